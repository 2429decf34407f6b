"""GGUF fixtures for `minigen convert`, one or two per architecture, made the way real files are made:
llama.cpp's own convert_hf_to_gguf.py on a tiny Hugging Face checkpoint (and llama-quantize for the
quantisation zoo), with references from transformers and token ids from llama.cpp's llama-tokenize.

    /root/ref/bin/python scripts/make_gguf_fixtures.py            # all; or name some: ... gemma2 phi3

Writes tests/fixtures/gguf/<name>.gguf and .npz (input_ids, logits, greedy_ids) and, for all of them,
tests/fixtures/gguf/archs.json (what each file is, which reference, the llama-tokenize ids of a hard text set).

Each source checkpoint's weights are rounded to float16 first, so an F16 GGUF holds them exactly. The reference:
- "transformers-gguf": transformers 5.24 loading the GGUF itself (`from_pretrained(dir, gguf_file=...)`), for the
  architectures and settings its GGUF loader reads (llama, mistral-as-llama, qwen2, qwen3, phi3, gpt2, gemma2,
  gemma3). These files may be quantised (Q8_0, the zoo): both sides dequantise the same bytes.
- "transformers-hf": transformers on the checkpoint the GGUF was made from, for what its loader does not read
  (gemma 1, olmo2, gpt_neox, smollm3 are not GGUF architectures it knows; Llama 3's rope_freqs, Phi-3's partial
  rotary and longrope factors are ignored by it). These files are F16: exactly the source's weights.
Both are computed for every fixture; archs.json records their largest difference.

The tokenizers: byte-level BPE ones are the parity fixtures' (tests/fixtures/*), written with the `tokenizer.ggml.pre`
real files of that family carry (llama.cpp's converter recognises pre-tokenizers by hashing the output of known
tokenizers; these tiny ones are unknown to it, so the name is given). SentencePiece ones (Gemma, Mistral, Phi-3)
are trained here with `sentencepiece` on the parity fixtures' corpus. Vocabulary ids are llama-tokenize's.
"""
from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import CORPUS, PROMPT_WORDS, randomise  # noqa: E402
import make_hybrid_fixtures as hybrid  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
OUT = FIXTURES / "gguf"
LLAMA_CPP = Path.home() / ".cache/minigen-llama-cpp/llama_cpp_python-0.3.36/vendor/llama.cpp"
BIN = LLAMA_CPP / "build" / "bin"
N_GREEDY = 20
SPM_VOCAB = 448
PROMPT_TOKENS = 40
MIN_GAP = 1e-3  # top-1 minus top-2 logit at every greedy step of the reference

# The hard text set for tokenizer agreement: runs of spaces, digits, code indentation, CJK, emoji, accents,
# special tokens (those of the file's own vocabulary are added per fixture).
TEXTS = [
    "a  2",
    "In the year 2024, 3.14159 and 1,000,000 people paid $12.50 each; call 555-0199.",
    "def square(x):\n    return x ** 2  # squares x\n\tprint('hi', {\"k\": [1, 2]})\n",
    "日本語のテキスト、中文文本。한국어 텍스트",
    "I love 🍕 and 🎉🎉! 👍🏽 👨‍👩‍👧",
    "café naïve résumé Ærøskøbing façade Straße",
    "I'm sure they'll say we've done it, can't they? DON'T!",
    "  leading spaces\n\n\ntrailing   \t ",
    "   ",
]

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
GEMMA_CHAT = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
              "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + "
              "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")
PHI3_CHAT = ("{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
             "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}")

# SentencePiece vocabularies: ids of the special pieces, user-defined pieces, the dummy prefix (Gemma has none)
SPM = {
    "llama": dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1, user=[], dummy=True, bos="<s>", eos="</s>",
                  template=None),
    "gemma": dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, user=["<start_of_turn>", "<end_of_turn>"], dummy=False,
                  bos="<bos>", eos="<eos>", template=GEMMA_CHAT),
    "phi3": dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1, user=["<|endoftext|>", "<|system|>", "<|user|>",
                 "<|assistant|>", "<|end|>"], dummy=True, bos="<s>", eos="<|endoftext|>", pad="<|endoftext|>",
                 template=PHI3_CHAT),
}


def cfg(cls, **kw):
    return getattr(transformers, cls)(**kw)


# name -> source checkpoint (a parity fixture, or a transformers config built here), vocabulary, GGUF type,
# reference. `pre`: tokenizer.ggml.pre of a BPE vocabulary (the parity fixture `bpe` supplies vocab and merges).
SPECS = {
    "llama": dict(fixture="llama_gqa3", pre="smollm", outtype="q8_0", ref="transformers-gguf"),
    # attention and MLP biases: llama.cpp permutes the q/k biases as it does the weights
    "llama_bias": dict(bpe="llama_bf16", pre="gpt-2", outtype="f16", ref="transformers-hf", family="llama",
                       config=lambda v, s: cfg("LlamaConfig", vocab_size=v, hidden_size=64, intermediate_size=128,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               attention_bias=True, mlp_bias=True, max_position_embeddings=512,
                                               tie_word_embeddings=False, **s)),
    "llama3_rope": dict(fixture="llama3_rope", pre="llama-bpe", outtype="f16", ref="transformers-hf"),
    "mistral": dict(fixture="mistral_sliding", spm="llama", outtype="q8_0", ref="transformers-gguf"),
    "qwen2": dict(fixture="qwen2", pre="qwen2", outtype="q8_0", ref="transformers-gguf"),
    # head_dim 128, as real Qwen3 (transformers' GGUF loader reads no head_dim for qwen3 and assumes 128)
    "qwen3": dict(bpe="qwen2", pre="qwen2", outtype="q8_0", ref="transformers-gguf", family="qwen3",
                  config=lambda v, s: cfg("Qwen3Config", vocab_size=v, hidden_size=64, intermediate_size=128,
                                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                          head_dim=128, tie_word_embeddings=False, max_position_embeddings=512,
                                          rope_theta=1e6, **s)),
    "gemma": dict(fixture="gemma", spm="gemma", outtype="f16", ref="transformers-hf"),
    # head_dim 256 and Gemma 2's caps: what transformers' GGUF loader assumes (it reads neither
    # query_pre_attn_scalar nor the soft-caps), so that its reference is the file's meaning
    "gemma2": dict(spm="gemma", outtype="q8_0", ref="transformers-gguf", family="gemma",
                   config=lambda v, s: cfg("Gemma2Config", vocab_size=v, hidden_size=64, intermediate_size=128,
                                           num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                           head_dim=256, query_pre_attn_scalar=256, sliding_window=16,
                                           attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                           max_position_embeddings=512, **s)),
    # six layers: Gemma 3's 5 sliding + 1 full pattern, which llama.cpp and transformers' GGUF loader assume
    "gemma3": dict(spm="gemma", outtype="q8_0", ref="transformers-gguf", family="gemma",
                   config=lambda v, s: cfg("Gemma3TextConfig", vocab_size=v, hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=6, num_attention_heads=1, num_key_value_heads=1,
                                           head_dim=256, query_pre_attn_scalar=256, sliding_window=16,
                                           max_position_embeddings=512, **s)),
    "phi3": dict(spm="phi3", outtype="q8_0", ref="transformers-gguf", family="phi3",
                 config=lambda v, s: cfg("Phi3Config", vocab_size=v, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                         max_position_embeddings=512, original_max_position_embeddings=512,
                                         sliding_window=511, **s)),
    # Phi-3.5 / Phi-4-mini style: partial rotary and longrope (context 512 over an original 32)
    "phi3_longrope": dict(spm="phi3", outtype="f16", ref="transformers-hf", family="phi3",
                          config=lambda v, s: cfg("Phi3Config", vocab_size=v, hidden_size=64, intermediate_size=96,
                                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                  max_position_embeddings=512, original_max_position_embeddings=32,
                                                  tie_word_embeddings=True, rope_parameters={
                                                      "rope_type": "longrope", "rope_theta": 10000.0,
                                                      "partial_rotary_factor": 0.5,
                                                      "short_factor": [1.0, 1.2, 1.5, 2.0],
                                                      "long_factor": [1.0, 2.0, 4.0, 16.0]}, **s)),
    # 1024 positions as every GPT-2 (transformers' GGUF loader sizes wpe by n_positions, which it does not read);
    # n_ctx: in every hub GPT-2 config.json (llama.cpp's converter needs it), not written by transformers 5
    "gpt2": dict(bpe="gpt2", pre="gpt-2", outtype="q8_0", ref="transformers-gguf", family="gpt2",
                 config=lambda v, s: cfg("GPT2Config", vocab_size=v, n_positions=1024, n_embd=64, n_layer=2,
                                         n_head=4, **s),
                 patch=lambda c: c.setdefault("n_ctx", c["n_positions"])),
    "olmo2": dict(bpe="llama3_rope", pre="dbrx", outtype="f16", ref="transformers-hf", family="olmo2",
                  config=lambda v, s: cfg("Olmo2Config", vocab_size=v, hidden_size=64, intermediate_size=128,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=500000.0,
                                          **s)),
    # rotary_pct, rotary_emb_base: Pythia's config.json spelling, which llama.cpp's converter reads
    "gpt_neox": dict(bpe="gpt2", pre="olmo", outtype="f16", ref="transformers-hf", family="gpt_neox",
                     config=lambda v, s: cfg("GPTNeoXConfig", vocab_size=v, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=512,
                                             use_parallel_residual=True, hidden_act="gelu", rotary_pct=0.25,
                                             rotary_emb_base=10000, tie_word_embeddings=False, **s),
                     patch=lambda c: c.update(rotary_pct=c["rope_parameters"]["partial_rotary_factor"],
                                              rotary_emb_base=c["rope_parameters"]["rope_theta"])),
    "smollm3": dict(bpe="llama3_rope", pre="llama-bpe", outtype="f16", ref="transformers-hf", family="smollm3",
                    config=lambda v, s: cfg("SmolLM3Config", vocab_size=v, hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                            no_rope_layer_interval=4, max_position_embeddings=512,
                                            tie_word_embeddings=True, rope_theta=2e6, **s)),
    # Granite's four multipliers (attention.scale, embedding_scale, residual_scale, logit_scale), q/k permuted
    "granite": dict(bpe="granite", pre="gpt-2", outtype="f16", ref="transformers-hf", family="granite",
                    config=lambda v, s: cfg("GraniteConfig", vocab_size=v, hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            max_position_embeddings=512, embedding_multiplier=12.0,
                                            attention_multiplier=0.015625, residual_multiplier=0.22,
                                            logits_scaling=8.0, tie_word_embeddings=False, **s)),
    # GraniteMoE: the multipliers and 4 experts top 2, input_linear split by llama.cpp into gate and up halves
    "granitemoe": dict(bpe="granitemoe", pre="gpt-2", outtype="f16", ref="transformers-hf", family="granitemoe",
                       config=lambda v, s: cfg("GraniteMoeConfig", vocab_size=v, hidden_size=64, intermediate_size=32,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               num_local_experts=4, num_experts_per_tok=2,
                                               max_position_embeddings=512, embedding_multiplier=12.0,
                                               attention_multiplier=0.015625, residual_multiplier=0.22,
                                               logits_scaling=8.0, tie_word_embeddings=False, **s)),
    # OLMo 3 (written as olmo2 with a sliding window): windows of 8 on layers 0-2, YaRN on the full layer 3
    "olmo3": dict(bpe="olmo3", pre="dbrx", outtype="f16", ref="transformers-hf", family="olmo3",
                  config=lambda v, s: cfg("Olmo3Config", vocab_size=v, hidden_size=64, intermediate_size=128,
                                          num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=512, rms_norm_eps=1e-6, sliding_window=8,
                                          rope_parameters={"full_attention": {
                                              "rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                                              "original_max_position_embeddings": 16, "beta_fast": 16.0},
                                              "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}},
                                          **s)),
    # Ministral 3's text model: YaRN (mscale_all_dim as yarn_log_multiplier) and llama 4's query scale
    # (attention.temperature_scale), original context 16 so that the prompt's positions are scaled
    "mistral3": dict(bpe="ministral3", pre="gpt-2", outtype="f16", ref="transformers-hf", family="ministral3",
                     config=lambda v, s: cfg("Ministral3Config", vocab_size=v, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             head_dim=16, max_position_embeddings=512, tie_word_embeddings=False,
                                             rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0,
                                                              "factor": 16.0, "original_max_position_embeddings": 16,
                                                              "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                                                              "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1},
                                             **s)),
    # The hybrids (the configs of scripts/make_hybrid_fixtures.py, its randomisation, its tokenizers), with prompts
    # longer than the 64-token Gated DeltaNet chunk.
    # Qwen3.5 as published (a vision tower, which the converter leaves out) with a multi-token-prediction block, as
    # real checkpoints have and current llama.cpp converts (extra blk.4, qwen35.nextn_predict_layers = 1):
    # 2 key heads and 4 value heads, so that llama.cpp tiles the value heads
    "qwen3_5": dict(bpe="qwen3_5_text", pre="qwen35", outtype="f32", ref="transformers-hf", family="qwen3_5",
                    config=hybrid.qwen3_5, randomise=hybrid.randomise, mtp=True, prompt_tokens=80),
    # the text-only class, untied, one key head per value head (no tiling), converted without MTP (--no-mtp)
    "qwen3_5_text": dict(bpe="qwen3_5_text", pre="qwen35", outtype="f32", ref="transformers-hf",
                         family="qwen3_5_text", randomise=hybrid.randomise, args=["--no-mtp"], prompt_tokens=80,
                         config=lambda v, s: hybrid.qwen3_5_text(v, s, linear_num_value_heads=2)),
    # short convs, head_count_kv per layer (0: a conv layer), the MLP width adjusted by the converter (120 -> 80);
    # no conv biases (llama.cpp's converter squeezes conv.conv.bias as if it were the kernel, and fails)
    "lfm2": dict(bpe="lfm2", pre="lfm2", outtype="f32", ref="transformers-hf", family="lfm2",
                 randomise=hybrid.randomise, prompt_tokens=80,
                 config=lambda v, s: hybrid.lfm2(v, s, intermediate_size=120)),
    # Granite 4.0-H: layer_types spelt as on the hub ("mamba"/"attention"; llama.cpp's converter knows no
    # other), the MLP as wide as the shared one (llama.cpp sizes ffn_gate by feed_forward_length), no experts
    # chosen per token (llama.cpp refuses num_experts_per_tok > num_local_experts = 0; dense releases say 0)
    "granitemoehybrid": dict(bpe="granitemoehybrid", pre="gpt-2", outtype="f32", ref="transformers-hf",
                             family="granitemoehybrid", randomise=hybrid.randomise, prompt_tokens=80,
                             config=lambda v, s: hybrid.granite(v, s, intermediate_size=48, num_experts_per_tok=0),
                             patch=lambda c: c.update(layer_types=["attention" if t == "full_attention" else "mamba"
                                                                   for t in c["layer_types"]])),
    # the same at Q8_0 (the converter's --outtype q8_0), tied embeddings: the source's matrices are put on the Q8_0
    # grid first, so that the file holds them exactly and transformers on the source is the reference still.
    # (NoPE, as every Granite 4.0-H: llama.cpp's converter writes rope.scaling.finetuned false, no RoPE, for any
    # model with Mamba2 layers, whatever position_embedding_type says)
    "granitemoehybrid_q8_0": dict(bpe="granitemoehybrid", pre="gpt-2", outtype="q8_0", ref="transformers-hf",
                                  family="granitemoehybrid", randomise=hybrid.randomise, prompt_tokens=80, grid="q8_0",
                                  config=lambda v, s: hybrid.granite(v, s, intermediate_size=48, num_experts_per_tok=0,
                                                                     tie_word_embeddings=True),
                                  patch=lambda c: c.update(layer_types=["attention" if t == "full_attention" else
                                                                        "mamba" for t in c["layer_types"]])),
    # Granite 4.0-H with routed experts (Tiny, Small), from the parity fixture: 8 experts top 3 (llama.cpp splits
    # input_linear into ffn_gate_exps and ffn_up_exps, as for granitemoe) beside the shared MLP, which it writes as
    # ffn_gate_shexp / ffn_up_shexp / ffn_down_shexp (expert_shared_feed_forward_length) when there are experts
    "granitemoehybrid_moe": dict(fixture="granitemoehybrid_moe", pre="gpt-2", outtype="f32", ref="transformers-hf",
                                 family="granitemoehybrid", prompt_tokens=80,
                                 patch=lambda c: c.update(layer_types=["attention" if t == "full_attention" else
                                                                       "mamba" for t in c["layer_types"]])),
    # Falcon-H1 with the gated norm in 2 groups after the gate (llama.cpp's order) and every µP multiplier,
    # which llama.cpp's converter folds into the weights
    "falcon_h1": dict(bpe="falcon_h1", pre="falcon-h1", outtype="f32", ref="transformers-hf", family="falcon_h1",
                      randomise=hybrid.randomise, prompt_tokens=80,
                      config=lambda v, s: hybrid.falcon_h1(v, s, mamba_rms_norm=True, mamba_norm_before_gate=False,
                                                           mamba_n_groups=2)),
    # every tensor type llama-quantize makes without an importance matrix, one per matrix (rows of 256 for K-quants)
    "quants": dict(bpe="llama_gqa3", pre="smollm", outtype="f32", ref="transformers-gguf", family="llama",
                   config=lambda v, s: cfg("LlamaConfig", vocab_size=v, hidden_size=256, intermediate_size=64,
                                           num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                                           max_position_embeddings=512, rope_theta=1e5, tie_word_embeddings=True,
                                           **s),
                   # K and I quants need rows of 256 (hidden 256); ffn_down's rows are 64 long (block-32 types)
                   quantize={"token_embd": "q6_k",
                             "blk\\.0\\.attn_q": "q2_k", "blk\\.0\\.attn_k": "q3_k", "blk\\.0\\.attn_v": "q4_k",
                             "blk\\.0\\.attn_output": "q5_k", "blk\\.0\\.ffn_gate": "q6_k", "blk\\.0\\.ffn_up": "iq4_xs",
                             "blk\\.0\\.ffn_down": "q4_0",
                             "blk\\.1\\.attn_q": "iq3_s", "blk\\.1\\.attn_k": "bf16", "blk\\.1\\.attn_v": "f16",
                             "blk\\.1\\.attn_output": "tq1_0", "blk\\.1\\.ffn_gate": "tq2_0", "blk\\.1\\.ffn_up": "q8_0",
                             "blk\\.1\\.ffn_down": "q4_1",
                             "blk\\.2\\.attn_q": "mxfp4", "blk\\.2\\.attn_k": "q5_0", "blk\\.2\\.attn_v": "q5_1",
                             "blk\\.2\\.attn_output": "iq4_nl", "blk\\.2\\.ffn_gate": "q2_k", "blk\\.2\\.ffn_up": "q3_k",
                             "blk\\.2\\.ffn_down": "q8_0"}),
}


# --- source checkpoints ---------------------------------------------------------------------------------------

def round_f16(path: Path) -> None:
    """Every tensor of model.safetensors rounded to float16 (kept float32): an F16 GGUF holds it exactly."""
    file = path / "model.safetensors"
    tensors = {k: v.to(torch.float16).to(torch.float32) for k, v in load_file(str(file)).items()}
    save_file(tensors, str(file), metadata={"format": "pt"})


def train_spm(kind: str, vocab: int, path: Path) -> dict:
    """A SentencePiece BPE model with byte fallback (as Llama 2, Mistral, Gemma, Phi-3 carry) -> path/tokenizer.model."""
    import sentencepiece as spm

    s = SPM[kind]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines()), model_writer=buf, vocab_size=vocab, model_type="bpe",
        byte_fallback=True, character_coverage=0.98, split_digits=True, allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity", add_dummy_prefix=s["dummy"],
        user_defined_symbols=s["user"], unk_id=s["unk_id"], bos_id=s["bos_id"], eos_id=s["eos_id"],
        pad_id=s["pad_id"], minloglevel=2)
    (path / "tokenizer.model").write_bytes(buf.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    ids = {"bos_token_id": sp.piece_to_id(s["bos"]), "eos_token_id": sp.piece_to_id(s["eos"])}
    if s.get("pad"):  # Phi-3's (config.json is where llama.cpp's converter finds the id)
        ids["pad_token_id"] = sp.piece_to_id(s["pad"])
    tcfg = {"tokenizer_class": "LlamaTokenizer", "bos_token": s["bos"], "eos_token": s["eos"], "add_bos_token": True,
            "add_eos_token": False,
            "added_tokens_decoder": {str(sp.piece_to_id(p)): {"content": p, "special": True} for p in s["user"]}}
    if s["template"]:
        tcfg["chat_template"] = s["template"]
    if s.get("pad"):  # Phi-3's; transformers' GGUF loader would otherwise take Phi3Config's pad id 32000
        tcfg["pad_token"] = s["pad"]
    (path / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))
    for f in ("tokenizer.json", "special_tokens_map.json", "chat_template.jinja"):
        (path / f).unlink(missing_ok=True)
    return ids


def copy_bpe(fixture: str, path: Path, with_template: bool = True) -> dict:
    """A parity fixture's byte-level BPE tokenizer files -> path; returns its bos/eos ids."""
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (FIXTURES / fixture / f).is_file():
            shutil.copy(FIXTURES / fixture / f, path / f)
    if with_template and not (path / "chat_template.jinja").is_file():
        tcfg = json.loads((path / "tokenizer_config.json").read_text())
        tcfg.setdefault("chat_template", CHATML)
        (path / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))
    src = json.loads((FIXTURES / fixture / "config.json").read_text())
    ids = {k: src[k] for k in ("bos_token_id", "eos_token_id") if src.get(k) is not None}
    return {**ids, "pad_token_id": src.get("pad_token_id")}  # None overrides a config class's own default


def source(name: str, spec: dict, path: Path, seed: int = 0) -> Path:
    """The HF checkpoint the GGUF is made from, in `path`, weights rounded to float16. A parity fixture is used
    as it is, except with a SentencePiece vocabulary: then a model of the fixture's config is built with the
    trained vocabulary's size (SentencePiece needs ~400 pieces for this corpus at its minimum coverage)."""
    path.mkdir(parents=True)
    if "fixture" in spec and "spm" not in spec:
        for f in (FIXTURES / spec["fixture"]).iterdir():
            if f.suffix != ".npz":
                shutil.copy(f, path / f.name)
    else:
        if "spm" in spec:
            vocab = spec.get("vocab", SPM_VOCAB)
            ids = train_spm(spec["spm"], vocab, path)
        else:
            ids = copy_bpe(spec["bpe"], path)
            vocab = json.loads((FIXTURES / spec["bpe"] / "config.json").read_text())["vocab_size"]
        if "fixture" in spec:
            config = transformers.AutoConfig.from_pretrained(FIXTURES / spec["fixture"])
            config.vocab_size = vocab
            for k, v in ids.items():
                setattr(config, k, v)
        else:
            config = spec["config"](vocab, ids)
        torch.manual_seed(sum(map(ord, name)) + seed)
        if config.model_type == "qwen3_5":  # the published class, vision tower included
            model = transformers.Qwen3_5ForConditionalGeneration._from_config(config, dtype=torch.float32)
        else:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        if "randomise" in spec:
            spec["randomise"](model)
        else:
            randomise(model, spec.get("family", config.model_type))
        for k, v in ids.items():
            setattr(model.generation_config, k, v)
        model.save_pretrained(path)
        if spec.get("mtp"):
            add_mtp(path)
    if "patch" in spec:
        c = json.loads((path / "config.json").read_text())
        spec["patch"](c)
        (path / "config.json").write_text(json.dumps(c, indent=2))
    round_f16(path)
    if "grid" in spec:
        on_grid(path, spec["grid"])
    return path


def add_mtp(path: Path) -> None:
    """Qwen3.5's multi-token-prediction head (`mtp.*`, mtp_num_hidden_layers 1), random, as published checkpoints
    carry it: a full-attention layer (a copy of the last one's shapes) and its fc and norms. transformers does
    not load it; llama.cpp's converter writes it as one more block."""
    file = path / "model.safetensors"
    tensors = load_file(str(file))
    cfg = json.loads((path / "config.json").read_text())
    text = cfg["text_config"]
    last = f"model.language_model.layers.{text['num_hidden_layers'] - 1}."
    hidden = text["hidden_size"]
    g = torch.Generator().manual_seed(5)
    for k, v in list(tensors.items()):
        if k.startswith(last):
            tensors["mtp.layers.0." + k[len(last):]] = torch.randn(v.shape, generator=g) * 0.1 + (v.ndim == 1)
    tensors["mtp.fc.weight"] = torch.randn((hidden, 2 * hidden), generator=g) * 0.1
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        tensors[f"mtp.{n}.weight"] = torch.randn(hidden, generator=g) * 0.1
    save_file(tensors, str(file), metadata={"format": "pt"})
    text["mtp_num_hidden_layers"] = 1
    (path / "config.json").write_text(json.dumps(cfg, indent=2))


def on_grid(path: Path, qtype: str) -> None:
    """Every matrix whose rows are whole blocks of the quantisation type, rounded to it (quantised and
    dequantised by the gguf package): llama.cpp's converter then stores them exactly."""
    import gguf as g

    kind = g.GGMLQuantizationType[qtype.upper()]
    block = g.GGML_QUANT_SIZES[kind][0]
    file = path / "model.safetensors"
    tensors = load_file(str(file))
    for k, v in tensors.items():
        if v.ndim == 2 and v.shape[-1] % block == 0:
            w = v.numpy().astype(np.float32)
            tensors[k] = torch.from_numpy(g.quants.dequantize(g.quants.quantize(w, kind), kind).reshape(w.shape))
    save_file(tensors, str(file), metadata={"format": "pt"})


# --- llama.cpp ------------------------------------------------------------------------------------------------

# llama.cpp's converter, with the pre-tokenizer name given (it cannot recognise these tiny tokenizers) and the
# raw config.json keys merged back into its hparams (transformers 5.24's AutoConfig.to_dict drops some that it
# reads, such as GPT-NeoX's rotary_pct; transformers 4.x kept them)
CONVERT = """
import json, sys
sys.path[:0] = [{root!r}, {root!r} + "/gguf-py"]
from conversion import base
pre = sys.argv.pop(1)
if pre != "-":
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
_load = base.ModelBase.load_hparams
def load_hparams(dir_model, is_mistral_format):
    hparams = _load(dir_model, is_mistral_format)
    for k, v in json.loads((dir_model / "config.json").read_text()).items():
        hparams.setdefault(k, v)
    return hparams
base.ModelBase.load_hparams = staticmethod(load_hparams)
import convert_hf_to_gguf
sys.argv[0] = "convert_hf_to_gguf.py"
convert_hf_to_gguf.main()
"""


def to_gguf(src: Path, out: Path, outtype: str, pre: str | None, args: list | None = None) -> None:
    code = CONVERT.format(root=str(LLAMA_CPP))
    r = subprocess.run([sys.executable, "-c", code, pre or "-", str(src), "--outfile", str(out), "--outtype", outtype,
                        *(args or [])], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode:
        sys.exit(f"convert_hf_to_gguf.py failed on {src.name}:\n{r.stderr[-3000:]}")


def quantize(src: Path, out: Path, types: dict) -> None:
    args = [str(BIN / "llama-quantize"), "--pure"]
    for pattern, t in types.items():
        args += ["--tensor-type", f"{pattern}={t}"]
    subprocess.run(args + [str(src), str(out), "q8_0"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)


def llama_tokenize(gguf: Path, text: str, bos: bool = True) -> list[int]:
    args = [str(BIN / "llama-tokenize"), "-m", str(gguf), "--stdin", "--ids", "--log-disable"]
    if not bos:
        args.append("--no-bos")
    out = subprocess.run(args, input=text.encode(), check=True, capture_output=True).stdout.decode()
    return json.loads(out.strip().splitlines()[-1])


# --- references -----------------------------------------------------------------------------------------------

@torch.no_grad()
def run(model, ids: list[int]) -> dict:
    logits = model(torch.tensor([ids])).logits[0].float().numpy()
    seq, gaps = list(ids), []
    for _ in range(N_GREEDY):  # full forwards, no cache, no EOS
        last = model(torch.tensor([seq])).logits[0, -1]
        top2 = torch.topk(last, 2).values
        gaps.append(float(top2[0] - top2[1]))
        seq.append(int(last.argmax()))
    return {"logits": logits, "greedy_ids": np.array(seq[len(ids):], np.int64), "min_gap": min(gaps)}


def load_hf(path: Path, gguf_file: str | None = None):
    kw = {"gguf_file": gguf_file} if gguf_file else {}
    published = not gguf_file and json.loads((path / "config.json").read_text())["model_type"] == "qwen3_5"
    cls = transformers.Qwen3_5ForConditionalGeneration if published else transformers.AutoModelForCausalLM
    return cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager", **kw).eval()


def tensor_types(gguf: Path) -> dict:
    """{type name: tensor count} of the file."""
    import gguf as g

    counts = {}
    for t in g.GGUFReader(gguf).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return dict(sorted(counts.items()))


def specials(gguf: Path) -> list[str]:
    """Control tokens of the file's vocabulary, for the special-token texts."""
    import gguf as g

    r = g.GGUFReader(gguf)
    tokens = [bytes(r.fields["tokenizer.ggml.tokens"].parts[i]).decode() for i in r.fields["tokenizer.ggml.tokens"].data]
    types = [int(r.fields["tokenizer.ggml.token_type"].parts[i][0]) for i in r.fields["tokenizer.ggml.token_type"].data]
    return [t for t, k in zip(tokens, types) if k in (3, 4) and not t.startswith("[PAD")]


def make(name: str, spec: dict, work: Path) -> dict:
    """The fixture; a checkpoint built here is re-seeded until every greedy step has a top-1/top-2 gap > MIN_GAP."""
    for seed in range(20):
        src = source(name, spec, work / f"{name}-{seed}", seed)
        gguf = OUT / f"{name}.gguf"
        if "quantize" in spec:
            f32 = work / f"{name}-f32.gguf"
            to_gguf(src, f32, "f32", spec.get("pre"))
            quantize(f32, gguf, spec["quantize"])
        else:
            to_gguf(src, gguf, spec["outtype"], spec.get("pre"), spec.get("args"))
        n_prompt = spec.get("prompt_tokens", PROMPT_TOKENS)
        words = PROMPT_WORDS * (3 if "prompt_tokens" in spec else 1)  # the same prompts as before for the others
        prompt_ids = llama_tokenize(gguf, " ".join(words))[:n_prompt]
        assert len(prompt_ids) == n_prompt, f"{name}: the prompt has only {len(prompt_ids)} tokens"
        hf = run(load_hf(src), prompt_ids)
        info = {"reference": spec["ref"], "source": spec.get("fixture", "built by this script"),
                "size": gguf.stat().st_size, "seed": seed, "types": tensor_types(gguf)}
        try:
            on_gguf = run(load_hf(OUT, gguf.name), prompt_ids)
            info["transformers_gguf_vs_hf"] = float(np.abs(on_gguf["logits"] - hf["logits"]).max())
        except Exception as e:  # not an architecture transformers' GGUF loader knows
            if spec["ref"] == "transformers-gguf":
                raise
            on_gguf = None
            info["transformers_gguf_vs_hf"] = f"transformers cannot load it: {type(e).__name__}: {str(e)[:120]}"
        ref = on_gguf if spec["ref"] == "transformers-gguf" else hf
        if ref["min_gap"] > MIN_GAP or ("fixture" in spec and "spm" not in spec):
            break
    np.savez_compressed(OUT / f"{name}.npz", input_ids=np.array(prompt_ids, np.int64), logits=ref["logits"],
                        greedy_ids=ref["greedy_ids"])
    info["min_gap"] = ref["min_gap"]
    texts = TEXTS + ["".join(specials(gguf)[:4]) + " hi " + " ".join(specials(gguf)[:2])]
    info["tokenizer"] = [{"text": t, "ids": llama_tokenize(gguf, t)} for t in texts]
    return info


def main(names: list[str]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    index = OUT / "archs.json"
    with tempfile.TemporaryDirectory() as work:
        for name in names or list(SPECS):
            info = make(name, SPECS[name], Path(work))
            table = json.loads(index.read_text()) if index.is_file() else {}
            table[name] = info
            table["_versions"] = {"transformers": transformers.__version__, "torch": torch.__version__,
                                  "llama.cpp": "llama-cpp-python 0.3.36 sdist (convert_hf_to_gguf.py, llama-quantize, "
                                               "llama-tokenize)"}
            text = json.dumps(dict(sorted(table.items())), indent=1, ensure_ascii=False)
            text = re.sub(r"\[\s+([-\d.e,\s]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
            index.write_text(text + "\n", encoding="utf-8")
            diff = info["transformers_gguf_vs_hf"]
            print(f"{name}: {info['size'] / 1024:.0f} KB, reference {info['reference']}, transformers on the GGUF vs "
                  f"on the source: {diff if isinstance(diff, str) else format(diff, '.2e')}, "
                  f"min greedy gap {info['min_gap']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Write the parity fixtures under tests/fixtures/<name>/ (needs torch + transformers; minigen does not).

    /root/ref/bin/python scripts/make_fixtures.py            # all fixtures
    /root/ref/bin/python scripts/make_fixtures.py gemma qwen2

Each fixture is a tiny randomly initialised Hugging Face checkpoint, saved with `save_pretrained`,
with a small byte-level BPE tokenizer trained here by the `tokenizers` library, plus `reference.npz`:

    input_ids   (T,)                    int64   the prompt, encoded with add_special_tokens=True
    logits      (T, V)                  float32 transformers' logits at every prompt position
    greedy_ids  (20,)                   int64   greedy continuation (plain argmax loop, EOS ignored)
    attentions  (n_layers, n_heads, T, T) float32 eager attention weights for the prompt
    prompt, transformers_version, torch_version, [chat_text]   0-d str arrays

The reference is always computed from the checkpoint *as saved* (reloaded in float32, eager attention),
so float16/bfloat16 rounding and hand-rewritten config.json files are part of what it checks. The `_v4`
fixtures' config.json is rewritten into the 4.x hub spelling (`rewrite_v4`); fixtures marked `crossing` (Phi-3
longrope) also get reference_generate.npz (`crossing_reference`); `long` ones a reference_long.npz from
scripts/make_long_fixtures.py. tests/fixtures/README.md describes every fixture and what transformers does.
"""
from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
N_GREEDY = 20
MIN_PROMPT_TOKENS = 40
MIN_GAP = 1e-3  # top-1 minus top-2 logit at every greedy step, or the fixture is re-seeded
MIN_DISTINCT = 8  # distinct ids in the greedy continuation (one token repeated 20 times tests little)

# ---------------------------------------------------------------------------------------------
# Tokenizer training text: prose, code, digits, accents, a little CJK and emoji.

CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model reads one token at a time and guesses the next.
Attention lets every position look back at the positions before it; the cache keeps what was already seen.
Once upon a time there was a little robot who liked to count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 100, 2024.
The birds eat the seeds, and the cat eats the fish. Prices rose 3.5% in 1999 and fell 12% by 2008.
def forward(x, cache=None):
    for layer in self.layers:
        x = layer(x, cache)
    return self.norm(x) @ self.lm_head.T
import numpy as np
print("hello, world!")  # a comment
if n > 0 and n % 2 == 0: return [i * i for i in range(n)]
{"name": "minigen", "version": "0.1.0", "layers": 2, "heads": 4}
Le café est très bon, mais la crème brûlée est meilleure. Où est la bibliothèque ? Déjà vu, naïve, façade.
Der Bär läuft über die Straße, und die Vögel singen schön. Grüße aus München!
El niño comió una manzana en la mañana. ¿Dónde está el señor? ¡Qué día tan bonito!
Ação, coração, não — São Paulo é uma cidade grande. Smörgåsbord, fjörd, Ærø, Łódź, İstanbul.
日本語の文章も少しだけ。東京は大きな都市です。中文也有一点：你好，世界！我们喜欢学习。한국어 안녕하세요.
Emoji too: 🙂 🚀 🐍 ❤️ 👍 — and symbols like ±, ×, €, £, ©, ™, →, ≤ and ≥.
"""

PROMPT_WORDS = (
    "Once upon a time, the little robot wrote: def add(a, b): return a + b # 42 ; "
    "le café très bon, die Straße, 東京 🙂 and the birds eat the seeds while the cat eats the fish "
    "in 2024, counting 1, 2, 3 and more words until the prompt is long enough for every test."
).split(" ")

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Gemma 2/3 instruct: no system turn of its own (Gemma 3 folds a system message into the first user turn,
# as here), the assistant is "model", BOS written by the template.
GEMMA_CHAT = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}{% set prefix = messages[0]['content'] + '\\n\\n' %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '')"
    " + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
# Phi-3-mini-4k-instruct's template.
PHI3_CHAT = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<|system|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\\n' + message['content'] + '<|end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)
QWEN_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
CHAT_MESSAGES = [
    {"role": "system", "content": "You are a tiny test model."},
    {"role": "user", "content": "Say hello in French, please."},
]

# ---------------------------------------------------------------------------------------------
# Tokenizer "styles": which special tokens, which ids, whether BOS is added by the post-processor.

TOKENIZER_STYLES = {
    # GPT-2: one special token, nothing added to the input.
    "gpt2": dict(specials=["<|endoftext|>"], bos="<|endoftext|>", eos="<|endoftext|>", unk="<|endoftext|>",
                 pad=None, add_bos=False),
    # Llama 2 / Mistral: <unk>=0 <s>=1 </s>=2, <s> prepended by a TemplateProcessing post-processor.
    "llama": dict(specials=["<unk>", "<s>", "</s>"], bos="<s>", eos="</s>", unk="<unk>", pad=None, add_bos=True),
    # SmolLM2-like: Llama ids plus ChatML tokens, digits split one by one, template in chat_template.jinja.
    "llama_chatml": dict(specials=["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"], bos="<s>",
                         eos="<|im_end|>", unk="<unk>", pad=None, add_bos=True, digits=True,
                         chat_template_file=True),
    # Llama 3: Sequence[ByteLevel, TemplateProcessing] post-processor, <|begin_of_text|> prepended.
    "llama3": dict(specials=["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], bos="<|begin_of_text|>",
                   eos="<|end_of_text|>", unk=None, pad=None, add_bos=True, bytelevel_then_template=True),
    # Qwen2: no BOS at all; NFC + Qwen's split regex (transformers 5 *forces* Qwen2Tokenizer for model_type
    # qwen2, which rebuilds exactly this pipeline, whatever tokenizer.json says); ChatML template in
    # tokenizer_config.json (the pre-transformers-5 place).
    "qwen2": dict(specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], bos=None, eos="<|im_end|>",
                  unk=None, pad="<|endoftext|>", add_bos=False, chat_template_in_config=True, qwen_regex=True),
    # Gemma: <pad>=0 <eos>=1 <bos>=2 <unk>=3, <bos> prepended.
    "gemma": dict(specials=["<pad>", "<eos>", "<bos>", "<unk>"], bos="<bos>", eos="<eos>", unk="<unk>",
                  pad="<pad>", add_bos=True),
    # Gemma 2/3 instruct: the Gemma ids plus <start_of_turn>=4 <end_of_turn>=5, template in tokenizer_config.json.
    "gemma_chat": dict(specials=["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"], bos="<bos>",
                       eos="<eos>", unk="<unk>", pad="<pad>", add_bos=True, chat_template_in_config=True,
                       chat_template=GEMMA_CHAT),
    # Qwen3: Qwen2's pipeline (NFC + split regex) and ChatML in tokenizer_config.json, plus <think></think>.
    "qwen3": dict(specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"], bos=None,
                  eos="<|im_end|>", unk=None, pad="<|endoftext|>", add_bos=False, chat_template_in_config=True,
                  qwen_regex=True),
    # Phi-3-mini: Llama ids, <s> prepended, eos <|endoftext|>, <|user|>/<|assistant|>/<|end|> turns.
    "phi3": dict(specials=["<unk>", "<s>", "</s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>",
                           "<|end|>"], bos="<s>", eos="<|endoftext|>", unk="<unk>", pad="<|endoftext|>", add_bos=True,
                 chat_template_in_config=True, chat_template=PHI3_CHAT),
    # GPT-NeoX / Pythia: <|endoftext|>=0 is bos and eos, <|padding|>=1, nothing added.
    "gpt_neox": dict(specials=["<|endoftext|>", "<|padding|>"], bos="<|endoftext|>", eos="<|endoftext|>",
                     unk="<|endoftext|>", pad="<|padding|>", add_bos=False),
    # OLMo 2 (dolma2 tokenizer): no BOS, eos <|endoftext|>, pad <|pad|>.
    "olmo2": dict(specials=["<|endoftext|>", "<|pad|>"], bos=None, eos="<|endoftext|>", unk=None, pad="<|pad|>",
                  add_bos=False),
    # SmolLM3: Llama-3 ids, no BOS added (bos_token_id null on the hub), eos <|im_end|>, ChatML in chat_template.jinja.
    "smollm3": dict(specials=["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"], bos=None,
                    eos="<|im_end|>", unk=None, pad="<|end_of_text|>", add_bos=False, chat_template_file=True),
}


def train_tokenizer(style: dict, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if style.get("qwen_regex"):
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif style.get("digits"):
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=style["specials"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    bos = style["bos"]
    if style["add_bos"]:
        template = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, tok.token_to_id(bos))])
        if style.get("bytelevel_then_template"):
            tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False), template])
        else:
            tok.post_processor = template
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def save_tokenizer(tok: Tokenizer, style: dict, path: Path) -> None:
    tok.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": style["bos"], "eos_token": style["eos"], "unk_token": style["unk"],
        "pad_token": style["pad"], "add_bos_token": style["add_bos"], "add_eos_token": False,
        "clean_up_tokenization_spaces": False, "model_max_length": 2048,
    }
    if style.get("chat_template_in_config"):
        config["chat_template"] = style.get("chat_template", CHATML)
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    if style.get("chat_template_file"):
        (path / "chat_template.jinja").write_text(style.get("chat_template", CHATML))


def choose_prompt(tok: Tokenizer) -> str:
    words = []
    for w in PROMPT_WORDS:
        words.append(w)
        if len(tok.encode(" ".join(words)).ids) >= MIN_PROMPT_TOKENS:
            break
    return " ".join(words)

# ---------------------------------------------------------------------------------------------
# Fixtures: a transformers config, a tokenizer style, the on-disk dtype, and save options.


def special_ids(tok: Tokenizer, style: dict) -> dict:
    ids = {k: (tok.token_to_id(style[k]) if style[k] else None) for k in ("bos", "eos", "pad")}
    return {"bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["pad"]}


def llama_config(cls_name="LlamaConfig", **kw):
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                tie_word_embeddings=False)
    base.update(kw)
    return getattr(transformers, cls_name)(**base)


FIXTURES = {
    "gpt2": dict(
        family="gpt2", style="gpt2", vocab=400, seed=1,
        config=lambda v, s: transformers.GPT2Config(vocab_size=v, n_embd=64, n_head=4, n_layer=2, n_positions=128,
                                                    n_inner=None, activation_function="gelu_new", **s)),
    "llama_gqa3": dict(
        family="llama", style="llama_chatml", vocab=448, seed=2,
        config=lambda v, s: llama_config(vocab_size=v, hidden_size=72, intermediate_size=96, num_hidden_layers=3,
                                         num_attention_heads=9, num_key_value_heads=3, head_dim=8,
                                         tie_word_embeddings=True,
                                         rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, **s)),
    "llama_bf16": dict(
        family="llama", style="llama", vocab=416, seed=3, dtype=torch.bfloat16,
        config=lambda v, s: llama_config(vocab_size=v, **s)),
    "llama_sharded": dict(
        family="llama", style="llama", vocab=432, seed=4, max_shard_size="150KB",
        config=lambda v, s: llama_config(vocab_size=v, num_key_value_heads=4, **s)),
    "llama3_rope": dict(
        family="llama", style="llama3", vocab=480, seed=5, old_config_spelling=True,
        # head_dim 16, theta 1e4, original context 32: wavelengths 6.3 (< 32/4: kept), 19.9 (between:
        # smoothed), 62.8.. (> 32: divided by 8) -- all three llama3 bands are exercised.
        config=lambda v, s: llama_config(vocab_size=v, max_position_embeddings=256, rope_parameters={
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}, **s)),
    "llama_linear_rope": dict(
        family="llama", style="llama", vocab=400, seed=6,
        config=lambda v, s: llama_config(vocab_size=v, rope_parameters={
            "rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}, **s)),
    "mistral_sliding": dict(
        family="mistral", style="llama", vocab=424, seed=7,
        config=lambda v, s: llama_config("MistralConfig", vocab_size=v, sliding_window=16, head_dim=16, **s)),
    "qwen2": dict(
        family="qwen2", style="qwen2", vocab=500, model_vocab=512, seed=8, dtype=torch.float16,
        config=lambda v, s: llama_config("Qwen2Config", vocab_size=v, tie_word_embeddings=True,
                                         rms_norm_eps=1e-6, use_sliding_window=False,
                                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **s)),
    "gemma": dict(
        family="gemma", style="gemma", vocab=384, seed=9, gemma_hub_activation=True,
        config=lambda v, s: llama_config("GemmaConfig", vocab_size=v, num_attention_heads=4, num_key_value_heads=1,
                                         head_dim=24, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                                         tie_word_embeddings=True, **s)),
    # ---- families added after the first nine: each in both config.json spellings (the `_v4` fixtures carry
    # the pre-transformers-5 spelling of the hub checkpoints, written by rewrite_v4 and checked to load into
    # bit-identical logits). Small dimensions keep each directory near 300 KB.
    "gemma2": dict(
        # embeddings N(0, 0.1) (tied: larger ones make every greedy step repeat the input token); q/k and MLP
        # larger than elsewhere so that both soft-caps bend (max |score| ~2x the attention cap, max |logit|
        # ~1.5x the final cap: tiny random tied models have small logits, hence the small final cap)
        family="gemma2", style="gemma_chat", vocab=300, seed=10, long=True, embed_std=0.1,
        stds={"q_proj": 0.3, "k_proj": 0.3, "mlp": 0.25},
        config=lambda v, s: transformers.Gemma2Config(
            vocab_size=v, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=16,
            attn_logit_softcapping=5.0, final_logit_softcapping=1.5, max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **s)),
    "gemma2_v4": dict(
        family="gemma2", style="gemma_chat", vocab=304, seed=11, dtype=torch.bfloat16, v4={}, embed_std=0.1,
        stds={"q_proj": 0.4, "k_proj": 0.4, "mlp": 0.25},
        config=lambda v, s: transformers.Gemma2Config(
            vocab_size=v, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
            attn_logit_softcapping=8.0, final_logit_softcapping=2.0, max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **s)),
    "gemma3_text": dict(
        # small embeddings, larger MLP and o_proj: otherwise the greedy continuation of these tiny random
        # Gemma 3 models repeats 2-4 tokens for most seeds
        family="gemma3_text", style="gemma_chat", vocab=296, seed=510, dtype=torch.bfloat16, embed_std=0.07,
        stds={"mlp": 0.3, "o_proj": 0.3},
        config=lambda v, s: transformers.Gemma3TextConfig(
            vocab_size=v, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=16,
            # a layer_types list no sliding_window_pattern gives; attn_logit_softcapping is read by the config
            # but NOT applied by Gemma3Attention in transformers 5.24 (see the README)
            layer_types=["full_attention", "sliding_attention", "sliding_attention"], attn_logit_softcapping=5.0,
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 200000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 3000.0}},
            max_position_embeddings=512, **s)),
    "gemma3_text_v4": dict(
        family="gemma3_text", style="gemma_chat", vocab=308, seed=210, dtype=torch.bfloat16, long=True,
        v4={"sliding_window_pattern": 3}, embed_std=0.07, stds={"mlp": 0.3, "o_proj": 0.3},
        config=lambda v, s: transformers.Gemma3TextConfig(
            vocab_size=v, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=16,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
            max_position_embeddings=512, **s)),
    "qwen3": dict(
        family="qwen3", style="qwen3", vocab=312, seed=14, dtype=torch.bfloat16,
        config=lambda v, s: transformers.Qwen3Config(
            vocab_size=v, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=24, tie_word_embeddings=False, max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **s)),
    "qwen3_v4": dict(
        family="qwen3", style="qwen3", vocab=298, model_vocab=320, seed=15, dtype=torch.bfloat16, v4={},
        config=lambda v, s: transformers.Qwen3Config(
            vocab_size=v, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=1, head_dim=16, tie_word_embeddings=True, max_position_embeddings=512,
            max_window_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **s)),
    "phi3": dict(
        family="phi3", style="phi3", vocab=302, seed=16, dtype=torch.bfloat16, long=True,
        config=lambda v, s: transformers.Phi3Config(
            vocab_size=v, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=3,
            num_key_value_heads=1, max_position_embeddings=512, original_max_position_embeddings=512,
            sliding_window=24, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                "partial_rotary_factor": 0.5}, **s)),
    "phi3_longrope": dict(
        family="phi3", style="phi3", vocab=306, seed=17,
        config=lambda v, s: transformers.Phi3Config(
            vocab_size=v, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=2, max_position_embeddings=512, original_max_position_embeddings=32,
            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                             "short_factor": [1.0, 1.25, 1.5, 2.0], "long_factor": [1.0, 2.0, 4.0, 16.0]},
            **s)),
    "phi3_longrope_v4": dict(
        family="phi3", style="phi3", vocab=310, seed=18, dtype=torch.bfloat16, v4={}, crossing=True,
        # Phi-4-mini-like: partial_rotary_factor 0.75, tied, longrope with original_max 32 (max 512: factor 16)
        config=lambda v, s: transformers.Phi3Config(
            vocab_size=v, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=512,
            original_max_position_embeddings=32, sliding_window=1024,
            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                             "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 3.0],
                             "long_factor": [1.0, 1.5, 3.0, 6.0, 12.0, 24.0]}, **s)),
    "olmo2": dict(
        family="olmo2", style="olmo2", vocab=294, seed=19, dtype=torch.bfloat16,
        config=lambda v, s: transformers.Olmo2Config(
            vocab_size=v, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=512, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, **s)),
    "olmo2_v4": dict(
        family="olmo2", style="olmo2", vocab=314, seed=20, dtype=torch.bfloat16, v4={},
        config=lambda v, s: transformers.Olmo2Config(
            vocab_size=v, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, **s)),
    "gpt_neox_v4": dict(
        family="gpt_neox", style="gpt_neox", vocab=316, seed=21, dtype=torch.float16, v4={},
        # Pythia: parallel residual, rotary_pct 0.25 (4 of 16 dims), LayerNorm with bias, untied embed_out
        config=lambda v, s: transformers.GPTNeoXConfig(
            vocab_size=v, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=512, use_parallel_residual=True, hidden_act="gelu",
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}, **s)),
    "gpt_neox": dict(
        family="gpt_neox", style="gpt_neox", vocab=292, seed=22,
        config=lambda v, s: transformers.GPTNeoXConfig(
            vocab_size=v, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=512, use_parallel_residual=False, hidden_act="gelu",
            rope_parameters={"rope_type": "default", "rope_theta": 20000.0, "partial_rotary_factor": 0.5}, **s)),
    "smollm3": dict(
        family="smollm3", style="smollm3", vocab=290, seed=23, dtype=torch.bfloat16, embed_std=0.05,
        stds={"mlp": 0.25},  # tied embeddings: see gemma2
        # an explicit no_rope_layers list the interval would not give (the list wins); 1 = RoPE, 0 = NoPE
        config=lambda v, s: transformers.SmolLM3Config(
            vocab_size=v, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, no_rope_layers=[0, 1, 1], no_rope_layer_interval=4, max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 5000000.0}, **s)),
    "smollm3_v4": dict(
        family="smollm3", style="smollm3", vocab=318, seed=24, dtype=torch.bfloat16, v4={}, embed_std=0.05,
        stds={"mlp": 0.25},
        config=lambda v, s: transformers.SmolLM3Config(
            vocab_size=v, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=1, no_rope_layer_interval=4, max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 5000000.0}, **s)),
}


GEMMA_EMBED_STD = 0.05  # x sqrt(64) = 0.4 after scaling


GEMMA_FAMILIES = ("gemma", "gemma2", "gemma3_text")  # RMSNorm (1 + w), embeddings x sqrt(hidden)


def randomise(model: torch.nn.Module, family: str, std: float = 0.15, embed_std: float | None = None,
              stds: dict | None = None) -> None:
    """Replace HF's init with larger random values everywhere: matrices, norm gains, biases.

    HF initialises biases to 0 and norm gains to 1 (Gemma: 0), which would hide bugs in their handling.
    Gemma multiplies embeddings by sqrt(hidden): at full size they swamp the residual stream and every
    seed greedily repeats one token, so its embedding gets a smaller std (`embed_std`, default
    GEMMA_EMBED_STD; other families with tied embeddings may set one too).
    `stds` maps a parameter-name fragment to its own std (Gemma 2's q/k, so that the attention soft-cap bends).
    Every 1-D non-bias parameter is a norm gain, q_norm/k_norm included.
    """
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight") and (family in GEMMA_FAMILIES or embed_std is not None):
                p.normal_(0.0, GEMMA_EMBED_STD if embed_std is None else embed_std)
            elif p.ndim >= 2:
                p.normal_(0.0, next((v for k, v in (stds or {}).items() if k in name), std))
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
            else:  # a norm gain: Gemma stores w in (1 + w)
                p.normal_(0.0 if family in GEMMA_FAMILIES else 1.0, 0.1)


def build(name: str, spec: dict, tok: Tokenizer, seed: int):
    style = TOKENIZER_STYLES[spec["style"]]
    vocab = spec.get("model_vocab", tok.get_vocab_size())
    config = spec["config"](vocab, special_ids(tok, style))
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    randomise(model, spec["family"], embed_std=spec.get("embed_std"), stds=spec.get("stds"))
    model.eval()
    gen = model.generation_config
    for k, v in special_ids(tok, style).items():
        setattr(gen, k, v)
    return model


def save(model, spec: dict, path: Path) -> None:
    dtype = spec.get("dtype", torch.float32)
    kw = {"max_shard_size": spec["max_shard_size"]} if "max_shard_size" in spec else {}
    copy.deepcopy(model).to(dtype).save_pretrained(path, **kw)
    # round the parameters (not the RoPE buffers: transformers recomputes those in float32 on load) to the
    # saved dtype, so the in-memory model equals the file
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).float())
    if spec.get("old_config_spelling"):
        rewrite_config_old_spelling(path / "config.json")
    if spec.get("gemma_hub_activation"):
        rewrite_gemma_activation(path / "config.json")
    if "v4" in spec:
        rewrite_v4(path / "config.json", spec["v4"])


def rewrite_config_old_spelling(file: Path) -> None:
    """config.json as pre-transformers-5 hub checkpoints spell it: rope_theta + rope_scaling, torch_dtype."""
    cfg = json.loads(file.read_text())
    rope = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = rope  # keeps rope_type, factor, low/high_freq_factor, original_max_position_embeddings
    cfg["torch_dtype"] = cfg.pop("dtype")
    cfg["transformers_version"] = "4.46.0"
    file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

def rewrite_gemma_activation(file: Path) -> None:
    """As google/gemma-2b's config.json: hidden_act "gelu" (which transformers reads as the tanh
    approximation, gelu_pytorch_tanh) next to hidden_activation "gelu_pytorch_tanh"."""
    cfg = json.loads(file.read_text())
    cfg["hidden_act"], cfg["hidden_activation"] = "gelu", "gelu_pytorch_tanh"
    file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

# The transformers version each family's hub checkpoints were saved with (as in tests/real_configs/).
V4_VERSION = {"gemma2": "4.42.4", "gemma3_text": "4.52.4", "qwen3": "4.51.0", "phi3": "4.45.0",
              "olmo2": "4.47.0.dev0", "gpt_neox": "4.24.0", "smollm3": "4.54.0"}


def rewrite_v4(file: Path, v4: dict) -> None:
    """config.json as the family's 4.x hub checkpoints spell it (see tests/real_configs/):

    gemma2       rope_theta; no layer_types (alternating by default); hidden_act next to hidden_activation;
                 cache_implementation "hybrid"
    gemma3_text  rope_theta (global) + rope_local_base_freq + rope_scaling (global layers only);
                 sliding_window_pattern instead of layer_types (as gemma-3-1b-it)
    qwen3        int rope_theta, rope_scaling null, no layer_types
    phi3         rope_theta, partial_rotary_factor and original_max_position_embeddings at the top level,
                 rope_scaling {"type": "longrope", long_factor, short_factor} (as Phi-3.5 / Phi-4-mini)
    olmo2        int rope_theta, rope_scaling null
    gpt_neox     int rotary_emb_base + rotary_pct (Pythia), no attention_bias (default true) and no rope_scaling
    smollm3      rope_theta, rope_scaling null; no_rope_layers + no_rope_layer_interval + layer_types kept
    and torch_dtype for dtype everywhere. Keys the 4.x files do not have are dropped.
    """
    cfg = json.loads(file.read_text())
    family = cfg["model_type"]
    rope = cfg.pop("rope_parameters")
    cfg["torch_dtype"] = cfg.pop("dtype")
    cfg["transformers_version"] = V4_VERSION[family]
    n = cfg["num_hidden_layers"]
    if family == "gemma3_text":
        full, local = rope["full_attention"], rope["sliding_attention"]
        cfg["rope_theta"], cfg["rope_local_base_freq"] = full.pop("rope_theta"), local.pop("rope_theta")
        assert local == {"rope_type": "default"}, local
        cfg["rope_scaling"] = None if full == {"rope_type": "default"} else full
        pattern = v4["sliding_window_pattern"]
        expected = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
        assert cfg.pop("layer_types") == expected, "layer_types is not what sliding_window_pattern gives"
        del cfg["_sliding_window_pattern"], cfg["use_bidirectional_attention"]
        cfg.update(sliding_window_pattern=pattern, cache_implementation="hybrid")
    elif family == "phi3":
        cfg["rope_theta"] = rope.pop("rope_theta")
        cfg["partial_rotary_factor"] = rope.pop("partial_rotary_factor")
        rope.pop("original_max_position_embeddings", None)  # the top-level field is the one the hub files carry
        rope["type"] = rope.pop("rope_type")
        cfg["rope_scaling"] = None if rope == {"type": "default"} else rope
        cfg["attention_bias"] = False  # a key of the Phi-3 hub files that Phi3Config no longer has
    elif family == "gpt_neox":
        cfg["rotary_emb_base"], cfg["rotary_pct"] = int(rope.pop("rope_theta")), rope.pop("partial_rotary_factor")
        assert rope == {"rope_type": "default"}, rope
        assert cfg.pop("attention_bias") is True
        for key in ("attention_dropout", "hidden_dropout", "classifier_dropout", "is_decoder", "pad_token_id"):
            cfg.pop(key)
    else:
        theta = rope.pop("rope_theta")
        assert rope == {"rope_type": "default"}, rope
        cfg["rope_theta"] = int(theta) if family in ("qwen3", "olmo2") and theta == int(theta) else theta
        if family == "gemma2":
            default = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
            assert cfg.pop("layer_types") == default
            del cfg["use_bidirectional_attention"]
            cfg.update(hidden_act=cfg["hidden_activation"], cache_implementation="hybrid")
        else:
            cfg["rope_scaling"] = None
        if family == "qwen3":
            assert cfg.pop("layer_types") == ["full_attention"] * n
    file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

# ---------------------------------------------------------------------------------------------
# Reference data.


@torch.no_grad()
def reference(model, ids: list[int]) -> dict:
    x = torch.tensor([ids])
    out = model(x, output_attentions=True)
    seq, gaps = list(ids), []
    for _ in range(N_GREEDY):  # plain loop of full forwards: no cache, no EOS handling
        last = model(torch.tensor([seq])).logits[0, -1]
        top2 = torch.topk(last, 2).values
        gaps.append(float(top2[0] - top2[1]))
        seq.append(int(last.argmax()))
    return {
        "input_ids": np.array(ids, dtype=np.int64),
        "logits": out.logits[0].float().numpy(),
        "greedy_ids": np.array(seq[len(ids):], dtype=np.int64),
        "attentions": torch.stack([a[0] for a in out.attentions]).float().numpy(),
        "min_gap": min(gaps),
    }


@torch.no_grad()
def generate_ids(model, ids: list[int]) -> np.ndarray:
    """model.generate(do_sample=False) with EOS disabled: the cached path, as a cross-check."""
    gen = transformers.GenerationConfig(do_sample=False, max_new_tokens=N_GREEDY, min_new_tokens=0,
                                        eos_token_id=None, pad_token_id=0, bos_token_id=None)
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gen)
    return out[0, len(ids):].numpy()


def check_tokenizer(path: Path, tok: Tokenizer, prompt: str, style: dict) -> str | None:
    """transformers' AutoTokenizer on the saved files must encode exactly as the tokenizers library does."""
    hf = AutoTokenizer.from_pretrained(path)
    ours = tok.encode(prompt).ids
    theirs = hf(prompt)["input_ids"]
    assert ours == theirs, f"{path.name}: AutoTokenizer {theirs[:6]}.. != tokenizers {ours[:6]}.."
    assert (style["bos"] is not None and ours[0] == tok.token_to_id(style["bos"])) == style["add_bos"], path.name
    assert hf.decode(ours, skip_special_tokens=True) == prompt
    if hf.chat_template:
        return hf.apply_chat_template(CHAT_MESSAGES, tokenize=False, add_generation_prompt=True)
    return None


def make(name: str) -> dict:
    spec = FIXTURES[name]
    style = TOKENIZER_STYLES[spec["style"]]
    path = OUT / name
    tok = train_tokenizer(style, spec["vocab"])
    prompt = choose_prompt(tok)
    ids = tok.encode(prompt).ids
    for seed in range(spec["seed"], spec["seed"] + 1000, 100):
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        model = build(name, spec, tok, seed)
        save(model, spec, path)
        save_tokenizer(tok, style, path)
        loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
        ref = reference(loaded, ids)
        crossing = crossing_reference(loaded, ids) if spec.get("crossing") else None
        distinct = len(set(ref["greedy_ids"].tolist()))
        gap = min(ref["min_gap"], crossing["min_gap"]) if crossing else ref["min_gap"]
        if gap > MIN_GAP and distinct >= MIN_DISTINCT:
            break
        print(f"{name}: seed {seed}: top-2 gap {gap:.2e}, {distinct} distinct greedy ids; re-seeding")
    else:
        raise SystemExit(f"{name}: no seed gives a greedy top-2 gap > {MIN_GAP}")
    sanity_checks(name, spec, model, loaded, ids, ref)
    if crossing:
        check_crossing(name, loaded, crossing)
        np.savez_compressed(path / "reference_generate.npz", transformers_version=np.array(transformers.__version__),
                            **{k: v for k, v in crossing.items() if k != "min_gap"})
    chat = check_tokenizer(path, tok, prompt, style)
    arrays = {k: v for k, v in ref.items() if k != "min_gap"}
    arrays.update(prompt=np.array(prompt), transformers_version=np.array(transformers.__version__),
                  torch_version=np.array(torch.__version__))
    if chat is not None:
        arrays["chat_text"] = np.array(chat)
    np.savez_compressed(path / "reference.npz", **arrays)
    return summary(name, spec, loaded, path, ref, seed)


@torch.no_grad()
def sanity_checks(name, spec, built, loaded, ids, ref) -> None:
    x = torch.tensor([ids])
    # 1. the checkpoint as reloaded (incl. a hand-rewritten config.json) computes what the built model computes
    diff = (built(x).logits - loaded(x).logits).abs().max().item()
    assert diff == 0.0, f"{name}: reloaded model differs from the built one by {diff}"
    # 2. the cached path (generate) agrees with the plain argmax loop
    gen = generate_ids(loaded, ids)
    assert (gen == ref["greedy_ids"]).all(), f"{name}: generate {gen} != loop {ref['greedy_ids']}"
    # 3. attention rows are distributions; the sliding window really cuts
    att = ref["attentions"]
    assert np.allclose(att.sum(-1), 1.0, atol=1e-5)
    window = getattr(loaded.config, "sliding_window", None)
    # 4. rope scaling really changes the model (compare with the same weights and plain RoPE)
    rope = getattr(loaded.config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        plain = copy.deepcopy(loaded.config)
        plain.rope_parameters = {"rope_type": "default", "rope_theta": rope["rope_theta"]}
        if "partial_rotary_factor" in rope:
            plain.rope_parameters["partial_rotary_factor"] = rope["partial_rotary_factor"]
        other = AutoModelForCausalLM.from_config(plain, attn_implementation="eager", dtype=torch.float32).eval()
        other.load_state_dict(loaded.state_dict())
        effect = (other(x).logits - loaded(x).logits).abs().max().item()
        assert effect > 1e-2, f"{name}: rope scaling changes logits by only {effect}"
        print(f"{name}: {rope['rope_type']} rope scaling changes logits by up to {effect:.3f}")
    if spec["family"] == "mistral":
        T = len(ids)
        q, k = np.indices((T, T))
        assert window < T
        assert (att[..., (q - k) >= window] == 0).all(), "weights outside the window"
        assert (att[..., (q - k >= 0) & (q - k < window)] > 0).all(), "zero weights inside the window"
    if spec["family"] in LATER_FAMILIES:
        check_windows(name, loaded.config, att)
        if spec["family"] in FAMILY_CHECKS:
            FAMILY_CHECKS[spec["family"]](name, loaded, x)

# ---------------------------------------------------------------------------------------------
# Checks of the families added later: each feature the fixture is meant to exercise really changes the logits.


def sliding_layers(config) -> list[int]:
    """Indices of the layers transformers runs with a sliding window."""
    if getattr(config, "sliding_window", None) is None:
        return []
    types = getattr(config, "layer_types", None)
    if types is None:  # phi3: one window for every layer
        return list(range(config.num_hidden_layers))
    return [i for i, t in enumerate(types) if t == "sliding_attention"]


def check_windows(name: str, config, att: np.ndarray) -> None:
    """Sliding layers: weights exactly 0 at q - k >= window, > 0 inside; full layers see beyond the window."""
    T = att.shape[-1]
    q, k = np.indices((T, T))
    window = getattr(config, "sliding_window", None)
    sliding = sliding_layers(config)
    for layer in range(att.shape[0]):
        a = att[layer]
        if layer in sliding and window < T:  # (a window wider than the prompt, as Phi-3.5's 262144, cuts nothing)
            assert (a[..., (q - k) >= window] == 0).all(), f"{name}: layer {layer}: weights outside the window"
            assert (a[..., (q - k >= 0) & (q - k < window)] > 0).all(), f"{name}: layer {layer}: zeros in window"
        else:
            assert (a[..., q < k] == 0).all() and (a[..., q >= k] > 0).all(), f"{name}: layer {layer} not causal"
    print(f"{name}: sliding window {window} on layers {sliding} of {att.shape[0]}")


@torch.no_grad()
def changed(loaded, x, **fields) -> float:
    """Max |logit difference| against the same weights under a config with `fields` changed."""
    config = copy.deepcopy(loaded.config)
    for key, value in fields.items():
        setattr(config, key, value)
    other = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
    other.load_state_dict(loaded.state_dict())
    return (other(x).logits - loaded(x).logits).abs().max().item()


def must_change(name: str, what: str, effect: float) -> None:
    assert effect > 1e-2, f"{name}: {what} changes the logits by only {effect}"
    print(f"{name}: {what} changes the logits by up to {effect:.3f}")


@torch.no_grad()
def softcap_ratios(model, x) -> tuple[float, float]:
    """max |value before tanh| / cap for the attention scores and for the final logits (how much tanh bends)."""
    seen = {3: 0.0, 4: 0.0}
    real = torch.tanh

    def spy(t):
        seen[t.ndim] = max(seen[t.ndim], t.abs().max().item())
        return real(t)
    torch.tanh = spy
    try:
        model(x)
    finally:
        torch.tanh = real
    return seen[4], seen[3]


def check_gemma2(name, loaded, x):
    c = loaded.config
    attn, final = softcap_ratios(loaded, x)
    print(f"{name}: max |score|/attn cap {attn:.2f} (tanh {np.tanh(attn):.2f}), "
          f"max |logit|/final cap {final:.2f} (tanh {np.tanh(final):.2f})")
    assert attn > 0.8 and final > 0.8, f"{name}: the soft-caps hardly bend (tanh of at most {attn}, {final})"
    must_change(name, "attention soft-capping", changed(loaded, x, attn_logit_softcapping=None))
    must_change(name, "final soft-capping", changed(loaded, x, final_logit_softcapping=None))
    must_change(name, "query_pre_attn_scalar (vs head_dim)" if c.query_pre_attn_scalar != c.head_dim
                else "query_pre_attn_scalar (vs 2 x head_dim)",
                changed(loaded, x, query_pre_attn_scalar=c.head_dim if c.query_pre_attn_scalar != c.head_dim
                        else 2 * c.head_dim))


def check_gemma3(name, loaded, x):
    c = loaded.config
    rope = c.rope_parameters
    full = {"rope_type": "default", "rope_theta": rope["full_attention"]["rope_theta"]}
    must_change(name, "linear scaling on the global layers",
                changed(loaded, x, rope_parameters={**copy.deepcopy(rope), "full_attention": full}))
    local = {"rope_type": "default", "rope_theta": rope["full_attention"]["rope_theta"]}
    must_change(name, "the local theta (vs the global one)",
                changed(loaded, x, rope_parameters={**copy.deepcopy(rope), "sliding_attention": local}))
    must_change(name, "query_pre_attn_scalar", changed(loaded, x, query_pre_attn_scalar=c.head_dim * 2))
    if c.attn_logit_softcapping is not None:
        effect = changed(loaded, x, attn_logit_softcapping=None)
        assert effect == 0.0, f"{name}: Gemma 3 applies attn_logit_softcapping after all ({effect})"
        print(f"{name}: attn_logit_softcapping {c.attn_logit_softcapping} is ignored by Gemma3Attention (effect 0.0)")


def check_smollm3(name, loaded, x):
    n = loaded.config.num_hidden_layers
    must_change(name, "the NoPE layers (vs RoPE everywhere)", changed(loaded, x, no_rope_layers=[1] * n))


def check_gpt_neox(name, loaded, x):
    c = loaded.config
    must_change(name, "use_parallel_residual", changed(loaded, x, use_parallel_residual=not c.use_parallel_residual))


def check_phi3(name, loaded, x):
    rope = loaded.config.rope_parameters
    if rope["rope_type"] == "longrope":  # the prompt (T >= 40) is longer than original_max: long factors
        assert x.shape[1] > rope["original_max_position_embeddings"]
        short = {**copy.deepcopy(rope), "long_factor": list(rope["short_factor"])}
        must_change(name, "long_factor (prompt longer than original_max)", changed(loaded, x, rope_parameters=short))


LATER_FAMILIES = ("gemma2", "gemma3_text", "qwen3", "phi3", "olmo2", "gpt_neox", "smollm3")
FAMILY_CHECKS = {"gemma2": check_gemma2, "gemma3_text": check_gemma3, "smollm3": check_smollm3,
                 "gpt_neox": check_gpt_neox, "phi3": check_phi3}

# ---------------------------------------------------------------------------------------------
# Phi-3 longrope in cached generation: a prompt shorter than original_max_position_embeddings whose greedy
# continuation runs past it.

CROSSING_PROMPT = 20  # tokens of the fixture's prompt; original_max 32
CROSSING_STEPS = 24   # the sequence grows to 44 > 32


@torch.no_grad()
def crossing_reference(model, ids: list[int]) -> dict:
    """model.generate's own ids and per-step logits, and the plain loop of uncached full forwards."""
    prompt = ids[:CROSSING_PROMPT]
    x = torch.tensor([prompt])
    gen = transformers.GenerationConfig(do_sample=False, max_new_tokens=CROSSING_STEPS, min_new_tokens=0,
                                        eos_token_id=None, pad_token_id=0, bos_token_id=None, output_logits=True,
                                        return_dict_in_generate=True)
    out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gen)
    seq, logits, gaps = list(prompt), [], []
    for _ in range(CROSSING_STEPS):
        last = model(torch.tensor([seq])).logits[0, -1]
        top2 = torch.topk(last, 2).values
        gaps.append(float(top2[0] - top2[1]))
        logits.append(last)
        seq.append(int(last.argmax()))
    return {
        "input_ids": np.array(prompt, dtype=np.int64),
        "generate_ids": out.sequences[0, len(prompt):].numpy().astype(np.int64),
        "generate_logits": torch.stack(out.logits)[:, 0].float().numpy(),
        "loop_ids": np.array(seq[len(prompt):], dtype=np.int64),
        "loop_logits": torch.stack(logits).float().numpy(),
        "min_gap": min(gaps),
    }


@torch.no_grad()
def naive_cached_logits(model, prompt: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """What an engine that never recomputes its cache would compute: keys keep the factors they were rotated with."""
    cache = transformers.DynamicCache(config=model.config)
    out = [model(torch.tensor([prompt.tolist()]), cache=cache, use_cache=True).logits[0, -1]]
    for t in tokens[:-1]:
        out.append(model(torch.tensor([[int(t)]]), cache=cache, use_cache=True).logits[0, -1])
    return torch.stack(out).float().numpy()


def check_crossing(name, model, ref) -> None:
    omax = model.config.rope_parameters["original_max_position_embeddings"]
    P, N = len(ref["input_ids"]), len(ref["generate_ids"])
    assert P < omax < P + N, f"{name}: the generation does not cross original_max {omax}"
    assert (ref["generate_ids"] == ref["loop_ids"]).all(), f"{name}: generate != plain loop"
    diff = np.abs(ref["generate_logits"] - ref["loop_logits"]).max()
    assert diff < 1e-4, f"{name}: generate logits differ from the plain loop by {diff}"
    naive = np.abs(naive_cached_logits(model, ref["input_ids"], ref["generate_ids"]) - ref["generate_logits"])
    per_step = naive.max(-1)  # step i > 0 feeds the token at position P + i - 1
    first = int(np.argmax(per_step > 1e-3))
    assert first == omax - P + 1 and per_step[:first].max() < 1e-4 and per_step.max() > 1e-2, per_step
    print(f"{name}: prompt {P}, {N} steps, original_max {omax}: generate == plain loop (max |diff| {diff:.1e}); "
          f"a cache that is never recomputed is off by up to {per_step.max():.3f} from step {first} on "
          f"(the forward that feeds position {P + first - 1}, sequence length {P + first})")


def summary(name, spec, model, path, ref, seed) -> dict:
    c = model.config
    files = sorted(p.name for p in path.iterdir())
    size = sum(p.stat().st_size for p in path.iterdir())
    n_heads = c.num_attention_heads
    return dict(
        name=name, model_type=c.model_type, seed=seed, layers=c.num_hidden_layers, hidden=c.hidden_size,
        heads=n_heads, kv_heads=getattr(c, "num_key_value_heads", n_heads),
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // n_heads, vocab=c.vocab_size,
        dtype=str(spec.get("dtype", torch.float32)).replace("torch.", ""),
        shards=sum(f.startswith("model-") for f in files) or 1, tied=c.tie_word_embeddings,
        T=len(ref["input_ids"]), min_gap=round(ref["min_gap"], 4), kb=size // 1024)


def main(names: list[str]) -> None:
    for name in names or list(FIXTURES):
        print(json.dumps(make(name)))


if __name__ == "__main__":
    main(sys.argv[1:])

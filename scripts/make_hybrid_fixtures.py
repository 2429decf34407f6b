"""Write the hybrid families' parity fixtures under tests/fixtures/<name>/ (needs torch + transformers).

    /root/ref/bin/python scripts/make_hybrid_fixtures.py            # all
    /root/ref/bin/python scripts/make_hybrid_fixtures.py lfm2 qwen3_5_text
    /root/ref/bin/python scripts/make_hybrid_fixtures.py --inspect    # reference_inspect.npz (lens, ablation)

Tiny random checkpoints of the families whose layers are not all attention (Qwen3.5's Gated DeltaNet,
LFM2's short convolutions, Granite 4.0-H's and Falcon-H1's Mamba2), made as scripts/make_fixtures.py
makes the others (its tokenizer styles and training; float32 on disk, reloaded from disk, eager
attention) and `reference.npz`:

    input_ids        (T,)            the prompt; T is longer than every conv kernel, Gated DeltaNet's
                                     64-token chunk and the fixture's Mamba2 chunk
    logits           (T, V)          one forward over the prompt
    greedy_ids       (20,)           greedy continuation: a loop of full forwards, no cache
    attentions       (A, H, T, T)    output_attentions of the A attention layers, in layer order
    attention_layers (A,)            which layers those are
    logits_pieces    (T, V)          transformers' own cached run over the prompt in pieces (PIECES), to
                                     compare with its one-shot logits (two algorithms of one recurrence)
    prompt, transformers_version, torch_version

Granite 4.0-H with routed experts (EXPERT_FIXTURES) also gets `expert_reference.npz` (the routing and
expert ablations, as scripts/make_family_fixtures.py makes it for GraniteMoE), and both its MLPs, the
experts and the shared one, are checked to move the logits.

`_v4` fixtures have config.json rewritten into the 4.x spelling (rope_theta at the top level,
torch_dtype, the family's old field names) and are checked to load into identical logits.
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
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import (MIN_DISTINCT, MIN_GAP, N_GREEDY, OUT, PROMPT_WORDS, TOKENIZER_STYLES,  # noqa: E402
                           check_tokenizer, generate_ids, save_tokenizer, special_ids, train_tokenizer)

PIECES = (0, 5, 23, 70)   # the prompt is fed as [0:5], [5:23], [23:70], [70:T]: pieces shorter than and
                          # crossing the conv kernel and the chunks
MIN_TOKENS = 80
EXPERT_FIXTURES = ("granitemoehybrid_moe", "granitemoehybrid_moe_v4")   # also get expert_reference.npz


def prompt_of(tok, n: int = MIN_TOKENS) -> str:
    words = []
    while len(tok.encode(" ".join(words)).ids) < n:
        words.append(PROMPT_WORDS[len(words) % len(PROMPT_WORDS)])
    return " ".join(words)


def qwen3_5_text(v, s, **kw):
    base = dict(vocab_size=v, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                max_position_embeddings=512, tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                 "mrope_section": [1, 1, 0], "mrope_interleaved": True}, **s)
    base.update(kw)
    return transformers.Qwen3_5TextConfig(**base)


def qwen3_5(v, s):
    """As published: a Qwen3_5ForConditionalGeneration with a (tiny) vision tower."""
    text = qwen3_5_text(v, s, tie_word_embeddings=True).to_dict()
    vision = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=32, out_hidden_size=32, patch_size=4,
                  temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16)
    return transformers.Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=True,
                                      # ids the fixture's prompt and greedy tokens do not use (minigen refuses
                                      # an image token in a prompt; transformers reads them only with pixels)
                                      image_token_id=v - 2, video_token_id=v - 3, vision_start_token_id=v - 4,
                                      vision_end_token_id=v - 6)


def lfm2(v, s, **kw):
    base = dict(vocab_size=v, hidden_size=32, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, conv_L_cache=3, conv_bias=False,
                block_multiple_of=16, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True,
                layer_types=["conv", "full_attention", "conv", "full_attention"], tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **s)
    base.update(kw)
    return transformers.Lfm2Config(**base)


def granite(v, s, **kw):
    base = dict(vocab_size=v, hidden_size=32, intermediate_size=64, shared_intermediate_size=48, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, num_local_experts=0,
                mamba_n_heads=4, mamba_n_groups=2, mamba_d_state=8, mamba_d_head=16, mamba_expand=2, mamba_d_conv=4,
                mamba_chunk_size=16, mamba_conv_bias=True, mamba_proj_bias=False,
                layer_types=["mamba", "attention", "mamba", "mamba"], position_embedding_type="nope",
                embedding_multiplier=3.0, attention_multiplier=0.2, residual_multiplier=0.6, logits_scaling=1.5,
                tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **s)
    base.update(kw)
    return transformers.GraniteMoeHybridConfig(**base)


def falcon_h1(v, s, **kw):
    base = dict(vocab_size=v, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=512, mamba_d_ssm=32, mamba_n_heads=4,
                mamba_d_head=8, mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4, mamba_chunk_size=16,
                mamba_rms_norm=False, mamba_norm_before_gate=False, mamba_conv_bias=True, mamba_proj_bias=False,
                projectors_bias=False, tie_word_embeddings=False,
                embedding_multiplier=1.5, lm_head_multiplier=0.7, key_multiplier=0.9, attention_in_multiplier=1.1,
                attention_out_multiplier=0.8, ssm_in_multiplier=1.2, ssm_out_multiplier=0.9,
                mlp_multipliers=[1.3, 0.6], ssm_multipliers=[0.9, 1.1, 1.2, 0.8, 1.05],
                rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, **s)
    base.update(kw)
    return transformers.FalconH1Config(**base)


FIXTURES = {
    "qwen3_5_text": dict(style="qwen3", vocab=320, seed=31, config=qwen3_5_text),
    "qwen3_5_text_v4": dict(style="qwen3", vocab=316, seed=32, v4=True,
                            config=lambda v, s: qwen3_5_text(v, s, num_hidden_layers=4, num_key_value_heads=1,
                                                             tie_word_embeddings=True)),
    "qwen3_5": dict(style="qwen3", vocab=324, seed=33, config=qwen3_5),
    "lfm2": dict(style="llama_chatml", vocab=312, seed=34, config=lfm2),
    "lfm2_v4": dict(style="llama_chatml", vocab=308, seed=35, v4=True,
                    config=lambda v, s: lfm2(v, s, conv_bias=True, tie_word_embeddings=False,
                                             layer_types=["conv", "conv", "full_attention"], num_hidden_layers=3)),
    "granitemoehybrid": dict(style="llama_chatml", vocab=304, seed=36, config=granite),
    "granitemoehybrid_attn": dict(style="llama_chatml", vocab=300, seed=37, v4=True,
                                  config=lambda v, s: granite(v, s, layer_types=["attention"] * 2, num_hidden_layers=2,
                                                              position_embedding_type="rope")),
    # Granite 4.0-H Tiny / Small's MLP: routed experts (intermediate_size each) plus the shared MLP; a vocabulary
    # of a multiple of 8, which llama.cpp's converter keeps as it is (it pads a Mamba2 model's token list to one)
    "granitemoehybrid_moe": dict(style="llama_chatml", vocab=312, seed=40,
                                 config=lambda v, s: granite(v, s, num_local_experts=8, num_experts_per_tok=3,
                                                             intermediate_size=16, shared_intermediate_size=24)),
    "granitemoehybrid_moe_v4": dict(style="llama_chatml", vocab=296, seed=41, v4=True,
                                    config=lambda v, s: granite(v, s, num_local_experts=5, num_experts_per_tok=2,
                                                                intermediate_size=24, shared_intermediate_size=16,
                                                                num_hidden_layers=3, position_embedding_type="rope",
                                                                layer_types=["mamba", "mamba", "attention"],
                                                                tie_word_embeddings=True)),
    "falcon_h1": dict(style="llama_chatml", vocab=296, seed=38, config=falcon_h1),
    "falcon_h1_v4": dict(style="llama_chatml", vocab=292, seed=39, v4=True,
                         config=lambda v, s: falcon_h1(v, s, mamba_rms_norm=True, mamba_norm_before_gate=True,
                                                       mamba_n_groups=2, tie_word_embeddings=True)),
}


def randomise(model: torch.nn.Module, std: float = 0.15) -> None:
    """Larger random values than HF's init everywhere (norm gains around 1, Qwen3.5's zero-centred ones
    around 0; A_log in (-1, 1) so the decays vary; biases N(0, 0.1))."""
    zero_centred = model.config.model_type.startswith("qwen3_5")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, std)
            elif name.endswith("A_log"):
                p.uniform_(-1.0, 1.0)
            elif name.endswith("bias") or name.endswith(".D"):
                p.normal_(0.0, 0.1 if name.endswith("bias") else 1.0)
            elif zero_centred and "linear_attn.norm" not in name:
                p.normal_(0.0, 0.1)
            else:
                p.normal_(1.0, 0.1)


def rewrite_v4(file: Path) -> None:
    """The 4.x spelling: rope_theta (and partial_rotary_factor) at the top level, torch_dtype; LFM2's
    block_ff_dim / tie_embedding and full_attn_idxs; Granite's "mamba"/"attention" layer types."""
    cfg = json.loads(file.read_text())
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    if "partial_rotary_factor" in rope:
        cfg["partial_rotary_factor"] = rope.pop("partial_rotary_factor")
    rope.pop("rope_type")
    cfg["rope_scaling"] = rope or None   # Qwen3.5's mrope_section stays here, as in rope_scaling of Qwen2-VL
    cfg["torch_dtype"] = cfg.pop("dtype")
    cfg["transformers_version"] = "4.57.0"
    family = cfg["model_type"]
    if family == "lfm2":
        cfg["block_ff_dim"] = cfg.pop("intermediate_size")
        cfg["tie_embedding"] = cfg.pop("tie_word_embeddings")
        cfg["full_attn_idxs"] = [i for i, t in enumerate(cfg.pop("layer_types")) if t == "full_attention"]
    if family == "granitemoehybrid":
        cfg["layer_types"] = ["mamba" if t == "linear_attention" else "attention" for t in cfg["layer_types"]]
    if family == "qwen3_5_text":
        cfg.pop("layer_types")
        cfg["full_attention_interval"] = 4
    file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def attention_layers(config) -> list[int]:
    c = getattr(config, "text_config", None) or config
    if c.model_type == "falcon_h1":
        return list(range(c.num_hidden_layers))
    return [i for i, t in enumerate(c.layer_types) if t in ("full_attention", "attention")]


@torch.no_grad()
def reference(model, ids: list[int]) -> dict:
    x = torch.tensor([ids])
    out = model(x, output_attentions=True)
    seq, gaps = list(ids), []
    for _ in range(N_GREEDY):
        last = model(torch.tensor([seq])).logits[0, -1]
        top2 = torch.topk(last, 2).values
        gaps.append(float(top2[0] - top2[1]))
        seq.append(int(last.argmax()))
    cache, pieces = None, []
    bounds = list(PIECES) + [len(ids)]
    for a, b in zip(bounds, bounds[1:]):
        o = model(x[:, a:b], cache=cache, use_cache=True)
        cache = o.cache if hasattr(o, "cache") else o.past_key_values
        pieces.append(o.logits[0])
    return {"input_ids": np.array(ids, dtype=np.int64), "logits": out.logits[0].float().numpy(),
            "greedy_ids": np.array(seq[len(ids):], dtype=np.int64),
            "attentions": torch.stack([a[0] for a in out.attentions]).float().numpy(),
            "attention_layers": np.array(attention_layers(model.config), dtype=np.int64),
            "logits_pieces": torch.cat(pieces).float().numpy(), "min_gap": min(gaps)}


def build(spec: dict, tok, seed: int):
    style = TOKENIZER_STYLES[spec["style"]]
    config = spec["config"](tok.get_vocab_size(), special_ids(tok, style))
    torch.manual_seed(seed)
    cls = transformers.Qwen3_5ForConditionalGeneration if config.model_type == "qwen3_5" else AutoModelForCausalLM
    model = cls.from_config(config, attn_implementation="eager", dtype=torch.float32) if cls is AutoModelForCausalLM \
        else cls._from_config(config, attn_implementation="eager", dtype=torch.float32)
    randomise(model)
    model.eval()
    for k, v in special_ids(tok, style).items():
        setattr(model.generation_config, k, v)
    return model


def load(path: Path, model_type: str):
    cls = transformers.Qwen3_5ForConditionalGeneration if model_type == "qwen3_5" else AutoModelForCausalLM
    return cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def make(name: str) -> None:
    spec = FIXTURES[name]
    style = TOKENIZER_STYLES[spec["style"]]
    path = OUT / name
    tok = train_tokenizer(style, spec["vocab"])
    prompt = prompt_of(tok)
    ids = tok.encode(prompt).ids
    for seed in range(spec["seed"], spec["seed"] + 1000, 100):
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        model = build(spec, tok, seed)
        model.save_pretrained(path)
        built_type = model.config.model_type
        if spec.get("v4"):
            rewrite_v4(path / "config.json")
        save_tokenizer(tok, style, path)
        loaded = load(path, built_type)
        ref = reference(loaded, ids)
        distinct = len(set(ref["greedy_ids"].tolist()))
        if ref["min_gap"] > MIN_GAP and distinct >= MIN_DISTINCT:
            break
        print(f"{name}: seed {seed}: gap {ref['min_gap']:.2e}, {distinct} distinct; re-seeding")
    else:
        raise SystemExit(f"{name}: no seed gives a greedy top-2 gap > {MIN_GAP}")
    with torch.no_grad():
        x = torch.tensor([ids])
        diff = (model(x).logits - loaded(x).logits).abs().max().item()
    assert diff == 0.0, f"{name}: the reloaded checkpoint differs from the built one by {diff}"
    loaded.generation_config.eos_token_id = None   # else generate() stops at an EOS the loop goes past
    gen = generate_ids(loaded, ids)
    assert (gen == ref["greedy_ids"]).all(), f"{name}: generate {gen} != loop {ref['greedy_ids']}"
    check_tokenizer(path, tok, prompt, style)
    if getattr(loaded.config, "num_local_experts", 0):
        check_experts_matter(name, loaded, ids)
    arrays = {k: v for k, v in ref.items() if k != "min_gap"}
    arrays.update(prompt=np.array(prompt), transformers_version=np.array(transformers.__version__),
                  torch_version=np.array(torch.__version__))
    np.savez_compressed(path / "reference.npz", **arrays)
    pieces = np.abs(ref["logits_pieces"] - ref["logits"]).max()
    size = sum(f.stat().st_size for f in path.iterdir())
    print(f"{name}: seed {seed}, T={len(ids)}, attention layers {ref['attention_layers'].tolist()}, "
          f"transformers pieces vs one shot {pieces:.2e}, {size / 1e3:.0f} KB")


@torch.no_grad()
def check_experts_matter(name: str, model, ids: list[int]) -> None:
    """Granite 4.0-H with routed experts: the experts' sum and the shared MLP each move the logits by > 1e-2
    when their output is zeroed (forward hooks on every layer), so that the fixture tests both."""
    x = torch.tensor([ids])
    clean = model(x).logits
    for module in ("block_sparse_moe", "shared_mlp"):
        zero = lambda m, i, o: torch.zeros_like(o)
        handles = [getattr(layer, module).register_forward_hook(zero) for layer in model.model.layers]
        moved = (model(x).logits - clean).abs().max().item()
        for h in handles:
            h.remove()
        assert moved > 1e-2, f"{name}: zeroing every {module} moves the logits by only {moved:.2e}"
        print(f"{name}: zeroing every layer's {module} moves the logits by {moved:.3f}")


# --- lens and ablation, from transformers' hidden states and forward hooks ------------------------------

INSPECT = {"qwen3_5_text": ("linear_attn", 0), "qwen3_5": ("linear_attn", 1), "lfm2": ("conv", 0), "granitemoehybrid": ("mamba", 0),
           "granitemoehybrid_moe": ("mamba", 0),
           "falcon_h1": ("mamba+self_attn", 1)}   # fixture -> (the token mixer modules of a layer, that layer)


@torch.no_grad()
def inspect_reference(name: str) -> None:
    """reference_inspect.npz beside reference.npz: `lens` (L + 1, T, V), the logit lens as transformers'
    output_hidden_states give it (row l < L: hidden state l through the final norm, lm_head and the
    family's logit multiplier; row L: the logits), and `ablated` (T, V), the logits with one layer's
    token mixer's output zeroed by forward hooks (`ablated_layer`; Falcon-H1: both its Mamba2 and its
    attention, whose sum is the layer's mixer output)."""
    path = OUT / name
    model = load(path, json.loads((path / "config.json").read_text())["model_type"])
    ids = torch.tensor([np.load(path / "reference.npz")["input_ids"].tolist()])
    out = model(ids, output_hidden_states=True)
    inner = getattr(model.model, "language_model", model.model)
    final_norm = getattr(inner, "norm", None) or getattr(inner, "embedding_norm", None) or inner.final_layernorm
    scale = 1.0 / model.config.logits_scaling if hasattr(model.config, "logits_scaling") else \
        getattr(model.config, "lm_head_multiplier", 1.0)
    rows = [model.lm_head(final_norm(h)) * scale for h in out.hidden_states[:-1]] + [out.logits]
    module, layer = INSPECT[name]
    zero = lambda m, i, o: (torch.zeros_like(o[0]),) + tuple(o[1:]) if isinstance(o, tuple) else torch.zeros_like(o)
    handles = [getattr(inner.layers[layer], m).register_forward_hook(zero) for m in module.split("+")]
    ablated = model(ids).logits
    for h in handles:
        h.remove()
    np.savez_compressed(path / "reference_inspect.npz", lens=torch.cat(rows).float().numpy(),
                        ablated=ablated[0].float().numpy(), ablated_layer=np.int64(layer),
                        transformers_version=np.array(transformers.__version__))
    print(f"{name}: lens {len(rows)} rows, layer {layer}'s {module} ablated: logits move by "
          f"{(ablated - out.logits).abs().max().item():.3f}")


def main(names: list[str]) -> None:
    if names[:1] == ["--inspect"]:
        for name in names[1:] or INSPECT:
            inspect_reference(name)
        return
    from make_family_fixtures import expert_reference   # expert_reference.npz, as for the GraniteMoE fixtures

    for name in names or FIXTURES:
        make(name)
        if name in EXPERT_FIXTURES:
            expert_reference(name)


if __name__ == "__main__":
    main(sys.argv[1:])

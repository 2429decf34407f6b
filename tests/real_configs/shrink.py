"""Scaled-down copies of the real config.json files in this directory, written under the tensor
naming and file layout of the real checkpoint. numpy + safetensors + tokenizers only, so both
tests/test_real_configs.py and scripts/make_real_config_fixtures.py (which adds torch) use it.

`shrink(real)` keeps every field and quirk of the real config.json (spellings, int rope_theta,
`sliding_window` with `use_sliding_window: false`, `hidden_act: "gelu"` beside `hidden_activation`,
explicit `head_dim`, eos lists, token ids) and shrinks only the sizes: 2 layers, vocab 64, hidden
32-64, the real query-heads-per-KV-head ratio, and `head_dim` given explicitly iff the real one is,
unequal to hidden/heads iff the real one is.

`LAYOUTS` says how each real checkpoint stores its tensors (read off the hub's
model.safetensors / model.safetensors.index.json): name prefix, GPT-2's causal-mask buffers,
whether lm_head.weight is on disk, how many shards, stray files beside the HF ones.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

HERE = Path(__file__).resolve().parent
VOCAB = 64
N_LAYERS = 2

# name -> how the real checkpoint lays its tensors out on disk
LAYOUTS = {
    # original OpenAI-converted names: no `transformer.` prefix, h.N.attn.bias / masked_bias buffers
    "gpt2": dict(prefix="", gpt2_buffers=True, lm_head=False, shards=1),
    "distilgpt2": dict(prefix="transformer.", gpt2_buffers=True, lm_head=False, shards=1),
    "SmolLM2-135M": dict(lm_head=False, shards=1),
    "SmolLM2-135M-Instruct": dict(lm_head=False, shards=1),
    "SmolLM2-360M": dict(lm_head=False, shards=1),
    "SmolLM2-1.7B-Instruct": dict(lm_head=False, shards=1),
    "SmolLM-135M": dict(lm_head=False, shards=1),
    "Qwen2.5-0.5B": dict(lm_head=False, shards=1),
    "Qwen2.5-0.5B-Instruct": dict(lm_head=False, shards=1),
    "Qwen2.5-1.5B-Instruct": dict(lm_head=False, shards=1),
    "Qwen2-0.5B": dict(lm_head=False, shards=1),
    "Llama-3.2-1B": dict(lm_head=False, shards=1),
    "Llama-3.2-1B-Instruct": dict(lm_head=False, shards=1),
    "Llama-3.2-3B-Instruct": dict(lm_head=False, shards=2),
    "TinyLlama-1.1B-Chat-v1.0": dict(lm_head=True, shards=1),
    "Mistral-7B-v0.1": dict(lm_head=True, shards=2),
    # the v0.3 repo also ships Mistral's own consolidated.safetensors (different names) beside the HF shards
    "Mistral-7B-v0.3": dict(lm_head=True, shards=3, consolidated=True),
    "gemma-2b": dict(lm_head=False, shards=2),
    "gemma-1.1-2b-it": dict(lm_head=False, shards=2),
    "gemma-7b": dict(lm_head=False, shards=4),
}
NAMES = sorted(LAYOUTS)


def real_config(name: str) -> dict:
    return json.loads((HERE / f"{name}.json").read_text(encoding="utf-8"))


def shrink(real: dict) -> dict:
    """The real config.json with its sizes shrunk (every other field kept as on the hub)."""
    c = copy.deepcopy(real)
    if c["model_type"] == "gpt2":
        c.update(n_embd=48, n_head=4, n_layer=N_LAYERS, vocab_size=VOCAB, n_positions=48)
        if "n_ctx" in c:
            c["n_ctx"] = 48
        return c
    H, KV = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    group = H // KV
    kv = 4 if group == 1 else 2 if group <= 4 else 1
    heads, d = kv * group, 8
    hidden = heads * d
    ratio = c["intermediate_size"] / c["hidden_size"]
    c.update(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=N_LAYERS, vocab_size=VOCAB,
             intermediate_size=int(round(hidden * ratio)))
    if "num_key_value_heads" in c:
        c["num_key_value_heads"] = kv
    if "head_dim" in c:  # keep the convention: equal to hidden/heads or not, as in the real file
        c["head_dim"] = d if real["head_dim"] * real["num_attention_heads"] == real["hidden_size"] else 12
    if c.get("sliding_window"):
        # Mistral v0.1: a window the 16-token prompt exceeds. Qwen2: a tiny window that must stay
        # unused (use_sliding_window is false), with max_window_layers inside the 2 layers.
        c["sliding_window"] = 8 if c["model_type"] == "mistral" else 4
        if "max_window_layers" in c:
            c["max_window_layers"] = 1
    return c


def head_dim(cfg: dict) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def random_tensors(cfg: dict, seed: int = 0, std: float = 0.15) -> dict:
    """Random float32 weights for a (shrunk) config, named as transformers' save_pretrained names them."""
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) * std).astype(np.float32)
    gain = lambda n: (1 + rng.standard_normal(n) * 0.1).astype(np.float32)
    if cfg["model_type"] == "gpt2":
        D, V, P, L = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], cfg["n_layer"]
        F = cfg.get("n_inner") or 4 * D
        t = {"transformer.wte.weight": w(V, D), "transformer.wpe.weight": w(P, D),
             "transformer.ln_f.weight": gain(D), "transformer.ln_f.bias": w(D)}
        for i in range(L):
            p = f"transformer.h.{i}."
            t.update({p + "ln_1.weight": gain(D), p + "ln_1.bias": w(D), p + "ln_2.weight": gain(D),
                      p + "ln_2.bias": w(D), p + "attn.c_attn.weight": w(D, 3 * D), p + "attn.c_attn.bias": w(3 * D),
                      p + "attn.c_proj.weight": w(D, D), p + "attn.c_proj.bias": w(D),
                      p + "mlp.c_fc.weight": w(D, F), p + "mlp.c_fc.bias": w(F),
                      p + "mlp.c_proj.weight": w(F, D), p + "mlp.c_proj.bias": w(D)})
        t["lm_head.weight"] = t["transformer.wte.weight"]
        return t
    D, V, F, L = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    hd = head_dim(cfg)
    q, kv = cfg["num_attention_heads"] * hd, cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * hd
    norm = (lambda n: w(n)) if cfg["model_type"] == "gemma" else gain  # Gemma stores w of (1 + w)
    # Gemma multiplies embeddings by sqrt(D): smaller ones keep the tied head from mostly echoing the last token
    embed = w(V, D) / np.float32(D ** 0.5) if cfg["model_type"] == "gemma" else w(V, D)
    t = {"model.embed_tokens.weight": embed, "model.norm.weight": norm(D)}
    for i in range(L):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": norm(D), p + "post_attention_layernorm.weight": norm(D),
                  p + "self_attn.q_proj.weight": w(q, D), p + "self_attn.k_proj.weight": w(kv, D),
                  p + "self_attn.v_proj.weight": w(kv, D), p + "self_attn.o_proj.weight": w(D, q),
                  p + "mlp.gate_proj.weight": w(F, D), p + "mlp.up_proj.weight": w(F, D),
                  p + "mlp.down_proj.weight": w(D, F)})
        if cfg["model_type"] == "qwen2":
            t.update({p + "self_attn.q_proj.bias": w(q), p + "self_attn.k_proj.bias": w(kv),
                      p + "self_attn.v_proj.bias": w(kv)})
    t["lm_head.weight"] = t["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", cfg["model_type"] == "gemma") else w(V, D)
    return t


def real_layout(tensors: dict, cfg: dict, layout: dict) -> dict:
    """Rename/add/drop tensors the way the real checkpoint stores them."""
    out = {}
    for k, v in tensors.items():
        if k == "lm_head.weight":
            if layout.get("lm_head"):
                out[k] = np.ascontiguousarray(v)
            continue
        if cfg["model_type"] == "gpt2" and k.startswith("transformer."):
            k = layout.get("prefix", "") + k[len("transformer."):]
        out[k] = np.ascontiguousarray(v)
    if layout.get("gpt2_buffers"):
        P, prefix = cfg["n_positions"], layout.get("prefix", "")
        for i in range(cfg["n_layer"]):
            out[f"{prefix}h.{i}.attn.bias"] = np.tril(np.ones((P, P), np.float32))[None, None]
            out[f"{prefix}h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    return out


def write_tokenizer(path: Path, vocab_size: int = VOCAB) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))


def write_checkpoint(path: Path, cfg: dict, tensors: dict, layout: dict, dtype: str = "float32") -> Path:
    """config.json (the shrunk real one), safetensors in the real layout (sharded + index if the
    real one is), tokenizer.json; returns path. dtype "bfloat16" (as the real files) needs torch."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tensors = real_layout(tensors, cfg, layout)
    n = layout.get("shards", 1)
    if dtype == "bfloat16":
        import torch
        from safetensors.torch import save_file as save_torch
        tensors = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in tensors.items()}
        save = lambda d, f, metadata: save_torch(d, f, metadata=metadata)
    else:
        save = save_file
    if n == 1:
        save(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    else:
        names = list(tensors)
        chunks = [names[i::n] for i in range(n)]
        weight_map = {}
        for j, chunk in enumerate(chunks, 1):
            shard = f"model-{j:05d}-of-{n:05d}.safetensors"
            save({k: tensors[k] for k in chunk}, str(path / shard), metadata={"format": "pt"})
            weight_map.update({k: shard for k in chunk})
        total = sum(a.nbytes if hasattr(a, "nbytes") else a.numel() * a.element_size() for a in tensors.values())
        (path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2))
    if layout.get("consolidated"):  # Mistral's own format beside the HF files; minigen must not read it
        save_file({"tok_embeddings.weight": np.zeros((2, 2), np.float32)}, str(path / "consolidated.safetensors"))
    write_tokenizer(path, cfg["vocab_size"])
    return path

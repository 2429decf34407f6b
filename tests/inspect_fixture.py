"""A GPT-2 checkpoint built by hand with a previous-token head (layer 0, head 0) and an induction head
(layer 1, head 0); heads 1 have zero q/k/v, so they attend uniformly. MLPs are zero.

Residual stream layout (D = 2V + P): token one-hot [0, V), position one-hot [V, V+P), and the previous
token's one-hot [V+P, 2V+P), written by the layer-0 head. LayerNorm (weight 1, bias 0) only shifts and
scales these one-hots by the same amounts for every token, so the matches below survive it.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

WORDS = list("abcdefghij")
V, P, H = len(WORDS) + 1, 16, 2       # + "<unk>"
D = 2 * V + P
HD = D // H


def make_induction_gpt2(path: Path, a: float = 5.0, b: float = 8.0, copy: float = 0.0) -> Path:
    """`copy` > 0: the induction head's output projection also writes the token it attends to into the
    token block, scaled by `copy`, so that the model predicts it (a model whose answer one head carries)."""
    path.mkdir(parents=True, exist_ok=True)
    tok, pos, prev = 0, V, V + P                                 # offsets of the three one-hot blocks
    embed = np.zeros((V, D), np.float32)
    embed[np.arange(V), tok + np.arange(V)] = 1
    wpe = np.zeros((P, D), np.float32)
    wpe[np.arange(P), pos + np.arange(P)] = 1
    t = {"wte.weight": embed, "wpe.weight": wpe,
         "ln_f.weight": np.ones(D, np.float32), "ln_f.bias": np.zeros(D, np.float32)}
    for layer in range(2):
        qkv = np.zeros((D, 3 * D), np.float32)                   # Conv1D: (in, out), head 0 = first HD cols
        proj = np.zeros((D, D), np.float32)
        if layer == 0:   # previous-token head: q = position i, k = position j + 1, v = token
            qkv[pos + np.arange(P), np.arange(P)] = a
            qkv[pos + np.arange(P), D + 1 + np.arange(P)] = 1
            qkv[tok + np.arange(V), 2 * D + np.arange(V)] = 1
            proj[np.arange(V), prev + np.arange(V)] = 0.25       # ~ the LayerNorm's 1/sigma undone
        else:            # induction head: q = this token, k = the token before the key
            qkv[tok + np.arange(V), np.arange(V)] = b
            qkv[prev + np.arange(V), D + np.arange(V)] = 1
            qkv[tok + np.arange(V), 2 * D + np.arange(V)] = 1
            proj[np.arange(V), tok + np.arange(V)] = copy
        t.update({f"h.{layer}.ln_1.weight": np.ones(D, np.float32), f"h.{layer}.ln_1.bias": np.zeros(D, np.float32),
                  f"h.{layer}.attn.c_attn.weight": qkv, f"h.{layer}.attn.c_attn.bias": np.zeros(3 * D, np.float32),
                  f"h.{layer}.attn.c_proj.weight": proj, f"h.{layer}.attn.c_proj.bias": np.zeros(D, np.float32),
                  f"h.{layer}.ln_2.weight": np.ones(D, np.float32), f"h.{layer}.ln_2.bias": np.zeros(D, np.float32),
                  f"h.{layer}.mlp.c_fc.weight": np.zeros((D, 4), np.float32), f"h.{layer}.mlp.c_fc.bias": np.zeros(4, np.float32),
                  f"h.{layer}.mlp.c_proj.weight": np.zeros((4, D), np.float32), f"h.{layer}.mlp.c_proj.bias": np.zeros(D, np.float32)})
    save_file(t, str(path / "model.safetensors"))
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": V, "n_embd": D,
              "n_head": H, "n_layer": 2, "n_positions": P, "n_inner": 4, "layer_norm_epsilon": 1e-5,
              "activation_function": "gelu_new", "tie_word_embeddings": True}
    (path / "config.json").write_text(json.dumps(config))
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS + ["<unk>"])}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.add_special_tokens(["<unk>"])
    tk.save(str(path / "tokenizer.json"))
    return path


# --- a random model of any family, built in memory (no checkpoint, no reference) ---------------------

FAMILY_EXTRAS = {  # what a family's config.json needs beyond the common sizes
    "gpt2": {}, "llama": {}, "mistral": {"sliding_window": 5}, "qwen2": {}, "qwen3": {},
    "gemma": {}, "gemma2": {"sliding_window": 5}, "gemma3_text": {"sliding_window": 5, "sliding_window_pattern": 2},
    "phi3": {}, "olmo2": {}, "gpt_neox": {"rotary_pct": 0.5}, "smollm3": {"no_rope_layer_interval": 2},
}


def random_model(model_type: str, seed: int = 0, n_layers: int = 3):
    """A Model of `model_type` with random float32 weights in minigen's canonical layout (weights.expected_shapes):
    for invariants that hold whatever the weights (lens, DLA, ablation, patching) on families without fixtures."""
    from minigen.checkpoint.config import parse_config
    from minigen.engine.model import Model
    from minigen.checkpoint.weights import expected_shapes
    raw = {"model_type": model_type, "vocab_size": 40, "hidden_size": 24, "num_hidden_layers": n_layers,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 6, "intermediate_size": 32,
           "max_position_embeddings": 64, **FAMILY_EXTRAS[model_type]}
    cfg = parse_config(raw)
    glob, layers = expected_shapes(cfg)
    rng = np.random.default_rng(seed)

    def tensor(name, shape):
        if "norm" in name and not name.endswith("_b"):
            return (1 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        return (0.4 * rng.standard_normal(shape)).astype(np.float32)
    params = {k: tensor(k, s) for k, s in glob.items()}
    params["layers"] = [{k: tensor(k, s) for k, s in layer.items()} for layer in layers]
    return Model(cfg, params)

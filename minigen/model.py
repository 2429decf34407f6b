"""The decoder forward pass: stateless functions of (params, config, token ids, cache) -> logits.

Shape letters:
    T  new tokens in this forward         S  tokens in the cache after it (offset + T)
    D  hidden size                        V  vocabulary size
    H  query heads      KV  key/value heads      G  H // KV (query heads per KV head)
    d  head_dim         F  MLP intermediate size

Weights are HF's Linear layout (out, in), applied as x @ w.T; q/k/v and gate/up are fused at load
(weights.py). One function serves every family: the differences are the fields of `cfg.family`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .attention import causal_attention
from .cache import KVCache, make_cache
from .config import Config, load_config
from .errors import MinigenError, read_json_object
from .layers import activation, apply_rope, layer_norm, rms_norm, rope_frequencies, rope_tables
from .tokenizer import Tokenizer
from .weights import load_params


# --- the forward pass ------------------------------------------------------------------------------

def forward(params: dict, cfg: Config, ids: np.ndarray, cache: list[KVCache],
            last_only: bool = False, record: list | None = None) -> np.ndarray:
    """Logits (T, V), or (1, V) for the last position only. Appends each layer's attention weights
    (H, T, S) to `record` when it is a list; the cache advances by T."""
    x = hidden(params, cfg, ids, cache, record)                              # (T, D)
    if last_only:
        x = x[-1:]                                                           # (1, D)
    return norm(x, params, cfg, "final_norm") @ params["lm_head"].T          # (T, V)


def hidden(params: dict, cfg: Config, ids: np.ndarray, cache: list[KVCache], record: list | None = None,
           n_layers: int | None = None) -> np.ndarray:
    """The residual stream (T, D) after the first n_layers layers (all of them by default)."""
    positions = np.arange(cache[0].offset, cache[0].offset + len(ids))
    x = embed(params, cfg, ids, positions)                                   # (T, D), our own copy
    rope = rope_for(params, cfg, positions)
    for i in range(cfg.n_layers if n_layers is None else n_layers):
        p = params["layers"][i]
        x += attention_block(norm(x, p, cfg, "attn_norm"), p, cfg, cache[i], rope, window(cfg, i), record)
        x += mlp_block(norm(x, p, cfg, "mlp_norm"), p, cfg)
    return x


def rope_for(params: dict, cfg: Config, positions: np.ndarray):
    """(cos, sin) tables for these positions, or None for families with learned positions."""
    return rope_tables(params["inv_freq"], positions) if cfg.family.positions == "rope" else None


def window(cfg: Config, layer: int) -> int | None:
    """The sliding window of this layer, or None for full causal attention."""
    return cfg.sliding_window if cfg.is_sliding(layer) else None


def embed(params: dict, cfg: Config, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    x = params["embed"][ids]                                                 # (T, D), a copy
    if cfg.family.embed_scale:  # Gemma: sqrt(D), rounded to the activation dtype as HF does
        x = x * np.float32(cfg.hidden_size ** 0.5)
    if cfg.family.positions == "learned":
        x = x + params["pos_embed"][positions]
    return x


def norm(x: np.ndarray, p: dict, cfg: Config, name: str) -> np.ndarray:
    if cfg.family.norm == "layer":
        return layer_norm(x, p[name], p[name + "_b"], cfg.norm_eps)
    return rms_norm(x, p[name], cfg.norm_eps, cfg.family.norm_offset)


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    y = x @ w.T
    return y if b is None else y + b


def qkv_heads(x: np.ndarray, p: dict, cfg: Config, rope) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Project x (T, D) to q (H, T, d), k and v (KV, T, d), with RoPE applied to q and k."""
    T, H, KV, d = x.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    qkv = linear(x, p["wqkv"], p.get("bqkv"))                                # (T, (H + 2 KV) d)
    qk = qkv[:, :(H + KV) * d].reshape(T, H + KV, d)                         # (T, H + KV, d)
    if rope is not None:  # q and k heads rotate alike: one call for both
        cos, sin = rope
        qk = apply_rope(qk, cos[:, None], sin[:, None])
    qk = qk.transpose(1, 0, 2)                                               # (H + KV, T, d)
    v = qkv[:, (H + KV) * d:].reshape(T, KV, d).transpose(1, 0, 2)           # (KV, T, d)
    return qk[:H], qk[H:], v


def attention_block(x: np.ndarray, p: dict, cfg: Config, cache: KVCache, rope, window: int | None,
                    record: list | None) -> np.ndarray:
    T, H, d = x.shape[0], cfg.n_heads, cfg.head_dim
    q, k, v = qkv_heads(x, p, cfg, rope)
    offset = cache.offset
    k, v = cache.update_and_fetch(k, v)                                      # (KV, S, d)
    out, weights = causal_attention(q, k, v, offset, window, record is not None)  # (H, T, d), (H, T, S)
    if record is not None:
        record.append(weights)
    out = out.transpose(1, 0, 2).reshape(T, H * d)                           # (T, H d)
    return linear(out, p["wo"], p.get("bo"))


def mlp_block(x: np.ndarray, p: dict, cfg: Config) -> np.ndarray:
    act = activation(cfg.act)
    if cfg.family.mlp == "plain":
        return linear(act(linear(x, p["w_up"], p.get("b_up"))), p["w_down"], p.get("b_down"))
    gate_up = linear(x, p["w_gate_up"], p.get("b_gate_up"))                  # (T, 2F)
    F = gate_up.shape[-1] // 2
    h = act(gate_up[:, :F])                                                  # (T, F)
    h *= gate_up[:, F:]  # in place: one (T, F) temporary fewer on a long prompt
    return linear(h, p["w_down"], p.get("b_down"))


# --- the loaded model --------------------------------------------------------------------------------

class Model:
    """A checkpoint in memory: config, float32 params, tokenizer. Holds no generation state."""

    def __init__(self, config: Config, params: dict, tokenizer: Tokenizer, generation_config: dict, path: Path):
        self.config, self.params, self.tokenizer = config, params, tokenizer
        self.generation_config, self.path = generation_config, path

    def make_cache(self, capacity: int = 256) -> list[KVCache]:
        c = self.config
        return make_cache(c.n_layers, c.n_kv_heads, c.head_dim, capacity)

    def forward(self, ids, cache: list[KVCache], last_only: bool = False, record: list | None = None) -> np.ndarray:
        ids = self._check_ids(ids)
        return forward(self.params, self.config, ids, cache, last_only, record)

    def logits(self, ids) -> np.ndarray:
        """Uncached forward over all ids: float32 (len(ids), vocab_size)."""
        return self.forward(ids, self.make_cache(max(len(ids), 1)))

    def _check_ids(self, ids) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.ndim != 1 or len(ids) == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise MinigenError("token ids must be a non-empty 1-D sequence of integers")
        if ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise MinigenError(f"token id {int(ids.max() if ids.max() >= self.config.vocab_size else ids.min())} "
                               f"is outside the vocabulary (0..{self.config.vocab_size - 1})")
        return ids

    @property
    def n_params(self) -> int:
        seen, total = set(), 0
        for a in [v for k, v in self.params.items() if k not in ("layers", "inv_freq")] + \
                 [v for layer in self.params["layers"] for v in layer.values()]:
            if id(a) not in seen:
                seen.add(id(a))
                total += a.size
        return total


def load(path: str | Path) -> Model:
    """Load a Hugging Face checkpoint directory: config, weights (float32), tokenizer, generation config."""
    path = Path(path)
    if not path.is_dir():
        raise MinigenError(f"{path}: no such checkpoint directory")
    cfg = load_config(path)
    activation(cfg.act)  # fail at load, not mid-forward, on an unknown activation
    tokenizer = Tokenizer.from_dir(path)  # before the weights: its parsing peak then adds to nothing
    params = load_params(path, cfg)
    params["inv_freq"] = rope_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    return Model(cfg, params, tokenizer, _generation_config(path), path)


def _generation_config(path: Path) -> dict:
    file = path / "generation_config.json"
    return read_json_object(file) if file.is_file() else {}

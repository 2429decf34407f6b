"""The decoder forward pass: stateless functions of (params, config, token ids, cache) -> logits.

Shape letters:
    T  new tokens in this forward         S  tokens in the cache after it (offset + T)
    D  hidden size                        V  vocabulary size
    H  query heads      KV  key/value heads      G  H // KV (query heads per KV head)
    d  head_dim         F  MLP intermediate size

Weights are HF's Linear layout (out, in), applied as x @ w.T; q/k/v and gate/up are fused at load
(weights.py). One function serves every family: the differences are fields of `Config` (config.py),
which each family sets in families.py. A layer is

    a = attention(attn_norm(x))      [no pre-norm: OLMo 2]      a = attn_post_norm(a)  [Gemma 2/3, OLMo 2]
    x = x + a                                                   [parallel: x + a + mlp(mlp_norm(x)), GPT-NeoX]
    m = mlp(mlp_norm(x))                                        m = mlp_post_norm(m)
    x = x + m
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from . import parallel
from .attention import causal_attention
from .cache import KVCache, make_cache
from .config import Config
from ..errors import MinigenError
from .layers import activation, apply_rope, layer_norm, query_scale, rms_norm, rope_tables, softcap
from .moe import moe_mlp


class Hooks:
    """Ways to look at or change a forward pass from outside (minigen.inspect). Each method gets the
    layer index and an array and returns the array to go on with; these defaults change nothing."""

    def z(self, layer: int, z: np.ndarray) -> np.ndarray:
        """(T, H, d): each head's output, before the output projection (TransformerLens's hook_z)."""
        return z

    def attn_out(self, layer: int, a: np.ndarray) -> np.ndarray:
        """(T, D): what the attention block adds to the residual stream."""
        return a

    def mlp_out(self, layer: int, m: np.ndarray) -> np.ndarray:
        """(T, D): what the MLP block adds to the residual stream."""
        return m

    def resid(self, layer: int, x: np.ndarray) -> None:
        """(T, D): the residual stream after the layer (read only)."""


# --- the forward pass ------------------------------------------------------------------------------

def forward(params: dict, cfg: Config, ids: np.ndarray, cache: list[KVCache], last_only: bool = False,
            record: list | None = None, hooks: Hooks | None = None) -> np.ndarray:
    """Logits (T, V), or (1, V) for the last position only. Appends each layer's attention weights
    (H, T, S) to `record` when it is a list; the cache advances by T."""
    x = hidden(params, cfg, ids, cache, record, hooks=hooks)                 # (T, D)
    return unembed(x[-1:] if last_only else x, params, cfg)                 # (T, V)


def hidden(params: dict, cfg: Config, ids: np.ndarray, cache: list[KVCache], record: list | None = None,
           n_layers: int | None = None, hooks: Hooks | None = None) -> np.ndarray:
    """The residual stream (T, D) after the first n_layers layers (all of them by default)."""
    positions = np.arange(cache[0].offset, cache[0].offset + len(ids))
    x = embed(params, cfg, ids, positions)                                   # (T, D), our own copy
    tables = rope_for(cfg, positions)
    for i in range(cfg.n_layers if n_layers is None else n_layers):
        x = layer(x, params["layers"][i], cfg, i, cache[i], tables.get(rope_of(cfg, i)), record, hooks)
    if parallel.threads_for(len(ids)) > 1:
        parallel.release_free_heap()
    return x


def layer(x: np.ndarray, p: dict, cfg: Config, i: int, cache: KVCache, rope, record, hooks) -> np.ndarray:
    """One decoder layer on the residual stream x (T, D), updated in place and returned. All but
    attention works on each row alone, so a long prompt's rows go in chunks to parallel threads
    (parallel.py), each writing its q, k and v in place; with hooks, in one chunk, so that each hook
    sees every row."""
    T = len(x)
    chunks, threads = ([slice(0, T)], 1) if hooks else (parallel.row_chunks(T), parallel.threads_for(T))
    offset = cache.offset
    q = np.empty((cfg.n_heads, T, cfg.head_dim), np.float32)                 # (H, T, d)
    k, v = cache.extend(T)                                                   # (KV, T, d) views into the cache
    parallel.run([partial(heads_into, x[r], p, cfg, rows_of(rope, r), q[:, r], k[:, r], v[:, r])
                  for r in chunks], threads)
    z = heads_output(q, cache, offset, cfg, i, record, hooks)                # (T, H, d)
    parallel.run([partial(after_attention, x[r], z[r], p, cfg, i, hooks) for r in chunks], threads)
    if hooks:
        hooks.resid(i, x)
    return x


def heads_into(x: np.ndarray, p: dict, cfg: Config, rope, q: np.ndarray, k: np.ndarray, v: np.ndarray):
    """Rows of the residual stream x through the attention's norm and qkv_heads, into q, k and v."""
    q[...], k[...], v[...] = qkv_heads(norm(x, p, cfg, "attn_norm") if cfg.pre_norms else x, p, cfg, rope)


def rows_of(rope, r: slice):
    """The RoPE tables (cos, sin), each (T, dim), for the rows r, or None."""
    return None if rope is None else tuple(t[r] for t in rope)


def after_attention(x: np.ndarray, z: np.ndarray, p: dict, cfg: Config, i: int, hooks) -> None:
    """The rest of the layer on rows of x (T, D), in place, from the heads' outputs z (T, H, d):
    the output projection, the residual adds and the MLP."""
    a = linear(z.reshape(len(z), -1), p["wo"], p.get("bo"))                 # (T, D)
    if cfg.post_norms:
        a = norm(a, p, cfg, "attn_post_norm")
    if cfg.residual_multiplier != 1.0:  # Granite
        a *= np.float32(cfg.residual_multiplier)
    if hooks:
        a = hooks.attn_out(i, a)
    if cfg.parallel_residual:  # both blocks read the same x
        m = mlp_out(norm(x, p, cfg, "mlp_norm"), p, cfg, i, hooks)
        x += a
    else:
        x += a
        m = mlp_out(norm(x, p, cfg, "mlp_norm") if cfg.pre_norms else x, p, cfg, i, hooks)
    x += m


def mlp_out(x: np.ndarray, p: dict, cfg: Config, i: int, hooks) -> np.ndarray:
    m = mlp_block(x, p, cfg)
    if cfg.post_norms:
        m = norm(m, p, cfg, "mlp_post_norm")
    if cfg.residual_multiplier != 1.0:  # Granite
        m *= np.float32(cfg.residual_multiplier)
    return hooks.mlp_out(i, m) if hooks else m


def rope_of(cfg: Config, layer: int):
    """This layer's Rope, or None (learned positions, or a layer without RoPE)."""
    return cfg.rope[layer] if cfg.positions == "rope" else None


def rope_for(cfg: Config, positions: np.ndarray) -> dict:
    """{Rope: (cos, sin) for these positions}: one table per distinct RoPE of the model."""
    return {r: rope_tables(r, positions) + ((query_scale(r, positions),) if r.query_beta else ())
            for r in set(cfg.rope) if r is not None} if cfg.positions == "rope" else {}


def embed(params: dict, cfg: Config, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    x = params["embed"][ids]                                                 # (T, D), a copy
    if cfg.embed_scale:  # Gemma: sqrt(D), rounded to the activation dtype as HF does
        x *= np.float32(cfg.hidden_size ** 0.5)
    if cfg.embedding_multiplier != 1.0:  # Granite
        x *= np.float32(cfg.embedding_multiplier)
    if cfg.positions == "learned":
        x += params["pos_embed"][positions]
    return x


def unembed(x: np.ndarray, params: dict, cfg: Config) -> np.ndarray:
    """The final norm, the output projection, and the family's soft-cap: (T, D) -> (T, V)."""
    logits = norm(x, params, cfg, "final_norm") @ params["lm_head"].T        # (T, V)
    if cfg.logits_scaling != 1.0:  # Granite
        logits /= np.float32(cfg.logits_scaling)
    return softcap(logits, cfg.final_softcap) if cfg.final_softcap else logits


def norm(x: np.ndarray, p: dict, cfg: Config, name: str) -> np.ndarray:
    if cfg.norm == "layer":
        return layer_norm(x, p[name], p[name + "_b"], cfg.norm_eps)
    return rms_norm(x, p[name], cfg.norm_eps)


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    y = x @ w.T
    return y if b is None else y + b


def qkv_heads(x: np.ndarray, p: dict, cfg: Config, rope) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Project x (T, D) to q (H, T, d), k and v (KV, T, d): the family's q/k norm, then RoPE on q and k."""
    T, H, KV, d = x.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    qkv = linear(x, p["wqkv"], p.get("bqkv"))                                # (T, (H + 2 KV) d)
    qk = qkv[:, :(H + KV) * d]                                               # (T, (H + KV) d)
    if cfg.qk_norm == "proj":  # OLMo 2: over the whole q and k projections
        qk = np.concatenate([rms_norm(qk[:, :H * d], p["q_norm"], cfg.norm_eps),
                             rms_norm(qk[:, H * d:], p["k_norm"], cfg.norm_eps)], axis=1)
    qk = qk.reshape(T, H + KV, d)                                            # (T, H + KV, d)
    if cfg.qk_norm == "head":  # Qwen 3, Gemma 3: over each head's d dims
        qk = np.concatenate([rms_norm(qk[:, :H], p["q_norm"], cfg.norm_eps),
                             rms_norm(qk[:, H:], p["k_norm"], cfg.norm_eps)], axis=1)
    if rope is not None:  # q and k heads rotate alike: one call for both
        cos, sin = rope[:2]
        qk = apply_rope(qk, cos[:, None], sin[:, None])
        if len(rope) > 2:  # Ministral 3: each position's queries x its scale
            qk[:, :H] *= rope[2][:, None, None]
    qk = qk.transpose(1, 0, 2)                                               # (H + KV, T, d)
    v = qkv[:, (H + KV) * d:].reshape(T, KV, d).transpose(1, 0, 2)           # (KV, T, d)
    return qk[:H], qk[H:], v


def attention_block(x: np.ndarray, p: dict, cfg: Config, i: int, cache: KVCache, rope,
                    record: list | None = None, hooks: Hooks | None = None) -> np.ndarray:
    """The attention block on x (T, D), already normed: what it adds to the residual stream (T, D)."""
    q, k, v = qkv_heads(x, p, cfg, rope)
    offset = cache.offset
    cache.update_and_fetch(k, v)
    z = heads_output(q, cache, offset, cfg, i, record, hooks)                # (T, H, d)
    return linear(z.reshape(len(x), -1), p["wo"], p.get("bo"))


def heads_output(q: np.ndarray, cache: KVCache, offset: int, cfg: Config, i: int, record: list | None = None,
                 hooks: Hooks | None = None) -> np.ndarray:
    """Causal attention of q (H, T, d), at positions offset.., over the cache: each head's output z
    (T, H, d). Appends the weights (H, T, S) to `record` when it is a list."""
    k, v = cache.fetch()                                                     # (KV, S, d)
    out, weights = causal_attention(q, k, v, offset, cfg.window(i), record is not None,
                                    cfg.attn_scale, cfg.attn_softcap)        # (H, T, d), (H, T, S)
    if record is not None:
        record.append(weights)
    z = out.transpose(1, 0, 2)                                               # (T, H, d), contiguous
    return hooks.z(i, z) if hooks else z


def mlp_block(x: np.ndarray, p: dict, cfg: Config) -> np.ndarray:
    if cfg.mlp == "moe":
        return moe_mlp(x, p, cfg)
    act = activation(cfg.act)
    if cfg.mlp == "plain":
        return linear(act(linear(x, p["w_up"], p.get("b_up"))), p["w_down"], p.get("b_down"))
    gate_up = linear(x, p["w_gate_up"], p.get("b_gate_up"))                  # (T, 2F)
    F = gate_up.shape[-1] // 2
    h = act(gate_up[:, :F])                                                  # (T, F)
    h *= gate_up[:, F:]  # in place: one (T, F) temporary fewer on a long prompt
    return linear(h, p["w_down"], p.get("b_down"))


def must_recompute(cfg: Config, offset: int, n_new: int) -> bool:
    """Whether the cache has to be rebuilt before feeding n_new tokens at `offset`: longrope switches
    to its long factors once the sequence passes original_max_position_embeddings, and transformers
    then recomputes every cached key with them (Phi3ForCausalLM.prepare_inputs_for_generation)."""
    return any(r is not None and r.kind == "longrope" and 0 < offset <= r.original_max < offset + n_new
               for r in set(cfg.rope))


def reusable_prefix(cfg: Config, cached: int, common: int, total: int) -> int:
    """How many positions of a cache holding `cached` a sequence of `total` ids may keep when its first
    `common` ids are the cached ones: all `common`, unless longrope's switch lies between. Keys cached
    past the switch were computed with the long factors (must_recompute sees to it), below it with the
    short ones; a sequence reaching past it wants the long ones at every position, one below it the
    short ones. Then nothing is kept, and the new forward computes the whole sequence afresh."""
    return 0 if any(r is not None and r.kind == "longrope" and common <= r.original_max
                    and (cached > r.original_max or total > r.original_max) for r in set(cfg.rope)) else common


# --- the loaded model --------------------------------------------------------------------------------

class Model:
    """A checkpoint's forward pass: its Config and float32 params. It holds no generation state (the
    cache is passed in) and loads nothing itself: `minigen.load` builds it beside the tokenizer."""

    def __init__(self, config: Config, params: dict, generation_config: dict | None = None,
                 path: Path | str | None = None):
        self.config, self.params = config, params
        self.generation_config = generation_config or {}   # generation_config.json: sampling defaults, EOS
        self.path = path

    def make_cache(self, capacity: int = 256) -> list[KVCache]:
        c = self.config
        return make_cache(c.n_layers, c.n_kv_heads, c.head_dim, capacity)

    def forward(self, ids, cache: list[KVCache], last_only: bool = False, record: list | None = None,
                hooks: Hooks | None = None) -> np.ndarray:
        ids = self._check_ids(ids)
        return forward(self.params, self.config, ids, cache, last_only, record, hooks)

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
        images = np.isin(ids, self.config.image_token_ids) if self.config.image_token_ids else None
        if images is not None and images.any():
            raise MinigenError(f"token id {int(ids[images][0])} at position {int(np.argmax(images))} is the "
                               f"checkpoint's image token: minigen runs the {self.config.wrapper} checkpoint's "
                               f"language model only (its vision tower is not loaded), so a prompt cannot hold images")
        return ids

    @property
    def n_params(self) -> int:
        seen, total = set(), 0
        for a in [v for k, v in self.params.items() if k != "layers"] + \
                 [v for layer in self.params["layers"] for v in layer.values()]:
            if id(a) not in seen:
                seen.add(id(a))
                total += a.size
        return total

"""Token mixers: what a layer computes across positions, each registered once in MIXERS.

A mixer is one `Mixer` entry: its forward, the cache it keeps per layer, whether a batch pools that
cache, whether it has attention heads, and its step for one token written out (`minigen trace` on a
layer without attention). Config.mixer(layer) names a layer's entry. Every forward has the same small
signature, `forward(h, p, cfg, at) -> out`: h (N, D) the layer's input rows (normed), p its weights,
and `at` (a `Pass`) what it needs of this forward: its layer index, each sequence's rows and cache of
this layer, the RoPE tables, and what the caller asked for (recorded weights, hooks, last rows only).
Its output (N, D), or (B, D) with `at.last`, is what the layer adds to the residual stream before any
post-norm.

    attention        multi-head attention over each sequence's own KV cache (GQA, sliding, soft-capped)
    gated_delta      Gated DeltaNet (gated_delta.py, Qwen3.5)
    short_conv       LFM2's gated short convolution (short_conv.py)
    mamba2           Mamba2 (ssm.py, Granite 4.0-H, Falcon-H1)
    attention+mamba2 attention and Mamba2 side by side on the same input, their outputs summed (Falcon-H1)
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

import numpy as np

from . import gated_delta, parallel, short_conv, ssm
from .cache import Both, KVCache, KVPool, PooledKV, StateCache
from .config import Config
from .hooks import Hooks
from .layers import rms_norm, rope_rows, sigmoid
from .linear import linear


@dataclass(frozen=True)
class Pass:
    """One forward pass as a layer's mixer sees it."""
    layer: int
    rows: tuple               # each sequence's rows (a slice) of the stacked input
    caches: tuple             # each sequence's cache of this layer
    rope: tuple | None = None  # this layer's (cos, sin[, query scale]) for every row, or None
    record: list | None = None  # attention weights (H, T, S) appended per layer (None for a layer without)
    hooks: Hooks | None = None
    last: bool = False        # only each sequence's last output row is wanted: (B, D)

    def part(self, name: str) -> "Pass":
        """This pass with each cache replaced by its part `name` (Both's kv or state)."""
        return replace(self, caches=tuple(getattr(c, name) for c in self.caches))

    @property
    def last_rows(self) -> list[int]:
        return [r.stop - 1 for r in self.rows]


@dataclass(frozen=True)
class Mixer:
    forward: Callable                  # (h, p, cfg, at) -> what the layer adds, (N, D) or (B, D)
    cache: Callable                    # (cfg, capacity) -> the layer's cache (cache.LayerCache)
    attends: bool = False              # it has attention heads: weights to record, heads to ablate
    pools: bool = False                # a batch keeps its keys and values in one pool (cache.KVPool)
    step: Callable | None = None       # (x, t, p, cfg, head) -> one token's step written out (minigen trace)


# --- attention -----------------------------------------------------------------------------------

def attention(h: np.ndarray, p: dict, cfg: Config, at: Pass) -> np.ndarray:
    """Multi-head attention of each sequence's rows of h (N, D) over its own cache (which it extends);
    with `at.last`, only each sequence's last query attends (every row's k and v still join the cache)."""
    q, k, v = parallel.by_rows(qkv_heads, h, at.rope, p=p, cfg=cfg)         # (N, H, d), (N, KV, d) x2
    if at.hooks:
        at.hooks.qkv(at.layer, q, k, v)
    z = attend_each(q, k, v, cfg, at)                                        # (N, H, d), or (B, H, d)
    if at.hooks:
        z = at.hooks.z(at.layer, z)
    z = z.reshape(len(z), -1)                                                # (N, H d)
    if cfg.attn_gate:  # Qwen3.5: each head's output x sigmoid(its gate), the gate's rows last in wqkv
        z = z * sigmoid(linear(h[at.last_rows] if at.last else h, p["wqkv"][qkv_rows(cfg):]))
    return parallel.by_rows(linear, z, w=p["wo"], b=p.get("bo"))             # (N, D)


def attend_each(q: np.ndarray, k: np.ndarray, v: np.ndarray, cfg: Config, at: Pass) -> np.ndarray:
    """Each sequence's new q (T, H, d), k and v (T, KV, d) join its own cache, and its queries attend
    over it: each head's output z (N, H, d), or (B, H, d) with `at.last`. A batch's decode step whose
    caches share a pool attends as one product (KVPool.attend); every other sequence alone, a batch's
    joining prompts on parallel threads, the longest first (with `record`, in order, so that the weights
    are appended in the sequences' order)."""
    window, scale, cap = cfg.window(at.layer), cfg.attn_scale, cfg.attn_softcap
    if len(at.rows) == 1 and at.record is None:   # one sequence (a decode step, a prompt): no batch to sort out
        queries = q[-1:] if at.last else q
        return at.caches[0].attend(queries, k, v, window, scale, cap)[0]
    z = np.empty((len(at.rows),) + q.shape[1:] if at.last else q.shape, np.float32)
    out = [slice(b, b + 1) if at.last else r for b, r in enumerate(at.rows)]   # each sequence's rows of z
    pooled = pooled_decoders(at) if at.record is None else []
    for pool, members in group_by_pool(at, pooled).items():
        rows = [at.rows[b].start for b in members]
        z[[out[b].start for b in members]] = pool.attend([at.caches[b] for b in members], q[rows], k[rows], v[rows],
                                                         window, scale, cap)

    # a record with a `block` method takes the weights a few query rows at a time as they are made,
    # record.block(layer, first row, weights (H, r, S), each row's w ln w (H, r)): no layer's whole map
    # is made (minigen.inspect.scan: a long prompt's attention in bounded memory)
    streamed = getattr(at.record, "block", None)

    def alone(b: int):
        r = at.rows[b]
        queries = q[r.stop - 1:r.stop] if at.last else q[r]
        z[out[b]], weights = at.caches[b].attend(queries, k[r], v[r], window, scale, cap,
                                                 at.record is not None and streamed is None,
                                                 None if streamed is None else partial(streamed, at.layer))
        if at.record is not None and streamed is None:
            at.record.append(weights)

    rest = sorted(set(range(len(at.rows))) - set(pooled), key=lambda b: (at.rows[b].start - at.rows[b].stop
                                                                          if at.record is None else b))
    threads = parallel.threads_for(len(q)) if at.record is None and len(rest) > 1 else 1
    parallel.in_threads([partial(alone, b) for b in rest], threads)
    return z


def pooled_decoders(at: Pass) -> list[int]:
    """The sequences (indices) whose attention can be pooled: a decode step (one new row) through a pool's
    slot, where two or more share that pool."""
    decoders = [b for b, (r, c) in enumerate(zip(at.rows, at.caches)) if r.stop - r.start == 1 and isinstance(c, PooledKV)]
    counts = Counter(at.caches[b].pool for b in decoders)
    return [b for b in decoders if counts[at.caches[b].pool] > 1]


def group_by_pool(at: Pass, members: list[int]) -> dict[KVPool, list[int]]:
    groups: dict = {}
    for b in members:
        groups.setdefault(at.caches[b].pool, []).append(b)
    return groups


def qkv_rows(cfg: Config) -> int:
    """Rows of wqkv that are q, k and v (Qwen3.5's output gate follows them)."""
    return (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim


def qkv_heads(x: np.ndarray, rope, p: dict, cfg: Config) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Project rows x (N, D) to q (N, H, d), k and v (N, KV, d): the family's q/k norm, then RoPE on
    q and k (rope: this layer's (cos, sin) tables for these rows, each (N, dim), or None)."""
    N, H, KV, d = x.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    w, b = p["wqkv"], p.get("bqkv")
    if cfg.attn_gate:   # the gate's rows are not q, k or v: left to attention()
        w, b = w[:qkv_rows(cfg)], None if b is None else b[:qkv_rows(cfg)]
    qkv = linear(x, w, b)                                                    # (N, (H + 2 KV) d)
    qk = qk_norm(qkv[:, :(H + KV) * d], p, cfg).reshape(N, H + KV, d)        # (N, H + KV, d)
    if rope is not None:  # q and k heads rotate alike: one call for both
        cos, sin = rope[:2]
        qk = rope_rows(qk, cos, sin)                                       # (N, H + KV, d)
        if len(rope) > 2:  # Ministral 3: each position's queries x its scale (model.rope_tables_for)
            qk[:, :H] *= rope[2][:, None, None]
    v = qkv[:, (H + KV) * d:].reshape(N, KV, d)                              # (N, KV, d)
    return qk[:, :H], qk[:, H:], v


def qk_norm(qk: np.ndarray, p: dict, cfg: Config) -> np.ndarray:
    """The family's RMSNorm on the q and k projections qk (N, (H + KV) d), before RoPE: over the whole
    projection (OLMo 2, "proj") or over each head's d dims (Qwen 3, Gemma 3, "head"), or none."""
    H, d = cfg.n_heads, cfg.head_dim
    if cfg.qk_norm == "proj":
        return np.concatenate([rms_norm(qk[:, :H * d], p["q_norm"], cfg.norm_eps),
                               rms_norm(qk[:, H * d:], p["k_norm"], cfg.norm_eps)], axis=1)
    if cfg.qk_norm == "head":
        heads = qk.reshape(len(qk), -1, d)                                   # (N, H + KV, d)
        return np.concatenate([rms_norm(heads[:, :H], p["q_norm"], cfg.norm_eps),
                               rms_norm(heads[:, H:], p["k_norm"], cfg.norm_eps)], axis=1).reshape(len(qk), -1)
    return qk


# --- recurrences: a state per sequence instead of a growing cache ------------------------------------

def recurrent(step: Callable, window: Callable | None = None) -> Callable:
    """A mixer from a recurrence `step(x, tail, state, p, cfg) -> (out, tail, state)` on one sequence's
    rows: each sequence runs from its own cache's state (a StateCache), which it then advances. With
    `at.last`, each sequence's last output row only; `window(cfg)`, if given, is how many of the last rows
    determine that output and the new tail (a convolution's kernel, with no state beyond its tail): then
    only those are computed."""
    def forward(h: np.ndarray, p: dict, cfg: Config, at: Pass) -> np.ndarray:
        out = np.empty((len(at.rows), h.shape[1]) if at.last else h.shape, np.float32)   # (N, D), or (B, D)
        for b, (r, c) in enumerate(zip(at.rows, at.caches)):
            start = max(r.start, r.stop - window(cfg)) if at.last and window else r.start
            # from a later start the first rows' outputs read the wrong tail; the last row's and the new tail do not
            y, tail, state = step(h[start:r.stop], c.tail, c.state, p, cfg)
            out[b if at.last else r] = y[-1] if at.last else y
            c.update(tail, state, r.stop - r.start)
        if at.record is not None:   # no attention weights: None keeps record[i] the weights of layer i
            at.record.append(None)
        return out
    return forward


def attention_and_mamba2(h: np.ndarray, p: dict, cfg: Config, at: Pass) -> np.ndarray:
    """Falcon-H1: attention and Mamba2 side by side on the same input, their outputs summed (the µP
    multipliers on both are folded into the weights at load)."""
    return MAMBA2(h, p, cfg, at.part("state")) + attention(h, p, cfg, at.part("kv"))


MAMBA2 = recurrent(lambda x, tail, state, p, cfg: ssm.mamba2(x, tail, state, p, cfg.mamba))


def kv_cache(cfg: Config, capacity: int) -> KVCache:
    return KVCache(cfg.n_kv_heads, cfg.head_dim, capacity)


def delta_net_cache(cfg: Config, capacity: int = 0) -> StateCache:
    m = cfg.delta_net
    conv = 2 * m.key_heads * m.key_dim + m.value_heads * m.value_dim
    return StateCache((m.conv_kernel - 1, conv), (m.value_heads, m.key_dim, m.value_dim))


def short_conv_cache(cfg: Config, capacity: int = 0) -> StateCache:
    return StateCache((cfg.short_conv.kernel - 1, cfg.hidden_size))


def mamba_cache(cfg: Config, capacity: int = 0) -> StateCache:
    m = cfg.mamba
    return StateCache((m.conv_kernel - 1, m.inner + 2 * m.groups * m.state_size), (m.heads, m.head_dim, m.state_size))


MIXERS = {
    "attention": Mixer(attention, kv_cache, attends=True, pools=True),
    "gated_delta": Mixer(recurrent(lambda x, tail, state, p, cfg: gated_delta.gated_deltanet(x, tail, state, p,
                                                                                             cfg.delta_net)),
                         delta_net_cache, step=gated_delta.one_token),
    "short_conv": Mixer(recurrent(lambda x, tail, state, p, cfg: (*short_conv.short_conv(x, tail, p), None),
                                  window=lambda cfg: cfg.short_conv.kernel),
                        short_conv_cache, step=short_conv.one_token),
    "mamba2": Mixer(MAMBA2, mamba_cache, step=ssm.one_token),
    "attention+mamba2": Mixer(attention_and_mamba2, lambda cfg, capacity: Both(kv_cache(cfg, capacity),
                                                                               mamba_cache(cfg)), attends=True),
}


def mixer_of(cfg: Config, layer: int) -> Mixer:
    return MIXERS[cfg.mixer(layer)]


def has_attention(cfg: Config, layer: int) -> bool:
    """Whether the layer has attention heads (hybrids: only some layers do)."""
    return mixer_of(cfg, layer).attends


def make_cache(cfg: Config, capacity: int = 256) -> list:
    """One cache per layer of the model `cfg`, of the kind its token mixer keeps, all at offset 0."""
    return [mixer_of(cfg, i).cache(cfg, capacity) for i in range(cfg.n_layers)]


def make_pools(cfg: Config) -> list:
    """Per layer: a KVPool for a batch's sequences where the layer's mixer pools its cache, else None."""
    return [KVPool(cfg.n_kv_heads, cfg.head_dim) if mixer_of(cfg, i).pools else None for i in range(cfg.n_layers)]

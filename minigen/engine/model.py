"""The decoder forward pass: stateless functions of (params, config, token ids, cache) -> logits.

Shape letters:
    N  rows of this forward: the new tokens of each sequence, one sequence after another
    T  new tokens of one sequence      S  tokens in its cache after this forward (offset + T)
    D  hidden size                     V  vocabulary size
    H  query heads      KV  key/value heads      G  H // KV (query heads per KV head)
    d  head_dim         F  MLP intermediate size

Weights have HF's Linear shape (out, in), in column-major memory, and are applied as x @ w.T (a plain
GEMM); q/k/v and gate/up are fused at load (checkpoint/weights.py). One function serves every family:
the differences are fields of `Config` (config.py), which each family sets in checkpoint/families.py.
A layer is

    h = attn_norm(x)                 [none: OLMo 2]
    a = mixer(h)                     attention over each sequence's own cache, or a recurrence over its
                                     state: Gated DeltaNet (gated_delta.py), LFM2's short convolution
                                     (short_conv.py), Mamba2 (ssm.py), attention beside Mamba2 (MIXERS)
    a = attn_post_norm(a)            [Gemma 2/3, OLMo 2]
    x = x + r a                      [parallel residual: the MLP reads x from before this add, GPT-NeoX]
    m = mlp(mlp_norm(x))             (MLPS: gated, plain, or routed experts, moe.py, with a shared MLP beside)
    m = mlp_post_norm(m)             [Gemma 2/3, OLMo 2]
    x = x + r m                      r: Granite's residual_multiplier (else 1)

Granite and Falcon-H1 also scale the embeddings (embed_multiplier) and the logits (logits_multiplier:
Granite's 1 / logits_scaling, Falcon-H1's lm_head_multiplier).

Several sequences can share one forward (`forward_batch`): their new rows are stacked, so every
projection reads the weights once for all of them, and only the mixer goes sequence by sequence.
Everything but the mixer treats each row alone, so a long prompt's row-wise steps run in chunks on
both cores (`parallel.by_rows`); attention splits its query blocks itself. Hooks (minigen.inspect)
see whole arrays, between the steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from . import parallel
from .attention import causal_attention, pooled_decode_attention, slot_runs
from .cache import KVCache, PooledKV, make_cache
from .config import Config
from .gated_delta import gated_deltanet, sigmoid
from .short_conv import short_conv
from .ssm import mamba2
from .layers import activation, apply_rope, layer_norm, query_scale, rms_norm, rope_tables, softcap
from .moe import moe_mlp
from ..errors import MinigenError


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

    def qkv(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """(T, H, d), (T, KV, d), (T, KV, d): an attention layer's queries, keys and values of this
        forward's rows, as attention takes them (after any q/k norm, RoPE and query scale; read only)."""


@dataclass(frozen=True)
class Seq:
    """One sequence's part of a forward: its rows of the stacked input, and its per-layer caches."""
    rows: slice
    cache: list


# --- the forward pass ------------------------------------------------------------------------------

def forward(params: dict, cfg: Config, ids: np.ndarray, cache: list, last_only: bool = False,
            record: list | None = None, hooks: Hooks | None = None) -> np.ndarray:
    """Logits (T, V), or (1, V) for the last position only. Appends each layer's attention weights
    (H, T, S) to `record` when it is a list; the cache advances by T."""
    with parallel.for_decode(len(ids)):   # a decode step on a busy machine: OpenBLAS on one thread
        x = hidden(params, cfg, ids, cache, record, hooks=hooks, last_only=last_only)   # (T, D), or (1, D)
        return unembed(x, params, cfg)                                       # (T, V), or (1, V)


def forward_batch(params: dict, cfg: Config, ids: list[np.ndarray], caches: list[list],
                  last_only: bool = True) -> list[np.ndarray]:
    """Several sequences in one pass over the weights, each with its own cache (and so its own
    positions): the logits of each, (1, V) for its last position or (T_b, V). Equal, row for row, to
    a `forward` of each sequence alone."""
    seqs = stack(ids, caches)
    with parallel.for_decode(seqs[-1].rows.stop):
        x = embed(params, cfg, np.concatenate(ids), positions(seqs))        # (N, D)
        x = run_layers(x, params, cfg, seqs, last_only=last_only)            # (N, D), or (B, D)
        if last_only:
            return list(unembed(x, params, cfg)[:, None])                    # B x (1, V)
        logits = unembed(x, params, cfg)                                     # (N, V)
    return [logits[s.rows] for s in seqs]


def hidden(params: dict, cfg: Config, ids: np.ndarray, cache: list, record: list | None = None,
           n_layers: int | None = None, hooks: Hooks | None = None, last_only: bool = False) -> np.ndarray:
    """The residual stream (T, D) after the first n_layers layers (all of them by default); with
    last_only, its last row (1, D)."""
    seqs = stack([ids], [cache])
    x = embed(params, cfg, ids, positions(seqs))                             # (T, D), our own copy
    return run_layers(x, params, cfg, seqs, 0, n_layers, record, hooks, last_only)


def run_layers(x: np.ndarray, params: dict, cfg: Config, seqs: list[Seq], start: int = 0,
               stop: int | None = None, record: list | None = None, hooks: Hooks | None = None,
               last_only: bool = False) -> np.ndarray:
    """Layers start..stop-1 on the residual stream x (N, D) of the sequences `seqs`, whose caches are
    at the positions where these rows begin. With last_only, only each sequence's last row of the
    result is wanted, (B, D): the model's final layer then computes its output at those rows alone,
    as llama.cpp does (what the cache keeps it still computes for every row), unless hooks or
    `record` look at every row."""
    tables, n_rows = rope_for(cfg, seqs), len(x)
    for i in range(start, cfg.n_layers if stop is None else stop):
        last = last_only and i == cfg.n_layers - 1 and record is None and not hooks
        x = layer(x, params["layers"][i], cfg, i, seqs, tables.get(rope_of(cfg, i)), record, hooks, last)
    if parallel.threads_for(n_rows) > 1:   # a long prompt's (the final layer may have kept one row)
        parallel.release_free_heap()
    if last_only and len(x) > len(seqs):
        x = x[last_rows(seqs)]                                               # (B, D)
    return x


def last_rows(seqs: list[Seq]) -> list[int]:
    """Each sequence's last row in the stacked rows."""
    return [s.rows.stop - 1 for s in seqs]


def layer(x: np.ndarray, p: dict, cfg: Config, i: int, seqs: list[Seq], rope, record: list | None = None,
          hooks: Hooks | None = None, last: bool = False) -> np.ndarray:
    """One decoder layer on the residual stream x (N, D), updated in place and returned. With `last`,
    its output at each sequence's last row only, (B, D): the mixer still advances every row's cache."""
    h = parallel.by_rows(norm, x, p=p, cfg=cfg, name="attn_norm") if cfg.pre_norms else x   # (N, D)
    a = MIXERS[cfg.mixer(i)](h, p, cfg, i, seqs, rope, record, hooks, last)   # (N, D), or (B, D)
    if last:
        x = x[last_rows(seqs)]                                               # (B, D)
    if cfg.post_norms:
        a = norm(a, p, cfg, "attn_post_norm")
    a = residual_scaled(a, cfg)
    if hooks:
        a = hooks.attn_out(i, a)
    if cfg.parallel_residual:  # both blocks read the same x
        m = parallel.by_rows(mlp_block, x, p=p, cfg=cfg)
        x += a
    else:
        x += a
        m = parallel.by_rows(mlp_block, x, p=p, cfg=cfg)                     # (N, D)
    m = residual_scaled(m, cfg)
    if hooks:
        m = hooks.mlp_out(i, m)
    x += m
    if hooks:
        hooks.resid(i, x)
    return x


def residual_scaled(a: np.ndarray, cfg: Config) -> np.ndarray:
    """What a block adds to the residual stream, times Granite's residual_multiplier (in place)."""
    if cfg.residual_multiplier != 1.0:
        a *= np.float32(cfg.residual_multiplier)
    return a


# --- token mixers: what a layer computes across positions ----------------------------------------

def attention(h: np.ndarray, p: dict, cfg: Config, i: int, seqs: list[Seq], rope, record: list | None = None,
              hooks: Hooks | None = None, last: bool = False) -> np.ndarray:
    """Multi-head attention of each sequence's rows of h (N, D), already normed, over its own cache
    (which it extends): what the block adds to the residual stream (N, D), before any post-norm; with
    `last`, only each sequence's last query attends, (B, D) (every row's k and v still join the cache)."""
    q, k, v = parallel.by_rows(qkv_heads, h, rope, p=p, cfg=cfg)             # (N, H, d), (N, KV, d) x2
    if hooks:
        hooks.qkv(i, q, k, v)
    out_rows = {id(s): slice(b, b + 1) if last else s.rows for b, s in enumerate(seqs)}
    z = np.empty((len(seqs),) + q.shape[1:] if last else q.shape, np.float32)   # (N, H, d), or (B, H, d)
    pooled = pooled_decoding(seqs, i) if record is None else []
    if pooled:
        rows = [s.rows.start for s in pooled]
        z[[out_rows[id(s)].start for s in pooled]] = attend_pooled(q[rows], k[rows], v[rows],
                                                                   [s.cache[i] for s in pooled], cfg, i)
    in_pool = {id(s) for s in pooled}
    alone = [s for s in seqs if id(s) not in in_pool]

    def attend_alone(s: Seq):
        queries = q[s.rows.stop - 1:s.rows.stop] if last else q[s.rows]
        z[out_rows[id(s)]] = attend_cached(queries, k[s.rows], v[s.rows], s.cache[i], cfg, i, record)

    # a batch's joining prompts attend on parallel threads, the longest first, each over its own cache;
    # with `record`, one after another, so that the weights are appended in the sequences' order
    threads = parallel.threads_for(len(h)) if record is None and len(alone) > 1 else 1
    if threads > 1:
        alone.sort(key=lambda s: s.rows.start - s.rows.stop)
    parallel.in_threads([partial(attend_alone, s) for s in alone], threads)
    if hooks:
        z = hooks.z(i, z)
    z = z.reshape(len(z), -1)                                                # (N, H d)
    if cfg.attn_gate:  # Qwen3.5: each head's output x sigmoid(its gate), the gate's rows last in wqkv
        z = z * sigmoid(linear(h[last_rows(seqs)] if last else h, p["wqkv"][qkv_rows(cfg):]))
    return parallel.by_rows(linear, z, w=p["wo"], b=p.get("bo"))             # (N, D)


def attend_cached(q: np.ndarray, k: np.ndarray, v: np.ndarray, cache: KVCache, cfg: Config, i: int,
                  record: list | None = None) -> np.ndarray:
    """One sequence's new k and v (T, KV, d) and the queries q (T', H, d) of its last T' <= T rows: k
    and v join the cache, q attends causally over all of it. Each head's output z (T', H, d); the
    weights (H, T', S) are appended to `record` when it is a list. A record with a `block` method takes
    them a few query rows at a time instead, record.block(layer, first row, weights (H, r, S), plogp (H, r)),
    and no layer's whole map is made (minigen.inspect.scan: a long prompt's attention in bounded memory)."""
    offset = cache.offset + len(k) - len(q)                                  # the first query's position
    keys, values = cache.update_and_fetch(k.transpose(1, 0, 2), v.transpose(1, 0, 2))   # (KV, S, d)
    streamed = getattr(record, "block", None)
    out, weights = causal_attention(q.transpose(1, 0, 2), keys, values, offset, cfg.window(i),
                                    record is not None, cfg.attn_scale, cfg.attn_softcap,
                                    None if streamed is None else partial(streamed, i))   # (H, T, d)
    if record is not None and streamed is None:
        record.append(weights)
    return out.transpose(1, 0, 2)                                            # (T, H, d)


def pooled_decoding(seqs: list[Seq], i: int) -> list[Seq]:
    """The sequences whose layer-i attention can be one pooled product: a decode step (one new row)
    through a cache of the first such sequence's pool (a Batch's, cache.KVPool), if there are two or more."""
    first = next((s.cache[i].pool for s in seqs if isinstance(s.cache[i], PooledKV)), None)
    if first is None:   # a forward of its own (generate, chat, scores): nothing to pool
        return []
    group = [s for s in seqs if s.rows.stop - s.rows.start == 1 and getattr(s.cache[i], "pool", None) is first]
    return group if len(group) > 1 else []


def attend_pooled(q: np.ndarray, k: np.ndarray, v: np.ndarray, caches: list[PooledKV], cfg: Config,
                  i: int) -> np.ndarray:
    """A decode step of B sequences of one pool: each one's new q (B, H, d), k and v (B, KV, d) join its
    slot, and every q attends over its own keys, in one product per run of neighbouring slots of like
    lengths (attention.slot_runs). Each head's output z (B, H, d)."""
    pool = caches[0].pool
    slots, lengths = pool.append(caches, k, v)                               # (B,) x2
    z = np.empty_like(q)                                                     # (B, H, d)
    with parallel.blas_alone():   # small products, faster on one OpenBLAS thread (as a decode step's attention)
        for run in slot_runs(tuple(slots.tolist()), tuple(lengths.tolist())):
            z[run] = pooled_decode_attention(q[run], pool.keys_t, pool.values, slots[run], lengths[run],
                                             cfg.window(i), cfg.attn_scale, cfg.attn_softcap)
    return z


def recurrent(step, window=None):
    """A token mixer from a recurrence `step(x, tail, state, p, cfg) -> (out, tail, state)` on one
    sequence's rows: each sequence runs from its own cache's state, which it then advances. With
    `last`, each sequence's last output row only, (B, D); `window(cfg)`, if given, is how many of the
    last rows determine that output and the new tail (a convolution's kernel, with no state beyond
    its tail): then only those are computed."""
    def mixer(h: np.ndarray, p: dict, cfg: Config, i: int, seqs: list[Seq], rope=None, record=None, hooks=None,
              last: bool = False):
        out = np.empty((len(seqs), h.shape[1]) if last else h.shape, np.float32)   # (N, D), or (B, D)
        for b, s in enumerate(seqs):
            c = s.cache[i]
            c = getattr(c, "ssm", c)   # beside attention (Falcon-H1), its own part of the layer's cache
            start = max(s.rows.start, s.rows.stop - window(cfg)) if last and window else s.rows.start
            # from a later start the first rows' outputs read the wrong tail; the last row's and the new tail do not
            y, tail, state = step(h[start:s.rows.stop], c.tail, c.state, p, cfg)
            out[b if last else s.rows] = y[-1] if last else y
            c.update(tail, state, s.rows.stop - s.rows.start)
        if record is not None:   # no attention weights: None keeps record[i] the weights of layer i
            record.append(None)
        return out
    return mixer


def attention_and_mamba2(h: np.ndarray, p: dict, cfg: Config, i: int, seqs: list[Seq], rope,
                         record: list | None = None, hooks: Hooks | None = None, last: bool = False) -> np.ndarray:
    """Falcon-H1: attention and Mamba2 side by side on the same input, their outputs summed (the µP
    multipliers on both are folded into the weights at load)."""
    return MIXERS["mamba2"](h, p, cfg, i, seqs, last=last) + attention(h, p, cfg, i, seqs, rope, record, hooks, last)


MIXERS = {   # Config.mixer(layer) -> the layer's token mixer
    "attention": attention,
    "gated_delta": recurrent(lambda x, tail, state, p, cfg: gated_deltanet(x, tail, state, p, cfg.delta_net)),
    "short_conv": recurrent(lambda x, tail, state, p, cfg: (*short_conv(x, tail, p), None),
                            window=lambda cfg: cfg.short_conv.kernel),
    "mamba2": recurrent(lambda x, tail, state, p, cfg: mamba2(x, tail, state, p, cfg.mamba)),
    "attention+mamba2": attention_and_mamba2,
}


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
        qk = apply_rope(qk, cos[:, None], sin[:, None])
        if len(rope) > 2:  # Ministral 3: each position's queries x its scale (rope_tables_for)
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


# --- MLPs ------------------------------------------------------------------------------------------

def mlp_block(x: np.ndarray, p: dict, cfg: Config) -> np.ndarray:
    """What the MLP block adds to rows of the residual stream x (N, D): norm, MLP, post-norm."""
    h = norm(x, p, cfg, "mlp_norm") if cfg.pre_norms or cfg.parallel_residual else x
    m = MLPS[cfg.mlp](h, p, cfg)                                             # (N, D)
    return norm(m, p, cfg, "mlp_post_norm") if cfg.post_norms else m


def gated_mlp(x: np.ndarray, p: dict, cfg: Config) -> np.ndarray:
    """down(act(gate x) * up x), gate and up fused into one (2F, D) matrix."""
    gate_up = linear(x, p["w_gate_up"], p.get("b_gate_up"))                  # (N, 2F)
    F = gate_up.shape[-1] // 2
    h = activation(cfg.act)(gate_up[:, :F])                                  # (N, F)
    h *= gate_up[:, F:]  # in place: one (N, F) temporary fewer on a long prompt
    return linear(h, p["w_down"], p.get("b_down"))


def plain_mlp(x: np.ndarray, p: dict, cfg: Config) -> np.ndarray:
    """down(act(up x)): GPT-2, GPT-NeoX."""
    return linear(activation(cfg.act)(linear(x, p["w_up"], p.get("b_up"))), p["w_down"], p.get("b_down"))


MLPS = {"gated": gated_mlp, "plain": plain_mlp, "moe": moe_mlp}   # Config.mlp -> the layer's MLP (moe: moe.py)


# --- around the layers -------------------------------------------------------------------------------

def stack(ids: list[np.ndarray], caches: list[list]) -> list[Seq]:
    """The Seq of each sequence whose new ids are stacked one after another."""
    ends = np.cumsum([len(i) for i in ids])
    return [Seq(slice(int(end - len(i)), int(end)), c) for i, end, c in zip(ids, ends, caches)]


def positions(seqs: list[Seq]) -> np.ndarray:
    """(N,) each row's position in its own sequence."""
    return np.concatenate([span(s) for s in seqs])


def span(s: Seq) -> np.ndarray:
    """(T,) the positions of one sequence's new rows: from its cache's offset on."""
    return np.arange(s.cache[0].offset, s.cache[0].offset + s.rows.stop - s.rows.start)


def rope_of(cfg: Config, layer: int):
    """This layer's Rope, or None (learned positions, or a layer without RoPE)."""
    return cfg.rope[layer] if cfg.positions == "rope" else None


def rope_for(cfg: Config, seqs: list[Seq]) -> dict:
    """{Rope: (cos, sin), each (N, dim)}: one pair of tables per distinct RoPE of the model, each
    sequence's rows at its own positions (longrope picks its factors per sequence, by its length)."""
    if cfg.positions != "rope":
        return {}
    tables = {}
    for r in set(cfg.rope) - {None}:
        parts = [rope_tables_for(r, span(s)) for s in seqs]                  # per sequence: (T, dim) x2 [, (T,)]
        tables[r] = parts[0] if len(parts) == 1 else tuple(np.concatenate(t) for t in zip(*parts))
    return tables


def rope_tables_for(r, positions: np.ndarray) -> tuple:
    """(cos, sin) for these positions, and Ministral 3's query scale (T,) when its Rope has one."""
    return rope_tables(r, positions) + ((query_scale(r, positions),) if r.query_beta else ())


def embed(params: dict, cfg: Config, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    x = params["embed"][ids]                                                 # (N, D), a copy
    if cfg.embed_scale:  # Gemma: sqrt(D), rounded to the activation dtype as HF does
        x *= np.float32(cfg.hidden_size ** 0.5)
    if cfg.embed_multiplier != 1.0:  # Granite, Falcon-H1
        x *= np.float32(cfg.embed_multiplier)
    if cfg.positions == "learned":
        x += params["pos_embed"][positions]
    return x


def unembed(x: np.ndarray, params: dict, cfg: Config) -> np.ndarray:
    """The final norm, the output projection, the logits multiplier and the family's soft-cap: (N, D) -> (N, V)."""
    logits = norm(x, params, cfg, "final_norm") @ params["lm_head"].T        # (N, V)
    if cfg.logits_multiplier != 1.0:  # Granite: / logits_scaling; Falcon-H1: x lm_head_multiplier
        logits *= np.float32(cfg.logits_multiplier)
    return softcap(logits, cfg.final_softcap) if cfg.final_softcap else logits


def norm(x: np.ndarray, p: dict, cfg: Config, name: str) -> np.ndarray:
    if cfg.norm == "layer":
        return layer_norm(x, p[name], p[name + "_b"], cfg.norm_eps)
    return rms_norm(x, p[name], cfg.norm_eps)


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """x (N, in) @ w.T, w (out, in). A row-major w (checkpoint/weights.column_major_for) times a few
    rows goes as w @ x.T, which OpenBLAS runs faster there (16 rows of SmolLM2's down projection: 473
    us against 519; 32 of LFM2-350M's: 3.5 ms against 4.8). A few rows are computed as a multiple of
    ROW_GROUP (`padded_rows`), the extra rows zeros."""
    n = len(x)
    if not 1 < n <= FEW_ROWS:
        y = x @ w.T
    else:
        if (rows := padded_rows(n)) != n:
            x = np.concatenate([x, np.zeros((rows - n, x.shape[1]), x.dtype)])
        y = ((w @ x.T).T if w.flags.c_contiguous else x @ w.T)[:n]
    return y if b is None else y + b


FEW_ROWS = 32
ROW_GROUP = 8


def padded_rows(n: int) -> int:
    """How many rows a product of n (2..FEW_ROWS) rows is computed as: n rounded up to a multiple of
    ROW_GROUP where it lies 4 or more past one. OpenBLAS's GEMM on AVX2 (Haswell's kernels, also on
    AMD) takes its small side in groups of 8, and a group cut short costs more than a whole one:
    measured on an AMD EPYC against one row (the GEMV), SmolLM2's 3072 x 576 gate/up at 5 / 7 / 8
    rows 2.97 / 3.03 / 2.32x, 13 / 16 rows 3.81 / 2.73x; Qwen2.5-1.5B's 151,936 x 1,536 lm_head 2.55 /
    2.48 / 1.97x and 3.29 / 2.64x. Short of 4 past (9 rows, 2 rows) the group is cheaper as it is."""
    over = n % ROW_GROUP
    return n + ROW_GROUP - over if over >= 4 else n


# --- the loaded model --------------------------------------------------------------------------------

class Model:
    """A checkpoint's forward pass: its Config and float32 params. It holds no generation state (the
    cache is passed in) and loads nothing itself: `minigen.load` builds it beside the tokenizer."""

    def __init__(self, config: Config, params: dict, generation_config: dict | None = None,
                 path: Path | str | None = None):
        self.config, self.params = config, params
        self.generation_config = generation_config or {}   # generation_config.json: sampling defaults, EOS
        self.path = path

    def make_cache(self, capacity: int = 256) -> list:
        """One cache per layer, of the layer's kind, all at offset 0."""
        return make_cache(self.config, capacity)

    def forward(self, ids, cache: list, last_only: bool = False, record: list | None = None,
                hooks: Hooks | None = None) -> np.ndarray:
        return forward(self.params, self.config, self.check_ids(ids), cache, last_only, record, hooks)

    def forward_batch(self, ids: list, caches: list[list], last_only: bool = True) -> list[np.ndarray]:
        """`forward` of several sequences, each with its own cache, in one pass over the weights."""
        return forward_batch(self.params, self.config, [self.check_ids(i) for i in ids], caches, last_only)

    def logits(self, ids) -> np.ndarray:
        """Uncached forward over all ids: float32 (len(ids), vocab_size)."""
        return self.forward(ids, self.make_cache(max(len(ids), 1)))

    def check_ids(self, ids) -> np.ndarray:
        """ids as a 1-D integer array within the vocabulary: the public edge of the forward pass."""
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

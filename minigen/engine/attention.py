"""Scaled dot-product attention: softmax(Q Kᵀ / √d_k) · V, with its causal (and sliding) mask, and
the two things some families change: the scale, and a tanh soft-cap on the scores (Gemma 2).

`attend` is the formula and nothing else, so the seeds' worked examples run through it unchanged:
plain 2-D arrays, no mask. `causal_attention` is how the model uses it: grouped-query shapes, the
G query heads of a KV head stacked as G*T rows against that one K and V (shared, never copied per
query head; query head h reads KV head h // G, HF's order), and long prompts cut into blocks of
query rows so that keys a block cannot see (the future, or past the sliding window) are skipped
rather than computed and masked, and only the keys a block might not see get a mask. Each block is
the same formula, rearranged for speed (`_attend_block`; a long block in tiles of keys with an online
softmax, `_attend_tiles`); a long prompt's blocks run on parallel threads (parallel.py). Tests hold
the two to each other.
"""
from __future__ import annotations

import math
from functools import lru_cache, partial

import numpy as np

from . import parallel
from .quant.matrix import twins

NEG = np.finfo(np.float32).min  # masked score: exp(NEG - max) is exactly 0, and never NaN


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(x - max) / sum: subtracting the row max keeps exp from overflowing."""
    return _softmax_(np.array(x, dtype=np.result_type(x, np.float32)), axis)


def _softmax_(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """softmax computed in place in x (a fresh scores array): no temporaries the size of x."""
    x -= x.max(axis=axis, keepdims=True)
    np.exp(x, out=x)
    total = x.sum(axis=axis, keepdims=True)
    x *= np.reciprocal(total, out=total)  # one division per row, a multiply per element
    return x


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None,
           scale: float | None = None, softcap: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """q (..., T, d), k (..., S, d), v (..., S, dv); mask (T, S) boolean, True where a query may look.
    A mask narrower than S covers the last mask.shape[-1] keys; every query sees the keys before them.
    `scale` defaults to 1/sqrt(d); `softcap` bounds the scaled scores to (-cap, cap) with tanh before
    the mask, as Gemma 2 does. Returns (out (..., T, dv), weights (..., T, S))."""
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    dtype = np.result_type(q, np.float32)
    scores = (q * np.asarray(scale, dtype=dtype)) @ np.swapaxes(k, -1, -2)   # (..., T, S); scaling q is cheaper
    if scores.dtype != dtype:
        scores = scores.astype(dtype)
    if softcap is not None:
        scores /= np.asarray(softcap, dtype=dtype)
        np.tanh(scores, out=scores)
        scores *= np.asarray(softcap, dtype=dtype)
    if mask is not None:
        np.copyto(scores[..., scores.shape[-1] - mask.shape[-1]:], np.asarray(NEG, dtype=scores.dtype), where=~mask)
    weights = _softmax_(scores)
    return weights @ v, weights


def causal_mask(T: int, offset: int, window: int | None = None) -> np.ndarray:
    """(T, offset + T) boolean: query i (at absolute position offset + i) sees keys j <= offset + i,
    and with a sliding window only the last `window` of them (offset + i - j < window), as HF does."""
    return block_mask(offset, offset + T, 0, offset + T, window)


def block_mask(q_start: int, q_stop: int, k_start: int, k_stop: int, window: int | None) -> np.ndarray:
    """The causal (and sliding) mask for query positions [q_start, q_stop) against keys [k_start, k_stop)."""
    q_pos = np.arange(q_start, q_stop)[:, None]
    k_pos = np.arange(k_start, k_stop)[None, :]
    mask = k_pos <= q_pos
    if window is not None:
        mask &= q_pos - k_pos < window
    return mask


BLOCK = 64   # query rows per block: a full-speed GEMM, and scores small enough to stay in cache


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, offset: int, window: int | None = None,
                     want_weights: bool = False, scale: float | None = None, softcap: float | None = None,
                     on_block=None) -> tuple[np.ndarray, np.ndarray | None]:
    """q (H, T, d) at positions offset.., k and v (KV, S, d) with S = offset + T, H = G * KV; `scale`
    and `softcap` as in `attend`. Returns out (H, T, d), a view of a (T, H, d) array, and, when asked,
    the weights (H, T, S) with exact zeros where masked. The blocks of a long prompt run on parallel
    threads (parallel.py), the longest first. With `on_block`, no (H, T, S) array is made: each block's
    weights go to on_block(start, weights, plogp) as they are made (`_stream_block`), from its thread."""
    (H, T, d), KV = q.shape, k.shape[0]
    if T == 1 and not want_weights and on_block is None and H // KV * k.shape[1] <= TILE:
        return _decode_step(q, k, v, offset, window, scale, softcap), None
    out = np.empty((T, H, v.shape[-1]), np.float32).transpose(1, 0, 2)      # (H, T, d); (T, H, d) in memory
    weights = np.zeros((H, T, k.shape[1]), np.float32) if want_weights and on_block is None else None
    q = q.reshape(KV, H // KV, T, d)                                          # (KV, G, T, d)

    def block(start: int, stop: int):
        lo = 0 if window is None else max(0, offset + start - window + 1)   # first key any row sees
        hi = offset + stop                                                    # one past the last
        if on_block is not None:
            out[:, start:stop] = _stream_block(q[:, :, start:stop], k[:, :hi], v[:, :hi], offset, start, window,
                                               scale, softcap, on_block)
            return
        # without a window only the block's own keys need a mask: the triangle on the diagonal
        mask = None if stop - start == 1 else \
            block_mask(offset + start, offset + stop, offset + start if window is None else lo, hi, window)
        o, w = _attend_block(q[:, :, start:stop], k[:, lo:hi], v[:, lo:hi], mask, scale, softcap, want_weights)
        out[:, start:stop] = o                                                # o (H, B, d)
        if want_weights:
            weights[:, start:stop, lo:hi] = w

    blocks = [partial(block, start, min(T, start + BLOCK)) for start in reversed(range(0, T, BLOCK))]
    if len(blocks) == 1:   # a decode step: small products, which OpenBLAS's threads slow (parallel.blas_alone)
        with parallel.blas_alone():
            blocks[0]()
    else:
        parallel.in_threads(blocks, parallel.threads_for(T))
    return out, weights


def _decode_step(q: np.ndarray, k: np.ndarray, v: np.ndarray, offset: int, window: int | None,
                 scale: float | None, softcap: float | None) -> np.ndarray:
    """causal_attention's one block for one query (a decode step), without the blocks' bookkeeping (~40 us
    of a ~60 us call on SmolLM2's shapes): `_attend_block` with no mask, as one query sees every key but those
    before its window, and its scores in one piece (a cache longer than TILE / G goes through the blocks,
    in tiles). q (H, 1, d) -> out (H, 1, d)."""
    (H, _, d), KV = q.shape, k.shape[0]
    lo = 0 if window is None else max(0, offset - window + 1)
    qs = q.reshape(KV, H // KV, d) * query_factor(d, scale, softcap)          # (KV, G, d)
    with parallel.blas_alone():
        scores = rows_times(qs, np.swapaxes(k[:, lo:], -1, -2))              # (KV, G, S')
        capped(scores, softcap)
        out, _ = softmax_times(scores, v[:, lo:])                            # (KV, G, d)
    return out.reshape(H, 1, -1)


def decode_attention(q: np.ndarray, keys_t: np.ndarray, values: np.ndarray, stop: int, window: int | None,
                     scale: float | None, softcap: float | None) -> np.ndarray:
    """One query per head q (H, d) at position stop − 1 over the first `stop` keys and values of one cache's
    buffers, keys_t (KV, d, C) and values (KV, C, d): out (H, d), no weights kept. By numba's twin
    (compiled.py) once the kernels are loaded, without a soft-cap (past TWIN_SCORES scores on numba's
    threads, unless this thread's products keep to it: parallel.alone()); else `causal_attention`."""
    (H, d), KV = q.shape, keys_t.shape[0]
    lo = 0 if window is None else max(0, stop - window)                      # the first key it sees
    if softcap is None and (twin := twins()) is not None:
        out, q = np.empty((H, d), np.float32), np.ascontiguousarray(q, np.float32)
        factor = np.float32(1.0 / math.sqrt(d) if scale is None else scale)
        if H * (stop - lo) <= TWIN_SCORES or parallel.alone() or (threads := twin.thread_count()) == 1:
            twin.decode_attention(q, keys_t, values, lo, stop, factor, out)
        else:
            twin.decode_attention_split(q, keys_t, values, lo, stop, factor, threads, out)
        return out
    k, v = keys_t[:, :, :stop].transpose(0, 2, 1), values[:, :stop]          # (KV, S, d) x2
    return causal_attention(q[:, None], k, v, stop - 1, window, False, scale, softcap)[0][:, 0]


# scores (heads x keys) up to which a decode step's attention runs on the calling thread (compiled.decode_attention);
# beyond, split over numba's threads (decode_attention_split), whose start costs ~15 us. A decode step in the model
# (Zen 5, one process, the ways taking turns), ms: SmolLM2-135M after 1,024 / 2,048 / 4,096 tokens 7.8 / 11.9 / 20.0
# on one thread, 7.5 / 9.8 / 15.5 split (NumPy's one-thread BLAS 8.4 / 14.3 / 25.0); Qwen2.5-1.5B Q4_K_M 41.9 / 41.5
# / 63.5, 39.8 / 36.0 / 51.9 (48.6 / 48.1 / 79.3).
TWIN_SCORES = 8192


def causal_weights(q: np.ndarray, k: np.ndarray, offset: int, window: int | None = None,
                   scale: float | None = None, softcap: float | None = None,
                   entropy: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """The weights `causal_attention` computes, without the values: queries q (H, T, d) at positions
    offset.., keys k (KV, S, d) with S = offset + T. The same steps as its blocks (`_attend_block`: the
    queries scaled, the soft-cap, the mask, the row max subtracted, exp, rows
    normalised by one reciprocal), so the same numbers: a tile of queries of a long prompt's map, which
    inspection takes one at a time (minigen.inspect.scan), and the exact rows it serves. Returns the
    weights (H, T, S), exact zeros where masked, and with `entropy` each row's sum of w ln w (H, T),
    from the scores: ln w_j = (s_j - max) - ln Z, so no log of a weight is taken."""
    (H, T, d), (KV, S) = q.shape, k.shape[:2]
    G, lo = H // KV, 0 if window is None else max(0, offset - window + 1)   # lo: the first key any row sees
    qs = (q * query_factor(d, scale, softcap)).reshape(KV, G * T, d)         # (KV, G T, d)
    scores = rows_times(qs, np.swapaxes(k[:, lo:], -1, -2))                  # (KV, G T, S - lo)
    capped(scores, softcap)
    rows = scores.reshape(KV, G, T, -1)                                      # the mask broadcast over heads
    np.copyto(rows, NEG, where=~block_mask(offset, offset + T, lo, S, window))
    scores -= scores.max(axis=-1, keepdims=True)
    e = np.exp(scores)                                                       # (KV, G T, S - lo), unnormalised
    total = e.sum(axis=-1, keepdims=True)                                    # (KV, G T, 1): Z
    plogp = None
    if entropy:   # sum_j w_j ln w_j = (sum_j e_j s_j) / Z - ln Z; masked: e_j = 0 against a finite s_j
        plogp = (np.einsum("...j,...j->...", e, scores) / total[..., 0] - np.log(total[..., 0])).reshape(H, T)
    e *= np.reciprocal(total, out=total)
    if lo == 0:
        return e.reshape(H, T, S), plogp
    weights = np.zeros((H, T, S), np.float32)
    weights[:, :, lo:] = e.reshape(H, T, -1)
    return weights, plogp


STREAM_ROWS = 16   # query rows per causal_weights call of a streamed block: 9 heads x 16 x 4,096 keys in 2.4 MB


def _stream_block(q: np.ndarray, k: np.ndarray, v: np.ndarray, offset: int, first: int, window: int | None,
                  scale: float | None, softcap: float | None, on_block) -> np.ndarray:
    """The block of query rows first.. (at positions offset + first..) of causal_attention, q (KV, G, B, d),
    with its weights wanted: for STREAM_ROWS rows at a time, `causal_weights` (weights (H, r, S) and each
    row's w ln w) handed to on_block(row, weights, plogp), then out = weights @ v. Returns out (H, B, d)."""
    KV, G, B, d = q.shape
    out = np.empty((KV * G, B, v.shape[-1]), np.float32)
    for a in range(0, B, STREAM_ROWS):
        b = min(B, a + STREAM_ROWS)
        S = offset + first + b
        w, plogp = causal_weights(q[:, :, a:b].reshape(KV * G, b - a, d), k[:, :S], offset + first + a, window,
                                  scale, softcap, entropy=True)            # (H, r, S), (H, r)
        on_block(first + a, w, plogp)
        out[:, a:b] = rows_times(w.reshape(KV, G * (b - a), S), v[:, :S]).reshape(KV * G, b - a, -1)
    return out


def _attend_block(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale: float | None,
                  softcap: float | None, want_weights: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """`attend` for one block of queries q (KV, G, B, d) against k, v (KV, S', d), G query heads per
    KV head stacked as G*B rows (K and V shared, never copied); mask (B, S') or None. The rows are
    normalised after the product with V, on d columns instead of S': the same numbers, faster. A block of more than TILE scores goes in tiles of keys
    (`_attend_tiles`), unless its weights are asked for. Returns out (H, B, d) and the weights (H, B, S')
    when asked."""
    KV, G, B, d = q.shape
    q = (q * query_factor(d, scale, softcap)).reshape(KV, G * B, d)
    if G * B * k.shape[1] > TILE and not want_weights:   # a long block's scores would not stay in cache
        return _attend_tiles(q, k, v, mask, softcap, G).reshape(KV * G, B, -1), None
    scores = rows_times(q, np.swapaxes(k, -1, -2))                            # (KV, G B, S')
    capped(scores, softcap)
    if mask is not None:
        rows = scores.reshape(KV, G, B, -1)                                   # the mask broadcast over heads
        np.copyto(rows[..., rows.shape[-1] - mask.shape[-1]:], NEG, where=~mask)
    out, total = softmax_times(scores, v)                                     # (KV, G B, d), (KV, G B, 1)
    if want_weights:
        scores *= total
        return out.reshape(KV * G, B, -1), scores.reshape(KV * G, B, -1)
    return out.reshape(KV * G, B, -1), None


TILE = 1 << 17   # scores in one tile of a long block's keys: 512 KB, in L2 while the tile is used


def _attend_tiles(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, softcap: float | None,
                  G: int) -> np.ndarray:
    """`_attend_block` for a long block, one KV head and one tile of keys at a time, with the softmax
    taken online as FlashAttention does: a tile's exponentials are taken against the largest score so
    far, and what the earlier tiles summed is rescaled by exp(old max - new max) when it grows. A block
    of 64 queries against 4,096 keys in one product writes 16 MB of scores (8 KV heads, 2 query heads
    each) and reads them four times more, from memory; in tiles of TILE scores they stay in L2 (on an
    AMD EPYC, SmolLM2's attention over a 4,096-token prompt 10.8 -> 9.5 s). q (KV, R, d) already scaled
    (query_factor), R = G B rows (G query heads of B queries); k, v (KV, S', d); mask (B, M) over the
    last M keys, or None. Each row sees its own key: a tile where a row sees nothing (outside a sliding
    window) gives it weights that a later tile's rescale wipes, exp(NEG - max) being 0. Returns out (KV, R, d)."""
    (KV, R, d), S = q.shape, k.shape[1]
    M = 0 if mask is None else mask.shape[-1]                                # the mask covers keys S - M..S - 1
    width = max(64, TILE // R)                                               # keys per tile
    out = np.empty((KV, R, v.shape[-1]), np.float32)
    for h in range(KV):
        top = np.full((R, 1), NEG, np.float32)                               # the largest score so far
        total, acc = np.zeros((R, 1), np.float32), np.zeros((R, v.shape[-1]), np.float32)
        for start in range(0, S, width):
            stop = min(S, start + width)
            scores = q[h] @ k[h, start:stop].T                               # (R, t)
            capped(scores, softcap)
            if stop > S - M:
                first = max(start, S - M)
                rows = scores.reshape(G, -1, stop - start)                   # (G, B, t): the mask broadcast over heads
                np.copyto(rows[..., first - start:], NEG, where=~mask[:, first - (S - M):stop - (S - M)])
            peak = np.maximum(top, scores.max(axis=-1, keepdims=True))       # (R, 1)
            shrink = np.exp(top - peak)                                         # the sums so far against the new max (0 at first)
            total *= shrink
            acc *= shrink
            top = peak
            scores -= top
            np.exp(scores, out=scores)
            total += scores.sum(axis=-1, keepdims=True)
            acc += scores @ v[h, start:stop]                                 # (R, d)
        np.divide(acc, total, out=out[h])
    return out


def pooled_decode_attention(q: np.ndarray, keys_t: np.ndarray, values: np.ndarray, slots: np.ndarray,
                            lengths: np.ndarray, window: int | None = None, scale: float | None = None,
                            softcap: float | None = None) -> np.ndarray:
    """A decode step of B sequences at once: sequence b's one new query q[b] (H, d), at position
    lengths[b] - 1, against the lengths[b] keys of its slot slots[b] of a batch's pool (cache.KVPool):
    keys_t (P, KV, d, C), values (P, KV, C, d). One product over the slots slots.min()..slots.max()
    with every slot's scores cut at the longest length, each masked past its own (and outside its
    window); a free slot between them computes nothing anyone reads. The same formula as
    `_attend_block` (rows normalised after the product with V). Returns out (B, H, d).
    By numba's twins (compiled.decode_pool) where decode_attention would take them, the sequences shared among
    numba's threads from two on: each sequence's keys are its own rows of lines, which a thread waits for however
    few the keys (SmolLM2's 9 heads, 16 sequences of 1 / 40 / 150 keys, Zen 4: 47 / 125 / 232 us on one thread,
    26 / 64 / 121 split; 2 sequences of 40 keys 15 / 10; a decode step of one sequence splits past TWIN_SCORES)."""
    B, H, d = q.shape
    firsts = np.zeros(B, np.int64) if window is None else np.maximum(0, lengths - window).astype(np.int64)
    if softcap is None and (twin := twins()) is not None:                    # compiled.py, each over its own keys
        out = np.empty((B, H, d), np.float32)
        alone = B == 1 or parallel.alone() or twin.thread_count() == 1
        pool = twin.decode_pool if alone else twin.decode_pool_split
        pool(np.ascontiguousarray(q, np.float32), keys_t, values, slots.astype(np.int64), firsts,
             lengths.astype(np.int64), np.float32(1.0 / math.sqrt(d) if scale is None else scale), out)
        return out
    with parallel.blas_alone():   # small products, faster on one OpenBLAS thread (as a decode step's attention)
        return _pooled_products(q, keys_t, values, slots, lengths, window, scale, softcap)


def _pooled_products(q, keys_t, values, slots, lengths, window, scale, softcap) -> np.ndarray:
    """pooled_decode_attention in NumPy: one product over the slots lo..hi-1, masked per slot."""
    (B, H, d), KV = q.shape, keys_t.shape[1]
    lo, hi, S = int(slots.min()), int(slots.max()) + 1, int(lengths.max())
    rows = slots - lo
    in_order = B == hi - lo and bool((rows == np.arange(B)).all())           # every slot lo..hi-1, in order
    qs = q.reshape(B, KV, H // KV, d) * query_factor(d, scale, softcap)      # (B, KV, G, d)
    if not in_order:
        qs, rest = np.zeros((hi - lo, KV, H // KV, d), np.float32), qs       # (P', KV, G, d)
        qs[rows] = rest
    scores = rows_times(qs, keys_t[lo:hi, :, :, :S])                          # (P', KV, G, S)
    capped(scores, softcap)
    np.copyto(scores, NEG, where=hidden_keys(tuple(rows.tolist()), tuple(lengths.tolist()), hi - lo, S, window))
    out, _ = softmax_times(scores, values[lo:hi, :, :S])                      # (P', KV, G, d)
    return (out if in_order else out[rows]).reshape(B, H, -1)                 # (B, H, d)


@lru_cache(maxsize=8)   # every attention layer of a decode step asks the same (a sliding one, with its window)
def hidden_keys(rows: tuple, lengths: tuple, P: int, S: int, window: int | None) -> np.ndarray:
    """(P, 1, 1, S): True where slot row r of a pooled product may not look: past its sequence's length
    (lengths[i] for rows[i]), outside its window, or every position of a row no sequence holds."""
    pos, rows, lengths = np.arange(S), np.array(rows), np.array(lengths)[:, None]
    visible = np.zeros((P, S), bool)
    visible[rows] = pos < lengths
    if window is not None:
        visible[rows] &= lengths - 1 - pos < window
    return ~visible[:, None, None]


def rows_times(a: np.ndarray, m: np.ndarray) -> np.ndarray:
    """a @ m for stacks of rows a (..., R, K) against their matrices m (..., K, N). A decode step has
    a few rows per matrix (R = the G query heads of a KV head): then each row times its matrix is one
    BLAS GEMV (np.vecmat, NumPy 2.2 on), as OpenBLAS's GEMM computes a handful of rows at a fraction
    of its speed: on an AMD EPYC, 3 query heads x 64 against 330 keys in 26 us as a GEMM, 16 as three
    GEMVs (against 2,000 keys: 172 and 87; 6 heads: even; 12: the GEMM 1.5x faster). From GEMV_ROWS
    rows on, or without np.vecmat, the GEMM."""
    if VECMAT is None or a.shape[-2] > GEMV_ROWS:
        return a @ m
    return VECMAT(a, m[..., None, :, :])                                     # m broadcast over the R rows


VECMAT = getattr(np, "vecmat", None)
GEMV_ROWS = 4


def query_factor(d: int, scale: float | None, softcap: float | None) -> np.float32:
    """What the queries are multiplied by before q · Kᵀ: the scale (1/sqrt(d) by default), or, with
    Gemma 2's soft-cap, scale / cap (`capped` does the rest)."""
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    return np.float32(scale if softcap is None else scale / softcap)


def capped(scores: np.ndarray, softcap: float | None) -> None:
    """Gemma 2's cap * tanh(s / cap) on scores already divided by the cap (in place)."""
    if softcap is not None:
        np.tanh(scores, out=scores)
        scores *= np.float32(softcap)


def softmax_times(scores: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """softmax(scores) @ v with the rows normalised after the product (on d columns, not S'), the
    scores turned into their unnormalised exponentials in place. Returns the output and 1 / each
    row's sum (..., 1), which turns those scores into the weights."""
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True)                                # (..., 1)
    out = rows_times(scores, v)                                               # (..., d)
    np.reciprocal(total, out=total)
    out *= total
    return out, total


RUN_COST = 160   # one more pooled product, in slot-positions (~50 us against ~0.3 us a slot-position, AMD EPYC)


@lru_cache(maxsize=4)   # every attention layer of a decode step asks the same
def slot_runs(slots: tuple, lengths: tuple) -> tuple[np.ndarray, ...]:
    """The sequences of a pooled decode step (indices into `slots`) cut into runs of neighbouring slots,
    each run one `pooled_decode_attention` as long as its longest sequence, where the cut minimises the
    positions computed, sum(slots a run spans x its longest) + RUN_COST a run (dynamic programming over
    the slot order). Like lengths make one run; a 4,000-token sequence among 200-token ones gets a run of
    its own, rather than the others padded to its length (20x their keys read)."""
    order = sorted(range(len(slots)), key=slots.__getitem__)
    span, longest = [slots[o] for o in order], [lengths[o] for o in order]
    best, cut = [0] + [None] * len(order), [0] * (len(order) + 1)        # best[j]: the first j in runs
    for j in range(1, len(order) + 1):
        top = 0
        for i in range(j - 1, -1, -1):   # the run i..j-1, its longest growing as it reaches back
            top = max(top, longest[i])
            cost = best[i] + (span[j - 1] - span[i] + 1) * top + RUN_COST
            if best[j] is None or cost < best[j]:
                best[j], cut[j] = cost, i
    runs, j = [], len(order)
    while j:
        runs.append(np.array(order[cut[j]:j]))
        j = cut[j]
    return tuple(runs[::-1])

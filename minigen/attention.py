"""Scaled dot-product attention: softmax(Q Kᵀ / √d_k) · V, with its causal (and sliding) mask, and
the two things some families change: the scale, and a tanh soft-cap on the scores (Gemma 2).

`attend` is the formula and nothing else, so the seeds' worked examples run through it unchanged:
plain 2-D arrays, no mask. `causal_attention` is how the model uses it: grouped-query shapes, the
G query heads of a KV head stacked as G*T rows against that one K and V (shared, never copied per
query head; query head h reads KV head h // G, HF's order), and long prompts cut into blocks of
query rows so that keys a block cannot see (the future, or past the sliding window) are skipped
rather than computed and masked, and only the keys a block might not see get a mask.
"""
from __future__ import annotations

import numpy as np

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


BLOCK = 128  # query rows per block: big enough for BLAS, small enough that scores stay in cache


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, offset: int, window: int | None = None,
                     want_weights: bool = False, scale: float | None = None,
                     softcap: float | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """q (H, T, d) at positions offset.., k and v (KV, S, d) with S = offset + T, H = G * KV; `scale`
    and `softcap` as in `attend`. Returns out (H, T, d) and, when asked, the weights (H, T, S) with
    exact zeros where masked."""
    (H, T, d), KV, S = q.shape, k.shape[0], k.shape[1]
    G = H // KV
    out = np.empty((H, T, v.shape[-1]), np.float32)
    weights = np.zeros((H, T, S), np.float32) if want_weights else None
    for start in range(0, T, BLOCK):
        stop = min(T, start + BLOCK)
        lo = 0 if window is None else max(0, offset + start - window + 1)   # first key any row sees
        hi = offset + stop                                                    # one past the last
        # without a window only the block's own keys need a mask: the triangle on the diagonal
        mask = None if stop - start == 1 else \
            block_mask(offset + start, offset + stop, offset + start if window is None else lo, hi, window)
        qb = q[:, start:stop].reshape(KV, G * (stop - start), d)              # (KV, G B, d)
        o, w = attend(qb, k[:, lo:hi], v[:, lo:hi], None if mask is None else np.tile(mask, (G, 1)), scale, softcap)
        out[:, start:stop] = o.reshape(H, stop - start, -1)                  # o (KV, G B, d)
        if want_weights:
            weights[:, start:stop, lo:hi] = w.reshape(H, stop - start, hi - lo)
    return out, weights

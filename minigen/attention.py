"""Scaled dot-product attention: softmax(Q Kᵀ / √d_k) · V, with its causal (and sliding) mask.

`attend` is the formula and nothing else, so the seeds' worked examples run through it unchanged:
plain 2-D arrays, no mask. The model calls it with grouped-query shapes — q (n_kv, group, T, d)
against k, v (n_kv, 1, S, d) — so each KV head is shared by its query group through broadcasting,
never copied per query head; query head h = kv * group + g reads KV head h // group, HF's order.
"""
from __future__ import annotations

import numpy as np

NEG = np.finfo(np.float32).min  # masked score: exp(NEG - max) is exactly 0, and never NaN


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(x - max) / sum: subtracting the row max keeps exp from overflowing."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None,
           scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """q (..., T, d), k (..., S, d), v (..., S, dv); mask (T, S) boolean, True where a query may look.
    Returns (out (..., T, dv), weights (..., T, S))."""
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ np.swapaxes(k, -1, -2)) * np.asarray(scale, dtype=q.dtype)  # (..., T, S)
    if mask is not None:
        scores = np.where(mask, scores, np.asarray(NEG, dtype=scores.dtype))
    weights = softmax(scores)
    return weights @ v, weights


def causal_mask(T: int, offset: int, window: int | None = None) -> np.ndarray:
    """(T, offset + T) boolean: query i (at absolute position offset + i) sees keys j <= offset + i,
    and with a sliding window only the last `window` of them (offset + i - j < window), as HF does."""
    q_pos = np.arange(offset, offset + T)[:, None]
    k_pos = np.arange(offset + T)[None, :]
    mask = k_pos <= q_pos
    if window is not None:
        mask &= q_pos - k_pos < window
    return mask

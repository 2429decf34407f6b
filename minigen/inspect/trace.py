"""One head's attention arithmetic, step by step, in the order of the worked examples of the articles
"Attention Math Step by Step: From the Input Matrix X to Softmax and V", "How Transformers Actually
Compute Attention — A Step-by-Step Breakdown" and "The math behind attention: Q, K and V" (whose
three-token birds/eat/seeds example `seeds_lines` reproduces): X, Q = X W_Q, K, V, the scores Q Kᵀ,
scaled by 1/√d_k, softmax, and the weighted sum of value rows.

`attention_steps` is the pure core: given X and a head's W_Q, W_K, W_V it computes every intermediate the
walk-through prints (no mask, no RoPE unless asked). `format_steps` turns one query row of it into lines
with token labels. Model-level tracing (norms, RoPE, the fused weights) lives in internals.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .report import bar, label


@dataclass
class Steps:
    """Every intermediate of softmax(q k^T / sqrt(d_k)) v for one head. Shapes: T queries, S keys, d dims."""
    x: np.ndarray         # (T, D) input rows
    q: np.ndarray         # (T, d) after bias and RoPE
    k: np.ndarray         # (S, d)
    v: np.ndarray         # (S, d_v)
    scores: np.ndarray    # (T, S) q . k, masked entries -inf
    scaled: np.ndarray    # (T, S) scores * scale
    weights: np.ndarray   # (T, S) softmax rows
    out: np.ndarray       # (T, d_v) weights @ v
    scale: float
    q_bias: np.ndarray | None = None
    q_raw: np.ndarray | None = None     # x W_Q + b, when a q/k norm or RoPE followed
    q_normed: np.ndarray | None = None  # after the q/k norm, before RoPE
    rotated: bool = False               # RoPE was applied
    softcap: float | None = None        # scaled scores went through cap * tanh(s / cap)


def attention_steps(x, w_q, w_k, w_v, *, b_q=None, b_k=None, b_v=None, kv_x=None, norm: Callable | None = None,
                    rotate: Callable | None = None, mask=None, scale: float | None = None,
                    softcap: float | None = None) -> Steps:
    """softmax((x W_Q)(x W_K)^T * scale) (x W_V), keeping every step.

    x: (T, D) query rows; kv_x: (S, D) key/value rows (default x). W_*: (D, d). norm(q, k) -> (q, k)
    is a q/k norm after the projections; rotate(q, k) -> (q, k) a positional rotation (RoPE) after it.
    mask: (T, S) bool, True = may attend. scale defaults to 1/sqrt(d_k); softcap bounds the scaled
    scores (before the mask, as Gemma 2 does).
    """
    x = np.asarray(x, dtype=np.float64)
    kv_x = x if kv_x is None else np.asarray(kv_x, dtype=np.float64)
    q = x @ np.asarray(w_q, dtype=np.float64) + (0 if b_q is None else b_q)          # (T, d)
    k = kv_x @ np.asarray(w_k, dtype=np.float64) + (0 if b_k is None else b_k)       # (S, d)
    v = kv_x @ np.asarray(w_v, dtype=np.float64) + (0 if b_v is None else b_v)       # (S, d_v)
    q_raw = q if norm is not None or rotate is not None else None
    q_normed = None
    if norm is not None:
        q, k = norm(q, k)
        q_normed = q
    if rotate is not None:
        q, k = rotate(q, k)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = q @ k.T                                                                  # (T, S)
    scaled = scores * scale
    if softcap is not None:
        scaled = softcap * np.tanh(scaled / softcap)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
        scaled = np.where(mask, scaled, -np.inf)
    e = np.exp(scaled - scaled.max(-1, keepdims=True))                                # row max first: no overflow
    weights = e / e.sum(-1, keepdims=True)
    return Steps(x, q, k, v, scores, scaled, weights, weights @ v, scale,
                 None if b_q is None else np.asarray(b_q), q_raw, q_normed, rotate is not None, softcap)


# --- printing ---------------------------------------------------------------------------------------

def fmt_vec(v, head: int = 4, tail: int = 2, digits: int = 2) -> str:
    """A vector as '(a, b, c)', integers without decimals, wide ones as first `head` ... last `tail`."""
    v = np.asarray(v, dtype=np.float64)
    as_int = np.all(np.isfinite(v)) and np.allclose(v, np.round(v), atol=1e-9)
    f = (lambda t: f"{t:.0f}") if as_int else (lambda t: f"{t:.{digits}f}")
    if v.size > head + tail + 1:
        parts = [f(t) for t in v[:head]] + [f"... ({v.size - head - tail} more)"] + [f(t) for t in v[-tail:]]
    else:
        parts = [f(t) for t in v]
    return "(" + ", ".join(parts) + ")"


def _num(t: float, as_int: bool) -> str:
    return "-inf" if np.isneginf(t) else (f"{t:.0f}" if as_int else f"{t:.2f}")


def visible_keys(steps: Steps, i: int, limit: int = 12) -> list[int]:
    """Keys worth a line for query i: all when few, else the top `limit` by weight, in position order."""
    keys = np.flatnonzero(np.isfinite(steps.scores[i]))
    if len(keys) <= limit:
        return list(keys)
    top = keys[np.argsort(-steps.weights[i, keys], kind="stable")[:limit]]
    return sorted(int(j) for j in top)


def format_steps(steps: Steps, labels: list[str], i: int, *, key_labels: list[str] | None = None,
                 limit: int = 12, header: str = "", norm_note: str = "", rope_note: str = "",
                 scale_note: str = "") -> list[str]:
    """The walk-through for query row i: x, q, keys/values, scores, scaled, softmax %, weighted sum."""
    key_labels = labels if key_labels is None else key_labels
    keys = visible_keys(steps, i, limit)
    n_keys = int(np.isfinite(steps.scores[i]).sum())
    d = steps.q.shape[-1]
    w = max(len(label(key_labels[j], 12)) for j in keys) + 9
    name = lambda j: f"'{label(key_labels[j], 12)}' [{j}]".ljust(w)
    out = [header] if header else []
    out.append(f"query token {i} {label(labels[i], 12)!r}")
    out.append(f"1. x (input row, width {steps.x.shape[-1]}) = {fmt_vec(steps.x[i])}")
    if steps.q_bias is not None:
        out.append(f"   q bias b_Q = {fmt_vec(steps.q_bias)}")
    if steps.q_raw is not None:
        out.append(f"2. q = x W_Q{' + b_Q' if steps.q_bias is not None else ''} = {fmt_vec(steps.q_raw[i])}")
        if steps.q_normed is not None:
            out.append(f"   after the q norm{norm_note}: q = {fmt_vec(steps.q_normed[i])}")
        if steps.rotated:
            out.append(f"   after RoPE at position {i}{rope_note}: q = {fmt_vec(steps.q[i])}")
    else:
        out.append(f"2. q = x W_Q{' + b_Q' if steps.q_bias is not None else ''} = {fmt_vec(steps.q[i])}   (d_k = {d})")
    shown = "" if len(keys) == n_keys else f" (showing the {len(keys)} largest weights of {n_keys})"
    rope = " (k after " + " and ".join(["the k norm"] * (steps.q_normed is not None) + ["RoPE"] * steps.rotated) + ")" \
        if steps.q_normed is not None or steps.rotated else ""
    out.append(f"3. keys and values it looks at{shown}{rope}:")
    for j in keys:
        out.append(f"   {name(j)} k = {fmt_vec(steps.k[j])}   v = {fmt_vec(steps.v[j])}")
    row_int = np.allclose(steps.scores[i, keys], np.round(steps.scores[i, keys]), atol=1e-9)
    out.append(f"4. raw scores q . k:")
    out += [f"   {name(j)} {_num(steps.scores[i, j], row_int)}" for j in keys]
    if scale_note:
        out.append(f"5. scaled scores x {steps.scale:.4g}{scale_note}" + (":" if steps.softcap is None else ""))
    else:
        out.append(f"5. scaled scores / sqrt(d_k) = / {1 / steps.scale:.4g}" + (":" if steps.softcap is None else ""))
    if steps.softcap is not None:
        out[-1] += f", then soft-capped: {steps.softcap:g} * tanh(s / {steps.softcap:g}):"
    out += [f"   {name(j)} {steps.scaled[i, j]:.2f}" for j in keys]
    out.append(f"6. softmax (row max subtracted first), as percentages:")
    out += [f"   {name(j)} {100 * steps.weights[i, j]:6.2f}%  {bar(steps.weights[i, j], 30)}" for j in keys]
    rest = 1.0 - steps.weights[i, keys].sum()
    if len(keys) < n_keys:
        out.append(f"   {'(other keys)'.ljust(w)} {100 * rest:6.2f}%")
    out.append("7. output = sum of weight x value row:")
    terms = " + ".join(f"{steps.weights[i, j]:.3f} x v[{j}]" for j in keys[:6])
    more = " + ..." if len(keys) > 6 or len(keys) < n_keys else ""
    out.append(f"   {terms}{more}")
    out.append(f"   = {fmt_vec(steps.out[i])}")
    return out


def format_tables(steps: Steps, labels: list[str]) -> list[str]:
    """Every row at once, as the seeds lay it out: Q/K/V per token, scores, scaled, weights, outputs."""
    w = max(len(label(s, 12)) for s in labels) + 2
    head = " " * w + "".join(label(s, 12).rjust(8) for s in labels)
    def table(title, m, f):
        return [title, head] + [label(labels[i], 12).ljust(w) + "".join(f(t).rjust(8) for t in m[i])
                                for i in range(len(m))]
    ints = lambda m: np.allclose(m[np.isfinite(m)], np.round(m[np.isfinite(m)]), atol=1e-9)
    out = ["token".ljust(w) + "Q".ljust(16) + "K".ljust(16) + "V"]
    out += [label(labels[i], 12).ljust(w) + fmt_vec(steps.q[i]).ljust(16) + fmt_vec(steps.k[i]).ljust(16)
            + fmt_vec(steps.v[i]) for i in range(len(steps.q))]
    out += table("scores q . k", steps.scores, lambda t: _num(t, ints(steps.scores)))
    out += table(f"scaled scores / sqrt(d_k) (/ {1 / steps.scale:.4g})", steps.scaled, lambda t: f"{t:.2f}")
    out += table("softmax weights", steps.weights, lambda t: f"{t:.3f}")
    out += ["output = weights @ V"] + [label(labels[i], 12).ljust(w) + fmt_vec(steps.out[i])
                                       for i in range(len(steps.out))]
    return out


# --- the worked example ------------------------------------------------------------------------------

SEEDS_ARTICLE = "The math behind attention: Q, K and V"
SEEDS = {  # birds, eat, seeds: d_model 4, d_k 2, as the article lays them out
    "X": [[1, 0, 2, 0], [0, 2, 0, 1], [1, 1, 0, 1]],
    "W_Q": [[1, 2], [1, 0], [0, 1], [0, 1]],
    "W_K": [[1, 0], [0, 1], [1, 0], [1, 0]],
    "W_V": [[0, 2], [2, 0], [0, 1], [0, 2]],
}


def seeds_lines() -> list[str]:
    """The birds/eat/seeds example: the walk-through for "birds", then every row as the article tables it."""
    steps = attention_steps(*(np.array(SEEDS[k]) for k in ("X", "W_Q", "W_K", "W_V")))
    labels = ["birds", "eat", "seeds"]
    header = f'the worked example of "{SEEDS_ARTICLE}": three tokens, X (3 x 4), W_Q, W_K, W_V (4 x 2)'
    return format_steps(steps, labels, 0, header=header) + [""] + format_tables(steps, labels)

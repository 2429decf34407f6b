"""Per-head statistics of causal attention patterns: the census, and the induction probe.

Every pattern here is one head's weights `A` (T, T): rows are queries, columns keys, causal (A[i, j] = 0
for j > i), rows summing to 1. Row 0 can only look at itself, so it says nothing about a head and every
statistic averages over queries 1..T-1.
"""
from __future__ import annotations

import numpy as np

STATS = ("entropy", "sink", "self", "prev", "max")
STAT_HELP = {
    "entropy": "normalised entropy: 1 = spread evenly over the visible keys, 0 = on one key",
    "sink": "mass on the first token (the attention sink)",
    "self": "mass on the query's own position",
    "prev": "mass on the previous token (a pure previous-token head scores 1)",
    "max": "largest weight in the row (how peaked the head is)",
}


def head_stats(attn: np.ndarray) -> dict[str, np.ndarray]:
    """Census statistics for a stack of patterns (..., T, T) -> dict of arrays (...), means over queries 1..T-1."""
    a = np.asarray(attn, dtype=np.float64)
    T = a.shape[-1]
    if T < 2:
        nan = np.full(a.shape[:-2], np.nan)
        return {k: nan for k in STATS}
    rows = a[..., 1:, :]                                     # (..., T-1, T): queries 1..T-1
    visible = np.arange(2, T + 1)                            # query i sees i+1 keys
    plogp = np.where(rows > 0, rows * np.log(np.where(rows > 0, rows, 1.0)), 0.0)
    entropy = -plogp.sum(-1) / np.log(visible)               # (..., T-1), 1 for a uniform row
    i = np.arange(1, T)
    return {
        "entropy": entropy.mean(-1),
        "sink": rows[..., 0].mean(-1),
        "self": a[..., i, i].mean(-1),
        "prev": a[..., i, i - 1].mean(-1),
        "max": rows.max(-1).mean(-1),
    }


def census(layers: dict[int, np.ndarray]) -> dict[str, np.ndarray]:
    """{layer: (n_heads, T, T)} -> {stat: (n_layers_kept, n_heads)}, layers in sorted order."""
    per_layer = [head_stats(layers[l]) for l in sorted(layers)]
    return {k: np.stack([s[k] for s in per_layer]) for k in STATS}


def strongest(table: np.ndarray, layers: list[int], heads: list[int], n: int = 3, lowest: bool = False):
    """The n (layer, head, value) with the highest (or lowest) value of one statistic."""
    flat = table.ravel()
    order = np.argsort(flat if lowest else -flat, kind="stable")[:n]
    return [(layers[k // table.shape[1]], heads[k % table.shape[1]], float(flat[k])) for k in order]


# --- induction --------------------------------------------------------------------------------------

def repeated_tokens(prefix: list[int], candidates: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """prefix + r + r with r n random ids drawn from `candidates`: the induction probe's input."""
    rng = np.random.default_rng(seed)
    r = rng.choice(candidates, size=n, replace=False if len(candidates) >= n else True)
    return np.concatenate([np.asarray(prefix, dtype=np.int64), r, r]).astype(np.int64)


def induction_score(attn: np.ndarray, n: int) -> np.ndarray:
    """TransformerLens-style induction score for patterns (..., T, T) over `prefix + r + r` (len(r) = n).

    Mean attention from each token of the second repeat to the token *after* its earlier occurrence:
    query q (in the last n positions) -> key q - n + 1.
    """
    T = attn.shape[-1]
    q = np.arange(T - n, T)                                  # second repeat
    return np.asarray(attn, dtype=np.float64)[..., q, q - n + 1].mean(-1)

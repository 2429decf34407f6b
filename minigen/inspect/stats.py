"""Per-head statistics of causal attention patterns: the census, the detectors, and the sink-aware views.

Every pattern here is one head's weights `A` (T, T): rows are queries, columns keys, causal (A[i, j] = 0
for j > i), rows summing to 1. Row 0 can only look at itself, so it says nothing about a head: the census
averages over queries 1..T-1, and the previous-token score over queries 2..T-1 (query 1's previous
token is token 0, where sink heads put everything: counting it would credit them with ~1/(T-1)).

Two ways of looking past the attention sink (token 0, which many heads use as a place to put weight
they do not want to spend):
- `hide_first`: drop key 0 and renormalise each row over the keys that remain;
- `value_weighted`: weight each key by the size of what it actually sends, ‖α_ij · v_j · W_O‖
  (Kobayashi et al. 2020, "Attention is Not Only a Weight: Analyzing Transformers with Vector Norms"):
  sinks usually carry a near-zero value vector, so their share shrinks.
"""
from __future__ import annotations

import numpy as np

STATS = ("entropy", "sink", "self", "prev", "max")
STAT_HELP = {
    "entropy": "normalised entropy: 1 = spread evenly over the visible keys, 0 = on one key",
    "sink": "mass on the first token (the attention sink)",
    "self": "mass on the query's own position",
    "prev": "mass on the previous token, over queries 2..T-1 (a pure previous-token head scores 1)",
    "max": "largest weight in the row (how peaked the head is)",
    "dup": "mass on earlier copies of the query's own token, over queries that have one (duplicate-token heads)",
}


def hide_first(attn: np.ndarray) -> np.ndarray:
    """Patterns (..., T, T) with key 0 removed and each row renormalised over keys 1..i. A row that had
    everything on token 0 (nothing left to renormalise) becomes all zeros."""
    a = np.array(attn, dtype=np.float64)
    a[..., 0] = 0
    rest = a.sum(-1, keepdims=True)
    return np.divide(a, rest, out=np.zeros_like(a), where=rest > 1e-9)


def value_weighted(attn: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """α_ij ‖v_j W_O‖ with each row renormalised to sum to 1: patterns (H, T, T) and the norms of what
    each key sends through each head, (H, T) (internals.value_norms)."""
    a = np.asarray(attn, dtype=np.float64) * np.asarray(norms, dtype=np.float64)[:, None, :]
    total = a.sum(-1, keepdims=True)
    return np.divide(a, total, out=np.zeros_like(a), where=total > 0)


def head_stats(attn: np.ndarray, ids=None, exclude_first: bool = False) -> dict[str, np.ndarray]:
    """Census statistics for a stack of patterns (..., T, T) -> dict of arrays (...). With token `ids`,
    also `dup` (when some token repeats). With `exclude_first`, every statistic but `sink` is taken on
    `hide_first(attn)` over queries 2..T-1, leaving out rows that had nothing but token 0, and `sink`
    says how much the hiding removed."""
    a = np.asarray(attn, dtype=np.float64)
    T = a.shape[-1]
    first = 2 if exclude_first else 1                        # the first query with two keys to choose from
    if T <= first:
        nan = np.full(a.shape[:-2], np.nan)
        return {k: nan for k in STATS}
    sink = a[..., 1:, 0].mean(-1)
    alive = np.ones(a.shape[:-1])                            # (..., T): which query rows count
    if exclude_first:
        alive = (a[..., 1:].sum(-1) > 1e-9).astype(np.float64)
        a = hide_first(a)
    i = np.arange(first, T)
    rows = a[..., first:, :]                                 # (..., T-first, T)
    keys = i + 1 - (1 if exclude_first else 0)               # keys query i can still see
    plogp = np.where(rows > 0, rows * np.log(np.where(rows > 0, rows, 1.0)), 0.0)
    p = np.arange(max(first, 2), T)
    mean = lambda x, q: _mean(x, alive[..., q])
    out = {"entropy": mean(-plogp.sum(-1) / np.log(keys), i), "sink": sink, "self": mean(a[..., i, i], i),
           "prev": mean(a[..., p, p - 1], p), "max": mean(rows.max(-1), i)}
    if ids is not None and duplicate_mask(ids).any():
        out["dup"] = duplicate_score(a, ids)
    return out


def _mean(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Mean over the last axis counting only rows of weight 1; NaN when none counts."""
    n = weight.sum(-1)
    return np.divide((x * weight).sum(-1), n, out=np.full(n.shape, np.nan), where=n > 0)


def census(layers: dict[int, np.ndarray], ids=None, exclude_first: bool = False) -> dict[str, np.ndarray]:
    """{layer: (n_heads, T, T)} -> {stat: (n_layers_kept, n_heads)}, layers in sorted order."""
    per_layer = [head_stats(layers[l], ids, exclude_first) for l in sorted(layers)]
    return {k: np.stack([s[k] for s in per_layer]) for k in per_layer[0]}


def strongest(table: np.ndarray, layers: list[int], heads: list[int], n: int = 3, lowest: bool = False):
    """The n (layer, head, value) with the highest (or lowest) value of one statistic; NaN never wins."""
    flat = np.where(np.isnan(table), np.inf if lowest else -np.inf, table).ravel()
    order = np.argsort(flat if lowest else -flat, kind="stable")[:n]
    return [(layers[k // table.shape[1]], heads[k % table.shape[1]], float(table.ravel()[k])) for k in order]


# --- detectors ----------------------------------------------------------------------------------------

def duplicate_mask(ids) -> np.ndarray:
    """(T, T) bool: key j < i holds the same token as query i (TransformerLens's duplicate-token pattern)."""
    ids = np.asarray(ids)
    return np.tril(ids[:, None] == ids[None, :], k=-1)


def duplicate_score(attn: np.ndarray, ids) -> np.ndarray:
    """Mean over queries with an earlier copy of their own token of the weight on those copies: (..., T, T) -> (...)."""
    mask = duplicate_mask(ids)
    q = mask.any(-1)
    return (np.asarray(attn, dtype=np.float64) * mask)[..., q, :].sum(-1).mean(-1)


def induction_mask(ids) -> np.ndarray:
    """(T, T) bool: key j + 1 for each earlier copy j of query i's token (TransformerLens's induction pattern:
    the duplicate pattern shifted one key to the right, key 0 never)."""
    dup = duplicate_mask(ids)
    out = np.zeros_like(dup)
    out[:, 1:] = dup[:, :-1]
    return np.tril(out)


def detect_head_score(attn: np.ndarray, mask: np.ndarray, exclude_bos: bool = False,
                      exclude_current: bool = False) -> np.ndarray:
    """TransformerLens's `detect_head(..., error_measure="mul")`: the share of a head's attention, summed
    over every query row, that falls on the pattern's (query, key) pairs. Rows without a target count
    in the denominator, so on prefix + r + r a perfect induction head scores about n / (2n + 1)."""
    a = np.array(attn, dtype=np.float64)
    if exclude_bos:
        a[..., 0] = 0
    if exclude_current:
        i = np.arange(a.shape[-1])
        a[..., i, i] = 0
    return (a * mask).sum((-2, -1)) / a.sum((-2, -1))


# --- the induction probe ------------------------------------------------------------------------------

PROBE_SCORES = {
    "induction": "mean weight from each token of the second repeat to the token after its first occurrence",
    "induction_tl": "TransformerLens detect_head(\"induction_head\"): share of all the head's attention "
                    "(every row) on induction targets; a perfect head scores about n/(2n+1)",
    "duplicate": "mean weight from each token of the second repeat to its first occurrence",
}


def repeated_tokens(prefix: list[int], candidates: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """prefix + r + r with r n random ids drawn from `candidates`: the induction probe's input."""
    rng = np.random.default_rng(seed)
    r = rng.choice(candidates, size=n, replace=False if len(candidates) >= n else True)
    return np.concatenate([np.asarray(prefix, dtype=np.int64), r, r]).astype(np.int64)


def induction_score(attn: np.ndarray, n: int) -> np.ndarray:
    """Mean attention from each token of the second repeat of `prefix + r + r` (len(r) = n) to the token
    *after* its earlier occurrence: query q (in the last n positions) -> key q - n + 1. (..., T, T) -> (...)."""
    T = attn.shape[-1]
    q = np.arange(T - n, T)                                  # second repeat
    return np.asarray(attn, dtype=np.float64)[..., q, q - n + 1].mean(-1)


def probe_scores(attn: np.ndarray, ids: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """Every probe score (PROBE_SCORES) for patterns (..., T, T) over `prefix + r + r`."""
    T = attn.shape[-1]
    q = np.arange(T - n, T)
    return {"induction": induction_score(attn, n),
            "induction_tl": detect_head_score(attn, induction_mask(ids)),
            "duplicate": np.asarray(attn, dtype=np.float64)[..., q, q - n].mean(-1)}

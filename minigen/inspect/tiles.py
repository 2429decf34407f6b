"""What is kept of each tile of a map (scan.py): each consumer takes tiles of query rows as they come
(`tile(Tile)`) and keeps only its own part of them, so that a 4,096-token prompt's every layer and head
can be looked at without holding any layer's whole map.

    RowNumbers   per row the few numbers the census is made of -> census() equal to stats.census
    TopKeys      per row its first token's share and its K largest other weights (the compact dump)
    Thumbs       per head R x R pixels, each the largest weight of its block (also with the first token hidden)
    Triangles    the full lower triangles (the full page, the full dump)
    Window       full rows of some queries (a dump of a window)
    StrongKeys   per row its first token's share and its strongest other keys (the compact page)
    Sinks        per row the first token's weight (the plain sink beside a value-weighted census)
    Pick, Cells  one row of one head; one query's rows in every layer and head

Shapes: Hk kept heads, T tokens, t a tile's rows, S its keys, K top keys, R thumbnail pixels.
"""
from __future__ import annotations

import threading

import numpy as np


ALIVE = 1e-9   # a row whose weight beyond the first token is below this has nothing left when it is hidden


class PerLayer:
    """Arrays per kept layer, made on first use: self.of(layer) -> {name: array}."""

    def __init__(self, layers: list[int]):
        self.layers = list(layers)
        self.index = {l: n for n, l in enumerate(self.layers)}


# --- the census, from a few numbers per row ------------------------------------------------------------------

ROW_NUMBERS = ("first", "others", "plogp", "max_others", "self", "prev", "dup_others", "dup_first")


class RowNumbers(PerLayer):
    """Per kept layer, head and query row: the first token's weight, the sum of the others, Σ w ln w, the
    largest other weight, the weights on itself, on the previous token, on earlier copies of its own token
    (beyond the first, and on the first). Every census statistic, with the first token shown or hidden,
    is a mean of these (`census`); they hold 8 numbers per row instead of the row."""

    def __init__(self, layers: list[int], n_heads: int, ids):
        super().__init__(layers)
        self.ids = np.asarray(ids)
        T = len(self.ids)
        self.a = {k: np.zeros((len(self.layers), n_heads, T)) for k in ROW_NUMBERS}   # (L, Hk, T) float64
        self.pairs = duplicate_pairs(self.ids)                               # earlier copies: (query, key), by query

    def tile(self, tile):
        w, rows, li = tile.w, tile.rows, self.index[tile.layer]
        t, sl = len(rows), slice(tile.start, tile.start + len(rows))
        a = {k: v[li] for k, v in self.a.items()}                            # (Hk, T) views
        a["first"][:, sl] = w[:, :, 0]
        a["others"][:, sl] = tile.others()
        if w.shape[-1] > 1:
            a["max_others"][:, sl] = w[:, :, 1:].max(-1)
        a["plogp"][:, sl] = tile.plogp()
        r = np.arange(t)
        a["self"][:, sl] = w[:, r, rows]
        a["prev"][:, sl] = np.where(rows > 0, w[:, r, np.maximum(rows - 1, 0)], 0.0)
        lo, hi = np.searchsorted(self.pairs[0], [tile.start, tile.start + t])   # the pairs are in query order
        i, j = self.pairs[0][lo:hi] - tile.start, self.pairs[1][lo:hi]
        on = w[:, i, j]                                                      # (Hk, pairs)
        at = (np.arange(len(w))[:, None] * t + i).ravel()                    # (head, row) of each pair
        for name, keys in (("dup_others", j > 0), ("dup_first", j == 0)):
            keep = np.broadcast_to(keys, on.shape).ravel()
            a[name][:, sl] = np.bincount(at[keep], on.ravel()[keep], minlength=len(w) * t).reshape(len(w), t)

    def census(self, exclude_first: bool = False) -> dict[str, np.ndarray]:
        """{stat: (n_layers_kept, Hk)}, as stats.census computes it on the full maps."""
        return census_of(self.a, self.ids, exclude_first)


def census_of(a: dict, ids, exclude_first: bool) -> dict[str, np.ndarray]:
    """stats.head_stats's statistics from RowNumbers' arrays (..., T): the same means over the same rows."""
    T = a["first"].shape[-1]
    first = 2 if exclude_first else 1                                        # the first query with two keys
    if T <= first:
        nan = np.full(a["first"].shape[:-1], np.nan)
        return {k: nan for k in ("entropy", "sink", "self", "prev", "max")}
    i = np.arange(first, T)
    p0, rest = a["first"], a["others"]
    if exclude_first:   # each row over keys 1..i, renormalised by what they hold: Σ q ln q = A / r - ln r
        alive = rest > ALIVE
        r = np.where(alive, rest, 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            plogp = (a["plogp"] - np.where(p0 > 0, p0 * np.log(np.where(p0 > 0, p0, 1.0)), 0.0)) / r - np.log(r)
        scale = np.where(alive, 1.0 / r, 0.0)
        top, dup = a["max_others"] * scale, a["dup_others"] * scale
    else:
        alive, scale = np.ones_like(p0, dtype=bool), np.ones_like(p0)
        plogp, top, dup = a["plogp"], np.maximum(p0, a["max_others"]), a["dup_others"] + a["dup_first"]
    weight = alive.astype(np.float64)
    p = np.arange(max(first, 2), T)
    mean = lambda x, rows: _mean(x[..., rows], weight[..., rows])
    out = {"entropy": mean(-plogp / _log_keys(T, exclude_first), i),
           "sink": p0[..., 1:].mean(-1), "self": mean(a["self"] * scale, i),
           "prev": mean(a["prev"] * scale, p), "max": mean(top, i)}
    q = has_copy(ids)
    if q.any():
        out["dup"] = dup[..., q].mean(-1)
    return out


def duplicate_pairs(ids) -> tuple[np.ndarray, np.ndarray]:
    """(i, j) for every query i and earlier key j < i holding the same token, in query order (the pairs of
    stats.duplicate_mask, found by grouping equal ids rather than by a T x T mask)."""
    ids = np.asarray(ids)
    order = np.argsort(ids, kind="stable")                                  # each id's positions, ascending
    cuts = np.flatnonzero(np.diff(ids[order])) + 1
    pairs = [(g[a], g[b]) for g in np.split(order, cuts) if len(g) > 1 for a, b in [np.tril_indices(len(g), -1)]]
    if not pairs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    i, j = (np.concatenate(x) for x in zip(*pairs))
    by = np.lexsort((j, i))
    return i[by], j[by]


def has_copy(ids) -> np.ndarray:
    """(T,) bool: an earlier position holds the same token."""
    ids = np.asarray(ids)
    out = np.ones(len(ids), bool)
    out[np.unique(ids, return_index=True)[1]] = False
    return out


def _log_keys(T: int, exclude_first: bool) -> np.ndarray:
    """(T,) ln of the keys each query row sees (i + 1, or i with the first hidden); 1 where that is < 2."""
    keys = np.arange(T) + (0 if exclude_first else 1)
    return np.log(np.maximum(keys, 2)).astype(np.float64)


def _mean(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    n = weight.sum(-1)
    return np.divide((x * weight).sum(-1), n, out=np.full(n.shape, np.nan), where=n > 0)


# --- each row's top keys ---------------------------------------------------------------------------------

class TopKeys(PerLayer):
    """Per kept layer, head and query row (the compact dump, --attn-top-k K): the first token's share
    (`first`), the other keys with the K largest weights, largest first (ties: the earlier key first; only
    weights > 0), padded with key -1 and weight 0 (`keys`, `weights`: (Hk, T, K)), and the weight of the
    other keys not listed (`rest`). `others` is each row's whole weight beyond the first token."""

    def __init__(self, layers: list[int], n_heads: int, T: int, K: int):
        super().__init__(layers)
        self.K = K
        L = len(self.layers)
        self.keys = np.full((L, n_heads, T, K), -1, np.int32)
        self.weights = np.zeros((L, n_heads, T, K), np.float32)
        self.first = np.zeros((L, n_heads, T), np.float32)
        self.others = np.zeros((L, n_heads, T), np.float32)

    def tile(self, tile):
        w, li = tile.w, self.index[tile.layer]
        sl = slice(tile.start, tile.start + w.shape[1])
        self.first[li, :, sl] = w[:, :, 0]
        if w.shape[-1] > 1:
            self.others[li, :, sl] = tile.others()
            self.keys[li, :, sl], self.weights[li, :, sl] = top_exact(w, self.K)

    def rest(self) -> np.ndarray:
        """(L, Hk, T): the weight beyond the first token that the listed keys leave out."""
        return np.maximum(self.others - self.weights.sum(-1), 0)

    def of(self, layer: int) -> dict:
        li = self.index[layer]
        return {"keys": self.keys[li], "weights": self.weights[li], "first": self.first[li],
                "rest": self.rest()[li]}


def top_exact(w: np.ndarray, K: int):
    """The K largest weights > 0 of each row's keys 1.. of w (Hk, t, S), largest first, ties by key:
    (keys (Hk, t, K) int32 padded with -1, weights (Hk, t, K) float32)."""
    rest = w[:, :, 1:]
    m = rest.shape[-1]
    C = max(CHUNKS, 2 * K)
    if m >= 4 * C:
        return _top_of_candidates(np.ascontiguousarray(w), K, C)
    if m > K:
        idx = np.argpartition(-rest, K - 1, axis=-1)[..., :K]              # (Hk, t, K), unordered
    else:
        idx = np.broadcast_to(np.arange(m), rest.shape[:-1] + (m,))
    vals = np.take_along_axis(rest, idx, -1)
    order = np.lexsort((idx, -vals), axis=-1)
    idx, vals = np.take_along_axis(idx, order, -1), np.take_along_axis(vals, order, -1)
    return _padded(np.where(vals > 0, idx + 1, -1), np.where(vals > 0, vals, 0), K)


CHUNKS = 64   # top_exact on long rows: the maxima of this many interleaved chunks of keys bound each row's K-th


def _top_of_candidates(w: np.ndarray, K: int, C: int):
    """top_exact on rows of m >= 4C keys, ~4x faster than argpartition at 4,000 keys: the maxima of C disjoint
    sets of keys (keys j, j + C, j + 2C, ...: elementwise maxima of contiguous runs) are C distinct weights, so
    a row's K-th largest weight is at least their K-th largest, tau; only the keys at or above tau (and
    above 0), a few per row, are sorted, by weight then key."""
    Hk, t, S = w.shape
    m = S - 1
    q = m // C
    maxima = w[:, :, 1:1 + C * q].reshape(Hk, t, q, C).max(axis=-2)        # (Hk, t, C)
    tau = np.partition(maxima, C - K, axis=-1)[..., C - K]                  # (Hk, t)
    tau = np.maximum(tau, np.float32(np.finfo(np.float32).smallest_subnormal))   # only weights > 0 are listed
    flat = np.flatnonzero(w[:, :, 1:] >= tau[..., None])                   # by (head, row), then key
    row, key = flat // m, flat % m + 1                                       # key: among 0..S-1
    vals = w.reshape(-1)[row * S + key]
    # by row, then weight descending: a weight > 0's float32 bits, as an integer, grow with it; the sort is
    # stable, so equal weights keep their key order
    order = np.argsort((row << 31) | (0x7FFFFFFF - vals.view(np.int32)).astype(np.int64), kind="stable")
    row, key, vals = row[order], key[order], vals[order]
    rank = np.arange(len(row)) - np.searchsorted(row, row, side="left")     # place within its row
    keep = rank < K
    keys = np.full((Hk * t, K), -1, np.int32)
    weights = np.zeros((Hk * t, K), np.float32)
    keys[row[keep], rank[keep]], weights[row[keep], rank[keep]] = key[keep], vals[keep]
    return keys.reshape(Hk, t, K), weights.reshape(Hk, t, K)


class StrongKeys(PerLayer):
    """The compact page's rows: per kept layer, head and query row, the keys beyond the first whose weight
    is at least `floor` of the row's weight beyond the first token (what that row shows once the first
    token is hidden), at most the K largest of them (ties: the earlier key), in key order; and each row's
    first token's share and its weight beyond the first (`first`, `others`: (L, Hk, T) float32). Kept as
    flat lists per layer and tile: row numbers (head-major within a tile), keys and weights."""

    def __init__(self, layers: list[int], n_heads: int, T: int, K: int = 16, floor: float = 1 / 64):
        super().__init__(layers)
        self.K, self.floor, self.T = K, np.float32(floor), T
        L = len(self.layers)
        self.first = np.zeros((L, n_heads, T), np.float32)
        self.others = np.zeros((L, n_heads, T), np.float32)
        self.parts: dict[int, list] = {l: [] for l in self.layers}   # per layer: [(start, t, row, key, weight)]
        self.lock = threading.Lock()

    def tile(self, tile):
        w, li = tile.w, self.index[tile.layer]
        Hk, t, S = w.shape
        sl = slice(tile.start, tile.start + t)
        others = tile.others()
        self.first[li, :, sl], self.others[li, :, sl] = w[:, :, 0], others
        if S == 1:
            return
        mask = w >= np.maximum(self.floor * others, np.float32(1e-30))[..., None]
        mask[..., 0] = False
        flat = np.flatnonzero(mask)                                          # by (head, row), then key
        row, key, vals = flat // S, (flat % S).astype(np.int32), w.reshape(-1)[flat]
        counts = np.bincount(row, minlength=Hk * t)
        if counts.max(initial=0) > self.K:
            keep = within_top(row, vals, counts, self.K)
            row, key, vals = row[keep], key[keep], vals[keep]
        with self.lock:
            self.parts[tile.layer].append((tile.start, t, row.astype(np.int32), key, vals))

    def rows_of(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One layer's entries in (head, query, key) order: (counts (Hk, T) per row, keys, weights)."""
        Hk = self.first.shape[1]
        parts = sorted(self.parts[layer], key=lambda p: p[0])
        heads = np.concatenate([p[2] // p[1] for p in parts]) if parts else np.zeros(0, np.int64)
        query = np.concatenate([p[0] + p[2] % p[1] for p in parts]) if parts else np.zeros(0, np.int64)
        keys = np.concatenate([p[3] for p in parts]) if parts else np.zeros(0, np.int32)
        vals = np.concatenate([p[4] for p in parts]) if parts else np.zeros(0, np.float32)
        order = np.lexsort((keys, query, heads))
        counts = np.bincount(heads * self.T + query, minlength=Hk * self.T).reshape(Hk, self.T)
        return counts, keys[order], vals[order]


def within_top(row: np.ndarray, vals: np.ndarray, counts: np.ndarray, K: int) -> np.ndarray:
    """Which of the candidates (grouped by row, in key order) are among their row's K largest (ties: the
    earlier key): a boolean over the candidates. Only rows with more than K are sorted."""
    keep = np.ones(len(row), bool)
    crowded = np.flatnonzero(counts[row] > K)
    order = crowded[np.lexsort((-vals[crowded], row[crowded]))]            # stable: ties keep the earlier key
    r = row[order]
    rank = np.arange(len(r)) - np.searchsorted(r, r, side="left")
    keep[order[rank >= K]] = False
    return keep


def _padded(keys: np.ndarray, weights: np.ndarray, K: int):
    """Arrays (..., m) widened to (..., K) with key -1 and weight 0 (a row with fewer than K keys)."""
    m = keys.shape[-1]
    if m >= K:
        return keys.astype(np.int32), weights.astype(np.float32)
    pad = [(0, 0)] * (keys.ndim - 1) + [(0, K - m)]
    return np.pad(keys, pad, constant_values=-1).astype(np.int32), np.pad(weights, pad).astype(np.float32)


# --- thumbnails -------------------------------------------------------------------------------------------

class Thumbs(PerLayer):
    """Per kept layer and head an R x R picture of the map, R = min(T, 64): pixel (a, b) is the largest
    weight of query rows floor(i R / T) = a on keys floor(j R / T) = b, so thin lines survive on long
    prompts (`plain`); `hidden` the same with the first token hidden and each row renormalised."""

    def __init__(self, layers: list[int], n_heads: int, T: int, R: int = 64):
        super().__init__(layers)
        self.T, self.R = T, min(T, R)
        self.starts = -(-np.arange(self.R) * T // self.R)                    # first key (and row) of each block
        L = len(self.layers)
        self.plain = np.zeros((L, n_heads, self.R, self.R), np.float32)
        self.hidden = np.zeros((L, n_heads, self.R, self.R), np.float32)
        self.lock = threading.Lock()   # tiles of neighbouring rows, on two threads, can share a pixel row

    def tile(self, tile):
        w, rows, li = tile.w, tile.rows, self.index[tile.layer]
        S = w.shape[-1]
        nb = int(np.searchsorted(self.starts, S))                            # key blocks this tile reaches
        cols = np.maximum.reduceat(w, self.starts[:nb], axis=-1)             # (Hk, t, nb)
        others = tile.others()
        hid = cols.copy()
        end0 = self.starts[1] if nb > 1 else S
        hid[..., 0] = w[:, :, 1:end0].max(-1) if end0 > 1 else 0             # block 0 without key 0
        scale = np.where(others > ALIVE, 1 / np.where(others > ALIVE, others, 1), 0).astype(np.float32)
        hid *= scale[..., None]
        blocks = rows * self.R // self.T                                     # each row's pixel row
        firsts = np.flatnonzero(np.r_[True, blocks[1:] != blocks[:-1]])
        parts = [np.maximum.reduceat(values, firsts, axis=1) for values in (cols, hid)]   # (Hk, pixel rows, nb)
        at = slice(blocks[0], blocks[-1] + 1)
        with self.lock:
            for picture, part in zip((self.plain, self.hidden), parts):
                np.maximum(picture[li][:, at, :nb], part, out=picture[li][:, at, :nb])


# --- full maps, windows, single rows -------------------------------------------------------------------

def as_float16(a: np.ndarray) -> np.ndarray:
    """a (float32) rounded to float16 as astype rounds it, ~10x faster on attention weights: most of a long
    prompt's weights are below float16's smallest normal (2^-14), where NumPy's cast takes ~100 ns each.
    Those are float16's subnormals, multiples of 2^-24 whose bits are the (rounded, to even) multiple."""
    a = np.asarray(a, dtype=np.float32)
    small = np.abs(a) < np.float32(2.0 ** -14)
    normal = np.where(small, np.float32(0), a).astype(np.float16).view(np.uint16)
    multiple = np.rint(np.minimum(np.abs(a), np.float32(2.0 ** -14)) * np.float32(2.0 ** 24)).astype(np.uint16)
    sign = np.where(np.signbit(a), np.uint16(0x8000), np.uint16(0))
    return np.where(small, multiple | sign, normal).view(np.float16)


class Triangles(PerLayer):
    """Per kept layer the full map's lower triangles (Hk, T(T+1)/2), rows one after another (np.tril_indices
    order), in `dtype`: the full page's and the full dump's weights."""

    def __init__(self, layers: list[int], n_heads: int, T: int, dtype=np.float32):
        super().__init__(layers)
        self.T = T
        self.tri = {l: np.zeros((n_heads, T * (T + 1) // 2), dtype) for l in self.layers}

    def tile(self, tile):
        tri = self.tri[tile.layer]
        w = as_float16(tile.w) if tri.dtype == np.float16 else tile.w
        for r, i in enumerate(tile.rows.tolist()):                        # row i: keys 0..i, from i(i+1)/2 on
            tri[:, i * (i + 1) // 2:(i + 1) * (i + 2) // 2] = w[:, r, :i + 1]

    def squares(self) -> dict[int, np.ndarray]:
        """{layer: (Hk, T, T) float32}, for what reads squares."""
        i, j = np.tril_indices(self.T)
        out = {}
        for l, tri in self.tri.items():
            out[l] = np.zeros((len(tri), self.T, self.T), np.float32)
            out[l][:, i, j] = tri
        return out


class Window(PerLayer):
    """Per kept layer the full rows of queries `start..stop-1` on keys 0..stop-1: (Hk, stop - start, stop)."""

    def __init__(self, layers: list[int], n_heads: int, start: int, stop: int, dtype=np.float32):
        super().__init__(layers)
        self.start, self.stop = start, stop
        self.rows = {l: np.zeros((n_heads, stop - start, stop), dtype) for l in self.layers}

    def tile(self, tile):
        a, b = max(self.start, tile.start), min(self.stop, tile.start + tile.w.shape[1])
        if a < b:
            S = tile.w.shape[-1]
            self.rows[tile.layer][:, a - self.start:b - self.start, :min(S, self.stop)] = \
                tile.w[:, a - tile.start:b - tile.start, :self.stop]


class Sinks(PerLayer):
    """Per kept layer, head and query row the first token's weight: the census's plain `sink` column beside
    a value-weighted census."""

    def __init__(self, layers: list[int], n_heads: int, T: int):
        super().__init__(layers)
        self.first = np.zeros((len(self.layers), n_heads, T))

    def tile(self, tile):
        self.first[self.index[tile.layer], :, tile.start:tile.start + tile.w.shape[1]] = tile.w[:, :, 0]

    def sink(self) -> np.ndarray:
        """(L, Hk): the mean over queries 1..T-1 (stats.head_stats's `sink`)."""
        return self.first[..., 1:].mean(-1)


class Pick:
    """One head's row `query` of one layer (float64, keys 0..query) when a tile holds it; head_index
    counts among the kept heads."""

    def __init__(self, layer: int, head_index: int, query: int):
        self.layer, self.head, self.query, self.row = layer, head_index, query, None

    def tile(self, tile):
        if tile.layer == self.layer and tile.start <= self.query < tile.start + tile.w.shape[1]:
            self.row = tile.w[self.head, self.query - tile.start, :self.query + 1].astype(np.float64)


class Cells(PerLayer):
    """Every kept layer and head's weights of query `query` (float64 rows, keys 0..query): (L, Hk, query + 1)."""

    def __init__(self, layers: list[int], n_heads: int, query: int):
        super().__init__(layers)
        self.query = query
        self.rows = np.zeros((len(self.layers), n_heads, query + 1))

    def tile(self, tile):
        if tile.start <= self.query < tile.start + tile.w.shape[1]:
            self.rows[self.index[tile.layer]] = tile.w[:, self.query - tile.start, :self.query + 1]

"""A prompt's attention a few query rows at a time, so that no layer's whole map is ever held.

One forward pass over the prompt with a Tap as its `record` and its hooks. The forward hands each
attention layer's weights over as it makes them, a few query rows at a time (model.attend_cached's record
protocol: `record.block(layer, first row, weights, Σ w ln w)`, engine.attention.causal_attention's
`on_block`), and each such Tile goes through the consumers (tiles.py: the census's per-row numbers, each
row's strongest keys, thumbnails, full maps where asked) and is let go. Memory is then the forward's own,
a tile per thread, and what the consumers keep; the time, the forward's, its attention computed in row
pieces that are handed over (~20 % more at 2,048 tokens), and the consumers' passes over each tile. The
hook (model.Hooks.qkv) sees each layer's queries, keys and values first: with `keep` they stay (Kept), for
the exact rows `--serve` recomputes (engine.attention.causal_weights, the forward's own steps); the values
give the norms of the value-weighted view.

A dump's full maps go through the same consumers as tiles of the stored squares (`map_tiles`).

Shape letters as in model.py: T tokens, H query heads (Hk: the heads kept), KV key/value heads, d head_dim,
t a tile's query rows, S its keys (the keys its last row sees: start + t).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..engine.hooks import Hooks
from ..engine.linear import dense
from ..engine.mixers import has_attention
from ..engine.attention import STREAM_ROWS, causal_weights

TILE = 1 << 20   # weights per tile of a dump's maps (4 MB of float32): its passes stay in cache, and there are few tiles


@dataclass
class Tile:
    """Query rows start..start+t-1 of one layer: their weights on keys 0..S-1 (S = start + t)."""
    layer: int
    start: int
    w: np.ndarray                     # (Hk, t, S) float32, exact zeros where masked
    sum_plogp: np.ndarray | None = None   # (Hk, t) each row's sum of w ln w, when the scores gave it
    _others: np.ndarray | None = field(default=None, repr=False)

    @property
    def rows(self) -> np.ndarray:
        """(t,) the query positions."""
        return np.arange(self.start, self.start + self.w.shape[1])

    def others(self) -> np.ndarray:
        """(Hk, t) float32: each row's weight beyond the first token (computed once for every consumer)."""
        if self._others is None:
            self._others = self.w[:, :, 1:].sum(-1) if self.w.shape[-1] > 1 else np.zeros(self.w.shape[:2], np.float32)
        return self._others

    def plogp(self) -> np.ndarray:
        """(Hk, t) float64: each row's sum of w ln w (0 ln 0 = 0), from the scores or else from np.log."""
        if self.sum_plogp is None:
            ln = np.log(np.maximum(self.w, np.float32(1e-45)))
            self.sum_plogp = np.einsum("...j,...j->...", self.w, ln)
        return self.sum_plogp.astype(np.float64)


def rows_per_tile(n_heads: int, T: int) -> int:
    """Query rows of a tile: TILE weights' worth at the longest row, 8 to 512 rows."""
    return int(min(512, max(8, TILE // max(1, n_heads * T))))


def head_groups(heads: list[int], group: int) -> list[tuple[int, list[int]]]:
    """The kept query heads by the KV head they read (h // group), in order: [(kv, [h, ...]), ...]."""
    out: list[tuple[int, list[int]]] = []
    for h in heads:
        if out and out[-1][0] == h // group:
            out[-1][1].append(h)
        else:
            out.append((h // group, [h]))
    return out


def layer_weights(q: np.ndarray, k: np.ndarray, cfg, layer: int, heads: list[int], start: int, stop: int):
    """The weights (Hk, t, stop) and each row's sum of w ln w (Hk, t) for query rows start..stop-1 of the
    kept heads, from q (H, T, d) and k (KV, T, d): causal_weights over each KV head's kept query heads."""
    args = (start, cfg.window(layer), cfg.attn_scale, cfg.attn_softcap, True)
    if len(heads) == cfg.n_heads:
        return causal_weights(q[:, start:stop], k[:, :stop], *args)
    parts = [causal_weights(q[hs, start:stop], k[kv:kv + 1, :stop], *args) for kv, hs in head_groups(heads, cfg.group)]
    return np.concatenate([w for w, _ in parts]), np.concatenate([p for _, p in parts])


def keys_for_blas(k: np.ndarray) -> np.ndarray:
    """k (T, KV, d) as a (KV, T, d) view of a (KV, d, T) array, as the KV cache stores keys: q · Kᵀ is then
    one BLAS call per KV head (on the (T, KV, d) layout NumPy's own loop takes ~20x as long)."""
    return np.ascontiguousarray(k.transpose(1, 2, 0)).transpose(0, 2, 1)


def map_tiles(layer: int, a: np.ndarray):
    """Tiles of a stored map (Hk, T, T) (a dump's): copies of its rows (w ln w then from np.log)."""
    T = a.shape[-1]
    size = rows_per_tile(len(a), T)
    for start in range(0, T, size):
        stop = min(T, start + size)
        yield Tile(layer, start, np.ascontiguousarray(a[:, start:stop, :stop], dtype=np.float32))


# --- the value-weighted view of a tile -------------------------------------------------------------------

def weighted(tile: Tile, norms: np.ndarray) -> Tile:
    """The tile as value-weighted attention: w_ij ‖v_j W_O‖ with rows renormalised (stats.value_weighted);
    norms (Hk, T) for the kept heads."""
    n = norms[:, :tile.w.shape[-1]].astype(np.float32)[:, None, :]         # (Hk, 1, S)
    a = tile.w * n
    total = a.sum(-1, keepdims=True)                                         # (Hk, t, 1)
    return Tile(tile.layer, tile.start, np.divide(a, total, out=np.zeros_like(a), where=total > 0))


def head_value_norms(v: np.ndarray, wo: np.ndarray, cfg, heads: list[int]) -> np.ndarray:
    """(Hk, T): ‖v_j · W_O[:, h]ᵀ‖ for the kept heads h, from one layer's values v (T, KV, d) and its output
    projection wo (D, H d): per head the quadratic form v (W_hᵀ W_h) vᵀ, no (H, T, D) product held
    (internals.value_norms computes the same as norms of the products)."""
    d = cfg.head_dim
    out = np.empty((len(heads), len(v)), np.float32)
    for n, h in enumerate(heads):
        w = np.asarray(wo[:, h * d:(h + 1) * d], dtype=np.float64)          # (D, d)
        x = v[:, h // cfg.group].astype(np.float64)                          # (T, d)
        out[n] = np.sqrt(np.maximum(np.einsum("td,de,te->t", x, w.T @ w, x), 0))
    return out


# --- the forward pass with the hook -----------------------------------------------------------------------

class Kept:
    """Each scanned layer's queries and keys (and values, when asked), for exact rows later:
    q[layer] (T, H, d) and v[layer] (T, KV, d) as the hook got them, k[layer] (KV, T, d) (keys_for_blas)."""

    def __init__(self, cfg):
        self.cfg, self.q, self.k, self.v = cfg, {}, {}, {}

    def weights(self, layer: int, head: int, start: int, stop: int) -> np.ndarray:
        """(stop - start, stop): one head's exact weights for query rows start..stop-1."""
        return self.rows(layer, [head], start, stop)[0][0]

    def rows(self, layer: int, heads: list[int], start: int, stop: int):
        """The weights (Hk, stop - start, stop) and their logs of query rows start..stop-1 of these heads."""
        return layer_weights(self.q[layer].transpose(1, 0, 2), self.k[layer], self.cfg, layer, heads, start, stop)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for part in (self.q, self.k, self.v) for a in part.values())


class Tap(Hooks):
    """What a scan passes to model.forward: as its `record`, it takes each attention block's weights as the
    forward makes them (`block`, the record protocol of model.attend_cached) and turns those of the kept
    layers and heads into Tiles for the consumers; as its hooks, it sees each layer's q, k and v first
    (`qkv`), to keep them (Kept) and to take the value norms of the value-weighted view. `plain` consumers
    get the weights; `view` consumers the value-weighted ones when `weigh_view` (the value norms from `wo`,
    the output projections {layer: wo}, which also fill `norms`), else the weights too. Blocks come from the forward's threads, so a consumer's
    `tile` may run beside another's on other rows of the same layer."""

    def __init__(self, cfg, layers: list[int], heads: list[int], plain: list, view: list = (),
                 wo: dict | None = None, weigh_view: bool = False, keep: bool = False, keep_values: bool = False,
                 norms: dict | None = None):
        self.cfg, self.layers, self.heads, self.weigh_view = cfg, set(layers), heads, weigh_view
        self.select = None if heads == list(range(cfg.n_heads)) else np.asarray(heads)
        self.plain, self.view, self.wo = list(plain), list(view), wo
        self.kept = Kept(cfg) if keep else None
        self.keep_values = keep_values
        self.norms = {} if norms is None else norms                            # {layer: (Hk, T)} when wo is given

    def qkv(self, layer, q, k, v):
        if layer not in self.layers:
            return
        if self.kept is not None:
            self.kept.q[layer], self.kept.k[layer] = q, keys_for_blas(k)       # q: a view of the (T, H + KV, d) array
            if self.keep_values:
                self.kept.v[layer] = v.copy()                                  # v is a view of the whole projection
        if self.wo is not None:
            self.norms[layer] = head_value_norms(v, self.wo[layer], self.cfg, self.heads)

    def append(self, weights):
        """model.forward's record for a layer without attention (None): nothing to keep."""

    def block(self, layer: int, start: int, w: np.ndarray, plogp: np.ndarray):
        if layer not in self.layers:
            return
        if self.select is not None:
            w, plogp = w[self.select], plogp[self.select]
        start = w.shape[-1] - w.shape[1]   # the rows' position: `start` counts from the forward's first row, which
        # is a decode step's offset (generation's dumps), and a tile's rows end at its last key (S = start + t)
        feed(Tile(layer, start, w, plogp), self.plain, self.view, self.norms.get(layer) if self.weighted else None)

    @property
    def weighted(self) -> bool:
        return self.wo is not None and self.weigh_view


def feed(tile: Tile, plain: list, view: list, norms: np.ndarray | None = None):
    """One tile through the consumers; the `view` ones get it value-weighted when norms are given."""
    for c in plain:
        c.tile(tile)
    if view:
        seen = tile if norms is None else weighted(tile, norms)
        for c in view:
            c.tile(seen)


def scan(model, ids, layers: list[int], heads: list[int], plain: list, view: list = (), value_weighted: bool = False,
         keep: bool = False, keep_values: bool = False, norms: dict | None = None) -> Kept | None:
    """One forward over ids (a prompt from position 0) with each kept layer's map a tile at a time
    through the consumers (`view` ones value-weighted if asked); the kept queries and keys when `keep`.
    `norms`, a dict, gets each kept layer's value norms (Hk, T) (the full page's value-weighted toggle)."""
    ids = model.check_ids(ids)
    wo = {l: dense(model.params["layers"][l]["wo"]) for l in layers} if value_weighted or norms is not None else None
    tap = Tap(model.config, layers, heads, plain, view, wo, value_weighted, keep, keep_values, norms)
    hooks = tap if keep or wo is not None else None   # hooked forwards may stay on one thread: only when needed
    model.forward(ids, model.make_cache(len(ids)), last_only=True, record=tap, hooks=hooks)
    for c in [*plain, *view]:
        getattr(c, "finish", lambda: None)()
    return tap.kept


def scan_maps(maps: dict[int, np.ndarray], plain: list, view: list = (), norms: dict | None = None):
    """A dump's maps {layer: (Hk, T, T)} through the same consumers, tile by tile; norms {layer: (Hk, T)}
    for the value-weighted `view` ones."""
    for layer, a in sorted(maps.items()):
        for tile in map_tiles(layer, a):
            feed(tile, plain, view, None if norms is None else norms[layer])
    for c in [*plain, *view]:
        getattr(c, "finish", lambda: None)()


# --- what a scan will need, before it runs ------------------------------------------------------------------

def forward_bytes(cfg, T: int) -> int:
    """A rough upper bound of the bytes a forward over T tokens holds beyond the weights: the KV cache of
    every attention layer, and the activations of one layer (the MLP's, the projections, the residual)."""
    kv = sum(has_attention(cfg, i) for i in range(cfg.n_layers)) * 2 * cfg.n_kv_heads * cfg.head_dim * T * 4
    width = 8 * cfg.hidden_size + 3 * cfg.intermediate_size + 4 * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
    return kv + T * width * 4


def kept_bytes(cfg, T: int, n_layers: int, values: bool = False) -> int:
    """Bytes of Kept for n_layers layers: q and k per layer (and v)."""
    per_token = (cfg.n_heads + cfg.n_kv_heads * (2 if values else 1)) * cfg.head_dim * 4
    return n_layers * T * per_token


def tile_bytes(n_heads: int, T: int) -> int:
    """A streamed piece of a block (STREAM_ROWS rows of every head) and its temporaries, ~8 of its size."""
    return 8 * 4 * n_heads * STREAM_ROWS * T

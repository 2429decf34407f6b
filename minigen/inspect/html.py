"""One self-contained HTML page for a set of attention patterns: no network, data and script inline.

A layer x head grid of thumbnails, the selected head zoomed with token labels on both axes, the
prompt/generated boundary when the patterns came from generation, and toggles that hide the first
token (the attention sink) and renormalise each row, showing how much weight that removed, and that
switch to value-weighted attention |α·v·W_O| when the norms are given. The page itself (markup, style,
script) is the package data file page.html; this module fills in the data, in one of two forms:

- full (`render_full`, `render_html`): every weight, float16 lower triangles in base64 (~2.7 bytes a
  weight: a 512-token page of 270 heads is ~90 MB, and 300 tokens is where it still opens in ~3 s);
- compact (`render_compact`), for long prompts: per head a thumbnail (each pixel the largest weight of
  its block, as uint8 of its square root, with the first token shown and hidden), and per query row
  its first token's share and its strongest other keys with their weights (uint16 keys, uint16 weights
  in units of 1/65535), as tiles.StrongKeys keeps them, then as many of the weakest as the page's size
  limit needs dropped. What a row does not list is said on the page (its weight beyond the first
  token, less what is listed). A 4,096-token page of 270 heads is under 40 MB.

A layer without attention (a hybrid's Gated DeltaNet, short convolution or Mamba2 layer) is not in
`layers`; `mixers` (each layer's token mixer) lets the page say what it is.
"""
from __future__ import annotations

import base64
import html
import json
from importlib import resources

import numpy as np

from ..errors import MinigenError
from .tiles import as_float16

MAX_HTML_BYTES = 256 * 2**20          # the full form's limit: past it a page takes minutes to open
COMPACT_PAGE_BYTES = 38 * 10**6       # the compact form's target: its strongest keys are cut to fit
AUTO_FULL_BYTES = 24 * 2**20          # --html-form auto: the full form up to here (~300 tokens x 270 heads)
THUMB = 64                            # thumbnail pixels per side (fewer for prompts shorter than that)
FLOOR = 1 / 64                        # compact rows list keys of at least this share of the row beyond the first token
TOP_K = 16                            # and at most this many of them
MIXER_NAMES = {"attention": "attention", "gated_delta": "Gated DeltaNet", "short_conv": "short convolution",
               "mamba2": "Mamba2", "attention+mamba2": "attention beside Mamba2"}


def html_size(n_layers: int, n_heads: int, T: int) -> int:
    """Bytes of inlined weights of the full form: float16 lower triangles, base64 (4/3)."""
    return n_layers * n_heads * (T * (T + 1) // 2) * 2 * 4 // 3


def check_full_size(n_layers: int, n_heads: int, T: int, limit: int | None = None) -> int:
    """The full form's bytes of weights, refused past `limit` (MAX_HTML_BYTES) before anything is computed."""
    limit = MAX_HTML_BYTES if limit is None else limit
    size = html_size(n_layers, n_heads, T)
    if size > limit:
        raise MinigenError(f"the full page would inline {size / 2**20:,.0f} MiB of weights ({n_layers} layers x "
                           f"{n_heads} heads x {T} tokens; limit {limit // 2**20} MiB); --html-form compact keeps "
                           f"each row's strongest keys instead, or keep fewer with --attn-layers/--attn-heads")
    return size


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


def _tril_b64(a: np.ndarray) -> str:
    """(H, T, T) -> base64 of float16 rows 0..T-1, row i holding keys 0..i, heads one after another."""
    i, j = np.tril_indices(a.shape[-1])            # row-major: row 0, then row 1's two keys, ...
    return _b64(as_float16(a[:, i, j]).astype("<f2"))


def page_template() -> str:
    return resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")


def _page(data: dict, title: str) -> str:
    blob = json.dumps(data).replace("</", "<\\/")
    return page_template().replace("__TITLE__", html.escape(title)).replace("__DATA__", blob)


def _common(layers: list[int], heads: list[int], tokens: list[str], prompt_length, title, subtitle, select,
            mixers) -> dict:
    T = len(tokens)
    return {"title": title, "subtitle": subtitle, "tokens": tokens, "layers": layers, "heads": list(heads),
            "prompt_length": prompt_length if prompt_length is not None and prompt_length < T else None,
            "select": list(select) if select else [layers[0], heads[0]],
            "mixers": None if mixers is None else [MIXER_NAMES.get(m, m) for m in mixers]}


def render_html(layers: dict[int, np.ndarray], heads: list[int], tokens: list[str], *,
                prompt_length: int | None = None, title: str = "minigen attention", subtitle: str = "",
                select: tuple[int, int] | None = None, value_norms: dict[int, np.ndarray] | None = None,
                mixers: list[str] | None = None) -> str:
    """{layer: (n_heads_kept, T, T)} -> the full page as a string. `heads` names the kept heads in order;
    `value_norms` {layer: (n_heads_kept, T)} (internals.value_norms) enables the value-weighted view."""
    i, j = np.tril_indices(len(tokens))
    return render_full({l: as_float16(np.asarray(a, np.float32)[:, i, j]) for l, a in layers.items()}, heads, tokens,
                       prompt_length=prompt_length, title=title, subtitle=subtitle, select=select,
                       value_norms=value_norms, mixers=mixers)


def render_full(triangles: dict[int, np.ndarray], heads: list[int], tokens: list[str], *,
                prompt_length: int | None = None, title: str = "minigen attention", subtitle: str = "",
                select: tuple[int, int] | None = None, value_norms: dict[int, np.ndarray] | None = None,
                mixers: list[str] | None = None) -> str:
    """The full page from float16 lower triangles {layer: (n_heads_kept, T(T+1)/2)} (tiles.Triangles)."""
    layer_ids = sorted(triangles)
    check_full_size(len(layer_ids), len(heads), len(tokens))
    data = _common(layer_ids, heads, tokens, prompt_length, title, subtitle, select, mixers)
    data.update(form="full", weights=[_b64(np.asarray(triangles[l], "<f2")) for l in layer_ids],
                value_norms=None if value_norms is None else [_b64(np.asarray(value_norms[l], "<f2")) for l in layer_ids])
    return _page(data, title)


def render_compact(rows: dict, thumbs: dict, heads: list[int], tokens: list[str], *,
                   prompt_length: int | None = None, title: str = "minigen attention", subtitle: str = "",
                   select: tuple[int, int] | None = None, mixers: list[str] | None = None,
                   server: dict | None = None, limit: int = COMPACT_PAGE_BYTES) -> str:
    """The compact page. rows {layer: (first (Hk, T), counts (Hk, T), keys, weights)}: each row's first token's
    share, and its listed keys and their weights in (head, row, key) order (tiles.StrongKeys.rows_of);
    thumbs {layer: (plain (Hk, R, R), hidden (Hk, R, R))} largest weights (tiles.Thumbs). Entries are
    dropped, weakest (as a share of their row beyond the first token) first, until the page fits `limit`.
    `server`: the routes of `minigen attention --serve`, for exact rows."""
    layer_ids = sorted(rows)
    T = len(tokens)
    data = _common(layer_ids, heads, tokens, prompt_length, title, subtitle, select, mixers)
    wide = T > 65535
    fixed = len(_page(data, title).encode()) + sum(4 * (a.size + b.size) // 3 for a, b in thumbs.values()) + \
        len(layer_ids) * len(heads) * T * 3 * 4 // 3 + 4096                  # first (uint16) and counts (uint8)
    budget = max(0, (limit - fixed) * 3 // 4 // (6 if wide else 4))         # entries that fit
    kept, cut = fit_entries(rows, budget)
    data.update(form="compact", thumb=next(iter(thumbs.values()))[0].shape[-1], key_bytes=4 if wide else 2,
                rule={"top_k": TOP_K, "floor": FLOOR, "cut": cut}, server=server)
    for name in ("thumbs", "thumbs_hidden", "first", "counts", "keys", "weights"):
        data[name] = []
    for l in layer_ids:
        first, counts, keys, weights = kept[l]
        plain, hidden = thumbs[l]
        data["thumbs"].append(_b64(sqrt_bytes(plain)))
        data["thumbs_hidden"].append(_b64(sqrt_bytes(hidden)))
        data["first"].append(_b64(units(first)))
        data["counts"].append(_b64(counts.astype(np.uint8)))
        data["keys"].append(_b64(keys.astype("<u4" if wide else "<u2")))
        data["weights"].append(_b64(units(weights)))
    return _page(data, title)


def fit_entries(rows: dict, budget: int) -> tuple[dict, float | None]:
    """rows with at most `budget` entries in all: the weakest dropped first, weakness being an entry's share
    of its row's weight beyond the first token. Returns (rows, the smallest share kept, or None if nothing
    was dropped)."""
    shares = [_shares(*rows[l]) for l in sorted(rows)]
    total = sum(len(s) for s in shares)
    if total <= budget:
        return rows, None
    every = np.concatenate(shares)
    cut = float(np.partition(every, total - budget)[total - budget]) if budget else np.inf
    out = {}
    for l, share in zip(sorted(rows), shares):
        first, counts, keys, weights = rows[l]
        keep = share >= cut
        row_of = np.repeat(np.arange(counts.size), counts.ravel())
        out[l] = (first, np.bincount(row_of[keep], minlength=counts.size).reshape(counts.shape), keys[keep],
                  weights[keep])
    return out, cut


def _shares(first, counts, keys, weights) -> np.ndarray:
    """Each entry's weight as a share of its row's weight beyond the first token."""
    others = np.repeat(np.maximum(1 - first.ravel(), 1e-30), counts.ravel())
    return weights / others


def units(w: np.ndarray) -> np.ndarray:
    """Weights in [0, 1] as uint16 multiples of 1/65535 (within 7.6e-6)."""
    return np.rint(np.clip(w, 0, 1) * 65535).astype("<u2")


def sqrt_bytes(w: np.ndarray) -> np.ndarray:
    """Weights as uint8 of their square root (the sqrt colour scale's steps; small weights keep detail)."""
    return np.rint(np.sqrt(np.clip(w, 0, 1)) * 255).astype(np.uint8)

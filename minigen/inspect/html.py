"""One self-contained HTML page for a set of attention patterns: no network, data and script inline.

A layer x head grid of thumbnails, a zoomed heatmap with token labels on both axes for the selected head,
the prompt/generated boundary when the patterns came from generation, and toggles that hide the first
token (the attention sink) and renormalise each row, showing how much weight that removed, and that
switch to value-weighted attention |α·v·W_O| when the norms are given. The page itself (markup, style,
script) is the package data file page.html; this module fills in the data: weights as float16 lower
triangles in base64, the value norms as float16 rows.
"""
from __future__ import annotations

import base64
import html
import json
from importlib import resources

import numpy as np

from ..errors import MinigenError

MAX_HTML_BYTES = 256 * 2**20


def html_size(n_layers: int, n_heads: int, T: int) -> int:
    """Bytes of inlined weights: float16 lower triangles, base64 (4/3)."""
    return n_layers * n_heads * (T * (T + 1) // 2) * 2 * 4 // 3


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f2").tobytes()).decode("ascii")


def _tril_b64(a: np.ndarray) -> str:
    """(H, T, T) -> base64 of float16 rows 0..T-1, row i holding keys 0..i, heads one after another."""
    i, j = np.tril_indices(a.shape[-1])            # row-major: row 0, then row 1's two keys, ...
    return _b64(a[:, i, j])


def page_template() -> str:
    return resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")


def render_html(layers: dict[int, np.ndarray], heads: list[int], tokens: list[str], *,
                prompt_length: int | None = None, title: str = "minigen attention", subtitle: str = "",
                select: tuple[int, int] | None = None, value_norms: dict[int, np.ndarray] | None = None) -> str:
    """{layer: (n_heads_kept, T, T)} -> the page as a string. `heads` names the kept heads in order;
    `value_norms` {layer: (n_heads_kept, T)} (internals.value_norms) enables the value-weighted view."""
    layer_ids = sorted(layers)
    T = len(tokens)
    size = html_size(len(layer_ids), len(heads), T)
    if size > MAX_HTML_BYTES:
        raise MinigenError(f"the page would inline {size / 2**20:.0f} MiB of weights (limit "
                           f"{MAX_HTML_BYTES // 2**20} MiB); keep fewer with --attn-layers/--attn-heads")
    data = {
        "title": title, "subtitle": subtitle, "tokens": tokens, "layers": layer_ids, "heads": list(heads),
        "prompt_length": prompt_length if prompt_length is not None and prompt_length < T else None,
        "select": list(select) if select else [layer_ids[0], heads[0]],
        "weights": [_tril_b64(np.asarray(layers[l], dtype=np.float32)) for l in layer_ids],
        "value_norms": None if value_norms is None else [_b64(value_norms[l]) for l in layer_ids],
    }
    blob = json.dumps(data).replace("</", "<\\/")
    return page_template().replace("__TITLE__", html.escape(title)).replace("__DATA__", blob)

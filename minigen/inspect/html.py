"""One self-contained HTML page for a set of attention patterns: no network, data and script inline.

A layer x head grid of thumbnails, a zoomed heatmap with token labels on both axes for the selected head,
the prompt/generated boundary when the patterns came from generation, and a toggle that hides the first
token (the attention sink) and renormalises each row. Weights travel as float16 lower triangles in base64.
"""
from __future__ import annotations

import base64
import html
import json

import numpy as np

from ..errors import MinigenError

MAX_HTML_BYTES = 256 * 2**20


def html_size(n_layers: int, n_heads: int, T: int) -> int:
    """Bytes of inlined weights: float16 lower triangles, base64 (4/3)."""
    return n_layers * n_heads * (T * (T + 1) // 2) * 2 * 4 // 3


def _tril_b64(a: np.ndarray) -> str:
    """(H, T, T) -> base64 of float16 rows 0..T-1, row i holding keys 0..i, heads one after another."""
    H, T, _ = a.shape
    i, j = np.tril_indices(T)                      # row-major: row 0, then row 1's two keys, ...
    return base64.b64encode(a[:, i, j].astype("<f2").tobytes()).decode("ascii")


def render_html(layers: dict[int, np.ndarray], heads: list[int], tokens: list[str], *,
                prompt_length: int | None = None, title: str = "minigen attention",
                subtitle: str = "", select: tuple[int, int] | None = None) -> str:
    """{layer: (n_heads_kept, T, T)} -> the page as a string. `heads` names the kept heads in order."""
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
    }
    blob = json.dumps(data).replace("</", "<\\/")
    return (_PAGE.replace("__TITLE__", html.escape(title)).replace("__DATA__", blob))


_PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>__TITLE__</title>
<style>
 body { font: 13px/1.4 system-ui, sans-serif; margin: 0; color: #222; background: #fafafa; }
 header { padding: 10px 16px; background: #fff; border-bottom: 1px solid #ddd; }
 header h1 { font-size: 16px; margin: 0 8px 0 0; display: inline; }
 header .sub { color: #666; }
 header label { margin-left: 16px; }
 main { display: flex; gap: 16px; padding: 12px 16px; align-items: flex-start; }
 #grid { border-collapse: collapse; }
 #grid th { font-weight: normal; color: #666; font-size: 11px; padding: 1px 4px; }
 #grid tr:first-child th { position: sticky; top: 0; background: #fafafa; z-index: 1; }
 #grid td { padding: 2px; }
 #grid canvas { width: 48px; height: 48px; image-rendering: pixelated; border: 2px solid #ddd;
                cursor: pointer; display: block; background: #fff; }
 #grid canvas.sel { border-color: #d62728; }
 #gridwrap { max-height: calc(100vh - 80px); overflow: auto; flex: none; }
 #zoom { position: sticky; top: 12px; background: #fff; border: 1px solid #ddd; padding: 8px; }
 #zoom h2 { font-size: 14px; margin: 0 0 6px; }
 #info { font-family: ui-monospace, monospace; font-size: 12px; min-height: 1.4em; color: #333; }
 .legend { margin-left: 16px; color: #444; }
 .legend span { display: inline-block; width: 12px; height: 10px; margin-right: 4px; vertical-align: middle; }
</style></head>
<body>
<header><h1 id="title"></h1><span class="sub" id="subtitle"></span>
 <label><input type="checkbox" id="hide"> hide first token and renormalise</label>
 <label><input type="checkbox" id="sqrt"> sqrt colour scale</label>
 <span class="legend" id="legend"></span>
</header>
<main>
 <div id="gridwrap"><table id="grid"></table></div>
 <div id="zoom"><h2 id="zoomtitle"></h2><canvas id="heat"></canvas><div id="info"></div></div>
</main>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const T = D.tokens.length, NH = D.heads.length, PL = D.prompt_length;
const TRI = T * (T + 1) / 2;
const H2F = new Float32Array(65536);
for (let h = 0; h < 65536; h++) {
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 31, f = h & 1023;
  H2F[h] = e === 0 ? s * f * 2 ** -24 : e === 31 ? (f ? NaN : s * Infinity) : s * (1 + f / 1024) * 2 ** (e - 15);
}
function decode(b64) {
  const bin = atob(b64), u8 = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) u8[i] = bin.charCodeAt(i);
  const u16 = new Uint16Array(u8.buffer), out = new Float32Array(u16.length);
  for (let i = 0; i < u16.length; i++) out[i] = H2F[u16[i]];
  return out;
}
const W = D.weights.map(decode);               // per layer: NH lower triangles of TRI values
let state = { layer: D.select[0], head: D.select[1], hide: false, sqrt: false, row: null };
for (const kv of location.hash.slice(1).split("&")) {
  const [k, v] = kv.split("=");
  if (k === "layer" || k === "head") state[k] = +v;
  if (k === "hide" || k === "sqrt") state[k] = v === "1";
  if (k === "row") state.row = +v;
}
document.getElementById("hide").checked = state.hide;
document.getElementById("sqrt").checked = state.sqrt;
document.getElementById("title").textContent = D.title;
document.getElementById("subtitle").textContent = D.subtitle + "  ·  " + T + " tokens" +
  (PL !== null ? " (" + PL + " prompt, " + (T - PL) + " generated)" : "");

function weight(li, hi, i, j) {               // attention of query i on key j, after the toggle
  if (j > i) return 0;
  const base = hi * TRI + i * (i + 1) / 2, w = W[li][base + j];
  if (!state.hide) return w;
  if (j === 0) return 0;
  const rest = 1 - W[li][base];
  return rest > 1e-6 ? w / rest : 0;
}
function colour(w) {                           // white -> deep blue
  const t = Math.max(0, Math.min(1, state.sqrt ? Math.sqrt(w) : w));
  return [Math.round(255 - 247 * t), Math.round(255 - 207 * t), Math.round(255 - 148 * t)];
}
function paint(canvas, li, hi) {
  canvas.width = T; canvas.height = T;
  const ctx = canvas.getContext("2d"), img = ctx.createImageData(T, T);
  for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) {
    const [r, g, b] = colour(weight(li, hi, i, j)), p = 4 * (i * T + j);
    img.data[p] = r; img.data[p + 1] = g; img.data[p + 2] = b; img.data[p + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
  if (PL !== null) { ctx.fillStyle = "rgba(214,39,40,0.8)"; ctx.fillRect(0, PL, T, 1 / 1); }
}
function label(s) { s = JSON.stringify(s).slice(1, -1); return s.length > 14 ? s.slice(0, 13) + "…" : s; }

const grid = document.getElementById("grid"), thumbs = [];
(function buildGrid() {
  const hr = grid.insertRow(); hr.appendChild(document.createElement("th"));
  for (const h of D.heads) { const th = document.createElement("th"); th.textContent = "head " + h; hr.appendChild(th); }
  D.layers.forEach((l, li) => {
    const tr = grid.insertRow(), th = document.createElement("th");
    th.textContent = "layer " + l; tr.appendChild(th); thumbs[li] = [];
    D.heads.forEach((h, hi) => {
      const td = tr.insertCell(), c = document.createElement("canvas");
      c.title = "layer " + l + ", head " + h;
      c.onclick = () => { state.layer = l; state.head = h; state.row = null; draw(); };
      td.appendChild(c); thumbs[li][hi] = c;
    });
  });
})();
function paintThumbs() { D.layers.forEach((l, li) => D.heads.forEach((h, hi) => paint(thumbs[li][hi], li, hi))); }

const heat = document.getElementById("heat"), info = document.getElementById("info");
let geo = null;
function drawHeat() {
  const li = Math.max(0, D.layers.indexOf(state.layer)), hi = Math.max(0, D.heads.indexOf(state.head));
  state.layer = D.layers[li]; state.head = D.heads[hi];
  D.layers.forEach((l, a) => D.heads.forEach((h, b) => thumbs[a][b].classList.toggle("sel", a === li && b === hi)));
  document.getElementById("zoomtitle").textContent = "layer " + state.layer + ", head " + state.head +
    (state.hide ? "  (first token hidden, rows renormalised)" : "");
  const cell = Math.max(3, Math.min(26, Math.floor(720 / T)));
  const ctx0 = heat.getContext("2d"); ctx0.font = "11px ui-monospace, monospace";
  let lw = 0; for (const s of D.tokens) lw = Math.max(lw, ctx0.measureText(label(s) + " 000").width);
  const M = Math.ceil(lw) + 8, every = Math.max(1, Math.ceil(12 / cell));
  heat.width = M + T * cell + 4; heat.height = M + T * cell + 4;
  const ctx = heat.getContext("2d");
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, heat.width, heat.height);
  for (let i = 0; i < T; i++) for (let j = 0; j <= i; j++) {
    const [r, g, b] = colour(weight(li, hi, i, j));
    ctx.fillStyle = "rgb(" + r + "," + g + "," + b + ")"; ctx.fillRect(M + j * cell, M + i * cell, cell, cell);
  }
  ctx.strokeStyle = "#999"; ctx.strokeRect(M - 0.5, M - 0.5, T * cell + 1, T * cell + 1);
  ctx.font = "11px ui-monospace, monospace"; ctx.textBaseline = "middle";
  for (let i = 0; i < T; i += every) {
    const gen = PL !== null && i >= PL, txt = label(D.tokens[i]) + " " + i;
    ctx.fillStyle = gen ? "#d62728" : "#222";
    ctx.textAlign = "right"; ctx.fillText(txt, M - 4, M + (i + 0.5) * cell);          // query labels (rows)
    ctx.save(); ctx.translate(M + (i + 0.5) * cell, M - 4); ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left"; ctx.fillText(txt, 0, 0); ctx.restore();                    // key labels (columns)
  }
  if (PL !== null) {
    ctx.strokeStyle = "#d62728"; ctx.lineWidth = 1.5; ctx.beginPath();
    ctx.moveTo(M, M + PL * cell); ctx.lineTo(M + T * cell, M + PL * cell);
    ctx.moveTo(M + PL * cell, M); ctx.lineTo(M + PL * cell, M + T * cell); ctx.stroke(); ctx.lineWidth = 1;
  }
  if (state.row !== null && state.row < T) {
    ctx.strokeStyle = "#ff7f0e"; ctx.strokeRect(M - 0.5, M + state.row * cell - 0.5, T * cell + 1, cell + 1);
  }
  geo = { M, cell, li, hi };
  showRow(state.row);
}
function showRow(i, j) {
  if (i === null || i === undefined || !geo) { info.textContent = "rows: queries, columns: keys. Hover a cell; click a row to pin its top weights."; return; }
  const ws = []; for (let k = 0; k <= i; k++) ws.push([weight(geo.li, geo.hi, i, k), k]);
  ws.sort((a, b) => b[0] - a[0]);
  let s = "query " + i + " '" + label(D.tokens[i]) + "'";
  if (j !== undefined && j <= i) s += " → key " + j + " '" + label(D.tokens[j]) + "': " + (100 * weight(geo.li, geo.hi, i, j)).toFixed(2) + "%";
  s += "   top: " + ws.slice(0, 5).map(([w, k]) => "'" + label(D.tokens[k]) + "'[" + k + "] " + (100 * w).toFixed(1) + "%").join(", ");
  info.textContent = s;
}
function cellAt(ev) {
  const r = heat.getBoundingClientRect(), x = (ev.clientX - r.left) * heat.width / r.width, y = (ev.clientY - r.top) * heat.height / r.height;
  const i = Math.floor((y - geo.M) / geo.cell), j = Math.floor((x - geo.M) / geo.cell);
  return i >= 0 && i < T && j >= 0 && j < T ? [i, j] : null;
}
heat.onmousemove = ev => { const c = cellAt(ev); if (c) showRow(c[0], c[1]); else showRow(state.row); };
heat.onclick = ev => { const c = cellAt(ev); if (c) { state.row = c[0]; drawHeat(); } };
document.getElementById("hide").onchange = e => { state.hide = e.target.checked; draw(true); };
document.getElementById("sqrt").onchange = e => { state.sqrt = e.target.checked; draw(true); };
(function legend() {
  const el = document.getElementById("legend");
  el.innerHTML = "colour = weight: " + [0, 0.25, 0.5, 0.75, 1].map(w => {
    const [r, g, b] = colour(w); return '<span style="background:rgb(' + r + ',' + g + ',' + b + ')"></span>' + w;
  }).join(" ") + (PL !== null ? '  <b style="color:#d62728">│ prompt / generated</b>' : "");
})();
function draw(all) { if (all) paintThumbs(); drawHeat(); }
paintThumbs(); drawHeat();
{ const c = thumbs[Math.max(0, D.layers.indexOf(state.layer))][Math.max(0, D.heads.indexOf(state.head))];
  c.scrollIntoView({ block: "nearest" }); }
</script></body></html>
"""

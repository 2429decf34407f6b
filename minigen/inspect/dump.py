"""Attention dumps: one .npz per run, readable with numpy.load alone, in one of three forms (meta["form"]).

- "full" (the default): `attention_tril_{l}` float32 (or float16) (n_heads_kept, T(T+1)/2) per kept layer:
  each head's lower triangle, rows (queries) one after another, row i holding keys 0..i, in
  `np.tril_indices(T)` order; the upper triangle is the causal mask's exact zeros and is not stored (half
  the size of the square):

      z = np.load("attn.npz"); T = len(z["token_ids"]); i, j = np.tril_indices(T)
      a = np.zeros((n_heads, T, T), np.float32); a[:, i, j] = z["attention_tril_5"]   # layer 5, (H, T, T)

  (Deflating the triangle saved ~6 % on a real 400-token dump and took ~4 s, so it is stored plain.)
- "top" (`--attn-top-k K`): per kept layer and query row the first token's share and
  the K strongest other keys, for prompts whose full maps would not fit: `attention_top_keys_{l}` int32
  (n_heads_kept, T, K), largest weight first (-1 past a row's last key with weight > 0),
  `attention_top_weights_{l}` (n_heads_kept, T, K), `attention_first_{l}` and `attention_rest_{l}`
  (n_heads_kept, T): the first token's weight and the weight of the other keys not listed, and
  `attention_thumbs_{l}` float16 (2, n_heads_kept, R, R): each head's R x R largest weights, with the
  first token shown and hidden (the compact page's thumbnails).
- "rows" (`--attn-queries A-B`): `attention_rows_{l}` (n_heads_kept, B - A + 1, B + 1): the full rows of
  queries A..B over keys 0..B (zeros past each row's own position); meta["queries"] = [A, B + 1].

The attention command dumps a prompt's rows; generate (rundump.py) the prompt's from the prefill and each
generated token's row from its cached decode step, in any of the three forms; the last generated token is
never fed back, so it has no row. Plus `token_ids` (T,), `prompt_length`, and `meta`
(a JSON string). Dumps of the first format (v1) held the full squares as `attention_{l}` (H, T, T);
`load_attention` reads them all. The file is written through files.OutputFile, so an interrupted run leaves
nothing behind.
"""
from __future__ import annotations

import json
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import MinigenError
from ..files import OutputFile, what_is_at
from . import tiles as TL
from .args import query_window

BUDGET = 2**30  # bytes: dumps above this are refused before running
NOTE = ("rows are queries, columns keys; attention_tril_{l} holds each head's lower triangle in np.tril_indices(T) "
        "order (the rest is the causal mask's zeros); prompt rows from the prefill, each generated token's row from "
        "its cached decode step; the final generated token is never fed back, so it has no row")
NOTES = {
    "full": NOTE,
    "top": "rows are queries; attention_top_keys_{l} (heads, T, K) lists each row's K strongest keys beyond the first "
           "token, strongest first (-1: none), attention_top_weights_{l} their weights, attention_first_{l} the first "
           "token's weight, attention_rest_{l} the weight of the other keys not listed; attention_thumbs_{l} (2, heads, "
           "R, R) each pixel the largest weight of its block, with the first token shown, then hidden and rows renormalised",
    "rows": "attention_rows_{l} (heads, B - A, B) holds the full rows of queries A..B-1 (meta queries = [A, B]) over keys "
            "0..B-1, zeros past each row's own position",
}
FORMAT = "minigen attention dump v2"


def parse_dtype(text: str | None) -> np.dtype:
    if text in (None, "float32", "f32"):
        return np.dtype(np.float32)
    if text in ("float16", "f16", "half"):
        return np.dtype(np.float16)
    raise MinigenError(f"--attn-dtype {text!r}: expected float32 or float16")


def expected_bytes(n_layers: int, n_heads: int, T: int, dtype, form: str = "full", top_k: int = 0,
                   queries: tuple[int, int] | None = None, thumb: int = 64) -> int:
    """The weights' bytes of a dump of that form."""
    item = np.dtype(dtype).itemsize
    if form == "top":
        R = min(T, thumb)
        return n_layers * n_heads * (T * (top_k * (4 + item) + 2 * item) + 2 * R * R * 2)
    if form == "rows":
        a, b = queries
        return n_layers * n_heads * (b - a) * b * item
    return n_layers * n_heads * (T * (T + 1) // 2) * item


def check_budget(n_layers: int, n_heads: int, T: int, dtype, budget: int | None = None, form: str = "full",
                 top_k: int = 0, queries: tuple[int, int] | None = None):
    budget = BUDGET if budget is None else budget
    size = expected_bytes(n_layers, n_heads, T, dtype, form, top_k, queries)
    if size > budget:
        what = {"full": f"{T}x{T}", "top": f"{T} rows x top {top_k} keys",
                "rows": f"{queries[1] - queries[0] if queries else 0} rows x {queries[1] if queries else 0} keys"}[form]
        more = "" if form == "top" else ", --attn-top-k 8 (each row's strongest keys)"
        raise MinigenError(
            f"the attention dump would take {size / 2**20:,.0f} MiB ({n_layers} layers x {n_heads} heads x "
            f"{what} {np.dtype(dtype).name}), over the {budget / 2**30:g} GiB budget; keep less with "
            f"--attn-layers 0,5-7, --attn-heads 0-3, --attn-dtype float16{more}, or fewer tokens")
    return size


# --- a form's consumers and arrays (the attention command's dump and generate's) ---------------------------

@dataclass(frozen=True)
class Form:
    """The dump a run's flags ask for: "full", "top" (`top_k` keys a row) or "rows" (`window` (A, B + 1))."""
    name: str = "full"
    dtype: np.dtype = np.dtype(np.float32)
    top_k: int = 0
    window: tuple[int, int] | None = None

    @classmethod
    def of(cls, rows: int, dtype: str | None = None, top_k: int | None = None, queries: str | None = None) -> "Form":
        """From --attn-dtype, --attn-top-k and --attn-queries, the window checked against `rows` query rows."""
        if top_k is not None and queries is not None:
            raise MinigenError("--attn-queries dumps full rows, --attn-top-k every row's strongest keys: choose one")
        dt = parse_dtype(dtype)
        if top_k is not None:
            return cls("top", dt, top_k)
        return cls("rows", dt, window=query_window(queries, rows)) if queries is not None else cls("full", dt)

    def size(self, n_layers: int, n_heads: int, T: int, budget: int | None = None) -> int:
        """The dump's bytes, refused over the budget (check_budget)."""
        return check_budget(n_layers, n_heads, T, self.dtype, budget, self.name, self.top_k, self.window)

    def consumer(self, layers: list[int], n_heads: int, T: int):
        """What a scan's tiles go to for this form (tiles.py); a top-keys dump also needs a Thumbs."""
        if self.name == "top":
            return TL.TopKeys(layers, n_heads, T, self.top_k)
        if self.name == "rows":
            a, b = self.window
            return TL.Window(layers, n_heads, a, min(b, T), dtype=self.dtype)
        return TL.Triangles(layers, n_heads, T, self.dtype)

    def extra_meta(self) -> dict:
        return {"queries": list(self.window)} if self.name == "rows" else {"top_k": self.top_k} if self.name == "top" else {}

    def arrays(self, layers: list[int], consumer, thumbs=None, T: int | None = None) -> dict[str, np.ndarray]:
        """The .npz arrays of what `consumer` kept, cut to the first T rows (a run that stopped early) when
        T is given; `thumbs` (a tiles.Thumbs made for those T rows) for a top-keys dump."""
        if self.name == "full":
            n = None if T is None else T * (T + 1) // 2
            return {f"attention_tril_{l}": t[:, :n] for l, t in consumer.tri.items()}
        if self.name == "rows":
            a, b = self.window
            b = b if T is None else min(b, T)
            return {f"attention_rows_{l}": r[:, :b - a, :b] for l, r in consumer.rows.items()}
        rest, out, dt = consumer.rest(), {}, self.dtype
        for n, l in enumerate(layers):
            out.update({f"attention_top_keys_{l}": consumer.keys[n, :, :T],
                        f"attention_top_weights_{l}": consumer.weights[n, :, :T].astype(dt),
                        f"attention_first_{l}": consumer.first[n, :, :T].astype(dt),
                        f"attention_rest_{l}": rest[n, :, :T].astype(dt),
                        f"attention_thumbs_{l}": np.stack([thumbs.plain[n], thumbs.hidden[n]]).astype(np.float16)})
        return out


class Recorder:
    """Assembles per-step records into full (n_heads_kept, T, T) matrices per kept layer.

    `add(record)` takes what `model.forward(..., record=...)` appended for one call: one
    (n_heads, q, S) array per layer, q new query rows against all S keys so far.
    """

    def __init__(self, layers: list[int], heads: list[int], capacity: int, dtype=np.float32):
        self.layers, self.heads, self.dtype = layers, heads, np.dtype(dtype)
        self.rows = 0
        self.mats = {l: np.zeros((len(heads), capacity, capacity), self.dtype) for l in layers}

    def add(self, record: list[np.ndarray]):
        q, S = next(r for r in record if r is not None).shape[-2:]   # None: a layer without attention
        if S - q > self.rows or S < self.rows + 1:  # a forward may recompute earlier rows (longrope's switch)
            raise MinigenError(f"attention record does not line up: {q} new rows against {S} keys after {self.rows} rows")
        self._ensure(S)
        for l in self.layers:
            self.mats[l][:, S - q:S, :S] = record[l][self.heads]
        self.rows = S

    def _ensure(self, S: int):
        cap = next(iter(self.mats.values())).shape[-1] if self.mats else S
        if S > cap:
            for l, m in self.mats.items():
                new = np.zeros((m.shape[0], S, S), self.dtype)
                new[:, :cap, :cap] = m
                self.mats[l] = new

    def matrices(self) -> dict[int, np.ndarray]:
        return {l: m[:, :self.rows, :self.rows] for l, m in self.mats.items()}


def head_kv_map(n_heads: int, n_kv_heads: int) -> list[int]:
    """Query head h reads KV head h // group (HF's order)."""
    group = n_heads // n_kv_heads
    return [h // group for h in range(n_heads)]


def make_meta(model, token_strings: list[str], layers: list[int], heads: list[int], dtype,
              final_token: tuple[int, str] | None = None, source: str = "generate", form: str = "full",
              **extra) -> dict:
    c = model.config
    return {
        "format": FORMAT,
        "form": form,
        **extra,
        "source": source,
        "note": NOTES[form],
        "model_path": str(model.path),
        "architecture": c.model_type,
        "n_layers": c.n_layers, "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads,
        "head_to_kv_head": head_kv_map(c.n_heads, c.n_kv_heads),
        "layers": layers, "heads": heads,
        "mixers": [c.mixer(i) for i in range(c.n_layers)],   # each layer's token mixer; only attention is dumped
        "dtype": np.dtype(dtype).name,
        "tokens": token_strings,
        "final_token": None if final_token is None else {"id": int(final_token[0]), "text": final_token[1]},
    }


class DumpFile(OutputFile):
    """An attention dump's target (files.OutputFile): a bad path fails before any work."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path, "attention dump")

    def write(self, matrices: dict[int, np.ndarray], token_ids, prompt_length: int, meta: dict):
        """Full squares {layer: (H, T, T)}, stored as their lower triangles."""
        T = len(token_ids)
        i, j = np.tril_indices(T)
        self.write_arrays({f"attention_tril_{l}": m[:, i, j] for l, m in matrices.items()}, token_ids, prompt_length,
                          meta)

    def write_arrays(self, arrays: dict[str, np.ndarray], token_ids, prompt_length: int, meta: dict):
        """The named arrays of one form, with token_ids, prompt_length and meta."""
        arrays = dict(arrays)
        arrays["token_ids"] = np.asarray(token_ids, dtype=np.int64)
        arrays["prompt_length"] = np.asarray(prompt_length, dtype=np.int64)
        arrays["meta"] = np.asarray(json.dumps(meta, ensure_ascii=False))
        try:
            with open(self.tmp, "wb") as f:
                np.savez(f, **arrays)
        except OSError as e:
            raise MinigenError(f"{self.path}: could not write the dump ({e.strerror or e})")
        self.commit()


def load_attention(path: str | os.PathLike) -> dict:
    """A dump of any form as {"form", "layers", "token_ids", "prompt_length", "meta", "heads"}: "layers" is
    {l: (n_heads_kept, T, T) float32} for a full dump (either format), {l: (n_heads_kept, B - A, B)} for a
    dump of query rows A..B-1 ("queries": (A, B)), and {l: {"keys", "weights", "first", "rest", "thumbs",
    "thumbs_hidden"}} for a dump of each row's top keys ("top_k": K)."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_file():  # a directory, a FIFO (np.load would wait on it), ...
        raise MinigenError(f"{path}: is {what_is_at(path)}, not an attention dump")
    if not path.is_file():
        raise MinigenError(f"{path}: no such attention dump")
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            token_ids, prompt_length = z["token_ids"], int(z["prompt_length"])
            form = meta.get("form", "full")
            layers = READERS[form](z, len(token_ids), meta) if form in READERS else None
    except (OSError, ValueError, KeyError, IndexError, zipfile.BadZipFile, json.JSONDecodeError) as e:
        raise MinigenError(f"{path}: not a minigen attention dump ({type(e).__name__}: {e})")
    if layers is None:
        raise MinigenError(f"{path}: an attention dump of a form this minigen does not know ({meta.get('form')!r})")
    if not layers or len(token_ids) == 0:
        raise MinigenError(f"{path}: the dump holds no attention (no layers, or no tokens)")
    first = next(iter(layers.values()))
    n_heads = (first["first"] if isinstance(first, dict) else first).shape[0]
    out = {"form": form, "layers": dict(sorted(layers.items())), "token_ids": token_ids,
           "prompt_length": prompt_length, "meta": meta, "heads": meta.get("heads", list(range(n_heads)))}
    if form == "rows":
        out["queries"] = tuple(meta["queries"])
    if form == "top":
        out["top_k"] = first["keys"].shape[-1]
    return out


def _full_layers(z, T: int, meta: dict) -> dict:
    return {l: _square(z[k], k, T) for k in z.files if (l := _layer_of(k)) is not None}


def _top_layers(z, T: int, meta: dict) -> dict:
    out = {}
    for k in z.files:
        if m := re.fullmatch(r"attention_top_keys_(\d+)", k):
            l = int(m[1])
            keys, thumbs = z[k], z[f"attention_thumbs_{l}"].astype(np.float32)
            if keys.ndim != 3 or keys.shape[1] != T or thumbs.shape[:2] != (2, keys.shape[0]):
                raise ValueError(f"{k} has shape {keys.shape}, not (heads, {T}, K), or its thumbnails do not match")
            out[l] = {"keys": keys, "weights": z[f"attention_top_weights_{l}"].astype(np.float32),
                      "first": z[f"attention_first_{l}"].astype(np.float32),
                      "rest": z[f"attention_rest_{l}"].astype(np.float32), "thumbs": thumbs[0], "thumbs_hidden": thumbs[1]}
    return out


def _rows_layers(z, T: int, meta: dict) -> dict:
    a, b = meta["queries"]
    out = {}
    for k in z.files:
        if m := re.fullmatch(r"attention_rows_(\d+)", k):
            rows = z[k]
            if rows.ndim != 3 or rows.shape[1:] != (b - a, b) or not 0 <= a < b <= T:
                raise ValueError(f"{k} has shape {rows.shape}, not (heads, {b - a}, {b}) for queries {a}-{b - 1}")
            out[int(m[1])] = rows.astype(np.float32)
    return out


READERS = {"full": _full_layers, "top": _top_layers, "rows": _rows_layers}


def _layer_of(key: str) -> int | None:
    m = re.fullmatch(r"attention_(?:tril_)?(\d+)", key)
    return int(m[1]) if m else None


def _square(a: np.ndarray, key: str, T: int) -> np.ndarray:
    """(H, T, T) float32 from a stored square (v1) or lower triangle (v2)."""
    if not key.startswith("attention_tril_"):
        if a.shape[-2:] != (T, T):
            raise ValueError(f"{key} has shape {a.shape}, not (heads, {T}, {T})")
        return a.astype(np.float32)
    if a.ndim != 2 or a.shape[1] != T * (T + 1) // 2:
        raise ValueError(f"{key} has shape {a.shape}, not (heads, {T * (T + 1) // 2}) for {T} tokens")
    i, j = np.tril_indices(T)
    out = np.zeros((a.shape[0], T, T), np.float32)
    out[:, i, j] = a
    return out

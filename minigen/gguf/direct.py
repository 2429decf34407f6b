"""A GGUF run as stored: the params built straight from the file, each matrix a StoredMatrix of the file's own
type (engine/quant), no converted directory.

The plan is the converter's (convert.read_plan: the tensor map, every check, config.json); the canonical names,
fused parts and the family's fixes are the Hugging Face loader's (checkpoint/weights.resolve, fixes.FIXES). A
matrix is kept in its type when the way from the GGUF's rows to minigen's only reorders whole rows:

- llama.cpp's Q/K permutation (unpermute_q/k), GPT-NeoX's qkv order (neox_per_head, then the HF family's
  neox_qkv: the two undo each other), Qwen3.5's gated q (gated_q) and its value heads' rows (dn_qkv, dn_rows):
  done on the rows of blocks, before they are tiled;
- GPT-2's Conv1D: the GGUF fix transposes to HF's (in, out), the HF family's fix back: the rows stay as stored;
- split tensors joined (q, k, v into wqkv; gate and up): rows one after another in one StoredMatrix when all
  parts have one type, else a StoredRows of one matrix per part (a Q4_K_M file's Q4_K q and k beside a Q6_K v),
  unless the family reorders rows across the parts (Qwen3.5's gated q: then float32).

Everything else becomes float32 exactly as a conversion then a load would make it (correct, just bigger):
vectors (norms, biases), convolutions, the recurrent layers' parameters, the MoE router, F32 matrices (OpenBLAS
multiplies them as fast, and a long prompt needs no dequantizing), and every tensor with dtype "float32". A
matrix of a type the kernels do not run (IQ1_S ... IQ3_S, TQ1_0, TQ2_0, MXFP4) is refused: `dtype="float32"` runs it.

Memory: each stored matrix's bytes are read once from the file (plain reads, one tensor at a time) into its
tiles; peak RSS is the tiles (about the file's size) plus one tensor. Stored matrices are not checked for NaN
(that needs their values: llama.cpp does not either); float32 ones are, by the converter's reader.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..checkpoint.families import FAMILIES
from ..checkpoint.fixes import FIXES
from ..checkpoint.weights import KEPT, MATRICES, Source, TensorRef, column_major, column_major_for, resolve, scaled
from ..engine.quant import RUNS, StoredMatrix, StoredRows, kernels_on, refuse_type, stack, warm
from ..errors import MinigenError
from .convert import Plan, _dequantise, _Tensor, read_rows

ROW_FIXES = {None, "unpermute_q", "unpermute_k", "neox_per_head", "neox_qkv", "gated_q", "dn_qkv", "dn_rows"}


def gguf_params(plan: Plan, dtype: str | None = None, int8: bool = False) -> dict:
    """The params of the GGUF `plan` describes: {"embed", ..., "layers": [...]}, as weights.load_params
    gives them for the converted checkpoint, with matrices kept as stored (dtype None) or all float32. The
    kept types' kernels (with `int8`, their int8 products too) load from numba's cache meanwhile (quant.warm)."""
    if dtype not in (None, "float32"):
        raise MinigenError(f"--dtype {dtype}: minigen runs a GGUF as stored or as float32 (--dtype float32)")
    cfg = plan.model_config
    family = FAMILIES[cfg.model_type]
    by_name = {t.name: t for t in plan.tensors}
    refs = {t.name: TensorRef(t.name, plan.source, "F32", t.shape, 0, 0, 0) for t in plan.tensors}
    glob, layers = resolve(cfg, family, refs, plan.source)
    keep = dtype is None and kernels_on()   # without the kernels: every tensor float32, dequantized once here
    if keep:
        named = [(k, s) for k, s in glob.items()] + [kv for srcs in layers for kv in srcs.items()]
        _refuse_types(plan, named, by_name)
        warm({h.qtype.name for h in _kept(named, by_name)}, int8)
    load = lambda key, src: _tensor(plan, family, key, src, [by_name[r.name] for r in src.refs], keep)  # noqa: E731
    params = {k: load(k, s) for k, s in glob.items()}
    if "lm_head" not in glob:
        params["lm_head"] = params["embed"] if isinstance(params["embed"], StoredMatrix) else column_major(params["embed"])
    params["layers"] = [scaled({k: load(k, s) for k, s in srcs.items()}, cfg) for srcs in layers]
    return params


def _tensor(plan: Plan, family, key: str, src: Source, parts: list[_Tensor], keep: bool):
    """One canonical tensor: a StoredMatrix (a list of them for experts, a StoredRows for parts of two types)
    when it can be kept, else float32."""
    if keep and _keepable(key, src, parts):
        return _stored(plan, src, parts)
    return _float32(plan, family, key, src, parts)


def _refuse_types(plan: Plan, srcs: list, by_name: dict) -> None:
    """Before any tensor is read: a KEPT matrix of a type the kernels do not run is refused, naming it."""
    for h in _kept(srcs, by_name):
        if h.qtype.name not in RUNS:
            e = refuse_type(f"{plan.source}: tensor {h.gguf_name}", h.qtype.name)
            raise MinigenError(f"{e}; --dtype float32 runs it dequantized to float32")


def _kept(srcs: list, by_name: dict):
    """The GGUF tensors (each half of a joined pair) of the KEPT canonical tensors among srcs [(key, Source)]."""
    for key, src in srcs:
        for t in (by_name[r.name] for r in src.refs) if key in KEPT else ():
            yield from (t, t.up) if t.up is not None else (t,)


def _keepable(key: str, src: Source, parts: list[_Tensor]) -> bool:
    """Whether a canonical tensor can be kept: a KEPT matrix of types the kernels run (F32 stays a float32
    array, which OpenBLAS multiplies as fast and a long prompt needs no dequantizing of), reached from the
    file's rows by row reorders only (the module's docstring)."""
    types = {p.qtype.name for p in parts} | {p.up.qtype.name for p in parts if p.up}
    if key not in KEPT or "F32" in types or not types <= set(RUNS) or any(p.offset_norm for p in parts):
        return False
    if len(types) > 1 and (src.fix is not None or len(src.shape) == 3):   # parts of two types: StoredRows,
        return False                                                       # which takes no reorder across parts
    if src.fix == "conv1d":   # GPT-2: the GGUF's transpose and the family's undo each other
        return all(p.fix == "conv1d" for p in parts)
    return src.fix in ROW_FIXES and all(p.fix in ROW_FIXES for p in parts)


def _stored(plan: Plan, src: Source, parts: list[_Tensor]):
    """The parts' rows of blocks, each reordered by its GGUF fix, joined, then the family's fix: tiled."""
    cfg, type = plan.model_config, parts[0].qtype.name
    halves = [h for t in parts for h in ((t, t.up) if t.up is not None else (t,))]
    if len(src.shape) == 2 and len({h.qtype.name for h in halves}) > 1:
        mats = [_stored(plan, Source((None,), (h.rows, h.cols)), [dataclasses.replace(h, up=None)]) for h in halves]
        return StoredRows(tuple(mats), parts[0].gguf_name)
    if len(src.shape) == 3:   # experts (E, rows, in): one matrix per expert, its gate rows then its up rows
        (t,) = parts
        E, rows = src.shape[0], t.rows // src.shape[0]
        mats = []
        for e in range(E):
            raw = np.concatenate([_rows(plan, h, e * rows, rows) for h in (t, t.up) if h is not None])
            mats.append(StoredMatrix.from_bytes(raw, type, src.shape[1:], f"{t.gguf_name}[{e}]"))
        return stack(mats)
    # the parts read straight into their rows of one array: no joined copy (each fresh buffer is first-touched
    # memory, dear here: the 1.5B Q4_K_M's fused q/k/v and gate/up were ~0.5 GB of such copies)
    raw = np.empty((sum(h.rows for h in halves), halves[0].row_bytes), np.uint8)   # one type, one width: same row bytes
    at = 0
    for h in halves:
        rows = raw[at:at + h.rows]                                           # (rows, row bytes) uint8
        read_rows(plan.source, h.offset, h.row_bytes, h.rows, h.gguf_name, into=rows)
        if h.fix in ROW_FIXES - {None}:
            rows[...] = FIXES[h.fix](rows, cfg)
        at += h.rows
    if src.fix in ROW_FIXES - {None}:
        raw = FIXES[src.fix](raw, cfg)
    return StoredMatrix.from_bytes(np.ascontiguousarray(raw), type, src.shape, parts[0].gguf_name)


def _rows(plan: Plan, t: _Tensor, start: int, n: int) -> np.ndarray:
    """Rows start..start+n of a tensor as the file stores them, (n, row bytes) uint8: one plain read."""
    return read_rows(plan.source, t.offset + start * t.row_bytes, t.row_bytes, n, t.gguf_name)


def _float32(plan: Plan, family, key: str, src: Source, parts: list[_Tensor]) -> np.ndarray:
    """As the converter writes it and weights._read reads it back: each part dequantized in HF's layout (the
    GGUF's fixes undone), joined by rows, the family's fix, its norm offset, a matrix's layout."""
    arrays = [np.concatenate([b.reshape(-1) for b in _dequantise(plan, t)]).reshape(t.shape) for t in parts]
    w = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
    if src.fix:
        w = FIXES[src.fix](w, plan.model_config)
    if family.norm_offset and "norm" in key and not key.endswith("_b") and key not in family.plain_norms:
        w = w + np.float32(family.norm_offset)
    if key in MATRICES or key == "embed":
        return column_major(w) if column_major_for(w.shape) else np.ascontiguousarray(w)
    return w

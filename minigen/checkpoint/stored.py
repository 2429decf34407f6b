"""Weights kept in a stored type (engine/quant's StoredMatrix) in a model's params: quantized at load from
float32 (`--quantize TYPE`), turned back into float32 (the reference a stored model is tested against),
and counted (`minigen info`).

Which tensors: every projection the forward applies through linear() (weights.MATRICES) and the embedding,
as llama.cpp quantizes a model, except the MoE router (llama.cpp keeps ffn_gate_inp in float too: a few
rows whose small errors move tokens between experts). Experts (E, out, in) become a list of E matrices.
Vectors (norms, biases, convolutions, the recurrent layers' parameters) stay float32.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..engine.linear import dense
from ..engine.quant import FORMATS, QUANTIZERS, STORED, StoredMatrix, StoredRows, kernels_on, stack
from ..engine.quant.matrix import INT8_TYPES
from ..errors import MinigenError
from .weights import KEPT, laid_out



QUANTIZE_TYPES = tuple(t for t in QUANTIZERS if t != "F32")   # Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, F16, BF16
# llama.cpp's fallback when a matrix's rows are not whole blocks of its type (llama-quant.cpp,
# tensor_type_fallback): a K type's 256 -> a 32-block type; rows not whole blocks of 32 stay float32 here
# (llama.cpp: F16), which is exact
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def check_quantize(type: str | None) -> str | None:
    """--quantize's value, checked: None, or a type minigen quantizes to (names as llama.cpp spells them)."""
    if type is None:
        return None
    name = str(type).upper()
    if name not in QUANTIZE_TYPES:
        raise MinigenError(f"--quantize {type}: not a type minigen quantizes to (one of {', '.join(QUANTIZE_TYPES)})")
    return name


def quantized(params: dict, type: str) -> dict:
    """params with every kept matrix (KEPT) quantized to `type` by llama.cpp's rules: new dicts, the
    float32 arrays they no longer hold left to be freed. A tied embedding stays one matrix."""
    type = check_quantize(type)
    done: dict[int, object] = {}

    def one(key: str, w):
        if key not in KEPT or not isinstance(w, np.ndarray) or id(w) in done:
            return done.get(id(w), w)
        done[id(w)] = _quantize(w, type, key)
        return done[id(w)]

    out = {k: one(k, v) for k, v in params.items() if k != "layers"}
    out["layers"] = [{k: one(k, v) for k, v in layer.items()} for layer in params["layers"]]
    return out if kernels_on() else dequantized(out)   # without the kernels: the quantized values in float32


def _quantize(w: np.ndarray, type: str, name: str):
    """One matrix (out, in), or a stack of experts (E, out, in), in `type` or its fallback."""
    if w.ndim == 3:
        experts = [_quantize(e, type, f"{name}[{i}]") for i, e in enumerate(w)]
        return w if isinstance(experts[0], np.ndarray) else stack(experts)
    for t in (type, FALLBACK.get(type)):
        if t and w.shape[1] % FORMATS[t].block == 0:
            return StoredMatrix.quantize(np.ascontiguousarray(w, np.float32), t, name)
    return w


def check_activations(value: str | None) -> str | None:
    """--activations' value: None (exact float32 products), or "int8"."""
    if value is None or str(value).lower() == "float32":
        return None
    if str(value).lower() != "int8":
        raise MinigenError(f"--activations {value}: not one minigen runs (int8, or float32: the default, exact)")
    return "int8"


def with_int8_activations(params: dict, source: str) -> dict:
    """params whose matrices of INT8_TYPES multiply with activations rounded to int8 per block of 32
    (StoredMatrix.int8: llama.cpp's arithmetic, not exact); the other types' products stay exact. A model
    with no such matrix, or no kernels to run them, is refused naming `source`."""
    if not kernels_on():
        raise MinigenError(f"--activations int8: {source}: needs numba's kernels (numba is not installed, "
                           "or MINIGEN_KERNELS=0)")
    done: dict[int, object] = {}
    changed = []

    def one(v):
        if id(v) in done:
            return done[id(v)]
        if isinstance(v, StoredMatrix):
            out = replace(v, int8=True) if v.type in INT8_TYPES else v
            if out is not v:
                changed.append(out)
        elif isinstance(v, StoredRows):
            out = StoredRows(tuple(one(p) for p in v.parts), v.name)
        elif isinstance(v, list) and v and isinstance(v[0], StoredMatrix):
            out = [one(p) for p in v]
        else:
            out = v
        done[id(v)] = out
        return out

    out = {k: one(v) for k, v in params.items() if k != "layers"}
    out["layers"] = [{k: one(v) for k, v in layer.items()} for layer in params["layers"]]
    if not changed:
        kept = ", ".join(stored_types(params)) or "none"
        raise MinigenError(f"--activations int8: {source} keeps no matrix in a type it runs with int8 activations "
                           f"({', '.join(INT8_TYPES)}; this model: {kept}); a GGUF of those types, or --quantize, does")
    return out


def dequantized(params: dict) -> dict:
    """params with every StoredMatrix (and list of them) as float32: the model a stored one must equal."""
    cast = lambda v: laid_out(dense(v)) if isinstance(v, (*STORED, list)) else v  # noqa: E731
    out = {k: cast(v) for k, v in params.items() if k != "layers"}
    out["layers"] = [{k: cast(v) for k, v in layer.items()} for layer in params["layers"]]
    if params.get("lm_head") is params.get("embed"):
        out["lm_head"] = out["embed"]
    return out


def _weights(params: dict):
    """Each StoredMatrix and float32 array (2-D and up) of the params once (a tied embedding is one;
    experts and a StoredRows' parts one by one)."""
    seen = set()
    layers = params.get("layers", [])
    for v in [v for k, v in params.items() if k != "layers"] + [v for layer in layers for v in layer.values()]:
        for m in v if isinstance(v, list) else v.parts if isinstance(v, StoredRows) else [v]:
            if id(m) not in seen and (isinstance(m, StoredMatrix) or getattr(m, "ndim", 0) >= 2):
                seen.add(id(m))
                yield m


def int8_types(params: dict) -> set[str]:
    """The types of the params' matrices that multiply with int8 activations (with_int8_activations)."""
    return {m.type for m in _weights(params) if isinstance(m, StoredMatrix) and m.int8}


def stored_types(params: dict) -> dict[str, tuple[int, int]]:
    """{type: (matrices, bytes)} of the params' weights, "float32" counting float32 arrays (2-D and up):
    what `minigen info` reports. Each array or matrix once (a tied embedding is one)."""
    counts = {}
    for m in _weights(params):
        t = m.type if isinstance(m, StoredMatrix) else "float32"
        n, b = counts.get(t, (0, 0))
        counts[t] = (n + 1, b + int(m.nbytes))
    return counts

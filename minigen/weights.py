"""How HF tensors become our arrays: safetensors (single or sharded), float32/float16/bfloat16,
the family's name table (families.py), shape checks, tied embeddings, fused projections.

Layout convention: every projection is kept as HF's Linear stores it, `(out, in)`, and applied as
`x @ w.T` (BLAS takes the transpose without a copy). GPT-2's Conv1D weights are stored `(in, out)`
and are transposed once here. q/k/v are fused into one `(q + 2 kv, in)` matrix and gate/up into
one `(2 * inter, in)` matrix, read straight into their slice of the fused buffer (a checkpoint that
stores them fused, like Phi-3's, is read as it is). Single float32 tensors are memory-mapped, not
read; fused ones are read into memory once, so they cost their size but no second copy.
"""
from __future__ import annotations

import json
import mmap
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import Config
from .errors import MinigenError

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}  # BF16 read as raw 16 bits


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor's bytes live on disk."""
    name: str
    file: Path
    dtype: str
    shape: tuple
    start: int  # absolute byte offset in the file
    nbytes: int


# --- reading safetensors -------------------------------------------------------------------

def index_checkpoint(path: Path) -> dict[str, TensorRef]:
    """Every tensor of a checkpoint directory: model.safetensors, or the shards its index names."""
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        return read_header(single)
    if not index.is_file():
        raise MinigenError(f"{path}: no model.safetensors or model.safetensors.index.json")
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise MinigenError(f"{index}: not a valid safetensors index ({type(e).__name__}: {e})")
    refs = {}
    for shard in shards:
        if not (path / shard).is_file():
            raise MinigenError(f"{path / shard}: shard named in {index.name} is missing")
        refs.update(read_header(path / shard))
    for name, shard in weight_map.items():
        if name not in refs or refs[name].file.name != shard:
            raise MinigenError(f"{index}: tensor {name!r} is not in {shard}")
    return refs


def read_header(file: Path) -> dict[str, TensorRef]:
    """Parse a safetensors header: 8-byte little-endian length, JSON, then the raw bytes."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise MinigenError(f"{file}: truncated (no safetensors header)")
        n = int.from_bytes(head, "little")
        if n > size - 8 or n > 100_000_000:
            raise MinigenError(f"{file}: corrupt or truncated safetensors header (says {n} bytes, file has {size})")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise MinigenError(f"{file}: corrupt safetensors header (not JSON)")
    if not isinstance(header, dict):
        raise MinigenError(f"{file}: corrupt safetensors header (not a JSON object)")
    header.pop("__metadata__", None)
    return {name: _ref(file, name, info, 8 + n, size) for name, info in header.items()}


def _ref(file: Path, name: str, info: dict, base: int, size: int) -> TensorRef:
    try:
        dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise MinigenError(f"{file}: tensor {name!r} has a malformed header entry")
    if dtype not in DTYPES:
        raise MinigenError(f"{file}: tensor {name!r} has dtype {dtype}; minigen reads F32, F16 and BF16")
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(DTYPES[dtype]).itemsize
    if end - begin != nbytes:
        raise MinigenError(f"{file}: tensor {name!r} says shape {list(shape)} but holds {end - begin} bytes")
    if base + end > size:
        raise MinigenError(f"{file}: truncated (tensor {name!r} runs past the end of the file)")
    return TensorRef(name, file, dtype, shape, base + begin, nbytes)


def read_tensor(ref: TensorRef, out: np.ndarray | None = None) -> np.ndarray:
    """A tensor as float32. float32 without `out` is memory-mapped (no copy); otherwise read into
    `out` (a float32 array of the tensor's size) or a new array."""
    if ref.dtype == "F32" and out is None:
        return _mapped(ref)
    if out is None:
        out = np.empty(ref.shape, np.float32)
    if ref.dtype == "F32":
        with open(ref.file, "rb") as f:
            f.seek(ref.start)
            f.readinto(memoryview(out.reshape(-1)).cast("B"))
        return out
    raw = np.fromfile(ref.file, DTYPES[ref.dtype], int(np.prod(ref.shape)), offset=ref.start).reshape(out.shape)
    if ref.dtype == "BF16":  # bfloat16 is the top half of a float32: widen by shifting 16 bits
        bits = out.view(np.uint32)
        bits[...] = raw                      # no uint32 temporary: widen in place, then shift
        bits <<= 16
    else:
        out[...] = raw
    return out


_maps: "weakref.WeakValueDictionary[tuple, mmap.mmap]" = weakref.WeakValueDictionary()  # alive while arrays use them


def _mapped(ref: TensorRef) -> np.ndarray:
    # One mapping per file version: a checkpoint rewritten at the same path gets a new mapping.
    st = ref.file.stat()
    key = (str(ref.file.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    mapping = _maps.get(key)
    if mapping is None:
        with open(ref.file, "rb") as f:
            mapping = _maps[key] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    count = int(np.prod(ref.shape, dtype=np.int64))
    return np.frombuffer(mapping, np.float32, count, ref.start).reshape(ref.shape)


# --- canonical tensors: shapes from the config, names from the family ------------------------------

def expected_shapes(cfg: Config) -> tuple[dict, dict]:
    """(global, per-layer) canonical tensors this config has, with their shapes in minigen's layout:
    every projection (out, in), q/k/v and gate/up fused by rows."""
    D, V, d, F = cfg.hidden_size, cfg.vocab_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.n_heads * d, cfg.n_kv_heads * d
    layer_norm = cfg.norm == "layer"
    glob = {"embed": (V, D), "final_norm": (D,), "lm_head": (V, D)}
    if cfg.positions == "learned":
        glob["pos_embed"] = (cfg.max_position_embeddings, D)
    norms = (["attn_norm", "mlp_norm"] if cfg.pre_norms else []) + \
            (["attn_post_norm", "mlp_post_norm"] if cfg.post_norms else [])
    layer = {n: (D,) for n in norms}
    if cfg.qk_norm:
        layer.update(q_norm=(d,) if cfg.qk_norm == "head" else (q,), k_norm=(d,) if cfg.qk_norm == "head" else (kv,))
    layer.update(wqkv=(q + 2 * kv, D), wo=(D, q), w_down=(D, F))
    layer.update(w_gate_up=(2 * F, D)) if cfg.mlp == "gated" else layer.update(w_up=(F, D))
    if cfg.qkv_bias:
        layer["bqkv"] = (q + 2 * kv,)
    if cfg.o_bias:
        layer["bo"] = (D,)
    if cfg.mlp_bias:
        layer.update({"b_gate_up" if cfg.mlp == "gated" else "b_up": (2 * F if cfg.mlp == "gated" else F,), "b_down": (D,)})
    if layer_norm:
        glob["final_norm_b"] = (D,)
        layer.update({n + "_b": (D,) for n in norms})
    return glob, layer


def row_splits(cfg: Config, name: str) -> list[int]:
    """How a fused canonical tensor's rows split into the checkpoint's separate tensors."""
    d, F = cfg.head_dim, cfg.intermediate_size
    if name in ("wqkv", "bqkv"):
        return [cfg.n_heads * d, cfg.n_kv_heads * d, cfg.n_kv_heads * d]
    return [F, F]  # w_gate_up, b_gate_up


@dataclass(frozen=True)
class Source:
    """Where one canonical tensor comes from: checkpoint tensors stacked by rows, then a fix."""
    refs: tuple          # TensorRef per part
    shape: tuple         # canonical shape
    fix: str | None = None


def resolve(cfg: Config, family, refs: dict[str, TensorRef], where: Path) -> tuple[dict, list[dict]]:
    """Canonical name -> Source, global and per layer; fail on unknown, missing or misshapen tensors."""
    for prefix in family.prefixes:
        refs = {(k[len(prefix):] if k.startswith(prefix) else k): r for k, r in refs.items()}
    glob_shapes, layer_shapes = expected_shapes(cfg)
    drop = {t.format(i) for t in family.ignored for i in range(cfg.n_layers)}
    wanted = {}  # checkpoint name -> (layer or None, canonical, part index, part shape)
    plan = [(None, k, s) for k, s in glob_shapes.items()] + \
           [(i, k, s) for i in range(cfg.n_layers) for k, s in layer_shapes.items()]
    for i, key, shape in plan:
        for j, (name, part) in enumerate(_parts(cfg, family, key, shape)):
            wanted[name.format(i)] = (i, key, j, part)
    unknown = sorted(set(refs) - set(wanted) - drop)
    if unknown:
        raise MinigenError(f"{where}: unexpected tensor {unknown[0]!r} for a {cfg.model_type} checkpoint "
                           f"with {cfg.n_layers} layers" + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    found: dict = {}
    for name, (i, key, j, part) in wanted.items():
        if name not in refs:
            if key == "lm_head" and cfg.tie_word_embeddings:
                continue
            hint = " (config.json says tie_word_embeddings is false)" if key == "lm_head" else ""
            raise MinigenError(f"{where}: missing tensor {name!r}{hint}")
        ref = refs[name]
        if tuple(ref.shape) != part:
            raise MinigenError(f"{ref.file}: tensor {name!r} has shape {list(ref.shape)}, expected {list(part)}")
        found.setdefault((i, key), {})[j] = ref
    glob, layers = {}, [{} for _ in range(cfg.n_layers)]
    for (i, key), parts in found.items():
        shape = glob_shapes[key] if i is None else layer_shapes[key]
        src = Source(tuple(parts[j] for j in sorted(parts)), shape, family.fix.get(key))
        (glob if i is None else layers[i])[key] = src
    return glob, layers


def _parts(cfg: Config, family, key: str, shape: tuple) -> list[tuple[str, tuple]]:
    """(checkpoint name template, its shape) for each part of a canonical tensor."""
    names = family.tensors.get(key)
    if names is None:
        raise MinigenError(f"{cfg.model_type}: minigen has no checkpoint name for {key!r} (a bug in families.py)")
    if isinstance(names, str):
        conv1d = family.fix.get(key) == "conv1d" and len(shape) == 2
        return [(names, shape[::-1] if conv1d else shape)]
    return [(n, (rows,) + shape[1:]) for n, rows in zip(names, row_splits(cfg, key))]


# --- canonical params ---------------------------------------------------------------------------

def load_params(path: Path, cfg: Config, family) -> dict:
    """All weights as float32 arrays: {"embed", "lm_head", "final_norm", ..., "layers": [dict, ...]}."""
    glob, layers = resolve(cfg, family, index_checkpoint(path), path)
    params = {k: _read(s, cfg, family, k) for k, s in glob.items()}
    if "lm_head" not in params:  # tied: the embedding doubles as the output projection
        params["lm_head"] = params["embed"]
    params["layers"] = [{k: _read(s, cfg, family, k) for k, s in srcs.items()} for srcs in layers]
    return params


def _read(src: Source, cfg: Config, family, key: str) -> np.ndarray:
    """One canonical tensor as float32: a single float32 part is memory-mapped; parts are read straight
    into their rows of one buffer; then the family's fix, and the norm offset."""
    if len(src.refs) == 1:
        w = read_tensor(src.refs[0])
    else:
        w = np.empty(src.shape, np.float32)
        start = 0
        for ref in src.refs:
            read_tensor(ref, w[start:start + ref.shape[0]])
            start += ref.shape[0]
    if src.fix:
        w = FIXES[src.fix](w, cfg)
    if family.norm_offset and "norm" in key and not key.endswith("_b"):
        w = w + np.float32(family.norm_offset)  # (1 + w) computed once, in float32 as HF does
    return w


def _neox_qkv(w: np.ndarray, cfg: Config) -> np.ndarray:
    """GPT-NeoX interleaves q, k, v per head: rows (H, 3, d) -> (3, H, d), our [all q; all k; all v]."""
    H, d = cfg.n_heads, cfg.head_dim
    return np.ascontiguousarray(w.reshape(H, 3, d, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape))


FIXES = {
    "conv1d": lambda w, cfg: np.ascontiguousarray(w.T),   # GPT-2's Conv1D stores (in, out)
    "neox_qkv": _neox_qkv,
}

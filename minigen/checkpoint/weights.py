"""How HF tensors become our arrays: safetensors (single or sharded), float32/float16/bfloat16,
the family's name table and tensor fixes (families.py), shape checks, tied embeddings, fused projections.

Layout convention: every projection has HF's Linear shape, `(out, in)`, and is applied as `x @ w.T`
(MATRICES). Its memory is column-major (`w.T` is C-contiguous, `(in, out)`), so that BLAS multiplies
x by w.T without a transpose: on OpenBLAS 0.3.31 (AMD EPYC, AVX2) a forward of 8 rows after 150
tokens took 86 ms against 109 with HF's row-major memory, one row 50 against 54, a 512-token prompt
1.29 s against 1.60. Except a 2-D matrix with more inputs than outputs (the MLP's down projection,
an output projection from wider heads), which stays row-major (`column_major_for`): a decode step's
GEMV then takes each output as one long dot product, in ~0.5-0.6x the time (SmolLM2's 576 x 1536
down projection 156 us against 293; 1024 x 4608, 575 against 1052; 896 x 4864, 539 against 1147),
16 rows 0.85-0.95x (once 1.10), a 512-row prompt chunk within 5 % either way. GPT-2's Conv1D
weights, stored `(in, out)`, are transposed to `(out, in)` by their fix (fixes.FIXES, which the
GGUF converter shares), then laid out.
q/k/v are fused into one `(q + 2 kv, in)` matrix and gate/up into one `(2 * inter, in)` matrix,
read into their rows of one buffer (a checkpoint that stores them fused, like Phi-3's, is read as
it is). The matrices are read, not memory-mapped, and laid out once at load (SmolLM2-135M's 538 MB
load in ~0.5 s); the other float32 tensors (norms, an untied embedding) are memory-mapped.
"""
from __future__ import annotations

import mmap
import weakref
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path, PurePosixPath

import numpy as np

from ..engine import parallel
from ..engine.config import Config
from ..engine.linear import dense
from ..engine.quant import StoredMatrix, kernels_on, stack, warm
from .families import WRAPPERS
from .fixes import FIXES
from ..errors import MinigenError, short
from ..files import MiB, open_regular, parse_json, read_json_object

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}  # BF16 read as raw 16 bits
DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
# Every dtype the safetensors format has a whole-byte size for: a header naming another is not valid.
DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8, "C64": 8}
# Limits stricter than the safetensors library's (a 100 MB header): the largest checkpoints minigen
# runs hold ~1,000 tensors in all, ~100 KB of header; a 95 MB header took 18 s to refuse.
MAX_HEADER = 4 * MiB
MAX_TENSORS = 16_384   # per file
MAX_SHARDS = 4_096     # per index (Llama 3.1 405B has 191)


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor's bytes live on disk."""
    name: str
    file: Path
    dtype: str
    shape: tuple
    start: int  # absolute byte offset in the file
    nbytes: int
    file_size: int  # the file's size when its header was read: a file changed since then is refused


# --- reading safetensors -------------------------------------------------------------------------
#
# A safetensors file is an 8-byte little-endian header length N, N bytes of JSON, then the data. The
# header is validated whole before any tensor is read, as strictly as the safetensors library does:
# each entry's dtype, shape and data_offsets of the right JSON types; offsets that, sorted, tile the
# data from 0 to its end with no gap, overlap or trailing byte; each tensor exactly shape x itemsize
# bytes; no key twice; and a size limit on the header.

def index_checkpoint(path: Path) -> dict[str, TensorRef]:
    """Every tensor of a checkpoint directory: model.safetensors, or the shards its index names."""
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.exists() or single.is_symlink():
        return read_header(single)
    if not (index.exists() or index.is_symlink()):
        raise MinigenError(f"{path}: no model.safetensors or model.safetensors.index.json")
    weight_map = read_json_object(index).get("weight_map")
    if not (isinstance(weight_map, dict) and weight_map and all(isinstance(v, str) for v in weight_map.values())):
        raise MinigenError(f"{index}: 'weight_map' should map tensor names to shard file names")
    shards = sorted(set(weight_map.values()))
    if len(shards) > MAX_SHARDS:
        raise MinigenError(f"{index}: names {len(shards):,} shard files, more than minigen reads ({MAX_SHARDS:,})")
    files = {shard: shard_file(path, shard, index) for shard in shards}
    refs: dict[str, TensorRef] = {}
    for shard, file in files.items():
        for name, ref in read_header(file).items():
            if name in refs:
                raise MinigenError(f"{file}: tensor {short(name, 80)} is also in {refs[name].file.name}")
            refs[name] = ref
    for name, shard in weight_map.items():
        if name not in refs or refs[name].file != files[shard]:
            raise MinigenError(f"{index}: tensor {short(name, 80)} is not in {short(shard, 80)}")
    return refs


def shard_file(path: Path, shard: str, index: Path) -> Path:
    """The file a weight_map entry names, which must lie inside the checkpoint directory: a relative
    path without `..`, whose directories do not lead out through a symlink. The file itself may be a
    symlink (the Hugging Face hub cache links every snapshot file to ../../blobs/<hash>)."""
    parts = PurePosixPath(shard).parts
    if not shard or "\0" in shard or PurePosixPath(shard).is_absolute() or ".." in parts or shard.endswith("/") \
            or parts in ((), (".",)):
        raise MinigenError(f"{index}: shard name {short(shard, 80)} is not a file name inside the checkpoint directory")
    file = path / shard
    root = path.resolve()
    if not (file.parent.resolve() == root or root in file.parent.resolve().parents):
        raise MinigenError(f"{index}: shard {short(shard, 80)} lies outside the checkpoint directory")
    if not (file.exists() or file.is_symlink()):
        raise MinigenError(f"{file}: shard named in {index.name} is missing")
    return file


def read_header(file: Path) -> dict[str, TensorRef]:
    """The tensors of one safetensors file, from its validated header; nothing else is read."""
    f, size = open_regular(file, "safetensors file")
    with f:
        if size < 8:
            raise MinigenError(f"{file}: truncated (no safetensors header)")
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8:
            raise MinigenError(f"{file}: corrupt or truncated safetensors file (its header length is larger "
                               f"than the file)")
        if n > MAX_HEADER:
            raise MinigenError(f"{file}: safetensors header larger than minigen reads ({MAX_HEADER // MiB} MiB; "
                               f"a checkpoint's header is ~100 KB)")
        try:
            text = f.read(n)
        except OSError as e:
            raise MinigenError(f"{file}: cannot read the safetensors header ({e.strerror or e})")
    if text.count(b'"data_offsets"') > MAX_TENSORS:  # a cheap bound before parsing: one per tensor
        raise _too_many(file)
    header = parse_json(text, f"{file}: safetensors header", constants=False, unique_keys=True)
    if not isinstance(header, dict):
        raise MinigenError(f"{file}: corrupt safetensors header (not a JSON object)")
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise MinigenError(f"{file}: corrupt safetensors header ('__metadata__' should map strings to strings)")
    if len(header) > MAX_TENSORS:
        raise _too_many(file)
    base = 8 + n
    entries = [(name, *_entry(file, name, info)) for name, info in header.items()]
    _check_tiling(file, entries, size - base)
    return {name: TensorRef(name, file, dtype, shape, base + begin, end - begin, size)
            for name, dtype, shape, begin, end in entries}


def _too_many(file: Path) -> MinigenError:
    return MinigenError(f"{file}: the safetensors header lists more tensors than minigen reads from one file "
                        f"({MAX_TENSORS:,})")


def _entry(file: Path, name: str, info) -> tuple[str, tuple, int, int]:
    """(dtype, shape, begin, end) of one header entry, each of the right type and size."""
    def bad(what: str):
        raise MinigenError(f"{file}: corrupt safetensors header (tensor {short(name, 80)}: {what})")

    if not isinstance(info, dict):
        bad("not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        bad(f"unknown dtype {short(dtype, 80)}")
    if not (isinstance(shape, list) and all(_is_index(d) for d in shape)):
        bad("'shape' should be a list of integers >= 0")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_index(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        bad("'data_offsets' should be [begin, end], integers with 0 <= begin <= end")
    count = 1
    for d in shape:  # as the library does: refuse a product past 2**64 at once (no 10**6-digit numbers)
        count *= d
        if count >= 2**64:
            bad(f"shape {short(shape, 80)} has more elements than any file can hold")
    if count * DTYPE_SIZES[dtype] != offsets[1] - offsets[0]:
        bad(f"shape {short(shape, 80)} of {dtype} does not fill its {offsets[1] - offsets[0]} bytes")
    return dtype, tuple(shape), offsets[0], offsets[1]


def _is_index(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**64


def _check_tiling(file: Path, entries: list, data_size: int):
    """Sorted by offset, the tensors must cover the data exactly: no gap, no overlap, nothing after."""
    at = 0
    for name, _, _, begin, end in sorted(entries, key=lambda e: (e[3], e[4])):
        if begin != at:
            what = "overlaps another tensor" if begin < at else "leaves a gap before it"
            raise MinigenError(f"{file}: corrupt safetensors header (tensor {short(name, 80)} {what})")
        at = end
    if at != data_size:
        what = "runs past the end of the file" if at > data_size else f"leaves {data_size - at} bytes after the last tensor"
        raise MinigenError(f"{file}: truncated or corrupt safetensors file (the data {what})")


def checkpoint_dtypes(path: Path) -> dict[str, int]:
    """How many tensors of each dtype the checkpoint's files hold, from their headers: the dtype on disk."""
    counts: dict[str, int] = {}
    for ref in index_checkpoint(path).values():
        counts[ref.dtype] = counts.get(ref.dtype, 0) + 1
    return counts


def read_tensor(ref: TensorRef, out: np.ndarray | None = None) -> np.ndarray:
    """A tensor as float32. float32 without `out` is memory-mapped (no copy); otherwise read into
    `out` (a float32 array of the tensor's size) or a new array."""
    if ref.dtype == "F32" and out is None:
        return _mapped(ref)
    if out is None:
        out = np.empty(ref.shape, np.float32)
    raw = out if ref.dtype == "F32" else np.empty(out.shape, DTYPES[ref.dtype])
    with _open(ref) as f:
        f.seek(ref.start)
        got = f.readinto(memoryview(raw.reshape(-1)).cast("B")) if raw.size else 0
    if got != ref.nbytes:
        raise MinigenError(f"{ref.file}: truncated while reading tensor {short(ref.name, 80)}")
    if ref.dtype == "BF16":  # bfloat16 is the top half of a float32: widen by shifting 16 bits
        bits = out.view(np.uint32)
        bits[...] = raw                      # no uint32 temporary: widen in place, then shift
        bits <<= 16
    elif ref.dtype == "F16":
        out[...] = raw
    return out


def read_raw(ref: TensorRef, out: np.ndarray) -> np.ndarray:
    """A tensor's bytes as stored, into `out` (an array of the tensor's size and itemsize)."""
    with _open(ref) as f:
        f.seek(ref.start)
        got = f.readinto(memoryview(out.reshape(-1)).cast("B")) if out.size else 0
    if got != ref.nbytes:
        raise MinigenError(f"{ref.file}: truncated while reading tensor {short(ref.name, 80)}")
    return out


def _open(ref: TensorRef):
    """The tensor's file, still a regular file of the size its header was read from."""
    f, size = open_regular(ref.file, "safetensors file")
    if size != ref.file_size:
        f.close()
        raise MinigenError(f"{ref.file}: changed while minigen was reading it")
    return f


_maps: "weakref.WeakValueDictionary[tuple, mmap.mmap]" = weakref.WeakValueDictionary()  # alive while arrays use them


def _mapped(ref: TensorRef) -> np.ndarray:
    # One mapping per file version: a checkpoint rewritten at the same path gets a new mapping.
    st = ref.file.stat()
    key = (str(ref.file.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    mapping = _maps.get(key)
    if mapping is None:
        with _open(ref) as f:
            mapping = _maps[key] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if len(mapping) < ref.start + ref.nbytes:
        raise MinigenError(f"{ref.file}: changed while minigen was reading it")
    count = int(np.prod(ref.shape, dtype=np.int64))
    return np.frombuffer(mapping, np.float32, count, ref.start).reshape(ref.shape)


# --- canonical tensors: shapes from the config, names from the family ------------------------------

def expected_shapes(cfg: Config) -> tuple[dict, list[dict]]:
    """(global, per-layer) canonical tensors this config has, with their shapes in minigen's layout:
    every projection (out, in), q/k/v and gate/up fused by rows. Each layer's tensors depend on its
    token mixer (attention, Gated DeltaNet, short conv, Mamba2, or attention beside Mamba2)."""
    D, V = cfg.hidden_size, cfg.vocab_size
    glob = {"embed": (V, D), "final_norm": (D,), "lm_head": (V, D)}
    if cfg.positions == "learned":
        glob["pos_embed"] = (cfg.max_position_embeddings, D)
    if cfg.norm == "layer":
        glob["final_norm_b"] = (D,)
    return glob, [layer_shapes(cfg, i) for i in range(cfg.n_layers)]


def layer_shapes(cfg: Config, i: int) -> dict:
    D, F = cfg.hidden_size, cfg.intermediate_size
    norms = (["attn_norm", "mlp_norm"] if cfg.pre_norms else []) + \
            (["attn_post_norm", "mlp_post_norm"] if cfg.post_norms else [])
    layer = {n: (D,) for n in norms}
    mixer = cfg.mixer(i)
    if "attention" in mixer:
        layer.update(attention_shapes(cfg))
    layer.update(MIXER_SHAPES.get(mixer.replace("attention+", "").replace("attention", ""), lambda c: {})(cfg))
    if cfg.mlp == "moe":  # routed experts, kept 3-D as stored, and the shared MLP beside them (Granite 4.0-H)
        E, S = cfg.n_experts, cfg.shared_intermediate_size
        layer.update(router=(E, D), experts_gate_up=(E, 2 * F, D), experts_down=(E, D, F))
        if S:
            layer.update(w_gate_up=(2 * S, D), w_down=(D, S))
    else:
        layer.update(w_down=(D, F))
        layer.update(w_gate_up=(2 * F, D)) if cfg.mlp == "gated" else layer.update(w_up=(F, D))
    if cfg.mlp_bias:
        layer.update({"b_gate_up" if cfg.mlp == "gated" else "b_up": (2 * F if cfg.mlp == "gated" else F,), "b_down": (D,)})
    if cfg.norm == "layer":
        layer.update({n + "_b": (D,) for n in norms})
    return layer


def attention_shapes(cfg: Config) -> dict:
    D, d = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.n_heads * d, cfg.n_kv_heads * d
    qkv = q + 2 * kv + (q if cfg.attn_gate else 0)   # Qwen3.5: the output gate's rows come with q
    out = {"wqkv": (qkv, D), "wo": (D, q)}
    if cfg.qk_norm:
        out.update(q_norm=(d,) if cfg.qk_norm == "head" else (q,), k_norm=(d,) if cfg.qk_norm == "head" else (kv,))
    if cfg.qkv_bias:
        out["bqkv"] = (qkv,)
    if cfg.o_bias:
        out["bo"] = (D,)
    return out


def delta_net_shapes(cfg: Config) -> dict:
    m, D = cfg.delta_net, cfg.hidden_size
    conv = 2 * m.key_heads * m.key_dim + m.value_heads * m.value_dim
    return {"w_in": (conv + m.value_heads * m.value_dim + 2 * m.value_heads, D), "conv_w": (conv, m.conv_kernel),
            "A_log": (m.value_heads,), "dt_bias": (m.value_heads,), "gate_norm": (m.value_dim,),
            "w_out": (D, m.value_heads * m.value_dim)}


def short_conv_shapes(cfg: Config) -> dict:
    m, D = cfg.short_conv, cfg.hidden_size
    out = {"w_in": (3 * D, D), "conv_w": (D, m.kernel), "w_out": (D, D)}
    if m.bias:
        out.update(b_in=(3 * D,), conv_b=(D,), b_out=(D,))
    return out


def mamba_shapes(cfg: Config) -> dict:
    m, D = cfg.mamba, cfg.hidden_size
    I, GN, H = m.inner, m.groups * m.state_size, m.heads
    out = {"w_in": (2 * I + 2 * GN + H, D), "conv_w": (I + 2 * GN, m.conv_kernel), "A_log": (H,), "D": (H,),
           "dt_bias": (H,), "w_out": (D, I)}
    if m.conv_bias:
        out["conv_b"] = (I + 2 * GN,)
    if m.norm:
        out["gate_norm"] = (I,)
    if m.in_bias:
        out["b_in"] = (2 * I + 2 * GN + H,)
    if m.out_bias:
        out["b_out"] = (D,)
    return out


MIXER_SHAPES = {"gated_delta": delta_net_shapes, "short_conv": short_conv_shapes, "mamba2": mamba_shapes}


def row_splits(cfg: Config, name: str) -> list[int]:
    """How a fused canonical tensor's rows split into the checkpoint's separate tensors."""
    d, F = cfg.head_dim, cfg.intermediate_size
    if name in ("wqkv", "bqkv"):
        return [cfg.n_heads * d * (2 if cfg.attn_gate else 1), cfg.n_kv_heads * d, cfg.n_kv_heads * d]
    if name == "w_in":  # Gated DeltaNet: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
        m = cfg.delta_net
        return [2 * m.key_heads * m.key_dim + m.value_heads * m.value_dim, m.value_heads * m.value_dim,
                m.value_heads, m.value_heads]
    if cfg.mlp == "moe":  # the shared MLP's gate and up (the experts' are one tensor)
        F = cfg.shared_intermediate_size
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
    refs = {k: r for k, r in refs.items() if not k.startswith(family.skipped)} if family.skipped else refs
    if cfg.wrapper:
        refs = text_part(cfg.wrapper, refs)
    glob_shapes, layer_shapes = expected_shapes(cfg)
    _check_layer_count(cfg, family, layer_shapes, len(refs), where)
    drop = {t.format(i) for t in family.ignored for i in range(cfg.n_layers)}
    wanted = {}  # checkpoint name -> (layer or None, canonical, part index, part shape)
    plan = [(None, k, s) for k, s in glob_shapes.items()] + \
           [(i, k, s) for i in range(cfg.n_layers) for k, s in layer_shapes[i].items()]
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
        if ref.dtype not in DTYPES:
            raise MinigenError(f"{ref.file}: tensor {name!r} has dtype {ref.dtype}; minigen reads F32, F16 and BF16")
        found.setdefault((i, key), {})[j] = ref
    glob, layers = {}, [{} for _ in range(cfg.n_layers)]
    for (i, key), parts in found.items():
        shape = glob_shapes[key] if i is None else layer_shapes[i][key]
        src = Source(tuple(parts[j] for j in sorted(parts)), shape, family.fix.get(key))
        (glob if i is None else layers[i])[key] = src
    return glob, layers


def text_part(wrapper: str, refs: dict[str, TensorRef]) -> dict[str, TensorRef]:
    """A multimodal checkpoint's language-model tensors under the text family's names (either layout);
    the vision tower's and projector's tensors are left out, unread."""
    w = WRAPPERS[wrapper]
    out = {}
    for name, ref in refs.items():
        if name.startswith(w.vision + w.ignored):
            continue
        new = next((to + name[len(old):] for old, to in w.renames if name.startswith(old)), name)
        if new in out:
            raise MinigenError(f"{ref.file}: tensors {short(name, 80)} and {short(out[new].name, 80)} are both the "
                               f"language model's {short(new, 80)} (two layouts in one checkpoint)")
        out[new] = ref
    return out


def vision_tensors(wrapper: str, refs: dict[str, TensorRef]) -> list[TensorRef]:
    """The tensors of a multimodal checkpoint that minigen does not read (vision tower, projector)."""
    return [r for n, r in refs.items() if n.startswith(WRAPPERS[wrapper].vision)] if wrapper else []


def _check_layer_count(cfg: Config, family, layer_shapes: list, n_tensors: int, where: Path):
    """Refuse a layer count the checkpoint cannot hold before anything is built per layer: each layer
    has at least this many tensors, so 10**12 layers fail here, not in a MemoryError."""
    per_layer = min(sum(len(_parts(cfg, family, k, s)) for k, s in shapes.items())
                    for shapes in {cfg.mixer(i): layer_shapes[i] for i in range(cfg.n_layers)}.values())
    if cfg.n_layers * per_layer > n_tensors:
        raise MinigenError(f"{where}: config.json says {cfg.n_layers} layers, but the checkpoint holds only "
                           f"{n_tensors} tensors, enough for at most {n_tensors // per_layer}")


def _parts(cfg: Config, family, key: str, shape: tuple) -> list[tuple[str, tuple]]:
    """(checkpoint name template, its shape) for each part of a canonical tensor."""
    names = family.tensors.get(key)
    if names is None:
        raise MinigenError(f"{cfg.model_type}: minigen has no checkpoint name for {key!r} (a bug in families.py)")
    if isinstance(names, str):
        fix = family.fix.get(key)
        if fix == "depthwise":  # torch's Conv1d(groups=C) weight: (C, 1, K)
            return [(names, (shape[0], 1, shape[1]))]
        return [(names, shape[::-1] if fix == "conv1d" and len(shape) == 2 else shape)]
    return [(n, (rows,) + shape[1:]) for n, rows in zip(names, row_splits(cfg, key))]


# --- canonical params ---------------------------------------------------------------------------

def load_params(path: Path, cfg: Config, family, dtype: str | None = None, int8: bool = False) -> dict:
    """All weights: {"embed", "lm_head", "final_norm", ..., "layers": [dict, ...]}. float32 arrays, except
    that (dtype None) a matrix or embedding stored in float16 or bfloat16 is kept in its 16 bits, a
    StoredMatrix (KEPT: half the memory, and a decode step reads half the bytes); dtype "float32":
    every tensor as float32, as before weights were kept stored. The kept types' kernels load from numba's
    cache meanwhile (quant.warm; int8 as there)."""
    if dtype not in (None, "float32"):
        raise MinigenError(f"--dtype {dtype}: minigen loads a checkpoint as stored or as float32 (--dtype float32)")
    glob, layers = resolve(cfg, family, index_checkpoint(path), path)
    tied = "lm_head" not in glob   # the embedding doubles as the output projection: one array, laid out as it
    keep = dtype is None and kernels_on()
    if keep:
        srcs = [s for k, s in glob.items() if k in KEPT] + [s for ls in layers for k, s in ls.items() if k in KEPT]
        warm({r.dtype for s in srcs for r in s.refs} & {"F16", "BF16"}, int8)
    params = {k: _load(s, cfg, family, k, k in MATRICES or (tied and k == "embed"), keep) for k, s in glob.items()}
    if tied:
        params["lm_head"] = params["embed"]
    params["layers"] = [scaled({k: _load(s, cfg, family, k, k in MATRICES, keep) for k, s in srcs.items()}, cfg)
                        for srcs in layers]
    return params


# What may be kept in a stored type (16 bits here, a GGUF's own in gguf/direct.py, --quantize's in stored.py):
# the projections and the embedding; not the MoE router, a few rows whose products decide routing (float32,
# as llama.cpp keeps ffn_gate_inp)
KEPT = {"embed", "lm_head", "wqkv", "wo", "w_gate_up", "w_down", "w_up", "w_in", "w_out",
        "experts_gate_up", "experts_down"}
# fixes that only reorder a matrix's rows or transpose it: they act on 16-bit values as on float32 ones
# (the others, on vectors and convolutions, never meet a kept matrix)
FIXES_16 = {None, "conv1d", "neox_qkv", "gated_q"}


def _load(src: Source, cfg: Config, family, key: str, matrix: bool, keep: bool):
    """One canonical tensor: a StoredMatrix (or a list of them, experts) when `keep` and it is a KEPT
    tensor whose parts are all float16 or all bfloat16, else float32 (_read)."""
    dtypes = {r.dtype for r in src.refs}
    if not (keep and key in KEPT and len(dtypes) == 1 and dtypes <= {"F16", "BF16"} and src.fix in FIXES_16):
        return _read(src, cfg, family, key, matrix)
    type = dtypes.pop()
    w = np.empty(src.shape, DTYPES[type])                                   # (out, in) or (E, out, in), 16 bits
    start = 0
    for ref in src.refs:
        read_raw(ref, w[start:start + ref.shape[0]] if len(src.refs) > 1 else w.reshape(ref.shape))
        start += ref.shape[0]
    if src.fix:
        w = FIXES[src.fix](w.reshape(src.refs[0].shape) if len(src.refs) == 1 else w, cfg)
    name = src.refs[0].name
    if w.ndim == 3:
        return stack([StoredMatrix.from_bytes(e.view(np.uint8), type, e.shape, f"{name}[{i}]") for i, e in enumerate(w)])
    return StoredMatrix.from_bytes(np.ascontiguousarray(w).view(np.uint8), type, w.shape, name)


BIASES = {"wqkv": "bqkv", "wo": "bo", "w_in": "b_in", "w_out": "b_out", "w_gate_up": "b_gate_up", "w_down": "b_down"}


def scaled(layer: dict, cfg: Config) -> dict:
    """A layer's tensors with cfg.weight_scales applied: rows start..stop of a weight (and of its bias,
    when the factor scales the output rather than the input) times a factor, so that the forward pass
    needs no multipliers of its own (Falcon-H1's µP multipliers on projections' inputs and outputs)."""
    for key, start, stop, factor, bias in cfg.weight_scales:
        for name in (key, BIASES[key]) if bias else (key,):
            if name in layer:
                # a column-major matrix stays one; a kept one becomes float32 (scaled rows are not its
                # type's values any more), laid out as a float32 matrix is
                w = layer[name].copy(order="K") if isinstance(layer[name], np.ndarray) else laid_out(dense(layer[name]))
                w[start:stop] *= np.float32(factor)
                layer[name] = w
    return layer


def _read(src: Source, cfg: Config, family, key: str, matrix: bool) -> np.ndarray:
    """One canonical tensor as float32: a single float32 part is memory-mapped unless it is a `matrix`
    (read, then laid out as `column_major_for` says); parts are read straight into their rows of one
    buffer; then the family's fix, the norm offset, and a matrix's layout."""
    column = matrix and column_major_for(src.shape)
    if column and not src.fix:
        return _read_column_major(src)
    if len(src.refs) == 1:
        ref = src.refs[0]
        w = read_tensor(ref, np.empty(ref.shape, np.float32) if matrix else None)
    else:
        w = np.empty(src.shape, np.float32)
        start = 0
        for ref in src.refs:
            read_tensor(ref, w[start:start + ref.shape[0]])
            start += ref.shape[0]
    if src.fix:
        w = FIXES[src.fix](w, cfg)
    if family.norm_offset and "norm" in key and not key.endswith("_b") and key not in family.plain_norms:
        w = w + np.float32(family.norm_offset)  # (1 + w) computed once, in float32 as HF does
    return column_major(w) if column else np.ascontiguousarray(w) if matrix else w


# What a forward pass applies as x @ w.T (with the lm_head, and a tied embedding): read, and laid out.
MATRICES = {"lm_head", "wqkv", "wo", "w_gate_up", "w_down", "w_up", "w_in", "w_out", "router",
            "experts_gate_up", "experts_down"}


def laid_out(w: np.ndarray) -> np.ndarray:
    """A float32 matrix (or stack) in a loaded matrix's layout, a copy."""
    return column_major(w) if column_major_for(w.shape) else np.ascontiguousarray(w)


def column_major_for(shape: tuple) -> bool:
    """Whether a matrix of `shape` (..., out, in) is kept column-major: all but a 2-D one with more
    inputs than outputs (see the module's docstring; stacks of experts were not measured: column-major)."""
    return not (len(shape) == 2 and shape[1] > shape[0])


LAYOUT_BLOCK = 1 << 19   # elements per block of rows copied: the block's source and target stay in cache


def _read_column_major(src: Source) -> np.ndarray:
    """A matrix's parts read a block of rows at a time, each block into a small buffer and laid out
    into its rows of the column-major result while it is still in cache: no whole row-major copy.
    The blocks go in as many runs as there are threads (parallel.in_threads), one buffer each."""
    out = empty_column_major(src.shape)                                      # (..., out, in)
    row_size = int(np.prod(src.shape[1:], dtype=np.int64))
    step = max(1, LAYOUT_BLOCK // row_size)
    blocks, row = [], 0   # (the part, its first row, the result's first row, rows)
    for ref in src.refs:
        blocks += [(ref, start, row + start, min(step, ref.shape[0] - start)) for start in range(0, ref.shape[0], step)]
        row += ref.shape[0]

    def run(todo: list):
        buffer = np.empty(step * row_size, np.float32)
        for ref, start, at, n in todo:
            row_bytes = ref.nbytes // ref.shape[0]
            piece = replace(ref, shape=(n,) + ref.shape[1:], start=ref.start + start * row_bytes, nbytes=n * row_bytes)
            out[at:at + n] = read_tensor(piece, buffer[:n * row_size].reshape(piece.shape))

    threads = min(parallel.n_threads(), len(blocks))
    parallel.in_threads([partial(run, blocks[i::threads]) for i in range(threads)], threads)
    return out


def column_major(w: np.ndarray) -> np.ndarray:
    """w (..., out, in) with the same values and its last two axes in column-major memory, so that
    w.T, or w[e].T for a stack of experts, is C-contiguous. Copied a block of rows at a time; w itself
    when it is laid out so already."""
    if w.swapaxes(-1, -2).flags.c_contiguous:
        return w
    out = empty_column_major(w.shape)                                        # (..., out, in)
    rows = max(1, LAYOUT_BLOCK // (w.shape[-1] * int(np.prod(w.shape[:-2], dtype=np.int64))))
    for r in range(0, w.shape[-2], rows):
        out[..., r:r + rows, :] = w[..., r:r + rows, :]
    return out


def empty_column_major(shape: tuple) -> np.ndarray:
    """An uninitialised float32 array of `shape` (..., out, in) whose last two axes are column-major."""
    return np.empty(tuple(shape[:-2]) + (shape[-1], shape[-2]), np.float32).swapaxes(-1, -2)

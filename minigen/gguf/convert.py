"""GGUF -> a Hugging Face checkpoint directory (config, safetensors, tokenizer) that minigen and transformers load.

Every GGUF architecture whose family minigen runs (each family's entry in gguf/families.py: llama,
qwen2, qwen3, gemma, gemma2, gemma3, phi3, gpt2, olmo2 (OLMo 2 and 3), gptneox, smollm3, granite, granitemoe,
mistral3, and the hybrids qwen35, lfm2, granitehybrid, falcon-h1), every tensor type the `gguf` package dequantises. The steps:
  1. read the metadata and the tensor directory, and check everything before writing anything: the architecture,
     the layer count against the tensors, every tensor's name (via the gguf package's name table), type, shape
     and extent in the file, token ids, and the resulting config.json through minigen's own config reader;
  2. stream each tensor: read a block of rows from the file, dequantise it, undo what llama.cpp's converter did
     (the family's fixes: Q/K permutation, Gemma's 1 + w norms, GPT-2's transposes, GPT-NeoX's qkv order, the
     recurrent layers' -exp(A_log), squeezed convs and Qwen3.5's tiled value heads; split tensors joined), check it is
     finite, cast it and append it to model.safetensors. Only one block of rows (or, for the small tensors a fix
     reorders, one tensor) is in memory at a time; the GGUF is read with plain reads, not memory-mapped.
     The tokenizer files are rebuilt by gguf_tokenizer (SentencePiece and byte-level BPE, as llama.cpp tokenises);
  3. write it all into a temporary directory next to OUT_DIR and rename that into place only when complete.
"""
from __future__ import annotations

import dataclasses
import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import ContextManager, Protocol

import numpy as np

from . import arch as archs
from ..checkpoint.config import parse_config
from ..checkpoint.families import FAMILIES
from ..checkpoint.fixes import FIXES
from ..checkpoint.weights import TensorRef, resolve
from ..errors import MinigenError, first_line, is_int, short
from ..files import atomic_dir, open_regular
from .vocab import special_ids, tokenizer_files

DTYPES = ("float32", "bfloat16", "float16")
_ST_DTYPE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}  # safetensors header names
_CHUNK = 1 << 22  # elements per block of rows streamed through dequantisation (16 MB of float32)
_EXTRAS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")  # read into config.json


@dataclass
class Result:
    out_dir: Path
    n_tensors: int
    n_params: int
    nbytes: int  # size of model.safetensors


@dataclass
class _Tensor:
    """One GGUF tensor and where it goes."""
    gguf_name: str
    name: str           # HF name
    qtype: object       # gguf.GGMLQuantizationType
    rows: int           # GGUF rows (1 for a vector) of `cols` values each
    cols: int
    offset: int         # absolute byte offset in the GGUF file
    row_bytes: int
    shape: tuple        # HF shape
    fix: str | None = None     # a fixes.FIXES name, on the whole tensor
    offset_norm: float = 0.0   # subtracted (Gemma's 1 + w norms)
    up: "_Tensor | None" = None  # the second of two tensors llama.cpp split this one into, written after it
    #                            (per expert: GraniteMoE's ffn_gate_exps + ffn_up_exps; Granite 4.0-H's
    #                            ffn_gate + ffn_up, or ffn_gate_shexp + ffn_up_shexp beside experts)
    vector: bool = False       # one-dimensional in the GGUF

    @property
    def size(self) -> int:
        return self.rows * self.cols + (self.up.size if self.up else 0)


@dataclass
class Plan:
    """Everything a conversion writes, checked: config.json, generation_config.json, tokenizer files, tensors."""
    source: Path
    arch: str
    config: dict
    generation: dict
    tokenizer_files: dict
    tensors: list = field(default_factory=list)
    model_config: object = None  # config.json through minigen's reader (an engine Config): what the fixes need

    @property
    def n_params(self) -> int:
        return sum(t.size for t in self.tensors)


class Progress(Protocol):
    """A progress bar the caller gives (the CLI: click.progressbar on a terminal): called as
    `with progress(label, total) as bar: bar.update(n)`, counting values written."""

    def __call__(self, label: str, total: int) -> ContextManager: ...


def convert_gguf(source: str | Path, out_dir: str | Path, dtype: str = "float32", progress: Progress | None = None,
                 extra_files: dict[str, str] | None = None, plan: Plan | None = None) -> Result:
    """Convert SOURCE (a GGUF file) into OUT_DIR, which must not exist or be empty; `extra_files` ({name: text})
    are written beside the checkpoint's own; `plan`: read_plan(SOURCE), when the caller has it already;
    `progress`: a progress bar to drive (none when None or False)."""
    source, out_dir = Path(source), Path(out_dir)
    if dtype not in DTYPES:
        raise MinigenError(f"--dtype {dtype}: not one of {', '.join(DTYPES)}")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise MinigenError(f"{out_dir}: already exists and is not an empty directory; choose a new OUT_DIR")
    plan = plan or read_plan(source)
    config = dict(plan.config, torch_dtype=dtype, dtype=dtype)
    with atomic_dir(out_dir) as tmp:
        nbytes = _write_safetensors(tmp / "model.safetensors", plan, dtype, progress)
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", plan.generation)
        for name, text in {**plan.tokenizer_files, **(extra_files or {})}.items():
            (tmp / name).write_text(text, encoding="utf-8")
    return Result(out_dir, len(plan.tensors), plan.n_params, nbytes)


def read_plan(source: str | Path, tokenizer: bool = True) -> Plan:
    """Read and check a GGUF's metadata and tensor directory (no tensor data): what converting it would write.
    tokenizer=False leaves the tokenizer files out (tokenizer_files {}: a GGUF run as stored whose files are
    made already; building Qwen's 151k-token tokenizer.json is most of a plan's time)."""
    source = Path(source)
    meta, infos = _read_header(source)
    arch = meta.get("general.architecture")
    if arch == "clip" or meta.get("general.type") == "mmproj":
        raise MinigenError(f"{source}: this is a multimodal projector (mmproj) file: the vision tower and projector "
                           f"of a multimodal model, which minigen does not run; convert the text model's GGUF beside it")
    if arch not in archs.ARCHS:
        known = ", ".join(sorted(archs.ARCHS))
        raise MinigenError(f"{source}: architecture {arch!r} is not supported (minigen converts {known})")
    m = archs.Meta(meta, arch, source)
    _check_layers(m, infos)
    n_layers = m.layers()  # without the multi-token-prediction blocks, whose tensors are not converted
    infos = {name: info for name, info in infos.items() if _block(name) is None or _block(name) < n_layers}
    tensors, extras = _map_tensors(arch, infos, n_layers, source)
    config = _config(arch, m, infos, extras)
    model_config = _check_against_minigen(arch, config, tensors, source)
    return Plan(source, arch, config, _generation_config(config, special_ids(meta, source)),
                tokenizer_files(meta, source) if tokenizer else {}, tensors, model_config)


def _block(name: str) -> int | None:
    """3 for 'blk.3.attn_q.weight'; None for a global tensor."""
    b = re.match(r"blk\.(\d+)\.", name)
    return int(b.group(1)) if b else None


# --- reading -----------------------------------------------------------------------------------
#
# Our own reader of the GGUF header (magic, version, counts, key/value metadata, tensor directory) rather than
# gguf.GGUFReader: that one builds an object per vocabulary entry (3 s for SmolLM2's 49k tokens and merges, ~10 s
# for Qwen's 151k), and on a damaged file it cannot say which key was being read. Tensor data is not touched here.

_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
            12: "<f8"}  # GGUF value types; 7 is bool, 8 string, 9 array
_STRING, _ARRAY, _BOOL = 8, 9, 7
_STRUCTS = {fmt: struct.Struct("<" + code) for fmt, code in
            {"<u1": "B", "<i1": "b", "<u2": "H", "<i2": "h", "<u4": "I", "<i4": "i", "<f4": "f", "<u8": "Q",
             "<i8": "q", "<f8": "d"}.items()}


@dataclass(frozen=True)
class _Info:
    name: str
    qtype: object      # gguf.GGMLQuantizationType
    dims: tuple        # GGUF order: innermost (columns) first
    offset: int        # absolute, in the file


def _read_header(source: Path) -> tuple[dict, dict[str, _Info]]:
    """(metadata {key: value}, tensor directory {name: _Info}) of a GGUF file."""
    import mmap

    f, _ = open_regular(source, "GGUF file")  # names a directory, a FIFO, a device... found instead
    try:
        with f:
            if f.read(4) != b"GGUF":
                raise MinigenError(f"{source}: not a GGUF file (it does not start with the GGUF magic)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return _Header(mm, source).read()
    except OSError as e:
        raise MinigenError(f"{source}: cannot read it ({e.strerror or e})")


class _Header:
    """A cursor over the header bytes; every read checks it stays inside the file and names what it was reading."""

    def __init__(self, buf, source: Path):
        self.buf, self.pos, self.source, self.what = buf, 4, source, "the header"

    def read(self) -> tuple[dict, dict]:
        version = self.scalar("<u4")
        if version not in (2, 3):
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if swapped in (2, 3):
                raise MinigenError(f"{self.source}: a big-endian GGUF file; minigen reads little-endian ones")
            raise MinigenError(f"{self.source}: GGUF version {version} is not supported (minigen reads 2 and 3)")
        n_tensors, n_kv = self.scalar("<u8"), self.scalar("<u8")
        self.fits(n_kv * 13 + n_tensors * 24, f"{n_kv} metadata keys and {n_tensors} tensors")
        meta = {}
        for i in range(n_kv):
            self.what = f"metadata key #{i}"
            key = self.name()
            self.what = f"metadata key {key}"
            if key in meta:
                self.fail("appears twice")
            meta[key] = self.value(self.scalar("<u4"))
        infos = [self.tensor_info(i) for i in range(n_tensors)]
        align = meta.get("general.alignment", 32)
        if not (isinstance(align, int) and 0 < align <= 1 << 20 and align & (align - 1) == 0):
            raise MinigenError(f"{self.source}: metadata key general.alignment should be a power of two, got {align!r}")
        data = self.pos + (-self.pos % align)
        self.check_offsets(infos, align, len(self.buf) - data)
        out = {}
        for name, qtype, dims, offset in infos:
            if name in out:
                raise MinigenError(f"{self.source}: tensor {name} appears twice")
            out[name] = _Info(name, qtype, dims, data + offset)
        return meta, out

    def tensor_info(self, i: int):
        from gguf import GGMLQuantizationType

        self.what = f"tensor #{i}"
        name = self.name()
        self.what = f"tensor {name}"
        n_dims = self.scalar("<u4")
        if not 1 <= n_dims <= 4:
            self.fail(f"has {n_dims} dimensions")
        dims = tuple(self.scalar("<u8") for _ in range(n_dims))
        kind, offset = self.scalar("<u4"), self.scalar("<u8")
        try:
            qtype = GGMLQuantizationType(kind)
        except ValueError:
            self.fail(f"has an unknown tensor type {kind}")
        return name, qtype, dims, offset

    def check_offsets(self, infos: list, align: int, room: int) -> None:
        """Tensor data laid out as llama.cpp writes it and its loader insists: in directory order, each tensor
        at the running offset, padded to the alignment. A changed type, shape or offset then cannot make a
        tensor read another's bytes or the file's gaps. Stops at a tensor whose size cannot be computed
        (unknown to gguf, or rows not a whole number of blocks): _layout names what is wrong with it."""
        import gguf

        expected = 0
        for name, qtype, dims, offset in infos:
            if offset != expected:
                raise MinigenError(f"{self.source}: tensor {name} starts at byte {offset} of the data, expected "
                                   f"{expected} (tensors follow each other, padded to {align} bytes)")
            block, type_size = gguf.GGML_QUANT_SIZES.get(qtype, (0, 0))
            if not block or any(d < 1 for d in dims) or dims[0] % block:
                return
            end = offset + int(np.prod(dims, dtype=object)) // block * type_size
            if end > room:
                raise MinigenError(f"{self.source}: truncated file: tensor {name} runs past the end of the file")
            expected = end + (-end % align)

    def name(self) -> str:
        """A metadata key or tensor name: printable text of at most 256 characters (llama.cpp allows 63 for
        tensors), so that an error quoting it stays one readable line."""
        text = self.string()
        if not text or len(text) > 256 or not text.isprintable():
            self.fail(f"has a name that is not a short line of printable text ({short(text)})")
        return text

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("<u4"), self.scalar("<u8")
            if item == _STRING:
                self.fits(count * 8, f"an array of {count} strings")
                return self.strings(count)
            if item not in _SCALARS:
                self.fail(f"is an array of unknown value type {item}")
            dtype = np.dtype(_SCALARS[item])
            self.fits(count * dtype.itemsize, f"an array of {count} values")
            values = np.frombuffer(self.buf, dtype, count, self.pos)
            self.pos += count * dtype.itemsize
            return [bool(v) for v in values] if item == _BOOL else values.tolist()
        if kind not in _SCALARS:
            self.fail(f"has an unknown value type {kind}")
        v = self.scalar(_SCALARS[kind])
        return bool(v) if kind == _BOOL else v

    def scalar(self, fmt: str):
        unpack = _STRUCTS[fmt]
        self.fits(unpack.size, "a value")
        v = unpack.unpack_from(self.buf, self.pos)[0]
        self.pos += unpack.size
        return v

    def strings(self, count: int) -> list[str]:
        """An array of `count` strings, as `string` reads one (a vocabulary's 150,000 tokens and as many merges:
        a loop without a call per string, 0.4 s faster for Qwen2.5's)."""
        buf, pos, end, size = self.buf, self.pos, len(self.buf), _STRUCTS["<u8"].unpack_from
        out = [b""] * count
        for i in range(count):
            if pos + 8 > end:
                break
            n = size(buf, pos)[0]
            if pos + 8 + n > end:
                break
            out[i] = buf[pos + 8:pos + 8 + n]
            pos += 8 + n
        else:
            self.pos = pos
            try:
                return [raw.decode("utf-8") for raw in out]
            except UnicodeDecodeError:
                self.fail("holds a string that is not UTF-8")
        self.pos = pos
        return [self.string()]   # the read past the end: its error names what it was reading

    def string(self) -> str:
        n = self.scalar("<u8")
        self.fits(n, f"a string of {n} bytes")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail("holds a string that is not UTF-8")

    def fits(self, n: int, what: str) -> None:
        if self.pos + n > len(self.buf):
            raise MinigenError(f"{self.source}: truncated or damaged file: {self.what} says {what}, past the end "
                               f"of the file")

    def fail(self, why: str):
        raise MinigenError(f"{self.source}: {self.what} {why}")


def _check_layers(m: archs.Meta, infos: dict) -> int:
    """block_count must match the blk.N tensors: checked before anything loops over layers."""
    n = m.int("block_count")
    blocks = {int(b) for b in (re.match(r"blk\.(\d+)\.", name) for name in infos) if b for b in [b.group(1)]}
    have = max(blocks) + 1 if blocks else 0
    if n != have or len(blocks) != have:
        m.fail("block_count", f"says {n} layers, but the file has tensors for {len(blocks)} "
                              f"(blk.0 to blk.{have - 1})" if blocks else f"says {n} layers, but the file has no "
                                                                          f"blk.N tensors")
    return n


def _map_tensors(arch: str, infos: dict, n_layers: int, source: Path) -> tuple[list[_Tensor], dict]:
    """Each GGUF tensor -> its HF name and shape; the rope factor tensors aside. Fails naming the first tensor
    that has no HF name, an unsupported type, more than two dimensions, or bytes past the end of the file."""
    family = archs.family_of(arch)
    names = archs.tensor_names(arch, family, n_layers)
    size = source.stat().st_size
    tensors, extras, seconds, held = [], {}, {}, {}
    for info in infos.values():
        row_bytes, rows, cols = _layout(info, size, source)
        if info.name in _EXTRAS:
            extras[info.name] = (info, row_bytes)
            continue
        if len(info.dims) == 3:  # routed experts (E, rows, cols): gate and up are joined below
            tensors.append(_experts_tensor(info, names, rows, cols, row_bytes, archs.ARCHS[arch], source))
            up = archs.kind(info.name) == "ffn_up_exps"
            _claim(held, tensors[-1], up, source)
            if up:
                seconds[tensors[-1].name] = tensors.pop()
            continue
        hf, key, part = names.get(info.name, (None, None, 0))
        if hf is None:
            raise MinigenError(f"{source}: tensor {info.name} has no Hugging Face {archs.ARCHS[arch]} equivalent; "
                               f"cannot convert")
        fix = archs.fix_of(arch, info.name)
        if fix == "conv1d" and len(info.dims) == 1:
            fix = None  # GPT-2's biases are not transposed
        shape = archs.fixed_shape(fix, (cols,) if len(info.dims) == 1 else (rows, cols))
        norm = family.norm_offset if "norm" in key and not key.endswith("_b") and key not in family.plain_norms else 0.0
        t = _Tensor(info.name, hf, info.qtype, rows, cols, info.offset, row_bytes, shape, fix, norm,
                    vector=len(info.dims) == 1)
        _claim(held, t, part, source)
        if part:
            seconds[hf] = t
        else:
            tensors.append(t)
    firsts = {hf for hf, key, part in names.values() if part} | \
        {t.name for t in tensors if archs.kind(t.gguf_name) == "ffn_gate_exps"}
    return _join(tensors, seconds, firsts, source), extras


def _claim(held: dict, t: _Tensor, part: int, source: Path) -> None:
    """Each HF tensor (or each part of one that llama.cpp split) comes from one GGUF tensor: a file holding two
    alternatives of it (Granite 4.0-H's ffn_down and ffn_down_shexp) is refused."""
    first = held.setdefault((t.name, part), t.gguf_name)
    if first != t.gguf_name:
        raise MinigenError(f"{source}: tensors {first} and {t.gguf_name} would both become the Hugging Face tensor "
                           f"{t.name} (a file holds one or the other); cannot convert")


def _experts_tensor(info, names: dict, rows: int, cols: int, row_bytes: int, model_type: str,
                    source: Path) -> _Tensor:
    """A 3-D experts tensor (GGUF dims cols, rows, E) in HF's (E, rows, cols). llama.cpp splits GraniteMoE's
    input_linear (E, 2F, D) into ffn_gate_exps and ffn_up_exps: both take input_linear's name here, and the up
    half joins the gate in _join."""
    kind = archs.kind(info.name)
    hf = names.get(info.name, (None,))[0]
    if kind in ("ffn_gate_exps", "ffn_up_exps"):  # the gguf package maps no HF name to these halves
        template = FAMILIES[model_type].tensors.get("experts_gate_up")
        hf = template and template.format(info.name.split(".")[1])
    if hf is None or kind not in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
        raise MinigenError(f"{source}: tensor {info.name} has no Hugging Face {model_type} equivalent; "
                           f"cannot convert")
    E = info.dims[2]
    return _Tensor(info.name, hf, info.qtype, rows * E, cols, info.offset, row_bytes, (E, rows, cols))


def _join(tensors: list, seconds: dict, firsts: set, source: Path) -> list:
    """Each tensor llama.cpp split in two joined again (`firsts`: the HF names of those), its second half from
    `seconds` (by HF name): one HF tensor, rows [first; second], per expert for experts ((E, 2F, D))."""
    out = []
    for t in tensors:
        if t.name in firsts:
            up = seconds.pop(t.name, None)
            if up is None or up.shape != t.shape:
                raise MinigenError(f"{source}: tensor {t.gguf_name} has no {_second_of(t.gguf_name)} of its shape "
                                   f"beside it; cannot convert")
            shape = (t.shape[0], 2 * t.shape[1], t.shape[2]) if len(t.shape) == 3 else (2 * t.shape[0], *t.shape[1:])
            t = dataclasses.replace(t, shape=shape, up=up)
        out.append(t)
    if seconds:
        lone = next(iter(seconds.values())).gguf_name
        raise MinigenError(f"{source}: tensor {lone} has no {_first_of(lone)} beside it; cannot convert")
    return out


def _second_of(name: str) -> str:
    """ffn_gate -> ffn_up, ffn_gate_exps -> ffn_up_exps, ffn_gate_shexp -> ffn_up_shexp."""
    return archs.kind(name).replace("gate", "up", 1)


def _first_of(name: str) -> str:
    return archs.kind(name).replace("up", "gate", 1)


def _layout(info: _Info, file_size: int, source: Path) -> tuple[int, int, int]:
    """(bytes per row, rows, columns) of a tensor, after checking its type, rank and extent."""
    import gguf

    qtype = info.qtype
    if qtype not in _supported_types():
        names = ", ".join(t.name for t in sorted(_supported_types(), key=lambda t: t.value))
        raise MinigenError(f"{source}: tensor {info.name} has quantisation type {qtype.name}, which is not supported "
                           f"(supported: {names})")
    experts = len(info.dims) == 3 and archs.kind(info.name).endswith("_exps")  # (E, rows, cols): routed experts
    if not (1 <= len(info.dims) <= 2 or experts) or any(d < 1 for d in info.dims):
        raise MinigenError(f"{source}: tensor {info.name} has shape {list(info.dims)}; minigen converts vectors, "
                           f"matrices and routed experts' stacks")
    cols, rows = info.dims[0], (info.dims[1] if len(info.dims) >= 2 else 1)
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if cols % block:
        raise MinigenError(f"{source}: tensor {info.name} has rows of {cols} values, not a whole number of "
                           f"{qtype.name} blocks of {block}")
    row_bytes = cols // block * type_size
    if info.offset + rows * (info.dims[2] if experts else 1) * row_bytes > file_size:
        raise MinigenError(f"{source}: truncated file: tensor {info.name} runs past the end of the file")
    return row_bytes, rows, cols


def _supported_types() -> set:
    """F32, F16 and every type gguf.quants can dequantise (BF16, Q4_0 ... Q8_0, the K and I quants, ...)."""
    from gguf import GGMLQuantizationType as Q, quants

    return {Q.F32, Q.F16} | set(quants._type_traits)


# --- config ------------------------------------------------------------------------------------


def _config(arch: str, m: archs.Meta, infos: dict, extras: dict) -> dict:
    shapes = {name: info.dims for name, info in infos.items()}
    config = archs.family_config(arch, m, archs.Tensors(shapes))
    _rope_from_tensors(arch, config, m, extras)
    config.update(_token_ids(m, config["vocab_size"]))
    return config


def _rope_from_tensors(arch: str, config: dict, m: archs.Meta, extras: dict) -> None:
    """Llama 3's rope_freqs and Phi-3's longrope factors -> config.json's rope_scaling, for the families whose
    entry says llama.cpp writes them (`Gguf.rope_factors`); such a tensor in another family's file is refused."""
    head_dim = config.get("head_dim")
    rope_dims = int(round(head_dim * config.get("partial_rotary_factor", 1.0))) if head_dim else 0
    kind = archs.gguf_of(arch).rope_factors
    if "rope_freqs.weight" in extras and kind == "llama3":
        factors = _read_vector(m.source, *extras.pop("rope_freqs.weight"))
        if config.get("rope_scaling"):
            raise MinigenError(f"{m.source}: both rope_freqs.weight and rope.scaling.type; cannot tell which applies")
        config["rope_scaling"] = archs.llama3_rope(factors, config["rope_theta"], rope_dims, m.source)
    short, long = extras.pop("rope_factors_short.weight", None), extras.pop("rope_factors_long.weight", None)
    if kind != "longrope":
        extras.update({k + ".weight": v for k, v in (("rope_factors_short", short), ("rope_factors_long", long)) if v})
    elif short or long or m.raw.get(f"{arch}.rope.scaling.type") == "longrope":
        vec = lambda e: None if e is None else _read_vector(m.source, *e)  # noqa: E731
        config["rope_scaling"] = archs.longrope(vec(short), vec(long), m, rope_dims // 2)
    if extras:  # a rope factor tensor this architecture does not use
        raise MinigenError(f"{m.source}: tensor {next(iter(extras))} has no meaning for a {arch} model; cannot convert")


def _read_vector(source: Path, info: _Info, row_bytes: int) -> np.ndarray:
    if len(info.dims) != 1:
        raise MinigenError(f"{source}: tensor {info.name} should be a vector, has shape {list(info.dims)}")
    return _dequantise_rows(source, info.offset, row_bytes, 1, info.qtype, info.name).reshape(-1)


def _token_ids(m: archs.Meta, vocab: int) -> dict:
    """bos/eos/pad ids of the tokenizer metadata, each checked to be a token of the vocabulary; null when the
    file has none (so that transformers does not take its config class's default, e.g. SmolLM3's pad 128004).
    A vocabulary longer than the embedding (ids the model has no row for) is refused."""
    n_tokens = len(m.raw.get("tokenizer.ggml.tokens") or [])
    if n_tokens > vocab:
        raise MinigenError(f"{m.source}: metadata key tokenizer.ggml.tokens has {n_tokens} tokens, more than the "
                           f"{vocab} rows of token_embd.weight")
    return {name: _token_id(m, f"tokenizer.ggml.{key}_token_id", vocab)
            for key, name in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("padding", "pad_token_id"))}


def _token_id(m: archs.Meta, key: str, vocab: int) -> int | None:
    i = m.raw.get(key)
    if i is None:
        return None
    n_tokens = len(m.raw.get("tokenizer.ggml.tokens") or []) or vocab
    if not is_int(i) or not 0 <= i < min(vocab, n_tokens):
        raise MinigenError(f"{m.source}: metadata key {key} is {short(i)}, not a token id "
                           f"(0 to {min(vocab, n_tokens) - 1})")
    return i


def _generation_config(config: dict, special: dict) -> dict:
    """BOS and PAD as config.json has them; EOS as every id llama.cpp ends generation on (EOT, EOM, ...)."""
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config.get(k) is not None}
    if special["eog"]:
        gen["eos_token_id"] = special["eog"][0] if len(special["eog"]) == 1 else special["eog"]
    return gen


def _check_against_minigen(arch: str, config: dict, tensors: list[_Tensor], source: Path):
    """The converted config through minigen's own reader, and the tensors' names and shapes through its weight
    resolver: a file that converts is a checkpoint minigen loads. Errors name the GGUF tensor. Returns the
    engine Config (what the tensor fixes need)."""
    cfg = parse_config(dict(config, torch_dtype="float32"), f"{source} (as config.json)")
    family = FAMILIES[cfg.model_type]
    try:
        resolve(cfg, family, {t.name: TensorRef(t.name, source, "F32", t.shape, 0, 0, 0) for t in tensors}, source)
    except MinigenError as e:
        to_gguf = {hf: g for g, (hf, key, part) in archs.tensor_names(arch, family, cfg.n_layers).items()
                   if not part}
        raise MinigenError(re.sub(r"'([^']+)'", lambda mt: f"{to_gguf.get(mt.group(1), '?')} ({mt.group(1)})",
                                  str(e))) from None
    return cfg


# --- writing -----------------------------------------------------------------------------------


def _write_safetensors(file: Path, plan: Plan, dtype: str, progress: Progress | None) -> int:
    """A minimal safetensors writer: 8-byte header length, JSON header, then each tensor's raw bytes, appended
    block by block as they are dequantised; our own writer because safetensors' numpy API refuses bfloat16."""
    itemsize = 4 if dtype == "float32" else 2
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for t in plan.tensors:
        size = t.size * itemsize
        header[t.name] = {"dtype": _ST_DTYPE[dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # pad so the data starts 8-byte aligned
    bar_of = progress or _no_progress
    with open(file, "wb") as f, bar_of(f"converting {plan.source.name}", plan.n_params) as bar:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for t in plan.tensors:
            for block in _dequantise(plan, t):
                f.write(memoryview(_cast(block, dtype, f"{plan.source}: tensor {t.gguf_name}")))
                bar.update(block.size)
    return file.stat().st_size


def _dequantise(plan: Plan, t: _Tensor):
    """The tensor as float32 blocks of rows in HF's layout, llama.cpp's changes undone: the whole tensor when a
    fix reorders it (q/k, qkv, GPT-2's transposes: small matrices), else blocks of at most _CHUNK values;
    merged experts one expert at a time, its gate rows then its up rows."""
    if t.up is not None and len(t.shape) == 3:  # experts: each expert's gate rows, then its up rows
        E, F = t.shape[0], t.shape[1] // 2
        for e in range(E):
            for half in (t, t.up):
                yield from _dequantise(plan, dataclasses.replace(half, offset=half.offset + e * F * half.row_bytes,
                                                                 rows=F, up=None))
        return
    if t.up is not None:
        yield from _dequantise(plan, dataclasses.replace(t, up=None))
        yield from _dequantise(plan, t.up)
        return
    step = t.rows if t.fix else max(1, _CHUNK // t.cols)
    for start in range(0, t.rows, step):
        n = min(step, t.rows - start)
        w = _dequantise_rows(plan.source, t.offset + start * t.row_bytes, t.row_bytes, n, t.qtype, t.gguf_name)
        if not np.isfinite(w).all():  # before any arithmetic on it: a signalling NaN would warn
            raise MinigenError(f"{plan.source}: tensor {t.gguf_name} holds NaN or infinite values after "
                               f"dequantisation; the file is damaged")
        if t.fix:  # on the whole tensor in GGUF's orientation, (out, in) or a vector
            try:
                w = FIXES[t.fix](w.reshape((t.cols,) if t.vector else (t.rows, t.cols)), plan.model_config)
            except MinigenError as e:
                raise MinigenError(f"{plan.source}: tensor {t.gguf_name} {e}") from None
        if t.offset_norm:
            w -= np.float32(t.offset_norm)  # llama.cpp stored 1 + w
        yield w


def read_rows(source: Path, offset: int, row_bytes: int, rows: int, name: str, into: np.ndarray | None = None) -> np.ndarray:
    """`rows` rows of a tensor as the file stores them, (rows, row bytes) uint8: one plain read (no memory
    map keeps them resident), into `into` (C-contiguous, that shape) if given."""
    raw = np.empty((rows, row_bytes), np.uint8) if into is None else into
    if raw.shape != (rows, row_bytes) or not raw.flags.c_contiguous:
        raise ValueError(f"read_rows: {name}: into must be C-contiguous ({rows}, {row_bytes}) uint8")
    with open(source, "rb") as f:
        f.seek(offset)
        if f.readinto(memoryview(raw).cast("B")) != raw.nbytes:
            raise MinigenError(f"{source}: truncated file: tensor {name} runs past the end of the file")
    return raw


def _dequantise_rows(source: Path, offset: int, row_bytes: int, rows: int, qtype, name: str) -> np.ndarray:
    """`rows` rows of a tensor, read with plain file reads (no memory map keeps them resident), as float32."""
    from gguf import GGMLQuantizationType as Q, quants

    raw = read_rows(source, offset, row_bytes, rows, name)
    try:
        if qtype == Q.F32:
            return raw.view("<f4")
        with np.errstate(all="ignore"):  # damaged scales give NaN or inf: refused by name after, not warned about
            w = quants.dequantize(raw, qtype)
    except Exception as e:
        raise MinigenError(f"{source}: cannot dequantise tensor {name} ({first_line(e)})")
    return w.astype(np.float32, copy=False).reshape(rows, -1)


def _cast(w: np.ndarray, dtype: str, where: str) -> np.ndarray:
    if dtype == "float32":
        return np.ascontiguousarray(w, dtype="<f4")
    if dtype == "float16":
        with np.errstate(over="ignore"):
            half = np.ascontiguousarray(w, dtype="<f2")
        if not np.isfinite(half).all():
            raise MinigenError(f"{where} has values beyond float16's range; use --dtype bfloat16 or float32")
        return half
    # bfloat16: the top 16 bits of float32, rounded to nearest even
    u = np.ascontiguousarray(w, dtype="<f4").view("<u4")
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


class _NoBar:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n: int) -> None:
        pass


def _no_progress(label: str, total: int) -> _NoBar:
    return _NoBar()


def _write_json(file: Path, obj: dict) -> None:
    file.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

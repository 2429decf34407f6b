"""How HF tensors become our arrays: safetensors (single or sharded), float32/float16/bfloat16,
per-family name maps, shape checks, tied embeddings, fused projections.

Layout convention: every projection is kept as HF's Linear stores it, `(out, in)`, and applied as
`x @ w.T` (BLAS takes the transpose without a copy). GPT-2's Conv1D weights are stored `(in, out)`
and are transposed once here. q/k/v are fused into one `(q + 2 kv, in)` matrix and gate/up into
one `(2 * inter, in)` matrix, read straight into their slice of the fused buffer, so fusing costs
no second copy. Unfused float32 tensors are memory-mapped, not read.
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


# --- HF names -> canonical names -------------------------------------------------------------

# canonical per-layer name -> HF template; {} is the layer index.
LLAMA_NAMES = {
    "attn_norm": "model.layers.{}.input_layernorm.weight",
    "wq": "model.layers.{}.self_attn.q_proj.weight",
    "wk": "model.layers.{}.self_attn.k_proj.weight",
    "wv": "model.layers.{}.self_attn.v_proj.weight",
    "bq": "model.layers.{}.self_attn.q_proj.bias",
    "bk": "model.layers.{}.self_attn.k_proj.bias",
    "bv": "model.layers.{}.self_attn.v_proj.bias",
    "wo": "model.layers.{}.self_attn.o_proj.weight",
    "bo": "model.layers.{}.self_attn.o_proj.bias",
    "mlp_norm": "model.layers.{}.post_attention_layernorm.weight",
    "w_gate": "model.layers.{}.mlp.gate_proj.weight",
    "w_up": "model.layers.{}.mlp.up_proj.weight",
    "w_down": "model.layers.{}.mlp.down_proj.weight",
    "b_gate": "model.layers.{}.mlp.gate_proj.bias",
    "b_up": "model.layers.{}.mlp.up_proj.bias",
    "b_down": "model.layers.{}.mlp.down_proj.bias",
}
LLAMA_GLOBALS = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight", "lm_head": "lm_head.weight"}
LLAMA_IGNORED = ("model.layers.{}.self_attn.rotary_emb.inv_freq",)

GPT2_NAMES = {
    "attn_norm": "h.{}.ln_1.weight", "attn_norm_b": "h.{}.ln_1.bias",
    "wqkv": "h.{}.attn.c_attn.weight", "bqkv": "h.{}.attn.c_attn.bias",
    "wo": "h.{}.attn.c_proj.weight", "bo": "h.{}.attn.c_proj.bias",
    "mlp_norm": "h.{}.ln_2.weight", "mlp_norm_b": "h.{}.ln_2.bias",
    "w_up": "h.{}.mlp.c_fc.weight", "b_up": "h.{}.mlp.c_fc.bias",
    "w_down": "h.{}.mlp.c_proj.weight", "b_down": "h.{}.mlp.c_proj.bias",
}
GPT2_GLOBALS = {"embed": "wte.weight", "pos_embed": "wpe.weight", "final_norm": "ln_f.weight",
                "final_norm_b": "ln_f.bias", "lm_head": "lm_head.weight"}
GPT2_IGNORED = ("h.{}.attn.bias", "h.{}.attn.masked_bias")  # causal-mask buffers in old checkpoints
GPT2_CONV1D = ("wqkv", "wo", "w_up", "w_down")              # stored (in, out)


def expected_shapes(cfg: Config) -> tuple[dict, dict]:
    """(global shapes, per-layer shapes) in HF's own storage layout, for every tensor the family has."""
    d, v, hd, f = cfg.hidden_size, cfg.vocab_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.n_heads * hd, cfg.n_kv_heads * hd
    if cfg.model_type == "gpt2":
        glob = {"embed": (v, d), "pos_embed": (cfg.max_position_embeddings, d), "final_norm": (d,),
                "final_norm_b": (d,), "lm_head": (v, d)}
        layer = {"attn_norm": (d,), "attn_norm_b": (d,), "wqkv": (d, 3 * d), "bqkv": (3 * d,), "wo": (d, d),
                 "bo": (d,), "mlp_norm": (d,), "mlp_norm_b": (d,), "w_up": (d, f), "b_up": (f,),
                 "w_down": (f, d), "b_down": (d,)}
        return glob, layer
    glob = {"embed": (v, d), "final_norm": (d,), "lm_head": (v, d)}
    layer = {"attn_norm": (d,), "wq": (q, d), "wk": (kv, d), "wv": (kv, d), "wo": (d, q), "mlp_norm": (d,),
             "w_gate": (f, d), "w_up": (f, d), "w_down": (d, f)}
    if cfg.attention_bias:
        layer.update(bq=(q,), bk=(kv,), bv=(kv,))
    if cfg.raw.get("attention_bias") and cfg.model_type == "llama":
        layer.update(bo=(d,))
    if cfg.mlp_bias:
        layer.update(b_gate=(f,), b_up=(f,), b_down=(d,))
    return glob, layer


def _names(cfg: Config) -> tuple[dict, dict, tuple, str]:
    if cfg.model_type == "gpt2":
        return GPT2_GLOBALS, GPT2_NAMES, GPT2_IGNORED, "transformer."
    return LLAMA_GLOBALS, LLAMA_NAMES, LLAMA_IGNORED, ""


def resolve(cfg: Config, refs: dict[str, TensorRef], where: Path) -> tuple[dict, list[dict]]:
    """Map HF tensor names to canonical ones; fail on unknown, missing or misshapen tensors."""
    glob_names, layer_names, ignored, prefix = _names(cfg)
    refs = {(k[len(prefix):] if prefix and k.startswith(prefix) else k): r for k, r in refs.items()}
    glob_shapes, layer_shapes = expected_shapes(cfg)
    wanted = {glob_names[k]: (None, k, s) for k, s in glob_shapes.items()}
    for i in range(cfg.n_layers):
        wanted.update({layer_names[k].format(i): (i, k, s) for k, s in layer_shapes.items()})
    drop = {t.format(i) for t in ignored for i in range(cfg.n_layers)}
    unknown = sorted(set(refs) - set(wanted) - drop)
    if unknown:
        raise MinigenError(f"{where}: unexpected tensor {unknown[0]!r} for a {cfg.model_type} checkpoint "
                           f"with {cfg.n_layers} layers" + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    glob, layers = {}, [{} for _ in range(cfg.n_layers)]
    for hf_name, (i, key, shape) in wanted.items():
        if hf_name not in refs:
            if key == "lm_head" and cfg.tie_word_embeddings is not False:
                continue
            if key == "lm_head":
                raise MinigenError(f"{where}: missing tensor 'lm_head.weight' (config.json says tie_word_embeddings is false)")
            raise MinigenError(f"{where}: missing tensor {hf_name!r}")
        ref = refs[hf_name]
        if tuple(ref.shape) != tuple(shape):
            raise MinigenError(f"{ref.file}: tensor {hf_name!r} has shape {list(ref.shape)}, expected {list(shape)}")
        (glob if i is None else layers[i])[key] = ref
    return glob, layers


# --- canonical params ---------------------------------------------------------------------------

def load_params(path: Path, cfg: Config) -> dict:
    """All weights as float32 arrays: {"embed", "lm_head", "final_norm", ..., "layers": [dict, ...]}."""
    glob, layers = resolve(cfg, index_checkpoint(path), path)
    params = {k: read_tensor(r) for k, r in glob.items()}
    if "lm_head" not in params:  # tied: the embedding doubles as the output projection
        params["lm_head"] = params["embed"]
    params["layers"] = [_layer_params(cfg, refs) for refs in layers]
    return params


def _layer_params(cfg: Config, refs: dict) -> dict:
    if cfg.model_type == "gpt2":
        out = {k: read_tensor(r) for k, r in refs.items()}
        for k in GPT2_CONV1D:  # Conv1D (in, out) -> Linear (out, in)
            out[k] = np.ascontiguousarray(out[k].T)
        return out
    out = {k: read_tensor(r) for k, r in refs.items() if k not in ("wq", "wk", "wv", "w_gate", "w_up", "bq", "bk", "bv")}
    out["wqkv"] = _fused([refs["wq"], refs["wk"], refs["wv"]])
    out["w_gate_up"] = _fused([refs["w_gate"], refs["w_up"]])
    if "bq" in refs:
        out["bqkv"] = _fused([refs["bq"], refs["bk"], refs["bv"]])
    if "b_gate" in refs:
        out["b_gate_up"] = _fused([refs["b_gate"], refs["b_up"]])
    return out


def _fused(refs: list[TensorRef]) -> np.ndarray:
    """Row-stack tensors, each read straight into its slice of one float32 buffer."""
    rows = [r.shape[0] for r in refs]
    out = np.empty((sum(rows),) + tuple(refs[0].shape[1:]), np.float32)
    start = 0
    for r, n in zip(refs, rows):
        read_tensor(r, out[start:start + n])
        start += n
    return out

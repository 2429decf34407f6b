"""GGUF -> a Hugging Face checkpoint directory (config, safetensors, tokenizer) that minigen and transformers load.

Only the `llama` architecture is supported; the tokenizer is rebuilt by `gguf_tokenizer`. The steps:
  1. read the metadata (`llama.*`, `tokenizer.ggml.*`) and check everything is supported before writing anything;
  2. dequantise each tensor with the `gguf` package, rename it to its HF name, and undo llama.cpp's Q/K row
     permutation (its converter interleaves the two RoPE halves of every head; HF keeps them split);
  3. write it all into a temporary directory next to OUT_DIR and rename that into place only when complete.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import MinigenError
from .gguf_tokenizer import special_ids, tokenizer_files

DTYPES = ("float32", "bfloat16", "float16")
_ST_DTYPE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}  # safetensors header names

# GGUF tensor name -> HF name, per layer where `{}` is the block index. Anything else fails loudly.
_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Quantisation types we hand to gguf.quants.dequantize (those it implements among these; checked at run time).
_QUANTS = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


@dataclass
class Result:
    out_dir: Path
    n_tensors: int
    n_params: int
    nbytes: int  # size of model.safetensors


def convert_gguf(source: str | Path, out_dir: str | Path, dtype: str = "float32", progress: bool = True) -> Result:
    """Convert SOURCE (a llama GGUF) into OUT_DIR, which must not exist or be empty."""
    source, out_dir = Path(source), Path(out_dir)
    if dtype not in DTYPES:
        raise MinigenError(f"--dtype {dtype}: not one of {', '.join(DTYPES)}")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise MinigenError(f"{out_dir}: already exists and is not an empty directory; choose a new OUT_DIR")
    reader = _open(source)
    meta = _metadata(reader, source)
    plan = _plan(reader, meta, source)
    config = _config(meta, plan, source, dtype)
    tok_files = tokenizer_files(meta, source)
    generation = _generation_config(config, special_ids(meta, source))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it 0700; the result should look like any new directory
        nbytes = _write_safetensors(tmp / "model.safetensors", plan, config, dtype, progress, source)
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", generation)
        for name, text in tok_files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        _move_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    n_params = sum(int(np.prod(p.shape)) for p in plan)
    return Result(out_dir, len(plan), n_params, nbytes)


def _move_into_place(tmp: Path, out_dir: Path) -> None:
    try:
        if out_dir.is_dir():
            out_dir.rmdir()  # empty (checked before converting); rename cannot replace a directory portably
        os.rename(tmp, out_dir)
    except OSError as e:  # typically: another process made OUT_DIR meanwhile
        raise MinigenError(f"{out_dir}: cannot move the converted checkpoint into place ({e.strerror})")


# --- reading -----------------------------------------------------------------------------------


def _open(source: Path):
    import gguf

    if not source.is_file():
        raise MinigenError(f"{source}: no such file")
    with open(source, "rb") as f:
        if f.read(4) != b"GGUF":
            raise MinigenError(f"{source}: not a GGUF file (it does not start with the GGUF magic)")
    try:
        return gguf.GGUFReader(source, "r")
    except Exception as e:  # the reader raises ValueError, IndexError, struct errors... on damaged files
        raise MinigenError(f"{source}: damaged or truncated GGUF file ({_first_line(e)})")


def _metadata(reader, source: Path) -> dict:
    """Every key/value field as plain Python values (strings decoded, arrays as lists)."""
    from gguf import GGUFValueType

    meta = {}
    for key, field in reader.fields.items():
        try:
            kind = field.types[0]
            if kind == GGUFValueType.ARRAY:
                if field.types[-1] == GGUFValueType.STRING:
                    meta[key] = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
                else:
                    meta[key] = [field.parts[i][0].item() for i in field.data]
            elif kind == GGUFValueType.STRING:
                meta[key] = bytes(field.parts[field.data[0]]).decode("utf-8")
            else:
                meta[key] = field.parts[field.data[0]][0].item()
        except (IndexError, UnicodeDecodeError) as e:
            raise MinigenError(f"{source}: metadata field {key} cannot be read ({_first_line(e)})")
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise MinigenError(f"{source}: architecture {arch!r} is not supported (minigen converts 'llama' GGUFs only)")
    return meta


@dataclass
class _Tensor:
    name: str  # HF name
    gguf: object  # gguf.ReaderTensor
    shape: tuple  # HF shape, (out, in) for matrices
    unpermute_heads: int  # 0, or the head count whose RoPE permutation to undo


def _plan(reader, meta: dict, source: Path) -> list[_Tensor]:
    """Map every GGUF tensor to its HF name and shape; fail on any we do not know or cannot dequantise."""
    from gguf import GGMLQuantizationType, quants

    supported = {q for q in _QUANTS if hasattr(GGMLQuantizationType, q)}
    supported = {q for q in supported if q in ("F32", "F16") or GGMLQuantizationType[q] in quants._type_traits}
    n_head = _int(meta, "llama.attention.head_count", source)
    n_kv = meta.get("llama.attention.head_count_kv", n_head)
    plan = []
    for t in reader.tensors:
        name = _hf_name(t.name, source)
        qtype = t.tensor_type.name
        if qtype not in supported:
            raise MinigenError(f"{source}: tensor {t.name} has quantisation type {qtype}, which is not supported "
                               f"(supported: {', '.join(sorted(supported))})")
        if t.data.nbytes != t.n_bytes:
            raise MinigenError(f"{source}: truncated file: tensor {t.name} has {t.data.nbytes} of {t.n_bytes} bytes")
        shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dims innermost first
        heads = n_head if "attn_q." in t.name else n_kv if "attn_k." in t.name else 0
        plan.append(_Tensor(name, t, shape, heads))
    return plan


def _hf_name(name: str, source: Path) -> str:
    if name in _NAMES:
        return _NAMES[name]
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    if name == "rope_freqs.weight":
        raise MinigenError(f"{source}: tensor rope_freqs.weight (Llama 3.1-style RoPE scaling) is not supported")
    raise MinigenError(f"{source}: tensor {name} has no Hugging Face Llama equivalent; cannot convert")


def _dequantise(t: _Tensor) -> np.ndarray:
    from gguf import quants

    w = quants.dequantize(t.gguf.data, t.gguf.tensor_type).reshape(t.shape).astype(np.float32, copy=False)
    return _unpermute(w, t.unpermute_heads) if t.unpermute_heads else w


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's convert_hf_to_gguf `permute`: per head, interleaved RoPE pairs -> HF's two halves."""
    rows = w.shape[0]
    rest = w.shape[1:]
    # (n_head, head_dim/2, 2, in) -> (n_head, 2, head_dim/2, in)
    return w.reshape(n_head, rows // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


# --- config ------------------------------------------------------------------------------------


def _config(meta: dict, plan: list[_Tensor], source: Path, dtype: str) -> dict:
    hidden = _int(meta, "llama.embedding_length", source)
    n_head = _int(meta, "llama.attention.head_count", source)
    n_kv = meta.get("llama.attention.head_count_kv", n_head)
    if not isinstance(n_kv, int):
        raise MinigenError(f"{source}: per-layer KV head counts (llama.attention.head_count_kv) are not supported")
    head_dim = meta.get("llama.attention.key_length", hidden // n_head)
    rope_dim = meta.get("llama.rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise MinigenError(f"{source}: partial rotary embeddings (llama.rope.dimension_count {rope_dim} != "
                           f"head dim {head_dim}) are not supported")
    names = {t.name: t for t in plan}
    embed = names.get("model.embed_tokens.weight")
    if embed is None:
        raise MinigenError(f"{source}: no token_embd.weight tensor")
    vocab = meta.get("llama.vocab_size", embed.shape[0])
    tied = "lm_head.weight" not in names
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": _int(meta, "llama.feed_forward_length", source),
        "num_hidden_layers": _int(meta, "llama.block_count", source),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _f32(meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": _f32(meta.get("llama.rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(meta, source),
        "max_position_embeddings": meta.get("llama.context_length", 2048),
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "attention_bias": "model.layers.0.self_attn.q_proj.bias" in names,
        "mlp_bias": False,
        "torch_dtype": dtype,
        "dtype": dtype,
    }
    for key in ("bos", "eos", "padding"):
        if f"tokenizer.ggml.{key}_token_id" in meta:
            config[f"{'pad' if key == 'padding' else key}_token_id"] = meta[f"tokenizer.ggml.{key}_token_id"]
    _check_shapes(config, names, source)
    return config


def _rope_scaling(meta: dict, source: Path):
    kind = meta.get("llama.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "type": "linear", "factor": _f32(meta["llama.rope.scaling.factor"])}
    raise MinigenError(f"{source}: RoPE scaling type {kind!r} is not supported (only none and linear)")


def _check_shapes(config: dict, names: dict, source: Path) -> None:
    h, d = config["hidden_size"], config["head_dim"]
    q, kv, ff = config["num_attention_heads"] * d, config["num_key_value_heads"] * d, config["intermediate_size"]
    want = {"model.embed_tokens.weight": (config["vocab_size"], h), "model.norm.weight": (h,)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        want.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                     p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                     p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                     p + "mlp.gate_proj.weight": (ff, h), p + "mlp.up_proj.weight": (ff, h),
                     p + "mlp.down_proj.weight": (h, ff)})
    for name, shape in want.items():
        if name not in names:
            raise MinigenError(f"{source}: tensor for {name} is missing")
        if names[name].shape != shape:
            raise MinigenError(f"{source}: {names[name].gguf.name} has shape {names[name].shape}, expected {shape}")


def _generation_config(config: dict, special: dict) -> dict:
    """BOS and PAD as config.json has them; EOS as every id llama.cpp ends generation on (EOT, EOM, ...)."""
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    if special["eog"]:
        gen["eos_token_id"] = special["eog"][0] if len(special["eog"]) == 1 else special["eog"]
    return gen


# --- writing -----------------------------------------------------------------------------------


def _write_safetensors(file: Path, plan: list[_Tensor], config: dict, dtype: str, progress: bool,
                       source: Path) -> int:
    """A minimal safetensors writer: 8-byte header length, JSON header, then each tensor's raw bytes.

    Written tensor by tensor so only one dequantised tensor is in memory at a time; our own writer because
    safetensors' numpy API refuses bfloat16.
    """
    itemsize = 4 if dtype == "float32" else 2
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for t in plan:
        size = int(np.prod(t.shape)) * itemsize
        header[t.name] = {"dtype": _ST_DTYPE[dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # pad so the data starts 8-byte aligned
    with open(file, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for t in _progress(plan, progress):
            try:
                w = _dequantise(t)
            except Exception as e:
                raise MinigenError(f"{source}: cannot dequantise tensor {t.gguf.name} ({_first_line(e)})")
            f.write(_cast(w, dtype).tobytes())
    return file.stat().st_size


def _cast(w: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float32":
        return np.ascontiguousarray(w, dtype="<f4")
    if dtype == "float16":
        return np.ascontiguousarray(w, dtype="<f2")
    # bfloat16: the top 16 bits of float32, rounded to nearest even
    u = np.ascontiguousarray(w, dtype="<f4").view("<u4")
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def _progress(items, enabled: bool):
    import click

    if not enabled:
        yield from items
        return
    with click.progressbar(items, label="dequantising", file=sys.stderr, show_pos=True,
                           item_show_func=lambda t: t.gguf.name if t else None) as bar:
        yield from bar


def _write_json(file: Path, obj: dict) -> None:
    file.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _int(meta: dict, key: str, source: Path) -> int:
    v = meta.get(key)
    if not isinstance(v, int):
        raise MinigenError(f"{source}: metadata {key} is missing or not a single integer")
    return v


def _f32(x: float) -> float:
    """A float32 metadata value as the shortest decimal that round-trips (9.999999747e-06 -> 1e-05)."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]

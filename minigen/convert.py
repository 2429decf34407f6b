"""GGUF -> a Hugging Face checkpoint directory (config, safetensors, tokenizer) that minigen and transformers load.

Only the `llama` architecture with a BPE (`gpt2`) vocabulary is supported. The steps:
  1. read the metadata (`llama.*`, `tokenizer.ggml.*`) and check everything is supported before writing anything;
  2. dequantise each tensor with the `gguf` package, rename it to its HF name, and undo llama.cpp's Q/K row
     permutation (its converter interleaves the two RoPE halves of every head; HF keeps them split);
  3. write it all into a temporary directory next to OUT_DIR and rename that into place only when complete.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import MinigenError
from .files import atomic_dir

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
    tok_files = _tokenizer_files(meta, source)
    with atomic_dir(out_dir) as tmp:
        nbytes = _write_safetensors(tmp / "model.safetensors", plan, config, dtype, progress, source)
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", _generation_config(config))
        for name, text in tok_files.items():
            (tmp / name).write_text(text, encoding="utf-8")
    n_params = sum(int(np.prod(p.shape)) for p in plan)
    return Result(out_dir, len(plan), n_params, nbytes)


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


def _generation_config(config: dict) -> dict:
    keys = ("bos_token_id", "eos_token_id", "pad_token_id")
    return {k: config[k] for k in keys if k in config}


# --- tokenizer ---------------------------------------------------------------------------------


def _tokenizer_files(meta: dict, source: Path) -> dict[str, str]:
    """tokenizer.json (rebuilt from tokenizer.ggml.*) and tokenizer_config.json (special tokens, chat template)."""
    if "tokenizer.huggingface.json" in meta:  # some GGUFs carry the original file verbatim
        tok_json = meta["tokenizer.huggingface.json"]
    else:
        tok_json = build_tokenizer(meta, source).to_str()
    return {"tokenizer.json": tok_json, "tokenizer_config.json": json.dumps(_tokenizer_config(meta), indent=2,
                                                                            ensure_ascii=False) + "\n"}


def build_tokenizer(meta: dict, source: Path | str = "GGUF"):
    """The HF fast tokenizer for a GGUF `gpt2` (byte-level BPE) vocabulary."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise MinigenError(f"{source}: tokenizer.ggml.model {kind!r} is not supported (only byte-level BPE, 'gpt2')")
    tokens, types = meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.token_type", [])
    merges = [tuple(m.split(" ")) for m in meta.get("tokenizer.ggml.merges", [])]
    if any(len(m) != 2 for m in merges):
        raise MinigenError(f"{source}: tokenizer.ggml.merges has an entry that is not two tokens")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tk.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"), source)
    tk.decoder = decoders.ByteLevel()
    # token types (llama.cpp's enum): 3 = control -> special added token, 4 = user-defined -> plain added token
    tk.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                           for i, t in enumerate(types) if t == 3])
    tk.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i, t in enumerate(types) if t == 4])
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        b = tokens[bos]
        tk.post_processor = processors.TemplateProcessing(single=f"{b} $A", pair=f"{b} $A {b} $B:1",
                                                          special_tokens=[(b, bos)])
    else:
        tk.post_processor = processors.ByteLevel(trim_offsets=False)
    return tk


def _pre_tokenizer(pre: str, source):
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre == "smollm":  # llama.cpp: each digit on its own, then the GPT-2 regex
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("gpt-2", "gpt2"):
        return byte_level
    raise MinigenError(f"{source}: tokenizer.ggml.pre {pre!r} is not supported (supported: smollm, gpt-2)")


def _tokenizer_config(meta: dict) -> dict:
    tokens, types = meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.token_type", [])
    config = {
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": meta.get("llama.context_length", 2048),
        "tokenizer_class": "PreTrainedTokenizerFast",  # GPT2Tokenizer would make transformers 5 rebuild its own pre-tokenizer, dropping the digit split
    }
    for key, name in (("bos", "bos_token"), ("eos", "eos_token"), ("unknown", "unk_token"), ("padding", "pad_token")):
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        if i is not None and i < len(tokens):
            config[name] = tokens[i]
    config["added_tokens_decoder"] = {
        str(i): {"content": tokens[i], "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": t == 3}
        for i, t in enumerate(types) if t in (3, 4)}
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = meta["tokenizer.chat_template"]
    return config


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


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]

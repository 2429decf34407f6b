"""What a loaded checkpoint is, as (name, value) rows: what `minigen info` prints."""
from __future__ import annotations

import math

from ..engine import quant
from ..engine.quant.formats import IN_24_BITS
from ..errors import ranges
from .stored import int8_types, stored_types
from .weights import DTYPE_NAMES, checkpoint_dtypes, index_checkpoint, vision_tensors


def describe(model, tokenizer, origin: str) -> list[tuple[str, object]]:
    """Architecture, size, dims, heads, context, dtype on disk, tokenizer, chat template; `origin`: what
    --model named (resolve.Resolved.origin)."""
    c, tok = model.config, tokenizer
    gguf = not model.path.is_dir()   # a GGUF run as stored: model.path is the file
    dtypes = {} if gguf else checkpoint_dtypes(model.path)
    rows = [
        ("model", origin),
        ("path", str(model.path)),
        ("architecture", f"{c.model_type} ({'the language model of ' + c.wrapper + ', ' if c.wrapper else ''}"
                         f"{', '.join(c.architectures) or '-'})"),
        ("parameters", f"{model.n_params:,} ({model.n_params / 1e6:.1f} M)"),
        *vision_rows(model),
        ("layers", c.n_layers),
        *mixer_rows(c),
        ("hidden size", c.hidden_size),
        ("intermediate size", f"{c.intermediate_size}{' per expert' if c.mlp == 'moe' else ''}"),
        ("heads", f"{c.n_heads} query, {c.n_kv_heads} key/value, head dim {c.head_dim}"),
        ("vocabulary", c.vocab_size),
        ("context", f"{c.max_position_embeddings} tokens" + (f", sliding window {c.sliding_window}"
                                                              if c.sliding_window else "")),
        ("dtype on disk", "GGUF: its matrices' types as below" if gguf else
                          ", ".join(DTYPE_NAMES.get(d, d) + (f" ({n} tensors)" if len(dtypes) > 1 else "")
                                    for d, n in sorted(dtypes.items(), key=lambda kv: -kv[1]))),
        *weight_rows(model),
        ("tokenizer", f"{type(tok.hf.model).__name__}, {tok.vocab_size} tokens"
                      f"{', byte fallback' if tok.byte_fallback_ids else ''}, BOS {tok.special_token('bos_token')}, "
                      f"EOS {tok.special_token('eos_token')}"),
        ("chat template", "yes" if tok.chat_template else "no"),
    ]
    return rows


def weight_rows(model) -> list[tuple[str, str]]:
    """The matrices in memory, per type (count and bytes), and what multiplies them: the kernels (numba), or
    NumPy's float32 chunks and OpenBLAS (no numba, or MINIGEN_KERNELS=0); float32 arrays: OpenBLAS."""
    types = stored_types(model.params)
    held = "; ".join(f"{t} {n} ({b / 1e6:,.1f} MB)" for t, (n, b) in sorted(types.items(), key=lambda kv: -kv[1][1]))
    kept = set(types) - {"float32"}
    if not kept:
        path = "OpenBLAS (float32)" + ("" if quant.kernels_on() else
                                        f" (without minigen's kernels, {_why_not()}: stored types are "
                                        f"dequantized at load)")
    elif quant.kernels_on():
        path = f"{', '.join(sorted(kept))}: minigen's kernels (numba); float32: OpenBLAS"
        rounded = sorted(int8_types(model.params))
        in_24 = sorted(kept & set(IN_24_BITS) - set(rounded)) if quant.matrix.vnni512() else []
        if in_24:
            path += f"; one row (a decode step) of {', '.join(in_24)}: exact integer sums of x in 24 bits (AVX-512 VNNI)"
        if rounded:
            path += f"; {', '.join(rounded)} with activations rounded to int8 (--activations int8, not exact)"
    else:
        path = f"NumPy: {', '.join(sorted(kept))} dequantized to float32 a chunk at a time, then OpenBLAS ({_why_not()})"
    return [("matrices", held), ("products", path)]


def _why_not() -> str:
    return "MINIGEN_KERNELS=0" if quant.matrix.HAVE_NUMBA else "numba is not installed"


def mixer_rows(c) -> list[tuple[str, str]]:
    """For a hybrid: which layers run which token mixer; for routed experts, how many."""
    kinds = [c.mixer(i) for i in range(c.n_layers)]
    spans = lambda k: ranges([i for i, m in enumerate(kinds) if m == k])  # noqa: E731
    rows = [] if set(kinds) == {"attention"} else \
        [("token mixers", "; ".join(f"{k} in layers {spans(k)}" for k in dict.fromkeys(kinds)))]
    if c.mlp == "moe":
        shared = f", and a shared MLP of width {c.shared_intermediate_size}" if c.shared_intermediate_size else ""
        rows.append(("experts", f"{c.n_experts} per layer, {c.experts_per_token} per token ({c.router}){shared}"))
    return rows


def vision_rows(model) -> list[tuple[str, object]]:
    """A multimodal checkpoint's vision tower and projector: what `info` says of what minigen does not read."""
    c = model.config
    if not c.wrapper or not model.path.is_dir():
        return []
    skipped = vision_tensors(c.wrapper, index_checkpoint(model.path))
    n = sum(math.prod(r.shape) for r in skipped)
    rows = [("vision", f"a vision tower and projector ({c.wrapper}: {len(skipped)} tensors, {n:,} parameters, "
                       f"not loaded and not counted above): minigen runs the language model, text only")]
    if c.image_token_ids:
        rows.append(("image tokens", ", ".join(f"#{i}" for i in c.image_token_ids) + " (refused in a prompt)"))
    return rows

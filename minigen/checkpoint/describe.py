"""What a loaded checkpoint is, as (name, value) rows: what `minigen info` prints."""
from __future__ import annotations

import math

from ..errors import ranges
from .weights import DTYPE_NAMES, checkpoint_dtypes, index_checkpoint, vision_tensors


def describe(model, tokenizer, origin: str) -> list[tuple[str, object]]:
    """Architecture, size, dims, heads, context, dtype on disk, tokenizer, chat template; `origin`: what
    --model named (resolve.Resolved.origin)."""
    c, tok = model.config, tokenizer
    dtypes = checkpoint_dtypes(model.path)
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
        ("dtype on disk", ", ".join(DTYPE_NAMES.get(d, d) + (f" ({n} tensors)" if len(dtypes) > 1 else "")
                                    for d, n in sorted(dtypes.items(), key=lambda kv: -kv[1]))),
        ("tokenizer", f"{type(tok.hf.model).__name__}, {tok.vocab_size} tokens"
                      f"{', byte fallback' if tok.byte_fallback_ids else ''}, BOS {tok.special_token('bos_token')}, "
                      f"EOS {tok.special_token('eos_token')}"),
        ("chat template", "yes" if tok.chat_template else "no"),
    ]
    return rows


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
    if not c.wrapper:
        return []
    skipped = vision_tensors(c.wrapper, index_checkpoint(model.path))
    n = sum(math.prod(r.shape) for r in skipped)
    rows = [("vision", f"a vision tower and projector ({c.wrapper}: {len(skipped)} tensors, {n:,} parameters, "
                       f"not loaded and not counted above): minigen runs the language model, text only")]
    if c.image_token_ids:
        rows.append(("image tokens", ", ".join(f"#{i}" for i in c.image_token_ids) + " (refused in a prompt)"))
    return rows

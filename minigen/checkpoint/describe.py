"""What a loaded checkpoint is, as (name, value) rows: what `minigen info` prints."""
from __future__ import annotations

from .families import FAMILIES
from ..errors import ranges
from .weights import DTYPE_NAMES, checkpoint_dtypes


def describe(model, tokenizer, origin: str) -> list[tuple[str, object]]:
    """Architecture, size, dims, heads, context, dtype on disk, tokenizer, chat template; `origin`: what
    --model named (resolve.Resolved.origin)."""
    c, tok = model.config, tokenizer
    dtypes = checkpoint_dtypes(model.path)
    rows = [
        ("model", origin),
        ("path", str(model.path)),
        ("architecture", f"{c.model_type} ({', '.join(c.architectures) or '-'})"),
        ("parameters", f"{model.n_params:,} ({model.n_params / 1e6:.1f} M)"),
        ("layers", c.n_layers),
        ("hidden size", c.hidden_size),
        ("intermediate size", c.intermediate_size),
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
    rows[5:5] = mixer_rows(c)
    return rows


def mixer_rows(c) -> list[tuple[str, str]]:
    """For a hybrid: which layers run which token mixer, and what of the checkpoint is not loaded."""
    kinds = [c.mixer(i) for i in range(c.n_layers)]
    spans = lambda k: ranges([i for i, m in enumerate(kinds) if m == k])  # noqa: E731
    rows = [] if set(kinds) == {"attention"} else \
        [("token mixers", "; ".join(f"{k} in layers {spans(k)}" for k in dict.fromkeys(kinds)))]
    skipped = FAMILIES[c.model_type].skipped
    return rows + ([("not loaded", ", ".join(f"{s}*" for s in skipped) + " (vision tower, multi-token prediction)")]
                   if "model.visual." in skipped else [])

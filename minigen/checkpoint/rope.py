"""RoPE settings from config.json in both spellings: transformers 5's `rope_parameters` (flat, or nested
per layer type) and the older `rope_theta` / `rope_scaling`; the kinds minigen runs (default, linear,
Llama 3's, Phi-3's longrope, YaRN) become one `Rope` each. Read by config.py for every family, and by the
families' own readers (families.py) where layers differ.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..engine.config import Rope
from ..errors import MinigenError, is_finite, is_int, is_number, is_positive, short
from .fields import Fields

ROPE_KINDS = ("default", "linear", "llama3", "longrope", "yarn")


def rope_parameters(get: Fields, layer_type: str | None = None) -> dict:
    """The RoPE settings as one dict in transformers 5's shape, from whichever spelling the file uses:
    `rope_parameters` (flat, or nested per layer type) or the older `rope_scaling` (+ a top-level
    `rope_theta`). As in transformers, a non-null `rope_scaling` wins over a flat `rope_parameters`,
    and updates the full-attention entry of a nested one."""
    params, scaling = get.dict("rope_parameters"), get.dict("rope_scaling")
    nested = {k: v for k, v in params.items() if isinstance(v, dict)}
    if nested:
        kind = layer_type or "full_attention"
        return {**(nested.get(kind) or {}), **(scaling if kind == "full_attention" else {})}
    return scaling or params


def read_rope(get: Fields, f: dict, defaults: dict, p: dict | None = None, theta: float | None = None) -> Rope:
    """One Rope. `p`: the settings in transformers 5's shape (default: `rope_parameters(get)`);
    `theta`: the base when `p` has none (default: rope_theta / rotary_emb_base, else the family's)."""
    where = get.where
    p = rope_parameters(get) if p is None else p
    if theta is None:
        theta = get.float("rope_theta", "rotary_emb_base", default=defaults.get("rope_theta", 10000.0))
    theta = p.get("rope_theta", theta)
    partial = p.get("partial_rotary_factor") or get.float(
        "partial_rotary_factor", "rotary_pct", default=defaults.get("partial_rotary_factor", 1.0))
    kind = p.get("rope_type", p.get("type", "default"))
    if f["model_type"] == "phi3" and kind in ("su", "yarn"):  # Phi-3's old names for longrope
        kind = "longrope"
    if not is_positive(theta):
        raise MinigenError(f"{where}: rope_theta should be a positive number, got {short(theta)}")
    if not (is_number(partial) and 0 < partial <= 1):
        raise MinigenError(f"{where}: partial_rotary_factor should be in (0, 1], got {short(partial)}")
    if kind not in ROPE_KINDS:
        raise MinigenError(f"{where}: unsupported rope scaling type {short(kind)} "
                           f"(minigen supports {', '.join(ROPE_KINDS)})")
    dim = int(f["head_dim"] * partial)
    rope = Rope(theta=float(theta), dim=dim - dim % 2)
    if kind == "default":
        return rope
    if kind == "linear":
        return _replace(rope, kind=kind, factor=_number(p, "factor", kind, where))
    if kind == "llama3":
        original = p.get("original_max_position_embeddings") or f["max_position_embeddings"]
        if not (is_int(original) and original > 0):
            raise MinigenError(f"{where}: rope scaling 'llama3' needs a positive integer "
                               f"'original_max_position_embeddings', got {short(original)}")
        return _replace(rope, kind=kind, factor=_number(p, "factor", kind, where),
                        low_freq_factor=_number(p, "low_freq_factor", kind, where),
                        high_freq_factor=_number(p, "high_freq_factor", kind, where), original_max=original)
    if kind == "yarn":
        return _yarn(rope, p, f, where)
    return _longrope(rope, p, get, f, defaults)


def _yarn(rope: Rope, p: dict, f: dict, where: str) -> Rope:
    """YaRN's settings as transformers reads them: original_max_position_embeddings defaults to
    max_position_embeddings; an explicit `factor` is used even where it disagrees with max / original
    (transformers warns and uses it), the ratio only when there is none; the attention factor from
    mscale / mscale_all_dim unless given; beta_fast / beta_slow default to 32 / 1 (also when 0 or null)."""
    original = p.get("original_max_position_embeddings") or f["max_position_embeddings"]
    if not (is_int(original) and original > 0):
        raise MinigenError(f"{where}: rope scaling 'yarn' needs a positive integer "
                           f"'original_max_position_embeddings', got {short(original)}")
    factor = p.get("factor")
    factor = f["max_position_embeddings"] / original if factor is None else factor
    if not is_positive(factor):
        raise MinigenError(f"{where}: rope scaling 'yarn' needs a positive number 'factor', got {short(factor)}")
    for name in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "llama_4_scaling_beta"):
        if p.get(name) is not None and not is_finite(p[name]):
            raise MinigenError(f"{where}: rope scaling 'yarn': {name!r} should be a number, got {short(p[name])}")
    attention = p.get("attention_factor")
    if attention is None:
        mscale, all_dim = p.get("mscale"), p.get("mscale_all_dim")
        attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, all_dim) if mscale and all_dim \
            else _yarn_mscale(factor)
    if not is_positive(attention):
        raise MinigenError(f"{where}: rope 'attention_factor' should be a positive number, got {short(attention)}")
    truncate = p.get("truncate", True)
    if not isinstance(truncate, bool):
        raise MinigenError(f"{where}: rope scaling 'yarn': 'truncate' should be true or false, got {short(truncate)}")
    return _replace(rope, kind="yarn", factor=float(factor), original_max=int(original),
                    attention_factor=float(attention), beta_fast=float(p.get("beta_fast") or 32),
                    beta_slow=float(p.get("beta_slow") or 1), truncate=truncate)


def _yarn_mscale(scale: float, mscale: float = 1) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _longrope(rope: Rope, p: dict, get: Fields, f: dict, defaults: dict) -> Rope:
    """Phi-3's longrope: per-pair short and long factors, the switch at original_max_position_embeddings
    (Phi-3's config keeps it at the top level, and transformers lets that win), and the attention factor."""
    where = get.where
    original = get.int("original_max_position_embeddings", default=defaults.get("original_max_position_embeddings")
                       or p.get("original_max_position_embeddings") or f["max_position_embeddings"])
    pairs = rope.dim // 2
    factors = {}
    for name in ("short_factor", "long_factor"):
        v = p.get(name)
        if not (isinstance(v, list) and len(v) == pairs and all(is_positive(x) for x in v)):
            raise MinigenError(f"{where}: rope scaling 'longrope' needs {name!r}: {pairs} positive numbers")
        factors[name] = tuple(float(x) for x in v)
    factor = p.get("factor") or f["max_position_embeddings"] / original
    if not is_positive(factor):
        raise MinigenError(f"{where}: rope scaling 'longrope' needs a positive number 'factor', got {short(factor)}")
    attention = p.get("attention_factor")
    if attention is None:  # transformers' default; log(original) is 0 for an original context of 1
        attention = 1.0 if factor <= 1.0 or original < 2 else math.sqrt(1 + math.log(factor) / math.log(original))
    if not is_positive(attention):
        raise MinigenError(f"{where}: rope 'attention_factor' should be a positive number, got {short(attention)}")
    return _replace(rope, kind="longrope", original_max=int(original), attention_factor=float(attention), **factors)


def _replace(rope: Rope, **kw) -> Rope:
    return replace(rope, **kw)


def _number(p: dict, name: str, kind: str, where: str) -> float:
    v = p.get(name)
    if not is_positive(v):
        raise MinigenError(f"{where}: rope scaling {kind!r} needs a positive number {name!r}, got {v!r}")
    return float(v)

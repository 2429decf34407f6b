"""What is this checkpoint? config.json -> one frozen Config, HF's spellings normalised.

`Config` (minigen.engine.config) says everything the forward pass needs, in minigen's own names: sizes, and the handful of
switches in which the families differ (norm kind and placement, q/k norms, RoPE per layer, soft-caps,
sliding windows). Which switches a `model_type` turns on, and how its config.json spells things, is
the family's entry in `families.py`; this module holds the machinery that reads any entry.

Both generations of transformers' config.json are read: `rope_theta` / `rope_scaling` /
`torch_dtype` (hub checkpoints saved before 5.x) and `rope_parameters` / `dtype` (5.x).
"""
from __future__ import annotations

import math
from dataclasses import MISSING, fields, replace
from pathlib import Path

from ..engine.config import MAX_LAYERS, Config, Rope
from ..engine.layers import ACTIVATIONS
from ..errors import MinigenError, is_int, is_number, is_real, read_json_object, short


def load_config(path: str | Path) -> Config:
    """Read `path/config.json` (or a config.json file) into a Config; one clear error if it is bad."""
    path = Path(path)
    file = path if path.suffix == ".json" else path / "config.json"
    if not (file.exists() or file.is_symlink()):
        raise MinigenError(f"{file}: missing (is {path} a Hugging Face checkpoint directory?)")
    return parse_config(read_json_object(file), str(file))


def parse_config(raw: dict, where: str = "config.json") -> Config:
    """config.json's fields -> Config: the sizes every family has, then the family's own reading."""
    from .families import FAMILIES, WRAPPERS  # the tables need this module's readers: imported here, not above
    model_type = raw.get("model_type")
    if isinstance(model_type, str) and model_type in WRAPPERS:
        if "text_config" not in raw:
            raise MinigenError(f"{where}: model_type {model_type!r} is a multimodal checkpoint, and minigen reads its "
                               f"language model from 'text_config', which is missing")
        return parse_wrapped(raw, where)
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        known = ", ".join(sorted(FAMILIES))
        raise MinigenError(f"{where}: unsupported model_type {short(model_type)} (minigen supports {known}, and the "
                           f"language model of {', '.join(sorted(WRAPPERS))} checkpoints)")
    family = FAMILIES[model_type]
    get = Fields(raw, where)
    hidden = get.int("hidden_size", "n_embd")
    n_heads = get.int("num_attention_heads", "n_head")
    n_layers = get.int("num_hidden_layers", "n_layer")
    if n_layers > MAX_LAYERS:  # per-layer settings are built below: refuse before, not in a MemoryError
        raise MinigenError(f"{where}: num_hidden_layers={n_layers} is more than any checkpoint minigen can "
                           f"load ({MAX_LAYERS:,})")
    d = family.defaults
    f = {x.name: x.default for x in fields(Config) if x.default is not MISSING}  # the features' defaults
    f.update(
        model_type=model_type, hidden_size=hidden, n_heads=n_heads, n_layers=n_layers,
        vocab_size=get.int("vocab_size"),
        n_kv_heads=get.int("num_key_value_heads", default=n_heads),
        head_dim=get.int("head_dim", default=None) or d.get("head_dim") or _divide(hidden, n_heads, where),
        intermediate_size=get.int("intermediate_size", "n_inner", default=d.get("intermediate_size", 4 * hidden)),
        max_position_embeddings=get.int("max_position_embeddings", "n_positions",
                                        default=d.get("max_position_embeddings", 2048)),
        norm_eps=get.float("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", default=d.get("norm_eps", 1e-6)),
        act=get.str("hidden_act", "activation_function", default=d.get("act", "silu")),
        tie_word_embeddings=get.bool("tie_word_embeddings", default=d.get("tie_word_embeddings", False)),
        eos_token_ids=get.token_ids("eos_token_id"),
        architectures=tuple(get.strings("architectures")),
    )
    get.token_id("bos_token_id")  # checked, as transformers checks it, though the tokenizer decides BOS
    f.update(family.features)
    f.update(family.read(get, f))
    if f["n_heads"] % f["n_kv_heads"]:
        raise MinigenError(f"{where}: num_attention_heads={n_heads} is not divisible by "
                           f"num_key_value_heads={f['n_kv_heads']}")
    f["attn_scale"] = f["attn_scale"] or f["head_dim"] ** -0.5
    if f["positions"] == "rope" and not f["rope"]:
        f["rope"] = (read_rope(get, f, d),) * n_layers  # one RoPE for every layer, unless the family's read said
    f["layer_types"] = tuple(f.get("layer_types") or ("full_attention",) * n_layers)
    _check_layers(f, where)
    return Config(**f)


def parse_wrapped(raw: dict, where: str) -> Config:
    """A multimodal checkpoint's config.json -> the Config of its language model (text_config), with what
    the top level decides: tying (the wrapper's default when absent, as transformers reads it), the
    architectures, and the image tokens a prompt must not hold."""
    from .families import WRAPPERS
    wrapper = WRAPPERS[raw["model_type"]]
    get = Fields(raw, where)
    text = dict(get.dict("text_config"))
    text.setdefault("model_type", wrapper.text_model_type)
    text["tie_word_embeddings"] = get.bool("tie_word_embeddings", default=wrapper.tie_word_embeddings)
    for name in ("bos_token_id", "eos_token_id"):
        if text.get(name) is None and raw.get(name) is not None:
            text[name] = raw[name]
    text["architectures"] = get.strings("architectures")
    images = {get.token_id(name) for name in ("image_token_id", "image_token_index")} - {None}
    cfg = parse_config(text, f"{where} (text_config)")
    return replace(cfg, wrapper=raw["model_type"], image_token_ids=tuple(sorted(images)))


GENERATION_FIELDS = {  # generation_config.json fields minigen uses: (check, what they should be)
    "do_sample": (lambda v: isinstance(v, bool), "true or false"),
    "temperature": (lambda v: is_real(v) and v >= 0, "a number >= 0"),
    "top_k": (lambda v: is_int(v) and v >= 0, "an integer >= 0"),
    "top_p": (lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "min_p": (lambda v: is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "repetition_penalty": (lambda v: _positive(v), "a positive number"),
}


def parse_generation_config(raw: dict, where: str = "generation_config.json") -> dict:
    """generation_config.json, its sampling defaults and EOS ids checked; other fields pass through.
    A field that is null is absent, as in transformers."""
    get = Fields(raw, where)
    for name, (ok, what) in GENERATION_FIELDS.items():
        get.check(name, ok, what)
    get.token_ids("eos_token_id")
    return raw


def _divide(a: int, b: int, where: str) -> int:
    if a % b:
        raise MinigenError(f"{where}: hidden_size={a} is not divisible by num_attention_heads={b} "
                           f"(and no head_dim is given)")
    return a // b


def _check_layers(f: dict, where: str):
    if f["act"] not in ACTIVATIONS:
        raise MinigenError(f"{where}: unsupported activation {f['act']!r} (minigen has {', '.join(ACTIVATIONS)})")
    n = f["n_layers"]
    if len(f["layer_types"]) != n or any(t not in ("full_attention", "sliding_attention") for t in f["layer_types"]):
        raise MinigenError(f"{where}: field 'layer_types' should list full_attention/sliding_attention "
                           f"for each of the {n} layers")
    if f["positions"] == "rope" and len(f["rope"]) != n:
        raise MinigenError(f"{where}: RoPE settings for {len(f['rope'])} layers, but the model has {n}")


class Fields:
    """Typed reads of config.json fields, each error naming the file and the field."""

    def __init__(self, raw: dict, where: str):
        self.raw, self.where = raw, where

    def _first(self, names, default, check, what):
        for name in names:
            value = self.raw.get(name)
            if value is not None:
                if not check(value):
                    raise MinigenError(f"{self.where}: field {name!r} should be {what}, got {short(value)}")
                return value
        if default is ...:
            raise MinigenError(f"{self.where}: missing required field {names[0]!r}")
        return default

    def int(self, *names, default=...) -> int:
        """A positive integer no larger than 2**53 (past that, sizes turned into floats overflow)."""
        return self._first(names, default, lambda v: is_int(v) and 0 < v <= 2**53, "a positive integer")

    def float(self, *names, default=...) -> float:
        v = self._first(names, default, _positive, "a positive number")
        return v if v is None else float(v)

    def number(self, *names, default=...) -> float:
        """A finite number of any sign."""
        v = self._first(names, default, is_real, "a number")
        return v if v is None else float(v)

    def nullable(self, read, name: str, default):
        """`read(name)`, except that a field present and null means None (no window, no cap)."""
        if name in self.raw and self.raw[name] is None:
            return None
        return read(name, default=default)

    def bool(self, *names, default=...) -> bool:
        return self._first(names, default, lambda v: isinstance(v, bool), "true or false")

    def str(self, *names, default=...) -> str:
        return self._first(names, default, lambda v: isinstance(v, str), "a string")

    def dict(self, *names) -> dict:
        return dict(self._first(names, {}, lambda v: isinstance(v, dict), "an object"))

    def list(self, *names, default=...) -> list:
        return self._first(names, default, lambda v: isinstance(v, list), "a list")

    def strings(self, name: str) -> list:
        return self._first((name,), [], lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
                           "a list of strings")

    def check(self, name: str, ok, what: str):
        """The field's value if present, not null, and `ok(value)`; None if absent or null."""
        return self._first((name,), None, ok, what)

    def token_id(self, name: str) -> int | None:
        return self._first((name,), None, lambda v: is_int(v) and v >= 0, "a token id (an integer >= 0)")

    def token_ids(self, name: str) -> tuple:
        v = self._first((name,), None, lambda v: (is_int(v) and v >= 0) or (
            isinstance(v, list) and all(is_int(i) and i >= 0 for i in v)), "a token id or a list of them")
        return () if v is None else tuple(v) if isinstance(v, list) else (v,)


# --- RoPE -----------------------------------------------------------------------------------------

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
    if not _positive(theta):
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
    if not _positive(factor):
        raise MinigenError(f"{where}: rope scaling 'yarn' needs a positive number 'factor', got {short(factor)}")
    for name in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "llama_4_scaling_beta"):
        if p.get(name) is not None and not is_real(p[name]):
            raise MinigenError(f"{where}: rope scaling 'yarn': {name!r} should be a number, got {short(p[name])}")
    attention = p.get("attention_factor")
    if attention is None:
        mscale, all_dim = p.get("mscale"), p.get("mscale_all_dim")
        attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, all_dim) if mscale and all_dim \
            else _yarn_mscale(factor)
    if not _positive(attention):
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
        if not (isinstance(v, list) and len(v) == pairs and all(_positive(x) for x in v)):
            raise MinigenError(f"{where}: rope scaling 'longrope' needs {name!r}: {pairs} positive numbers")
        factors[name] = tuple(float(x) for x in v)
    factor = p.get("factor") or f["max_position_embeddings"] / original
    if not _positive(factor):
        raise MinigenError(f"{where}: rope scaling 'longrope' needs a positive number 'factor', got {short(factor)}")
    attention = p.get("attention_factor")
    if attention is None:  # transformers' default; log(original) is 0 for an original context of 1
        attention = 1.0 if factor <= 1.0 or original < 2 else math.sqrt(1 + math.log(factor) / math.log(original))
    if not _positive(attention):
        raise MinigenError(f"{where}: rope 'attention_factor' should be a positive number, got {short(attention)}")
    return _replace(rope, kind="longrope", original_max=int(original), attention_factor=float(attention), **factors)


def _replace(rope: Rope, **kw) -> Rope:
    from dataclasses import replace
    return replace(rope, **kw)


def _number(p: dict, name: str, kind: str, where: str) -> float:
    v = p.get(name)
    if not _positive(v):
        raise MinigenError(f"{where}: rope scaling {kind!r} needs a positive number {name!r}, got {v!r}")
    return float(v)


def _positive(v) -> bool:
    return is_real(v) and v > 0

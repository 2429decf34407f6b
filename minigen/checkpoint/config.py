"""What is this checkpoint? config.json -> one frozen Config, HF's spellings normalised.

`Config` (minigen.engine.config) says everything the forward pass needs, in minigen's own names: sizes, and the handful of
switches in which the families differ (norm kind and placement, q/k norms, RoPE per layer, soft-caps,
sliding windows). Which switches a `model_type` turns on, and how its config.json spells things, is
the family's entry in `families.py`; this module holds the machinery that reads any entry (and
rope.py the RoPE settings, which the families' own readers use too).

Both generations of transformers' config.json are read: `rope_theta` / `rope_scaling` /
`torch_dtype` (hub checkpoints saved before 5.x) and `rope_parameters` / `dtype` (5.x).
"""
from __future__ import annotations

from dataclasses import MISSING, fields, replace
from pathlib import Path

from ..engine.config import MAX_LAYERS, Config
from ..engine.layers import ACTIVATIONS
from ..errors import MinigenError, is_finite, is_int, is_number, is_positive, short
from ..files import read_json_object
from .families import FAMILIES, WRAPPERS
from .fields import Fields
from .rope import read_rope


def load_config(path: str | Path) -> Config:
    """Read `path/config.json` (or a config.json file) into a Config; one clear error if it is bad."""
    path = Path(path)
    file = path if path.suffix == ".json" else path / "config.json"
    if not (file.exists() or file.is_symlink()):
        raise MinigenError(f"{file}: missing (is {path} a Hugging Face checkpoint directory?)")
    return parse_config(read_json_object(file), str(file))


def parse_config(raw: dict, where: str = "config.json") -> Config:
    """config.json's fields -> Config: the sizes every family has, then the family's own reading."""
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
        norm_eps=get.float("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_eps",
                           default=d.get("norm_eps", 1e-6)),
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
    "temperature": (lambda v: is_finite(v) and v >= 0, "a number >= 0"),
    "top_k": (lambda v: is_int(v) and v >= 0, "an integer >= 0"),
    "top_p": (lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "min_p": (lambda v: is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "repetition_penalty": (lambda v: is_positive(v), "a positive number"),
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

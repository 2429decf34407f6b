"""What is this checkpoint? config.json -> one frozen Config, HF's spellings normalised.

A family is data: `Family` holds the handful of literal fields in which GPT-2, Llama, Mistral,
Qwen2 and Gemma differ. Both generations of transformers' config.json are read: `rope_theta` /
`rope_scaling` / `torch_dtype` (older hub checkpoints) and `rope_parameters` / `dtype` (5.x).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .errors import MinigenError, read_json_object


@dataclass(frozen=True)
class Family:
    norm: str = "rms"               # "rms" | "layer"
    norm_offset: float = 0.0        # Gemma scales by (1 + w)
    mlp: str = "gated"              # "gated": down(act(gate) * up) | "plain": down(act(up))
    act: str = "silu"
    positions: str = "rope"         # "rope" (half-split, HF's rotate_half) | "learned"
    qkv_bias: bool = False
    out_bias: bool = False          # o_proj / c_proj and MLP biases (GPT-2)
    norm_bias: bool = False         # LayerNorm has a bias
    embed_scale: bool = False       # Gemma multiplies embeddings by sqrt(hidden)
    sliding: bool = False           # sliding_window in config.json applies to every layer


FAMILIES = {
    "gpt2": Family(norm="layer", mlp="plain", act="gelu_new", positions="learned",
                   qkv_bias=True, out_bias=True, norm_bias=True),
    "llama": Family(),
    "mistral": Family(sliding=True),
    "qwen2": Family(qkv_bias=True),
    "gemma": Family(norm_offset=1.0, act="gelu_pytorch_tanh", embed_scale=True),
}


@dataclass(frozen=True)
class Config:
    model_type: str
    family: Family
    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    norm_eps: float
    act: str
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None       # {"rope_type": "linear" | "llama3", ...}; None = default
    tie_word_embeddings: bool = False
    attention_bias: bool = False           # q/k/v (and o for Llama's attention_bias) biases
    mlp_bias: bool = False
    sliding_window: int | None = None
    layer_types: tuple = ()                # per layer: "full_attention" | "sliding_attention"
    bos_token_id: int | None = None
    eos_token_ids: tuple = ()
    dtype: str = "float32"                 # dtype the checkpoint says it was saved in
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def group(self) -> int:
        """Query heads per KV head: query head h reads KV head h // group (HF's order)."""
        return self.n_heads // self.n_kv_heads

    def is_sliding(self, layer: int) -> bool:
        return self.sliding_window is not None and self.layer_types[layer] == "sliding_attention"


def load_config(path: str | Path) -> Config:
    """Read `path/config.json` (or a config.json file) into a Config; one clear error if it is bad."""
    path = Path(path)
    file = path if path.suffix == ".json" else path / "config.json"
    if not file.is_file():
        raise MinigenError(f"{file}: missing (is {path} a Hugging Face checkpoint directory?)")
    return parse_config(read_json_object(file), str(file))


def parse_config(raw: dict, where: str = "config.json") -> Config:
    model_type = raw.get("model_type")
    if model_type not in FAMILIES:
        known = ", ".join(sorted(FAMILIES))
        raise MinigenError(f"{where}: unsupported model_type {model_type!r} (minigen supports {known})")
    if model_type == "gpt2":
        return _gpt2_config(raw, where)
    return _llama_like_config(raw, model_type, where)


def _get(raw: dict, where: str, *names, default=..., kind=int):
    """The first of `names` present in raw, checked against `kind`; error naming the field if absent."""
    for name in names:
        if raw.get(name) is not None:
            value = raw[name]
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else isinstance(value, kind)
            if not ok or (kind is int and isinstance(value, bool)):
                raise MinigenError(f"{where}: field {name!r} should be {kind.__name__}, got {value!r}")
            if kind is int and value <= 0 and name not in ("bos_token_id", "eos_token_id"):
                raise MinigenError(f"{where}: field {name!r} must be positive, got {value}")
            return value
    if default is ...:
        raise MinigenError(f"{where}: missing required field {names[0]!r}")
    return default


def _eos_ids(raw: dict) -> tuple:
    eos = raw.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (eos,)


def _dtype(raw: dict) -> str:
    return str(raw.get("dtype") or raw.get("torch_dtype") or "float32")


def _gpt2_config(raw: dict, where: str) -> Config:
    hidden = _get(raw, where, "n_embd", "hidden_size")
    n_heads = _get(raw, where, "n_head", "num_attention_heads")
    _check_divides(hidden, n_heads, where, "n_embd", "n_head")
    return Config(
        model_type="gpt2", family=FAMILIES["gpt2"], raw=raw,
        vocab_size=_get(raw, where, "vocab_size"), hidden_size=hidden,
        n_layers=_get(raw, where, "n_layer", "num_hidden_layers"),
        n_heads=n_heads, n_kv_heads=n_heads, head_dim=hidden // n_heads,
        intermediate_size=_get(raw, where, "n_inner", default=4 * hidden),
        max_position_embeddings=_get(raw, where, "n_positions", "max_position_embeddings"),
        norm_eps=_get(raw, where, "layer_norm_epsilon", default=1e-5, kind=float),
        act=raw.get("activation_function") or "gelu_new",
        tie_word_embeddings=raw.get("tie_word_embeddings", True),
        bos_token_id=raw.get("bos_token_id"), eos_token_ids=_eos_ids(raw), dtype=_dtype(raw),
    )


def _llama_like_config(raw: dict, model_type: str, where: str) -> Config:
    family = FAMILIES[model_type]
    hidden = _get(raw, where, "hidden_size")
    n_heads = _get(raw, where, "num_attention_heads")
    n_kv = _get(raw, where, "num_key_value_heads", default=n_heads)
    if raw.get("head_dim") is None and model_type != "gemma":
        _check_divides(hidden, n_heads, where, "hidden_size", "num_attention_heads")
    _check_divides(n_heads, n_kv, where, "num_attention_heads", "num_key_value_heads")
    n_layers = _get(raw, where, "num_hidden_layers")
    theta, scaling = _rope(raw, where)
    # transformers' defaults when the key is absent: Mistral 4096 (an explicit null means none)
    sliding = raw.get("sliding_window", 4096 if model_type == "mistral" else None) \
        if family.sliding or model_type == "qwen2" else None
    layer_types = _layer_types(raw, model_type, n_layers, sliding, where)
    act = raw.get("hidden_act") or family.act
    if model_type == "gemma" and act == "gelu":  # as transformers' Gemma: "gelu" means the tanh form
        act = "gelu_pytorch_tanh"
    return Config(
        model_type=model_type, family=family, raw=raw,
        vocab_size=_get(raw, where, "vocab_size"), hidden_size=hidden, n_layers=n_layers,
        n_heads=n_heads, n_kv_heads=n_kv,
        head_dim=_get(raw, where, "head_dim", default=256 if model_type == "gemma" else hidden // n_heads),
        intermediate_size=_get(raw, where, "intermediate_size"),
        max_position_embeddings=_get(raw, where, "max_position_embeddings", default=2048),
        norm_eps=_get(raw, where, "rms_norm_eps", default=1e-6, kind=float),
        act=act, rope_theta=theta, rope_scaling=scaling,
        tie_word_embeddings=raw.get("tie_word_embeddings", model_type == "gemma"),
        attention_bias=family.qkv_bias or bool(raw.get("attention_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        sliding_window=sliding, layer_types=layer_types,
        bos_token_id=raw.get("bos_token_id"), eos_token_ids=_eos_ids(raw), dtype=_dtype(raw),
    )


def _rope(raw: dict, where: str) -> tuple[float, dict | None]:
    """(theta, scaling) from either `rope_parameters` (transformers 5) or `rope_theta`/`rope_scaling`."""
    params = raw.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise MinigenError(f"{where}: field 'rope_parameters' should be an object")
    scaling = raw.get("rope_scaling") or params
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    if not isinstance(theta, (int, float)) or theta <= 0:
        raise MinigenError(f"{where}: rope_theta should be a positive number, got {theta!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if kind not in ("default", "linear", "llama3"):
        raise MinigenError(f"{where}: unsupported rope scaling type {kind!r} (minigen supports default, linear, llama3)")
    if kind == "default":
        return float(theta), None
    needed = {"linear": ["factor"],
              "llama3": ["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"]}[kind]
    for name in needed:
        if not isinstance(scaling.get(name), (int, float)):
            raise MinigenError(f"{where}: rope scaling {kind!r} needs a numeric {name!r}")
    return float(theta), {"rope_type": kind, **{n: float(scaling[n]) for n in needed}}


def _layer_types(raw: dict, model_type: str, n_layers: int, sliding, where: str) -> tuple:
    types = raw.get("layer_types")
    if types is not None:
        if len(types) != n_layers or any(t not in ("full_attention", "sliding_attention") for t in types):
            raise MinigenError(f"{where}: field 'layer_types' should list full_attention/sliding_attention "
                               f"for each of the {n_layers} layers")
        return tuple(types)
    if sliding is None or (model_type == "qwen2" and not raw.get("use_sliding_window", False)):
        return ("full_attention",) * n_layers
    if model_type == "qwen2":  # Qwen2 slides only from layer max_window_layers on
        first = raw.get("max_window_layers", 28)  # transformers' default
        return tuple("sliding_attention" if i >= first else "full_attention" for i in range(n_layers))
    return ("sliding_attention",) * n_layers


def _check_divides(a: int, b: int, where: str, name_a: str, name_b: str):
    if a % b:
        raise MinigenError(f"{where}: {name_a}={a} is not divisible by {name_b}={b}")

"""Each family's config.json quirks: what its `read` function (families.FAMILIES) makes of the fields no table can
say (layer patterns, per-layer RoPE, the recurrent layers' sizes, multipliers), as more Config fields. Each
takes the config's typed reader (`Fields`) and the fields read so far."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from .fields import Fields
from .rope import read_rope, rope_parameters
from ..engine.config import DeltaNet, Mamba, ShortConv
from ..errors import MinigenError, is_int, is_number, short


def _biases(get: Fields, f: dict) -> dict:
    """Llama's attention_bias puts a bias on q, k, v and o; mlp_bias on gate, up and down."""
    bias = get.bool("attention_bias", default=False)
    return {"qkv_bias": f["qkv_bias"] or bias, "o_bias": bias, "mlp_bias": get.bool("mlp_bias", default=False)}


def _all_sliding(get: Fields, f: dict, default: int | None) -> dict:
    """Mistral, Phi-3: one window for every layer; an explicit null means none."""
    window = get.nullable(get.int, "sliding_window", default)
    return {"sliding_window": window, "layer_types": _layer_types(get, f, lambda i: window is not None)}


def _layer_types(get: Fields, f: dict, sliding: Callable[[int], bool]) -> tuple:
    """config.json's `layer_types` when given, else the family's pattern."""
    types = get.list("layer_types", default=None)
    if types is not None:
        return tuple(types)
    return tuple("sliding_attention" if sliding(i) else "full_attention" for i in range(f["n_layers"]))


def _qwen_sliding(get: Fields, f: dict) -> dict:
    """Qwen2/3: a window only with use_sliding_window, from layer max_window_layers on."""
    window = get.int("sliding_window", default=None) if get.bool("use_sliding_window", default=False) else None
    first = get.int("max_window_layers", default=28)
    return {"sliding_window": window, "layer_types": _layer_types(get, f, lambda i: window is not None and i >= first)}


def llama(get, f):
    return _biases(get, f)


def mistral(get, f):
    return {**_biases(get, f), **_all_sliding(get, f, 4096)}


def qwen(get, f):
    return {**_biases(get, f), **_qwen_sliding(get, f)}


def gemma(get, f):
    act = f["act"]  # hub Gemma 1 configs say "gelu" and mean the tanh form, as transformers reads them
    return {**_biases(get, f), "act": "gelu_pytorch_tanh" if act == "gelu" else act}


def gemma2(get, f):
    return {**_biases(get, f), **_gemma2_like(get, f, pattern=2),
            "attn_softcap": get.nullable(get.float, "attn_logit_softcapping", 50.0),
            "final_softcap": get.nullable(get.float, "final_logit_softcapping", 30.0)}


def gemma3(get, f):
    """Gemma 3: sliding layers use rope_local_base_freq without scaling; full layers rope_theta, scaled.
    attn_logit_softcapping is read by transformers but never applied, so it is ignored here too."""
    if get.bool("use_bidirectional_attention", default=False):  # EmbeddingGemma-style encoders
        raise_field(get, "use_bidirectional_attention", "false: minigen runs causal decoders only")
    out = {**_biases(get, f), **_gemma2_like(get, f, pattern=get.int("sliding_window_pattern", default=6)),
           "final_softcap": get.float("final_logit_softcapping", default=None)}
    nested = isinstance(get.dict("rope_parameters").get("sliding_attention"), dict)
    local = read_rope(get, f, {}, rope_parameters(get, "sliding_attention") if nested else {},
                      theta=get.float("rope_local_base_freq", default=10000.0))
    full = read_rope(get, f, {"rope_theta": 1e6}, rope_parameters(get, "full_attention"))
    out["rope"] = tuple(local if t == "sliding_attention" else full for t in out["layer_types"])
    return out


def _gemma2_like(get, f, pattern: int) -> dict:
    window = get.nullable(get.int, "sliding_window", 4096)
    return {"act": get.str("hidden_activation", "hidden_act", default="gelu_pytorch_tanh"),
            "attn_scale": get.float("query_pre_attn_scalar", default=256) ** -0.5,
            "sliding_window": window,
            "layer_types": _layer_types(get, f, lambda i: (i + 1) % pattern != 0)}


def phi3(get, f):
    return _all_sliding(get, f, None)


def neox(get, f):
    bias = get.bool("attention_bias", default=True)
    return {"parallel_residual": get.bool("use_parallel_residual", default=True),
            "qkv_bias": bias, "o_bias": bias, "n_kv_heads": f["n_heads"]}


def smollm3(get, f):
    """SmolLM3: no_rope_layers[i] is 1 where layer i uses RoPE (default: every 4th layer has none)."""
    n, every = f["n_layers"], get.int("no_rope_layer_interval", default=4)
    uses = get.list("no_rope_layers", default=None)
    if uses is None:
        uses = [int((i + 1) % every != 0) for i in range(n)]
    if len(uses) != n or any(u not in (0, 1) for u in uses):
        raise_field(get, "no_rope_layers", f"a 0 or 1 for each of the {n} layers")
    window = get.int("sliding_window", default=None) if get.bool("use_sliding_window", default=False) else None
    rope = read_rope(get, f, {"rope_theta": 2e6})  # every layer that has RoPE has this one
    return {**_biases(get, f), "sliding_window": window, "rope": tuple(rope if u else None for u in uses),
            "layer_types": _layer_types(get, f, lambda i: window is not None and not uses[i])}


def granite(get, f):
    """Granite's four multipliers: embeddings x embedding_multiplier, scores x attention_multiplier (instead
    of 1/sqrt(head_dim)), both blocks' outputs x residual_multiplier, logits / logits_scaling. transformers'
    defaults are 1.0 for all four (attention_multiplier too: not 1/sqrt(head_dim))."""
    return {**_biases(get, f), **granite_multipliers(get)}


def granite_multipliers(get) -> dict:
    """Granite's multipliers in minigen's names (granite, granitemoe, granitemoehybrid)."""
    return {"attn_scale": get.float("attention_multiplier", default=1.0),
            "embed_multiplier": get.number("embedding_multiplier", default=1.0),
            "residual_multiplier": get.number("residual_multiplier", default=1.0),
            "logits_multiplier": 1.0 / get.float("logits_scaling", default=1.0)}


def granitemoe(get, f):
    out = {**granite(get, f), **_experts(get, "num_local_experts", 8, "num_experts_per_tok", 2)}
    out["mlp_bias"] = False  # GraniteMoE has no mlp_bias (a field its config does not read)
    return out


def _experts(get, n_name: str, n_default: int, k_name: str, k_default: int) -> dict:
    n, k = get.int(n_name, default=n_default), get.int(k_name, default=k_default)
    if k > n:
        raise_field(get, k_name, f"at most {n_name} ({n})")
    return {"n_experts": n, "experts_per_token": k}


def olmo3(get, f):
    """OLMo 3: OLMo 2 with a window on the layers layer_types says (by default 3 of every 4); sliding layers
    use plain RoPE, full layers the scaling. In the 4.x spelling (rope_theta + rope_scaling) the scaling is
    the full layers' only, and transformers gives the sliding layers Olmo3Config's default theta (500000):
    its reader pops rope_theta for the full layers first (Olmo3Config.convert_rope_params_to_dict)."""
    window = get.nullable(get.int, "sliding_window", 4096)
    types = _layer_types(get, f, lambda i: (i + 1) % 4 != 0)
    nested = isinstance(get.dict("rope_parameters").get("full_attention"), dict)
    if nested:
        full = read_rope(get, f, {"rope_theta": 500000.0}, rope_parameters(get, "full_attention"))
        local = read_rope(get, f, {"rope_theta": 500000.0}, rope_parameters(get, "sliding_attention"))
    else:
        full = read_rope(get, f, {"rope_theta": 500000.0}, get.dict("rope_scaling"))
        local = read_rope(get, f, {}, {}, theta=500000.0)
    return {**_biases(get, f), "sliding_window": window, "layer_types": types,
            "rope": tuple(local if window is not None and t == "sliding_attention" else full for t in types)}


def ministral3(get, f):
    """Ministral 3: Mistral with YaRN and llama 4's query scale (rope_parameters' llama_4_scaling_beta),
    which transformers applies on every layer with original_max_position_embeddings as its period."""
    out = {**_biases(get, f), **_all_sliding(get, f, None)}
    p = rope_parameters(get)
    rope = read_rope(get, f, {"rope_theta": 1e6}, p)
    beta = p.get("llama_4_scaling_beta")
    if beta is not None:
        if not (is_number(beta) and math.isfinite(beta)):
            raise MinigenError(f"{get.where}: rope 'llama_4_scaling_beta' should be a number, got {short(beta)}")
        if not rope.original_max:
            raise MinigenError(f"{get.where}: rope 'llama_4_scaling_beta' needs 'original_max_position_embeddings'")
        rope = replace(rope, query_beta=float(beta))
    out["rope"] = (rope,) * f["n_layers"]
    return out


def raise_field(get: Fields, name: str, what: str):
    raise MinigenError(f"{get.where}: field {name!r} should be {what}, got {get.raw.get(name)!r}")


# --- layers that are not attention: Qwen3.5, LFM2, Granite 4.0(-H), Falcon-H1 -------------------------

def _silu_conv(get: Fields, f: dict):
    """Gated DeltaNet and Mamba2 run their conv's output through hidden_act; minigen's mixers use SiLU."""
    if f["act"] not in ("silu", "swish"):
        raise_field(get, "hidden_act", '"silu" (it is also the activation after the Gated DeltaNet / Mamba2 conv)')


def _mixers(get: Fields, f: dict, kinds: dict, name: str, types: list) -> dict:
    """layer_mixers from a per-layer list of config.json layer types, each a key of `kinds`."""
    n = f["n_layers"]
    if len(types) != n or any(t not in kinds for t in types):
        raise MinigenError(f"{get.where}: field {name!r} should list one of {', '.join(sorted(kinds))} "
                           f"for each of the {n} layers, got {short_list(types)}")
    return {"layer_mixers": tuple(kinds[t] for t in types)}


def short_list(v) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def qwen3_5(get, f):
    """Qwen3.5: Gated DeltaNet in 3 of every 4 layers (full_attention_interval), gated attention with
    q/k norms and 25 % partial RoPE in the 4th."""
    every = get.int("full_attention_interval", default=4)
    types = get.list("layer_types", default=None) or \
        ["linear_attention" if (i + 1) % every else "full_attention" for i in range(f["n_layers"])]
    out = _mixers(get, f, {"linear_attention": "gated_delta", "full_attention": "attention"}, "layer_types", types)
    _silu_conv(get, f)
    out["layer_types"] = ("full_attention",) * f["n_layers"]
    out["delta_net"] = DeltaNet(
        key_heads=get.int("linear_num_key_heads", default=16), value_heads=get.int("linear_num_value_heads", default=32),
        key_dim=get.int("linear_key_head_dim", default=128), value_dim=get.int("linear_value_head_dim", default=128),
        conv_kernel=get.int("linear_conv_kernel_dim", default=4), eps=f["norm_eps"])
    if out["delta_net"].value_heads % out["delta_net"].key_heads:
        raise MinigenError(f"{get.where}: linear_num_value_heads={out['delta_net'].value_heads} is not a multiple "
                           f"of linear_num_key_heads={out['delta_net'].key_heads}")
    if get.bool("attention_bias", default=False):
        raise_field(get, "attention_bias", "false (minigen runs Qwen3.5 without attention biases)")
    return out


def lfm2(get, f):
    """LFM2: gated short convolutions, GQA with q/k norms in the layers full_attn_idxs (or layer_types)
    names; the MLP width adjusted as transformers' Lfm2MLP does."""
    types = get.list("layer_types", default=None)
    if types is None:
        attn = get.list("full_attn_idxs", default=None)
        attn = range(f["n_layers"]) if attn is None else attn
        types = ["full_attention" if i in attn else "conv" for i in range(f["n_layers"])]
    out = _mixers(get, f, {"conv": "short_conv", "full_attention": "attention"}, "layer_types", types)
    out["layer_types"] = ("full_attention",) * f["n_layers"]
    out["short_conv"] = ShortConv(kernel=get.int("conv_L_cache", default=3), bias=get.bool("conv_bias", default=False))
    F = get.int("intermediate_size", "block_ff_dim", default=12288)
    if get.bool("block_auto_adjust_ff_dim", default=True):
        F = int(2 * F / 3)
        multiplier = get.nullable(get.float, "block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            step = get.int("block_multiple_of", default=256)
            F = step * ((int(multiplier * F) + step - 1) // step)
    out["intermediate_size"] = F
    out["tie_word_embeddings"] = get.bool("tie_word_embeddings", "tie_embedding", default=True)
    return out


def _mamba(get, f, inner: int, norm: bool, norm_before_gate: bool, out_bias: bool) -> Mamba:
    heads = get.int("mamba_n_heads", default=128)
    head_dim = get.raw.get("mamba_d_head", "auto")
    head_dim = inner // heads if head_dim == "auto" else get.int("mamba_d_head")
    if heads * head_dim != inner:
        raise MinigenError(f"{get.where}: mamba_n_heads={heads} x mamba_d_head={head_dim} should be the Mamba2 "
                           f"inner size {inner}")
    groups = get.int("mamba_n_groups", default=1)
    if heads % groups:
        raise MinigenError(f"{get.where}: mamba_n_heads={heads} is not a multiple of mamba_n_groups={groups}")
    limit = get.raw.get("time_step_limit", (0.0, float("inf")))
    if isinstance(limit, (list, tuple)):  # transformers 5 writes infinity as {"__float__": "Infinity"}
        limit = [float(x["__float__"]) if isinstance(x, dict) and x.get("__float__") in FLOAT_TAGS else x
                 for x in limit]
    if limit is not None and not (isinstance(limit, list) and len(limit) == 2
                                  and all(isinstance(x, (int, float)) and not math.isnan(x) for x in limit)):
        raise_field(get, "time_step_limit", "null or two numbers")
    return Mamba(heads=heads, head_dim=head_dim, groups=groups, state_size=get.int("mamba_d_state", default=256),
                 conv_kernel=get.int("mamba_d_conv", default=4), chunk=get.int("mamba_chunk_size", default=256),
                 limit=None if limit is None else (float(limit[0]), float(limit[1])), eps=f["norm_eps"], norm=norm,
                 norm_before_gate=norm_before_gate, conv_bias=get.bool("mamba_conv_bias", default=True),
                 in_bias=get.bool("mamba_proj_bias", default=False), out_bias=out_bias)


FLOAT_TAGS = ("Infinity", "-Infinity")


def granite_hybrid(get, f):
    """Granite 4.0(-H): Mamba2 or attention per layer (layer_types, "mamba"/"attention" in the 4.x
    spelling), NoPE unless position_embedding_type is "rope", a shared gated MLP (alone, or beside routed
    experts), Granite's multipliers."""
    types = get.list("layer_types", "layers_block_type", default=None) or ["mamba"] * f["n_layers"]
    kinds = {"mamba": "mamba2", "linear_attention": "mamba2", "attention": "attention", "full_attention": "attention"}
    out = _mixers(get, f, kinds, "layer_types", types)
    out["layer_types"] = ("full_attention",) * f["n_layers"]
    if "mamba2" in out["layer_mixers"]:
        _silu_conv(get, f)
        out["mamba"] = _mamba(get, f, get.int("mamba_expand", default=2) * f["hidden_size"], norm=True,
                              norm_before_gate=False, out_bias=get.bool("mamba_proj_bias", default=False))
    kind = get.raw.get("position_embedding_type")
    if kind not in (None, "rope", "nope"):
        raise_field(get, "position_embedding_type", '"rope", "nope" or null')
    if kind != "rope":
        out["rope"] = (None,) * f["n_layers"]
    out.update(_granite_hybrid_mlp(get))
    out.update(granite_multipliers(get))
    return {**_biases(get, f), **out, "mlp_bias": False}


def _granite_hybrid_mlp(get) -> dict:
    """Granite 4.0(-H)'s MLP: the shared gated MLP (shared_intermediate_size wide) alone where
    num_local_experts is 0 (the dense models), else added to num_local_experts routed experts of
    intermediate_size each, num_experts_per_tok per token (Tiny: 64 top 6, Small: 72 top 10)."""
    shared = get.int("shared_intermediate_size", default=1024)
    n = get.raw.get("num_local_experts", 8)  # transformers' default is 8
    if is_int(n) and n == 0:
        return {"intermediate_size": shared}
    return {"mlp": "moe", **_experts(get, "num_local_experts", 8, "num_experts_per_tok", 2),
            "shared_intermediate_size": shared}


def falcon_h1(get, f):
    """Falcon-H1: attention and Mamba2 side by side in every layer, and µP multipliers on nearly every
    projection, folded into the weights at load (weight_scales) but for the embedding and logits ones."""
    n, D = f["n_layers"], f["hidden_size"]
    _silu_conv(get, f)
    inner = get.int("mamba_d_ssm", default=None) or get.int("mamba_expand", default=2) * D
    m = _mamba(get, f, inner, norm=get.bool("mamba_rms_norm", default=False),
               norm_before_gate=get.bool("mamba_norm_before_gate", default=True),
               out_bias=get.bool("projectors_bias", default=False))
    I, GN, H, d = m.inner, m.groups * m.state_size, f["n_heads"] * f["head_dim"], f["head_dim"]
    mup = _numbers(get, "ssm_multipliers", 5, [1.0] * 5)
    gate, down = _numbers(get, "mlp_multipliers", 2, [1.0, 1.0])
    kv = f["n_kv_heads"] * d
    bounds = [0, I, 2 * I, 2 * I + GN, 2 * I + 2 * GN, None]
    scales = [("w_in", a, b, x, True) for a, b, x in zip(bounds, bounds[1:], mup)] + [
        ("w_in", None, None, get.number("ssm_in_multiplier", default=1.0), False),
        ("w_out", None, None, get.number("ssm_out_multiplier", default=1.0), True),
        ("wqkv", None, None, get.number("attention_in_multiplier", default=1.0), False),
        ("wqkv", H, H + kv, get.number("key_multiplier", default=1.0), True),
        ("wo", None, None, get.number("attention_out_multiplier", default=1.0), True),
        ("w_gate_up", 0, f["intermediate_size"], gate, True), ("w_down", None, None, down, True)]
    return {**_biases(get, f), "mamba": m, "layer_mixers": ("attention+mamba2",) * n,
            "weight_scales": tuple(s for s in scales if s[3] != 1.0),
            "embed_multiplier": get.number("embedding_multiplier", default=1.0),
            "logits_multiplier": get.number("lm_head_multiplier", default=1.0)}


def _numbers(get: Fields, name: str, n: int, default: list) -> list:
    v = get.raw.get(name)
    if v is None:
        return default
    if not (isinstance(v, list) and len(v) == n and all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)):
        raise_field(get, name, f"a list of {n} numbers")
    return [float(x) for x in v]

"""The model families minigen runs, one entry each: what the forward pass switches on, how config.json
spells the family's own fields, where its tensors live in the checkpoint, and what llama.cpp made of it
in a GGUF file.

Adding a family is adding an entry here (and its fixtures), its GGUF mapping included: nothing else in
minigen names a family. `features` are Config fields fixed by the family; `defaults` are transformers'
defaults for fields config.json may leave out; `read` handles what no table can say (layer patterns,
per-layer RoPE), returning more Config fields; `tensors` maps minigen's canonical tensor names to the
checkpoint's (a tuple is stacked by rows into one matrix: q/k/v and gate/up are fused at load), `fix`
names the reshuffles some layouts need (FIXES, below), and `norm_offset` is added to every norm weight at
load (Gemma stores w of its (1 + w) norms; llama.cpp stores 1 + w, so a conversion subtracts it).

`gguf` says how llama.cpp's convert_hf_to_gguf.py wrote the family (its `conversion/*.py` in the
llama-cpp-python sdist), so that minigen.gguf can undo it: the `general.architecture` name, the HF class,
a function from the `{arch}.*` metadata to the family's own config.json fields (`Meta` and `Tensors` of
minigen/gguf/arch.py; the fields every family has are read there), and the tensor fixes by GGUF tensor
kind. What llama.cpp did, per family:

    llama, smollm3   q/k rows permuted so each head's two RoPE halves interleave ("normal" RoPE): unpermute
                     Llama 3-style RoPE scaling written as per-frequency factors (rope_freqs), not parameters
    granite, mistral3  q/k permuted, as llama (mistral3: the text GGUF of Ministral 3)
    granitemoe       q/k permuted; each layer's input_linear (E, 2F, D) split into ffn_gate_exps and
                     ffn_up_exps (minigen/gguf/convert.py joins them again)
    gemma, gemma2/3  every norm weight stored as 1 + w (norm_offset)
    gpt2             Conv1D weights transposed to (out, in)
    gpt_neox         the fused query_key_value rows reordered from per-head [q; k; v] to [all q; all k; all v]
    phi3             nothing to the matrices (qkv_proj and gate_up_proj stay fused); longrope's factors
                     written as tensors (rope_factors_long/short)
    qwen2/3, olmo2   nothing; an olmo2 file with a sliding window is OLMo 3 (llama.cpp writes both as olmo2)
    qwen3_5_text     (qwen35) norms as 1 + w but the gated one; A_log as -exp(A_log); dt_bias renamed; the conv
                     squeezed; value heads tiled (QWEN3_5_FIXES); an MTP block appended (dropped: nextn_predict_layers)
    lfm2             the short conv squeezed; head_count_kv per layer (0: a conv layer); the MLP width adjusted
    granitemoehybrid (granitehybrid) Mamba2 as below, q/k permuted, shared_mlp.input_linear split into ffn_gate
                     and ffn_up (ffn_gate_shexp and ffn_up_shexp beside routed experts, whose input_linear is
                     split as granitemoe's); head_count_kv 0 on a Mamba2 layer
    falcon_h1        every µP multiplier folded into the weights, none written; Mamba2 (MAMBA2_FIXES):
                     A_log as -exp(A_log) (H, 1), D (H, 1), the conv (C, K), the group norm (G, I/G)
Tensor names are not written by hand: the `gguf` package's own table (gguf.TensorNameMap, the one
convert_hf_to_gguf.py renames with) maps each of the family's HF names to its GGUF name.

Canonical names, per layer unless global:
    embed, pos_embed, final_norm, lm_head                  (global; a `_b` suffix is a LayerNorm bias)
    attn_norm, attn_post_norm, mlp_norm, mlp_post_norm     norms before / after attention and MLP
    q_norm, k_norm                                         RMSNorm on q and k
    wqkv, bqkv, wo, bo                                     attention: fused q/k/v (out, in), output proj
    w_gate_up, b_gate_up, w_up, b_up, w_down, b_down       MLP: fused gate/up (gated) or up (plain)
    w_in, b_in, conv_w, conv_b, w_out, b_out               the other mixers: input projection (fused),
                                                           depthwise conv (C, K), output projection
    A_log, dt_bias, D, gate_norm                           Gated DeltaNet / Mamba2: decay, step bias, skip,
                                                           the output's gated RMSNorm
    router, experts_gate_up, experts_down                  routed experts (moe): (E, D), (E, 2F, D), (E, D, F);
                                                           w_gate_up, w_down beside them: the shared MLP (Granite 4.0-H)

A multimodal checkpoint (`WRAPPERS`: Gemma 3, Mistral 3, Qwen3.5) is read as its language model: its
config.json's `text_config` is the family's config, its tensors under the language model's prefix are the
family's tensors, and the vision tower and projector are left unread.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from .fields import Fields
from .rope import read_rope, rope_parameters
from ..engine.config import DeltaNet, Mamba, ShortConv
from ..errors import MinigenError, is_int, is_number, short


@dataclass(frozen=True)
class Gguf:
    """How llama.cpp wrote a family into a GGUF file."""
    arch: str                             # general.architecture
    hf_class: str                         # config.json's architectures[0]
    config: Callable                      # (Meta, Tensors) -> the family's own config.json fields
    fixes: dict = field(default_factory=dict)  # GGUF tensor kind ("attn_q") -> a FIXES name
    rope_dims: str = "full"               # "full": rope.dimension_count must be head_dim; "partial": may be less
    rope_factors: str | None = None       # "llama3": a rope_freqs tensor; "longrope": rope_factors_long/short
    spell: Callable = lambda cfg: cfg     # the family's own config.json names, where it has them
    tensors: dict = field(default_factory=dict)  # canonical tensor -> its GGUF name without "blk.N.", where the
    #                                       gguf package's table has none or another; a tuple: the GGUF tensors
    #                                       llama.cpp split it into by rows, joined again (Granite 4.0-H's MLP);
    #                                       a list: alternatives, of which a file has one (that MLP's ffn_* in a
    #                                       dense file, ffn_*_shexp beside routed experts)
    recurrent: bool = False               # attention.head_count_kv 0 marks a recurrent layer (LFM2, Granite 4.0-H)


@dataclass(frozen=True)
class Family:
    tensors: dict
    features: dict = field(default_factory=dict)
    defaults: dict = field(default_factory=dict)
    read: Callable[[Fields, dict], dict] = lambda get, f: {}
    fix: dict = field(default_factory=dict)       # canonical tensor -> a FIXES name
    ignored: tuple = ()                           # buffers old checkpoints carry (templates)
    prefixes: tuple = ()                          # stripped from tensor names when present
    norm_offset: float = 0.0
    plain_norms: tuple = ()                       # norms norm_offset leaves alone (Qwen3.5's gated one)
    skipped: tuple = ()                           # tensor-name prefixes not loaded (a vision tower, MTP heads)
    gguf: Gguf | None = None                      # None: llama.cpp writes none (or as another family)


# --- tensor name tables ---------------------------------------------------------------------------

def _llama_tensors(p: str = "model.layers.{}.", **changes) -> dict:
    t = {
        "embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight", "lm_head": "lm_head.weight",
        "attn_norm": p + "input_layernorm.weight", "mlp_norm": p + "post_attention_layernorm.weight",
        "wqkv": tuple(p + f"self_attn.{x}_proj.weight" for x in "qkv"),
        "bqkv": tuple(p + f"self_attn.{x}_proj.bias" for x in "qkv"),
        "wo": p + "self_attn.o_proj.weight", "bo": p + "self_attn.o_proj.bias",
        "q_norm": p + "self_attn.q_norm.weight", "k_norm": p + "self_attn.k_norm.weight",
        "w_gate_up": (p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
        "b_gate_up": (p + "mlp.gate_proj.bias", p + "mlp.up_proj.bias"),
        "w_down": p + "mlp.down_proj.weight", "b_down": p + "mlp.down_proj.bias",
    }
    return {**t, **changes}


LLAMA = _llama_tensors()
LLAMA_IGNORED = ("model.layers.{}.self_attn.rotary_emb.inv_freq",)
SANDWICH = _llama_tensors(  # Gemma 2/3: a norm before and after both attention and MLP
    attn_post_norm="model.layers.{}.post_attention_layernorm.weight",
    mlp_norm="model.layers.{}.pre_feedforward_layernorm.weight",
    mlp_post_norm="model.layers.{}.post_feedforward_layernorm.weight")
OLMO2 = _llama_tensors(  # norms after attention and MLP only
    attn_post_norm="model.layers.{}.post_attention_layernorm.weight",
    mlp_post_norm="model.layers.{}.post_feedforward_layernorm.weight")
PHI3 = _llama_tensors(wqkv="model.layers.{}.self_attn.qkv_proj.weight",
                      w_gate_up="model.layers.{}.mlp.gate_up_proj.weight")

GPT2 = {
    "embed": "wte.weight", "pos_embed": "wpe.weight", "final_norm": "ln_f.weight", "final_norm_b": "ln_f.bias",
    "lm_head": "lm_head.weight",
    "attn_norm": "h.{}.ln_1.weight", "attn_norm_b": "h.{}.ln_1.bias",
    "wqkv": "h.{}.attn.c_attn.weight", "bqkv": "h.{}.attn.c_attn.bias",
    "wo": "h.{}.attn.c_proj.weight", "bo": "h.{}.attn.c_proj.bias",
    "mlp_norm": "h.{}.ln_2.weight", "mlp_norm_b": "h.{}.ln_2.bias",
    "w_up": "h.{}.mlp.c_fc.weight", "b_up": "h.{}.mlp.c_fc.bias",
    "w_down": "h.{}.mlp.c_proj.weight", "b_down": "h.{}.mlp.c_proj.bias",
}

_N = "gpt_neox.layers.{}."
NEOX = {
    "embed": "gpt_neox.embed_in.weight", "lm_head": "embed_out.weight",
    "final_norm": "gpt_neox.final_layer_norm.weight", "final_norm_b": "gpt_neox.final_layer_norm.bias",
    "attn_norm": _N + "input_layernorm.weight", "attn_norm_b": _N + "input_layernorm.bias",
    "mlp_norm": _N + "post_attention_layernorm.weight", "mlp_norm_b": _N + "post_attention_layernorm.bias",
    "wqkv": _N + "attention.query_key_value.weight", "bqkv": _N + "attention.query_key_value.bias",
    "wo": _N + "attention.dense.weight", "bo": _N + "attention.dense.bias",
    "w_up": _N + "mlp.dense_h_to_4h.weight", "b_up": _N + "mlp.dense_h_to_4h.bias",
    "w_down": _N + "mlp.dense_4h_to_h.weight", "b_down": _N + "mlp.dense_4h_to_h.bias",
}


GRANITEMOE = {k: v for k, v in _llama_tensors(
    router="model.layers.{}.block_sparse_moe.router.layer.weight",
    experts_gate_up="model.layers.{}.block_sparse_moe.input_linear.weight",
    experts_down="model.layers.{}.block_sparse_moe.output_linear.weight").items()
    if not k.startswith(("w_gate_up", "b_gate_up", "w_down", "b_down"))}
PHI3 = _llama_tensors(wqkv="model.layers.{}.self_attn.qkv_proj.weight",
                      w_gate_up="model.layers.{}.mlp.gate_up_proj.weight")


# --- config quirks ----------------------------------------------------------------------------------

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


def _llama(get, f):
    return _biases(get, f)


def _mistral(get, f):
    return {**_biases(get, f), **_all_sliding(get, f, 4096)}


def _qwen(get, f):
    return {**_biases(get, f), **_qwen_sliding(get, f)}


def _gemma(get, f):
    act = f["act"]  # hub Gemma 1 configs say "gelu" and mean the tanh form, as transformers reads them
    return {**_biases(get, f), "act": "gelu_pytorch_tanh" if act == "gelu" else act}


def _gemma2(get, f):
    return {**_biases(get, f), **_gemma2_like(get, f, pattern=2),
            "attn_softcap": get.nullable(get.float, "attn_logit_softcapping", 50.0),
            "final_softcap": get.nullable(get.float, "final_logit_softcapping", 30.0)}


def _gemma3(get, f):
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


def _phi3(get, f):
    return _all_sliding(get, f, None)


def _neox(get, f):
    bias = get.bool("attention_bias", default=True)
    return {"parallel_residual": get.bool("use_parallel_residual", default=True),
            "qkv_bias": bias, "o_bias": bias, "n_kv_heads": f["n_heads"]}


def _smollm3(get, f):
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


def _granite(get, f):
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


def _granitemoe(get, f):
    out = {**_granite(get, f), **_experts(get, "num_local_experts", 8, "num_experts_per_tok", 2)}
    out["mlp_bias"] = False  # GraniteMoE has no mlp_bias (a field its config does not read)
    return out


def _experts(get, n_name: str, n_default: int, k_name: str, k_default: int) -> dict:
    n, k = get.int(n_name, default=n_default), get.int(k_name, default=k_default)
    if k > n:
        raise_field(get, k_name, f"at most {n_name} ({n})")
    return {"n_experts": n, "experts_per_token": k}


def _olmo3(get, f):
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


def _ministral3(get, f):
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


# --- layers that are not attention: Qwen3.5, LFM2, Granite 4.0(-H), Falcon-H1 ----------------------

_Q = "model.layers.{}."
QWEN3_5 = _llama_tensors(
    w_in=tuple(_Q + f"linear_attn.in_proj_{x}.weight" for x in ("qkv", "z", "b", "a")),
    conv_w=_Q + "linear_attn.conv1d.weight", A_log=_Q + "linear_attn.A_log", dt_bias=_Q + "linear_attn.dt_bias",
    gate_norm=_Q + "linear_attn.norm.weight", w_out=_Q + "linear_attn.out_proj.weight")
LFM2 = _llama_tensors(
    final_norm="model.embedding_norm.weight", attn_norm=_Q + "operator_norm.weight",
    mlp_norm=_Q + "ffn_norm.weight", wo=_Q + "self_attn.out_proj.weight",
    q_norm=_Q + "self_attn.q_layernorm.weight", k_norm=_Q + "self_attn.k_layernorm.weight",
    w_gate_up=(_Q + "feed_forward.w1.weight", _Q + "feed_forward.w3.weight"), w_down=_Q + "feed_forward.w2.weight",
    w_in=_Q + "conv.in_proj.weight", b_in=_Q + "conv.in_proj.bias", conv_w=_Q + "conv.conv.weight",
    conv_b=_Q + "conv.conv.bias", w_out=_Q + "conv.out_proj.weight", b_out=_Q + "conv.out_proj.bias")
_MAMBA = dict(w_in=_Q + "mamba.in_proj.weight", b_in=_Q + "mamba.in_proj.bias", conv_w=_Q + "mamba.conv1d.weight",
              conv_b=_Q + "mamba.conv1d.bias", A_log=_Q + "mamba.A_log", dt_bias=_Q + "mamba.dt_bias", D=_Q + "mamba.D",
              gate_norm=_Q + "mamba.norm.weight", w_out=_Q + "mamba.out_proj.weight", b_out=_Q + "mamba.out_proj.bias")
GRANITE_HYBRID = _llama_tensors(w_gate_up=_Q + "shared_mlp.input_linear.weight",
                                w_down=_Q + "shared_mlp.output_linear.weight", **_MAMBA,
                                **{k: GRANITEMOE[k] for k in ("router", "experts_gate_up", "experts_down")})
FALCON_H1 = _llama_tensors(final_norm="model.final_layernorm.weight", mlp_norm=_Q + "pre_ff_layernorm.weight",
                           w_gate_up=(_Q + "feed_forward.gate_proj.weight", _Q + "feed_forward.up_proj.weight"),
                           b_gate_up=(_Q + "feed_forward.gate_proj.bias", _Q + "feed_forward.up_proj.bias"),
                           w_down=_Q + "feed_forward.down_proj.weight", b_down=_Q + "feed_forward.down_proj.bias",
                           **_MAMBA)


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


def _qwen3_5(get, f):
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


def _lfm2(get, f):
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


def _granite_hybrid(get, f):
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


def _falcon_h1(get, f):
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


# --- GGUF metadata -> the family's own config.json fields (the common ones: minigen/gguf/arch.py) ------------

def _gguf_llama(m, t) -> dict:
    return {"hidden_act": "silu", "rms_norm_eps": m.float("attention.layer_norm_rms_epsilon"),
            "attention_bias": t.has("blk.0.attn_q.bias"), "mlp_bias": t.has("blk.0.ffn_gate.bias")}


def _gguf_qwen2(m, t) -> dict:
    return {"hidden_act": "silu", "rms_norm_eps": m.float("attention.layer_norm_rms_epsilon"),
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": m.int("block_count")}


def _gguf_qwen3(m, t) -> dict:
    return {**_gguf_qwen2(m, t), "attention_bias": t.has("blk.0.attn_q.bias")}


def _gguf_gemma(m, t) -> dict:
    return {"hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
            "rms_norm_eps": m.float("attention.layer_norm_rms_epsilon")}


def _gemma_attention_scale(m, n_layers: int, layers_27b: int) -> float:
    """llama.cpp scales scores by 1/sqrt(head_dim), except for the 27B models (by layer count), where it uses
    1/sqrt(hidden / heads): HF's query_pre_attn_scalar, which the GGUF does not carry."""
    if n_layers == layers_27b:
        return m.int("embedding_length") // m.int("attention.head_count")
    return m.int("attention.key_length", default=m.int("embedding_length") // m.int("attention.head_count"))


def _gguf_gemma2(m, t) -> dict:
    n = m.int("block_count")
    return {**_gguf_gemma(m, t),
            "query_pre_attn_scalar": _gemma_attention_scale(m, n, layers_27b=46),
            "attn_logit_softcapping": m.float("attn_logit_softcapping", default=50.0),   # llama.cpp's defaults
            "final_logit_softcapping": m.float("final_logit_softcapping", default=30.0),
            "sliding_window": m.int("attention.sliding_window", default=4096),
            "layer_types": m.sliding_pattern(n, default=2)}


def _gguf_gemma3(m, t) -> dict:
    """Gemma 3: sliding layers use rope.freq_base_swa (llama.cpp's default 10000) without scaling; full
    layers rope.freq_base with the file's scaling. No sliding window (or 0) means every layer is full."""
    n = m.int("block_count")
    window = m.int("attention.sliding_window", default=0, minimum=0)
    softcap = m.raw.get(f"{m.arch}.final_logit_softcapping")
    return {**_gguf_gemma(m, t),
            "query_pre_attn_scalar": _gemma_attention_scale(m, n, layers_27b=62),
            "final_logit_softcapping": m.float("final_logit_softcapping") if softcap else None,
            "attn_logit_softcapping": None,
            "sliding_window": window or None,
            "rope_local_base_freq": m.float("rope.freq_base_swa", default=10000.0),
            "layer_types": m.sliding_pattern(n, default=6) if window else ["full_attention"] * n}


def _gguf_phi3(m, t) -> dict:
    """Phi-3: a window of 0 means none (llama.cpp writes 0 for Phi-4); partial rotary from rope.dimension_count."""
    window = m.int("attention.sliding_window", default=0, minimum=0)
    return {"hidden_act": "silu", "rms_norm_eps": m.float("attention.layer_norm_rms_epsilon"),
            "sliding_window": window or None,
            "original_max_position_embeddings": m.int("rope.scaling.original_context_length",
                                                      default=m.int("context_length"))}


def _gguf_gpt2(m, t) -> dict:
    return {"activation_function": "gelu_new", "layer_norm_epsilon": m.float("attention.layer_norm_epsilon")}


def _gguf_olmo2(m, t) -> dict:
    """OLMo 2, or OLMo 3 when the file has a sliding window (llama.cpp writes both as olmo2): then the window's
    layers from sliding_window_pattern (llama.cpp's default period 4), plain RoPE on them (rope.freq_base_swa,
    else freq_base: llama.cpp's reading), the scaling on the full layers; as transformers 5's nested
    rope_parameters, which keeps the two apart."""
    out = {"hidden_act": "silu", "rms_norm_eps": m.float("attention.layer_norm_rms_epsilon"),
           "attention_bias": t.has("blk.0.attn_q.bias")}
    window = m.int("attention.sliding_window", default=0, minimum=0)
    if not window:
        return out
    base = m.float("rope.freq_base", default=10000.0)
    full = {"rope_type": "default", "rope_theta": base, **(m.rope_scaling() or {})}
    full.pop("type", None)
    return {**out, "model_type": "olmo3", "architectures": ["Olmo3ForCausalLM"], "sliding_window": window,
            "layer_types": m.sliding_pattern(m.int("block_count"), default=4),
            "rope_parameters": {"full_attention": full, "sliding_attention": {
                "rope_type": "default", "rope_theta": m.float("rope.freq_base_swa", default=base)}},
            "rope_theta": None, "rope_scaling": None}


def _gguf_gpt_neox(m, t) -> dict:
    return {"hidden_act": "gelu", "layer_norm_eps": m.float("attention.layer_norm_epsilon"),
            "use_parallel_residual": m.bool("use_parallel_residual"),
            "attention_bias": t.has("blk.0.attn_qkv.bias")}


def _gguf_smollm3(m, t) -> dict:
    """SmolLM3: llama.cpp hard-codes NoPE on every 4th layer (n_no_rope_layer_step); the GGUF has no key for it."""
    n = m.int("block_count")
    return {**_gguf_llama(m, t), "no_rope_layer_interval": 4,
            "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(n)], "use_sliding_window": False,
            "sliding_window": None}


def _gguf_granite(m, t) -> dict:
    """Granite's multipliers as llama.cpp reads them: logit_scale is required; no attention.scale means
    1/sqrt(head_dim), no residual or embedding scale means none (1)."""
    head_dim = m.int("attention.key_length", default=m.int("embedding_length") // m.int("attention.head_count"))
    return {**_gguf_llama(m, t), "logits_scaling": m.float("logit_scale"),
            "attention_multiplier": m.float("attention.scale", default=head_dim ** -0.5),
            "residual_multiplier": m.float("residual_scale", default=1.0),
            "embedding_multiplier": m.float("embedding_scale", default=1.0)}


def _gguf_granitemoe(m, t) -> dict:
    """GraniteMoE: Granite's multipliers and routed experts (expert_count, expert_used_count); llama.cpp split
    each layer's input_linear into ffn_gate_exps and ffn_up_exps (minigen/gguf/convert.py joins them again)."""
    return {**_gguf_granite(m, t), **_gguf_experts(m)}


def _gguf_experts(m) -> dict:
    """expert_count routed experts, expert_used_count of them per token."""
    n, k = m.int("expert_count"), m.int("expert_used_count")
    if k > n:
        m.fail("expert_used_count", f"({k}) is more than expert_count ({n})")
    return {"num_local_experts": n, "num_experts_per_tok": k}


def _gguf_mistral3(m, t) -> dict:
    """Ministral 3 (the text GGUF of a Mistral 3 checkpoint): Llama with YaRN and, from
    attention.temperature_scale, llama 4's query scale (its period: YaRN's original context)."""
    out = {**_gguf_llama(m, t), "sliding_window": m.int("attention.sliding_window", default=0, minimum=0) or None}
    beta = m.float("attention.temperature_scale", default=None)
    if beta is not None:
        if m.str("rope.scaling.type", default="none") != "yarn":
            m.fail("attention.temperature_scale", "is set without YaRN (rope.scaling.type yarn), whose original "
                                                  "context is its period")
        out["llama_4_scaling_beta"] = beta  # moved into rope_scaling by gguf/arch.py's family_config
    return out


def _gguf_qwen3_5(m, t) -> dict:
    """Qwen3.5 (qwen35): the Gated DeltaNet sizes from ssm.* (state_size: a key head's dims, group_count: key
    heads, time_step_rank: value heads, inner_size: all value heads' dims), which layers are attention from
    attention.recurrent_layers or full_attention_interval (llama.cpp's default 4). The MRoPE sections
    (rope.dimension_sections) are not read: text positions are the same in all three."""
    n = m.layers()
    flags = m.raw.get(f"{m.arch}.attention.recurrent_layers")
    if flags is None:
        every = m.int("full_attention_interval", default=4)
        flags = [(i + 1) % every != 0 for i in range(n)]
    elif not (isinstance(flags, list) and len(flags) >= n and all(isinstance(f, bool) for f in flags)):
        m.fail("attention.recurrent_layers", f"should list a flag for each of the {n} layers")
    heads, inner = m.int("ssm.time_step_rank"), m.int("ssm.inner_size")
    if inner % heads:
        m.fail("ssm.inner_size", f"({inner}) is not a multiple of ssm.time_step_rank ({heads}), the value heads")
    return {"hidden_act": "silu", "rms_norm_eps": m.float("attention.layer_norm_rms_epsilon"),
            "layer_types": ["linear_attention" if f else "full_attention" for f in flags[:n]],
            "linear_conv_kernel_dim": m.int("ssm.conv_kernel"), "linear_key_head_dim": m.int("ssm.state_size"),
            "linear_num_key_heads": m.int("ssm.group_count"), "linear_num_value_heads": heads,
            "linear_value_head_dim": inner // heads, "attention_bias": False}


def _gguf_lfm2(m, t) -> dict:
    """LFM2: a layer is a short conv where attention.head_count_kv is 0; feed_forward_length is the MLP's width
    after Lfm2MLP's adjustment (llama.cpp's converter made it), so no adjustment is asked for again."""
    if m.int("attention.sliding_window", default=0, minimum=0):
        m.fail("attention.sliding_window", "is set; minigen runs LFM2 with full attention only")
    return {"hidden_act": "silu", "norm_eps": m.float("attention.layer_norm_rms_epsilon"),
            "layer_types": ["conv" if kv == 0 else "full_attention" for kv in m.head_counts_kv()],
            "conv_L_cache": m.int("shortconv.l_cache"), "conv_bias": t.any("shortconv.conv.bias"),
            "block_auto_adjust_ff_dim": False}


def _gguf_mamba2(m, t, inner: int) -> dict:
    """The Mamba2 fields Granite 4.0-H and Falcon-H1 share: heads (ssm.time_step_rank), groups, state, conv,
    biases by their tensors."""
    heads = m.int("ssm.time_step_rank")
    if inner % heads:
        m.fail("ssm.inner_size", f"({inner}) is not a multiple of ssm.time_step_rank ({heads}), the heads")
    return {"hidden_act": "silu", "rms_norm_eps": m.float("attention.layer_norm_rms_epsilon"),
            "mamba_n_heads": heads, "mamba_d_head": inner // heads, "mamba_n_groups": m.int("ssm.group_count"),
            "mamba_d_state": m.int("ssm.state_size"), "mamba_d_conv": m.int("ssm.conv_kernel"),
            "mamba_conv_bias": t.any("ssm_conv1d.bias"), "mamba_proj_bias": t.any("ssm_in.bias")}


def _gguf_granite_hybrid(m, t) -> dict:
    """Granite 4.0-H (granitehybrid): a layer is Mamba2 where attention.head_count_kv is 0; Granite's multipliers
    as llama.cpp reads them (none required: no logit_scale is no scaling, no attention.scale 1/sqrt(head_dim));
    RoPE only when rope.scaling.finetuned says so (llama.cpp's switch for it, default on); the shared MLP's width
    (expert_shared_feed_forward_length, else feed_forward_length) and, where expert_count is not 0, routed
    experts of feed_forward_length each (Tiny, Small)."""
    hidden, inner = m.int("embedding_length"), m.int("ssm.inner_size")
    if inner % hidden:
        m.fail("ssm.inner_size", f"({inner}) is not a multiple of embedding_length ({hidden}), the Mamba2 expansion")
    head_dim = m.int("attention.key_length", default=hidden // m.int("attention.head_count"))
    return {**_gguf_mamba2(m, t, inner), "mamba_expand": inner // hidden, **_gguf_hybrid_mlp(m),
            "layer_types": ["mamba" if kv == 0 else "attention" for kv in m.head_counts_kv()],
            "position_embedding_type": "rope" if m.bool("rope.scaling.finetuned", default=True) else "nope",
            "logits_scaling": m.float("logit_scale", default=1.0),
            "attention_multiplier": m.float("attention.scale", default=head_dim ** -0.5),
            "residual_multiplier": m.float("residual_scale", default=1.0),
            "embedding_multiplier": m.float("embedding_scale", default=1.0),
            "attention_bias": t.any("attn_q.bias")}


def _gguf_hybrid_mlp(m) -> dict:
    """Granite 4.0-H's MLP. Dense (expert_count 0 or absent): the shared MLP alone, expert_shared_feed_forward_length
    wide, else feed_forward_length. With experts: expert_count of feed_forward_length each beside the shared MLP,
    whose width key is then required (llama.cpp runs no shared MLP without it; Granite 4.0-H always has one)."""
    if not m.int("expert_count", default=0, minimum=0):
        return {"num_local_experts": 0, "shared_intermediate_size": m.int("expert_shared_feed_forward_length",
                                                                          default=m.int("feed_forward_length"))}
    if not m.has("expert_shared_feed_forward_length"):
        m.fail("expert_shared_feed_forward_length", "is missing: Granite 4.0-H's routed experts come with a shared "
                                                    "MLP (ffn_*_shexp), and its width is that key")
    return {**_gguf_experts(m), "shared_intermediate_size": m.int("expert_shared_feed_forward_length")}


def _gguf_falcon_h1(m, t) -> dict:
    """Falcon-H1: llama.cpp's converter folded every µP multiplier into the weights (embeddings, lm_head, q/k/v,
    o, in_proj's five parts, out_proj, gate, down) and writes none, so each is 1 here; the output's gated norm
    when ssm_norm is there, the gate applied first (llama.cpp's order)."""
    inner = m.int("ssm.inner_size")
    return {**_gguf_mamba2(m, t, inner), "mamba_d_ssm": inner, "mamba_rms_norm": t.any("ssm_norm.weight"),
            "mamba_norm_before_gate": False, "projectors_bias": t.any("ssm_out.bias"),
            "attention_bias": t.any("attn_q.bias"), "embedding_multiplier": 1.0, "lm_head_multiplier": 1.0,
            "key_multiplier": 1.0, "attention_in_multiplier": 1.0, "attention_out_multiplier": 1.0,
            "ssm_in_multiplier": 1.0, "ssm_out_multiplier": 1.0, "ssm_multipliers": [1.0] * 5,
            "mlp_multipliers": [1.0, 1.0]}


def _neox_names(cfg: dict) -> dict:
    """Pythia's config.json spells partial rotary and the RoPE base its own way."""
    out = dict(cfg, rotary_emb_base=cfg["rope_theta"])
    out["rotary_pct"] = out.pop("partial_rotary_factor", 1.0)
    return out


def _gpt2_names(cfg: dict) -> dict:
    """GPT-2's config.json has its own names (n_embd, n_layer, ...)."""
    return {"architectures": cfg["architectures"], "model_type": "gpt2", "n_embd": cfg["hidden_size"],
            "n_layer": cfg["num_hidden_layers"], "n_head": cfg["num_attention_heads"],
            "n_inner": cfg["intermediate_size"], "n_positions": cfg["max_position_embeddings"],
            "n_ctx": cfg["max_position_embeddings"], "vocab_size": cfg["vocab_size"],
            "tie_word_embeddings": cfg["tie_word_embeddings"], "activation_function": cfg["activation_function"],
            "layer_norm_epsilon": cfg["layer_norm_epsilon"]}


# --- the tensor fixes: one table, on whole tensors in HF's (out, in) orientation (a vector: its rows) ----------
#
# Each takes (w, cfg), cfg the checkpoint's engine Config (heads, KV heads, the recurrent layers' sizes).
# `fix` of a family applies one when a Hugging Face checkpoint is loaded; `Gguf.fixes` when a GGUF is
# converted into one (undoing what llama.cpp's converter did; those may also change the tensor's shape).

def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute` (conversion/llama.py): per head, interleaved RoPE pairs -> HF's two halves."""
    rows = w.shape[0]
    # (n_head, head_dim/2, 2, ...) -> (n_head, 2, head_dim/2, ...)
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def neox_interleave(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's GPT-NeoX qkv reorder: rows [all q; all k; all v] -> HF's per-head [q; k; v]."""
    d = w.shape[0] // 3 // n_head
    # (3, H, d, ...) -> (H, 3, d, ...)
    return w.reshape(3, n_head, d, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape)


def neox_group(w: np.ndarray, n_head: int) -> np.ndarray:
    """GPT-NeoX's checkpoints interleave q, k, v per head: rows (H, 3, d) -> (3, H, d), minigen's
    [all q; all k; all v] (what llama.cpp also writes)."""
    d = w.shape[0] // 3 // n_head
    return np.ascontiguousarray(w.reshape(n_head, 3, d, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape))


def gated_q(w: np.ndarray, heads: int, kv: int) -> np.ndarray:
    """Qwen3.5's q_proj holds each head's query and output gate side by side, rows (H, 2, d): the fused
    [q_proj; k_proj; v_proj] becomes [all q; k; v; all gates], so that q, k, v lead as in every family."""
    d = w.shape[0] // (2 * heads + 2 * kv)
    qg = w[:2 * heads * d].reshape(heads, 2, d, *w.shape[1:])
    return np.ascontiguousarray(np.concatenate([qg[:, 0].reshape(heads * d, *w.shape[1:]), w[2 * heads * d:],
                                                qg[:, 1].reshape(heads * d, *w.shape[1:])]))


def untile(w: np.ndarray, groups: int, per_group: int, axis: int = 0) -> np.ndarray:
    """Inverse of llama.cpp's _reorder_v_heads (conversion/qwen.py): Qwen3.5 keeps its value heads grouped by
    key head ([k0's v0..v(r-1)], [k1's ...]); llama.cpp tiles them ([v0 of every k], [v1 of every k], ...)
    along `axis` so that ggml can broadcast the key heads. Each head spans the axis's length / (G r) entries."""
    x = np.moveaxis(w, axis, 0)
    d = x.shape[0] // (groups * per_group)
    # (r, G, d, ...) -> (G, r, d, ...)
    x = x.reshape(per_group, groups, d, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)
    return np.ascontiguousarray(np.moveaxis(x, 0, axis))


def a_log(w: np.ndarray) -> np.ndarray:
    """A_log back from llama.cpp's ssm_a = -exp(A_log) (Mamba2, Gated DeltaNet), as a vector."""
    if not np.all(w < 0):
        raise MinigenError("holds values that are not negative, so it is not llama.cpp's -exp(A_log)")
    return np.log(-w.astype(np.float64)).astype(np.float32).reshape(-1)


def _untile_heads(w: np.ndarray, c, axis: int = 0) -> np.ndarray:
    """Qwen3.5's value heads along `axis` back in HF's order (c: the Config, its delta_net sizes)."""
    dn = c.delta_net
    return untile(w, dn.key_heads, dn.value_heads // dn.key_heads, axis)


def _untile_qkv(w: np.ndarray, c) -> np.ndarray:
    """in_proj_qkv's rows (or the conv's channels) [q; k; v]: only v's heads were tiled."""
    qk = 2 * c.delta_net.key_heads * c.delta_net.key_dim
    return np.concatenate([w[:qk], _untile_heads(w[qk:], c)])


FIXES = {
    "conv1d": lambda w, c: np.ascontiguousarray(w.T),               # GPT-2's Conv1D stores (in, out)
    "neox_qkv": lambda w, c: neox_group(w, c.n_heads),              # HF GPT-NeoX -> minigen's fused order
    "neox_per_head": lambda w, c: neox_interleave(w, c.n_heads),    # llama.cpp's GPT-NeoX -> HF's
    "unpermute_q": lambda w, c: unpermute(w, c.n_heads),            # llama.cpp's Llama q -> HF's
    "unpermute_k": lambda w, c: unpermute(w, c.n_kv_heads),         # ... and k, by KV heads
    "gated_q": lambda w, c: gated_q(w, c.n_heads, c.n_kv_heads),    # Qwen3.5's q and output gate, per head
    "depthwise": lambda w, c: np.ascontiguousarray(w.reshape(w.shape[0], w.shape[-1])),  # (C, 1, K) -> (C, K)
    # llama.cpp's recurrent layers, undone when a GGUF is converted (GGUF rows x columns in, HF's shape out)
    "channels": lambda w, c: w.reshape(w.shape[0], 1, w.shape[1]),  # ssm_conv1d, shortconv (C, K) -> (C, 1, K)
    "vector": lambda w, c: w.reshape(-1),                            # Mamba2's ssm_d (H, 1), ssm_norm (G, I/G)
    "a_log": lambda w, c: a_log(w),                                  # Mamba2's ssm_a = -exp(A_log), (H, 1)
    "dn_rows": lambda w, c: _untile_heads(w, c),                     # Qwen3.5's z, b, a rows, dt_bias
    "dn_a_log": lambda w, c: _untile_heads(a_log(w), c),             # ... its ssm_a
    "dn_qkv": lambda w, c: _untile_qkv(w, c),                        # ... in_proj_qkv: v's rows
    "dn_conv": lambda w, c: _untile_qkv(w, c).reshape(w.shape[0], 1, w.shape[1]),  # ... the conv: v's channels
    "dn_out": lambda w, c: _untile_heads(w, c, axis=1),              # ... out_proj: v's columns
}
PERMUTED = {"attn_q": "unpermute_q", "attn_k": "unpermute_k"}
MAMBA2_FIXES = {"ssm_a": "a_log", "ssm_d": "vector", "ssm_norm": "vector", "ssm_conv1d.weight": "channels"}
QWEN3_5_FIXES = {"ssm_a": "dn_a_log", "ssm_dt": "dn_rows", "attn_gate": "dn_rows", "ssm_beta": "dn_rows",
                 "ssm_alpha": "dn_rows", "attn_qkv": "dn_qkv", "ssm_conv1d.weight": "dn_conv", "ssm_out": "dn_out"}
DT_BIAS = {"dt_bias": "ssm_dt.bias"}  # llama.cpp's converter renames dt_bias to dt_proj.bias before its table
GRANITE_HYBRID_SHARED_MLP = {  # shared_mlp.input_linear split into gate and up: ffn_* in a dense file, ffn_*_shexp
    "w_gate_up": [("ffn_gate.weight", "ffn_up.weight"), ("ffn_gate_shexp.weight", "ffn_up_shexp.weight")],
    "w_down": ["ffn_down.weight", "ffn_down_shexp.weight"]}   # beside routed experts (conversion/granite.py)


# --- the table ------------------------------------------------------------------------------------------------

GEMMA_FEATURES = dict(embed_scale=True)
GEMMA_DEFAULTS = dict(head_dim=256, tie_word_embeddings=True, max_position_embeddings=8192, act="gelu_pytorch_tanh")

FAMILIES = {
    "gpt2": Family(
        GPT2, features=dict(norm="layer", mlp="plain", positions="learned", qkv_bias=True, o_bias=True,
                            mlp_bias=True),
        defaults=dict(act="gelu_new", norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=1024),
        fix={"wqkv": "conv1d", "wo": "conv1d", "w_up": "conv1d", "w_down": "conv1d"},
        ignored=("h.{}.attn.bias", "h.{}.attn.masked_bias"), prefixes=("transformer.",),
        gguf=Gguf("gpt2", "GPT2LMHeadModel", _gguf_gpt2, spell=_gpt2_names,
                  fixes={"attn_qkv": "conv1d", "attn_output": "conv1d", "ffn_up": "conv1d", "ffn_down": "conv1d"})),
    "llama": Family(LLAMA, read=_llama, ignored=LLAMA_IGNORED,
                    gguf=Gguf("llama", "LlamaForCausalLM", _gguf_llama, fixes=PERMUTED, rope_factors="llama3")),
    "mistral": Family(LLAMA, read=_mistral, ignored=LLAMA_IGNORED, defaults=dict(max_position_embeddings=131072)),
    "qwen2": Family(LLAMA, features=dict(qkv_bias=True), read=_qwen, ignored=LLAMA_IGNORED,
                    defaults=dict(max_position_embeddings=32768),
                    gguf=Gguf("qwen2", "Qwen2ForCausalLM", _gguf_qwen2)),
    "qwen3": Family(LLAMA, features=dict(qk_norm="head"), read=_qwen, ignored=LLAMA_IGNORED,
                    defaults=dict(head_dim=128, max_position_embeddings=32768),
                    gguf=Gguf("qwen3", "Qwen3ForCausalLM", _gguf_qwen3)),
    "gemma": Family(LLAMA, features=GEMMA_FEATURES, defaults=GEMMA_DEFAULTS, read=_gemma, norm_offset=1.0,
                    ignored=LLAMA_IGNORED, gguf=Gguf("gemma", "GemmaForCausalLM", _gguf_gemma)),
    "gemma2": Family(SANDWICH, features=dict(GEMMA_FEATURES, post_norms=True), defaults=GEMMA_DEFAULTS,
                     read=_gemma2, norm_offset=1.0, gguf=Gguf("gemma2", "Gemma2ForCausalLM", _gguf_gemma2)),
    "gemma3_text": Family(SANDWICH, features=dict(GEMMA_FEATURES, post_norms=True, qk_norm="head"),
                          defaults=dict(GEMMA_DEFAULTS, max_position_embeddings=131072), read=_gemma3,
                          norm_offset=1.0, gguf=Gguf("gemma3", "Gemma3ForCausalLM", _gguf_gemma3)),
    "phi3": Family(PHI3, read=_phi3, defaults=dict(norm_eps=1e-5, max_position_embeddings=4096,
                                                   original_max_position_embeddings=4096),
                   gguf=Gguf("phi3", "Phi3ForCausalLM", _gguf_phi3, rope_dims="partial", rope_factors="longrope")),
    "olmo2": Family(OLMO2, features=dict(pre_norms=False, post_norms=True, qk_norm="proj"), read=_llama,
                    defaults=dict(norm_eps=1e-5), gguf=Gguf("olmo2", "Olmo2ForCausalLM", _gguf_olmo2)),
    "gpt_neox": Family(
        NEOX, features=dict(norm="layer", mlp="plain", mlp_bias=True), read=_neox,
        defaults=dict(act="gelu", norm_eps=1e-5, partial_rotary_factor=0.25),
        fix={"wqkv": "neox_qkv", "bqkv": "neox_qkv"},
        ignored=(_N + "attention.bias", _N + "attention.masked_bias", _N + "attention.rotary_emb.inv_freq"),
        gguf=Gguf("gptneox", "GPTNeoXForCausalLM", _gguf_gpt_neox, fixes={"attn_qkv": "neox_per_head"},
                  rope_dims="partial", spell=_neox_names)),
    "smollm3": Family(LLAMA, read=_smollm3, defaults=dict(tie_word_embeddings=True, max_position_embeddings=32768),
                      gguf=Gguf("smollm3", "SmolLM3ForCausalLM", _gguf_smollm3, fixes=PERMUTED,
                                rope_factors="llama3")),
    "qwen3_5_text": Family(QWEN3_5, features=dict(qk_norm="head", attn_gate=True), read=_qwen3_5, norm_offset=1.0,
                           plain_norms=("gate_norm",), fix={"wqkv": "gated_q", "conv_w": "depthwise"},
                           defaults=dict(head_dim=256, max_position_embeddings=32768, partial_rotary_factor=0.25),
                           skipped=("mtp.",),
                           gguf=Gguf("qwen35", "Qwen3_5ForCausalLM", _gguf_qwen3_5, fixes=QWEN3_5_FIXES,
                                     rope_dims="partial", tensors=DT_BIAS)),
    "lfm2": Family(LFM2, features=dict(qk_norm="head"), read=_lfm2, fix={"conv_w": "depthwise"},
                   defaults=dict(norm_eps=1e-5, max_position_embeddings=128000, rope_theta=1000000.0),
                   gguf=Gguf("lfm2", "Lfm2ForCausalLM", _gguf_lfm2, fixes={"shortconv.conv.weight": "channels"},
                             recurrent=True)),
    "granitemoehybrid": Family(GRANITE_HYBRID, read=_granite_hybrid, fix={"conv_w": "depthwise"},
                               defaults=dict(max_position_embeddings=2048, intermediate_size=11008),
                               gguf=Gguf("granitehybrid", "GraniteMoeHybridForCausalLM", _gguf_granite_hybrid,
                                         fixes={**PERMUTED, **MAMBA2_FIXES}, recurrent=True,
                                         tensors={**DT_BIAS, **GRANITE_HYBRID_SHARED_MLP})),
    "falcon_h1": Family(FALCON_H1, read=_falcon_h1, fix={"conv_w": "depthwise"},
                        defaults=dict(norm_eps=1e-5, max_position_embeddings=8192),
                        gguf=Gguf("falcon-h1", "FalconH1ForCausalLM", _gguf_falcon_h1, fixes=MAMBA2_FIXES,
                                  tensors=DT_BIAS)),
    "granite": Family(LLAMA, read=_granite, ignored=LLAMA_IGNORED,
                      gguf=Gguf("granite", "GraniteForCausalLM", _gguf_granite, fixes=PERMUTED)),
    "granitemoe": Family(GRANITEMOE, features=dict(mlp="moe"), read=_granitemoe,
                         gguf=Gguf("granitemoe", "GraniteMoeForCausalLM", _gguf_granitemoe, fixes=PERMUTED)),
    "olmo3": Family(OLMO2, features=dict(pre_norms=False, post_norms=True, qk_norm="proj"), read=_olmo3,
                    defaults=dict(norm_eps=1e-5)),  # GGUF: llama.cpp writes it as olmo2 (_gguf_olmo2)
    "ministral3": Family(LLAMA, read=_ministral3, defaults=dict(max_position_embeddings=262144, norm_eps=1e-5,
                                                                head_dim=128),
                         gguf=Gguf("mistral3", "Ministral3ForCausalLM", _gguf_mistral3, fixes=PERMUTED)),
}


@dataclass(frozen=True)
class Wrapper:
    """A multimodal checkpoint around a language model: where its text model's tensors are (the layout of
    transformers 4.5x's save, `language_model.model.*`, or 5.x's, `model.language_model.*`), which tensor
    prefixes belong to the vision tower and projector (left unread), and transformers' defaults for the
    fields the top level decides (tie_word_embeddings: the wrapper's own, not text_config's)."""
    text_model_type: str                  # text_config's model_type when it has none
    vision: tuple                         # prefixes of the vision tower's and projector's tensors (not read)
    tie_word_embeddings: bool = True
    ignored: tuple = ()                   # prefixes transformers ignores too (Qwen3.5's multi-token prediction)
    renames: tuple = (("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
                      ("model.language_model.", "model."))


WRAPPERS = {
    "gemma3": Wrapper("gemma3_text", ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                                      "model.multi_modal_projector.")),
    "mistral3": Wrapper("mistral", ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                                    "model.multi_modal_projector.")),
    "qwen3_5": Wrapper("qwen3_5_text", ("model.visual.", "visual."), tie_word_embeddings=False, ignored=("mtp.",)),
}

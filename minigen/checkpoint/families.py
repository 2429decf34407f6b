"""The model families minigen runs, one entry each: what the forward pass switches on, how config.json
spells the family's own fields, and where its tensors live in the checkpoint.

Adding a family is adding an entry here (and its fixtures), with, where llama.cpp writes the family, its
entry in minigen/gguf/families.py: nothing else in minigen names a family. `features` are Config fields
fixed by the family; `defaults` are transformers' defaults for fields config.json may leave out; `read`
handles what no table can say (layer patterns, per-layer RoPE; family_configs.py holds them), returning
more Config fields; `tensors` maps minigen's canonical tensor names to the checkpoint's (a tuple is stacked
by rows into one matrix: q/k/v and gate/up are fused at load), `fix` names the reshuffles some layouts need
(fixes.FIXES), and `norm_offset` is added to every norm weight at load (Gemma stores w of its (1 + w)
norms; llama.cpp stores 1 + w, so a conversion subtracts it).

The three concerns of a family live in three modules, each a table or the functions one names:
    families.py         this table: features, defaults, tensor names (a family's one entry)
    family_configs.py   each family's config.json quirks (`read`)
    fixes.py            the tensor fixes (FIXES), shared by the loader and the GGUF converter
and what llama.cpp made of a family (its GGUF architecture, metadata, what its converter did to the
tensors) is minigen/gguf/families.py, beside the rest of the GGUF code.

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

from dataclasses import dataclass, field
from typing import Callable

from .fields import Fields
from . import family_configs as configs


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


# --- layers that are not attention: Qwen3.5, LFM2, Granite 4.0(-H), Falcon-H1 ---------------------------

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


# --- the table ------------------------------------------------------------------------------------------------

GEMMA_FEATURES = dict(embed_scale=True)
GEMMA_DEFAULTS = dict(head_dim=256, tie_word_embeddings=True, max_position_embeddings=8192, act="gelu_pytorch_tanh")

FAMILIES = {
    "gpt2": Family(
        GPT2, features=dict(norm="layer", mlp="plain", positions="learned", qkv_bias=True, o_bias=True,
                            mlp_bias=True),
        defaults=dict(act="gelu_new", norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=1024),
        fix={"wqkv": "conv1d", "wo": "conv1d", "w_up": "conv1d", "w_down": "conv1d"},
        ignored=("h.{}.attn.bias", "h.{}.attn.masked_bias"), prefixes=("transformer.",)),
    "llama": Family(LLAMA, read=configs.llama, ignored=LLAMA_IGNORED),
    "mistral": Family(LLAMA, read=configs.mistral, ignored=LLAMA_IGNORED, defaults=dict(max_position_embeddings=131072)),
    "qwen2": Family(LLAMA, features=dict(qkv_bias=True), read=configs.qwen, ignored=LLAMA_IGNORED,
                    defaults=dict(max_position_embeddings=32768)),
    "qwen3": Family(LLAMA, features=dict(qk_norm="head"), read=configs.qwen, ignored=LLAMA_IGNORED,
                    defaults=dict(head_dim=128, max_position_embeddings=32768)),
    "gemma": Family(LLAMA, features=GEMMA_FEATURES, defaults=GEMMA_DEFAULTS, read=configs.gemma, norm_offset=1.0,
                    ignored=LLAMA_IGNORED),
    "gemma2": Family(SANDWICH, features=dict(GEMMA_FEATURES, post_norms=True), defaults=GEMMA_DEFAULTS,
                     read=configs.gemma2, norm_offset=1.0),
    "gemma3_text": Family(SANDWICH, features=dict(GEMMA_FEATURES, post_norms=True, qk_norm="head"),
                          defaults=dict(GEMMA_DEFAULTS, max_position_embeddings=131072), read=configs.gemma3,
                          norm_offset=1.0),
    "phi3": Family(PHI3, read=configs.phi3, defaults=dict(norm_eps=1e-5, max_position_embeddings=4096,
                                                   original_max_position_embeddings=4096)),
    "olmo2": Family(OLMO2, features=dict(pre_norms=False, post_norms=True, qk_norm="proj"), read=configs.llama,
                    defaults=dict(norm_eps=1e-5)),
    "gpt_neox": Family(
        NEOX, features=dict(norm="layer", mlp="plain", mlp_bias=True), read=configs.neox,
        defaults=dict(act="gelu", norm_eps=1e-5, partial_rotary_factor=0.25),
        fix={"wqkv": "neox_qkv", "bqkv": "neox_qkv"},
        ignored=(_N + "attention.bias", _N + "attention.masked_bias", _N + "attention.rotary_emb.inv_freq")),
    "smollm3": Family(LLAMA, read=configs.smollm3, defaults=dict(tie_word_embeddings=True, max_position_embeddings=32768)),
    "qwen3_5_text": Family(QWEN3_5, features=dict(qk_norm="head", attn_gate=True), read=configs.qwen3_5, norm_offset=1.0,
                           plain_norms=("gate_norm",), fix={"wqkv": "gated_q", "conv_w": "depthwise"},
                           defaults=dict(head_dim=256, max_position_embeddings=32768, partial_rotary_factor=0.25),
                           skipped=("mtp.",)),
    "lfm2": Family(LFM2, features=dict(qk_norm="head"), read=configs.lfm2, fix={"conv_w": "depthwise"},
                   defaults=dict(norm_eps=1e-5, max_position_embeddings=128000, rope_theta=1000000.0)),
    "granitemoehybrid": Family(GRANITE_HYBRID, read=configs.granite_hybrid, fix={"conv_w": "depthwise"},
                               defaults=dict(max_position_embeddings=2048, intermediate_size=11008)),
    "falcon_h1": Family(FALCON_H1, read=configs.falcon_h1, fix={"conv_w": "depthwise"},
                        defaults=dict(norm_eps=1e-5, max_position_embeddings=8192)),
    "granite": Family(LLAMA, read=configs.granite, ignored=LLAMA_IGNORED),
    "granitemoe": Family(GRANITEMOE, features=dict(mlp="moe"), read=configs.granitemoe),
    "olmo3": Family(OLMO2, features=dict(pre_norms=False, post_norms=True, qk_norm="proj"), read=configs.olmo3,
                    defaults=dict(norm_eps=1e-5)),  # GGUF: llama.cpp writes it as olmo2 (gguf/families.py)
    "ministral3": Family(LLAMA, read=configs.ministral3, defaults=dict(max_position_embeddings=262144, norm_eps=1e-5,
                                                                head_dim=128)),
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

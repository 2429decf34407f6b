"""What llama.cpp made of each family minigen runs, one entry each (GGUF, keyed by the family's model_type in
checkpoint/families.py): how its convert_hf_to_gguf.py wrote the family (its `conversion/*.py` in the
llama-cpp-python sdist), so that minigen.gguf can undo it: the `general.architecture` name, the HF class,
a function from the `{arch}.*` metadata to the family's own config.json fields (`Meta` and `Tensors` of
arch.py; the fields every family has are read there), and the tensor fixes by GGUF tensor kind
(checkpoint/fixes.FIXES). What llama.cpp did, per family:

    llama, smollm3   q/k rows permuted so each head's two RoPE halves interleave ("normal" RoPE): unpermute
                     Llama 3-style RoPE scaling written as per-frequency factors (rope_freqs), not parameters
    granite, mistral3  q/k permuted, as llama (mistral3: the text GGUF of Ministral 3)
    granitemoe       q/k permuted; each layer's input_linear (E, 2F, D) split into ffn_gate_exps and
                     ffn_up_exps (convert.py joins them again)
    gemma, gemma2/3  every norm weight stored as 1 + w (the family's norm_offset)
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

A family llama.cpp does not write (mistral; olmo3, which it writes as olmo2) has no entry.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


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


PERMUTED = {"attn_q": "unpermute_q", "attn_k": "unpermute_k"}
MAMBA2_FIXES = {"ssm_a": "a_log", "ssm_d": "vector", "ssm_norm": "vector", "ssm_conv1d.weight": "channels"}
QWEN3_5_FIXES = {"ssm_a": "dn_a_log", "ssm_dt": "dn_rows", "attn_gate": "dn_rows", "ssm_beta": "dn_rows",
                 "ssm_alpha": "dn_rows", "attn_qkv": "dn_qkv", "ssm_conv1d.weight": "dn_conv", "ssm_out": "dn_out"}
DT_BIAS = {"dt_bias": "ssm_dt.bias"}  # llama.cpp's converter renames dt_bias to dt_proj.bias before its table
GRANITE_HYBRID_SHARED_MLP = {  # shared_mlp.input_linear split into gate and up: ffn_* in a dense file, ffn_*_shexp
    "w_gate_up": [("ffn_gate.weight", "ffn_up.weight"), ("ffn_gate_shexp.weight", "ffn_up_shexp.weight")],
    "w_down": ["ffn_down.weight", "ffn_down_shexp.weight"]}   # beside routed experts (conversion/granite.py)


# --- the table ------------------------------------------------------------------------------------------------

GGUF = {   # model_type (checkpoint/families.py) -> how llama.cpp writes that family
    "gpt2": Gguf("gpt2", "GPT2LMHeadModel", _gguf_gpt2, spell=_gpt2_names, fixes={"attn_qkv": "conv1d", "attn_output": "conv1d", "ffn_up": "conv1d", "ffn_down": "conv1d"}),
    "llama": Gguf("llama", "LlamaForCausalLM", _gguf_llama, fixes=PERMUTED, rope_factors="llama3"),
    "qwen2": Gguf("qwen2", "Qwen2ForCausalLM", _gguf_qwen2),
    "qwen3": Gguf("qwen3", "Qwen3ForCausalLM", _gguf_qwen3),
    "gemma": Gguf("gemma", "GemmaForCausalLM", _gguf_gemma),
    "gemma2": Gguf("gemma2", "Gemma2ForCausalLM", _gguf_gemma2),
    "gemma3_text": Gguf("gemma3", "Gemma3ForCausalLM", _gguf_gemma3),
    "phi3": Gguf("phi3", "Phi3ForCausalLM", _gguf_phi3, rope_dims="partial", rope_factors="longrope"),
    "olmo2": Gguf("olmo2", "Olmo2ForCausalLM", _gguf_olmo2),
    "gpt_neox": Gguf("gptneox", "GPTNeoXForCausalLM", _gguf_gpt_neox, fixes={"attn_qkv": "neox_per_head"}, rope_dims="partial", spell=_neox_names),
    "smollm3": Gguf("smollm3", "SmolLM3ForCausalLM", _gguf_smollm3, fixes=PERMUTED, rope_factors="llama3"),
    "qwen3_5_text": Gguf("qwen35", "Qwen3_5ForCausalLM", _gguf_qwen3_5, fixes=QWEN3_5_FIXES, rope_dims="partial", tensors=DT_BIAS),
    "lfm2": Gguf("lfm2", "Lfm2ForCausalLM", _gguf_lfm2, fixes={"shortconv.conv.weight": "channels"}, recurrent=True),
    "granitemoehybrid": Gguf("granitehybrid", "GraniteMoeHybridForCausalLM", _gguf_granite_hybrid, fixes={**PERMUTED, **MAMBA2_FIXES}, recurrent=True, tensors={**DT_BIAS, **GRANITE_HYBRID_SHARED_MLP}),
    "falcon_h1": Gguf("falcon-h1", "FalconH1ForCausalLM", _gguf_falcon_h1, fixes=MAMBA2_FIXES, tensors=DT_BIAS),
    "granite": Gguf("granite", "GraniteForCausalLM", _gguf_granite, fixes=PERMUTED),
    "granitemoe": Gguf("granitemoe", "GraniteMoeForCausalLM", _gguf_granitemoe, fixes=PERMUTED),
    "ministral3": Gguf("mistral3", "Ministral3ForCausalLM", _gguf_mistral3, fixes=PERMUTED),
}

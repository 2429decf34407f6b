"""What llama.cpp's convert_hf_to_gguf.py did to each architecture minigen runs, and how to undo it.

One entry per GGUF `general.architecture`: the minigen family (HF `model_type`) it becomes, the config.json
fields its `{arch}.*` metadata gives (with llama.cpp's own defaults where a key is optional, since those are
what the file means to the program that made it), and the tensor fixes that turn llama.cpp's layout back into
Hugging Face's (llama.cpp's `conversion/*.py` in the llama-cpp-python sdist, per architecture):

    llama, smollm3, granite, mistral3   q/k rows permuted so each head's two RoPE halves interleave (llama.cpp's
                     "normal" RoPE)
    olmo2            nothing; a file with a sliding window is OLMo 3 (llama.cpp writes both as olmo2)
    granitemoe       q/k permuted; each layer's input_linear (E, 2F, D) split into ffn_gate_exps and ffn_up_exps
    gemma, gemma2/3  every norm weight stored as 1 + w (HF stores w and adds 1 in the forward pass)
    gpt2             Conv1D weights transposed to (out, in)
    gptneox          the fused query_key_value rows reordered from per-head [q; k; v] to [all q; all k; all v]
    phi3             nothing: qkv_proj and gate_up_proj stay fused, as in HF
    llama (rope_freqs)  Llama 3.1-style RoPE scaling written as per-frequency factors, not parameters
    phi3 (rope_factors_long/short)  longrope's factors written as tensors

Tensor names are not written by hand: for every HF tensor name of the family (families.py), the `gguf`
package's own table (`gguf.TensorNameMap`, the one convert_hf_to_gguf.py renames with) gives the GGUF name.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import MinigenError, is_int, is_number, short

_MAX_DIM = 2**31 - 1  # ggml's dims are int64, but nothing real is near this; larger means a damaged file


class Meta:
    """Typed reads of GGUF metadata, each error naming the file and the key. `m.int("block_count")` reads
    `{arch}.block_count`; keys with a dot-separated prefix of their own (`tokenizer.ggml.*`) go through `raw`."""

    def __init__(self, raw: dict, arch: str, source):
        self.raw, self.arch, self.source = raw, arch, source

    def _value(self, key: str, default, check, what: str):
        full = f"{self.arch}.{key}"
        if full not in self.raw:
            if default is ...:
                raise MinigenError(f"{self.source}: metadata key {full} is missing")
            return default
        value = self.raw[full]
        if isinstance(value, list):
            raise MinigenError(f"{self.source}: metadata key {full} is a per-layer list; minigen needs one value "
                               f"for every layer")
        if not check(value):
            raise MinigenError(f"{self.source}: metadata key {full} should be {what}, got {short(value)}")
        return value

    def has(self, key: str) -> bool:
        return f"{self.arch}.{key}" in self.raw

    def int(self, key: str, default=..., minimum: int = 1) -> int:
        return self._value(key, default, lambda v: is_int(v) and minimum <= v <= _MAX_DIM,
                           f"an integer from {minimum} to {_MAX_DIM}")

    def float(self, key: str, default=...) -> float:
        v = self._value(key, default, lambda v: is_number(v) and math.isfinite(v) and v > 0, "a positive number")
        return v if v is None else _f32(v)

    def bool(self, key: str, default=...) -> bool:
        return self._value(key, default, lambda v: isinstance(v, bool), "true or false")

    def str(self, key: str, default=...) -> str:
        return self._value(key, default, lambda v: isinstance(v, str), "a string")

    def fail(self, key: str, why: str):
        raise MinigenError(f"{self.source}: metadata key {self.arch}.{key} {why}")


@dataclass(frozen=True)
class Arch:
    """How one GGUF architecture becomes a minigen family."""
    model_type: str                       # the family (config.json's model_type)
    hf_class: str                         # config.json's architectures[0]
    config: Callable                      # (Meta, Tensors) -> the family's own config.json fields
    fixes: dict = field(default_factory=dict)  # GGUF tensor kind ("attn_q") -> fix name (FIXES below)
    norm_offset: float = 0.0              # subtracted from every norm weight (llama.cpp stored 1 + w)
    rope_dims: str = "full"               # "full": rope.dimension_count must be head_dim; "partial": may be less
    spell: Callable = lambda cfg: cfg     # the family's own config.json names, where it has them


class Tensors:
    """The GGUF's tensor names and shapes (GGUF order: innermost dimension first), for config decisions."""

    def __init__(self, shapes: dict[str, tuple]):
        self.shapes = shapes

    def has(self, name: str) -> bool:
        return name in self.shapes


# --- the config.json fields each architecture's metadata gives ------------------------------------------

def common(m: Meta, t: Tensors, arch: Arch) -> dict:
    """The fields every family has: sizes, heads, context, vocabulary, tying, RoPE base and scaling."""
    hidden = m.int("embedding_length")
    n_head = m.int("attention.head_count")
    n_kv = m.int("attention.head_count_kv", default=n_head)
    if n_head % n_kv:
        m.fail("attention.head_count_kv", f"({n_kv}) does not divide attention.head_count ({n_head})")
    head_dim = m.int("attention.key_length", default=None)
    if head_dim is None:
        if hidden % n_head:
            m.fail("attention.head_count", f"({n_head}) does not divide embedding_length ({hidden}) and there "
                                           f"is no attention.key_length")
        head_dim = hidden // n_head
    if m.int("attention.value_length", default=head_dim) != head_dim:
        m.fail("attention.value_length", f"differs from attention.key_length ({head_dim}); minigen needs them equal")
    embed = t.shapes.get("token_embd.weight")
    if embed is None or len(embed) != 2:
        raise MinigenError(f"{m.source}: no two-dimensional token_embd.weight tensor")
    vocab = embed[1]
    if m.int("vocab_size", default=vocab) != vocab:
        m.fail("vocab_size", f"({m.raw[m.arch + '.vocab_size']}) differs from the rows of token_embd.weight ({vocab})")
    rope_dims = m.int("rope.dimension_count", default=head_dim)
    if rope_dims > head_dim or rope_dims % 2 or (arch.rope_dims == "full" and rope_dims != head_dim):
        m.fail("rope.dimension_count", f"({rope_dims}) should be {'at most ' if arch.rope_dims != 'full' else ''}"
                                       f"the head dimension ({head_dim}) and even")
    return {
        "hidden_size": hidden,
        "num_hidden_layers": m.int("block_count"),
        "intermediate_size": m.int("feed_forward_length"),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "max_position_embeddings": m.int("context_length"),
        "vocab_size": vocab,
        "tie_word_embeddings": not t.has("output.weight"),
        "rope_theta": m.float("rope.freq_base", default=10000.0),  # llama.cpp's default when absent
        "rope_scaling": linear_rope(m),
        "_rope_dims": rope_dims,  # popped by convert: what partial_rotary_factor is computed from
    }


def linear_rope(m: Meta) -> dict | None:
    """llama.cpp's rope.scaling.type (default none) and its parameters, as HF's rope_scaling."""
    kind = m.str("rope.scaling.type", default="none")
    factor = m.float("rope.scaling.factor", default=None) or m.float("rope.scale_linear", default=None)
    if kind == "none" or (kind == "linear" and factor in (None, 1.0)):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "type": "linear", "factor": factor}
    if kind == "yarn":
        return yarn_rope(m, factor)
    if kind == "longrope":
        return None  # phi3: the factors are tensors, read by `longrope` below
    m.fail("rope.scaling.type", f"is {kind!r}, which minigen does not run (it runs none, linear, yarn, Llama 3's "
                                f"rope_freqs and Phi-3's longrope)")


def yarn_rope(m: Meta, factor: float | None) -> dict:
    """HF's YaRN settings from what convert_hf_to_gguf.py wrote: the factor, the original context, the betas
    and attention factor when the source had them, and yarn_log_multiplier (Ministral 3's mscale_all_dim;
    llama.cpp takes mscale as 1 beside it, and so does this)."""
    if factor is None:
        m.fail("rope.scaling.factor", "is missing, and YaRN needs it")
    out = {"rope_type": "yarn", "type": "yarn", "factor": factor,
           "original_max_position_embeddings": m.int("rope.scaling.original_context_length")}
    for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow"),
                      ("yarn_attn_factor", "attention_factor")):
        value = m.float(f"rope.scaling.{key}", default=None)
        if value is not None:
            out[name] = value
    log_mul = m.float("rope.scaling.yarn_log_multiplier", default=None)
    if log_mul is not None:
        out.update(mscale=1.0, mscale_all_dim=log_mul)
    return out


def rms_eps(m: Meta) -> dict:
    return {"rms_norm_eps": m.float("attention.layer_norm_rms_epsilon")}


def _llama(m: Meta, t: Tensors) -> dict:
    return {"hidden_act": "silu", **rms_eps(m), "attention_bias": t.has("blk.0.attn_q.bias"),
            "mlp_bias": t.has("blk.0.ffn_gate.bias")}


def _qwen2(m: Meta, t: Tensors) -> dict:
    return {"hidden_act": "silu", **rms_eps(m), "use_sliding_window": False, "sliding_window": None,
            "max_window_layers": m.int("block_count")}


def _qwen3(m: Meta, t: Tensors) -> dict:
    return {**_qwen2(m, t), "attention_bias": t.has("blk.0.attn_q.bias")}


def _gemma(m: Meta, t: Tensors) -> dict:
    return {"hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", **rms_eps(m)}


def _gemma_attention_scale(m: Meta, n_layers: int, layers_27b: int) -> float:
    """llama.cpp scales scores by 1/sqrt(head_dim), except for the 27B models (by layer count), where it uses
    1/sqrt(hidden / heads): HF's query_pre_attn_scalar, which the GGUF does not carry."""
    if n_layers == layers_27b:
        return m.int("embedding_length") // m.int("attention.head_count")
    return m.int("attention.key_length", default=m.int("embedding_length") // m.int("attention.head_count"))


def sliding_pattern(m: Meta, n_layers: int, default: int) -> list[str]:
    """llama.cpp's load_swa_pattern: a per-layer bool list, or a period n (layer i slides unless (i+1) % n == 0;
    0: every layer slides)."""
    key = f"{m.arch}.attention.sliding_window_pattern"
    value = m.raw.get(key, default)
    if isinstance(value, list):
        if len(value) != n_layers or not all(isinstance(v, (bool, int)) for v in value):
            m.fail("attention.sliding_window_pattern", f"should list one flag for each of the {n_layers} layers")
        flags = [bool(v) for v in value]
    elif is_int(value) and 0 <= value <= _MAX_DIM:
        flags = [value == 0 or (i + 1) % value != 0 for i in range(n_layers)]
    else:
        m.fail("attention.sliding_window_pattern", f"should be a layer count or a list of flags, got {short(value)}")
    return ["sliding_attention" if f else "full_attention" for f in flags]


def _gemma2(m: Meta, t: Tensors) -> dict:
    n = m.int("block_count")
    return {**_gemma(m, t),
            "query_pre_attn_scalar": _gemma_attention_scale(m, n, layers_27b=46),
            "attn_logit_softcapping": m.float("attn_logit_softcapping", default=50.0),   # llama.cpp's defaults
            "final_logit_softcapping": m.float("final_logit_softcapping", default=30.0),
            "sliding_window": m.int("attention.sliding_window", default=4096),
            "layer_types": sliding_pattern(m, n, default=2)}


def _gemma3(m: Meta, t: Tensors) -> dict:
    """Gemma 3: sliding layers use rope.freq_base_swa (llama.cpp's default 10000) without scaling; full
    layers rope.freq_base with the file's scaling. No sliding window (or 0) means every layer is full."""
    n = m.int("block_count")
    window = m.int("attention.sliding_window", default=0, minimum=0)
    softcap = m.raw.get(f"{m.arch}.final_logit_softcapping")
    out = {**_gemma(m, t),
           "query_pre_attn_scalar": _gemma_attention_scale(m, n, layers_27b=62),
           "final_logit_softcapping": m.float("final_logit_softcapping") if softcap else None,
           "attn_logit_softcapping": None,
           "sliding_window": window or None,
           "rope_local_base_freq": m.float("rope.freq_base_swa", default=10000.0),
           "layer_types": sliding_pattern(m, n, default=6) if window else ["full_attention"] * n}
    return out


def _phi3(m: Meta, t: Tensors) -> dict:
    """Phi-3: a window of 0 means none (llama.cpp writes 0 for Phi-4); partial rotary from rope.dimension_count."""
    window = m.int("attention.sliding_window", default=0, minimum=0)
    return {"hidden_act": "silu", **rms_eps(m), "sliding_window": window or None,
            "original_max_position_embeddings": m.int("rope.scaling.original_context_length",
                                                      default=m.int("context_length"))}


def _gpt2(m: Meta, t: Tensors) -> dict:
    return {"activation_function": "gelu_new", "layer_norm_epsilon": m.float("attention.layer_norm_epsilon")}


def _olmo2(m: Meta, t: Tensors) -> dict:
    """OLMo 2, or OLMo 3 when the file has a sliding window (llama.cpp writes both as olmo2): then the window's
    layers from sliding_window_pattern (llama.cpp's default period 4), plain RoPE on them (rope.freq_base_swa,
    else freq_base: llama.cpp's reading), the scaling on the full layers; as transformers 5's nested
    rope_parameters, which keeps the two apart."""
    out = {"hidden_act": "silu", **rms_eps(m), "attention_bias": t.has("blk.0.attn_q.bias")}
    window = m.int("attention.sliding_window", default=0, minimum=0)
    if not window:
        return out
    base = m.float("rope.freq_base", default=10000.0)
    full = {"rope_type": "default", "rope_theta": base, **(linear_rope(m) or {})}
    full.pop("type", None)
    return {**out, "model_type": "olmo3", "architectures": ["Olmo3ForCausalLM"], "sliding_window": window,
            "layer_types": sliding_pattern(m, m.int("block_count"), default=4),
            "rope_parameters": {"full_attention": full, "sliding_attention": {
                "rope_type": "default", "rope_theta": m.float("rope.freq_base_swa", default=base)}},
            "rope_theta": None, "rope_scaling": None}


def _granite(m: Meta, t: Tensors) -> dict:
    """Granite's multipliers as llama.cpp reads them: logit_scale is required; no attention.scale means
    1/sqrt(head_dim), no residual or embedding scale means none (1)."""
    head_dim = m.int("attention.key_length", default=m.int("embedding_length") // m.int("attention.head_count"))
    return {**_llama(m, t), "logits_scaling": m.float("logit_scale"),
            "attention_multiplier": m.float("attention.scale", default=head_dim ** -0.5),
            "residual_multiplier": m.float("residual_scale", default=1.0),
            "embedding_multiplier": m.float("embedding_scale", default=1.0)}


def _granitemoe(m: Meta, t: Tensors) -> dict:
    """GraniteMoE: Granite's multipliers and routed experts (expert_count, expert_used_count); llama.cpp split
    each layer's input_linear into ffn_gate_exps and ffn_up_exps (convert.py joins them again)."""
    return {**_granite(m, t), "num_local_experts": m.int("expert_count"),
            "num_experts_per_tok": m.int("expert_used_count")}


def _mistral3(m: Meta, t: Tensors) -> dict:
    """Ministral 3 (the text GGUF of a Mistral 3 checkpoint): Llama with YaRN and, from
    attention.temperature_scale, llama 4's query scale (its period: YaRN's original context)."""
    out = {**_llama(m, t), "sliding_window": m.int("attention.sliding_window", default=0, minimum=0) or None}
    beta = m.float("attention.temperature_scale", default=None)
    if beta is not None:
        if m.str("rope.scaling.type", default="none") != "yarn":
            m.fail("attention.temperature_scale", "is set without YaRN (rope.scaling.type yarn), whose original "
                                                  "context is its period")
        out["llama_4_scaling_beta"] = beta  # moved into rope_scaling by family_config
    return out


def _gpt_neox(m: Meta, t: Tensors) -> dict:
    return {"hidden_act": "gelu", "layer_norm_eps": m.float("attention.layer_norm_epsilon"),
            "use_parallel_residual": m.bool("use_parallel_residual"),
            "attention_bias": t.has("blk.0.attn_qkv.bias")}


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


def _smollm3(m: Meta, t: Tensors) -> dict:
    """SmolLM3: llama.cpp hard-codes NoPE on every 4th layer (n_no_rope_layer_step); the GGUF has no key for it."""
    n = m.int("block_count")
    return {**_llama(m, t), "no_rope_layer_interval": 4, "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(n)],
            "use_sliding_window": False, "sliding_window": None}


# --- Llama 3's rope_freqs and Phi-3's longrope factors: tensors back to config fields --------------------

def llama3_rope(factors: np.ndarray, theta: float, dim: int, source) -> dict | None:
    """HF's llama3 rope_scaling that gives llama.cpp's per-frequency `rope_freqs` factors (llama.cpp divides
    frequency i by factors[i]), or None when every factor is 1. llama.cpp computed them from (factor,
    low_freq_factor, high_freq_factor, original_max_position_embeddings); the tensor alone does not pin all
    four, so candidates are tried (Llama 3.x's low_freq_factor of 1, the rest fitted to the blended factors or
    a power-of-two original context) and the first whose factors match the tensor to float32 precision wins:
    any such set gives the same frequencies, hence the same RoPE.""" 
    factors = np.asarray(factors, np.float64)
    if factors.shape != (dim // 2,) or not np.all(np.isfinite(factors)) or np.any(factors <= 0):
        raise MinigenError(f"{source}: tensor rope_freqs.weight should hold {dim // 2} positive factors")
    if np.allclose(factors, 1.0, rtol=0, atol=1e-6):
        return None
    freqs = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    wavelen = 2 * math.pi / freqs
    for params in _llama3_candidates(factors, wavelen):
        if np.allclose(_llama3_factors(wavelen, **params), factors, rtol=2e-6, atol=0):
            return {"rope_type": "llama3", "type": "llama3", **params}
    raise MinigenError(f"{source}: tensor rope_freqs.weight holds RoPE factors that are not Llama 3's scaling "
                       f"(no factor, low/high_freq_factor and original context reproduce them); cannot convert")


def _llama3_factors(wavelen, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
    """llama.cpp's generate_extra_tensors for llama3 rope (conversion/llama.py), in float64."""
    old = original_max_position_embeddings
    smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    mid = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < old / high_freq_factor, 1.0, np.where(wavelen > old / low_freq_factor, factor, mid))


def _llama3_candidates(factors, wavelen):
    """(factor, low, high, original) sets to try, all with low_freq_factor 1 (every Llama 3.x release)."""
    factor = float(np.float32(factors.max()))
    mid = (factors > 1 + 1e-6) & (factors < factor * (1 - 1e-6))
    smooth = (1 / factors[mid] - 1 / factor) / (1 - 1 / factor)  # = (old / wavelen - 1) / (high - 1)
    if mid.sum() >= 2:  # smooth is linear in 1 / wavelen: fit it
        a, b = np.polyfit(1 / wavelen[mid], smooth, 1)
        if b < 0:
            yield _params(factor, 1.0, 1 - 1 / b, a * -1 / b)
    for old in [8192] + [2 ** k for k in range(1, 25)]:  # a power-of-two original context, high from one blend
        if mid.any():
            yield _params(factor, 1.0, 1 + (old / wavelen[mid][0] - 1) / smooth[0], old)
        else:
            yield _params(factor, 1.0, 4.0, old)
    ones, scaled = wavelen[factors <= 1 + 1e-6], wavelen[factors >= factor * (1 - 1e-6)]
    if not mid.any() and len(ones) and len(scaled):  # no blended frequencies: any band edge between the two works
        old = float(scaled.min()) * 0.999
        yield _params(factor, 1.0, old / (float(ones.max()) * 1.001), old)


def _params(factor, low, high, old) -> dict:
    return {"factor": factor, "low_freq_factor": float(low), "high_freq_factor": float(round(high, 6)),
            "original_max_position_embeddings": int(round(old))}


def longrope(short: np.ndarray, long: np.ndarray, m: Meta, pairs: int) -> dict:
    """Phi-3's rope_scaling from llama.cpp's rope_factors_short/long tensors and its attention factor."""
    for name, f in (("rope_factors_short", short), ("rope_factors_long", long)):
        if f is None or f.shape != (pairs,) or not np.all(np.isfinite(f)) or np.any(f <= 0):
            raise MinigenError(f"{m.source}: tensor {name}.weight should hold {pairs} positive factors "
                               f"(Phi-3 longrope needs both)")
    out = {"rope_type": "longrope", "type": "longrope", "short_factor": [_f32(x) for x in short],
           "long_factor": [_f32(x) for x in long]}
    attn = m.float("rope.scaling.attn_factor", default=None)
    if attn is not None:
        out["attention_factor"] = attn
    return out


# --- the table --------------------------------------------------------------------------------------------

_PERMUTED = {"attn_q": "unpermute_q", "attn_k": "unpermute_k"}

ARCHS = {
    "llama": Arch("llama", "LlamaForCausalLM", _llama, fixes=_PERMUTED),
    "qwen2": Arch("qwen2", "Qwen2ForCausalLM", _qwen2),
    "qwen3": Arch("qwen3", "Qwen3ForCausalLM", _qwen3),
    "gemma": Arch("gemma", "GemmaForCausalLM", _gemma, norm_offset=1.0),
    "gemma2": Arch("gemma2", "Gemma2ForCausalLM", _gemma2, norm_offset=1.0),
    "gemma3": Arch("gemma3_text", "Gemma3ForCausalLM", _gemma3, norm_offset=1.0),
    "phi3": Arch("phi3", "Phi3ForCausalLM", _phi3, rope_dims="partial"),
    "gpt2": Arch("gpt2", "GPT2LMHeadModel", _gpt2, spell=_gpt2_names,
                 fixes={"attn_qkv": "conv1d", "attn_output": "conv1d", "ffn_up": "conv1d", "ffn_down": "conv1d"}),
    "olmo2": Arch("olmo2", "Olmo2ForCausalLM", _olmo2),
    "gptneox": Arch("gpt_neox", "GPTNeoXForCausalLM", _gpt_neox, fixes={"attn_qkv": "neox_qkv"}, rope_dims="partial",
                    spell=_neox_names),
    "smollm3": Arch("smollm3", "SmolLM3ForCausalLM", _smollm3, fixes=_PERMUTED),
    "granite": Arch("granite", "GraniteForCausalLM", _granite, fixes=_PERMUTED),
    "granitemoe": Arch("granitemoe", "GraniteMoeForCausalLM", _granitemoe, fixes=_PERMUTED),
    "mistral3": Arch("ministral3", "Ministral3ForCausalLM", _mistral3, fixes=_PERMUTED),
}


def family_config(arch_name: str, m: Meta, t: Tensors) -> dict:
    """config.json (HF field names, the spelling both transformers 4.x and 5.x read) for this GGUF."""
    arch = ARCHS[arch_name]
    cfg = {"architectures": [arch.hf_class], "model_type": arch.model_type, **common(m, t, arch)}
    cfg.update(arch.config(m, t))
    rope_dims = cfg.pop("_rope_dims")
    if rope_dims != cfg["head_dim"]:
        cfg["partial_rotary_factor"] = rope_dims / cfg["head_dim"]
    if "llama_4_scaling_beta" in cfg:  # Ministral 3 keeps it among the RoPE settings
        cfg["rope_scaling"]["llama_4_scaling_beta"] = cfg.pop("llama_4_scaling_beta")
    return arch.spell({k: v for k, v in cfg.items() if not (k in ("rope_theta", "rope_scaling") and v is None
                                                            and "rope_parameters" in cfg)})


# --- tensor names, from the gguf package's table -------------------------------------------------------------

def tensor_names(arch_name: str, family, n_layers: int) -> dict[str, str]:
    """GGUF tensor name -> the family's HF tensor name, for every tensor the family can have."""
    import gguf

    tmap = gguf.get_tensor_name_map(_gguf_arch(arch_name), n_layers)
    names = {}
    for template in _templates(family):
        for i in (range(n_layers) if "{}" in template else (None,)):
            hf = template.format(i) if i is not None else template
            g = tmap.get_name(hf, try_suffixes=(".weight", ".bias"))
            if g is not None:
                names.setdefault(g, hf)
    return names


def _templates(family) -> list[str]:
    out = []
    for v in family.tensors.values():
        out.extend(v if isinstance(v, tuple) else (v,))
    return out


def _gguf_arch(name: str):
    import gguf

    return next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == name)


def kind(gguf_name: str) -> str:
    """'blk.3.attn_q.weight' -> 'attn_q'; 'output_norm.weight' -> 'output_norm'."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) > 2:
        parts = parts[2:]
    return ".".join(parts[:-1]) if parts[-1] in ("weight", "bias") else ".".join(parts)


# --- the fixes, on whole tensors in HF's (out, in) orientation ------------------------------------------------

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


def apply_fix(fix: str, w: np.ndarray, cfg: dict) -> np.ndarray:
    heads = cfg.get("num_attention_heads") or cfg.get("n_head")
    if fix == "unpermute_q":
        return unpermute(w, heads)
    if fix == "unpermute_k":
        return unpermute(w, cfg["num_key_value_heads"])
    if fix == "neox_qkv":
        return neox_interleave(w, heads)
    if fix == "conv1d":
        return np.ascontiguousarray(w.T)
    raise ValueError(fix)


def fixed_shape(fix: str | None, shape: tuple) -> tuple:
    """The HF shape of a tensor whose GGUF shape (reversed to (out, in)) is `shape`."""
    return shape[::-1] if fix == "conv1d" else shape


# --- small helpers ------------------------------------------------------------------------------------------

def _f32(x: float) -> float:
    """A float32 metadata value as the shortest decimal that round-trips (9.999999747e-06 -> 1e-05)."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))

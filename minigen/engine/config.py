"""The forward pass's configuration: one frozen `Config` per checkpoint, one `Rope` per distinct rotary
embedding. Everything the decoder needs, in minigen's own names: sizes, and the handful of switches in
which the families differ (norm kind and placement, q/k norms, RoPE per layer, soft-caps, sliding
windows). `minigen.checkpoint.config` builds it from a config.json; nothing here reads a file.
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_LAYERS = 100_000  # a 16 MiB safetensors header (weights.MAX_HEADER) cannot name more layers


@dataclass(frozen=True)
class Rope:
    """One rotary embedding: the first `dim` dims of each head rotate (HF's half-split within them)."""
    theta: float
    dim: int                          # rotated dims per head; the rest pass through (partial rotary)
    kind: str = "default"             # default | linear | llama3 | longrope | yarn
    factor: float = 1.0               # linear, llama3, yarn
    low_freq_factor: float = 1.0      # llama3
    high_freq_factor: float = 4.0     # llama3
    original_max: int = 0             # llama3, yarn; longrope: the switch from short to long factors
    short_factor: tuple = ()          # longrope, one per rotated pair
    long_factor: tuple = ()
    attention_factor: float = 1.0     # longrope, yarn: cos and sin are scaled by it
    beta_fast: float = 32.0           # yarn: the ramp between extrapolated and interpolated frequencies
    beta_slow: float = 1.0
    truncate: bool = True             # yarn: the ramp's ends rounded outwards to whole dims
    query_beta: float = 0.0           # Ministral 3 (llama_4_scaling_beta): q x (1 + beta log(1 + floor(pos / original_max)))


@dataclass(frozen=True)
class DeltaNet:
    """Gated DeltaNet sizes (Qwen3.5's linear_* fields): Hk key heads of dk dims, H value heads of dv."""
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int                  # the causal conv over q, k, v (linear_conv_kernel_dim)
    eps: float                        # the gated RMSNorm's


@dataclass(frozen=True)
class ShortConv:
    """LFM2's gated short convolution."""
    kernel: int                       # conv_L_cache
    bias: bool                        # conv_bias: on in_proj, the conv and out_proj


@dataclass(frozen=True)
class Mamba:
    """Mamba2 sizes: H heads of P dims (H P = the inner size I), G groups of B and C, N state dims."""
    heads: int
    head_dim: int
    groups: int
    state_size: int
    conv_kernel: int
    chunk: int                        # mamba_chunk_size: the SSD scan's chunk
    limit: tuple | None               # time_step_limit on the prompt's step sizes, or None
    eps: float
    norm: bool                        # the gated RMSNorm on the output (else the gate alone: Falcon-H1's default)
    norm_before_gate: bool            # Falcon-H1's mamba_norm_before_gate; Granite gates first
    conv_bias: bool
    in_bias: bool                     # on in_proj (mamba_proj_bias)
    out_bias: bool                    # on out_proj (mamba_proj_bias; Falcon-H1: projectors_bias)

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim


@dataclass(frozen=True)
class Config:
    model_type: str
    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    norm_eps: float
    # --- what the forward pass does: set by the family, some by config.json -------------------
    norm: str = "rms"                 # "rms" | "layer" (LayerNorm, with a bias)
    pre_norms: bool = True            # norm the input of attention and MLP (all but OLMo 2)
    post_norms: bool = False          # norm their outputs before the residual add (Gemma 2/3, OLMo 2)
    parallel_residual: bool = False   # x + attn(ln1 x) + mlp(ln2 x) (GPT-NeoX)
    qk_norm: str | None = None        # RMSNorm on q and k: "head" (over head_dim) | "proj" (whole projection)
    mlp: str = "gated"                # "gated": down(act(gate) * up) | "plain": down(act(up)) | "moe": routed experts
    n_experts: int = 0                # moe: experts per layer (E)
    experts_per_token: int = 0        # moe: top-k
    router: str = "topk_softmax"      # moe: how the chosen experts' weights are normalised (moe.NORMALISATIONS)
    shared_intermediate_size: int = 0  # moe: a gated MLP this wide beside the experts, on every token (Granite 4.0-H)
    act: str = "silu"
    positions: str = "rope"           # "rope" | "learned" (GPT-2)
    embed_scale: bool = False         # Gemma: embeddings x sqrt(hidden)
    attn_scale: float = 0.0           # scores are q.k x attn_scale (1/sqrt(head_dim) unless the family says)
    attn_softcap: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap)
    final_softcap: float | None = None  # Gemma 2: logits -> cap * tanh(logits / cap)
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    rope: tuple = ()                  # per layer: a Rope, or None (no rotary embedding in that layer)
    sliding_window: int | None = None
    layer_types: tuple = ()           # per layer: "full_attention" | "sliding_attention"
    layer_mixers: tuple = ()          # per layer: its token mixer (mixers.MIXERS); empty: attention in every layer
    attn_gate: bool = False           # Qwen3.5: attention output x sigmoid(gate), the gate from q_proj
    delta_net: DeltaNet | None = None
    short_conv: ShortConv | None = None
    mamba: Mamba | None = None
    embed_multiplier: float = 1.0     # Granite, Falcon-H1: embeddings x it
    residual_multiplier: float = 1.0  # Granite: each block's output x it before the residual add
    logits_multiplier: float = 1.0    # Granite: 1 / logits_scaling; Falcon-H1: lm_head_multiplier
    weight_scales: tuple = ()         # (tensor, first row, end row, factor, bias too) applied at load: Falcon-H1's µP
    eos_token_ids: tuple = ()
    architectures: tuple = ()         # config.json's `architectures`, e.g. ("LlamaForCausalLM",)
    wrapper: str = ""                 # a multimodal checkpoint's model_type (gemma3, mistral3): this is its text model
    image_token_ids: tuple = ()       # the wrapper's image tokens: refused in a prompt (no vision tower is run)

    @property
    def group(self) -> int:
        """Query heads per KV head: query head h reads KV head h // group (HF's order)."""
        return self.n_heads // self.n_kv_heads

    def mixer(self, layer: int) -> str:
        """The layer's token mixer, a key of mixers.MIXERS."""
        return self.layer_mixers[layer] if self.layer_mixers else "attention"

    def is_sliding(self, layer: int) -> bool:
        return self.sliding_window is not None and self.layer_types[layer] == "sliding_attention"

    def window(self, layer: int) -> int | None:
        """The sliding window of this layer, or None for full causal attention."""
        return self.sliding_window if self.is_sliding(layer) else None

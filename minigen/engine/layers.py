"""Norms, activations, the gated MLP and rotary position embeddings, as pure NumPy functions in float32.

Each follows the HF modeling file it stands in for, step for step, so that the numbers agree:
RMSNorm (Gemma's (1 + w) is folded into the weight at load), LayerNorm, gelu_new / gelu_pytorch_tanh,
exact gelu, SiLU, tanh soft-capping, and RoPE in HF's half-split (`rotate_half`) layout, partial or
whole, with default, linear, llama3, longrope and YaRN frequencies, and Ministral 3's per-position query scale.
"""
from __future__ import annotations

import math

import numpy as np

from .config import Rope
from .linear import linear
from .quant.matrix import twins
from ..errors import MinigenError


# --- norms ---------------------------------------------------------------------------------------

def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w."""
    ms = np.square(x).sum(axis=-1, keepdims=True)                 # sum, not mean: np.mean is slower
    ms *= np.float32(1.0 / x.shape[-1])
    ms += np.float32(eps)
    np.sqrt(ms, out=ms)
    y = x / ms
    y *= w
    return y


def rms_norm_rows(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """rms_norm, by its numba twin (compiled.py) for a few float32 rows (a decode step's, a batch's) once the
    kernels are loaded (quant.matrix.twins): the same numbers to float32's rounding, ~3 us of NumPy's ~16."""
    if x.ndim == 2 and len(x) <= TWIN_ROWS and x.dtype == w.dtype == np.float32 and (twin := twins()) is not None:
        return twin.rms_norm(np.ascontiguousarray(x), w, eps)
    return rms_norm(x, w, eps)


TWIN_ROWS = 16   # rows up to which the twins (rms_norm_rows, gated, rope_rows) serve; a prompt's stay in NumPy


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    xc = x - mean
    var = np.mean(xc * xc, axis=-1, keepdims=True)
    return xc * (1.0 / np.sqrt(var + np.float32(eps))) * w + b


# --- activations ----------------------------------------------------------------------------------

def silu(x: np.ndarray) -> np.ndarray:
    """x · sigmoid(x) = x / (1 + e⁻ˣ). Where e⁻ˣ overflows (x < -88) it is inf and the quotient -0, the
    limit. Written with exp, not as x (1 + tanh(x/2)) / 2: NumPy's float32 exp is the cheaper of the two
    (AMD EPYC, AVX2: a 480 x 1536 gate in 3.6 ms against 5.3 ms)."""
    y = np.negative(x)
    with np.errstate(over="ignore"):
        np.exp(y, out=y)
    y += np.float32(1)
    return np.divide(x, y, out=y)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GPT-2's gelu_new, identical to torch's gelu(approximate='tanh') (gelu_pytorch_tanh)."""
    c = np.float32(math.sqrt(2.0 / math.pi))
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """Exact gelu, 0.5 x (1 + erf(x / sqrt 2)), with erf from Abramowitz & Stegun 7.1.26 (|err| < 1.5e-7)."""
    z = np.abs(x) * np.float32(1 / math.sqrt(2.0))
    t = 1.0 / (1.0 + np.float32(0.3275911) * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = np.sign(x) * (1.0 - poly * np.exp(-z * z))
    return (np.float32(0.5) * x * (1.0 + erf)).astype(np.float32)


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap), in place: Gemma 2 bounds attention scores and logits this way."""
    x /= np.float32(cap)
    np.tanh(x, out=x)
    x *= np.float32(cap)
    return x


def sigmoid(x: np.ndarray) -> np.ndarray:
    return np.float32(0.5) * (np.tanh(x * np.float32(0.5)) + np.float32(1))   # no overflow for large |x|


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, np.float32(0))


ACTIVATIONS = {
    "silu": silu, "swish": silu,
    "gelu_new": gelu_tanh, "gelu_pytorch_tanh": gelu_tanh, "gelu_fast": gelu_tanh,
    "gelu": gelu_erf, "relu": relu,
}


def activation(name: str):
    if name not in ACTIVATIONS:
        raise MinigenError(f"config.json: unsupported activation {name!r} (minigen has {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


def gated(x: np.ndarray, gate_up: np.ndarray, down: np.ndarray, fn, b_gate_up: np.ndarray | None = None,
          b_down: np.ndarray | None = None) -> np.ndarray:
    """A gated MLP on rows x (N, D): down(fn(gate x) * up x), gate and up stacked in gate_up (2F, D), down
    (D, F). The dense MLP of most families, each routed expert (moe.py) and a shared MLP beside them."""
    h = linear(x, gate_up, b_gate_up)                                        # (N, 2F)
    F = h.shape[1] // 2
    if fn is silu and len(h) <= TWIN_ROWS and h.dtype == np.float32 and (twin := twins()) is not None:
        g = twin.silu_gate(h)                                                # (N, F), compiled.py
    else:
        g = fn(h[:, :F])                                                     # (N, F)
        g *= h[:, F:]  # in place: one (N, F) temporary fewer on a long prompt
    return linear(g, down, b_down)                                           # (N, D)


# --- rotary position embeddings -----------------------------------------------------------------

def rope_frequencies(rope: Rope, seq_len: int = 0) -> np.ndarray:
    """inv_freq (rope.dim/2,) in float32, as transformers' rope init functions compute it. `seq_len`
    (the longest position this forward reaches, plus one) picks longrope's short or long factors."""
    # theta ** (2i / dim) in float64, rounded once: float32 pow differs by an ulp between NumPy's SIMD paths
    # (AVX2, AVX-512) and torch's, and the rest below is float32 arithmetic that rounds alike on every CPU
    exponents = np.arange(0, rope.dim, 2, dtype=np.float64) / rope.dim
    base = (np.float64(rope.theta) ** exponents).astype(np.float32)
    if rope.kind == "longrope":
        factors = rope.long_factor if seq_len > rope.original_max else rope.short_factor
        return (np.float32(1.0) / (np.asarray(factors, np.float32) * base)).astype(np.float32)
    inv_freq = (np.float32(1.0) / base).astype(np.float32)
    if rope.kind == "linear":
        return inv_freq / np.float32(rope.factor)
    if rope.kind == "llama3":
        return _llama3_frequencies(inv_freq, rope)
    if rope.kind == "yarn":
        return _yarn_frequencies(base, rope)
    return inv_freq


def _llama3_frequencies(inv_freq: np.ndarray, r: Rope) -> np.ndarray:
    """Llama 3.1's scaling: long wavelengths divided by `factor`, short ones kept, a smooth blend between."""
    factor, low, high, old_len = (np.float32(v) for v in
                                  (r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max))
    wavelen = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn_frequencies(base: np.ndarray, r: Rope) -> np.ndarray:
    """YaRN (transformers' _compute_yarn_parameters): the highest frequencies kept (extrapolated), the lowest
    divided by `factor` (interpolated), a linear ramp between, over the dims whose wavelengths make between
    beta_fast and beta_slow turns in the original context. The ramp's ends in float64, the rest in float32."""
    def turns_dim(turns: float) -> float:  # the dim at which a wavelength makes `turns` turns in original_max
        return r.dim * math.log(r.original_max / (turns * 2 * math.pi)) / (2 * math.log(r.theta))
    low, high = turns_dim(r.beta_fast), turns_dim(r.beta_slow)
    if r.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, r.dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(r.dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    keep = np.float32(1) - ramp.astype(np.float32)                          # 1: extrapolate, 0: interpolate
    extrapolated = np.float32(1) / base
    interpolated = np.float32(1) / (np.float32(r.factor) * base)
    return (interpolated * (np.float32(1) - keep) + extrapolated * keep).astype(np.float32)


def query_scale(rope: Rope, positions: np.ndarray) -> np.ndarray | None:
    """Ministral 3's (llama 4's) attention temperature, 1 + beta log(1 + floor(pos / original_max)): (T,)
    float32, what each position's query is multiplied by after RoPE; None when the config has none."""
    if not rope.query_beta:
        return None
    steps = np.floor(positions.astype(np.float32) / np.float32(rope.original_max))
    return (np.float32(1) + np.float32(rope.query_beta) * np.log(np.float32(1) + steps)).astype(np.float32)


def rope_tables(rope: Rope, positions: np.ndarray, length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin, each (T, rope.dim): the frequencies repeated for both halves (half-split layout),
    times longrope's or YaRN's attention factor. One forward uses one set of frequencies, chosen by its last
    position (or the sequence `length` given), as transformers does."""
    inv_freq = rope_frequencies(rope, length if length is not None else int(positions[-1]) + 1 if len(positions) else 0)
    freqs = positions.astype(np.float32)[:, None] * inv_freq[None, :]  # (T, dim/2)
    emb = np.concatenate([freqs, freqs], axis=-1)                       # (T, dim)
    cos, sin = np.cos(emb), np.sin(emb)
    if rope.attention_factor != 1.0:
        cos *= np.float32(rope.attention_factor)
        sin *= np.float32(rope.attention_factor)
    return cos, sin


def rope_rows(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """apply_rope of rows x (N, M, d), M heads at each row's position, cos and sin (N, r): by numba's twin
    (compiled.py) for a few float32 rows once the kernels are loaded (~2 us of NumPy's ~10-20)."""
    if len(x) <= TWIN_ROWS and x.dtype == cos.dtype == np.float32 and (twin := twins()) is not None:
        return twin.rope(np.ascontiguousarray(x), np.ascontiguousarray(cos), np.ascontiguousarray(sin))
    return apply_rope(x, cos[:, None], sin[:, None])


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x * cos + rotate_half(x) * sin on the first r = cos.shape[-1] dims of x (..., head_dim); the
    rest pass through (partial rotary: Phi-3, GPT-NeoX). rotate_half pairs dimension i with i + r/2,
    HF's layout, not the interleaved (2i, 2i+1) pairs of the original paper and llama.cpp. Written as
    two half-updates: no concatenated copy."""
    r = cos.shape[-1]
    half = r // 2
    if r == x.shape[-1]:
        out = x * cos
    else:
        out = x.copy()
        out[..., :r] *= cos
    out[..., :half] -= x[..., half:r] * sin[..., :half]
    out[..., half:r] += x[..., :half] * sin[..., half:]
    return out

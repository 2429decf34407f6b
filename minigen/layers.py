"""Norms, activations and rotary position embeddings, as pure NumPy functions in float32.

Each follows the HF modeling file it stands in for, step for step, so that the numbers agree:
Llama's RMSNorm, Gemma's (1 + w) RMSNorm, GPT-2's LayerNorm, gelu_new / gelu_pytorch_tanh, SiLU,
and RoPE in HF's half-split (`rotate_half`) layout with default, linear and llama3 frequencies.
"""
from __future__ import annotations

import math

import numpy as np

from .errors import MinigenError


# --- norms ---------------------------------------------------------------------------------------

def rms_norm(x: np.ndarray, w: np.ndarray, eps: float, offset: float = 0.0) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * (offset + w). offset=1 is Gemma's convention."""
    ms = np.square(x).sum(axis=-1, keepdims=True)                 # sum, not mean: np.mean is slower
    ms *= np.float32(1.0 / x.shape[-1])
    ms += np.float32(eps)
    np.sqrt(ms, out=ms)
    y = x / ms
    y *= (w + np.float32(offset)) if offset else w
    return y


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    xc = x - mean
    var = np.mean(xc * xc, axis=-1, keepdims=True)
    return xc * (1.0 / np.sqrt(var + np.float32(eps))) * w + b


# --- activations ----------------------------------------------------------------------------------

def silu(x: np.ndarray) -> np.ndarray:
    # sigmoid(x) = (1 + tanh(x/2)) / 2: no overflow for large |x|, unlike 1 / (1 + exp(-x))
    y = np.multiply(x, np.float32(0.5))
    np.tanh(y, out=y)
    y *= np.float32(0.5)
    y += np.float32(0.5)
    y *= x
    return y


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


# --- rotary position embeddings -----------------------------------------------------------------

def rope_frequencies(head_dim: int, theta: float, scaling: dict | None) -> np.ndarray:
    """inv_freq (head_dim/2,) in float32, as transformers' rope init functions compute it."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (np.float32(1.0) / (np.float32(theta) ** exponents)).astype(np.float32)
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "linear":
        return inv_freq / np.float32(scaling["factor"])
    return _llama3_frequencies(inv_freq, scaling)


def _llama3_frequencies(inv_freq: np.ndarray, s: dict) -> np.ndarray:
    """Llama 3.1's scaling: long wavelengths divided by `factor`, short ones kept, a smooth blend between."""
    factor, low, high, old_len = (np.float32(s[k]) for k in
                                  ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"))
    wavelen = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(inv_freq: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin, each (T, head_dim): the frequencies repeated for both halves (half-split layout)."""
    freqs = positions.astype(np.float32)[:, None] * inv_freq[None, :]  # (T, head_dim/2)
    emb = np.concatenate([freqs, freqs], axis=-1)                       # (T, head_dim)
    return np.cos(emb), np.sin(emb)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x * cos + rotate_half(x) * sin for x (..., head_dim), cos and sin broadcastable to x.
    rotate_half pairs dimension i with i + head_dim/2, HF's layout, not the interleaved (2i, 2i+1)
    pairs of the original paper and llama.cpp. Written as two half-updates: no concatenated copy."""
    half = x.shape[-1] // 2
    out = x * cos
    out[..., :half] -= x[..., half:] * sin[..., :half]
    out[..., half:] += x[..., :half] * sin[..., half:]
    return out

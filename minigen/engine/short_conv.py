"""Causal depthwise convolution, and LFM2's gated short convolution built on it.

Shape letters:
    T  new tokens        C  channels        K  kernel length        D  hidden size

A causal depthwise convolution mixes each channel with its own K - 1 predecessors:

    y[t, c] = b[c] + Σ_{j<K} w[c, j] · x[t + j - (K - 1), c]          (x before the prompt is 0)

which is torch's `Conv1d(groups=C, padding=K-1)` cut to the first T outputs, as transformers runs it.
The state it carries from one forward to the next is the last K - 1 inputs (the "tail"), so a prompt
fed in pieces convolves exactly like one piece, and a decode step costs K multiply-adds per channel.
Gated DeltaNet (gated_delta.py) and Mamba2 (ssm.py) run their q/k/v or x/B/C through it.

LFM2's short convolution (Liquid AI, "LFM2 Technical Report", 2025) gates the convolution on both sides:

    B, C, x̃ = split(in_proj(x))         y = out_proj(C ⊙ conv(B ⊙ x̃))

with K = conv_L_cache (3 in the published checkpoints) and no activation.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from . import parallel
from .linear import linear


CONV_BLOCK = 1 << 18   # elements per block of rows: each tap's product stays in cache (6144 channels: 42 rows)


def causal_conv(x: np.ndarray, tail: np.ndarray, w: np.ndarray, b: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """x (T, C) the new inputs, tail (K-1, C) the inputs before them (zeros before the first), w (C, K)
    torch's depthwise weight with its singleton axis dropped, b (C,) or None. Returns y (T, C) and the
    new tail (K-1, C), the last K-1 inputs. A long prompt's rows go in chunks to both cores, each chunk
    reading the K-1 inputs before it, and within a chunk in blocks of CONV_BLOCK elements, so that the
    K passes over a block run in cache, not in memory (Qwen3.5's 6144 channels at 512 tokens: 5 ms
    against 11)."""
    T, K = len(x), w.shape[1]
    y = np.empty(x.shape, np.float32)                                        # (T, C)
    taps = np.ascontiguousarray(w.T)                                         # (K, C)
    step = max(8, CONV_BLOCK // x.shape[1])                                  # rows per block

    def rows(r: slice):
        before = np.concatenate([tail, x[max(0, r.start - (K - 1)):r.start]])   # the inputs before row r.start
        xs = np.concatenate([before[len(before) - (K - 1):], x[r]])         # (K-1+t, C): xs[i] = x[r.start+i-(K-1)]
        product = np.empty((min(step, r.stop - r.start), x.shape[1]), np.float32)
        for i in range(0, r.stop - r.start, step):
            out = y[r.start + i:min(r.stop, r.start + i + step)]              # (t, C)
            t = len(out)
            np.multiply(xs[i:i + t], taps[0], out=out)
            for j in range(1, K):   # K is 3 or 4: a few multiply-adds over the block, no loop over tokens
                out += np.multiply(xs[i + j:i + j + t], taps[j], out=product[:t])
            if b is not None:
                out += b

    parallel.in_threads([partial(rows, r) for r in parallel.row_chunks(T)], parallel.threads_for(T))
    last = np.concatenate([tail, x[max(0, T - (K - 1)):]])
    return y, last[len(last) - (K - 1):].copy()                              # (K-1, C)


def short_conv(x: np.ndarray, tail: np.ndarray, p: dict) -> tuple[np.ndarray, np.ndarray]:
    """LFM2's mixer on x (T, D), already normed: what it adds to the residual stream (T, D), and the
    convolution's new tail (K-1, D). p: w_in (3D, D), conv_w (D, K), w_out (D, D), and with
    conv_bias b_in, conv_b, b_out."""
    bcx = linear(x, p["w_in"], p.get("b_in"))                                # (T, 3D)
    D = bcx.shape[1] // 3
    gated = bcx[:, :D] * bcx[:, 2 * D:]                                      # (T, D): B ⊙ x̃
    y, tail = causal_conv(gated, tail, p["conv_w"], p.get("conv_b"))         # (T, D)
    y *= bcx[:, D:2 * D]                                                     # C ⊙ conv(...)
    return linear(y, p["w_out"], p.get("b_out")), tail                       # (T, D)


# --- one token's step, written out (minigen trace on a short-convolution layer) -------------------------

def one_token(x: np.ndarray, t: int, p: dict, cfg, head: int, fmt) -> tuple[list[str], np.ndarray, float]:
    """Token t of the layer's normed input x (T, D) through the layer, each quantity as a line (vectors
    through `fmt`), from the tail the layer's own forward leaves after tokens 0..t-1. Returns the lines,
    the layer's output for the token (D,), and 0.0 (no state beyond the tail). `head` is unused: the
    convolution is per channel."""
    K, D = cfg.short_conv.kernel, cfg.hidden_size
    tail = np.zeros((K - 1, D), np.float32)
    if t > 0:
        _, tail = short_conv(x[:t], tail, p)
    bcx = linear(x[t:t + 1], p["w_in"], p.get("b_in"))
    full, _ = short_conv(x[t:t + 1], tail, p)
    lines = [f"1. in_proj: B, C, x̃ ({D} channels each); B ⊙ x̃ = {fmt((bcx[:, :D] * bcx[:, 2 * D:])[0])}",
             f"2. the state before this token: B ⊙ x̃ of the {K - 1} tokens before it (the conv's tail), "
             f"|tail| = {np.linalg.norm(tail):.4f}",
             f"3. the depthwise conv over those and this token, times C, out_proj: the layer's output {fmt(full[0])}"]
    return lines, full[0], 0.0

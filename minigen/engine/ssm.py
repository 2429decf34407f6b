"""Mamba2 (Granite 4.0-H, Falcon-H1): a causal conv, then the selective state space scan.

Shape letters:
    T  new tokens        D  hidden size        H  SSM heads        P  head dim (H P = I, the inner size)
    G  groups (B and C are shared by the H / G heads of a group)   N  state size (d_state)
    L  chunk length (mamba_chunk_size)

Each head keeps a state S (P, N). Per token, with Δ = softplus(dt + dt_bias) the step and A = -exp(A_log)
a negative scalar per head (Dao & Gu 2024, "Transformers are SSMs: Generalized Models and Efficient
Algorithms Through Structured State Space Duality", eq. 1 with scalar-times-identity A):

    S_t = exp(Δ_t A) S_{t-1} + Δ_t x_t B_tᵀ          y_t = S_t C_t + D x_t

Decode runs it one token at a time (`recurrent_step`, flat in the context). A prompt uses the SSD
chunked form (`chunked`, §6 of the paper, as transformers' `mamba2_chunk_scan` writes it): inside a
chunk of L tokens the scan is a masked "attention" (C Bᵀ ⊙ the decays between positions) applied to
Δx, plus what the state at the chunk's start contributes; the state then passes to the next chunk.
The chunk loop here carries the state itself (transformers computes the chunk starts in one more
einsum): the same sums in another order, ~1e-6 apart.

The layer around it (`mamba2`): one input projection gives the gate z, x‖B‖C (through the conv and
SiLU) and dt; the output y is gated and normed — RMSNorm per group of y · silu(z) (Granite,
Falcon-H1 with mamba_rms_norm), or y · silu(z) alone (Falcon-H1's default) — and goes through out_proj.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from . import parallel
from .gated_delta import softplus
from .layers import silu
from .linear import linear
from .short_conv import causal_conv
from ..errors import MinigenError


def step_size(dt: np.ndarray, dt_bias: np.ndarray, limit: tuple | None = None) -> np.ndarray:
    """Δ = softplus(dt + dt_bias), clamped to `limit` (time_step_limit) when given."""
    delta = softplus(dt + dt_bias)
    return delta if limit is None else np.clip(delta, limit[0], limit[1]).astype(np.float32)


def recurrent_step(x: np.ndarray, delta: np.ndarray, A: np.ndarray, B: np.ndarray, C: np.ndarray,
                   D: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One token: x (H, P), delta (H,), A and D (H,), B and C (G, N), state (H, P, N). Returns y (H, P)
    and the new state."""
    H, G = len(x), len(B)
    Bh, Ch = np.repeat(B, H // G, axis=0), np.repeat(C, H // G, axis=0)     # (H, N): head h, group h // (H/G)
    state = state * np.exp(delta * A)[:, None, None]                         # (H, P, N)
    state += (delta[:, None] * x)[:, :, None] * Bh[:, None, :]
    y = np.einsum("hpn,hn->hp", state, Ch)                                   # (H, P)
    return y + D[:, None] * x, state


def chunked(x: np.ndarray, delta: np.ndarray, A: np.ndarray, B: np.ndarray, C: np.ndarray, D: np.ndarray,
            state: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """The scan over T tokens: x (T, H, P), delta (T, H), A and D (H,), B and C (T, G, N), state (H, P, N).
    Returns y (T, H, P) and the state after the last token."""
    T, H, P = x.shape
    G = B.shape[1]
    Bh = np.repeat(B, H // G, axis=1).transpose(1, 0, 2)                     # (H, T, N)
    Ch = np.repeat(C, H // G, axis=1).transpose(1, 0, 2)                     # (H, T, N)
    xdt = (x * delta[..., None]).transpose(1, 0, 2)                          # (H, T, P): Δ x
    a = (delta * A).T.astype(np.float64)                                     # (H, T): log decay per token
    y, state = parallel.by_heads(partial(scan_heads, chunk=chunk), xdt, a, Bh, Ch, state)   # heads are independent
    return y.transpose(1, 0, 2) + D[:, None] * x, state


def scan_heads(xdt: np.ndarray, a: np.ndarray, Bh: np.ndarray, Ch: np.ndarray, state: np.ndarray,
               chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """The chunked scan for some heads on one thread: xdt (H, T, P), a (H, T) float64, Bh and Ch
    (H, T, N), state (H, P, N) -> y (H, T, P) without the skip D x, and the state after the last token."""
    H, T, P = xdt.shape
    y = np.empty((H, T, P), np.float32)
    state = state.astype(np.float32, copy=True)
    for s in range(0, T, chunk):   # T / L steps; each a few (L, L) and (L, N) matrix products per head
        e = min(T, s + chunk)
        cum = np.cumsum(a[:, s:e], axis=1)                                   # (H, L), float64: differences stay exact
        seg = cum[:, :, None] - cum[:, None, :]                              # (H, L, L): decay from j to i
        causal = np.tril(np.ones((e - s, e - s), bool))
        decay = np.where(causal, np.exp(np.where(causal, seg, 0)), 0).astype(np.float32)
        scores = (Ch[:, s:e] @ Bh[:, s:e].swapaxes(1, 2)) * decay            # (H, L, L): C_i · B_j, decayed
        y[:, s:e] = scores @ xdt[:, s:e]                                     # within the chunk
        y[:, s:e] += (Ch[:, s:e] @ state.swapaxes(1, 2)) * np.exp(cum)[..., None].astype(np.float32)
        to_end = np.exp(cum[:, -1:] - cum).astype(np.float32)                # (H, L)
        state = state * np.exp(cum[:, -1]).astype(np.float32)[:, None, None] + \
            (xdt[:, s:e] * to_end[..., None]).swapaxes(1, 2) @ Bh[:, s:e]    # (H, P, N)
    return y, state


def gated_norm(y: np.ndarray, z: np.ndarray, w: np.ndarray | None, groups: int, eps: float,
               norm_before_gate: bool = False) -> np.ndarray:
    """y (T, I) gated by silu(z) and RMS-normed per group of I / groups channels (w (I,)), the gate before
    the norm unless norm_before_gate; without w, only the gate."""
    if w is None:
        return y * silu(z)
    if not norm_before_gate:
        y = y * silu(z)
    T, I = y.shape
    yg = y.reshape(T, groups, I // groups)
    yg = yg / np.sqrt(np.square(yg).mean(-1, keepdims=True) + np.float32(eps))
    out = yg.reshape(T, I) * w
    return out * silu(z) if norm_before_gate else out


def mamba2(x: np.ndarray, tail: np.ndarray, state: np.ndarray, p: dict, m) -> tuple:
    """The layer on x (T, D), already normed (and scaled: Falcon-H1's multipliers are folded into w_in
    at load): what it adds to the residual stream (T, D), the conv's new tail (K-1, I + 2GN) and the new
    state (H, P, N). `m`: a Config's `ssm` settings (heads, head_dim, groups, state_size, chunk, limit,
    eps, norm, norm_before_gate). p: w_in (2I + 2GN + H, D) and b_in; conv_w (I + 2GN, K), conv_b;
    A_log, D, dt_bias (H,); gate_norm (I,) when normed; w_out (D, I), b_out."""
    T = len(x)
    H, P, G, N = m.heads, m.head_dim, m.groups, m.state_size
    I = H * P
    proj = linear(x, p["w_in"], p.get("b_in"))                               # (T, 2I + 2GN + H)
    z, dt = proj[:, :I], proj[:, 2 * I + 2 * G * N:]
    xbc, tail = causal_conv(proj[:, I:2 * I + 2 * G * N], tail, p["conv_w"], p.get("conv_b"))
    xbc = silu(xbc)                                                          # (T, I + 2GN)
    xs = xbc[:, :I].reshape(T, H, P)
    B, C = xbc[:, I:I + G * N].reshape(T, G, N), xbc[:, I + G * N:].reshape(T, G, N)
    A = -np.exp(p["A_log"])
    if T == 1:  # transformers' one-token update does not clamp Δ (time_step_limit); its chunked scan does
        y, state = recurrent_step(xs[0], step_size(dt[0], p["dt_bias"]), A, B[0], C[0], p["D"], state)
        y = y[None]
    else:
        y, state = chunked(xs, step_size(dt, p["dt_bias"], m.limit), A, B, C, p["D"], state, m.chunk)
    y = gated_norm(y.reshape(T, I), z, p.get("gate_norm"), G, m.eps, m.norm_before_gate)
    return linear(y, p["w_out"], p.get("b_out")), tail, state                # (T, D)


# --- one token's step, written out (minigen trace on a Mamba2 layer) ------------------------------------

def one_token(x: np.ndarray, t: int, p: dict, cfg, head: int, fmt) -> tuple[list[str], np.ndarray, float]:
    """Token t of the layer's normed input x (T, D) through the recurrence above for head `head`, each
    quantity as a line (vectors through `fmt`), from the state the layer's own forward leaves after tokens
    0..t-1. Returns the lines, the layer's output for the token (D,), and how far this head's new state is
    from the one the layer's own step computes."""
    m = cfg.mamba
    H, P, G, N, I = m.heads, m.head_dim, m.groups, m.state_size, m.inner
    if not 0 <= head < H:
        raise MinigenError(f"--head {head} out of range (this Mamba2 layer has {H} heads: 0-{H - 1})")
    tail, state = np.zeros((m.conv_kernel - 1, I + 2 * G * N), np.float32), np.zeros((H, P, N), np.float32)
    if t > 0:
        _, tail, state = mamba2(x[:t], tail, state, p, m)
    proj = linear(x[t:t + 1], p["w_in"], p.get("b_in"))
    conv, _ = causal_conv(proj[:, I:2 * I + 2 * G * N], tail, p["conv_w"], p.get("conv_b"))
    xbc = silu(conv)[0]
    g = head // (H // G)
    xs = xbc[head * P:(head + 1) * P]
    B, C = xbc[I + g * N:I + (g + 1) * N], xbc[I + G * N + g * N:I + G * N + (g + 1) * N]
    delta = step_size(proj[0, 2 * I + 2 * G * N + head], p["dt_bias"][head])
    A = -np.exp(p["A_log"][head])
    S = state[head]
    S_new = np.exp(delta * A) * S + np.outer(delta * xs, B)
    y = S_new @ C + p["D"][head] * xs
    full, _, new_state = mamba2(x[t:t + 1], tail, state, p, m)
    lines = [
        f"1. in_proj, then the causal conv (kernel {m.conv_kernel}) and SiLU: x (head {head} of {H}), B and C "
        f"(group {g} of {G}, {N} dims)",
        f"   x = {fmt(xs)}", f"   B = {fmt(B)}", f"   C = {fmt(C)}",
        f"2. the step Δ = softplus(dt + dt_bias) = {float(delta):.4f}, the decay exp(Δ A) = {float(np.exp(delta * A)):.4f}",
        f"3. the state before this token, S ({P} x {N}), |S| = {np.linalg.norm(S):.4f}",
        f"4. S ← exp(Δ A) S + Δ x Bᵀ, |S| = {np.linalg.norm(S_new):.4f}",
        f"5. y = S C + D x = {fmt(y)}",
        f"6. every head gated by silu(z){' and RMS-normed per group' if m.norm else ''}, out_proj: the layer's output "
        f"{fmt(full[0])}"]
    return lines, full[0], float(np.abs(S_new - new_state[head]).max())

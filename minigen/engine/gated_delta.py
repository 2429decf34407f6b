"""Gated DeltaNet (Qwen3.5's linear-attention layers): a causal conv, then the gated delta rule.

Shape letters:
    T  new tokens        D  hidden size        H  value heads        Hk  key heads (H = Hk · G)
    dk key head dim      dv value head dim     C  chunk length (64)  N  chunks

Each value head keeps a matrix S (dk, dv) instead of a growing K/V cache. Per token, with
α = exp(g) ∈ (0, 1) the gate (decay) and β ∈ (0, 1) the write strength (Yang, Kautz & Hatamizadeh
2024, "Gated Delta Networks: Improving Mamba2 with Delta Rule", eq. 10, in the row-vector form
transformers uses):

    S_t = α_t S_{t-1} + β_t k_t (v_t - α_t S_{t-1}ᵀ k_t)ᵀ   — decay, then correct what S predicts for k_t
    o_t = S_tᵀ q_t

with q and k L2-normalised per head and q scaled by 1/√dk. Decode runs this one step at a time
(`recurrent_step`: O(dk dv) per head, flat in the context). A prompt runs it in chunks of C tokens
(`chunked`, the WY/UT form of Yang et al. 2024 "Parallelizing Linear Transformers with the Delta Rule
over Sequence Length", as transformers' `torch_chunk_gated_delta_rule` writes it): inside a chunk the
C updates are one unit-triangular inverse and a few matrix products, and S passes from chunk to chunk.
The two are the same recurrence computed in different orders; they agree to ~1e-6.

The layer around it (`gated_deltanet`): one fused input projection gives q, k, v (through the
conv, k = 4, and SiLU), z (the output gate), b (β = sigmoid b) and a (g = -exp(A_log) · softplus(a +
dt_bias)); the heads' outputs go through a gated RMSNorm, rms_norm(o) · w · silu(z), and out_proj.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from . import parallel
from .layers import sigmoid, silu
from .linear import linear
from .short_conv import causal_conv
from ..errors import MinigenError

CHUNK = 64  # transformers' chunk_size; the chunked form is exact for any C, this one matches its rounding


def l2norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """x / sqrt(Σx² + eps) over the last axis (FLA's and transformers' form)."""
    return x / np.sqrt(np.square(x).sum(-1, keepdims=True) + np.float32(eps))


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + eᕽ), as torch computes it: x itself past 20."""
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(np.float32)


def recurrent_step(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                   state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One token per head: q, k (H, dk) normed and q scaled, v (H, dv), g and beta (H,), state (H, dk, dv).
    Returns o (H, dv) and the new state. A decode step is bound by passes over the (H, dk, dv) state,
    so it reads the old state once (for both q and k) and writes the new one once, taking o from
    o = S_tᵀq = α S_{t-1}ᵀq + (kᵀq) δ rather than from a second pass over S_t."""
    alpha = np.exp(g)[:, None]                                               # (H, 1)
    read = np.matmul(np.stack([q, k], axis=1), state)                        # (H, 2, dv): S_{t-1}ᵀq, S_{t-1}ᵀk
    delta = (v - alpha * read[:, 1]) * beta[:, None]                         # (H, dv): β (v - what α S says for k)
    new = state * alpha[:, :, None]                                          # (H, dk, dv): α S
    new += k[:, :, None] * delta[:, None, :]                                 #   + k δᵀ
    o = alpha * read[:, 0] + np.einsum("hk,hk->h", q, k)[:, None] * delta    # (H, dv)
    return o, new


def chunked(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
            state: np.ndarray, chunk: int = CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """The same recurrence over T tokens: q, k (H, T, dk) normed and q scaled, v (H, T, dv), g and beta
    (H, T), state (H, dk, dv). Returns o (H, T, dv) and the state after the last token. The heads are
    independent: they go in groups to parallel threads (parallel.by_heads)."""
    return parallel.by_heads(partial(chunked_heads, chunk=chunk), q, k, v, g, beta, state)


def chunked_heads(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                  state: np.ndarray, chunk: int = CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """`chunked` for some of the heads, on one thread."""
    H, T, dk = k.shape
    pad = (-T) % chunk     # padded positions have k = v = 0 and g = 0: they change nothing
    q, k, v = (np.pad(a, ((0, 0), (0, pad), (0, 0))) for a in (q, k, v))
    g, beta = (np.pad(a, ((0, 0), (0, pad))) for a in (g, beta))
    n = (T + pad) // chunk
    q, k, v = (a.reshape(H, n, chunk, -1) for a in (q, k, v))               # (H, N, C, d)
    cum = g.reshape(H, n, chunk).cumsum(-1)                                  # (H, N, C): log of α_1 … α_t
    k_beta = k * beta.reshape(H, n, chunk, 1)
    v_beta = v * beta.reshape(H, n, chunk, 1)
    decay = cum[..., :, None] - cum[..., None, :]                            # (H, N, C, C): log α_j+1 … α_i
    np.minimum(decay, 0, out=decay)      # above the diagonal (j > i) the difference is >= 0: kept from overflowing
    np.exp(decay, out=decay)
    decay *= np.tril(np.ones((chunk, chunk), np.float32))                    # and zeroed there: j <= i
    # the UT transform: the chunk's C delta-rule writes as one unit-lower-triangular system (I + A)
    inverse = unit_lower_inverse(np.tril(k_beta @ k.swapaxes(-1, -2) * decay, -1))   # (H, N, C, C)
    u = inverse @ v_beta                                                     # (H, N, C, dv)
    w = inverse @ (k_beta * np.exp(cum)[..., None])                          # (H, N, C, dk)
    intra = (q @ k.swapaxes(-1, -2)) * decay                                 # (H, N, C, C), causal
    q_decayed = q * np.exp(cum)[..., None]                                   # reads the state at the chunk start
    k_decayed = k * np.exp(cum[..., -1:] - cum)[..., None]                   # writes, decayed to the chunk end
    chunk_decay = np.exp(cum[..., -1])[..., None, None]                      # (H, N, 1, 1)
    out = np.empty((H, n, chunk, v.shape[-1]), np.float32)
    state = state.astype(np.float32, copy=True)
    for i in range(n):      # N = T / 64 steps; each is a few (C, d) matrix products per head
        v_new = u[:, i] - w[:, i] @ state                                    # (H, C, dv): the corrections
        out[:, i] = q_decayed[:, i] @ state + intra[:, i] @ v_new
        state = state * chunk_decay[:, i] + k_decayed[:, i].swapaxes(-1, -2) @ v_new
    return out.reshape(H, n * chunk, -1)[:, :T], state


def unit_lower_inverse(a: np.ndarray, base: int = 8) -> np.ndarray:
    """(I + A)⁻¹ for A (..., C, C) strictly lower triangular. The diagonal blocks of `base` rows by
    forward substitution a row at a time, as transformers' torch_chunk_gated_delta_rule does for the
    whole matrix (row i of M = (I + A)⁻¹ - I is -A_i - A_i M, which needs only the rows above it),
    every block of every head and chunk at once; then neighbouring blocks merged in pairs, doubling
    their size, by the inverse of a block-lower-triangular matrix:

        [[I + A11, 0], [A21, I + A22]]⁻¹ = [[N11, 0], [-N22 A21 N11, N22]]

    log2(C / base) merges of two products each instead of C - 1 row steps: 2x faster at C = 64 than
    substitution alone, which was ~4x faster than np.linalg.solve; both within ~1e-7 of an inverse in
    float64. A C that is not base times a power of two is substituted whole."""
    C = a.shape[-1]
    m = np.negative(a).reshape(-1, C, C)                                     # (B, C, C): N - I, block by block
    if C % base or (C // base) & (C // base - 1):
        base = C
    d = diagonal_blocks(m, base, 0, 0, 1)                                    # (B, C / base, base, base)
    for i in range(1, base):
        d[..., i, :i] += np.einsum("...j,...jk->...k", d[..., i, :i], d[..., :i, :i])
    size = base
    while size < C:   # pairs of blocks of `size`: the lower-left one, still -A21, becomes N21
        m11, m22, m21 = (diagonal_blocks(m, size, row, col, 2) for row, col in ((0, 0), (size, size), (size, 0)))
        a21_n11 = m21 @ m11
        a21_n11 += m21
        a21_n11 *= -1                                                        # A21 N11 = A21 (I + M11)
        m21[...] = m22 @ a21_n11
        m21 += a21_n11
        m21 *= -1                                                            # -N22 A21 N11
        size *= 2
    return m.reshape(a.shape) + np.eye(C, dtype=np.float32)


def diagonal_blocks(m: np.ndarray, size: int, row: int, col: int, every: int) -> np.ndarray:
    """A writable view (B, n, size, size) of m (B, C, C)'s blocks of `size` along the diagonal, one
    every `every` blocks, offset by (row, col): m[b, row + p every size + i, col + p every size + j]."""
    B, C, _ = m.shape
    s0, s1, s2 = m.strides
    return np.lib.stride_tricks.as_strided(m[:, row:, col:], (B, C // (size * every), size, size),
                                           (s0, every * size * (s1 + s2), s1, s2), writeable=True)


def gated_rms_norm(x: np.ndarray, z: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """rms_norm(x) · w · silu(z) over the last axis (Qwen3_5RMSNormGated: norm, then gate)."""
    ms = np.square(x).mean(-1, keepdims=True)
    return x / np.sqrt(ms + np.float32(eps)) * w * silu(z)


def gated_deltanet(x: np.ndarray, tail: np.ndarray, state: np.ndarray, p: dict, m) -> tuple:
    """The layer on x (T, D), already normed: what it adds to the residual stream (T, D), the conv's
    new tail (K-1, 2 Hk dk + H dv) and the new state (H, dk, dv). `m` holds the sizes (a Config's
    `linear` settings: key_heads, value_heads, key_dim, value_dim, eps). p: w_in (2 Hk dk + 2 H dv + 2H, D)
    = in_proj_qkv, in_proj_z, in_proj_b, in_proj_a stacked; conv_w (2 Hk dk + H dv, K); A_log, dt_bias (H,);
    gate_norm (dv,); w_out (D, H dv). Everything but the conv and the recurrence treats each token
    alone: on a long prompt those steps go in row chunks to both cores (parallel.by_rows)."""
    T = len(x)
    H, dv, n_qkv = m.value_heads, m.value_dim, 2 * m.key_heads * m.key_dim + m.value_heads * m.value_dim
    proj = linear(x, p["w_in"])                                              # (T, n_qkv + H dv + 2H)
    qkv, tail = causal_conv(proj[:, :n_qkv], tail, p["conv_w"])              # (T, n_qkv)
    q, k, v, g, beta = parallel.by_rows(heads_in, qkv, proj[:, n_qkv + H * dv:], p=p, m=m)
    if T == 1:
        o, state = recurrent_step(q[0], k[0], v[0], g[0], beta[0], state)
        o = o[None]                                                          # (1, H, dv)
    else:
        o, state = chunked(q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2), g.T, beta.T, state)
        o = o.transpose(1, 0, 2)                                             # (T, H, dv)
    z = proj[:, n_qkv:n_qkv + H * dv].reshape(T, H, dv)
    return parallel.by_rows(heads_out, o, z, p=p, m=m), tail, state


def heads_in(qkv: np.ndarray, ba: np.ndarray, p: dict, m) -> tuple:
    """Rows of the conv's output qkv (T, n_qkv) and of the b, a projections ba (T, 2H) -> q, k (T, H, dk)
    (SiLU, L2-normed, q scaled, key head h // G repeated for value head h), v (T, H, dv), g and beta (T, H)."""
    T = len(qkv)
    Hk, H, dk, dv = m.key_heads, m.value_heads, m.key_dim, m.value_dim
    qkv = silu(qkv)
    q = l2norm(qkv[:, :Hk * dk].reshape(T, Hk, dk))
    k = l2norm(qkv[:, Hk * dk:2 * Hk * dk].reshape(T, Hk, dk))
    v = qkv[:, 2 * Hk * dk:].reshape(T, H, dv)
    q *= np.float32(dk ** -0.5)
    if H != Hk:  # value head h reads key head h // G (transformers' repeat_interleave)
        q, k = np.repeat(q, H // Hk, axis=1), np.repeat(k, H // Hk, axis=1)  # (T, H, dk)
    beta = sigmoid(ba[:, :H])                                                # (T, H)
    g = -np.exp(p["A_log"]) * softplus(ba[:, H:] + p["dt_bias"])             # (T, H), log α <= 0
    return q, k, v, g, beta


def heads_out(o: np.ndarray, z: np.ndarray, p: dict, m) -> np.ndarray:
    """Rows of the heads' outputs o and gates z (T, H, dv) through the gated RMSNorm and out_proj: (T, D)."""
    o = gated_rms_norm(o, z, p["gate_norm"], m.eps)                          # (T, H, dv)
    return linear(o.reshape(len(o), -1), p["w_out"])


# --- one token's step, written out (minigen trace on a Gated DeltaNet layer) ----------------------------

def one_token(x: np.ndarray, t: int, p: dict, cfg, head: int, fmt) -> tuple[list[str], np.ndarray, float]:
    """Token t of the layer's normed input x (T, D) through the recurrence above for value head `head`, each
    quantity as a line (vectors through `fmt`), from the state the layer's own forward leaves after tokens
    0..t-1. Returns the lines, the layer's output for the token (D,), and how far this head's new state is
    from the one the layer's own step computes."""
    m = cfg.delta_net
    H, Hk, dk, dv = m.value_heads, m.key_heads, m.key_dim, m.value_dim
    if not 0 <= head < H:
        raise MinigenError(f"--head {head} out of range (this Gated DeltaNet layer has {H} value heads: 0-{H - 1})")
    n_qkv = 2 * Hk * dk + H * dv
    tail, state = np.zeros((m.conv_kernel - 1, n_qkv), np.float32), np.zeros((H, dk, dv), np.float32)
    if t > 0:
        _, tail, state = gated_deltanet(x[:t], tail, state, p, m)
    proj = linear(x[t:t + 1], p["w_in"])                                     # (1, n_qkv + H dv + 2H)
    conv, _ = causal_conv(proj[:, :n_qkv], tail, p["conv_w"])
    qkv = silu(conv)[0]
    kh = head // (H // Hk)
    q = l2norm(qkv[kh * dk:(kh + 1) * dk]) * np.float32(dk ** -0.5)
    k = l2norm(qkv[Hk * dk + kh * dk:Hk * dk + (kh + 1) * dk])
    v = qkv[2 * Hk * dk + head * dv:2 * Hk * dk + (head + 1) * dv]
    beta = sigmoid(proj[0, n_qkv + H * dv + head])
    g = -np.exp(p["A_log"][head]) * softplus(proj[0, n_qkv + H * dv + H + head] + p["dt_bias"][head])
    S = state[head]
    decayed = np.exp(g) * S
    predicted = k @ decayed
    delta = beta * (v - predicted)
    S_new = decayed + np.outer(k, delta)
    o = q @ S_new
    full, _, new_state = gated_deltanet(x[t:t + 1], tail, state, p, m)
    z = proj[0, n_qkv + head * dv:n_qkv + (head + 1) * dv]
    lines = [
        f"1. in_proj, then the causal conv (kernel {m.conv_kernel}) over this token and the {m.conv_kernel - 1} before it, "
        f"SiLU: q, k (key head {kh} of {Hk}, L2-normed, q x 1/sqrt({dk})), v (value head {head} of {H})",
        f"   q = {fmt(q)}", f"   k = {fmt(k)}", f"   v = {fmt(v)}",
        f"2. the gate α = exp(-exp(A_log) softplus(a + dt_bias)) = {float(np.exp(g)):.4f}, the write strength "
        f"β = sigmoid(b) = {float(beta):.4f}",
        f"3. the state before this token, S ({dk} x {dv}), |S| = {np.linalg.norm(S):.4f}",
        f"4. decay, then what it predicts for k: Sᵀk after α S = {fmt(predicted)}",
        f"5. the delta rule: δ = β (v - that) = {fmt(delta)}; S ← α S + k δᵀ, |S| = {np.linalg.norm(S_new):.4f}",
        f"6. the head's output o = Sᵀq = {fmt(o)}",
        f"   this head after the gated RMSNorm: {fmt(gated_rms_norm(o, z, p['gate_norm'], m.eps))}",
        f"7. every head through the gated RMSNorm (x silu(z)) and out_proj: the layer's output {fmt(full[0])}"]
    return lines, full[0], float(np.abs(S_new - new_state[head]).max())

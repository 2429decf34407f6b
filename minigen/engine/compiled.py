"""numba twins of the small steps of a decode step, which NumPy takes several calls each for: the RMSNorm of a
few rows (layers.rms_norm_rows), RoPE (layers.rope_rows), the gated MLP's silu(gate) · up (layers.gated), and
one query per head attending over its KV cache (attention.decode_attention). layers.py and attention.py stay
the reference, and the path of a float32 model (which never loads numba), of one without numba or with
MINIGEN_KERNELS=0: quant.matrix.twins hands these out once the kernels are loaded. tests/test_compiled.py
holds them to the reference and to float64 arithmetic.

Why: a decode step of SmolLM2-135M (the default model) spent ~8 ms of ~16 outside its weight products, in
~40 NumPy calls a layer of a few microseconds each. Alone, on the AMD Zen 3 here: RMSNorm of one row of 576,
16-18 us in NumPy (six calls), ~3 us here; one query per head over 100 keys (9 heads of 64, 3 KV heads),
45-55 us, 15 here; 12 heads of 128 over 160 keys (Qwen2.5-1.5B), 75-100 us, 40-55.

Each keeps float32 and the reference's operations, but for the order of the sums (sequential where NumPy
sums pairwise and OpenBLAS in its own blocks) and fused multiply-adds: their results equal the reference's
to float32's rounding. The exponential is `exp_neg` below (Cephes' expf, within 1.5 ulp of e^x; NumPy's
own float32 exp is within 3.5), written out so that LLVM vectorises it: a call to libm per score took most
of a long cache's time.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from .quant.kernels import JIT, thread_count  # noqa: F401  (thread_count: for attention.py)

F32 = np.float32
KEYS = 256   # keys per pass of q · Kᵀ: G x 256 scores (6 KB for G = 6) stay in L1 over the d rows of K


@intrinsic
def _as_float(typingctx, bits):
    """The float32 whose bits are the low 32 of an integer (a bitcast: NumPy's .view, for one value)."""
    def codegen(context, builder, sig, args):
        v = args[0]
        return builder.bitcast(builder.trunc(v, ir.IntType(32)) if v.type.width > 32 else v, ir.FloatType())
    return types.float32(bits), codegen


@njit(inline="always", **JIT)
def exp_neg(x):
    """e^x for x <= 0 in float32, 0 below -87.34 (where e^x leaves float32's normal range): x = n ln 2 + r
    with |r| <= ln 2 / 2 (ln 2 in two parts, Cody and Waite), e^r by Cephes' polynomial, 2^n by its bits."""
    if x < F32(-87.33654):
        return F32(0)
    n = np.floor(x * F32(1.44269504088896341) + F32(0.5))
    r = x - n * F32(0.693359375) - n * F32(-2.12194440e-4)
    p = F32(1.9875691500e-4)
    p = p * r + F32(1.3981999507e-3)
    p = p * r + F32(8.3334519073e-3)
    p = p * r + F32(4.1665795894e-2)
    p = p * r + F32(1.6666665459e-1)
    p = p * r + F32(5.0000001201e-1)
    p = p * r * r + r + F32(1)
    return p * _as_float((np.int32(n) + np.int32(127)) << np.int32(23))


@njit(nogil=True, **JIT)
def rms_norm(x, w, eps):
    """layers.rms_norm of rows x (N, D): x / sqrt(mean(x^2) + eps) * w."""
    n, d = x.shape
    y = np.empty((n, d), F32)
    for r in range(n):
        total = F32(0)
        for i in range(d):
            total += x[r, i] * x[r, i]
        root = np.sqrt(total * F32(1.0 / d) + F32(eps))
        for i in range(d):
            y[r, i] = x[r, i] / root * w[i]
    return y


@njit(nogil=True, **JIT)
def decode_attention(q, keys_t, values, lo, stop, scale, out):
    """One query per head q (H, d) over the keys and values lo .. stop − 1 of one sequence's cache buffers,
    keys_t (KV, d, C) and values (KV, C, d) (cache.KVBase's, whole: a slice of them would not vectorise):
    out (H, d) = softmax(scale · q Kᵀ) V, query head h reading KV head h // G. The G heads of a KV head go
    together, each key row and value row loaded once for all of them."""
    H, d = q.shape
    KV = keys_t.shape[0]
    G = H // KV
    top, total = np.empty(G, F32), np.empty(G, F32)
    for kv in range(KV):
        o = out[kv * G:(kv + 1) * G]
        attend_part(q, keys_t, values, kv, lo, stop, scale, o, top, total)
        for g in range(G):
            inv = F32(1) / total[g]
            for i in range(d):
                o[g, i] *= inv


@njit(parallel=True, nogil=True, **JIT)
def decode_attention_split(q, keys_t, values, lo, stop, scale, threads, out):
    """decode_attention on numba's threads (a long cache: a decode step after 4,096 tokens of Qwen2.5-1.5B reads
    235 MB of keys and values, ~1 ms a layer on one thread), each task one KV head's G heads over a part of the
    keys (`attend_part`), the parts joined as flash-decoding joins them: out = sum_p e^(m_p − M) o_p / sum_p
    e^(m_p − M) z_p, for each part's max m_p, sum z_p and unnormalised output o_p. Parts: one per KV head when
    the `threads` (numba's, as many as this call runs on) divide the KV heads, else as many as threads per KV
    head."""
    H, d = q.shape
    KV = keys_t.shape[0]
    G, n = H // KV, stop - lo
    P = 1 if KV % threads == 0 else min(threads, n)
    parts = np.empty((KV, P, G, d), F32)
    tops, totals = np.empty((KV, P, G), F32), np.empty((KV, P, G), F32)
    for task in prange(KV * P):
        kv, p = task // P, task % P
        attend_part(q, keys_t, values, kv, lo + n * p // P, lo + n * (p + 1) // P, scale, parts[kv, p],
                    tops[kv, p], totals[kv, p])
    for kv in range(KV):
        for g in range(G):
            top = tops[kv, 0, g]
            for p in range(1, P):
                top = max(top, tops[kv, p, g])
            o = out[kv * G + g]
            o[:] = 0
            total = F32(0)
            for p in range(P):
                f = exp_neg(tops[kv, p, g] - top)
                total += f * totals[kv, p, g]
                for i in range(d):
                    o[i] += f * parts[kv, p, g, i]
            inv = F32(1) / total
            for i in range(d):
                o[i] *= inv


@njit(inline="always", nogil=True, **JIT)
def attend_part(q, keys_t, values, kv, a, b, scale, o, top, total):
    """KV head kv's G query heads over keys a .. b − 1 (a < b): o (G, d) = sum_j e^(s_j − top) v_j, unnormalised,
    with top (G,) each head's largest score s_j = scale · q · k_j and total (G,) its sum_j e^(s_j − top)."""
    d = q.shape[1]
    G, n = o.shape[0], b - a
    scores = np.zeros((G, n), F32)
    for j0 in range(0, n, KEYS):   # the G heads' scores of KEYS keys stay in L1 over the d rows
        j1 = min(n, j0 + KEYS)
        for i in range(d):
            row = keys_t[kv, i, a + j0:a + j1]
            for g in range(G):
                qi = q[kv * G + g, i] * scale
                s = scores[g, j0:j1]
                for j in range(j1 - j0):
                    s[j] += qi * row[j]
    for g in range(G):
        s = scores[g]
        m = s[0]
        for j in range(n):
            m = max(m, s[j])
        for j in range(n):
            s[j] = exp_neg(s[j] - m)
        top[g] = m
        o[g, :] = 0
    for j in range(n):
        v = values[kv, a + j]
        for g in range(G):
            p = scores[g, j]
            og = o[g]
            for i in range(d):
                og[i] += p * v[i]
    for g in range(G):
        z = F32(0)
        for j in range(n):
            z += scores[g, j]
        total[g] = z


@njit(nogil=True, **JIT)
def silu_gate(h):
    """layers.gated's silu(gate) · up of rows h (N, 2F), gate then up: (N, F). silu(x) = x / (1 + e^−x), with
    e = e^−|x| from exp_neg: x / (1 + e) for x >= 0, x·e / (e + 1) below (−0 where e^−x would overflow)."""
    n, F = h.shape[0], h.shape[1] // 2
    out = np.empty((n, F), F32)
    for r in range(n):
        for i in range(F):
            x = h[r, i]
            e = exp_neg(-abs(x))
            out[r, i] = (x / (F32(1) + e) if x >= 0 else x * e / (e + F32(1))) * h[r, F + i]
    return out


@njit(nogil=True, **JIT)
def rope(x, cos, sin):
    """layers.apply_rope of rows x (N, M, d), M heads each, with their positions' cos and sin (N, r): the first
    r dims of each head rotated in HF's half-split pairs (i, i + r/2), the rest passed through."""
    n, m, d = x.shape
    r = cos.shape[1]
    half = r // 2
    out = np.empty((n, m, d), F32)
    for p in range(n):
        c, s = cos[p], sin[p]
        for h in range(m):
            a, o = x[p, h], out[p, h]
            for i in range(half):
                o[i] = a[i] * c[i] - a[half + i] * s[i]
            for i in range(half, r):
                o[i] = a[i] * c[i] + a[i - half] * s[i]
            for i in range(r, d):
                o[i] = a[i]
    return out


@njit(nogil=True, **JIT)
def decode_pool(q, keys_t, values, slots, los, stops, scale, out):
    """decode_attention for each of B sequences of a batch's pool (cache.KVPool), keys_t (P, KV, d, C) and values
    (P, KV, C, d): sequence b's query heads q[b] (H, d) over keys los[b] .. stops[b] − 1 of slot slots[b], into
    out[b]; each over its own length, where the pooled NumPy product pads every slot to the longest."""
    for b in range(q.shape[0]):
        decode_attention(q[b], keys_t[slots[b]], values[slots[b]], los[b], stops[b], scale, out[b])


@njit(parallel=True, nogil=True, **JIT)
def decode_pool_split(q, keys_t, values, slots, los, stops, scale, out):
    """decode_pool with the sequences shared among numba's threads."""
    for b in prange(q.shape[0]):
        decode_attention(q[b], keys_t[slots[b]], values[slots[b]], los[b], stops[b], scale, out[b])

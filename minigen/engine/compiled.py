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

The attention (compiled.decode_attention) was first written as plain loops that LLVM left mostly scalar; its
steps now keep a block's sums in vector registers (see KEYS below): one thread, Zen 5, 9 heads of 64 over 1,024
keys 99 -> 47 us, 12 of 128 over 4,096 806 -> 485; past TWIN_SCORES (attention.py) it runs on numba's threads.

Each keeps float32 and the reference's operations, but for the order of the sums (sequential where NumPy
sums pairwise and OpenBLAS in its own blocks) and fused multiply-adds: their results equal the reference's
to float32's rounding. The exponential is `exp_neg` below (Cephes' expf, within 1.5 ulp of e^x; NumPy's
own float32 exp is within 3.5), written out so that LLVM vectorises it: a call to libm per score took most
of a long cache's time.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange, types
from numba.extending import intrinsic

from .quant.kernels import F32_P, INT, JIT, address, call, data, lazy_cfunc
from .quant.kernels import thread_count  # noqa: F401  (for attention.py)

F32 = np.float32


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


def decode_attention(q, keys_t, values, lo, stop, scale, out):
    """One query per head q (H, d) over the keys and values lo .. stop − 1 of one sequence's cache buffers,
    keys_t (KV, d, C) and values (KV, C, d) (cache.KVBase's, whole: a slice of them would not vectorise), all
    C-contiguous: out (H, d) = softmax(scale · q Kᵀ) V, query head h reading KV head h // G. The G heads of a KV
    head go together (attend_part), each block of keys and values loaded once for all of them."""
    q, keys_t, values, out = _contiguous(q, keys_t, values, out)
    _decode_attention(address(ATTEND), q, keys_t, values, lo, stop, scale, out)


@njit(nogil=True, **JIT)
def _decode_attention(attend, q, keys_t, values, lo, stop, scale, out):
    H, d = q.shape
    KV = keys_t.shape[0]
    G = H // KV
    work = scratch(G, d, stop - lo)
    total = work[4]
    for kv in range(KV):
        o = out[kv * G:(kv + 1) * G]
        attend_at(attend, q, keys_t, values, kv, lo, stop, scale, o, work)
        for g in range(G):
            inv = F32(1) / total[g]
            for i in range(d):
                o[g, i] *= inv


def decode_attention_split(q, keys_t, values, lo, stop, scale, threads, out):
    """decode_attention on numba's threads (a long cache: a decode step after 4,096 tokens of Qwen2.5-1.5B reads
    235 MB of keys and values), each task one KV head's G heads over a part of the keys (`attend_part`), the
    parts joined as flash-decoding joins them: out = sum_p e^(m_p − M) o_p / sum_p e^(m_p − M) z_p, for each
    part's max m_p, sum z_p and unnormalised output o_p. Parts: one per KV head when the `threads` (numba's,
    as many as this call runs on) divide the KV heads, else as many as threads per KV head."""
    q, keys_t, values, out = _contiguous(q, keys_t, values, out)
    _decode_attention_split(address(ATTEND), q, keys_t, values, lo, stop, scale, threads, out)


def _contiguous(*arrays):
    """The arrays, each C-contiguous, as ATTEND reads them through their first elements' addresses."""
    for a in arrays:
        if not a.flags.c_contiguous:
            raise ValueError("compiled decode attention: q, keys_t, values and out must be C-contiguous")
    return arrays


@njit(parallel=True, nogil=True, **JIT)
def _decode_attention_split(attend, q, keys_t, values, lo, stop, scale, threads, out):
    H, d = q.shape
    KV = keys_t.shape[0]
    G, n = H // KV, stop - lo
    P = 1 if KV % threads == 0 else min(threads, n)
    parts = np.empty((KV, P, G, d), F32)
    tops, totals = np.empty((KV, P, G), F32), np.empty((KV, P, G), F32)
    for task in prange(KV * P):
        kv, p = task // P, task % P
        a, b = lo + n * p // P, lo + n * (p + 1) // P
        work = scratch(G, d, b - a)
        attend_at(attend, q, keys_t, values, kv, a, b, scale, parts[kv, p], work)
        tops[kv, p], totals[kv, p] = work[3], work[4]
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


# A part's steps are separate compiled functions (not inlined into one), so that their arrays are arguments, which
# kernels.JIT marks noalias: LLVM then keeps a block's sums in vector registers across the inner loop
# (a block of KEYS scores per head across the d rows of K; a chunk of DIMS outputs across a block of values).
# On Zen 5, one thread, 9 heads of 64 over 1,024 keys (SmolLM2): 99 -> 47 us; 12 of 128 over 4,096: 806 -> 485.
# A block's loop is compiled once per width (`_score_blocks`, `_value_chunks`: WIDE, KEYS, 16; WIDE_DIMS, DIMS, 16)
# on purpose: a width known when compiling is what lets LLVM keep the block's sums in registers; a width passed in
# would not.
# The keys' rows (d of them, C apart) are read WIDE keys at a time: a block of 64 read 256 bytes of a row before
# moving to the next, too little for the hardware's prefetch to follow d rows at once. One thread, 3 heads of 64 over
# the keys of one KV head (SmolLM2), Zen 4: 4,096 keys 101 -> 48 us, 1,000 keys 23 -> 15, below 300 as before;
# 3 heads of 128 (Qwen2.5-1.5B) 4,096 keys 229 -> 126 us; in AVX2 code (scripts/as_cpu.py zen3) 78 -> 49 and 191 -> 154.
WIDE = 256  # keys a wide block: 16 AVX-512 registers of scores for one head
KEYS = 64   # keys a block: 4 AVX-512 registers of scores per head
DIMS = 64   # outputs a chunk of o = p V
# A chunk of 128 outputs first: a head of 128 then reads each value's row whole in its block's first pass (in two
# halves, the second half's lines came from memory again in a later pass). 3 heads of 128 over 4,096 values 123 ->
# 83 us, 6 heads 179 -> 136 (Qwen2.5-1.5B; Zen 4); heads of 64 as before.
WIDE_DIMS = 128
LANES = 16  # lanes of the running max and sum (a float sum is not reordered otherwise, so not vectorised)


@njit(nogil=True, **JIT)
def scratch(G, d, n):
    """One part's working arrays: its G heads' scaled queries (G, d), scores (G, n rounded up to a block of 16:
    the last block of keys is taken whole), LANES partial sums, and per head the max and sum of the softmax."""
    return (np.empty((G, d), F32), np.empty((G, n + 16), F32), np.empty(LANES, F32), np.empty(G, F32),
            np.empty(G, F32))


@njit(nogil=True, **JIT)
def attend_part(q, keys_t, values, kv, a, b, scale, o, work):
    """KV head kv's G query heads over keys a .. b − 1 (a < b): o (G, d) = sum_j e^(s_j − top) v_j, unnormalised,
    with top (G,) each head's largest score s_j = scale · q · k_j and total (G,) its sum_j e^(s_j − top), both
    in `work` (scratch: qs, scores, lanes, top, total)."""
    G, d = o.shape
    n = b - a
    qs, scores, lanes, top, total = work
    for g in range(G):
        for i in range(d):
            qs[g, i] = q[kv * G + g, i] * scale
    _scores(qs, keys_t[kv], a, n, scores)
    _softmax(scores, n, lanes, top, total)
    _weighted_values(scores, values[kv], a, n, o)


def _attend(q_p, H, d, keys_p, KV, C, values_p, kv, a, b, scale, o_p, qs_p, scores_p, lanes_p, top_p, total_p):
    """attend_part as a C function (numba's cfunc, as the products' work in quant/kernels.py): compiled once, its
    steps with it, and called by its address from each of the four decode attentions (one thread, split, a
    batch's pool on one thread or split), which numba would otherwise each compile again with all they call.
    Compiling all four with an empty cache (an ad-hoc script, Zen 5): 15.3 s -> 7.8 s; their times equal."""
    G = H // KV
    work = (carray(qs_p, (G, d)), carray(scores_p, (G, b - a + 16)), carray(lanes_p, (LANES,)), carray(top_p, (G,)),
            carray(total_p, (G,)))
    attend_part(carray(q_p, (H, d)), carray(keys_p, (KV, d, C)), carray(values_p, (KV, C, d)), kv, a, b, scale,
                carray(o_p, (G, d)), work)


ATTEND = lazy_cfunc(_attend, types.void(F32_P, INT, INT, F32_P, INT, INT, F32_P, INT, INT, INT, types.float32, F32_P,
                                        F32_P, F32_P, F32_P, F32_P, F32_P), JIT)


@njit(inline="always", **JIT)
def attend_at(attend, q, keys_t, values, kv, a, b, scale, o, work):
    """attend_part(q, keys_t, values, kv, a, b, scale, o, work) by the C function at `attend` (ATTEND's address)."""
    qs, scores, lanes, top, total = work
    call(attend, (data(q), q.shape[0], q.shape[1], data(keys_t), keys_t.shape[0], keys_t.shape[2], data(values),
                  np.int64(kv), np.int64(a), np.int64(b), F32(scale), data(o), data(qs), data(scores), data(lanes),
                  data(top), data(total)))


def _score_blocks(width: int):
    """The scores of keys j0 .. j1 − 1 (a multiple of `width` apart) in blocks of `width` keys, each head's sums of
    a block in registers across the d rows: one loop, compiled into `_scores` once per width (a width known
    when compiling is what lets LLVM keep the block's sums in registers)."""
    @njit(inline="always", **JIT)
    def blocks(qs, keys_t, a, j0, j1, scores):
        G, d = qs.shape
        for b in range(j0, j1, width):
            for g in range(G):
                acc = scores[g, b:b + width]
                acc[:] = 0
                for i in range(d):
                    qi = qs[g, i]
                    row = keys_t[i, a + b:a + b + width]
                    for j in range(width):
                        acc[j] += qi * row[j]
    return blocks


_wide_blocks, _key_blocks, _blocks_of_16 = _score_blocks(WIDE), _score_blocks(KEYS), _score_blocks(16)


@njit(nogil=True, **JIT)
def _scores(qs, keys_t, a, n, scores):
    """scores[g, j] = qs[g] · k_(a + j) for j < n, keys_t (d, C): WIDE keys a block, then KEYS, then 16, reading
    keys past n (within the buffer) where the last 16 run over, whose scores nothing reads, else one by one."""
    G, d = qs.shape
    wide, whole = n - n % WIDE, n - n % KEYS
    _wide_blocks(qs, keys_t, a, 0, wide, scores)
    _key_blocks(qs, keys_t, a, wide, whole, scores)
    C = keys_t.shape[1]
    for j0 in range(whole, n, 16):
        if a + j0 + 16 <= C:
            _blocks_of_16(qs, keys_t, a, j0, j0 + 16, scores)
        else:
            for g in range(G):
                for j in range(j0, n):
                    total = F32(0)
                    for i in range(d):
                        total += qs[g, i] * keys_t[i, a + j]
                    scores[g, j] = total


@njit(nogil=True, **JIT)
def _softmax(scores, n, lanes, top, total):
    """Each head g's scores[g, :n] -> e^(s_j − top[g]) in place, top[g] their max and total[g] their sum, the
    max and the sum kept in LANES partial ones."""
    G = scores.shape[0]
    whole = n - n % LANES
    for g in range(G):
        s = scores[g]
        lanes[:] = s[0]
        for j0 in range(0, whole, LANES):
            for k in range(LANES):
                lanes[k] = max(lanes[k], s[j0 + k])
        m = lanes[0]
        for k in range(LANES):
            m = max(m, lanes[k])
        for j in range(whole, n):
            m = max(m, s[j])
        for j in range(n):
            s[j] = exp_neg(s[j] - m)
        lanes[:] = 0
        for j0 in range(0, whole, LANES):
            for k in range(LANES):
                lanes[k] += s[j0 + k]
        z = F32(0)
        for k in range(LANES):
            z += lanes[k]
        for j in range(whole, n):
            z += s[j]
        top[g], total[g] = m, z


def _value_chunks(width: int):
    """Head g's outputs o[g, i0:] in chunks of `width` while whole, each chunk's sums in registers across the values
    j0 .. j1 − 1: one loop, compiled into `_weighted_values` once per width. Returns where the chunks stopped."""
    @njit(inline="always", **JIT)
    def chunks(scores, values, a, j0, j1, g, i0, o):
        d = o.shape[1]
        while i0 + width <= d:
            acc = o[g, i0:i0 + width]
            for j in range(j0, j1):
                p, v = scores[g, j], values[a + j, i0:i0 + width]
                for i in range(width):
                    acc[i] += p * v[i]
            i0 += width
        return i0
    return chunks


_wide_chunks, _dim_chunks, _chunks_of_16 = _value_chunks(WIDE_DIMS), _value_chunks(DIMS), _value_chunks(16)


@njit(nogil=True, **JIT)
def _weighted_values(scores, values, a, n, o):
    """o[g] = sum_(j < n) scores[g, j] · v_(a + j), values (C, d): a block of KEYS values at a time (in L1 for every
    head), a chunk of WIDE_DIMS, DIMS, then 16 outputs' sums in registers across it."""
    G, d = o.shape
    o[:] = 0
    for j0 in range(0, n, KEYS):
        j1 = min(n, j0 + KEYS)
        for g in range(G):
            i0 = _wide_chunks(scores, values, a, j0, j1, g, 0, o)
            i0 = _dim_chunks(scores, values, a, j0, j1, g, i0, o)
            i0 = _chunks_of_16(scores, values, a, j0, j1, g, i0, o)
            for j in range(j0, j1):
                p = scores[g, j]
                for i in range(i0, d):
                    o[g, i] += p * values[a + j, i]


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


def decode_pool(q, keys_t, values, slots, los, stops, scale, out):
    """decode_attention for each of B sequences of a batch's pool (cache.KVPool), keys_t (P, KV, d, C) and values
    (P, KV, C, d): sequence b's query heads q[b] (H, d) over keys los[b] .. stops[b] − 1 of slot slots[b], into
    out[b]; each over its own length, where the pooled NumPy product pads every slot to the longest."""
    q, keys_t, values, out = _contiguous(q, keys_t, values, out)
    _decode_pool(address(ATTEND), q, keys_t, values, slots, los, stops, scale, out)


def decode_pool_split(q, keys_t, values, slots, los, stops, scale, out):
    """decode_pool with the sequences shared among numba's threads."""
    q, keys_t, values, out = _contiguous(q, keys_t, values, out)
    _decode_pool_split(address(ATTEND), q, keys_t, values, slots, los, stops, scale, out)


@njit(nogil=True, **JIT)
def _decode_pool(attend, q, keys_t, values, slots, los, stops, scale, out):
    for b in range(q.shape[0]):
        _decode_attention(attend, q[b], keys_t[slots[b]], values[slots[b]], los[b], stops[b], scale, out[b])


@njit(parallel=True, nogil=True, **JIT)
def _decode_pool_split(attend, q, keys_t, values, slots, los, stops, scale, out):
    for b in prange(q.shape[0]):
        _decode_attention(attend, q[b], keys_t[slots[b]], values[slots[b]], los[b], stops[b], scale, out[b])

"""The products with a stored matrix, compiled with numba: y = x @ W.T for float32 rows x (k, in) and a
matrix W (out, in) kept in its checkpoint's own type, each weight read from memory once for all k rows.

The layout (made once at load, `tile`): tiles of TILE = 64 outputs, each the matrix's blocks with the
outputs innermost:

    tiles[t, b, r, j]    (T, n_blocks, R, C) uint8
    block types (Q4_0 ... Q8_K): byte r of block b of output 64t + j   (R = the type's bytes per block, C = 64)
    F16, BF16, F32:      input 32b + r of output 64t + j, its 2 or 4 bytes little-endian at j·size ...
                         (R = 32, C = 64 · size: a row viewed as uint16 / float32 is the 64 outputs)

so that byte r of 64 consecutive outputs is 64 contiguous bytes. Every loop below that touches weights
runs innermost over the tile's 64 outputs, j: 64 independent lanes, which LLVM turns into 8 AVX2
vectors with no horizontal sum; the two nibbles of a byte are two inputs of one output, so both go to
the same accumulator. (A loop per output row with a reduction over its inputs ran at 2-4 GB/s here:
LLVM cannot vectorise a float32 sum it may not reorder.)

Per tile and per group of 32 inputs, `_decode` writes the group's exact float32 values (32, 64) into
a small buffer, as formats.py defines them (the same products, each exact: see formats.py), and
`_accumulate` adds x[:, group] @ that to the tile's (k, 64) accumulators, two rows at a time so that
each value loaded from the buffer serves both; so a weight is read from memory and decoded once
whatever k is. Accumulation is float32; the sums run over the inputs in another order than OpenBLAS's,
so results equal `x @ dequantize().T` to float32's rounding of a sum, not to its last digit.

The threads: `prange` over tiles, on numba's threading layer (OpenMP where libgomp is found: ~3 us to
start a parallel region, against ~50 us for numba's own workqueue; its idle threads spin briefly, so a
kernel should not run while OpenBLAS's threads do: see matrix.py).

Integers: numba computes every integer expression in int64, and an int64 cannot be converted to float
in an AVX2 vector. Each code is therefore narrowed back to uint8 (`U8(b & 15)`) before its float
conversion, which LLVM then does on bytes; float16 scales go through `_half`, an LLVM `fpext half`
(one vcvtph2ps on F16C).

Measured on this machine (AMD EPYC, Zen 3, 2 cores, AVX2; loaded by other work, so rough): see
scripts/bench_kernels.py and the figures in `BANDWIDTH` below.
"""
from __future__ import annotations

from contextlib import contextmanager

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.untyped_passes import TranslateByteCode
from numba.extending import intrinsic


TILE = 64    # outputs per tile
GROUP = 32   # inputs decoded at a time (every block type's block, or an eighth of a K super-block)
F32 = np.float32
U8 = np.uint8
FAST = {"contract"}   # let LLVM fuse a*b + c into an FMA; nothing may be reordered


@register_pass(mutates_CFG=False, analysis_only=False)
class _NoAlias(FunctionPass):
    """Marks every array argument noalias (C's restrict). No kernel here is given two arrays that
    overlap, and without it LLVM checks at run time, before every vectorised 64-output loop, that no
    store of it can change what it loads: ~100 instructions per loop of 8 vectors."""
    _name = "minigen_noalias"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        state.flags.noalias = True
        return False


class _Compiler(CompilerBase):
    def define_pipelines(self):
        pm = DefaultPassBuilder.define_nopython_pipeline(self.state)
        pm.add_pass_after(_NoAlias, TranslateByteCode)
        pm.finalize()
        return [pm]


JIT = dict(cache=True, fastmath=FAST, error_model="numpy", pipeline_class=_Compiler)

# the decoder of each type, by number: a compile-time branch per group of 32 inputs (not per weight)
KINDS = {name: i for i, name in enumerate(["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                                           "Q4_K", "Q5_K", "Q6_K", "Q8_K"])}


@intrinsic
def _half(typingctx, lo, hi):
    """Two bytes of a little-endian float16 -> its float32 value (exact)."""
    def codegen(context, builder, sig, args):
        i16 = ir.IntType(16)
        bits = builder.or_(builder.zext(args[0], i16), builder.shl(builder.zext(args[1], i16), ir.Constant(i16, 8)))
        return builder.fpext(builder.bitcast(bits, ir.HalfType()), ir.FloatType())
    return types.float32(types.uint8, types.uint8), codegen


@intrinsic
def _half16(typingctx, h):
    """A float16's 16 bits -> its float32 value."""
    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.uint16), codegen


@intrinsic
def _bfloat16(typingctx, h):
    """A bfloat16's 16 bits -> its float32 value: they are its high half."""
    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        return builder.bitcast(builder.shl(builder.zext(args[0], i32), ir.Constant(i32, 16)), ir.FloatType())
    return types.float32(types.uint16), codegen


@intrinsic
def _float32(typingctx, b0, b1, b2, b3):
    """Four bytes of a little-endian float32 -> its value."""
    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        bits = builder.zext(args[0], i32)
        for k in (1, 2, 3):
            bits = builder.or_(bits, builder.shl(builder.zext(args[k], i32), ir.Constant(i32, 8 * k)))
        return builder.bitcast(bits, ir.FloatType())
    return types.float32(types.uint8, types.uint8, types.uint8, types.uint8), codegen


@intrinsic
def _bits(typingctx, b, shift, mask):
    """(b >> shift) & mask on a byte, in 8 bits (shift < 8). numba would compute it in int64 and, for a
    shift not known at compile time, keep 64-bit lanes."""
    def codegen(context, builder, sig, args):
        i8 = ir.IntType(8)
        return builder.and_(builder.lshr(args[0], builder.trunc(args[1], i8)), args[2])
    return types.uint8(types.uint8, types.int64, types.uint8), codegen


@intrinsic
def _code(typingctx, lo, lo_shift, hi, hi_shift, hi_mask):
    """A 5- or 6-bit code as float32: its low 4 bits (lo >> lo_shift) & 15, and above them
    (hi >> hi_shift) & hi_mask, in 8 bits and one conversion (not a second one and an FMA)."""
    def codegen(context, builder, sig, args):
        i8 = ir.IntType(8)
        low = builder.and_(builder.lshr(args[0], builder.trunc(args[1], i8)), ir.Constant(i8, 15))
        high = builder.and_(builder.lshr(args[2], builder.trunc(args[3], i8)), args[4])
        code = builder.or_(low, builder.shl(high, ir.Constant(i8, 4)))
        return builder.uitofp(code, ir.FloatType())
    return types.float32(types.uint8, types.int64, types.uint8, types.int64, types.uint8), codegen


# --- one group of 32 inputs of one tile -> its float32 values w (32, 64) --------------------------------
# blk: the tile's block (R, C) uint8; g: which group of 32 inputs of the block (0 for the legacy types,
# 0..7 for the K types); s, o (64,): scratch for the group's scale and offset of each output, computed
# once per group so that the loop over its 32 inputs only unpacks, converts and scales.

@njit(inline="always")
def _legacy(blk, w, s, o, row_m, row_qh, row_qs, offset, has_m, bits5):
    """Q4_0, Q4_1, Q5_0, Q5_1: d (and m) f16 at bytes 0 (and 2); qs byte l holds inputs l (low nibble)
    and l + 16 (high); Q5's qh bit i the fifth bit of input i: w = d·(q − offset) [+ m]."""
    for j in range(TILE):
        s[j] = _half(blk[0, j], blk[1, j])
        o[j] = _half(blk[row_m, j], blk[row_m + 1, j]) if has_m else F32(0)
    for l in range(16):
        for j in range(TILE):
            if bits5:
                lo = _code(blk[row_qs + l, j], 0, blk[row_qh + (l >> 3), j], l & 7, U8(1))
                hi = _code(blk[row_qs + l, j], 4, blk[row_qh + 2 + (l >> 3), j], l & 7, U8(1))
            else:
                lo, hi = F32(_bits(blk[row_qs + l, j], 0, U8(15))), F32(_bits(blk[row_qs + l, j], 4, U8(15)))
            if has_m:
                w[l, j] = s[j] * lo + o[j]
                w[l + 16, j] = s[j] * hi + o[j]
            else:   # no + 0: d·0 may be -0, as in formats.py
                w[l, j] = s[j] * (lo - offset)
                w[l + 16, j] = s[j] * (hi - offset)


@njit(inline="always")
def _scale_min_k4(blk, g, j):
    """Group g's 6-bit (sc, m) of a Q4_K / Q5_K block (12 bytes at 4..15), ggml's get_scale_min_k4: g < 4
    keeps its 6 bits in bytes g and g + 4; g >= 4 keeps 4 in byte g + 4 and 2 atop bytes g − 4 and g."""
    if g < 4:
        return F32(blk[4 + g, j] & U8(63)), F32(blk[8 + g, j] & U8(63))
    sc = (blk[8 + g, j] & U8(15)) | ((blk[g, j] >> U8(6)) << U8(4))
    m = (blk[8 + g, j] >> U8(4)) | ((blk[4 + g, j] >> U8(6)) << U8(4))
    return F32(U8(sc)), F32(U8(m))


@njit(inline="always")
def _q45_k(blk, g, w, s, o, row_qs, fifth):
    """Q4_K, Q5_K: d, dmin f16 at 0, 2; chunk c = g // 2 of qs holds group 2c in its low nibbles and
    2c + 1 in its high; Q5_K's qh byte l, bit g, the fifth bit of input l of group g:
    w = (d·sc)·q − dmin·m."""
    for j in range(TILE):
        sc, m = _scale_min_k4(blk, g, j)
        s[j] = _half(blk[0, j], blk[1, j]) * sc
        o[j] = _half(blk[2, j], blk[3, j]) * m
    row, shift = row_qs + 32 * (g >> 1), 4 * (g & 1)
    for l in range(GROUP):
        for j in range(TILE):
            if fifth:
                q = _code(blk[row + l, j], shift, blk[16 + l, j], g, U8(1))
            else:
                q = F32(_bits(blk[row + l, j], shift, U8(15)))
            w[l, j] = s[j] * q - o[j]


@njit(**JIT)
def _q6_k(blk, g, w, s, o):
    """Q6_K: group g is quarter r = g % 4 of half h = g // 4 (128 inputs). Low 4 bits: ql byte 64h +
    32(r % 2) + l, its low nibble for r < 2, high for r >= 2; high 2 bits: qh byte 128 + 32h + l, bits
    2r, 2r + 1; scale: int8 byte 192 + 8h + 2r + l // 16 (s for l < 16, o for the rest here); d f16
    at 208: w = (d·sc)·(q − 32)."""
    h, r = g >> 2, g & 3
    for j in range(TILE):
        d = _half(blk[208, j], blk[209, j])
        s[j] = d * F32(np.int8(blk[192 + 8 * h + 2 * r, j]))
        o[j] = d * F32(np.int8(blk[193 + 8 * h + 2 * r, j]))
    row, shift = 64 * h + 32 * (r & 1), 4 * (r >> 1)
    for l in range(16):
        for j in range(TILE):
            w[l, j] = s[j] * (_code(blk[row + l, j], shift, blk[128 + 32 * h + l, j], 2 * r, U8(3)) - F32(32))
    for l in range(16, GROUP):
        for j in range(TILE):
            w[l, j] = o[j] * (_code(blk[row + l, j], shift, blk[128 + 32 * h + l, j], 2 * r, U8(3)) - F32(32))


@njit(inline="always")
def _q8(blk, g, w, s, row_qs, wide_d):
    """Q8_0 (d f16 at 0) and Q8_K (d f32 at 0): w = d·q, q int8."""
    for j in range(TILE):
        s[j] = _float32(blk[0, j], blk[1, j], blk[2, j], blk[3, j]) if wide_d else _half(blk[0, j], blk[1, j])
    for l in range(GROUP):
        for j in range(TILE):
            w[l, j] = s[j] * F32(np.int8(blk[row_qs + 32 * g + l, j]))


@njit(**JIT)
def _q4_0(blk, g, w, s, o):
    _legacy(blk, w, s, o, 0, 0, 2, F32(8), False, False)


@njit(**JIT)
def _q4_1(blk, g, w, s, o):
    _legacy(blk, w, s, o, 2, 0, 4, F32(0), True, False)


@njit(**JIT)
def _q5_0(blk, g, w, s, o):
    _legacy(blk, w, s, o, 0, 2, 6, F32(16), False, True)


@njit(**JIT)
def _q5_1(blk, g, w, s, o):
    _legacy(blk, w, s, o, 2, 4, 8, F32(0), True, True)


@njit(**JIT)
def _q8_0(blk, g, w, s, o):
    _q8(blk, g, w, s, 2, False)


@njit(**JIT)
def _q8_k(blk, g, w, s, o):
    _q8(blk, g, w, s, 4, True)


@njit(**JIT)
def _q4_k(blk, g, w, s, o):
    _q45_k(blk, g, w, s, o, 16, False)


@njit(**JIT)
def _q5_k(blk, g, w, s, o):
    _q45_k(blk, g, w, s, o, 48, True)


@njit(**JIT)
def _f32(blk, g, w, s, o):
    """F32, F16, BF16: the tile's 64 outputs for 32 inputs, as they are."""
    v = blk.view(np.float32)
    for l in range(GROUP):
        for j in range(TILE):
            w[l, j] = v[l, j]


@njit(**JIT)
def _f16(blk, g, w, s, o):
    h = blk.view(np.uint16)
    for l in range(GROUP):
        for j in range(TILE):
            w[l, j] = _half16(h[l, j])


@njit(**JIT)
def _bf16(blk, g, w, s, o):
    h = blk.view(np.uint16)
    for l in range(GROUP):
        for j in range(TILE):
            w[l, j] = _bfloat16(h[l, j])


@njit(**JIT)
def _decode(kind, blk, g, w, s, o):
    """Group g of the tile's block blk -> w (32, 64) float32, by the type's number (KINDS)."""
    if kind == 0:
        _f32(blk, g, w, s, o)
    elif kind == 1:
        _f16(blk, g, w, s, o)
    elif kind == 2:
        _bf16(blk, g, w, s, o)
    elif kind == 3:
        _q4_0(blk, g, w, s, o)
    elif kind == 4:
        _q4_1(blk, g, w, s, o)
    elif kind == 5:
        _q5_0(blk, g, w, s, o)
    elif kind == 6:
        _q5_1(blk, g, w, s, o)
    elif kind == 7:
        _q8_0(blk, g, w, s, o)
    elif kind == 8:
        _q4_k(blk, g, w, s, o)
    elif kind == 9:
        _q5_k(blk, g, w, s, o)
    elif kind == 10:
        _q6_k(blk, g, w, s, o)
    else:
        _q8_k(blk, g, w, s, o)


# --- the product ------------------------------------------------------------------------------------------

@njit(**JIT)
def _accumulate(acc, x, i0, w):
    """acc (k, 64) += x[:, i0:i0 + 32] @ w (32, 64): two rows at a time, four inputs at a time, so that
    a value of w loaded once serves two rows and an accumulator is loaded and stored once per four
    inputs; the last row alone, eight inputs at a time."""
    k = acc.shape[0]
    n = 0
    while n + 1 < k:
        a, b = acc[n], acc[n + 1]
        xa, xb = x[n], x[n + 1]
        for i in range(0, GROUP, 4):
            a0, a1, a2, a3 = xa[i0 + i], xa[i0 + i + 1], xa[i0 + i + 2], xa[i0 + i + 3]
            b0, b1, b2, b3 = xb[i0 + i], xb[i0 + i + 1], xb[i0 + i + 2], xb[i0 + i + 3]
            w0, w1, w2, w3 = w[i], w[i + 1], w[i + 2], w[i + 3]
            for j in range(TILE):
                a[j] += a0 * w0[j] + a1 * w1[j] + a2 * w2[j] + a3 * w3[j]
                b[j] += b0 * w0[j] + b1 * w1[j] + b2 * w2[j] + b3 * w3[j]
        n += 2
    if n < k:
        a, xa = acc[n], x[n]
        for i in range(0, GROUP, 8):
            a0, a1, a2, a3 = xa[i0 + i], xa[i0 + i + 1], xa[i0 + i + 2], xa[i0 + i + 3]
            a4, a5, a6, a7 = xa[i0 + i + 4], xa[i0 + i + 5], xa[i0 + i + 6], xa[i0 + i + 7]
            for j in range(TILE):
                a[j] += (a0 * w[i, j] + a1 * w[i + 1, j] + a2 * w[i + 2, j] + a3 * w[i + 3, j]
                         + a4 * w[i + 4, j] + a5 * w[i + 5, j] + a6 * w[i + 6, j] + a7 * w[i + 7, j])


@njit(parallel=True, **JIT)
def times(kind, tiles, groups, x, y):
    """y (k, out) = x (k, in) @ W.T for W in tiles (T, n_blocks, R, C) of type number `kind`, whose
    blocks hold `groups` groups of 32 inputs each. y may be narrower than T·64 (the last tile's padding)."""
    n_tiles, n_blocks = tiles.shape[0], tiles.shape[1]
    k, out = x.shape[0], y.shape[1]
    for t in prange(n_tiles):
        acc = np.zeros((k, TILE), F32)
        w, s, o = np.empty((GROUP, TILE), F32), np.empty(TILE, F32), np.empty(TILE, F32)
        for b in range(n_blocks):
            for g in range(groups):
                _decode(kind, tiles[t, b], g, w, s, o)
                _accumulate(acc, x, GROUP * (groups * b + g), w)
        for n in range(k):
            for j in range(min(TILE, out - TILE * t)):
                y[n, TILE * t + j] = acc[n, j]


@njit(parallel=True, **JIT)
def dequantize(kind, tiles, groups, out):
    """out (n_out, in) float32 = the values of W, from its tiles, as `times` sees them."""
    n_tiles, n_blocks = tiles.shape[0], tiles.shape[1]
    n_out = out.shape[0]
    for t in prange(n_tiles):
        w, s, o = np.empty((GROUP, TILE), F32), np.empty(TILE, F32), np.empty(TILE, F32)
        for b in range(n_blocks):
            for g in range(groups):
                _decode(kind, tiles[t, b], g, w, s, o)
                i0 = GROUP * (groups * b + g)
                for j in range(min(TILE, n_out - TILE * t)):
                    for i in range(GROUP):
                        out[TILE * t + j, i0 + i] = w[i, j]





@contextmanager
def threads(n: int | None):
    """numba's parallel regions on this thread use n threads meanwhile (None: as many as it has)."""
    if n is None:
        yield
        return
    before = numba.get_num_threads()
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    try:
        yield
    finally:
        numba.set_num_threads(before)

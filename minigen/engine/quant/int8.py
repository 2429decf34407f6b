"""The product with activations rounded to int8 per block of 32 inputs, and integer dot products:
llama.cpp's way to multiply by Q4_K, Q6_K, Q8_0, Q4_1 (and Q4_0) weights, offered as an option
because it is not exact (the default, kernels.py, multiplies the exact float32 values).

Each row x (in,) becomes, per block of 32 inputs, xq = round(x / dx) with dx = max|x| / 127 (llama.cpp's
quantize_row_q8_0, which its CPU backend applies to activations beside Q4_0/Q4_1/Q8_0 weights; for K
types it uses one scale per 256 inputs, Q8_K: a scale per 32 is the more accurate). Then per group of
32 inputs of a weight block, with codes q and the group's float scale s and offset o (w = s·q − o):

    sum_i x_i w_i  ≈  dx · (s · sum_i xq_i q_i − o · sum_i xq_i)

where sum_i xq_i q_i is an exact integer. The only error is x's rounding to int8 (its relative size:
~1/254 per value, ~1e-3 of a typical output); `reference` computes the same products in NumPy from the
dequantized weights and the rounded activations, which the kernel equals to float32's rounding.

The integer products are LLVM vector code written here (`_dot`): a code vector of the tile's 64
outputs for one input, widened to int16, times the input's xq broadcast, summed over up to 16 inputs in
int16 lanes (as many as cannot overflow for the type's code width: 4-bit codes times |xq| <= 127 need
11 bits, 16 of them 15 bits) and then widened to int32. numba's own integer arithmetic is int64, which
AVX2 cannot multiply in vectors, hence the hand-written IR; LLVM makes vpmovzxbw, vpmullw, vpaddw of it.
Measured on this machine (AMD EPYC Zen 3, one thread, loaded): the integer products alone of a Q4_K
matrix at ~11 G weights/s, against ~5 G weights/s for kernels.py's float decoding.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from .kernels import GROUP, JIT, KINDS, TILE, F32, _half, _scale_min_k4
from .quantize import _round_half_away

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K")   # what this module multiplies


def _vec(t, n):
    return ir.VectorType(t, n)


def _splat(builder, value, n):
    v = builder.insert_element(ir.Constant(_vec(value.type, n), ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(_vec(I32, n), [0] * n))


def _const(t, n, value):
    return ir.Constant(_vec(t, n), [value] * n)


def _dot_intrinsic(codes, n_inputs: int, n_inner: int, doc: str):
    """An intrinsic dot(blk, row, sub, xq, x0, out): out[0:64] (int32) = sum over n_inputs inputs l of
    codes(l)[j] · xq[x0 + l], where codes(builder, row_at, l, row, sub) -> <64 x i16> is the type's code
    vector of input l (row_at(r): the tile block's byte row r, <64 x i8>). Sums of n_inner products
    stay in int16 lanes before widening."""
    @intrinsic
    def dot(typingctx, blk, row, sub, xq, x0, out):
        def codegen(context, builder, sig, args):
            b = context.make_array(sig.args[0])(context, builder, args[0])
            base = builder.bitcast(b.data, I8.as_pointer())
            xbase = builder.bitcast(context.make_array(sig.args[3])(context, builder, args[3]).data, I16.as_pointer())
            obase = context.make_array(sig.args[5])(context, builder, args[5]).data

            def row_at(r):
                at = builder.mul(r, ir.Constant(I64, TILE))
                return builder.load(builder.bitcast(builder.gep(base, [at]), _vec(I8, TILE).as_pointer()), align=1)

            acc = _const(I32, TILE, 0)
            for start in range(0, n_inputs, n_inner):
                acc16 = _const(I16, TILE, 0)
                for l in range(start, start + n_inner):
                    code = codes(builder, row_at, l, args[1], args[2])
                    x = builder.load(builder.gep(xbase, [builder.add(args[4], ir.Constant(I64, l))]))
                    acc16 = builder.add(acc16, builder.mul(code, _splat(builder, x, TILE)))
                acc = builder.add(acc, builder.sext(acc16, _vec(I32, TILE)))
            builder.store(acc, builder.bitcast(obase, _vec(I32, TILE).as_pointer()), align=4)
            return context.get_dummy_value()
        return types.none(blk, row, sub, xq, x0, out), codegen
    dot.__doc__ = doc
    return dot


def _nibble(builder, byte_row, shift):
    """(row >> shift) & 15 widened to int16."""
    v = builder.lshr(byte_row, _splat(builder, builder.trunc(shift, I8), TILE))
    return builder.zext(builder.and_(v, _const(I8, TILE, 15)), _vec(I16, TILE))


def _codes_k4(builder, row_at, l, row, sub):
    """Q4_K group: byte row `row` + l, nibble `sub` (0: low, 1: high)."""
    return _nibble(builder, row_at(builder.add(row, ir.Constant(I64, l))), builder.mul(sub, ir.Constant(I64, 4)))


def _codes_legacy4(builder, row_at, l, row, sub):
    """Q4_0 / Q4_1 block: input l < 16 is byte row + l's low nibble, l >= 16 byte row + l - 16's high."""
    return _nibble(builder, row_at(builder.add(row, ir.Constant(I64, l % 16))), ir.Constant(I64, 4 * (l // 16)))


def _codes_q8(builder, row_at, l, row, sub):
    """Q8_0 block: byte row + l, an int8 code."""
    return builder.sext(row_at(builder.add(row, ir.Constant(I64, l))), _vec(I16, TILE))


def _codes_q6(builder, row_at, l, row, sub):
    """Q6_K, sub = g + 16·half for inputs 16·half + l of group g: low 4 bits from ql byte row `row` + l,
    nibble r // 2; high 2 bits from qh byte row 128 + 32h + 16·half + l, bits 2r (h, r = g // 4, g % 4);
    minus 32."""
    g, half = builder.and_(sub, ir.Constant(I64, 15)), builder.lshr(sub, ir.Constant(I64, 4))
    h, r = builder.lshr(g, ir.Constant(I64, 2)), builder.and_(g, ir.Constant(I64, 3))
    nibble = builder.mul(builder.lshr(r, ir.Constant(I64, 1)), ir.Constant(I64, 4))
    low = _nibble(builder, row_at(builder.add(row, ir.Constant(I64, l))), nibble)
    qh_row = builder.add(builder.mul(h, ir.Constant(I64, 32)), builder.mul(half, ir.Constant(I64, 16)))
    qh = row_at(builder.add(qh_row, ir.Constant(I64, 128 + l)))
    high = builder.lshr(qh, _splat(builder, builder.trunc(builder.mul(r, ir.Constant(I64, 2)), I8), TILE))
    high = builder.zext(builder.and_(high, _const(I8, TILE, 3)), _vec(I16, TILE))
    return builder.sub(builder.or_(low, builder.shl(high, _const(I16, TILE, 4))), _const(I16, TILE, 32))


_dot_k4 = _dot_intrinsic(_codes_k4, GROUP, 16, "Q4_K: 32 inputs of one nibble of a chunk")
_dot_legacy4 = _dot_intrinsic(_codes_legacy4, GROUP, 16, "Q4_0 / Q4_1: the 32 inputs of a block")
_dot_q8 = _dot_intrinsic(_codes_q8, GROUP, 2, "Q8_0: the 32 inputs of a block")
_dot_q6 = _dot_intrinsic(_codes_q6, 16, 8, "Q6_K: 16 inputs of a group (each half has its own scale)")


# --- per group: the integer dots and the float scale, offset ----------------------------------------------

@njit(**JIT)
def _group(kind, blk, g, xq, x0, dx, xs, acc, s, o, dot, dot2):
    """acc (64,) += this group's share of x @ W.T for one row: dx, xs the group's activation scale and
    code sum; kind as kernels.KINDS."""
    if kind == 8:   # Q4_K
        for j in range(TILE):
            sc, m = _scale_min_k4(blk, g, j)
            s[j] = _half(blk[0, j], blk[1, j]) * sc
            o[j] = _half(blk[2, j], blk[3, j]) * m
        _dot_k4(blk, 16 + 32 * (g >> 1), g & 1, xq, x0, dot)
        for j in range(TILE):
            acc[j] += dx * (s[j] * F32(dot[j]) - o[j] * xs)
    elif kind == 10:   # Q6_K: two halves of 16, each with its scale
        h, r = g >> 2, g & 3
        _dot_q6(blk, 64 * h + 32 * (r & 1), g, xq, x0, dot)
        _dot_q6(blk, 64 * h + 32 * (r & 1) + 16, g + 16, xq, x0 + 16, dot2)
        for j in range(TILE):
            d = _half(blk[208, j], blk[209, j])
            s0 = d * F32(np.int8(blk[192 + 8 * h + 2 * r, j]))
            s1 = d * F32(np.int8(blk[193 + 8 * h + 2 * r, j]))
            acc[j] += dx * (s0 * F32(dot[j]) + s1 * F32(dot2[j]))
    elif kind == 7:   # Q8_0
        _dot_q8(blk, 2, 0, xq, x0, dot)
        for j in range(TILE):
            acc[j] += dx * (_half(blk[0, j], blk[1, j]) * F32(dot[j]))
    elif kind == 4:   # Q4_1: w = d·q + m
        _dot_legacy4(blk, 4, 0, xq, x0, dot)
        for j in range(TILE):
            acc[j] += dx * (_half(blk[0, j], blk[1, j]) * F32(dot[j]) + _half(blk[2, j], blk[3, j]) * xs)
    else:   # Q4_0: w = d·(q − 8)
        _dot_legacy4(blk, 2, 0, xq, x0, dot)
        for j in range(TILE):
            acc[j] += dx * (_half(blk[0, j], blk[1, j]) * (F32(dot[j]) - F32(8) * xs))


@njit(parallel=True, **JIT)
def _times(kind, tiles, groups, xq, dx, xs, y):
    """y (k, out) for activations already rounded: xq (k, in) int16, dx, xs (k, in / 32) float32."""
    n_tiles, n_blocks = tiles.shape[0], tiles.shape[1]
    k, out = xq.shape[0], y.shape[1]
    for t in prange(n_tiles):
        acc = np.zeros(TILE, F32)
        s, o = np.empty(TILE, F32), np.empty(TILE, F32)
        dot, dot2 = np.empty(TILE, np.int32), np.empty(TILE, np.int32)
        for n in range(k):
            acc[:] = 0
            for b in range(n_blocks):
                for g in range(groups):
                    i = groups * b + g
                    _group(kind, tiles[t, b], g, xq[n], GROUP * i, dx[n, i], xs[n, i], acc, s, o, dot, dot2)
            for j in range(min(TILE, out - TILE * t)):
                y[n, TILE * t + j] = acc[j]


def quantize_activations(x: np.ndarray):
    """x (k, in) float32 -> xq (k, in) int16 (values in -127..127), dx (k, in/32) float32, xs (k, in/32)
    float32 (each block's code sum): llama.cpp's quantize_row_q8_0 (roundf of x · (1/d), d = max|x|/127)."""
    blocks = x.reshape(len(x), -1, GROUP)
    d = (np.abs(blocks).max(axis=2) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = _round_half_away(blocks * inv[:, :, None]).astype(np.int16)
    return q.reshape(x.shape), d, q.sum(axis=2).astype(np.float32)


def times_int8(m, x: np.ndarray) -> np.ndarray:
    """x (N, in) float32 @ m.T with x rounded to int8 per block of 32 (m a StoredMatrix of TYPES)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    xq, dx, xs = quantize_activations(x)
    y = np.empty((len(x), m.shape[0]), np.float32)
    _times(KINDS[m.type], m.tiles, m.groups, xq, dx, xs, y)
    return y


def reference(m, x: np.ndarray) -> np.ndarray:
    """What times_int8 computes, in NumPy: the rounded activations (dx·xq) times the exact weights."""
    xq, dx, _ = quantize_activations(np.asarray(x, np.float32))
    rounded = (xq.reshape(len(x), -1, GROUP) * dx[:, :, None]).reshape(x.shape).astype(np.float32)
    return rounded @ m.dequantize().T

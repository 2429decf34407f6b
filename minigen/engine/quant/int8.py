"""The product with activations rounded to int8 per block of 32 inputs, and integer dot products:
llama.cpp's way to multiply by Q4_K, Q6_K, Q8_0, Q4_1 (and Q4_0, Q5_0, Q5_1) weights, offered as an option
because it is not exact (the default, kernels.py, multiplies the exact float32 values).

Each row x (in,) becomes, per block of 32 inputs, xq = round(x / dx) with dx = max|x| / 127 (llama.cpp's
quantize_row_q8_0, which its CPU backend applies to activations beside Q4_0/Q4_1/Q8_0 weights, except
that dx stays float32 where llama.cpp rounds it to float16; for K types llama.cpp uses one scale per
256 inputs, Q8_K: a scale per 32 is the more accurate). Then per group of
32 inputs of a weight block, with codes q and the group's float scale s and offset o (w = s·q − o):

    sum_i x_i w_i  ≈  dx · (s · sum_i xq_i q_i − o · sum_i xq_i)

where sum_i xq_i q_i is an exact integer. The only error is x's rounding to int8 (~1/254 of a value,
~1e-3 of a typical output); `reference` computes the same products in NumPy from the exact weights and
the rounded activations, which the kernel equals to float32's rounding.

The integer sums are LLVM vector IR (as kernels.py's values), a loop over a unit's inputs in pieces of
16 outputs: each input's codes widened to int16, times its xq broadcast (vpmullw), summed in int16
lanes over as many inputs as cannot overflow (4-bit codes times |xq| <= 127 need 11 bits: 16 of them
fit in 15), then widened into int32 sums; at the end of the unit the sums are scaled in float32 and
added to the outputs. The tile layout, the units and the scales are kernels.py's.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .kernels import GROUP, JIT, KINDS, TILE, F32, _k4_scales, _scales, ir_bits, ir_splat
from .quantize import _round_half_away

TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K")   # what this module multiplies
I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
FLOAT = ir.FloatType()
LANES = 16


def _vec(t, n=LANES):
    return ir.VectorType(t, n)


def _const(t, value, n=LANES):
    return ir.Constant(_vec(t, n), [value] * n)


class _Pass:
    """IR for the 16 outputs j0 ... j0 + 15 of one unit of one tile block (arguments: blk, u, s, o, s2,
    o2, xq, x0, dx, xs, g0, acc; see _unit)."""

    def __init__(self, context, builder, sig, args, j0):
        self.b = b = builder
        arr = lambda i: context.make_array(sig.args[i])(context, builder, args[i])
        self.base = b.bitcast(arr(0).data, I8.as_pointer())
        self.u, self.j0 = args[1], j0
        self.scales = [self.load(b.bitcast(arr(i).data, FLOAT.as_pointer()), j0, FLOAT) for i in (2, 3, 4, 5)]
        self.xq = b.bitcast(arr(6).data, I16.as_pointer())
        self.x0 = args[7]
        self.dx = b.bitcast(arr(8).data, FLOAT.as_pointer())
        self.xs = b.bitcast(arr(9).data, FLOAT.as_pointer())
        self.g0 = args[10]
        self.acc = b.bitcast(arr(11).data, FLOAT.as_pointer())

    def i64(self, v):
        return ir.Constant(I64, v) if isinstance(v, int) else v

    def add(self, *terms):
        total = self.i64(terms[0])
        for t in terms[1:]:
            total = self.b.add(total, self.i64(t))
        return total

    def load(self, ptr, at, t):
        return self.b.load(self.b.bitcast(self.b.gep(ptr, [self.i64(at)]), _vec(t).as_pointer()), align=1)

    def row(self, r):
        """Byte row r of the block at this pass's 16 outputs, <16 x i8>."""
        return self.load(self.b.gep(self.base, [self.b.mul(self.i64(r), self.i64(TILE))]), self.j0, I8)

    def splat(self, value, t):
        return ir_splat(self.b, value, t, LANES)

    def bits(self, v, shift, mask):
        """(v >> shift) & mask of a <16 x i8> row (shift: a Python int or an IR i64), as <16 x i16>."""
        return ir_bits(self.b, v, shift, mask, I16, LANES)

    def x(self, i):
        """xq[x0 + i] broadcast, <16 x i16>."""
        return self.splat(self.b.load(self.b.gep(self.xq, [self.add(self.x0, i)])), I16)

    def scalar(self, ptr, i):
        return self.b.load(self.b.gep(ptr, [self.add(self.g0, i)]))

    def sums(self, count: int, inner: int, streams):
        """Integer sums over `count` steps l of each stream: streams(l) -> [(codes <16 x i16>, input)],
        sum_l codes · xq[x0 + input], kept in int16 for `inner` steps at a time. -> [<16 x i32>] per stream."""
        b = self.b
        n = len(streams(ir.Constant(I64, 0)))
        wide = [cgutils.alloca_once_value(b, _const(I32, 0)) for _ in range(n)]
        with cgutils.for_range(b, self.i64(count // inner)) as outer:
            narrow = [cgutils.alloca_once(b, _vec(I16)) for _ in range(n)]
            for a in narrow:
                b.store(_const(I16, 0), a)
            with cgutils.for_range(b, self.i64(inner)) as step:
                l = self.add(b.mul(outer.index, self.i64(inner)), step.index)
                for a, (codes, i) in zip(narrow, streams(l)):
                    b.store(b.add(b.load(a), b.mul(codes, self.x(i))), a)
            for w, a in zip(wide, narrow):
                b.store(b.add(b.load(w), b.sext(b.load(a), _vec(I32))), w)
        return [b.sitofp(b.load(w), _vec(FLOAT)) for w in wide]

    def add_to_outputs(self, value):
        """acc[j0:j0 + 16] += value <16 x float>. acc is a float32 array, aligned to 4 bytes only: a vector's
        natural alignment (64 bytes) would let LLVM emit aligned moves, which fault on AVX-512."""
        at = self.b.bitcast(self.b.gep(self.acc, [self.i64(self.j0)]), _vec(FLOAT).as_pointer())
        self.b.store(self.b.fadd(self.b.load(at, align=4), value), at, align=4)

    def fsplat(self, v):
        return self.splat(v, FLOAT)


def _int8_kernel(emit, doc: str):
    @intrinsic
    def fn(typingctx, blk, u, s, o, s2, o2, xq, x0, dx, xs, g0, acc):
        def codegen(context, builder, sig, args):
            for j0 in range(0, TILE, LANES):
                emit(_Pass(context, builder, sig, args, j0))
            return context.get_dummy_value()
        return types.none(blk, u, s, o, s2, o2, xq, x0, dx, xs, g0, acc), codegen
    fn.__doc__ = doc
    return fn


def _emit_k4(p: _Pass):
    """Q4_K unit c: qs byte 16 + 32c + l holds input l of group 2c (low nibble) and of 2c + 1 (high);
    acc += dx_2c·(s·D_2c − o·xs_2c) + dx_2c+1·(s2·D_2c+1 − o2·xs_2c+1)."""
    b = p.b
    rows = p.add(b.mul(p.u, p.i64(32)), 16)

    def streams(l):
        byte = p.row(b.add(rows, l))
        return [(p.bits(byte, 0, 15), l), (p.bits(byte, 4, 15), b.add(l, p.i64(32)))]
    lo, hi = p.sums(GROUP, 16, streams)
    (s, o), (s2, o2) = (_k4_scales(b, p.row, g) for g in (b.mul(p.u, p.i64(2)), p.add(b.mul(p.u, p.i64(2)), 1)))
    terms = []
    for i, (d, sc, off) in enumerate(((lo, s, o), (hi, s2, o2))):
        dx, xs = p.fsplat(p.scalar(p.dx, i)), p.fsplat(p.scalar(p.xs, i))
        terms.append(b.fmul(dx, b.fsub(b.fmul(sc, d), b.fmul(off, xs))))
    p.add_to_outputs(b.fadd(terms[0], terms[1]))


def _emit_q6(p: _Pass):
    """Q6_K unit g = quarter r of half h: input l's low 4 bits in ql byte 64h + 32(r % 2) + l (nibble
    r // 2), high 2 bits in qh byte 128 + 32h + l, bits 2r; codes − 32 in -32..31 (so 8 products of
    them fit in int16). acc += dx·(s·D_0..15 + s2·D_16..31)."""
    b = p.b
    h, r = b.lshr(p.u, p.i64(2)), b.and_(p.u, p.i64(3))
    ql = p.add(b.mul(h, p.i64(64)), b.mul(b.and_(r, p.i64(1)), p.i64(32)))
    qh = p.add(b.mul(h, p.i64(32)), 128)
    nibble, pair = b.mul(b.lshr(r, p.i64(1)), p.i64(4)), b.mul(r, p.i64(2))

    def code(l):
        low = p.bits(p.row(b.add(ql, l)), nibble, 15)
        high = p.bits(p.row(b.add(qh, l)), pair, 3)
        return b.sub(b.or_(low, b.shl(high, _const(I16, 4))), _const(I16, 32))

    def streams(l):
        return [(code(l), l), (code(b.add(l, p.i64(16))), b.add(l, p.i64(16)))]
    first, second = p.sums(16, 8, streams)
    s, _, s2, _ = p.scales
    dx = p.fsplat(p.scalar(p.dx, 0))
    p.add_to_outputs(b.fmul(dx, b.fadd(b.fmul(s, first), b.fmul(s2, second))))


def _emit_q8(p: _Pass):
    """Q8_0: int8 codes in bytes 2..33 (two products of them fit in int16). acc += dx·d·D."""
    b = p.b

    def streams(l):
        return [(b.sext(p.row(p.add(2, l)), _vec(I16)), l), (b.sext(p.row(p.add(18, l)), _vec(I16)), b.add(l, p.i64(16)))]
    first, second = p.sums(16, 2, streams)
    dx = p.fsplat(p.scalar(p.dx, 0))
    p.add_to_outputs(b.fmul(dx, b.fmul(p.scales[0], b.fadd(first, second))))


def _emit_legacy(p: _Pass, row_qh: int, row_qs: int, offset: int, has_m: bool):
    """Q4_0, Q4_1, Q5_0, Q5_1: qs byte l holds inputs l (low nibble) and l + 16 (high); Q5's qh bit i
    (byte i // 8, bit i % 8) input i's fifth bit (5-bit codes: 8 products fit in int16, 4-bit: 16).
    With m: acc += dx·(d·D + m·xs); else acc += dx·d·(D − offset·xs)."""
    b = p.b

    def streams(l):
        byte = p.row(p.add(row_qs, l))
        lo, hi = p.bits(byte, 0, 15), p.bits(byte, 4, 15)
        if row_qh:
            at, bit = b.lshr(l, p.i64(3)), b.and_(l, p.i64(7))
            fifth = lambda row: b.shl(p.bits(p.row(p.add(row, at)), bit, 1), _const(I16, 4))
            lo, hi = b.or_(lo, fifth(row_qh)), b.or_(hi, fifth(row_qh + 2))
        return [(lo, l), (hi, b.add(l, p.i64(16)))]
    first, second = p.sums(16, 8 if row_qh else 16, streams)
    total = b.fadd(first, second)
    dx, xs = p.fsplat(p.scalar(p.dx, 0)), p.fsplat(p.scalar(p.xs, 0))
    d, m = p.scales[0], p.scales[1]
    if has_m:
        value = b.fadd(b.fmul(d, total), b.fmul(m, xs))
    else:
        value = b.fmul(d, b.fsub(total, b.fmul(p.fsplat(ir.Constant(FLOAT, float(offset))), xs)))
    p.add_to_outputs(b.fmul(dx, value))


_int8_q4_k = _int8_kernel(_emit_k4, "Q4_K")
_int8_q6_k = _int8_kernel(_emit_q6, "Q6_K")
_int8_q8_0 = _int8_kernel(_emit_q8, "Q8_0")
_int8_q4_0 = _int8_kernel(lambda p: _emit_legacy(p, 0, 2, 8, False), "Q4_0")
_int8_q4_1 = _int8_kernel(lambda p: _emit_legacy(p, 0, 4, 0, True), "Q4_1")
_int8_q5_0 = _int8_kernel(lambda p: _emit_legacy(p, 2, 6, 16, False), "Q5_0")
_int8_q5_1 = _int8_kernel(lambda p: _emit_legacy(p, 4, 8, 0, True), "Q5_1")


@njit(**JIT)
def _unit(kind, blk, u, s, o, s2, o2, xq, x0, dx, xs, g0, acc):
    """Unit u of a tile block, for one row: acc (64,) += its share of x @ W.T. g0: the unit's first
    group of 32 inputs in dx, xs (the row's activation scales and code sums)."""
    _scales(kind, blk, u, s, o, s2, o2)
    if kind == 8:
        _int8_q4_k(blk, u, s, o, s2, o2, xq, x0, dx, xs, g0, acc)
    elif kind == 10:
        _int8_q6_k(blk, u, s, o, s2, o2, xq, x0, dx, xs, g0, acc)
    elif kind == 7:
        _int8_q8_0(blk, u, s, o, s2, o2, xq, x0, dx, xs, g0, acc)
    elif kind == 4:
        _int8_q4_1(blk, u, s, o, s2, o2, xq, x0, dx, xs, g0, acc)
    elif kind == 5:
        _int8_q5_0(blk, u, s, o, s2, o2, xq, x0, dx, xs, g0, acc)
    elif kind == 6:
        _int8_q5_1(blk, u, s, o, s2, o2, xq, x0, dx, xs, g0, acc)
    else:
        _int8_q4_0(blk, u, s, o, s2, o2, xq, x0, dx, xs, g0, acc)


@njit(parallel=True, **JIT)
def _times(kind, tiles, units, unit_in, xq, dx, xs, y):
    """y (k, out) for activations already rounded: xq (k, in) int16, dx, xs (k, in / 32) float32."""
    n_tiles, n_blocks = tiles.shape[0], tiles.shape[1]
    k, out = xq.shape[0], y.shape[1]
    for t in prange(n_tiles):
        acc = np.zeros(TILE, F32)
        s, o, s2, o2 = np.empty(TILE, F32), np.empty(TILE, F32), np.empty(TILE, F32), np.empty(TILE, F32)
        for n in range(k):
            acc[:] = 0
            for b in range(n_blocks):
                for u in range(units):
                    i0 = unit_in * (units * b + u)
                    _unit(kind, tiles[t, b], u, s, o, s2, o2, xq[n], i0, dx[n], xs[n], i0 // GROUP, acc)
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
    _times(KINDS[m.type], m.tiles, m.groups * GROUP // m.unit, m.unit, xq, dx, xs, y)
    return y


def reference(m, x: np.ndarray) -> np.ndarray:
    """What times_int8 computes, in NumPy: the rounded activations (dx·xq) times the exact weights."""
    xq, dx, _ = quantize_activations(np.asarray(x, np.float32))
    rounded = (xq.reshape(len(x), -1, GROUP) * dx[:, :, None]).reshape(x.shape).astype(np.float32)
    return rounded @ m.dequantize().T

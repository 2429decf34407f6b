"""The product with activations rounded to int8 per block of 32 inputs, and integer dot products:
llama.cpp's way to multiply by Q4_K, Q5_K, Q6_K, Q8_0, Q4_1 (and Q4_0, Q5_0, Q5_1, Q2_K, IQ4_NL, IQ4_XS)
weights, offered as an option because it is not exact (the default, kernels.py, multiplies the exact
float32 values). The same sums also carry the exact path's one row where the CPU has AVX-512 VNNI, with x
in 24 bits as three int8 digit planes (times_24, PLANES): exact integer sums, float32's precision.

Each row x (in,) becomes, per block of 32 inputs, xq = round(x / dx) with dx = max|x| / 127 (llama.cpp's
quantize_row_q8_0, which its CPU backend applies to activations beside Q4_0/Q4_1/Q8_0 weights, except
that dx stays float32 where llama.cpp rounds it to float16; for K types llama.cpp uses one scale per
256 inputs, Q8_K: a scale per 32 is the more accurate). Then per group of
32 inputs of a weight block, with codes q and the group's float scale s and offset o (w = s·q − o):

    sum_i x_i w_i  ≈  dx · (s · sum_i xq_i q_i − o · sum_i xq_i)

where sum_i xq_i q_i is an exact integer. The only error is x's rounding to int8 (~1/254 of a value,
~1e-3 of a typical output); `reference` computes the same products in NumPy from the exact weights and
the rounded activations, which the kernel equals to float32's rounding.

The integer sums are LLVM vector IR (as kernels.py's values), in passes of 16 outputs, on kernels.py's
tiles as they are (no second copy of the weights): 4 byte rows of the block (4 consecutive inputs, or
their nibbles) for those 16 outputs are interleaved in registers (vpermt2b) so that each 32-bit lane
holds one output's 4 codes, and `vpdpbusd` adds their products with 4 int8 activations broadcast from
memory: 64 multiply-adds per instruction. Codes are unsigned (Q8_0's flipped by 128, Q4_0 and Q5_0 as
stored, Q2_K's 2 bits, Q5_K's 5 bits, Q6_K's 6 bits, IQ4's values looked up, plus 128) and the offset
comes out with the row's code sums per 16 inputs (xs): dx·(s·D − offset·s·xs). Q6_K is walked a half
block (128 inputs) at a time, 3 interleaved byte rows giving 4 inputs of each of its 4 quarters; one row of it
(a decode step) over all 64 outputs of a tile at once, each byte row read as a whole line (WIDE, _Pass.lines).
Up to ROWS rows of activations share the codes made once (a batch, a draft, a prompt under matrix.blas_rows()
rows); one row is a decode step. Without VNNI, on AVX2 (AMD Zen 2 and 3, Intel's
Haswell to Comet Lake), the sums are llama.cpp's AVX2 pair: vpmaddubsw (byte products summed in pairs
to int16) then vpmaddwd by ones, exact for codes below 128; Q8_0's signed codes by the sign trick (_Pass.sums: its
flipped codes, up to 255, would overflow the int16 pairs). Tested with MINIGEN_AVX2=1
on any CPU. On the AMD Zen 3 here (one thread, 8960 x 1536, one row) those took Q4_K's product from 9.5 ms
(the plain IR that was here: widen, multiply, add 4 lanes) to 1.0, Q8_0's from 10.0 to 2.2.

Measured on the Intel Xeon here (AVX-512 VNNI, 2 threads; docs/weights-as-stored.md#the-int8-option):
a decode step of Qwen2.5-Coder-1.5B Q4_K_M takes ~110-120 ms against ~230-260 exact; the products
stream the file at ~9 GB/s.
"""
from __future__ import annotations

import os

import numpy as np
from llvmlite import binding, ir
from numba import carray, njit, prange, types
from numba.core import cgutils
from numba.core.errors import RequireLiteralValue
from numba.extending import intrinsic

from .kernels import (AVX2_ONLY, F32, F32_P, FEATURES, GROUP, INT, JIT, KINDS, NAMES, TILE, TILE_SHAPE, U8_P, UNIT, UNITS,
                      address, call, data, ir_half, ir_prefetch_share, ir_scales, ir_splat, ir_table16, launch, lazy_cfunc,
                      own_name)
from .formats import IN_24_BITS, INT8_TYPES, IQ4_VALUES
from .quantize import _round_half_away

TYPES = INT8_TYPES   # what this module multiplies
# no FMA contraction in these kernels: where LLVM fuses a multiply into an add depends on what surrounds it, so
# the one-row and the many-row kernels rounded a row's epilogue differently (Q4_0, Q2_K, IQ4: a few ulp), and a
# batch's int8 rounding in the next layer then parted from the same sequence run alone
EXACT_ORDER = dict(JIT, fastmath=False)
I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
FLOAT = ir.FloatType()
LANES = 16
# the integer dot product of 4 unsigned by 4 signed bytes per 32-bit lane in one instruction (vpdpbusd,
# 256 bits: AVX512-VNNI with VL, or AVX-VNNI): Zen 4 and Intel's AVX-512 CPUs have it; elsewhere the
# same sums in plain IR (and with MINIGEN_AVX2=1, kernels.py).
VNNI512 = bool(FEATURES.get("avx512vnni") and FEATURES.get("avx512bw")) and not AVX2_ONLY   # as matrix.vnni512 reads it
VNNI = VNNI512 or bool(FEATURES.get("avxvnni") or (FEATURES.get("avx512vnni") and FEATURES.get("avx512vl"))) and not AVX2_ONLY
AVX2 = bool(FEATURES.get("avx2"))   # vpmaddubsw, vpmaddwd on 256 bits (_dot4)
SIGNED_CODES = AVX2 and not VNNI    # Q8_0's codes multiplied as signed bytes (_Pass.sums)


# the types whose passes (units of 32 inputs) have their steps written out rather than a loop (VNNI): LLVM's loop
# kept some activation broadcasts a step ahead in registers and sent the rest to the stack and back. Zen 5, 2
# threads, 8960 x 1536, one process, calls alternating with the loop, two runs: one row 0.42-0.84x the time, 8
# rows 0.63-0.97x, 16 rows 0.74-1.01x. Q4_K, Q5_K, Q2_K (two streams of 8 or 4 steps) 0.85-1.2x at every row
# count, Q6_K 1.0-1.47x: loops
UNROLLED = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "IQ4_XS"}

# The exact path's one row on AVX-512 VNNI (times_24, which matrix.StoredMatrix takes for a decode step): x in 24
# bits per block of 32, X = round(x / dx) with dx = max|x| / TOP24, as three balanced base-256 digits (PLANES of
# int8, X = D0 + 2^8·D1 + 2^16·D2), each multiplied by the codes as int8's are (vpdpbusd), so that a block's sums
# are exact integers and the only rounding besides float32's own is x's to 24 bits of its block's largest value,
# which a float32 sum of that block makes anyway. Its error against a float64 product is no larger than the float
# kernel's (an ad-hoc script, Qwen2.5-1.5B's Q4_K ffn_down, one row: max 5.8e-9 / 5.1e-8 of |x|·|w| against
# 3.2e-8 / 1.2e-7, without and with outliers in x), and the three dot products a step cost less than converting
# the codes to floats and their FMAs: Zen 4, the 1.5B's Q4_K matrices one row, 58 -> 46 ms on one thread.
PLANES = 3
TOP24 = 127 * (1 + 256 + 65536)   # the largest |X| whose three balanced digits stay within int8 (8,355,711)


def _vec(t, n=LANES):
    return ir.VectorType(t, n)


def _const(t, value, n=LANES):
    return ir.Constant(_vec(t, n), [value] * n)


class _Pass:
    """IR for the 16 outputs j0 ... j0 + 15 of one unit of one tile block, for `nrows` rows of activations
    n0 ... n0 + nrows − 1 (arguments: blk, u, xq, n0, x0, dx, xs, g0, acc; see _unit): the codes of a weight
    are made once and multiplied by every row."""

    def __init__(self, context, builder, argtypes, args, kind: str, j0, nrows, wide: bool = False, planes: int = 1):
        self.b = b = builder
        self.passes = 1 if wide else TILE // LANES   # passes over a unit's 64 outputs (wide: one, _Pass.lines)
        self.planes = planes                         # xq's rows a row of activations (PLANES: its 24-bit digits)
        arr = lambda i: context.make_array(argtypes[i])(context, builder, args[i])
        width = lambda i: cgutils.unpack_tuple(b, arr(i).shape, 2)[1]
        self.base = b.bitcast(arr(0).data, I8.as_pointer())
        self.kind = kind
        self.u, self.j0, self.nrows = args[1], j0, nrows
        self.xq, self.xq_row = b.bitcast(arr(2).data, I8.as_pointer()), width(2)
        self.n0, self.x0 = args[3], args[4]
        self.dx, self.dx_row = b.bitcast(arr(5).data, FLOAT.as_pointer()), width(5)
        self.xs, self.xs_row = b.bitcast(arr(6).data, FLOAT.as_pointer()), width(6)
        self.g0 = args[7]
        self.acc = b.bitcast(arr(8).data, FLOAT.as_pointer())
        # s, o, s2, o2 of the 16 outputs (kernels.ir_scales; Q6_K's units are half blocks: its own, _emit_q6)
        self.scales = ir_scales(b, kind, self.row, self.u) if kind != "Q6_K" and not wide else None

    def at_row(self, r, stride, i):
        """Element i of activation row n0 + r of an array whose rows are `stride` long."""
        return self.add(self.b.mul(self.add(self.n0, r), stride), i)

    def i64(self, v):
        return ir.Constant(I64, v) if isinstance(v, int) else v

    def add(self, *terms):
        total = self.i64(terms[0])
        for t in terms[1:]:
            total = self.b.add(total, self.i64(t))
        return total

    def load(self, ptr, at, t, n=LANES):
        return self.b.load(self.b.bitcast(self.b.gep(ptr, [self.i64(at)]), _vec(t, n).as_pointer()), align=1)

    def row(self, r):
        """Byte row r of the block at this pass's 16 outputs, <16 x i8>."""
        return self.load(self.b.gep(self.base, [self.b.mul(self.i64(r), self.i64(TILE))]), self.j0, I8)

    def quad(self, r):
        """Byte rows r ... r + 3 (r: an IR i64, or a function of 0..3 giving each row) of the 16 outputs,
        interleaved: lane j of the <16 x i32> result holds output j's four bytes, rows r ... r + 3 in order,
        as an integer dot product wants them (4 inputs of one output per 32-bit lane)."""
        b = self.b
        rows = [self.row(r(q) if callable(r) else self.add(r, q)) for q in range(4)]
        return _interleave(b, rows)

    def lines(self, r, half: int):
        """Byte rows r ... r + 3 (an IR i64) of the block at outputs 8·half + 16k ... + 7 (k = 0 ... 3), each read as one
        line, interleaved as quad() interleaves 16 outputs' by two rounds of unpacks within 128-bit lanes: chunks
        m = 2·half, 2·half + 1, <64 x i8> each, chunk m holding output 16k + 4m + i's four bytes at lane 4k + i
        (i = 0 ... 3; WIDE_AT). Where quad() takes four loads, two inserts and a permute per 16 outputs, these take
        a load and two unpacks."""
        b = self.b
        rows = [self.load(self.base, b.mul(self.add(r, q), self.i64(TILE)), I8, TILE) for q in range(4)]
        pair = lambda x, y: b.bitcast(b.shuffle_vector(x, y, ir.Constant(_vec(I32, 64), [
            16 * k + 8 * half + t + 64 * s for k in range(4) for t in range(8) for s in (0, 1)])), _vec(I16, 32))
        first, second = pair(rows[0], rows[1]), pair(rows[2], rows[3])
        quad = lambda part: b.bitcast(b.shuffle_vector(first, second, ir.Constant(_vec(I32, 32), [
            8 * k + 4 * part + t + 32 * s for k in range(4) for t in range(4) for s in (0, 1)])), _vec(I8, 64))
        return [quad(0), quad(1)]

    def row_wide(self, r, m):
        """Byte row r of the block at the 16 outputs of a wide pass's chunk m (lines), in its order, <16 x i8>."""
        v = self.load(self.base, self.b.mul(self.i64(r), self.i64(TILE)), I8, TILE)
        return self.b.shuffle_vector(v, v, ir.Constant(_vec(I32, 16), [16 * k + 4 * m + i for k in range(4) for i in range(4)]))

    def splat(self, value, t, n=LANES):
        return ir_splat(self.b, value, t, n)

    def x4(self, r, i, n=8, plane: int = 0):
        """xq[n0 + r, x0 + i ... x0 + i + 3], four int8 as one i32, broadcast to <n x i32> (with PLANES, digit
        `plane` of those activations: xq's row 3·(n0 + r) + plane)."""
        b = self.b
        row = self.add(b.mul(self.add(self.n0, r), self.i64(self.planes)), plane)
        at = self.add(b.mul(row, self.xq_row), self.x0, i)
        word = b.load(b.bitcast(b.gep(self.xq, [at]), I32.as_pointer()), align=1)
        return self.splat(word, I32, n)

    def dx_of(self, r, i):
        """Row r's activation scale of the unit's group i, broadcast."""
        return self.fsplat(self.b.load(self.b.gep(self.dx, [self.at_row(r, self.dx_row, self.add(self.g0, i))])))

    def xsum(self, r, half):
        """Row r's code sum over inputs 16·half ... of the unit's first group (xs holds one per 16)."""
        at = self.at_row(r, self.xs_row, self.add(self.b.mul(self.g0, self.i64(2)), half))
        return self.fsplat(self.b.load(self.b.gep(self.xs, [at])))

    def sums(self, count: int, streams, sign: str = "small", share=(0, 1)):
        """Integer sums over `count` steps l of each stream: streams(l) -> [(codes <64 x i8> as quad()
        lays them out, first input)], for each row r the sum over l of each output's 4 codes times
        xq[n0 + r, x0 + input ... + 3] (dot4). The codes are (sign) "small" (unsigned, < 128), "unsigned" or
        "signed" (only without VNNI on AVX2: SIGNED_CODES). -> per row, [<16 x float>] per stream (exact:
        |sum| < 2^24). share (i, n): this is loop i of the n that walk the unit (its prefetches, i/n of the
        unit's). With VNNI the steps are a loop, or written out one after another for the UNROLLED types."""
        b = self.b
        n = len(streams(ir.Constant(I64, 0)))
        rows = range(self.nrows)
        if VNNI512:   # one <16 x i32> sum per stream, row and digit plane
            fn = b.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.512", (), ir.FunctionType(_vec(I32), [_vec(I32)] * 3))
            dot = lambda total, codes, i, r, p: b.call(fn, [total, b.bitcast(codes, _vec(I32)), self.x4(r, i, LANES, p)])
            planes = range(self.planes)
            if self.kind in UNROLLED:   # the steps written out one after another, the sums SSA values
                sums = [[[_const(I32, 0)] * self.planes for _ in range(n)] for _ in rows]
                for step in map(self.i64, range(count)):
                    for k, (codes, i) in enumerate(streams(step)):
                        for r in rows:
                            sums[r][k] = [dot(sums[r][k][p], codes, i, r, p) for p in planes]
                    self.prefetch(step, count, share)
                return [[self.planes_float(v) for v in row] for row in sums]
            acc = [[[cgutils.alloca_once_value(b, _const(I32, 0)) for _ in planes] for _ in range(n)] for _ in rows]
            with cgutils.for_range(b, self.i64(count)) as step:
                for k, (codes, i) in enumerate(streams(step.index)):
                    for r in rows:
                        for p in planes:
                            b.store(dot(b.load(acc[r][k][p]), codes, i, r, p), acc[r][k][p])
                self.prefetch(step.index, count, share)
            return [[self.planes_float([b.load(a) for a in sums]) for sums in row] for row in acc]
        # signed (Q8_0 on AVX2, whose flipped codes up to 255 would overflow vpmaddubsw's int16 pairs): llama.cpp's
        # sign trick turned round so that no value leaves a byte, w·x = |w|·(x·sign w), |w| <= 128 unsigned
        # (vpabsb: -128 becomes 128) and x·sign w within -127..127 (vpsignb; 0 where w is 0): a pair's sum
        # stays within 2·128·127 < 2^15
        i8x32 = _vec(I8, 32)
        if sign == "signed":
            absb = b.module.declare_intrinsic("llvm.abs.v32i8", (), ir.FunctionType(i8x32, [i8x32, ir.IntType(1)]))
            signb = b.module.declare_intrinsic("llvm.x86.avx2.psign.b", (), ir.FunctionType(i8x32, [i8x32, i8x32]))
        acc = [[[cgutils.alloca_once_value(b, _const(I32, 0, 8)) for _ in range(2)] for _ in range(n)] for _ in rows]
        with cgutils.for_range(b, self.i64(count)) as step:
            self.prefetch(step.index, count, share)
            for k, (codes, i) in enumerate(streams(step.index)):
                parts = [b.shuffle_vector(codes, codes, ir.Constant(_vec(I32, 32), list(range(32 * h, 32 * h + 32)))) for h in range(2)]
                sizes = [b.call(absb, [w, ir.Constant(ir.IntType(1), 0)]) for w in parts] if sign == "signed" else parts
                for r in rows:
                    x = self.x4(r, i)
                    for half in range(2):
                        xs = b.call(signb, [b.bitcast(x, i8x32), parts[half]]) if sign == "signed" else x
                        a = acc[r][k][half]
                        b.store(_dot4(b, b.load(a), b.bitcast(sizes[half], _vec(I32, 8)), b.bitcast(xs, _vec(I32, 8)),
                                      sign != "unsigned"), a)
        mask = ir.Constant(_vec(I32, 16), list(range(16)))
        return [[b.sitofp(b.shuffle_vector(b.load(lo), b.load(hi), mask), _vec(FLOAT)) for lo, hi in row] for row in acc]

    def planes_float(self, sums):
        """A stream's integer sums, one <16 x i32> per digit plane, as one <16 x float>: the sum itself, or with
        PLANES (2^16·D2 + 2^8·D1) + D0, each D exact in a float (below 2^24) and each product by a power of 2."""
        b = self.b
        f = [b.sitofp(v, _vec(FLOAT)) for v in sums]
        if len(f) == 1:
            return f[0]
        return b.fadd(b.fadd(b.fmul(f[2], self.fsplat(ir.Constant(FLOAT, 65536.0))),
                             b.fmul(f[1], self.fsplat(ir.Constant(FLOAT, 256.0)))), f[0])

    def prefetch(self, step, count: int, share=(0, 1)):
        """Step `step` of this pass's loop `share[0]` of `share[1]`, each of `count` steps: its part of the unit's
        share of the block ahead, the share spread over the unit's passes and loops (kernels.ir_prefetch_share)."""
        passes, (i, n) = self.passes, share
        at = self.b.add(step, self.i64(count * (i + n * (self.j0 // LANES))))
        ir_prefetch_share(self.b, self.base, self.kind, self.u, at, count * n * passes)

    def add_to_outputs(self, r, value, j0=None):
        """acc[n0 + r, j0:j0 + 16] += value <16 x float> (j0: the pass's). acc is a float32 array, aligned to 4 bytes
        only: a vector's natural alignment (64 bytes) would let LLVM emit aligned moves, which fault on AVX-512."""
        at = self.at_row(r, self.i64(TILE), self.j0 if j0 is None else j0)
        at = self.b.bitcast(self.b.gep(self.acc, [at]), _vec(FLOAT).as_pointer())
        self.b.store(self.b.fadd(self.b.load(at, align=4), value), at, align=4)

    def fsplat(self, v):
        return self.splat(v, FLOAT)


def _interleave(b, rows):
    """Four <16 x i8> rows -> <64 x i8>, lane j (bytes 4j ... 4j + 3) = rows[0][j] ... rows[3][j]."""
    mask = lambda k: ir.Constant(_vec(I32, k), list(range(k)))
    ab = b.shuffle_vector(rows[0], rows[1], mask(32))
    cd = b.shuffle_vector(rows[2], rows[3], mask(32))
    order = [(q % 2) * 16 + j + (32 if q >= 2 else 0) for j in range(16) for q in range(4)]
    return b.shuffle_vector(ab, cd, ir.Constant(_vec(I32, 64), order))


def _dot4(b, acc, codes, x, small: bool):
    """acc <8 x i32> + per lane the sum of its 4 unsigned bytes of codes times the 4 signed bytes of x:
    vpdpbusd where the CPU has it (AVX512-VNNI or AVX-VNNI, one instruction for 32 products); else, for
    `small` codes (<= 128) on AVX2, llama.cpp's pair (vpmaddubsw: byte products summed in pairs to int16, then
    vpmaddwd by ones: the pairs summed to int32), exact as |x| <= 127 keeps a pair's sum within int16
    (2·128·127 < 2^15); else plain IR (widen, multiply, add the 4 products of each lane)."""
    if VNNI:
        fn = b.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.256", (), ir.FunctionType(_vec(I32, 8), [_vec(I32, 8)] * 3))
        return b.call(fn, [acc, codes, x])
    if small and AVX2:
        i8x32, i16x16 = _vec(I8, 32), _vec(I16, 16)
        pairs = b.module.declare_intrinsic("llvm.x86.avx2.pmadd.ub.sw", (), ir.FunctionType(i16x16, [i8x32, i8x32]))
        quads = b.module.declare_intrinsic("llvm.x86.avx2.pmadd.wd", (), ir.FunctionType(_vec(I32, 8), [i16x16, i16x16]))
        p = b.call(pairs, [b.bitcast(codes, i8x32), b.bitcast(x, i8x32)])
        return b.add(acc, b.call(quads, [p, ir.Constant(i16x16, [1] * 16)]))
    u = b.zext(b.bitcast(codes, _vec(I8, 32)), _vec(I32, 32))
    s = b.sext(b.bitcast(x, _vec(I8, 32)), _vec(I32, 32))
    p = b.mul(u, s)
    for q in range(4):
        acc = b.add(acc, b.shuffle_vector(p, p, ir.Constant(_vec(I32, 8), [4 * j + q for j in range(8)])))
    return acc


def _bytes(n, value):
    return ir.Constant(_vec(I8, n), [value] * n)


def _nibbles(b, v):
    """The low and high nibbles of <64 x i8>, each <64 x i8>."""
    v = b.bitcast(v, _vec(I8, 64))
    return b.and_(v, _bytes(64, 15)), b.and_(b.lshr(v, _bytes(64, 4)), _bytes(64, 15))


def _emit_k45(p: _Pass, row_qs: int, fifth: bool):
    """Q4_K, Q5_K unit c: qs byte row_qs + 32c + l (the tiles' rows, formats.UNPACKED_SCALES) holds input l of
    group 2c (low nibble) and of 2c + 1 (high); Q5_K's qh byte 20 + l, bit g: the fifth bit of input l of group
    g (codes 0..31); acc += dx_2c·(s·D_2c − o·xs_2c) + dx_2c+1·(s2·D_2c+1 − o2·xs_2c+1)."""
    b = p.b
    rows = p.add(b.mul(p.u, p.i64(32)), row_qs)
    g = b.trunc(b.mul(p.u, p.i64(2)), I8)

    def streams(step):
        l = b.mul(step, p.i64(4))
        lo, hi = _nibbles(b, p.quad(b.add(rows, l)))
        if fifth:   # bit g (and g + 1) of the 4 inputs' qh bytes, moved to bit 4
            qh = b.bitcast(p.quad(p.add(20, l)), _vec(I8, 64))
            bit = lambda at: b.shl(b.and_(b.lshr(qh, p.splat(at, I8, 64)), _bytes(64, 1)), _bytes(64, 4))
            lo, hi = b.or_(lo, bit(g)), b.or_(hi, bit(b.add(g, ir.Constant(I8, 1))))
        return [(lo, l), (hi, b.add(l, p.i64(32)))]
    for r, (lo, hi) in enumerate(p.sums(8, streams)):
        _k45_finish(p, r, lo, hi, p.scales, p.j0)


def _emit_k45_wide(p: _Pass, row_qs: int, fifth: bool):
    """Q4_K, Q5_K, one row, a wide pass (_Pass.lines): _emit_k45's sums for all 64 outputs, a loop per half of them
    (4 sums: 2 chunks of low and high nibbles), then its finish for each chunk m of 16 outputs in its order."""
    b = p.b
    rows = p.add(b.mul(p.u, p.i64(32)), row_qs)
    g = b.trunc(b.mul(p.u, p.i64(2)), I8)

    def streams(half, step):
        l = b.mul(step, p.i64(4))
        out = []
        qhs = p.lines(p.add(20, l), half) if fifth else [None, None]
        for v, qh in zip(p.lines(b.add(rows, l), half), qhs):
            lo, hi = _nibbles(b, v)
            if fifth:
                qh = b.bitcast(qh, _vec(I8, 64))
                bit = lambda at: b.shl(b.and_(b.lshr(qh, p.splat(at, I8, 64)), _bytes(64, 1)), _bytes(64, 4))
                lo, hi = b.or_(lo, bit(g)), b.or_(hi, bit(b.add(g, ir.Constant(I8, 1))))
            out += [(lo, l), (hi, b.add(l, p.i64(32)))]
        return out
    sums = [p.sums(8, lambda step, half=half: streams(half, step), share=(half, 2))[0] for half in (0, 1)]
    for m in range(4):
        lo, hi = sums[m // 2][2 * (m % 2)], sums[m // 2][2 * (m % 2) + 1]
        _k45_finish(p, 0, lo, hi, ir_scales(b, p.kind, lambda r, m=m: p.row_wide(r, m), p.u), 16 * m)


def _k45_finish(p: _Pass, r, lo, hi, scales, j0):
    """acc[n0 + r, j0:j0 + 16] += dx_2c·(s·D_2c − o·xs_2c) + dx_2c+1·(s2·D_2c+1 − o2·xs_2c+1)."""
    b = p.b
    s, o, s2, o2 = scales
    terms = []
    for i, (d, sc, off) in enumerate(((lo, s, o), (hi, s2, o2))):
        xs = b.fadd(p.xsum(r, 2 * i), p.xsum(r, 2 * i + 1))
        terms.append(b.fmul(p.dx_of(r, i), b.fsub(b.fmul(sc, d), b.fmul(off, xs))))
    p.add_to_outputs(r, b.fadd(terms[0], terms[1]), j0)


def _emit_q2(p: _Pass):
    """Q2_K unit g (a group of 32 inputs, in half h = g // 4 of the super-block, field f = g % 4): input 16·q + l
    (q = 0, 1) has its 2-bit code in bits 2f, 2f + 1 of qs byte 16 + 32h + 16q + l; a scale and an offset per 16
    inputs: acc += dx_g·(s_0·D_0 − o_0·xs_0 + s_1·D_1 − o_1·xs_1). (Q3_K stays exact: the same with its third
    bit from hmask and offsets 4·s took 0.92-0.97x its exact product's time, 8960 x 1536 at 1, 8 and 16 rows.)"""
    b = p.b
    h, f = b.lshr(p.u, p.i64(2)), b.and_(p.u, p.i64(3))
    qs, shift = p.add(b.mul(h, p.i64(32)), 16), p.splat(b.trunc(b.mul(f, p.i64(2)), I8), I8, 64)

    def streams(step):
        ls = [p.add(b.mul(step, p.i64(4)), 16 * half) for half in (0, 1)]
        return [(b.and_(b.lshr(b.bitcast(p.quad(b.add(qs, l)), _vec(I8, 64)), shift), _bytes(64, 3)), l) for l in ls]
    s0, o0, s1, o1 = p.scales
    for r, (first, second) in enumerate(p.sums(4, streams)):
        halves = [b.fsub(b.fmul(s, total), b.fmul(o, p.xsum(r, half)))
                  for half, (total, s, o) in enumerate(((first, s0, o0), (second, s1, o1)))]
        p.add_to_outputs(r, b.fmul(p.dx_of(r, 0), b.fadd(*halves)))


def _emit_q6(p: _Pass):
    """Q6_K unit h = half h of the block (128 inputs, quarters q = 0..3 of 32): input l of quarter q has its
    low 4 bits in ql byte 64h + 32(q % 2) + l (low nibble for q < 2, high for q >= 2), its high 2 bits in qh
    byte 128 + 32h + l, bits 2q; codes 0..63, value (d·sc)·(code − 32), an int8 sc per 16 inputs (bytes
    192 + 8h + 2q, + 1). So 3 interleaved byte rows give 4 inputs of all four quarters: 4 streams, the
    quarters, per part of a quarter (inputs 0..15, 16..31). acc += sum over q, parts p:
    dx_q·(d·sc_qp)·(D_qp − 32·xs_qp)."""
    b = p.b
    ql, qh = _q6_rows(p)

    def streams(part, step):
        l = p.add(b.mul(step, p.i64(4)), part)
        codes = _q6_codes(b, p.quad(b.add(ql, l)), p.quad(p.add(ql, 32, l)), p.quad(b.add(qh, l)))
        return [(code, p.add(l, 32 * q)) for q, code in enumerate(codes)]
    # one or two rows: their 8 sums each in one loop; more rows: a loop per part, 4 sums a row (8 a row took more
    # registers than AVX-512 has at 4 rows: the sums went to the stack and back every step)
    if p.nrows <= 2:
        both = p.sums(4, lambda step: streams(0, step) + streams(16, step))
        sums = [[row[:4] for row in both], [row[4:] for row in both]]
    else:
        sums = [p.sums(4, lambda step, part=part: streams(16 * part, step), share=(part, 2)) for part in (0, 1)]
    _q6_finish(p, p.row, sums, p.j0)


def _emit_q6_wide(p: _Pass):
    """Q6_K, one row, a wide pass (_Pass.lines): _emit_q6's sums for all 64 outputs, a loop per part of a quarter and
    half of the outputs (8 sums: 4 quarters of 2 chunks; 16 in one loop went to the stack and back), then its
    finish for each chunk m of 16 outputs in its order."""
    b = p.b
    ql, qh = _q6_rows(p)

    def streams(part, half, step):
        l = p.add(b.mul(step, p.i64(4)), part)
        chunks = zip(p.lines(b.add(ql, l), half), p.lines(p.add(ql, 32, l), half), p.lines(b.add(qh, l), half))
        codes = [_q6_codes(b, *rows) for rows in chunks]                  # [chunk][q]
        return [(codes[m][q], p.add(l, 32 * q)) for q in range(4) for m in range(2)]
    sums = {(part, half): p.sums(4, lambda step, part=part, half=half: streams(16 * part, half, step), share=(2 * part + half, 4))[0]
            for part in (0, 1) for half in (0, 1)}
    for m in range(4):
        half, c = divmod(m, 2)
        chunk = [[sums[part, half][2 * q + c] for q in range(4)] for part in (0, 1)]
        _q6_finish(p, lambda r, m=m: p.row_wide(r, m), [[chunk[0]], [chunk[1]]], 16 * m)


def _q6_rows(p: _Pass):
    """Unit h's first ql and qh byte rows."""
    return p.b.mul(p.u, p.i64(64)), p.add(p.b.mul(p.u, p.i64(32)), 128)


def _q6_codes(b, a, c, hi) -> list:
    """The codes of quarters 0 ... 3 (<64 x i8> each, 0 ... 63) from the interleaved ql rows a (l), c (32 + l) and
    qh rows hi: a quarter's low 4 bits a nibble of a or c, its high 2 bits of hi at bits 2q."""
    a, c, hi = (b.bitcast(v, _vec(I8, 64)) for v in (a, c, hi))
    bits = lambda v, shift, mask: b.and_(b.lshr(v, _bytes(64, shift)), _bytes(64, mask)) if shift else b.and_(v, _bytes(64, mask))
    lows = [bits(a, 0, 15), bits(c, 0, 15), bits(a, 4, 15), bits(c, 4, 15)]
    return [b.or_(lows[q], b.shl(bits(hi, 2 * q, 3), _bytes(64, 4))) for q in range(4)]


def _q6_finish(p: _Pass, row, sums, j0):
    """acc[:, j0:j0 + 16] += each row's sum over quarters q and parts of dx_q·(d·sc_qp)·(D_qp − 32·xs_qp), from
    sums[part][r][q] and row(r), the block's byte row r at those 16 outputs (the same operations in the same order
    for a pass of 16 outputs and a wide pass's chunk: one row's product is the same bits either way)."""
    b, h = p.b, p.u
    d = ir_half(b, row(208), row(209))
    scale = lambda q, part: b.fmul(d, b.sitofp(b.sext(row(p.add(b.mul(h, p.i64(8)), 192 + 2 * q + part)), _vec(I32)), _vec(FLOAT)))
    scales = {(q, part): scale(q, part) for q in range(4) for part in (0, 1)}
    c32 = p.fsplat(ir.Constant(FLOAT, 32.0))
    for r in range(p.nrows):
        total = None
        for q in range(4):
            inner = None
            for part in (0, 1):
                term = b.fmul(scales[q, part], b.fsub(sums[part][r][q], b.fmul(c32, p.xsum(r, 2 * q + part))))
                inner = term if inner is None else b.fadd(inner, term)
            term = b.fmul(p.dx_of(r, q), inner)
            total = term if total is None else b.fadd(total, term)
        p.add_to_outputs(r, total, j0)


def _emit_q8(p: _Pass):
    """Q8_0: int8 codes in bytes 2..33, as they are (SIGNED_CODES: acc += dx·d·D) or made unsigned (q + 128, a
    flip of the top bit: acc += dx·d·(D − 128·xs))."""
    b = p.b

    def streams(step):
        l = b.mul(step, p.i64(4))
        v = b.bitcast(p.quad(p.add(2, l)), _vec(I8, 64))
        return [(v if SIGNED_CODES else b.xor(v, _bytes(64, -128)), l)]
    for r, (total,) in enumerate(p.sums(8, streams, "signed" if SIGNED_CODES else "unsigned")):
        _q8_finish(p, r, total, p.scales[0], p.j0)


def _emit_q8_wide(p: _Pass):
    """Q8_0, one row, a wide pass (_Pass.lines; VNNI512, so the codes made unsigned): _emit_q8's sums for all 64
    outputs, a loop per half of them (2 chunks), then its finish for each chunk m of 16 outputs in its order."""
    b = p.b

    def streams(half, step):
        l = b.mul(step, p.i64(4))
        return [(b.xor(b.bitcast(v, _vec(I8, 64)), _bytes(64, -128)), l) for v in p.lines(p.add(2, l), half)]
    sums = [p.sums(8, lambda step, half=half: streams(half, step), "unsigned", share=(half, 2))[0] for half in (0, 1)]
    for m in range(4):
        scale = ir_scales(b, "Q8_0", lambda r, m=m: p.row_wide(r, m), p.u)[0]
        _q8_finish(p, 0, sums[m // 2][m % 2], scale, 16 * m)


def _q8_finish(p: _Pass, r, total, scale, j0):
    """acc[n0 + r, j0:j0 + 16] += dx·(d·D) (SIGNED_CODES), or dx·(d·(D − 128·xs)) for the flipped codes; the same
    operations for a pass of 16 outputs and a wide pass's chunk (one row's product the same bits either way)."""
    b = p.b
    if not SIGNED_CODES:
        total = b.fsub(total, b.fmul(p.fsplat(ir.Constant(FLOAT, 128.0)), b.fadd(p.xsum(r, 0), p.xsum(r, 1))))
    p.add_to_outputs(r, b.fmul(p.dx_of(r, 0), b.fmul(scale, total)), j0)


def _emit_iq4(p: _Pass, xs: bool):
    """IQ4_NL (qs at byte 2), IQ4_XS unit g (its 16 bytes at 8 + 16g): byte l holds inputs l (low nibble) and
    l + 16 (high), as Q4_0's; a code q stands for IQ4_VALUES[q] (-127 ... 113), looked up as a byte
    (kernels.ir_table16): as it is where the sums are signed (SIGNED_CODES: acc += dx·s·D), else plus 128
    (1 ... 241, unsigned: acc += dx·s·(D − 128·xs)), with s = d or d·(sc − 32)."""
    b = p.b
    first = p.add(b.mul(p.u, p.i64(16)), 8) if xs else p.i64(2)
    table = [int(v) if SIGNED_CODES else (int(v) + 128) - (256 if int(v) >= 0 else 0) for v in IQ4_VALUES]

    def streams(step):
        l = b.mul(step, p.i64(4))
        lo, hi = _nibbles(b, p.quad(b.add(first, l)))
        return [(ir_table16(b, lo, table), l), (ir_table16(b, hi, table), b.add(l, p.i64(16)))]
    c128 = p.fsplat(ir.Constant(FLOAT, 128.0))
    for r, (first_sum, second) in enumerate(p.sums(4, streams, "signed" if SIGNED_CODES else "unsigned")):
        total = b.fadd(first_sum, second)
        if not SIGNED_CODES:
            total = b.fsub(total, b.fmul(c128, b.fadd(p.xsum(r, 0), p.xsum(r, 1))))
        p.add_to_outputs(r, b.fmul(p.dx_of(r, 0), b.fmul(p.scales[0], total)))


def _emit_legacy(p: _Pass, row_qh: int, row_qs: int, offset: int, has_m: bool):
    """Q4_0, Q4_1, Q5_0, Q5_1: qs byte l holds inputs l (low nibble) and l + 16 (high); Q5's qh bit i
    (byte i // 8, bit i % 8) input i's fifth bit. With m: acc += dx·(d·D + m·xs); else
    acc += dx·d·(D − offset·xs)."""
    b = p.b

    def streams(step):
        l = b.mul(step, p.i64(4))
        lo, hi = _nibbles(b, p.quad(p.add(row_qs, l)))
        if row_qh:   # inputs l ... l + 3 (and 16 + l ...) have their fifth bits at bits l % 8 ... of qh byte l // 8 (2 + l // 8)
            at = b.lshr(l, p.i64(3))
            bits = b.shl(ir.Constant(_vec(I8, 64), [1 << (q % 4) for q in range(64)]), p.splat(b.trunc(b.and_(l, p.i64(7)), I8), I8, 64))

            def fifth(row):
                qh = b.bitcast(p.quad(lambda q: p.add(row, at)), _vec(I8, 64))
                return b.select(b.icmp_unsigned("!=", b.and_(qh, bits), _bytes(64, 0)), _bytes(64, 16), _bytes(64, 0))
            lo, hi = b.or_(lo, fifth(row_qh)), b.or_(hi, fifth(row_qh + 2))
        return [(lo, l), (hi, b.add(l, p.i64(16)))]
    d, m = p.scales[0], p.scales[1]
    for r, (first, second) in enumerate(p.sums(4, streams)):
        total = b.fadd(first, second)
        xs = b.fadd(p.xsum(r, 0), p.xsum(r, 1))
        if has_m:
            value = b.fadd(b.fmul(d, total), b.fmul(m, xs))
        else:
            value = b.fmul(d, b.fsub(total, b.fmul(p.fsplat(ir.Constant(FLOAT, float(offset))), xs)))
        p.add_to_outputs(r, b.fmul(p.dx_of(r, 0), value))


EMIT = {8: lambda p: _emit_k45(p, 20, False), 9: lambda p: _emit_k45(p, 52, True), 10: _emit_q6, 7: _emit_q8,
        3: lambda p: _emit_legacy(p, 0, 2, 8, False), 4: lambda p: _emit_legacy(p, 0, 4, 0, True),
        5: lambda p: _emit_legacy(p, 2, 6, 16, False), 6: lambda p: _emit_legacy(p, 4, 8, 0, True),
        12: _emit_q2,
        14: lambda p: _emit_iq4(p, False), 15: lambda p: _emit_iq4(p, True)}   # by KINDS' number
# rows of activations a kernel multiplies at once (the codes made once for them; then one at a time): 8, whose
# 16 sums per 16 outputs stay in registers; Q6_K, 4 (a loop per part of its 4 streams: 16 sums; 8 rows, 32 sums, spill
# to the stack: 8960 x 1536 at 8 rows no faster than two passes of 4)
ROWS = tuple(4 if kind == 10 else 8 for kind in range(len(KINDS)))
# and the rest of a product's rows HALF at a time before one at a time: a batch of 4 (or 12) took 4 one-row
# passes, each making the codes again (Zen 3, one thread, 4 rows of 8960 x 1536 Q4_K: 2.94 ms so, 1.69 as one
# pass of 4)
HALF = tuple(r // 2 for r in ROWS)
# one row of these types in wide passes (_Pass.lines: all 64 outputs of a unit at once, VNNI on AVX-512): Q6_K's
# three interleaved quads a step were most of its time, its one-row product took 2x Q4_K's time a weight (Zen 4);
# Q8_0's, a byte a weight, twice Q4's interleaving a weight: one thread 11.3-11.8 -> 13.1-14.3 GB/s wide
WIDE = {10: _emit_q6_wide, 7: _emit_q8_wide} if VNNI512 else {}
# and in times_24's (three planes of sums a step): Q4_K's and Q5_K's too. The 1.5B's Q4_K matrices, one row, both
# forms in one process taking turns (Zen 4): one thread 17.3-17.9 -> 18.8-19.9 GB/s, two 26.8-28.4 -> 28.2-29.8;
# int8's row in wide passes was slower (24.0 -> 21.8 in turn), as in the tenth session: not there
WIDE24 = {**WIDE, 8: lambda p: _emit_k45_wide(p, 20, False), 9: lambda p: _emit_k45_wide(p, 52, True)} if VNNI512 else {}
# where output j of a tile is in a wide product's sums (lines: chunk m = (j % 16) // 4, lane 4·(j // 16) + j % 4)
WIDE_AT = tuple(16 * ((j % 16) // 4) + 4 * (j // 16) + j % 4 for j in range(TILE))


@intrinsic
def _unit(typingctx, kind, many, blk, u, xq, n0, x0, dx, xs, g0, acc):
    """Unit u of a tile block of type `kind` (KINDS' number, a literal: a product is compiled for one type) for
    rows n0 ... (ROWS[kind] of them if `many`, a literal, is 2, HALF[kind] if 1, else one; 3: one in a wide pass,
    WIDE, whose acc[n0] holds output j at WIDE_AT[j]; 4 or 7: one, or one wide (WIDE24), its activations in PLANES
    digit planes): acc[n] (64,) += its share of x[n] @ W.T. g0: the unit's first group of 32 inputs in dx, xs (the rows' activation scales and
    code sums)."""
    for name, arg in (("kind", kind), ("many", many)):
        if not isinstance(arg, types.IntegerLiteral):
            raise RequireLiteralValue(name)   # numba types the call again with its literal value

    def codegen(context, builder, sig, args):
        number = kind.literal_value
        planes, shape = (PLANES, many.literal_value - 4) if many.literal_value >= 4 else (1, many.literal_value)
        if shape == 3:
            (WIDE24 if planes > 1 else WIDE)[number](_Pass(context, builder, sig.args[2:], args[2:], NAMES[number], 0, 1,
                                                           wide=True, planes=planes))
            return context.get_dummy_value()
        nrows = (1, HALF[number], ROWS[number])[shape]
        for j0 in range(0, TILE, LANES):
            EMIT[number](_Pass(context, builder, sig.args[2:], args[2:], NAMES[number], j0, nrows, planes=planes))
        return context.get_dummy_value()
    return types.none(kind, many, blk, u, xq, n0, x0, dx, xs, g0, acc), codegen


def _work(kind: int, one: bool, planes: int = 1):
    """A thread's work on tiles t0 ... t1 - 1 of the product for type number `kind` alone, of one row or of any
    number, with x rounded (_quantize: xq (k, in) int8, dx (k, in / 32), xs (k, in / 16) float32; with planes =
    PLANES, one row in 24 bits, _quantize24: xq (3, in)): an uncompiled C function that kernels.address compiles
    the first time a model calls it (kernels._work)."""
    name = NAMES[kind]
    R, C = TILE_SHAPE[name]
    units, unit_in = UNITS[name], UNIT[name]
    full, half = ROWS[kind], HALF[kind]
    wide = one and kind in (WIDE24 if planes > 1 else WIDE)
    first = (3 if wide else 0) + (4 if planes > 1 else 0)   # _unit's `many` for one row

    def work(tiles_p, n_tiles, n_blocks, xq_p, dx_p, xs_p, k, n_in, y_p, out, t0, t1):
        tiles = carray(tiles_p, (n_tiles, n_blocks, R, C))
        xq, y = carray(xq_p, (k * planes, n_in)), carray(y_p, (k, out))
        dx, xs = carray(dx_p, (k, n_in // GROUP)), carray(xs_p, (k, n_in // 16))
        in_full = k - k % full                            # rows 0 .. in_full - 1 go ROWS at a time
        in_half = in_full + (k - in_full) // half * half  # then HALF at a time, then one at a time
        acc = np.empty((k, TILE), F32)
        for t in range(t0, t1):
            acc[:] = 0
            for b in range(n_blocks):
                for u in range(units):
                    i0 = unit_in * (units * b + u)
                    if one:
                        _unit(kind, first, tiles[t, b], u, xq, 0, i0, dx, xs, i0 // GROUP, acc)
                    else:
                        for n0 in range(0, in_full, full):
                            _unit(kind, 2, tiles[t, b], u, xq, n0, i0, dx, xs, i0 // GROUP, acc)
                        for n0 in range(in_full, in_half, half):
                            _unit(kind, 1, tiles[t, b], u, xq, n0, i0, dx, xs, i0 // GROUP, acc)
                        for n0 in range(in_half, k):
                            _unit(kind, 0, tiles[t, b], u, xq, n0, i0, dx, xs, i0 // GROUP, acc)
            for n in range(k):
                for j in range(min(TILE, out - TILE * t)):
                    y[n, TILE * t + j] = acc[n, WIDE_AT[j]] if wide else acc[n, j]
    what = "times_int24" if planes > 1 else "times_int8"
    return lazy_cfunc(own_name(work, f"{what}_{name}_{'one' if one else 'more'}"), WORK, EXACT_ORDER)


# what a thread's work is given: the tiles (T, n_blocks, R, C); xq, dx, xs; k, in; y (k, out); its tiles t0 ... t1 - 1
WORK = types.void(U8_P, INT, INT, types.CPointer(types.int8), F32_P, F32_P, INT, INT, F32_P, INT, INT, INT)
WORKS = {kind: (_work(kind, True), _work(kind, False)) for kind in EMIT}   # by KINDS' number: one row, any
# one row in 24 bits (times_24), for formats.IN_24_BITS: every type int8 runs but Q8_0, a byte a weight, whose float
# kernel (a widening load, a conversion and an FMA per 16 weights, no interleaving) read 15-17 GB/s on one thread and
# 18-26 on two where its 24-bit row read 13-15 and 17-23 (Zen 4, eight 8960 x 1536 matrices, runs in turn), in
# narrow or wide passes alike
WORKS24 = {kind: _work(kind, True, PLANES) for kind in EMIT if NAMES[kind] in IN_24_BITS} if VNNI512 else {}


def _runner(parallel: bool):
    """_run, or _run_alone on the calling thread outside numba's threading layer (as kernels._runner's)."""
    def run(work, parts, tiles, x, y, planes):
        """y (k, out) = x (k, in) @ W.T, x rounded first (to int8, or with planes = PLANES to 24 bits), in one compiled
        call (a call costs microseconds: as much as a small matrix's product): `work` (a _work's address) on `parts`
        ranges of the tiles, one a thread."""
        n_tiles, n_blocks = tiles.shape[0], tiles.shape[1]
        k, n_in = x.shape
        xq, dx, xs = np.empty((k * planes, n_in), np.int8), np.empty((k, n_in // GROUP), F32), np.empty((k, n_in // 16), F32)
        if planes == PLANES:
            _quantize24(x, xq, dx, xs)
        else:
            _quantize(x, xq, dx, xs)
        parts = max(1, min(parts, n_tiles))
        for p in prange(parts):
            call(work, (data(tiles), n_tiles, n_blocks, data(xq), data(dx), data(xs), k, n_in, data(y), y.shape[1],
                        p * n_tiles // parts, (p + 1) * n_tiles // parts))
    return njit(parallel=parallel, **EXACT_ORDER)(own_name(run, "_run" if parallel else "_run_alone"))


@njit(**JIT)
def _quantize(x, xq, dx, xs):
    """quantize_activations into xq (k, in) int8, dx (k, in / 32), xs (k, in / 16), compiled (a NumPy call
    per product cost ~30 us, more than a small matrix's product)."""
    for n in range(x.shape[0]):
        _quantize_row(x, xq, dx, xs, n, 1)


@njit(**JIT)
def _quantize24(x, xq, dx, xs):
    """quantize24 into xq (3k, in) int8 (row 3n + p: digit p of row n), dx (k, in / 32), xs (k, in / 16)."""
    for n in range(x.shape[0]):
        _quantize_row(x, xq, dx, xs, n, PLANES)


@intrinsic
def _quantize_row(typingctx, x, xq, dx, xs, n, planes):
    """Row n of _quantize as LLVM vector IR, a group of 32 inputs at a time: d = max|x| / 127, each code
    roundf(x · (1/d)) (halves away from zero: floor(|v|), plus one where the rest is >= 0.5, the sign put back),
    the codes' sums per 16. The same numbers as numba's scalar loop of int64 codes, which took 14 us for 8 rows
    of 1,536 inputs (Zen 5), run once before each product's parallel loop. With `planes` (a literal) PLANES,
    quantize24's: d = max|x| / TOP24, the codes (clamped to TOP24) stored as their three balanced base-256 digits."""
    if not isinstance(planes, types.IntegerLiteral):
        raise RequireLiteralValue("planes")

    def codegen(context, builder, sig, args):
        b = builder
        arr = lambda i: context.make_array(sig.args[i])(context, builder, args[i])
        n_in = cgutils.unpack_tuple(b, arr(0).shape, 2)[1]
        groups = b.udiv(n_in, ir.Constant(I64, GROUP))
        row, digits = args[4], planes.literal_value
        ptr = lambda i, t, width: b.gep(b.bitcast(arr(i).data, t.as_pointer()), [b.mul(row, width)])
        x_p, q_p = ptr(0, FLOAT, n_in), ptr(1, I8, b.mul(n_in, ir.Constant(I64, digits)))
        d_p, s_p = ptr(2, FLOAT, groups), ptr(3, FLOAT, b.mul(groups, ir.Constant(I64, 2)))
        f32, i32 = _vec(FLOAT, GROUP), _vec(I32, GROUP)
        fn = lambda name, ret, *ts: b.module.declare_intrinsic(name, (), ir.FunctionType(ret, list(ts)))
        fabs, floor = fn("llvm.fabs.v32f32", f32, f32), fn("llvm.floor.v32f32", f32, f32)
        copysign = fn("llvm.copysign.v32f32", f32, f32, f32)
        top_of = fn("llvm.vector.reduce.fmax.v32f32", FLOAT, f32)
        add16 = fn("llvm.vector.reduce.add.v16i32", I32, _vec(I32, 16))
        splat = lambda v: ir_splat(b, v, FLOAT, GROUP)
        zero, one, half = (ir.Constant(FLOAT, c) for c in (0.0, 1.0, 0.5))
        with cgutils.for_range(b, groups) as loop:
            g = loop.index
            at = b.mul(g, ir.Constant(I64, GROUP))
            v = b.load(b.bitcast(b.gep(x_p, [at]), f32.as_pointer()), align=4)
            d = b.fdiv(b.call(top_of, [b.call(fabs, [v])]), ir.Constant(FLOAT, 127.0 if digits == 1 else float(TOP24)))
            if digits > 1:   # a NaN in the block (which fmax passes over): its scale NaN, the outputs NaN as a float sum's
                nan = b.icmp_unsigned("!=", b.bitcast(b.fcmp_unordered("uno", v, v), ir.IntType(GROUP)), ir.Constant(ir.IntType(GROUP), 0))
                d = b.select(nan, ir.Constant(FLOAT, float("nan")), d)
            inv = b.select(b.fcmp_ordered("!=", d, zero), b.fdiv(one, d), zero)
            b.store(d, b.gep(d_p, [g]))
            v = b.fmul(v, splat(inv))
            a = b.call(fabs, [v])
            whole = b.call(floor, [a])
            q = b.fadd(whole, b.select(b.fcmp_ordered(">=", b.fsub(a, whole), splat(half)), splat(one), splat(zero)))
            q = b.fptosi(b.call(copysign, [q, v]), i32)
            c = lambda value: ir.Constant(i32, [value] * GROUP)
            if digits > 1:   # |q| <= TOP24 (x · (1/d) may round past it), then its digits, low first
                q = b.select(b.icmp_signed(">", q, c(TOP24)), c(TOP24), b.select(b.icmp_signed("<", q, c(-TOP24)), c(-TOP24), q))
            rest = q
            for p in range(digits):
                digit = b.sub(b.and_(b.add(rest, c(128)), c(255)), c(128)) if p < digits - 1 else rest
                at_p = b.add(at, b.mul(ir.Constant(I64, p), n_in))
                b.store(b.trunc(digit, _vec(I8, GROUP)), b.bitcast(b.gep(q_p, [at_p]), _vec(I8, GROUP).as_pointer()), align=1)
                rest = b.ashr(b.sub(rest, digit), c(8)) if p < digits - 1 else rest
            for h in range(2):
                part = b.shuffle_vector(q, q, ir.Constant(_vec(I32, 16), list(range(16 * h, 16 * h + 16))))
                b.store(b.sitofp(b.call(add16, [part]), FLOAT), b.gep(s_p, [b.add(b.mul(g, ir.Constant(I64, 2)), ir.Constant(I64, h))]))
        return context.get_dummy_value()
    return types.none(x, xq, dx, xs, n, planes), codegen


_run, _run_alone = _runner(True), _runner(False)


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
    """x (N, in) float32, C-contiguous, padded to the tiles' inputs, @ m.T with x rounded to int8 per block of
    32 (m a StoredMatrix of TYPES)."""
    y = np.empty((len(x), m.shape[0]), F32)
    launch(_run, _run_alone, address(WORKS[KINDS[m.type]][len(x) != 1]), m.tiles, x, y, 1)
    return y


def times_24(m, x: np.ndarray) -> np.ndarray:
    """x (1, in) float32, C-contiguous, padded to the tiles' inputs, @ m.T with x in 24 bits per block of 32
    (quantize24: exact integer sums, float32's precision; m a StoredMatrix of a type in WORKS24)."""
    y = np.empty((1, m.shape[0]), F32)
    launch(_run, _run_alone, address(WORKS24[KINDS[m.type]]), m.tiles, x, y, PLANES)
    return y


def quantize_compiled(x: np.ndarray):
    """quantize_activations by the compiled quantizer times_int8 uses: xq int8, dx, xs (per 16 inputs)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    k, n_in = x.shape
    xq, dx, xs = np.empty((k, n_in), np.int8), np.empty((k, n_in // GROUP), F32), np.empty((k, n_in // 16), F32)
    _quantize(x, xq, dx, xs)
    return xq, dx, xs


def quantize24(x: np.ndarray):
    """x (k, in) float32 -> X (k, in) int64 (|X| <= TOP24), dx (k, in/32) float32: times_24's activations, X =
    roundf(x · (1/dx)) with dx = max|x| / TOP24 per block of 32 (NaN where the block holds one), clamped."""
    blocks = x.reshape(len(x), -1, GROUP)
    with np.errstate(invalid="ignore"):
        d = (np.abs(blocks).max(axis=2) / np.float32(TOP24)).astype(np.float32)
    d[np.isnan(blocks).any(axis=2)] = np.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
        q = np.nan_to_num(_round_half_away(blocks * inv[:, :, None]))
    return np.clip(q, -TOP24, TOP24).astype(np.int64).reshape(x.shape), d


def digits24(X: np.ndarray) -> np.ndarray:
    """X (k, in) -> (k, PLANES, in) int8, its balanced base-256 digits, lowest first: X = D0 + 2^8·D1 + 2^16·D2."""
    out = []
    for _ in range(PLANES - 1):
        digit = (X + 128) % 256 - 128
        out.append(digit)
        X = (X - digit) // 256
    return np.stack(out + [X], axis=1).astype(np.int8)


def quantize24_compiled(x: np.ndarray):
    """The compiled quantizer times_24 uses: xq (PLANES·k, in) int8 (row PLANES·n + p: row n's digit p), dx, xs (the
    sums of X per 16 inputs)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    k, n_in = x.shape
    xq, dx, xs = np.empty((PLANES * k, n_in), np.int8), np.empty((k, n_in // GROUP), F32), np.empty((k, n_in // 16), F32)
    _quantize24(x, xq, dx, xs)
    return xq, dx, xs


def reference24(m, x: np.ndarray) -> np.ndarray:
    """What times_24 computes, in float64: the 24-bit activations (dx·X) times the exact weights, rounded once."""
    X, dx = quantize24(np.asarray(x, np.float32))
    rounded = (X.reshape(len(x), -1, GROUP) * dx[:, :, None].astype(np.float64)).reshape(x.shape)
    return (rounded @ m.dequantize().astype(np.float64).T).astype(np.float32)


def reference(m, x: np.ndarray) -> np.ndarray:
    """What times_int8 computes, in NumPy: the rounded activations (dx·xq) times the exact weights."""
    xq, dx, _ = quantize_activations(np.asarray(x, np.float32))
    rounded = (xq.reshape(len(x), -1, GROUP) * dx[:, :, None]).reshape(x.shape).astype(np.float32)
    return rounded @ m.dequantize().T

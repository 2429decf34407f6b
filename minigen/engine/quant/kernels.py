"""The products with a stored matrix, compiled with numba: y = x @ W.T for float32 rows x (k, in) and a
matrix W (out, in) kept in its checkpoint's own type, each weight read from memory once for all k rows.

The layout (made once at load, matrix.py): tiles of TILE = 64 outputs, each the matrix's blocks with
the outputs innermost:

    tiles[t, b, r, j]    (T, n_blocks, R, C) uint8
    block types (Q4_0 ... Q8_K): byte r of block b of output 64t + j   (R = the type's bytes per block, C = 64;
                         Q4_K, Q5_K: 4 more, their 12 bytes of 6-bit sc, m unpacked to sc[8], m[8] at 4..19)
    F16, BF16, F32:      input 32b + r of output 64t + j, its 2 or 4 bytes little-endian at j·size ...
                         (R = 32, C = 64 · size: a row viewed as uint16 / float32 is the 64 outputs)

so that byte r of 64 consecutive outputs is 64 contiguous bytes, a vector of 64 lanes. Every loop
that touches weights is innermost over the tile's 64 outputs (4 AVX-512 vectors or 8 AVX2, no horizontal sum: a
loop per output row with a reduction over its inputs ran at 2-4 GB/s here, as LLVM may not reorder a
float32 sum to vectorise it). The two nibbles of a byte are two inputs of one output, so both go to
the same accumulator; a byte is loaded once for both.

A tile is walked in units of 32 inputs (64 for Q4_K and Q5_K, whose bytes hold two groups of 32 in
their two nibbles; 128 for Q6_K, a half block, whose three byte rows hold an input of each quarter). Per unit:
- `ir_scales` computes each output's scale and offset (d, d·sc, dmin·m ...) in float32, as formats.py,
  a vector of outputs at a time (a scalar loop over the 64 outputs took as long as the unit's products:
  Q4_0's one-row int8 kernel on 8960 x 1536, one thread, 1.76 ms with it, 0.52 without; the exact 4.1 / 2.0);
- for one row (a decode step), the type's intrinsic with rows=1 adds x[unit] · w to the 64 outputs in
  the factored form llama.cpp's integer sums take, s·sum(x·code) − o·sum(x) per group (`_Unit.put`):
  the codes, made from the bytes in registers, are multiplied by x as they are, and each output's scale
  and offset applied once a unit, one multiply-add a weight fewer (Q4_K 1.6-1.7 -> 1.2 ms on the shape
  above);
- for 2 to ROWS rows (a draft, a batch of streams), the values w are made in registers, 32 outputs a pass,
  and multiplied by each row into that row's sums, also in registers (rows=2, 4 or 8: 8 rows' 16 sums, two
  values and the scales fit AVX-512's 32 registers); a few rows more are decoded again for each 8, 4, 2;
  on Zen 5, one thread against the buffer below, Q4_K 8960 x 1536 from memory: 2 rows 0.72-0.83x the time,
  4 rows 0.76x, 8 rows 0.87x (Q8_0 0.71-0.82x); a whole forward of 8 tokens of Qwen2.5-Coder-1.5B Q4_K_M
  112 -> 100 ms, where its 8-row products run at ~64 % of the two cores' FMA peak (exact products are FMA-bound
  from ~3 rows on: 8 rows cannot cost less than ~2.5 times one row's memory-bound pass);
- for more rows (a prompt), it writes the unit's values w (unit, 64) into a buffer in L1 and
  `_accumulate` adds x[:, unit] @ w to the (k, 64) accumulators, four rows at a time (a value loaded
  once serves them); so a weight is read from memory and decoded once whatever k is.
Each value w is computed exactly as formats.py computes it (every product there is exact in float32,
see its docstring), so `dequantize` here is bit-equal to formats.py. Accumulation is float32 FMAs in
the order of the inputs (for one row, of x times the codes, then the scales), which is not OpenBLAS's
order: results equal `x @ dequantize().T` to float32's rounding of a sum, not to its last digit. No
activation is rounded (that is int8.py, an option).

Each type's unit (every form, `rows` a literal) is LLVM vector IR built here (`_emit_*`, one short
function per type reading like ggml-quants.c's dequantize_row_*), because numba computes integers in
int64, which AVX2 cannot convert to float in a vector: a byte row becomes <64 x i8>, its codes <64 x i32>
(vpmovzxbd), then floats (vcvtdq2ps), accumulated with one FMA (stored: scaled with another), the 64
accumulators in 4 registers (8 with AVX2) for the whole unit. What a thread does with its tiles is compiled
for one type and one way of its rows (_work: one row, a few, many; or the values alone), the first time a
model calls it, and cached on disk; one parallel loop (_run) serves them all.

The threads: `prange` over the threads, each a contiguous range of tiles, on numba's threading layer
(OpenMP where libgomp is found: ~3 us to start a parallel region, against ~50 us for numba's own
workqueue). Its idle threads spin briefly after a kernel, as OpenBLAS's do after a product: a decode step
on stored matrices should keep OpenBLAS to one thread (parallel.blas_alone) so that the two pools do not
take each other's cores.

Which loop is innermost, and why: the tile's outputs, as lanes of vectors (16 per AVX-512 register, 8 per AVX2); over
them, a unit's inputs (the loop the IR writes), the accumulators staying in registers; over those,
units, blocks, and tiles (the parallel loop). A byte is decoded once and its value multiplied by
every row in registers; nothing is summed across lanes.

Measured on an AMD EPYC Zen 3 (2 cores, AVX2, KVM, 2026-12-04; commands and tables in
docs/weights-as-stored.md): in the same process a float32 GEMV over 933 MB (OpenBLAS, 2 threads) read
23.9 GB/s; one row of 151,936 x 1,536 from memory, Q4_K 10.1 GB/s (0.42 of that), Q6_K 8.9, Q8_0 13.2,
BF16 15.9, 2-3x faster than OpenBLAS's float32 GEMV of the same matrix but compute-bound (a conversion
and an FMA per weight on 8 lanes): all the products of a decode step of Qwen2.5-Coder-1.5B Q4_K_M take
~112 ms, where llama.cpp's whole step takes ~61 ms. On Zen 4 (AVX-512, 16 lanes) the same step's
products took 26-51 ms, against llama.cpp's whole step of ~33 ms there.
"""
from __future__ import annotations

import functools
import os
import tempfile
import threading
from contextlib import contextmanager, nullcontext

# OpenMP's idle threads spin 300,000 rounds after a kernel by default, long enough to slow an OpenBLAS
# product that follows by ~40 % (they hold the core it wants); 10,000 rounds still catch the next
# kernel of a decode step (~5 us to start one after gaps up to 100 us; 60 us after a 500 us gap).
# Read by libgomp when numba first loads it, at the first parallel call (scripts/bench_kernels.py
# --interplay). OpenBLAS's own spin: OPENBLAS_THREAD_TIMEOUT, minigen/__init__.py.
os.environ.setdefault("GOMP_SPINCOUNT", "10000")

import numba   # noqa: E402
import numpy as np   # noqa: E402


def sources_cache_dir(base: str | None = None, here=None) -> str:
    """numba's cache directory for this version of the kernels' sources: `base` (NUMBA_CACHE_DIR where the
    user set it, else ~/.cache/minigen/numba), then a hash of minigen/engine/quant/*.py and compiled.py. numba
    checks only the file of the function it loads from its cache, and int8.py's and compiled.py's kernels are
    compiled from this module's IR and formats.py's layouts: a change to those alone would leave their cached
    code stale, and a product wrong or crashing until the cache is removed. MINIGEN_AVX2=1 (the AVX2 forms on
    any CPU) has a directory of its own: numba keys its cache by the CPU, not by what minigen emits for it, so
    the two forms would otherwise load each other's code."""
    import hashlib
    from pathlib import Path
    here = Path(here or Path(__file__).resolve().parent)
    digest = hashlib.sha256()
    for path in sorted(here.glob("*.py")) + [here.parent / "compiled.py"]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    if avx2_forced():
        digest.update(b"\0MINIGEN_AVX2")
    base = base or numba.config.CACHE_DIR or str(Path.home() / ".cache" / "minigen" / "numba")
    return os.path.join(base, f"minigen-{digest.hexdigest()[:16]}")


def avx2_forced() -> bool:
    """MINIGEN_AVX2=1: compile the kernels' AVX2 forms whatever the CPU (AVX2_ONLY below)."""
    return os.environ.get("MINIGEN_AVX2", "0").strip() == "1"


def cache_is_new() -> bool:
    """Whether numba's cache for this version of the kernels holds nothing yet (the first run on this machine, or
    the first after an update): the first forward then compiles what it uses, some seconds a type."""
    from pathlib import Path
    return not any(Path(numba.config.CACHE_DIR).rglob("*.nbi"))


def writable_cache_dir(*candidates: str) -> str:
    """The first of the candidate directories that can be made and written (as root, where permissions do not
    stop a write, a path through a file still cannot be made); the last if none can."""
    for d in candidates:
        try:
            os.makedirs(d, exist_ok=True)
            if os.access(d, os.W_OK):
                return d
        except OSError:
            pass
    return candidates[-1]


# before any function below (or in int8.py, compiled.py) is compiled or loaded with cache=True; where the home
# directory cannot be written (a read-only container), the system's temporary directory
numba.config.CACHE_DIR = writable_cache_dir(sources_cache_dir(), sources_cache_dir(
    os.path.join(tempfile.gettempdir(), f"minigen-numba-{getattr(os, 'getuid', lambda: 0)()}")))
from . import formats   # noqa: E402
from .formats import UNIT_INPUTS, UNPACKED_SCALES   # noqa: E402
from llvmlite import binding, ir   # noqa: E402
from numba import carray, njit, prange, types   # noqa: E402
from numba.core.ccallback import CFunc   # noqa: E402
from numba.core import cgutils, sigutils   # noqa: E402
from numba.core.compiler import Compiler, CompilerBase, DefaultPassBuilder   # noqa: E402
from numba.core.compiler_machinery import FunctionPass, register_pass   # noqa: E402
from numba.core.errors import RequireLiteralValue   # noqa: E402
from numba.core.untyped_passes import TranslateByteCode   # noqa: E402
from numba.extending import intrinsic   # noqa: E402

TILE = 64    # outputs per tile
GROUP = 32   # inputs per group: every block type's block, or an eighth of a K super-block
F32 = np.float32
U8 = np.uint8
FAST = {"contract"}   # let LLVM fuse a*b + c into an FMA; nothing may be reordered

# each type's number in the kernels' branches, and the inputs of one unit of its tiles
KINDS = {name: i for i, name in enumerate(["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                                           "Q4_K", "Q5_K", "Q6_K", "Q8_K", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"])}
NAMES = list(KINDS)   # by number
UNIT = {name: UNIT_INPUTS.get(name, GROUP) for name in KINDS}   # inputs per unit (formats.UNIT_INPUTS)
MOST = max(UNIT.values())   # rows of a unit's buffer of values (times, dequantize)
# bytes of a tile block (R x C: the type's block, or 4 bytes more for Q4_K and Q5_K's unpacked scales, for
# 64 outputs; F32, F16, BF16: 32 inputs of 64 outputs), and units per block (32 inputs, or 256 for K types)
BLOCK_BYTES = {name: TILE * 32 * {"F32": 4, "F16": 2, "BF16": 2}[name] if name in ("F32", "F16", "BF16")
               else TILE * (formats.FORMATS[name].nbytes + (4 if name in UNPACKED_SCALES else 0)) for name in KINDS}
UNITS = {name: (formats.FORMATS[name].block if name not in ("F32", "F16", "BF16") else GROUP) // UNIT[name] for name in KINDS}
# blocks ahead of the one multiplied that the kernels ask into the cache (ir_prefetch_share): at least 2, and
# at least 16 KB on (Q8_0's 2 blocks, 4 KB, were too close once the requests were spread over the unit)
AHEAD = {name: max(2, -(-16384 // BLOCK_BYTES[name])) for name in KINDS}


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


# --- LLVM IR: one unit's values, stored or accumulated ------------------------------------------------------
# A unit is emitted as a loop over its inputs, in passes of PASS outputs: 4 pieces of LANES outputs, one
# vector register each (16 floats with AVX-512, 8 with AVX2). Per input, each piece's bytes are loaded
# (LANES at a time, zero-extended to 32 bits by vpmovzxbd), turned into codes, and their values stored, or
# the codes accumulated into two accumulators per piece taken in turn (8 independent FMA chains hide an
# FMA's latency). A loop, not straight-line code: with 32 inputs unrolled LLVM scheduled every load first
# and spilled most of what it loaded.

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
FLOAT = ir.FloatType()
# MINIGEN_AVX2=1 compiles the kernels as for a CPU with AVX2 and nothing newer (8 lanes, no VNNI): the forms
# such a CPU runs, tested on any. numba's cache keys a kernel by the CPU's name and features, not by this.
FEATURES = binding.get_host_cpu_features()
AVX2_ONLY = avx2_forced()
# a piece is one vector register: 16 floats with AVX-512 (Zen 4, Intel's server CPUs), else 8 (AVX2). On the
# Intel Xeon here 16 lanes took the one-row products of 8960 x 1536 on one thread from 1.7 to 1.2-1.6 ms
# (Q4_0, Q4_K) and 4.5 to 2.5-3.4 ms (Q6_K), as the same instructions each do twice the work
LANES = 16 if FEATURES.get("avx512f") and not AVX2_ONLY else 8
ZEN = binding.get_host_cpu_name().startswith("znver")   # AMD Zen 2-5, AVX2 or AVX-512 (matrix.blas_rows)
PASS = 4 * LANES   # outputs per pass: 4 pieces, their 8 accumulators and scales in registers
# A product of a few rows (a draft, a batch: 2 to ROWS) keeps each row's sums in registers, ROWS_PASS outputs a
# pass (2 pieces: 8 rows' 16 accumulators, the values and the scales fit AVX-512's 32 registers), the values made
# once and multiplied by every row; more rows go ROWS at a time, a prompt's through a buffer (_accumulate).
ROWS = 8 if LANES == 16 else 4
ROWS_PASS = 2 * LANES
FEW = ROWS   # up to here a product's rows go in registers (times), with AVX2 an even count only
# pieces of outputs each four rows of a prompt's product accumulate at once (_accumulate): AVX-512's 32 registers
# hold 4 x 4 accumulators, AVX2's 16 4 x 2
ACC_PIECES = 4 if LANES == 16 else 2


def _vec(t, n=LANES):
    return ir.VectorType(t, n)


def _splat_const(t, value):
    return ir.Constant(_vec(t), [value] * LANES)


def ir_splat(b, value, t, lanes: int = LANES):
    """value broadcast to <lanes x t>."""
    v = b.insert_element(ir.Constant(_vec(t, lanes), ir.Undefined), value, ir.Constant(I32, 0))
    return b.shuffle_vector(v, v, ir.Constant(_vec(I32, lanes), [0] * lanes))


def ir_bits(b, v, shift, mask: int, t, lanes: int = LANES):
    """(v >> shift) & mask of a <lanes x i8> vector, widened to <lanes x t> (shift: a Python int or an IR i64)."""
    v = b.zext(v, _vec(t, lanes))
    amount = ir.Constant(_vec(t, lanes), [shift] * lanes) if isinstance(shift, int) else ir_splat(b, b.trunc(shift, t), t, lanes)
    return b.and_(b.lshr(v, amount), ir.Constant(_vec(t, lanes), [mask] * lanes))


def ir_half(b, lo, hi):
    """Two byte rows <n x i8> (low, high byte) of little-endian float16s -> <n x float> (exact; vcvtph2ps)."""
    n = lo.type.count
    i16 = ir.VectorType(I16, n)
    bits = b.or_(b.zext(lo, i16), b.shl(b.zext(hi, i16), ir.Constant(i16, [8] * n)))
    return b.fpext(b.bitcast(bits, ir.VectorType(ir.HalfType(), n)), ir.VectorType(FLOAT, n))


def ir_scales(b, kind: str, row, u, part: int = 0) -> list:
    """[s, o, s2, o2]: each output's scale and offset for unit u (an IR i64) of a block of type `kind`, s, o
    for its first group (Q4_K, Q5_K: the low nibbles; Q6_K, Q2_K, Q3_K: inputs 0..15 of the group), s2, o2 for
    its second, None where the type has none; from the block's byte rows (row(r) -> <n x i8>, r an int or an
    IR i64), in float32 as formats.py computes them (each product exact, so bit-equal to it)."""
    n = row(0).type.count
    vec = lambda t: ir.VectorType(t, n)
    i64 = lambda v: ir.Constant(I64, v) if isinstance(v, int) else v
    add = lambda *t: functools.reduce(b.add, [i64(v) for v in t])
    unsigned = lambda v: b.uitofp(v, vec(FLOAT))
    signed = lambda v, t=I8: b.sitofp(b.sext(v, vec(I32)) if t.width < 32 else v, vec(FLOAT))
    half = lambda r: ir_half(b, row(r), row(r + 1))
    if kind in ("F32", "F16", "BF16"):
        return [None] * 4
    if kind in ("Q4_0", "Q5_0", "Q8_0", "IQ4_NL"):                                 # d
        return [half(0), None, None, None]
    if kind in ("Q4_1", "Q5_1"):                                                     # d, m
        return [half(0), half(2), None, None]
    if kind in ("Q4_K", "Q5_K"):   # groups 2u, 2u + 1: d·sc, dmin·m, sc and m unpacked at load (rows 4 + g, 12 + g)
        g = b.mul(u, i64(2))
        d, dmin = half(0), half(2)
        return [v for k in (0, 1) for v in (b.fmul(d, unsigned(row(add(g, 4 + k)))), b.fmul(dmin, unsigned(row(add(g, 12 + k)))))]
    if kind == "Q6_K":       # unit u = half h, inputs 16·part ... of each quarter r: d·sc[8h + 2r + part], r = 0..3
        d = half(208)
        return [b.fmul(d, signed(row(add(b.mul(u, i64(8)), 192 + 2 * r + part)))) for r in range(4)]
    if kind == "Q8_K":       # d, float32
        bits = functools.reduce(b.or_, [b.shl(b.zext(row(k), vec(I32)), ir.Constant(vec(I32), [8 * k] * n)) for k in range(4)])
        return [b.bitcast(bits, vec(FLOAT)), None, None, None]
    if kind == "Q2_K":       # group u's halves of 16: scale bytes 2u, 2u + 1 (sc in the low nibble, m in the high)
        d, dmin = half(80), half(82)
        out = []
        for k in (0, 1):
            v = row(add(b.mul(u, i64(2)), k))
            out += [b.fmul(d, unsigned(ir_bits(b, v, 0, 15, I32, n))), b.fmul(dmin, unsigned(ir_bits(b, v, 4, 15, I32, n)))]
        return out
    if kind == "Q3_K":       # scales 2u, 2u + 1 of 16: 4 bits in byte 96 + i % 8 (low nibble for i < 8), 2 in
        d = half(108)        # byte 104 + i % 4 at bits 2·(i // 4) (formats.scales_q3_k)
        out = []
        for k in (0, 1):
            i = add(b.mul(u, i64(2)), k)
            low = ir_bits(b, row(b.add(i64(96), b.and_(i, i64(7)))), b.mul(b.lshr(i, i64(3)), i64(4)), 15, I32, n)
            high = ir_bits(b, row(b.add(i64(104), b.and_(i, i64(3)))), b.mul(b.lshr(i, i64(2)), i64(2)), 3, I32, n)
            sc = b.sub(b.or_(low, b.shl(high, ir.Constant(vec(I32), [4] * n))), ir.Constant(vec(I32), [32] * n))
            out += [b.fmul(d, signed(sc, I32)), None]
        return out
    if kind == "IQ4_XS":     # d·(sc − 32): 4 bits in nibble u % 2 of byte 4 + u // 2, 2 in bits 2u of the u16 at 2
        low = ir_bits(b, row(b.add(i64(4), b.lshr(u, i64(1)))), b.mul(b.and_(u, i64(1)), i64(4)), 15, I32, n)
        word = b.or_(b.zext(row(2), vec(I32)), b.shl(b.zext(row(3), vec(I32)), ir.Constant(vec(I32), [8] * n)))
        high = b.and_(b.lshr(word, ir_splat(b, b.trunc(b.mul(u, i64(2)), I32), I32, n)), ir.Constant(vec(I32), [3] * n))
        sc = b.sub(b.or_(low, b.shl(high, ir.Constant(vec(I32), [4] * n))), ir.Constant(vec(I32), [32] * n))
        return [b.fmul(half(0), signed(sc, I32)), None, None, None]
    raise ValueError(kind)


def ir_prefetch_share(b, base, kind: str, u, step, steps: int):
    """Step `step` (an IR i64) of `steps` over unit u of a tile block of type `kind` at `base` (i8*)
    asks its share of the 64-byte lines of the block AHEAD blocks on into the cache (llvm.prefetch, read,
    into L2), spread over the steps so that a product streaming its matrix from memory neither waits for
    each line (on the Intel Xeon here one row of a 17,920 x 1,536 Q4_K matrix read from memory took 7.1 ms on
    two threads without prefetching, 3.3 ms with) nor stalls on a burst of requests at a unit's start: Q6_K's
    151,936 x 1,536 on two threads (AMD Zen 4), 7.8 ms with a unit's share asked for at once before it, 5.4 ms
    spread (36 GB/s, as fast as OpenBLAS's float32 GEMV reads). The tiles are one C-contiguous array, so the
    block ahead is the next tile's near the end of one; past the last, a prefetch is a hint, which does not
    fault."""
    i64 = lambda v: ir.Constant(I64, v)
    lines = -(-BLOCK_BYTES[kind] // (64 * UNITS[kind]))                # a unit's share of the block, in lines
    k = -(-lines // steps)                                             # lines per step, at most
    pf = b.module.declare_intrinsic("llvm.prefetch", [I8.as_pointer()],
                                    ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32]))
    lo = b.add(i64(AHEAD[kind] * BLOCK_BYTES[kind]), b.mul(u, i64(64 * lines)))
    ask = lambda line: b.call(pf, [b.gep(base, [b.add(lo, b.mul(line, i64(64)))]), ir.Constant(I32, 0),
                                   ir.Constant(I32, 2), ir.Constant(I32, 1)])
    for j in range(k):                    # step s asks for lines s, s + steps, ...: each line once
        line = b.add(step, i64(j * steps))
        if (j + 1) * steps <= lines:
            ask(line)
        else:
            with b.if_then(b.icmp_unsigned("<", line, i64(lines))):
                ask(line)


class _Unit:
    """IR for one pass over one unit of one tile block: the pieces' byte rows, codes and scales, and
    where each value w of input l goes (`put`: a buffer row, or accumulated as x[l]·w)."""

    def __init__(self, context, builder, argtypes, args, kind: str, rows: int, pieces):
        self.b = b = builder
        arr = lambda i: context.make_array(argtypes[i])(context, builder, args[i])
        stride = lambda i: b.udiv(cgutils.unpack_tuple(b, arr(i).strides, 2)[0], ir.Constant(I64, 4))   # in floats
        self.base = b.bitcast(arr(0).data, I8.as_pointer())
        self.u = args[1]
        self.pieces = pieces                          # first output of each piece
        self.width = len(pieces) * LANES              # outputs in this pass
        self.x = b.bitcast(arr(2).data, FLOAT.as_pointer())
        self.xs = b.bitcast(arr(3).data, FLOAT.as_pointer())   # x's sums over each 16 inputs (sums16)
        self.x0 = args[4]
        self.out = b.bitcast(arr(5).data, FLOAT.as_pointer())
        if rows != 1:   # out (inputs, 64): a unit's buffer, or its rows of dequantize's out_t; or (rows, 64) sums
            self.stride = stride(5)
        if rows > 1:    # x (rows, in)
            self.x_stride = stride(2)
        self.kind, self.rows, self.dot = kind, rows, rows == 1
        self.fma = b.module.declare_intrinsic(f"llvm.fma.v{LANES}f32", (), ir.FunctionType(_vec(FLOAT), [_vec(FLOAT)] * 3))

    def start(self, part: int):
        """Before the loop over part `part` of the unit's inputs (most types have one): its scales, and (dot)
        fresh accumulators acc[piece][turn] (sums of x · code), in allocas LLVM keeps in registers."""
        b = self.b
        self.part = part
        # scales[k][piece]: s, o, s2, o2 (ir_scales) of each piece's outputs
        per_piece = [ir_scales(b, self.kind, lambda r, j=j: self.load(self.row_base(r, I8), j, I8), self.u, part)
                     for j in self.pieces]
        self.scales = [[p[k] for p in per_piece] for k in range(len(per_piece[0]))]
        zero = lambda: cgutils.alloca_once_value(b, ir.Constant(_vec(FLOAT), [0.0] * LANES))
        if self.dot:
            self.acc = [[zero() for _ in range(4)] for _ in self.pieces]
            self.forms = {}   # turn -> (scale, offset, plus) of its codes, as put() was given them
        elif self.rows > 1:   # each row's sums of x · w, one per piece
            self.sums = [[zero() for _ in self.pieces] for _ in range(self.rows)]

    def i64(self, v):
        return ir.Constant(I64, v) if isinstance(v, int) else v

    def add(self, *terms):
        total = self.i64(terms[0])
        for t in terms[1:]:
            total = self.b.add(total, self.i64(t))
        return total

    def mul(self, a, k: int):
        return self.b.mul(self.i64(a), ir.Constant(I64, k))

    def load(self, ptr, at, t):
        p = self.b.gep(ptr, [self.i64(at)])
        return self.b.load(self.b.bitcast(p, _vec(t).as_pointer()), align=1)

    def row_base(self, r, t):
        """Where row r of the block begins, as a pointer to t."""
        size = t.width // 8 if isinstance(t, ir.IntType) else 4
        return self.b.bitcast(self.b.gep(self.base, [self.mul(r, TILE * size)]), t.as_pointer())

    def row(self, r, t=I8):
        """Row r of the block, one <LANES x t> per piece (t: i8 for block types; i16 / float for F16, BF16, F32)."""
        base = self.row_base(r, t)
        return [self.load(base, j, t) for j in self.pieces]

    def prefetch(self, step0: int, l, steps: int):
        """Step step0 + l of the unit's `steps`: ir_prefetch_share."""
        ir_prefetch_share(self.b, self.base, self.kind, self.u, self.b.add(self.i64(step0), l), steps)

    def row_all(self, r):
        """Row r of the block at the pass's outputs, one <width x i8> (byte arithmetic on all pieces at once)."""
        return self.b.load(self.b.bitcast(self.b.gep(self.row_base(r, I8), [self.i64(self.pieces[0])]),
                                          ir.VectorType(I8, self.width).as_pointer()), align=1)

    def split(self, v):
        """<width x t> (bytes, or a comparison's bits) -> one <LANES x t> per piece."""
        return [self.b.shuffle_vector(v, v, ir.Constant(_vec(I32), list(range(k * LANES, (k + 1) * LANES))))
                for k in range(len(self.pieces))]

    def bytes(self, v):
        """A constant <width x i8>."""
        return ir.Constant(ir.VectorType(I8, self.width), [v] * self.width)

    def nibbles(self, v):
        """The low and high nibbles of <width x i8> bytes, each <width x i8>."""
        return self.b.and_(v, self.bytes(15)), self.b.lshr(v, self.bytes(4))

    def fifth_bit(self, v, bit):
        """16 where bit `bit` (an IR i64) of a byte of <width x i8> is set, else 0: a fifth bit in place."""
        b = self.b
        mask = ir_splat(b, b.trunc(b.shl(self.i64(1), bit), I8), I8, self.width)
        return b.select(b.icmp_unsigned("!=", b.and_(v, mask), self.bytes(0)), self.bytes(16), self.bytes(0))

    def floats(self, codes):
        """<width x i8> unsigned codes -> one <LANES x float> per piece (exact)."""
        return [self.float(self.b.zext(v, _vec(I32))) for v in self.split(codes)]

    def splat(self, value, t):
        return ir_splat(self.b, value, t)

    def bits(self, v, shift, mask):
        """(v >> shift) & mask for a piece <LANES x i8> (shift: a Python int or an IR i64), as <LANES x i32>."""
        return ir_bits(self.b, v, shift, mask, I32)

    def float(self, code):
        """A code <LANES x i32> as float (exact: |code| < 2^24)."""
        return self.b.sitofp(code, _vec(FLOAT))

    def put(self, l, codes, turn=0, scale=None, offset=None, plus=False, span=None):
        """Input l of the unit (an IR i64) has codes (one <LANES x float> per piece, exact integers or a table's
        values) whose weights are w = scale·code (scale: one vector per piece; None: w = code), less `offset`:
        per-piece vectors o (w = scale·code − o, one rounding: an FMA; plus: + o) or an int k (w = scale·(code − k),
        exact). Scale and offset vectors are the unit's (made before its loop: finish() uses them after it).
        Stored, w is computed so (formats.py's values, bit for bit). Multiplied (dot), the unit's sum is
        factored as llama.cpp's integer sums are: x · code is added to the turn's accumulators, and finish()
        applies the scale and offset once a unit, sum(x w) = scale·sum(x code) − offset·sum(x) (one
        multiply-add a weight fewer; the same sum to float32's rounding), sum(x) over the turn's inputs, its
        `span` (first input in the unit, count: 16 or 32), read from x's sums per 16 inputs (`sums16`, made
        once a product: summed here in the loop, 4 scalar sums held 4 of AVX2's 16 registers and pushed
        accumulators to the stack: one row of 8960 x 1536 on one thread, Zen 3, Q4_K 1.13 -> 0.95 ms, Q4_1
        1.18 -> 1.00, Q5_K 2.50 -> 2.24). A turn's scale and offset are the same for every input of a unit
        (each turn is one group, or half of one)."""
        b = self.b
        if self.dot:
            self.forms.setdefault(turn, (scale, offset, plus, span))
            x = self.splat(b.load(b.gep(self.x, [b.add(self.x0, l)])), FLOAT)
            for c, acc in zip(codes, self.acc):
                b.store(b.call(self.fma, [x, c, b.load(acc[turn])]), acc[turn])
            return
        ws = [self.value(piece, c, scale, offset, plus) for piece, c in enumerate(codes)]
        if self.rows > 1:   # each row's x[l] times the values, in registers
            for r, sums in enumerate(self.sums):
                at = b.add(b.mul(self.i64(r), self.x_stride), b.add(self.x0, l))
                x = self.splat(b.load(b.gep(self.x, [at])), FLOAT)
                for w, total in zip(ws, sums):
                    b.store(b.call(self.fma, [x, w, b.load(total)]), total)
            return
        for j, w in zip(self.pieces, ws):
            at = b.gep(self.out, [self.add(b.mul(self.i64(l), self.stride), j)])
            b.store(w, b.bitcast(at, _vec(FLOAT).as_pointer()), align=4)

    def value(self, piece: int, c, scale, offset, plus: bool):
        """A piece's weights w from its codes c, as put() says, exactly as formats.py computes them."""
        b = self.b
        if scale is None:
            return c
        if offset is None:
            return b.fmul(scale[piece], c)
        if isinstance(offset, int):
            return b.fmul(scale[piece], b.fsub(c, _splat_const(FLOAT, float(offset))))
        return b.call(self.fma, [scale[piece], c, offset[piece] if plus else b.fneg(offset[piece])])

    def x_sum(self, start: int, n: int):
        """The sum of x over the unit's inputs start ... start + n - 1 (n: 16 or 32), from sums16."""
        b = self.b
        at = b.lshr(b.add(self.x0, ir.Constant(I64, start)), ir.Constant(I64, 4))
        total = b.load(b.gep(self.xs, [at]))
        for k in range(1, n // 16):
            total = b.fadd(total, b.load(b.gep(self.xs, [b.add(at, ir.Constant(I64, k))])))
        return total

    def finish(self):
        """out += each turn's sum(x w), from its accumulators (put's factored form), or each row's sums."""
        b = self.b
        if self.rows > 1:
            for r, sums in enumerate(self.sums):
                for j, total in zip(self.pieces, sums):
                    at = b.bitcast(b.gep(self.out, [self.add(b.mul(self.i64(r), self.stride), j)]), _vec(FLOAT).as_pointer())
                    b.store(b.fadd(b.load(at, align=4), b.load(total)), at, align=4)
            return
        if not self.dot:
            return
        for piece, (j, acc) in enumerate(zip(self.pieces, self.acc)):
            at = b.bitcast(b.gep(self.out, [ir.Constant(I64, j)]), _vec(FLOAT).as_pointer())
            total = b.load(at, align=4)
            for turn, (scale, offset, plus, span) in sorted(self.forms.items()):
                a = b.load(acc[turn])
                if offset is not None and span is None:
                    raise ValueError(f"{self.kind}: an offset's turn needs the span of its inputs")
                xs = self.splat(self.x_sum(*span), FLOAT) if offset is not None else None
                if scale is None:
                    total = b.fadd(total, a)
                    continue
                if isinstance(offset, int):   # scale·(A − k·X)
                    a = b.fsub(a, b.fmul(_splat_const(FLOAT, float(offset)), xs))
                value = b.fmul(scale[piece], a)
                if offset is not None and not isinstance(offset, int):   # scale·A ∓ o·X
                    value = (b.fadd if plus else b.fsub)(value, b.fmul(offset[piece], xs))
                total = b.fadd(total, value)
            b.store(total, at, align=4)


def _kernel(kind: str, emit, count: int, doc: str, parts: int = 1):
    """The IR of one type's unit, generate(context, builder, argtys, args, n) for the arguments (blk, u, x, xs,
    x0, out) and n rows (_unit's `rows`): 0, store the unit's values into out (inputs, 64); 1, add x · them to
    out (64,) (put's factored form); 2 ... ROWS, add x[r] · them to out[r] (rows, 64) for each row r of x
    (rows, in). For each pass of PASS outputs (ROWS_PASS with rows > 1: their sums stay in registers) and each
    of the unit's `parts`, their scales (ir_scales), then a loop of `count` steps, each emit(unit, l) for l =
    its index (an IR i64; unit.part says which part)."""
    def generate(context, builder, argtys, args, n):
        width = ROWS_PASS if n > 1 else PASS
        for first in range(0, TILE, width):
            unit = _Unit(context, builder, argtys, args, kind, n, range(first, first + width, LANES))
            for part in range(parts):
                unit.start(part)
                with cgutils.for_range(builder, ir.Constant(I64, count)) as loop:
                    emit(unit, loop.index)
                    if first == 0:
                        unit.prefetch(part * count, loop.index, count * parts)
                unit.finish()
    generate.kind, generate.__doc__ = kind, doc
    return generate


def _emit_floats(u: _Unit, l, kind: str):
    """F32, F16, BF16: row l of the block is input l of the 64 outputs."""
    b = u.b
    if kind == "F32":
        ws = u.row(l, FLOAT)
    elif kind == "F16":
        ws = [b.fpext(b.bitcast(v, _vec(ir.HalfType())), _vec(FLOAT)) for v in u.row(l, I16)]
    else:   # bfloat16 is the high half of a float32
        ws = [b.bitcast(b.shl(b.zext(v, _vec(I32)), _splat_const(I32, 16)), _vec(FLOAT)) for v in u.row(l, I16)]
    u.put(l, ws)


def _emit_legacy(u: _Unit, l, row_qh: int, row_qs: int, offset: int, has_m: bool):
    """Q4_0, Q4_1, Q5_0, Q5_1 (l < 16): qs byte l holds inputs l (low nibble) and l + 16 (high); Q5's qh
    bit i (byte i // 8, bit i % 8) is input i's fifth bit. w = d·(q − offset), or d·q + m."""
    b = u.b
    if row_qh:   # the codes as bytes for all pieces at once, then widened (variable shifts on i32 took 1.2-1.4x)
        lo, hi = u.nibbles(u.row_all(u.add(row_qs, l)))
        byte, bit = b.lshr(l, u.i64(3)), b.and_(l, u.i64(7))
        lo = u.floats(b.or_(lo, u.fifth_bit(u.row_all(u.add(row_qh, byte)), bit)))
        hi = u.floats(b.or_(hi, u.fifth_bit(u.row_all(u.add(row_qh + 2, byte)), bit)))
    else:        # per piece: a byte widened once for both nibbles (as bytes, 1.1x the time)
        qs = u.row(u.add(row_qs, l))
        lo, hi = [u.float(u.bits(v, 0, 15)) for v in qs], [u.float(u.bits(v, 4, 15)) for v in qs]
    d, m = u.scales[0], u.scales[1]
    for turn, (i, codes) in enumerate(((l, lo), (u.add(l, 16), hi))):
        u.put(i, codes, turn, d, m if has_m else offset, plus=has_m, span=(16 * turn, 16))


def _emit_q8(u: _Unit, l, row_qs: int):
    """Q8_0 (one block of 32) and Q8_K (unit u of 8): w = d·q, q int8."""
    b = u.b
    first = u.add(row_qs, u.mul(u.u, GROUP)) if row_qs == 4 else u.i64(row_qs)
    qs = u.row(b.add(first, l))
    u.put(l, [b.sitofp(b.sext(v, _vec(I32)), _vec(FLOAT)) for v in qs], 0, u.scales[0])


def _emit_k45(u: _Unit, l, row_qs: int, fifth: bool):
    """Q4_K, Q5_K, unit c = groups 2c, 2c + 1: qs byte row_qs + 32c + l holds input l of group 2c (low
    nibble) and of 2c + 1 (high); Q5_K's qh byte 20 + l, bit g: the fifth bit of input l of group g (the
    tiles' rows: the file's, 4 on from byte 16, where sc[8] and m[8] are unpacked; formats.UNPACKED_SCALES).
    w = (d·sc)·q − dmin·m, i.e. fma(s, q, −o) (s·q is exact, so fused or not it rounds once)."""
    b = u.b
    at = u.add(u.mul(u.u, 32), row_qs, l)
    if fifth:   # as bytes for all pieces at once, then widened (as _emit_legacy)
        (lo, hi), qh, g = u.nibbles(u.row_all(at)), u.row_all(u.add(20, l)), u.mul(u.u, 2)
        lo, hi = u.floats(b.or_(lo, u.fifth_bit(qh, g))), u.floats(b.or_(hi, u.fifth_bit(qh, b.add(g, u.i64(1)))))
    else:
        qs = u.row(at)
        lo, hi = [u.float(u.bits(v, 0, 15)) for v in qs], [u.float(u.bits(v, 4, 15)) for v in qs]
    for turn, (i, codes, s, o) in enumerate(((l, lo, 0, 1), (u.add(l, 32), hi, 2, 3))):
        u.put(i, codes, turn, u.scales[s], u.scales[o], span=(32 * turn, 32))


def _emit_q6(u: _Unit, l):
    """Q6_K, unit h = half h (128 inputs, quarters r = 0..3 of 32), part p: inputs 32r + 16p + l (l < 16).
    Input i of quarter r has its low 4 bits in ql byte 64h + 32(r % 2) + i (low nibble for r < 2, high for
    r >= 2), its high 2 bits in qh byte 128 + 32h + i, bits 2r, 2r + 1: three byte rows hold one input of
    each quarter, combined into codes as bytes for the PASS outputs at once, then widened per piece.
    w = (d·sc)·(q − 32), sc the scale of inputs 16·(2r + p) ... of the half (u.scales[r])."""
    b = u.b
    i = u.add(l, 16 * u.part)
    ql = u.add(u.mul(u.u, 64), i)
    a, c, qh = u.row_all(ql), u.row_all(u.add(ql, 32)), u.row_all(u.add(u.mul(u.u, 32), 128, i))
    high = lambda shift: b.and_(b.shl(qh, u.bytes(4 - shift)) if shift < 4 else b.lshr(qh, u.bytes(shift - 4)), u.bytes(48))
    (a_lo, a_hi), (c_lo, c_hi) = u.nibbles(a), u.nibbles(c)
    codes = [b.or_(a_lo, high(0)), b.or_(c_lo, high(2)), b.or_(a_hi, high(4)), b.or_(c_hi, high(6))]
    for r, code in enumerate(codes):
        u.put(u.add(i, 32 * r), u.floats(code), r, u.scales[r], 32, span=(32 * r + 16 * u.part, 16))


def _emit_k23(u: _Unit, l, third: bool):
    """Q2_K, Q3_K, unit g (inputs 32g .. 32g + 31 of the super-block, half h = g // 4, field f = g % 4):
    input 16·p + l (l < 16, p = 0, 1) has its 2-bit code in bits 2f, 2f + 1 of qs byte 32h + 16p + l
    (qs at 16 in Q2_K, 32 in Q3_K); Q3_K's third bit is bit g of hmask byte 16p + l. w = fma(s, q, −o)
    (Q2_K: (d·sc)·q − dmin·m) or (d·sc)·(q − 4) (Q3_K), each product exact."""
    b = u.b
    h, f = b.lshr(u.u, u.i64(2)), b.and_(u.u, u.i64(3))
    for p in (0, 1):
        i = u.add(l, 16 * p)
        codes = [u.bits(v, u.mul(f, 2), 3) for v in u.row(u.add(32 if third else 16, u.mul(h, 32), i))]
        if third:   # bit g of the hmask bytes tested for all pieces at once, a code's third bit set where it is (the bit
            # moved into place per piece, 5 operations of i32 lanes, took Q3_K to 1.8-2.0x Q4_K's time, now 1.3-1.6x)
            bit = ir_splat(b, b.trunc(b.shl(u.i64(1), u.u), I8), I8, u.width)
            on = u.split(b.icmp_unsigned("!=", b.and_(u.row_all(i), bit), u.bytes(0)))
            codes = [b.select(o, b.or_(c, _splat_const(I32, 4)), c) for c, o in zip(codes, on)]
        u.put(i, [u.float(q) for q in codes], p, u.scales[2 * p], 4 if third else u.scales[2 * p + 1], span=(16 * p, 16))


def _iq4_values(u: _Unit, codes):
    """formats.IQ4_VALUES[code] for the pass's codes <width x i8> (0..15), as one <LANES x float> per piece
    (exact): looked up as int8 by ir_table16, then widened. Zen 5, 8960 x 1536 IQ4_XS (bench_kernels.py): one
    row 1.35 -> 0.43 ms, 8 rows 3.76 -> 1.24 against the selects on each piece's float lanes that were here."""
    values = ir_table16(u.b, codes, [int(v) for v in formats.IQ4_VALUES])
    return [u.float(u.b.sext(v, _vec(I32))) for v in u.split(values)]


def ir_table16(b, codes, table: list):
    """table[code] for codes <n x i8> (0..15; n a multiple of 16), <n x i8>: a byte shuffle looks the 16
    entries up, 16 to 64 bytes an instruction (`pshufb`: SSSE3, AVX2, AVX-512BW), as llama.cpp's IQ4 kernels
    do; elsewhere a tree of 15 selects per byte (portable IR)."""
    n = codes.type.count
    row = lambda v: ir.Constant(ir.VectorType(I8, n), [v] * n)
    size = next((k for k in sorted(SHUFFLE, reverse=True) if n % k == 0 and FEATURES.get(SHUFFLE[k][0])
                 and not (AVX2_ONLY and k == 64)), None)
    if size is None:
        level = [row(v) for v in table]
        for bit in range(4):
            on = b.icmp_unsigned("!=", b.and_(codes, row(1 << bit)), row(0))
            level = [b.select(on, level[2 * k + 1], level[2 * k]) for k in range(len(level) // 2)]
        return level[0]
    t = ir.VectorType(I8, size)
    fn = b.module.declare_intrinsic(SHUFFLE[size][1], (), ir.FunctionType(t, [t, t]))
    lookup = ir.Constant(t, [table[i % 16] for i in range(size)])   # the table in each 16-byte lane
    take = lambda x, y, k, m: b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, m), list(range(k, k + m))))
    parts = [b.call(fn, [lookup, codes if n == size else take(codes, codes, k, size)]) for k in range(0, n, size)]
    while len(parts) > 1:   # joined two at a time
        parts = [take(x, y, 0, 2 * x.type.count) for x, y in zip(parts[::2], parts[1::2])]
    return parts[0]


# the byte shuffle of each width: the CPU feature it needs, its LLVM intrinsic
SHUFFLE = {64: ("avx512bw", "llvm.x86.avx512.pshuf.b.512"), 32: ("avx2", "llvm.x86.avx2.pshuf.b"),
           16: ("ssse3", "llvm.x86.ssse3.pshuf.b.128")}


def _emit_iq4(u: _Unit, l, xs: bool):
    """IQ4_NL (qs at byte 2), IQ4_XS unit g (its 16 bytes at 8 + 16g): byte l holds inputs l (low nibble) and
    l + 16 (high), as Q4_0's. w = s·values[q] (s = d, or d·(sc − 32)), exact."""
    qs = u.row_all(u.add(u.mul(u.u, 16), 8, l) if xs else u.add(2, l))
    for turn, (i, codes) in enumerate(zip((l, u.add(l, 16)), u.nibbles(qs))):
        u.put(i, _iq4_values(u, codes), turn, u.scales[0])


# each type's IR by its number in KINDS
KERNELS = (
    _kernel("F32", lambda u, l: _emit_floats(u, l, "F32"), GROUP, "F32"),
    _kernel("F16", lambda u, l: _emit_floats(u, l, "F16"), GROUP, "F16"),
    _kernel("BF16", lambda u, l: _emit_floats(u, l, "BF16"), GROUP, "BF16"),
    _kernel("Q4_0", lambda u, l: _emit_legacy(u, l, 0, 2, 8, False), 16, "Q4_0: d, qs[16]"),
    _kernel("Q4_1", lambda u, l: _emit_legacy(u, l, 0, 4, 0, True), 16, "Q4_1: d, m, qs[16]"),
    _kernel("Q5_0", lambda u, l: _emit_legacy(u, l, 2, 6, 16, False), 16, "Q5_0: d, qh[4], qs[16]"),
    _kernel("Q5_1", lambda u, l: _emit_legacy(u, l, 4, 8, 0, True), 16, "Q5_1: d, m, qh[4], qs[16]"),
    _kernel("Q8_0", lambda u, l: _emit_q8(u, l, 2), GROUP, "Q8_0: d, qs[32]"),
    _kernel("Q4_K", lambda u, l: _emit_k45(u, l, 20, False), GROUP, "Q4_K: d, dmin, sc[8], m[8], qs[128]"),
    _kernel("Q5_K", lambda u, l: _emit_k45(u, l, 52, True), GROUP, "Q5_K: d, dmin, sc[8], m[8], qh[32], qs[128]"),
    _kernel("Q6_K", _emit_q6, 16, "Q6_K: ql[128], qh[64], scales[16], d", parts=2),
    _kernel("Q8_K", lambda u, l: _emit_q8(u, l, 4), GROUP, "Q8_K: d (f32), qs[256], bsums[16]"),
    _kernel("Q2_K", lambda u, l: _emit_k23(u, l, False), 16, "Q2_K: scales[16], qs[64], d, dmin"),
    _kernel("Q3_K", lambda u, l: _emit_k23(u, l, True), 16, "Q3_K: hmask[32], qs[64], scales[12], d"),
    _kernel("IQ4_NL", lambda u, l: _emit_iq4(u, l, False), 16, "IQ4_NL: d, qs[16]"),
    _kernel("IQ4_XS", lambda u, l: _emit_iq4(u, l, True), 16, "IQ4_XS: d, scales_h, scales_l[4], qs[128]"),
)
assert [g.kind for g in KERNELS] == list(KINDS)


@intrinsic
def _unit(typingctx, kind, rows, blk, u, x, xs, x0, out):
    """Unit u of a tile block of type number `kind`, its values into out (unit, 64), or x[x0:] · them added to
    out (_kernel's `rows`). Both literals: a thread's work is compiled for one type (_work), so that a model's
    first run compiles the types it has, not all sixteen."""
    if not isinstance(kind, types.IntegerLiteral):
        raise RequireLiteralValue("kind")
    if not isinstance(rows, types.IntegerLiteral):
        raise RequireLiteralValue("rows")   # numba types the call again with its literal value

    def codegen(context, builder, sig, args):
        KERNELS[kind.literal_value](context, builder, sig.args[2:], args[2:], rows.literal_value)
        return context.get_dummy_value()
    return types.none(kind, rows, blk, u, x, xs, x0, out), codegen


# --- the product ------------------------------------------------------------------------------------------

@intrinsic
def _accumulate(typingctx, acc, x, i0, w, n_in):
    """acc (k, 64) += x[:, i0:i0 + n_in] @ w[:n_in] (w: a unit's values, (inputs, 64)), as LLVM IR: four
    rows at a time over ACC_PIECES pieces of outputs, their accumulators in registers across the unit's
    inputs, so that each piece of w loaded from L1 serves four rows and no accumulator goes through memory
    (as numba's loop did, 3 loads and 2 stores per 8 FMAs); the 1-3 rows left two at a time over PASS
    outputs, an odd last row over all 64. On AVX2 four rows by two pieces rather than two by four (AMD Zen 3,
    one thread, 256 rows of SmolLM2's 3072 x 576 Q4_1: 10.2-10.3 ms against 11.5-11.7, as fast as OpenBLAS's
    GEMM of the float32 values, 10.1-10.4; 3 rows by 4 pieces spill, 2.5x slower); with AVX-512 four by four,
    a piece of x broadcast serving 4 pieces of w (Zen 5, two threads, 8960 x 1536 at 512 rows: Q4_K 39.8 ->
    34.1 ms, Q6_K 41.3 -> 33.9, Q4_1 44.8 -> 34.8, ~85 % of the FMA peak; 5 or 6 rows by 4 pieces no faster)."""
    def codegen(context, builder, sig, args):
        b = builder
        arr = lambda i: context.make_array(sig.args[i])(context, builder, args[i])
        acc_a, x_a, w_a = arr(0), arr(1), arr(3)
        k = cgutils.unpack_tuple(b, acc_a.shape, 2)[0]
        x_row = cgutils.unpack_tuple(b, x_a.shape, 2)[1]
        acc_p, x_p, w_p = (b.bitcast(a.data, FLOAT.as_pointer()) for a in (acc_a, x_a, w_a))
        fma = b.module.declare_intrinsic(f"llvm.fma.v{LANES}f32", (), ir.FunctionType(_vec(FLOAT), [_vec(FLOAT)] * 3))
        i64 = lambda v: ir.Constant(I64, v)

        def vec_at(ptr, at):
            return b.bitcast(b.gep(ptr, [at]), _vec(FLOAT).as_pointer())

        def block(rows, first_out, n_pieces):
            """rows (IR i64 row numbers) x n_pieces pieces from first_out: acc += x @ w."""
            cells = [(r, first_out + LANES * q) for r in rows for q in range(n_pieces)]
            slots = [cgutils.alloca_once(b, _vec(FLOAT)) for _ in cells]
            for slot, (r, j) in zip(slots, cells):
                b.store(b.load(vec_at(acc_p, b.add(b.mul(r, i64(TILE)), i64(j))), align=4), slot)
            with cgutils.for_range(b, args[4]) as loop:
                i = loop.index
                xs = {}
                for r in rows:
                    v = b.load(b.gep(x_p, [b.add(b.mul(r, x_row), b.add(args[2], i))]))
                    xs[r] = b.shuffle_vector(b.insert_element(ir.Constant(_vec(FLOAT), ir.Undefined), v, ir.Constant(I32, 0)),
                                             ir.Constant(_vec(FLOAT), ir.Undefined), ir.Constant(_vec(I32), [0] * LANES))
                ws = {q: b.load(vec_at(w_p, b.add(b.mul(i, i64(TILE)), i64(first_out + LANES * q))), align=4) for q in range(n_pieces)}
                for slot, (r, j) in zip(slots, cells):
                    q = (j - first_out) // LANES
                    b.store(b.call(fma, [xs[r], ws[q], b.load(slot)]), slot)
            for slot, (r, j) in zip(slots, cells):
                b.store(b.load(slot), vec_at(acc_p, b.add(b.mul(r, i64(TILE)), i64(j))), align=4)

        fours = b.lshr(k, i64(2))
        with cgutils.for_range(b, fours) as loop:
            r0 = b.mul(loop.index, i64(4))
            for first in range(0, TILE, ACC_PIECES * LANES):
                block([b.add(r0, i64(j)) for j in range(4)], first, ACC_PIECES)
        done = b.mul(fours, i64(4))
        pairs = b.lshr(b.sub(k, done), i64(1))
        with cgutils.for_range(b, pairs) as loop:
            r0 = b.add(done, b.mul(loop.index, i64(2)))
            for first in range(0, TILE, PASS):
                block([r0, b.add(r0, i64(1))], first, PASS // LANES)
        odd = b.icmp_signed("!=", b.and_(k, i64(1)), i64(0))
        with b.if_then(odd):
            block([b.sub(k, i64(1))], 0, TILE // LANES)
        return context.get_dummy_value()
    return types.none(acc, x, i0, w, n_in), codegen


@njit(**JIT)
def sums16(x):
    """x (in,) -> the sum of each 16 inputs, in order (in / 16,): what the one-row kernels take for sum(x) over a
    group, for the offsets (put's factored form), once a product instead of once a tile and pass."""
    xs = np.empty(x.shape[0] // 16, F32)
    for g in range(xs.shape[0]):
        total = F32(0)
        for i in range(16 * g, 16 * g + 16):
            total += x[i]
        xs[g] = total
    return xs


def in_registers(k: int, lanes: int) -> bool:
    """Whether a product of k rows keeps its sums in registers (times): one row always (the factored form), 2 to
    FEW rows with AVX-512, an even count of them with AVX2 (an odd one's last row alone cost its decoding again)."""
    return k == 1 or k <= FEW and (lanes == 16 or k % 2 == 0)


# A product is two compiled pieces. `_run` is one parallel loop for every type: numba's prange over the threads,
# each given a contiguous range of tiles, as numba's own schedule of a loop over the tiles gives them. What a
# thread does with its tiles is compiled for one type and one way of its rows (one row, a few in registers, a
# prompt's; or the values alone, for `dequantize`) as a C function (numba's cfunc), compiled the first time a
# model calls it and cached on disk; `_run` calls it by its address. A parallel loop compiled for each type and
# way instead cost ~3 times as much to compile (every type's every way, exact and int8: 155-174 -> 50-53 s here),
# as numba builds a parallel loop as four nested functions, each optimised and made into machine code again with
# all it holds.
ONE, FEW_ROWS, MANY, VALUES = 0, 1, 2, 3   # the ways: one row, 2 to FEW in registers, more, the values alone
WAY_NAMES = ("one", "few", "many", "values")
TILE_SHAPE = {name: (BLOCK_BYTES[name] // TILE, TILE) if name not in ("F32", "F16", "BF16")
              else (GROUP, BLOCK_BYTES[name] // GROUP) for name in KINDS}   # (R, C) of a tile block
U8_P, F32_P, INT = types.CPointer(types.uint8), types.CPointer(types.float32), types.int64
# what a thread's work is given (_work): the tiles (T, n_blocks, R, C); x (k, in); the sums per 16 inputs of row
# `last` of x (sums16), which the one-row form multiplies (none: last < 0); y (k, out); its tiles t0 ... t1 - 1.
# The values alone (VALUES) write W.T into y (in, T·64) and take no x (k = 0).
WORK = types.void(U8_P, INT, INT, F32_P, INT, INT, F32_P, INT, F32_P, INT, INT, INT)


def _work(kind: int, way: int):
    """A thread's work on tiles t0 ... t1 - 1 of a product (or of dequantize) with type number `kind`, in one way
    of its rows: a closure, so that numba takes both as constants, an uncompiled C function (cfunc) that
    `address` compiles, or loads from numba's cache, the first time it is asked for.

    ONE row: the factored form (_Unit.put); FEW_ROWS (2 to FEW): ROWS, 4 or 2 at a time with their sums in
    registers (an odd last row as one row: with AVX2, whose 8 lanes make decoding dearer, an odd count goes the
    third way); MANY: the unit's values through a buffer, read by _accumulate; VALUES: each unit's values
    written by the decoder straight into its rows of y = W.T (a copy through a buffer in between, element by
    element, had held it to 0.65 G weights/s)."""
    name = NAMES[kind]
    R, C = TILE_SHAPE[name]
    units, unit_in = UNITS[name], UNIT[name]

    def work(tiles_p, n_tiles, n_blocks, x_p, k, n_in, xs_p, last, y_p, out, t0, t1):
        tiles = carray(tiles_p, (n_tiles, n_blocks, R, C))
        x, xs = carray(x_p, (max(k, 1), n_in)), carray(xs_p, (n_in // 16,))
        y = carray(y_p, (n_in if way == VALUES else k, out))
        acc = np.empty((k, TILE), F32)
        w = np.empty((MOST, TILE), F32)
        for t in range(t0, t1):
            acc[:] = 0
            for b in range(n_blocks):
                for u in range(units):
                    i0 = unit_in * (units * b + u)
                    if way == ONE:
                        _unit(kind, 1, tiles[t, b], u, x[0], xs, i0, acc[0])
                    elif way == FEW_ROWS:
                        n0 = 0
                        while k - n0 >= ROWS:
                            _unit(kind, ROWS, tiles[t, b], u, x[n0:n0 + ROWS], xs, i0, acc[n0:n0 + ROWS])
                            n0 += ROWS
                        if ROWS > 4 and k - n0 >= 4:
                            _unit(kind, 4, tiles[t, b], u, x[n0:n0 + 4], xs, i0, acc[n0:n0 + 4])
                            n0 += 4
                        if k - n0 >= 2:
                            _unit(kind, 2, tiles[t, b], u, x[n0:n0 + 2], xs, i0, acc[n0:n0 + 2])
                            n0 += 2
                        if last >= 0:
                            _unit(kind, 1, tiles[t, b], u, x[last], xs, i0, acc[last])
                    elif way == MANY:
                        _unit(kind, 0, tiles[t, b], u, x[0], xs, i0, w)
                        _accumulate(acc, x, i0, w, unit_in)
                    else:
                        _unit(kind, 0, tiles[t, b], u, x[0], xs, 0, y[i0:i0 + unit_in, TILE * t:TILE * (t + 1)])
            for n in range(k):
                for j in range(min(TILE, out - TILE * t)):
                    y[n, TILE * t + j] = acc[n, j]
    return lazy_cfunc(own_name(work, f"{'dequantize' if way == VALUES else 'times'}_{name}_{WAY_NAMES[way]}"), WORK, JIT)


def lazy_cfunc(fn, sig, options: dict):
    """fn as numba's C function of signature sig, not compiled yet (numba.cfunc compiles at once): `address` compiles
    it, or loads it from the cache, when a model first calls it."""
    made = CFunc(fn, sigutils.normalize_signature(sig), locals={}, pipeline_class=options.get("pipeline_class", Compiler),
                 options={k: v for k, v in options.items() if k not in ("cache", "pipeline_class")})
    made.enable_caching()
    return made


def address(fn) -> int:
    """Where the compiled code of a lazy_cfunc begins, compiling (or loading) it the first time, once: the two halves
    of a long prompt (parallel.py) ask on two threads at once, and each would compile it."""
    if fn._wrapper_address is None:
        with _compiling:
            if fn._wrapper_address is None:
                fn.compile()
    return fn._wrapper_address


_compiling = threading.Lock()


def own_name(fn, name: str):
    """fn named `name`, before numba compiles it: numba keeps a function's cache (an index, and a data file for
    each entry) under its qualified name, and closures of one name would share one index, whose entries two
    processes compiling at once can cross (numba numbers a new entry's file from the index as it read it), so
    that a later start loads one type's code for another's (seen: two suites compiling the AVX2 forms at once)."""
    fn.__name__ = fn.__qualname__ = name
    return fn


@intrinsic
def data(typingctx, arr):
    """A pointer to an array's first element."""
    def codegen(context, builder, sig, args):
        return context.make_array(sig.args[0])(context, builder, args[0]).data
    return types.CPointer(arr.dtype)(arr), codegen


@intrinsic
def call(typingctx, address, args):
    """The C function at `address` (a cfunc's, an integer), called with the tuple args: its signature is theirs."""
    def codegen(context, builder, sig, llargs):
        ctypes = [context.get_value_type(t) for t in args.types]
        fn = builder.inttoptr(llargs[0], ir.FunctionType(ir.VoidType(), ctypes).as_pointer())
        builder.call(fn, cgutils.unpack_tuple(builder, llargs[1], len(ctypes)))
        return context.get_dummy_value()
    return types.none(address, args), codegen


def _runner(parallel: bool):
    """_run (a parallel loop on numba's threads) or _run_alone (the same loop compiled without parallel: one range
    on the calling thread, outside numba's threading layer; what a product on one thread takes). Where libgomp is
    missing numba's layer is its workqueue, which aborts the process when two threads start parallel loops at once:
    a long prompt's halves (parallel.in_threads) and quant.warm beside a first forward pass run one-thread products
    on threads of their own."""
    def run(work, parts, tiles, x, last, y):
        """y (k, out) = x (k, in) @ W.T for W in tiles, by `work` (a _work's address) on `parts` ranges of the tiles,
        one a thread; with no rows in x, y (in, T·64) = W.T (VALUES). x and y C-contiguous."""
        n_tiles, n_blocks = tiles.shape[0], tiles.shape[1]
        k, n_in = x.shape
        xs = sums16(x[last]) if last >= 0 else np.zeros(n_in // 16, F32)
        parts = max(1, min(parts, n_tiles))
        for p in prange(parts):
            call(work, (data(tiles), n_tiles, n_blocks, data(x), k, n_in, data(xs), last, data(y), y.shape[1],
                        p * n_tiles // parts, (p + 1) * n_tiles // parts))
    return njit(parallel=parallel, **JIT)(own_name(run, "_run" if parallel else "_run_alone"))


_run, _run_alone = _runner(True), _runner(False)


def launch(run, run_alone, work, tiles, *args):
    """run(work, parts, tiles, *args) on this thread's count of numba's threads, or run_alone where that is one, or
    where numba's parallel loops start slowly (its workqueue, `slow_starts`) and the tiles are fewer than
    SLOW_START_BYTES."""
    parts = thread_count()
    if parts > 1 and (tiles.nbytes >= SLOW_START_BYTES or not _slow_starts):
        run(work, parts, tiles, *args)
        if _slow_starts is None:
            slow_starts()
    else:
        run_alone(work, parts, tiles, *args)


# Where libgomp is missing, numba's parallel loops run on its workqueue, whose start cost ~50 us a loop here (OpenMP's
# ~3): the default model decoded 44 tok/s on two threads so against 102 on one. Two threads pay from a few MB of
# weights on (one thread reads ~20 GB/s: 2 MB take ~100 us).
SLOW_START_BYTES = 4 << 20
_slow_starts: bool | None = None   # None until a parallel loop has run: numba names its layer only then


def slow_starts() -> bool:
    """Whether numba's parallel loops run on its workqueue (known once one has run; False before)."""
    global _slow_starts
    if _slow_starts is None:
        try:
            _slow_starts = numba.threading_layer() == "workqueue"
        except ValueError:   # no parallel loop has run yet
            return False
    return _slow_starts


WORKS = tuple(tuple(_work(kind, way) for way in (ONE, FEW_ROWS, MANY, VALUES)) for kind in range(len(KINDS)))   # [kind][way]
WAYS = tuple(ONE if k == 1 else FEW_ROWS if in_registers(k, LANES) else MANY for k in range(FEW + 1))


def times(kind: int, tiles, x, out: int):
    """y (k, out) = x (k, in) @ W.T for W in tiles of type number `kind`, x C-contiguous: its way's work on each
    thread's tiles."""
    k = x.shape[0]
    way = WAYS[k] if k <= FEW else MANY
    y = np.empty((k, out), F32)
    launch(_run, _run_alone, address(WORKS[kind][way]), tiles, x, k - 1 if way != MANY and k % 2 == 1 else -1, y)
    return y


def dequantize(kind: int, tiles, out_t):
    """out_t (in, T·64) float32, C-contiguous = W.T for W in tiles (T, n_blocks, R, C) of type number `kind`, its
    values as `times` sees them. Transposed, as the tiles hold them (a unit's values are (inputs, 64 outputs)),
    where (n_out, in) would take 64 scattered stores per input; OpenBLAS multiplies x @ out_t as well."""
    n_in = tiles.shape[1] * UNITS[NAMES[kind]] * UNIT[NAMES[kind]]
    if not out_t.flags.c_contiguous or out_t.shape != (n_in, tiles.shape[0] * TILE):
        raise ValueError(f"dequantize: out_t {out_t.shape} is not a C-contiguous W.T of these tiles")
    launch(_run, _run_alone, address(WORKS[kind][VALUES]), tiles, np.zeros((0, out_t.shape[0]), F32), -1, out_t)


def in_cache(fn) -> bool:
    """Whether numba's cache index holds code of fn (one of WORKS, or int8's), read by numba's private layout: an
    entry's key ends in hashes of the function's code and its closure (here the type and the way)."""
    ours = fn._cache._index_key(fn._sig, fn._targetdescr.target_context.codegen())[1:]
    return any(key[1:] == ours for key in fn._cache._cache_file._load_index())


_mine = threading.local()   # .n: numba's thread count on this thread, as threads() last set it


def threads(n: int | None):
    """A context in which numba's parallel regions on this thread use n threads (None: as they do). Cheap
    where n is the count already (a decode step inside parallel.step_alone asks for 1 ~120 times: numba's
    get and set took ~9 us a product, as long as a small matrix's product)."""
    if n is None or min(n, numba.config.NUMBA_NUM_THREADS) == thread_count():
        return nullcontext()
    return _threads(min(n, numba.config.NUMBA_NUM_THREADS))


def thread_count() -> int:
    """How many of numba's threads a parallel region on this thread uses (as threads() last set it)."""
    if getattr(_mine, "n", None) is None:
        _mine.n = numba.get_num_threads()
    return _mine.n


@contextmanager
def _threads(n: int):
    before = thread_count()
    numba.set_num_threads(n)
    _mine.n = n
    try:
        yield
    finally:
        numba.set_num_threads(before)
        _mine.n = before

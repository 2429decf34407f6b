"""llama.cpp's quantization rules, so that a float checkpoint quantized here gives the bytes
`llama-quantize` (without an importance matrix) would give.

Each function takes blocks (n, block) float32 and returns their bytes (n, nbytes), written after
ggml-quants.c's `quantize_row_*_ref`, the reference every file llama.cpp makes without an imatrix
goes through. That C is compiled without FMA (ggml-base is built for baseline x86-64) and without
-ffast-math, so its sums run in float32, one rounding per operation, in index order: the loops over
a block's inputs below keep that order (vectorised over blocks, never over the inputs of one block),
and `_round_half_away` / `_nearest_int` are roundf and ggml's nearest_int. float16 scales round to
nearest even, as GGML_FP32_TO_FP16 does.

Where gguf-py implements a type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16, F16), these bytes equal its bytes;
Q4_K equals llama.cpp's own quantize_row_q4_K_ref (tests/test_quant_quantize.py, fixtures made by
scripts/make_quant_fixtures.py with libggml-base).
"""
from __future__ import annotations

import numpy as np

from .formats import FORMATS, QK_K

F32 = np.float32


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    """(n,) float32 -> (n, 2) uint8, float16 rounded to nearest even."""
    return v.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _inverse(d: np.ndarray) -> np.ndarray:
    """`d ? 1.0f/d : 0.0f`."""
    with np.errstate(divide="ignore"):
        return np.where(d == 0, F32(0), F32(1) / d).astype(F32)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C's roundf: to the nearest integer, halves away from zero (np.round rounds them to even)."""
    a = np.abs(v)
    whole = np.floor(a)
    return np.copysign(whole + (a - whole >= 0.5), v)


def _nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int (adding 1.5·2^23 in float32): to nearest, ties to even; int32. (NaN, from a
    flat row or a zero scale, becomes some int the caller then discards.)"""
    with np.errstate(invalid="ignore"):
        return np.rint(v).astype(np.int32)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) codes < 16 -> (n, 16) bytes: input j in the low half of byte j, input j + 16 in the high."""
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)


def _truncate(v: np.ndarray) -> np.ndarray:
    """C's (int8_t)/(uint8_t) conversion of a non-negative float: towards zero."""
    return np.trunc(v).astype(np.int32)


def _abs_max_signed(x: np.ndarray) -> np.ndarray:
    """The value of largest magnitude of each row, as the reference's loop finds it: the first of
    equals, and +0 when all are zero (its `max` starts at 0.0f and moves only for a larger |v|, so an
    all-zero block gets d = +0/-8 = -0, whatever the signs of its zeros; gguf-py takes the first zero)."""
    first = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]
    return np.where(first == 0, F32(0), first)


def _first_min(x: np.ndarray) -> np.ndarray:
    """Each row's minimum as `if (v < min) min = v` finds it: the first of equals (-0 or +0 as it comes)."""
    return np.take_along_axis(x, x.argmin(axis=1)[:, None], axis=1)[:, 0]


def _first_max(x: np.ndarray) -> np.ndarray:
    return np.take_along_axis(x, x.argmax(axis=1)[:, None], axis=1)[:, 0]


def quantize_q8_0(x):
    d = (np.abs(x).max(axis=1) / F32(127)).astype(F32)
    q = _round_half_away(x * _inverse(d)[:, None]).astype(np.int8)
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=1)


def quantize_q4_0(x):
    d = (_abs_max_signed(x) / F32(-8)).astype(F32)
    q = np.minimum(15, _truncate(x * _inverse(d)[:, None] + F32(8.5)))
    return np.concatenate([_f16_bytes(d), _pack_nibbles(q)], axis=1)


def quantize_q4_1(x):
    lo, hi = _first_min(x), _first_max(x)
    d = ((hi - lo) / F32(15)).astype(F32)
    q = np.minimum(15, _truncate((x - lo[:, None]) * _inverse(d)[:, None] + F32(0.5)))
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(q)], axis=1)


def _fifth_bits(q: np.ndarray) -> np.ndarray:
    """(n, 32) 5-bit codes -> (n, 4) bytes: their fifth bits as one little-endian uint32 (bit j: input j)."""
    return np.packbits((q >> 4).astype(np.uint8), axis=1, bitorder="little")


def quantize_q5_0(x):
    d = (_abs_max_signed(x) / F32(-16)).astype(F32)
    q = np.minimum(31, _truncate(x * _inverse(d)[:, None] + F32(16.5)))
    return np.concatenate([_f16_bytes(d), _fifth_bits(q), _pack_nibbles(q & 15)], axis=1)


def quantize_q5_1(x):
    lo, hi = _first_min(x), _first_max(x)
    d = ((hi - lo) / F32(31)).astype(F32)
    q = _truncate((x - lo[:, None]) * _inverse(d)[:, None] + F32(0.5))
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), _fifth_bits(q), _pack_nibbles(q & 15)], axis=1)


def _sequential_sum(terms) -> np.ndarray:
    """sum += term, in order, in float32 (the reference's loops; NumPy's sum would pair them)."""
    total = None
    for t in terms:
        total = t.astype(F32) if total is None else (total + t).astype(F32)
    return total


def make_qkx2_quants(x, weights, nmax=15, rmin=F32(-1), rdelta=F32(0.1), nstep=20):
    """ggml's make_qkx2_quants (use_mad false) for rows x (n, 32) with weights (n, 32): codes L (n, 32)
    in 0..nmax, scale (n,) and the_min (n,) (w ≈ scale·L − the_min). A first scale from the range, then
    nstep + 1 trial scales around it, each refitted by weighted least squares; the best fit is kept."""
    n, m = x.shape
    lo = _first_min(x)
    lo = np.where(lo > 0, F32(0), lo)
    hi = _first_max(x)
    sum_w = _sequential_sum(weights[:, i] for i in range(m))
    sum_x = _sequential_sum(weights[:, i] * x[:, i] for i in range(m))
    flat = hi == lo
    with np.errstate(divide="ignore", invalid="ignore"):   # a flat row (hi == lo) is set apart at the end
        iscale = (F32(nmax) / (hi - lo)).astype(F32)
        scale = (F32(1) / iscale).astype(F32)
        L = np.clip(_nearest_int(iscale[:, None] * (x - lo[:, None])), 0, nmax)
        best = _squared_error(scale, lo, L, x, weights)
    for step in range(nstep + 1):
        with np.errstate(divide="ignore", invalid="ignore"):
            iscale = ((rmin + rdelta * F32(step) + F32(nmax)) / (hi - lo)).astype(F32)
            trial = np.clip(_nearest_int(iscale[:, None] * (x - lo[:, None])), 0, nmax)
            lf = trial.astype(F32)
            sum_l = _sequential_sum(weights[:, i] * lf[:, i] for i in range(m))
            sum_l2 = _sequential_sum(weights[:, i] * lf[:, i] * lf[:, i] for i in range(m))
            sum_xl = _sequential_sum(weights[:, i] * lf[:, i] * x[:, i] for i in range(m))
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            positive = this_min > 0
            this_scale = np.where(positive, sum_xl / sum_l2, this_scale).astype(F32)
            this_min = np.where(positive, F32(0), this_min).astype(F32)
            error = _squared_error(this_scale, this_min, trial, x, weights)
        better = (D > 0) & (error < best) & ~flat
        L = np.where(better[:, None], trial, L)
        best, scale, lo = (np.where(better, new, old) for new, old in [(error, best), (this_scale, scale), (this_min, lo)])
    L = np.where(flat[:, None], 0, L)
    scale = np.where(flat, F32(0), scale).astype(F32)
    return L, scale, (-lo).astype(F32)


def _squared_error(scale, lo, L, x, weights):
    """sum_i w_i·(scale·L_i + min − x_i)², in order (the reference's best_error / cur_error)."""
    lf = L.astype(F32)
    diff = (scale[:, None] * lf + lo[:, None]) - x
    return _sequential_sum(weights[:, i] * (diff[:, i] * diff[:, i]) for i in range(x.shape[1]))


def quantize_q4_k(x):
    """quantize_row_q4_K_ref: per sub-block of 32, make_qkx2_quants with weights av_x + |x| (av_x the
    RMS of the sub-block); the 8 scales and 8 mins as 6-bit multiples of their largest / 63; then each
    code again from the rounded scale and min (a sub-block whose rounded scale is 0 keeps its codes)."""
    n = len(x)
    sub = x.reshape(n, 8, 32)
    L, scales, mins = np.empty((n, 8, 32), np.int32), np.empty((n, 8), F32), np.empty((n, 8), F32)
    for j in range(8):
        xs = sub[:, j]
        sum_x2 = _sequential_sum(xs[:, i] * xs[:, i] for i in range(32))
        av_x = np.sqrt(sum_x2 / F32(32)).astype(F32)
        L[:, j], scales[:, j], mins[:, j] = make_qkx2_quants(xs, (av_x[:, None] + np.abs(xs)).astype(F32))
    max_scale = np.maximum(scales.max(axis=1), F32(0))
    max_min = np.maximum(mins.max(axis=1), F32(0))
    ls = np.minimum(63, _nearest_int(_inverse_of_max(max_scale)[:, None] * scales) & 255)
    lm = np.minimum(63, _nearest_int(_inverse_of_max(max_min)[:, None] * mins) & 255)
    packed = _pack_scale_min_k4(ls.astype(np.uint8), lm.astype(np.uint8))
    d16, dmin16 = _f16_bytes((max_scale / F32(63)).astype(F32)), _f16_bytes((max_min / F32(63)).astype(F32))
    d = (d16.view(np.float16)[:, 0].astype(F32)[:, None] * ls.astype(F32))            # (n, 8)
    dm = (dmin16.view(np.float16)[:, 0].astype(F32)[:, None] * lm.astype(F32))
    with np.errstate(divide="ignore", invalid="ignore"):
        again = np.clip(_nearest_int((sub + dm[:, :, None]) / d[:, :, None]), 0, 15)
    L = np.where((d != 0)[:, :, None], again, L).reshape(n, 4, 2, 32)                   # (n, chunk, half, l)
    qs = (L[:, :, 0] | (L[:, :, 1] << 4)).astype(np.uint8).reshape(n, 128)
    return np.concatenate([d16, dmin16, packed, qs], axis=1)


def _inverse_of_max(m: np.ndarray) -> np.ndarray:
    """`max > 0 ? 63.f/max : 0.f`."""
    with np.errstate(divide="ignore"):
        return np.where(m > 0, F32(63) / m, F32(0)).astype(F32)


def _pack_scale_min_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """8 pairs of 6-bit (scale, min) -> 12 bytes, the inverse of formats.scale_min_k4."""
    out = np.zeros((len(ls), 12), np.uint8)
    out[:, 0:4], out[:, 4:8] = ls[:, :4], lm[:, :4]
    out[:, 8:12] = (ls[:, 4:] & 15) | ((lm[:, 4:] & 15) << 4)
    out[:, 0:4] |= (ls[:, 4:] >> 4) << 6
    out[:, 4:8] |= (lm[:, 4:] >> 4) << 6
    return out


def quantize_f16(x):
    return x.astype(np.float16).view(np.uint8)


def quantize_bf16(x):
    """ggml_compute_fp32_to_bf16: round to nearest even; a NaN stays a (quiet) NaN."""
    n = x.view(np.uint32).astype(np.uint64)
    rounded = (n + 0x7FFF + ((n >> 16) & 1)) >> 16
    nan = (n & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (n >> 16) | 64, rounded).astype(np.uint16).view(np.uint8)


def quantize_f32(x):
    return x.view(np.uint8)


QUANTIZERS = {"F32": quantize_f32, "F16": quantize_f16, "BF16": quantize_bf16, "Q8_0": quantize_q8_0,
              "Q4_0": quantize_q4_0, "Q4_1": quantize_q4_1, "Q5_0": quantize_q5_0, "Q5_1": quantize_q5_1,
              "Q4_K": quantize_q4_k}


def quantize_rows(w: np.ndarray, name: str) -> np.ndarray:
    """A float32 matrix (out, in) -> its rows of blocks of type `name` (out, row bytes) uint8.
    `in` must be a multiple of the type's block (the caller names the tensor when it is not)."""
    f = FORMATS[name]
    blocks = np.ascontiguousarray(w, dtype=F32).reshape(-1, f.block)
    return QUANTIZERS[name](blocks).reshape(w.shape[0], -1)

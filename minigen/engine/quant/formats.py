"""Each GGUF tensor type minigen runs: its block layout, and the NumPy function that defines its values.

A matrix (out, in) of a block type is stored as `out` rows of `in // block` blocks of `nbytes` bytes
each; a block holds `block` consecutive inputs of one output. `dequantize(blocks)` turns blocks
(n, nbytes) uint8 into their float32 values (n, block), one short function per type, written after
llama.cpp's ggml-quants.c `dequantize_row_*` (the C names the fields as below). These functions are
the definition every kernel must equal (kernels.py), and they equal gguf-py's `gguf.quants.dequantize`
bit for bit (tests/test_quant_formats.py).

Every value is d·q, d·q + m, (d·sc)·q − dmin·m or (d·sc)·q, with q a small integer and d, sc, m from the block
(IQ4_NL, IQ4_XS: q one of 16 integers of a table, |q| <= 127).
A float16 d has 11 significant bits, a sub-scale sc or m at most 7 and a code at most 8, and no product
here needs more than float32's 24 bits, so each is exact: the only rounding is the one addition of an
offset (Q8_K's float32 d times q: the one multiplication). The value of a weight therefore does not
depend on the order of the operations, nor on whether a compiler fuses them into an FMA.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

QK = 32     # inputs per block of the legacy types (Q4_0 ... Q8_0)
QK_K = 256  # inputs per super-block of the K types


@dataclass(frozen=True)
class Format:
    name: str          # GGUF's name of the type, e.g. "Q4_K"
    ggml_type: int     # its number in GGUF's tensor info (ggml.h's enum ggml_type)
    block: int         # inputs per block
    nbytes: int        # bytes per block
    dequantize: Callable[[np.ndarray], np.ndarray]   # (n, nbytes) uint8 -> (n, block) float32

    def row_bytes(self, n_in: int) -> int:
        return n_in // self.block * self.nbytes


def _f16(b: np.ndarray) -> np.ndarray:
    """(..., 2) uint8, little-endian float16 -> (...,) float32 (exact)."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes of a legacy block -> (n, 32) codes: byte j holds input j (low 4 bits) and j + 16."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """(n, 4) bytes = one little-endian uint32 -> (n, 32) its bits, bit j for input j."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def dequantize_f32(b):
    return np.ascontiguousarray(b).view(np.float32)


def dequantize_f16(b):
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def dequantize_bf16(b):
    """bfloat16 is the high half of a float32."""
    return (np.ascontiguousarray(b).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def dequantize_q4_0(b):
    """d (f16), qs[16]: w = d·(q − 8)."""
    return _f16(b[:, 0:2])[:, None] * (_nibbles(b[:, 2:18]).astype(np.float32) - 8)


def dequantize_q4_1(b):
    """d, m (f16), qs[16]: w = d·q + m."""
    return _f16(b[:, 0:2])[:, None] * _nibbles(b[:, 4:20]).astype(np.float32) + _f16(b[:, 2:4])[:, None]


def dequantize_q5_0(b):
    """d (f16), qh (u32: the fifth bit of each code), qs[16]: w = d·(q − 16)."""
    q = _nibbles(b[:, 6:22]) | (_high_bits(b[:, 2:6]) << 4)
    return _f16(b[:, 0:2])[:, None] * (q.astype(np.float32) - 16)


def dequantize_q5_1(b):
    """d, m (f16), qh (u32), qs[16]: w = d·q + m."""
    q = _nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8]) << 4)
    return _f16(b[:, 0:2])[:, None] * q.astype(np.float32) + _f16(b[:, 2:4])[:, None]


def dequantize_q8_0(b):
    """d (f16), qs int8[32]: w = d·q."""
    return _f16(b[:, 0:2])[:, None] * b[:, 2:34].view(np.int8).astype(np.float32)


def dequantize_q8_k(b):
    """d (f32), qs int8[256], bsums int16[16] (sums of 16 codes, for dot products; not a value): w = d·q."""
    return dequantize_f32(b[:, 0:4]) * b[:, 4:260].view(np.int8).astype(np.float32)


def scale_min_k4(scales: np.ndarray, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """(n, 12) packed 6-bit sub-scales of Q4_K / Q5_K -> sc, m (n, 8), ggml's get_scale_min_k4: sub-block
    j < 4 keeps its 6 bits in bytes j and j + 4; j >= 4 keeps 4 bits in byte j + 4 and 2 in the top of
    bytes j − 4 and j. The 12 bytes may lie along another axis (the kernels' tiles: axis 2)."""
    a, b, c = np.split(scales, 3, axis=axis)
    sc = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=axis)
    m = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=axis)
    return sc, m


def _k_codes_4(qs: np.ndarray) -> np.ndarray:
    """(n, 128) bytes of a K block -> (n, 256) 4-bit codes: 32-byte chunk c holds inputs 64c + l (low)
    and 64c + 32 + l (high)."""
    qs = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([qs & 15, qs >> 4], axis=2).reshape(-1, QK_K)


def _k_scaled(d, dmin, sc, m, q):
    """w = (d·sc)·q − dmin·m per sub-block of 32: d, dmin (n,), sc, m (n, 8), q (n, 256)."""
    scale = (d[:, None] * sc.astype(np.float32))[:, :, None]
    offset = (dmin[:, None] * m.astype(np.float32))[:, :, None]
    return (scale * q.reshape(-1, 8, 32).astype(np.float32) - offset).reshape(-1, QK_K)


def dequantize_q4_k(b):
    """d, dmin (f16), scales[12] (8 pairs of 6-bit sc, m), qs[128]."""
    sc, m = scale_min_k4(b[:, 4:16])
    return _k_scaled(_f16(b[:, 0:2]), _f16(b[:, 2:4]), sc, m, _k_codes_4(b[:, 16:144]))


def dequantize_q5_k(b):
    """d, dmin (f16), scales[12], qh[32] (bit c of byte l: the fifth bit of inputs 32c + l), qs[128]."""
    sc, m = scale_min_k4(b[:, 4:16])
    high = np.unpackbits(b[:, 16:48, None], axis=-1, bitorder="little")     # (n, 32 l, 8 c)
    q = _k_codes_4(b[:, 48:176]) | (high.transpose(0, 2, 1).reshape(-1, QK_K) << 4)
    return _k_scaled(_f16(b[:, 0:2]), _f16(b[:, 2:4]), sc, m, q)


def dequantize_q6_k(b):
    """ql[128] (low 4 bits), qh[64] (high 2 bits), scales int8[16] (one per 16 inputs), d (f16):
    w = (d·sc)·(q − 32). Each half of 128 inputs takes 64 bytes of ql and 32 of qh: byte l of ql holds
    inputs l (low) and 64 + l (high), byte 32 + l inputs 32 + l and 96 + l; byte l of qh their high bits,
    2 each, in that order (l, 32 + l, 64 + l, 96 + l)."""
    ql = b[:, 0:128].reshape(-1, 2, 2, 32)                     # (n, half, 32-byte row, l)
    low = np.concatenate([ql & 15, ql >> 4], axis=2)           # (n, half, 4 quarter, l)
    qh = b[:, 128:192].reshape(-1, 2, 1, 32)
    high = (qh >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3   # (n, half, 4 quarter, l)
    q = (low | (high << 4)).reshape(-1, 16, 16).astype(np.float32) - 32
    scale = _f16(b[:, 208:210])[:, None] * b[:, 192:208].view(np.int8).astype(np.float32)
    return (scale[:, :, None] * q).reshape(-1, QK_K)


SHIFTS_2 = np.array([0, 2, 4, 6], np.uint8)   # the four 2-bit fields of a byte


def _k_codes_2(qs: np.ndarray) -> np.ndarray:
    """(n, 64) bytes of a Q2_K / Q3_K block -> (n, 256) 2-bit codes: bits 2j, 2j + 1 of byte 32h + l hold
    input 128h + 32j + l (l < 32)."""
    return ((qs.reshape(-1, 2, 1, 32) >> SHIFTS_2[:, None]) & 3).reshape(-1, QK_K)


def dequantize_q2_k(b):
    """scales[16] (sc in the low 4 bits, m in the high 4, one pair per 16 inputs), qs[64], d, dmin (f16):
    w = (d·sc)·q − dmin·m."""
    sc, q = b[:, 0:16], _k_codes_2(b[:, 16:80]).reshape(-1, 16, 16).astype(np.float32)
    scale = (_f16(b[:, 80:82])[:, None] * (sc & 15).astype(np.float32))[:, :, None]
    offset = (_f16(b[:, 82:84])[:, None] * (sc >> 4).astype(np.float32))[:, :, None]
    return (scale * q - offset).reshape(-1, QK_K)


def scales_q3_k(scales: np.ndarray) -> np.ndarray:
    """(n, 12) packed 6-bit scales of Q3_K -> (n, 16) sc − 32: scale i keeps 4 bits in byte i % 8 (the low
    nibble for i < 8, the high for i >= 8) and 2 in byte 8 + i % 4, at bits 2·(i // 4)."""
    i = np.arange(16)
    low = (scales[:, i % 8] >> (4 * (i // 8)).astype(np.uint8)) & 15
    high = (scales[:, 8 + i % 4] >> (2 * (i // 4)).astype(np.uint8)) & 3
    return (low | (high << 4)).astype(np.float32) - 32


def dequantize_q3_k(b):
    """hmask[32] (bit k of byte l: the third bit of input 32k + l), qs[64] (the low 2 bits), scales[12]
    (16 6-bit scales), d (f16): w = (d·(sc − 32))·(q − 4), the third bit set meaning q >= 4 (ggml's
    "minus 4 where the mask bit is 0")."""
    high = np.unpackbits(b[:, 0:32, None], axis=-1, bitorder="little")      # (n, 32 l, 8 k)
    q = _k_codes_2(b[:, 32:96]) | (high.transpose(0, 2, 1).reshape(-1, QK_K) << 2)
    scale = _f16(b[:, 108:110])[:, None] * scales_q3_k(b[:, 96:108])
    return (scale[:, :, None] * (q.reshape(-1, 16, 16).astype(np.float32) - 4)).reshape(-1, QK_K)


IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
# ggml's kvalues_iq4nl: the 16 values a 4-bit code of IQ4_NL and IQ4_XS stands for (a non-linear grid)


def dequantize_iq4_nl(b):
    """d (f16), qs[16] (bytes as Q4_0's): w = d·values[q]."""
    return _f16(b[:, 0:2])[:, None] * IQ4_VALUES[_nibbles(b[:, 2:18])]


def scales_iq4_xs(b: np.ndarray) -> np.ndarray:
    """(n, 136) IQ4_XS blocks -> (n, 8) their groups' 6-bit scales − 32: group g keeps 4 bits in nibble g % 2
    of scales_l byte g // 2 and 2 in bits 2g, 2g + 1 of the 16-bit scales_h."""
    g = np.arange(8)
    low = (b[:, 4 + g // 2] >> (4 * (g % 2)).astype(np.uint8)) & 15
    high = (np.ascontiguousarray(b[:, 2:4]).view(np.uint16) >> (2 * g).astype(np.uint16)) & 3
    return (low | (high << 4)).astype(np.float32) - 32


def dequantize_iq4_xs(b):
    """d (f16), scales_h (u16), scales_l[4], qs[128] (16 bytes per group of 32, as Q4_0's):
    w = (d·(sc − 32))·values[q]."""
    scale = _f16(b[:, 0:2])[:, None] * scales_iq4_xs(b)                   # (n, 8)
    q = _nibbles(b[:, 8:136].reshape(-1, 16)).reshape(-1, 8, 32)
    return (scale[:, :, None] * IQ4_VALUES[q]).reshape(-1, QK_K)


FORMATS = {f.name: f for f in [
    Format("F32", 0, 1, 4, dequantize_f32),
    Format("F16", 1, 1, 2, dequantize_f16),
    Format("BF16", 30, 1, 2, dequantize_bf16),
    Format("Q4_0", 2, QK, 18, dequantize_q4_0),
    Format("Q4_1", 3, QK, 20, dequantize_q4_1),
    Format("Q5_0", 6, QK, 22, dequantize_q5_0),
    Format("Q5_1", 7, QK, 24, dequantize_q5_1),
    Format("Q8_0", 8, QK, 34, dequantize_q8_0),
    Format("Q2_K", 10, QK_K, 84, dequantize_q2_k),
    Format("Q3_K", 11, QK_K, 110, dequantize_q3_k),
    Format("Q4_K", 12, QK_K, 144, dequantize_q4_k),
    Format("Q5_K", 13, QK_K, 176, dequantize_q5_k),
    Format("Q6_K", 14, QK_K, 210, dequantize_q6_k),
    Format("Q8_K", 15, QK_K, 292, dequantize_q8_k),
    Format("IQ4_NL", 20, QK, 18, dequantize_iq4_nl),
    Format("IQ4_XS", 23, QK_K, 136, dequantize_iq4_xs),
]}
BY_GGML_TYPE = {f.ggml_type: f for f in FORMATS.values()}
# the types whose products can round activations to int8 (int8.py, --activations int8)
INT8_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")
# the types whose exact one-row product runs as integer sums of x in 24 bits where the CPU has AVX-512 VNNI
# (int8.times_24): all of INT8_TYPES but Q8_0, whose float kernel reads its bytes faster (int8.WORKS24)
IN_24_BITS = tuple(t for t in INT8_TYPES if t != "Q8_0")

# GGUF's other types, by number, so that a refusal can name them (ggml.h)
OTHER_GGML_TYPES = {9: "Q8_1", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS",
                    19: "IQ1_S", 21: "IQ3_S", 22: "IQ2_S", 24: "I8",
                    25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 34: "TQ1_0",
                    35: "TQ2_0", 39: "MXFP4"}


# How the kernels' tiles (matrix.py, kernels.py) hold a type where it differs from the file's blocks:
# Q4_K and Q5_K blocks pack 8 pairs of 6-bit (sc, m) into 12 bytes (bytes 4..15); the tiles hold them
# unpacked instead, sc[8] then m[8] as bytes (rows 4..19, the rest 4 rows on), so that a kernel reads a
# group's sc and m with one load each: unpacking them per product was a third to a half of a one-row Q4_K
# product (docs/weights-as-stored.md, 2026-12-03). 4 bytes more per 144 (Q4_K) or 176 (Q5_K).
UNPACKED_SCALES = {"Q4_K", "Q5_K"}
# inputs the kernels decode at a time where not one group of 32: Q4_K, Q5_K 64 (a byte holds 2 groups), Q6_K
# 128 (a half block: 3 byte rows hold an input of each of its 4 quarters)
UNIT_INPUTS = {"Q4_K": 64, "Q5_K": 64, "Q6_K": 128}


def dequantize(raw: np.ndarray, name: str) -> np.ndarray:
    """Rows of blocks (..., row bytes) uint8 of type `name` -> their values (..., in) float32."""
    f = FORMATS[name]
    blocks = np.ascontiguousarray(raw).reshape(-1, f.nbytes)
    return f.dequantize(blocks).reshape(*raw.shape[:-1], raw.shape[-1] // f.nbytes * f.block)

"""Every projection of the forward pass: y = x @ w.T + b, for rows x (N, in) and a weight w (out, in).

This is the one place a product with a weight is computed, so that how it is computed can change with
what the weight is. A float32 weight (checkpoint/weights.py lays it out column-major, or row-major when
it has more inputs than outputs) goes to OpenBLAS, with the two rules below that this machine's BLAS
rewards; a weight kept in its checkpoint's own type (a StoredMatrix, quant/) goes to its kernels
(`w.times(x)`). The few places that need a weight's values rather than its product (an embedding's
rows, an inspection reading a head's slice) ask `rows_of` and `dense` here, which work on either kind.

OpenBLAS's rules, measured on an AMD EPYC (AVX2), OpenBLAS 0.3.31:
- a row-major w times a few rows goes as w @ x.T, which OpenBLAS runs faster there (16 rows of
  SmolLM2's down projection: 473 us against 519; 32 of LFM2-350M's: 3.5 ms against 4.8);
- a few rows are computed as a multiple of ROW_GROUP (`padded_rows`), the extra rows zeros: its GEMM
  on AVX2 (Haswell's kernels, also on AMD) takes its small side in groups of 8, and a group cut short
  costs more than a whole one.
"""
from __future__ import annotations

import numpy as np

from . import parallel
from .quant import STORED

FEW_ROWS = 32    # up to here a product is a decode step's or a short draft's: the rules above apply
ROW_GROUP = 8
# A StoredMatrix smaller than this is multiplied on the calling thread alone. On a quiet machine two threads
# halve even small products (Intel Xeon here, one row, 1 / 2 threads: SmolLM2's 576 x 576 Q4_1 0.071 / 0.039
# ms, 960 x 576 Q8_0 0.095 / 0.052); on a busy one waking numba's second thread cost more than it saved
# (576 x 576: 0.08 against 0.55 ms), which parallel.alone() catches: a decode step beside other work runs
# inside parallel.step_alone (for_decode), and its kernels then keep to one thread.
ALONE_BYTES = 64 << 10


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """x (N, in) @ w.T (+ b): (N, out). w: a float32 array, or a StoredMatrix (its kernels)."""
    if isinstance(w, STORED):
        y = w.times(x, 1 if w.nbytes < ALONE_BYTES or parallel.alone() else None)
        return y if b is None else y + b
    n = len(x)
    if not 1 < n <= FEW_ROWS:
        y = x @ w.T
    else:
        if (rows := padded_rows(n)) != n:
            x = np.concatenate([x, np.zeros((rows - n, x.shape[1]), x.dtype)])
        y = ((w @ x.T).T if w.flags.c_contiguous else x @ w.T)[:n]
    return y if b is None else y + b


def padded_rows(n: int) -> int:
    """How many rows a product of n (2..FEW_ROWS) rows is computed as: n rounded up to a multiple of
    ROW_GROUP where it lies 4 or more past one. Measured against one row (the GEMV): SmolLM2's 3072 x
    576 gate/up at 5 / 7 / 8 rows 2.97 / 3.03 / 2.32x, 13 / 16 rows 3.81 / 2.73x; Qwen2.5-1.5B's
    151,936 x 1,536 lm_head 2.55 / 2.48 / 1.97x and 3.29 / 2.64x. Short of 4 past (9 rows, 2 rows) the
    group is cheaper as it is."""
    over = n % ROW_GROUP
    return n + ROW_GROUP - over if over >= 4 else n


def rows_of(w, ids) -> np.ndarray:
    """Rows `ids` of a weight (out, in) as float32 (n, in), a copy: an embedding lookup, a few unembedding rows."""
    return w.rows(ids) if isinstance(w, STORED) else w[ids]


def dense(w) -> np.ndarray:
    """A weight's values as a float32 array: the array itself, or a StoredMatrix dequantized (a copy, for the
    inspection commands that read a weight's entries; the forward pass never asks)."""
    if isinstance(w, STORED):
        return w.dequantize()
    if isinstance(w, list):   # stored experts: one StoredMatrix per expert -> (E, out, in)
        return np.stack([dense(m) for m in w])
    return w

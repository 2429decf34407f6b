"""StoredMatrix: a weight matrix (out, in), as HF's Linear shapes it, kept in its checkpoint's own type.

    w = StoredMatrix.from_bytes(raw, "Q4_K", (out, in), name="blk.0.ffn_gate.weight")
    y = w.times(x)          # x (N, in) float32 -> (N, out) = x @ w.dequantize().T
    e = w.rows(ids)         # an embedding kept stored: only these rows are dequantized
    w = StoredMatrix.quantize(w32, "Q4_K")   # llama.cpp's rules (quantize.py)

What it holds is the layout the kernels want (kernels.py): the GGUF blocks in tiles of 64 outputs,
made once here from the file's bytes (a memory-mapped slice is read once and can be released after).
`times` runs the numba kernel below `BLAS_ROWS` rows; from there on (a long prompt) it dequantizes
CHUNK outputs at a time into a float32 buffer (the thread's scratch buffer, kept until the forward pass
ends) and lets OpenBLAS's GEMM multiply, which is faster
there (scripts/bench_kernels.py measures the switch). Without numba (`HAVE_KERNELS` False) every
product takes that second path, the reference the kernels are tested against: the engine then runs as
it did before weights were kept stored, only slower to start each product; a loader that expects
many products should dequantize once at load instead (`dequantize()`).

Experts (E, out, in) are a list of StoredMatrix, one per expert (`stack`), each applied alone.
"""
from __future__ import annotations

import importlib.util
import os
import threading
from dataclasses import dataclass, replace
from functools import partial
from typing import Sequence

import numpy as np

from ...errors import MinigenError
from .. import pages
from ..parallel import in_threads, n_threads
from .formats import BY_GGML_TYPE, FORMATS, INT8_TYPES, OTHER_GGML_TYPES, UNPACKED_SCALES, scale_min_k4
from .formats import dequantize as dequantize_rows
from .quantize import QUANTIZERS, _pack_scale_min_k4, quantize_rows

# numba is optional: without it the NumPy path below computes the same products. It is imported with the
# kernels on the first stored product (`_compiled`), not with this module: a float32 model never pays its
# ~60 MB and 0.3 s. MINIGEN_KERNELS=0 forces the NumPy reference path even where numba is installed.
HAVE_NUMBA = importlib.util.find_spec("numba") is not None
HAVE_KERNELS = HAVE_NUMBA and os.environ.get("MINIGEN_KERNELS", "1").strip() != "0"
TILE, GROUP = 64, 32
# from this many rows on, products go through float32 chunks and OpenBLAS. bench_kernels.py put the switch at 64
# rows on an idle AMD EPYC. On the busy Intel Xeon here, on one thread (as a long prompt's halves run, parallel.py),
# 2026-12-03: 8960 x 1536 Q4_K at 128 / 256 / 512 rows, kernel 73 / 146 / 304 ms, this path 94 / 143 / 185
# (OpenBLAS on the float32 values alone 55 / 98 / 162); SmolLM2's 3072 x 576 Q4_1 11.0 / 19.6 / 35.8 against
# 10.8 / 15.2 / 30.9. A 512-token prompt of Qwen2.5-Coder-0.5B Q4_K_M, whose halves of 256 rows took the kernel
# with the switch at 512, took 1.55x the float32 model's time; at 256, 1.28x; at 128, 1.33x.
BLAS_ROWS = 256
# On AMD's cores (kernels.ZEN) the kernel is as fast or faster at every count a forward pass gives a product (at
# most parallel.ROWS = 512 rows a thread). 2026-12-03, AMD EPYC (LLVM: znver5, AVX-512), one thread: 8960 x 1536
# Q4_K at 128 / 256 / 512 rows, kernel 28 / 50 / 89 ms, this path 42 / 70 / 138; 1536 x 8960 Q6_K 21 / 49 / 108
# against 41 / 74 / 143. A 512-token prompt as stored against float32: SmolLM2 0.94x with the switch at 256,
# 1.31x without; Qwen2.5-Coder-0.5B 0.88x, 1.28x (bench_stored.py --prompt-tokens 512). 2026-12-05, AMD EPYC Zen 3
# (AVX2), a prompt of SmolLM2-135M in one process, the kernel / this path / the float32 model, tok/s (medians of
# 8 rounds alternating): Q4_1 256 tokens 550 / 501 / 550, 512 tokens 586 / 549 / 601; the bfloat16 conversion
# 486 / 463 / 533 and 566 / 534 / 588; 4096 tokens (Q4_1, 2 rounds) 311 / 309 / 327.
BLAS_ROWS_ZEN = 1024
CHUNK = 4096       # outputs dequantized at a time on that path (4096 x 1536 float32: 25 MB): few large GEMMs,
                   # as each OpenBLAS call pays its threads' wake-up, dear on a busy machine
FLOATS = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
RUNS = tuple(FORMATS)   # every type a StoredMatrix holds


def refuse_type(tensor: str, type_name: str) -> MinigenError:
    """The error for a tensor whose type minigen does not run: raise it at load."""
    runs = ", ".join(RUNS)
    return MinigenError(f"{tensor}: GGUF type {type_name} is not one minigen runs (it runs {runs})")


def type_name(ggml_type: int, tensor: str) -> str:
    """GGUF's number of a tensor type -> its name, or the refusal naming the tensor."""
    if ggml_type in BY_GGML_TYPE:
        return BY_GGML_TYPE[ggml_type].name
    raise refuse_type(tensor, OTHER_GGML_TYPES.get(ggml_type, f"number {ggml_type}"))


@dataclass(frozen=True)
class StoredMatrix:
    type: str                 # "Q4_K", "BF16", ...
    shape: tuple[int, int]    # (out, in), HF's Linear shape: applied as x @ w.T
    tiles: np.ndarray         # (T, n_blocks, R, C) uint8, kernels.py's layout
    name: str = ""            # the tensor's name, for messages
    int8: bool = False        # products with activations rounded to int8 (times_int8), llama.cpp's arithmetic

    # --- made from -----------------------------------------------------------------------------------

    @classmethod
    def from_bytes(cls, raw: np.ndarray, type: str, shape: tuple[int, int], name: str = "") -> "StoredMatrix":
        """raw: the tensor's bytes as the file stores them, rows of blocks (out, row bytes) or flat,
        uint8 (a memory-mapped slice is fine: it is read once, here). shape: (out, in)."""
        if type not in FORMATS:
            raise refuse_type(name or "a tensor", type)
        out, n_in = (int(s) for s in shape)
        f = FORMATS[type]
        if n_in % f.block or np.asarray(raw).size != out * f.row_bytes(n_in):
            raise MinigenError(f"{name or 'a tensor'}: {np.asarray(raw).size} bytes do not hold a {type} "
                               f"matrix of shape ({out}, {n_in}) (rows of {n_in} must be whole blocks of {f.block})")
        raw = np.asarray(raw, dtype=np.uint8).reshape(out, -1)
        tiles = _tile_floats(raw, type, n_in) if type in FLOATS else _tile_blocks(raw, f.nbytes, type in UNPACKED_SCALES)
        return cls(type, (out, n_in), tiles, name)

    @classmethod
    def quantize(cls, w: np.ndarray, type: str, name: str = "") -> "StoredMatrix":
        """A float matrix (out, in) in `type`, by llama.cpp's rules (quantize.py)."""
        if type not in QUANTIZERS:
            raise MinigenError(f"{name or 'a tensor'}: cannot quantize to {type} (minigen quantizes to "
                               f"{', '.join(QUANTIZERS)})")
        block = FORMATS[type].block
        if w.ndim != 2 or w.shape[1] % block:
            raise MinigenError(f"{name or 'a tensor'}: shape {tuple(w.shape)} cannot be {type} "
                               f"(its rows must be whole blocks of {block} inputs)")
        return cls.from_bytes(quantize_rows(np.asarray(w, np.float32), type), type, w.shape, name)

    # --- what it is ------------------------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        return self.tiles.nbytes

    @property
    def size(self) -> int:
        """How many weights (out x in), as an array's size."""
        return self.shape[0] * self.shape[1]

    ndim = 2

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: slice) -> "StoredMatrix":
        """Rows lo..hi of the outputs, a StoredMatrix: a view of the tiles when lo is a multiple of 64 and
        hi is one or the end (Qwen3.5's q/k/v and gate rows of wqkv with head_dim 64, 128, 256), else a copy
        re-tiled from the file's bytes of those rows."""
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TypeError("a StoredMatrix takes a slice of rows (for single rows: .rows(ids))")
        lo, hi, _ = rows.indices(self.shape[0])
        hi = max(lo, hi)
        if (lo, hi) == (0, self.shape[0]):
            return self
        if lo % TILE == 0 and (hi % TILE == 0 or hi == self.shape[0]):
            return StoredMatrix(self.type, (hi - lo, self.shape[1]), self.tiles[lo // TILE:-(-hi // TILE)], self.name, self.int8)
        part = StoredMatrix.from_bytes(self.raw(slice(lo, hi)), self.type, (hi - lo, self.shape[1]), self.name)
        return replace(part, int8=self.int8)

    @property
    def groups(self) -> int:
        """Groups of 32 inputs in one block of the tiles."""
        return max(1, FORMATS[self.type].block // GROUP) if self.type not in FLOATS else 1

    def __repr__(self) -> str:
        return f"StoredMatrix({self.name!r}, {self.type}, {self.shape})"

    # --- values ------------------------------------------------------------------------------------------

    def raw(self, rows: slice = slice(None)) -> np.ndarray:
        """The file's bytes of these rows again, (n, row bytes) uint8: undoes the tiling."""
        out, n_in = self.shape
        lo, hi, _ = rows.indices(out)
        t0, t1 = lo // TILE, -(-hi // TILE)
        part = self.tiles[t0:t1]                              # (t, n_blocks, R, C)
        if self.type in FLOATS:
            size = np.dtype(FLOATS[self.type]).itemsize
            v = part.view(FLOATS[self.type])                   # (t, n_blocks, 32, 64)
            v = v.transpose(0, 3, 1, 2).reshape((t1 - t0) * TILE, -1)[:, :n_in]
            return np.ascontiguousarray(v[lo - TILE * t0:hi - TILE * t0]).view(np.uint8).reshape(hi - lo, n_in * size)
        rows_ = part.transpose(0, 3, 1, 2).reshape((t1 - t0) * TILE, *part.shape[1:3])   # (t·64, n_blocks, R)
        rows_ = rows_[lo - TILE * t0:hi - TILE * t0]
        return _file_blocks(rows_, self.type).reshape(hi - lo, -1)

    def dequantize(self, rows: slice = slice(None)) -> np.ndarray:
        """The float32 values (out, in) (or of a slice of the outputs), by formats.py's NumPy functions."""
        return dequantize_rows(self.raw(rows), self.type)

    def rows(self, ids) -> np.ndarray:
        """An embedding lookup: the values of rows `ids` (n,), (n, in) float32; only those are decoded."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.shape[0]):
            raise MinigenError(f"{self.name or 'an embedding'}: token id out of range 0..{self.shape[0] - 1}")
        f = FORMATS[self.type]
        t, j = ids // TILE, ids % TILE
        if self.type in FLOATS:
            v = self.tiles.view(FLOATS[self.type])[t, :, :, j]           # (n, n_blocks, 32)
            raw = np.ascontiguousarray(v.reshape(len(ids), -1)[:, :self.shape[1]]).view(np.uint8)
        else:
            raw = _file_blocks(self.tiles[t, :, :, j], self.type).reshape(len(ids), -1)   # (n, n_blocks·nbytes)
        return dequantize_rows(raw, f.name)

    # --- the product ---------------------------------------------------------------------------------------

    def times(self, x: np.ndarray, threads: int | None = None) -> np.ndarray:
        """x (N, in) float32 -> (N, out) = x @ self.dequantize().T; the kernel on `threads` of numba's
        threads (None: all)."""
        if HAVE_KERNELS and (len(x) < BLAS_ROWS or len(x) < blas_rows()):   # (a decode step asks nothing more)
            return self.times_int8(x, threads) if self.int8 else self._kernel(x, threads, False)
        return self.times_blas(x)

    def times_kernel(self, x: np.ndarray, threads: int | None = None) -> np.ndarray:
        """The numba kernel, whatever N (tests and benchmarks call it directly)."""
        return self._kernel(x, threads, False)

    def times_int8(self, x: np.ndarray, threads: int | None = None) -> np.ndarray:
        """x @ W.T with x rounded to int8 per block of 32 inputs and integer dot products (int8.py):
        llama.cpp's arithmetic, not exact; an option, for int8.TYPES (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K,
        Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS); a model multiplies its other types' matrices with the exact kernel."""
        int8 = _compiled()[1] if HAVE_KERNELS else None
        if not HAVE_KERNELS or self.type not in int8.TYPES:
            why = "numba is not installed" if not HAVE_KERNELS else f"int8 activations run {', '.join(int8.TYPES)}"
            raise MinigenError(f"{self.name or 'a tensor'}: {self.type} cannot be multiplied with int8 activations ({why})")
        return self._kernel(x, threads, True)

    def _kernel(self, x: np.ndarray, threads: int | None, int8: bool) -> np.ndarray:
        """The exact kernel or the int8 one (a model's types are checked at load). Lean: a decode step of a
        small model makes ~120 of these calls, each of its products taking tens of microseconds."""
        kernels, int8_kernels = _compiled()
        x = _padded_inputs(np.ascontiguousarray(x, dtype=np.float32), self.tiles.shape[1] * self.groups * GROUP)
        if threads is not None:
            with kernels.threads(threads):
                return self._kernel(x, None, int8)
        if int8:
            return int8_kernels.times_int8(self, x)
        kind = kernels.KINDS[self.type]
        if len(x) == 1 and kind in int8_kernels.WORKS24:   # a decode step: exact integer sums (int8.times_24)
            return int8_kernels.times_24(self, x)
        return kernels.times(kind, self.tiles, x, self.shape[0])

    def times_blas(self, x: np.ndarray) -> np.ndarray:
        """CHUNK outputs at a time dequantized to float32 (by the kernels' decoder on this thread where
        numba is installed, else by NumPy), each multiplied by OpenBLAS on its threads. The decoder
        keeps to the calling thread so that numba's threads never wait beside OpenBLAS's (decoding
        is a few % of a long product's time; with numba's threads in between, 128 rows of 8960 x
        1536 took 4-6x as long as the float32 product alone)."""
        out = self.shape[0]
        y = np.empty((len(x), out), np.float32)
        for lo in range(0, out, CHUNK):
            w_t = self.dequantize_fast(slice(lo, min(out, lo + CHUNK)), threads=1, scratch=True).T   # (in, chunk), rows strided
            y[:, lo:lo + w_t.shape[1]] = x @ w_t   # (matmul into a strided `out=` took NumPy's slow loop: 10x)
        return y

    def dequantize_fast(self, rows: slice = slice(None), threads: int | None = None, scratch: bool = False) -> np.ndarray:
        """dequantize(rows) by the compiled decoder when there is one (the same values), on `threads`
        of numba's threads (None: all). Made transposed: the result is a view (out, in) of an (in, out)
        array; with `scratch`, of this thread's scratch buffer (valid until its next use here)."""
        if not HAVE_KERNELS:
            return self.dequantize(rows)
        lo, hi, _ = rows.indices(self.shape[0])
        t0, t1 = lo // TILE, -(-hi // TILE)
        shape = (self.tiles.shape[1] * self.groups * GROUP, (t1 - t0) * TILE)
        w_t = scratch_buffer(shape) if scratch else np.empty(shape, np.float32)
        kernels = _compiled()[0]
        with kernels.threads(threads):
            kernels.dequantize(kernels.KINDS[self.type], self.tiles[t0:t1], w_t)
        return w_t[:self.shape[1], lo - TILE * t0:hi - TILE * t0].T


@dataclass(frozen=True)
class StoredRows:
    """A matrix (out, in) whose blocks of rows are kept in different types: a fused projection whose parts a
    GGUF stores in two types (a Q4_K_M file's Q4_K attn_q and attn_k beside a Q6_K attn_v). Each part is
    multiplied alone and the outputs placed side by side: x @ W.T = [x @ W_1.T, x @ W_2.T, ...]."""
    parts: tuple              # StoredMatrix, each (out_i, in)
    name: str = ""
    ndim = 2

    @property
    def shape(self) -> tuple[int, int]:
        return sum(p.shape[0] for p in self.parts), self.parts[0].shape[1]

    @property
    def type(self) -> str:
        return "+".join(dict.fromkeys(p.type for p in self.parts))

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"StoredRows({self.name!r}, {self.type}, {self.shape})"

    def times(self, x: np.ndarray, threads: int | None = None) -> np.ndarray:
        return np.concatenate([p.times(x, threads) for p in self.parts], axis=1)

    def dequantize(self) -> np.ndarray:
        return np.concatenate([p.dequantize() for p in self.parts])

    def rows(self, ids) -> np.ndarray:
        return self.dequantize()[np.asarray(ids, dtype=np.int64).reshape(-1)]

    def __getitem__(self, rows: slice) -> "StoredRows | StoredMatrix":
        """Rows lo..hi: each part's share of them (StoredMatrix's slices), one part as itself."""
        lo, hi, _ = rows.indices(self.shape[0])
        pieces, at = [], 0
        for p in self.parts:
            a, b = max(lo, at), min(hi, at + p.shape[0])
            if a < b:
                pieces.append(p[a - at:b - at])
            at += p.shape[0]
        return pieces[0] if len(pieces) == 1 else StoredRows(tuple(pieces), self.name)


STORED = (StoredMatrix, StoredRows)   # what linear() multiplies by its kernels


def stack(matrices: Sequence[StoredMatrix]) -> list[StoredMatrix]:
    """Experts (E, out, in) as E matrices of one type and shape: a list, each applied alone to the rows
    routed to it (moe.py's by_expert groups them)."""
    first = matrices[0]
    for m in matrices:
        if (m.type, m.shape) != (first.type, first.shape):
            raise MinigenError(f"{m.name}: expert of type {m.type} {m.shape} beside {first.type} {first.shape}")
    return list(matrices)


def _tile_blocks(raw: np.ndarray, nbytes: int, unpack_scales: bool = False) -> np.ndarray:
    """(out, n_blocks·nbytes) -> (T, n_blocks, R, 64): outputs padded with zero blocks (value 0); R = nbytes,
    or nbytes + 4 with `unpack_scales` (UNPACKED_SCALES: rows 4..15 become sc[8], m[8])."""
    out = len(raw)
    T = -(-out // TILE)
    blocks = raw.reshape(out, -1, nbytes)                                      # (out, n_blocks, nbytes)
    tiles = pages.empty((T, blocks.shape[1], nbytes + 4 if unpack_scales else nbytes, TILE), np.uint8)

    def fill(lo: int, hi: int) -> None:                                        # tiles lo..hi
        by_tile = _padded_rows(blocks, lo * TILE, hi * TILE).reshape(hi - lo, TILE, -1, nbytes).transpose(0, 2, 3, 1)
        part = tiles[lo:hi]                                                    # (t, n_blocks, R, 64)
        if not unpack_scales:
            part[...] = by_tile
            return
        part[:, :, :4], part[:, :, 20:] = by_tile[:, :, :4], by_tile[:, :, 16:]
        part[:, :, 4:12], part[:, :, 12:20] = scale_min_k4(np.ascontiguousarray(by_tile[:, :, 4:16]), axis=2)

    _in_parts(fill, T, tiles.nbytes)
    return tiles


def _padded_rows(a: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Rows lo..hi of `a`, zero rows past its end: a view when none are needed."""
    if hi <= len(a):
        return a[lo:hi]
    return np.concatenate([a[lo:], np.zeros((hi - max(lo, len(a)), *a.shape[1:]), a.dtype)])


def _in_parts(fill, T: int, nbytes: int) -> None:
    """fill(lo, hi) over tiles 0..T, in one part per core (parallel.n_threads) when the tiles are large:
    a load's tiling is a gather into fresh memory whose pages are first touched there, and NumPy's copies
    release the GIL. Loading Qwen2.5-Coder-1.5B Q4_K_M's matrices (an ad-hoc script, 5 runs in turn on
    2 cores): 0.80-0.91 s against 1.15-1.34 on one thread."""
    threads = n_threads() if nbytes >= SPLIT_BYTES else 1
    cuts = [T * i // threads for i in range(threads + 1)]
    in_threads([partial(fill, lo, hi) for lo, hi in zip(cuts, cuts[1:]) if hi > lo], threads)


SPLIT_BYTES = 1 << 22   # tiles of fewer bytes are made on the calling thread (a helper's start costs ~0.1 ms)


def _file_blocks(blocks: np.ndarray, type: str) -> np.ndarray:
    """Tile blocks (..., R) uint8 -> the file's bytes (..., nbytes), contiguous: repacks UNPACKED_SCALES."""
    if type not in UNPACKED_SCALES:
        return np.ascontiguousarray(blocks)
    lead = blocks.shape[:-1]
    packed = _pack_scale_min_k4(blocks[..., 4:12].reshape(-1, 8), blocks[..., 12:20].reshape(-1, 8))
    return np.concatenate([blocks[..., :4], packed.reshape(*lead, 12), blocks[..., 20:]], axis=-1)


def _tile_floats(raw: np.ndarray, type: str, n_in: int) -> np.ndarray:
    """(out, in·size) -> (T, ceil(in/32), 32, 64·size): inputs and outputs padded with zeros."""
    out = len(raw)
    v = raw.view(FLOATS[type]).reshape(out, n_in)
    T, nb = -(-out // TILE), -(-n_in // GROUP)
    tiles = pages.empty((T, nb, GROUP, TILE), v.dtype)

    def fill(lo: int, hi: int) -> None:                                        # tiles lo..hi
        rows = _padded_rows(v, lo * TILE, hi * TILE)                           # ((hi - lo)·64, in)
        if n_in != nb * GROUP:
            rows = np.concatenate([rows, np.zeros((len(rows), nb * GROUP - n_in), v.dtype)], axis=1)
        tiles[lo:hi] = rows.reshape(hi - lo, TILE, nb, GROUP).transpose(0, 2, 3, 1)

    _in_parts(fill, T, tiles.nbytes)
    return tiles.view(np.uint8)


_scratch: dict[int, np.ndarray] = {}   # thread id -> its buffer for dequantized chunks (times_blas)


def scratch_buffer(shape: tuple[int, int]) -> np.ndarray:
    """A float32 array of this shape in the calling thread's scratch buffer, kept between products: a
    fresh array per chunk pays its pages' first touch each time (dequantizing on one thread, 2026-12-03:
    8960 x 1536 Q4_K 44 ms into a fresh array, 31 into a buffer used before; 1536 x 8960 Q6_K 28 against
    17). `release_scratch` frees them all (run_layers, at the end of every forward pass)."""
    n, key = shape[0] * shape[1], threading.get_ident()
    buf = _scratch.get(key)
    if buf is None or buf.size < n:
        buf = _scratch[key] = np.empty(n, np.float32)
    return buf[:n].reshape(shape)


def release_scratch() -> None:
    """Drop every thread's scratch buffer (after a long prompt: decoding never uses them)."""
    _scratch.clear()


def _padded_inputs(x: np.ndarray, n: int) -> np.ndarray:
    """x (N, in) with zero columns up to n (a float matrix's inputs padded to whole groups of 32)."""
    if x.shape[1] == n:
        return x
    return np.concatenate([x, np.zeros((len(x), n - x.shape[1]), np.float32)], axis=1)


def vnni512() -> bool:
    """Whether this CPU has AVX-512 VNNI (with BW) and MINIGEN_AVX2 does not hide it: int8's 512-bit sums, and the
    exact product's one row in 24 bits (int8.times_24), as int8.VNNI512 says. Read from llvmlite, without loading
    numba (for `minigen info`)."""
    from llvmlite import binding
    features = binding.get_host_cpu_features()
    return bool(features.get("avx512vnni") and features.get("avx512bw")) and os.environ.get("MINIGEN_AVX2", "0").strip() != "1"


def blas_rows() -> int:
    """From how many rows `times` goes through float32 chunks and OpenBLAS on this CPU (with the kernels)."""
    return BLAS_ROWS_ZEN if _compiled()[0].ZEN else BLAS_ROWS


_modules: tuple = ()


def twins():
    """minigen.engine.compiled, numba's twins of a decode step's small steps, once the kernels are loaded (a
    stored matrix's first product); else None, the NumPy reference path: a float32 model never loads numba
    (~60 MB, 0.3 s), nor does one without numba or with MINIGEN_KERNELS=0."""
    global _twins
    if not HAVE_KERNELS or not _modules:
        return None
    if _twins is None:   # imported once: a decode step of SmolLM2 asks ~150 times
        from .. import compiled
        _twins = compiled
    return _twins


_twins = None


def compiled_before(types, int8_types=()) -> bool:
    """Whether numba's cache holds the one-row product of each of these types, and the int8 one of each of
    int8_types: a first forward compiles those it lacks, a few seconds each (kernels.in_cache; where numba's
    index is not laid out as 0.68's, whether the cache holds anything)."""
    kernels, int8 = _compiled()
    one = lambda kind: int8.WORKS24.get(kind) or kernels.WORKS[kind][kernels.ONE]   # the one-row product _kernel takes
    products = ([one(kernels.KINDS[t]) for t in types]
                + [int8.WORKS[kernels.KINDS[t]][0] for t in int8_types])
    try:
        return all(kernels.in_cache(fn) for fn in products)
    except Exception:   # another numba
        return not kernels.cache_is_new()


def warm(types, int8: bool = False) -> threading.Thread | None:
    """Load the kernels of these types (with `int8`, their int8 products too) from numba's cache on a helper
    thread while the caller goes on loading: numba's import and each kernel's loading took the first forward pass
    ~0.35 s for a Q4_K_M file's two types, and a loader's tiles are made meanwhile by NumPy, which lets go of the
    GIL. Only what the cache holds is loaded: what a first start compiles (seconds a kernel) is left to the first
    forward pass, which announces it. The thread (None: nothing to load); not a daemon, so that an exit waits
    for its loading rather than tearing LLVM down under it."""
    types = [t for t in dict.fromkeys(types) if t in FORMATS and t != "F32"]
    if not (HAVE_KERNELS and types):
        return None
    thread = threading.Thread(target=_warm, args=(types, int8), name="minigen-warm")
    thread.start()
    return thread


def _warm(types: list[str], int8: bool) -> None:
    """A product of a tile of zeros of each type for one row, two and many (what a prompt and a decode step
    take), on this thread alone, where the cache holds its kernel; any failure is left to the real product."""
    try:
        kernels, int8_kernels = _compiled()
        for t in types:
            kind, f = kernels.KINDS[t], FORMATS[t]
            m = StoredMatrix.from_bytes(np.zeros(TILE * f.nbytes, np.uint8), t, (TILE, f.block))
            for k in (1, 2, kernels.FEW + 1):
                way = kernels.WAYS[k] if k <= kernels.FEW else kernels.MANY
                work = int8_kernels.WORKS24.get(kind) if k == 1 else None
                products = [(work or kernels.WORKS[kind][way], m.times_kernel)]
                if int8 and kind in int8_kernels.WORKS:
                    products.append((int8_kernels.WORKS[kind][k != 1], m.times_int8))
                for work, times in products:
                    if kernels.in_cache(work):
                        times(np.zeros((k, f.block), np.float32), 1)
    except Exception:
        pass


def _compiled():
    """(kernels, int8): the numba modules, imported on first use (numba loads with them)."""
    global _modules
    if not _modules:
        from . import int8, kernels
        _modules = kernels, int8
    return _modules

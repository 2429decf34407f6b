"""Micro-benchmark of the stored-matrix kernels (minigen/engine/quant) against today's path, a float32
matrix (the same values, dequantized with NumPy) multiplied by OpenBLAS.

    python scripts/bench_kernels.py                         # every type, the shapes below, 1 ... 32 and 512 rows
    python scripts/bench_kernels.py --types Q4_K Q6_K --shapes 8960x1536 --rows 1 8 --repeat 15

For each type, shape and row count: the kernel's time (StoredMatrix.times_kernel), the float32 GEMM's
(x @ W.T), and StoredMatrix.times (which switches to dequantize-then-OpenBLAS at matrix.blas_rows()), each the
median of --repeat calls, the three alternated call by call so that a load that comes and goes touches
them alike; the kernel's bandwidth (stored bytes / time) and its fraction of this machine's, measured in
the same process first: a float32 GEMV over a 933 MB matrix (OpenBLAS, every thread) and a copy. With
--int8, also the int8-activation kernel (int8.py). The machine is shared: figures are rough; compare
ratios within one run.

    python scripts/bench_kernels.py --gguf /work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf

times instead every matrix of a real GGUF file, as one decode step multiplies them (one row each; the
token embedding only where it is also the output projection): their sum is the floor of a decode
step's time with these kernels, to hold against `llama-bench -t 2 -p 0 -n 32 -m FILE`.

Shapes: SmolLM2-135M (the default model): 49152x576 (tied embedding / lm_head), 3072x576 (gate and up
fused), 576x1536 (down), 960x576 (q, k, v fused); Qwen2.5-Coder-1.5B: 151936x1536 (lm_head),
8960x1536 (gate, up), 1536x8960 (down), 2048x1536 (q, k, v fused). Weights are random blocks with finite
scales (the kernels' speed does not depend on the values).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "18")   # as minigen/__init__.py sets it, before NumPy loads OpenBLAS
import numpy as np   # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from minigen.engine.quant import FORMATS, StoredMatrix   # noqa: E402
from minigen.engine.quant import matrix as matrix_module             # noqa: E402

INT8_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K")   # minigen.engine.quant.int8.TYPES
SHAPES = ["49152x576", "3072x576", "576x1536", "960x576", "151936x1536", "8960x1536", "1536x8960", "2048x1536"]
ROWS = [1, 2, 4, 8, 16, 32, 512]


def machine_bandwidth() -> dict[str, float]:
    """GB/s of a float32 GEMV over 933 MB (OpenBLAS) and of a 512 MB copy (read + write)."""
    w = np.random.default_rng(0).standard_normal((151936, 1536), dtype=np.float32)
    x = np.ones(1536, np.float32)
    gemv = w.nbytes / median([timed(lambda: w @ x) for _ in range(7)])
    a = np.ones(128 * 1024 * 1024, np.float32)
    b = np.empty_like(a)
    copy = 2 * a.nbytes / median([timed(lambda: np.copyto(b, a)) for _ in range(7)])
    return {"gemv": gemv / 1e9, "copy": copy / 1e9}


def timed(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def median(v) -> float:
    return float(np.median(v))


def make_matrix(name: str, out: int, n_in: int, rng) -> StoredMatrix:
    """Random blocks with finite scales (tests/quant_blocks.py): the kernels' speed does not depend on
    the values, and quantizing 233M weights with quantize.py's NumPy rules would take minutes."""
    from quant_blocks import random_matrix
    return StoredMatrix.from_bytes(random_matrix(name, out, n_in, rng), name, (out, n_in))


def bench(m: StoredMatrix, w32: np.ndarray, rows: int, repeat: int, int8) -> dict[str, float]:
    x = np.random.default_rng(rows).standard_normal((rows, m.shape[1]), dtype=np.float32)
    calls = {"kernel": lambda: m.times_kernel(x), "blas": lambda: x @ w32.T, "times": lambda: m.times(x)}
    if int8 is not None and rows <= 32 and m.type in INT8_TYPES:
        calls["int8"] = lambda: m.times_int8(x)
    if rows > 64:
        repeat = max(3, repeat // 4)
    for f in calls.values():
        f()
    times = {k: [] for k in calls}
    for _ in range(repeat):
        for k, f in calls.items():
            times[k].append(timed(f))
    return {k: median(v) for k, v in times.items()}


def bench_gguf(path: str, repeat: int, rows: int, int8) -> None:
    """Every projection of a real file, `rows` rows each: per type, and the sum (a decode step's floor)."""
    import gguf
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    tied = "output.weight" not in tensors
    mats = []
    for t in tensors.values():
        if len(t.shape) != 2 or (t.name == "token_embd.weight" and not tied):
            continue
        shape = (int(t.shape[1]), int(t.shape[0]))
        mats.append(StoredMatrix.from_bytes(np.asarray(t.data), t.tensor_type.name, shape, t.name))
    x = {m.shape[1]: np.random.default_rng(1).standard_normal((rows, m.shape[1]), dtype=np.float32) for m in mats}
    fns = {"kernel": lambda m: m.times_kernel(x[m.shape[1]])}
    if int8 is not None:   # the types int8 does not multiply go through the exact kernel there too
        fns["int8"] = lambda m: (m.times_int8 if m.type in INT8_TYPES else m.times_kernel)(x[m.shape[1]])
    for m in mats:
        for f in fns.values():
            f(m)
    total = {k: [] for k in fns}
    by_type = {k: {} for k in fns}    # kernel -> type -> [the sum over that type's matrices, per repeat]
    for _ in range(repeat):
        for k, f in fns.items():
            step = {}
            for m in mats:
                step[m.type] = step.get(m.type, 0.0) + timed(lambda: f(m))
            total[k].append(sum(step.values()))
            for name, dt in step.items():
                by_type[k].setdefault(name, []).append(dt)
    nbytes = sum(m.nbytes for m in mats)
    print(f"{path}: {len(mats)} matrices, {nbytes / 1e6:.0f} MB stored, {rows} row(s)")
    for k in fns:
        t = median(total[k])
        print(f"  {k}: all matrices {t * 1e3:.1f} ms per step ({1 / t:.1f} steps/s), {nbytes / t / 1e9:.1f} GB/s")
        for name, v in sorted(by_type[k].items()):
            count = sum(1 for m in mats if m.type == name)
            size = sum(m.nbytes for m in mats if m.type == name)
            weights = sum(m.shape[0] * m.shape[1] for m in mats if m.type == name)
            print(f"    {name}: {count} matrices, {size / 1e6:.0f} MB, {median(v) * 1e3:.1f} ms "
                  f"({size / median(v) / 1e9:.1f} GB/s, {weights / median(v) / 1e9:.1f} G weights/s)")


def bench_interplay(repeat: int) -> None:
    """The two thread pools side by side: a numba kernel (Q4_K 8960x1536, one row) alone, right after an
    OpenBLAS product on its threads (whose helpers then spin ~OPENBLAS_THREAD_TIMEOUT), and right after
    one with OpenBLAS kept to one thread (parallel.blas_alone); and the OpenBLAS product alone and right
    after a kernel (whose OpenMP helper spins in turn)."""
    from minigen.engine import parallel
    rng = np.random.default_rng(0)
    m = make_matrix("Q4_K", 8960, 1536, rng)
    x = rng.standard_normal((1, 1536), dtype=np.float32)
    a, b = rng.standard_normal((64, 1536), dtype=np.float32), rng.standard_normal((1536, 1536), dtype=np.float32)
    kernel, blas = (lambda: m.times_kernel(x)), (lambda: a @ b)
    cases = {"kernel alone": [], "kernel after OpenBLAS (2 threads)": [], "kernel after OpenBLAS (1 thread)": [],
             "OpenBLAS alone": [], "OpenBLAS after kernel": []}
    kernel(), blas()
    for _ in range(repeat):
        time.sleep(0.01)
        cases["kernel alone"].append(timed(kernel))
        blas()
        cases["kernel after OpenBLAS (2 threads)"].append(timed(kernel))
        with parallel.blas_alone():
            blas()
            cases["kernel after OpenBLAS (1 thread)"].append(timed(kernel))
        time.sleep(0.01)
        cases["OpenBLAS alone"].append(timed(blas))
        kernel()
        cases["OpenBLAS after kernel"].append(timed(blas))
    for name, v in cases.items():
        print(f"  {name:36s} {median(v) * 1e3:7.3f} ms (median of {repeat})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--types", nargs="+", default=list(FORMATS))
    p.add_argument("--shapes", nargs="+", default=SHAPES)
    p.add_argument("--rows", nargs="+", type=int, default=ROWS)
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--int8", action="store_true", help="also the int8-activation kernel (not exact)")
    p.add_argument("--gguf", help="time every matrix of this GGUF file instead (a decode step's products)")
    p.add_argument("--gguf-rows", type=int, default=1, help="rows per product with --gguf")
    p.add_argument("--interplay", action="store_true", help="numba's and OpenBLAS's threads side by side")
    args = p.parse_args()
    if not matrix_module.HAVE_KERNELS:
        sys.exit("numba is not installed: there is no kernel to measure")
    int8 = True if args.int8 else None
    if args.gguf:
        bench_gguf(args.gguf, args.repeat, args.gguf_rows, int8)
        return
    if args.interplay:
        bench_interplay(args.repeat)
        return
    bw = machine_bandwidth()
    print(f"machine: float32 GEMV {bw['gemv']:.1f} GB/s, copy {bw['copy']:.1f} GB/s (read + write); "
          f"fractions below are of the GEMV's")
    rng = np.random.default_rng(0)
    for shape in args.shapes:
        out, n_in = (int(v) for v in shape.split("x"))
        for name in args.types:
            if n_in % FORMATS[name].block:
                continue
            m = make_matrix(name, out, n_in, rng)
            w32 = m.dequantize_fast().copy()
            print(f"\n{name} {out}x{n_in}: {m.nbytes / 1e6:.1f} MB stored, {w32.nbytes / 1e6:.1f} MB float32")
            print("  rows  kernel ms   GB/s  of bw   x k=1 | blas ms  x k=1 | blas/kernel | times ms" +
                  ("  int8 ms  int8/kernel" if int8 and name in INT8_TYPES else ""))
            one = {}
            for rows in args.rows:
                t = bench(m, w32, rows, args.repeat, int8)
                one = one or t
                gbs = m.nbytes / t["kernel"] / 1e9
                line = (f"  {rows:4d}  {t['kernel'] * 1e3:9.3f}  {gbs:5.1f}  {gbs / bw['gemv']:5.2f}  {t['kernel'] / one['kernel']:5.2f}"
                        f" | {t['blas'] * 1e3:7.3f}  {t['blas'] / one['blas']:5.2f} | {t['blas'] / t['kernel']:11.2f}"
                        f" | {t['times'] * 1e3:8.3f}")
                if "int8" in t:
                    line += f"  {t['int8'] * 1e3:7.3f}  {t['int8'] / t['kernel']:11.2f}"
                print(line, flush=True)


if __name__ == "__main__":
    main()

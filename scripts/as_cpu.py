"""Run a command as minigen would run on another kind of CPU, on this one: the suite's faults that show on one
machine only (the last digit of a float32 sum, a kernel's branch by CPU) found before CI or a user meets them.

    python scripts/as_cpu.py intel -- python -m pytest -q      # an Intel Xeon (Sapphire Rapids) with AVX-512
    python scripts/as_cpu.py zen3 -- python -m pytest -q       # an AMD Zen 3: AVX2 and FMA, no AVX-512, no VNNI

What differs between these machines in minigen's arithmetic, and what this sets for the command:
- LLVM's target for numba's code (minigen's kernels and twins): its tuning for that CPU (Intel's AVX-512 parts
  prefer 256-bit vectors in loops LLVM vectorises; so the sums' order differs), and for zen3 the host's features
  without AVX-512 or VNNI. `llvmlite.binding.get_host_cpu_name` and `get_host_cpu_features` are patched by a
  `sitecustomize` in a temporary directory put first on PYTHONPATH (children inherit it), which also makes
  minigen's vendor checks (kernels.ZEN: matrix.blas_rows) answer as that CPU;
- OpenBLAS's kernels (`OPENBLAS_CORETYPE`: SkylakeX's AVX-512 GEMMs on Intel, Haswell's on Zen);
- NumPy's dispatch (zen3: `NPY_DISABLE_CPU_FEATURES` drops its AVX-512 loops), and for zen3 `MINIGEN_AVX2=1`
  (the kernels' 8-lane forms);
- numba's cache (`NUMBA_CACHE_DIR`, a fresh directory: compiled code for this CPU is not that CPU's).

It cannot emulate what this CPU lacks (an instruction the other has) nor any speed: it is for correctness only.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CPUS = {
    "intel": dict(name="sapphirerapids", drop=(), env={"OPENBLAS_CORETYPE": "SkylakeX"}),
    "zen3": dict(name="znver3", drop=("avx512", "avxvnni", "amx", "evex512", "avx10"),
                 env={"OPENBLAS_CORETYPE": "Zen", "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL",
                      "MINIGEN_AVX2": "1"}),
}

SITECUSTOMIZE = """import llvmlite.binding as _b
_features = _b.get_host_cpu_features


def _as_that_cpu():
    f = _features()
    for k in list(f):
        if k.startswith({drop!r}):
            f[k] = False
    return f


_b.get_host_cpu_features = _as_that_cpu
_b.get_host_cpu_name = lambda: {name!r}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cpu", choices=sorted(CPUS))
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command: as_cpu.py CPU -- COMMAND ...")
    cpu = CPUS[args.cpu]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sitecustomize.py").write_text(SITECUSTOMIZE.format(drop=tuple(cpu["drop"]), name=cpu["name"]))
        env = dict(os.environ, **cpu["env"], NUMBA_CACHE_DIR=str(Path(tmp) / "numba"),
                   PYTHONPATH=os.pathsep.join(p for p in (tmp, os.environ.get("PYTHONPATH")) if p))
        sys.exit(subprocess.run(command, env=env).returncode)


if __name__ == "__main__":
    main()

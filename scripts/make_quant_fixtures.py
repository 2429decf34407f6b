"""Fixtures for minigen.engine.quant (tests/test_quant_*.py), from llama.cpp and from real GGUF files.

    python scripts/make_quant_fixtures.py [LLAMA_CPP_DIR]

LLAMA_CPP_DIR is a llama.cpp tree with a CMake build in build/ (default: the one minigen's helpers
build, ~/.cache/minigen-llama-cpp/llama_cpp_python-0.3.36/vendor/llama.cpp). Writes, under
tests/fixtures/quant/:

- `llama_quantize.npz`: float32 matrices (random rows of many scales, and rows made to hit the rules'
  corners: zeros, a constant, all positive, all negative, one outlier, values near float16's limits)
  and their bytes from llama.cpp's own `ggml_quantize_chunk` without an importance matrix (what
  llama-quantize calls), for each type the quantizer of minigen implements: key `<TYPE>`. A small C
  driver is linked against the tree's build/ggml/src/libggml-base.a (the object llama-quantize uses).
- `real_blocks.npz`: the first rows of a few tensors of each type in real files (Qwen2.5-Coder-0.5B and
  1.5B Q4_K_M in /work/models, the default model's SmolLM2-135M Q4_1): key `<file>:<tensor>` -> raw
  bytes (rows, row bytes) uint8, and `<key>:type` its GGUF type name. Tests dequantize these with
  gguf-py and with minigen.

Needs: gcc, the built tree, the real files; gguf-py (a minigen dependency) to read them.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "quant"
LLAMA = Path(os.path.expanduser("~/.cache/minigen-llama-cpp/llama_cpp_python-0.3.36/vendor/llama.cpp"))
TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "BF16": 30, "F16": 1}

DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include "ggml.h"
/* quantize rows*cols float32 from argv[2] into argv[3] as ggml type argv[1], no imatrix */
int main(int argc, char ** argv) {
    int type = atoi(argv[1]); long rows = atol(argv[4]), cols = atol(argv[5]);
    float * src = malloc(rows * cols * sizeof(float));
    FILE * f = fopen(argv[2], "rb"); fread(src, sizeof(float), rows * cols, f); fclose(f);
    size_t size = ggml_row_size(type, cols) * rows;
    void * dst = malloc(size);
    size_t n = ggml_quantize_chunk(type, src, dst, 0, rows, cols, NULL);
    f = fopen(argv[3], "wb"); fwrite(dst, 1, n, f); fclose(f);
    return n == size ? 0 : 1;
}
"""


def test_matrix(rng: np.random.Generator) -> np.ndarray:
    """(96, 512) float32: 64 random rows of scales 1e-4 ... 30, then 32 rows of corner cases."""
    x = rng.standard_normal((96, 512)).astype(np.float32) * np.exp(rng.uniform(-9, 3.4, (96, 1))).astype(np.float32)
    x[64] = 0
    x[65] = 0.37
    x[66] = np.abs(x[66])
    x[67] = -np.abs(x[67])
    x[68, ::37] = 40.0                                     # outliers
    x[69] = rng.uniform(0, 1, 512).astype(np.float32)      # min > 0
    x[70] = np.round(x[70] * 4) / 4                        # many ties
    x[71] = rng.standard_normal(512).astype(np.float32) * 6e4   # near float16's largest
    x[72] = rng.standard_normal(512).astype(np.float32) * 1e-6  # scales in float16's subnormals
    x[73, :256] = 0                                         # a zero super-block beside a live one
    x[74] = np.repeat(rng.standard_normal(16).astype(np.float32), 32)   # constant blocks
    x[75] = np.tile(np.linspace(-1, 1, 32, dtype=np.float32), 16)
    x[76] = (rng.integers(-8, 8, 512)).astype(np.float32)  # exactly representable codes
    x[77] = rng.laplace(size=512).astype(np.float32)
    return x


def build_driver(llama: Path, tmp: Path) -> Path:
    """DRIVER compiled in tmp, linked against the tree's libggml-base.a: the path of the program."""
    (tmp / "driver.c").write_text(DRIVER)
    exe = tmp / "driver"
    subprocess.run(["gcc", "-O2", str(tmp / "driver.c"), "-o", str(exe),
                    f"-I{llama}/ggml/include", str(llama / "build/ggml/src/libggml-base.a"),
                    "-lm", "-lstdc++", "-fopenmp", "-lpthread"], check=True)
    return exe


def llama_quantize(x: np.ndarray, llama: Path) -> dict[str, np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        exe = build_driver(llama, tmp)
        x.tofile(tmp / "x.f32")
        out = {}
        for name, number in TYPES.items():
            subprocess.run([str(exe), str(number), str(tmp / "x.f32"), str(tmp / "q.bin"), *map(str, x.shape)], check=True)
            out[name] = np.fromfile(tmp / "q.bin", np.uint8).reshape(len(x), -1)
        return out


def real_blocks(rows: int = 16) -> dict[str, np.ndarray]:
    import gguf
    from minigen.gguf import default_model
    files = {"qwen0.5b": "/work/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
             "qwen1.5b": "/work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
             "smollm2": str(default_model.gguf_source())}
    wanted = {"qwen0.5b": ["blk.0.ffn_down.weight", "blk.0.ffn_gate.weight", "blk.0.attn_v.weight",
                           "blk.11.ffn_down.weight", "token_embd.weight"],
              "qwen1.5b": ["blk.0.ffn_down.weight", "blk.0.ffn_gate.weight", "blk.0.attn_v.weight",
                           "blk.11.ffn_down.weight", "output.weight"],
              "smollm2": ["blk.0.ffn_down.weight", "blk.0.attn_q.weight", "token_embd.weight"]}
    out = {}
    for short, path in files.items():
        tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
        for name in wanted[short]:
            t = tensors[name]
            key = f"{short}:{name}"
            out[key] = np.array(t.data[:rows])
            out[f"{key}:type"] = np.array(t.tensor_type.name)
    return out


def main() -> None:
    llama = Path(sys.argv[1]) if len(sys.argv) > 1 else LLAMA
    OUT.mkdir(parents=True, exist_ok=True)
    x = test_matrix(np.random.default_rng(33))
    np.savez_compressed(OUT / "llama_quantize.npz", x=x, **llama_quantize(x, llama))
    np.savez_compressed(OUT / "real_blocks.npz", **real_blocks())
    for f in sorted(OUT.glob("*.npz")):
        print(f.relative_to(ROOT), f.stat().st_size, "bytes")


if __name__ == "__main__":
    main()

"""minigen.engine.quant.quantize: llama.cpp's quantization rules, byte for byte.

Against llama.cpp's own compiled quantizer (ggml_quantize_chunk from libggml-base, what llama-quantize
calls without an importance matrix) on matrices made to hit the rules' corners
(tests/fixtures/quant/llama_quantize.npz, scripts/make_quant_fixtures.py), and against gguf-py's
quantizer where it has one, on random matrices made here. gguf-py and llama.cpp differ in one case, a
block of zeros, where the sign of its zero scale differs (minigen follows llama.cpp): tested too."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import quantize as gguf_quantize

from minigen.engine.quant.formats import FORMATS, dequantize
from minigen.engine.quant.quantize import QUANTIZERS, quantize_rows

FIXTURE = Path(__file__).parent / "fixtures" / "quant" / "llama_quantize.npz"
BY_GGUF_PY = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]


@pytest.fixture(scope="module")
def llama():
    with np.load(FIXTURE) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "F16", "BF16"])
def test_bytes_equal_llama_cpp(llama, name):
    with np.errstate(all="ignore"):
        mine = quantize_rows(llama["x"], name)
    assert mine.shape == llama[name].shape
    differ = np.flatnonzero((mine != llama[name]).any(axis=1))
    assert differ.size == 0, f"{name}: rows {differ.tolist()} differ from llama.cpp's"


def test_the_fixture_covers_the_corners(llama):
    """Rows that take the rules' rare branches: an all-zero block, a constant one, one where the
    minimum is positive, ties, float16 subnormal scales, values near float16's largest."""
    x = llama["x"]
    blocks = x.reshape(-1, 32)
    assert (np.abs(blocks).max(axis=1) == 0).any()
    assert ((blocks.max(axis=1) == blocks.min(axis=1)) & (blocks[:, 0] != 0)).any()
    assert (blocks.min(axis=1) > 0).any()
    assert np.abs(x).max() > 6e4 and (np.abs(blocks).max(axis=1) < 1e-5).any()
    q4k = llama["Q4_K"].reshape(-1, 144)
    assert (q4k[:, 0:2].view(np.float16) == 0).any() and (q4k[:, 0:2].view(np.float16) != 0).any()


def random_rows(rng, n=48, n_in=512):
    x = rng.standard_normal((n, n_in)).astype(np.float32) * np.exp(rng.uniform(-6, 3, (n, 1))).astype(np.float32)
    x[1] = np.abs(x[1])
    x[2, ::7] = 0
    x[3] = np.round(x[3] * 2) / 2
    return x


@pytest.mark.parametrize("name", BY_GGUF_PY)
def test_bytes_equal_gguf_py(name):
    """Every block but the all-zero ones (below) byte for byte."""
    x = random_rows(np.random.default_rng(FORMATS[name].ggml_type))
    mine = quantize_rows(x, name)
    theirs = gguf_quantize(x, gguf.GGMLQuantizationType[name]).view(np.uint8).reshape(mine.shape)
    f = FORMATS[name]
    zero = (x.reshape(-1, f.block) == 0).all(axis=1)
    mine_b, theirs_b = mine.reshape(-1, f.nbytes), theirs.reshape(-1, f.nbytes)
    assert np.array_equal(mine_b[~zero], theirs_b[~zero])
    assert np.array_equal(dequantize(mine_b[zero], name), dequantize(theirs_b[zero], name))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_a_zero_block_where_gguf_py_differs(name):
    """+0 and -0 only: llama.cpp's d is -0 for Q4_0/Q5_0 (+0 / -8) and its min the first zero for
    Q4_1/Q5_1; gguf-py takes the first zero and NumPy's minimum. Only that scale's sign bit differs,
    never a value."""
    x = np.zeros((1, 32), np.float32)
    x[0, ::2] = -0.0
    mine = quantize_rows(x, name)
    theirs = gguf_quantize(x, gguf.GGMLQuantizationType[name]).view(np.uint8).reshape(mine.shape)
    assert np.array_equal(dequantize(mine, name), dequantize(theirs, name))
    if name in ("Q4_0", "Q5_0"):
        assert mine[0, 1] == 0x80   # -0.0 as float16
    assert (mine != theirs).sum() == 1


@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_values_are_within_a_step(name):
    """dequantize(quantize(w)) is w to within the type's step (a sanity check on the layout)."""
    x = random_rows(np.random.default_rng(7), n=16)
    w = dequantize(quantize_rows(x, name), name)
    blocks = np.abs(x).reshape(16, -1, 32).max(axis=2, keepdims=True)
    step = {"F32": 0, "F16": 1e-3, "BF16": 8e-3, "Q8_0": 1 / 127, "Q4_0": 1 / 7, "Q4_1": 2 / 15,
            "Q5_0": 1 / 15, "Q5_1": 2 / 31, "Q4_K": 0.3}[name]
    assert (np.abs(w - x).reshape(16, -1, 32) <= step * blocks + 1e-30).all()

"""minigen.engine.quant.formats: each GGUF type's NumPy dequantizer equals gguf-py's bit for bit, on
random bytes (every bit pattern, NaN and infinite scales included), on blocks of real files (the two
Qwen2.5-Coder Q4_K_M GGUFs and the default model's Q4_1, tests/fixtures/quant/real_blocks.npz) and on
every tensor of the llama-quantize zoo (tests/fixtures/gguf/quants.gguf, scripts/make_gguf_fixtures.py).
Q8_K, which gguf-py does not dequantize, against values built by hand."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from minigen.engine.quant.formats import FORMATS, OTHER_GGML_TYPES, dequantize, scale_min_k4

FIXTURES = Path(__file__).parent / "fixtures"
BY_GGUF_PY = [name for name in FORMATS if name != "Q8_K"]


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def test_the_table_is_gguf_s():
    for name, f in FORMATS.items():
        t = gguf.GGMLQuantizationType[name]
        assert (f.ggml_type, (f.block, f.nbytes)) == (int(t), gguf.GGML_QUANT_SIZES[t])
    for number, name in OTHER_GGML_TYPES.items():
        assert gguf.GGMLQuantizationType(number).name == name


@pytest.mark.parametrize("name", BY_GGUF_PY)
def test_random_bytes_equal_gguf_py(name):
    f = FORMATS[name]
    rng = np.random.default_rng(FORMATS[name].ggml_type)
    raw = rng.integers(0, 256, (13, f.nbytes * (4 if f.block > 1 else 256)), dtype=np.uint8)
    with np.errstate(all="ignore"):
        mine, theirs = dequantize(raw, name), gguf_dequantize(raw, gguf.GGMLQuantizationType[name])
    assert mine.shape == theirs.shape == (13, raw.shape[1] // f.nbytes * f.block)
    assert np.array_equal(bits(mine), bits(theirs))


def test_real_blocks_equal_gguf_py():
    with np.load(FIXTURES / "quant" / "real_blocks.npz") as z:
        keys = [k for k in z.files if not k.endswith(":type")]
        seen = set()
        for key in keys:
            name = str(z[f"{key}:type"])
            seen.add(name)
            mine, theirs = dequantize(z[key], name), gguf_dequantize(z[key], gguf.GGMLQuantizationType[name])
            assert np.array_equal(bits(mine), bits(theirs)), key
            assert np.isfinite(mine).all() and np.abs(mine).max() > 0, key
    assert seen == {"Q4_K", "Q6_K", "Q5_0", "Q8_0", "Q4_1"}


def test_llama_quantize_zoo_equals_gguf_py():
    seen = set()
    for t in gguf.GGUFReader(FIXTURES / "gguf" / "quants.gguf").tensors:
        if t.tensor_type.name in FORMATS and len(t.shape) == 2:
            seen.add(t.tensor_type.name)
            raw = np.asarray(t.data).view(np.uint8).reshape(int(t.shape[1]), -1)
            mine = dequantize(raw, t.tensor_type.name)
            theirs = gguf_dequantize(raw, t.tensor_type).reshape(mine.shape)
            assert np.array_equal(bits(mine), bits(theirs)), t.name
    assert seen == set(BY_GGUF_PY) - {"F32"}


def test_q8_k_by_hand():
    rng = np.random.default_rng(15)
    d = np.array([0.5, -3e-4], np.float32)
    q = rng.integers(-128, 128, (2, 256)).astype(np.int8)
    bsums = q.reshape(2, 16, 16).sum(-1).astype(np.int16)
    raw = np.concatenate([d.view(np.uint8).reshape(2, 4), q.view(np.uint8), bsums.view(np.uint8).reshape(2, 32)], axis=1)
    assert raw.shape == (2, FORMATS["Q8_K"].nbytes)
    assert np.array_equal(dequantize(raw, "Q8_K"), d[:, None] * q.astype(np.float32))


def test_scale_min_k4_is_ggml_s():
    """get_scale_min_k4 written as ggml-quants.c does, byte by byte, against the vectorised one."""
    q = np.random.default_rng(4).integers(0, 256, (50, 12), dtype=np.uint8)
    sc, m = scale_min_k4(q)
    for row in range(50):
        for j in range(8):
            if j < 4:
                want = (q[row, j] & 63, q[row, j + 4] & 63)
            else:
                want = ((q[row, j + 4] & 0xF) | ((q[row, j - 4] >> 6) << 4), (q[row, j + 4] >> 4) | ((q[row, j] >> 6) << 4))
            assert (sc[row, j], m[row, j]) == want

"""Random matrices of every stored type, for tests/test_quant_*.py: random bytes with finite scales.

Codes are any bytes (every bit pattern a block can hold); the float16 scales (and Q8_K's float32 one)
are replaced with finite values of either sign spanning several orders of magnitude, so that products
are finite and compare with a tolerance. Float matrices are random normal values.
"""
from __future__ import annotations

import numpy as np

from minigen.engine.quant.formats import FORMATS

# byte offsets of each block type's float16 scales (d, m, dmin) and of Q8_K's float32 d
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
              "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "Q8_K": [],
              "IQ4_NL": [0], "IQ4_XS": [0]}


def random_matrix(name: str, out: int, n_in: int, rng: np.random.Generator) -> np.ndarray:
    """(out, row bytes) uint8: a matrix (out, n_in) of type `name` as a GGUF file stores it."""
    f = FORMATS[name]
    if f.block == 1:
        v = rng.standard_normal((out, n_in)).astype(np.float32)
        if name == "F16":
            return v.astype(np.float16).view(np.uint8)
        if name == "BF16":
            return (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return v.view(np.uint8)
    blocks = rng.integers(0, 256, (out, n_in // f.block, f.nbytes), dtype=np.uint8)
    for at in F16_FIELDS[name]:
        blocks[..., at:at + 2] = _scales(rng, blocks.shape[:2]).astype(np.float16)[..., None].view(np.uint8)
    if name == "Q8_K":
        blocks[..., 0:4] = _scales(rng, blocks.shape[:2])[..., None].view(np.uint8)
    return blocks.reshape(out, -1)


def _scales(rng, shape) -> np.ndarray:
    return (rng.choice([-1, 1], shape) * np.exp(rng.uniform(-9, 0, shape))).astype(np.float32)

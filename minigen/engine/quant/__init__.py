"""Weights kept in their checkpoint's own type, and the kernels that multiply by them.

    from minigen.engine.quant import StoredMatrix, HAVE_KERNELS
    w = StoredMatrix.from_bytes(raw, "Q4_K", (out, in), name)   # raw: the file's bytes of the tensor
    y = w.times(x)                                             # x (N, in) float32 -> x @ W.T (N, out)

| module | what |
| --- | --- |
| formats.py | each GGUF type's block layout and the NumPy function that defines its values |
| quantize.py | llama.cpp's quantization rules (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, F16, BF16) |
| kernels.py | the numba kernels: the layout they read, the product, the compiled decoder |
| int8.py | the product with activations rounded to int8 per block of 32 (llama.cpp's way; not exact; an option) |
| matrix.py | StoredMatrix, what the engine holds, and the refusal of a type it does not run |

May import: numpy, numba (optional: without it every product goes through NumPy and OpenBLAS), and
`minigen.errors`.
"""
from . import matrix
from .formats import FORMATS
from .matrix import HAVE_KERNELS, RUNS, STORED, StoredMatrix, StoredRows, refuse_type, stack, type_name, warm
from .quantize import QUANTIZERS

__all__ = ["FORMATS", "HAVE_KERNELS", "QUANTIZERS", "RUNS", "STORED", "StoredMatrix", "StoredRows", "kernels_on",
           "refuse_type", "stack", "type_name", "warm"]


def kernels_on() -> bool:
    """Whether stored matrices are multiplied by the kernels (numba installed, MINIGEN_KERNELS not 0). Without
    them a loader keeps nothing stored: each product would dequantize its matrix again (the NumPy path), so
    the weights are dequantized once, at load, and the engine runs as it did on float32."""
    return matrix.HAVE_KERNELS

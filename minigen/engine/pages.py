"""Large arrays in 4 KB pages, for memory that is filled a part at a time.

NumPy asks the kernel for 2 MB pages (`madvise(MADV_HUGEPAGE)`) for every array of 4 MB or more. Two kinds
of minigen's arrays are better without them:

- the stored weights' tiles (quant/matrix.py), a whole model's worth of fresh memory at load: their first
  touch cost 1.5-3.5 s a GiB in huge pages on a VM here (the host backs each afresh) against 0.5-0.6 s in
  4 KB pages; the kernels' streaming reads ran as fast either way (llama.cpp's mapped file is in 4 KB
  pages too);
- the KV caches (cache.py), whose keys are stored transposed, (KV, d, capacity): the first positions of
  every row touch every 2 MB page of the buffer, so in huge pages a cache is resident at its whole capacity
  however little of it is filled. A batch's pool of 8 slots (SmolLM2's 30 layers), one sequence of 4,200
  positions beside seven of 320, took 2.9 GB in huge pages, 0.47 GB in 4 KB pages.

An anonymous memory map of the array's own, advised against huge pages (where the system would make them
unasked, transparent huge pages "always"), is in 4 KB pages, and fresh from the kernel, so already zero;
it is unmapped when the array goes. Below 4 MB, and on Windows (no anonymous map of this kind), the
arrays are NumPy's, which it does not advise.
"""
from __future__ import annotations

import mmap

import numpy as np

ADVISED = 1 << 22   # NumPy's threshold for asking for huge pages


def empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An array whose contents do not matter yet (a fresh map is zero all the same)."""
    return _own_map(shape, dtype, np.empty)


def zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zeroed array: its pages are touched only where it is later written."""
    return _own_map(shape, dtype, np.zeros)


def _own_map(shape: tuple[int, ...], dtype, numpy_way) -> np.ndarray:
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if n < ADVISED or not hasattr(mmap, "MAP_ANONYMOUS"):
        return numpy_way(shape, dtype)
    memory = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:   # so also where the system makes huge pages unasked (THP "always")
        memory.madvise(mmap.MADV_NOHUGEPAGE)
    except (AttributeError, OSError):   # no such advice here (a kernel without huge pages: none to avoid)
        pass
    return np.frombuffer(memory, dtype).reshape(shape)

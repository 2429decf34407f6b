"""Both cores for a long prompt: minigen's own threads, with OpenBLAS kept to one thread meanwhile.

NumPy's ufuncs (exp, the norms, SiLU, the softmax arithmetic) run on one core and release the GIL;
OpenBLAS runs each matrix product on every core. Left alone, a long prompt's forward pass uses half
the machine between its GEMMs. So from SPLIT_ROWS rows on, the forward pass hands out whole pieces of
work (a chunk of rows, from the norm to the MLP; a block of queries in attention) to `n_threads()`
threads, the calling one included, each calling OpenBLAS single-threaded. Shorter inputs and hooked
runs stay on the calling thread with OpenBLAS threading its products as usual: there its two-thread
GEMM (one packed copy of the weights for both cores) beats two single-threaded GEMMs on half the rows
each by more than the ufuncs gain (128 rows: 30 % slower split; 512 rows: 5 % faster). A decode step
(up to DECODE_ROWS rows) stays on the calling thread, and while other processes keep a core busy it
runs with OpenBLAS on one thread (`for_decode`): its ~100 GEMVs and small products each wait for
OpenBLAS's helper thread, which is then often off its core (2-4x slower decoding on 2 cores beside
one other busy process; 1.4-1.6x faster on the idle machine).

The two kinds of threads must not overlap. OpenBLAS's idle threads spin after each call, 2^28 cycles
(~0.1 s) by default, on the cores our threads want: a prompt started right after a decode step ran at
half speed. minigen/__init__.py sets OPENBLAS_THREAD_TIMEOUT=18 (2^18 cycles, ~0.1 ms, still longer than
the gaps between a float32 decode step's products) unless set; OpenBLAS reads it once, when NumPy loads it.
It was 22 (~1.5 ms) until a stored model's prompt showed the cost: each of its layers hands the cores from
OpenBLAS (attention) to numba's kernels (the projections), and the helper's spin took a core from the
kernel after it. A 128-token prompt of SmolLM2-135M Q4_1 (AMD Zen 3, 4 rounds alternating, one process
per setting): 272-361 ms at 22, 221-255 at 16 and 224-250 at 18, the float32 model beside it 219-260
at every setting, and its decode step 21.8-26.9 ms at each.

OpenBLAS's thread count is set through its C API (`openblas_set_num_threads`), looked up with ctypes
in the copy NumPy loaded. Without one (NumPy built on MKL or Accelerate, or OPENBLAS_NUM_THREADS=1)
`n_threads()` is 1 and everything runs on the calling thread.
"""
from __future__ import annotations

import ctypes
import glob
import os
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager, nullcontext
from functools import lru_cache, partial
from typing import Callable, Sequence

import numpy as np

SPLIT_ROWS = 512   # from here on a forward pass splits its work (measured on 2 cores, see above)
DECODE_ROWS = 16   # up to here a forward pass is a decode step (or a few drafts): GEMVs and small products
ROWS = 512         # rows per chunk: GEMMs near full speed, MLP temporaries of a few MB


@lru_cache(maxsize=1)
def _openblas():
    """(set_num_threads, get_num_threads) of the OpenBLAS NumPy loaded, or None."""
    for path in _openblas_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in [("scipy_openblas", "64_"), ("scipy_openblas", ""), ("openblas", "64_"), ("openblas", "")]:
            get, put = (getattr(lib, f"{prefix}_{f}_num_threads{suffix}", None) for f in ("get", "set"))
            if get and put:
                put.argtypes, get.restype = [ctypes.c_int], ctypes.c_int
                return put, get
    return None


def _openblas_paths() -> list[str]:
    """Where the loaded OpenBLAS is: from the process's mappings on Linux, else NumPy's bundled copy."""
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if "openblas" in line.rsplit("/", 1)[-1]})
    except OSError:
        root = os.path.dirname(os.path.dirname(np.__file__))
        return sorted(glob.glob(os.path.join(root, "numpy*libs", "*openblas*")) +
                      glob.glob(os.path.join(root, "numpy", ".dylibs", "*openblas*")))


@lru_cache(maxsize=1)
def n_threads() -> int:
    """How many threads a long prompt's forward pass uses: as many as OpenBLAS had at first use."""
    blas = _openblas()
    return 1 if blas is None else max(1, blas[1]())


def threads_for(n_rows: int) -> int:
    """How many threads a forward pass over n_rows rows uses: all of them from SPLIT_ROWS on, else one."""
    return n_threads() if n_rows >= SPLIT_ROWS else 1


def row_chunks(n_rows: int) -> list[slice]:
    """The rows of a forward pass cut for `by_rows`: one chunk below SPLIT_ROWS, else chunks of at most
    ROWS rows, as many as a multiple of the thread count so that no thread idles."""
    threads = threads_for(n_rows)
    if threads == 1:
        return [slice(0, n_rows)]
    n = threads * -(-n_rows // (ROWS * threads))
    return [slice(n_rows * i // n, n_rows * (i + 1) // n) for i in range(n)]


_local = threading.local()   # .worker: True while a thread runs tasks, where `in_threads` must not wait on the pool
_lock = threading.RLock()    # one `blas_alone` at a time (nested ones: the same), so that each gives OpenBLAS back the threads it found
_pool: tuple[int, ThreadPoolExecutor] | None = None


def in_threads(tasks: Sequence[Callable[[], object]], threads: int) -> list:
    """Each task's result, in order. One thread (or task): called here. Else the calling thread and
    threads - 1 helpers take tasks in order as they come free (so put the longest first), with
    OpenBLAS on one thread meanwhile."""
    if threads == 1 or len(tasks) == 1 or getattr(_local, "worker", False):
        return [task() for task in tasks]
    todo, results = queue.SimpleQueue(), [None] * len(tasks)
    for item in enumerate(tasks):
        todo.put(item)

    def work():
        _local.worker = True
        try:
            while True:
                try:
                    i, task = todo.get_nowait()
                except queue.Empty:
                    return
                results[i] = task()
        finally:
            _local.worker = False

    n_helpers = min(threads, n_threads()) - 1   # n_threads() is cached at first use: before put(1)
    with blas_alone():
        helpers = [pool().submit(work) for _ in range(n_helpers)]
        try:
            work()
        finally:
            wait(helpers)
        for helper in helpers:
            helper.result()   # raises a helper's exception here
    return results


@contextmanager
def blas_alone():
    """OpenBLAS on one thread meanwhile, as many as it had afterwards. For our own threads, and for the
    small products of a decode step (a few query rows against the cache): OpenBLAS threads a product
    from ~2^18 multiply-adds on, and each threaded call waits for its helper. On a busy machine that
    helper is often off its core: measured on 2 cores at load 5, one attention layer's decode step
    (8 query heads of 256 against 520 keys) took 0.8 ms median and 36 ms mean on OpenBLAS's two threads,
    0.9 ms and 0.9 ms on one."""
    if getattr(_local, "worker", False):   # inside in_threads: OpenBLAS is on one thread already
        yield
        return
    put, get = _openblas() or (lambda n: None, lambda: None)
    with _lock:
        before = get()
        put(1)
        _local.alone = True
        try:
            yield
        finally:
            _local.alone = False
            put(before)


@contextmanager
def step_alone():
    """blas_alone, and minigen's numba kernels on this thread alone too where they are loaded (numba is not
    imported for them here): a decode step beside busy cores, one setting for the whole step rather than one
    per product (linear.py asks for one thread again, which is then free)."""
    kernels = sys.modules.get("minigen.engine.quant.kernels")
    with blas_alone(), (kernels.threads(1) if kernels is not None else nullcontext()):
        yield


def alone() -> bool:
    """Whether this thread's products keep to it (inside blas_alone or in_threads' tasks): minigen's kernels
    (linear.py) then run on one thread too, for the same reason."""
    return getattr(_local, "alone", False) or getattr(_local, "worker", False)


def for_decode(n_rows: int):
    """A context for a forward pass of n_rows rows: `step_alone()` for a decode step while other
    processes keep a core busy, else nothing. A decode step makes ~100 OpenBLAS calls (GEMVs, mostly),
    and each threaded one waits for OpenBLAS's helper thread, which is then often off its core.
    Measured on 2 cores, a decode step on OpenBLAS's two threads against one: beside another process
    using ~1.5 cores, Qwen3.5-0.8B 566 against 282 ms, LFM2-350M 335 against 121, SmolLM2-135M 380
    against 82; on the idle machine 189 against 273, 80 against 132, 53 against 78."""
    return step_alone() if n_rows <= DECODE_ROWS and n_threads() > 1 and others_busy() else nullcontext()


_others = {"at": 0.0, "busy": 0.0, "ours": 0.0, "verdict": False}   # the last measurement of others_busy()


def others_busy(every: float = 1.0, cores: float = 0.5) -> bool:
    """Whether other processes used `cores` cores or more since this was last measured (at most every
    `every` seconds; between, the last answer): the machine's busy time in /proc/stat less this
    process's own CPU time. Not the load average, which counts this process's own threads: decoding
    on one thread or two would change the answer that chose it. Without /proc/stat: False."""
    now = time.monotonic()
    if now - _others["at"] < every:
        return _others["verdict"]
    try:
        with open("/proc/stat") as f:
            ticks = [int(t) for t in f.readline().split()[1:]]   # user nice system idle iowait irq softirq steal ...
    except (OSError, ValueError):
        return False
    busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")     # seconds, all cores
    ours = sum(os.times()[:2])
    if _others["at"]:
        others = (busy - _others["busy"]) - (ours - _others["ours"])
        _others["verdict"] = others >= cores * (now - _others["at"])
    _others.update(at=now, busy=busy, ours=ours)
    return _others["verdict"]


def by_rows(fn: Callable, *rows, **kw):
    """fn(*rows, **kw) for a function that treats each row alone: rows are arrays (N, ...) or tuples of
    them (or None), cut alike. Below SPLIT_ROWS rows, one call here; from there on, one call per chunk
    of rows on `n_threads()` threads, and each result (an array, or a tuple of arrays) joined again."""
    n = len(rows[0])
    chunks = row_chunks(n)
    if len(chunks) == 1:
        return fn(*rows, **kw)
    parts = in_threads([partial(fn, *(_cut(a, r) for a in rows), **kw) for r in chunks], threads_for(n))
    if isinstance(parts[0], tuple):
        return tuple(np.concatenate(column) for column in zip(*parts))
    return np.concatenate(parts)


def by_heads(fn: Callable, *arrays):
    """fn(*arrays) for a function of independent heads (axis 0 of every array), returning arrays (or a
    tuple of them) with heads on axis 0: the heads in n_threads() groups on parallel threads, whatever
    the length. The recurrent mixers' chunked scans are many small matrix products, which OpenBLAS's
    own threads slow down (each call waits for its threads; on a busy machine ~100x); here OpenBLAS
    runs on one thread in each of ours."""
    H, threads = len(arrays[0]), min(n_threads(), len(arrays[0]))
    if threads == 1:
        return fn(*arrays)
    groups = [slice(H * i // threads, H * (i + 1) // threads) for i in range(threads)]
    parts = in_threads([partial(fn, *(a[g] for a in arrays)) for g in groups], threads)
    if isinstance(parts[0], tuple):
        return tuple(np.concatenate(column) for column in zip(*parts))
    return np.concatenate(parts)


def _cut(a, r: slice):
    return None if a is None else tuple(x[r] for x in a) if isinstance(a, tuple) else a[r]


def release_free_heap() -> None:
    """Hand the heap pages malloc keeps after frees back to the system (glibc's malloc_trim; elsewhere
    nothing happens). After a split forward pass, each helper thread's malloc arena still holds that
    pass's temporaries, which decoding, on the calling thread, never reuses: ~3 MB of peak RSS."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError, TypeError):
        pass


def pool() -> ThreadPoolExecutor:
    """The process's n_threads() - 1 helper threads (made again in a forked child, which has none)."""
    global _pool
    if _pool is None or _pool[0] != os.getpid():
        _pool = os.getpid(), ThreadPoolExecutor(n_threads() - 1, thread_name_prefix="minigen")
    return _pool[1]

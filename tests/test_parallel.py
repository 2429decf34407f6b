"""parallel.py: how a long prompt's work is cut across threads, and that cutting it changes no number."""
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import minigen
from minigen.engine import attention, parallel
from minigen.engine.model import Model


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.setattr(parallel, "n_threads", lambda: 2)


def test_row_chunks_cover_the_rows_in_a_multiple_of_the_threads(two_threads):
    short = parallel.SPLIT_ROWS - 1
    assert parallel.row_chunks(1) == [slice(0, 1)] and parallel.row_chunks(short) == [slice(0, short)]
    for T in (parallel.SPLIT_ROWS, 1001, parallel.ROWS * 2, parallel.ROWS * 2 + 1, 4096):
        chunks = parallel.row_chunks(T)
        assert len(chunks) % 2 == 0 and chunks[0].start == 0 and chunks[-1].stop == T
        assert all(a.stop == b.start for a, b in zip(chunks, chunks[1:]))
        assert max(c.stop - c.start for c in chunks) <= parallel.ROWS


def test_run_keeps_order_and_a_nested_run_does_not_wait_on_the_pool(two_threads):
    assert parallel.in_threads([lambda i=i: i * i for i in range(9)], 2) == [i * i for i in range(9)]
    assert parallel.in_threads([lambda: parallel.in_threads([lambda: 1, lambda: 2], 2), lambda: 3], 2) == [[1, 2], 3]


def test_a_first_run_counts_openblas_threads_before_it_sets_them_to_one():
    """n_threads() is cached at first use; a program whose first call is run(..., 2) must still get its
    helper thread (it was counted after OpenBLAS had been set to one thread, and cached 1)."""
    import subprocess
    import sys
    code = ("import threading, time, minigen\n"
            "from minigen.engine import parallel\n"
            "if parallel._openblas() is None: print(2); raise SystemExit\n"
            "parallel._openblas()[0](2)\n"
            "ids = parallel.in_threads([lambda: (time.sleep(0.2), threading.get_ident())[1]] * 2, 2)\n"
            "print(len(set(ids)))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 0 and r.stdout.strip() == "2", r.stderr


def test_run_gives_openblas_its_threads_back(two_threads):
    blas = parallel._openblas()
    if blas is None:
        pytest.skip("no OpenBLAS handle in this NumPy")
    put, get = blas
    before = get()
    assert parallel.in_threads([get, get], 2) == [1, 1] and get() == before


FIXTURES = Path(__file__).parent / "fixtures"
NAMES = sorted(p.parent.name for p in FIXTURES.glob("*/reference.npz"))


def halved(rope):
    """The same RoPE on half the dims (longrope keeps one factor per rotated pair)."""
    d = rope.dim // 2 - rope.dim // 2 % 2
    return replace(rope, dim=d, short_factor=rope.short_factor[:d // 2], long_factor=rope.long_factor[:d // 2])


def variants(cfg):
    """The fixture's own config, and the forward pass's other branches on the same weights."""
    half = tuple(None if r is None else halved(r) for r in cfg.rope)
    parallel = {"parallel residual": replace(cfg, parallel_residual=True)} if cfg.pre_norms else {}  # needs mlp_norm
    return {"as is": cfg, "soft-cap": replace(cfg, attn_softcap=2.0), **parallel, "partial rope": replace(cfg, rope=half),
            "window on odd layers": replace(cfg, sliding_window=9, layer_types=tuple(
                "sliding_attention" if i % 2 else "full_attention" for i in range(cfg.n_layers))),
            "no rope in layer 0": replace(cfg, rope=(None,) + cfg.rope[1:])}


@pytest.mark.parametrize("name", NAMES)
def test_threaded_forward_equals_one_thread(monkeypatch, name):
    # every family and branch: row chunks and attention blocks on two threads (splitting from 16
    # rows on, blocks of 8) against everything on the calling thread
    model = minigen.load(FIXTURES / name)[0]
    long = FIXTURES / name / "reference_long.npz"
    ids = np.load(long if long.is_file() else FIXTURES / name / "reference.npz")["input_ids"]
    monkeypatch.setattr(parallel, "SPLIT_ROWS", 16)
    monkeypatch.setattr(attention, "BLOCK", 8)
    for what, cfg in variants(model.config).items():
        if what != "as is" and cfg.positions != "rope":
            continue
        variant = Model(cfg, model.params)
        results = []
        for threads in (1, 2):
            monkeypatch.setattr(parallel, "n_threads", lambda: threads)
            record = []
            results.append((variant.forward(ids, variant.make_cache(), record=record), record))
        (one, rec_one), (two, rec_two) = results
        # GEMMs over fewer rows round differently: the parity tests' bounds (1e-4 logits, 1e-5 weights)
        assert np.abs(one - two).max() <= 1e-4, what
        assert all(np.abs(a - b).max() <= 1e-5 for a, b in zip(rec_one, rec_two)), what

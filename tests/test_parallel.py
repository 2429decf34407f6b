"""parallel.py: how a long prompt's work is cut across threads, and that cutting it changes no number."""
import numpy as np
import pytest

import minigen
import tiny_checkpoint
from minigen import parallel


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
    assert parallel.run([lambda i=i: i * i for i in range(9)], 2) == [i * i for i in range(9)]
    assert parallel.run([lambda: parallel.run([lambda: 1, lambda: 2], 2), lambda: 3], 2) == [[1, 2], 3]


def test_run_gives_openblas_its_threads_back(two_threads):
    blas = parallel._openblas()
    if blas is None:
        pytest.skip("no OpenBLAS handle in this NumPy")
    put, get = blas
    before = get()
    assert parallel.run([get, get], 2) == [1, 1] and get() == before


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_threaded_forward_equals_one_thread(tmp_path, monkeypatch, family):
    # 300 rows (splitting from 64 on): two row chunks and five attention blocks on two threads,
    # against everything in place
    cfg = {**tiny_checkpoint.CONFIG, "model_type": family, **({"sliding_window": 50} if family == "mistral" else {})}
    model = minigen.load(tiny_checkpoint.write(tmp_path / "m", cfg=cfg))[0]
    ids = np.random.default_rng(4).integers(0, 64, 300)
    results = []
    monkeypatch.setattr(parallel, "SPLIT_ROWS", 64)
    for threads in (1, 2):
        monkeypatch.setattr(parallel, "n_threads", lambda: threads)
        record = []
        results.append((model.forward(ids, model.make_cache(), record=record), record))
    (one, rec_one), (two, rec_two) = results
    assert np.abs(one - two).max() <= 1e-6
    assert all(np.abs(a - b).max() <= 1e-7 for a, b in zip(rec_one, rec_two))

"""forward_batch: several sequences in one pass over the weights equal each sequence alone, against
transformers' own logits (the fixtures' reference.npz), at different cache offsets and lengths."""
from pathlib import Path

import numpy as np
import pytest

import minigen
from minigen.engine import parallel
from minigen.engine.cache import reusable

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = sorted(p.parent.name for p in FIXTURES.glob("*/reference.npz"))


@pytest.mark.parametrize("name", NAMES)
def test_batch_of_sequences_at_different_offsets_equals_transformers(name):
    model = minigen.load(FIXTURES / name)[0]
    ref = np.load(FIXTURES / name / "reference.npz")
    ids, want = ref["input_ids"], ref["logits"]                           # transformers: (T,), (T, V)
    T = len(ids)
    # three sequences, all the same prompt, fed at different points: one from the start, one after a
    # prefill of a third of it, one after all but its last token (a decode step); where longrope's
    # switch lies between, transformers recomputes the whole cache (cache.reusable), and so from 0
    cuts = [0] + [c for c in (T // 3, T - 1) if reusable(model.config, c, c, T) == c]
    caches = [model.make_cache(4) for _ in cuts]
    for cut, cache in zip(cuts, caches):
        if cut:
            model.forward(ids[:cut], cache)
    out = model.forward_batch([ids[cut:] for cut in cuts], caches, last_only=False)
    for cut, logits, cache in zip(cuts, out, caches):
        assert logits.shape == (T - cut, want.shape[1])
        assert np.abs(logits - want[cut:]).max() <= 1e-4, cut
        assert all(layer.offset == T for layer in cache)
    # last_only: the last row of each; short prompts stand alone (longrope's factors follow a
    # sequence's length, so those are compared with each prompt's own forward)
    last = model.forward_batch([ids[:5], ids[:9]], [model.make_cache(), model.make_cache()])
    for n, got in zip((5, 9), last):
        alone = model.forward(ids[:n], model.make_cache(), last_only=True)
        assert got.shape == (1, want.shape[1]) and np.abs(got - alone).max() <= 1e-5
        if not any(r is not None and r.kind == "longrope" for r in model.config.rope):
            assert np.abs(got[0] - want[n - 1]).max() <= 1e-4


def test_batch_rows_split_across_threads_equal_one_thread(monkeypatch):
    """A batch whose stacked rows pass SPLIT_ROWS runs its row-wise steps in chunks on two threads;
    the chunks cut across sequences, and nothing may leak between them."""
    model = minigen.load(FIXTURES / "llama_gqa3")[0]
    ids = np.load(FIXTURES / "llama_gqa3" / "reference.npz")["input_ids"]
    monkeypatch.setattr(parallel, "SPLIT_ROWS", 16)
    monkeypatch.setattr(parallel, "ROWS", 7)
    results = []
    for threads in (1, 2):
        monkeypatch.setattr(parallel, "n_threads", lambda: threads)
        results.append(model.forward_batch([ids, ids[:11], ids[3:]], [model.make_cache() for _ in range(3)],
                                           last_only=False))
    for one, two in zip(*results):
        assert np.abs(one - two).max() <= 1e-4

"""Parity with Hugging Face transformers (float32, eager attention) on the committed fixtures.

Each tests/fixtures/<name>/ holds a tiny random checkpoint saved by transformers' save_pretrained
and reference.npz made by scripts/make_fixtures.py with torch + transformers; neither is needed here.
"""
from pathlib import Path

import numpy as np
import pytest

import minigen
from conftest import greedy

FIXTURES = sorted(p.parent.name for p in (Path(__file__).parent / "fixtures").glob("*/reference.npz"))


@pytest.fixture(scope="module", params=FIXTURES)
def case(request):
    path = Path(__file__).parent / "fixtures" / request.param
    return minigen.load(path)[0], dict(np.load(path / "reference.npz"))


def test_logits_match_transformers(case):
    model, ref = case
    logits = model.logits(ref["input_ids"])
    assert logits.dtype == np.float32 and logits.shape == ref["logits"].shape
    assert np.abs(logits - ref["logits"]).max() <= 1e-4


def test_attention_weights_match_output_attentions(case):
    model, ref = case
    record = []
    model.forward(ref["input_ids"], model.make_cache(), record=record)
    got = np.stack([r for r in record if r is not None])  # (attention layers, heads, T, T); None: no attention
    assert got.shape == ref["attentions"].shape
    assert np.abs(got - ref["attentions"]).max() <= 1e-5


def test_greedy_continuation_matches(case):
    model, ref = case
    assert greedy(model, ref["input_ids"], len(ref["greedy_ids"]))[0] == ref["greedy_ids"].tolist()


def test_prefill_then_decode_equals_uncached(case):
    model, ref = case
    ids = np.concatenate([ref["input_ids"], ref["greedy_ids"]])
    full = model.logits(ids)
    cache = model.make_cache(capacity=8)
    model.forward(ids[:-1], cache)
    np.testing.assert_allclose(model.forward(ids[-1:], cache), full[-1:], atol=1e-5)



def test_last_row_only_matches_and_leaves_the_cache_of_a_full_forward(case):
    """forward(last_only): the final layer computes its output at the last row alone (its mixer still
    advances every row's cache): that row's logits match transformers', and decoding on from that
    cache equals decoding on from a full forward's."""
    model, ref = case
    ids, nxt = ref["input_ids"], ref["greedy_ids"][:3]
    trimmed, full = model.make_cache(capacity=8), model.make_cache(capacity=8)
    last = model.forward(ids, trimmed, last_only=True)
    assert last.shape == (1, ref["logits"].shape[1]) and np.abs(last[0] - ref["logits"][-1]).max() <= 1e-4
    model.forward(ids, full)
    np.testing.assert_allclose(model.forward(nxt, trimmed), model.forward(nxt, full), atol=1e-5)

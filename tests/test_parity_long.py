"""Parity with transformers on a 300-token prompt: longer than an attention block (128 query rows),
so the blocked attention, the keys it skips and Mistral's 16-token sliding window across blocks are
compared with transformers directly (references from scripts/make_long_fixtures.py)."""
from pathlib import Path

import numpy as np
import pytest

import minigen
from conftest import greedy
from minigen.engine.attention import BLOCK

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = sorted(p.parent.name for p in FIXTURES.glob("*/reference_long.npz"))


@pytest.fixture(scope="module", params=NAMES)
def case(request):
    return minigen.load(FIXTURES / request.param)[0], dict(np.load(FIXTURES / request.param / "reference_long.npz"))


def test_long_references_exist_and_span_blocks():
    assert {"llama_gqa3", "mistral_sliding"} <= set(NAMES)
    for name in NAMES:
        assert len(np.load(FIXTURES / name / "reference_long.npz")["input_ids"]) > 2 * BLOCK


def test_long_prompt_logits_and_attention(case):
    model, ref = case
    record = []
    logits = model.forward(ref["input_ids"], model.make_cache(), record=record)
    assert np.abs(logits[ref["positions"]] - ref["logits"]).max() <= 1e-4
    rows = np.stack([w[:, -10:, :] for w in record])           # (L, H, 10, T)
    assert np.abs(rows - ref["attn_rows"]).max() <= 1e-5


def test_long_prompt_logits_with_keys_in_tiles(case, monkeypatch):
    # every block's keys 64 at a time through the online softmax (attention._attend_tiles), as a
    # prompt of thousands of tokens runs, against transformers on this one
    from minigen.engine import attention
    model, ref = case
    monkeypatch.setattr(attention, "TILE", 64)
    logits = model.forward(ref["input_ids"], model.make_cache())
    assert np.abs(logits[ref["positions"]] - ref["logits"]).max() <= 1e-4


def test_long_prompt_greedy(case):
    model, ref = case
    assert greedy(model, ref["input_ids"], len(ref["greedy_ids"]))[0] == ref["greedy_ids"].tolist()

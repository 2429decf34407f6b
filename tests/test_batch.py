"""Batched generation: each sequence's result equals generating its prompt alone."""
import copy
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

import minigen
from conftest import FIXTURES as PARITY_FIXTURES
from minigen.errors import OptionError
from minigen.generation.batch import Batch, batch_runs, generate_batch
from minigen.generation.options import Options
from minigen.generation.steps import Run, generate_step

FIXTURES = Path(__file__).parent / "fixtures"


@lru_cache(maxsize=None)
def fixture(name):
    model, tok = minigen.load(FIXTURES / name)
    return model, tok, np.load(FIXTURES / name / "reference.npz")["input_ids"].tolist()


def prompts_of(ids, n=5):
    """Prompts of different lengths cut from a fixture's ids (rotated, so that they differ)."""
    return [(ids[i:] + ids[:i])[: 3 + 4 * i] for i in range(n)]


def alone(model, prompt, options):
    return [(s.token, s.finish) for s in generate_step(model, prompt, options)]


def greedy(**kw):
    """generate_step's options for greedy decoding that ignores EOS unless asked otherwise."""
    return Options(**{"temp": 0, "ignore_eos": True, **kw})


@pytest.mark.parametrize("name", sorted(PARITY_FIXTURES))
def test_batch_equals_alone_greedy_every_family(name):
    model, tok, ids = fixture(name)
    prompts = prompts_of(ids)
    model = copy.copy(model)
    model.generation_config = {**model.generation_config, "eos_token_id": ids[2]}   # an EOS the prompts reach
    batch, got = Batch(model), {}
    handles = [batch.add(p, greedy(max_tokens=6 + 3 * i, ignore_eos=False)) for i, p in enumerate(prompts)]
    while len(batch):
        for h, step in batch.step().items():
            got.setdefault(h, []).append((step.token, step.finish))
    for h, p, i in zip(handles, prompts, range(len(prompts))):
        assert got[h] == alone(model, p, greedy(max_tokens=6 + 3 * i, ignore_eos=False)), (name, i)


def test_batch_equals_alone_sampling_each_with_its_own_rng_and_settings():
    model, tok, ids = fixture("llama_gqa3")
    prompts = prompts_of(ids, 4)
    settings = [dict(temp=1.0), dict(temp=0.7, top_k=20, top_p=0.9, min_p=0.02, repeat_penalty=1.3, repeat_last_n=8),
                dict(temp=0, repeat_penalty=1.5, repeat_last_n=0), dict(temp=1.3, top_k=5)]
    options = [Options(max_tokens=10, ignore_eos=True, seed=7 + i, **s) for i, s in enumerate(settings)]
    batch, got = Batch(model), {}
    handles = [batch.add(p, o) for p, o in zip(prompts, options)]
    while len(batch):
        for h, step in batch.step().items():
            got.setdefault(h, []).append((step.token, step.finish))
    for h, p, o in zip(handles, prompts, options):
        assert got[h] == alone(model, p, o)


def test_sequences_join_between_steps_and_leave_when_cancelled():
    model, tok, ids = fixture("qwen3")
    a, b, c = prompts_of(ids, 3)
    batch, got = Batch(model), {}
    ha = batch.add(a, greedy(max_tokens=12))
    for _ in range(3):
        got.setdefault(ha, []).extend(s.token for s in batch.step().values())
    hb = batch.add(b, greedy(max_tokens=5, max_context=len(b) + 2))   # joins late, ends on a full context
    hc = batch.add(c, greedy(max_tokens=12))
    steps = 0
    while len(batch):
        out = batch.step()
        steps += 1
        assert set(out) <= {ha, hb, hc}
        for h, s in out.items():
            got.setdefault(h, []).append(s.token)
        if steps == 4:
            batch.cancel(hc)
            assert hc not in batch.sequences
    assert got[ha] == [t for t, _ in alone(model, a, greedy(max_tokens=12))]
    assert alone(model, b, greedy(max_tokens=5, max_context=len(b) + 2))[-1][1] == "context"
    assert got[hb] == [t for t, _ in alone(model, b, greedy(max_tokens=5, max_context=len(b) + 2))]
    assert got[hc] == [t for t, _ in alone(model, c, greedy(max_tokens=4))]
    assert batch.step() == {}


def test_generate_batch_text_equals_generate_alone():
    model, tok, _ = fixture("llama_gqa3")
    prompts = ["Hello there", "The quick brown fox", "a", "One two three four five six seven"]
    texts = generate_batch(model, tok, prompts, max_tokens=12, ignore_eos=True)
    assert texts == [minigen.generate(model, tok, p, max_tokens=12, ignore_eos=True) for p in prompts]
    # per-prompt options, a stop string, a seed, and at most two at a time
    options = [dict(max_tokens=8), dict(max_tokens=15, temp=0.8, seed=3), dict(max_tokens=20, stop=texts[2][4:7]),
               dict(max_tokens=5, ignore_eos=True)]
    results = batch_runs(model, tok, prompts, options, max_batch=2)
    for p, o, r in zip(prompts, options, results):
        want = Run.from_prompt(model, tok, p, **o)
        assert r.text == want.text() and r.tokens == want.tokens and r.finish_reason == want.stats.finish
    assert results[2].finish_reason == "stop"


def test_batch_refuses_bad_options_naming_them():
    model, tok, _ = fixture("llama_gqa3")
    with pytest.raises(OptionError, match="temp"):
        generate_batch(model, tok, ["a", "b"], temp=-1)
    with pytest.raises(OptionError, match="options"):
        batch_runs(model, tok, ["a", "b"], [{}])
    with pytest.raises(OptionError, match="nucleus"):
        batch_runs(model, tok, ["a"], [{"nucleus": 1}])

"""Log-probs while generating: Step.logprob / top_logprobs (the distribution sampled from) and
Step.model_logprob / model_top_logprobs (the raw model), against hand-computed filters and transformers."""
import math
from functools import lru_cache

import numpy as np
import pytest

import minigen
from conftest import FIXTURES, FIXTURES_DIR, load_reference
from minigen.generation.sampling import make_sampler
from minigen.generation.options import Options
from minigen.generation.sequence import prompt_ids, top_entries
from minigen.generation.steps import Run

NAMES = sorted(FIXTURES)


def run(model, tok, prompt, **options):
    return Run(model, tok, prompt_ids(tok, prompt), Options.of(**options))


@lru_cache(maxsize=None)
def fixture(name):
    return minigen.load(FIXTURES_DIR / name)


def test_sampled_distribution_on_a_small_vocabulary():
    # temp 0.5 doubles the logits: 4, 3, 0.6, -2, 0.58, -6. top-k 4 keeps 4, 3, 0.6, 0.58; of those,
    # e^4 / sum = 0.697 < 0.9 <= (e^4 + e^3) / sum = 0.954, so top-p 0.9 keeps the first two.
    logits = np.array([2.0, 1.5, 0.3, -1.0, 0.29, -3.0], np.float32)
    lp = make_sampler(0.5, top_k=4, top_p=0.9).distribution(logits)
    first = -math.log(1 + math.exp(-1))  # log(e^4 / (e^4 + e^3))
    np.testing.assert_allclose(lp[:2], [first, first - 1], atol=1e-6)
    assert np.all(lp[2:] == -np.inf)
    # min-p 0.2 at temp 1: keep p >= 0.2 p_max, i.e. logit >= 2 + ln 0.2 = 0.39: tokens 0 and 1
    lp = make_sampler(1.0, min_p=0.2).distribution(logits)
    np.testing.assert_allclose(lp[:2], [-math.log(1 + math.exp(-0.5)), -0.5 - math.log(1 + math.exp(-0.5))],
                               atol=1e-6)
    assert np.all(lp[2:] == -np.inf)
    # greedy is certain
    lp = make_sampler(0.0).distribution(logits)
    assert lp[0] == 0.0 and np.all(lp[1:] == -np.inf)


def hand_filtered(logits, temp, k, penalty_seen=(), penalty=1.0):
    """The sampled distribution computed the long way, in float64: penalty, temperature, top-k, renormalise."""
    x = logits.astype(np.float64).copy()
    for t in set(penalty_seen):
        x[t] = x[t] * penalty if x[t] < 0 else x[t] / penalty
    x = x / temp
    keep = np.argsort(-x, kind="stable")[:k]
    z = np.log(np.sum(np.exp(x[keep] - x[keep].max()))) + x[keep].max()
    out = np.full(len(x), -np.inf)
    out[keep] = x[keep] - z
    return out


def test_steps_report_the_distribution_they_drew_from():
    model, tok = fixture("llama_gqa3")
    r = run(model, tok, "The cat sat on the mat", max_tokens=8, temp=0.7, top_k=5, repeat_penalty=1.3,
            repeat_last_n=0, seed=4, ignore_eos=True)
    seen = list(r.prompt)
    for step in r.steps():
        want = hand_filtered(step.logits, 0.7, 5, seen, 1.3)
        np.testing.assert_allclose(step.sampled_logprobs[np.isfinite(want)], want[np.isfinite(want)], atol=1e-5)
        assert np.all(step.sampled_logprobs[~np.isfinite(want)] == -np.inf)
        assert math.isfinite(step.logprob) and step.logprob == pytest.approx(want[step.token], abs=1e-5)
        top = step.top_logprobs(10)
        assert len(top) == 5 and [i for i, _ in top] == list(np.argsort(-want, kind="stable")[:5])
        seen.append(step.token)


def test_greedy_steps_are_certain_and_the_model_distribution_stays():
    model, tok = fixture("gpt2")
    steps = list(run(model, tok, "Hello", max_tokens=3, temp=0).steps())
    for s in steps:
        assert s.logprob == 0.0 and s.top_logprobs(4) == [(s.token, 0.0)]
        assert s.model_top_logprobs(1)[0][0] == s.token and s.model_logprob < 0


@pytest.mark.parametrize("name", NAMES)
def test_model_logprobs_equal_transformers(name):
    """Every greedy step's raw log-probs against torch.log_softmax of transformers' logits (full forwards)."""
    path = FIXTURES_DIR / name / "reference_scores.npz"
    ref, scores = load_reference(name), dict(np.load(path))
    model, tok = fixture(name)
    r = run(model, tok, ref["input_ids"].tolist(), max_tokens=20, ignore_eos=True, temp=0)
    steps = list(r.steps())
    assert [s.token for s in steps] == ref["greedy_ids"].tolist()
    want = scores["greedy_logprobs"]                                          # (20, V)
    got = np.stack([s.model_logprobs for s in steps])
    assert np.abs(got - want).max() <= 1e-4
    for s, row in zip(steps, want):
        assert s.model_logprob == pytest.approx(float(row[s.token]), abs=1e-4)
        assert [i for i, _ in s.model_top_logprobs(5)] == [i for i, _ in top_entries(row, 5)]


def test_top_entries_orders_and_skips_filtered():
    lp = np.array([-1.0, -np.inf, -0.5, -1.0, -3.0], np.float32)
    assert top_entries(lp, 3) == [(2, -0.5), (0, -1.0), (3, -1.0)]
    assert top_entries(lp, 10) == [(2, -0.5), (0, -1.0), (3, -1.0), (4, -3.0)]
    assert top_entries(lp, 0) == []

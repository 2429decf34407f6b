"""Sampling on hand-built distributions."""
import numpy as np
import pytest

from minigen.generation.sampling import (categorical, log_softmax, make_repetition_penalty, make_sampler,
                                         min_p_filter, repetition_penalty, top_k_filter, top_p_filter)

PROBS = np.array([0.05, 0.4, 0.1, 0.25, 0.2], dtype=np.float32)  # sorted: 1, 3, 4, 2, 0
LP = np.log(PROBS)


def kept(lp):
    return set(np.flatnonzero(np.isfinite(lp)).tolist())


def test_log_softmax_normalises():
    lp = log_softmax(np.array([1.0, 2.0, 3.0, 1000.0], dtype=np.float32))
    assert np.isclose(np.exp(lp).sum(), 1.0) and lp.dtype == np.float32 and np.all(np.isfinite(lp))


@pytest.mark.parametrize("k, expected", [(1, {1}), (2, {1, 3}), (3, {1, 3, 4}), (0, {0, 1, 2, 3, 4}),
                                         (9, {0, 1, 2, 3, 4})])
def test_top_k_keeps_k(k, expected):
    assert kept(top_k_filter(LP, k)) == expected


def test_top_k_keeps_ties_like_hf():
    assert kept(top_k_filter(np.log(np.array([0.3, 0.3, 0.3, 0.1])), 2)) == {0, 1, 2}


@pytest.mark.parametrize("p, expected", [(0.3, {1}), (0.4, {1}), (0.41, {1, 3}), (0.64, {1, 3}),
                                         (0.66, {1, 3, 4}), (0.9, {1, 3, 4, 2}), (0.96, {0, 1, 2, 3, 4}),
                                         (1.0, {0, 1, 2, 3, 4})])
def test_top_p_smallest_set_reaching_p(p, expected):
    assert kept(top_p_filter(LP, p)) == expected


@pytest.mark.parametrize("p, expected", [(0.49, {1, 3, 4}), (0.6, {1, 3}), (0.2, {1, 2, 3, 4}), (1.0, {1}),
                                         (0.0, {0, 1, 2, 3, 4})])
def test_min_p_relative_to_max(p, expected):
    assert kept(min_p_filter(LP, p)) == expected  # 0.4 * 0.49 < 0.2 keeps 0.2; 0.4 * 0.2 = 0.08 drops 0.05


def test_filters_keep_values_of_kept_tokens():
    out = top_p_filter(top_k_filter(LP, 3), 0.5)
    assert np.array_equal(out[[1, 3]], LP[[1, 3]])


def test_repetition_penalty_like_hf():
    logits = np.array([2.0, -2.0, 1.0, -1.0, 0.0], dtype=np.float32)
    out = repetition_penalty(logits, [0, 1, 1, 4], 2.0)
    # HF: score < 0 -> score * penalty, else score / penalty; each token once however often it appeared
    assert np.array_equal(out, np.array([1.0, -4.0, 1.0, -1.0, 0.0], dtype=np.float32))
    assert np.array_equal(logits, [2.0, -2.0, 1.0, -1.0, 0.0])  # input untouched


def test_repetition_penalty_window():
    logits = np.zeros(5, dtype=np.float32) + 1
    proc = make_repetition_penalty(2.0, last_n=2)
    assert np.array_equal(proc(logits, [0, 1, 2, 3]), [1, 1, 0.5, 0.5, 1])
    assert np.array_equal(make_repetition_penalty(2.0, last_n=0)(logits, [0, 1]), [0.5, 0.5, 1, 1, 1])
    assert make_repetition_penalty(1.0) is None


def test_greedy_is_argmax():
    sampler = make_sampler(0.0, top_k=1, top_p=0.1)
    rng = np.random.default_rng(0)
    assert all(sampler(LP, rng) == 1 for _ in range(5))


def test_temperature_one_follows_softmax():
    """Chi-square goodness of fit: 20000 draws over 5 outcomes, critical value 18.47 at p = 0.001 (4 dof)."""
    sampler, rng, n = make_sampler(1.0), np.random.default_rng(0), 20000
    counts = np.bincount([sampler(LP + 3.0, rng) for _ in range(n)], minlength=5)  # unnormalised on purpose
    expected = PROBS / PROBS.sum() * n
    assert ((counts - expected) ** 2 / expected).sum() < 18.47


def test_low_temperature_sharpens_and_filters_apply():
    rng = np.random.default_rng(0)
    draws = [make_sampler(1.0, top_k=2)(LP, rng) for _ in range(300)]
    assert set(draws) == {1, 3}
    draws = [make_sampler(0.05)(LP, rng) for _ in range(100)]
    assert draws.count(1) > 95


def test_categorical_never_draws_filtered_tokens():
    lp = np.array([-np.inf, 0.0, -np.inf, -np.inf], dtype=np.float32)
    rng = np.random.default_rng(0)
    assert {categorical(lp, rng) for _ in range(50)} == {1}


DRAWS = """
import sys, numpy as np
from minigen.generation.sampling import make_sampler
lp = np.log(np.array([0.05, 0.4, 0.1, 0.25, 0.2], np.float32))
sampler, rng = make_sampler(0.9, top_p=0.95, min_p=0.01), np.random.default_rng(int(sys.argv[1]))
print(" ".join(str(sampler(lp, rng)) for _ in range(60)))
"""


def test_a_seed_gives_the_same_draws_in_another_process():
    """Nothing but the seed decides the draws: not the process, its hash seed, or what ran before."""
    import os
    import subprocess
    import sys
    runs = [subprocess.run([sys.executable, "-c", DRAWS, "7"], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": h}).stdout.split() for h in ("1", "2")]
    sampler, rng = make_sampler(0.9, top_p=0.95, min_p=0.01), np.random.default_rng(7)
    here = [str(sampler(LP, rng)) for _ in range(60)]
    assert runs[0] == runs[1] == here
    assert len(set(here)) >= 3  # a real sample, not a constant


def test_different_seeds_draw_differently_on_a_flat_distribution():
    flat = np.zeros(1000, np.float32)  # 1000 equally likely tokens
    sampler = make_sampler(1.0)
    draws = []
    for seed in range(5):
        rng = np.random.default_rng(seed)
        draws.append(tuple(sampler(flat, rng) for _ in range(20)))
    assert len(set(draws)) == 5
    assert len({t for d in draws for t in d}) > 80  # 100 draws from 1000 tokens: about 95 distinct


def test_top_p_draws_follow_the_renormalised_distribution():
    """top-p 0.7 keeps tokens 1, 3, 4 (0.4 + 0.25 + 0.2); draws follow 0.4/0.85, 0.25/0.85, 0.2/0.85
    (chi-square, critical value 13.82 at p = 0.001, 2 degrees of freedom)."""
    sampler, rng, n = make_sampler(1.0, top_p=0.7), np.random.default_rng(1), 20000
    counts = np.bincount([sampler(LP, rng) for _ in range(n)], minlength=5)
    assert counts[0] == counts[2] == 0
    expected = PROBS[[1, 3, 4]] / PROBS[[1, 3, 4]].sum() * n
    assert ((counts[[1, 3, 4]] - expected) ** 2 / expected).sum() < 13.82



def test_largest_is_a_stable_sort_s_head():
    """sampling.largest against np.argsort(-x, kind="stable")[:k]: ties (at and across the k-th), -inf,
    k of 0, 1, all and more."""
    from minigen.generation.sampling import largest
    rng = np.random.default_rng(4)
    for x in (rng.standard_normal(1000), rng.integers(0, 5, 1000).astype(np.float64),
              np.where(rng.random(300) < 0.5, -np.inf, rng.integers(0, 3, 300)).astype(np.float32)):
        for k in (0, 1, 2, 7, 100, len(x), len(x) + 3):
            np.testing.assert_array_equal(largest(x, k), np.argsort(-x, kind="stable")[:k])

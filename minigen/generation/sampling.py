"""Logits -> next token: a small pipeline of pure functions.

Shapes: every function takes one row, `(V,)` float32, V = vocabulary size.

The order follows Hugging Face's `generate` (the defaults come from its generation_config.json):
logits processors (repetition penalty) act on raw logits; then log-softmax; then temperature, and the
filters top-k, top-p, min-p on the tempered log-probabilities; then one draw. Temperature 0 is greedy
(argmax), and then the filters do not matter. A filtered-out token gets -inf, never a finite "small"
number, so it can never be drawn.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

Sampler = Callable[[np.ndarray, "np.random.Generator"], int]   # a string: importing numpy.random costs 6 MB
Processor = Callable[[np.ndarray, Sequence[int]], np.ndarray]


def log_softmax(x: np.ndarray, axis: int = -1, dtype=np.float32) -> np.ndarray:
    """log(softmax(x)) along `axis`, computed in `dtype` (inspect/ takes float64 for its figures)."""
    x = np.asarray(x).astype(dtype, copy=False)
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def top_k_filter(logprobs: np.ndarray, k: int) -> np.ndarray:
    """Keep the k most likely tokens (ties at the k-th value are kept too, as HF does)."""
    if k <= 0 or k >= logprobs.shape[-1]:
        return logprobs
    kth = np.partition(logprobs, -k)[-k]
    return np.where(logprobs >= kth, logprobs, -np.inf)


def largest(values: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest of values (V,), largest first, ties by lower id: what
    np.argsort(-values, kind="stable")[:k] gives, without sorting the whole vocabulary."""
    n = len(values)
    if k >= n:
        return np.argsort(-values, kind="stable")[:k]
    if k <= 0:
        return np.zeros(0, np.int64)
    kth = np.partition(values, n - k)[n - k]
    candidates = np.flatnonzero(values >= kth)             # the k largest and any tied with the k-th, by id
    return candidates[np.argsort(-values[candidates], kind="stable")[:k]]


def top_p_filter(logprobs: np.ndarray, p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose probabilities add up to at least p."""
    if p >= 1.0:
        return logprobs
    order = np.argsort(-logprobs, kind="stable")
    probs = np.exp(logprobs[order] - np.max(logprobs))
    cum = np.cumsum(probs / probs.sum())
    n_keep = int(np.searchsorted(cum, p, side="left")) + 1  # first index where the sum reaches p
    out = np.full_like(logprobs, -np.inf)
    keep = order[:n_keep]
    out[keep] = logprobs[keep]
    return out


def min_p_filter(logprobs: np.ndarray, p: float) -> np.ndarray:
    """Keep tokens at least p times as likely as the most likely one."""
    if p <= 0.0:
        return logprobs
    threshold = np.max(logprobs) + np.log(p)
    return np.where(logprobs >= threshold, logprobs, -np.inf)


def categorical(logprobs: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from the (unnormalised) distribution exp(logprobs), by inverting the CDF."""
    probs = np.exp(logprobs.astype(np.float64) - np.max(logprobs))
    cum = np.cumsum(probs)
    return int(min(np.searchsorted(cum, rng.random() * cum[-1], side="right"), len(cum) - 1))


def make_sampler(temp: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> Sampler:
    """A function (logprobs (V,), rng) -> token id. temp 0 is greedy; 0 / 1.0 / 0.0 disable the filters.
    The values are trusted: options.Options validates a run's options, once. Its `.logprobs(x)`
    is the distribution it draws from (speculative sampling needs it, not only a draw)."""
    return Sampling(temp, top_k, top_p, min_p)


class Sampling:
    """The sampler of make_sampler: `logprobs` is the tempered, filtered distribution, `__call__` one
    draw from it (or the argmax, greedy)."""

    def __init__(self, temp: float, k: int, p: float, mp: float):
        self.temp, self.k, self.p, self.mp = temp, k, p, mp
        self.greedy = temp == 0

    def logprobs(self, logprobs: np.ndarray) -> np.ndarray:
        """(V,) the log-probabilities draws come from, -inf where filtered out (greedy: not used)."""
        # Shift before dividing: the best token stays at exactly 0, so a temperature as small as 1e-40
        # sends the others to -inf (greedy) instead of overflowing to inf - inf = NaN.
        lp = log_softmax((logprobs - np.max(logprobs)) / np.float32(self.temp))
        return min_p_filter(top_p_filter(top_k_filter(lp, self.k), self.p), self.mp)

    def __call__(self, logprobs: np.ndarray, rng: np.random.Generator) -> int:
        if self.greedy:
            return int(np.argmax(logprobs))
        return categorical(self.logprobs(logprobs), rng)

    def distribution(self, logprobs: np.ndarray) -> np.ndarray:
        """(V,) the normalised log-probs a draw is made from (Step.logprob): greedy's is certain, 0 at the
        argmax and -inf elsewhere."""
        if self.greedy:
            out = np.full(logprobs.shape, -np.inf, np.float32)
            out[int(np.argmax(logprobs))] = 0.0
            return out
        return log_softmax(self.logprobs(logprobs))


def repetition_penalty(logits: np.ndarray, tokens: Sequence[int], penalty: float) -> np.ndarray:
    """HF's RepetitionPenaltyLogitsProcessor: each token seen gets logit * penalty if < 0, else / penalty."""
    if penalty == 1.0 or len(tokens) == 0:
        return logits
    seen = np.unique(np.asarray(tokens, dtype=np.int64))
    out = logits.copy()
    score = out[seen]
    out[seen] = np.where(score < 0, score * penalty, score / penalty)
    return out


def make_repetition_penalty(penalty: float, last_n: int = 64) -> Processor | None:
    """A processor (logits, tokens so far) -> logits over the last `last_n` tokens (0: all of them)."""
    if penalty == 1.0:
        return None

    def process(logits: np.ndarray, tokens: Sequence[int]) -> np.ndarray:
        window = tokens[-last_n:] if last_n > 0 else tokens
        return repetition_penalty(logits, window, penalty)

    return process


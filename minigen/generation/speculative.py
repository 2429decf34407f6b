"""Speculative decoding: several tokens per pass over the weights, the output unchanged.

A drafter guesses the next k tokens: prompt lookup (the tokens that followed the context's last
n-gram where it occurred before, n = 3, 2, 1, as transformers' prompt_lookup_num_tokens and
llama.cpp's lookup decoding do) or a small draft model sharing the vocabulary. One forward of the
model over the pending token and the k drafts gives its logits at each of the k + 1 positions; the
tokens kept are the longest prefix of the draft that the model itself would have produced, plus the
model's own next token, so every forward yields at least one token. The cache is then cut back past
the rejected drafts: an offset moved (`truncate` on every layer's cache), nothing copied.

Greedy: a draft token is kept while it equals the argmax of the processed scores at its position.
Sampling: the speculative-sampling rule (Leviathan et al. 2023; Chen et al. 2023). A draft token x
drawn from q is kept with probability min(1, p(x) / q(x)); at the first rejection the token is drawn
from max(0, p - q), normalised; after k acceptances, from p. Each token is then distributed exactly
as without speculation. p at a position is the whole sampling pipeline (the repetition penalty over
the tokens so far, the drafted prefix included; temperature; top-k, top-p, min-p). Prompt lookup is
deterministic: its q puts all mass on its token, so x is kept with probability p(x) and a rejection
draws from p without x.

How many drafts to verify (`Policy`): the k that maximises the expected tokens per unit of time,
(1 + a + ... + a^k) / cost(k + 1), with a the running acceptance rate of a draft position and
cost(r) a forward over r rows relative to a one-row forward (measured as it goes; the prior is the
bench's figure). Prompt lookup's guesses are checked against the model's tokens even when not
verified (they cost nothing to make), so on text that never repeats a falls and k goes to 0: plain
decoding, plus a lookup of a few microseconds per token.
"""
from __future__ import annotations

import time
from typing import Iterator, Sequence as Ids

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..engine.cache import checkpoint, truncate
from ..engine.model import hidden, unembed
from ..engine.quant import STORED
from ..errors import MinigenError
from .sampling import Processor, categorical
from .ids import common_prefix
from .sequence import Sequence, Step, quietly

KS = tuple(range(17))   # draft lengths the policy chooses among
# forward(r rows) / forward(1 row) for SmolLM2-135M after a 150-token prompt (scripts/bench.py --spec,
# AMD EPYC: 1.7-1.9 at 2 rows, 1.8-2.1 at 4 to 8, 2.0-2.3 at 9, 2.3-2.5 at 13 to 16; products of 4-7
# and 12-15 rows are computed as 8 and 16, engine/linear.padded_rows; between, the nearest size);
# replaced by the times measured during the run once a size has been tried
PRIOR_COST = {1: 1.0, 2: 1.8, 3: 1.9, 4: 2.0, 8: 2.0, 9: 2.1, 10: 2.2, 12: 2.4, 16: 2.4, 17: 2.7}
# the same for a model whose weights are kept stored (a GGUF: its numba kernels, whose rows beyond one are
# bound by arithmetic, not by reading the weights): SmolLM2-135M Q4_1, Qwen2.5-Coder-0.5B and 1.5B Q4_K_M after a
# 128-token prompt, AMD Zen 5, 1.4-1.7 at 2 rows (1.25-1.45 the 1.5B), 1.6-1.9 at 4, 2.4-3.2 at 8, 4.0-4.9 at 16
PRIOR_COST_STORED = {1: 1.0, 2: 1.4, 3: 1.7, 4: 1.8, 8: 2.7, 9: 3.0, 12: 3.6, 16: 4.3, 17: 4.5}


def forward_rows(model, ids: list[int], cache: list, rows: int) -> np.ndarray:
    """The model's logits (rows, V) at the last `rows` positions of ids, fed through the cache."""
    ids = model.check_ids(ids)
    x = hidden(model.params, model.config, ids, cache)                       # (T, D)
    return unembed(x[-rows:], model.params, model.config)                     # (rows, V)


def speculative_step(model, prompt_ids: Ids[int], options=None, cache: list | None = None, *,
                     drafter) -> Iterator[Step]:
    """steps.generate_step with `drafter`'s guesses verified several per forward (its arguments, its Steps)."""
    return decode(Sequence(model, prompt_ids, *(() if options is None else (options,)), cache), drafter)


def decode(seq: Sequence, drafter) -> Iterator[Step]:
    """Plain decoding's Steps (steps.decode), the same tokens (greedy) or the same distribution (sampling),
    with `drafter`'s guesses verified several per forward. The cache, as plain decoding's, holds after each
    Step the prompt and every generated token but the last."""
    if seq.options.record_attention:
        raise ValueError("speculative decoding records no attention weights (its forwards hold drafts)")
    if seq.options.max_tokens == 0:
        return
    while True:
        start, first = time.perf_counter(), not seq.generated
        room = seq.room(64)   # the most drafts any drafter makes (options: draft_tokens <= 64)
        left = seq.options.max_tokens - seq.generated   # tokens the run may still give
        draft, q = drafter.draft(seq.tokens, room, seq.sampler, seq.processors, seq.rng, left=left) if room else ([], None)
        draft, q = admitted(draft, q, seq)
        pending = seq.feed(draft)
        if draft:   # recurrent layers (hybrids) cannot drop rejected drafts: they return here, then refeed
            checkpoint(seq.cache)
        base = seq.cache[0].offset + len(pending)   # cache positions filled before the first kept token's
        logits = quietly(forward_rows, seq.model, pending + draft, seq.cache, len(draft) + 1)   # (k + 1, V)
        seq.check_logits(logits)
        out = verify(logits, draft, q, seq.tokens, seq.sampler, seq.processors, seq.rng)
        seconds = time.perf_counter() - start
        drafter.feedback(len(draft), len(out) - 1, out[-1], None if first else seconds, len(pending) + len(draft))
        truncate(seq.cache, base + len(out) - 1)   # the kept drafts stay; the rejected ones are cut
        for j, token in enumerate(out):
            finish = seq.append(token)
            if finish or j == len(out) - 1:
                truncate(seq.cache, base + j)   # as plain decoding leaves it: every generated token but this one
            try:
                yield Step(token, finish, seconds / len(out), seq.generated == 1, logits[j], None,
                           forward=j == 0, drafted=len(draft) if j == 0 else 0,
                           accepted=len(out) - 1 if j == 0 else 0)
            except GeneratorExit:   # the caller stopped here (a stop string): the cache as after this Step
                truncate(seq.cache, min(seq.cache[0].offset, base + j))
                raise
            if finish:
                return
        seq.pending = seq.tokens[seq.cache[0].offset:]   # [out[-1]]; after a recurrent layer's rollback, the kept tokens too


def admitted(draft: list[int], q, seq: Sequence) -> tuple[list[int], list | None]:
    """The draft cut before its first token a processor rules out whatever the logits (a grammar's
    `admits`), so that no row of the forward is spent on a guess verify would reject anyway."""
    for process in seq.processors:
        if draft and (admits := getattr(process, "admits", None)):
            n = admits(seq.tokens, draft)
            draft, q = draft[:n], None if q is None else q[:n]
    return draft, q


def verify(logits: np.ndarray, draft: list[int], q: list[np.ndarray] | None, tokens: list[int],
           sampler, processors: Ids[Processor], rng) -> list[int]:
    """The tokens kept: the accepted prefix of `draft`, then one token of the model's own. logits
    (k + 1, V) at the draft's positions; q the drafter's probabilities (k of (V,)), None when it is
    deterministic; tokens the context before the draft."""
    out: list[int] = []
    for i, row in enumerate(logits):
        scores = row
        for process in processors:
            scores = process(scores, tokens + out)
        if i == len(draft):
            return out + [sampler(scores, rng)]
        x = draft[i]
        if sampler.greedy:
            token = int(np.argmax(scores))
            if token != x:
                return out + [token]
        else:
            p = np.exp(sampler.logprobs(scores).astype(np.float64))          # (V,), sums to 1
            qx = 1.0 if q is None else float(q[i][x])
            if rng.random() * qx >= p[x]:    # rejected: draw from max(0, p - q), normalised
                return out + [residual_draw(p, x if q is None else q[i], rng)]
        out.append(x)
    raise AssertionError("unreachable: logits has one row more than the draft")


def residual_draw(p: np.ndarray, q, rng) -> int:
    """A draw from max(0, p - q) normalised; q a (V,) array, or an int: all of q's mass on that token."""
    if isinstance(q, (int, np.integer)):
        r = p.copy()
        r[q] = 0.0
    else:   # q may be shorter (a draft's vocabulary within the model's padded one)
        r = p.copy()
        r[:len(q)] = np.maximum(p[:len(q)] - q, 0.0)
    if not r.sum() > 0:   # p <= q everywhere: a rejection had probability 0; only rounding gets here
        r = p
    with np.errstate(divide="ignore"):
        return categorical(np.log(r), rng)


# --- drafters ------------------------------------------------------------------------------------------

class Policy:
    """The number of drafts to verify (see the module's docstring): acceptance rates per kind of guess,
    forward times per row count, and the cost of drafting one token (a draft model's forward). While
    no draft pays at the rates seen, a forward now and then still verifies a few (the 8th, then one in
    PROBE_EVERY, the gap doubling while they do not pay: a forward of PRIOR_COST[8] ~ 2x, a few % at
    most), so that the costs of this machine and model get measured; and none once even drafts always
    kept could not pay at the costs measured (a draft model as slow as the model itself)."""

    PROBE_EVERY, PROBE_MAX = 64, 1024   # forwards between probes; twice as many after each that did not pay
    PROBE_SOON = 8   # forwards to the next probe after one that kept at least half its drafts
    PROBE = 7        # drafts a probe verifies: 8 rows, which cost what 5 do (engine/linear.padded_rows)

    def __init__(self, max_draft: int = 16, draft_cost: float = 0.0, prior: float = 0.5, costs: dict | None = None):
        self.max_draft, self.draft_cost = max_draft, draft_cost
        self.prior_costs = costs or PRIOR_COST   # forward(rows) / forward(1) until measured
        self.rate: dict = {}          # kind -> running acceptance rate of one draft position
        self.seconds: dict = {}       # rows -> running seconds of a forward over that many rows
        self.prior = prior
        self.calls, self.next_probe, self.probe_gap = 0, 8, self.PROBE_EVERY
        self.probed = False           # the last choice was a probe, not yet observed

    def choose(self, kind, available: int) -> int:
        a = min(self.rate.get(kind, self.prior), 0.999)
        best, best_k = 1.0, 0
        for k in KS:
            if 0 < k <= min(available, self.max_draft):
                expected = (1 - a ** (k + 1)) / (1 - a)
                gain = expected / (self.cost(k + 1) + k * self.draft_cost)
                if gain > best:
                    best, best_k = gain, k
        self.calls += 1
        if best_k:
            self.probe_gap = self.PROBE_EVERY
        elif available > 0 and self.calls >= self.next_probe:   # could_pay() once a gap, not every token
            self.next_probe = self.calls + self.probe_gap
            if self.could_pay():
                self.probe_gap = min(2 * self.probe_gap, self.PROBE_MAX)
                self.probed = True
                return min(available, self.max_draft, self.PROBE)
        return best_k

    def best_gain(self) -> float:
        """The most a forward could yield per unit of time if every draft were kept: max over k of
        (k + 1) / (cost(k + 1) + k · draft_cost), at the costs seen (1.0: plain decoding)."""
        return max([1.0] + [(k + 1) / (self.cost(k + 1) + k * self.draft_cost) for k in KS if 0 < k <= self.max_draft])

    def could_pay(self) -> bool:
        """Whether some k would pay if every draft were kept: at the costs seen, drafting can gain at all
        (a draft model as slow as the model itself never can)."""
        return any(k + 1 > self.cost(k + 1) + k * self.draft_cost for k in KS if 0 < k <= self.max_draft)

    def cost(self, rows: int) -> float:
        """forward(rows) / forward(1): measured, else the prior scaled to the nearest size measured."""
        known = self.prior_costs
        prior = lambda r: known.get(r) or known[min(known, key=lambda c: abs(c - r))]
        if 1 not in self.seconds:
            return prior(rows)
        if rows in self.seconds:
            return self.seconds[rows] / self.seconds[1]
        near = min((r for r in self.seconds if r > 1), key=lambda r: abs(r - rows), default=None)
        if near is None:
            return prior(rows)
        return self.seconds[near] / self.seconds[1] * prior(rows) / prior(near)

    def observe(self, kind, accepted: int, drafted: int):
        """A draft of `drafted` guesses whose first `accepted` were kept: position by position. A probe
        that kept half its drafts or more is followed by another soon, not after a doubled gap: the
        rate one probe leaves (a prior of 0.5 and 7 kept drafts give 0.84) can fall short of paying
        where drafting would, and a draft model learns its rate only from the drafts it verifies (a
        pair kept 100 % of the time, whose first probe's forward ran slow, had stopped drafting for good)."""
        if self.probed and drafted:
            self.probed = False
            if 2 * accepted >= drafted:
                self.next_probe, self.probe_gap = self.calls + self.PROBE_SOON, self.PROBE_EVERY
        a = self.rate.get(kind, self.prior)
        for hit in [1.0] * accepted + ([0.0] if accepted < drafted else []):
            a += 0.15 * (hit - a)
        self.rate[kind] = a

    def timed(self, rows: int, seconds: float):
        s = self.seconds.get(rows)
        self.seconds[rows] = seconds if s is None else s + 0.2 * (seconds - s)


class PromptLookup:
    """Drafts from the context itself: the tokens after the last earlier occurrence of its last n-gram."""

    def __init__(self, max_draft: int = 16, ngram: tuple[int, int] = (3, 1), costs: dict | None = None):
        self.policy = Policy(max_draft, costs=costs)
        self.ngram = ngram
        self.shadow = None            # (kind, guess) made but not verified, checked against the next token
        self.kind = None

    def draft(self, tokens: list[int], room: int, sampler, processors, rng, left=None) -> tuple[list[int], None]:
        guess, n = lookup(np.asarray(tokens), min(room, self.policy.max_draft), *self.ngram)
        k = self.policy.choose(n, len(guess)) if guess else 0
        self.kind, self.shadow = n, (n, guess[0]) if guess and k == 0 else None
        return guess[:k], None

    def feedback(self, drafted: int, accepted: int, token: int, seconds: float | None, rows: int):
        if drafted:
            self.policy.observe(self.kind, accepted, drafted)
        elif self.shadow:
            self.policy.observe(self.shadow[0], int(self.shadow[1] == token), 1)
        if seconds is not None:
            self.policy.timed(rows, seconds)


def lookup(tokens: np.ndarray, k: int, n_max: int = 3, n_min: int = 1) -> tuple[list[int], int]:
    """k tokens that followed the most recent earlier occurrence of the context's last n-gram, n from
    n_max down to n_min, and that n; ([], 0) when none occurs. Where the tokens after the occurrence
    run into the end of the context, the copy goes on over what it copied (as LZ77's overlapping
    copies do): text repeating with period p = L - start is guessed to go on repeating, so a loop of 8
    tokens gives a draft of k, not of 7. (Measured on bench.py's quoting task, whose answer falls
    into such a loop: 2.0x -> 2.25x plain decode in a replay at the bench's forward costs.)"""
    L = len(tokens)
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        windows = sliding_window_view(tokens[:L - 1], n)                    # (L - n, n): each has a next token
        hits = np.flatnonzero((windows == tokens[L - n:]).all(axis=1))
        if len(hits) and k > 0:
            start = int(hits[-1]) + n
            return tokens[start + np.arange(k) % (L - start)].tolist(), n
    return [], 0


class DraftModel:
    """Drafts with a small model of the same vocabulary, through a cache of its own that follows the
    context: on each call it is cut back to what the context still shares with it, then fed the rest.
    A draft token's cost, relative to a forward of the model, starts as `cost` (make_drafter: the ratio
    of their weights, which a decode step reads) and is then measured, on forwards that follow the
    context closely, not on the one that catches up after a stretch of no drafting.

    Catching up is a prefill of the draft model over every token it has not seen: at the first draft, the
    whole prompt. It is made only where drafting could win it back over the tokens the run may still give
    (`left`): behind x a prompt token's cost <= left x (1 − 1 / Policy.best_gain()), everything in forwards of
    the model. A prompt token costs PREFILL_SHARE of a draft token until a catch-up is timed. (Qwen2.5-Coder-0.5B
    drafting for the 1.5B here, 128 tokens after a 622-token prompt: its first draft's catch-up took 2.3 s of
    the run's 7.5, for drafts that could gain ~20 % at the costs this machine then measured.) So that the
    first such choice is not made on the weights' ratio alone (0.32 for that pair, where a draft token cost
    0.6 of a forward: the smaller model's step is more than its share of the weights), a draft token's cost
    is first measured on one step of the draft model (`step_seconds`)."""

    PREFILL_SHARE = 0.2   # a prompt token's forward against a decode step's, of one model (0.15-0.26 here)

    def __init__(self, model, max_draft: int = 16, vocab: int | None = None, cost: float = 0.3, costs: dict | None = None):
        self.model, self.vocab = model, vocab or model.config.vocab_size   # ids it may propose: the model's too
        self.policy = Policy(max_draft, draft_cost=cost, costs=costs)
        self.cache = model.make_cache(256)
        self.cached: list[int] = []      # the ids the draft cache holds
        self.spent, self.per_token = 0.0, None   # the last call's seconds; seconds a draft token, caught up
        self.per_prompt_token = None     # seconds a token of a catch-up (a prefill), once one is timed

    def draft(self, tokens: list[int], room: int, sampler, processors, rng, left=None) -> tuple[list[int], list | None]:
        k = self.policy.choose("draft", min(room, self.model.config.max_position_embeddings - len(tokens)))
        self.spent = 0.0
        if k == 0:
            return [], None
        start = time.perf_counter()
        common = common_prefix(self.cached, tokens[:-1])
        behind = len(tokens) - common
        if left is not None and behind > self.policy.max_draft + 1:   # not following closely: a catch-up
            if self.per_token is None and 1 in self.policy.seconds:   # a draft token's cost, before paying a catch-up
                self.per_token = self.step_seconds(tokens[-1])
                self.policy.draft_cost = self.per_token / self.policy.seconds[1]
            if not self.catch_up_pays(behind, left):
                self.policy.probed = False
                self.spent = time.perf_counter() - start   # not the model's forward's (feedback)
                return [], None
        keep = self.model.resume(self.cache, common, len(tokens))   # a snapshot, or 0
        feed, out, q, seconds = tokens[keep:], [], [], []
        caught_up = len(feed) <= self.policy.max_draft + 1   # not behind by an idle stretch
        for _ in range(k):
            began = time.perf_counter()
            offset = self.cache[0].offset
            if (kept := self.model.resume(self.cache, offset, offset + len(feed))) < offset:   # longrope's switch
                feed, caught_up = (tokens + out)[kept:], False
            fed = len(feed)
            scores = quietly(self.model.forward, feed, self.cache, last_only=True)[0][:self.vocab]
            for process in processors:
                scores = process(scores, tokens + out)
            out.append(self._pick(scores, sampler, rng, q))
            feed = [out[-1]]
            seconds.append(time.perf_counter() - began)
            if fed > self.policy.max_draft + 1:
                self.per_prompt_token = seconds[-1] / fed
        self.cached = (tokens + out)[:self.cache[0].offset]
        self.spent = time.perf_counter() - start
        # a draft token's cost, from forwards that did not catch up with a stretch of context
        per_token = sum(seconds) / k if caught_up else sum(seconds[1:]) / (k - 1) if k > 1 else None
        self.per_token = per_token or self.per_token
        return out, None if sampler.greedy else q

    def step_seconds(self, token: int) -> float:
        """Seconds of a decode step of the draft model (one token on a scratch cache; the second of two, the
        first may load what the model needs): what a draft token costs, known before any catch-up."""
        cache = self.model.make_cache(4)
        for _ in range(2):
            start = time.perf_counter()
            quietly(self.model.forward, [token], cache, last_only=True)
            seconds = time.perf_counter() - start
            truncate(cache, 0)
        return seconds

    def catch_up_pays(self, behind: int, left: int) -> bool:
        """Whether feeding the draft model the `behind` tokens it has not seen could be won back by drafting
        over the `left` tokens still to come."""
        step = self.policy.seconds.get(1)   # the model's one-row forward, once timed
        if self.per_prompt_token is not None and step:
            cost = self.per_prompt_token / step
        else:
            cost = self.PREFILL_SHARE * self.policy.draft_cost
        return behind * cost <= left * (1 - 1 / self.policy.best_gain())

    def _pick(self, scores: np.ndarray, sampler, rng, q: list) -> int:
        if sampler.greedy:
            return int(np.argmax(scores))
        lp = sampler.logprobs(scores)                                        # (V_draft,)
        q.append(np.exp(lp.astype(np.float64)))
        return categorical(lp, rng)

    def feedback(self, drafted: int, accepted: int, token: int, seconds: float | None, rows: int):
        if drafted:
            self.policy.observe("draft", accepted, drafted)
        if seconds is not None:
            self.policy.timed(rows, seconds - self.spent)
            if self.per_token is not None and 1 in self.policy.seconds:
                self.policy.draft_cost = self.per_token / self.policy.seconds[1]


def make_drafter(model, tokenizer, options):
    """The drafter a run's options ask for, or None: prompt_lookup, or draft_model (its vocabulary
    checked against the model's here, once)."""
    max_draft = 16 if options.draft_tokens is None else options.draft_tokens
    if max_draft == 0 or not (options.prompt_lookup or options.draft_model):
        return None
    costs = PRIOR_COST_STORED if kept_stored(model.params) else PRIOR_COST
    if options.prompt_lookup:
        return PromptLookup(max_draft, costs=costs)
    draft, draft_tokenizer = options.draft_model
    check_same_vocabulary(tokenizer, draft_tokenizer, model, draft)
    # a decode step reads every weight: a draft token costs about the draft's share of the two (until measured)
    return DraftModel(draft, max_draft, min(model.config.vocab_size, draft.config.vocab_size),
                      cost=draft.n_params / model.n_params, costs=costs)


def kept_stored(params: dict) -> bool:
    """Whether a model's projections are kept in a stored type (a GGUF, a 16-bit checkpoint): its first layer's."""
    layer = (params.get("layers") or [{}])[0]
    return any(isinstance(v, STORED) or isinstance(v, list) and bool(v) and isinstance(v[0], STORED) for v in layer.values())


def check_same_vocabulary(tokenizer, draft_tokenizer, model, draft):
    """MinigenError in one line unless the two tokenizers give the same ids to the same tokens, the
    special ones included, and the draft's logits cover the model's vocabulary."""
    mine, theirs = tokenizer.hf.get_vocab(with_added_tokens=True), draft_tokenizer.hf.get_vocab(with_added_tokens=True)
    where = f"the draft model ({getattr(draft, 'path', None) or 'given'})"
    differ = next((t for t in sorted(set(mine) | set(theirs), key=lambda t: mine.get(t, theirs.get(t)))
                   if mine.get(t) != theirs.get(t)), None)
    if differ is not None:
        a, b = mine.get(differ), theirs.get(differ)
        what = (f"the model's token {differ!r} (id {a}) is not in it" if b is None else
                f"its token {differ!r} (id {b}) is not in the model's" if a is None else
                f"token {differ!r} is id {b} there and {a} in the model")
        raise MinigenError(f"{where} has another vocabulary: {what}; a draft model must share the model's tokenizer")
    specials = {n: (tokenizer.special_token(n), draft_tokenizer.special_token(n)) for n in ("bos_token", "eos_token", "pad_token", "unk_token")}
    wrong = next((n for n, (a, b) in specials.items() if a != b and a is not None and b is not None), None)
    if wrong is not None:
        raise MinigenError(f"{where} has another {wrong}: {specials[wrong][1]!r} there, {specials[wrong][0]!r} here")
    if draft.config.vocab_size < len(mine):
        raise MinigenError(f"{where}'s vocab_size {draft.config.vocab_size} is smaller than its tokenizer's {len(mine)} tokens")

"""Speculative decoding: the same tokens as plain decoding (greedy), the same distribution (sampling).

The reference is always generate_step, plain one-token decoding, run beside it on the same model.
"""
import copy
import dataclasses
import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

import minigen
from conftest import FIXTURES as PARITY_FIXTURES
from minigen.errors import MinigenError
from minigen.generation import speculative as S
from minigen.generation.options import Options
from minigen.generation.sampling import make_sampler
from minigen.generation.speculative import speculative_step
from minigen.generation.steps import Run, generate_step

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = sorted(PARITY_FIXTURES)


@lru_cache(maxsize=None)
def fixture(name):
    model, tok = minigen.load(FIXTURES / name)
    return model, tok, np.load(FIXTURES / name / "reference.npz")["input_ids"].tolist()


class Scripted:
    """A drafter that knows the plain run's tokens (`truth`) and drafts, forward by forward, k tokens of
    which the first `good` are right and the rest wrong, cycling through `plan` [(k, good), ...]."""

    def __init__(self, truth, prompt_len, plan, vocab):
        self.truth, self.n0, self.plan, self.vocab, self.i = truth, prompt_len, plan, vocab, 0
        self.calls = []

    def draft(self, tokens, room, sampler, processors, rng, left=None):
        k, good = self.plan[self.i % len(self.plan)]
        self.i += 1
        done = len(tokens) - self.n0
        right = self.truth[done:done + k]
        out = [t if j < good else (t + 1) % self.vocab for j, t in enumerate(right)][:room]
        self.calls.append((room, len(out)))
        return out, None

    def feedback(self, *args):
        pass


PLANS = [[(k, good)] for k in (1, 2, 3, 5, 8) for good in sorted({0, k // 2, k})] + \
        [[(3, 3), (1, 0), (8, 2), (2, 2), (16, 16)]]


def greedy(eos=None, **kw):
    """Greedy options; EOS ignored unless `eos` is given (it is then the model's: see with_eos)."""
    return Options(temp=0, ignore_eos=eos is None, **kw)


def with_eos(model, eos):
    """The model with generation_config.json's eos_token_id set to `eos` (None: the model as it is)."""
    if eos is None:
        return model
    m = copy.copy(model)
    m.generation_config = {**model.generation_config, "eos_token_id": eos}
    return m


def plain(model, ids, eos=None, **kw):
    steps = list(generate_step(with_eos(model, eos), ids, greedy(eos, **kw)))
    return [s.token for s in steps], steps[-1].finish


def spec(model, ids, drafter, eos=None, **kw):
    cache = model.make_cache(8)
    steps = list(speculative_step(with_eos(model, eos), ids, greedy(eos, **kw), cache, drafter=drafter))
    return [s.token for s in steps], steps[-1].finish, cache[0].offset, steps


@pytest.mark.parametrize("name", NAMES)
def test_greedy_identity_every_family_every_draft_length(name):
    model, tok, ids = fixture(name)
    truth, _ = plain(model, ids, max_tokens=24)
    for plan in PLANS:
        tokens, finish, offset, steps = spec(model, ids, Scripted(truth, len(ids), plan, model.config.vocab_size),
                                             max_tokens=24)
        assert tokens == truth, (name, plan)
        assert finish == "length" and offset == len(ids) + 23
        k, good = plan[0]
        if len(plan) == 1 and k <= 8:  # every forward kept its right drafts and one token of its own
            assert all(s.accepted == min(good, s.drafted) for s in steps if s.forward and s.drafted)
    # and prompt lookup, which drafts whatever the context repeats
    tokens, finish, offset, _ = spec(model, ids, S.PromptLookup(8), max_tokens=24)
    assert tokens == truth


@pytest.mark.parametrize("name", ["llama_gqa3", "qwen3", "gemma2", "phi3_longrope"])
def test_stop_conditions_inside_drafts(name):
    model, tok, ids = fixture(name)
    truth, _ = plain(model, ids, max_tokens=30)
    all_right = [(8, 8)]
    # EOS inside an accepted draft: generation ends at its first occurrence, the cache as plain leaves it
    for at in (1, 3, 6, 13):
        eos = [truth[at]]
        want, finish = plain(model, ids, max_tokens=30, eos=eos)
        got, got_finish, offset, _ = spec(model, ids, Scripted(truth, len(ids), all_right, model.config.vocab_size),
                                          max_tokens=30, eos=eos)
        assert (got, got_finish) == (want, finish) == (want, "eos")
        assert offset == len(ids) + len(want) - 1
    # max_tokens at every count
    for n in range(1, 12):
        got, finish, offset, _ = spec(model, ids, Scripted(truth, len(ids), all_right, model.config.vocab_size),
                                      max_tokens=n)
        assert (got, finish, offset) == (truth[:n], "length", len(ids) + n - 1)
    # a full context: drafts never reach past it, the last token is yielded with finish "context"
    for room in (1, 2, 5, 9):
        want, finish = plain(model, ids, max_tokens=30, max_context=len(ids) + room)
        d = Scripted(truth, len(ids), all_right, model.config.vocab_size)
        got, got_finish, offset, _ = spec(model, ids, d, max_tokens=30, max_context=len(ids) + room)
        assert (got, got_finish) == (want, finish) == (truth[:room + 1], "context")
        assert all(len(ids) + done_room[1] <= len(ids) + room for done_room in d.calls)


def test_stop_strings_and_text_equal_plain():
    model, tok, ids = fixture("llama_gqa3")
    base = Run.from_prompt(model, tok, ids, max_tokens=30, ignore_eos=True)
    text = base.text()
    stop = text[len(text) // 2: len(text) // 2 + 3]
    want = Run.from_prompt(model, tok, ids, max_tokens=30, ignore_eos=True, stop=stop)
    want_text = want.text()
    truth = base.tokens
    got = Run.from_prompt(model, tok, ids, max_tokens=30, ignore_eos=True, stop=stop, prompt_lookup=True)
    got.drafter = Scripted(truth, len(ids), [(8, 8)], model.config.vocab_size)
    assert got.text() == want_text and got.stats.finish == want.stats.finish == "stop"
    assert got.stats.accepted > 0 and got.stats.forwards < want.stats.forwards


def test_rollback_moves_an_offset_and_copies_nothing():
    model, tok, ids = fixture("llama_gqa3")
    truth, _ = plain(model, ids, max_tokens=12)
    cache = model.make_cache(len(ids) + 64)
    buffers = [(layer.keys_t, layer.values) for layer in cache]
    steps = list(speculative_step(model, ids, greedy(max_tokens=12), cache,
                                  drafter=Scripted(truth, len(ids), [(8, 2)], model.config.vocab_size)))
    assert [s.token for s in steps] == truth
    assert sum(s.drafted - s.accepted for s in steps) > 0          # drafts were rejected, and cut back
    assert all(layer.keys_t is k and layer.values is v for layer, (k, v) in zip(cache, buffers))
    assert all(layer.offset == len(ids) + 11 for layer in cache)


def test_a_caller_stopping_early_leaves_the_cache_as_plain_decoding_would():
    model, tok, ids = fixture("llama_gqa3")
    truth, _ = plain(model, ids, max_tokens=12)
    cache = model.make_cache(8)
    gen = speculative_step(model, ids, greedy(max_tokens=12), cache,
                           drafter=Scripted(truth, len(ids), [(8, 8)], model.config.vocab_size))
    got = [next(gen).token for _ in range(4)]   # the second forward kept 8 drafts; stop after its third
    gen.close()
    assert got == truth[:4] and cache[0].offset == len(ids) + 3


def test_lookup_finds_the_most_recent_longest_ngram():
    t = np.array([5, 1, 2, 3, 9, 9, 1, 2, 3, 4, 7, 0, 2, 3])
    assert S.lookup(t, 3) == ([4, 7, 0], 2)           # "2 3" most recently followed by 4
    assert S.lookup(t, 6) == ([4, 7, 0, 2, 3, 4], 2)  # running into the present: the copy goes on over itself
    assert S.lookup(np.array([1, 2, 3, 1, 2]), 5) == ([3, 1, 2, 3, 1], 2)   # a loop of period 3 goes on
    assert S.lookup(np.array([7, 8, 9]), 4) == ([], 0)
    assert S.lookup(np.array([4, 4, 4]), 4) == ([4, 4, 4, 4], 2)   # the repeat in progress


def test_policy_stops_drafting_when_guesses_fail_and_drafts_when_they_hold():
    p = S.Policy(16)
    for _ in range(30):
        p.observe(1, 0, 1)
    assert p.choose(1, 16) == 0
    for _ in range(30):
        p.observe(3, 6, 6)
    p.seconds = {1: 1.0, 9: 1.6, 17: 2.0}
    assert p.choose(3, 16) >= 8


def test_policy_probes_ever_less_while_drafts_do_not_pay_and_never_when_they_cannot():
    costs = {1: 1.0, 2: 1.8, 5: 2.0, 9: 2.0, 17: 2.4}   # forward(rows) / forward(1), as bench.py --spec measures
    lookup = S.Policy(16)   # prompt lookup: a guess costs nothing
    lookup.seconds = dict(costs)
    for _ in range(30):
        lookup.observe(1, 0, 1)
    probes = {call: k for call in range(1, 1001) if (k := lookup.choose(1, 16))}   # none kept: never pays
    gaps = np.diff(list(probes))
    assert len(probes) >= 3 and (gaps > 0).all() and (np.diff(gaps) > 0).all()     # it keeps measuring, ever less
    assert sum(lookup.cost(k + 1) - 1 for k in probes.values()) / 1000 < 0.02    # at < 2 % of plain decoding's time
    slow = S.Policy(16, draft_cost=1.0)   # a draft model as slow as the model: no k pays even if all are kept
    slow.seconds = dict(costs)
    for _ in range(30):
        slow.observe("draft", 6, 6)
    assert not slow.could_pay() and not any(slow.choose("draft", 16) for _ in range(1000))
    cheap = S.Policy(16, draft_cost=0.05)
    cheap.seconds = dict(costs)
    for _ in range(30):
        cheap.observe("draft", 6, 6)
    assert cheap.could_pay() and cheap.choose("draft", 16) >= 8


def test_a_probe_that_keeps_its_drafts_is_followed_by_another_soon():
    """A draft model learns its acceptance rate only from the drafts it verifies: a probe that kept
    most of them brings the next probe within PROBE_SOON forwards (not a doubled gap), until the rate
    pays; one that kept few leaves the gap to grow."""
    costs = {1: 1.0, 2: 1.8, 8: 2.4, 16: 2.9}   # a slow k-row forward: one probe's 0.84 does not pay
    good = S.Policy(16, draft_cost=0.35)
    good.seconds = dict(costs)
    chosen = []
    for call in range(1, 60):
        k = good.choose("draft", 16)
        chosen.append(k)
        if k:
            good.observe("draft", k, k)   # every draft kept
    first = next(i for i, k in enumerate(chosen) if k)
    assert first < 16 and all(chosen[first + 16:]), chosen   # soon after its first probe it drafts on every forward
    # every draft kept: tokens per unit of time over the run, against plain decoding's one per forward
    tokens = sum(k + 1 for k in chosen)
    seconds = sum(good.cost(k + 1) + k * good.draft_cost for k in chosen)
    assert tokens / seconds > 1.5, (tokens, seconds)
    bad = S.Policy(16, draft_cost=0.35)
    bad.seconds = dict(costs)
    calls = {}
    for call in range(1, 1001):
        if k := bad.choose("draft", 16):
            calls[call] = k
            bad.observe("draft", 1, k)   # one kept of the probe's drafts: drafting never pays
    gaps = np.diff(list(calls))
    assert len(calls) >= 3 and (np.diff(gaps) > 0).all(), calls          # probes ever less often
    wasted = sum(bad.cost(k + 1) + k * bad.draft_cost - 2 for k in calls.values())   # each probe gave 2 tokens
    assert wasted / 1000 < 0.03, calls


class OneSecondARow:
    """A model whose forwards advance `clock` (the drafter's perf_counter, monkeypatched) by a second a row."""

    def __init__(self, model, clock: list):
        self.model, self.clock, self.config = model, clock, model.config

    def make_cache(self, capacity):
        return self.model.make_cache(capacity)

    def resume(self, cache, common, total):
        return self.model.resume(cache, common, total)

    def forward(self, feed, cache, last_only=False):
        self.clock[0] += len(feed)
        return self.model.forward(feed, cache, last_only=last_only)


def test_a_draft_tokens_cost_leaves_out_catching_up_with_the_context(monkeypatch):
    model, tok, ids = fixture("llama_gqa3")
    clock = [0.0]
    monkeypatch.setattr(S.time, "perf_counter", lambda: clock[0])
    d = S.DraftModel(OneSecondARow(model, clock), 16)
    d.policy.choose = lambda kind, available: 4
    out, _ = d.draft(ids, 10, make_sampler(0.0), [], None)   # 40 ids behind: the first forward catches up
    assert len(out) == 4 and d.spent == len(ids) + 3 and d.per_token == 1.0
    d.feedback(4, 2, out[2], 50.0, 5)
    assert d.policy.seconds[5] == 50.0 - d.spent and "draft" in d.policy.rate   # the verify alone, and 2 of 4 kept
    # two drafts kept, then the model's own token: the draft cache keeps them and is fed that one token
    d.draft(ids + out[:2] + [(out[2] + 1) % model.config.vocab_size], 10, make_sampler(0.0), [], None)
    assert d.spent == 4 and d.per_token == 1.0


def test_the_policy_starts_from_the_forward_costs_of_the_weights_kind():
    """A model whose weights are kept stored starts from the stored kernels' costs (rows beyond one bound by
    arithmetic: 8 rows ~2.7 forwards), a float32 one from OpenBLAS's (~2); measured costs then replace both."""
    model, tok, _ = fixture("llama_gqa3")
    stored = minigen.load(FIXTURES / "llama_gqa3", quantize="Q8_0")[0]
    for m, costs in ((model, S.PRIOR_COST), (stored, S.PRIOR_COST_STORED)):
        lookup = S.make_drafter(m, tok, Options.of(prompt_lookup=True))
        drafting = S.make_drafter(m, tok, Options.of(draft_model=(model, tok)))
        assert lookup.policy.prior_costs is costs and drafting.policy.prior_costs is costs
        assert lookup.policy.cost(8) == costs[8]


def test_a_draft_model_catches_up_only_where_drafting_could_win_it_back(monkeypatch):
    """The first draft feeds the draft model the whole prompt: made when the drafts to come could repay it
    (`left` tokens at the best gain the costs allow), skipped otherwise, the draft cache left as it was; a
    timed catch-up then prices the next one (here at one second a row against a model's forward of 10)."""
    model, tok, ids = fixture("llama_gqa3")
    clock = [0.0]
    monkeypatch.setattr(S.time, "perf_counter", lambda: clock[0])
    d = S.DraftModel(OneSecondARow(model, clock), 4, cost=0.1)
    d.policy.choose = lambda kind, available: 4
    behind = len(ids)                       # 40: the prompt, all of it new to the draft model
    gain = d.policy.best_gain()             # at the prior costs: a draft token a tenth of a forward
    assert gain > 1.5
    # the prior prices a prompt token at PREFILL_SHARE of a draft token: 40 x 0.02 = 0.8 forwards
    short = int(behind * S.DraftModel.PREFILL_SHARE * 0.1 / (1 - 1 / gain))   # left at which it just does not pay
    assert d.draft(ids, 4, make_sampler(0.0), [], None, left=short) == ([], None)
    assert d.cached == [] and d.spent == 0 and clock[0] == 0        # nothing fed, nothing spent
    out, _ = d.draft(ids, 4, make_sampler(0.0), [], None, left=short + 2)
    assert len(out) == 4 and d.per_prompt_token == 1.0            # caught up: 40 rows in 40 seconds
    d.policy.timed(1, 10.0)                                        # the model's own forward: 10 s, so a prompt token is 0.1
    # a stretch of context the draft model has not seen (a turn of chat, an idle stretch): 30 tokens cost 3 forwards
    later = ids + out + list(range(3, 33))
    gain = d.policy.best_gain()
    pays = 30 * 0.1 / (1 - 1 / gain)
    assert d.draft(later, 4, make_sampler(0.0), [], None, left=int(pays) - 1) == ([], None)
    assert len(d.draft(later, 4, make_sampler(0.0), [], None, left=int(pays) + 2)[0]) == 4
    # following the context (a few tokens behind) never asks
    assert len(d.draft(later + d.cached[len(later):][:1], 4, make_sampler(0.0), [], None, left=1)[0]) == 4

# --- sampling: the distribution of the first tokens, with and without drafts -------------------------

def two_sample_chi2(a, b) -> float:
    """The z-score (Wilson-Hilferty) of the chi-squared two-sample statistic of equal-size samples,
    cells with fewer than 10 draws pooled: about N(0, 1) when both come from one distribution."""
    counts = {}
    for x in a:
        counts.setdefault(x, [0, 0])[0] += 1
    for x in b:
        counts.setdefault(x, [0, 0])[1] += 1
    cells, pool = [], [0, 0]
    for ca, cb in counts.values():
        if ca + cb < 10:
            pool[0], pool[1] = pool[0] + ca, pool[1] + cb
        else:
            cells.append((ca, cb))
    if sum(pool):
        cells.append(tuple(pool))
    stat, df = sum((x - y) ** 2 / (x + y) for x, y in cells), len(cells) - 1
    return ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))


class Greedy:
    """A deterministic drafter (q puts all mass on its token, as prompt lookup's does): a draft model's
    greedy guesses without the repetition penalty, whatever the run samples. On a prompt where greedy
    repeats one token, it drafts that token again and again: the penalty, computed with the drafted
    prefix, must then reject it as often as plain sampling avoids it."""

    def __init__(self, model, k=4):
        self.d, self.greedy = FixedK(S.DraftModel(model, k)), make_sampler(0.0)

    def draft(self, tokens, room, sampler, processors, rng, left=None):
        return self.d.draft(tokens, room, self.greedy, [], rng)[0], None

    def feedback(self, *args):
        self.d.feedback(*args)


def peaked(name="llama_gqa3", scale=5.0):
    """A fixture's model with its logits scaled: random weights give near-flat distributions, where a
    draft is hardly ever kept; real models are peaked."""
    model = minigen.load(FIXTURES / name)[0]
    model.params = {**model.params, "lm_head": model.params["lm_head"] * np.float32(scale)}
    return model


# (fixture, prompt length, settings): after gemma's first 5 ids its greedy output repeats a new token
SETTINGS = [("llama_gqa3", 6, dict(temp=1.0)),
            ("gemma", 5, dict(temp=0.9, top_k=12, top_p=0.9, min_p=0.02, penalty=1.5))]
N_DRAWS = 600


def draws(model, ids, settings: dict, drafter_for):
    """N_DRAWS samples of 3 tokens, without and with speculation: (plain, speculative, drafts kept)."""
    plain_draws, spec_draws, accepted = [], [], 0
    sampled = lambda seed: Options(max_tokens=3, ignore_eos=True, seed=seed, **settings)
    for seed in range(N_DRAWS):
        a = [s.token for s in generate_step(model, ids, sampled(seed))]
        steps = list(speculative_step(model, ids, sampled(10 ** 6 + seed), drafter=drafter_for()))
        accepted += sum(s.accepted for s in steps)
        plain_draws.append(tuple(a))
        spec_draws.append(tuple(s.token for s in steps))
    return plain_draws, spec_draws, accepted


def assert_same_distribution(plain_draws, spec_draws):
    for position in (1, 2):   # the first token comes from the prompt's forward, never drafted
        z = two_sample_chi2([d[position] for d in plain_draws], [d[position] for d in spec_draws])
        assert z < 4.0, (position, z)
    z = two_sample_chi2([d[1:] for d in plain_draws], [d[1:] for d in spec_draws])
    assert z < 4.0, ("pairs", z)


@pytest.mark.parametrize("name, n, settings", SETTINGS, ids=["plain", "all-filters-and-penalty"])
def test_sampling_distribution_is_unchanged(name, n, settings):
    model, ids = peaked(name), fixture(name)[2][:n]
    s = settings
    options = dict(temp=s["temp"], top_k=s.get("top_k", 0), top_p=s.get("top_p", 1.0), min_p=s.get("min_p", 0.0),
                   repeat_penalty=s.get("penalty", 1.0), repeat_last_n=0)
    plain_draws, spec_draws, accepted = draws(model, ids, options, lambda: Greedy(model, 2))
    assert accepted > N_DRAWS // 10                  # the drafts were often kept...
    assert_same_distribution(plain_draws, spec_draws)  # ...and each token is distributed as plain's


def test_sampling_with_a_draft_model_is_unchanged():
    """q is a real distribution here (another model's): the rule's p/q and max(0, p - q) both used."""
    model, ids = peaked(), fixture("llama_gqa3")[2][:6]
    other = peaked(scale=3.0)    # a flatter q than p
    options = dict(temp=0.8, top_k=0, top_p=0.95, min_p=0.0, repeat_penalty=1.0)
    plain_draws, spec_draws, accepted = draws(model, ids, options, lambda: FixedK(S.DraftModel(other, 2)))
    assert accepted > N_DRAWS // 3
    assert_same_distribution(plain_draws, spec_draws)


class FixedK:
    """A drafter's guesses at its maximum length, whatever its policy would choose."""

    def __init__(self, drafter):
        self.d = drafter
        self.d.policy.choose = lambda kind, available: min(available, self.d.policy.max_draft)

    def draft(self, *args, left=None):   # at full length: not skipped for a catch-up that would not pay
        return self.d.draft(*args)

    def feedback(self, *args):
        self.d.feedback(*args)


def test_draft_model_greedy_identity_and_vocabulary_check():
    model, tok, ids = fixture("llama_gqa3")
    truth, _ = plain(model, ids, max_tokens=20)
    other = minigen.load(FIXTURES / "llama_gqa3")[0]
    other.params = {**other.params, "lm_head": other.params["lm_head"][::-1].copy()}   # drafts mostly wrong
    for drafter in (S.DraftModel(model, 5), S.DraftModel(other, 5)):
        tokens, finish, _, steps = spec(model, ids, FixedK(drafter), max_tokens=20)
        assert tokens == truth
    r = Run.from_prompt(model, tok, ids, max_tokens=20, draft_model=(model, tok))
    r.text()
    assert r.tokens == truth and r.stats.drafted == 0   # as slow as the model: it never pays, so never drafts
    small = copy.copy(model)   # the model's first layer alone: a draft of about half its weights
    small.params = {**model.params, "layers": model.params["layers"][:1]}
    small.config = dataclasses.replace(model.config, n_layers=1)
    drafter = S.make_drafter(model, tok, Options.of(draft_model=(small, tok)))
    assert drafter.policy.draft_cost == small.n_params / model.n_params < 0.6
    r = Run.from_prompt(model, tok, ids, max_tokens=20, draft_model=(small, tok))
    r.text()
    assert r.tokens == truth
    g_model, g_tok, _ = fixture("gpt2")
    with pytest.raises(MinigenError, match="another vocabulary") as e:
        Run.from_prompt(model, tok, ids, draft_model=(g_model, g_tok))
    assert "\n" not in str(e.value)


def test_options_are_checked():
    model, tok, ids = fixture("llama_gqa3")
    with pytest.raises(minigen.errors.OptionError, match="draft_tokens"):
        Run.from_prompt(model, tok, ids, prompt_lookup=True, draft_tokens=-1)
    with pytest.raises(minigen.errors.OptionError, match="prompt_lookup"):
        Run.from_prompt(model, tok, ids, prompt_lookup="yes")
    with pytest.raises(minigen.errors.OptionError, match="recording attention"):
        Run.from_prompt(model, tok, ids, prompt_lookup=True, record_attention=True)
    with pytest.raises(minigen.errors.OptionError, match="draft_model"):
        Run.from_prompt(model, tok, ids, draft_model="weights/x")


def test_cli_prompt_lookup_prints_the_same_text_and_its_figures():
    from click.testing import CliRunner
    from minigen.cli import main
    m = FIXTURES / "llama_gqa3"
    args = ["generate", "--model", str(m), "a b c a b c a b c a b", "-m", "40", "--ignore-eos"]
    plain_run = CliRunner().invoke(main, args + ["-q"])
    spec_run = CliRunner().invoke(main, args + ["--prompt-lookup", "-v", "--draft-tokens", "4"])
    assert plain_run.exit_code == spec_run.exit_code == 0
    assert spec_run.stdout == plain_run.stdout
    bad = CliRunner().invoke(main, args + ["--draft-model", str(FIXTURES / "gpt2")])
    assert bad.exit_code == 1 and "another vocabulary" in bad.output
    bad = CliRunner().invoke(main, args + ["--prompt-lookup", "--draft-tokens", "-2"])
    assert bad.exit_code == 2 and "--draft-tokens" in bad.output


def test_chat_turns_with_speculation_equal_plain_generation():
    """Across turns the cache carries over: after speculative turns it must hold exactly what was kept."""
    from minigen.generation.chat import ChatSession
    model, tok, _ = fixture("llama_gqa3")
    lines = ["a b c a b c a b", "And again: a b c a b c", "Thanks! c b a c b a"]
    truth_for = {}

    class Oracle:   # drafts the plain run's continuation of this very turn, 6 at a time, 2 of them wrong
        def draft(self, tokens, room, sampler, processors, rng, left=None):
            key = max((k for k in truth_for if tokens[:len(k)] == list(k)), key=len)   # this turn's prompt
            done = tokens[len(key):]
            right = truth_for[key][len(done):len(done) + 6]
            return [t if j < 4 else (t + 1) % model.config.vocab_size for j, t in enumerate(right)][:room], None

        def feedback(self, *args):
            pass

    plain_session = ChatSession(model, tok, max_tokens=12, ignore_eos=True)
    spec_session = ChatSession(model, tok, max_tokens=12, ignore_eos=True, prompt_lookup=True)
    for line in lines:
        want = plain_session.reply(line)
        want_text = want.text()
        truth_for[tuple(want.run.prompt)] = want.run.tokens
        got = spec_session.reply(line)
        got.run.drafter = Oracle()
        assert got.text() == want_text
        assert got.stats.accepted > 0 and got.stats.forwards < want.stats.forwards
        assert spec_session.cached == plain_session.cached

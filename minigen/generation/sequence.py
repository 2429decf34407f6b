"""One sequence being generated, and the Step each token of it gives: the object every loop drives.

Plain decoding (steps.decode), speculative decoding (speculative.decode), a batch (batch.Batch) and the
server's scheduler all hold one `Sequence` per prompt and ask it the same things, so that each rule is
written once, here:

    Sequence(model, prompt_ids, options, cache)   the options filled in for the model, the prompt checked,
                                                  a cache sized for it (or the caller's, which must leave
                                                  at least the prompt's last id to compute), the sampler,
                                                  logits processors and rng, the EOS ids
    seq.feed()                                    the ids the next forward takes: the pending ones, or more
                                                  where the cache cannot keep what it holds (longrope's
                                                  switch: engine/cache.reusable)
    seq.step(logits, ...)                         one forward's logits -> the next token, as a Step: the
                                                  non-finite check, processors then sampler, the finish rule
    seq.append(token)                             a token taken by other means (a kept draft): the finish rule

The context: the cache holds at most `max_context` tokens (default: the checkpoint's
max_position_embeddings), so every position fed to the model is < max_context. The token produced by
the forward that fills the cache is still given, with finish "context".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Sequence as Ids

import numpy as np

from ..errors import MinigenError, OptionError, short
from .options import Options, check_prompt
from .ids import token_ids
from .sampling import Processor, Sampler, log_softmax, make_repetition_penalty, make_sampler

FIRST_ROOM = 256  # tokens the KV cache has room for beyond the prompt before it first grows


@dataclass
class Step:
    """One generated token. Its log-probs come in two kinds, each named as such, computed only when read:
    `logprob` / `top_logprobs(k)` are of the distribution the token was drawn from (the repetition
    penalty, temperature and the top-k/top-p/min-p filters applied, normalised again; greedy's is
    certain: 0 for its token), `model_logprob` / `model_top_logprobs(k)` of the raw model distribution,
    log_softmax(logits)."""
    token: int
    finish: str | None          # None while going on; "eos" | "length" | "context" on the last step
    seconds: float              # the forward and the sampling that produced this token
    prefill: bool               # produced by the prompt's forward
    logits: np.ndarray          # (V,) the raw logits the token was drawn from
    attentions: list | None     # per layer (H, T, S) when recorded: prefill T = prompt, decode T = 1
    forward: bool = True        # the first token of a forward pass (speculative decoding yields several)
    drafted: int = 0            # on a forward's first token: the drafts that forward verified
    accepted: int = 0           # ... and how many of them it kept
    scores: np.ndarray | None = field(default=None, repr=False)   # (V,) the logits after the processors
    distribution: Callable | None = field(default=None, repr=False)  # scores -> the sampled log-probs

    @cached_property
    def sampled_logprobs(self) -> np.ndarray:
        """(V,) log-probs of the distribution that was sampled from (-inf where filtered out)."""
        if self.distribution is None:  # a sampler of the caller's own, without a `distribution`
            raise MinigenError("this step's sampler does not say what distribution it drew from "
                               "(give it a `distribution` attribute, as make_sampler does)")
        return self.distribution(self.logits if self.scores is None else self.scores)

    @cached_property
    def model_logprobs(self) -> np.ndarray:
        """(V,) log_softmax of the raw logits."""
        return log_softmax(self.logits)

    @property
    def logprob(self) -> float:
        return float(self.sampled_logprobs[self.token])

    @property
    def model_logprob(self) -> float:
        return float(self.model_logprobs[self.token])

    def top_logprobs(self, k: int) -> list[tuple[int, float]]:
        """The k most likely (id, log-prob) of the sampled distribution, best first; fewer when fewer
        tokens survived the filters."""
        return top_entries(self.sampled_logprobs, k)

    def model_top_logprobs(self, k: int) -> list[tuple[int, float]]:
        """The k most likely (id, log-prob) of the raw model distribution, best first."""
        return top_entries(self.model_logprobs, k)


def top_entries(logprobs: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k largest finite entries of logprobs (V,) as (index, value), largest first, ties by index."""
    k = max(0, min(int(k), len(logprobs)))
    part = np.argpartition(-logprobs, k - 1)[:k] if 0 < k < len(logprobs) else np.arange(len(logprobs))[:k]
    order = part[np.lexsort((part, -logprobs[part]))]
    return [(int(i), float(logprobs[i])) for i in order if np.isfinite(logprobs[i])]


class Sequence:
    """One prompt's generation: its ids so far, the ids its next forward takes, its cache, its sampling
    pipeline and its finish rule (see the module's docstring). The prompt's ids are checked here
    (options.check_prompt): every way into generation passes through this constructor.

    `cache`: a cache that already holds the first `cache[0].offset` (< len(prompt_ids)) of the prompt's
    ids (an earlier turn of a conversation, the server's prefix cache); only the rest is computed. It is
    updated in place: after each token it holds the prompt and every generated token but the last."""

    def __init__(self, model, prompt_ids: Ids[int], options: Options = Options(), cache: list | None = None):
        self.model = model
        self.options = o = options.for_model(model)
        self.tokens = [int(t) for t in prompt_ids]     # the prompt, then every generated token
        check_prompt(self.tokens, model, o.max_context)
        self.prompt_tokens = len(self.tokens)
        # Room for the prompt and a first stretch of tokens; the cache doubles when full, so a huge
        # max_tokens or context (10**12 in a config) costs nothing until tokens are actually generated.
        self.cache = cache if cache is not None else \
            model.make_cache(min(o.max_context, len(self.tokens) + min(o.max_tokens, FIRST_ROOM)))
        self.cached = self.cache[0].offset              # prompt ids the caller's cache already held
        self.pending = self.tokens[self.cached:]        # the ids the next forward takes
        if not self.pending:
            raise ValueError("the cache holds the whole prompt: leave at least its last id to compute")
        self.sampler, self.processors, self.rng = sampling_pipeline(o)
        self.eos = frozenset(() if o.ignore_eos else eos_token_ids(model))
        self.generated = 0
        # a record that every forward of this sequence takes in place of per-step lists (with record_attention):
        # the engine's streaming protocol (append(None) for a layer without attention, block(layer, row, weights,
        # plogp) a few query rows at a time), so no step's maps are held; Steps' `attentions` are then None
        self.record = None

    def feed(self, drafts: Ids[int] = ()) -> list[int]:
        """The ids the next forward takes (with `drafts` after them, if any): the pending ones, from as far
        back as the cache can keep (a forward that crosses longrope's switch computes the sequence afresh)."""
        offset = self.cache[0].offset
        kept = self.model.resume(self.cache, offset, offset + len(self.pending) + len(drafts))
        self.pending = self.tokens[kept:]
        return self.pending

    def took(self, n: int) -> bool:
        """A forward took the first n of the pending ids into the cache: whether some are left (a prompt
        computed in pieces, generation/batch.py), to be fed next; if so, there are no logits to sample yet."""
        self.pending = self.pending[n:]
        return bool(self.pending)

    def room(self, wanted: int) -> int:
        """How many drafts the next forward may verify, at most `wanted`: each must be a token the run may
        still give (max_tokens, the context), and none may reach across longrope's switch (their keys would
        differ from the ones the sequence keeps)."""
        if not self.generated:   # the prompt's forward drafts nothing
            return 0
        offset = self.cache[0].offset
        k = max(0, min(wanted, self.options.max_tokens - self.generated - 1,
                       self.options.max_context - offset - len(self.pending)))
        while k and self.model.reusable(offset, offset, offset + len(self.pending) + k) < offset:
            k -= 1
        return k

    def scores(self, logits: np.ndarray, tokens: Ids[int] | None = None) -> np.ndarray:
        """The logits (V,) after every processor, given the ids so far (`tokens`, default the sequence's)."""
        tokens = self.tokens if tokens is None else tokens
        for process in self.processors:
            logits = process(logits, tokens)
        return logits

    def step(self, logits: np.ndarray, seconds: float = 0.0, attentions: list | None = None) -> Step:
        """The next token from the forward's logits (V,) at the sequence's last position, as a Step."""
        self.check_logits(logits)
        scores = self.scores(logits)
        token = self.sampler(scores, self.rng)
        prefill = not self.generated
        return Step(token, self.append(token), seconds, prefill, logits, attentions, scores=scores,
                    distribution=getattr(self.sampler, "distribution", None))

    def append(self, token: int) -> str | None:
        """The token is the sequence's next: its finish ("eos", "length", "context"), or None to go on.
        "context": every position of the context is taken, so no forward may compute a next token."""
        full = len(self.tokens) >= self.options.max_context
        self.tokens.append(int(token))
        self.generated += 1
        self.pending = [int(token)]
        return ("eos" if token in self.eos else "length" if self.generated == self.options.max_tokens
                else "context" if full else None)

    def check_logits(self, logits: np.ndarray) -> None:
        """MinigenError when a forward's logits (any shape) are not all finite: NaN weights or eps would
        otherwise sample <unk> forever."""
        if not np.isfinite(logits).all():
            raise MinigenError(f"step {self.generated + 1}: the model's logits are not finite (NaN or infinity); "
                               f"the checkpoint's weights or config.json are likely corrupt")


def quietly(forward: Callable, *args, **kw):
    """forward(*args, **kw) without NumPy's warnings: a generation's non-finite values are its step's to report,
    once, by name (Sequence.check_logits), not a RuntimeWarning per operation on the way there."""
    with np.errstate(all="ignore"):
        return forward(*args, **kw)


def sampling_pipeline(o: Options) -> tuple[Sampler, list[Processor], "np.random.Generator | None"]:
    """(sampler, logits processors, rng) for options the model has filled in. Greedy draws nothing, so
    it needs no rng (and numpy.random, 6 MB, stays unloaded). A constraint (generation/constraint.py)
    is the first processor, a new one per sequence: its mask comes before every other setting."""
    penalty = make_repetition_penalty(o.repeat_penalty, o.repeat_last_n)
    rng = None if o.temp == 0 else np.random.default_rng(o.seed)
    processors = ([o.constraint.processor()] if o.constraint is not None else []) + ([penalty] if penalty else [])
    return make_sampler(o.temp, o.top_k, o.top_p, o.min_p), processors, rng


def eos_token_ids(model) -> list[int]:
    """EOS ids from generation_config.json (an int or a list) and config.json, in that order."""
    gc = model.generation_config.get("eos_token_id")
    ids = gc if isinstance(gc, list) else [] if gc is None else [gc]
    return list(dict.fromkeys([int(i) for i in ids] + [int(i) for i in model.config.eos_token_ids]))


# --- a prompt's ids ------------------------------------------------------------------------------------

def prompt_ids(tokenizer, prompt: str | Ids[int], chat: bool = False, system: str | None = None) -> list[int]:
    """Ids to start from: ids as given; text encoded with the tokenizer's special tokens (BOS); or, for
    chat, the chat template rendered (see chat_ids). The arguments are checked: an OptionError names one."""
    if not isinstance(chat, bool):
        raise OptionError("chat", f"should be true or false, got {short(chat, 40)}")
    if not (system is None or isinstance(system, str)):
        raise OptionError("system", f"should be a string, got {short(system, 40)}")
    if not isinstance(prompt, str):
        return token_ids(prompt)
    if not (chat or system is not None):
        return tokenizer.encode(prompt)
    messages = ([{"role": "system", "content": system}] if system is not None else []) + \
               [{"role": "user", "content": prompt}]
    return chat_ids(tokenizer, messages)


def chat_ids(tokenizer, messages: list[dict], **variables) -> list[int]:
    """A conversation through the chat template with the generation prompt, encoded without adding
    special tokens, as transformers' apply_chat_template does (the template writes BOS itself).
    `variables`: the template's other inputs (`tools`, as the server passes them)."""
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, **variables),
                            add_special_tokens=False)

"""The prefill/decode loop, stop conditions and timing. Nothing here prints.

`generate_step` is the loop on ids: one batched forward over the prompt (prefill), then one token
at a time through the KV cache (decode), yielding a `Step` per token. `Run` puts text on top: the
streaming detokenizer, stop strings, and the figures the CLI shows.

The context: the cache holds at most `max_context` tokens (default: the checkpoint's
max_position_embeddings), so every position fed to the model is < max_context. The token produced
by the forward that fills the cache is still yielded, with finish "context".
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable, Iterator, Sequence

import numpy as np

from ..engine.cache import checkpoint, truncate
from ..engine.cache import must_recompute
from ..errors import MinigenError, OptionError, is_int, short
from .options import Options, check_prompt
from .sampling import Processor, Sampler, log_softmax, make_repetition_penalty, make_sampler
from .speculative import forward_rows, make_drafter, verify


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


def generate_step(model, prompt_ids: Sequence[int], options: Options = Options(),
                  cache: list | None = None) -> Iterator[Step]:
    """Yield one Step per generated token until EOS (yielded, finish "eos"; never with ignore_eos),
    max_tokens or a full cache. The ids are trusted (`check_prompt`, which Run applies); the options'
    Nones are the checkpoint's (Options.for_model).

    `cache`: a KV cache that already holds the first `cache[0].offset` (< len(prompt_ids)) of the
    prompt's ids, from an earlier turn of a conversation; only the rest is computed. It is updated in
    place: after each Step it holds the prompt and every generated token but the last.
    """
    o = options.for_model(model)
    tokens = [int(t) for t in prompt_ids]
    sampler, processors, rng = sampling_pipeline(o)
    # Room for the prompt and a first stretch of tokens; the cache doubles when full, so a huge
    # max_tokens or context (10**12 in a config) costs nothing until tokens are actually generated.
    if cache is None:
        cache = model.make_cache(min(o.max_context, len(tokens) + min(o.max_tokens, FIRST_ROOM)))
    eos = frozenset(() if o.ignore_eos else eos_token_ids(model))
    ids = tokens[cache[0].offset:]
    if not ids:
        raise ValueError("the cache holds the whole prompt: leave at least its last id to compute")
    for n in range(1, o.max_tokens + 1):
        start, record = time.perf_counter(), [] if o.record_attention else None
        if must_recompute(model.config, cache[0].offset, len(ids)):  # longrope's switch, as transformers
            truncate(cache, 0)  # in place: a caller's cache stays the one in use
            ids = tokens
        logits = model.forward(ids, cache, last_only=True, record=record)[0]   # (V,)
        if n == 1:  # recurrent layers (hybrids) keep their state after the prompt: a next chat turn returns here
            checkpoint(cache)
        if not np.isfinite(logits).all():  # NaN weights or eps would otherwise sample <unk> forever
            raise MinigenError(f"step {n}: the model's logits are not finite (NaN or infinity); the "
                               f"checkpoint's weights or config.json are likely corrupt")
        scores = logits
        for process in processors:
            scores = process(scores, tokens)
        token = sampler(scores, rng)
        tokens.append(token)
        finish = ("eos" if token in eos else "length" if n == o.max_tokens
                  else "context" if cache[0].offset >= o.max_context else None)
        yield Step(token, finish, time.perf_counter() - start, n == 1, logits, record, scores=scores,
                   distribution=getattr(sampler, "distribution", None))
        if finish:
            return
        ids = [token]


def sampling_pipeline(o: Options) -> tuple[Sampler, list[Processor], "np.random.Generator | None"]:
    """(sampler, logits processors, rng) for options the model has filled in. Greedy draws nothing, so
    it needs no rng (and numpy.random, 6 MB, stays unloaded). A constraint (generation/constraint.py)
    is the first processor, a new one per sequence: its mask comes before every other setting."""
    penalty = make_repetition_penalty(o.repeat_penalty, o.repeat_last_n)
    rng = None if o.temp == 0 else np.random.default_rng(o.seed)
    processors = ([o.constraint.processor()] if o.constraint is not None else []) + ([penalty] if penalty else [])
    return make_sampler(o.temp, o.top_k, o.top_p, o.min_p), processors, rng


def speculative_step(model, prompt_ids: Sequence[int], options: Options = Options(), cache: list | None = None,
                     *, drafter) -> Iterator[Step]:
    """generate_step's Steps, the same tokens (greedy) or the same distribution (sampling), with
    `drafter`'s guesses verified several per forward. The cache, as generate_step's, holds after each
    Step the prompt and every generated token but the last."""
    o = options.for_model(model)
    if o.record_attention:
        raise ValueError("speculative decoding records no attention weights (its forwards hold drafts)")
    tokens = [int(t) for t in prompt_ids]
    sampler, processors, rng = sampling_pipeline(o)
    max_tokens, max_context = o.max_tokens, o.max_context
    if cache is None:
        cache = model.make_cache(min(max_context, len(tokens) + min(max_tokens, FIRST_ROOM)))
    eos, pending = frozenset(() if o.ignore_eos else eos_token_ids(model)), tokens[cache[0].offset:]
    if not pending:
        raise ValueError("the cache holds the whole prompt: leave at least its last id to compute")
    n = 0
    while True:
        start = time.perf_counter()
        if must_recompute(model.config, cache[0].offset, len(pending)):  # longrope's switch, as generate_step
            truncate(cache, 0)
            pending = tokens
        offset = cache[0].offset
        room = min(max_tokens - n - 1, max_context - offset - len(pending)) if n else 0  # none on the prompt
        draft, q = drafter.draft(tokens, room, sampler, processors, rng) if room > 0 else ([], None)
        while draft and must_recompute(model.config, offset, len(pending) + len(draft)):
            draft, q = draft[:-1], q and q[:-1]   # never across longrope's switch: its keys would differ
        if draft:   # recurrent layers (hybrids) cannot drop rejected drafts: they return here, then refeed
            checkpoint(cache)
        logits = forward_rows(model, pending + draft, cache, len(draft) + 1)         # (k + 1, V)
        if not np.isfinite(logits).all():
            raise MinigenError(f"step {n + 1}: the model's logits are not finite (NaN or infinity); the "
                               f"checkpoint's weights or config.json are likely corrupt")
        out = verify(logits, draft, q, tokens, sampler, processors, rng)
        seconds = time.perf_counter() - start
        drafter.feedback(len(draft), len(out) - 1, out[-1], seconds if n else None, len(pending) + len(draft))
        base = offset + len(pending)   # cache positions filled before the first kept token's
        truncate(cache, base + len(out) - 1)   # the kept drafts stay; the rejected ones are cut
        for j, token in enumerate(out):
            n += 1
            tokens.append(token)
            finish = ("eos" if token in eos else "length" if n == max_tokens
                      else "context" if base + j >= max_context else None)
            if finish or j == len(out) - 1:
                truncate(cache, base + j)   # as generate_step leaves it: every generated token but this one
            try:
                yield Step(token, finish, seconds / len(out), n == 1, logits[j], None,
                           forward=j == 0, drafted=len(draft) if j == 0 else 0,
                           accepted=len(out) - 1 if j == 0 else 0)
            except GeneratorExit:   # the caller stopped here (a stop string): the cache as after this Step
                truncate(cache, min(cache[0].offset, base + j))
                raise
            if finish:
                return
        pending = tokens[cache[0].offset:]   # [out[-1]]; after a recurrent layer's rollback, the kept tokens too


def eos_token_ids(model) -> list[int]:
    """EOS ids from generation_config.json (an int or a list) and config.json, in that order."""
    gc = model.generation_config.get("eos_token_id")
    ids = gc if isinstance(gc, list) else [] if gc is None else [gc]
    return list(dict.fromkeys([int(i) for i in ids] + [int(i) for i in model.config.eos_token_ids]))


def prompt_ids(tokenizer, prompt: str | Sequence[int], chat: bool = False, system: str | None = None) -> list[int]:
    """Ids to start from: ids as given; text encoded with the tokenizer's special tokens (BOS); or, for
    chat, the chat template rendered (see chat_ids)."""
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


def token_ids(prompt) -> list[int]:
    """A prompt given as ids: a sequence of integers (Python or NumPy), nothing else."""
    if isinstance(prompt, (str, bytes, bytearray, dict)) or not hasattr(prompt, "__iter__"):
        raise OptionError("prompt", f"should be a string or a list of token ids, got {short(prompt, 40)}")
    ids = list(prompt)
    bad = next((i for i in ids if not is_int(i)), None)
    if bad is not None:
        raise OptionError("prompt", f"token ids should be integers, got {short(bad, 40)}")
    return [int(i) for i in ids]


@dataclass
class Stats:
    prompt_tokens: int = 0
    generated_tokens: int = 0           # every token sampled, a final EOS included
    prefill_seconds: float = 0.0        # the prompt's forward (and the first token's sampling)
    decode_seconds: float = 0.0         # the one-token forwards after it
    finish: str | None = None           # "eos" | "length" | "context" | "stop"; None if interrupted
    forwards: int = 0                   # forward passes, the prompt's included
    drafted: int = 0                    # speculative decoding: draft tokens verified
    accepted: int = 0                   # ... and kept

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def accepted_per_forward(self) -> float:
        return self.accepted / (self.forwards - 1) if self.forwards > 1 else 0.0

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tps(self) -> float:
        steps = self.generated_tokens - 1
        return steps / self.decode_seconds if steps > 0 and self.decode_seconds else 0.0


@dataclass
class Run:
    """One generation of text: `pieces()` yields text as it is produced; `stats` fills in as it goes.

    `on_step` callbacks see every Step (ids, logits, attention weights when recorded) before its text.
    `cache`: a KV cache already holding the start of the prompt (see generate_step); the stats then
    count only the prompt tokens computed.
    """
    model: object
    tokenizer: object
    prompt: list[int]
    options: Options = field(default_factory=Options)
    on_step: list[Callable[[Step], None]] = field(default_factory=list)
    cache: list | None = None

    def __post_init__(self):
        self.options = self.options.for_model(self.model)
        if self.options.constraint is not None:   # llguidance's tokenizer for this one (made once per tokenizer)
            self.options = replace(self.options, constraint=self.options.constraint.bind(
                self.tokenizer, self.model.config.vocab_size, eos_token_ids(self.model)))
        check_prompt(self.prompt, self.model, self.options.max_context)
        self.stats = Stats(prompt_tokens=len(self.prompt) - (self.cache[0].offset if self.cache is not None else 0))
        self.tokens: list[int] = []      # generated ids, a final EOS excluded
        self.drafter = make_drafter(self.model, self.tokenizer, self.options)
        self._detok, self._pending, self.stopped = None, "", False
        self._stops = tuple(s for s in self.options.stop if s)

    @classmethod
    def from_prompt(cls, model, tokenizer, prompt: str | Sequence[int], chat: bool = False,
                    system: str | None = None, cache: list | None = None, **options) -> "Run":
        """A Run from a prompt (text, or ids) and keyword options named like Options' fields."""
        if not isinstance(chat, bool):
            raise OptionError("chat", f"should be true or false, got {short(chat, 40)}")
        if not (system is None or isinstance(system, str)):
            raise OptionError("system", f"should be a string, got {short(system, 40)}")
        settings = Options.of(**options)
        return cls(model, tokenizer, prompt_ids(tokenizer, prompt, chat, system), settings, cache=cache)

    def steps(self) -> Iterator[Step]:
        if self.drafter is None:
            return generate_step(self.model, self.prompt, self.options, self.cache)
        return speculative_step(self.model, self.prompt, self.options, self.cache, drafter=self.drafter)

    def pieces(self) -> Iterator[str]:
        for step in self.steps():
            text = self.take(step)
            if text:
                yield text
            if self.stopped or step.finish == "eos":
                break
        text = self.flush()
        if text:
            yield text

    def take(self, step: Step) -> str:
        """One Step in, as pieces() takes them or a Batch hands them out: the text it completes. After
        a stop string (`stopped`) or a Step with a finish, `flush()` gives what was held back."""
        if self._detok is None:
            self._detok = self.tokenizer.streamer()
        self._count(step)
        for callback in self.on_step:
            callback(step)
        if step.finish == "eos":
            return ""  # the EOS that ends generation is not text
        self.tokens.append(step.token)
        text, self._pending, self.stopped = split_at_stop(self._pending + self._detok.add(step.token), self._stops)
        if self.stopped:
            self.stats.finish = "stop"
        return text

    def flush(self) -> str:
        """The text held back (an incomplete character, a possible stop string's start) at the end."""
        if self.stopped or self._detok is None:
            return ""
        text, self._pending, stopped = split_at_stop(self._pending + self._detok.flush(), self._stops, final=True)
        if stopped:
            self.stats.finish, self.stopped = "stop", True
        return text

    def text(self) -> str:
        return "".join(self.pieces())

    def _count(self, step: Step):
        st = self.stats
        st.generated_tokens += 1
        if step.prefill:
            st.prefill_seconds += step.seconds
        else:
            st.decode_seconds += step.seconds
        st.finish = step.finish
        st.forwards += step.forward
        st.drafted += step.drafted
        st.accepted += step.accepted


def split_at_stop(text: str, stops: Sequence[str], final: bool = False) -> tuple[str, str, bool]:
    """(safe to show, held back, stopped): cut at the first stop string; hold back a tail that could
    still become one (a stop string can span tokens); at the end (`final`) nothing is held back."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    if hits:
        return text[:min(hits)], "", True
    if final:
        return text, "", False
    hold = max((n for s in stops for n in range(min(len(s) - 1, len(text)), 0, -1)
                if text.endswith(s[:n])), default=0)
    return text[:len(text) - hold], text[len(text) - hold:], False


def generate(model, tokenizer, prompt: str | Sequence[int], **options) -> str:
    """The generated text (the prompt not included)."""
    return Run.from_prompt(model, tokenizer, prompt, **options).text()


def stream(model, tokenizer, prompt: str | Sequence[int], **options) -> Iterator[str]:
    """The generated text in pieces, as it is produced (bad options raise here, not at the first piece)."""
    return Run.from_prompt(model, tokenizer, prompt, **options).pieces()

"""The prefill/decode loop, stop conditions and timing. Nothing here prints.

`generate_step` is the loop on ids: one batched forward over the prompt (prefill), then one token
at a time through the KV cache (decode), yielding a `Step` per token. `Run` puts text on top: the
streaming detokenizer, stop strings, and the figures the CLI shows.

The context: the cache holds at most `max_context` tokens (default: the checkpoint's
max_position_embeddings), so every position fed to the model is < max_context. The token produced
by the forward that fills the cache is still yielded, with finish "context".
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from ..engine.cache import truncate
from ..errors import MinigenError, OptionError, is_int, short
from ..engine.cache import must_recompute
from .sampling import Processor, Sampler, make_repetition_penalty, make_sampler, sampling_settings
from .speculative import forward_rows, make_drafter, verify


FIRST_ROOM = 256  # tokens the KV cache has room for beyond the prompt before it first grows


@dataclass
class Step:
    token: int
    finish: str | None          # None while going on; "eos" | "length" | "context" on the last step
    seconds: float              # the forward and the sampling that produced this token
    prefill: bool               # produced by the prompt's forward
    logits: np.ndarray          # (V,) the raw logits the token was drawn from
    attentions: list | None     # per layer (H, T, S) when recorded: prefill T = prompt, decode T = 1
    forward: bool = True        # the first token of a forward pass (speculative decoding yields several)
    drafted: int = 0            # on a forward's first token: the drafts that forward verified
    accepted: int = 0           # ... and how many of them it kept


def generate_step(model, prompt_ids: Sequence[int], sampler: Sampler | None = None,
                  processors: Sequence[Processor] = (), rng: np.random.Generator | None = None,
                  max_tokens: int = 256, eos_ids: Sequence[int] = (), max_context: int | None = None,
                  record_attention: bool = False, cache: list | None = None) -> Iterator[Step]:
    """Yield one Step per generated token until EOS (yielded, finish "eos"), max_tokens or a full cache.

    `cache`: a KV cache that already holds the first `cache[0].offset` (< len(prompt_ids)) of the
    prompt's ids, from an earlier turn of a conversation; only the rest is computed. It is updated in
    place: after each Step it holds the prompt and every generated token but the last.
    """
    tokens = [int(t) for t in prompt_ids]
    max_context = max_context or model.config.max_position_embeddings
    check_prompt(len(tokens), max_context)
    if rng is None and sampler is not None:  # greedy (no sampler) draws nothing: numpy.random stays unloaded (6 MB)
        rng = np.random.default_rng()
    sampler = sampler or make_sampler(0.0)
    # Room for the prompt and a first stretch of tokens; the cache doubles when full, so a huge
    # max_tokens or context (10**12 in a config) costs nothing until tokens are actually generated.
    if cache is None:
        cache = model.make_cache(min(max_context, len(tokens) + min(max_tokens, FIRST_ROOM)))
    eos, ids = frozenset(int(e) for e in eos_ids), tokens[cache[0].offset:]
    if not ids:
        raise ValueError("the cache holds the whole prompt: leave at least its last id to compute")
    for n in range(1, max_tokens + 1):
        start, record = time.perf_counter(), [] if record_attention else None
        if must_recompute(model.config, cache[0].offset, len(ids)):  # longrope's switch, as transformers
            truncate(cache, 0)  # in place: a caller's cache stays the one in use
            ids = tokens
        logits = model.forward(ids, cache, last_only=True, record=record)[0]   # (V,)
        if not np.isfinite(logits).all():  # NaN weights or eps would otherwise sample <unk> forever
            raise MinigenError(f"step {n}: the model's logits are not finite (NaN or infinity); the "
                               f"checkpoint's weights or config.json are likely corrupt")
        scores = logits
        for process in processors:
            scores = process(scores, tokens)
        token = sampler(scores, rng)
        tokens.append(token)
        finish = ("eos" if token in eos else "length" if n == max_tokens
                  else "context" if cache[0].offset >= max_context else None)
        yield Step(token, finish, time.perf_counter() - start, n == 1, logits, record)
        if finish:
            return
        ids = [token]


def speculative_step(model, prompt_ids: Sequence[int], sampler: Sampler | None = None,
                     processors: Sequence[Processor] = (), rng: np.random.Generator | None = None,
                     max_tokens: int = 256, eos_ids: Sequence[int] = (), max_context: int | None = None,
                     record_attention: bool = False, cache: list | None = None, *, drafter) -> Iterator[Step]:
    """generate_step's Steps, the same tokens (greedy) or the same distribution (sampling), with
    `drafter`'s guesses verified several per forward. The cache, as generate_step's, holds after each
    Step the prompt and every generated token but the last."""
    if record_attention:
        raise ValueError("speculative decoding records no attention weights (its forwards hold drafts)")
    tokens = [int(t) for t in prompt_ids]
    max_context = max_context or model.config.max_position_embeddings
    check_prompt(len(tokens), max_context)
    sampler = sampler or make_sampler(0.0)
    if rng is None and not sampler.greedy:
        rng = np.random.default_rng()
    if cache is None:
        cache = model.make_cache(min(max_context, len(tokens) + min(max_tokens, FIRST_ROOM)))
    eos, pending = frozenset(int(e) for e in eos_ids), tokens[cache[0].offset:]
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
        pending = [out[-1]]



def check_prompt(n_tokens: int, max_context: int):
    if n_tokens == 0:
        raise MinigenError("the prompt is empty (no tokens to start from)")
    if n_tokens > max_context:
        raise MinigenError(f"the prompt is {n_tokens} tokens, longer than the context of {max_context} "
                           f"tokens (--max-context); shorten it")


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


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """A conversation through the chat template with the generation prompt, encoded without adding
    special tokens, as transformers' apply_chat_template does (the template writes BOS itself)."""
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True),
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
class Options:
    """Everything a run can be asked for; None means the checkpoint's generation_config.json decides.
    `check` is the one place these are validated (the CLI's flags included): inner code trusts them."""
    max_tokens: int = 256
    temp: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int = 64              # 0: the whole sequence, prompt included (HF's behaviour)
    seed: int | None = None
    stop: tuple = ()
    ignore_eos: bool = False
    max_context: int | None = None
    record_attention: bool = False
    prompt_lookup: bool = False          # draft from the context's own n-grams (speculative decoding)
    draft_model: tuple | None = None     # (Model, Tokenizer) of a small model that drafts (same vocabulary)
    draft_tokens: int | None = None      # at most this many drafts per forward (None: 16); 0 drafts none

    def check(self):
        """OptionError naming the first option of the wrong type or out of range."""
        real, opt = _is_real, lambda ok: lambda v: v is None or ok(v)
        rules = [
            ("max_tokens", lambda v: is_int(v) and v >= 0, "an integer >= 0"),
            ("temp", opt(lambda v: real(v) and v >= 0), "a number >= 0"),
            ("top_k", opt(lambda v: is_int(v) and v >= 0), "an integer >= 0"),
            ("top_p", opt(lambda v: real(v) and 0 < v <= 1), "a number in (0, 1]"),
            ("min_p", opt(lambda v: real(v) and 0 <= v <= 1), "a number in [0, 1]"),
            ("repeat_penalty", opt(lambda v: real(v) and v > 0), "a number > 0"),
            ("repeat_last_n", lambda v: is_int(v) and v >= 0, "an integer >= 0"),
            ("seed", opt(lambda v: is_int(v) and v >= 0), "an integer >= 0"),
            ("stop", lambda v: isinstance(v, tuple) and all(isinstance(x, str) and x for x in v),
             "a non-empty string or a list of them"),
            ("ignore_eos", lambda v: isinstance(v, bool), "true or false"),
            ("max_context", opt(lambda v: is_int(v) and v >= 1), "an integer >= 1"),
            ("record_attention", lambda v: isinstance(v, bool), "true or false"),
            ("prompt_lookup", lambda v: isinstance(v, bool), "true or false"),
            ("draft_model", opt(lambda v: isinstance(v, tuple) and len(v) == 2 and hasattr(v[0], "forward")),
             "a (model, tokenizer) pair, as minigen.load returns"),
            ("draft_tokens", opt(lambda v: is_int(v) and 0 <= v <= 64), "an integer in 0..64"),
        ]
        for name, ok, what in rules:
            value = getattr(self, name)
            if not ok(value):
                raise OptionError(name, f"should be {what}, got {short(value, 40)}")
        if self.record_attention and (self.prompt_lookup or self.draft_model):
            raise OptionError("prompt_lookup" if self.prompt_lookup else "draft_model",
                              "cannot be combined with recording attention (a verifying forward holds drafts)")
        if self.prompt_lookup and self.draft_model:
            raise OptionError("draft_model", "choose one drafter: prompt_lookup or draft_model, not both")


def _is_real(v) -> bool:
    """A finite number (NaN, infinity and ints past float's range are refused: no option's range has them)."""
    if not isinstance(v, (int, float, np.integer, np.floating)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


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
        self.options.check()
        cfg_context = self.model.config.max_position_embeddings
        if self.options.max_context is not None and self.options.max_context > cfg_context:
            raise OptionError("max_context", f"{self.options.max_context} is larger than the model's context "
                                             f"({cfg_context} tokens, max_position_embeddings)")
        vocab = self.model.config.vocab_size
        outside = next((i for i in self.prompt if not 0 <= i < vocab), None)
        if outside is not None:  # ids given, or a tokenizer larger than the model's vocab_size
            raise MinigenError(f"prompt: token id {outside} is outside the model's vocabulary (0..{vocab - 1})")
        self.settings = sampling_settings(self.model.generation_config, temp=self.options.temp,
                                          top_k=self.options.top_k, top_p=self.options.top_p,
                                          min_p=self.options.min_p, repeat_penalty=self.options.repeat_penalty)
        self.max_context = self.options.max_context or cfg_context
        check_prompt(len(self.prompt), self.max_context)
        self.stats = Stats(prompt_tokens=len(self.prompt) - (self.cache[0].offset if self.cache is not None else 0))
        self.tokens: list[int] = []      # generated ids, a final EOS excluded
        self.drafter = make_drafter(self.model, self.tokenizer, self.options)
        self._detok, self._pending, self.stopped = None, "", False
        self._stops = tuple(s for s in self.options.stop if s)

    def steps(self) -> Iterator[Step]:
        loop, drafter = (generate_step, {}) if self.drafter is None else (speculative_step, {"drafter": self.drafter})
        return loop(self.model, self.prompt, *self.loop_args(), **drafter)

    def loop_args(self) -> tuple:
        """generate_step's arguments after the prompt, from the options: (sampler, processors, rng,
        max_tokens, eos_ids, max_context, record_attention, cache). A Batch takes them too."""
        o, s = self.options, self.settings
        greedy = s["temp"] == 0
        sampler = None if greedy else make_sampler(s["temp"], s["top_k"], s["top_p"], s["min_p"])
        penalty = make_repetition_penalty(s["repeat_penalty"], o.repeat_last_n)
        return (sampler, [penalty] if penalty else [], None if greedy else np.random.default_rng(o.seed),
                o.max_tokens, () if o.ignore_eos else eos_token_ids(self.model), self.max_context,
                o.record_attention, self.cache)

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


def run(model, tokenizer, prompt: str | Sequence[int], chat: bool = False, system: str | None = None,
        cache: list | None = None, **options) -> Run:
    """A Run from keyword options named like the CLI's flags (max_tokens, temp, top_k, ..., stop)."""
    unknown = set(options) - set(Options.__dataclass_fields__)
    if unknown:
        raise OptionError(sorted(unknown)[0], f"no such option (options: {', '.join(Options.__dataclass_fields__)})")
    stop = options.get("stop", ())
    options["stop"] = (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, (list, tuple)) else stop
    if not isinstance(chat, bool):
        raise OptionError("chat", f"should be true or false, got {short(chat, 40)}")
    if not (system is None or isinstance(system, str)):
        raise OptionError("system", f"should be a string, got {short(system, 40)}")
    ids = prompt_ids(tokenizer, prompt, chat, system)
    return Run(model, tokenizer, ids, Options(**options), cache=cache)


def generate(model, tokenizer, prompt: str | Sequence[int], **options) -> str:
    """The generated text (the prompt not included)."""
    return run(model, tokenizer, prompt, **options).text()


def stream(model, tokenizer, prompt: str | Sequence[int], **options) -> Iterator[str]:
    """The generated text in pieces, as it is produced (bad options raise here, not at the first piece)."""
    return run(model, tokenizer, prompt, **options).pieces()

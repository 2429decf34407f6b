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
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from .errors import MinigenError
from .model import must_recompute
from .sampling import Processor, Sampler, make_repetition_penalty, make_sampler, sampling_settings


@dataclass
class Step:
    token: int
    finish: str | None          # None while going on; "eos" | "length" | "context" on the last step
    seconds: float              # the forward and the sampling that produced this token
    prefill: bool               # produced by the prompt's forward
    logits: np.ndarray          # (V,) the raw logits the token was drawn from
    attentions: list | None     # per layer (H, T, S) when recorded: prefill T = prompt, decode T = 1


def generate_step(model, prompt_ids: Sequence[int], sampler: Sampler | None = None,
                  processors: Sequence[Processor] = (), rng: np.random.Generator | None = None,
                  max_tokens: int = 256, eos_ids: Sequence[int] = (), max_context: int | None = None,
                  record_attention: bool = False) -> Iterator[Step]:
    """Yield one Step per generated token until EOS (yielded, finish "eos"), max_tokens or a full cache."""
    tokens = [int(t) for t in prompt_ids]
    max_context = max_context or model.config.max_position_embeddings
    check_prompt(len(tokens), max_context)
    if rng is None and sampler is not None:  # greedy (no sampler) draws nothing: numpy.random stays unloaded (6 MB)
        rng = np.random.default_rng()
    sampler = sampler or make_sampler(0.0)
    cache = model.make_cache(min(max_context, len(tokens) + max_tokens))
    eos, ids = frozenset(int(e) for e in eos_ids), tokens
    for n in range(1, max_tokens + 1):
        start, record = time.perf_counter(), [] if record_attention else None
        if must_recompute(model.config, cache[0].offset, len(ids)):  # longrope's switch, as transformers
            cache, ids = model.make_cache(cache[0].capacity), tokens
        logits = model.forward(ids, cache, last_only=True, record=record)[0]   # (V,)
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
    chat, the chat template rendered with the generation prompt and encoded without adding any, as
    transformers' apply_chat_template does (the template writes BOS itself)."""
    if not isinstance(prompt, str):
        return [int(i) for i in prompt]
    if not (chat or system is not None):
        return tokenizer.encode(prompt)
    messages = ([{"role": "system", "content": system}] if system is not None else []) + \
               [{"role": "user", "content": prompt}]
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True),
                            add_special_tokens=False)


@dataclass
class Options:
    """Everything a run can be asked for; None means the checkpoint's generation_config.json decides."""
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

    def check(self):
        bad = [(n, v, why) for n, v, ok, why in [
            ("max_tokens", self.max_tokens, self.max_tokens >= 0, ">= 0"),
            ("temp", self.temp, self.temp is None or self.temp >= 0, ">= 0"),
            ("top_k", self.top_k, self.top_k is None or self.top_k >= 0, ">= 0"),
            ("top_p", self.top_p, self.top_p is None or 0 < self.top_p <= 1, "in (0, 1]"),
            ("min_p", self.min_p, self.min_p is None or 0 <= self.min_p <= 1, "in [0, 1]"),
            ("repeat_penalty", self.repeat_penalty, self.repeat_penalty is None or self.repeat_penalty > 0, "> 0"),
            ("repeat_last_n", self.repeat_last_n, self.repeat_last_n >= 0, ">= 0"),
            ("max_context", self.max_context, self.max_context is None or self.max_context >= 1, ">= 1"),
        ] if not ok]
        if bad:
            name, value, why = bad[0]
            raise MinigenError(f"{name} must be {why}, got {value}")
        if any(not s for s in self.stop):
            raise MinigenError("stop strings must not be empty")


@dataclass
class Stats:
    prompt_tokens: int = 0
    generated_tokens: int = 0           # every token sampled, a final EOS included
    prefill_seconds: float = 0.0        # the prompt's forward (and the first token's sampling)
    decode_seconds: float = 0.0         # the one-token forwards after it
    finish: str | None = None           # "eos" | "length" | "context" | "stop"; None if interrupted

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
    """
    model: object
    tokenizer: object
    prompt: list[int]
    options: Options = field(default_factory=Options)
    on_step: list[Callable[[Step], None]] = field(default_factory=list)

    def __post_init__(self):
        self.options.check()
        cfg_context = self.model.config.max_position_embeddings
        if self.options.max_context is not None and self.options.max_context > cfg_context:
            raise MinigenError(f"max_context {self.options.max_context} is larger than the model's context "
                               f"({cfg_context} tokens, max_position_embeddings)")
        self.settings = sampling_settings(self.model.generation_config, temp=self.options.temp,
                                          top_k=self.options.top_k, top_p=self.options.top_p,
                                          min_p=self.options.min_p, repeat_penalty=self.options.repeat_penalty)
        self.max_context = self.options.max_context or cfg_context
        check_prompt(len(self.prompt), self.max_context)
        self.stats = Stats(prompt_tokens=len(self.prompt))
        self.tokens: list[int] = []      # generated ids, a final EOS excluded

    def steps(self) -> Iterator[Step]:
        o, s = self.options, self.settings
        greedy = s["temp"] == 0
        sampler = None if greedy else make_sampler(s["temp"], s["top_k"], s["top_p"], s["min_p"])
        penalty = make_repetition_penalty(s["repeat_penalty"], o.repeat_last_n)
        return generate_step(self.model, self.prompt, sampler, [penalty] if penalty else [],
                             None if greedy else np.random.default_rng(o.seed), o.max_tokens,
                             () if o.ignore_eos else eos_token_ids(self.model), self.max_context,
                             o.record_attention)

    def pieces(self) -> Iterator[str]:
        detok, pending, stops = self.tokenizer.streamer(), "", tuple(s for s in self.options.stop if s)
        for step in self.steps():
            self._count(step)
            for callback in self.on_step:
                callback(step)
            if step.finish == "eos":
                break  # the EOS that ends generation is not text
            self.tokens.append(step.token)
            text, pending, stopped = split_at_stop(pending + detok.add(step.token), stops)
            if text:
                yield text
            if stopped:
                self.stats.finish = "stop"
                return
        text, _, stopped = split_at_stop(pending + detok.flush(), stops, final=True)
        if stopped:
            self.stats.finish = "stop"
        if text:
            yield text

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
        **options) -> Run:
    """A Run from keyword options named like the CLI's flags (max_tokens, temp, top_k, ..., stop)."""
    unknown = set(options) - set(Options.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    if isinstance(options.get("stop"), str):
        options["stop"] = (options["stop"],)
    ids = prompt_ids(tokenizer, prompt, chat, system)
    return Run(model, tokenizer, ids, Options(**options))


def generate(model, tokenizer, prompt: str | Sequence[int], **options) -> str:
    """The generated text (the prompt not included)."""
    return run(model, tokenizer, prompt, **options).text()


def stream(model, tokenizer, prompt: str | Sequence[int], **options) -> Iterator[str]:
    """The generated text in pieces, as it is produced (bad options raise here, not at the first piece)."""
    return run(model, tokenizer, prompt, **options).pieces()

"""The prefill/decode loop, its figures, and text on top. Nothing here prints.

`generate_step` is the loop on ids: one batched forward over the prompt (prefill), then one token at a
time through the KV cache (decode), yielding a `Step` per token; the rules of each token (what to feed,
the checks, sampling, when to stop) are the Sequence's (sequence.py). `Run` puts text on top: the
streaming detokenizer and stop strings (text/stream.py), the figures the CLI shows, and the choice of
loop (plain, or speculative.decode when a drafter is asked for).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Sequence as Ids

from ..engine.cache import checkpoint
from ..text.stream import TextStream
from .options import Options
from .sequence import Sequence, Step, eos_token_ids, prompt_ids, quietly
from . import speculative


def generate_step(model, prompt_ids: Ids[int], options: Options = Options(),
                  cache: list | None = None) -> Iterator[Step]:
    """Yield one Step per generated token until EOS (yielded, finish "eos"; never with ignore_eos),
    max_tokens or a full cache. The options' Nones are the checkpoint's (Options.for_model).

    `cache`: a KV cache that already holds the first `cache[0].offset` (< len(prompt_ids)) of the
    prompt's ids, from an earlier turn of a conversation; only the rest is computed. It is updated in
    place: after each Step it holds the prompt and every generated token but the last.
    """
    return decode(Sequence(model, prompt_ids, options, cache))


def decode(seq: Sequence) -> Iterator[Step]:
    """Plain decoding of a Sequence: one forward a token."""
    if seq.options.max_tokens == 0:
        return
    while True:
        start, record = time.perf_counter(), [] if seq.options.record_attention and seq.record is None else None
        logits = quietly(seq.model.forward, seq.feed(), seq.cache, last_only=True,
                         record=seq.record if record is None else record)[0]   # (V,)
        if not seq.generated:  # recurrent layers (hybrids) keep their state after the prompt: a next chat turn returns here
            checkpoint(seq.cache)
        step = seq.step(logits, attentions=record)
        step.seconds = time.perf_counter() - start
        yield step
        if step.finish:
            return


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
    count only the prompt tokens computed. The Run's Sequence (`sequence`) is what a loop drives:
    `steps()` here, or a Batch it is added to (batch.py), whose Steps come back through `take`.
    """
    model: object
    tokenizer: object
    prompt: list[int]
    options: Options = field(default_factory=Options)
    on_step: list[Callable[[Step], None]] = field(default_factory=list)
    cache: list | None = None

    def __post_init__(self):
        if self.options.constraint is not None:   # llguidance's tokenizer for this one (made once per tokenizer)
            self.options = replace(self.options, constraint=self.options.constraint.bind(
                self.tokenizer, self.model.config.vocab_size, eos_token_ids(self.model)))
        self.sequence = Sequence(self.model, self.prompt, self.options, self.cache)   # checks the prompt
        self.options = self.sequence.options
        self.stats = Stats(prompt_tokens=len(self.prompt) - self.sequence.cached)
        self.tokens: list[int] = []      # generated ids, a final EOS excluded
        self.drafter = speculative.make_drafter(self.model, self.tokenizer, self.options)
        self.text_out = TextStream(self.tokenizer, self.options.stop)

    @classmethod
    def from_prompt(cls, model, tokenizer, prompt: str | Ids[int], chat: bool = False,
                    system: str | None = None, cache: list | None = None, **options) -> "Run":
        """A Run from a prompt (text, or ids) and keyword options named like Options' fields."""
        ids = prompt_ids(tokenizer, prompt, chat, system)
        return cls(model, tokenizer, ids, Options.of(**options), cache=cache)

    @property
    def stopped(self) -> bool:
        """A stop string was reached: no more text comes."""
        return self.text_out.stopped

    def steps(self) -> Iterator[Step]:
        if self.drafter is None:
            return decode(self.sequence)
        return speculative.decode(self.sequence, self.drafter)

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
        self._count(step)
        for callback in self.on_step:
            callback(step)
        if step.finish == "eos":
            return ""  # the EOS that ends generation is not text
        self.tokens.append(step.token)
        text = self.text_out.add(step.token)
        if self.stopped:
            self.stats.finish = "stop"
        return text

    def flush(self) -> str:
        """The text held back (an incomplete character, a possible stop string's start) at the end."""
        text = self.text_out.flush()
        if self.stopped:
            self.stats.finish = "stop"
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


def generate(model, tokenizer, prompt: str | Ids[int], *, chat: bool = False, system: str | None = None,
             **options) -> str:
    """The generated text (the prompt not included). `chat`: the prompt through the chat template (with
    `system` as its system message); `options`: Options' fields (max_tokens, temp, ..., stop)."""
    return Run.from_prompt(model, tokenizer, prompt, chat, system, **options).text()


def stream(model, tokenizer, prompt: str | Ids[int], *, chat: bool = False, system: str | None = None,
           **options) -> Iterator[str]:
    """`generate`'s text in pieces, as it is produced (bad options raise here, not at the first piece)."""
    return Run.from_prompt(model, tokenizer, prompt, chat, system, **options).pieces()

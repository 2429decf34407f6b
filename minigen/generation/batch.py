"""Batched generation: several sequences decoded together, each forward over all of their new rows.

`Batch` is the step a server runs: `add` a Sequence (sequence.py) between steps, `step()` feeds every
sequence's pending ids (a new one's prompt, the others' last token) through one batched forward and
gives each sequence the Step its own rules make of its logits (its own sampler, processors, rng and
finish rule); a sequence leaves when it finishes (EOS, max_tokens, a full context), fails, or is
cancelled. Each sequence has its own cache (and offset), so prompts of any length share a step, and each
result is the one plain decoding gives that prompt alone. While in the batch, a sequence's attention
layers keep their keys and values in a slot of the batch's pools (engine/cache.KVPool), so that a decode
step attends for every sequence in one product (~15 small products per sequence and layer otherwise);
leaving, it takes them back.

With `prefill_chunk`, while some sequences are generating, a step computes at most that many prompt ids
of the others (the first to join first; the decode steps' rows are not counted): a long prompt goes
through in pieces over several steps, and the sequences already generating get a token between them, as
a server wants (vLLM's chunked prefill). With none generating, prompts go whole; so does every prompt of
a model with longrope, whose keys depend on where a forward ends (cache.reusable).

`batch_runs` runs a list of prompts through one Batch, text and all (a Run per prompt: the detokenizer
and stop strings); `generate_batch` is its text.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence as Ids

from ..engine.cache import pool, unpool
from ..engine.mixers import make_pools
from ..errors import MinigenError, OptionError, is_int, short
from .sequence import Sequence, Step, quietly
from .steps import Run


class Batch:
    """Sequences generated together; see the module's docstring. Not thread-safe: one caller steps it."""

    def __init__(self, model, prefill_chunk: int | None = None):
        if prefill_chunk is not None and not (is_int(prefill_chunk) and prefill_chunk >= 1):
            raise OptionError("prefill_chunk", f"should be an integer >= 1 or None, got {short(prefill_chunk, 40)}")
        self.model = model
        longrope = any(r is not None and r.kind == "longrope" for r in set(model.config.rope))
        self.chunk = None if longrope or prefill_chunk is None else int(prefill_chunk)
        self.sequences: dict[int, Sequence] = {}
        self._next = 0
        self.pools = make_pools(model.config)   # the attention layers' K/V of every sequence (cache.KVPool)

    def __len__(self) -> int:
        return len(self.sequences)

    def add(self, seq: Sequence) -> int:
        """A new sequence; it joins at the next step. Returns its handle."""
        if seq.model is not self.model:
            raise ValueError("the sequence is another model's")
        if seq.options.record_attention:
            raise ValueError("a batch records no attention weights")
        if seq.options.max_tokens == 0:   # a step gives every sequence a token: it would never finish on "length"
            raise ValueError("max_tokens is 0: nothing to generate, so nothing to add to a batch")
        pool(seq.cache, self.pools)   # a decode step then attends for all sequences at once
        handle, self._next = self._next, self._next + 1
        self.sequences[handle] = seq
        return handle

    def cancel(self, handle: int) -> None:
        """The sequence leaves the batch (a client gone, a stop string); unknown or finished: nothing.
        Its cache keeps what it holds, in arrays of its own."""
        seq = self.sequences.pop(handle, None)
        if seq is not None:
            unpool(seq.cache)

    def step(self) -> dict[int, Step | Exception]:
        """One token for every sequence in the batch, by handle: its Step (one with a finish is its last), or
        the MinigenError that ended it (its logits not finite); either way a finished sequence has left."""
        if not self.sequences:
            return {}
        start = time.perf_counter()
        handles = list(self.sequences)
        feeds = dict(zip(handles, self._cut([self.sequences[h] for h in handles])))
        handles = [h for h in handles if feeds[h]]              # a prompt left waiting for the next step
        seqs = [self.sequences[h] for h in handles]
        logits = quietly(self.model.forward_batch, [feeds[h] for h in handles], [s.cache for s in seqs], last_only=True)
        out: dict[int, Step | Exception] = {}
        for h, s, row in zip(handles, seqs, logits):            # row: (1, V)
            if s.took(len(feeds[h])):   # a piece of its prompt: no token yet
                continue
            try:
                out[h] = s.step(row[0])
            except MinigenError as e:   # this sequence's own failure: the others go on
                out[h] = e
        seconds = time.perf_counter() - start
        for h, result in out.items():
            if isinstance(result, Step):
                result.seconds = seconds
            if not isinstance(result, Step) or result.finish:
                self.cancel(h)
        return out

    def _cut(self, seqs: list[Sequence]) -> list[list[int]]:
        """Each sequence's ids for this step: its pending ones, and while some sequence is generating, the
        prompts' cut to `chunk` ids in all, given in the order the sequences joined (one cut to nothing
        waits). With none generating, there is no token to give between pieces: the prompts go whole."""
        feeds = [s.feed() for s in seqs]
        if self.chunk is None or not any(s.generated for s in seqs):
            return feeds
        left = self.chunk
        for i, s in enumerate(seqs):
            if not s.generated:   # a prompt
                feeds[i], left = feeds[i][:left], max(0, left - len(feeds[i]))
        return feeds


# --- a list of prompts, text and all -------------------------------------------------------------------

@dataclass
class Result:
    index: int
    text: str
    tokens: list[int]
    finish_reason: str | None
    run: Run = field(repr=False)


def batch_runs(model, tokenizer, prompts: Ids, options: Ids[dict] | dict = (), chat: bool = False,
               system: str | None = None, on_step: Callable[[int, Step], None] | None = None,
               on_done: Callable[[Result], None] | None = None, max_batch: int | None = None) -> list[Result]:
    """Generate for every prompt (text or ids), each with its own options (one dict for all, or one per
    prompt), at most max_batch at a time (None: all), in one Batch. Results in input order; `on_done`
    sees each as it finishes, `on_step` each Step with its prompt's index."""
    if isinstance(options, dict):
        options = [options] * len(prompts)
    if len(options) != len(prompts):
        raise OptionError("options", f"{len(options)} option sets for {len(prompts)} prompts")
    runs = []
    for i, (p, o) in enumerate(zip(prompts, options)):
        try:
            runs.append(_run(model, tokenizer, p, o, chat, system))
        except OptionError:
            raise
        except MinigenError as e:   # the prompt itself (too long, an id outside the vocabulary): which one
            raise PromptError(i, str(e)) from None
    texts, results = [""] * len(runs), [None] * len(runs)
    batch, handles, waiting = Batch(model), {}, []
    for i, r in enumerate(runs):
        if r.options.max_tokens:
            waiting.append(i)
        else:   # max_tokens 0: done before it starts, as alone (a batch step would give it a token)
            results[i] = Result(i, "", [], "length", r)
            if on_done:
                on_done(results[i])
    while waiting or handles:
        while waiting and (max_batch is None or len(handles) < max_batch):
            i = waiting.pop(0)
            handles[batch.add(runs[i].sequence)] = i
        for h, step in batch.step().items():
            i = handles[h]
            r = runs[i]
            if isinstance(step, Exception):
                raise PromptError(i, str(step))
            texts[i] += r.take(step)
            if on_step:
                on_step(i, step)
            if r.stopped or step.finish:
                texts[i] += r.flush()
                batch.cancel(h)
                del handles[h]
                results[i] = Result(i, texts[i], r.tokens, r.stats.finish, r)
                if on_done:
                    on_done(results[i])
    return results


class PromptError(MinigenError):
    """A batch's prompt that cannot run: its index (from 0) and why."""

    def __init__(self, index: int, message: str):
        super().__init__(f"prompt {index + 1}: {message}")
        self.index, self.message = index, message


def _run(model, tokenizer, prompt, options: dict, chat: bool, system: str | None = None) -> Run:
    if not isinstance(options, dict):
        raise OptionError("options", f"should be an object of options, got {short(options, 40)}")
    check_batchable(options)
    return Run.from_prompt(model, tokenizer, prompt, chat=chat, system=system, **options)


NOT_IN_A_BATCH = ("prompt_lookup", "draft_model", "record_attention")   # options a batched prompt cannot set


def check_batchable(options: dict) -> None:
    """OptionError naming the first option set that a batch cannot run (NOT_IN_A_BATCH)."""
    name = next((n for n in NOT_IN_A_BATCH if options.get(n) not in (None, False)), None)
    if name:
        raise OptionError(name, "not available in a batch (speculative decoding and attention dumps run one "
                                "prompt at a time: minigen generate)")


def generate_batch(model, tokenizer, prompts: Ids, *, chat: bool = False, system: str | None = None,
                   **options) -> list[str]:
    """The generated text for each prompt, in order: minigen.generate on each (the same keywords), computed
    as one batch."""
    return [r.text for r in batch_runs(model, tokenizer, prompts, options, chat, system)]

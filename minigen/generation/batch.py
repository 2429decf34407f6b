"""Batched generation: several sequences decoded together, each forward over all of their new rows.

`Batch` is the step a server runs: `add` a sequence (its prompt and its options.Options) between
steps, `step()` feeds every sequence's pending ids (a new one's prompt, the others' last token) through
one batched forward and samples each sequence's next token with its own sampler, processors and rng;
a sequence leaves when it finishes (EOS, max_tokens, a full context) or is cancelled. Each sequence
has its own cache (and offset), so prompts of any length share a step, and each result is the one
generate_step gives that prompt alone: the same stop rules, and each sequence's draws from its own rng.
While in the batch, a sequence's attention layers keep their keys and values in a slot of the
batch's pools (engine/cache.KVPool), so that a decode step attends for every sequence in one product
(~15 small products per sequence and layer otherwise); leaving, it takes them back.

`generate_batch` runs a list of prompts through one Batch, text and all (a Run per prompt: the
detokenizer and stop strings).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..engine.cache import make_pools, must_recompute, pool, truncate, unpool
from ..errors import MinigenError, OptionError, short
from ..files import MiB, decode_utf8, read_bounded
from .options import REQUEST_FIELDS, Options, check_prompt
from .sampling import Processor, Sampler
from .steps import FIRST_ROOM, Run, Step, eos_token_ids, sampling_pipeline


@dataclass
class Member:
    """One sequence of a Batch: generate_step's state, kept between steps."""
    tokens: list[int]
    pending: list[int]            # ids to feed at the next step: the prompt (or its uncached rest), then one
    cache: list
    sampler: Sampler
    processors: Sequence[Processor]
    rng: np.random.Generator | None
    max_tokens: int
    eos: frozenset
    max_context: int
    n: int = 0                    # tokens generated so far


class Batch:
    """Sequences generated together; see the module's docstring. Not thread-safe: one caller steps it."""

    def __init__(self, model):
        self.model = model
        self.sequences: dict[int, Member] = {}
        self._next = 0
        self.pools = make_pools(model.config)   # the attention layers' K/V of every sequence (cache.KVPool)

    def __len__(self) -> int:
        return len(self.sequences)

    def add(self, prompt_ids: Sequence[int], options: Options = Options(), cache: list | None = None) -> int:
        """A new sequence, with generate_step's arguments; it joins at the next step. Returns its handle.
        The prompt is checked here (options.check_prompt): a server hands its ids to `add` directly."""
        o = options.for_model(self.model)
        if o.record_attention:
            raise ValueError("a batch records no attention weights")
        if o.max_tokens == 0:   # a step gives every sequence a token: it would never finish on "length"
            raise ValueError("max_tokens is 0: nothing to generate, so nothing to add to a batch")
        tokens = [int(t) for t in prompt_ids]
        check_prompt(tokens, self.model, o.max_context)
        if cache is None:
            cache = self.model.make_cache(min(o.max_context, len(tokens) + min(o.max_tokens, FIRST_ROOM)))
        if not tokens[cache[0].offset:]:
            raise ValueError("the cache holds the whole prompt: leave at least its last id to compute")
        sampler, processors, rng = sampling_pipeline(o)
        eos = frozenset(() if o.ignore_eos else eos_token_ids(self.model))
        pool(cache, self.pools)   # a decode step then attends for all sequences at once
        handle, self._next = self._next, self._next + 1
        self.sequences[handle] = Member(tokens, tokens[cache[0].offset:], cache, sampler, processors, rng,
                                        o.max_tokens, eos, o.max_context)
        return handle

    def cancel(self, handle: int) -> None:
        """The sequence leaves the batch (a client gone, a stop string); unknown or finished: nothing.
        Its cache (the one passed to `add`, if any) keeps what it holds, in arrays of its own."""
        s = self.sequences.pop(handle, None)
        if s is not None:
            unpool(s.cache)

    def step(self) -> dict[int, Step]:
        """One token for every sequence in the batch, by handle; a Step with a finish is its last."""
        if not self.sequences:
            return {}
        start = time.perf_counter()
        handles = list(self.sequences)
        seqs = [self.sequences[h] for h in handles]
        for s in seqs:
            if must_recompute(self.model.config, s.cache[0].offset, len(s.pending)):  # longrope, as generate_step
                truncate(s.cache, 0)
                s.pending = s.tokens
        logits = forward_batch(self.model, [s.pending for s in seqs], [s.cache for s in seqs])   # (B, V)
        out = {}
        for h, s, row in zip(handles, seqs, logits):
            out[h] = self._next_token(s, row)
        seconds = time.perf_counter() - start
        for h, step in out.items():
            step.seconds = seconds
            if step.finish:
                self.cancel(h)
        return out

    def _next_token(self, s: Member, logits: np.ndarray) -> Step:
        if not np.isfinite(logits).all():
            raise MinigenError(f"step {s.n + 1}: the model's logits are not finite (NaN or infinity); the "
                               f"checkpoint's weights or config.json are likely corrupt")
        scores = logits
        for process in s.processors:
            scores = process(scores, s.tokens)
        token = s.sampler(scores, s.rng)
        s.tokens.append(token)
        s.n += 1
        s.pending = [token]
        finish = ("eos" if token in s.eos else "length" if s.n == s.max_tokens
                  else "context" if s.cache[0].offset >= s.max_context else None)
        return Step(token, finish, 0.0, s.n == 1, logits, None)


def forward_batch(model, ids: list[list[int]], caches: list[list]) -> list[np.ndarray]:
    """Each sequence's logits (V,) after its new ids, through its own cache, in one forward."""
    return [logits[0] for logits in model.forward_batch(ids, caches, last_only=True)]


# --- a list of prompts, text and all -------------------------------------------------------------------

BATCH_FILE_LIMIT = 64 * MiB


@dataclass
class Result:
    index: int
    text: str
    tokens: list[int]
    finish_reason: str | None
    run: Run = field(repr=False)


def batch_runs(model, tokenizer, prompts: Sequence, options: Sequence[dict] | dict = (), chat: bool = False,
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
            handles[batch.add(runs[i].prompt, runs[i].options, runs[i].cache)] = i
        for h, step in batch.step().items():
            i = handles[h]
            r = runs[i]
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


def read_batch_file(path: str | Path) -> tuple[list, list[dict], list[int]]:
    """The prompts of a batch file, each one's options and line number: a line is a prompt, or (starting
    with "{") a JSON object (`json_line`). Blank lines are skipped. MinigenError naming the file and line."""
    text = decode_utf8(read_bounded(path, BATCH_FILE_LIMIT, "batch file"), str(path), "the batch file")
    prompts, options, lines = [], [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            prompt, o = json_line(line) if line.lstrip().startswith("{") else (line, {})
        except MinigenError as e:
            raise MinigenError(f"{path}:{n}: {e}") from None
        prompts.append(prompt)
        options.append(o)
        lines.append(n)
    if not prompts:
        raise MinigenError(f"{path}: no prompts (one a line, or JSON objects with a \"prompt\")")
    return prompts, options, lines


def json_line(line: str) -> tuple:
    """A batch file's JSON line: its "prompt" (text or token ids) and its options, named like generate's
    (max_tokens, temp, ..., stop) or as in an OpenAI request (temperature, repetition_penalty:
    options.REQUEST_FIELDS), checked. MinigenError naming the field at fault."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise MinigenError(f"not a JSON object ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict) or "prompt" not in obj:
        raise MinigenError('a JSON line needs a "prompt" field (text or token ids)')
    prompt = obj.pop("prompt")
    if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                                                         for i in prompt))):
        raise MinigenError(f"prompt: should be a string or a list of token ids, got {short(prompt, 40)}")
    spelled = {name: request for request, name in REQUEST_FIELDS.items() if request != name and request in obj}
    for name, request in spelled.items():
        if name in obj:
            raise MinigenError(f"{request}: give it or {name}, not both")
        obj[name] = obj.pop(request)
    try:
        check_batchable(obj)
        Options.of(**obj)
    except OptionError as e:
        raise MinigenError(f"{spelled.get(e.option, e.option)}: {e.message}") from None
    return prompt, obj


def generate_batch(model, tokenizer, prompts: Sequence, **options) -> list[str]:
    """The generated text for each prompt, in order: minigen.generate on each, computed as one batch."""
    return [r.text for r in batch_runs(model, tokenizer, prompts, options)]

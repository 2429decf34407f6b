"""A job's Steps -> text pieces, as `Run.pieces` makes them: the streaming detokenizer (so the pieces add
up to the tokenizer's decode of the generated ids), stop strings cut and held back across tokens, the
final EOS not text. Read on the HTTP thread serving the request, so the scheduler only steps.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterator

from ..text.stream import TextStream
from ..text.template import fork_inside
from .api import Request, logprob_entry
from .scheduler import Failed, ForkGate, Job

POLL = 0.2   # seconds between checks that the client is still there while no token comes


class ClientGone(Exception):
    """The client closed its connection: the job is cancelled, nothing more is sent."""


class JobFailed(Exception):
    def __init__(self, failed: Failed):
        super().__init__(failed.message)
        self.status = failed.status


class Output:
    """Iterate `pieces()` for (text, log-prob entries of its tokens or None); then `finish`, `tokens`,
    `first_token` (monotonic time) are set."""

    def __init__(self, req: Request, job: Job, tokenizer, gone: Callable[[], bool]):
        self.req, self.job, self.tokenizer, self.gone = req, job, tokenizer, gone
        self.finish: str | None = None
        self.tokens = 0                  # generated, a final EOS included (OpenAI's completion_tokens)
        self.first_token: float | None = None

    def pieces(self) -> Iterator[tuple[str, list | None]]:
        text_out, want = TextStream(self.tokenizer, self.req.options.stop), self.req.logprobs
        entries = [] if want is not None else None
        while self.finish is None:
            step = self._next()
            self.tokens += 1
            self.first_token = self.first_token or time.monotonic()
            if step.finish == "eos":
                self.finish = "eos"
                break
            if entries is not None:
                entries.append(logprob_entry(self.tokenizer, step.logits, step.token, want))
            text = text_out.add(step.token)
            if text:
                yield text, entries
                entries = [] if want is not None else None
            if text_out.stopped:
                self.finish = "stop"
                self.job.cancel()
                return
            self.finish = step.finish
        text = text_out.flush()
        if text_out.stopped:
            self.finish = "stop"
        if text or entries:
            yield text, entries

    def _next(self):
        while True:
            try:
                event = self.job.events.get(timeout=POLL)
            except queue.Empty:
                if self.gone():
                    self.job.cancel()
                    raise ClientGone() from None
                continue
            if isinstance(event, Failed):
                raise JobFailed(event)
            return event


class Locked:
    """The tokenizer, one call at a time. Its guard against Rust panics points the process's fd 2 at a
    temporary file during each call (text/tokenizer.py): two threads at once could leave it there. The
    chat template forks its renderer: the fork (not the render) goes through the scheduler's ForkGate."""

    def __init__(self, tokenizer, gate: ForkGate):
        self.inner, self.lock, self.gate = tokenizer, threading.RLock(), gate

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, *args, **kwargs):
        with self.lock:
            return self.inner.encode(*args, **kwargs)

    def decode(self, *args, **kwargs):
        with self.lock:
            return self.inner.decode(*args, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        with fork_inside(self.gate.forking), self.lock:   # the gate held for the fork alone, not the render
            return self.inner.apply_chat_template(*args, **kwargs)

    def id_to_token(self, token: int) -> str | None:
        return self.inner.hf.id_to_token(token)

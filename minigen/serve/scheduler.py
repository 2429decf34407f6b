"""One thread owns the model and runs the batch step in a loop: continuous batching.

Requests (Jobs) wait in a bounded queue; before every step, waiting jobs join the running batch
while it has fewer than `max_batch` sequences, each starting from the prefix cache's longest match;
a step advances every running sequence by one token, and each Step goes to its job's event queue,
which the HTTP thread serving it reads. A sequence leaves the batch when it finishes (its cache then
goes to the prefix cache), when its client goes away or it hits a stop string (`Job.cancel`), or when
its own step fails: one sequence's exception ends that request only.

The step is reached through a narrow interface, the `BatchStep` protocol: `add(ids, options, cache) ->
handle`, `step() -> {handle: Step | Exception}`, `cancel(handle)`, `release(handle) -> (ids, cache)`.
`Batched` is generation/batch.py's Batch; `OneAtATime` runs each sequence through generate_step, one
token per call in turn (each sequence's failure its own: the tests use it to inject one).
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Protocol, Sequence

from ..errors import MinigenError
from ..generation.batch import Batch
from ..generation.options import Options
from ..generation.steps import FIRST_ROOM, Run
from .prefix import PrefixCache


class QueueFull(Exception):
    """The queue holds max_queue requests already: the client should retry (429)."""


class Stopping(Exception):
    """The server is shutting down and takes no new request (503)."""


class Failed:
    """A job's event: it ended without a last Step (its step raised, or the server is stopping)."""

    def __init__(self, message: str, status: int = 500):
        self.message, self.status = message, status


class Job:
    """One request's generation: the scheduler puts Steps (then, if it ends early, a Failed) on `events`."""

    def __init__(self, ids: Sequence[int], options: Options):
        self.ids, self.options = list(ids), options
        self.events: queue.Queue = queue.Queue()
        self.cancelled = threading.Event()
        self.cached_tokens = 0          # prompt tokens the prefix cache supplied
        self.submitted = time.monotonic()

    def cancel(self):
        """Leave the batch at the next step (the client went away, or a stop string was reached)."""
        self.cancelled.set()


class ForkGate:
    """Forking waits for the running step and holds back the next one. The chat template is rendered in
    a forked child (text/template.py), and OpenBLAS's fork handler shuts its thread pool down: a matmul
    running on the scheduler thread at that moment never returns (seen here: the server hung)."""

    def __init__(self):
        self.gate, self.busy = threading.Lock(), threading.Lock()

    @contextmanager
    def computing(self):
        with self.gate:   # held only for a moment, so a waiting fork gets in between two steps
            self.busy.acquire()
        try:
            yield
        finally:
            self.busy.release()

    @contextmanager
    def forking(self):
        with self.gate, self.busy:
            yield


class BatchStep(Protocol):
    def add(self, ids: list[int], options: Options, cache: list | None) -> int: ...
    def step(self) -> dict: ...
    def cancel(self, handle: int) -> None: ...
    def release(self, handle: int) -> tuple[list[int], list]: ...


def new_cache(model, ids: Sequence[int], options: Options) -> list:
    """A KV cache for `ids` and a first stretch of tokens, as generate_step makes one: kept here, so the
    sequence's cache can go to the prefix cache when it finishes."""
    o = options.for_model(model)
    return model.make_cache(min(o.max_context, len(ids) + min(o.max_tokens, FIRST_ROOM)))


class OneAtATime:
    """The stand-in batch: each sequence is generate_step's generator; a step takes one token of each."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.seqs: dict[int, tuple] = {}         # handle -> (steps, ids fed so far, cache)
        self.handles = itertools.count()

    def add(self, ids: list[int], options: Options, cache: list | None) -> int:
        cache = cache if cache is not None else new_cache(self.model, ids, options)
        run = Run(self.model, self.tokenizer, ids, options, cache=cache)   # checks the prompt
        handle = next(self.handles)
        self.seqs[handle] = (run.steps(), list(ids), cache)
        return handle

    def step(self) -> dict:
        out = {}
        for handle, (steps, fed, _) in list(self.seqs.items()):
            try:
                out[handle] = step = next(steps)
                fed.append(step.token)
            except Exception as e:  # noqa: BLE001 (a sequence's failure is its request's, reported there)
                out[handle] = e
        return out

    def cancel(self, handle: int):
        steps, _, _ = self.seqs.pop(handle)
        steps.close()

    def release(self, handle: int) -> tuple[list[int], list]:
        """A finished sequence's ids and cache (holding all its ids but the last)."""
        _, fed, cache = self.seqs.pop(handle)
        return fed, cache


class Batched:
    """The batch step (generation/batch.py): every running sequence's new rows in one forward over the
    weights. Its sequences' ids and caches are kept here for the prefix cache."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer, self.batch = model, tokenizer, Batch(model)
        self.fed: dict[int, tuple[list[int], list]] = {}

    def add(self, ids: list[int], options: Options, cache: list | None) -> int:
        cache = cache if cache is not None else new_cache(self.model, ids, options)
        handle = self.batch.add(ids, options, cache)   # checks the prompt (options.check_prompt)
        self.fed[handle] = (list(ids), cache)
        return handle

    def step(self) -> dict:
        out = self.batch.step()
        for handle, step in out.items():
            self.fed[handle][0].append(step.token)
        return out

    def cancel(self, handle: int):
        self.batch.cancel(handle)
        self.fed.pop(handle, None)

    def release(self, handle: int) -> tuple[list[int], list]:
        return self.fed.pop(handle)


class Scheduler:
    def __init__(self, batch: BatchStep, max_batch: int, max_queue: int, prefix: PrefixCache | None = None,
                 gate: ForkGate | None = None):
        self.batch, self.max_batch, self.max_queue, self.prefix = batch, max_batch, max_queue, prefix
        self.gate = gate or ForkGate()
        self.waiting: deque[Job] = deque()
        self.running: dict[int, Job] = {}
        self.lock = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="minigen-scheduler", daemon=True)

    def start(self):
        self.thread.start()

    def submit(self, job: Job):
        with self.lock:
            if self.stopping:
                raise Stopping()
            if len(self.waiting) >= self.max_queue:  # those whose client left make room first
                self.waiting = deque(j for j in self.waiting if not j.cancelled.is_set())
            if len(self.waiting) >= self.max_queue:
                raise QueueFull()
            self.waiting.append(job)
            self.lock.notify()

    def load(self) -> dict:
        with self.lock:
            return {"running": len(self.running), "waiting": len(self.waiting)}

    def stop(self, grace: float):
        """Take no new job, fail the waiting ones, let the running ones finish for `grace` seconds, then
        cancel what is left; returns when the loop has ended (or after grace + 2 s)."""
        with self.lock:
            self.stopping, self.deadline = True, time.monotonic() + grace
            while self.waiting:
                self.waiting.popleft().events.put(Failed("the server is shutting down", 503))
            self.lock.notify()
        self.thread.join(grace + 2.0)

    def _loop(self):
        while True:
            with self.lock:
                while not self.running and not self.waiting and not self.stopping:
                    self.lock.wait()
                if self.stopping and (not self.running or time.monotonic() > self.deadline):
                    break
                joining = [self.waiting.popleft() for _ in range(min(len(self.waiting),
                                                                     self.max_batch - len(self.running)))]
            try:
                for job in joining:
                    self._admit(job)
                self._leave_cancelled()
                if self.running:
                    self._step()
            except Exception as e:  # noqa: BLE001 (a bug here ends the running requests, not the server)
                for handle, job in list(self.running.items()):
                    self._end(handle, job, Failed(f"{type(e).__name__}: {e}"))
        for handle, job in list(self.running.items()):
            self._end(handle, job, Failed("the server is shutting down", 503))

    def _admit(self, job: Job):
        if job.cancelled.is_set():
            return
        try:
            cache = None
            if self.prefix is not None:
                cache, job.cached_tokens = self.prefix.lookup(job.ids, len(job.ids) + min(job.options.max_tokens,
                                                                                           FIRST_ROOM))
            with self.gate.computing():
                self.running[self.batch.add(job.ids, job.options, cache)] = job
        except Exception as e:  # noqa: BLE001
            job.events.put(Failed(f"{type(e).__name__}: {e}"))

    def _leave_cancelled(self):
        for handle, job in list(self.running.items()):
            if job.cancelled.is_set():
                self._end(handle, job, None)

    def _step(self):
        try:
            with self.gate.computing():
                results = self.batch.step()
        except Exception as e:  # noqa: BLE001 (the whole step failed: every running request ends, the server goes on)
            for handle, job in list(self.running.items()):
                self._end(handle, job, Failed(f"{type(e).__name__}: {e}"))
            return
        for handle, result in results.items():
            job = self.running[handle]
            if isinstance(result, Exception):
                self._end(handle, job, Failed(str(result) if isinstance(result, MinigenError) else
                                              f"{type(result).__name__}: {result}"))
                continue
            job.events.put(result)
            if result.finish:
                del self.running[handle]
                ids, cache = self.batch.release(handle)
                if self.prefix is not None:
                    self.prefix.store(ids, cache)

    def _end(self, handle: int, job: Job, event: Failed | None):
        del self.running[handle]
        try:
            self.batch.cancel(handle)
        except Exception:  # noqa: BLE001 (leaving must not fail the loop)
            pass
        if event is not None:
            job.events.put(event)

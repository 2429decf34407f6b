"""One thread owns the model and runs the batch step in a loop: continuous batching.

Requests (Jobs) wait in a bounded queue; before every step, waiting jobs join the running batch
while it has fewer than `max_batch` sequences, each a Sequence (generation/sequence.py) starting from
the prefix cache's longest match; a step (generation/batch.Batch) advances every running sequence by one
token, and each Step goes to its job's event queue, which the HTTP thread serving it reads. A sequence
leaves the batch when it finishes (its cache then goes to the prefix cache), when its client goes away or
it hits a stop string (`Job.cancel`), or when its own step fails (the batch gives that sequence's
exception in place of its Step): one sequence's failure ends that request only.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Sequence as Ids

from ..errors import MinigenError
from ..generation.batch import Batch
from ..generation.options import Options
from ..generation.sequence import FIRST_ROOM, Sequence
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

    def __init__(self, ids: Ids[int], options: Options):
        self.ids, self.options = list(ids), options
        self.events: queue.Queue = queue.Queue()
        self.cancelled = threading.Event()
        self.cached_tokens = 0          # prompt tokens the prefix cache supplied
        self.sequence: Sequence | None = None   # its generation, once it joins the batch
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


class Scheduler:
    def __init__(self, batch: Batch, max_batch: int, max_queue: int, prefix: PrefixCache | None = None,
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
                job.sequence = Sequence(self.batch.model, job.ids, job.options, cache)   # checks the prompt
                self.running[self.batch.add(job.sequence)] = job
        except Exception as e:  # noqa: BLE001
            job.events.put(Failed(str(e) if isinstance(e, MinigenError) else f"{type(e).__name__}: {e}"))

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
            if isinstance(result, Exception):   # this sequence's own failure: the batch has let it go
                self._end(handle, job, Failed(str(result) if isinstance(result, MinigenError) else
                                              f"{type(result).__name__}: {result}"))
                continue
            job.events.put(result)
            if result.finish:   # the batch has let it go: its cache holds every id but the last
                del self.running[handle]
                if self.prefix is not None:
                    self.prefix.store(job.sequence.tokens, job.sequence.cache)

    def _end(self, handle: int, job: Job, event: Failed | None):
        del self.running[handle]
        try:
            self.batch.cancel(handle)
        except Exception:  # noqa: BLE001 (leaving must not fail the loop)
            pass
        if event is not None:
            job.events.put(event)

"""Rendering a checkpoint's chat template: transformers' jinja2 sandbox, bounded in time, memory and size.

A chat template is code that comes with a checkpoint. It is rendered as transformers renders it (an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loop controls and the `{% generation %}`
block, the `raise_exception` and `strftime_now` globals and its own `tojson`), which keeps it from
reaching Python's internals. The sandbox does not bound cost: `{{ 'a' * 10**9 }}`,
`{{ 10 ** (10 ** 10) }}`, `'a'.center(10**9)` or two nested loops of 99,999 each run in one C call or
for hours. So the template is rendered in another process with a memory limit (RLIMIT_AS), killed after
TIME_LIMIT seconds, and its text is read back through a pipe: at most OUTPUT_BASE characters more than
twice the messages (a template wraps the messages, it does not multiply them; and 16 MiB of text takes
the tokenizer some ten seconds). Whatever goes wrong (a syntax error, 1/0, an include, recursion, a
limit) is one MinigenError line.

That process is a fresh interpreter kept for every render (`Worker`; its side is sandbox.py, which imports
jinja2 alone): it compiles each template once and renders in ~0.1 ms, where a child forked per render took
13.7 ms with SmolLM2 loaded and 24 ms with a 1.5B model (the fork alone 6.9 and 11.2 ms), on the cores a
server's steps use. It starts at the first render, or earlier where one is sure to come (`start_renderer`:
`minigen chat`, `generate --chat`, `serve`), taking ~0.1 s beside the model's loading. It gets each
render's variables pickled, with the time `strftime_now` reads. A render past the time limit, or one
that takes the process down, ends it, and the next render starts another; a MemoryError it survives.
Variables that cannot be pickled (a function) go to a child forked for that render. Without fork (not
POSIX) a template renders in-process, sandboxed and bounded in size but not in time.
"""
from __future__ import annotations

import atexit
import json
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
import warnings
from contextlib import contextmanager, nullcontext
from datetime import datetime
from pathlib import Path

from ..errors import MinigenError
from . import sandbox
from .sandbox import MEMORY_LIMIT, OUTPUT_BASE, TIME_LIMIT, MiB, describe  # noqa: F401 (TIME_LIMIT: tests set it)

now = datetime.now   # the clock a template's strftime_now reads (Granite's "Today's Date"); tests pin it


_fork = threading.local()   # .guard: what this thread's renders make their fork inside (fork_inside)


@contextmanager
def fork_inside(guard):
    """Renders on this thread, within this context, fork their child inside `guard()`, a context manager, and
    only the fork: the server's (serve/scheduler.ForkGate.forking) waits for the model's running step and holds
    back the next one while OpenBLAS's fork handler stops its threads, and need not hold it while the child
    renders."""
    previous = getattr(_fork, "guard", None)
    _fork.guard = guard
    try:
        yield
    finally:
        _fork.guard = previous


def render_chat_template(template: str, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
    """The template rendered with `messages`, as transformers' apply_chat_template(tokenize=False) does."""
    variables = {"tools": None, "documents": None, **kwargs, "messages": messages,
                 "add_generation_prompt": add_generation_prompt}
    limit = OUTPUT_BASE + 2 * len(json.dumps([messages, kwargs.get("tools")], default=str))   # tools are text too
    when = now()
    if not hasattr(os, "fork"):
        try:
            return "".join(sandbox.render(template, variables, limit, when))
        except Exception as e:
            raise MinigenError(f"chat template: {describe(e)}")
    try:
        request = pickle.dumps((template, variables, limit, when))
    except Exception:  # noqa: BLE001 (a function among the variables: it cannot be sent)
        return _render_isolated(template, variables, limit, when)
    text = WORKER.render(request, limit)
    return text if text is not None else _render_isolated(template, variables, limit, when)


def start_renderer() -> None:
    """Start the render process now, in the background, where a render is sure to come: its start (~0.1 s,
    mostly importing jinja2) then runs beside the model's loading rather than before the first token."""
    if hasattr(os, "fork"):
        WORKER.start()


def _render_isolated(template: str, variables: dict, limit: int, when: datetime) -> str:
    """The render in a child forked for it, for variables that cannot be sent to the kept process."""
    # jinja2 imported here, once, not in each child: a child's import was half its time (SmolLM2 loaded, a
    # render took 33-43 ms so, 17-21 ms with jinja2 already in the forked process; a fork alone ~6.5 ms)
    import jinja2.ext  # noqa: F401
    import jinja2.sandbox  # noqa: F401
    read, write = os.pipe()
    with warnings.catch_warnings(), (getattr(_fork, "guard", None) or nullcontext)():
        warnings.simplefilter("ignore", DeprecationWarning)   # Python 3.12 warns about fork in a threaded process:
        pid = os.fork()                                       # the child only renders
        if pid == 0:  # the child: render, send b"T" + length + text or b"E" + one line, and leave without cleanup
            try:      # (nothing after os._exit runs in it: not the guard's exit, which is the parent's)
                os.close(read)
                _child(template, variables, limit, when, write)
            finally:
                os._exit(0)
    os.close(write)
    try:
        data = _read(read, time.monotonic() + TIME_LIMIT, 4 * limit + 9)  # UTF-8: at most 4 bytes a character
    finally:
        os.close(read)
        status = _reap(pid)
    return _text(data, status)


def _child(template: str, variables: dict, limit: int, when: datetime, fd: int):
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    sandbox.limit_resources(MEMORY_LIMIT)
    view = memoryview(sandbox.answer(template, variables, limit, when))
    while view:
        view = view[os.write(fd, view):]


def _text(data: bytes, status: int | None) -> str:
    """The text of an answer (sandbox.answer), or its MinigenError; `status`, the renderer's exit code (negative:
    a signal) when it died before answering whole."""
    if data[:1] == b"T" and int.from_bytes(data[1:9], "little") == len(data) - 9:  # whole, not cut short
        return data[9:].decode("utf-8", "surrogatepass")
    if data[:1] == b"E":
        raise MinigenError(f"chat template: {data[1:].decode('utf-8', 'replace')}")
    died = f"killed by signal {-status}" if status and status < 0 else "out of memory"
    raise MinigenError(f"chat template: rendering failed ({died}; the limit is {MEMORY_LIMIT // MiB} MiB)")


class Worker:
    """The render process, started at the first render (inside this thread's fork guard, as a fork per
    render was) and kept: a request (pickled) and its answer go through its pipes, each after its length
    in 8 bytes. A render past TIME_LIMIT, or one that takes the process down, ends it; the next render
    starts another. Renders take turns."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.answered = False
        self.inherited: list = []   # a forked child's copies of its parent's process (kept, never waited for)
        atexit.register(self.stop)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget)

    def _forget(self):
        """In a forked child: the parent's process is not its own. Its copies of the pipes are closed, so that
        the process still sees its stdin close when the parent goes; the child starts its own when it renders."""
        proc, self.proc, self.lock = self.proc, None, threading.Lock()
        if proc is not None:
            self.inherited.append(proc)
            for pipe in (proc.stdin, proc.stdout):   # the child's copies: the parent's stay open
                try:
                    pipe.close()
                except OSError:
                    pass

    def render(self, request: bytes, limit: int) -> str | None:
        """The text the request renders to (or its MinigenError); None if no process could be started, or it
        could not read the request (an object of the caller's whose class it cannot import)."""
        with self.lock:
            proc = self._running()
            if proc is None:
                return None
            try:
                proc.stdin.write(len(request).to_bytes(8, "little") + request)
                proc.stdin.flush()
                data = _read_answer(proc.stdout.fileno(), time.monotonic() + TIME_LIMIT, 4 * limit + 18)
            except BrokenPipeError:   # it died before reading the request
                data = b""
            except BaseException:     # too slow, too long, or the caller interrupted: it cannot be trusted to be idle
                self.stop(kill=True)
                raise
            if data:
                self.answered = True
                return None if data == sandbox.UNREADABLE else _text(data, None)
            first, status = not self.answered, self.stop()
            if first and (status is None or status >= 0):
                return None   # it could not start here (an interpreter's own settings): a forked child renders
            return _text(data, status)

    def start(self) -> None:
        with self.lock:
            self._running()

    def _running(self) -> subprocess.Popen | None:
        """The process, started if none runs (None if it cannot be: no interpreter to run)."""
        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        self.stop()
        self.answered = False   # whether this process has answered a render yet
        root = Path(__file__).resolve().parents[2]   # where the minigen package is: the process imports it from there
        path = os.pathsep.join([str(root)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
        try:
            with (getattr(_fork, "guard", None) or nullcontext)():   # OpenBLAS's fork handler, as in _render_isolated
                self.proc = subprocess.Popen([sys.executable, "-c", "from minigen.text.sandbox import work; work()"],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                             cwd=root, env={**os.environ, "PYTHONPATH": path})
        except OSError:
            return None
        return self.proc

    def stop(self, kill: bool = False) -> int | None:
        """End the process (its pipe closed; killed at once with `kill`, else if it has not left within 0.5 s):
        its exit code, or None if none ran."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if kill:
            proc.kill()
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        try:
            return proc.wait(0.5)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


WORKER = Worker()


def _read_answer(fd: int, deadline: float, most: int) -> bytes:
    """The worker's answer: its length (8 bytes), then that many; b"" if the pipe closes first."""
    head = _read(fd, deadline, 8, exactly=8)
    if len(head) < 8:
        return b""
    n = int.from_bytes(head, "little")
    if n > most:
        raise MinigenError("chat template: the rendered text is longer than allowed")
    data = _read(fd, deadline, n, exactly=n)
    return data if len(data) == n else b""


def _read(fd: int, deadline: float, most: int, exactly: int | None = None) -> bytes:
    """What the pipe holds until it closes (or until `exactly` bytes), waiting until the deadline; more than
    `most` bytes or a deadline passed is a MinigenError."""
    chunks, size = [], 0
    while exactly is None or size < exactly:
        left = deadline - time.monotonic()
        if left <= 0:
            raise MinigenError(f"chat template: rendering took longer than {TIME_LIMIT:g} s")
        if not select.select([fd], [], [], left)[0]:
            continue
        chunk = os.read(fd, 1 << 16 if exactly is None else min(exactly - size, 1 << 20))
        if not chunk:
            break
        size += len(chunk)
        if size > most:
            raise MinigenError("chat template: the rendered text is longer than allowed")
        chunks.append(chunk)
    return b"".join(chunks)


def _reap(pid: int) -> int:
    """Wait for the child, killing it first if it still runs; its exit code (negative: a signal)."""
    done, status = os.waitpid(pid, os.WNOHANG)
    if not done:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)

"""Rendering a checkpoint's chat template: transformers' jinja2 sandbox, bounded in time, memory and size.

A chat template is code that comes with a checkpoint. It is rendered as transformers renders it (an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loop controls and the `{% generation %}`
block, the `raise_exception` and `strftime_now` globals and its own `tojson`), which keeps it from
reaching Python's internals. The sandbox does not bound cost: `{{ 'a' * 10**9 }}`,
`{{ 10 ** (10 ** 10) }}`, `'a'.center(10**9)` or two nested loops of 99,999 each run in one C call or
for hours. So the template is rendered in a forked child process with a memory limit (RLIMIT_AS),
killed after TIME_LIMIT seconds, and its text is read back through a pipe: at most OUTPUT_BASE characters more than twice the messages (a template wraps
the messages, it does not multiply them; and 16 MiB of text takes the tokenizer some ten seconds).
Whatever goes wrong (a syntax error, 1/0, an include, recursion, a limit) is one MinigenError line.
Without fork (not POSIX) it renders in-process, sandboxed and bounded in size but not in time.
"""
from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
import warnings
from contextlib import contextmanager, nullcontext
from datetime import datetime

from ..errors import MinigenError
from ..files import MiB

now = datetime.now   # the clock a template's strftime_now reads (Granite's "Today's Date"); tests pin it

TIME_LIMIT = 5.0             # seconds to render (real templates take milliseconds)
MEMORY_LIMIT = 512 * MiB     # address space the renderer may add to what the process has
OUTPUT_BASE = MiB            # characters of rendered text beyond twice the messages' own


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
    if not hasattr(os, "fork"):
        try:
            return "".join(_render(template, variables, limit))
        except Exception as e:
            raise MinigenError(f"chat template: {describe(e)}")
    return _render_isolated(template, variables, limit)


def _render(template: str, variables: dict, limit: int):
    """Yield the rendered text in pieces, stopping past `limit` characters."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols", _generation_tag()])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: now().strftime(fmt)
    size = 0
    for piece in env.from_string(template).generate(**variables):
        size += len(piece)
        if size > limit:
            raise MinigenError(f"the rendered text is longer than {limit:,} characters (the messages "
                               f"and {OUTPUT_BASE // MiB} MiB)")
        yield piece


def _generation_tag():
    """transformers' `{% generation %}...{% endgeneration %}` (its AssistantTracker extension, which marks
    the assistant's tokens for training masks): rendering only, the block's body as it is. Templates of
    some instruct models use it."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    return Generation


def _render_isolated(template: str, variables: dict, limit: int) -> str:
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
                _child(template, variables, limit, write)
            finally:
                os._exit(0)
    os.close(write)
    try:
        data = _read_until(read, time.monotonic() + TIME_LIMIT, 4 * limit + 9)  # UTF-8: at most 4 bytes a character
    finally:
        os.close(read)
        status = _reap(pid)
    if data[:1] == b"T" and int.from_bytes(data[1:9], "little") == len(data) - 9:  # whole, not cut short
        return data[9:].decode("utf-8", "surrogatepass")
    if data[:1] == b"E":
        raise MinigenError(f"chat template: {data[1:].decode('utf-8', 'replace')}")
    died = f"killed by signal {-status}" if status and status < 0 else "out of memory"
    raise MinigenError(f"chat template: rendering failed ({died}; the limit is {MEMORY_LIMIT // MiB} MiB)")


def _child(template: str, variables: dict, limit: int, fd: int):
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    _limit_resources(MEMORY_LIMIT)
    try:
        text = "".join(_render(template, variables, limit)).encode("utf-8", "surrogatepass")
        payload = b"T" + len(text).to_bytes(8, "little") + text
    except BaseException as e:  # noqa: BLE001 (everything the template can raise becomes the message)
        payload = b"E" + describe(e).encode("utf-8", "replace")
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view):]


def _limit_resources(extra: int):
    """In the child: at most `extra` more bytes of address space, and a CPU-time limit of its own, so
    that it dies even if the parent is killed before it can kill the child."""
    try:
        import resource
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        seconds = int(TIME_LIMIT) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (seconds if hard == resource.RLIM_INFINITY else min(seconds, hard), hard))
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = current + extra if hard == resource.RLIM_INFINITY else min(current + extra, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (OSError, ValueError, ImportError):
        pass  # no /proc or no resource module: the parent's time limit still holds


def _read_until(fd: int, deadline: float, most: int) -> bytes:
    chunks, size = [], 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise MinigenError(f"chat template: rendering took longer than {TIME_LIMIT:g} s")
        if not select.select([fd], [], [], left)[0]:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > most:
            raise MinigenError("chat template: the rendered text is longer than allowed")
        chunks.append(chunk)


def _reap(pid: int) -> int:
    """Wait for the child, killing it first if it still runs; its exit code (negative: a signal)."""
    done, status = os.waitpid(pid, os.WNOHANG)
    if not done:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def describe(e: BaseException) -> str:
    """One line for anything a template can raise."""
    if isinstance(e, MemoryError):
        return f"needs more memory than allowed ({MEMORY_LIMIT // MiB} MiB)"
    if isinstance(e, RecursionError):
        return "recursion too deep"
    text = str(e).strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line if len(line) <= 200 else line[:197] + "..."

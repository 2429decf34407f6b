"""The renderer's side of a chat template (template.py holds the caller's): transformers' jinja2 sandbox,
a render's answer, its limits, and the loop of the process that renders. It imports jinja2 and the
standard library only, so that process starts in ~50 ms.

May import: jinja2.
"""
from __future__ import annotations

import json
import os
import pickle
import signal
from datetime import datetime
from functools import lru_cache

MiB = 1 << 20                # as files.MiB, which imports errors and so NumPy: this process does without
TIME_LIMIT = 5.0             # seconds to render (real templates take milliseconds)
MEMORY_LIMIT = 512 * MiB     # address space the renderer may add to what the process has
OUTPUT_BASE = MiB            # characters of rendered text beyond twice the messages' own

_when: datetime | None = None   # the time of the render under way: what strftime_now reads


UNREADABLE = b"U"   # the answer to a request this process could not unpickle: the caller renders it otherwise


class TooLong(Exception):
    """The rendered text passed its limit."""


def answer(template: str, variables: dict, limit: int, when: datetime) -> bytes:
    """A render's answer: b"T" + the text's length (8 bytes) + the text, or b"E" + one line."""
    try:
        text = "".join(render(template, variables, limit, when)).encode("utf-8", "surrogatepass")
        return b"T" + len(text).to_bytes(8, "little") + text
    except BaseException as e:  # noqa: BLE001 (everything the template can raise becomes the message)
        return b"E" + describe(e).encode("utf-8", "replace")


def render(template: str, variables: dict, limit: int, when: datetime):
    """Yield the rendered text in pieces, stopping past `limit` characters; strftime_now reads `when`."""
    global _when
    _when, size = when, 0
    for piece in compiled(template).generate(**variables):
        size += len(piece)
        if size > limit:
            raise TooLong(f"the rendered text is longer than {limit:,} characters (the messages "
                          f"and {OUTPUT_BASE // MiB} MiB)")
        yield piece


@lru_cache(maxsize=4)
def compiled(template: str):
    """The template parsed and compiled in transformers' sandbox, once per template in a process. Only ever
    in a process that renders under the limits: jinja2 folds constants as it compiles, so compiling
    `{{ 10 ** (10 ** 10) }}` is itself unbounded."""
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
    env.globals["strftime_now"] = lambda fmt: _when.strftime(fmt)
    return env.from_string(template)


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


def describe(e: BaseException) -> str:
    """One line for anything a template can raise."""
    if isinstance(e, MemoryError):
        return f"needs more memory than allowed ({MEMORY_LIMIT // MiB} MiB)"
    if isinstance(e, RecursionError):
        return "recursion too deep"
    text = str(e).strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line if len(line) <= 200 else line[:197] + "..."


def limit_resources(extra: int, cpu: bool = True):
    """In the renderer: at most `extra` more bytes of address space, and with `cpu` a CPU-time limit of its
    own, so that a child forked for one render dies even if the parent is killed before it can kill it."""
    try:
        import resource
        if cpu:
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


def work():
    """The loop of the render process (template.Worker): requests from stdin, answers to stdout, each after
    its length in 8 bytes, until stdin closes (the parent has gone, or stopped it). A render must end within
    TIME_LIMIT + 1 s of wall time (SIGALRM's default action ends the process), so that it ends even when
    its parent is killed mid-render; CPU time is not limited, since it adds up over a long life's renders."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # a Ctrl-C at the terminal is for the parent
    for sig in (signal.SIGTERM, signal.SIGALRM):
        signal.signal(sig, signal.SIG_DFL)
    import jinja2.ext  # noqa: F401
    import jinja2.sandbox  # noqa: F401
    limit_resources(MEMORY_LIMIT, cpu=False)
    read, write = os.fdopen(0, "rb", closefd=False), os.fdopen(1, "wb", closefd=False)   # the parent's pipes
    while len(head := read.read(8)) == 8:
        request = read.read(int.from_bytes(head, "little"))
        signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT + 1)
        try:
            template, variables, limit, when = pickle.loads(request)
        except Exception:  # noqa: BLE001 (a caller's object whose class this process cannot import)
            reply = UNREADABLE
        else:
            reply = answer(template, variables, limit, when)
        signal.setitimer(signal.ITIMER_REAL, 0)
        if reply == b"E" + describe(MemoryError()).encode():
            compiled.cache_clear()   # the templates it holds may be what the next render needs the memory for
        write.write(len(reply).to_bytes(8, "little") + reply)
        write.flush()

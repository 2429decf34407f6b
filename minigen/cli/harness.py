"""The process around a command: standard streams, signals and exit codes; the prompt reader and --model.

`Group.invoke` runs every command: a bad input is one line `minigen: error: ...` (exit 1), a bad option
value a usage error naming its flag (exit 2); Ctrl-C exits 130 and SIGTERM/SIGHUP 128 + the signal,
both by an exception, so every output file's temporary sibling is removed on the way out (files.py); a
closed, full or broken stdout is one line (or, for a closed pipe, silence), never a traceback. Slow work
below (a conversion, a download) is reported through `note` and `progress_bar`, given here. Ctrl-C
before a command runs (while Python imports minigen, or click parses the flags) also exits 130: see
cli/__init__.py and `Group.make_context`.
"""
from __future__ import annotations

import errno
import os
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

import click

from ..errors import MinigenError, OptionError
from ..files import MiB, decode_utf8, read_bounded

PROMPT_LIMIT = 16 * MiB  # bytes of prompt read from a file or stdin (/dev/zero never ends)
MODEL_HELP = "A checkpoint directory, a .gguf file or a hub id (org/name); default: the default model."


class Command(click.Command):
    """A subcommand whose OptionError (a bad value for one run option) becomes click's usage error
    naming the flag, exit 2: the values are checked in one place, generation/options.py."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OptionError as e:
            param = next((p for p in self.params if p.name == e.option), None)
            hint = None if param else "PROMPT" if e.option == "prompt" else "--" + e.option.replace("_", "-")
            raise click.BadParameter(e.message, ctx=ctx, param=param, param_hint=hint) from None


class Group(click.Group):
    """Runs a subcommand so that nothing ends in a traceback (see the module's docstring)."""
    command_class = Command

    def make_context(self, *args, **kwargs):
        try:  # click would call a Ctrl-C here "Aborted!", exit 1
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:
            interrupted()

    def invoke(self, ctx):
        _fill_closed_stdio()
        if sys.stdout is None or not _is_open(1, writable=True):
            fail("standard output is closed; redirect it to a file instead (> out.txt)")
        try:
            with _signals_exit():
                try:
                    return super().invoke(ctx)
                finally:
                    if sys.stdout is not None:
                        sys.stdout.flush()  # a full disk shows here, not as a traceback at exit
        except MinigenError as e:
            fail(str(e))
        except KeyboardInterrupt:
            interrupted()
        except UnicodeDecodeError as e:  # text read from stdin in a strict UTF-8 locale
            fail(f"the input is not valid UTF-8 (bad byte at offset {e.start})")
        except MemoryError:
            fail("out of memory (the model, or the context asked for, needs more than this machine has)")
        except OSError as e:
            _discard_stdout()
            if e.errno == errno.EPIPE:  # the reader went away (| head): stop quietly, as SIGPIPE would
                sys.exit(128 + signal.SIGPIPE)
            fail(_os_error(e))


def interrupted():
    click.echo("minigen: interrupted", err=True)
    sys.exit(130)


WRITE_ERRORS = (errno.EBADF, errno.ENOSPC, errno.EFBIG, errno.EIO, getattr(errno, "EDQUOT", errno.ENOSPC))


def _os_error(e: OSError) -> str:
    """One line for an OSError that no reader turned into a MinigenError: mostly stdout failing."""
    if e.filename:
        return f"{e.filename}: {e.strerror or e}"
    if e.errno in WRITE_ERRORS:
        return f"standard output: {e.strerror}"
    return str(e.strerror or e)


def fail(message: str):
    click.echo(f"minigen: error: {message}", err=True)
    sys.exit(1)


def _fill_closed_stdio():
    """A closed stdin or stderr (`<&-`, `2>&-`) is given /dev/null: a free fd 0 or 2 would be handed to
    the next file opened, and error text meant for stderr could land in an output file."""
    for fd, mode in ((0, os.O_RDONLY), (2, os.O_WRONLY)):
        if not _is_open(fd, writable=fd == 2):
            null = os.open(os.devnull, mode)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            if fd == 2:
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 (lives as long as the process)


def _is_open(fd: int, writable: bool = False) -> bool:
    """Whether fd is open (for writing, if asked: a launcher script may leave a read-only file there)."""
    try:
        import fcntl
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except ImportError:  # not POSIX
        return True
    except OSError:
        return False
    return not writable or flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR)


def _discard_stdout():
    """After stdout failed, send what is still buffered nowhere, so that the interpreter's final flush
    does not fail again and print a traceback (Python's documented recipe for SIGPIPE)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, AttributeError, ValueError):
        pass


@contextmanager
def _signals_exit():
    """SIGTERM and SIGHUP raise SystemExit(128 + signal) while a command runs, so `with` blocks clean up
    (temporary files are removed) as for Ctrl-C; a second signal is ignored so cleanup can finish."""
    def leave(signum, frame):
        for sig in caught:
            signal.signal(sig, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    caught = [s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    try:
        previous = {sig: signal.signal(sig, leave) for sig in caught}
    except ValueError:  # not the main thread: leave signals alone
        previous = {}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def stdin_is_terminal() -> bool:
    return sys.stdin.isatty()


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


def stdout_is_stderr() -> bool:
    """stdout and stderr are one file or pipe (`2>&1`): figures on stderr would run on from the text."""
    try:
        out, err = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):  # not real files (a test runner's buffers)
        return False
    return (out.st_dev, out.st_ino) == (err.st_dev, err.st_ino)


# --- the inputs every command shares: the prompt, --model ----------------------------------------------

def read_prompt(prompt: str | None, prompt_opt: str | None = None, file: str | None = None) -> str:
    """The prompt as text: an argument, stdin (-) or a file (which may be a pipe, as `-f <(cmd)`), read up
    to PROMPT_LIMIT bytes and required to be UTF-8; anything else is a usage error naming its source."""
    given = [p for p in (prompt, prompt_opt, file) if p is not None]
    if len(given) != 1:
        raise click.UsageError("give the prompt once: PROMPT, -p/--prompt (- reads stdin) or -f/--file")
    hint = "-f/--file" if file is not None else "-p/--prompt" if prompt_opt is not None else "PROMPT"
    try:
        if file is not None:
            return decode_utf8(read_bounded(file, PROMPT_LIMIT, "prompt file"), file, "the prompt")
        if given[0] == "-":
            return decode_utf8(read_stdin(PROMPT_LIMIT), "stdin", "the prompt")
        return decode_utf8(os.fsencode(given[0]), "the argument", "the prompt")
    except MinigenError as e:
        raise click.BadParameter(str(e), param_hint=hint) from None


def read_stdin(limit: int) -> bytes:
    if sys.stdin is None:
        raise MinigenError("stdin is closed")
    data = sys.stdin.buffer.read(limit + 1)
    if len(data) > limit:
        raise MinigenError(f"the prompt on stdin is longer than minigen reads ({limit:,} bytes)")
    return data


def model_option(f):
    """--model, the same for every command, with the load options beside it: --dtype, --quantize and --activations (kept in
    the click context's meta for load_timed, so that no command's signature carries them)."""
    def keep(name):
        return lambda ctx, param, value: ctx.meta.__setitem__(name, value) if value is not None else None
    f = click.option("--quantize", metavar="TYPE", expose_value=False, callback=keep("minigen.quantize"),
                     help="Quantize the matrices at load, by llama.cpp's rules: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, "
                          "Q4_K, F16 or BF16.")(f)
    f = click.option("--activations", type=click.Choice(["int8", "float32"]), expose_value=False,
                     callback=keep("minigen.activations"),
                     help="int8: products with Q4_0 ... Q8_0, Q2_K, Q4_K ... Q6_K and IQ4 matrices round activations to int8 per "
                          "block of 32 and use integer dot products, as llama.cpp does: faster, not exact "
                          "(default float32: exact).")(f)
    f = click.option("--dtype", type=click.Choice(["float32"]), expose_value=False, callback=keep("minigen.dtype"),
                     help="Every weight as float32 (default: as stored: a GGUF's own types, float16 and "
                          "bfloat16 in 16 bits).")(f)
    return click.option("--model", "model_path", metavar="PATH|ID", help=MODEL_HELP)(f)


@dataclass
class Loaded:
    model: object
    tokenizer: object
    seconds: float      # the load itself: a GGUF's first conversion or a download is not counted
    resolved: object    # resolve.Resolved: what --model named


def load_timed(spec: str | None, renders: bool = False, computes: bool = True) -> Loaded:
    """--model (a directory, a .gguf file or a hub id; None: the default model), loaded; a GGUF's first
    conversion or a download is announced on stderr and not counted as loading, and so, on a terminal, is
    the kernels' first compile when the command `computes`. `renders`: the command will render the chat
    template, whose process then starts beside the loading (text/template.py)."""
    from ..resolve import load_resolved, resolve
    resolved = resolve(spec, note, progress_bar())
    if renders:
        from ..text.template import start_renderer
        start_renderer()
    import numpy as np
    np.seterr(all="ignore")  # non-finite logits are reported per step (steps.py), not as numpy warnings
    start = time.perf_counter()
    options = click.get_current_context(silent=True)
    meta = options.meta if options is not None else {}
    model, tokenizer = load_resolved(resolved, meta.get("minigen.dtype"), meta.get("minigen.quantize"),
                                     meta.get("minigen.activations"))
    seconds = time.perf_counter() - start
    if computes:
        announce_first_compile(model)
    return Loaded(model, tokenizer, seconds, resolved)


def announce_first_compile(model) -> None:
    """On a terminal, one line before a first run's pause: the kernels of a model's types compile once for this
    CPU (~8-12 s on two cores for the default model), then load from numba's cache."""
    from ..engine.quant import kernels_on
    if not (kernels_on() and stderr_is_terminal()):
        return
    from ..checkpoint.stored import int8_types, stored_types
    from ..engine.quant import kernels, matrix
    types = set(stored_types(model.params)) - {"float32"}
    if types and (kernels.cache_is_new() or not matrix.compiled_before(types, int8_types(model.params))):
        import numba
        note(f"compiling the kernels for this CPU, once (some seconds; kept in {numba.config.CACHE_DIR})")


def note(message: str) -> None:
    """What minigen's library says about slow work (a conversion, a download), on stderr."""
    click.echo(f"minigen: {message}", err=True)


def progress_bar():
    """A conversion's progress bar on stderr, when stderr is a terminal (gguf.convert.Progress), else None."""
    if not sys.stderr.isatty():
        return None
    return lambda label, total: click.progressbar(length=total, label=label, file=sys.stderr, show_percent=True,
                                                  show_eta=True)


def figures(stats, load_seconds: float, verbose: bool = False) -> str:
    """The figures a run prints on stderr when it ends (generate, chat, --logprobs): tokens, speeds, load, memory."""
    import resource
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    lines = ["==========",
             f"prompt: {stats.prompt_tokens} tokens, {stats.prefill_tps:.1f} tokens/s",
             f"generation: {stats.generated_tokens} tokens, {stats.decode_tps:.1f} tokens/s",
             f"load: {load_seconds:.2f} s, peak memory: {peak_mb:.0f} MB"]
    if verbose:
        lines.append(f"finish: {stats.finish or 'interrupted'}, prefill {stats.prefill_seconds:.3f} s, "
                     f"decode {stats.decode_seconds:.3f} s")
    if verbose and stats.drafted:
        lines.append(f"speculative: {stats.accepted} of {stats.drafted} drafts accepted ({100 * stats.acceptance:.0f} %), "
                     f"{stats.accepted_per_forward:.2f} per forward, {stats.forwards} forwards")
    return "\n".join(lines)


@contextmanager
def until_signal():
    """SIGINT and SIGTERM caught while the block runs (a server's life): the block calls the yielded wait()
    to sleep until one comes; the handlers that were there before are put back at the end."""
    import threading
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}

    def wait():
        while not stop.wait(0.5):
            pass
    try:
        yield wait
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

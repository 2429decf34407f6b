"""The command line: flags and printing only. Work happens in generate.py, chat.py, convert.py and inspect/.

Process-wide behaviour lives in `Group.invoke`: a bad input is one line `minigen: error: ...` (exit 1),
a bad option value a usage error naming its flag (exit 2); Ctrl-C exits 130 and SIGTERM/SIGHUP 128 +
the signal, both by an exception, so every output file's temporary sibling is removed on the way out
(files.py); a closed, full or broken stdout is one line (or, for a closed pipe, silence), never a
traceback.
"""
from __future__ import annotations

import errno
import math
import os
import re
import signal
import sys
from contextlib import contextmanager

import click

from ..errors import MiB, MinigenError, OptionError, decode_utf8, read_bounded

PROMPT_LIMIT = 16 * MiB  # bytes of prompt read from a file or stdin (/dev/zero never ends)


class Command(click.Command):
    """A subcommand whose OptionError (a bad value for one run option) becomes click's usage error
    naming the flag, exit 2: the values are checked in one place, generate.Options.check."""

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

    def invoke(self, ctx):
        _fill_closed_stdio()
        if sys.stdout is None or not _is_open(1, writable=True):
            _fail("standard output is closed; redirect it to a file instead (> out.txt)")
        try:
            with _signals_exit():
                try:
                    return super().invoke(ctx)
                finally:
                    if sys.stdout is not None:
                        sys.stdout.flush()  # a full disk shows here, not as a traceback at exit
        except MinigenError as e:
            _fail(str(e))
        except KeyboardInterrupt:
            click.echo("minigen: interrupted", err=True)
            sys.exit(130)
        except UnicodeDecodeError as e:  # text read from stdin in a strict UTF-8 locale
            _fail(f"the input is not valid UTF-8 (bad byte at offset {e.start})")
        except MemoryError:
            _fail("out of memory (the model, or the context asked for, needs more than this machine has)")
        except OSError as e:
            _discard_stdout()
            if e.errno == errno.EPIPE:  # the reader went away (| head): stop quietly, as SIGPIPE would
                sys.exit(128 + signal.SIGPIPE)
            _fail(_os_error(e))


WRITE_ERRORS = (errno.EBADF, errno.ENOSPC, errno.EFBIG, errno.EIO, getattr(errno, "EDQUOT", errno.ENOSPC))


def _os_error(e: OSError) -> str:
    """One line for an OSError that no reader turned into a MinigenError: mostly stdout failing."""
    if e.filename:
        return f"{e.filename}: {e.strerror or e}"
    if e.errno in WRITE_ERRORS:
        return f"standard output: {e.strerror}"
    return str(e.strerror or e)


def _fail(message: str):
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


@click.group(cls=Group)
@click.version_option(package_name="minigen")
def main():
    """minigen: run, read and look inside small transformers."""


def _stop_strings(values: tuple, flag: str) -> tuple:
    """--stop TEXT: backslash escapes \\n, \\t, \\r and \\\\ are processed, so --stop "\\n\\n" stops at a blank line."""
    values = tuple(unescape(v) for v in values)
    if any(v == "" for v in values):
        raise click.BadParameter("an empty stop string would stop before the first token", param_hint=flag)
    return values


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def stdin_is_terminal() -> bool:
    return sys.stdin.isatty()


def stdout_is_stderr() -> bool:
    """stdout and stderr are one file or pipe (`2>&1`): figures on stderr would run on from the text."""
    try:
        out, err = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):  # not real files (a test runner's buffers)
        return False
    return (out.st_dev, out.st_ino) == (err.st_dev, err.st_ino)


def unescape(text: str) -> str:
    return re.sub(r"\\([ntr\\])", lambda m: {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[m[1]], text)


# --- generate, info (issue 3) ---------------------------------------------------------------

MODEL_HELP = "A checkpoint directory, a .gguf file or a hub id (org/name); default: the default model."


def load_model(path):
    """--model (a directory, a .gguf file or a hub id; None: the default model) -> (model, tokenizer, load
    seconds); a GGUF's first conversion or a download is announced on stderr and not counted as loading."""
    return resolve_and_load(path)[:3]


def resolve_and_load(path):
    """load_model's (model, tokenizer, load seconds), and the checkpoint.Resolved saying what --model named."""
    import time
    from ..checkpoint.resolve import load, resolve
    resolved = resolve(path)
    import numpy as np
    np.seterr(all="ignore")  # non-finite logits are reported per step (generate.py), not as numpy warnings
    start = time.perf_counter()
    model, tokenizer = load(resolved.path)
    return model, tokenizer, time.perf_counter() - start, resolved


def read_prompt(prompt: str | None, prompt_opt: str | None, file: str | None) -> str:
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


def build_run(model, tokenizer, text: str, chat: bool, system: str | None, **options):
    """The Run a `generate` invocation asks for; other commands' options can add to it (on_step, ...)."""
    from ..generation.steps import run
    return run(model, tokenizer, text, chat=chat, system=system, **options)


def print_run(run, load_seconds: float, quiet: bool, verbose: bool) -> int:
    """Stream the text to stdout, piece by piece; notes and figures to stderr. Returns the exit code."""
    if verbose:
        click.echo(f"model: {run.model.path} ({run.model.config.model_type}), prompt: {len(run.prompt)} tokens, "
                   f"{settings_text(run.settings, run.options.repeat_last_n, run.options.seed, run.max_context)}",
                   err=True)
    code, last = 0, ""
    try:
        for piece in run.pieces():
            click.echo(piece, nl=False)
            last = piece
    except KeyboardInterrupt:
        code = 130
    if last and not last.endswith("\n"):  # the figures start on a line of their own
        if stdout_is_terminal():
            click.echo()
        elif stdout_is_stderr() and not quiet:  # 2>&1 into a file or pipe: the text on stdout stays as it was
            click.echo(err=True)
    if run.stats.finish == "context":
        click.echo(f"minigen: note: the context is full ({run.max_context} tokens); generation stopped", err=True)
    if not quiet:
        click.echo(figures(run.stats, load_seconds, verbose), err=True)
    return code


def settings_text(s: dict, repeat_last_n: int, seed: int | None, max_context: int) -> str:
    return (f"temp {s['temp']}, top-k {s['top_k']}, top-p {s['top_p']}, min-p {s['min_p']}, "
            f"repeat-penalty {s['repeat_penalty']} (last {repeat_last_n}), seed {seed}, context {max_context}")


def figures(stats, load_seconds: float, verbose: bool = False) -> str:
    import resource
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    lines = ["==========",
             f"prompt: {stats.prompt_tokens} tokens, {stats.prefill_tps:.1f} tokens/s",
             f"generation: {stats.generated_tokens} tokens, {stats.decode_tps:.1f} tokens/s",
             f"load: {load_seconds:.2f} s, peak memory: {peak_mb:.0f} MB"]
    if verbose:
        lines.append(f"finish: {stats.finish or 'interrupted'}, prefill {stats.prefill_seconds:.3f} s, "
                     f"decode {stats.decode_seconds:.3f} s")
    return "\n".join(lines)


GENERATION_OPTIONS = [  # generate's flags for a run (sampling, stopping, context, figures), shared with chat
    # Values are checked by generate.Options.check (one layer); click only parses the types.
    click.option("-m", "-n", "--max-tokens", type=int, default=256, show_default=True,
                 help="Tokens to generate at most (>= 0)."),
    click.option("--temp", type=float, help="Temperature, >= 0; 0 is greedy. [default: from "
                 "generation_config.json, else 0]"),
    click.option("--top-k", type=int, help="Keep the k most likely tokens (0: off)."),
    click.option("--top-p", type=float, help="Keep the smallest set reaching p, in (0, 1] (1: off)."),
    click.option("--min-p", type=float, help="Keep tokens at least min-p times the top one, in [0, 1] (0: off)."),
    click.option("--repeat-penalty", type=float,
                 help="Penalise tokens seen recently, as HF's repetition_penalty, > 0 (1: off)."),
    click.option("--repeat-last-n", type=int, default=64, show_default=True,
                 help="Window of the repeat penalty, in tokens (0: the whole sequence)."),
    click.option("--seed", type=int, help="Seed for sampling (>= 0): the same seed gives the same text."),
    click.option("--stop", multiple=True, callback=lambda ctx, param, value: _stop_strings(value, "--stop"),
                 help="Stop when this text appears (not printed); \\n, \\t, \\r, \\\\ are escapes. Repeatable."),
    click.option("--ignore-eos", is_flag=True, help="Keep going past the end-of-sequence token."),
    click.option("--max-context", type=int, help="Context size in tokens (default and maximum: the model's)."),
    click.option("-q", "--quiet", is_flag=True, help="No figures on stderr."),
    click.option("-v", "--verbose", is_flag=True, help="Settings before, more figures after."),
]


def generation_options(command):
    for option in reversed(GENERATION_OPTIONS):
        command = option(command)
    return command


@main.command()
@click.argument("prompt", required=False)
@click.option("--model", "model_path", metavar="PATH|ID", help=MODEL_HELP)
@click.option("-p", "--prompt", "prompt_opt", help="The prompt; - reads it from stdin.")
@click.option("-f", "--file", type=click.Path(exists=True, dir_okay=False), help="Read the prompt from a file.")
@generation_options
@click.option("--chat", is_flag=True, help="Wrap the prompt in the checkpoint's chat template.")
@click.option("--system", help="System message for --chat (implies --chat).")
@click.option("--dump-attention", "dump_path", metavar="OUT.npz",
              help="Save every attention weight of the run (prompt and generated rows) as .npz.")
@click.option("--attn-layers", metavar="0,5-7", help="Layers to dump (default all).")
@click.option("--attn-heads", metavar="0-3", help="Heads to dump (default all).")
@click.option("--attn-dtype", type=click.Choice(["float32", "float16"]), help="Dump dtype (default float32).")
@click.option("--attn-verify", is_flag=True, help="Recompute without the cache and check the dumped rows.")
def generate(prompt, model_path, prompt_opt, file, chat, system, quiet, verbose, **options):
    """Generate text from PROMPT and stream it to stdout; figures go to stderr."""
    dump = pop_dump_options(options)  # --dump-attention & co: see the attention section (issue 5)
    text = read_prompt(prompt, prompt_opt, file)
    model, tokenizer, load_seconds = load_model(model_path)
    run = build_run(model, tokenizer, text, chat, system, record_attention=dump is not None, **options)
    if dump is not None:
        sys.exit(generate_with_dump(run, load_seconds, quiet, verbose, dump))
    sys.exit(print_run(run, load_seconds, quiet, verbose))


@main.command()
@click.option("--model", "model_path", metavar="PATH|ID", help=MODEL_HELP)
def info(model_path):
    """What a checkpoint is (and what --model resolved to): architecture, size, dims, heads, context, tokenizer."""
    model, tok, _, resolved = resolve_and_load(model_path)
    from ..checkpoint.weights import DTYPE_NAMES, checkpoint_dtypes
    c = model.config
    arch = ", ".join(c.architectures) or "-"
    dtypes = checkpoint_dtypes(model.path)
    rows = [
        ("model", resolved.origin),
        ("path", str(model.path)),
        ("architecture", f"{c.model_type} ({'the language model of ' + c.wrapper + ', ' if c.wrapper else ''}{arch})"),
        ("parameters", f"{model.n_params:,} ({model.n_params / 1e6:.1f} M)"),
        *vision_rows(model),
        ("layers", c.n_layers),
        ("hidden size", c.hidden_size),
        ("intermediate size", c.intermediate_size),
        ("heads", f"{c.n_heads} query, {c.n_kv_heads} key/value, head dim {c.head_dim}"),
        ("vocabulary", c.vocab_size),
        ("context", f"{c.max_position_embeddings} tokens" + (f", sliding window {c.sliding_window}"
                                                              if c.sliding_window else "")),
        ("dtype on disk", ", ".join(DTYPE_NAMES.get(d, d) + (f" ({n} tensors)" if len(dtypes) > 1 else "")
                                    for d, n in sorted(dtypes.items(), key=lambda kv: -kv[1]))),
        ("tokenizer", f"{type(tok.hf.model).__name__}, {tok.vocab_size} tokens"
                      f"{', byte fallback' if tok.byte_fallback_ids else ''}, BOS {tok.special_token('bos_token')}, "
                      f"EOS {tok.special_token('eos_token')}"),
        ("chat template", "yes" if tok.chat_template else "no"),
    ]
    for name, value in rows:
        click.echo(f"{name + ':':<19}{value}")



def vision_rows(model) -> list:
    """A multimodal checkpoint's vision tower and projector: what `info` says of what minigen does not read."""
    from ..checkpoint.weights import index_checkpoint, vision_tensors
    c = model.config
    if not c.wrapper:
        return []
    skipped = vision_tensors(c.wrapper, index_checkpoint(model.path))
    n = sum(math.prod(r.shape) for r in skipped)
    rows = [("vision", f"a vision tower and projector ({c.wrapper}: {len(skipped)} tensors, {n:,} parameters, "
                       f"not loaded and not counted above): minigen runs the language model, text only")]
    if c.image_token_ids:
        rows.append(("image tokens", ", ".join(f"#{i}" for i in c.image_token_ids) + " (refused in a prompt)"))
    return rows


# --- chat (issue 12) ------------------------------------------------------------------------

CHAT_HELP = """commands:
  /help          this list
  /reset         start a new conversation (the system message is kept)
  /system TEXT   set the system message (/system alone removes it); the conversation is kept
  /save FILE     write the conversation as JSON messages (minigen chat --load FILE resumes it)
  /exit          quit (so does Ctrl-D); Ctrl-C stops a reply and keeps what was printed
a message that starts with / is sent by typing // for its /"""


@main.command()
@click.option("--model", "model_path", type=click.Path(), help="Checkpoint directory (default: the default model).")
@click.option("--system", help="System message (replaces the one of --load).")
@click.option("--load", "load_path", type=click.Path(exists=True, dir_okay=False),
              help="Resume a conversation saved with /save (a JSON list of messages).")
@generation_options
def chat(model_path, system, load_path, quiet, verbose, **options):
    """A conversation through the checkpoint's chat template, one message per line.

    Each reply is streamed to stdout and followed by a newline; figures go to stderr. The KV cache
    carries over between turns, so a turn computes only its new tokens. In a terminal: line editing
    and history, Ctrl-C stops a reply, Ctrl-D or /exit quits, /help lists the commands. When the
    conversation outgrows the context, its oldest exchanges are dropped (the system message is kept).
    """
    from ..generation.chat import ChatSession, load_conversation
    messages = load_conversation(load_path) if load_path else []
    model, tokenizer, load_seconds = load_model(model_path)
    session = ChatSession(model, tokenizer, messages, system=system, **options)
    terminal = stdin_is_terminal()
    if terminal:
        enable_line_editing()
        click.echo(f"minigen chat: {model.path}; /help for commands, Ctrl-D or /exit to quit", err=True)
    if verbose:
        click.echo(f"model: {model.path} ({model.config.model_type}), "
                   f"{settings_text(session.settings, options['repeat_last_n'], options['seed'], session.max_context)}",
                   err=True)
    failed = False
    try:
        for line in read_lines(terminal):
            line = line.strip()
            try:
                if line.startswith("/") and not line.startswith("//"):
                    if not chat_command(session, line):
                        break
                elif line:
                    print_reply(session.reply(line[1:] if line.startswith("//") else line), load_seconds, quiet,
                                verbose)
            except MinigenError as e:  # a bad message or command: say so and go on
                click.echo(f"minigen: error: {e}", err=True)
                failed = True
    except KeyboardInterrupt:  # outside a reply (reading a pipe): stop there
        sys.exit(130)
    sys.exit(1 if failed else 0)


def enable_line_editing():
    try:
        import readline  # noqa: F401 -- once imported, input() edits lines and keeps a history
    except ImportError:
        pass


def read_lines(terminal: bool):
    """The user's lines: stdin as it comes, or input() with a prompt in a terminal, where Ctrl-C
    abandons the line being typed and Ctrl-D ends. The prompt goes to stderr when stdout is not a
    terminal (`minigen chat | tee log`), which then holds the replies only."""
    if not terminal:
        yield from sys.stdin
        return
    aside = not stdout_is_terminal()
    while True:
        try:
            if aside:
                click.echo(">>> ", nl=False, err=True)
            yield input("" if aside else ">>> ")
        except KeyboardInterrupt:
            click.echo(err=aside)
        except EOFError:
            click.echo(err=aside)
            return


def chat_command(session, line: str) -> bool:
    """Carry out one /command; False when it asks to quit."""
    name, _, arg = line.partition(" ")
    arg = arg.strip()
    if name in ("/exit", "/quit", "/bye"):
        return False
    if name == "/help":
        click.echo(CHAT_HELP, err=True)
    elif name == "/reset":
        session.reset()
        click.echo("new conversation" + (" (the system message is kept)" if session.messages else ""), err=True)
    elif name == "/system":
        session.set_system(arg or None)
        click.echo("system message " + ("set" if arg else "removed"), err=True)
    elif name == "/save":
        if not arg:
            raise MinigenError("/save needs a file: /save FILE")
        session.save(arg)
        click.echo(f"saved {len(session.messages)} messages to {arg}", err=True)
    else:
        raise MinigenError(f"unknown command {name} (/help lists them)")
    return True


def print_reply(reply, load_seconds: float, quiet: bool, verbose: bool):
    """Stream one reply to stdout and end it with a newline; notes and figures to stderr."""
    if reply.dropped:
        click.echo(f"minigen: note: the context is full: dropped the oldest {reply.dropped} exchange(s) "
                   f"of the conversation (the system message is kept)", err=True)
    try:
        for piece in reply.pieces():
            click.echo(piece, nl=False)
    except KeyboardInterrupt:
        pass  # the reply stops; what was printed stays in the conversation
    reply.close()
    click.echo()
    if reply.stats.finish == "context":
        click.echo(f"minigen: note: the context is full ({reply.run.max_context} tokens); the reply stopped", err=True)
    if not quiet:
        click.echo(figures(reply.stats, load_seconds, verbose), err=True)



# --- convert (issue 4) ----------------------------------------------------------------------

@main.command()
@click.argument("source", type=click.Path(exists=True, dir_okay=False))
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
              show_default=True, help="Data type of the written weights.")
def convert(source, out_dir, dtype):
    """Convert a GGUF file (SOURCE) into a Hugging Face checkpoint directory (OUT_DIR).

    Architectures: llama (also Mistral, SmolLM), qwen2, qwen3, gemma, gemma2, gemma3, phi3, gpt2, olmo2,
    gptneox, smollm3. Tensors are dequantised (every type the gguf package reads: F32, F16, BF16, Q4_0 ... Q8_0,
    the K and I quants, ...), llama.cpp's changes to them undone, the tokenizer rebuilt as tokenizer.json, and
    OUT_DIR appears only when the conversion is complete.
    """
    import time

    from ..gguf.convert import convert_gguf

    start = time.perf_counter()
    result = convert_gguf(source, out_dir, dtype=dtype, progress=True)
    click.echo(f"wrote {result.out_dir}: {result.n_tensors} tensors, {result.n_params / 1e6:.1f}M parameters, "
               f"{result.nbytes / 1e6:.0f} MB ({dtype}) in {time.perf_counter() - start:.1f} s", err=True)


# --- looking inside: attention, trace (issue 5); ablate, patch, lens, dla (issue 11) ------------------------
# Each command parses its flags, calls one function of minigen/inspect/commands.py, and prints the result
# as text (inspect/report.py) or, with --json, as one JSON object on stdout (fields: README).

def pop_dump_options(options: dict) -> dict | None:
    """Take generate's --dump-attention options out of `options`; check the path before any work."""
    from ..files import check_target
    dump = {k: options.pop(k) for k in ("dump_path", "attn_layers", "attn_heads", "attn_dtype", "attn_verify")}
    if dump["dump_path"] is None:
        if any(v for k, v in dump.items() if k != "dump_path"):
            raise click.UsageError("--attn-layers, --attn-heads, --attn-dtype and --attn-verify go with --dump-attention")
        return None
    if options["max_tokens"] == 0:
        raise click.UsageError("--dump-attention needs at least one generated token (-n 0 runs no forward pass); "
                               "for the prompt alone: minigen attention PROMPT --dump-attention OUT.npz")
    check_target(dump["dump_path"], "attention dump")
    return dump


def generate_with_dump(run, load_seconds: float, quiet: bool, verbose: bool, dump: dict) -> int:
    """print_run with the attention of every step collected; the file is written only if the run ends."""
    from ..inspect.dump import GenerationDump
    from ..inspect.internals import verify_rows
    max_tokens = min(run.options.max_tokens, run.max_context - len(run.prompt) + 1)
    with GenerationDump(run.model, run.tokenizer, dump["dump_path"], run.prompt, max_tokens, dump["attn_layers"],
                        dump["attn_heads"], dump["attn_dtype"]) as d:
        run.on_step.append(d.on_step)
        code = print_run(run, load_seconds, quiet, verbose)
        if code != 0:
            click.echo("minigen: interrupted: no attention dump written", err=True)
            return code
        out = d.finish()
    T = len(out["token_ids"])
    click.echo(f"attention: wrote {out['path']} ({len(d.layers)} layers x {len(d.heads)} heads x {T}x{T} "
               f"{d.dtype.name}, lower triangles; prompt {len(run.prompt)} tokens)", err=True)
    if dump["attn_verify"]:
        err = verify_rows(run.model, out["token_ids"], out["matrices"], d.heads)
        tol = 1e-4 if d.dtype.itemsize == 4 else 2e-3
        if err > tol:
            raise MinigenError(f"--attn-verify: dumped rows differ from the uncached recomputation by {err:.2e} (> {tol:g})")
        click.echo(f"attention verify: all {T} rows match an uncached recomputation (max |diff| {err:.1e})", err=True)
    return 0


def _prompt_ids(tokenizer, prompt, chat):
    from ..generation.steps import prompt_ids
    if prompt == "-":
        prompt = sys.stdin.read()
    ids = prompt_ids(tokenizer, prompt, chat=chat)
    if not ids:
        raise MinigenError("the prompt is empty (no tokens to look at)")
    return ids


def _emit(result: dict, as_json: bool, format_lines):
    """The result as one JSON object, or as the report's lines."""
    from ..inspect.commands import as_json as to_json
    if as_json:
        click.echo(to_json(result))
        return
    for line in format_lines(result):
        click.echo(line)


def _model_and_ids(model_path, prompt, chat):
    if prompt is None:
        raise click.UsageError("give a PROMPT (or - to read stdin)")
    model, tok, _ = load_model(model_path)
    return model, tok, _prompt_ids(tok, prompt, chat)


def _shared(f):
    """--model, --chat and --json, which every command on a prompt takes."""
    f = click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object (fields: README).")(f)
    f = click.option("--chat", is_flag=True, help="Render the prompt through the chat template first.")(f)
    return click.option("--model", "model_path", metavar="PATH|ID", help=MODEL_HELP)(f)


def _usage(**conflicts):
    """Usage errors for flags given together that do not go together: name=(given, message)."""
    for given, message in conflicts.values():
        if given:
            raise click.UsageError(message)


@main.command()
@click.argument("prompt", required=False)
@_shared
@click.option("--from", "from_path", metavar="DUMP.npz", help="Inspect a dump made by --dump-attention instead.")
@click.option("--layer", type=int, help="Layer for --token (and the HTML's first view).")
@click.option("--head", type=int, help="Head for --token (and the HTML's first view).")
@click.option("--token", "token_spec", metavar="I|TEXT",
              help="Query token: index (negative from the end) or text (its last occurrence).")
@click.option("--key", "key_spec", metavar="I|TEXT",
              help="With --token and no --layer/--head: the query's weight on this key in every layer x head.")
@click.option("-k", "--top-k", type=click.IntRange(min=1), default=10, show_default=True, help="Bars for --token.")
@click.option("--value-weighted", is_flag=True,
              help="Weigh each key by the size of what it sends, |α·v·W_O| (rows renormalised).")
@click.option("--exclude-first", is_flag=True, help="Hide the first token (the sink) and renormalise the rows.")
@click.option("--probe", type=click.Choice(["induction"]),
              help="Add induction and duplicate-token scores from a repeated random sequence.")
@click.option("--probe-length", type=click.IntRange(min=2), help="Random tokens per repeat (default 50, or what fits).")
@click.option("--probe-first", metavar="TOKEN|none",
              help="What comes before the repeats: a token (text or #ID), or none (default: the tokenizer's BOS, if any).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for the probe's random tokens.")
@click.option("--html", "html_path", metavar="OUT.html", help="Write a self-contained page with every head.")
@click.option("--dump-attention", "dump_path", metavar="OUT.npz", help="Save the prompt's attention as .npz.")
@click.option("--attn-layers", metavar="0,5-7", help="Layers to keep (default all).")
@click.option("--attn-heads", metavar="0-3", help="Heads to keep (default all).")
@click.option("--attn-dtype", type=click.Choice(["float32", "float16"]), help="Dump dtype (default float32).")
def attention(prompt, model_path, chat, as_json, from_path, layer, head, token_spec, key_spec, top_k,
              value_weighted, exclude_first, probe, probe_length, probe_first, seed, html_path, dump_path,
              attn_layers, attn_heads, attn_dtype):
    """Census of every layer x head for PROMPT, one query's top keys, one query across the model, a page.

    \b
      minigen attention "The cat sat on the mat. The cat" --model PATH
      minigen attention "..." --layer 3 --head 2 --token -1
      minigen attention "..." --token -1 --key cat          # every layer x head
      minigen attention "..." --value-weighted --exclude-first
      minigen attention --probe induction
      minigen attention --from attn.npz --html attn.html
    """
    from contextlib import ExitStack
    from ..files import OutputFile
    from ..inspect import commands as C
    from ..inspect import report as R
    from ..inspect.dump import DumpFile
    from ..inspect.internals import induction_probe

    uses_model = value_weighted or probe is not None
    _usage(
        token=(token_spec is not None and key_spec is None and (layer is None or head is None),
               "--token needs --layer and --head (one head's top keys) or --key (every layer x head)"),
        key=(key_spec is not None and (token_spec is None or layer is not None or head is not None),
             "--key goes with --token, without --layer/--head"),
        both=(prompt is not None and from_path is not None, "give either a PROMPT or --from DUMP.npz, not both"),
        chat=(from_path is not None and chat, "--chat renders a PROMPT; a dump's tokens are already fixed"),
        dump=(from_path is not None and dump_path is not None,
              "--dump-attention writes a new dump from a PROMPT; with --from the dump exists"),
        dtype=(attn_dtype is not None and dump_path is None, "--attn-dtype goes with --dump-attention"),
        model=(from_path is not None and model_path is not None and not uses_model,
               "--model with --from is used only by --value-weighted and --probe (the dump holds the weights)"),
        probe=((probe_length is not None or probe_first is not None) and probe is None,
               "--probe-length and --probe-first go with --probe induction"),
        census=(probe is not None and token_spec is not None, "--probe adds columns to the census, not to --token's views"),
    )
    if prompt is None and from_path is None:
        if probe is None:
            raise click.UsageError("give a PROMPT (or - to read stdin), or --from DUMP.npz, or --probe induction")
        model, tok, _ = load_model(model_path)
        _emit(C.probe(model, tok, probe_length, seed, probe_first, attn_layers, attn_heads), as_json, R.format_attention)
        return
    with ExitStack() as files:  # both paths are checked before any work; nothing is left if it fails
        dump = files.enter_context(DumpFile(dump_path)) if dump_path else None
        page = files.enter_context(OutputFile(html_path, "HTML page")) if html_path else None
        if from_path is not None:
            src = C.from_dump(from_path, attn_layers, attn_heads)
            if uses_model:
                model, tok, _ = load_model(model_path or C.dump_model_path(from_path))
                src = C.with_model(src, model, tok)
        else:
            model, tok, ids = _model_and_ids(model_path, prompt, chat)
            src = C.from_prompt(model, tok, ids, attn_layers, attn_heads)
        if layer is not None or head is not None:  # a bad --layer/--head fails before any file is written
            C.pattern(src, layer if layer is not None else min(src.layers), head if head is not None else src.heads[0])
        written = {}
        if dump is not None:
            written["dump"] = C.write_dump(src, dump, attn_dtype)
            click.echo(f"wrote {dump_path}: {written['dump']['layers']} layers x {written['dump']['heads']} heads x "
                       f"{len(src.tokens)} tokens (lower triangles)", err=True)
        if page is not None:
            written["html"] = C.write_html(src, page, layer, head)
            click.echo(f"wrote {html_path} ({written['html']['bytes'] / 2**20:.1f} MiB): open it in a browser", err=True)
    if written and token_spec is None and probe is None and not (value_weighted or exclude_first):
        if as_json:  # asked for files only; a view flag (or no file flag) prints the census
            click.echo(C.as_json({"command": "attention", "view": "files", "files": written}))
        return
    probed = induction_probe(src.model, src.tokenizer, probe_length, seed, probe_first) if probe else None
    result = C.attention_view(src, layer, head, token_spec, key_spec, top_k, value_weighted, exclude_first, probed)
    _emit({**result, "files": written} if written else result, as_json, R.format_attention)


@main.command()
@click.argument("prompt", required=False)
@_shared
@click.option("--heads", metavar="L.H,...", help="Heads to ablate: 18.6,17.4 (18.* for a whole layer).")
@click.option("--attn", "attn_layers", metavar="LAYERS", help="Attention blocks to ablate: 3,5-7.")
@click.option("--mlp", "mlp_layers", metavar="LAYERS", help="MLP blocks to ablate: 3,5-7.")
@click.option("--expert", metavar="L.E,...", help="Routed experts to take out: 3.5,0.1 (3.* for a layer's all).")
@click.option("--sweep", type=click.Choice(["heads", "attn", "mlp", "experts"]),
              help="Ablate each head (or each layer's attention or MLP, or each expert) alone in turn and rank them.")
@click.option("--mode", type=click.Choice(["zero", "mean"]), default="zero", show_default=True,
              help="Replace the output by zeros, or by its mean over the prompt's positions.")
@click.option("--token", "token_spec", metavar="I|TEXT", help="Position whose next token is measured (default: the last).")
@click.option("--target", metavar="TOKEN", help="Token whose log-probability is followed (text or #ID; default: the top one).")
@click.option("-k", "--top-k", type=click.IntRange(min=1), default=5, show_default=True, help="Top tokens shown.")
@click.option("--rank", type=click.Choice(["kl", "logp"]), default="kl", show_default=True,
              help="Sweep order: KL(before || after), or the drop in log p(target).")
@click.option("--top", type=click.IntRange(min=1), default=15, show_default=True, help="Sweep rows shown.")
def ablate(prompt, model_path, chat, as_json, heads, attn_layers, mlp_layers, expert, sweep, mode, token_spec, target,
           top_k, rank, top):
    """What happens to the next token when heads or blocks are taken out (zeroed or mean-ablated).

    \b
      minigen ablate "When Mary and John went to the store, John gave a drink to" --heads 18.6,17.4
      minigen ablate "..." --sweep heads --mode mean
      minigen ablate "..." --mlp 0 --attn 29
      minigen ablate "..." --expert 3.5 --model ibm-granite/granite-3.1-1b-a400m-instruct
    """
    from ..inspect import commands as C
    from ..inspect import report as R
    _usage(sweep=(sweep is not None and any((heads, attn_layers, mlp_layers, expert)),
                  "--sweep ablates each part in turn; leave out --heads, --attn, --mlp and --expert"),
           rank=(sweep is None and rank != "kl", "--rank orders a --sweep"),
           mode=(mode == "mean" and (expert or sweep == "experts"),
                 "an expert is taken out by zeroing what it adds (--mode zero); --mode mean is for heads and blocks"))
    model, tok, ids = _model_and_ids(model_path, prompt, chat)
    if sweep is not None:
        if sweep == "experts":
            from ..inspect.experts import check_moe
            check_moe(model.config, "--sweep experts")
        _emit(C.sweep(model, tok, ids, sweep, mode, token_spec, target, rank), as_json, lambda r: R.format_sweep(r, top))
        return
    parts = C.components(model, heads, attn_layers, mlp_layers, expert)
    _emit(C.ablate(model, tok, ids, parts, mode, token_spec, target, top_k), as_json, R.format_ablation)


@main.command()
@click.argument("prompt", required=False)
@_shared
@click.option("--layers", metavar="LAYERS", help="Layers to report: 0,5-7 (default all).")
def experts(prompt, model_path, chat, as_json, layers):
    """Routed experts: which experts each token of PROMPT went to in each layer, with their weights.

    \b
      minigen experts "The capital of France is" --model ibm-granite/granite-3.1-1b-a400m-instruct
      minigen experts "..." --layers 0,-1 --json
    """
    from ..inspect import commands as C
    from ..inspect import report as R
    model, tok, ids = _model_and_ids(model_path, prompt, chat)
    _emit(C.routing(model, tok, ids, layers), as_json, R.format_routing)


@main.command()
@click.argument("clean", required=False)
@click.argument("corrupted", required=False)
@_shared
@click.option("--answer", metavar="TOKEN", help="The clean prompt's answer (text or #ID; default: its top token).")
@click.option("--wrong", metavar="TOKEN", help="The answer it is told apart from (default: the corrupted prompt's top token).")
@click.option("--what", type=click.Choice(["heads", "resid", "attn", "mlp"]), default="heads", show_default=True,
              help="Patch each head's output; or the residual stream, attention or MLP output at each layer x position.")
@click.option("--token", "token_spec", metavar="I|TEXT", help="Position whose logit difference is measured (default: the last).")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="Heads listed after the grid.")
def patch(clean, corrupted, model_path, chat, as_json, answer, wrong, what, token_spec, top):
    """Activation patching: how much of CLEAN's logit difference each part restores in CORRUPTED.

    \b
      minigen patch "When Mary and John went to the store, John gave a drink to" \\
                    "When Mary and John went to the store, Mary gave a drink to" --answer " Mary" --wrong " John"
      minigen patch CLEAN CORRUPTED --what resid
    """
    from ..inspect import commands as C
    from ..inspect import report as R
    if clean is None or corrupted is None:
        raise click.UsageError("give two prompts of the same length in tokens: CLEAN CORRUPTED")
    model, tok, clean_ids = _model_and_ids(model_path, clean, chat)
    corrupt_ids = _prompt_ids(tok, corrupted, chat)
    _emit(C.patch(model, tok, clean_ids, corrupt_ids, answer, wrong, what, token_spec), as_json,
          lambda r: R.format_patch(r, top))


@main.command()
@click.argument("prompt", required=False)
@_shared
@click.option("--token", "token_spec", metavar="I|TEXT", help="Position to read (default: the last).")
@click.option("-k", "--top-k", type=click.IntRange(min=1), default=5, show_default=True, help="Top tokens per layer.")
@click.option("--target", metavar="TOKEN", help="Token whose rank and probability are followed (default: the final top one).")
def lens(prompt, model_path, chat, as_json, token_spec, top_k, target):
    """Logit lens: what the residual stream after each layer predicts, read out as the last layer's is.

    \b
      minigen lens "The capital of France is" --target " Paris"
    """
    from ..inspect import commands as C
    from ..inspect import report as R
    model, tok, ids = _model_and_ids(model_path, prompt, chat)
    _emit(C.logit_lens(model, tok, ids, token_spec, top_k, target), as_json, R.format_lens)


@main.command()
@click.argument("prompt", required=False)
@_shared
@click.option("--token", "token_spec", metavar="I|TEXT", help="Position to attribute (default: the last).")
@click.option("--target", metavar="TOKEN", help="Token whose logit is attributed (text or #ID; default: the top one).")
@click.option("--vs", metavar="TOKEN", help="Attribute logit(target) - logit(vs) instead.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="Heads listed after the table.")
def dla(prompt, model_path, chat, as_json, token_spec, target, vs, top):
    """Direct logit attribution: each head's, attention block's and MLP's direct part of a token's logit.

    \b
      minigen dla "When Mary and John went to the store, John gave a drink to" --target " Mary" --vs " John"
    """
    from ..inspect import commands as C
    from ..inspect import report as R
    model, tok, ids = _model_and_ids(model_path, prompt, chat)
    _emit(C.dla(model, tok, ids, token_spec, target, vs), as_json, lambda r: R.format_dla(r, top))


@main.command()
@click.argument("prompt", required=False)
@_shared
@click.option("--layer", type=int, help="Layer to trace.")
@click.option("--head", type=int, help="Query head to trace.")
@click.option("--token", "token_spec", metavar="I|TEXT", help="Query token (default: the last).")
@click.option("--keys", type=click.IntRange(min=1), default=12, show_default=True,
              help="Keys to print (the largest weights) when the token sees more.")
@click.option("--seeds", is_flag=True, help="Trace the birds/eat/seeds worked example instead (no model).")
def trace(prompt, model_path, chat, as_json, layer, head, token_spec, keys, seeds):
    """One head's attention for one token, step by step: x, q, keys, scores, softmax, output.

    \b
      minigen trace "The cat sat on the mat" --model PATH --layer 2 --head 1 --token -1
      minigen trace --seeds
    """
    from ..inspect import commands as C
    from ..inspect.trace import seeds_lines
    if seeds:
        lines = seeds_lines()
        click.echo(C.as_json({"command": "trace", "seeds": True, "lines": lines}) if as_json else "\n".join(lines))
        return
    if layer is None or head is None:
        raise click.UsageError("trace needs --layer and --head")
    model, tok, ids = _model_and_ids(model_path, prompt, chat)
    result = C.trace(model, tok, ids, layer, head, token_spec, keys)
    _emit(result, as_json, lambda r: r["lines"])
    if not result["matches_model"]:
        raise MinigenError("the trace does not match the model's own head output")

"""The command line: flags and printing only. Work happens in generate.py, convert.py, inspect.py.

Process-wide behaviour lives in `Group.invoke`: a bad input is one line `minigen: error: ...` (exit 1),
a bad option value a usage error naming its flag (exit 2); Ctrl-C exits 130 and SIGTERM/SIGHUP 128 +
the signal, both by an exception, so every output file's temporary sibling is removed on the way out
(files.py); a closed, full or broken stdout is one line (or, for a closed pipe, silence), never a
traceback.
"""
from __future__ import annotations

import errno
import os
import re
import signal
import sys
from contextlib import contextmanager

import click

from .errors import MiB, MinigenError, OptionError, decode_utf8, read_bounded

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


def unescape(text: str) -> str:
    return re.sub(r"\\([ntr\\])", lambda m: {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[m[1]], text)


# --- generate, info (issue 3) ---------------------------------------------------------------

def load_model(path):
    """The model at --model, or the default model; returns (model, tokenizer, load seconds)."""
    import time
    from .checkpoint import load
    if path is None:
        from .default_model import default_model_path
        path = default_model_path()
    import numpy as np
    np.seterr(all="ignore")  # non-finite logits are reported per step (generate.py), not as numpy warnings
    start = time.perf_counter()
    model, tokenizer = load(path)
    return model, tokenizer, time.perf_counter() - start


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
    from .generate import run
    return run(model, tokenizer, text, chat=chat, system=system, **options)


def print_run(run, load_seconds: float, quiet: bool, verbose: bool) -> int:
    """Stream the text to stdout, piece by piece; notes and figures to stderr. Returns the exit code."""
    if verbose:
        s = run.settings
        click.echo(f"model: {run.model.path} ({run.model.config.model_type}), prompt: {len(run.prompt)} tokens, "
                   f"temp {s['temp']}, top-k {s['top_k']}, top-p {s['top_p']}, min-p {s['min_p']}, "
                   f"repeat-penalty {s['repeat_penalty']} (last {run.options.repeat_last_n}), "
                   f"seed {run.options.seed}, context {run.max_context}", err=True)
    code = 0
    try:
        for piece in run.pieces():
            click.echo(piece, nl=False)
    except KeyboardInterrupt:
        code = 130
    if sys.stdout.isatty():
        click.echo()
    if run.stats.finish == "context":
        click.echo(f"minigen: note: the context is full ({run.max_context} tokens); generation stopped", err=True)
    if not quiet:
        click.echo(figures(run.stats, load_seconds, verbose), err=True)
    return code


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


@main.command()
@click.argument("prompt", required=False)
@click.option("--model", "model_path", type=click.Path(), help="Checkpoint directory (default: the default model).")
@click.option("-p", "--prompt", "prompt_opt", help="The prompt; - reads it from stdin.")
@click.option("-f", "--file", type=click.Path(exists=True, dir_okay=False), help="Read the prompt from a file.")
# Values are checked by generate.Options.check (one layer); click only parses the types.
@click.option("-m", "-n", "--max-tokens", type=int, default=256, show_default=True,
              help="Tokens to generate at most (>= 0).")
@click.option("--temp", type=float, help="Temperature, >= 0; 0 is greedy. [default: from "
              "generation_config.json, else 0]")
@click.option("--top-k", type=int, help="Keep the k most likely tokens (0: off).")
@click.option("--top-p", type=float, help="Keep the smallest set reaching p, in (0, 1] (1: off).")
@click.option("--min-p", type=float, help="Keep tokens at least min-p times the top one, in [0, 1] (0: off).")
@click.option("--repeat-penalty", type=float, help="Penalise tokens seen recently, as HF's repetition_penalty, > 0 (1: off).")
@click.option("--repeat-last-n", type=int, default=64, show_default=True,
              help="Window of the repeat penalty, in tokens (0: the whole sequence).")
@click.option("--seed", type=int, help="Seed for sampling (>= 0): the same seed gives the same text.")
@click.option("--stop", multiple=True, callback=lambda ctx, param, value: _stop_strings(value, "--stop"),
              help="Stop when this text appears (not printed); \\n, \\t, \\r, \\\\ are escapes. Repeatable.")
@click.option("--ignore-eos", is_flag=True, help="Keep going past the end-of-sequence token.")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the checkpoint's chat template.")
@click.option("--system", help="System message for --chat (implies --chat).")
@click.option("--max-context", type=int, help="Context size in tokens (default and maximum: the model's).")
@click.option("-q", "--quiet", is_flag=True, help="No figures on stderr.")
@click.option("-v", "--verbose", is_flag=True, help="Settings before, more figures after.")
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
@click.option("--model", "model_path", type=click.Path(), help="Checkpoint directory (default: the default model).")
def info(model_path):
    """What a checkpoint is: architecture, size, dims, heads, context, tokenizer."""
    model, tok, _ = load_model(model_path)
    from .weights import DTYPE_NAMES, checkpoint_dtypes
    c = model.config
    arch = ", ".join(c.architectures) or "-"
    dtypes = checkpoint_dtypes(model.path)
    rows = [
        ("path", str(model.path)),
        ("architecture", f"{c.model_type} ({arch})"),
        ("parameters", f"{model.n_params:,} ({model.n_params / 1e6:.1f} M)"),
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



# --- convert (issue 4) ----------------------------------------------------------------------

@main.command()
@click.argument("source", type=click.Path(exists=True, dir_okay=False))
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
              show_default=True, help="Data type of the written weights.")
def convert(source, out_dir, dtype):
    """Convert a Llama GGUF file (SOURCE) into a Hugging Face checkpoint directory (OUT_DIR).

    Tensors are dequantised (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, K-quants), the tokenizer is rebuilt
    as tokenizer.json, and OUT_DIR appears only when the conversion is complete.
    """
    import time

    from .convert import convert_gguf

    start = time.perf_counter()
    result = convert_gguf(source, out_dir, dtype=dtype, progress=True)
    click.echo(f"wrote {result.out_dir}: {result.n_tensors} tensors, {result.n_params / 1e6:.1f}M parameters, "
               f"{result.nbytes / 1e6:.0f} MB ({dtype}) in {time.perf_counter() - start:.1f} s", err=True)


# --- attention, trace (issue 5) -------------------------------------------------------------

def pop_dump_options(options: dict) -> dict | None:
    """Take generate's --dump-attention options out of `options`; check the path before any work."""
    from .inspect.dump import check_dump_path
    dump = {k: options.pop(k) for k in ("dump_path", "attn_layers", "attn_heads", "attn_dtype", "attn_verify")}
    if dump["dump_path"] is None:
        if any(v for k, v in dump.items() if k != "dump_path"):
            raise click.UsageError("--attn-layers, --attn-heads, --attn-dtype and --attn-verify go with --dump-attention")
        return None
    check_dump_path(dump["dump_path"])
    return dump


def generate_with_dump(run, load_seconds: float, quiet: bool, verbose: bool, dump: dict) -> int:
    """print_run with the attention of every step collected; the file is written only if the run ends."""
    from .inspect.dump import GenerationDump
    from .inspect.internals import verify_rows
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
               f"{d.dtype.name}; prompt {len(run.prompt)} tokens)", err=True)
    if dump["attn_verify"]:
        err = verify_rows(run.model, out["token_ids"], out["matrices"], d.heads)
        tol = 1e-4 if d.dtype.itemsize == 4 else 2e-3
        if err > tol:
            raise MinigenError(f"--attn-verify: dumped rows differ from the uncached recomputation by {err:.2e} (> {tol:g})")
        click.echo(f"attention verify: all {T} rows match an uncached recomputation (max |diff| {err:.1e})", err=True)
    return 0


def _inspect_model(path):
    """--model PATH, or the default model when it is not given: (model, tokenizer)."""
    return load_model(path)[:2]


def _prompt_ids(tokenizer, prompt, chat):
    from .generate import prompt_ids
    if prompt == "-":
        prompt = sys.stdin.read()
    return prompt_ids(tokenizer, prompt, chat=chat)


def _attention_source(prompt, model_path, from_path, chat, attn_layers, attn_heads):
    """(model or None, ids, layers {l: (heads, T, T)}, heads, tokens, prompt_length or None, subtitle)."""
    from .inspect import dump as D
    from .inspect.internals import prompt_attention
    if from_path is not None:
        if prompt is not None:
            raise MinigenError("give either a PROMPT or --from DUMP.npz, not both")
        d = D.load_attention(from_path)
        m = d["meta"]
        layers = d["layers"]
        if attn_layers is not None:
            keep = D.parse_selection(attn_layers, m.get("n_layers", max(layers) + 1), "layer", "--attn-layers")
            missing = [l for l in keep if l not in layers]
            if missing:
                raise MinigenError(f"--attn-layers: layer {missing[0]} is not in {from_path} (it has {sorted(layers)})")
            layers = {l: layers[l] for l in keep}
        heads = list(d["heads"])
        tokens = m.get("tokens") or [str(i) for i in d["token_ids"]]
        sub = f"{m.get('model_path', '?')} · from {from_path}"
        return None, d["token_ids"], layers, heads, tokens, d["prompt_length"], sub
    if prompt is None:
        raise MinigenError("give a PROMPT (or - to read stdin), or --from DUMP.npz")
    model, tok = _inspect_model(model_path)
    ids = _prompt_ids(tok, prompt, chat)
    c = model.config
    keep_l = D.parse_selection(attn_layers, c.n_layers, "layer", "--attn-layers")
    heads = D.parse_selection(attn_heads, c.n_heads, "head", "--attn-heads")
    record = prompt_attention(model, ids)
    layers = {l: record[l][heads] for l in keep_l}
    return (model, tok), ids, layers, heads, tok.token_strings(ids), None, str(model.path)


def _pick(layers, heads, layer, head):
    """Map --layer/--head onto the kept arrays: (layer array index into dict, head position)."""
    if layer not in layers:
        raise MinigenError(f"--layer {layer} out of range (available: {_ranges(sorted(layers))})")
    if head not in heads:
        raise MinigenError(f"--head {head} out of range (available: {_ranges(heads)})")
    return layers[layer][heads.index(head)]


def _ranges(xs):
    return f"{xs[0]}-{xs[-1]}" if xs == list(range(xs[0], xs[-1] + 1)) else ",".join(map(str, xs))


@main.command()
@click.argument("prompt", required=False)
@click.option("--model", "model_path", metavar="PATH", help="Checkpoint directory (default: the default model).")
@click.option("--from", "from_path", metavar="DUMP.npz", help="Inspect a dump made by --dump-attention instead.")
@click.option("--chat", is_flag=True, help="Render the prompt through the chat template first.")
@click.option("--layer", type=int, help="Layer for --token (and the HTML's first view).")
@click.option("--head", type=int, help="Head for --token (and the HTML's first view).")
@click.option("--token", "token_spec", metavar="I|TEXT", help="Query token: index (negative from the end) or its text.")
@click.option("-k", "--top-k", type=click.IntRange(min=1), default=10, show_default=True, help="Bars for --token.")
@click.option("--probe", type=click.Choice(["induction"]), help="Add induction scores from a repeated random sequence.")
@click.option("--probe-length", type=click.IntRange(min=2), help="Random tokens per repeat (default 50, or what fits).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for the probe's random tokens.")
@click.option("--html", "html_path", metavar="OUT.html", help="Write a self-contained page with every head.")
@click.option("--dump-attention", "dump_path", metavar="OUT.npz", help="Save the prompt's attention as .npz.")
@click.option("--attn-layers", metavar="0,5-7", help="Layers to keep (default all).")
@click.option("--attn-heads", metavar="0-3", help="Heads to keep (default all).")
@click.option("--attn-dtype", type=click.Choice(["float32", "float16"]), help="Dump dtype (default float32).")
def attention(prompt, model_path, from_path, chat, layer, head, token_spec, top_k, probe, probe_length, seed,
              html_path, dump_path, attn_layers, attn_heads, attn_dtype):
    """Census of every layer x head for PROMPT, top-k for one token, an HTML picture.

    \b
      minigen attention "The cat sat on the mat. The cat" --model PATH
      minigen attention "..." --layer 3 --head 2 --token -1
      minigen attention "..." --probe induction
      minigen attention --from attn.npz --html attn.html
    """
    from .inspect import dump as D
    from .inspect.html import render_html
    from .inspect.internals import check_layer_head, induction_probe, resolve_token
    from .inspect.report import format_census, format_topk
    from .inspect.stats import census

    if (token_spec is not None) and (layer is None or head is None):
        raise MinigenError("--token needs --layer and --head")
    if prompt is None and from_path is None and probe:  # the probe on its own
        _print_probe(*_inspect_model(model_path), probe_length, seed, attn_layers, attn_heads)
        return
    dump_file = D.DumpFile(dump_path) if dump_path else None   # a bad path fails before any work
    try:
        if dump_file is not None and from_path is not None:
            raise MinigenError("--dump-attention writes a new dump from a PROMPT; with --from the dump exists")
        if dump_file is not None:
            dtype = D.parse_dtype(attn_dtype)
        loaded, ids, layers, heads, tokens, prompt_length, sub = _attention_source(
            prompt, model_path, from_path, chat, attn_layers, attn_heads)
        model = loaded[0] if loaded else None
        if layer is not None or head is not None:
            if model is not None:
                check_layer_head(model.config, layer if layer is not None else 0, head if head is not None else 0)
            _pick(layers, heads, layer if layer is not None else min(layers), head if head is not None else heads[0])
        if dump_file is not None:
            D.check_budget(len(layers), len(heads), len(tokens), dtype)
            meta = D.make_meta(model, tokens, sorted(layers), heads, dtype, None, "attention")
            dump_file.write({l: a.astype(dtype) for l, a in layers.items()}, ids, len(ids), meta)
            click.echo(f"wrote {dump_path}: {len(layers)} layers x {len(heads)} heads x {len(tokens)}x{len(tokens)}", err=True)
        if html_path:
            _write_html(html_path, layers, heads, tokens, prompt_length, sub, layer, head)
        if token_spec is not None:
            i = resolve_token(tokens, token_spec)
            a = _pick(layers, heads, layer, head)
            click.echo(f"layer {layer}, head {head}: where token {i} {tokens[i]!r} looks (top {top_k} of {i + 1} keys)")
            for line in format_topk(a[i], tokens, i, top_k):
                click.echo(line)
            return
        if (html_path or dump_path) and not probe:
            return  # asked for files; --probe (or no file flags) prints the census
        table = census(layers)
        if probe:
            pm = loaded or _inspect_model(model_path or _dump_model_path(from_path))
            _, n, scores = induction_probe(*pm, probe_length, seed)
            table["induction"] = scores[sorted(layers)][:, heads]
        click.echo(f"census of {len(layers)} layers x {len(heads)} heads over {len(tokens)} tokens")
        for line in format_census(table, sorted(layers), heads):
            click.echo(line)
    finally:
        if dump_file is not None:
            dump_file.__exit__(None, None, None)


def _dump_model_path(from_path):
    from .inspect.dump import load_attention
    return load_attention(from_path)["meta"].get("model_path")


def _print_probe(model, tokenizer, probe_length, seed, attn_layers, attn_heads):
    from .inspect import dump as D
    from .inspect.internals import induction_probe
    from .inspect.report import KINDS
    from .inspect.stats import strongest
    c = model.config
    layers = D.parse_selection(attn_layers, c.n_layers, "layer", "--attn-layers")
    heads = D.parse_selection(attn_heads, c.n_heads, "head", "--attn-heads")
    ids, n, scores = induction_probe(model, tokenizer, probe_length, seed)
    scores = scores[layers][:, heads]
    click.echo(f"induction probe: {n} random tokens repeated once ({len(ids)} tokens)")
    click.echo("layer " + " ".join(f"{'h' + str(h):>6}" for h in heads))
    for a, l in enumerate(layers):
        click.echo(f"{l:5d} " + " ".join(f"{s:6.3f}" for s in scores[a]))
    best = strongest(scores, layers, heads, 5)
    click.echo("strongest induction heads: " + "  ".join(f"{l}.{h} {v:.3f}" for l, h, v in best))


def _write_html(path, layers, heads, tokens, prompt_length, subtitle, layer, head):
    from pathlib import Path
    from .inspect.html import render_html
    page = render_html(layers, heads, tokens, prompt_length=prompt_length, subtitle=subtitle,
                       select=(layer if layer is not None else min(layers), head if head is not None else heads[0]))
    from .files import atomic_write
    out = Path(path)
    with atomic_write(out, "HTML page") as tmp:
        tmp.write_text(page, encoding="utf-8")
    click.echo(f"wrote {out} ({len(page) / 2**20:.1f} MiB): open it in a browser", err=True)


@main.command()
@click.argument("prompt", required=False)
@click.option("--model", "model_path", metavar="PATH", help="Checkpoint directory (default: the default model).")
@click.option("--chat", is_flag=True, help="Render the prompt through the chat template first.")
@click.option("--layer", type=int, help="Layer to trace.")
@click.option("--head", type=int, help="Query head to trace.")
@click.option("--token", "token_spec", metavar="I|TEXT", help="Query token (default: the last).")
@click.option("--keys", type=click.IntRange(min=1), default=12, show_default=True,
              help="Keys to print (the largest weights) when the token sees more.")
@click.option("--seeds", is_flag=True, help="Trace the seeds' birds/eat/seeds example instead (no model).")
def trace(prompt, model_path, chat, layer, head, token_spec, keys, seeds):
    """One head's attention for one token, step by step: x, q, keys, scores, softmax, output.

    \b
      minigen trace "The cat sat on the mat" --model PATH --layer 2 --head 1 --token -1
      minigen trace --seeds
    """
    from .inspect.internals import check_layer_head, resolve_token, trace_lines
    if seeds:
        for line in _seeds_lines():
            click.echo(line)
        return
    if prompt is None:
        raise MinigenError("give a PROMPT to trace (or --seeds for the worked example)")
    if layer is None or head is None:
        raise MinigenError("trace needs --layer and --head")
    model, tok = _inspect_model(model_path)
    check_layer_head(model.config, layer, head)
    ids = _prompt_ids(tok, prompt, chat)
    i = resolve_token(tok.token_strings(ids), token_spec)
    lines, ok = trace_lines(model, tok, ids, layer, head, i, limit=keys)
    for line in lines:
        click.echo(line)
    if not ok:
        raise MinigenError("the trace does not match the model's own head output")


def _seeds_lines():
    import numpy as np
    from .inspect.trace import attention_steps, format_steps, format_tables
    X = np.array([[1, 0, 2, 0], [0, 2, 0, 1], [1, 1, 0, 1]])
    W_Q = np.array([[1, 2], [1, 0], [0, 1], [0, 1]])
    W_K = np.array([[1, 0], [0, 1], [1, 0], [1, 0]])
    W_V = np.array([[0, 2], [2, 0], [0, 1], [0, 2]])
    steps = attention_steps(X, W_Q, W_K, W_V)
    labels = ["birds", "eat", "seeds"]
    return format_steps(steps, labels, 0, header="the seeds' example: X, W_Q, W_K, W_V from ../shared/seeds/") + \
        [""] + format_tables(steps, labels)

"""`generate`, `info` and `convert`: parse the flags, call generation/ or checkpoint/ or gguf/, print.

generate's run flags are options.Options' table (`run_options`), shared with chat; text goes to stdout
piece by piece, notes and figures to stderr.
"""
from __future__ import annotations

import os
import sys
import time

import click

from ..errors import MinigenError
from ..generation.options import Options, flags_of, spec, summary
from . import harness
from .harness import Command, figures, load_timed, model_option, progress_bar, read_prompt


def run_flag(f):
    """The click option for one field of options.Options, from its entry in the table."""
    s = spec(f)
    kw = {"help": s.help, "show_default": s.show_default}
    if s.type is None:
        kw["is_flag"] = True
    else:
        kw.update(type=s.type, multiple=s.multiple, default=None if s.multiple else f.default)
    if s.parse is not None:
        kw["callback"] = lambda ctx, param, value: _parsed(s.parse, value, param)
    return click.option(*s.flags, f.name, **kw)


def _parsed(parse, value, param):
    try:
        return tuple(parse(v) for v in value) if isinstance(value, tuple) else None if value is None else parse(value)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=param.opts[-1]) from None


# Options.constraint from four flags (at most one given): pop_constraint turns them into it, before the model loads
CONSTRAINT_FLAGS = (
    click.option("--json-schema", metavar="FILE|JSON",
                 help="The output is JSON valid against this schema (a file, or the schema's JSON text)."),
    click.option("--json-object", is_flag=True, default=None, help="The output is a JSON object (any)."),
    click.option("--regex", metavar="RE", help="The output matches this regular expression, whole."),
    click.option("--grammar", metavar="FILE",
                 help="The output follows this grammar: Lark (llguidance's syntax) or llama.cpp's GBNF."),
)
GRAMMAR_LIMIT = 16 * 1024 * 1024   # bytes of a schema or grammar file


def pop_constraint(flags: dict) -> None:
    """Replace --json-schema / --json-object / --regex / --grammar in `flags` by `constraint`, compiled;
    a usage error naming the flag when it does not compile (or when two are given)."""
    from ..generation import constraint
    given = {k: flags.pop(k) for k in ("json_schema", "json_object", "regex", "grammar")}
    given = {k: v for k, v in given.items() if v is not None}
    if len(given) > 1:
        raise click.UsageError(" and ".join(_flag(k) for k in given) + ": give one constraint, not several")
    if not given:
        return
    (kind, value), = given.items()
    try:
        text = _file_or_text(kind, value)
        flags["constraint"] = constraint.MAKERS[kind](text)
    except (ValueError, MinigenError) as e:
        raise click.BadParameter(str(e), param_hint=f"'{_flag(kind)}'") from None


def _file_or_text(kind: str, value):
    """--grammar is a file; --json-schema a file if one is there, else the schema's text."""
    from ..files import decode_utf8, read_bounded
    if kind == "grammar" or (kind == "json_schema" and os.path.exists(value)):
        return decode_utf8(read_bounded(value, GRAMMAR_LIMIT, kind.replace("_", " ")), value, "the file")
    if kind == "json_schema":
        import json
        try:
            json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"no such file, and not a schema's JSON text ({e.msg} at column {e.colno})") from None
    return value


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def run_options(name: str):
    """A decorator: the flags of every run option that command `name` has (options.flags_of), the
    constraint's (CONSTRAINT_FLAGS), then -q, -v."""
    def add(command):
        for option in reversed([run_flag(f) for f in flags_of(name)] + list(CONSTRAINT_FLAGS) + [
                click.option("-q", "--quiet", is_flag=True, help="No figures on stderr."),
                click.option("-v", "--verbose", is_flag=True, help="Settings before, more figures after.")]):
            command = option(command)
        return command
    return add


@click.command(cls=Command)
@click.argument("prompt", required=False)
@model_option
@click.option("-p", "--prompt", "prompt_opt", help="The prompt; - reads it from stdin.")
@click.option("-f", "--file", type=click.Path(exists=True, dir_okay=False), help="Read the prompt from a file.")
@run_options("generate")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the checkpoint's chat template.")
@click.option("--system", help="System message for --chat (implies --chat).")
@click.option("--dump-attention", "dump_path", metavar="OUT.npz",
              help="Save the run's attention (prompt and generated rows) as .npz: every weight, or with "
                   "--attn-top-k / --attn-queries each row's strongest keys / a window of rows.")
@click.option("--attn-layers", metavar="0,5-7", help="Layers to dump (default all).")
@click.option("--attn-heads", metavar="0-3", help="Heads to dump (default all).")
@click.option("--attn-dtype", type=click.Choice(["float32", "float16"]), help="Dump dtype (default float32).")
@click.option("--attn-top-k", type=click.IntRange(1, 1024), metavar="K",
              help="Dump each row's first token and its K strongest other keys instead of every weight.")
@click.option("--attn-queries", metavar="A-B",
              help="Dump the full rows of queries A..B only (rows: the prompt's tokens, then each generated one).")
@click.option("--attn-verify", is_flag=True, help="Recompute without the cache and check the dumped rows.")
@click.option("--draft-model", "draft_path", metavar="PATH|ID",
              help="Speculative decoding with this small model drafting (it must share the model's tokenizer).")
@click.option("--batch", "batch_file", type=click.Path(exists=True, dir_okay=False),
              help="Generate for every prompt of FILE (one a line, or JSONL objects with a \"prompt\" and options), "
                   "in one batch; JSONL results on stdout in input order.")
@click.option("--logprobs", type=click.IntRange(min=0), metavar="K",
              help="Print each token's log-prob and the K most likely alternatives instead of the text (docs/scores.md).")
@click.option("--logprobs-of", type=click.Choice(["model", "sampled"]), default="model", show_default=True,
              help="--logprobs of the raw model distribution, or of the one sampled from (after the filters).")
@click.option("--json", "as_json", is_flag=True, help="With --logprobs: one JSON object per token, then the figures.")
def generate(prompt, model_path, prompt_opt, file, chat, system, quiet, verbose, draft_path, batch_file, logprobs,
             logprobs_of, as_json, **flags):
    """Generate text from PROMPT and stream it to stdout; figures go to stderr."""
    from ..generation.steps import Run, prompt_ids
    pop_constraint(flags)
    if logprobs is None and (as_json or logprobs_of != "model"):
        raise click.UsageError("--json and --logprobs-of go with --logprobs K")
    if logprobs is not None and (flags.get("dump_path") is not None or batch_file is not None):
        raise click.UsageError("--logprobs goes with neither --dump-attention nor --batch; run them separately")
    dump = pop_dump_options(flags)
    if batch_file is not None:
        if any(x is not None for x in (prompt, prompt_opt, file, dump, draft_path)) or flags.get("prompt_lookup"):
            raise click.UsageError("--batch reads its prompts from the file: no PROMPT, -p, -f, --dump-attention, "
                                   "--draft-model or --prompt-lookup with it")
        sys.exit(generate_batch_file(batch_file, model_path, chat or system is not None, system, quiet, flags))
    draft = load_timed(draft_path) if draft_path is not None else None
    options = Options.of(record_attention=dump is not None,
                         draft_model=(draft.model, draft.tokenizer) if draft else None, **flags)
    text = read_prompt(prompt, prompt_opt, file)
    loaded = load_timed(model_path, renders=chat or system is not None)
    run = Run(loaded.model, loaded.tokenizer, prompt_ids(loaded.tokenizer, text, chat, system), options)
    if dump is not None:
        sys.exit(generate_with_dump(run, loaded.seconds, quiet, verbose, dump))
    if logprobs is not None:  # a way of printing the run, not an option of it: Options stays as it is
        from .scores import print_logprobs_run
        sys.exit(print_logprobs_run(run, loaded.seconds, logprobs, logprobs_of == "sampled", as_json, quiet, verbose))
    sys.exit(print_run(run, loaded.seconds, quiet, verbose))


def print_run(run, load_seconds: float, quiet: bool, verbose: bool) -> int:
    """Stream the text to stdout, piece by piece; notes and figures to stderr. Returns the exit code."""
    if verbose:
        click.echo(f"model: {run.model.path} ({run.model.config.model_type}), prompt: {len(run.prompt)} tokens, "
                   f"{summary(run.options)}", err=True)
    code, last = 0, ""
    try:
        for piece in run.pieces():
            click.echo(piece, nl=False)
            last = piece
    except KeyboardInterrupt:
        code = 130
    if last and not last.endswith("\n"):  # the figures start on a line of their own
        if harness.stdout_is_terminal():
            click.echo()
        elif harness.stdout_is_stderr() and not quiet:  # 2>&1 into a file or pipe: the text on stdout stays
            click.echo(err=True)
    print_end(run.stats, run.options.max_context, "generation stopped", load_seconds, quiet, verbose)
    return code


def print_end(stats, max_context: int, stopped: str, load_seconds: float, quiet: bool, verbose: bool):
    """On stderr: a note if the context filled up (`stopped`: what stopped), then the figures unless quiet."""
    if stats.finish == "context":
        click.echo(f"minigen: note: the context is full ({max_context} tokens); {stopped}", err=True)
    if not quiet:
        click.echo(figures(stats, load_seconds, verbose), err=True)


BATCH = 16   # sequences in one batch at most


def generate_batch_file(path: str, model_path, chat: bool, system, quiet: bool, flags: dict) -> int:
    """`generate --batch FILE`: every prompt of the file, JSONL results on stdout in input order, each as
    soon as it and those before it are done; a progress line on stderr in a terminal."""
    import json
    from ..errors import MinigenError, OptionError
    from ..generation.batch import PromptError, batch_runs
    from .batch_file import read_batch_file
    given = {k: v for k, v in flags.items() if v is not None and v != ()}
    Options.of(**given)   # the flags first: a bad one is a usage error naming it
    prompts, per_prompt, lines = read_batch_file(path)
    for line, o in zip(lines, per_prompt):
        try:
            Options.of(**{**given, **o})
        except OptionError as e:
            if e.option not in o:
                raise
            raise MinigenError(f"{path}:{line}: {e.option}: {e.message}") from None
    loaded = load_timed(model_path, renders=chat)
    tokens, start, written, results = [0], time.perf_counter(), [0], {}
    progress = sys.stderr.isatty() and not quiet

    def on_done(r):
        results[r.index] = r
        while written[0] in results:
            r = results.pop(written[0])
            click.echo(json.dumps({"index": r.index, "text": r.text, "tokens": r.tokens,
                                   "finish_reason": r.finish_reason}, ensure_ascii=False))
            written[0] += 1

    def on_step(i, step):
        tokens[0] += 1
        if progress:
            rate = tokens[0] / (time.perf_counter() - start)
            click.echo(f"\rbatch: {written[0]}/{len(prompts)} written, {tokens[0]} tokens, {rate:.1f} tokens/s ",
                       err=True, nl=False)

    try:
        runs = batch_runs(loaded.model, loaded.tokenizer, prompts, [{**given, **o} for o in per_prompt], chat=chat,
                          system=system, on_step=on_step, on_done=on_done, max_batch=BATCH)
    except KeyboardInterrupt:
        return 130
    except PromptError as e:   # found before any result is written
        raise MinigenError(f"{path}:{lines[e.index]}: {e.message}") from None
    finally:
        if progress:
            click.echo(err=True)
    if not quiet:
        seconds = time.perf_counter() - start
        click.echo(f"==========\nbatch: {len(runs)} prompts, {tokens[0]} tokens in {seconds:.2f} s, "
                   f"{tokens[0] / seconds:.1f} tokens/s (prefill included); load: {loaded.seconds:.2f} s", err=True)
    return 0


def pop_dump_options(flags: dict) -> dict | None:
    """Take generate's --dump-attention flags out of `flags`; check the path before any work."""
    from ..files import check_target
    dump = {k: flags.pop(k) for k in ("dump_path", "attn_layers", "attn_heads", "attn_dtype", "attn_top_k",
                                      "attn_queries", "attn_verify")}
    if dump["dump_path"] is None:
        if any(v for k, v in dump.items() if k != "dump_path"):
            raise click.UsageError("--attn-layers, --attn-heads, --attn-dtype, --attn-top-k, --attn-queries and "
                                   "--attn-verify go with --dump-attention")
        return None
    if dump["attn_top_k"] is not None and dump["attn_queries"] is not None:
        raise click.UsageError("--attn-queries dumps full rows, --attn-top-k every row's strongest keys: choose one")
    if flags["max_tokens"] == 0:
        raise click.UsageError("--dump-attention needs at least one generated token (-n 0 runs no forward pass); "
                               "for the prompt alone: minigen attention PROMPT --dump-attention OUT.npz")
    check_target(dump["dump_path"], "attention dump")
    return dump


def generate_with_dump(run, load_seconds: float, quiet: bool, verbose: bool, dump: dict) -> int:
    """print_run with the attention of every step streamed into the dump; the file is written only if the run ends."""
    from ..inspect.rundump import GenerationDump
    with GenerationDump.for_run(run, dump["dump_path"], dump["attn_layers"], dump["attn_heads"], dump["attn_dtype"],
                                dump["attn_top_k"], dump["attn_queries"]) as d:
        d.attach(run)
        code = print_run(run, load_seconds, quiet, verbose)
        if code != 0:
            click.echo("minigen: interrupted: no attention dump written", err=True)
            return code
        out = d.finish(verify=dump["attn_verify"])
    T = len(out["token_ids"])
    if out["form"] == "rows":
        what = f"full rows of queries {out['queries'][0]}-{out['queries'][1] - 1} of {T}"
    else:
        what = f"{T} rows, each row's top {d.form.top_k} keys" if out["form"] == "top" else \
            f"{T}x{T} {d.form.dtype.name}, lower triangles"
    click.echo(f"attention: wrote {out['path']} ({len(d.layers)} layers x {len(d.heads)} heads x {what}; "
               f"prompt {len(run.prompt)} tokens)", err=True)
    if out["verify"] is not None:
        click.echo(f"attention verify: all {T} rows match an uncached recomputation (max |diff| {out['verify']:.1e})",
                   err=True)
    return 0


@click.command(cls=Command)
@model_option
def info(model_path):
    """What a checkpoint is (and what --model resolved to): architecture, size, dims, heads, context, tokenizer."""
    from ..checkpoint.describe import describe
    loaded = load_timed(model_path, computes=False)
    for name, value in describe(loaded.model, loaded.tokenizer, loaded.resolved.origin):
        click.echo(f"{name + ':':<19}{value}")


@click.command(cls=Command)
@click.argument("source", type=click.Path(exists=True, dir_okay=False))
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
              show_default=True, help="Data type of the written weights.")
def convert(source, out_dir, dtype):
    """Convert a GGUF file (SOURCE) into a Hugging Face checkpoint directory (OUT_DIR).

    Architectures: llama (also Mistral, SmolLM), qwen2, qwen3, gemma, gemma2, gemma3, phi3, gpt2, olmo2
    (also OLMo 3), gptneox, smollm3, granite, granitemoe, mistral3 (Ministral 3's text GGUF). Tensors are dequantised (every type the gguf package reads: F32, F16, BF16, Q4_0 ... Q8_0,
    the K and I quants, ...), llama.cpp's changes to them undone, the tokenizer rebuilt as tokenizer.json, and
    OUT_DIR appears only when the conversion is complete.
    """
    from ..gguf.convert import convert_gguf

    start = time.perf_counter()
    result = convert_gguf(source, out_dir, dtype=dtype, progress=progress_bar())
    click.echo(f"wrote {result.out_dir}: {result.n_tensors} tensors, {result.n_params / 1e6:.1f}M parameters, "
               f"{result.nbytes / 1e6:.0f} MB ({dtype}) in {time.perf_counter() - start:.1f} s", err=True)

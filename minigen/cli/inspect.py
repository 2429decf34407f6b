"""The inspection commands (attention, ablate, experts, patch, lens, dla, trace): each parses its flags, calls
minigen/inspect/commands.py, and prints the result as text (inspect/report.py) or, with --json, as one
JSON object on stdout (fields: docs). Every prompt goes through the one reader (harness.read_prompt)
and the one check (options.check_prompt): the same refusals as generate's.
"""
from __future__ import annotations

import click

from ..errors import MinigenError
from .harness import Command, load_timed, model_option, read_prompt, until_signal


def load(model_path):
    """(model, tokenizer) for --model."""
    loaded = load_timed(model_path)
    return loaded.model, loaded.tokenizer


def prompt_ids(model, tok, text: str, chat: bool) -> list[int]:
    """The prompt's ids (through the chat template with --chat), checked as every run's are."""
    from ..generation.options import check_prompt
    from ..generation.steps import prompt_ids as ids_of
    ids = ids_of(tok, text, chat=chat)
    check_prompt(ids, model, flag=None)
    return ids


def model_and_ids(model_path, prompt, chat):
    if prompt is None:
        raise click.UsageError("give a PROMPT (or - to read stdin)")
    text = read_prompt(prompt)
    model, tok = load(model_path)
    return model, tok, prompt_ids(model, tok, text, chat)


def emit(result: dict, as_json: bool, format_lines):
    """The result as one JSON object, or as the report's lines."""
    from ..inspect.commands import as_json as to_json
    if as_json:
        click.echo(to_json(result))
        return
    for line in format_lines(result):
        click.echo(line)


def shared(fields: str):
    """--model, --chat and --json, which every command on a prompt takes; `fields`: the JSON object's fields,
    for --json's help (docs/inspection.md's table says what each holds)."""
    def options(f):
        f = click.option("--json", "as_json", is_flag=True,
                         help=f"Print the result as one JSON object: command, {fields} (docs/inspection.md, --json).")(f)
        f = click.option("--chat", is_flag=True, help="Render the prompt through the chat template first.")(f)
        return model_option(f)
    return options


JSON_FIELDS = {   # each command's --json fields besides `command`
    "attention": "view (census, top_keys, query_grid, probe or files) and that view's fields",
    "ablate": "components, mode, position, target, top_before, top_after, logp_before, logp_after, delta_logp, kl "
              "(--sweep: sweep, rank, effects)",
    "experts": "n_experts, experts_per_token, normalisation, tokens, layers",
    "patch": "what, position, answer, wrong, logit_diff_clean, logit_diff_corrupted, layers, columns, logit_diff, "
             "restored, clean_tokens, corrupted_tokens",
    "lens": "position, target, rows",
    "dla": "position, target, vs, layers, embed, heads, attn_bias, attn, mlp, norm_bias, total, logit, softcap, "
           "post_norm, capped",
    "trace": "layer, head, query, matches_model, lines, q, keys, scores, scaled, weights, output "
             "(a recurrent layer: mixer; --seeds: seeds)",
}


def usage(message: str | None):
    """A usage error (exit 2) when flags given together do not go together."""
    if message is not None:
        raise click.UsageError(message)


@click.command(cls=Command)
@click.argument("prompt", required=False)
@shared(JSON_FIELDS["attention"])
@click.option("--from", "from_path", metavar="DUMP.npz", help="Inspect a dump made by --dump-attention instead.")
@click.option("--layer", type=int, help="Layer for --token (and the page's first view).")
@click.option("--head", type=int, help="Head for --token (and the page's first view).")
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
@click.option("--html-form", type=click.Choice(["auto", "full", "compact"]),
              help="The page's form: every weight, or each row's strongest keys (default auto: full while it is small).")
@click.option("--serve", is_flag=True, help="Serve the page on 127.0.0.1 with exact rows on demand (Ctrl-C stops it).")
@click.option("--port", type=click.IntRange(0, 65535), help="Port for --serve (default: a free one, printed).")
@click.option("--dump-attention", "dump_path", metavar="OUT.npz", help="Save the prompt's attention as .npz.")
@click.option("--attn-layers", metavar="0,5-7", help="Layers to keep (default all).")
@click.option("--attn-heads", metavar="0-3", help="Heads to keep (default all).")
@click.option("--attn-dtype", type=click.Choice(["float32", "float16"]), help="Dump dtype (default float32).")
@click.option("--attn-top-k", type=click.IntRange(1, 1024), metavar="K",
              help="Dump each row's first token and its K strongest other keys instead of every weight.")
@click.option("--attn-queries", metavar="A-B", help="Dump the full rows of queries A..B only.")
def attention(prompt, model_path, chat, as_json, from_path, layer, head, token_spec, key_spec, top_k,
              value_weighted, exclude_first, probe, probe_length, probe_first, seed, html_path, html_form, serve,
              port, dump_path, attn_layers, attn_heads, attn_dtype, attn_top_k, attn_queries):
    """Census of every layer x head for PROMPT, one query's top keys, one query across the model, a page.

    \b
      minigen attention "The cat sat on the mat. The cat" --model PATH
      minigen attention "..." --layer 3 --head 2 --token -1
      minigen attention "..." --token -1 --key cat          # every layer x head
      minigen attention "..." --value-weighted --exclude-first
      minigen attention --probe induction
      minigen attention "..." --html attn.html              # compact for long prompts
      minigen attention "..." --serve                       # the page, with exact rows on demand
      minigen attention --from attn.npz --html attn.html
    """
    from contextlib import ExitStack
    from ..files import OutputFile
    from ..inspect import patterns as P
    from ..inspect import report as R
    from ..inspect.dump import DumpFile
    from ..inspect.results import as_json as to_json

    ask = P.AttentionAsk(None if prompt is None else read_prompt(prompt), from_path, model_path, chat, layer, head,
                         token_spec, key_spec, top_k, value_weighted, exclude_first, probe, probe_length, probe_first,
                         seed, html_path, dump_path, attn_layers, attn_heads, attn_dtype, attn_top_k, attn_queries,
                         html_form, serve, port)
    usage(ask.conflict())
    if ask.probe_alone:
        model, tok = load(model_path)
        emit(P.probe(model, tok, probe_length, seed, probe_first, attn_layers, attn_heads), as_json, R.format_attention)
        return
    asked = {name for name, on in (("dump", dump_path), ("html", html_path), ("serve", serve)) if on}
    with ExitStack() as files:  # both paths are checked before any work; nothing is left if it fails
        dump = files.enter_context(DumpFile(dump_path)) if dump_path else None
        page = files.enter_context(OutputFile(html_path, "HTML page")) if html_path else None
        src = ask.source(load, lambda model, tok: prompt_ids(model, tok, ask.prompt, chat))
        plan = ask.plan(src, asked)          # sizes and memory: refused here, before the forward pass
        kept = plan.run()
        written = {}
        if dump is not None:
            written["dump"] = P.write_dump(src, plan, dump)
            click.echo(f"wrote {dump_path}: {written['dump']['layers']} layers x {written['dump']['heads']} heads x "
                       f"{len(src.tokens)} tokens ({DUMP_FORMS[written['dump']['form']]})", err=True)
        if page is not None:
            written["html"] = P.write_page(P.render_page(src, plan, layer, head), page)
            click.echo(f"wrote {html_path} ({written['html']['bytes'] / 2**20:.1f} MiB, "
                       f"{plan.parts['page form']}): open it in a browser", err=True)
    if ask.prints_view(asked):
        result = ask.view(src, plan)
        emit({**result, "files": written} if written else result, as_json, R.format_attention)
    elif as_json and written:
        click.echo(to_json({"command": "attention", "view": "files", "files": written}))
    if serve:
        serve_attention(P.render_page(src, plan, layer, head, server={"weights": "weights"}), kept, src, port)


DUMP_FORMS = {"full": "lower triangles", "top": "each row's top keys", "rows": "full rows of the queries asked"}


def serve_attention(page: str, kept, src, port: int | None):
    """`--serve`: the page and its exact rows on 127.0.0.1 until SIGINT or SIGTERM; then exit 0."""
    from ..inspect.server import App, serve
    app = App(page.encode("utf-8"), kept, src.layers, src.heads, len(src.tokens))
    try:
        server = serve(app, port or 0)
    except OSError as e:
        raise MinigenError(f"--serve: cannot listen on 127.0.0.1:{port or 0} ({e.strerror or e})")
    with until_signal() as wait:
        click.echo(f"minigen attention: serving http://127.0.0.1:{server.server_address[1]}/ "
                   f"(exact rows at /weights; Ctrl-C stops it)", err=True)
        try:
            wait()
        finally:
            server.shutdown()
            server.server_close()
            click.echo("minigen attention: stopped", err=True)


@click.command(cls=Command)
@click.argument("prompt", required=False)
@shared(JSON_FIELDS["ablate"])
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
def ablate(prompt, model_path, chat, as_json, heads, attn_layers, mlp_layers, expert, sweep, mode, token_spec,
           target, top_k, rank, top):
    """What happens to the next token when heads or blocks are taken out (zeroed or mean-ablated).

    \b
      minigen ablate "When Mary and John went to the store, John gave a drink to" --heads 18.6,17.4
      minigen ablate "..." --sweep heads --mode mean
      minigen ablate "..." --mlp 0 --attn 29
      minigen ablate "..." --expert 3.5 --model ibm-granite/granite-3.1-1b-a400m-instruct
    """
    from ..inspect import commands as C
    from ..inspect import report as R
    usage("--sweep ablates each part in turn; leave out --heads, --attn, --mlp and --expert"
          if sweep is not None and any((heads, attn_layers, mlp_layers, expert)) else
          "--rank orders a --sweep" if sweep is None and rank != "kl" else
          "an expert is taken out by zeroing what it adds (--mode zero); --mode mean is for heads and blocks"
          if mode == "mean" and (expert or sweep == "experts") else None)
    model, tok, ids = model_and_ids(model_path, prompt, chat)
    if sweep is not None:
        if sweep == "experts":
            from ..inspect.experts import check_moe
            check_moe(model.config, "--sweep experts")
        emit(C.sweep(model, tok, ids, sweep, mode, token_spec, target, rank), as_json, lambda r: R.format_sweep(r, top))
        return
    parts = C.components(model, heads, attn_layers, mlp_layers, expert)
    emit(C.ablate(model, tok, ids, parts, mode, token_spec, target, top_k), as_json, R.format_ablation)


@click.command(cls=Command)
@click.argument("prompt", required=False)
@shared(JSON_FIELDS["experts"])
@click.option("--layers", metavar="LAYERS", help="Layers to report: 0,5-7 (default all).")
def experts(prompt, model_path, chat, as_json, layers):
    """Routed experts: which experts each token of PROMPT went to in each layer, with their weights.

    \b
      minigen experts "The capital of France is" --model ibm-granite/granite-3.1-1b-a400m-instruct
      minigen experts "..." --layers 0,-1 --json
    """
    from ..inspect import commands as C
    from ..inspect import report as R
    model, tok, ids = model_and_ids(model_path, prompt, chat)
    emit(C.routing(model, tok, ids, layers), as_json, R.format_routing)


@click.command(cls=Command)
@click.argument("clean", required=False)
@click.argument("corrupted", required=False)
@shared(JSON_FIELDS["patch"])
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
    texts = read_prompt(clean), read_prompt(corrupted)
    model, tok = load(model_path)
    clean_ids, corrupt_ids = (prompt_ids(model, tok, text, chat) for text in texts)
    emit(C.patch(model, tok, clean_ids, corrupt_ids, answer, wrong, what, token_spec), as_json,
          lambda r: R.format_patch(r, top))


@click.command(cls=Command)
@click.argument("prompt", required=False)
@shared(JSON_FIELDS["lens"])
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
    model, tok, ids = model_and_ids(model_path, prompt, chat)
    emit(C.logit_lens(model, tok, ids, token_spec, top_k, target), as_json, R.format_lens)


@click.command(cls=Command)
@click.argument("prompt", required=False)
@shared(JSON_FIELDS["dla"])
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
    model, tok, ids = model_and_ids(model_path, prompt, chat)
    emit(C.dla(model, tok, ids, token_spec, target, vs), as_json, lambda r: R.format_dla(r, top))


@click.command(cls=Command)
@click.argument("prompt", required=False)
@shared(JSON_FIELDS["trace"])
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
    model, tok, ids = model_and_ids(model_path, prompt, chat)
    result = C.trace(model, tok, ids, layer, head, token_spec, keys)
    emit(result, as_json, lambda r: r["lines"])
    if not result["matches_model"]:
        raise MinigenError("the trace does not match the model's own head output")

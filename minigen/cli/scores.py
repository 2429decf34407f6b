"""`minigen score` and `minigen perplexity`, and `generate --logprobs`'s printing: parse, call
minigen/generation/scores.py, print. Docs: docs/scores.md."""
from __future__ import annotations

import json
import math
import sys
import time

import click

from ..errors import MinigenError

from ..files import MiB, decode_utf8, read_bounded
from .harness import Command, figures, load_timed, model_option, read_prompt

TEXT_LIMIT = 64 * MiB  # bytes of text perplexity reads (wikitext-2's test set is 1.3 MB)


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _num(x: float | None):
    """A log-prob for JSON, rounded to 6 decimals (float32: more digits say nothing); -inf as null."""
    return None if x is None or not math.isfinite(x) else round(float(x), 6)


# --- generate --logprobs K -----------------------------------------------------------------------

def logprob_entry(tokenizer, step, k: int, sampled: bool) -> dict:
    """One generated token as --json prints it: {"token", "id", "logprob", "top": [...]}."""
    lp, top = (step.logprob, step.top_logprobs(k)) if sampled else (step.model_logprob, step.model_top_logprobs(k))
    return {"token": tokenizer.decode([step.token]), "id": step.token, "logprob": _num(lp),
            "top": [{"token": tokenizer.decode([i]), "id": i, "logprob": _num(v)} for i, v in top]}


def logprob_line(entry: dict) -> str:
    alts = ", ".join(f"{json.dumps(t['token'], ensure_ascii=False)} {t['logprob']:.3f}" for t in entry["top"])
    lp = "-inf" if entry["logprob"] is None else f"{entry['logprob']:.4f}"
    return f"{lp:>9}  {json.dumps(entry['token'], ensure_ascii=False):<16} | {alts}"


def print_logprobs_run(run, load_seconds: float, k: int, sampled: bool, as_json: bool, quiet: bool,
                       verbose: bool) -> int:
    """generate --logprobs K: one line (or JSON object) per generated token as it comes, then the figures
    (with --json: one more object, on stdout). The EOS that ends a run is not text, and not listed."""
    steps = []
    run.on_step.append(steps.append)
    code, text = 0, []
    if not as_json:
        click.echo(f"{'logprob':>9}  {'token':<16} | top {k} ({'sampled' if sampled else 'model'} distribution)")
    try:
        for piece in _pieces_with_steps(run, steps):
            if isinstance(piece, str):
                text.append(piece)
                continue
            entry = logprob_entry(run.tokenizer, piece, k, sampled)
            click.echo(_dumps(entry) if as_json else logprob_line(entry))
    except KeyboardInterrupt:
        code = 130
    st = run.stats
    if as_json:
        click.echo(_dumps({"text": "".join(text), "finish": st.finish, "prompt_tokens": st.prompt_tokens,
                           "generated_tokens": st.generated_tokens, "prefill_tps": round(st.prefill_tps, 1),
                           "decode_tps": round(st.decode_tps, 1), "load_seconds": round(load_seconds, 3),
                           "logprobs_of": "sampled" if sampled else "model"}))
    elif not quiet:
        click.echo(figures(st, load_seconds, verbose), err=True)
    return code


def _pieces_with_steps(run, steps: list):
    """Interleave run.pieces()'s text with the Steps (non-EOS) that on_step collected, in order."""
    for piece in run.pieces():
        yield from _drain(steps)
        yield piece
    yield from _drain(steps)


def _drain(steps: list):
    while steps:
        step = steps.pop(0)
        if step.finish != "eos":
            yield step


# --- score ------------------------------------------------------------------------------------------

def _token_row(t, top_k: int) -> str:
    lp = "" if t.logprob is None else f"{t.logprob:9.4f}"
    rank = "" if t.rank is None else str(t.rank)
    alts = ", ".join(f"{json.dumps(s, ensure_ascii=False)} {v:.3f}" for s, v in t.top_text) if top_k else ""
    return f"{lp:>9}  {rank:>6}  {json.dumps(t.text, ensure_ascii=False):<18}" + (f" | {alts}" if alts else "")


def _with_text(tokenizer, tokens):
    for t in tokens:
        t.top_text = [(tokenizer.decode([i]), v) for i, v in t.top]
    return tokens


def _token_json(t) -> dict:
    return {"token": t.text, "id": t.id, "logprob": _num(t.logprob), "rank": t.rank,
            "top": [{"token": s, "id": i, "logprob": _num(v)} for (i, v), (s, _) in zip(t.top, t.top_text)]}


@click.command(cls=Command)
@click.argument("prompt", required=False)
@model_option
@click.option("-f", "--file", type=click.Path(exists=True, dir_okay=False), help="Score this file's text.")
@click.option("--answer", "answers", multiple=True, metavar="TEXT",
              help="Score TEXT as the continuation of PROMPT (repeatable: each answer alone).")
@click.option("-k", "--top-k", type=click.IntRange(min=0), help="Alternatives shown per position "
              "[default: 5 for --answer, 0 for a whole text].")
@click.option("--chat", is_flag=True, help="Render PROMPT through the chat template first (with --answer).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (fields: docs/scores.md).")
def score(prompt, model_path, file, answers, top_k, chat, as_json):
    """Log-probs of a text's tokens, or of answers after a prompt.

    \b
      minigen score "The capital of France is" --answer " Paris" --answer " Lyon"
      minigen score -f article.txt            # every token's log-prob and the text's total
    """
    from ..generation import scores as S
    from ..generation.steps import prompt_ids
    if (prompt is None) == (file is None):
        raise click.UsageError("give the text once: PROMPT (- reads stdin) or -f/--file")
    text = read_prompt(prompt, None, file)
    if chat and not answers:
        raise click.UsageError("--chat renders a prompt for --answer; a whole text is scored as it is")
    loaded = load_timed(model_path)
    model, tok = loaded.model, loaded.tokenizer
    if answers:
        ids = prompt_ids(tok, text, chat=chat)
        k = 5 if top_k is None else top_k
        results = [S.score_answer(model, tok, ids, a, k) for a in answers]
        _print_answers(tok, len(ids), results, k, as_json)
        return
    scored = S.score_ids(model, tok, _text_ids(tok, text), top_k or 0)
    _print_text(tok, scored, top_k or 0, as_json)


def _text_ids(tok, text: str) -> list[int]:
    ids = tok.encode(text)
    if len(ids) < 2:
        raise MinigenError(f"the text is {len(ids)} token(s); scoring needs at least 2 (one to predict from)")
    return ids


def _print_answers(tok, n_prompt: int, results: list[dict], k: int, as_json: bool):
    for r in results:
        _with_text(tok, r["tokens"])
    if as_json:
        click.echo(_dumps({"command": "score", "prompt_tokens": n_prompt, "answers": [
            {"answer": r["answer"], "ids": r["ids"], "logprob": _num(r["logprob"]), "prob": math.exp(r["logprob"]),
             "first_rank": r["first_rank"], "tokens": [_token_json(t) for t in r["tokens"]]} for r in results]}))
        return
    click.echo(f"prompt: {n_prompt} tokens")
    for r in results:
        n = len(r["ids"])
        click.echo(f"\nanswer {json.dumps(r['answer'], ensure_ascii=False)}: log-prob {r['logprob']:.4f} "
                   f"(p = {math.exp(r['logprob']):.4g}), {n} token{'s' * (n != 1)}, rank {r['first_rank']} "
                   f"at the first")
        click.echo(f"{'logprob':>9}  {'rank':>6}  {'token':<18}" + (f" | top {k}" if k else ""))
        for t in r["tokens"]:
            click.echo(_token_row(t, k))


def _print_text(tok, scored, k: int, as_json: bool):
    tokens = _with_text(tok, scored.tokens)
    n = sum(t.logprob is not None for t in tokens)
    if as_json:
        click.echo(_dumps({"command": "score", "tokens": [_token_json(t) for t in tokens],
                           "logprob": _num(scored.total), "scored_tokens": n,
                           "perplexity": math.exp(-scored.total / n)}))
        return
    click.echo(f"{'logprob':>9}  {'rank':>6}  {'token':<18}" + (f" | top {k}" if k else ""))
    for t in tokens:
        click.echo(_token_row(t, k))
    click.echo(f"total: {scored.total:.4f} over {n} tokens (mean {scored.total / n:.4f}, "
               f"perplexity {math.exp(-scored.total / n):.4f}); the first token has no log-prob")


# --- perplexity ------------------------------------------------------------------------------------

@click.command(cls=Command)
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@model_option
@click.option("-c", "--ctx", type=click.IntRange(min=2), default=512, show_default=True,
              help="Tokens per window (at most the model's context).")
@click.option("--stride", type=click.IntRange(min=1),
              help="Sliding windows every STRIDE tokens (the transformers guide) instead of llama-perplexity's chunks.")
@click.option("--chunks", type=click.IntRange(min=1), help="Score only the first N windows (llama-perplexity's --chunks).")
@click.option("--save-logits", "save_path", metavar="OUT",
              help="Keep this model's distributions (top-32 + the rest's mass) for a later --kl-base.")
@click.option("--kl-base", "base_path", type=click.Path(exists=True, dir_okay=False),
              help="Compare with a base model's --save-logits file: KL divergence, top-1 agreement, Δ perplexity.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (fields: docs/scores.md).")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
def perplexity(file, model_path, ctx, stride, chunks, save_path, base_path, as_json, quiet):
    """Perplexity of a text file, window by window, as llama-perplexity computes it (or --stride).

    \b
      minigen perplexity article.txt --ctx 512
      minigen perplexity article.txt --model base.gguf --save-logits base.logits
      minigen perplexity article.txt --model q4.gguf --kl-base base.logits
    """
    from contextlib import ExitStack

    from ..files import OutputFile
    from ..generation import scores as S
    if stride is not None and stride > ctx:
        raise click.BadParameter(f"{stride} is larger than --ctx ({ctx})", param_hint="--stride")
    text = decode_utf8(read_bounded(file, TEXT_LIMIT, "text file"), file, "the text")
    with ExitStack() as stack:
        out = stack.enter_context(OutputFile(save_path, "logits file")) if save_path else None
        base = S.BaseLogits(base_path) if base_path else None
        loaded = load_timed(model_path)
        model, tok = loaded.model, loaded.tokenizer
        if ctx > model.config.max_position_embeddings:
            raise click.BadParameter(f"{ctx} is larger than the model's context ({model.config.max_position_embeddings})",
                                     param_hint="--ctx")
        bos = S.added_bos(tok)
        ids = tok.encode(text)
        f = stack.enter_context(open(out.tmp, "wb")) if out else None
        writer = S.LogitsWriter(f, str(model.path)) if f else None
        bar = None if quiet else ProgressBar(sys.stderr)
        result = S.perplexity(model, ids, ctx, stride, bos, writer, base, bar.update if bar else None, chunks)
        if bar:
            bar.close()
        if f:
            f.close()
            out.commit()
    _print_perplexity(result, file, save_path, as_json)


class ProgressBar:
    """llama-perplexity's running figures on stderr: a bar redrawn in a terminal, a line per window elsewhere."""

    def __init__(self, stream):
        self.stream, self.start = stream, time.perf_counter()
        self.tty = getattr(stream, "isatty", lambda: False)()

    def update(self, p):
        seconds = time.perf_counter() - self.start
        if self.tty:
            done = int(24 * p.window / p.windows)
            self.stream.write(f"\r[{'#' * done}{'.' * (24 - done)}] {p.window}/{p.windows}  "
                              f"PPL {p.ppl:.4f} ± {p.se:.4f}  {seconds:.0f} s")
        else:
            self.stream.write(f"[{p.window}/{p.windows}] PPL {p.ppl:.4f} ± {p.se:.4f} ({p.count} tokens, {seconds:.1f} s)\n")
        self.stream.flush()

    def close(self):
        if self.tty:
            self.stream.write("\n")


def _print_perplexity(r, file: str, save_path: str | None, as_json: bool):
    how = (f"llama-perplexity's method: {r.windows} chunks of {r.n_ctx} tokens, each scored on its second half"
           if r.method == "llama" else
           f"sliding windows of {r.n_ctx} tokens every {r.stride}, each token scored once")
    if as_json:
        out = {"command": "perplexity", "file": file, "method": r.method, "ctx": r.n_ctx, "stride": r.stride,
               "text_tokens": r.n_tokens, "windows": r.windows, "scored_tokens": r.count, "ppl": r.ppl, "ppl_se": r.se,
               "mean_nll": float(r.nll.mean())}
        if save_path:
            out["saved"] = save_path
        if r.kl:
            out["kl"] = r.kl
        click.echo(_dumps(out))
        return
    click.echo(f"perplexity: {r.ppl:.4f} ± {r.se:.4f}  ({how}; {r.count} of {r.n_tokens} tokens scored)")
    if save_path:
        click.echo(f"saved the distributions of {r.count} positions to {save_path}", err=True)
    if r.kl:
        k = {key: (0.0 if isinstance(v, float) and abs(v) < 5e-7 else v) for key, v in r.kl.items()}  # no "-0.000000"
        rows = [
            ("Mean PPL(Q)", f"{k['ppl']:.6f}"), ("Mean PPL(base)", f"{k['ppl_base']:.6f}"),
            ("Mean PPL(Q)/PPL(base)", f"{k['ppl_ratio']:.6f}"), ("Mean PPL(Q)-PPL(base)", f"{k['ppl_diff']:.6f}"),
            ("Mean    KLD", f"{k['kl_mean']:.6f} ± {k['kl_se']:.6f}"), ("Maximum KLD", f"{k['kl_max']:.6f}"),
            ("99.0%   KLD", f"{k['kl_p99']:.6f}"), ("Median  KLD", f"{k['kl_median']:.6f}"),
            ("Same top p", f"{100 * k['same_top']:.3f} ± {100 * k['same_top_se']:.3f} %"),
        ]
        click.echo(f"KL divergence from the base ({k['positions']} positions; KL(base || this model) over the "
                   f"base's top-32 tokens and the rest as one):")
        for name, value in rows:
            click.echo(f"  {name:<22}: {value}")

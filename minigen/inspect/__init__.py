"""Looking inside a model: where attention looks (dumps, census, traces, the HTML page) and what it does
(ablation, activation patching, the logit lens, direct logit attribution).

    args.py       the commands' arguments: layers, heads, positions, tokens, each checked with its flag
    dump.py       the .npz forms (full, top keys, rows): size budget, each form's consumer and arrays, load_attention
    rundump.py    generate --dump-attention: a run's prompt and generated rows streamed into one of those forms
    stats.py      census statistics, detectors (induction, duplicate-token), sink-aware views, on plain arrays
    scan.py       a prompt's attention a few query rows at a time from the forward's own blocks (no map held)
    tiles.py      what is kept of each tile: the census's per-row numbers, top keys, thumbnails, full maps
    patterns.py   the attention command: its sources, the one scan an invocation needs, views, files
    trace.py      one head's arithmetic step by step (the articles' walk-through), pure
    internals.py  running a loaded model part way with model.py's own functions; value norms; the probe
    hooks.py      model.Hooks that keep or change head and block outputs; resuming a forward at a layer
    effects.py    ablation and activation patching
    lens.py       the logit lens and direct logit attribution
    commands.py   what the other inspection commands compute, as plain data (the CLI prints it or dumps JSON)
    results.py    results as plain data: JSON, tokens and positions with their text
    report.py     terminal text for those results
    html.py       the self-contained page, full or compact (page.html is its markup, style and script)
    server.py     `attention --serve`: the page and exact rows on 127.0.0.1

    logit_lens(model, ids)                          -> float32 (n_layers + 1, T, V)
    ablated_logits(model, ids, heads, mode="zero")  -> float32 (T, V); heads: [(layer, head), ...]

May import: engine, text, errors, files, and generation.sampling's log_softmax (one for both).
"""
from .dump import Recorder, load_attention
from .effects import ablated_logits
from .html import render_html
from .lens import direct_attribution, logit_lens
from .stats import census, head_stats, induction_score
from .trace import Steps, attention_steps, format_steps

__all__ = ["logit_lens", "ablated_logits", "direct_attribution", "load_attention", "Recorder", "render_html",
           "census", "head_stats", "induction_score", "attention_steps", "format_steps", "Steps"]

"""Terminal text for the inspection commands' results (commands.py): lists of lines, the CLI prints them."""
from __future__ import annotations

import numpy as np

from ..errors import ranges
from .stats import PROBE_SCORES, STAT_HELP, STATS, strongest

KINDS = [  # (label, statistic, lowest?) for the "strongest heads" summary
    ("attention sinks (mass on token 0)", "sink", False),
    ("previous-token heads", "prev", False),
    ("duplicate-token heads (earlier copies)", "dup", False),
    ("self heads (mass on own position)", "self", False),
    ("focused heads (lowest entropy)", "entropy", True),
    ("broad heads (highest entropy)", "entropy", False),
    ("induction heads (mean weight, probe)", "induction", False),
    ("induction heads (TL detect_head, probe)", "induction_tl", False),
    ("duplicate-token heads (probe)", "duplicate", False),
]


def label(s: str, width: int = 14) -> str:
    s = repr(s)[1:-1]
    return s if len(s) <= width else s[: width - 1] + "…"


def tok(t: dict) -> str:
    """A token for text: its repr, quotes included."""
    return repr(t["text"])


def pct(p: float) -> str:
    return f"{100 * p:.1f}%"


def heads_list(best) -> str:
    return "  ".join(f"{l}.{h} {v:.3f}" for l, h, v in best)


# --- attention ------------------------------------------------------------------------------------------

def format_attention(r: dict) -> list[str]:
    return {"census": format_census, "top_keys": format_top_keys, "query_grid": format_query_grid,
            "probe": format_probe}[r["view"]](r)


def format_census(r: dict, n_best: int = 3) -> list[str]:
    """One line per layer x head, then the strongest heads of each kind, then what each column means."""
    table = {k: np.asarray(v, dtype=np.float64) for k, v in r["stats"].items()}
    if r["probe"]:
        table.update({k: np.asarray(v, dtype=np.float64) for k, v in r["probe"]["scores"].items()})
    cols = [c for c in list(STATS) + ["dup", "sink_raw"] + list(PROBE_SCORES) if c in table]
    layers, heads = r["layers"], r["heads"]
    view = [v for v, on in (("value-weighted |α·v·W_O|, rows renormalised", r["value_weighted"]),
                            ("first token hidden, rows renormalised", r["exclude_first"])) if on]
    out = [f"census of {len(layers)} layers x {len(heads)} heads over {len(r['tokens'])} tokens"
           + (f" ({'; '.join(view)})" if view else "")]
    without = r.get("without_attention") or {}
    for mixer in sorted(set(without.values())):
        out.append(f"layers without attention: {ranges(sorted(l for l, m in without.items() if m == mixer))} ({mixer})")
    widths = [max(9, len(c)) for c in cols]
    out.append("layer head " + " ".join(f"{c:>{w}}" for c, w in zip(cols, widths)))
    for a, l in enumerate(layers):
        for b, h in enumerate(heads):
            out.append(f"{l:5d} {h:4d} " + " ".join(_num(table[c][a, b], w) for c, w in zip(cols, widths)))
    out += ["", "strongest heads (layer.head value):"]
    for name, stat, lowest in KINDS:
        if stat in table and not (stat == "sink" and r["exclude_first"]):
            out.append(f"  {name:42s} " + heads_list(strongest(table[stat], layers, heads, n_best, lowest)))
    out.append("")
    out += [f"  {c:12s} {STAT_HELP[c]}" for c in list(STATS) + ["dup"] if c in table]
    if "sink_raw" in table:
        out.append(f"  {'sink_raw':12s} mass on the first token of the plain attention weights α (before value weighting)")
    if r["exclude_first"]:
        out.append("  with the first token hidden, 'sink' is the mass that hiding removed, and the other columns "
                   "average over queries 2..T-1 whose rows had anything left")
    if r["probe"]:
        p = r["probe"]
        out.append(f"  probe: {p['length']} random tokens repeated once after "
                   + (" ".join(repr(t["text"]) for t in p["prefix"]) if p["prefix"] else "nothing") + ":")
        out += [f"  {c:12s} {PROBE_SCORES[c]}" for c in PROBE_SCORES if c in table]
    out.append("  (each averaged over query tokens 1..T-1 unless said; token 0 can only attend to itself)")
    return out


def _num(v: float, width: int) -> str:
    return f"{'-':>{width}}" if not np.isfinite(v) else f"{v:{width}.3f}"


def format_probe(r: dict) -> list[str]:
    prefix = " ".join(repr(t["text"]) for t in r["prefix"]) or "nothing"
    out = [f"induction probe: {r['length']} random tokens (seed {r['seed']}) repeated once, after {prefix} "
           f"({len(r['token_ids'])} tokens)"]
    for name, scores in r["scores"].items():
        s = np.asarray(scores, dtype=np.float64)
        out += ["", f"{name}: {r['descriptions'][name]}"]
        out += grid_lines(s, r["layers"], [f"h{h}" for h in r["heads"]], lambda v: f"{v:.3f}")
        out.append(f"strongest: {heads_list(strongest(s, r['layers'], r['heads'], 5))}")
    return out


def format_top_keys(r: dict, width: int = 40) -> list[str]:
    """Bar chart of the largest weights of one query row."""
    q, n, k = r["query"], r["n_keys"], len(r["keys"])
    view = f" [{', '.join(r['transforms'])}]" if r["transforms"] else ""
    shown = f"all {n} keys" if k == n else f"top {k} of {n} keys"
    out = [f"layer {r['layer']}, head {r['head']}: where token {q['index']} {q['text']!r} looks ({shown}){view}"]
    w = max(len(repr(label(key["text"]))) for key in r["keys"]) + 2
    for key in r["keys"]:
        out.append(f"  {key['index']:5d} {repr(label(key['text'])).ljust(w)} {100 * key['weight']:6.2f}%  {bar(key['weight'], width)}".rstrip())
    if k < n:
        out.append(f"  {'':5s} {'(others)'.ljust(w)} {100 * r['others']:6.2f}%")
    return out


def bar(w: float, width: int = 40) -> str:
    n = max(0.0, w) * width
    return "█" * int(n) + ("▌" if n - int(n) >= 0.5 else "")


def format_query_grid(r: dict) -> list[str]:
    q, k = r["query"], r["key"]
    w = np.asarray(r["weights"], dtype=np.float64)
    view = f" [{', '.join(r['transforms'])}]" if r["transforms"] else ""
    out = [f"weight of query {q['index']} {q['text']!r} on key {k['index']} {k['text']!r}, every layer x head, "
           f"in %{view}"]
    out += grid_lines(100 * w, r["layers"], [f"h{h}" for h in r["heads"]], lambda v: f"{v:.1f}")
    out.append("largest: " + "  ".join(f"{l}.{h} {100 * v:.1f}%" for l, h, v in strongest(w, r["layers"], r["heads"], 5)))
    return out


def grid_lines(values: np.ndarray, rows: list, columns: list[str], fmt, width: int = 6,
               row_name: str = "layer") -> list[str]:
    out = [f"{row_name:>5} " + " ".join(f"{c:>{width}}" for c in columns)]
    for name, row in zip(rows, values):
        out.append(f"{str(name):>5} " + " ".join(f"{fmt(v) if np.isfinite(v) else '-':>{width}}" for v in row))
    return out


# --- ablation, patching, lens, DLA ----------------------------------------------------------------------

def top_line(tops: list[dict]) -> str:
    return "  ".join(f"{tok(t)} {pct(t['p'])}" for t in tops)


def format_ablation(r: dict) -> list[str]:
    names = ", ".join(c["name"] for c in r["components"])
    pos, t = r["position"], r["target"]
    return [f"ablated ({r['mode']}): {names}, at every position; effect on the next token after "
            f"{pos['index']} {pos['text']!r}",
            f"  before: {top_line(r['top_before'])}",
            f"  after:  {top_line(r['top_after'])}",
            f"  log p({t['text']!r}): {r['logp_before']:.3f} -> {r['logp_after']:.3f} "
            f"(change {r['delta_logp']:+.3f}; p {pct(np.exp(r['logp_before']))} -> {pct(np.exp(r['logp_after']))})",
            f"  KL(before || after) = {r['kl']:.4f} nats"]


def format_sweep(r: dict, top: int) -> list[str]:
    pos, t = r["position"], r["target"]
    what = {"heads": "each head", "attn": "each layer's attention block", "mlp": "each layer's MLP",
            "experts": "each routed expert"}[r["sweep"]]
    order = "KL(before || after)" if r["rank"] == "kl" else f"the drop in log p({t['text']!r})"
    out = [f"ablating {what} in turn ({r['mode']}), ranked by {order}; next token after {pos['index']} {pos['text']!r}",
           f"  before: {top_line(r['top_before'])}   log p({t['text']!r}) = {r['logp_before']:.3f}",
           None]
    width = max([8] + [len(e["name"]) for e in r["effects"][:top]])
    out[-1] = f"  {'rank':>4} {'L.H' if r['sweep'] == 'heads' else 'block':>{width}} {'KL':>8} {'Δ log p':>8}   top token after"
    for n, e in enumerate(r["effects"][:top], 1):
        out.append(f"  {n:4d} {e['name']:>{width}} {e['kl']:8.4f} {e['delta_logp']:+8.3f}   {tok(e['top_after'])} "
                   f"{pct(e['top_after']['p'])}")
    if len(r["effects"]) > top:
        out.append(f"  ... {len(r['effects']) - top} more (--top N, or --json for all)")
    return out


def whole(v: float) -> str:
    """A rounded number without a minus sign on zero."""
    return str(int(round(v)))


def format_patch(r: dict, top: int) -> list[str]:
    a, w, pos = r["answer"], r["wrong"], r["position"]
    restored = np.asarray(r["restored"], dtype=np.float64)
    ld = f"logit({a['text']!r}) - logit({w['text']!r})"
    out = [f"{ld} at {pos['index']} {pos['text']!r}: clean {r['logit_diff_clean']:+.3f}, "
           f"corrupted {r['logit_diff_corrupted']:+.3f}",
           "restored = (patched - corrupted) / (clean - corrupted), in %"]
    if r["what"] == "heads":
        out.insert(1, "patching each head's output (before the output projection, every position) from the clean "
                      "run into the corrupted run")
        cols = [f"h{c['head']}" for c in r["columns"]]
        out += grid_lines(100 * restored, r["layers"], cols, whole, width=5)
        flat = [(l, h, restored[l, h]) for l in r["layers"] for h in range(restored.shape[1])]
        flat.sort(key=lambda x: -abs(x[2]))
        out.append("largest: " + "  ".join(f"{l}.{h} {100 * v:+.1f}%" for l, h, v in flat[:top]))
        return out
    block = {"resid": "the residual stream entering each layer", "attn": "each layer's attention output",
             "mlp": "each layer's MLP output"}[r["what"]]
    out.insert(1, f"patching {block} at one position at a time from the clean run into the corrupted run")
    diff = [c["index"] for c in r["columns"] if c["clean"] != c["corrupted"]]
    out += grid_lines(100 * restored, r["layers"], [str(c["index"]) for c in r["columns"]], whole, width=4)
    out.append("positions: " + "  ".join(
        f"{c['index']} {c['clean']!r}" + (f"/{c['corrupted']!r}" if c["index"] in diff else "") for c in r["columns"]))
    return out


def format_lens(r: dict) -> list[str]:
    pos, t = r["position"], r["target"]
    k = len(r["rows"][0]["top"])
    out = [f"logit lens at token {pos['index']} {pos['text']!r}: the residual stream after each layer through the "
           f"final norm and lm_head; rank and probability of {t['text']!r}, then the top {k}",
           f"{'layer':>5} {'rank':>6} {'p':>7}   top {k}"]
    for row in r["rows"]:
        tops = "  ".join(f"{quoted(x['text'], 10)} {prob(x['p'])}" for x in row["top"])
        out.append(f"{row['name']:>5} {row['target_rank']:6d} {prob(row['target_p']):>7}   {tops}")
    return out


def quoted(text: str, width: int = 14) -> str:
    """A token between quotes, escaped once, cut to `width`."""
    return "'" + label(text, width) + "'"


def prob(p: float) -> str:
    return f"{100 * p:.1f}%" if p >= 0.001 else f"{p:.0e}"


def format_dla(r: dict, top: int) -> list[str]:
    t, v, pos = r["target"], r["vs"], r["position"]
    what = f"logit({t['text']!r})" + (f" - logit({v['text']!r})" if v else "")
    heads = np.asarray(r["heads"], dtype=np.float64)
    frozen = "the final norm's scale" + (" and each attn_post_norm's" if r["post_norm"] else "")
    out = [f"direct logit attribution of {what} at token {pos['index']} {pos['text']!r} ({frozen} frozen at "
           f"this prompt's values)",
           f"  embeddings {r['embed']:+.3f}" + (f", final norm bias {r['norm_bias']:+.3f}" if r["norm_bias"] else ""),
           f"{'layer':>5} {'attn':>8} {'mlp':>8}   each head (attn = the heads + the output bias)"]
    for l in r["layers"]:
        out.append(f"{l:5d} {r['attn'][l]:+8.3f} {r['mlp'][l]:+8.3f}   "
                   + " ".join(f"{x:+6.2f}" for x in heads[l]))
    flat = sorted(((l, h, heads[l, h]) for l in r["layers"] for h in range(heads.shape[1])), key=lambda x: -abs(x[2]))
    out.append("largest heads: " + "  ".join(f"{l}.{h} {x:+.3f}" for l, h, x in flat[:top]))
    cap = f"; after the final soft-cap ({r['softcap']:g}) the model's value is {r['capped']:+.3f}" if r["softcap"] else ""
    out.append(f"sum of the parts {r['total']:+.4f} = the model's {what} {r['logit']:+.4f} before any soft-cap{cap}")
    return out


def format_routing(r: dict) -> list[str]:
    """Per layer: each token's experts, best first, with their weights; then how many tokens each expert got."""
    out = [f"routed experts: {r['experts_per_token']} of {r['n_experts']} per token "
           f"({r['normalisation']}), {len(r['tokens'])} tokens"]
    for layer in r["layers"]:
        out.append(f"layer {layer['layer']}")
        for route in layer["routes"]:
            t = route["token"]
            chosen = "  ".join(f"e{x['expert']:<3d} {x['weight']:.3f}" for x in route["experts"])
            out.append(f"  {t['index']:4d} {quoted(t['text'])}  {chosen}")
        load = layer["load"]
        out.append("  tokens per expert: " + " ".join(f"e{e}:{n}" for e, n in enumerate(load) if n) +
                   (f"  (unused: {', '.join(f'e{e}' for e, n in enumerate(load) if not n)})" if min(load) == 0 else ""))
    return out

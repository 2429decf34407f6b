"""What each inspection command computes, as plain data: the CLI parses flags, calls one function here,
and prints the result as text (report.py) or as JSON (`--json`, `as_json`). Every result is a dict of
JSON types whose fields the README documents; token ids come with their text ({"id", "text"}), positions
in the prompt with theirs ({"index", "text"}).

The `attention` command reads patterns from a prompt run now or from a dump (`Source`), optionally
transforms them (value-weighted, first token hidden), and shows one view of them: the census, one query's
top keys for one head, or one query's weight on one key across every layer and head.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

import numpy as np

from ..errors import MinigenError
from ..files import OutputFile
from . import dump as D
from . import effects, experts, lens, stats
from .html import render_html
from .internals import (check_layer_head, induction_probe, prompt_attention, resolve_token, trace_lines,
                        value_norms, vocab_token)


# --- JSON ------------------------------------------------------------------------------------------------

def as_json(result: dict) -> str:
    """The result as JSON text: NumPy arrays and scalars as lists and numbers, NaN as null."""
    return json.dumps(_plain(result), ensure_ascii=False)


def _plain(x):
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return None if not math.isfinite(float(x)) else float(x)
    return x


def token_json(tok, i: int) -> dict:
    return {"id": int(i), "text": _text(tok, i)}


def _text(tok, i: int) -> str:
    return tok.token_strings([int(i)])[0] if int(i) < tok.vocab_size else f"<id {int(i)}>"


def position_json(tokens: list[str], i: int) -> dict:
    return {"index": int(i), "text": tokens[i]}


def _with_text(tok, items: list[dict]) -> list[dict]:
    return [{**t, "text": _text(tok, t["id"])} for t in items]


# --- attention patterns: where they come from -------------------------------------------------------------

@dataclass
class Source:
    """Attention patterns to look at: {layer: (n_heads_kept, T, T)} over `tokens`, with what made them."""
    layers: dict
    heads: list[int]
    tokens: list[str]
    ids: np.ndarray
    prompt_length: int | None     # set for generation dumps: rows from there on are generated tokens
    subtitle: str
    model: object | None = None   # needed by the value-weighted view and the probe
    tokenizer: object | None = None
    norms: dict | None = None     # {layer: (n_heads_kept, T)} ‖v_j W_O‖, once computed
    view: tuple = ()              # transformations applied: "value-weighted", "first token hidden"


def from_prompt(model, tok, ids, attn_layers: str | None, attn_heads: str | None) -> Source:
    c = model.config
    layers = D.parse_selection(attn_layers, c.n_layers, "layer", "--attn-layers")
    heads = D.parse_selection(attn_heads, c.n_heads, "head", "--attn-heads")
    record = prompt_attention(model, ids)
    return Source({l: record[l][heads] for l in layers}, heads, tok.token_strings(ids), np.asarray(ids), None,
                  str(model.path), model, tok)


def from_dump(path, attn_layers: str | None, attn_heads: str | None) -> Source:
    """A dump, with --attn-layers and --attn-heads choosing among what it holds."""
    d = D.load_attention(path)
    m = d["meta"]
    layers, heads = d["layers"], list(d["heads"])
    keep_l = _kept(attn_layers, m.get("n_layers", max(layers) + 1), sorted(layers), "layer", "--attn-layers", path)
    keep_h = _kept(attn_heads, m.get("n_heads", max(heads) + 1), heads, "head", "--attn-heads", path)
    rows = [heads.index(h) for h in keep_h]
    tokens = m.get("tokens") or [str(i) for i in d["token_ids"]]
    return Source({l: layers[l][rows] for l in keep_l}, keep_h, tokens, d["token_ids"], d["prompt_length"],
                  f"{m.get('model_path', '?')} · from {path}")


def dump_model_path(path) -> str | None:
    """The checkpoint a dump was made with, as its meta records it."""
    return D.load_attention(path)["meta"].get("model_path")


def _kept(text, n: int, present: list[int], what: str, flag: str, path) -> list[int]:
    if text is None:
        return present
    keep = D.parse_selection(text, n, what, flag)
    missing = [i for i in keep if i not in present]
    if missing:
        raise MinigenError(f"{flag}: {what} {missing[0]} is not in {path} (it has {D.ranges(present)})")
    return keep


def with_model(src: Source, model, tok) -> Source:
    """A dump's patterns joined with the model that made them (checked as far as a dump allows: its layers,
    heads and token ids must exist in the model)."""
    c = model.config
    if max(src.layers) >= c.n_layers or max(src.heads) >= c.n_heads or int(np.max(src.ids)) >= c.vocab_size:
        raise MinigenError(f"{model.path} does not fit this dump ({c.n_layers} layers, {c.n_heads} heads, "
                           f"vocabulary {c.vocab_size}); give the model that made it with --model")
    return replace(src, model=model, tokenizer=tok)


def value_weighted(src: Source) -> Source:
    """The patterns as value-weighted attention: α_ij ‖v_j W_O‖, rows renormalised (stats.value_weighted)."""
    src = with_norms(src)
    layers = {l: stats.value_weighted(a, src.norms[l]) for l, a in src.layers.items()}
    return replace(src, layers=layers, view=src.view + ("value-weighted",))


def with_norms(src: Source) -> Source:
    if src.norms is not None:
        return src
    if src.model is None:
        raise MinigenError("the value-weighted view needs the model (--model PATH)")
    norms = value_norms(src.model, src.ids)                                  # (L, H, T)
    return replace(src, norms={l: norms[l][src.heads] for l in src.layers})


def first_hidden(src: Source) -> Source:
    layers = {l: stats.hide_first(a) for l, a in src.layers.items()}
    return replace(src, layers=layers, view=src.view + ("first token hidden",))


# --- attention views ------------------------------------------------------------------------------------

def census(src: Source, exclude_first: bool = False, probed: dict | None = None) -> dict:
    """The census of every kept layer x head; with `probed` (internals.induction_probe), its scores too."""
    if len(src.tokens) < (3 if exclude_first else 2):
        raise MinigenError(f"the census needs at least {3 if exclude_first else 2} tokens "
                           f"(the first can only look at itself); this has {len(src.tokens)}")
    layers = sorted(src.layers)
    probe_part = None
    if probed is not None:
        probe_part = {"length": probed["n"], "prefix": [token_json(src.tokenizer, i) for i in probed["prefix"]], "descriptions": stats.PROBE_SCORES,
                      "scores": {k: v[layers][:, src.heads] for k, v in probed["scores"].items()}}
    return {"command": "attention", "view": "census", "source": src.subtitle, "tokens": src.tokens,
            "token_ids": src.ids, "layers": layers, "heads": src.heads, "exclude_first": exclude_first,
            "value_weighted": "value-weighted" in src.view, "stats": stats.census(src.layers, src.ids, exclude_first),
            "probe": probe_part}


def attention_census(src: Source, exclude_first: bool, weighted: bool, probed: dict | None) -> dict:
    """The census of the raw patterns, or of the value-weighted ones beside the raw sink column."""
    if not weighted:
        return census(src, exclude_first, probed)
    out = census(value_weighted(src), exclude_first, probed)
    out["stats"]["sink_raw"] = stats.census(src.layers)["sink"]
    return out


def attention_view(src: Source, layer: int | None, head: int | None, token: str | None, key: str | None, k: int,
                   weighted: bool, exclude_first: bool, probed: dict | None) -> dict:
    """What `minigen attention` shows: one query's top keys for one head (token, layer, head), one query's
    weight on one key in every layer and head (token, key), or else the census."""
    if token is None:
        return attention_census(src, exclude_first, weighted, probed)
    view = value_weighted(src) if weighted else src
    view = first_hidden(view) if exclude_first else view
    return query_grid(view, token, key) if key is not None else top_keys(view, layer, head, token, k)


def top_keys(src: Source, layer: int, head: int, token: str, k: int) -> dict:
    a = pattern(src, layer, head)
    i = resolve_token(src.tokens, token)
    row = np.asarray(a[i, :i + 1], dtype=np.float64)
    order = np.argsort(-row, kind="stable")[:k]
    return {"command": "attention", "view": "top_keys", "layer": layer, "head": head, "transforms": list(src.view),
            "query": position_json(src.tokens, i), "n_keys": i + 1,
            "keys": [{**position_json(src.tokens, j), "weight": float(row[j])} for j in order],
            "others": 0.0 if len(order) == len(row) else float(max(0.0, 1.0 - row[order].sum()))}


def query_grid(src: Source, token: str, key: str) -> dict:
    """One query's weight on one key in every kept layer and head."""
    i = resolve_token(src.tokens, token)
    j = resolve_token(src.tokens[:i + 1], key, "--key")
    layers = sorted(src.layers)
    return {"command": "attention", "view": "query_grid", "transforms": list(src.view),
            "query": position_json(src.tokens, i), "key": position_json(src.tokens, j),
            "layers": layers, "heads": src.heads, "weights": np.stack([src.layers[l][:, i, j] for l in layers])}


def pattern(src: Source, layer: int, head: int) -> np.ndarray:
    """One head's (T, T) pattern by model numbering; an error naming what the source holds otherwise."""
    if src.model is not None:
        check_layer_head(src.model.config, layer, head)
    if layer not in src.layers:
        raise MinigenError(f"--layer {layer} out of range (available: {D.ranges(sorted(src.layers))})")
    if head not in src.heads:
        raise MinigenError(f"--head {head} out of range (available: {D.ranges(src.heads)})")
    return src.layers[layer][src.heads.index(head)]


def probe(model, tok, length: int | None, seed: int, first: str | None, attn_layers: str | None = None,
          attn_heads: str | None = None) -> dict:
    """The induction probe: prefix + r + r, every score of stats.PROBE_SCORES, for the kept layers and heads."""
    c = model.config
    layers = D.parse_selection(attn_layers, c.n_layers, "layer", "--attn-layers")
    heads = D.parse_selection(attn_heads, c.n_heads, "head", "--attn-heads")
    p = induction_probe(model, tok, length, seed, first)
    return {"command": "attention", "view": "probe", "length": p["n"], "seed": seed,
            "prefix": [token_json(tok, i) for i in p["prefix"]], "token_ids": p["ids"], "layers": layers,
            "heads": heads, "scores": {k: v[layers][:, heads] for k, v in p["scores"].items()},
            "descriptions": stats.PROBE_SCORES}


def write_dump(src: Source, out: D.DumpFile, dtype: str | None) -> dict:
    dt = D.parse_dtype(dtype)
    D.check_budget(len(src.layers), len(src.heads), len(src.tokens), dt)
    meta = D.make_meta(src.model, src.tokens, sorted(src.layers), src.heads, dt, None, "attention")
    out.write({l: a.astype(dt) for l, a in src.layers.items()}, src.ids, len(src.ids), meta)
    return {"path": str(out.path), "layers": len(src.layers), "heads": len(src.heads), "tokens": len(src.tokens)}


def write_html(src: Source, out: OutputFile, layer: int | None, head: int | None) -> dict:
    select = (layer if layer is not None else min(src.layers), head if head is not None else src.heads[0])
    norms = with_norms(src).norms if src.model is not None else None
    page = render_html(src.layers, src.heads, src.tokens, prompt_length=src.prompt_length, subtitle=src.subtitle,
                       select=select, value_norms=norms)
    out.tmp.write_text(page, encoding="utf-8")
    out.commit()
    return {"path": str(out.path), "bytes": len(page.encode("utf-8"))}


# --- what heads do ----------------------------------------------------------------------------------------

def _position(tok, ids, spec) -> int:
    return resolve_token(tok.token_strings(ids), spec)


def _target(tok, model, spec: str | None, flag: str) -> int | None:
    return None if spec is None else vocab_token(tok, spec, flag, model.config.vocab_size)


def components(model, heads: str | None, attn: str | None, mlp: str | None,
               expert: str | None = None) -> list[effects.Component]:
    c = model.config
    out = effects.parse_heads(heads, c) if heads else []
    for kind, text, flag in (("attn", attn, "--attn"), ("mlp", mlp, "--mlp")):
        if text:
            out += [effects.Component(kind, l) for l in D.parse_selection(text, c.n_layers, "layer", flag)]
    if expert:
        out += [effects.Component("expert", l, e) for l, e in experts.parse_experts(expert, c)]
    if not out:
        raise MinigenError("nothing to ablate: give --heads 18.6,17.4, --attn LAYERS, --mlp LAYERS or --expert L.E "
                           "(or --sweep)")
    return out


def ablate(model, tok, ids, parts: list[effects.Component], mode: str, token: str | None, target: str | None,
           k: int) -> dict:
    p = _position(tok, ids, token)
    r = effects.ablation(model, ids, parts, mode, p, _target(tok, model, target, "--target"), k)
    return {"command": "ablate", **r, "position": position_json(tok.token_strings(ids), p),
            "target": token_json(tok, r["target"]), "top_before": _with_text(tok, r["top_before"]),
            "top_after": _with_text(tok, r["top_after"])}


def sweep(model, tok, ids, kind: str, mode: str, token: str | None, target: str | None, rank: str = "kl") -> dict:
    p = _position(tok, ids, token)
    r = effects.sweep(model, ids, kind, mode, p, _target(tok, model, target, "--target"))
    key = (lambda e: -e["kl"]) if rank == "kl" else (lambda e: e["delta_logp"])
    ranked = sorted(r["effects"], key=key)
    return {"command": "ablate", **r, "sweep": kind, "rank": rank,
            "position": position_json(tok.token_strings(ids), p), "target": token_json(tok, r["target"]),
            "top_before": _with_text(tok, r["top_before"]),
            "effects": [{**e, "top_after": _with_text(tok, [e["top_after"]])[0]} for e in ranked]}


def patch(model, tok, clean_ids, corrupt_ids, answer: str | None, wrong: str | None, what: str,
          token: str | None) -> dict:
    tokens_c, tokens_r = tok.token_strings(clean_ids), tok.token_strings(corrupt_ids)
    if len(clean_ids) != len(corrupt_ids):
        raise MinigenError(f"the clean prompt is {len(clean_ids)} tokens and the corrupted one {len(corrupt_ids)}: "
                           f"patching needs the same length (positions are patched one for one)")
    p = _position(tok, clean_ids, token)
    a = _target(tok, model, answer, "--answer")
    w = _target(tok, model, wrong, "--wrong")
    if a is None or w is None:  # default: what each prompt predicts
        a = int(np.argmax(model.forward(clean_ids, model.make_cache(len(clean_ids)))[p])) if a is None else a
        w = int(np.argmax(model.forward(corrupt_ids, model.make_cache(len(corrupt_ids)))[p])) if w is None else w
    if a == w:
        raise MinigenError(f"--answer and --wrong are the same token ({_text(tok, a)!r}); the logit difference "
                           f"would be 0 in every run")
    r = effects.patching(model, clean_ids, corrupt_ids, a, w, what, p)
    columns = ([{"head": h} for h in range(model.config.n_heads)] if what == "heads" else
               [{"index": q, "clean": tokens_c[q], "corrupted": tokens_r[q]} for q in range(len(tokens_c))])
    return {"command": "patch", **r, "position": position_json(tokens_c, p), "answer": token_json(tok, a),
            "wrong": token_json(tok, w), "clean_tokens": tokens_c, "corrupted_tokens": tokens_r,
            "layers": list(range(model.config.n_layers)), "columns": columns}


def logit_lens(model, tok, ids, token: str | None, k: int, target: str | None) -> dict:
    p = _position(tok, ids, token)
    r = lens.lens_at(model, ids, p, k, _target(tok, model, target, "--target"))
    rows = [{**row, "top": _with_text(tok, row["top"])} for row in r["rows"]]
    return {"command": "lens", "position": position_json(tok.token_strings(ids), p),
            "target": token_json(tok, r["target"]), "rows": rows}


def dla(model, tok, ids, token: str | None, target: str | None, vs: str | None) -> dict:
    p = _position(tok, ids, token)
    t = _target(tok, model, target, "--target")
    if t is None:
        t = int(np.argmax(model.forward(ids, model.make_cache(len(ids)))[p]))
    v = _target(tok, model, vs, "--vs")
    r = lens.direct_attribution(model, ids, p, t, v)
    return {"command": "dla", **r, "position": position_json(tok.token_strings(ids), p), "target": token_json(tok, t),
            "vs": None if v is None else token_json(tok, v), "layers": list(range(model.config.n_layers))}


def trace(model, tok, ids, layer: int, head: int, token: str | None, keys: int) -> dict:
    check_layer_head(model.config, layer, head)
    i = resolve_token(tok.token_strings(ids), token)
    lines, ok, steps = trace_lines(model, tok, ids, layer, head, i, limit=keys)
    return {"command": "trace", "layer": layer, "head": head, "query": position_json(tok.token_strings(ids), i),
            "matches_model": ok, "lines": lines,
            "q": steps.q[i], "keys": [position_json(tok.token_strings(ids), j) for j in range(i + 1)],
            "scores": steps.scores[i, :i + 1], "scaled": steps.scaled[i, :i + 1],
            "weights": steps.weights[i, :i + 1], "output": steps.out[i]}


# --- routed experts ------------------------------------------------------------------------------------------

def routing(model, tok, ids, layers: str | None = None) -> dict:
    """Which experts each token went to in each (selected) layer, with weights, and each expert's load."""
    c = model.config
    experts.check_moe(c, "experts")
    keep = D.parse_selection(layers, c.n_layers, "layer", "--layers")
    tokens = tok.token_strings(ids)
    rows = [r for r in experts.routing(model, ids) if r["layer"] in keep]
    return {"command": "experts", "n_experts": c.n_experts, "experts_per_token": c.experts_per_token,
            "normalisation": c.router, "tokens": [token_json(tok, i) for i in ids],
            "layers": [{"layer": r["layer"], "load": r["load"],
                        "routes": [{"token": position_json(tokens, t),
                                    "experts": [{"expert": int(e), "weight": float(w)}
                                                for e, w in zip(r["experts"][t], r["weights"][t])]}
                                   for t in range(len(ids))]} for r in rows]}

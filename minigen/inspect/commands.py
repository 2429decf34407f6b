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

from ..engine.mixers import has_attention
from ..errors import MinigenError, ranges
from ..files import OutputFile
from . import dump as D
from . import effects, experts, lens, stats
from .html import render_html
from .args import attention_selection, expert_items, head_items, layer_head, position, selection, vocab_token
from .recurrent import trace_recurrent
from .internals import induction_probe, prompt_attention, trace_lines, value_norms


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
    layers = attention_selection(attn_layers, c)
    heads = selection(attn_heads, c.n_heads, "head", "--attn-heads")
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
    keep = selection(text, n, what, flag)
    missing = [i for i in keep if i not in present]
    if missing:
        raise MinigenError(f"{flag}: {what} {missing[0]} is not in {path} (it has {ranges(present)})")
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
    cfg = src.model.config if src.model is not None else None
    without = {} if cfg is None else {l: cfg.mixer(l) for l in range(cfg.n_layers) if not has_attention(cfg, l)}
    return {"command": "attention", "view": "census", "source": src.subtitle, "tokens": src.tokens,
            "token_ids": src.ids, "layers": layers, "heads": src.heads, "exclude_first": exclude_first,
            "without_attention": without,   # hybrids: layer -> its token mixer (Gated DeltaNet, short conv, Mamba2)
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
    i = position(src.tokens, token)
    row = np.asarray(a[i, :i + 1], dtype=np.float64)
    order = np.argsort(-row, kind="stable")[:k]
    return {"command": "attention", "view": "top_keys", "layer": layer, "head": head, "transforms": list(src.view),
            "query": position_json(src.tokens, i), "n_keys": i + 1,
            "keys": [{**position_json(src.tokens, j), "weight": float(row[j])} for j in order],
            "others": 0.0 if len(order) == len(row) else float(max(0.0, 1.0 - row[order].sum()))}


def query_grid(src: Source, token: str, key: str) -> dict:
    """One query's weight on one key in every kept layer and head."""
    i = position(src.tokens, token)
    j = position(src.tokens[:i + 1], key, "--key")
    layers = sorted(src.layers)
    return {"command": "attention", "view": "query_grid", "transforms": list(src.view),
            "query": position_json(src.tokens, i), "key": position_json(src.tokens, j),
            "layers": layers, "heads": src.heads, "weights": np.stack([src.layers[l][:, i, j] for l in layers])}


def pattern(src: Source, layer: int, head: int) -> np.ndarray:
    """One head's (T, T) pattern by model numbering; an error naming what the source holds otherwise."""
    if src.model is not None:
        layer_head(src.model.config, layer, head)
    if layer not in src.layers:
        raise MinigenError(f"--layer {layer} out of range (available: {ranges(sorted(src.layers))})")
    if head not in src.heads:
        raise MinigenError(f"--head {head} out of range (available: {ranges(src.heads)})")
    return src.layers[layer][src.heads.index(head)]


def probe(model, tok, length: int | None, seed: int, first: str | None, attn_layers: str | None = None,
          attn_heads: str | None = None) -> dict:
    """The induction probe: prefix + r + r, every score of stats.PROBE_SCORES, for the kept layers and heads."""
    c = model.config
    layers = attention_selection(attn_layers, c)
    heads = selection(attn_heads, c.n_heads, "head", "--attn-heads")
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


# --- the attention command: which flags go together, where the patterns come from -----------------------

@dataclass
class AttentionAsk:
    """What one `minigen attention` invocation asks for (its flags, by name)."""
    prompt: str | None = None           # the prompt's text (None: --from or --probe alone)
    from_path: str | None = None
    model_path: str | None = None
    chat: bool = False
    layer: int | None = None
    head: int | None = None
    token: str | None = None
    key: str | None = None
    top_k: int = 10
    value_weighted: bool = False
    exclude_first: bool = False
    probe: str | None = None
    probe_length: int | None = None
    probe_first: str | None = None
    seed: int = 0
    html_path: str | None = None
    dump_path: str | None = None
    attn_layers: str | None = None
    attn_heads: str | None = None
    attn_dtype: str | None = None

    @property
    def uses_model(self) -> bool:
        """Whether a dump needs its model too (the dump holds the weights, not the values)."""
        return self.value_weighted or self.probe is not None

    @property
    def probe_alone(self) -> bool:
        return self.prompt is None and self.from_path is None

    def conflict(self) -> str | None:
        """The first flags given together that do not go together, as a usage message; None if none."""
        rules = [
            (self.token is not None and self.key is None and (self.layer is None or self.head is None),
             "--token needs --layer and --head (one head's top keys) or --key (every layer x head)"),
            (self.key is not None and (self.token is None or self.layer is not None or self.head is not None),
             "--key goes with --token, without --layer/--head"),
            (self.prompt is not None and self.from_path is not None,
             "give either a PROMPT or --from DUMP.npz, not both"),
            (self.from_path is not None and self.chat, "--chat renders a PROMPT; a dump's tokens are already fixed"),
            (self.from_path is not None and self.dump_path is not None,
             "--dump-attention writes a new dump from a PROMPT; with --from the dump exists"),
            (self.attn_dtype is not None and self.dump_path is None, "--attn-dtype goes with --dump-attention"),
            (self.from_path is not None and self.model_path is not None and not self.uses_model,
             "--model with --from is used only by --value-weighted and --probe (the dump holds the weights)"),
            ((self.probe_length is not None or self.probe_first is not None) and self.probe is None,
             "--probe-length and --probe-first go with --probe induction"),
            (self.probe is not None and self.token is not None,
             "--probe adds columns to the census, not to --token's views"),
            (self.probe_alone and self.probe is None,
             "give a PROMPT (or - to read stdin), or --from DUMP.npz, or --probe induction"),
        ]
        return next((message for given, message in rules if given), None)

    def source(self, load, prompt_ids) -> Source:
        """The patterns to look at: from the dump (joined with its model when a view needs it) or from the
        prompt. `load(model_path) -> (model, tokenizer)`; `prompt_ids(model, tokenizer) -> ids`, checked.
        A bad --layer/--head fails here, before any file is written."""
        if self.from_path is not None:
            src = from_dump(self.from_path, self.attn_layers, self.attn_heads)
            if self.uses_model:
                src = with_model(src, *load(self.model_path or dump_model_path(self.from_path)))
        else:
            model, tok = load(self.model_path)
            src = from_prompt(model, tok, prompt_ids(model, tok), self.attn_layers, self.attn_heads)
        if self.layer is not None or self.head is not None:
            pattern(src, self.layer if self.layer is not None else min(src.layers),
                    self.head if self.head is not None else src.heads[0])
        return src

    def files_only(self, written: dict) -> bool:
        """Files were asked for and no view flag: the census is not printed (only, with --json, the files)."""
        return bool(written) and self.token is None and self.probe is None and not (self.value_weighted or
                                                                                     self.exclude_first)

    def view(self, src: Source) -> dict:
        probed = induction_probe(src.model, src.tokenizer, self.probe_length, self.seed, self.probe_first) \
            if self.probe else None
        return attention_view(src, self.layer, self.head, self.token, self.key, self.top_k, self.value_weighted,
                              self.exclude_first, probed)


# --- what heads do ----------------------------------------------------------------------------------------

def _position(tok, ids, spec) -> int:
    return position(tok.token_strings(ids), spec)


def _target(tok, model, spec: str | None, flag: str) -> int | None:
    return None if spec is None else vocab_token(tok, spec, flag, model.config.vocab_size)


def components(model, heads: str | None, attn: str | None, mlp: str | None,
               expert: str | None = None) -> list[effects.Component]:
    c = model.config
    out = [effects.Component("head", l, h) for l, h in head_items(heads, c)] if heads else []
    for kind, text, flag in (("attn", attn, "--attn"), ("mlp", mlp, "--mlp")):
        if text:
            out += [effects.Component(kind, l) for l in selection(text, c.n_layers, "layer", flag)]
    if expert:
        experts.check_moe(c, "--expert")
        out += [effects.Component("expert", l, e) for l, e in expert_items(expert, c)]
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
    cfg = model.config
    if 0 <= layer < cfg.n_layers and not has_attention(cfg, layer):   # a recurrent layer: one token's step
        i = position(tok.token_strings(ids), token)
        return {**trace_recurrent(model, tok, ids, layer, head, i), "query": position_json(tok.token_strings(ids), i)}
    layer_head(model.config, layer, head)
    i = position(tok.token_strings(ids), token)
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
    keep = selection(layers, c.n_layers, "layer", "--layers")
    tokens = tok.token_strings(ids)
    rows = [r for r in experts.routing(model, ids) if r["layer"] in keep]
    return {"command": "experts", "n_experts": c.n_experts, "experts_per_token": c.experts_per_token,
            "normalisation": c.router, "tokens": [token_json(tok, i) for i in ids],
            "layers": [{"layer": r["layer"], "load": r["load"],
                        "routes": [{"token": position_json(tokens, t),
                                    "experts": [{"expert": int(e), "weight": float(w)}
                                                for e, w in zip(r["experts"][t], r["weights"][t])]}
                                   for t in range(len(ids))]} for r in rows]}

"""What each inspection command computes, as plain data: the CLI parses flags, calls one function here,
and prints the result as text (report.py) or as JSON (`--json`, results.as_json). Every result is a dict
of JSON types whose fields the docs list; token ids come with their text ({"id", "text"}), positions in
the prompt with theirs ({"index", "text"}). The attention command's are in patterns.py.
"""
from __future__ import annotations

import numpy as np

from ..engine.mixers import has_attention
from ..errors import MinigenError
from . import effects, experts, lens
from .args import expert_items, head_items, layer_head, position, selection, vocab_token
from .internals import trace_lines
from .recurrent import trace_recurrent
from .results import as_json, position_json, token_json, token_text as _text, with_text as _with_text

__all__ = ["as_json", "components", "ablate", "sweep", "patch", "logit_lens", "dla", "trace", "routing"]


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

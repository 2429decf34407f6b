"""What heads and blocks do to the output: ablation (take a part out, see what changes) and activation
patching (put a part of a clean run into a corrupted run, see how much of the answer comes back).

Ablating a head replaces its output before the output projection (TransformerLens's hook_z), at every
position, by zeros ("zero") or by its mean over the prompt's positions in the same run ("mean", which
keeps the head's average contribution and removes only what depends on the token). Ablating a block
("attn L", "mlp L") does the same to what the block adds to the residual stream.

Patching (the indirect-object-identification workflow): two prompts of the same token length, a clean
one and a corrupted one (e.g. the names swapped), and two answer tokens. The metric is the logit
difference logit(answer) - logit(wrong) at one position; a patch restores
    (patched - corrupted) / (clean - corrupted)
of it: 1 when the patched part carries everything that differs, 0 when it carries nothing.

Shape letters as in model.py: T tokens, D hidden, H query heads, d head_dim, V vocabulary, L layers.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engine.mixers import has_attention
from ..engine import model as M
from ..engine.linear import rows_of
from ..errors import MinigenError
from ..generation.sampling import largest, log_softmax
from .args import attention_layer, index
from .experts import without_experts
from .hooks import Intervention, final_residual, layer_inputs, logits_of, mean, patch, resume, resume_each, zero

MODES = ("zero", "mean")


@dataclass(frozen=True)
class Component:
    """A part of the model: one head ("head", layer, head), a layer's attention or MLP block, or one routed
    expert ("expert", layer, expert: `head` holds the expert's index)."""
    kind: str
    layer: int
    head: int | None = None

    def __str__(self):
        if self.kind == "expert":
            return f"expert {self.layer}.{self.head}"
        return f"{self.layer}.{self.head}" if self.kind == "head" else f"{self.kind} {self.layer}"

    def as_json(self) -> dict:
        out = {"kind": self.kind, "layer": self.layer, "head": self.head, "name": str(self)}
        if self.kind == "expert":
            out.update(head=None, expert=self.head)
        return out


def every(kind: str, cfg) -> list[Component]:
    """Every component of a kind, in layer (then head) order: what a sweep goes through."""
    if kind == "heads":
        return [Component("head", l, h) for l in range(cfg.n_layers) if has_attention(cfg, l) for h in range(cfg.n_heads)]
    if kind == "experts":
        return [Component("expert", l, e) for l in range(cfg.n_layers) for e in range(cfg.n_experts)]
    return [Component(kind, l) for l in range(cfg.n_layers)]


def changes_for(components: list[Component], mode: str) -> dict:
    """Intervention changes that ablate `components` ("zero" or "mean")."""
    if mode not in MODES:
        raise MinigenError(f"ablation mode {mode!r}: expected one of {', '.join(MODES)}")
    make = zero if mode == "zero" else mean
    heads: dict[int, list[int]] = {}
    changes = {}
    for c in components:
        if c.kind == "head":
            heads.setdefault(c.layer, []).append(c.head)
        elif c.kind != "expert":  # experts are taken out of the params (model_without), not by a hook
            changes[(c.kind, c.layer)] = make()
    changes.update({("z", l): make(sorted(hs)) for l, hs in heads.items()})
    return changes


# --- ablation -----------------------------------------------------------------------------------------

def ablated_logits(model, ids, heads, mode: str = "zero") -> np.ndarray:
    """float32 (T, V): the logits with each (layer, head) in `heads` zeroed, or (mode="mean") replaced by
    its mean over the T positions, before the output projection."""
    comps = [Component("head", *_index_pair(model.config, l, h)) for l, h in heads]
    x = final_residual(model, ids, Intervention(changes_for(comps, mode)))
    return logits_of(model, x).astype(np.float32)


def _index_pair(cfg, layer: int, head: int) -> tuple[int, int]:
    layer = attention_layer(cfg, index(int(layer), cfg.n_layers, "layer", "heads"), "heads")
    return layer, index(int(head), cfg.n_heads, "head", "heads")


def model_without(model, components: list[Component]):
    """The model itself, or a copy whose ablated experts add nothing (experts.without_experts)."""
    experts = [(c.layer, c.head) for c in components if c.kind == "expert"]
    return without_experts(model, experts) if experts else model


def compare(before: np.ndarray, after: np.ndarray, target: int, k: int = 5) -> dict:
    """How one position's next-token distribution changed: top-k before and after, log p(target) before,
    after and the change, and KL(before || after) in nats."""
    lb, la = log_softmax(before, dtype=np.float64), log_softmax(after, dtype=np.float64)
    pb = np.exp(lb)
    return {"top_before": top_tokens(lb, k), "top_after": top_tokens(la, k),
            "logp_before": float(lb[target]), "logp_after": float(la[target]),
            "delta_logp": float(la[target] - lb[target]), "kl": float(max(0.0, (pb * (lb - la)).sum()))}


def top_tokens(logp: np.ndarray, k: int) -> list[dict]:
    order = largest(logp, k)
    return [{"id": int(t), "p": float(np.exp(logp[t]))} for t in order]


def ablation(model, ids, components: list[Component], mode: str, position: int, target: int | None = None,
             k: int = 5) -> dict:
    """The effect of ablating `components` together on the distribution at `position`."""
    x_in, _ = layer_inputs(model, ids)
    start = min(c.layer for c in components)
    after = resume(model_without(model, components), x_in[start], start, Intervention(changes_for(components, mode)))
    before = logits_of(model, x_in[-1][position])
    target = int(np.argmax(before)) if target is None else target
    return {"components": [c.as_json() for c in components], "mode": mode, "position": position,
            "target": target, **compare(before, logits_of(model, after[position]), target, k)}


def sweep(model, ids, kind: str, mode: str, position: int, target: int | None = None) -> dict:
    """Ablate each head (kind "heads") or each layer's "attn" or "mlp" in turn, alone; the effect of each
    on the distribution at `position`, in component order (commands.sweep ranks them)."""
    x_in, _ = layer_inputs(model, ids)
    before = logits_of(model, x_in[-1][position])
    target = int(np.argmax(before)) if target is None else target
    rows = []
    components, finals = ablated_runs(model, x_in, every(kind, model.config), mode)
    for c, after in zip(components, logits_of_rows(model, [x[position] for x in finals])):
        effect = compare(before, after, target, k=1)
        rows.append({**c.as_json(), "kl": effect["kl"], "delta_logp": effect["delta_logp"],
                     "top_after": effect["top_after"][0]})
    return {"kind": kind, "mode": mode, "position": position, "target": target,
            "logp_before": float(log_softmax(before, dtype=np.float64)[target]),
            "top_before": top_tokens(log_softmax(before, dtype=np.float64), 5),
            "effects": rows}


def logits_of_rows(model, rows: list[np.ndarray], chunk: int = 64):
    """The logits (V,) of each residual row (D,), `chunk` rows to a product: a sweep of 270 heads reads the
    output projection 5 times, not 270 (Gemma 2's is 2.4 GB in float32)."""
    for lo in range(0, len(rows), chunk):
        yield from logits_of(model, np.stack(rows[lo:lo + chunk]))


def ablated_runs(model, x_in: np.ndarray, components: list[Component], mode: str):
    """(components, the final residual with each one ablated alone), the runs that start at one layer
    resumed together (hooks.resume_each); an expert's run (another model's params) alone."""
    done = {}
    for layer in sorted({c.layer for c in components}):
        here = [c for c in components if c.layer == layer and c.kind != "expert"]
        for c, x in zip(here, resume_each(model, [x_in[layer]] * len(here), layer,
                                          [changes_for([c], mode) for c in here])):
            done[c] = x
    for c in components:
        if c.kind == "expert":
            done[c] = resume(model_without(model, [c]), x_in[c.layer], c.layer, Intervention(changes_for([c], mode)))
    return components, [done[c] for c in components]


# --- activation patching --------------------------------------------------------------------------------

PATCH_WHAT = ("heads", "resid", "attn", "mlp")


def logit_diff(model, x_row: np.ndarray, answer: int, wrong: int) -> float:
    """logit(answer) - logit(wrong) from one final residual row (D,): the final norm, the two rows of
    lm_head it needs, and the family's soft-cap (no full unembedding per patched run)."""
    cfg, params = model.config, model.params
    h = M.norm(np.asarray(x_row, np.float32)[None], params, cfg, "final_norm")      # (1, D)
    logits = (h @ rows_of(params["lm_head"], [answer, wrong]).T)[0].astype(np.float64)        # (2,)
    logits *= cfg.logits_multiplier  # Granite: 1 / logits_scaling; Falcon-H1: lm_head_multiplier
    if cfg.final_softcap:
        logits = cfg.final_softcap * np.tanh(logits / cfg.final_softcap)
    return float(logits[0] - logits[1])


def patching(model, clean_ids, corrupt_ids, answer: int, wrong: int, what: str = "heads",
             position: int = -1) -> dict:
    """Patch each head's output ("heads": every position at once; a layers x heads grid), or the residual
    stream entering each layer ("resid"), or each layer's attention or MLP output ("attn", "mlp") at each
    position (a layers x positions grid), from the clean run into the corrupted run; how much of the
    clean logit difference at `position` each patch restores."""
    if len(clean_ids) != len(corrupt_ids):
        raise MinigenError(f"the clean prompt is {len(clean_ids)} tokens and the corrupted one {len(corrupt_ids)}: "
                           f"patching needs the same length (positions are patched one for one)")
    if what not in PATCH_WHAT:
        raise MinigenError(f"patching {what!r}: expected one of {', '.join(PATCH_WHAT)}")
    cfg, T = model.config, len(clean_ids)
    p = position % T
    xc, clean = layer_inputs(model, clean_ids)
    xr, corrupt = layer_inputs(model, corrupt_ids)
    ld_clean, ld_corrupt = (logit_diff(model, x[-1][p], answer, wrong) for x in (xc, xr))
    if abs(ld_clean - ld_corrupt) < 1e-6:
        raise MinigenError(f"the clean and corrupted prompts give the same logit difference ({ld_clean:.4f}): "
                           f"there is nothing to restore; choose other prompts or answers")

    def measured(l: int, runs: list) -> list[float]:
        """The logit difference of each run (x, changes) resumed at layer l together; None: the corrupted one."""
        todo = [r for r in runs if r is not None]
        done = iter(resume_each(model, [x for x, _ in todo], l, [c for _, c in todo]))
        return [ld_corrupt if r is None else logit_diff(model, next(done)[p], answer, wrong) for r in runs]

    if what == "heads":
        grid = [measured(l, [(xr[l], {("z", l): patch(clean.kept["z"][l], heads=[h])}) for h in range(cfg.n_heads)])
                if has_attention(cfg, l) else [float("nan")] * cfg.n_heads   # a layer without heads (hybrids)
                for l in range(cfg.n_layers)]
    else:
        grid = [measured(l, [_patch_run(what, l, q, p, (xc, clean), (xr, corrupt)) for q in range(T)])
                for l in range(cfg.n_layers)]
    ld = np.array(grid)
    return {"what": what, "position": p, "answer": answer, "wrong": wrong,
            "logit_diff_clean": ld_clean, "logit_diff_corrupted": ld_corrupt,
            "logit_diff": ld.tolist(), "restored": ((ld - ld_corrupt) / (ld_clean - ld_corrupt)).tolist()}


def _patch_run(what, l, q, p, clean, corrupt):
    """One cell of a layers x positions grid: the run (x entering layer l, changes), or None where a
    position after `p` cannot reach it (causal attention) or the row is equal in both runs: the
    corrupted logit difference, without a run."""
    (xc, kc), (xr, kr) = clean, corrupt
    source, target = (xc[l], xr[l]) if what == "resid" else (kc.kept[what][l], kr.kept[what][l])
    if q > p or np.array_equal(source[q], target[q]):
        return None
    if what == "resid":
        x = xr[l].copy()
        x[q] = xc[l][q]
        return x, None
    return xr[l], {(what, l): patch(source, positions=[q])}

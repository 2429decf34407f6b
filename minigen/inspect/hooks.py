"""Running a loaded model with model.py's hooks: keeping what each layer computes, changing head or block
outputs (ablation, patching), and resuming a forward pass at a layer's input.

What can be changed, per layer (model.Hooks):
    z     (T, H, d)  each head's output before the output projection (TransformerLens's hook_z)
    attn  (T, D)     what the attention block adds to the residual stream (after any post-norm)
    mlp   (T, D)     what the MLP block adds (after any post-norm)
A change is a function array -> array; it must not modify its argument in place.

Resuming: an intervention at layer l leaves the residual stream entering layer l untouched, so a sweep
runs the clean prompt once, keeps every layer's input, and starts each changed run at layer l
(`resume`), which halves the work of a sweep over layers.

Shape letters as in model.py: T tokens, D hidden, H query heads, d head_dim, V vocabulary, L layers.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..engine import model as M

Change = Callable[[np.ndarray], np.ndarray]


class Intervention(M.Hooks):
    """Hooks that apply `changes` {("z" | "attn" | "mlp", layer): Change} and, with keep=True, keep a copy
    of every z, attn, mlp and residual stream (after the changes) in `kept[kind][layer]`."""

    def __init__(self, changes: dict | None = None, keep: bool = False):
        self.changes = changes or {}
        self.kept = {"z": {}, "attn": {}, "mlp": {}, "resid": {}} if keep else None

    def _through(self, kind: str, layer: int, a: np.ndarray) -> np.ndarray:
        change = self.changes.get((kind, layer))
        if change is not None:
            a = change(a)
        if self.kept is not None:
            self.kept[kind][layer] = a.copy()
        return a

    def z(self, layer, z):
        return self._through("z", layer, z)

    def attn_out(self, layer, a):
        return self._through("attn", layer, a)

    def mlp_out(self, layer, m):
        return self._through("mlp", layer, m)

    def resid(self, layer, x):
        if self.kept is not None:
            self.kept["resid"][layer] = x.copy()  # x is updated in place by the next layer


# --- changes ------------------------------------------------------------------------------------------

def zero(heads: list[int] | None = None) -> Change:
    """Zero some heads of z (T, H, d), or a whole block output (T, D) when heads is None."""
    def change(a):
        a = a.copy()
        if heads is None:
            a[:] = 0
        else:
            a[:, heads] = 0
        return a
    return change


def mean(heads: list[int] | None = None) -> Change:
    """Replace some heads of z (or a whole block output) by their mean over the T positions."""
    def change(a):
        a = a.copy()
        if heads is None:
            a[:] = a.mean(0)
        else:
            a[:, heads] = a[:, heads].mean(0)
        return a
    return change


def patch(source: np.ndarray, heads: list[int] | None = None, positions: list[int] | None = None) -> Change:
    """Copy from another run's array of the same shape: some heads of z at every position, or some
    positions (rows) of a block output."""
    def change(a):
        a = a.copy()
        if heads is not None:
            a[:, heads] = source[:, heads]
        else:
            a[positions] = source[positions]
        return a
    return change


# --- running ------------------------------------------------------------------------------------------

def final_residual(model, ids, hooks: M.Hooks | None = None) -> np.ndarray:
    """The final residual stream (T, D) of an uncached forward over ids, with hooks; `logits_of` finishes it."""
    return _final_residual(model, model.check_ids(ids), hooks)


def _final_residual(model, ids: np.ndarray, hooks: M.Hooks | None) -> np.ndarray:
    return M.hidden(model.params, model.config, ids, model.make_cache(len(ids)), hooks=hooks)


def layer_inputs(model, ids) -> tuple[np.ndarray, Intervention]:
    """(L + 1, T, D): the residual stream entering each layer (row 0: the embeddings) and after the last
    one (before the final norm); and the Intervention that kept every z, attn, mlp of that run."""
    ids = model.check_ids(ids)
    cfg = model.config
    keep = Intervention(keep=True)
    x_last = _final_residual(model, ids, keep)
    x0 = M.embed(model.params, cfg, ids, np.arange(len(ids)))
    rows = [x0] + [keep.kept["resid"][l] for l in range(cfg.n_layers - 1)] + [x_last]
    return np.stack(rows), keep


def resume(model, x: np.ndarray, start: int, hooks: M.Hooks | None = None) -> np.ndarray:
    """Layers start..L-1 on a copy of the residual stream x (T, D) entering layer `start`; the final
    residual (T, D). Equal to a full forward whose layers before `start` produced x."""
    seqs = M.stack([x], [model.make_cache(len(x))])
    return M.run_layers(x.copy(), model.params, model.config, seqs, start, hooks=hooks)


class Each(M.Hooks):
    """The hooks of B runs stacked as one batch, each T rows: run i's own Intervention sees, and changes,
    its rows i*T..(i+1)*T alone (a mean is over its own positions)."""

    def __init__(self, runs: list[Intervention], T: int):
        self.runs, self.T = runs, T

    def _each(self, kind: str, layer: int, a: np.ndarray) -> np.ndarray:
        out = None
        for i, run in enumerate(self.runs):
            change = run.changes.get((kind, layer))
            if change is not None:
                out = a.copy() if out is None else out
                out[i * self.T:(i + 1) * self.T] = change(a[i * self.T:(i + 1) * self.T])
        return a if out is None else out

    def z(self, layer, z):
        return self._each("z", layer, z)

    def attn_out(self, layer, a):
        return self._each("attn", layer, a)

    def mlp_out(self, layer, m):
        return self._each("mlp", layer, m)


BATCH = 16   # runs resumed together: a product of 16 prompts' rows runs near GEMM's speed, one prompt's far below


def resume_each(model, xs: list[np.ndarray], start: int, changes: list[dict | None]) -> list[np.ndarray]:
    """`resume` for many runs from one layer: run i on xs[i] (T, D) with changes[i], BATCH of them at a
    time as one batch of sequences (the same rows through every product, so each equals its own resume
    to float32's rounding). -> each run's final residual (T, D)."""
    out = []
    for b in range(0, len(xs), BATCH):
        group, group_changes = xs[b:b + BATCH], changes[b:b + BATCH]
        T = len(group[0])
        seqs = M.stack([np.zeros(T, np.int64)] * len(group), [model.make_cache(T) for _ in group])   # lengths only
        hooks = Each([Intervention(c) for c in group_changes], T)
        x = M.run_layers(np.concatenate(group), model.params, model.config, seqs, start, hooks=hooks)
        out += [x[i * T:(i + 1) * T] for i in range(len(group))]
    return out


def logits_of(model, x: np.ndarray) -> np.ndarray:
    """Final norm, lm_head and the family's soft-cap on residual rows (..., D) -> (..., V)."""
    return M.unembed(np.atleast_2d(x), model.params, model.config).reshape(*x.shape[:-1], -1)

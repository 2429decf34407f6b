"""Routed experts seen from outside: which experts each token of a prompt went to, with what weight (the
routing report, `minigen experts`), and what taking experts out does (`minigen ablate --expert L.E`).

The routing is the engine's own (engine/moe.py's `route`) on each MoE layer's input as the forward pass
makes it: the residual stream entering the layer plus what its attention block added, through the MLP's
norm. Ablating an expert zeroes its output projection for that layer in a copy of the layer's params, so
the expert adds nothing wherever it was chosen; the router and the other experts' weights are left as they
were (the router still picks it: the question is what its contribution was).

Shape letters as in model.py: T tokens, D hidden, E experts, k experts per token.
"""
from __future__ import annotations

import numpy as np

from ..engine import model as M
from ..engine import moe
from ..engine.linear import dense
from ..errors import MinigenError
from .hooks import layer_inputs


def check_moe(cfg, flag: str):
    if cfg.mlp != "moe":
        raise MinigenError(f"{flag}: this {cfg.model_type} model has no routed experts (its MLP is {cfg.mlp!r}; "
                           f"granitemoe and MoE granitemoehybrid checkpoints have them)")


def mlp_inputs(model, ids) -> list[np.ndarray]:
    """(T, D) per layer: what each layer's MLP reads, from one uncached forward pass."""
    cfg, params = model.config, model.params
    x_in, kept = layer_inputs(model, ids)
    out = []
    for l in range(cfg.n_layers):
        x = x_in[l] if cfg.parallel_residual else x_in[l] + kept.kept["attn"][l]     # (T, D)
        out.append(M.norm(x, params["layers"][l], cfg, "mlp_norm") if cfg.pre_norms or cfg.parallel_residual else x)
    return out


def routing(model, ids) -> list[dict]:
    """Per layer: {"layer", "experts" (T, k) best first, "weights" (T, k), "load" (E,) tokens per expert}."""
    cfg = model.config
    check_moe(cfg, "experts")
    rows = []
    for l, h in enumerate(mlp_inputs(model, ids)):
        idx, weights = moe.route(h, model.params["layers"][l]["router"], cfg.experts_per_token, cfg.router)
        rows.append({"layer": l, "experts": idx, "weights": weights,
                     "load": np.bincount(idx.reshape(-1), minlength=cfg.n_experts)})
    return rows


def without_experts(model, experts: list[tuple[int, int]]):
    """A Model sharing every array with `model` but the listed layers' expert output projections, copied
    with those experts' slices zeroed."""
    params = dict(model.params, layers=list(model.params["layers"]))
    for layer in sorted({l for l, _ in experts}):
        down = np.array(dense(params["layers"][layer]["experts_down"]))         # (E, D, F), a float32 copy
        down[[e for l, e in experts if l == layer]] = 0
        params["layers"][layer] = dict(params["layers"][layer], experts_down=down)
    return M.Model(model.config, params, model.generation_config, model.path)

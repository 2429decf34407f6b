"""One token's step through a recurrent layer (Gated DeltaNet, Mamba2, LFM2's short convolution), for
`minigen trace` on a layer without attention: the state before the token, the update, the output, and
the check that this one step gives the row the model's own (chunked) forward gives for that token.

The state before token t is what the layer's own mixer leaves after the tokens before it (fed from a
fresh state); the step itself is the mixer's own (its `step` in engine/mixers.MIXERS: each recurrence's
module writes its one-token update out, with the recurrence of its docstring).
"""
from __future__ import annotations

import numpy as np

from ..engine import model as M
from ..engine.mixers import Pass, mixer_of
from .internals import hidden_before
from .trace import fmt_vec


def trace_recurrent(model, tok, ids, layer: int, head: int, t: int, tol: float = 1e-4) -> dict:
    cfg = model.config
    kind, mixer = cfg.mixer(layer), mixer_of(cfg, layer)
    h, _ = hidden_before(model, ids, layer)
    p = model.params["layers"][layer]
    x = M.norm(h, p, cfg, "attn_norm")                                       # (T, D)
    whole = mixer.forward(x, p, cfg, Pass(layer, (slice(0, len(x)),), (mixer.cache(cfg, len(x)),)))
    tokens = tok.token_strings(ids)
    header = [f"{model.path}: {cfg.model_type}, layer {layer} of {cfg.n_layers} ({kind}), token {t} {tokens[t]!r}",
              f"x = the residual stream entering layer {layer}, after its RMSNorm: {fmt_vec(x[t])}"]
    lines, out, state_err = mixer.step(x, t, p, cfg, head, fmt_vec)
    err = float(np.abs(out - whole[t]).max())
    ok = err <= tol * max(1.0, float(np.abs(whole[t]).max())) and state_err <= tol
    lines = header + lines + [
        f"check: the layer's output for this token from the model's own forward over the prompt = {fmt_vec(whole[t])}",
        f"   max |step - model| = {err:.2e} (output), {state_err:.2e} (this head's new state, written out above "
        f"against the mixer's own step): " + ("equal" if ok else "DIFFERENT") + f" within {tol:g}"]
    return {"command": "trace", "layer": layer, "head": head, "mixer": kind, "matches_model": ok, "lines": lines,
            "output": out}

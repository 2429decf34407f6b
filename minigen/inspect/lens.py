"""What the residual stream says along the way: the logit lens, and direct logit attribution.

Logit lens: the residual stream after each layer (row 0: the embeddings, with the family's scale and
learned positions) read out as the last layer's is: the final norm, lm_head, and the final soft-cap
where the family has one. The last row is the model's logits.

Direct logit attribution (DLA): the residual stream at the last layer is a sum of parts, the embeddings
plus what every attention block and MLP added, and each attention block's part is a sum over heads,
z_h · W_O[:, h] (+ the output bias). What turns that sum into a logit is not linear: the final norm
divides by the stream's own RMS (LayerNorm also subtracts its mean and adds a bias), and some families
soft-cap the logits. DLA freezes the final norm's scale at its value on this prompt (as TransformerLens
does with its cached ln_final scale), which makes the map from parts to the logit linear and the parts
add up exactly to the logit before the soft-cap; it is reported before the cap (monotone, so a part that
raises the pre-cap logit raises the logit). For OLMo 2 and Gemma 2/3 a norm also sits between the heads
and the residual stream (attn_post_norm): the heads' outputs are attributed through that norm's scale
frozen the same way, at its input on this prompt, so the heads of a layer still add up to its block.
A frozen-scale attribution says what each part contributes given the stream as it is; what the logit
would be without a part is ablation's question (effects.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engine import model as M
from ..engine.linear import dense, rows_of
from ..generation.sampling import largest, log_softmax
from .hooks import layer_inputs, logits_of


def logit_lens(model, ids) -> np.ndarray:
    """float32 (n_layers + 1, T, V): row 0 from the embeddings, row l from the residual stream after
    layer l, each through the final norm, lm_head and the final soft-cap; the last row is the logits."""
    x, _ = layer_inputs(model, ids)                                         # (L + 1, T, D)
    return np.stack([logits_of(model, row) for row in x]).astype(np.float32)


def lens_at(model, ids, position: int, k: int = 5, target: int | None = None) -> dict:
    """The lens at one position: each row's top-k tokens and probabilities, and one token's rank (1 = top),
    probability and logit across rows (the target defaults to the model's final top token)."""
    x, _ = layer_inputs(model, ids)
    logp = log_softmax(logits_of(model, x[:, position]), dtype=np.float64)                 # (L + 1, V)
    target = int(np.argmax(logp[-1])) if target is None else target
    rows = []
    for l, lp in enumerate(logp):
        order = largest(lp, k)
        rows.append({"layer": l - 1 if l else None, "name": "embed" if l == 0 else str(l - 1),
                     "top": [{"id": int(t), "p": float(np.exp(lp[t]))} for t in order],
                     "target_rank": int((lp > lp[target]).sum()) + 1, "target_p": float(np.exp(lp[target]))})
    return {"position": position, "target": target, "rows": rows}


# --- direct logit attribution ---------------------------------------------------------------------------

@dataclass
class FrozenNorm:
    """A norm with its statistics taken from one input row and then held fixed: linear in what it is given.
    LayerNorm still subtracts each input's own mean (that part is linear); its bias is a constant apart."""
    scale: np.ndarray            # (D,) weight / RMS (or / standard deviation) of the row it was frozen at
    centre: bool
    bias: np.ndarray | None

    def __call__(self, c: np.ndarray) -> np.ndarray:
        c = np.asarray(c, dtype=np.float64)
        if self.centre:
            c = c - c.mean(-1, keepdims=True)
        return c * self.scale


def freeze(cfg, p: dict, name: str, x_row: np.ndarray) -> FrozenNorm:
    """The norm `name` of params `p` (layers.rms_norm / layer_norm) frozen at the row x_row (D,)."""
    x = np.asarray(x_row, dtype=np.float64)
    if cfg.norm == "layer":
        sd = np.sqrt(x.var() + cfg.norm_eps)
        return FrozenNorm(p[name] / sd, True, np.asarray(p[name + "_b"], np.float64))
    return FrozenNorm(p[name] / np.sqrt(np.mean(x * x) + cfg.norm_eps), False, None)


def head_vectors(model, layer: int, z_row: np.ndarray) -> np.ndarray:
    """(H, D): what each head writes at one position, z_h · W_O[:, h·d:(h+1)·d]ᵀ, before the output bias."""
    cfg = model.config
    H, d = cfg.n_heads, cfg.head_dim
    wo = dense(model.params["layers"][layer]["wo"]).reshape(-1, H, d)            # (D, H, d): HF's (out, in)
    return np.einsum("hd,Dhd->hD", np.asarray(z_row, np.float64), wo)


def direct_attribution(model, ids, position: int, target: int, vs: int | None = None) -> dict:
    """Each part's direct contribution to logit(target) (minus logit(vs)) at `position`, before the final
    soft-cap: {"embed", "heads" (L, H), "attn_bias" (L,), "attn" (L,), "mlp" (L,), "norm_bias", "total",
    "logit"} — total is the sum of the parts and equals "logit", the model's own pre-cap value."""
    cfg, params = model.config, model.params
    x, kept = layer_inputs(model, ids)
    u = (rows_of(params["lm_head"], [target])[0].astype(np.float64)
         - (0 if vs is None else rows_of(params["lm_head"], [vs])[0])) * cfg.logits_multiplier
    final = freeze(cfg, params, "final_norm", x[-1][position])
    to_logit = lambda c: final(c) @ u
    heads, attn_bias, attn, mlp = [], [], [], []
    for l in range(cfg.n_layers):
        p = params["layers"][l]
        c = head_vectors(model, l, kept.kept["z"][l][position])           # (H, D)
        b = np.asarray(p["bo"], np.float64) if "bo" in p else np.zeros(c.shape[1])
        if cfg.post_norms:  # attribute through attn_post_norm frozen at this block's own input
            post = freeze(cfg, p, "attn_post_norm", c.sum(0) + b)
            c, b = post(c), post(b) + (post.bias if post.bias is not None else 0)
        c, b = c * cfg.residual_multiplier, b * cfg.residual_multiplier  # Granite scales the block's output
        heads.append(to_logit(c))
        attn_bias.append(float(to_logit(b)))
        attn.append(float(to_logit(kept.kept["attn"][l][position])))
        mlp.append(float(to_logit(kept.kept["mlp"][l][position])))
    embed = float(to_logit(x[0][position]))
    norm_bias = float(final.bias @ u) if final.bias is not None else 0.0
    logit = float(M.norm(x[-1][position][None], params, cfg, "final_norm")[0].astype(np.float64) @ u)
    total = embed + float(np.sum(attn)) + float(np.sum(mlp)) + norm_bias
    capped = logits_of(model, x[-1][position])                              # (V,): the model's own logits
    return {"position": position, "target": target, "vs": vs, "embed": embed, "heads": np.array(heads).tolist(),
            "attn_bias": attn_bias, "attn": attn, "mlp": mlp, "norm_bias": norm_bias, "total": total,
            "logit": logit, "softcap": cfg.final_softcap, "post_norm": cfg.post_norms,
            "capped": float(capped[target] - (0 if vs is None else capped[vs]))}

"""One token's step through a recurrent layer (Gated DeltaNet, Mamba2, LFM2's short convolution), for
`minigen trace` on a layer without attention: the state before the token, the update, the output, and
the check that this one step gives the row the model's own (chunked) forward gives for that token.

The state before token t is what the layer's own mixer leaves after the tokens before it (fed from a
fresh state); the step is then written out with the recurrence of the mixer's module docstring.
"""
from __future__ import annotations

import numpy as np

from ..engine import model as M
from ..engine.cache import make_cache
from ..engine.gated_delta import gated_deltanet, gated_rms_norm, l2norm, sigmoid, softplus
from ..engine.layers import silu
from ..engine.short_conv import causal_conv, short_conv
from ..engine.ssm import mamba2, step_size
from ..errors import MinigenError
from .internals import hidden_before
from .trace import fmt_vec


def trace_recurrent(model, tok, ids, layer: int, head: int, t: int, tol: float = 1e-4) -> dict:
    cfg = model.config
    kind = cfg.mixer(layer)
    h, _ = hidden_before(model, ids, layer)
    p = model.params["layers"][layer]
    x = M.norm(h, p, cfg, "attn_norm")                                       # (T, D)
    whole = M.MIXERS[kind](x, p, cfg, layer, M.stack([np.zeros(len(x), np.int64)], [make_cache(cfg, len(x))]))
    tokens = tok.token_strings(ids)
    header = [f"{model.path}: {cfg.model_type}, layer {layer} of {cfg.n_layers} ({kind}), token {t} {tokens[t]!r}",
              f"x = the residual stream entering layer {layer}, after its RMSNorm: {fmt_vec(x[t])}"]
    lines, out, state_err = STEPS[kind](x, t, p, cfg, head)
    err = float(np.abs(out - whole[t]).max())
    ok = err <= tol * max(1.0, float(np.abs(whole[t]).max())) and state_err <= tol
    lines = header + lines + [
        f"check: the layer's output for this token from the model's own forward over the prompt = {fmt_vec(whole[t])}",
        f"   max |step - model| = {err:.2e} (output), {state_err:.2e} (this head's new state, written out above "
        f"against the mixer's own step): " + ("equal" if ok else "DIFFERENT") + f" within {tol:g}"]
    return {"command": "trace", "layer": layer, "head": head, "mixer": kind, "matches_model": ok, "lines": lines,
            "output": out}


def _before(step, x, t, p, cfg, tail, state):
    """The conv tail and state after tokens 0..t-1, from the layer's own mixer."""
    if t == 0:
        return tail, state
    _, tail, state = step(x[:t], tail, state, p)
    return tail, state


def delta_net_step(x, t, p, cfg, head: int):
    m = cfg.delta_net
    H, Hk, dk, dv = m.value_heads, m.key_heads, m.key_dim, m.value_dim
    if not 0 <= head < H:
        raise MinigenError(f"--head {head} out of range (this Gated DeltaNet layer has {H} value heads: 0-{H - 1})")
    n_qkv = 2 * Hk * dk + H * dv
    tail, state = _before(lambda a, tl, st, p: gated_deltanet(a, tl, st, p, m), x, t, p, cfg,
                          np.zeros((m.conv_kernel - 1, n_qkv), np.float32), np.zeros((H, dk, dv), np.float32))
    proj = x[t:t + 1] @ p["w_in"].T                                          # (1, n_qkv + H dv + 2H)
    conv, _ = causal_conv(proj[:, :n_qkv], tail, p["conv_w"])
    qkv = silu(conv)[0]
    kh = head // (H // Hk)
    q = l2norm(qkv[kh * dk:(kh + 1) * dk]) * np.float32(dk ** -0.5)
    k = l2norm(qkv[Hk * dk + kh * dk:Hk * dk + (kh + 1) * dk])
    v = qkv[2 * Hk * dk + head * dv:2 * Hk * dk + (head + 1) * dv]
    beta = sigmoid(proj[0, n_qkv + H * dv + head])
    g = -np.exp(p["A_log"][head]) * softplus(proj[0, n_qkv + H * dv + H + head] + p["dt_bias"][head])
    S = state[head]
    decayed = np.exp(g) * S
    predicted = k @ decayed
    delta = beta * (v - predicted)
    S_new = decayed + np.outer(k, delta)
    o = q @ S_new
    full, _, new_state = gated_deltanet(x[t:t + 1], tail, state, p, m)
    lines = [
        f"1. in_proj, then the causal conv (kernel {m.conv_kernel}) over this token and the {m.conv_kernel - 1} before it, "
        f"SiLU: q, k (key head {kh} of {Hk}, L2-normed, q x 1/sqrt({dk})), v (value head {head} of {H})",
        f"   q = {fmt_vec(q)}", f"   k = {fmt_vec(k)}", f"   v = {fmt_vec(v)}",
        f"2. the gate α = exp(-exp(A_log) softplus(a + dt_bias)) = {float(np.exp(g)):.4f}, the write strength "
        f"β = sigmoid(b) = {float(beta):.4f}",
        f"3. the state before this token, S ({dk} x {dv}), |S| = {np.linalg.norm(S):.4f}",
        f"4. decay, then what it predicts for k: Sᵀk after α S = {fmt_vec(predicted)}",
        f"5. the delta rule: δ = β (v - that) = {fmt_vec(delta)}; S ← α S + k δᵀ, |S| = {np.linalg.norm(S_new):.4f}",
        f"6. the head's output o = Sᵀq = {fmt_vec(o)}",
        f"7. every head through the gated RMSNorm (x silu(z)) and out_proj: the layer's output {fmt_vec(full[0])}"]
    z = proj[0, n_qkv + head * dv:n_qkv + (head + 1) * dv]
    lines.insert(-1, f"   this head after the gated RMSNorm: {fmt_vec(gated_rms_norm(o, z, p['gate_norm'], m.eps))}")
    return lines, full[0], float(np.abs(S_new - new_state[head]).max())


def mamba_step(x, t, p, cfg, head: int):
    m = cfg.mamba
    H, P, G, N, I = m.heads, m.head_dim, m.groups, m.state_size, m.inner
    if not 0 <= head < H:
        raise MinigenError(f"--head {head} out of range (this Mamba2 layer has {H} heads: 0-{H - 1})")
    tail, state = _before(lambda a, tl, st, p: mamba2(a, tl, st, p, m), x, t, p, cfg,
                          np.zeros((m.conv_kernel - 1, I + 2 * G * N), np.float32), np.zeros((H, P, N), np.float32))
    proj = x[t:t + 1] @ p["w_in"].T + p.get("b_in", 0)
    conv, _ = causal_conv(proj[:, I:2 * I + 2 * G * N], tail, p["conv_w"], p.get("conv_b"))
    xbc = silu(conv)[0]
    g = head // (H // G)
    xs = xbc[head * P:(head + 1) * P]
    B, C = xbc[I + g * N:I + (g + 1) * N], xbc[I + G * N + g * N:I + G * N + (g + 1) * N]
    delta = step_size(proj[0, 2 * I + 2 * G * N + head], p["dt_bias"][head])
    A = -np.exp(p["A_log"][head])
    S = state[head]
    S_new = np.exp(delta * A) * S + np.outer(delta * xs, B)
    y = S_new @ C + p["D"][head] * xs
    full, _, new_state = mamba2(x[t:t + 1], tail, state, p, m)
    lines = [
        f"1. in_proj, then the causal conv (kernel {m.conv_kernel}) and SiLU: x (head {head} of {H}), B and C "
        f"(group {g} of {G}, {N} dims)",
        f"   x = {fmt_vec(xs)}", f"   B = {fmt_vec(B)}", f"   C = {fmt_vec(C)}",
        f"2. the step Δ = softplus(dt + dt_bias) = {float(delta):.4f}, the decay exp(Δ A) = {float(np.exp(delta * A)):.4f}",
        f"3. the state before this token, S ({P} x {N}), |S| = {np.linalg.norm(S):.4f}",
        f"4. S ← exp(Δ A) S + Δ x Bᵀ, |S| = {np.linalg.norm(S_new):.4f}",
        f"5. y = S C + D x = {fmt_vec(y)}",
        f"6. every head gated by silu(z){' and RMS-normed per group' if m.norm else ''}, out_proj: the layer's output "
        f"{fmt_vec(full[0])}"]
    return lines, full[0], float(np.abs(S_new - new_state[head]).max())


def short_conv_step(x, t, p, cfg, head: int):
    K = cfg.short_conv.kernel
    _, tail = (None, np.zeros((K - 1, cfg.hidden_size), np.float32)) if t == 0 else \
        short_conv(x[:t], np.zeros((K - 1, cfg.hidden_size), np.float32), p)
    bcx = x[t:t + 1] @ p["w_in"].T + p.get("b_in", 0)
    D = cfg.hidden_size
    full, _ = short_conv(x[t:t + 1], tail, p)
    lines = [f"1. in_proj: B, C, x̃ ({D} channels each); B ⊙ x̃ = {fmt_vec((bcx[:, :D] * bcx[:, 2 * D:])[0])}",
             f"2. the state before this token: B ⊙ x̃ of the {K - 1} tokens before it (the conv's tail), "
             f"|tail| = {np.linalg.norm(tail):.4f}",
             f"3. the depthwise conv over those and this token, times C, out_proj: the layer's output {fmt_vec(full[0])}"]
    return lines, full[0], 0.0


STEPS = {"gated_delta": delta_net_step, "mamba2": mamba_step, "short_conv": short_conv_step}

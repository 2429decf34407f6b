"""Looking inside a loaded model with model.py's own functions: prompt attention, the hidden state
entering a layer, one head's projections, the size of what each key sends through each head, the
induction probe, the uncached check of a dump, and reading token arguments.

Shape letters as in model.py: T tokens, D hidden, H query heads, KV key/value heads, d head_dim.
"""
from __future__ import annotations

import numpy as np

from ..engine import mixers, model as M
from ..engine.linear import dense, linear
from ..engine.attention import attend, causal_mask
from ..errors import MinigenError
from ..engine.layers import apply_rope
from .args import layer_head, vocab_token
from .hooks import layer_inputs
from .stats import probe_scores, repeated_tokens
from .trace import Steps, attention_steps, fmt_vec, format_steps


def prompt_attention(model, ids) -> list[np.ndarray]:
    """Uncached forward over ids; each layer's weights (H, T, T)."""
    record: list = []
    model.forward(np.asarray(ids), model.make_cache(max(len(ids), 1)), record=record)
    return record


def hidden_before(model, ids, layer: int) -> tuple[np.ndarray, tuple | None]:
    """The residual stream entering `layer` (T, D), and that layer's RoPE tables (cos, sin) or None."""
    cfg, params = model.config, model.params
    ids = np.asarray(ids)
    cache = model.make_cache(len(ids))
    x = M.hidden(params, cfg, ids, cache, n_layers=layer)                    # (T, D)
    return x, rope_tables_for(model, len(ids), layer)


def rope_tables_for(model, T: int, layer: int):
    """The layer's RoPE tables (cos, sin) at positions 0..T-1, or None."""
    seqs = M.stack([np.zeros(T, np.int64)], [model.make_cache(T)])
    return M.rope_for(model.config, seqs).get(M.rope_of(model.config, layer))


def _layer_mask(cfg, layer: int, T: int) -> np.ndarray:
    return causal_mask(T, 0, cfg.window(layer))


def head_weights(model, layer: int, head: int) -> dict:
    """One head's W_Q, W_K, W_V as (D, d) (and biases): slices of the fused (H + 2 KV) d x D matrix."""
    cfg, p = model.config, model.params["layers"][layer]
    H, d, kv = cfg.n_heads, cfg.head_dim, head // cfg.group
    rows = {"q": slice(head * d, (head + 1) * d),
            "k": slice((H + kv) * d, (H + kv + 1) * d),
            "v": slice((H + cfg.n_kv_heads + kv) * d, (H + cfg.n_kv_heads + kv + 1) * d)}
    wqkv = dense(p["wqkv"])                                                  # ((H + 2 KV) d, D) float32
    out = {f"w_{n}": wqkv[r].T for n, r in rows.items()}                     # (D, d) each
    if "bqkv" in p:
        out.update({f"b_{n}": p["bqkv"][r] for n, r in rows.items()})
    out["kv_head"] = kv
    return out


def trace_head(model, ids, layer: int, head: int) -> tuple[Steps, dict]:
    """The walk-through's numbers for one head over all of ids, and the model's own results to check
    them against: {"out": (T, d) the head's output from attend(), "weights": (T, T) from the forward's record}."""
    cfg = model.config
    layer_head(cfg, layer, head)
    h, rope = hidden_before(model, ids, layer)
    p = model.params["layers"][layer]
    x = M.norm(h, p, cfg, "attn_norm") if cfg.pre_norms else h               # (T, D)
    w = head_weights(model, layer, head)
    rotate = None if rope is None else (lambda q, k: (apply_rope(q, *rope[:2]) * _query_scale(rope), apply_rope(k, *rope[:2])))
    mask = _layer_mask(cfg, layer, len(ids))
    steps = attention_steps(x, w["w_q"], w["w_k"], w["w_v"], b_q=w.get("b_q"), b_k=w.get("b_k"),
                            b_v=w.get("b_v"), norm=_qk_norm(model, layer, head, x), rotate=rotate, mask=mask,
                            scale=cfg.attn_scale, softcap=cfg.attn_softcap)
    return steps, _model_head_output(model, x, p, rope, mask, layer, head)


def _query_scale(rope) -> np.ndarray | float:
    """Ministral 3's per-position query scale (T, 1) after RoPE, part of its rotation step; else 1."""
    return rope[2][:, None] if len(rope) > 2 else 1.0


def _qk_norm(model, layer: int, head: int, x: np.ndarray):
    """The family's q/k norm for one head as a function (q, k) -> (q, k), or None: the model's own
    `qk_norm` on every head's projection of x (OLMo 2's RMS is over all heads at once), of which the
    walk-through shows this head's part."""
    cfg, p = model.config, model.params["layers"][layer]
    if cfg.qk_norm is None:
        return None
    H, KV, d, kv = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, head // cfg.group
    qkv = linear(x, p["wqkv"], p.get("bqkv"))                              # (T, (H + 2 KV) d)
    qk = mixers.qk_norm(qkv[:, :(H + KV) * d], p, cfg).reshape(len(x), H + KV, d)  # (T, H + KV, d)
    return lambda q, k: (qk[:, head], qk[:, H + kv])


def _model_head_output(model, x, p, rope, mask, layer, head) -> dict:
    """The head's output as the model computes it: model.qkv_heads, then attend() over the GQA shapes."""
    cfg = model.config
    T, H, KV, G, d = x.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.group, cfg.head_dim
    q, k, v = (a.transpose(1, 0, 2) for a in mixers.qkv_heads(x, rope, p, cfg))  # (H, T, d), (KV, T, d) x2
    out, weights = attend(q.reshape(KV, G * T, d), k, v, np.tile(mask, (G, 1)), cfg.attn_scale, cfg.attn_softcap)
    out = out.reshape(H, T, d)                                               # (H, T, d)
    # the same heads through o_proj must give the model's attention block output
    block = mixers.attention(x, p, cfg, mixers.Pass(layer, (slice(0, T),), (mixers.kv_cache(cfg, T),), rope))
    block_err = float(np.abs(linear(out.transpose(1, 0, 2).reshape(T, H * d), p["wo"], p.get("bo")) - block).max())
    return {"out": out[head], "weights": weights.reshape(H, T, T)[head], "block_err": block_err}


# --- value-weighted attention ------------------------------------------------------------------------

def value_norms(model, ids) -> np.ndarray:
    """(L, H, T): ‖v_j · W_Oᵀ[h]‖, the size of the vector key j sends through head h of each layer, so that
    α_ij times it is query i's value-weighted attention on key j (Kobayashi et al. 2020). The output bias
    is left out (it is added once, not per key), and so is any post-norm after the output projection
    (OLMo 2, Gemma 2/3): the norms are those of the heads' own outputs."""
    cfg, params = model.config, model.params
    H, d = cfg.n_heads, cfg.head_dim
    x_in, _ = layer_inputs(model, ids)
    kv = np.arange(H) // cfg.group
    out = []
    for l in range(cfg.n_layers):
        p = params["layers"][l]
        x = M.norm(x_in[l], p, cfg, "attn_norm") if cfg.pre_norms else x_in[l]
        v = mixers.qkv_heads(x, None, p, cfg)[2].transpose(1, 0, 2)              # (KV, T, d); RoPE leaves v alone
        sent = np.einsum("htd,Dhd->htD", v[kv], dense(p["wo"]).reshape(-1, H, d))  # (H, T, D)
        out.append(np.linalg.norm(sent, axis=-1))
    return np.stack(out).astype(np.float32)


# --- induction probe ---------------------------------------------------------------------------------

def probe_candidates(tokenizer, vocab_size: int) -> np.ndarray:
    """Ordinary token ids to draw random sequences from: no added/special tokens."""
    special = set(tokenizer.hf.get_added_tokens_decoder()) if hasattr(tokenizer.hf, "get_added_tokens_decoder") else set()
    n = min(vocab_size, tokenizer.vocab_size)
    return np.array([i for i in range(n) if i not in special], dtype=np.int64)


def probe_prefix(tok, vocab_size: int, first: str | None = None) -> list[int]:
    """What precedes the repeated sequence: by default what the tokenizer puts at the start of a text
    (BOS, if it adds one); `first` "none" for nothing, or one token (its text, or #ID)."""
    if first is None:
        return tok.encode("", add_special_tokens=True)
    if first.strip().lower() == "none":
        return []
    return [vocab_token(tok, first, "--probe-first", vocab_size)]


def induction_probe(model, tok, n: int | None = None, seed: int = 0, first: str | None = None) -> dict:
    """Run prefix + r + r (r: n random ordinary tokens): {"ids", "n", "prefix", "scores": {name: (L, H)}}
    with the scores of stats.PROBE_SCORES."""
    cfg = model.config
    prefix = probe_prefix(tok, cfg.vocab_size, first)
    candidates = probe_candidates(tok, cfg.vocab_size)
    limit = (cfg.max_position_embeddings - len(prefix)) // 2
    n = min(50, limit, len(candidates)) if n is None else n
    if n < 2 or n > limit:
        raise MinigenError(f"--probe-length {n}: must be between 2 and {limit} for this model's context")
    ids = repeated_tokens(prefix, candidates, n, seed)
    record = prompt_attention(model, ids)             # None for a layer without attention: NaN scores there
    blank = np.full(next(r for r in record if r is not None).shape, np.nan, np.float32)
    record = np.stack([blank if r is None else r for r in record])           # (L, H, T, T)
    return {"ids": ids, "n": n, "prefix": prefix, "scores": probe_scores(record, ids, n)}


# --- verifying a dump ---------------------------------------------------------------------------------

# --- the model-level walk-through ------------------------------------------------------------------------

def trace_lines(model, tok, ids, layer: int, head: int, token: int, limit: int = 12,
                tol: float = 1e-4) -> tuple[list[str], bool, Steps]:
    """The seeds' walk-through on a real checkpoint for one head and one query token, ending with the check:
    (lines, whether the trace matches the model's own head output, the Steps)."""
    cfg = model.config
    tokens = tok.token_strings(ids)
    steps, own = trace_head(model, ids, layer, head)
    norm = {"layer": "LayerNorm", "rms": "RMSNorm"}[cfg.norm]
    rope = M.rope_of(cfg, layer)
    pos = ("learned positions (added to the embeddings)" if cfg.positions == "learned" else
           "no RoPE in this layer" if rope is None else
           f"RoPE on q and k (HF half-split{', the first %d of %d dims' % (rope.dim, cfg.head_dim) if rope.dim < cfg.head_dim else ''}, "
           f"theta {rope.theta:g}{', ' + rope.kind + ' scaling' if rope.kind != 'default' else ''}"
           f"{'; then q x 1 + %g log(1 + floor(pos / %d))' % (rope.query_beta, rope.original_max) if rope.query_beta else ''})")
    window = f", sliding window {cfg.sliding_window}" if cfg.is_sliding(layer) else ""
    x_is = f"after its {norm}" if cfg.pre_norms else f"as it is ({cfg.model_type} norms attention's output, not its input)"
    header = (f"{model.path}: {cfg.model_type}, layer {layer} of {cfg.n_layers}, head {head} of {cfg.n_heads} "
              f"(reads KV head {head // cfg.group} of {cfg.n_kv_heads}), d_k = {cfg.head_dim}\n"
              f"x = the residual stream entering layer {layer}, {x_is}; {pos}{window}; causal mask")
    norm_note = {"head": " (RMSNorm over the head's d_k dims, weight q_norm)",
                 "proj": f" (RMSNorm over all {cfg.n_heads} heads' q at once, then this head's slice of q_norm)",
                 None: ""}[cfg.qk_norm]
    default_scale = abs(cfg.attn_scale - cfg.head_dim ** -0.5) < 1e-12
    scale_note = "" if default_scale else f" = 1/sqrt({1 / cfg.attn_scale ** 2:g}) (query_pre_attn_scalar, not d_k)"
    rope_note = "" if rope is None or rope.dim == cfg.head_dim else f" (dims 0-{rope.dim - 1} rotate, the rest pass through)"
    lines = format_steps(steps, tokens, token, limit=limit, header=header, norm_note=norm_note,
                         rope_note=rope_note, scale_note=scale_note)
    err = float(np.abs(steps.out[token] - own["out"][token]).max())
    werr = float(np.abs(steps.weights[token] - own["weights"][token]).max())
    ok = err <= tol * max(1.0, float(np.abs(own["out"][token]).max())) and werr <= tol
    lines += ["8. check against the model's own computation (model.qkv_heads + attention.attend):",
              f"   model's head output = {fmt_vec(own['out'][token])}",
              f"   max |trace - model| = {err:.2e} (output), {werr:.2e} (weights): "
              + ("equal" if ok else "DIFFERENT") + f" within {tol:g}"]
    return lines, ok, steps

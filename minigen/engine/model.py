"""The decoder forward pass: stateless functions of (params, config, token ids, cache) -> logits.

Shape letters:
    N  rows of this forward: the new tokens of each sequence, one sequence after another
    B  sequences in this forward      T  new tokens of one sequence    S  tokens in its cache after it
    D  hidden size                     V  vocabulary size
    H  query heads      KV  key/value heads      G  H // KV (query heads per KV head)
    d  head_dim         F  MLP intermediate size

Weights have HF's Linear shape (out, in) and are applied as x @ w.T (linear.py: every product with a
weight goes through it); q/k/v and gate/up are fused at load (checkpoint/weights.py). One function serves
every family: the differences are fields of `Config` (config.py), which each family sets in
checkpoint/families.py. A layer is

    h = attn_norm(x)                 [none: OLMo 2]
    a = mixer(h)                     attention over each sequence's own cache, or a recurrence over its
                                     state (mixers.py: one entry per kind of layer)
    a = attn_post_norm(a)            [Gemma 2/3, OLMo 2]
    x = x + r a                      [parallel residual: the MLP reads x from before this add, GPT-NeoX]
    m = mlp(mlp_norm(x))             (MLPS: gated, plain, or routed experts, moe.py, with a shared MLP beside)
    m = mlp_post_norm(m)             [Gemma 2/3, OLMo 2]
    x = x + r m                      r: Granite's residual_multiplier (else 1)

Granite and Falcon-H1 also scale the embeddings (embed_multiplier) and the logits (logits_multiplier:
Granite's 1 / logits_scaling, Falcon-H1's lm_head_multiplier).

Several sequences can share one forward (`forward_batch`): their new rows are stacked, so every
projection reads the weights once for all of them, and only the mixer goes sequence by sequence. The
steps before and after the mixer treat each row alone, so a long prompt runs each of them in chunks of
rows on both cores (parallel.by_rows, once per stage); attention splits its query blocks itself. Hooks
(minigen.inspect) see whole arrays, between the steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import parallel
from .config import Config
from .hooks import Hooks
from .layers import activation, gated, layer_norm, query_scale, rms_norm_rows, rope_tables, softcap
from .linear import linear, rows_of
from .mixers import Pass, make_cache, mixer_of
from .moe import moe_mlp
from .quant.matrix import release_scratch
from . import cache as caches
from ..errors import MinigenError


@dataclass(frozen=True)
class Seq:
    """One sequence's part of a forward: its rows of the stacked input, and its per-layer caches."""
    rows: slice
    cache: list


# --- the forward pass ------------------------------------------------------------------------------

def forward(params: dict, cfg: Config, ids: np.ndarray, cache: list, last_only: bool = False,
            record: list | None = None, hooks: Hooks | None = None, length: int | None = None) -> np.ndarray:
    """Logits (T, V), or (1, V) for the last position only. Appends each layer's attention weights
    (H, T, S) to `record` when it is a list (None for a layer without attention); the cache advances by T.
    `length`: the sequence length whose RoPE factors every position gets (longrope; default: where this
    forward ends), for a caller computing one long sequence in pieces, as transformers computes it in one."""
    with parallel.for_decode(len(ids)):   # a decode step on a busy machine: OpenBLAS on one thread
        seqs = stack([ids], [cache])
        x = embed(params, cfg, ids, positions(seqs))                         # (T, D), our own copy
        x = run_layers(x, params, cfg, seqs, record=record, hooks=hooks, last_only=last_only, length=length)
        return unembed(x, params, cfg)                                       # (T, V), or (1, V)


def forward_batch(params: dict, cfg: Config, ids: list[np.ndarray], caches: list[list],
                  last_only: bool = True) -> list[np.ndarray]:
    """Several sequences in one pass over the weights, each with its own cache (and so its own
    positions): the logits of each, (1, V) for its last position or (T_b, V). Equal, row for row, to
    a `forward` of each sequence alone."""
    seqs = stack(ids, caches)
    with parallel.for_decode(seqs[-1].rows.stop):
        x = embed(params, cfg, np.concatenate(ids), positions(seqs))        # (N, D)
        x = run_layers(x, params, cfg, seqs, last_only=last_only)            # (N, D), or (B, D)
        if last_only:
            return list(unembed(x, params, cfg)[:, None])                    # B x (1, V)
        logits = unembed(x, params, cfg)                                     # (N, V)
    return [logits[s.rows] for s in seqs]


def hidden(params: dict, cfg: Config, ids: np.ndarray, cache: list, record: list | None = None,
           n_layers: int | None = None, hooks: Hooks | None = None) -> np.ndarray:
    """The residual stream (T, D) after the first n_layers layers (all of them by default), before the
    final norm."""
    seqs = stack([ids], [cache])
    x = embed(params, cfg, ids, positions(seqs))                             # (T, D)
    return run_layers(x, params, cfg, seqs, 0, n_layers, record, hooks)


def run_layers(x: np.ndarray, params: dict, cfg: Config, seqs: list[Seq], start: int = 0,
               stop: int | None = None, record: list | None = None, hooks: Hooks | None = None,
               last_only: bool = False, length: int | None = None) -> np.ndarray:
    """Layers start..stop-1 on the residual stream x (N, D) of the sequences `seqs`, whose caches are
    at the positions where these rows begin. With last_only, only each sequence's last row of the
    result is wanted, (B, D): the model's final layer then computes its output at those rows alone,
    as llama.cpp does (what the cache keeps it still computes for every row), unless hooks or
    `record` look at every row."""
    tables, n_rows = rope_for(cfg, seqs, length), len(x)
    rows = tuple(s.rows for s in seqs)
    for i in range(start, cfg.n_layers if stop is None else stop):
        last = last_only and i == cfg.n_layers - 1 and record is None and not hooks
        at = Pass(i, rows, tuple(s.cache[i] for s in seqs), tables.get(rope_of(cfg, i)), record, hooks, last)
        x = layer(x, params["layers"][i], cfg, at)
    release_scratch()   # the buffers stored matrices dequantized a long prompt's chunks into (quant/matrix.py)
    if parallel.threads_for(n_rows) > 1:   # a long prompt's (the final layer may have kept one row)
        parallel.release_free_heap()
    if last_only and len(x) > len(seqs):
        x = x[[r.stop - 1 for r in rows]]                                    # (B, D)
    return x


def layer(x: np.ndarray, p: dict, cfg: Config, at: Pass) -> np.ndarray:
    """One decoder layer on the residual stream x (N, D), updated in place and returned. With `at.last`,
    its output at each sequence's last row only, (B, D): the mixer still advances every row's cache."""
    h = rows(norm, x, p=p, cfg=cfg, name="attn_norm") if cfg.pre_norms else x   # (N, D)
    a = mixer_of(cfg, at.layer).forward(h, p, cfg, at)                       # (N, D), or (B, D)
    if at.last:
        x = x[at.last_rows]                                                  # (B, D)
    return rows(after_mixer, x, a, p=p, cfg=cfg, i=at.layer, hooks=at.hooks, split=not at.hooks)


def after_mixer(x: np.ndarray, a: np.ndarray, p: dict, cfg: Config, i: int, hooks: Hooks | None) -> np.ndarray:
    """The rest of a layer on rows x (N, D), given what the mixer adds, a (N, D): the post-norm, the
    residual add, the MLP block and its residual add (x updated in place)."""
    if cfg.post_norms:
        a = norm(a, p, cfg, "attn_post_norm")
    a = residual_scaled(a, cfg)
    if hooks:
        a = hooks.attn_out(i, a)
    if cfg.parallel_residual:  # both blocks read the same x
        m = mlp_block(x, p, cfg)
        x += a
    else:
        x += a
        m = mlp_block(x, p, cfg)                                             # (N, D)
    m = residual_scaled(m, cfg)
    if hooks:
        m = hooks.mlp_out(i, m)
    x += m
    if hooks:
        hooks.resid(i, x)
    return x


def rows(fn, *arrays, split: bool = True, **kw):
    """fn(*arrays, **kw) for a step that treats each row alone: a long prompt's rows in chunks on both
    cores (parallel.by_rows), unless `split` is False (hooks see whole arrays)."""
    return parallel.by_rows(fn, *arrays, **kw) if split else fn(*arrays, **kw)


def residual_scaled(a: np.ndarray, cfg: Config) -> np.ndarray:
    """What a block adds to the residual stream, times Granite's residual_multiplier (in place)."""
    if cfg.residual_multiplier != 1.0:
        a *= np.float32(cfg.residual_multiplier)
    return a


# --- MLPs ------------------------------------------------------------------------------------------

def mlp_block(x: np.ndarray, p: dict, cfg: Config) -> np.ndarray:
    """What the MLP block adds to rows of the residual stream x (N, D): norm, MLP, post-norm."""
    h = norm(x, p, cfg, "mlp_norm") if cfg.pre_norms or cfg.parallel_residual else x
    m = MLPS[cfg.mlp](h, p, cfg)                                             # (N, D)
    return norm(m, p, cfg, "mlp_post_norm") if cfg.post_norms else m


def gated_mlp(x: np.ndarray, p: dict, cfg: Config) -> np.ndarray:
    """down(act(gate x) * up x), gate and up fused into one (2F, D) matrix (moe.gated)."""
    return gated(x, p["w_gate_up"], p["w_down"], activation(cfg.act), p.get("b_gate_up"), p.get("b_down"))


def plain_mlp(x: np.ndarray, p: dict, cfg: Config) -> np.ndarray:
    """down(act(up x)): GPT-2, GPT-NeoX."""
    return linear(activation(cfg.act)(linear(x, p["w_up"], p.get("b_up"))), p["w_down"], p.get("b_down"))


MLPS = {"gated": gated_mlp, "plain": plain_mlp, "moe": moe_mlp}   # Config.mlp -> the layer's MLP (moe: moe.py)


# --- around the layers -------------------------------------------------------------------------------

def stack(ids: list[np.ndarray], caches: list[list]) -> list[Seq]:
    """The Seq of each sequence whose new ids are stacked one after another."""
    ends = np.cumsum([len(i) for i in ids])
    return [Seq(slice(int(end - len(i)), int(end)), c) for i, end, c in zip(ids, ends, caches)]


def positions(seqs: list[Seq]) -> np.ndarray:
    """(N,) each row's position in its own sequence."""
    return np.concatenate([span(s) for s in seqs])


def span(s: Seq) -> np.ndarray:
    """(T,) the positions of one sequence's new rows: from its cache's offset on."""
    return np.arange(s.cache[0].offset, s.cache[0].offset + s.rows.stop - s.rows.start)


def rope_of(cfg: Config, layer: int):
    """This layer's Rope, or None (learned positions, or a layer without RoPE)."""
    return cfg.rope[layer] if cfg.positions == "rope" else None


def rope_for(cfg: Config, seqs: list[Seq], length: int | None = None) -> dict:
    """{Rope: (cos, sin), each (N, dim)}: one pair of tables per distinct RoPE of the model, each
    sequence's rows at its own positions (longrope picks its factors per sequence, by the length it
    reaches in this forward, or `length`)."""
    if cfg.positions != "rope":
        return {}
    tables = {}
    for r in set(cfg.rope) - {None}:
        parts = [rope_tables_for(r, span(s), length) for s in seqs]           # per sequence: (T, dim) x2 [, (T,)]
        tables[r] = parts[0] if len(parts) == 1 else tuple(np.concatenate(t) for t in zip(*parts))
    return tables


def rope_tables_for(r, positions: np.ndarray, length: int | None = None) -> tuple:
    """(cos, sin) for these positions, and Ministral 3's query scale (T,) when its Rope has one."""
    return rope_tables(r, positions, length) + ((query_scale(r, positions),) if r.query_beta else ())


def embed(params: dict, cfg: Config, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    x = rows_of(params["embed"], ids)                                        # (N, D), a copy
    if cfg.embed_scale:  # Gemma: sqrt(D), rounded to the activation dtype as HF does
        x *= np.float32(cfg.hidden_size ** 0.5)
    if cfg.embed_multiplier != 1.0:  # Granite, Falcon-H1
        x *= np.float32(cfg.embed_multiplier)
    if cfg.positions == "learned":
        x += params["pos_embed"][positions]
    return x


def unembed(x: np.ndarray, params: dict, cfg: Config) -> np.ndarray:
    """The final norm, the output projection, the logits multiplier and the family's soft-cap: (N, D) -> (N, V)."""
    logits = linear(norm(x, params, cfg, "final_norm"), params["lm_head"])  # (N, V)
    if cfg.logits_multiplier != 1.0:  # Granite: / logits_scaling; Falcon-H1: x lm_head_multiplier
        logits *= np.float32(cfg.logits_multiplier)
    return softcap(logits, cfg.final_softcap) if cfg.final_softcap else logits


def norm(x: np.ndarray, p: dict, cfg: Config, name: str) -> np.ndarray:
    if cfg.norm == "layer":
        return layer_norm(x, p[name], p[name + "_b"], cfg.norm_eps)
    return rms_norm_rows(x, p[name], cfg.norm_eps)


# --- the loaded model --------------------------------------------------------------------------------

class Model:
    """A checkpoint's forward pass: its Config and params (float32 arrays, or StoredMatrix where a weight is
    kept in its checkpoint's own type). It holds no generation state (the
    cache is passed in) and loads nothing itself: `minigen.load` builds it beside the tokenizer."""

    def __init__(self, config: Config, params: dict, generation_config: dict | None = None,
                 path: Path | str | None = None):
        self.config, self.params = config, params
        self.generation_config = generation_config or {}   # generation_config.json: sampling defaults, EOS
        self.path = path

    def make_cache(self, capacity: int = 256) -> list:
        """One cache per layer, of the layer's kind, all at offset 0."""
        return make_cache(self.config, capacity)

    def forward(self, ids, cache: list, last_only: bool = False, record: list | None = None,
                hooks: Hooks | None = None, length: int | None = None) -> np.ndarray:
        return forward(self.params, self.config, self.check_ids(ids), cache, last_only, record, hooks, length)

    def resume(self, cache: list, common: int, total: int) -> int:
        """Cut `cache`, whose first `common` positions hold the sequence's ids, back to what a forward taking
        the sequence to `total` positions may keep (cache.resume: longrope's rule, a recurrent layer's
        snapshots). Returns how many it kept: the caller feeds the ids from there on."""
        return caches.resume(self.config, cache, common, total)

    def reusable(self, cached: int, common: int, total: int) -> int:
        """What `resume` would keep of a cache computed for `cached` positions (the rule alone)."""
        return caches.reusable(self.config, cached, common, total)

    def forward_batch(self, ids: list, caches: list[list], last_only: bool = True) -> list[np.ndarray]:
        """`forward` of several sequences, each with its own cache, in one pass over the weights."""
        return forward_batch(self.params, self.config, [self.check_ids(i) for i in ids], caches, last_only)

    def logits(self, ids) -> np.ndarray:
        """Uncached forward over all ids: float32 (len(ids), vocab_size)."""
        return self.forward(ids, self.make_cache(max(len(ids), 1)))

    def check_ids(self, ids) -> np.ndarray:
        """ids as a 1-D integer array within the vocabulary: the public edge of the forward pass."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or len(ids) == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise MinigenError("token ids must be a non-empty 1-D sequence of integers")
        if ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise MinigenError(f"token id {int(ids.max() if ids.max() >= self.config.vocab_size else ids.min())} "
                               f"is outside the vocabulary (0..{self.config.vocab_size - 1})")
        images = np.isin(ids, self.config.image_token_ids) if self.config.image_token_ids else None
        if images is not None and images.any():
            raise MinigenError(f"token id {int(ids[images][0])} at position {int(np.argmax(images))} is the "
                               f"checkpoint's image token: minigen runs the {self.config.wrapper} checkpoint's "
                               f"language model only (its vision tower is not loaded), so a prompt cannot hold images")
        return ids

    @property
    def n_params(self) -> int:
        seen, total = set(), 0
        for a in [v for k, v in self.params.items() if k != "layers"] + \
                 [v for layer in self.params["layers"] for v in layer.values()]:
            for m in a if isinstance(a, list) else [a]:   # stored experts: a list of matrices
                if id(m) not in seen:
                    seen.add(id(m))
                    total += m.size
        return total

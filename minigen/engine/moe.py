"""Routed experts (a sparse mixture-of-experts MLP), as pure NumPy functions in float32.

Shape letters as in model.py, plus
    E  experts       k  experts per token (top-k)       F  one expert's intermediate size

A router scores every expert for every token (N, E); each token goes to its k best, and its output is
the weighted sum of those experts' gated MLPs:

    logits  = x @ router.T                         (N, E)
    idx     = the k largest logits of each row     (N, k), best first (torch.topk's order)
    weights = the family's normalisation           (N, k): GraniteMoE, Mixtral: softmax over the k chosen logits
    out[n]  = sum_j weights[n, j] * expert_{idx[n, j]}(x[n]),   expert_e(x) = down_e(act(gate_e x) * up_e x)
            [+ shared(x[n])]                       Granite 4.0-H: a gated MLP every token also goes through

The experts stay as the checkpoint stores them, 3-D: gate_up (E, 2F, D) and down (E, D, F), each expert's
slice applied as x @ w[e].T without a copy. A prompt's tokens are grouped by expert, so prefill is one GEMM
per expert that any token chose (at most E), not a product per token and expert.
"""
from __future__ import annotations

import numpy as np

from .attention import softmax
from .layers import activation, gated
from .linear import linear


def router_logits(x: np.ndarray, router: np.ndarray) -> np.ndarray:
    """(N, D) -> (N, E): every expert's score for every token."""
    return linear(x, router)


def top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """(N, E) -> (N, k) the indices of each row's k largest logits, largest first (ties: lower index first)."""
    return np.argsort(-logits, axis=-1, kind="stable")[:, :k]


def topk_softmax(logits: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """GraniteMoE, Mixtral: a softmax over the k chosen logits only, (N, k)."""
    return softmax(np.take_along_axis(logits, idx, axis=-1))


def softmax_topk(logits: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Qwen2-MoE / OLMoE without norm_topk_prob: the chosen experts' shares of a softmax over all E."""
    return np.take_along_axis(softmax(logits), idx, axis=-1)


NORMALISATIONS = {"topk_softmax": topk_softmax, "softmax_topk": softmax_topk}


def route(x: np.ndarray, router: np.ndarray, k: int, normalisation: str = "topk_softmax"):
    """Which experts each token of x (N, D) goes to and with what weight: idx (N, k), weights (N, k)."""
    logits = router_logits(x, router)                                        # (N, E)
    idx = top_k(logits, k)                                                   # (N, k)
    return idx, NORMALISATIONS[normalisation](logits, idx)


def by_expert(idx: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """{expert: (token rows, their slot j in idx)} for every expert some token chose, in expert order.
    A token chooses an expert at most once, so each expert's rows are distinct."""
    N, k = idx.shape
    order = np.argsort(idx, axis=None, kind="stable")                        # flat (n, j) sorted by expert
    experts = idx.reshape(-1)[order]
    starts = np.flatnonzero(np.r_[True, experts[1:] != experts[:-1]])
    ends = np.r_[starts[1:], len(order)]
    return {int(experts[s]): (order[s:e] // k, order[s:e] % k) for s, e in zip(starts, ends)}


def experts_out(x: np.ndarray, idx: np.ndarray, weights: np.ndarray, gate_up: np.ndarray, down: np.ndarray,
                act: str) -> np.ndarray:
    """(N, D): each token's weighted sum of its experts' gated MLPs, one GEMM pair per expert chosen.
    Experts are added in expert order into zeros, as transformers' index_add_ loop does."""
    out = np.zeros_like(x)                                                   # (N, D)
    fn = activation(act)
    for e, (rows, slots) in by_expert(idx).items():
        y = gated(x[rows], gate_up[e], down[e], fn)                          # (n_e, D)
        y *= weights[rows, slots][:, None]
        out[rows] += y
    return out


def without(idx: np.ndarray, weights: np.ndarray, experts) -> np.ndarray:
    """The routing weights (N, k) with the given experts' shares set to 0 (ablation: those experts add
    nothing, the other experts' weights are left as the router gave them)."""
    return np.where(np.isin(idx, list(experts)), np.float32(0), weights).astype(np.float32)


def moe_mlp(x: np.ndarray, p: dict, cfg) -> np.ndarray:
    """The MLP kind "moe" on rows x (N, D), already normed: route, then the chosen experts, plus the shared
    MLP (w_gate_up, w_down) where the family has one (cfg.shared_intermediate_size)."""
    idx, weights = route(x, p["router"], cfg.experts_per_token, cfg.router)  # (N, k) x2
    out = experts_out(x, idx, weights, p["experts_gate_up"], p["experts_down"], cfg.act)
    if cfg.shared_intermediate_size:  # transformers adds it to the experts' sum: moe(x) + shared_mlp(x)
        out += gated(x, p["w_gate_up"], p["w_down"], activation(cfg.act))
    return out

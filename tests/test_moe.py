"""Routed experts (minigen/engine/moe.py): the routing and the grouped expert products against a plain loop
over tokens and their experts, on hand-built arrays; the GraniteMoE fixtures' parity with transformers is in
test_parity.py, their routing and expert ablation in test_experts.py."""
import numpy as np
import pytest

from minigen.engine import moe
from minigen.engine.layers import silu

RNG = np.random.default_rng(0)
N, D, F, E, K = 23, 12, 6, 5, 2


def arrays():
    x = RNG.standard_normal((N, D)).astype(np.float32)
    router = RNG.standard_normal((E, D)).astype(np.float32)
    gate_up = RNG.standard_normal((E, 2 * F, D)).astype(np.float32) * 0.3
    down = RNG.standard_normal((E, D, F)).astype(np.float32) * 0.3
    return x, router, gate_up, down


def naive(x, router, gate_up, down, k, normalisation):
    """Token by token: the k best experts, their weights, each expert's gated MLP, the weighted sum."""
    out = np.zeros_like(x, dtype=np.float64)
    for n in range(len(x)):
        logits = (router.astype(np.float64) @ x[n])
        best = sorted(range(E), key=lambda e: -logits[e])[:k]
        if normalisation == "topk_softmax":
            w = np.exp(logits[best] - logits[best].max())
            w /= w.sum()
        else:
            p = np.exp(logits - logits.max())
            w = (p / p.sum())[best]
        for e, we in zip(best, w):
            h = gate_up[e].astype(np.float64) @ x[n]
            g = h[:F] / (1 + np.exp(-h[:F])) * h[F:]
            out[n] += we * (down[e].astype(np.float64) @ g)
    return out


@pytest.mark.parametrize("normalisation", sorted(moe.NORMALISATIONS))
@pytest.mark.parametrize("k", [1, 2, E])
def test_grouped_experts_equal_a_loop_over_tokens(normalisation, k):
    x, router, gate_up, down = arrays()
    idx, weights = moe.route(x, router, k, normalisation)
    got = moe.experts_out(x, idx, weights, gate_up, down, "silu")
    assert got.dtype == np.float32 and got.shape == (N, D)
    np.testing.assert_allclose(got, naive(x, router, gate_up, down, k, normalisation), atol=2e-5)


def test_top_k_is_best_first_and_the_weights_are_a_softmax_of_the_chosen():
    logits = np.array([[0.1, 3.0, -1.0, 2.0], [5.0, 5.5, 0.0, -2.0]], np.float32)
    idx = moe.top_k(logits, 2)
    assert idx.tolist() == [[1, 3], [1, 0]]
    w = moe.topk_softmax(logits, idx)
    np.testing.assert_allclose(w[0], [1 / (1 + np.exp(-1.0)), 1 - 1 / (1 + np.exp(-1.0))], rtol=1e-6)
    np.testing.assert_allclose(w.sum(-1), 1, rtol=1e-6)
    assert (moe.softmax_topk(logits, idx).sum(-1) < 1).all()


def test_by_expert_groups_every_choice_once():
    idx = np.array([[2, 0], [0, 1], [2, 1], [0, 2]])
    groups = moe.by_expert(idx)
    assert list(groups) == [0, 1, 2]
    assert {e: sorted(rows.tolist()) for e, (rows, _) in groups.items()} == {0: [0, 1, 3], 1: [1, 2], 2: [0, 2, 3]}
    for e, (rows, slots) in groups.items():
        assert (idx[rows, slots] == e).all()


def test_an_ablated_expert_adds_nothing():
    x, router, gate_up, down = arrays()
    idx, weights = moe.route(x, router, K)
    chosen = int(idx[0, 0])
    zeroed = down.copy()
    zeroed[chosen] = 0
    np.testing.assert_allclose(moe.experts_out(x, idx, moe.without(idx, weights, [chosen]), gate_up, down, "silu"),
                               moe.experts_out(x, idx, weights, gate_up, zeroed, "silu"), atol=1e-6)


def test_one_token_one_expert_is_one_gated_mlp():
    x, _, gate_up, down = arrays()
    idx, w = np.array([[3]]), np.array([[1.0]], np.float32)
    h = gate_up[3] @ x[0]
    np.testing.assert_allclose(moe.experts_out(x[:1], idx, w, gate_up, down, "silu")[0],
                               down[3] @ (silu(h[:F]) * h[F:]), rtol=1e-5)


def test_the_shared_mlp_is_added_to_the_experts_sum():
    """Granite 4.0-H: moe_mlp = the routed experts' sum + a gated MLP of its own width on every token."""
    from types import SimpleNamespace
    x, router, gate_up, down = arrays()
    Fs = 7
    shared_gate_up = RNG.standard_normal((2 * Fs, D)).astype(np.float32) * 0.3
    shared_down = RNG.standard_normal((D, Fs)).astype(np.float32) * 0.3
    p = dict(router=router, experts_gate_up=gate_up, experts_down=down, w_gate_up=shared_gate_up, w_down=shared_down)
    cfg = SimpleNamespace(experts_per_token=K, router="topk_softmax", act="silu", shared_intermediate_size=Fs)
    h = x.astype(np.float64) @ shared_gate_up.T.astype(np.float64)
    shared = (h[:, :Fs] / (1 + np.exp(-h[:, :Fs])) * h[:, Fs:]) @ shared_down.T.astype(np.float64)
    want = naive(x, router, gate_up, down, K, "topk_softmax") + shared
    np.testing.assert_allclose(moe.moe_mlp(x, p, cfg), want, atol=2e-5)
    alone = moe.moe_mlp(x, p, SimpleNamespace(**{**vars(cfg), "shared_intermediate_size": 0}))   # GraniteMoE's
    np.testing.assert_allclose(alone, naive(x, router, gate_up, down, K, "topk_softmax"), atol=2e-5)

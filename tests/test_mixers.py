"""The non-attention token mixers against transformers' torch reference kernels on random arrays
(tests/fixtures/mixers, made by scripts/make_mixer_fixtures.py), and each one's pieces = one piece."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from minigen.engine import gated_delta, short_conv as short_conv_module, ssm
from minigen.engine.short_conv import causal_conv, short_conv

FIX = Path(__file__).parent / "fixtures" / "mixers"


def load(name: str) -> dict:
    with np.load(FIX / f"{name}.npz") as z:
        return {k: z[k] for k in z.files}


def test_causal_conv_whole_and_stepwise():
    f = load("conv")
    K = f["w"].shape[1]
    y, tail = causal_conv(f["x"], np.zeros((K - 1, f["x"].shape[1]), np.float32), f["w"], f["b"])
    np.testing.assert_allclose(y, f["full"], atol=1e-6)
    np.testing.assert_allclose(tail, f["x"][-(K - 1):])
    tail, steps = np.zeros((K - 1, f["x"].shape[1]), np.float32), []
    for t in range(len(f["x"])):
        y, tail = causal_conv(f["x"][t:t + 1], tail, f["w"], f["b"])
        steps.append(y)
    np.testing.assert_allclose(np.concatenate(steps), f["steps"], atol=1e-6)


def test_causal_conv_in_blocks_of_rows_equals_transformers(monkeypatch):
    """Blocks of 8 rows (the fewest CONV_BLOCK gives) over the fixture's prompt: every block reads the
    K - 1 inputs before it."""
    f = load("conv")
    monkeypatch.setattr(short_conv_module, "CONV_BLOCK", 1)
    K = f["w"].shape[1]
    assert len(f["x"]) > 8   # two blocks at least
    y, _ = causal_conv(f["x"], np.zeros((K - 1, f["x"].shape[1]), np.float32), f["w"], f["b"])
    np.testing.assert_allclose(y, f["full"], atol=1e-6)


@pytest.mark.parametrize("C", [1, 8, 48, 64, 128])
def test_unit_lower_inverse_equals_float64_inverse(C):
    """Blocks substituted, then merged in pairs (C = 64, 128), or one block substituted (48: not 8 times
    a power of two), over stacked heads and chunks."""
    rng = np.random.default_rng(C)
    a = np.tril(rng.uniform(-1, 1, (3, 2, C, C)), -1).astype(np.float32) * np.float32(0.3)
    want = np.linalg.inv(np.eye(C) + a.astype(np.float64))
    got = gated_delta.unit_lower_inverse(a)
    assert got.shape == a.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=3e-6 * max(1.0, np.abs(want).max()))


def normed(f: dict):
    """q, k l2-normed and q scaled, repeated over the value heads, as (H, T, d) and (H, T)."""
    H, Hk = f["v"].shape[1], f["q"].shape[1]
    q = gated_delta.l2norm(f["q"]) * np.float32(f["q"].shape[-1] ** -0.5)
    k = gated_delta.l2norm(f["k"])
    q, k = np.repeat(q, H // Hk, axis=1), np.repeat(k, H // Hk, axis=1)
    return (q.transpose(1, 0, 2), k.transpose(1, 0, 2), f["v"].transpose(1, 0, 2), f["g"].T, f["beta"].T)


def test_gated_delta_chunked_equals_transformers():
    f = load("gated_delta")
    o, state = gated_delta.chunked(*normed(f), f["state"])
    np.testing.assert_allclose(o.transpose(1, 0, 2), f["o_chunk"], atol=2e-5)
    np.testing.assert_allclose(state, f["state_chunk"], atol=2e-5)


def test_gated_delta_recurrent_equals_transformers():
    f = load("gated_delta")
    q, k, v, g, beta = normed(f)
    state, outs = f["state"].copy(), []
    for t in range(q.shape[1]):
        o, state = gated_delta.recurrent_step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state)
        outs.append(o)
    np.testing.assert_allclose(np.stack(outs), f["o_rec"], atol=2e-5)
    np.testing.assert_allclose(state, f["state_rec"], atol=2e-5)


@pytest.mark.parametrize("cut", [1, 5, 64, 100])
def test_gated_delta_in_pieces_equals_one_piece(cut):
    """Chunked over [0, cut) then [cut, T) = chunked over [0, T): the state carries everything."""
    f = load("gated_delta")
    q, k, v, g, beta = normed(f)
    whole, s_whole = gated_delta.chunked(q, k, v, g, beta, f["state"])
    a, s = gated_delta.chunked(q[:, :cut], k[:, :cut], v[:, :cut], g[:, :cut], beta[:, :cut], f["state"])
    b, s = gated_delta.chunked(q[:, cut:], k[:, cut:], v[:, cut:], g[:, cut:], beta[:, cut:], s)
    np.testing.assert_allclose(np.concatenate([a, b], axis=1), whole, atol=2e-5)
    np.testing.assert_allclose(s, s_whole, atol=2e-5)


def test_mamba2_chunked_equals_transformers():
    f = load("mamba2")
    delta = ssm.step_size(f["dt"], f["dt_bias"], (0.0, float("inf")))
    y, state = ssm.chunked(f["x"], delta, f["A"], f["B"], f["C"], f["D"], f["state"], int(f["chunk"]))
    np.testing.assert_allclose(y, f["y"], atol=2e-5)
    np.testing.assert_allclose(state, f["state_end"], atol=2e-5)


def test_mamba2_recurrent_equals_transformers():
    f = load("mamba2")
    state, ys = f["state"].copy(), []
    for t in range(len(f["x"])):
        y, state = ssm.recurrent_step(f["x"][t], ssm.step_size(f["dt"][t], f["dt_bias"]), f["A"], f["B"][t],
                                      f["C"][t], f["D"], state)
        ys.append(y)
    np.testing.assert_allclose(np.stack(ys), f["y_steps"], atol=2e-5)
    np.testing.assert_allclose(state, f["state_steps"], atol=2e-5)


@pytest.mark.parametrize("cut", [1, 7, 16, 30])
def test_mamba2_in_pieces_equals_one_piece(cut):
    f = load("mamba2")
    delta = ssm.step_size(f["dt"], f["dt_bias"])
    args = lambda s, e: (f["x"][s:e], delta[s:e], f["A"], f["B"][s:e], f["C"][s:e], f["D"])  # noqa: E731
    whole, s_whole = ssm.chunked(*args(0, None), f["state"], 16)
    a, s = ssm.chunked(*args(0, cut), f["state"], 16)
    b, s = ssm.chunked(*args(cut, None), s, 16)
    np.testing.assert_allclose(np.concatenate([a, b]), whole, atol=2e-5)
    np.testing.assert_allclose(s, s_whole, atol=2e-5)


# --- whole mixers, weights as transformers names them ---------------------------------------------

def test_gated_deltanet_layer_equals_transformers():
    f = load("layers")
    w = lambda n: f[f"gdn_{n}"]  # noqa: E731
    p = {"w_in": np.concatenate([w("in_proj_qkv.weight"), w("in_proj_z.weight"), w("in_proj_b.weight"),
                                 w("in_proj_a.weight")]),
         "conv_w": w("conv1d.weight")[:, 0], "A_log": w("A_log"), "dt_bias": w("dt_bias"),
         "gate_norm": w("norm.weight"), "w_out": w("out_proj.weight")}
    m = SimpleNamespace(key_heads=2, value_heads=4, key_dim=8, value_dim=8, eps=1e-6)
    x = f["gdn_x"]
    tail0, state0 = np.zeros((3, p["conv_w"].shape[0]), np.float32), np.zeros((4, 8, 8), np.float32)
    y, tail, state = gated_delta.gated_deltanet(x, tail0, state0, p, m)
    np.testing.assert_allclose(y, f["gdn_y"], atol=2e-5)
    # a prompt in pieces, the last token by the one-step recurrence
    a, tail, state = gated_delta.gated_deltanet(x[:40], tail0, state0, p, m)
    b, tail, state = gated_delta.gated_deltanet(x[40:-1], tail, state, p, m)
    c, tail, state = gated_delta.gated_deltanet(x[-1:], tail, state, p, m)
    np.testing.assert_allclose(np.concatenate([a, b, c]), f["gdn_y"], atol=2e-5)


def test_short_conv_layer_equals_transformers():
    f = load("layers")
    w = lambda n: f[f"conv_{n}"]  # noqa: E731
    p = {"w_in": w("in_proj.weight"), "b_in": w("in_proj.bias"), "conv_w": w("conv.weight")[:, 0],
         "conv_b": w("conv.bias"), "w_out": w("out_proj.weight"), "b_out": w("out_proj.bias")}
    x = f["conv_x"]
    tail0 = np.zeros((2, 16), np.float32)
    y, _ = short_conv(x, tail0, p)
    np.testing.assert_allclose(y, f["conv_y"], atol=2e-5)
    ys, tail = [], tail0
    for t in range(len(x)):
        y, tail = short_conv(x[t:t + 1], tail, p)
        ys.append(y)
    np.testing.assert_allclose(np.concatenate(ys), f["conv_y"], atol=2e-5)


def mamba_params(f: dict, prefix: str, normed: bool) -> dict:
    w = lambda n: f[f"{prefix}_{n}"]  # noqa: E731
    p = {"w_in": w("in_proj.weight"), "conv_w": w("conv1d.weight")[:, 0], "conv_b": w("conv1d.bias"),
         "A_log": w("A_log"), "D": w("D"), "dt_bias": w("dt_bias"), "w_out": w("out_proj.weight")}
    if normed:
        p["gate_norm"] = w("norm.weight")
    return p


@pytest.mark.parametrize("prefix, groups, normed", [("granite", 2, True), ("falcon", 1, False)])
def test_mamba2_layer_equals_transformers(prefix, groups, normed):
    f = load("layers")
    p = mamba_params(f, prefix, normed)
    m = SimpleNamespace(heads=4, head_dim=8, groups=groups, state_size=8, chunk=8, limit=(0.0, float("inf")),
                        eps=1e-6 if prefix == "granite" else 1e-5, norm_before_gate=False)
    x = f[f"{prefix}_x"]
    conv_dim = p["conv_w"].shape[0]
    tail0, state0 = np.zeros((3, conv_dim), np.float32), np.zeros((4, 8, 8), np.float32)
    y, _, _ = ssm.mamba2(x, tail0, state0, p, m)
    np.testing.assert_allclose(y, f[f"{prefix}_y"], atol=2e-5)
    a, tail, state = ssm.mamba2(x[:11], tail0, state0, p, m)
    ys = [a]
    for t in range(11, len(x)):
        y, tail, state = ssm.mamba2(x[t:t + 1], tail, state, p, m)
        ys.append(y)
    np.testing.assert_allclose(np.concatenate(ys), f[f"{prefix}_y"], atol=2e-5)


@pytest.mark.parametrize("name", ["lfm2", "lfm2_v4", "qwen3_5_text", "granitemoehybrid", "falcon_h1"])
def test_every_mixer_as_the_last_layer_computes_the_last_row_alone_and_the_whole_cache(name):
    """A forward that wants the last row only (forward(last_only), forward_batch) computes the final
    layer's output there alone: a convolution only its kernel's last rows, a recurrence every row (its
    state), attention only the last query. Each hybrid fixture cut after each of its layers, so that
    every kind of mixer is the last once: the last row's logits, and two decode steps from that cache,
    equal those of a full forward; and a batch of two prompts equals each alone."""
    import copy
    import dataclasses
    import minigen
    whole = minigen.load(Path(__file__).parent / "fixtures" / name)[0]
    ids = np.load(Path(__file__).parent / "fixtures" / name / "reference.npz")["input_ids"]
    for n_layers in range(1, whole.config.n_layers + 1):
        model = copy.copy(whole)
        model.params = {**whole.params, "layers": whole.params["layers"][:n_layers]}
        model.config = dataclasses.replace(whole.config, n_layers=n_layers)
        trimmed, full = model.make_cache(8), model.make_cache(8)
        got, want = model.forward(ids, trimmed, last_only=True), model.forward(ids, full)[-1:]
        np.testing.assert_allclose(got, want, atol=1e-5)
        for token in (5, 7):
            np.testing.assert_allclose(model.forward([token], trimmed), model.forward([token], full), atol=1e-5)
        pair = model.forward_batch([ids[:9], ids[4:]], [model.make_cache(), model.make_cache()])
        for got, part in zip(pair, (ids[:9], ids[4:])):
            np.testing.assert_allclose(got, model.forward(part, model.make_cache())[-1:], atol=1e-5)

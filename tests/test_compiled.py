"""numba's twins of a decode step's small steps (minigen/engine/compiled.py), against float64 arithmetic written
out here and against the NumPy reference they stand in for: RMSNorm of a few rows, one query per head over a
KV cache (grouped heads, a sliding window, key counts across the twin's blocks of keys), the softmax's
exponential, and a model's decode steps with the twins and without them."""
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest

import minigen
from minigen.engine import attention, compiled, layers, parallel
from minigen.engine.attention import causal_attention, decode_attention
from minigen.engine.cache import KVCache
from minigen.engine.quant import matrix

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def kernels_loaded():
    """The twins serve once a model's kernels are loaded (quant.matrix.twins), as a stored model's first product
    loads them: load them here, whichever test ran before."""
    matrix._compiled()
    assert matrix.twins() is compiled


def softmax_attention64(q, k, v, lo, scale):
    """One query per head q (H, d) over keys and values lo.. of k, v (KV, S, d), in float64."""
    H, d = q.shape
    G = H // k.shape[0]
    out = np.empty((H, d))
    for h in range(H):
        s = (k[h // G, lo:].astype(np.float64) @ q[h].astype(np.float64)) * scale
        w = np.exp(s - s.max())
        out[h] = (w / w.sum()) @ v[h // G, lo:].astype(np.float64)
    return out


def cache_of(rng, KV, d, S, capacity):
    """Buffers of `capacity` positions, the first S filled; NaN past them (the twins read whole blocks of keys
    past the last, whose scores nothing may use)."""
    keys_t = np.full((KV, d, capacity), np.nan, np.float32)
    values = np.full((KV, capacity, d), np.nan, np.float32)
    keys_t[:, :, :S] = rng.standard_normal((KV, d, S), dtype=np.float32)
    values[:, :S] = rng.standard_normal((KV, S, d), dtype=np.float32)
    return keys_t, values


@pytest.mark.parametrize("H, KV, d, S, window", [
    (4, 4, 16, 1, None),        # the first token: one key
    (9, 3, 64, 100, None),      # SmolLM2's heads
    (12, 2, 128, 257, None),    # Qwen2.5-1.5B's, one key past a block of KEYS
    (6, 2, 80, 700, 300),       # a sliding window: keys 400.. only
    (8, 1, 32, 513, 513),       # one KV head for all, a window as long as the cache
    (14, 2, 80, 70, None),      # a head of 64 + 16 outputs, 64 + 6 keys (the last block of 16 runs past them)
    (4, 1, 216, 300, None),     # 128 + 64 + 16 + 8 outputs, 256 + 44 keys
    (4, 2, 72, 131, 100),       # 64 + 8 outputs, a window starting mid-block
    (9, 3, 64, 1000, 700),      # keys 300..999: two blocks of WIDE, two of KEYS, 60 (the last 16 run past)
])
def test_decode_attention_equals_float64_and_the_numpy_path(H, KV, d, S, window):
    rng = np.random.default_rng(S)
    keys_t, values = cache_of(rng, KV, d, S, capacity=S + 37)   # buffers longer than what is filled
    q = rng.standard_normal((H, d), dtype=np.float32) * 2
    lo = 0 if window is None else max(0, S - window)
    k, v = keys_t[:, :, :S].transpose(0, 2, 1), values[:, :S]
    want = softmax_attention64(q, k, v, lo, 1 / np.sqrt(d))
    out = np.empty((H, d), np.float32)
    compiled.decode_attention(q, keys_t, values, lo, S, np.float32(1 / np.sqrt(d)), out)
    np.testing.assert_allclose(out, want, atol=2e-6)
    numpy_path = causal_attention(q[:, None], k, v, S - 1, window)[0][:, 0]
    np.testing.assert_allclose(out, numpy_path, atol=1e-5)
    assert decode_attention(q, keys_t, values, S, window, None, None).tobytes() == out.tobytes()
    for threads in (1, 2, 3):   # parts of the keys on numba's threads (1-3 parts per KV head), joined
        split = np.empty((H, d), np.float32)
        compiled.decode_attention_split(q, keys_t, values, lo, S, np.float32(1 / np.sqrt(d)), threads, split)
        np.testing.assert_allclose(split, want, atol=2e-6, err_msg=f"{threads} threads")


def test_decode_attention_refuses_arrays_it_cannot_read_by_address():
    """The compiled attention reads its arrays through their first elements' addresses: a strided one is
    refused rather than misread."""
    rng = np.random.default_rng(3)
    keys_t, values = cache_of(rng, 2, 64, 40, capacity=48)
    q, out = rng.standard_normal((4, 64), dtype=np.float32), np.empty((4, 64), np.float32)
    for args in [(q[:, ::2].copy(), keys_t[:, ::2], values[:, :, ::2]), (q.T.copy().T, keys_t, values)]:
        with pytest.raises(ValueError, match="C-contiguous"):
            compiled.decode_attention(*args, 0, 40, np.float32(0.125), out[:, :args[0].shape[1]])


def test_decode_attention_takes_the_given_scale_leaves_soft_caps_to_numpy_and_splits_long_caches(monkeypatch):
    rng = np.random.default_rng(1)
    keys_t, values = cache_of(rng, 2, 32, 50, 64)
    q = rng.standard_normal((4, 32), dtype=np.float32)
    k, v = keys_t[:, :, :50].transpose(0, 2, 1), values[:, :50]
    np.testing.assert_allclose(decode_attention(q, keys_t, values, 50, None, 0.5, None),
                               softmax_attention64(q, k, v, 0, 0.5), atol=2e-6)
    calls = []
    monkeypatch.setattr(compiled, "decode_attention", lambda *a: calls.append(a))
    capped = decode_attention(q, keys_t, values, 50, None, None, 30.0)        # Gemma 2: NumPy's causal_attention
    np.testing.assert_allclose(capped, causal_attention(q[:, None], k, v, 49, softcap=30.0)[0][:, 0], atol=0)
    split = []
    monkeypatch.setattr(compiled, "decode_attention_split", lambda *a: split.append(a))
    monkeypatch.setattr(attention, "TWIN_SCORES", 4 * 49)
    monkeypatch.setattr(compiled, "thread_count", lambda: 2)
    decode_attention(q, keys_t, values, 50, None, None, None)               # 4 x 50 scores: past the limit,
    assert calls == [] and len(split) == 1 and split[0][-2] == 2            # on numba's two threads
    decode_attention(q, keys_t, values, 50, 49, None, None)                 # 4 x 49 in the window: one thread
    assert len(calls) == 1
    with parallel.blas_alone():                                               # a thread whose products keep to it
        decode_attention(q, keys_t, values, 50, None, None, None)
    assert len(calls) == 2 and len(split) == 1
    monkeypatch.setattr(compiled, "thread_count", lambda: 1)                 # a busy machine's step: one thread
    decode_attention(q, keys_t, values, 50, None, None, None)
    assert len(calls) == 3 and len(split) == 1


def test_a_cache_decode_step_attends_over_its_buffers_as_causal_attention_does():
    rng = np.random.default_rng(2)
    cache = KVCache(3, 16, capacity=4)
    prompt = rng.standard_normal((2, 7, 3, 16), dtype=np.float32)            # k, v (T, KV, d): grows the buffers
    cache.update_and_fetch(prompt[0].transpose(1, 0, 2), prompt[1].transpose(1, 0, 2))
    q, k, v = (rng.standard_normal((1, n, 16), dtype=np.float32) for n in (6, 3, 3))
    out, weights = cache.attend(q, k, v, window=5, scale=None, softcap=None)
    keys, values = cache.fetch()
    assert weights is None and out.shape == (1, 6, 16) and cache.offset == 8
    np.testing.assert_allclose(out[0], causal_attention(q[0][:, None], keys, values, 7, 5)[0][:, 0], atol=1e-5)


@pytest.mark.parametrize("rows, D", [(1, 576), (3, 64), (16, 1536)])
def test_rms_norm_rows_equals_float64_and_rms_norm(rows, D):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, D), dtype=np.float32) * np.float32(rng.uniform(0.01, 30))
    w = rng.standard_normal(D, dtype=np.float32)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + 1e-6) * w
    got = compiled.rms_norm(x, w, 1e-6)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-6 * scale
    np.testing.assert_allclose(layers.rms_norm_rows(x, w, 1e-6), layers.rms_norm(x, w, 1e-6), atol=1e-6 * scale)
    assert layers.rms_norm_rows(x, w, 1e-6).tobytes() == got.tobytes()


def test_exp_neg_within_two_ulp_of_e_to_the_x_and_zero_below_float32s_range():
    @compiled.njit
    def each(x):
        out = np.empty_like(x)
        for i in range(len(x)):
            out[i] = compiled.exp_neg(x[i])
        return out
    x = np.concatenate([-np.linspace(0, 87.3, 200001, dtype=np.float32), np.float32([-0.0, -1e-30, -0.34657359])])
    want = np.exp(x.astype(np.float64))
    got = each(x)
    assert got.dtype == np.float32 and got[0] == 1
    assert (np.abs(got - want) / want).max() <= 2 * 2.0 ** -23
    assert (each(np.float32([-87.4, -100, -1e30, -np.inf])) == 0).all()


@pytest.mark.parametrize("name", ["llama_gqa3", "mistral_sliding", "qwen2"])
def test_decode_steps_with_the_twins_equal_those_without(name, monkeypatch):
    """Greedy decoding of a fixture with the twins and with the NumPy reference path: the same tokens, logits
    within 1e-5 (the parity tests hold either to transformers)."""
    model = minigen.load(FIXTURES / name)[0]
    ref = np.load(FIXTURES / name / "reference.npz")
    runs = []
    for twins in (compiled, None):
        monkeypatch.setattr(layers, "twins", lambda: twins)
        monkeypatch.setattr(attention, "twins", lambda: twins)
        cache, ids, logits = model.make_cache(4), ref["input_ids"], []
        out = model.forward(ids, cache, last_only=True)
        for _ in range(12):                                                   # past the capacity: the buffers grow
            ids = [int(out[-1].argmax())]
            logits.append(out[-1])
            out = model.forward(np.array(ids), cache, last_only=True)
        runs.append(np.stack(logits))
    assert runs[0].argmax(1).tolist() == runs[1].argmax(1).tolist()
    np.testing.assert_allclose(runs[0], runs[1], atol=1e-5)


def test_silu_gate_equals_float64_and_the_numpy_gate():
    rng = np.random.default_rng(3)
    h = (rng.standard_normal((3, 2 * 700)) * 6).astype(np.float32)
    h[0, :6] = [0, -0.0, 88.8, -88.8, -200, 1e-30]                        # e^-x past float32's range, both ways
    g64, u64 = h[:, :700].astype(np.float64), h[:, 700:].astype(np.float64)
    want = g64 / (1 + np.exp(-g64)) * u64
    got = compiled.silu_gate(h)
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()
    numpy_gate = layers.silu(h[:, :700].copy()) * h[:, 700:]
    np.testing.assert_allclose(got, numpy_gate, rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("d, r", [(64, 64), (80, 32)])                  # whole, and partial rotary (Phi-3, NeoX)
def test_rope_rows_equals_apply_rope(d, r):
    rng = np.random.default_rng(d)
    x = rng.standard_normal((3, 5, d), dtype=np.float32)
    angles = rng.uniform(-50, 50, (3, r // 2)).astype(np.float32)
    cos, sin = np.cos(np.concatenate([angles, angles], 1)), np.sin(np.concatenate([angles, angles], 1))
    x64, c64, s64, half = x.astype(np.float64), cos[:, None].astype(np.float64), sin[:, None].astype(np.float64), r // 2
    rotated = np.concatenate([-x64[..., half:r], x64[..., :half]], -1)   # rotate_half, written out
    want = np.concatenate([x64[..., :r] * c64 + rotated * s64, x64[..., r:]], -1)
    got = compiled.rope(x, cos, sin)
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(layers.rope_rows(x, cos, sin), layers.apply_rope(x, cos[:, None], sin[:, None]), atol=1e-6)
    assert got[..., r:].tobytes() == x[..., r:].tobytes()


@pytest.mark.parametrize("window", [None, 5])
def test_a_pools_decode_step_takes_each_sequence_over_its_own_keys(window, monkeypatch):
    """Five sequences in slots 4, 0, 2, 7, 5 of a pool of 8, large stale values past each one's length and in
    the free slots: the twin (compiled.decode_pool) equals float64 attention of each sequence alone."""
    rng = np.random.default_rng(4)
    P, H, KV, d, C = 8, 6, 2, 8, 300
    slots, lengths = np.array([4, 0, 2, 7, 5]), np.array([9, 1, 260, 4, 12])
    keys_t = 1e3 * rng.standard_normal((P, KV, d, C)).astype(np.float32)
    values = 1e3 * rng.standard_normal((P, KV, C, d)).astype(np.float32)
    for s, n in zip(slots, lengths):
        keys_t[s, :, :, :n] = rng.standard_normal((KV, d, n))
        values[s, :, :n] = rng.standard_normal((KV, n, d))
    q = rng.standard_normal((5, H, d)).astype(np.float32)
    used = []
    for name in ("decode_pool", "decode_pool_split"):
        pool = getattr(compiled, name)
        monkeypatch.setattr(compiled, name, lambda *a, name=name, pool=pool: used.append(name) or pool(*a))
    # the sequences on numba's two threads; on one inside blas_alone (a thread whose products keep to it) or
    # where numba has one (a busy machine's step)
    for keep, threads in ((nullcontext, 2), (parallel.blas_alone, 2), (nullcontext, 1)):
        monkeypatch.setattr(compiled, "thread_count", lambda threads=threads: threads)
        with keep():
            out = attention.pooled_decode_attention(q, keys_t, values, slots, lengths, window)
        for b, (s, n) in enumerate(zip(slots, lengths)):
            lo = 0 if window is None else max(0, n - window)
            want = softmax_attention64(q[b], keys_t[s, :, :, :n].transpose(0, 2, 1), values[s, :, :n], lo, 1 / np.sqrt(d))
            np.testing.assert_allclose(out[b], want, atol=2e-6)
    assert used == ["decode_pool_split", "decode_pool", "decode_pool"]

"""Invariants of the engine's parts: RoPE layout, masks, the cache, numerical stability, loading."""
import sys
import warnings

import numpy as np
import pytest

import minigen
from minigen.engine.attention import NEG, attend, causal_mask, softmax
from minigen.engine.cache import KVCache
from minigen.engine.config import Rope
from minigen.engine.layers import apply_rope, rope_frequencies, rope_tables, silu
from minigen.checkpoint.weights import read_tensor, index_checkpoint

import tiny_checkpoint
from memory_maps import in_small_pages


def test_rope_pairs_dimension_i_with_i_plus_half():
    # HF's rotate_half layout: the unit vector e_0 at position p rotates into dims 0 and d/2.
    # Under the interleaved (2i, 2i+1) layout it would rotate into dims 0 and 1, and this fails.
    d, p = 8, 3
    inv_freq = rope_frequencies(Rope(10000.0, d))
    cos, sin = rope_tables(Rope(10000.0, d), np.array([p]))
    x = np.zeros((1, d), np.float32)
    x[0, 0] = 1.0
    y = apply_rope(x, cos, sin)[0]
    expected = np.zeros(d)
    expected[0], expected[d // 2] = np.cos(p * inv_freq[0]), np.sin(p * inv_freq[0])
    np.testing.assert_allclose(y, expected, atol=1e-6)


def test_rope_scores_depend_on_relative_position_only():
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, 16)).astype(np.float32)
    rope = Rope(10000.0, 16)
    def score(m, n):
        return (apply_rope(q, *rope_tables(rope, np.array([m]))) @ apply_rope(k, *rope_tables(rope, np.array([n]))).T).item()
    assert score(5, 2) == pytest.approx(score(13, 10), abs=1e-4)


def test_rope_frequencies_linear_and_llama3():
    base = rope_frequencies(Rope(500000.0, 64))
    np.testing.assert_allclose(rope_frequencies(Rope(500000.0, 64, "linear", factor=4.0)), base / 4)
    scaled = rope_frequencies(Rope(500000.0, 64, "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                   original_max=8192))
    wavelen = 2 * np.pi / base
    np.testing.assert_allclose(scaled[wavelen < 8192 / 4], base[wavelen < 8192 / 4])      # high freq kept
    np.testing.assert_allclose(scaled[wavelen > 8192], base[wavelen > 8192] / 8, rtol=1e-6)  # low freq / factor
    mid = (wavelen >= 8192 / 4) & (wavelen <= 8192)
    assert mid.any() and np.all(scaled[mid] < base[mid]) and np.all(scaled[mid] > base[mid] / 8)


def test_causal_mask_with_offset_and_window():
    m = causal_mask(2, 3)
    np.testing.assert_array_equal(m, [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    w = causal_mask(5, 0, window=2)
    np.testing.assert_array_equal(w.sum(1), [1, 2, 2, 2, 2])
    assert w[4, 3] and w[4, 4] and not w[4, 2]


def test_extreme_scores_give_finite_probabilities():
    q = np.array([[100.0, 0.0], [-100.0, 0.0]], np.float32)
    k = np.array([[100.0, 0.0], [-100.0, 0.0], [0.0, 100.0]], np.float32)  # scores of +-1e4
    out, w = attend(q, k, k, causal_mask(2, 1))
    assert np.isfinite(w).all() and np.isfinite(out).all()
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)
    assert w[0, 2] == 0.0 and w[0, 0] == pytest.approx(1.0)
    p = softmax(np.array([1e4, -1e4, 0.0], np.float32))
    assert np.isfinite(p).all() and p[0] == 1.0
    assert np.isfinite(softmax(np.array([NEG, NEG], np.float32))).all()


def test_silu_equals_float64_formula_over_the_whole_range_without_warnings():
    x = np.concatenate([np.linspace(-120, 120, 4001), [-1e30, -88.8, -87.0, 0.0, 88.8, 1e30]]).astype(np.float32)
    with np.errstate(over="ignore"):
        want = x.astype(np.float64) / (1.0 + np.exp(-x.astype(np.float64)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # e^-x overflowing past x = -88 must not warn
        got = silu(x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)
    assert silu(np.float32([-1e30]))[0] == 0.0 and silu(np.float32([1e30]))[0] == np.float32(1e30)


def test_cache_grows_geometrically_and_keeps_rows():
    c = KVCache(n_kv=2, head_dim=3, capacity=2)
    rows = [np.full((2, 1, 3), i, np.float32) for i in range(5)]
    capacities = []
    for r in rows:
        k, v = c.update_and_fetch(r, -r)
        capacities.append(c.capacity)
    assert capacities == [2, 2, 4, 4, 8]
    assert k.shape == (2, 5, 3) and c.offset == 5
    np.testing.assert_array_equal(k[0, :, 0], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(v[1, :, 2], [0, -1, -2, -3, -4])
    assert np.shares_memory(k, c.keys_t) and np.shares_memory(v, c.values)  # views, not copies


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_long_caches_are_kept_from_huge_pages():
    """NumPy asks for 2 MB pages for arrays of 4 MB or more; a cache's transposed keys would then be resident
    at the whole capacity, however little is filled (a batch's pool of 8 at SmolLM2's size, one long sequence
    beside short ones: 2.9 GB against 0.47 in 4 KB pages). A pool's fresh slots still read as zeros."""
    from minigen.engine.cache import KVPool
    c = KVCache(n_kv=4, head_dim=64, capacity=256)
    c.update_and_fetch(np.ones((4, 4097, 64), np.float32), np.ones((4, 4097, 64), np.float32))
    assert c.keys_t.nbytes >= 4 << 20 and in_small_pages(c.keys_t) and in_small_pages(c.values)
    pool = KVPool(n_kv=4, head_dim=64, slots=2, capacity=256)
    a, b = pool.take(256), pool.take(256)
    a.update_and_fetch(np.ones((4, 2100, 64), np.float32), np.ones((4, 2100, 64), np.float32))   # the pool grows
    assert pool.keys_t.nbytes >= 4 << 20 and in_small_pages(pool.keys_t) and in_small_pages(pool.values)
    assert not pool.keys_t[b.slot].any() and not pool.values[b.slot].any() and not pool.keys_t[a.slot, :, :, 2100:].any()


def test_cache_truncate_rewinds_and_later_writes_overwrite():
    c = KVCache(n_kv=1, head_dim=2, capacity=4)
    c.update_and_fetch(np.arange(8, dtype=np.float32).reshape(1, 4, 2), -np.ones((1, 4, 2), np.float32))
    c.truncate(1)
    k, v = c.update_and_fetch(np.full((1, 2, 2), 9, np.float32), np.full((1, 2, 2), 7, np.float32))
    assert c.offset == 3 and c.capacity == 4
    np.testing.assert_array_equal(k[0], [[0, 1], [9, 9], [9, 9]])
    np.testing.assert_array_equal(v[0, :, 0], [-1, 7, 7])
    for bad in (-1, 4):
        with pytest.raises(ValueError):
            c.truncate(bad)


def test_cached_decode_equals_uncached(tmp_path):
    model = minigen.load(tiny_checkpoint.write(tmp_path / "ckpt"))[0]
    ids = np.random.default_rng(1).integers(0, 64, 40)
    full = model.logits(ids)
    cache = model.make_cache(capacity=4)  # small, so decoding also exercises growth
    steps = [model.forward(ids[:30], cache)] + [model.forward(ids[i:i + 1], cache) for i in range(30, 40)]
    np.testing.assert_allclose(np.concatenate(steps), full, atol=1e-5)
    cache = model.make_cache()
    model.forward(ids[:-1], cache)
    np.testing.assert_allclose(model.forward(ids[-1:], cache, last_only=True), full[-1:], atol=1e-5)


def test_record_attention_shapes_and_rows(tmp_path):
    model = minigen.load(tiny_checkpoint.write(tmp_path / "ckpt"))[0]
    record = []
    model.forward(np.arange(10), model.make_cache(), record=record)
    assert len(record) == 2 and record[0].shape == (4, 10, 10)
    np.testing.assert_allclose(record[0].sum(-1), 1.0, rtol=1e-5)
    assert np.all(np.triu(record[1], 1) == 0)


def test_float32_tensors_are_memory_mapped(tmp_path):
    path = tiny_checkpoint.write(tmp_path / "ckpt")
    ref = index_checkpoint(path)["model.norm.weight"]
    a = read_tensor(ref)
    assert not a.flags.writeable and not a.flags.owndata  # a view on the file's mapping


def test_tied_and_untied_lm_head(tmp_path):
    weights = tiny_checkpoint.tensors()
    tied = minigen.load(tiny_checkpoint.write(tmp_path / "tied", weights=weights))[0]
    assert tied.params["lm_head"] is tied.params["embed"]
    head = np.random.default_rng(3).standard_normal((64, 32)).astype(np.float32)
    both = minigen.load(tiny_checkpoint.write(tmp_path / "both", weights={**weights, "lm_head.weight": head}))[0]
    np.testing.assert_array_equal(both.params["lm_head"], head)  # both present: lm_head.weight wins
    ids = np.arange(5)
    assert not np.allclose(both.logits(ids), tied.logits(ids))


def test_projections_are_laid_out_with_the_files_values(tmp_path, monkeypatch):
    """Every matrix a forward applies as x @ w.T is laid out column-major (w.T C-contiguous), but the
    down projection (more inputs than outputs) row-major, with the values the file holds, whole and in
    small blocks over both threads; norms stay memory-mapped."""
    from minigen.checkpoint import weights as W
    weights = tiny_checkpoint.tensors()
    path = tiny_checkpoint.write(tmp_path / "ckpt", weights=weights)
    whole = minigen.load(path)[0]
    monkeypatch.setattr(W, "LAYOUT_BLOCK", 40)   # one or two rows a block
    blocks = minigen.load(path)[0]
    for model in (whole, blocks):
        layer = model.params["layers"][1]
        q, k, v = (weights[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv")
        np.testing.assert_array_equal(layer["wqkv"], np.concatenate([q, k, v]))
        np.testing.assert_array_equal(layer["w_down"], weights["model.layers.1.mlp.down_proj.weight"])
        np.testing.assert_array_equal(model.params["lm_head"], weights["model.embed_tokens.weight"])
        for name in ("wqkv", "wo", "w_gate_up"):
            assert layer[name].T.flags.c_contiguous, name
        assert layer["w_down"].shape[1] > layer["w_down"].shape[0] and layer["w_down"].flags.c_contiguous
        assert model.params["lm_head"].T.flags.c_contiguous and model.params["lm_head"] is model.params["embed"]
        assert not layer["attn_norm"].flags.owndata   # a view on the file's mapping
    np.testing.assert_array_equal(whole.logits(np.arange(6)), blocks.logits(np.arange(6)))


def test_every_fixtures_projections_are_laid_out():
    """Over every family's fixture (experts, GPT-2's transposed Conv1D, fused and per-head-fixed
    matrices, tied and untied heads): each of the MATRICES is column-major, or row-major where it
    has more inputs than outputs, and both kinds occur."""
    from pathlib import Path
    from minigen.checkpoint.weights import MATRICES
    from minigen.resolve import load_model
    seen, rows = set(), set()
    for config in sorted((Path(__file__).parent / "fixtures").glob("*/config.json")):
        params = load_model(config.parent, dtype="float32").params   # (kept 16-bit matrices have their own layout)
        for key, w in [("lm_head", params["lm_head"])] + [kv for layer in params["layers"] for kv in layer.items()]:
            if key in MATRICES:
                wide = w.ndim == 2 and w.shape[1] > w.shape[0]
                assert (w.flags.c_contiguous if wide else w.swapaxes(-1, -2).flags.c_contiguous), (config.parent.name, key)
                seen.add(key)
                rows |= {key} if wide else set()
    assert seen == MATRICES and {"w_down", "wo"} <= rows


def test_linear_of_every_row_count_equals_the_product_in_float64():
    """linear() computes 4-7, 12-15, ... rows as a multiple of 8 (padded with zero rows): for every
    row count, both layouts and a bias, each row equals x @ w.T + b, none of the padding shows, and
    the rounding is as the row count's own."""
    from minigen.engine.linear import FEW_ROWS, linear, padded_rows
    assert [padded_rows(n) for n in (2, 3, 4, 7, 8, 9, 11, 12, 15, 16, 17, 20, 28, 31)] == \
        [2, 3, 8, 8, 8, 9, 11, 16, 16, 16, 17, 24, 32, 32]
    rng = np.random.default_rng(0)
    w = rng.standard_normal((40, 24)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    for n in range(1, FEW_ROWS + 2):
        x = rng.standard_normal((n, 24)).astype(np.float32)
        want = x.astype(np.float64) @ w.T.astype(np.float64) + b
        for layout in (np.ascontiguousarray(w), np.asfortranarray(w)):
            y = linear(x, layout, b)
            assert y.shape == (n, 40) and y.dtype == np.float32
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_bfloat16_and_float16_are_widened(tmp_path):
    import json
    from minigen.engine.linear import dense
    weights = tiny_checkpoint.tensors()
    path = tiny_checkpoint.write(tmp_path / "f16", weights={k: v.astype(np.float16) for k, v in weights.items()})
    m16 = minigen.load(path)[0]
    np.testing.assert_array_equal(dense(m16.params["embed"]), weights["model.embed_tokens.weight"].astype(np.float16).astype(np.float32))
    # bfloat16: write the top 16 bits by hand (numpy has no bfloat16), check they widen back exactly
    bits = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in weights.items()}
    path = tiny_checkpoint.write(tmp_path / "bf16", weights=weights)
    header = {k: {"dtype": "BF16", "shape": list(v.shape)} for k, v in bits.items()}
    offset, blobs = 0, []
    for k, v in bits.items():
        header[k]["data_offsets"] = [offset, offset + v.nbytes]
        offset += v.nbytes
        blobs.append(v.tobytes())
    h = json.dumps(header).encode()
    (path / "model.safetensors").write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))
    mbf = minigen.load(path)[0]
    expected = (bits["model.embed_tokens.weight"].astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(dense(mbf.params["embed"]), expected)   # kept in 16 bits: the same values
    assert np.abs(dense(mbf.params["embed"]) - weights["model.embed_tokens.weight"]).max() < 0.01


@pytest.mark.parametrize("offset,window,scale,cap", [(0, None, None, None), (7, None, None, None), (0, 20, None, None),
                                                     (5, 70, None, None), (0, 1, None, None), (3, None, 0.7, None),
                                                     (0, 30, 0.7, 2.0), (90, 100, None, None)])
@pytest.mark.parametrize("tiles", [False, True])
def test_blocked_causal_attention_equals_one_masked_softmax(offset, window, scale, cap, tiles, monkeypatch):
    # 150 query rows span three blocks; keys a block cannot see are skipped, not masked; each block
    # takes its softmax in base 2 (with the scale and Gemma 2's soft-cap folded in), `attend` in e.
    # With tiles, every block's keys go 64 at a time through the online softmax (_attend_tiles): rows
    # whose window starts past a tile see nothing in it, the diagonal's mask spans tiles
    from minigen.engine import attention
    from minigen.engine.attention import BLOCK, causal_attention
    if tiles:
        monkeypatch.setattr(attention, "TILE", 64)
    rng = np.random.default_rng(0)
    H, KV, T, d = 6, 2, 2 * BLOCK + 22, 8
    q = rng.standard_normal((H, T, d)).astype(np.float32)
    k, v = rng.standard_normal((2, KV, offset + T, d)).astype(np.float32)
    out, weights = causal_attention(q, k, v, offset, window, want_weights=True, scale=scale, softcap=cap)
    # reference: every head against its KV head (h // G), one full mask
    kv_of = np.arange(H) // (H // KV)
    ref_out, ref_w = attend(q, k[kv_of], v[kv_of], causal_mask(T, offset, window), scale, cap)
    np.testing.assert_allclose(weights, ref_w, atol=1e-5)
    np.testing.assert_allclose(out, ref_out, atol=1e-5)
    assert np.all(weights[ref_w == 0] == 0)
    out2, none = causal_attention(q, k, v, offset, window, scale=scale, softcap=cap)
    assert none is None
    if tiles:   # the weights' path is never tiled: the same outputs to rounding
        np.testing.assert_allclose(out2, ref_out, atol=1e-5)
    else:
        assert np.array_equal(out, out2)


def test_long_prompt_cached_equals_uncached_with_sliding_window(tmp_path):
    import json
    cfg = {**tiny_checkpoint.CONFIG, "model_type": "mistral", "sliding_window": 50}
    model = minigen.load(tiny_checkpoint.write(tmp_path / "m", cfg=cfg))[0]
    ids = np.random.default_rng(2).integers(0, 64, 140)
    full = model.logits(ids)
    cache = model.make_cache(8)
    steps = [model.forward(ids[:100], cache)] + [model.forward(ids[i:i + 1], cache) for i in range(100, 140)]
    np.testing.assert_allclose(np.concatenate(steps), full, atol=1e-5)
    # and the window really matters here
    unwindowed = minigen.load(tiny_checkpoint.write(tmp_path / "l", cfg=tiny_checkpoint.CONFIG))[0].logits(ids)
    assert np.abs(unwindowed[60:] - full[60:]).max() > 1e-3


@pytest.mark.parametrize("window,scale,cap", [(None, None, None), (5, None, None), (None, 0.7, 2.0), (3, 0.7, 2.0)])
@pytest.mark.parametrize("slots", [(4, 0, 2, 7, 5), (2, 3, 4, 5, 6)])
def test_pooled_decode_attention_equals_each_sequence_alone(window, scale, cap, slots):
    # five sequences of different lengths in slots 4, 0, 2, 7, 5 of a pool of 8 (holes at 1, 3, 6), or
    # in slots 2..6 in order (no holes); past each slot's length (and in the holes) lie large stale
    # values: none may reach an output
    from minigen.engine.attention import pooled_decode_attention
    rng = np.random.default_rng(1)
    P, H, KV, d, C = 8, 6, 2, 4, 16
    slots, lengths = np.array(slots), np.array([9, 1, 16, 4, 12])
    keys_t = 1e3 * rng.standard_normal((P, KV, d, C)).astype(np.float32)
    values = 1e3 * rng.standard_normal((P, KV, C, d)).astype(np.float32)
    q = rng.standard_normal((len(slots), H, d)).astype(np.float32)
    ks, vs = [], []
    for s, n in zip(slots, lengths):
        k, v = rng.standard_normal((2, KV, n, d)).astype(np.float32)
        keys_t[s, :, :, :n], values[s, :, :n] = k.transpose(0, 2, 1), v
        ks.append(k), vs.append(v)
    out = pooled_decode_attention(q, keys_t, values, slots, lengths, window, scale, cap)
    kv_of = np.arange(H) // (H // KV)
    for b, (k, v) in enumerate(zip(ks, vs)):
        n = lengths[b]
        ref, _ = attend(q[b][:, None], k[kv_of], v[kv_of], causal_mask(1, n - 1, window), scale, cap)   # (H, 1, d)
        np.testing.assert_allclose(out[b], ref[:, 0], atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 12])
@pytest.mark.parametrize("gemv", [True, False])
def test_rows_times_is_the_matrix_product(rows, gemv, monkeypatch):
    # a decode step's few query heads per KV head go through one GEMV each (np.vecmat), more rows
    # (or a NumPy without vecmat) through the GEMM: either way a @ m, on strided views as the cache hands out
    from minigen.engine import attention
    if not gemv:
        monkeypatch.setattr(attention, "VECMAT", None)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 3, rows, 8)).astype(np.float32)              # (P, KV, R, d)
    keys_t = rng.standard_normal((2, 3, 8, 40)).astype(np.float32)[..., :29]   # (P, KV, d, S), rows of stride 40
    values = rng.standard_normal((2, 3, 40, 8)).astype(np.float32)[:, :, :29]  # (P, KV, S, d)
    scores = attention.rows_times(a, keys_t)
    np.testing.assert_allclose(scores, a.astype(np.float64) @ keys_t, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(attention.rows_times(scores, values), scores.astype(np.float64) @ values,
                               rtol=1e-5, atol=1e-4)


def test_pool_slots_keep_their_rows_through_growth_release_and_reuse():
    from minigen.engine.cache import KVPool
    pool = KVPool(n_kv=2, head_dim=3, slots=1, capacity=2)
    a, b = pool.take(2), pool.take(2)                       # a second slot: the pool doubles its slots
    assert (a.slot, b.slot) == (0, 1) and len(pool.values) == 2
    rows = [np.full((2, 1, 3), i, np.float32) for i in range(5)]
    for r in rows:
        a.update_and_fetch(r, -r)                           # grows the capacity for every slot
    b.update_and_fetch(rows[4], rows[4])
    k, v = a.fetch()
    np.testing.assert_array_equal(k[0, :, 0], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(v[1, :, 2], [0, -1, -2, -3, -4])
    assert pool.capacity >= 5 and np.shares_memory(k, pool.keys_t)
    own = pool.release(a)                                   # a KVCache of its own, the slot free again
    assert type(own) is KVCache and own.offset == 5 and not np.shares_memory(own.keys_t, pool.keys_t)
    np.testing.assert_array_equal(own.fetch()[0], k)
    c = pool.take(3)
    assert c.slot == 0 and c.offset == 0
    c.update_and_fetch(rows[2], rows[2])
    np.testing.assert_array_equal(c.fetch()[0][:, :, 0], [[2], [2]])
    np.testing.assert_array_equal(b.fetch()[1][:, 0, 0], [4, 4])   # the other slot untouched
    capacity = pool.capacity
    for i in range(capacity):                               # a decode step's rows, one per member, past the capacity
        pool.append([b, c], np.full((2, 2, 3), 10 + i, np.float32), -np.full((2, 2, 3), 10 + i, np.float32))
    assert pool.capacity > capacity and (b.offset, c.offset) == (1 + capacity, 1 + capacity)
    np.testing.assert_array_equal(b.fetch()[0][0, :, 0], [4] + list(range(10, 10 + capacity)))
    np.testing.assert_array_equal(c.fetch()[1][1, :, 2], [2] + [-(10 + i) for i in range(capacity)])
    kept = [pool.release(b), pool.release(c)]               # the last ones out: the pool back to its first size
    assert pool.members == {} and pool.capacity == 2 and len(pool.values) == 1   # as made above
    np.testing.assert_array_equal(kept[1].fetch()[1][1, :, 2], [2] + [-(10 + i) for i in range(capacity)])


def test_slot_runs_keep_like_lengths_together_and_a_long_one_apart():
    from minigen.engine.attention import slot_runs
    runs = lambda slots, lengths: [sorted(np.asarray(slots)[r].tolist()) for r in slot_runs(tuple(slots), tuple(lengths))]
    assert runs([0, 1, 2, 3], [200, 201, 205, 199]) == [[0, 1, 2, 3]]               # one product
    assert runs([3, 0, 1, 2, 4], [210, 200, 4000, 205, 190]) == [[0], [1], [2, 3, 4]]   # the long one alone
    assert runs([0, 5], [100, 100]) == [[0], [5]]                                   # no product over 4 free slots
    every = slot_runs(tuple(range(9, -1, -1)), tuple(range(10, 110, 10)))
    assert sorted(np.concatenate(every).tolist()) == list(range(10))                # each sequence once

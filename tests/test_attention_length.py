"""Attention at length (issue 35): maps streamed from the forward's blocks into what the census, the compact
page and the dumps keep, checked against transformers' output_attentions (reference.npz, and the last
rows of a 300-token prompt in reference_long.npz); the exact rows --serve answers, over HTTP on 127.0.0.1;
refusals before any forward pass."""
import base64
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request

import numpy as np
import pytest
from click.testing import CliRunner

import minigen
import minigen.engine.model
from minigen.cli import main
from minigen.engine.attention import causal_attention, causal_weights
from minigen.inspect import dump as D
from minigen.inspect import html as H
from minigen.inspect import load_attention, stats
from minigen.inspect import patterns as P
from minigen.inspect import scan as SC
from minigen.inspect import tiles as TL
from minigen.inspect.args import attention_layers
from minigen.inspect.internals import prompt_attention, value_norms
from minigen.inspect.server import App, answer, serve

from conftest import FIXTURES_DIR, load_reference

PROMPT = "The cat sat on the mat. The cat sat on the mat and the dog"
FAMILIES = ["llama_gqa3", "mistral_sliding", "gemma2", "qwen2", "gpt2", "olmo2", "phi3"]
HYBRIDS = ["qwen3_5", "lfm2", "granitemoehybrid", "falcon_h1"]


def cli(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def reference_maps(name):
    """transformers' output_attentions {layer: (H, T, T)} (hybrids: their attention layers) and the ids."""
    ref = load_reference(name)
    layers = ref["attention_layers"] if "attention_layers" in ref else range(len(ref["attentions"]))
    return {int(l): a for l, a in zip(layers, ref["attentions"])}, ref["input_ids"]


def scanned(name, heads=None, *consumers_of):
    """The fixture's model, its reference maps and ids, and consumers run through one scan of them."""
    model = minigen.load(FIXTURES_DIR / name)[0]
    maps, ids = reference_maps(name)
    layers = attention_layers(model.config)
    assert layers == sorted(maps)
    heads = list(range(model.config.n_heads)) if heads is None else heads
    consumers = [make(layers, len(heads), ids) for make in consumers_of]
    SC.scan(model, ids, layers, heads, consumers)
    return model, {l: a[heads] for l, a in maps.items()}, ids, consumers


# --- the engine's streamed weights ------------------------------------------------------------------------

@pytest.mark.parametrize("H_, KV, T, window, cap", [(9, 3, 150, None, None), (4, 2, 90, 16, None), (4, 1, 70, None, 5.0)])
def test_causal_weights_are_causal_attentions_and_streaming_changes_no_output(H_, KV, T, window, cap):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((n, T, 8)).astype(np.float32) * 2 for n in (H_, KV, KV))
    out, w = causal_attention(q, k, v, 0, window, True, None, cap)
    for a, b in [(0, T), (0, 1), (37, 61)]:
        got, plogp = causal_weights(q[:, a:b], k[:, :b], a, window, None, cap, entropy=True)
        np.testing.assert_allclose(got, w[:, a:b, :b], atol=1e-5, rtol=0)
        ref = np.where(got > 0, got * np.log(np.where(got > 0, got, 1)), 0).sum(-1)
        np.testing.assert_allclose(plogp, ref, atol=2e-5, rtol=0)
    seen = np.zeros_like(w)
    streamed, none = causal_attention(q, k, v, 0, window, False, None, cap,
                                      on_block=lambda start, b, p: seen.__setitem__((slice(None), slice(start, start + b.shape[1]), slice(0, b.shape[2])), b))
    assert none is None
    np.testing.assert_allclose(streamed, out, atol=1e-5, rtol=0)
    np.testing.assert_allclose(seen, w, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", FAMILIES + HYBRIDS)
def test_streamed_maps_equal_output_attentions(name):
    _, maps, _, (tri,) = scanned(name, None, lambda l, h, ids: TL.Triangles(l, h, len(ids)))
    for l, a in tri.squares().items():
        np.testing.assert_allclose(a, maps[l], atol=1e-5, rtol=0)


def test_streamed_maps_of_some_heads_and_of_many_blocks_on_two_threads():
    """GQA heads kept apart (not every query head of a KV head), and a 600-token prompt: past SPLIT_ROWS the
    forward's blocks run on two threads (where OpenBLAS has two), and the tiles they hand over equal the
    forward's recorded maps (within float32's rounding carried through the layers: the streamed blocks
    normalise the weights before the product with V, the others after)."""
    model = minigen.load(FIXTURES_DIR / "llama_gqa3")[0]
    ids = np.random.default_rng(1).integers(5, model.config.vocab_size, 600)
    layers, heads = [0, 2], [1, 4, 5, 8]
    tri, th = TL.Triangles(layers, 4, 600), TL.Thumbs(layers, 4, 600, R=64)
    SC.scan(model, ids, layers, heads, [tri, th])
    record = prompt_attention(model, ids)
    for n, (l, a) in enumerate(tri.squares().items()):
        np.testing.assert_allclose(a, record[l][heads], atol=1e-5, rtol=0)
        blocks = np.arange(600) * 64 // 600
        expect = np.zeros((4, 64, 64))
        np.maximum.at(expect, (slice(None), blocks[:, None], blocks[None, :]), a)
        np.testing.assert_allclose(th.plain[n], expect, atol=1e-7, rtol=0)


# --- what the consumers keep equals what the full maps say ----------------------------------------------------

@pytest.mark.parametrize("name", ["llama_gqa3", "gemma2", "lfm2", "falcon_h1"])
def test_census_from_row_numbers_equals_the_full_maps(name):
    _, maps, ids, (numbers,) = scanned(name, None, lambda l, h, ids: TL.RowNumbers(l, h, ids))
    for exclude in (False, True):
        expect, got = stats.census(maps, ids, exclude), numbers.census(exclude)
        assert expect.keys() == got.keys()
        for k in expect:
            np.testing.assert_allclose(got[k], expect[k], atol=2e-6, rtol=0, err_msg=f"{k}, exclude_first={exclude}")


def test_value_weighted_census_equals_the_full_maps():
    model, maps, ids, _ = scanned("qwen2")
    layers = sorted(maps)
    plain, view = TL.Sinks(layers, 4, len(ids)), TL.RowNumbers(layers, 4, ids)
    SC.scan(model, ids, layers, [0, 1, 2, 3], [plain], [view], value_weighted=True)
    norms = value_norms(model, ids)
    expect = stats.census({l: stats.value_weighted(maps[l], norms[l]) for l in layers}, ids)
    for k, v in view.census().items():
        np.testing.assert_allclose(v, expect[k], atol=2e-6, rtol=0)
    np.testing.assert_allclose(plain.sink(), stats.census(maps)["sink"], atol=1e-6)


def assert_top_keys(keys, weights, row, K, floor=0.0):
    """keys/weights (K,) of one row against the row of the reference map: the strongest keys beyond the first
    (weight > 0, >= floor x the row beyond the first), strongest first, and nothing left out that beats them."""
    listed = keys[keys >= 0]
    others = row[1:].sum()
    np.testing.assert_allclose(weights[:len(listed)], row[listed], atol=1e-5)
    assert np.all(weights[len(listed):] == 0) and np.all(listed >= 1)
    tol, keys_after_first = 1e-5, np.arange(len(row)) > 0
    surely = np.count_nonzero(keys_after_first & (row > floor * others + tol) & (row > tol))   # must be listed
    maybe = np.count_nonzero(keys_after_first & (row >= floor * others - tol) & (row > 0))      # may be
    assert min(K, surely) <= len(listed) <= min(K, maybe)
    assert np.all(row[listed] >= floor * others - tol)
    if len(listed):
        rest = np.setdiff1d(np.arange(1, len(row)), listed)
        assert row[rest].max(initial=0) <= row[listed].min() + 1e-5


@pytest.mark.parametrize("S,K", [(300, 4), (1100, 8), (4000, 8), (2000, 100)])
def test_top_exact_equals_a_full_sort(S, K):
    """Each row's K strongest keys beyond the first against a plain sort of the row (weight, then key), on
    rows long enough for the candidates' bound (tiles._top_of_candidates) and short ones: ties at the top, a
    sliding window's zeros, a row with nothing beyond the first token."""
    rng = np.random.default_rng(S)
    w = rng.random((5, 16, S)).astype(np.float32) ** 8
    w[0, 3, 50:S // 2] = w[0, 3].max()
    w[1, :, :S - 40], w[1, :, 0] = 0, 1
    w[2, 0, 1:] = 0
    w /= w.sum(-1, keepdims=True)
    keys, weights = TL.top_exact(w, K)
    for h in range(5):
        for i in range(16):
            row = w[h, i, 1:]
            order = np.lexsort((np.arange(len(row)), -row))[:K]
            order = order[row[order] > 0]
            assert np.array_equal(keys[h, i], np.r_[order + 1, [-1] * (K - len(order))])
            assert np.array_equal(weights[h, i], np.r_[row[order], [0] * (K - len(order))].astype(np.float32))


@pytest.mark.parametrize("name", ["llama_gqa3", "mistral_sliding", "granitemoehybrid"])
def test_top_keys_are_the_full_maps_top_keys(name):
    _, maps, ids, (top,) = scanned(name, None, lambda l, h, ids: TL.TopKeys(l, h, len(ids), 5))
    for l, a in maps.items():
        got = top.of(l)
        np.testing.assert_allclose(got["first"], a[:, :, 0], atol=1e-5)
        for h in range(len(a)):
            for i in range(len(ids)):
                w = got["weights"][h, i]
                assert np.all(np.diff(w[w > 0]) <= 0)                  # strongest first
                assert_top_keys(got["keys"][h, i], w, a[h, i, :i + 1], 5)
        listed = np.where(got["keys"] >= 0, got["weights"], 0).sum(-1)
        np.testing.assert_allclose(got["rest"], a[:, :, 1:].sum(-1) - listed, atol=1e-5)


def test_strong_keys_follow_the_pages_rule():
    _, maps, ids, (strong,) = scanned("llama_gqa3", None, lambda l, h, ids: TL.StrongKeys(l, h, len(ids), 3, 0.05))
    T = len(ids)
    for l, a in maps.items():
        counts, keys, weights = strong.rows_of(l)
        at = np.concatenate([[0], np.cumsum(counts.ravel(), dtype=np.int64)])
        for h in range(len(a)):
            for i in range(T):
                r = h * T + i
                k, w = keys[at[r]:at[r + 1]], weights[at[r]:at[r + 1]]
                assert np.all(np.diff(k) > 0)                              # in key order
                order = np.argsort(-w, kind="stable")
                assert_top_keys(np.pad(k[order], (0, 3 - len(k)), constant_values=-1),
                                np.pad(w[order], (0, 3 - len(k))), a[h, i, :i + 1], 3, 0.05)


# --- the compact page -----------------------------------------------------------------------------------

def page_data(text: str) -> dict:
    return json.loads(text.split('<script type="application/json" id="data">')[1].split("</script>")[0])


def decoded(data: dict, n: int):
    b = lambda s: base64.b64decode(s)
    first = np.frombuffer(b(data["first"][n]), "<u2") / 65535
    counts = np.frombuffer(b(data["counts"][n]), np.uint8)
    keys = np.frombuffer(b(data["keys"][n]), "<u4" if data["key_bytes"] == 4 else "<u2")
    weights = np.frombuffer(b(data["weights"][n]), "<u2") / 65535
    return first, counts, keys, weights


def test_compact_page_holds_each_rows_strongest_keys(tmp_path):
    out = tmp_path / "p.html"
    r = cli("attention", PROMPT, "--model", FIXTURES_DIR / "llama_gqa3", "--html", out, "--html-form", "compact")
    assert r.exit_code == 0, r.output
    data = page_data(out.read_text())
    model, tok = minigen.load(FIXTURES_DIR / "llama_gqa3")
    ids = tok.encode(PROMPT)
    record, T = prompt_attention(model, ids), len(ids)
    assert data["form"] == "compact" and data["rule"]["cut"] is None and len(data["tokens"]) == T
    for n, l in enumerate(data["layers"]):
        first, counts, keys, weights = decoded(data, n)
        np.testing.assert_allclose(first.reshape(9, T), record[l][:, :, 0], atol=1e-5)
        at = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        for r in range(9 * T):
            h, i = divmod(r, T)
            k, w = keys[at[r]:at[r + 1]], weights[at[r]:at[r + 1]]
            order = np.argsort(-w, kind="stable")
            assert_top_keys(np.pad(k[order].astype(int), (0, H.TOP_K - len(k)), constant_values=-1),
                            np.pad(w[order], (0, H.TOP_K - len(k))), record[l][h, i, :i + 1], H.TOP_K, H.FLOOR)
        thumbs = np.frombuffer(base64.b64decode(data["thumbs"][n]), np.uint8).reshape(9, T, T) / 255
        np.testing.assert_allclose(thumbs ** 2, record[l], atol=2 / 255)   # T < 64: one pixel a weight


def test_compact_page_fits_its_limit_weakest_entries_first():
    T, rng = 300, np.random.default_rng(0)
    w = rng.random((2, T, T)) ** 6 * np.tril(np.ones((T, T)))
    w /= w.sum(-1, keepdims=True)
    strong, th = TL.StrongKeys([0], 2, T), TL.Thumbs([0], 2, T)
    for t in SC.map_tiles(0, w):
        strong.tile(t), th.tile(t)
    rows = {0: (strong.first[0], *strong.rows_of(0))}
    thumbs = {0: (th.plain[0], th.hidden[0])}
    tokens = [f"t{i}" for i in range(T)]
    whole = H.render_compact(rows, thumbs, [0, 1], tokens)
    limit = len(whole.encode()) - 20_000
    cut = H.render_compact(rows, thumbs, [0, 1], tokens, limit=limit)
    assert len(cut.encode()) <= limit
    d0, d1 = page_data(whole), page_data(cut)
    assert d0["rule"]["cut"] is None and d1["rule"]["cut"] > H.FLOOR
    f, c, k, v = decoded(d1, 0)
    others = np.repeat(1 - f, c)
    assert np.all(v / others >= d1["rule"]["cut"] - 1e-4)              # what is left is the strongest


@pytest.mark.parametrize("name", HYBRIDS)
def test_hybrid_pages_show_the_attention_layers_and_name_the_others(tmp_path, name):
    out = tmp_path / "h.html"
    r = cli("attention", PROMPT, "--model", FIXTURES_DIR / name, "--html", out, "--html-form", "compact")
    assert r.exit_code == 0, r.output
    data = page_data(out.read_text())
    cfg = minigen.load(FIXTURES_DIR / name)[0].config
    assert data["layers"] == attention_layers(cfg)
    assert data["mixers"] == [H.MIXER_NAMES[cfg.mixer(i)] for i in range(cfg.n_layers)]
    assert any(m != "attention" for m in data["mixers"])
    assert "no attention weights" in out.read_text()                   # the page's label for the others


# --- dumps: top keys and windows of queries -----------------------------------------------------------------

def test_top_keys_dump_and_its_page(tmp_path):
    out = tmp_path / "top.npz"
    name = "llama_gqa3"
    maps, ids = reference_maps(name)
    prompt = minigen.load(FIXTURES_DIR / name)[1].decode(ids[1:])
    r = cli("attention", prompt, "--model", FIXTURES_DIR / name, "--dump-attention", out, "--attn-top-k", 4,
            "--attn-heads", "2-4")
    assert r.exit_code == 0 and "top keys" in r.output, r.output
    d = load_attention(out)
    assert d["form"] == "top" and d["top_k"] == 4 and d["heads"] == [2, 3, 4]
    assert np.array_equal(d["token_ids"], ids)
    for l, got in d["layers"].items():
        a = maps[l][2:5]
        np.testing.assert_allclose(got["first"], a[:, :, 0], atol=1e-5)
        for h in range(3):
            for i in range(len(ids)):
                assert_top_keys(got["keys"][h, i], got["weights"][h, i], a[h, i, :i + 1], 4)
        assert got["thumbs"].shape == (3, len(ids), len(ids))
        np.testing.assert_allclose(got["thumbs"], a, atol=1e-3)          # float16 of a weight a pixel
    with np.load(out) as z:                                            # numpy alone reads it
        assert z["attention_top_keys_0"].dtype == np.int32 and json.loads(str(z["meta"]))["form"] == "top"
    page = tmp_path / "top.html"
    assert cli("attention", "--from", out, "--html", page).exit_code == 0
    assert page_data(page.read_text())["form"] == "compact"
    r = cli("attention", "--from", out)
    assert r.exit_code == 1 and "the census needs every weight" in r.output


def test_window_dump_holds_full_rows_equal_to_output_attentions(tmp_path):
    ref = np.load(FIXTURES_DIR / "llama_gqa3" / "reference_long.npz")
    model, tok = minigen.load(FIXTURES_DIR / "llama_gqa3")
    ids = ref["input_ids"]
    window = TL.Window([0, 1, 2], 9, 290, 300)
    SC.scan(model, ids, [0, 1, 2], list(range(9)), [window])
    for l in range(3):                                                 # transformers' last 10 rows of 300
        np.testing.assert_allclose(window.rows[l], ref["attn_rows"][l], atol=1e-5, rtol=0)
    out = tmp_path / "rows.npz"
    r = cli("attention", PROMPT, "--model", FIXTURES_DIR / "llama_gqa3", "--dump-attention", out,
            "--attn-queries", "4-7", "--attn-layers", 1)
    assert r.exit_code == 0, r.output
    d = load_attention(out)
    full = prompt_attention(model, d["token_ids"])
    assert d["form"] == "rows" and d["queries"] == (4, 8) and list(d["layers"]) == [1]
    np.testing.assert_allclose(d["layers"][1], full[1][:, 4:8, :8], atol=1e-5)


# --- generate --dump-attention at length: the same forms, streamed from every step ------------------------------

def generated_dump(tmp_path, name, *flags, n=5, out="g.npz"):
    """generate's dump (greedy, -n n) of the reference prompt: (its load_attention, the reference maps)."""
    maps, ids = reference_maps(name)
    prompt = minigen.load(FIXTURES_DIR / name)[1].decode(ids[1:])
    r = cli("generate", prompt, "--model", FIXTURES_DIR / name, "-n", n, "--temp", 0, "--ignore-eos", "-q",
            "--dump-attention", tmp_path / out, "--attn-verify", *flags)
    assert r.exit_code == 0 and "match an uncached recomputation" in r.output, r.output
    d = load_attention(tmp_path / out)
    assert np.array_equal(d["token_ids"][:len(ids)], ids) and d["prompt_length"] == len(ids)
    assert len(d["token_ids"]) == len(ids) + n - 1
    return d, maps


@pytest.mark.parametrize("name", ["llama_gqa3", "mistral_sliding", "lfm2"])
def test_generation_dumps_compact_and_windows_equal_the_full_dump_and_output_attentions(tmp_path, name):
    """The three forms of one greedy run: the full maps' prompt rows are transformers' output_attentions, the
    top keys of every row (the prompt's and the generated tokens') are the full maps' top keys, a window of
    queries across the prompt's end is the full maps' slice."""
    full, maps = generated_dump(tmp_path, name, out="full.npz")
    top, _ = generated_dump(tmp_path, name, "--attn-top-k", 3, "--attn-heads", "1-2", out="top.npz")
    P = full["prompt_length"]
    rows, _ = generated_dump(tmp_path, name, "--attn-queries", f"{P - 2}-{P + 2}", out="rows.npz")
    T = len(full["token_ids"])
    th = TL.Thumbs(sorted(full["layers"]), 2, T)
    SC.scan_maps({l: a[1:3] for l, a in full["layers"].items()}, [th])
    assert top["form"] == "top" and top["top_k"] == 3 and top["heads"] == [1, 2]
    assert rows["form"] == "rows" and rows["queries"] == (P - 2, P + 3)
    for l, a in full["layers"].items():
        np.testing.assert_allclose(a[:, :P, :P], maps[l], atol=1e-5, rtol=0)
        got = top["layers"][l]
        np.testing.assert_allclose(got["first"], a[1:3, :, 0], atol=1e-5)
        for h in range(2):
            for i in range(T):
                assert_top_keys(got["keys"][h, i], got["weights"][h, i], a[1 + h, i, :i + 1], 3)
        listed = np.where(got["keys"] >= 0, got["weights"], 0).sum(-1)
        np.testing.assert_allclose(got["rest"], a[1:3, :, 1:].sum(-1) - listed, atol=1e-5)
        n = sorted(full["layers"]).index(l)
        np.testing.assert_allclose(got["thumbs"], th.plain[n], atol=1e-3)   # float16 pixels
        np.testing.assert_allclose(got["thumbs_hidden"], th.hidden[n], atol=1e-3)
        np.testing.assert_allclose(rows["layers"][l], a[:, P - 2:P + 3, :P + 3], atol=1e-5, rtol=0)
        np.testing.assert_allclose(rows["layers"][l][:, :2, :P], maps[l][:, P - 2:], atol=1e-5, rtol=0)


def test_generation_dump_of_a_run_that_stops_early_is_cut_to_its_rows(tmp_path):
    """A run that ends before max_tokens (EOS, a stop string): the arrays made for the most it could give are
    cut to the rows it gave, the thumbnails (blocks of T) made again for T; a window past its end is cut."""
    from minigen.generation.options import Options
    from minigen.generation.steps import Run
    from minigen.inspect.rundump import GenerationDump
    model, tok = minigen.load(FIXTURES_DIR / "llama_gqa3")
    ids = list(np.random.default_rng(2).integers(5, model.config.vocab_size, 90))   # thumbnails of 64 < T pixels
    dumps = {}
    for form, flags in [("full", {}), ("top", {"top_k": 4}), ("rows", {"queries": "85-120"})]:
        run = Run(model, tok, ids, Options(max_tokens=6, temp=0, ignore_eos=True))
        with GenerationDump(model, tok, tmp_path / f"{form}.npz", ids, 40, **flags) as d:
            d.attach(run)
            seen = []
            run.on_step.append(lambda step: seen.append(step.attentions))
            run.text()
            assert seen == [None] * 6                                         # no step's maps are held
            d.finish(verify=True)
        dumps[form] = load_attention(tmp_path / f"{form}.npz")
    T = 95
    full = dumps["full"]["layers"]
    assert len(dumps["full"]["token_ids"]) == T and full[0].shape == (9, T, T)
    record = prompt_attention(model, dumps["full"]["token_ids"])
    th = TL.Thumbs(sorted(full), 9, T)
    SC.scan_maps(full, [th])
    for n, l in enumerate(sorted(full)):
        np.testing.assert_allclose(full[l], record[l], atol=1e-5, rtol=0)
        top = dumps["top"]["layers"][l]
        assert top["keys"].shape == (9, T, 4)
        np.testing.assert_allclose(top["first"], full[l][:, :, 0], atol=1e-5)
        np.testing.assert_allclose(top["thumbs"], th.plain[n], atol=2e-3)
        np.testing.assert_allclose(top["thumbs_hidden"], th.hidden[n], atol=2e-3)
    assert dumps["rows"]["queries"] == (85, T)
    np.testing.assert_allclose(dumps["rows"]["layers"][1], full[1][:, 85:], atol=1e-5)


def test_generation_top_keys_dump_makes_the_compact_page(tmp_path):
    generated_dump(tmp_path, "llama_gqa3", "--attn-top-k", 2, n=3)
    page = tmp_path / "g.html"
    r = cli("attention", "--from", tmp_path / "g.npz", "--html", page)
    assert r.exit_code == 0, r.output
    assert page_data(page.read_text())["form"] == "compact"


def test_generation_dump_over_its_budget_is_refused_before_the_forward(tmp_path, monkeypatch):
    monkeypatch.setattr(D, "BUDGET", 200_000)     # bytes: gpt2's 128-token context's full maps of 2 x 4 heads: 264 kB
    with monkeypatch.context() as m:
        m.setattr(minigen.engine.model, "forward", lambda *a, **k: pytest.fail("a forward pass ran"))
        r = cli("generate", PROMPT, "--model", FIXTURES_DIR / "gpt2", "-n", 200, "--dump-attention", tmp_path / "d.npz")
    assert r.exit_code == 1 and "Traceback" not in r.output and r.stdout == ""
    assert re.search(r"the attention dump would take [\d.,]+ MiB \(2 layers x 4 heads x 128x128 float32\)", r.output)
    assert "--attn-top-k 8" in r.output and not list(tmp_path.iterdir())
    r = cli("generate", PROMPT, "--model", FIXTURES_DIR / "gpt2", "-n", 200, "-q", "--dump-attention",
            tmp_path / "d.npz", "--attn-top-k", 4)
    assert r.exit_code == 0, r.output                                   # the compact form fits (172 kB)
    assert load_attention(tmp_path / "d.npz")["layers"][0]["keys"].shape == (4, 128, 4)


@pytest.mark.parametrize("flags,words", [
    (["--attn-top-k", 4], ["go with --dump-attention"]),
    (["--attn-queries", "1-3"], ["go with --dump-attention"]),
    (["--dump-attention", "x.npz", "--attn-top-k", 2, "--attn-queries", "1-2"], ["choose one"]),
])
def test_generation_dump_flags_that_do_not_go_together(flags, words):
    r = cli("generate", PROMPT, "--model", FIXTURES_DIR / "gpt2", "-n", 2, *flags)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert all(w in r.output for w in words), r.output


def test_generation_window_past_the_runs_rows_is_refused_before_the_forward(tmp_path):
    r = cli("generate", PROMPT, "--model", FIXTURES_DIR / "gpt2", "-n", 2, "--dump-attention", tmp_path / "d.npz",
            "--attn-queries", "500-600")
    assert r.exit_code == 1 and "out of range" in r.output and "query rows" in r.output and r.stdout == ""


# --- exact rows on demand -------------------------------------------------------------------------------

def served(name, ids):
    model = minigen.load(FIXTURES_DIR / name)[0]
    layers = attention_layers(model.config)
    kept = SC.scan(model, ids, layers, list(range(model.config.n_heads)), [], keep=True)
    return App(b"<html>page</html>", kept, layers, list(range(model.config.n_heads)), len(ids))


def rows_of(reply: dict) -> np.ndarray:
    w = np.frombuffer(base64.b64decode(reply["weights"]), "<f4")
    return w.reshape(reply["q1"] - reply["q0"], reply["k1"] - reply["k0"])


@pytest.mark.parametrize("name", ["llama_gqa3", "gemma2", "phi3", "qwen3_5", "falcon_h1"])
def test_served_rows_equal_output_attentions(name):
    maps, ids = reference_maps(name)
    app = served(name, ids)
    T = len(ids)
    for l, a in maps.items():
        for head in (0, a.shape[0] - 1):
            status, kind, body = answer(app, f"/weights?layer={l}&head={head}&q0=0&q1={T}")
            assert status == 200 and kind == "application/json"
            np.testing.assert_allclose(rows_of(json.loads(body)), a[head], atol=1e-5, rtol=0)
            status, _, body = answer(app, f"/weights?layer={l}&head={head}&q0={T - 3}&q1={T - 1}&k0=5&k1=20")
            np.testing.assert_allclose(rows_of(json.loads(body)), a[head, T - 3:T - 1, 5:20], atol=1e-5, rtol=0)


def test_served_rows_of_a_long_prompt_equal_output_attentions():
    ref = np.load(FIXTURES_DIR / "mistral_sliding" / "reference_long.npz")   # a sliding window across 300 keys
    app = served("mistral_sliding", ref["input_ids"])
    for l in range(2):
        body = json.loads(answer(app, f"/weights?layer={l}&head=3&q0=290&q1=300")[2])
        np.testing.assert_allclose(rows_of(body), ref["attn_rows"][l, 3], atol=1e-5, rtol=0)


@pytest.mark.parametrize("target,words", [
    ("/weights?layer=9&head=0&q0=0&q1=1", ["layer 9"]), ("/weights?layer=0&head=0&q0=5&q1=2", ["q0 5"]),
    ("/weights?layer=0&head=x&q0=0&q1=1", ["head 'x'"]), ("/weights?layer=0&q0=0&q1=1", ["head: missing"]),
    ("/weights?layer=0&head=0&q0=0&q1=3&k1=9", ["k1 9"]),
])
def test_served_bad_requests_name_the_field(target, words):
    app = served("gpt2", np.arange(5, 20))
    status, _, body = answer(app, target)
    assert status == 400
    for w in words:
        assert w in json.loads(body)["error"]
    assert answer(app, "/nope")[0] == 404 and answer(app, "/")[2] == b"<html>page</html>"


def test_server_answers_on_localhost_and_stops():
    app = served("gpt2", np.arange(5, 20))
    server = serve(app, 0)
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/weights?layer=1&head=2&q0=3&q1=4", timeout=10) as r:
            reply = json.loads(r.read())
        np.testing.assert_allclose(rows_of(reply)[0], prompt_attention(minigen.load(FIXTURES_DIR / "gpt2")[0],
                                                                      np.arange(5, 20))[1][2, 3, :4], atol=1e-5)
    finally:
        server.shutdown()
        server.server_close()


def test_serve_command_prints_its_port_and_stops_on_ctrl_c():
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "minigen", "attention", PROMPT, "--model", str(FIXTURES_DIR / "gpt2"),
                          "--serve"], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = ""
        while "serving" not in line:                                    # the first lines: loading, then the URL
            line = p.stderr.readline()
            assert line, "the server stopped before serving"
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)[0]
        with urllib.request.urlopen(url + "health", timeout=10) as r:
            assert json.loads(r.read())["status"] == "ok"
        with urllib.request.urlopen(url, timeout=10) as r:
            assert b"minigen attention" in r.read()
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# --- refused before any forward pass ------------------------------------------------------------------------

@pytest.fixture
def no_forward(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a forward pass ran")
    monkeypatch.setattr(P, "scan", refuse)


def test_full_page_over_its_limit_is_refused_before_the_forward(tmp_path, monkeypatch, no_forward):
    monkeypatch.setattr(H, "MAX_HTML_BYTES", 1000)
    r = cli("attention", PROMPT, "--model", FIXTURES_DIR / "gpt2", "--html", tmp_path / "p.html", "--html-form", "full")
    assert r.exit_code == 1 and "the full page would inline" in r.output and "--html-form compact" in r.output
    assert not list(tmp_path.iterdir())


def test_dump_over_its_budget_is_refused_before_the_forward(tmp_path, monkeypatch, no_forward):
    monkeypatch.setattr(D, "BUDGET", 1000)
    r = cli("attention", PROMPT, "--model", FIXTURES_DIR / "gpt2", "--dump-attention", tmp_path / "d.npz")
    assert r.exit_code == 1 and "MiB" in r.output and "--attn-top-k" in r.output
    assert not list(tmp_path.iterdir())


def test_what_would_not_fit_in_memory_is_refused_before_the_forward(monkeypatch, no_forward):
    monkeypatch.setattr(P, "available_memory", lambda: 1000)   # bytes: less than the tiny model needs
    r = cli("attention", PROMPT, "--model", FIXTURES_DIR / "gpt2")
    assert r.exit_code == 1 and "GiB of memory" in r.output and "available" in r.output


@pytest.mark.parametrize("flags,words", [
    (["--attn-top-k", 4], ["--attn-top-k goes with --dump-attention"]),
    (["--attn-queries", "1-3"], ["--attn-queries goes with"]),
    (["--port", 8000], ["--port goes with --serve"]),
    (["--html-form", "full"], ["--html-form goes with"]),
    (["--dump-attention", "x.npz", "--attn-top-k", 2, "--attn-queries", "1-2"], ["choose one"]),
])
def test_flags_that_do_not_go_together(flags, words):
    r = cli("attention", PROMPT, "--model", FIXTURES_DIR / "gpt2", *flags)
    assert r.exit_code == 2 and "Traceback" not in r.output
    for w in words:
        assert w in r.output, r.output


def test_serve_from_a_dump_is_refused(tmp_path):
    out = tmp_path / "d.npz"
    assert cli("attention", PROMPT, "--model", FIXTURES_DIR / "gpt2", "--dump-attention", out).exit_code == 0
    r = cli("attention", "--from", out, "--serve")
    assert r.exit_code == 2 and "--serve recomputes rows" in r.output


def test_float16_rounding_matches_numpys():
    x = np.concatenate([np.random.default_rng(0).random(20000).astype(np.float32) ** 8,
                        np.float32([0, -0.0, 6.1e-5, 6.0e-5, 2 ** -25, 3 * 2 ** -25, 1.5 * 2 ** -24, 65504, 1e-45,
                                    2 ** -14, -3e-7])]).astype(np.float32)
    assert np.array_equal(TL.as_float16(x).view(np.uint16), x.astype(np.float16).view(np.uint16))

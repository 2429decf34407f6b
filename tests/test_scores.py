"""minigen.score, answers, perplexity and KL divergence against transformers (tests/fixtures/*/reference*.npz)."""
import io
import math
from functools import lru_cache

import numpy as np
import pytest

import minigen
from conftest import FIXTURES, FIXTURES_DIR, load_reference
from minigen.engine.model import Model
from minigen.errors import MinigenError
from minigen.generation import scores as S

NAMES = sorted(FIXTURES)


@lru_cache(maxsize=None)
def fixture(name):
    return minigen.load(FIXTURES_DIR / name)


def ref_logprobs(ref) -> np.ndarray:
    """log_softmax of transformers' logits, in float64 (the reference, not minigen's code)."""
    x = ref["logits"].astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("name", NAMES)
def test_score_equals_log_softmax_of_transformers(name):
    model, tok = fixture(name)
    ref = load_reference(name)
    scored = minigen.score(model, tok, str(ref["prompt"]))
    ids = ref["input_ids"]
    assert scored.ids == ids.tolist() and scored.logprobs[0] is None
    want = ref_logprobs(ref)[np.arange(len(ids) - 1), ids[1:]]
    assert np.abs(np.array(scored.logprobs[1:]) - want).max() <= 1e-4
    assert scored.total == pytest.approx(want.sum(), abs=1e-3)


def test_answer_total_rank_and_alternatives():
    model, tok = fixture("llama_gqa3")
    ref = load_reference("llama_gqa3")
    ids, lp = ref["input_ids"], ref_logprobs(ref)
    answer = tok.decode(ids[12:16])
    assert tok.encode(answer, add_special_tokens=False) == ids[12:16].tolist()  # the span re-encodes alike
    got = S.score_answer(model, tok, ids[:12].tolist(), answer, top_k=3)
    want = [lp[p - 1, ids[p]] for p in range(12, 16)]
    assert got["ids"] == ids[12:16].tolist()
    assert got["logprob"] == pytest.approx(sum(want), abs=1e-4)
    assert got["first_rank"] == int((lp[11] > lp[11, ids[12]]).sum()) + 1
    for t, p in zip(got["tokens"], range(12, 16)):
        assert t.logprob == pytest.approx(lp[p - 1, ids[p]], abs=1e-4)
        assert [i for i, _ in t.top] == list(np.argsort(-lp[p - 1], kind="stable")[:3])


def test_score_bad_inputs():
    model, tok = fixture("gpt2")
    with pytest.raises(MinigenError, match="at least 2"):
        minigen.score(model, tok, "")
    with pytest.raises(MinigenError, match="encodes to no tokens"):
        S.score_answer(model, tok, [1, 2], "")
    with pytest.raises(MinigenError, match="longer than the model's context"):
        S.score_ids(model, tok, [1] * (model.config.max_position_embeddings + 1))


def bos_of(name):
    return S.added_bos(fixture(name)[1])


@pytest.mark.parametrize("name", NAMES)
def test_perplexity_llama_method_equals_transformers_loss(name):
    model, tok = fixture(name)
    ref = dict(np.load(FIXTURES_DIR / name / "reference_scores.npz"))
    ctx = int(ref["llama_ctx"])
    r = S.perplexity(model, ref["ppl_ids"], ctx, bos=bos_of(name))
    counts = ref["llama_counts"]
    assert r.windows == len(counts) and r.count == counts.sum() == r.windows * (ctx - 1 - ctx // 2)
    per_chunk = r.nll.reshape(r.windows, -1).mean(axis=1)
    np.testing.assert_allclose(per_chunk, ref["llama_losses"], rtol=1e-4)
    assert r.ppl == pytest.approx(math.exp(np.average(ref["llama_losses"], weights=counts)), rel=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_perplexity_stride_method_equals_transformers_loss(name):
    model, tok = fixture(name)
    ref = dict(np.load(FIXTURES_DIR / name / "reference_scores.npz"))
    r = S.perplexity(model, ref["ppl_ids"], int(ref["stride_ctx"]), stride=int(ref["stride"]))
    counts = ref["stride_counts"]
    assert r.count == counts.sum() == len(ref["ppl_ids"]) - 1  # every token but the first, once
    bounds = np.cumsum(counts)[:-1]
    np.testing.assert_allclose([c.mean() for c in np.split(r.nll, bounds)], ref["stride_losses"], rtol=1e-4)
    assert r.ppl == pytest.approx(math.exp(np.average(ref["stride_losses"], weights=counts)), rel=1e-4)


def test_bos_replaces_each_chunks_first_token():
    assert bos_of("llama_gqa3") == 1 and bos_of("qwen2") is None and bos_of("gpt2") is None
    ws = S.llama_windows(np.arange(10, 30), 8, bos=1)
    assert len(ws) == 2 and [w.ids[0] for w in ws] == [1, 1] and ws[1].ids[1:].tolist() == list(range(19, 26))
    assert all(w.first == 4 for w in ws)


def test_windows_refuse_short_texts_and_bad_strides():
    with pytest.raises(MinigenError, match="shorter than one window of 64"):
        S.windows_for(np.arange(63), 64, None, None)
    with pytest.raises(MinigenError, match="--stride 0"):
        S.windows_for(np.arange(100), 64, 0, None)
    with pytest.raises(MinigenError, match="--stride 65"):
        S.windows_for(np.arange(100), 64, 65, None)


def saved(model, ids, ctx, stride=None, k=S.TOP_K):
    buf = io.BytesIO()
    w = S.LogitsWriter(buf, "test", k)
    r = S.perplexity(model, ids, ctx, stride, save=w)
    return r, buf.getvalue()


def base_from(tmp_path, data):
    path = tmp_path / "base.logits"
    path.write_bytes(data)
    return S.BaseLogits(path)


def perturbed(model, scale=1.3):
    params = dict(model.params)
    params["lm_head"] = model.params["lm_head"] * np.float32(scale)
    return Model(model.config, params, model.generation_config, model.path)


@pytest.mark.parametrize("stride", [None, 10])
def test_kl_of_a_model_against_itself_is_zero(tmp_path, stride):
    model, _ = fixture("llama_gqa3")
    ids = np.asarray(dict(np.load(FIXTURES_DIR / "llama_gqa3" / "reference_scores.npz"))["ppl_ids"])
    r, data = saved(model, ids, 32, stride)
    again = S.perplexity(model, ids, 32, stride, base=base_from(tmp_path, data))
    kl = again.kl
    assert kl["positions"] == r.count and abs(kl["kl_mean"]) < 1e-6 and abs(kl["kl_max"]) < 1e-5
    assert kl["same_top"] == 1.0 and kl["ppl_diff"] == pytest.approx(0, abs=1e-3 * r.ppl)


def full_kl(model_p, model_q, ids, ctx):
    """KL(P || Q) over the whole vocabulary at llama-perplexity's positions, in float64."""
    out = []
    for w in S.llama_windows(np.asarray(ids), ctx):
        lp = [np.log(np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
              for x in (m.logits(w.ids).astype(np.float64)[w.first:-1] for m in (model_p, model_q))]
        out.append((np.exp(lp[0]) * (lp[0] - lp[1])).sum(-1))
    return np.concatenate(out)


def test_kl_against_another_model_equals_the_full_sum(tmp_path):
    model, _ = fixture("llama_gqa3")
    other = perturbed(model)
    ids = np.asarray(dict(np.load(FIXTURES_DIR / "llama_gqa3" / "reference_scores.npz"))["ppl_ids"])
    want = full_kl(model, other, ids, 32)
    _, everything = saved(model, ids, 32, k=model.config.vocab_size)   # top-V: nothing merged
    kl = S.perplexity(other, ids, 32, base=base_from(tmp_path, everything)).kl
    assert kl["kl_mean"] == pytest.approx(want.mean(), rel=1e-4) and kl["kl_median"] == pytest.approx(np.median(want), rel=1e-3)
    _, top = saved(model, ids, 32, k=8)                                # the tail merged: a lower bound, close
    coarse = S.perplexity(other, ids, 32, base=base_from(tmp_path, top)).kl
    assert 0 < coarse["kl_mean"] <= kl["kl_mean"] * (1 + 1e-6) and coarse["kl_mean"] > 0.5 * kl["kl_mean"]
    p_nll = S.perplexity(model, ids, 32).nll
    assert kl["ppl_base"] == pytest.approx(math.exp(p_nll.mean()), rel=1e-5)


def test_a_base_from_other_windows_is_refused(tmp_path):
    model, _ = fixture("gpt2")
    ids = np.arange(5, 105)
    _, data = saved(model, ids, 32)
    base = base_from(tmp_path, data)
    with pytest.raises(MinigenError, match="made with ctx 32, this run has 20"):
        S.perplexity(model, ids, 20, base=base)
    with pytest.raises(MinigenError, match="tokens_sha256"):
        S.perplexity(model, ids[::-1].copy(), 32, base=base)
    (tmp_path / "cut.logits").write_bytes(data[:-10])
    with pytest.raises(MinigenError, match="cut short"):
        S.BaseLogits(tmp_path / "cut.logits")
    (tmp_path / "junk.logits").write_bytes(b"PK\x03\x04 not ours")
    with pytest.raises(MinigenError, match="not a file written by minigen perplexity"):
        S.BaseLogits(tmp_path / "junk.logits")


def test_progress_reports_the_running_estimate():
    model, _ = fixture("gpt2")
    seen = []
    r = S.perplexity(model, np.arange(5, 105), 32, on_window=seen.append)
    assert [p.window for p in seen] == [1, 2, 3] and seen[-1].ppl == pytest.approx(r.ppl)
    sd = r.nll.std()  # the population sd, as llama.cpp's mean(x^2) - mean(x)^2
    assert seen[-1].se == pytest.approx(r.ppl * sd / math.sqrt(r.count - 1), rel=1e-6)

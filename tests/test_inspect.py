"""Attention dumps, census statistics, the induction probe, the HTML page, and bad input (issue 5)."""
import json
import re
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import minigen
from minigen.cli import main
from minigen.errors import MinigenError
from minigen.inspect import census, head_stats, induction_score, load_attention, render_html
from minigen.inspect.args import position, selection
from minigen.inspect.dump import Recorder, check_budget
from minigen.inspect.internals import induction_probe, prompt_attention

from conftest import FIXTURES, FIXTURES_DIR, interrupt_generation, load_reference
from inspect_fixture import make_induction_gpt2

PROMPT = "The cat sat on the mat. The cat sat on the"


def cli(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def causal_uniform(T):
    a = np.tril(np.ones((T, T)))
    return a / a.sum(-1, keepdims=True)


# --- statistics on hand-built patterns --------------------------------------------------------------

def test_census_on_hand_built_patterns():
    T = 12
    prev = np.eye(T, k=-1)
    prev[0, 0] = 1                                       # row 0 can only look at itself
    sink = np.zeros((T, T))
    sink[:, 0] = 1
    pats = np.stack([prev, causal_uniform(T), sink, np.eye(T)])
    s = head_stats(pats)
    assert s["prev"][0] == pytest.approx(1)               # a pure previous-token head
    assert s["prev"][3] == 0 and s["prev"][1] < 0.5
    assert s["entropy"][1] == pytest.approx(1)          # uniform over the visible keys
    assert s["entropy"][0] == pytest.approx(0) and s["entropy"][2] == pytest.approx(0)
    assert s["sink"][2] == pytest.approx(1)              # all on the first token
    assert s["self"][3] == pytest.approx(1) and s["self"][0] == 0
    assert s["max"][0] == pytest.approx(1) and s["max"][1] < 0.5
    table = census({0: pats[:2], 3: pats[2:]})
    assert table["sink"].shape == (2, 2) and table["sink"][1, 0] == pytest.approx(1)


def test_induction_score_on_hand_built_pattern():
    n, T = 5, 11                                          # BOS + r + r
    a = causal_uniform(T)
    q = np.arange(T - n, T)
    a[q] = 0
    a[q, q - n + 1] = 1                                   # each second-repeat token -> after its first copy
    assert induction_score(a, n) == pytest.approx(1)
    assert induction_score(causal_uniform(T), n) < 0.2


def test_selection_and_budget():
    assert selection("0,5-7", 30, "layer", "--attn-layers") == [0, 5, 6, 7]
    assert selection("-1", 30, "layer", "--attn-layers") == [29]
    assert selection(None, 3, "head", "--attn-heads") == [0, 1, 2]
    with pytest.raises(MinigenError, match="out of range"):
        selection("30", 30, "layer", "--attn-layers")
    with pytest.raises(MinigenError, match="--attn-layers"):
        check_budget(30, 9, 5000, np.float32)


# --- dumps equal the references ---------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_prompt_attention_equals_reference(name):
    ref = load_reference(name)
    rec = prompt_attention(minigen.load(FIXTURES_DIR / name)[0], ref["input_ids"])
    np.testing.assert_allclose(np.stack(rec), ref["attentions"], atol=1e-5, rtol=0)


def test_attention_dump_cli_equals_reference(tmp_path):
    name = "llama_gqa3"                                   # GQA: checks HF's head order h -> h // group
    ref = load_reference(name)
    model, tok = minigen.load(FIXTURES_DIR / name)
    prompt = tok.decode(ref["input_ids"][1:])
    out = tmp_path / "p.npz"
    r = cli("attention", prompt, "--model", FIXTURES_DIR / name, "--dump-attention", out)
    assert r.exit_code == 0, r.output
    d = load_attention(out)
    ids = d["token_ids"]
    ref_rec = prompt_attention(model, ids)
    for l, a in d["layers"].items():     # the dump's blocked softmax sums in its own order: float32's rounding
        np.testing.assert_allclose(a, ref_rec[l], atol=1e-5)
    if np.array_equal(ids, ref["input_ids"]):
        np.testing.assert_allclose(np.stack([d["layers"][l] for l in sorted(d["layers"])]), ref["attentions"], atol=1e-5)
    assert d["meta"]["head_to_kv_head"] == [h // 3 for h in range(9)]


def generate_dump(tmp_path, name, *extra, max_tokens=8):
    out = tmp_path / "gen.npz"
    r = cli("generate", "Once upon a time", "--model", FIXTURES_DIR / name, "-n", max_tokens, "--temp", 0,
            "--ignore-eos", "-q", "--dump-attention", out, *extra)
    assert r.exit_code == 0, r.output
    return out, r


@pytest.mark.parametrize("name", ["llama_gqa3", "mistral_sliding", "gpt2"])
def test_generation_dump_rows_equal_uncached(tmp_path, name):
    out, _ = generate_dump(tmp_path, name)
    d = load_attention(out)
    model = minigen.load(FIXTURES_DIR / name)[0]
    ids, P = d["token_ids"], d["prompt_length"]
    assert len(ids) == P + 8 - 1                          # the last generated token has no row
    assert d["meta"]["final_token"] is not None and "no row" in d["meta"]["note"]
    full = prompt_attention(model, ids)                   # the whole sequence, no cache
    for l, a in d["layers"].items():
        assert a.dtype == np.float32 and a.shape == (model.config.n_heads, len(ids), len(ids))
        np.testing.assert_allclose(a, full[l], atol=1e-5)
        assert np.all(a[:, np.triu_indices(len(ids), 1)[0], np.triu_indices(len(ids), 1)[1]] == 0)
        np.testing.assert_allclose(a.sum(-1), 1, atol=1e-5)
    with np.load(out) as z:                               # numpy alone reads it
        meta = json.loads(str(z["meta"]))
    assert {"tokens", "model_path", "architecture", "n_layers", "n_heads", "n_kv_heads", "head_to_kv_head",
            "layers", "heads", "dtype"} <= set(meta)


def test_generation_dump_selection_dtype_verify(tmp_path):
    out, r = generate_dump(tmp_path, "llama_gqa3", "--attn-layers", "0,2", "--attn-heads", "1-3,8",
                           "--attn-dtype", "float16", "--attn-verify")
    assert "verify" in r.output and "match" in r.output
    with np.load(out) as z:
        assert sorted(k for k in z.files if k.startswith("attention_")) == ["attention_tril_0", "attention_tril_2"]
        T = len(z["token_ids"])
        assert z["attention_tril_0"].dtype == np.float16 and z["attention_tril_0"].shape == (4, T * (T + 1) // 2)
    assert load_attention(out)["heads"] == [1, 2, 3, 8]
    assert [p.name for p in tmp_path.iterdir()] == ["gen.npz"]      # no temporary left


def test_dump_over_budget_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("minigen.inspect.dump.BUDGET", 100_000)    # the fixtures are far below 1 GiB
    out = tmp_path / "big.npz"
    r = cli("generate", "hi", "--model", FIXTURES_DIR / "gpt2", "-n", 100, "-q", "--dump-attention", out)
    assert_clean_failure(r, "--attn-layers", "--attn-heads", "--attn-dtype", "budget")
    assert r.stdout == ""                                           # refused before generating
    assert not list(tmp_path.iterdir())


# --- the induction probe on a checkpoint built to have one ---------------------------------------

@pytest.fixture(scope="module")
def induction_model(tmp_path_factory):
    return make_induction_gpt2(tmp_path_factory.mktemp("induction"))


def test_induction_probe_finds_the_induction_head(induction_model):
    p = induction_probe(*minigen.load(induction_model))
    ids, n, scores = p["ids"], p["n"], p["scores"]["induction"]
    assert np.array_equal(ids[:n], ids[n:])
    assert np.unravel_index(scores.argmax(), scores.shape) == (1, 0)
    assert scores[1, 0] > 0.85 and scores[0].max() < 0.2 and scores[1, 1] < 0.2
    r = cli("attention", "a b c d e f g h", "--model", induction_model, "--probe", "induction")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert any(l.split()[:2] == ["previous-token", "heads"] and l.split()[2].startswith("0.0") for l in lines)
    assert any("induction heads" in l and l.split()[-2] == "1.0" or "induction heads" in l and "1.0 0.9" in l for l in lines)
    row = next(l.split() for l in lines if l.split()[:2] == ["0", "0"])
    assert float(row[5]) == pytest.approx(1, abs=1e-3)    # prev column of layer 0 head 0
    row = next(l.split() for l in lines if l.split()[:2] == ["0", "1"])
    assert float(row[2]) == pytest.approx(1, abs=1e-3)    # entropy of the zero head: uniform


# --- the terminal and the page ------------------------------------------------------------------------

def test_topk_bars():
    """The bars of one query's strongest keys are transformers' weights: the top 3 keys of layer 1, head 2,
    query 5 of the reference prompt, in order, each with its percentage, then the rest as "(others)"."""
    ref = load_reference("gpt2")
    model, tok = minigen.load(FIXTURES_DIR / "gpt2")
    ids = [int(i) for i in ref["input_ids"]]
    prompt = tok.decode(ids)
    assert tok.encode(prompt) == ids
    r = cli("attention", prompt, "--model", FIXTURES_DIR / "gpt2", "--layer", 1, "--head", 2, "--token", 5, "-k", 3)
    assert r.exit_code == 0, r.output
    row = ref["attentions"][1, 2, 5, :6]                                     # query 5 sees keys 0..5
    top = np.argsort(-row, kind="stable")[:3]
    bars = [l for l in r.output.splitlines() if "%" in l]
    assert len(bars) == 4 and "█" in r.output
    for line, key in zip(bars, top):
        index, percent = line.split()[0], float(re.search(r"([\d.]+)%", line)[1])
        assert int(index) == key and abs(percent - 100 * row[key]) <= 0.006, (line, key, row[key])
    others = float(re.search(r"([\d.]+)%", bars[3])[1])
    assert "(others)" in bars[3] and abs(others - 100 * (1 - row[top].sum())) <= 0.011


def test_html_is_self_contained(tmp_path):
    out, _ = generate_dump(tmp_path, "llama_gqa3", max_tokens=5)
    page = tmp_path / "a.html"
    r = cli("attention", "--from", out, "--html", page, "--layer", 1, "--head", 4)
    assert r.exit_code == 0, r.output
    text = page.read_text()
    assert "http://" not in text and "https://" not in text and "<script src" not in text and "<link" not in text
    data = json.loads(text.split('<script type="application/json" id="data">')[1].split("</script>")[0])
    assert data["prompt_length"] == load_attention(out)["prompt_length"] and data["select"] == [1, 4]
    assert len(data["weights"]) == 3 and len(data["tokens"]) == len(load_attention(out)["token_ids"])
    assert "hide first token" in text


def test_render_html_round_trips_weights():
    import base64
    a = np.stack([causal_uniform(4), np.eye(4)])[None][0]
    page = render_html({0: a}, [0, 1], list("abcd"))
    data = json.loads(page.split('id="data">')[1].split("</script>")[0])
    w = np.frombuffer(base64.b64decode(data["weights"][0]), "<f2").astype(np.float32)
    i, j = np.tril_indices(4)
    np.testing.assert_allclose(w, a[:, i, j].ravel(), atol=1e-3)


# --- bad input: short message, non-zero exit, no traceback, no file --------------------------------

def assert_clean_failure(r, *words):
    assert r.exit_code != 0
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    for w in words:
        assert w in r.output, r.output


@pytest.mark.parametrize("where", ["missing", "readonly", "isdir"])
def test_bad_dump_path_fails_before_generating(tmp_path, where):
    if where == "missing":
        out = tmp_path / "nope" / "x.npz"
    elif where == "isdir":
        out = tmp_path
    else:
        out = Path("/sys/minigen-test.npz")
        if os.access("/sys", os.W_OK) and not Path("/sys").is_mount():
            pytest.skip("no read-only directory available")
    r = cli("generate", "hello", "--model", FIXTURES_DIR / "gpt2", "-n", 3, "-q", "--dump-attention", out)
    assert_clean_failure(r, str(out))
    assert r.output.startswith("minigen: error:") and r.output.count("\n") == 1
    assert not out.exists() or out.is_dir()
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_bad_dump_path_on_attention(tmp_path):
    out = tmp_path / "missing" / "x.npz"
    r = cli("attention", PROMPT, "--model", FIXTURES_DIR / "gpt2", "--dump-attention", out)
    assert_clean_failure(r, "does not exist")


@pytest.mark.parametrize("args,words", [
    (["--layer", 7, "--head", 0, "--token", 1], ["--layer 7"]),
    (["--layer", 0, "--head", 9, "--token", 1], ["--head 9"]),
    (["--layer", 0, "--head", 0, "--token", 400], ["--token 400", "past the prompt"]),
    (["--attn-layers", "0-5"], ["--attn-layers"]),
])
def test_bad_attention_arguments(args, words):
    r = cli("attention", PROMPT, "--model", FIXTURES_DIR / "gpt2", *args)
    assert_clean_failure(r, *words)


def test_from_missing_dump(tmp_path):
    assert_clean_failure(cli("attention", "--from", tmp_path / "no.npz"), "no such attention dump")


def test_ctrl_c_leaves_no_dump(tmp_path, monkeypatch):
    interrupt_generation(monkeypatch, after=3)
    out = tmp_path / "x.npz"
    r = cli("generate", "hello", "--model", FIXTURES_DIR / "gpt2", "-n", 10, "--dump-attention", out)
    assert r.exit_code == 130 and "no attention dump written" in r.output
    assert not list(tmp_path.iterdir())


# --- issue 11: fixes, sink-aware views, detectors, JSON ---------------------------------------------------

from minigen.inspect.stats import (detect_head_score, duplicate_score, hide_first, induction_mask,
                                   probe_scores)


def test_prev_score_skips_query_1_whose_previous_token_is_the_sink():
    T = 10
    sink = np.zeros((T, T))
    sink[:, 0] = 1
    assert head_stats(sink)["prev"] == 0                  # was 1/(T-1): query 1's previous token is token 0
    prev = np.eye(T, k=-1)
    prev[0, 0] = 1
    assert head_stats(prev)["prev"] == pytest.approx(1)


def test_exclude_first_hides_the_sink_and_renormalises():
    T = 8
    a = np.zeros((T, T))
    a[0, 0] = 1
    a[1:, 0] = 0.9
    a[1, 1] = 0.1
    a[np.arange(2, T), np.arange(1, T - 1)] = 0.1      # the rest of each row on the previous token
    a[5] = 0
    a[5, 0] = 1                                           # one row with nothing but the sink
    plain, hidden = head_stats(a), head_stats(a, exclude_first=True)
    assert plain["prev"] == pytest.approx((0.1 * 5) / 6)  # queries 2..7; row 5 has none
    assert hidden["prev"] == pytest.approx(1)            # rows 2..7 but 5 (nothing left) are pure previous-token
    assert hidden["entropy"] == pytest.approx(0) and hidden["max"] == pytest.approx(1)
    assert hidden["sink"] == plain["sink"] == pytest.approx((0.9 * 6 + 1) / 7)   # what hiding removed
    np.testing.assert_allclose(hide_first(a)[3], np.eye(T)[2])


def test_duplicate_and_transformerlens_induction_scores_by_hand():
    ids = np.array([99, 1, 2, 3, 1, 2, 3])                # BOS + r + r, n = 3
    induction = np.zeros((7, 7))
    induction[:4, 0] = 1                                  # before the repeat: on BOS
    induction[[4, 5, 6], [2, 3, 4]] = 1                   # the token after the earlier copy
    duplicate = np.zeros((7, 7))
    duplicate[:4, 0] = 1
    duplicate[[4, 5, 6], [1, 2, 3]] = 1                   # the earlier copy itself
    assert detect_head_score(induction, induction_mask(ids)) == pytest.approx(3 / 7)   # n / (2n + 1)
    assert detect_head_score(duplicate, induction_mask(ids)) == 0
    assert duplicate_score(duplicate, ids) == 1 and duplicate_score(induction, ids) == 0
    s = probe_scores(np.stack([induction, duplicate]), ids, 3)
    np.testing.assert_allclose(s["induction"], [1, 0])
    np.testing.assert_allclose(s["duplicate"], [0, 1])
    np.testing.assert_allclose(s["induction_tl"], [3 / 7, 0])
    assert detect_head_score(induction, induction_mask(ids), exclude_bos=True) == pytest.approx(1)


def test_token_text_names_its_last_occurrence():
    tokens = ["Mr", " D", "urs", " said", " Mr", " Potter", ",", " and", " Mr"]
    assert position(tokens, "Mr") == 8 and position(tokens, " Mr") == 8
    assert position(tokens, "Potter") == 5 and position(tokens, -1) == 8


def test_top_keys_says_all_keys_when_k_covers_them():
    r = cli("attention", PROMPT, "--model", FIXTURES_DIR / "gpt2", "--layer", 0, "--head", 0, "--token", 2, "-k", 10)
    assert r.exit_code == 0 and "(all 3 keys)" in r.output and "of 3 keys" not in r.output, r.output


def test_old_full_square_dumps_still_load(tmp_path):
    out, _ = generate_dump(tmp_path, "gpt2", max_tokens=4)
    new = load_attention(out)
    old = tmp_path / "v1.npz"
    with np.load(out) as z:
        arrays = {k: z[k] for k in ("token_ids", "prompt_length", "meta")}
    np.savez(old, **arrays, **{f"attention_{l}": a for l, a in new["layers"].items()})
    back = load_attention(old)
    assert back["layers"].keys() == new["layers"].keys()
    for l in new["layers"]:
        np.testing.assert_array_equal(back["layers"][l], new["layers"][l])
    T = len(new["token_ids"])
    assert weight_bytes(out) * 2 * T == weight_bytes(old) * (T + 1)   # the triangle: T(T+1)/2 of T^2


def weight_bytes(path) -> int:
    with np.load(path) as z:
        return sum(z[k].nbytes for k in z.files if k.startswith("attention_"))


def test_dump_of_no_generated_token_is_refused(tmp_path):
    out = tmp_path / "x.npz"
    r = cli("generate", "hello", "--model", FIXTURES_DIR / "gpt2", "-n", 0, "--dump-attention", out, "--attn-verify")
    assert r.exit_code == 2 and "--dump-attention needs at least one generated token" in r.output
    assert "Traceback" not in r.output and not out.exists()


def test_from_dump_keeps_only_the_asked_heads(tmp_path):
    out, _ = generate_dump(tmp_path, "llama_gqa3", "--attn-heads", "1-3", max_tokens=4)
    r = cli("attention", "--from", out, "--attn-heads", "2-3", "--json")
    assert r.exit_code == 0, r.output
    j = json.loads(r.output)
    assert j["heads"] == [2, 3] and np.array(j["stats"]["sink"]).shape == (3, 2)
    d = load_attention(out)
    expected = census({l: a[1:] for l, a in d["layers"].items()})["sink"]
    np.testing.assert_allclose(j["stats"]["sink"], expected)
    assert_clean_failure(cli("attention", "--from", out, "--attn-heads", "0"), "--attn-heads", "head 0 is not in")


@pytest.mark.parametrize("flags,words", [
    (["--chat"], ["--chat"]), (["--attn-dtype", "float16"], ["--attn-dtype"]),
    (["--model", FIXTURES_DIR / "gpt2"], ["--model", "--value-weighted"]),
    (["--probe-first", "none"], ["--probe-first"]),
])
def test_from_dump_refuses_flags_it_would_ignore(tmp_path, flags, words):
    out, _ = generate_dump(tmp_path, "gpt2", max_tokens=3)
    r = cli("attention", "--from", out, *flags)
    assert r.exit_code == 2 and "Traceback" not in r.output
    for w in words:
        assert w in r.output, r.output


def test_one_query_across_the_model():
    ref = load_reference("llama_gqa3")
    prompt = minigen.load(FIXTURES_DIR / "llama_gqa3")[1].decode(ref["input_ids"][1:])
    r = cli("attention", prompt, "--model", FIXTURES_DIR / "llama_gqa3", "--token", -1, "--key", 3, "--json")
    assert r.exit_code == 0, r.output
    j = json.loads(r.output)
    assert j["view"] == "query_grid" and j["key"]["index"] == 3
    model, tok = minigen.load(FIXTURES_DIR / "llama_gqa3")
    ids = tok.encode(prompt)
    rec = np.stack(prompt_attention(model, ids))                  # (L, H, T, T)
    np.testing.assert_allclose(j["weights"], rec[:, :, len(ids) - 1, 3], atol=1e-5)
    text = cli("attention", prompt, "--model", FIXTURES_DIR / "llama_gqa3", "--token", -1, "--key", 3)
    assert text.exit_code == 0 and len([l for l in text.output.splitlines() if l.split()[:1] in (["0"], ["1"], ["2"])]) == 3


def test_value_weighted_census_json_and_page(tmp_path):
    model_dir = FIXTURES_DIR / "qwen2"
    j = json.loads(cli("attention", PROMPT, "--model", model_dir, "--value-weighted", "--json").output)
    plain = json.loads(cli("attention", PROMPT, "--model", model_dir, "--json").output)
    assert j["value_weighted"] and not plain["value_weighted"]
    np.testing.assert_allclose(j["stats"]["sink_raw"], plain["stats"]["sink"])
    assert not np.allclose(j["stats"]["sink"], plain["stats"]["sink"])
    page = tmp_path / "p.html"
    r = cli("attention", PROMPT, "--model", model_dir, "--html", page)
    assert r.exit_code == 0, r.output
    text = page.read_text()
    data = json.loads(text.split('<script type="application/json" id="data">')[1].split("</script>")[0])
    assert len(data["value_norms"]) == minigen.load(model_dir)[0].config.n_layers
    assert "__DATA__" not in text and "history.replaceState" in text and "value-weighted" in text


def test_exclude_first_json():
    j = json.loads(cli("attention", PROMPT, "--model", FIXTURES_DIR / "gpt2", "--exclude-first", "--json").output)
    model, tok = minigen.load(FIXTURES_DIR / "gpt2")
    ids = tok.encode(PROMPT)
    expected = census(dict(enumerate(prompt_attention(model, ids))), ids, exclude_first=True)
    assert j["exclude_first"]
    for k in ("entropy", "prev", "max", "sink"):   # the command's census is float32 sums of each row's numbers
        np.testing.assert_allclose(j["stats"][k], expected[k], rtol=0, atol=1e-6)


def test_probe_json_and_first_token(induction_model):
    j = json.loads(cli("attention", "--probe", "induction", "--model", induction_model, "--probe-first", "none",
                       "--probe-length", 6, "--json").output)
    assert j["view"] == "probe" and j["prefix"] == [] and len(j["token_ids"]) == 12
    assert set(j["scores"]) == {"induction", "induction_tl", "duplicate"} and set(j["descriptions"]) == set(j["scores"])
    j = json.loads(cli("attention", "--probe", "induction", "--model", induction_model, "--probe-first", "j",
                       "--probe-length", 6, "--json").output)
    assert j["prefix"][0]["text"] == "j" and j["token_ids"][0] == j["prefix"][0]["id"]
    assert np.array(j["scores"]["induction"])[1, 0] > 0.85


def test_trace_seeds_cites_the_article_and_trace_json():
    r = cli("trace", "--seeds")
    assert "The math behind attention: Q, K and V" in r.output and "../shared" not in r.output
    r = cli("trace", PROMPT, "--model", FIXTURES_DIR / "gpt2", "--layer", 1, "--head", 2, "--json")
    j = json.loads(r.output)
    assert j["matches_model"] and len(j["weights"]) == j["query"]["index"] + 1
    assert sum(j["weights"]) == pytest.approx(1, abs=1e-6)

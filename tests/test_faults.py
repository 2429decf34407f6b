"""Hostile and unlucky input: the fast subset of scripts/fault_inject.py (one test per case), and the
promises it cannot check on its own (what loads still computes the right thing).

The corpus runs once, in a subprocess, with limits on time and memory per case; each case is then a
test that fails with the case's outcome (traceback, hang, wrong) and the first line it printed.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import minigen
from conftest import FIXTURES_DIR
from minigen.cli import main
from minigen.errors import MinigenError

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "fault_inject.py"


def _script():
    spec = importlib.util.spec_from_file_location("fault_inject", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fault_inject"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


FAST = [f"{c.category}/{c.name}" for c in _script().fast_cases()]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    out = tmp_path_factory.mktemp("faults") / "results.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--fast", "--json", str(out)], capture_output=True, text=True,
                       timeout=600)
    if not out.exists():
        pytest.fail(f"fault_inject.py did not run: {r.stderr[-2000:]}")
    return {f"{x['category']}/{x['name']}": x for x in json.loads(out.read_text())}


@pytest.mark.parametrize("name", FAST)
def test_fault(outcomes, name):
    x = outcomes[name]
    assert x["outcome"] in ("ok", "ok-error"), f"{x['outcome']}: {x['detail']}"


# --- what still loads must still be right --------------------------------------------------------

def test_hub_cache_symlinked_shards_load_the_same_weights(tmp_path):
    """The hub cache links snapshot files to ../../blobs/<hash>: outside the snapshot, and allowed."""
    src = FIXTURES_DIR / "llama_sharded"
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    snap.mkdir(parents=True)
    for i, f in enumerate(p for p in src.iterdir() if not p.name.startswith("reference")):
        shutil.copy(f, blobs / str(i))
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / str(i))
    ids = [1, 5, 9, 2]
    want = minigen.load(src)[0].logits(ids)
    assert np.array_equal(minigen.load(snap)[0].logits(ids), want)


def test_shard_outside_the_checkpoint_is_never_opened(tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(FIXTURES_DIR / "llama_sharded", ckpt)
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    shutil.move(ckpt / shard, tmp_path / shard)  # a valid shard, but beside the checkpoint
    index["weight_map"] = {k: (f"../{v}" if v == shard else v) for k, v in index["weight_map"].items()}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(MinigenError, match="not a file name inside the checkpoint"):
        minigen.load(ckpt)


def test_info_reports_the_tensors_dtype_not_the_configs(tmp_path):
    ckpt = tmp_path / "bf16"
    shutil.copytree(FIXTURES_DIR / "llama_bf16", ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["torch_dtype"] = cfg["dtype"] = "float32"  # config.json says one thing, the file holds another
    (ckpt / "config.json").write_text(json.dumps(cfg))
    r = CliRunner().invoke(main, ["info", "--model", str(ckpt)])
    assert r.exit_code == 0, r.output
    assert "dtype on disk:     bfloat16" in r.output


def test_stop_processes_escapes():
    model, tok = minigen.load(FIXTURES_DIR / "llama_gqa3")
    text = minigen.generate(model, tok, "Hello", max_tokens=40, ignore_eos=True)
    stop = next(c for c in ("\n", "\t", " ") if c in text)  # a character the greedy text contains
    escaped = {"\n": "\\n", "\t": "\\t", " ": " "}[stop]
    r = CliRunner().invoke(main, ["generate", "--model", str(FIXTURES_DIR / "llama_gqa3"), "-m", "40",
                                  "--ignore-eos", "-q", "--stop", escaped, "Hello"])
    assert r.exit_code == 0 and r.stdout == text[:text.index(stop)]


def test_cache_grows_instead_of_taking_the_whole_context():
    import dataclasses
    from minigen.generation.options import Options
    from minigen.generation.steps import FIRST_ROOM, generate_step
    model, _ = minigen.load(FIXTURES_DIR / "llama_gqa3")
    model.config = dataclasses.replace(model.config, max_position_embeddings=10**12)  # a config's huge context
    asked = []
    make_cache = model.make_cache
    model.make_cache = lambda capacity=256: asked.append(capacity) or make_cache(capacity)
    steps = generate_step(model, [1, 2, 3], Options(max_tokens=10**12, max_context=10**12, ignore_eos=True))
    for _ in range(FIRST_ROOM + 2):  # past the first room: the cache has grown by itself
        next(steps)
    assert asked == [3 + FIRST_ROOM]


def test_non_finite_logits_name_the_step():
    model, tok = minigen.load(FIXTURES_DIR / "llama_gqa3")
    model.params["layers"][1]["wo"] = model.params["layers"][1]["wo"] * np.float32(np.inf)
    with pytest.raises(MinigenError, match="step 1: the model's logits are not finite"):
        minigen.generate(model, tok, "Hello", max_tokens=3)


@pytest.mark.parametrize("kw, option", [(dict(top_k=1.5), "top_k"), (dict(seed="x"), "seed"), (dict(stop=5), "stop"),
                                        (dict(max_tokens=None), "max_tokens"), (dict(temp=float("nan")), "temp"),
                                        (dict(seed=-1), "seed"), (dict(repeat_last_n=None), "repeat_last_n")])
def test_api_option_types_are_minigen_errors(kw, option):
    model, tok = minigen.load(FIXTURES_DIR / "llama_gqa3")
    with pytest.raises(MinigenError, match=f"^{option}: should be"):
        minigen.generate(model, tok, "Hello", **kw)


def test_api_prompt_ids_are_checked_not_truncated():
    model, tok = minigen.load(FIXTURES_DIR / "llama_gqa3")
    for prompt, why in [([1.5], "should be integers"), ([10**9], "outside the model.s vocabulary"), (None, "string or a list")]:
        with pytest.raises(MinigenError, match=why):
            minigen.generate(model, tok, prompt)
    assert minigen.generate(model, tok, np.array([1, 2]), max_tokens=2) == minigen.generate(model, tok, [1, 2], max_tokens=2)

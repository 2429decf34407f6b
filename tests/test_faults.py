"""Hostile and unlucky input: the fast subset of the fault corpus (tests/faults/, one test per case), the
runner's own verdicts, and the promises the corpus cannot check on its own (what loads still computes the
right thing).

The corpus runs once, in a subprocess (scripts/fault_inject.py --fast), with limits on time and memory per
case; each case is then a test that fails with the case's outcome (traceback, hang, wrong) and the first
line it printed.
"""
from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import minigen
from conftest import FIXTURES_DIR
from faults import runner
from faults.checkpoint_files import pack, split_safetensors, tensor_mutations
from faults.core import Case, Run
from faults.gguf_files import gguf_fields
from minigen.cli import main
from minigen.errors import MinigenError

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "fault_inject.py"
FAST = [f"{c.category}/{c.name}" for c in runner.fast_cases()]


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


# --- the runner's verdicts --------------------------------------------------------------------------------

@pytest.mark.parametrize("expect, code, err, outcome", [
    ("error", 1, b"minigen: error: x.json: not valid JSON\n", "ok-error"),
    ("error", 0, b"", "wrong"),                                             # accepted what must be refused
    ("error", 1, b"minigen: error: one\nand another line\n", "wrong"),     # more than one line
    ("usage", 1, b"minigen: error: --top-p: bad\n", "wrong"),              # a usage error must exit 2
    ("usage", 2, b"Usage: minigen generate\n\nError: Invalid value for '--top-p'\n", "ok-error"),
    ("either", 0, b"", "ok"),
    ("ok", 1, b"minigen: error: x\n", "wrong"),
    ("error", 1, b"Traceback (most recent call last):\n  File ...\nKeyError: 'x'\n", "traceback"),
    ("error", 101, b"thread '<unnamed>' panicked at src/lib.rs\n", "traceback"),
    ("error", 1, b"MemoryError\n", "hang"),
    ("either", 0, b"RuntimeWarning: overflow\n", "wrong"),
])
def test_classify(tmp_path, expect, code, err, outcome):
    case = Case("config", "x", lambda d: Run(), expect)
    assert runner.classify(case, Run(), code, b"", err, tmp_path, False)[0] == outcome
    assert runner.classify(case, Run(), None, b"", b"", tmp_path, True) == ("hang", "time limit")


def test_classify_runs_the_case_check(tmp_path):
    case = Case("config", "x", lambda d: Run(), "error")
    run = Run(check=lambda code, out, err, d: "printed a secret" if b"SECRET" in err else None)
    assert runner.classify(case, run, 1, b"", b"minigen: error: SECRET\n", tmp_path, False) == ("wrong", "printed a secret")


def test_case_names_are_unique():
    case = Case("config", "x", lambda d: Run())
    with pytest.raises(AssertionError, match="unique"):
        runner.check_unique([case, case])


def test_safetensors_mutations_are_what_they_say():
    """Every mutation of a fixture is a different file, and the fixture itself round-trips through pack."""
    blob = (FIXTURES_DIR / "llama_gqa3" / "model.safetensors").read_bytes()
    header, data = split_safetensors(blob)
    assert split_safetensors(pack(header, data)) == (header, data)
    mutations = tensor_mutations(header, data, random.Random(0))
    assert len({name for name, _ in mutations}) == len(mutations) > 100
    assert len({b for _, b in mutations}) > 0.9 * len(mutations)
    assert dict(mutations)["empty-file"] == b"" and dict(mutations)["trailing-1"] == pack(header, data) + b"\0"


def test_gguf_fields_walk_a_real_header():
    """Each field's position and size, read back from llama.cpp's file, holds what the field says."""
    buf = (FIXTURES_DIR / "gguf" / "llama.gguf").read_bytes()
    fields, data_start = gguf_fields(buf)
    value = {label: int.from_bytes(buf[pos:pos + n], "little") for label, pos, n, kind in fields}
    assert buf[:4] == b"GGUF" and value["version"] == 3 and data_start % 32 == 0 and data_start < len(buf)
    n_tensors = value["n_tensors"]
    assert sum(label.endswith(":n_dims") for label, *_ in fields) == n_tensors
    assert value["llama.block_count:type"] == 4  # uint32


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
    from minigen.generation.sequence import FIRST_ROOM
    from minigen.generation.steps import generate_step
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
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # one error naming the step, not NumPy's warnings on the way
        with pytest.raises(MinigenError, match="step 1: the model's logits are not finite"):
            minigen.generate(model, tok, "Hello", max_tokens=3)
        for drafter in (dict(prompt_lookup=True), dict(draft_model=(model, tok))):   # speculative, a draft model's too
            with pytest.raises(MinigenError, match="step 1: the model's logits are not finite"):
                minigen.generate(model, tok, "Hello Hello Hello", max_tokens=3, **drafter)
        with pytest.raises(MinigenError, match="step 1: the model's logits are not finite"):
            minigen.generate_batch(model, tok, ["Hello", "Hi there"], max_tokens=3)


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

"""`minigen convert` on GGUFs that llama.cpp's own converter made, one or more per architecture.

tests/fixtures/gguf/<name>.gguf and .npz come from scripts/make_gguf_fixtures.py: tiny checkpoints through
convert_hf_to_gguf.py (and llama-quantize for `quants`), logits and greedy ids from transformers loading the GGUF
itself where its GGUF loader reads the architecture and settings, else from transformers on the checkpoint the
GGUF was made from (F16 files: the same weights exactly); token ids from llama.cpp's llama-tokenize.
archs.json says which reference each file has.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import minigen
from conftest import FIXTURES_DIR, greedy
from minigen.gguf.convert import convert_gguf, read_plan

GGUF = FIXTURES_DIR / "gguf"
ARCHS = {k: v for k, v in json.loads((GGUF / "archs.json").read_text(encoding="utf-8")).items()
         if not k.startswith("_")}
NAMES = sorted(ARCHS)

# GGUF architecture -> what it must become (every architecture of gguf_arch.ARCHS has a fixture)
FAMILY = {"llama": "llama", "llama_bias": "llama", "llama3_rope": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
          "gemma": "gemma", "gemma2": "gemma2", "gemma3": "gemma3_text", "phi3": "phi3", "phi3_longrope": "phi3",
          "gpt2": "gpt2", "olmo2": "olmo2", "gpt_neox": "gpt_neox", "smollm3": "smollm3", "quants": "llama",
          "granite": "granite", "granitemoe": "granitemoe", "olmo3": "olmo3", "mistral3": "ministral3",
          "qwen3_5": "qwen3_5_text", "qwen3_5_text": "qwen3_5_text", "lfm2": "lfm2",
          "granitemoehybrid": "granitemoehybrid", "granitemoehybrid_q8_0": "granitemoehybrid",
          "granitemoehybrid_moe": "granitemoehybrid", "falcon_h1": "falcon_h1"}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """name -> (model, tokenizer) of the converted fixture, each converted once."""
    done = {}

    def get(name):
        if name not in done:
            out = tmp_path_factory.mktemp("gguf") / name
            convert_gguf(GGUF / f"{name}.gguf", out, progress=False)
            done[name] = minigen.load(out)
        return done[name]

    return get


def reference(name: str) -> dict:
    with np.load(GGUF / f"{name}.npz") as z:
        return {k: z[k] for k in z.files}


def test_every_architecture_has_a_fixture():
    from minigen.gguf.arch import ARCHS as SUPPORTED

    assert set(FAMILY) == set(NAMES)
    made = {read_plan(GGUF / f"{n}.gguf").arch for n in NAMES}
    assert made == set(SUPPORTED)


@pytest.mark.parametrize("name", NAMES)
def test_family(name, converted):
    assert converted(name)[0].config.model_type == FAMILY[name]


@pytest.mark.parametrize("name", NAMES)
def test_logits_match_transformers(name, converted):
    model, _ = converted(name)
    ref = reference(name)
    logits = model.logits(ref["input_ids"])
    assert logits.shape == ref["logits"].shape
    assert np.abs(logits - ref["logits"]).max() <= 1e-4 * max(1.0, np.abs(ref["logits"]).max())


@pytest.mark.parametrize("name", NAMES)
def test_greedy_matches_transformers(name, converted):
    model, _ = converted(name)
    ref = reference(name)
    assert greedy(model, ref["input_ids"], len(ref["greedy_ids"]))[0] == ref["greedy_ids"].tolist()


@pytest.mark.parametrize("name", NAMES)
def test_tokenizer_matches_llama_cpp(name, converted):
    _, tok = converted(name)
    for case in ARCHS[name]["tokenizer"]:
        assert tok.encode(case["text"]) == case["ids"], case["text"]

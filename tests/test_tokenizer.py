"""Streaming detokenizer and chat template, on tokenizers built here (no files, no network)."""
import json

import jinja2
import numpy as np
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from minigen.errors import MinigenError
from minigen.text.tokenizer import Tokenizer, render_chat_template

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello world, hello there!",
    "Café, naïve, résumé, Ångström, façade, jalapeño, Zürich, São Paulo.",
    "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.",
    "Emoji: 😀🎉👍🏽 🇫🇷 👨‍👩‍👧 and ✨ sparkles.",
    "Ελληνικά και русский текст, עברית, العربية, हिन्दी.",
    "  leading spaces,\ttabs\nand new lines   ",
]
SAMPLES = CORPUS + [
    "日本語のテキスト、漢字と😀絵文字", "naïve café 🎉 東京", " spaced  out ", "x", "🇫🇷🇫🇷", "Ω≈ç√∫˜µ≤≥÷",
]


def byte_level_bpe() -> Tokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return Tokenizer(tok, {"eos_token": "<|endoftext|>"}, None)


def byte_fallback_bpe(decoder: str) -> Tokenizer:
    """A SentencePiece-like BPE (Llama 2 / Mistral / Gemma): '▁' for spaces, <0xNN> tokens for bytes."""
    tok = HFTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=60,
                                  show_progress=False)
    tok.train_from_iterator(CORPUS[:2] + CORPUS[4:], trainer)  # no CJK or emoji: those fall back to bytes
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    shifted = {t: (i if i < 3 else i + 256) for t, i in vocab.items()}
    shifted.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    data["model"]["vocab"] = shifted
    for added in data["added_tokens"]:
        added["id"] = shifted[added["content"]]
    if decoder == "metaspace":  # newer files: Metaspace pre-tokenizer and decoder
        data["normalizer"] = None
        data["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
        data["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    else:
        steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        if decoder == "strip":  # Llama 2: drop the one space the normaliser prepended
            steps.append(decoders.Strip(" ", 1, 0))
        data["decoder"] = json.loads(decoders.Sequence(steps).__getstate__())
    hf = HFTokenizer.from_str(json.dumps(data))
    return Tokenizer(hf, {"bos_token": "<s>", "eos_token": {"content": "</s>"}}, None)


TOKENIZERS = {
    "byte_level": byte_level_bpe,
    "fallback_strip": lambda: byte_fallback_bpe("strip"),
    "fallback_gemma": lambda: byte_fallback_bpe("plain"),
    "fallback_metaspace": lambda: byte_fallback_bpe("metaspace"),
}


@pytest.fixture(scope="module", params=list(TOKENIZERS))
def tok(request):
    return TOKENIZERS[request.param]()


def stream(tok, ids):
    s = tok.streamer()
    pieces = [s.add(i) for i in ids]
    return pieces, s.flush()


def test_fallback_tokenizer_really_uses_byte_tokens():
    tok = byte_fallback_bpe("strip")
    enc = tok.hf.encode("東京 😀", add_special_tokens=False)
    assert "<0xE6>" in enc.tokens and tok.decode(enc.ids) == "東京 😀"
    assert set(enc.ids) & tok.byte_fallback_ids and not byte_level_bpe().byte_fallback_ids


@pytest.mark.parametrize("text", SAMPLES)
def test_stream_equals_full_decode(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    pieces, rest = stream(tok, ids)
    assert "".join(pieces) + rest == tok.decode(ids, skip_special_tokens=False)
    assert all("\ufffd" not in p for p in pieces)  # nothing cut mid-character is shown


def test_stream_random_ids_with_special_tokens(tok):
    """Arbitrary id sequences (bytes that never complete, specials in the middle) still add up exactly."""
    rng = np.random.default_rng(0)
    for _ in range(30):
        ids = rng.integers(0, tok.vocab_size, size=int(rng.integers(1, 25))).tolist()
        pieces, rest = stream(tok, ids)
        assert "".join(pieces) + rest == tok.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("make", [byte_level_bpe, lambda: byte_fallback_bpe("plain")])
def test_stream_holds_back_incomplete_character(make):
    tok = make()
    ids = [i for i in tok.encode("😀", add_special_tokens=False) if tok.decode([i]).strip()]  # no '▁'
    assert len(ids) > 1  # the emoji is several byte tokens
    s = tok.streamer()
    assert [s.add(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert s.add(ids[-1]) + s.flush() == tok.decode(ids)
    # a character cut at the end is flushed the way the full decode renders it: U+FFFD
    s = tok.streamer()
    assert [s.add(i) for i in ids[:2]] == ["", ""]
    assert s.flush() == tok.decode(ids[:2]) and s.text.endswith("\ufffd")


def test_stream_special_tokens_appear_as_text():
    tok = byte_level_bpe()
    eot = tok.hf.token_to_id("<|im_end|>")
    ids = tok.encode("hi", add_special_tokens=False) + [eot] + tok.encode(" there", add_special_tokens=False)
    pieces, rest = stream(tok, ids)
    assert "".join(pieces) + rest == "hi<|im_end|> there"


TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}<<SYS>>{{ m['content'] }}<</SYS>>\n"
    "{% elif m['role'] == 'user' %}[INST] {{ m['content'] | trim }} [/INST]\n"
    "{% else %}{{ raise_exception('bad role ' + m['role']) }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ANSWER:{% endif %}{{ messages | tojson }}{{ eos_token }}"
)


def test_chat_template_matches_jinja2_directly():
    tok = byte_fallback_bpe("strip")
    tok.chat_template = TEMPLATE
    messages = [{"role": "system", "content": "Be brief. é"}, {"role": "user", "content": " Hi 東京 "}]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    expected = env.from_string(TEMPLATE).render(messages=messages, add_generation_prompt=True,
                                                bos_token="<s>", eos_token="</s>")
    assert tok.apply_chat_template(messages) == expected
    assert "東京" in expected and expected.startswith("<s><<SYS>>") and "ANSWER:" in expected
    assert "ANSWER:" not in tok.apply_chat_template(messages, add_generation_prompt=False)


def test_chat_template_raise_exception_is_minigen_error():
    with pytest.raises(MinigenError, match="bad role"):
        render_chat_template(TEMPLATE, [{"role": "tool", "content": "x"}], bos_token="", eos_token="")


def test_no_chat_template_is_minigen_error():
    with pytest.raises(MinigenError, match="chat template"):
        byte_level_bpe().apply_chat_template([{"role": "user", "content": "x"}])


def test_template_sandbox_refuses_mutation():
    with pytest.raises((MinigenError, jinja2.exceptions.SecurityError)):
        render_chat_template("{% set x = [] %}{{ x.append(1) }}", [])

"""The generation loop on the fixture checkpoints: HF greedy parity, cache vs recompute, stop conditions."""
import copy
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

import minigen
from conftest import FIXTURES as PARITY_FIXTURES
from minigen.engine import cache as cache_module
from minigen.errors import MinigenError
from minigen.generation.options import Options
from minigen.generation.sampling import repetition_penalty
from minigen.generation.sequence import eos_token_ids, prompt_ids
from minigen.generation.steps import Run, generate_step
from minigen.text.stream import split_at_stop

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = sorted(PARITY_FIXTURES)  # the HF parity fixtures listed in tests/conftest.py
CHAT_MESSAGES = [{"role": "system", "content": "You are a tiny test model."},
                 {"role": "user", "content": "Say hello in French, please."}]


@lru_cache(maxsize=None)
def fixture(name):
    return (*minigen.load(FIXTURES / name), dict(np.load(FIXTURES / name / "reference.npz")))


def with_generation_config(model, **gc):
    m = copy.copy(model)
    m.generation_config = {**model.generation_config, **gc}
    return m


@pytest.mark.parametrize("name", NAMES)
def test_greedy_equals_hf(name):
    model, tok, ref = fixture(name)
    r = Run.from_prompt(model, tok, ref["input_ids"].tolist(), max_tokens=20, ignore_eos=True, temp=0)
    assert r.text() == tok.decode(ref["greedy_ids"])
    assert r.tokens == ref["greedy_ids"].tolist()
    if "prompt" not in ref:  # the real-config fixtures are ids only (random-id prompts)
        return
    # from the prompt's text, through the tokenizer, with the public API
    prompt = str(ref["prompt"])
    assert prompt_ids(tok, prompt) == ref["input_ids"].tolist()
    assert minigen.generate(model, tok, prompt, max_tokens=20, ignore_eos=True, temp=0) == \
        tok.decode(ref["greedy_ids"])


@pytest.mark.parametrize("name", ["gpt2", "mistral_sliding", "qwen2"])
def test_cached_decode_equals_recompute(name):
    model, tok, ref = fixture(name)
    ids = ref["input_ids"].tolist()
    steps = list(generate_step(model, ids, Options(temp=0.9, seed=3, max_tokens=12, ignore_eos=True)))
    seq = list(ids)
    for step in steps:
        full = model.logits(seq)[-1]
        np.testing.assert_allclose(step.logits, full, rtol=1e-4, atol=1e-4)
        seq.append(step.token)


def test_generate_step_continues_from_a_cache():
    model, tok, ref = fixture("llama_gqa3")
    ids = ref["input_ids"].tolist()
    cache = model.make_cache(4)
    model.forward(ids[:25] + [7, 7, 7], cache)  # the first 25 ids are the prompt's; then a stale tail
    cache_module.truncate(cache, 25)
    fed = []
    forward = model.forward
    model = copy.copy(model)
    model.forward = lambda x, c, **kw: fed.append(len(x)) or forward(x, c, **kw)
    steps = list(generate_step(model, ids, Options(max_tokens=8, temp=0, ignore_eos=True), cache=cache))
    assert [s.token for s in steps] == ref["greedy_ids"][:8].tolist()
    assert fed == [len(ids) - 25] + [1] * 7 and cache[0].offset == len(ids) + 7
    with pytest.raises(ValueError, match="whole prompt"):
        next(generate_step(model, ids[:10], cache=cache))


def test_repetition_penalty_matches_manual_loop():
    model, tok, ref = fixture("llama_gqa3")
    seq = ref["input_ids"].tolist()
    for _ in range(10):  # HF: penalty over every token so far, prompt included; greedy
        seq.append(int(np.argmax(repetition_penalty(model.logits(seq)[-1], seq, 1.5))))
    r = Run.from_prompt(model, tok, ref["input_ids"].tolist(), max_tokens=10, ignore_eos=True, temp=0, repeat_penalty=1.5,
                        repeat_last_n=0)
    r.text()
    assert r.tokens == seq[len(ref["input_ids"]):]
    assert r.tokens != ref["greedy_ids"][:10].tolist()


def test_record_attention_shapes_and_values():
    model, tok, ref = fixture("llama_gqa3")
    ids, c = ref["input_ids"].tolist(), model.config
    steps = list(generate_step(model, ids, Options(max_tokens=3, record_attention=True, temp=0, ignore_eos=True)))
    assert len(steps[0].attentions) == c.n_layers
    np.testing.assert_allclose(np.stack(steps[0].attentions), ref["attentions"], atol=1e-5)
    assert steps[1].attentions[0].shape == (c.n_heads, 1, len(ids) + 1)
    assert steps[2].attentions[-1].shape == (c.n_heads, 1, len(ids) + 2)
    assert all(s.attentions is None for s in generate_step(model, ids, Options(max_tokens=2)))


def test_eos_int_or_list_stops_and_is_not_text():
    model, tok, ref = fixture("llama_gqa3")
    greedy, ids = ref["greedy_ids"].tolist(), ref["input_ids"].tolist()
    k = next(i for i in range(3, 20) if greedy[i] not in greedy[:i])
    for eos in (greedy[k], [12345, greedy[k]]):
        m = with_generation_config(model, eos_token_id=eos)
        r = Run.from_prompt(m, tok, ids, max_tokens=20, temp=0)
        assert r.text() == tok.decode(greedy[:k])
        assert r.stats.finish == "eos" and r.tokens == greedy[:k] and r.stats.generated_tokens == k + 1
        assert r.text() != Run.from_prompt(m, tok, ids, max_tokens=20, temp=0, ignore_eos=True).text()
    m = with_generation_config(model, eos_token_id=[7, 8])
    assert eos_token_ids(m)[:2] == [7, 8] and set(model.config.eos_token_ids) <= set(eos_token_ids(m))


def test_max_tokens_and_context():
    model, tok, ref = fixture("gpt2")
    ids = ref["input_ids"].tolist()
    r = Run.from_prompt(model, tok, ids, max_tokens=5, ignore_eos=True)
    r.text()
    assert (len(r.tokens), r.stats.finish) == (5, "length")
    assert Run.from_prompt(model, tok, ids, max_tokens=0).text() == ""
    r = Run.from_prompt(model, tok, ids, max_tokens=50, ignore_eos=True, max_context=len(ids) + 3)
    r.text()  # the cache holds len(ids) + 3 tokens: 3 decode steps after the prefill, 4 tokens in all
    assert (len(r.tokens), r.stats.finish) == (4, "context")
    assert r.tokens == ref["greedy_ids"][:4].tolist()
    with pytest.raises(MinigenError, match="longer than the context"):
        Run.from_prompt(model, tok, ids, max_context=len(ids) - 1)
    with pytest.raises(MinigenError, match="larger than the model's context"):
        Run.from_prompt(model, tok, ids, max_context=model.config.max_position_embeddings + 1)
    with pytest.raises(MinigenError, match="empty"):
        Run.from_prompt(model, tok, [])


def test_stop_string_spanning_tokens():
    model, tok, ref = fixture("llama_gqa3")
    ids = ref["input_ids"].tolist()
    pieces = list(minigen.stream(model, tok, ids, max_tokens=20, ignore_eos=True))
    full = "".join(pieces)
    assert full == tok.decode(ref["greedy_ids"])
    cut = len(pieces[0]) + len(pieces[1])  # a stop string across the boundary of pieces 2 and 3
    stop = full[cut - 2:cut + 2]
    assert len(stop) == 4
    r = Run.from_prompt(model, tok, ids, max_tokens=20, ignore_eos=True, stop=["never appears", stop])
    assert r.text() == full[:full.index(stop)] and r.stats.finish == "stop"
    assert minigen.generate(model, tok, ids, max_tokens=20, ignore_eos=True, stop=full[-3:] + "zzz") == full


def test_split_at_stop():
    assert split_at_stop("hello wor", ["world"]) == ("hello ", "wor", False)
    assert split_at_stop("hello world!", ["world", "lo"]) == ("hel", "", True)
    assert split_at_stop("hello wor", ["world"], final=True) == ("hello wor", "", False)
    assert split_at_stop("abc", []) == ("abc", "", False)
    assert split_at_stop("aXa", ["ab", "aa"]) == ("aX", "a", False)


def test_sampling_seed_reproducible_and_defaults_from_generation_config():
    model, tok, ref = fixture("qwen2")
    ids = ref["input_ids"].tolist()
    a = minigen.generate(model, tok, ids, max_tokens=15, temp=1.0, seed=5, ignore_eos=True)
    assert a == minigen.generate(model, tok, ids, max_tokens=15, temp=1.0, seed=5, ignore_eos=True)
    assert a != minigen.generate(model, tok, ids, max_tokens=15, temp=1.0, seed=6, ignore_eos=True)
    sampling = with_generation_config(model, do_sample=True, temperature=1.0)
    assert minigen.generate(sampling, tok, ids, max_tokens=15, seed=5, ignore_eos=True) == a
    assert Run.from_prompt(sampling, tok, ids, temp=0).options.temp == 0  # the flag wins


def test_chat_prompt_renders_like_transformers():
    for name in ("llama_gqa3", "qwen2"):
        model, tok, ref = fixture(name)
        assert tok.apply_chat_template(CHAT_MESSAGES) == str(ref["chat_text"])
        ids = prompt_ids(tok, CHAT_MESSAGES[1]["content"], system=CHAT_MESSAGES[0]["content"])
        assert ids == tok.encode(str(ref["chat_text"]), add_special_tokens=False)


def test_bad_options():
    model, tok, ref = fixture("gpt2")
    for bad in (dict(temp=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-1), dict(max_tokens=-1),
                dict(min_p=2), dict(repeat_penalty=0)):
        with pytest.raises(MinigenError, match=next(iter(bad))):
            Run.from_prompt(model, tok, "x", **bad)
    with pytest.raises(MinigenError, match="temperature: no such option"):
        Run.from_prompt(model, tok, "x", temperature=0.5)

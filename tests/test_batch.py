"""Batched generation: each sequence's result equals generating its prompt alone."""
import copy
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

import minigen
from conftest import FIXTURES as PARITY_FIXTURES, FIXTURES_DIR
from minigen.errors import OptionError
from minigen.generation.batch import Batch, batch_runs, generate_batch
from minigen.generation.options import Options
from minigen.generation.sequence import Sequence
from minigen.generation.steps import Run, generate_step

FIXTURES = Path(__file__).parent / "fixtures"


@lru_cache(maxsize=None)
def fixture(name):
    model, tok = minigen.load(FIXTURES / name)
    return model, tok, np.load(FIXTURES / name / "reference.npz")["input_ids"].tolist()


def prompts_of(ids, n=5):
    """Prompts of different lengths cut from a fixture's ids (rotated, so that they differ)."""
    return [(ids[i:] + ids[:i])[: 3 + 4 * i] for i in range(n)]


def alone(model, prompt, options):
    return [(s.token, s.finish) for s in generate_step(model, prompt, options)]


def greedy(**kw):
    """generate_step's options for greedy decoding that ignores EOS unless asked otherwise."""
    return Options(**{"temp": 0, "ignore_eos": True, **kw})


@pytest.mark.parametrize("name", sorted(PARITY_FIXTURES))
def test_batch_equals_alone_greedy_every_family(name):
    model, tok, ids = fixture(name)
    prompts = prompts_of(ids)
    model = copy.copy(model)
    model.generation_config = {**model.generation_config, "eos_token_id": ids[2]}   # an EOS the prompts reach
    batch, got = Batch(model), {}
    handles = [batch.add(Sequence(model, p, greedy(max_tokens=6 + 3 * i, ignore_eos=False))) for i, p in enumerate(prompts)]
    while len(batch):
        for h, step in batch.step().items():
            got.setdefault(h, []).append((step.token, step.finish))
    for h, p, i in zip(handles, prompts, range(len(prompts))):
        assert got[h] == alone(model, p, greedy(max_tokens=6 + 3 * i, ignore_eos=False)), (name, i)


def test_batch_equals_alone_sampling_each_with_its_own_rng_and_settings():
    model, tok, ids = fixture("llama_gqa3")
    prompts = prompts_of(ids, 4)
    settings = [dict(temp=1.0), dict(temp=0.7, top_k=20, top_p=0.9, min_p=0.02, repeat_penalty=1.3, repeat_last_n=8),
                dict(temp=0, repeat_penalty=1.5, repeat_last_n=0), dict(temp=1.3, top_k=5)]
    options = [Options(max_tokens=10, ignore_eos=True, seed=7 + i, **s) for i, s in enumerate(settings)]
    batch, got = Batch(model), {}
    handles = [batch.add(Sequence(model, p, o)) for p, o in zip(prompts, options)]
    while len(batch):
        for h, step in batch.step().items():
            got.setdefault(h, []).append((step.token, step.finish))
    for h, p, o in zip(handles, prompts, options):
        assert got[h] == alone(model, p, o)


def test_sequences_join_between_steps_and_leave_when_cancelled():
    model, tok, ids = fixture("qwen3")
    a, b, c = prompts_of(ids, 3)
    batch, got = Batch(model), {}
    ha = batch.add(Sequence(model, a, greedy(max_tokens=12)))
    for _ in range(3):
        got.setdefault(ha, []).extend(s.token for s in batch.step().values())
    hb = batch.add(Sequence(model, b, greedy(max_tokens=5, max_context=len(b) + 2)))   # joins late, ends on a full context
    hc = batch.add(Sequence(model, c, greedy(max_tokens=12)))
    steps = 0
    while len(batch):
        out = batch.step()
        steps += 1
        assert set(out) <= {ha, hb, hc}
        for h, s in out.items():
            got.setdefault(h, []).append(s.token)
        if steps == 4:
            batch.cancel(hc)
            assert hc not in batch.sequences
    assert got[ha] == [t for t, _ in alone(model, a, greedy(max_tokens=12))]
    assert alone(model, b, greedy(max_tokens=5, max_context=len(b) + 2))[-1][1] == "context"
    assert got[hb] == [t for t, _ in alone(model, b, greedy(max_tokens=5, max_context=len(b) + 2))]
    assert got[hc] == [t for t, _ in alone(model, c, greedy(max_tokens=4))]
    assert batch.step() == {}


def test_generate_batch_text_equals_generate_alone():
    model, tok, _ = fixture("llama_gqa3")
    prompts = ["Hello there", "The quick brown fox", "a", "One two three four five six seven"]
    texts = generate_batch(model, tok, prompts, max_tokens=12, ignore_eos=True)
    assert texts == [minigen.generate(model, tok, p, max_tokens=12, ignore_eos=True) for p in prompts]
    # per-prompt options, a stop string, a seed, and at most two at a time
    options = [dict(max_tokens=8), dict(max_tokens=15, temp=0.8, seed=3), dict(max_tokens=20, stop=texts[2][4:7]),
               dict(max_tokens=5, ignore_eos=True)]
    results = batch_runs(model, tok, prompts, options, max_batch=2)
    for p, o, r in zip(prompts, options, results):
        want = Run.from_prompt(model, tok, p, **o)
        assert r.text == want.text() and r.tokens == want.tokens and r.finish_reason == want.stats.finish
    assert results[2].finish_reason == "stop"


def test_the_api_takes_the_same_keywords_everywhere():
    """generate, stream and generate_batch take the same prompt keywords (chat, system) and options."""
    model, tok = minigen.load(FIXTURES_DIR / "qwen2")   # a checkpoint with a chat template
    prompts, kw = ["Say something.", "Name a colour."], dict(chat=True, system="Be brief.", max_tokens=8, temp=0)
    alone = [minigen.generate(model, tok, p, **kw) for p in prompts]
    assert minigen.generate_batch(model, tok, prompts, **kw) == alone
    assert ["".join(minigen.stream(model, tok, p, **kw)) for p in prompts] == alone
    assert alone != [minigen.generate(model, tok, p, max_tokens=8, temp=0) for p in prompts]   # chat did something


def test_batch_refuses_bad_options_naming_them():
    model, tok, _ = fixture("llama_gqa3")
    with pytest.raises(OptionError, match="temp"):
        generate_batch(model, tok, ["a", "b"], temp=-1)
    with pytest.raises(OptionError, match="options"):
        batch_runs(model, tok, ["a", "b"], [{}])
    with pytest.raises(OptionError, match="nucleus"):
        batch_runs(model, tok, ["a"], [{"nucleus": 1}])
    for option in ({"prompt_lookup": True}, {"draft_model": (model, tok)}, {"record_attention": True}):
        with pytest.raises(OptionError, match=f"^{next(iter(option))}: not available in a batch"):
            batch_runs(model, tok, ["a"], option)


def test_max_tokens_zero_gives_an_empty_result_without_joining_the_batch():
    """generate alone gives no token for max_tokens 0; a batch step gives every sequence one, so such a
    prompt never joins (it ran until its context filled)."""
    model, tok, ids = fixture("llama_gqa3")
    results = batch_runs(model, tok, ["Hello", "World"], [{"max_tokens": 0}, {"max_tokens": 3, "ignore_eos": True}])
    alone = Run.from_prompt(model, tok, "Hello", max_tokens=0)
    assert (results[0].text, results[0].tokens, results[0].finish_reason) == (alone.text(), alone.tokens, "length")
    assert results[0].tokens == [] and len(results[1].tokens) == 3
    with pytest.raises(ValueError, match="max_tokens is 0"):
        Batch(model).add(Sequence(model, ids, Options.of(max_tokens=0)))


# --- the command line: generate --batch FILE -----------------------------------------------------------

def cli(*args):
    from click.testing import CliRunner
    from minigen.cli import main
    return CliRunner().invoke(main, [str(a) for a in args])


def test_cli_batch_writes_jsonl_in_input_order(tmp_path):
    import json
    model, tok, _ = fixture("llama_gqa3")
    f = tmp_path / "prompts.txt"
    f.write_text('Hello there\n\n{"prompt": "The quick brown", "max_tokens": 3, "temp": 0.7, "seed": 1}\n'
                 '{"prompt": [5, 6, 7], "max_tokens": 9}\nOne more line\n'
                 '{"prompt": "A", "temperature": 0.9, "repetition_penalty": 1.3, "seed": 4}\n')
    r = cli("generate", "--model", FIXTURES / "llama_gqa3", "--batch", f, "-m", "6", "-q", "--ignore-eos")
    assert r.exit_code == 0, r.output
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["index"] for x in lines] == [0, 1, 2, 3, 4]
    want = [Run.from_prompt(model, tok, "Hello there", max_tokens=6, ignore_eos=True),
            Run.from_prompt(model, tok, "The quick brown", max_tokens=3, temp=0.7, seed=1, ignore_eos=True),
            Run.from_prompt(model, tok, [5, 6, 7], max_tokens=9, ignore_eos=True),
            Run.from_prompt(model, tok, "One more line", max_tokens=6, ignore_eos=True),
            # an OpenAI request's spelling of temp and repeat_penalty, as the server takes them
            Run.from_prompt(model, tok, "A", max_tokens=6, temp=0.9, repeat_penalty=1.3, seed=4, ignore_eos=True)]
    for got, w in zip(lines, want):
        assert got["text"] == w.text() and got["tokens"] == w.tokens and got["finish_reason"] == w.stats.finish
        assert set(got) == {"index", "text", "tokens", "finish_reason"}


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "x", "temp": -1}\n', "bad.jsonl:1: temp: should be a number >= 0"),
    ('a\n\n{"prompt": "x", "temperature": -1}\n', "bad.jsonl:3: temperature: should be a number >= 0"),
    ('{"prompt": "x", "temperature": 0.5, "temp": 1}\n', ":1: temperature: give it or temp, not both"),
    ('{"prompt": "x", "prompt_lookup": true}\n', ":1: prompt_lookup: not available in a batch"),
    ('{"prompt": "x", "draft_model": "some/dir"}\n', ":1: draft_model: not available in a batch"),
    ('{"prompt": 3}\n', ":1: prompt: should be a string or a list of token ids"),
    ('a\n{"prompt": "x",\n', ":2: not a JSON object"),
    ('{"text": "x"}\n', 'needs a "prompt" field'),
    ('\n\n', "no prompts"),
    ('{"prompt": "x", "nucleus": 0.5}\n', ":1: nucleus: no such option"),
    ('a\n{"prompt": [5, 99999999]}\n', "bad.jsonl:2: prompt: token id 99999999 is outside"),   # seen once loaded
    ('a\n\n' + "word " * 2000 + "\n", "bad.jsonl:3: the prompt is"),
])
def test_cli_batch_bad_files_are_one_line(tmp_path, content, message):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    r = cli("generate", "--model", FIXTURES / "llama_gqa3", "--batch", f)
    assert r.exit_code == 1 and message in r.output and len(r.output.strip().splitlines()) == 1, r.output
    r = cli("generate", "--model", FIXTURES / "llama_gqa3", "--batch", f, "hello")
    assert r.exit_code == 2


def test_decode_steps_attend_through_the_pool_and_leavers_take_their_cache(monkeypatch):
    from minigen.engine import cache as engine
    from minigen.engine.cache import KVCache, PooledKV
    model, tok, ids = fixture("llama_gqa3")
    prompts = prompts_of(ids, 3)
    calls = []
    pooled = engine.pooled_decode_attention
    monkeypatch.setattr(engine, "pooled_decode_attention", lambda q, *a, **kw: calls.append(len(q)) or pooled(q, *a, **kw))
    caches = [model.make_cache(4) for _ in prompts]
    batch = Batch(model)
    handles = [batch.add(Sequence(model, p, greedy(max_tokens=4 + 2 * i), c)) for i, (p, c) in enumerate(zip(prompts, caches))]
    got = {h: [s.token] for h, s in batch.step().items()}  # the prompts: each attends alone
    assert calls == [] and all(isinstance(layer, PooledKV) for layer in caches[0])
    while len(batch):
        for h, s in batch.step().items():
            got[h].append(s.token)
    assert calls[:model.config.n_layers] == [3] * model.config.n_layers   # one pooled product per layer
    for p, c, i in zip(prompts, caches, range(3)):
        want = model.make_cache(4)
        tokens = [s.token for s in generate_step(model, p, greedy(max_tokens=4 + 2 * i), want)]
        assert all(type(layer) is KVCache for layer in c) and c[0].offset == want[0].offset
        for mine, theirs in zip(c, want):
            np.testing.assert_allclose(mine.fetch()[0], theirs.fetch()[0], atol=1e-5)
        assert got[handles[i]] == tokens


CHUNKED = ["llama_gqa3", "gpt2", "mistral_sliding", "gemma2", "gemma3_text", "qwen3", "phi3", "granitemoe",
           "lfm2", "qwen3_5_text", "falcon_h1", "granitemoehybrid"]


@pytest.mark.parametrize("name", CHUNKED)
def test_a_prompt_in_pieces_while_another_generates_equals_it_whole(name):
    """With prefill_chunk, a long prompt joining a generating sequence goes in pieces of 8 ids, one a step,
    the other sequence getting a token from each step; both equal their runs alone (tokens, and the logits
    within 1e-4 of their scale): attention over a cache filled piece by piece (a sliding window, a
    soft-cap), recurrent and convolutional states carried from piece to piece."""
    model, tok, ids = fixture(name)
    short, long = prompts_of(ids, 1)[0], (ids * 4)[:41]
    batch = Batch(model, prefill_chunk=8)
    ha = batch.add(Sequence(model, short, greedy(max_tokens=12)))
    got = {ha: list(batch.step().values())}                         # a's prompt
    hb = batch.add(Sequence(model, long, greedy(max_tokens=4)))
    got[hb] = []
    while not got[hb]:
        out = batch.step()
        assert ha in out                                            # a token for a at every step
        got[ha].append(out[ha])
        got[hb] += [out[hb]] if hb in out else []
    assert len(got[ha]) == 1 + 6                                    # b's 41 ids in 6 steps: 5 x 8, then 1
    while len(batch):
        for h, s in batch.step().items():
            got[h].append(s)
    for h, p, n in [(ha, short, 12), (hb, long, 4)]:
        want = list(generate_step(model, p, greedy(max_tokens=n)))
        assert [s.token for s in got[h]] == [s.token for s in want], (name, h)
        for mine, theirs in zip(got[h], want):
            scale = np.abs(theirs.logits).max()
            np.testing.assert_allclose(mine.logits, theirs.logits, atol=1e-4 * scale, rtol=0)


def test_prompts_go_whole_with_nobody_generating_and_on_longrope():
    """A batch of prompts alone has no token to give between pieces: each prompt's first token comes from
    the first step. Phi-3's longrope computes a prompt's keys for where its forward ends: whole there too."""
    model, tok, ids = fixture("llama_gqa3")
    batch = Batch(model, prefill_chunk=4)
    handles = [batch.add(Sequence(model, p, greedy(max_tokens=3))) for p in prompts_of(ids, 3)[1:]]   # 7 and 11 ids
    assert set(batch.step()) == set(handles)
    model, tok, ids = fixture("phi3_longrope")
    batch = Batch(model, prefill_chunk=4)
    ha = batch.add(Sequence(model, ids[:3], greedy(max_tokens=40)))
    batch.step()
    hb = batch.add(Sequence(model, ids[:40], greedy(max_tokens=2)))   # crosses its switch (32)
    assert set(batch.step()) == {ha, hb}
    for bad in (0, -1, 2.5, "8", True):
        with pytest.raises(OptionError, match="prefill_chunk"):
            Batch(model, prefill_chunk=bad)

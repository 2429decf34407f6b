"""The options of a run: one table (options.Options) from which the checks, the CLI's flags and the summary derive."""
import types
from dataclasses import fields
from pathlib import Path

import pytest
from click.testing import CliRunner

import minigen
from minigen.cli import main
from minigen.errors import OptionError
from minigen.generation import chat as chat_module
from minigen.generation.options import Options, check_prompt, flags_of, spec, summary

FIXTURES = Path(__file__).parent / "fixtures"


def fake_model(generation_config=None, context=256, vocab=100):
    config = types.SimpleNamespace(max_position_embeddings=context, vocab_size=vocab)
    return types.SimpleNamespace(config=config, generation_config=generation_config or {})


def test_settings_from_generation_config():
    assert Options().for_model(fake_model()).temp == 0.0  # no do_sample: greedy, as in HF
    gc = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.1}
    o = Options().for_model(fake_model(gc))
    assert (o.temp, o.top_p, o.top_k, o.min_p, o.repeat_penalty, o.max_context) == (0.6, 0.9, 0, 0.0, 1.1, 256)
    o = Options(temp=0.0, top_k=5, top_p=None).for_model(fake_model(gc))
    assert (o.temp, o.top_k, o.top_p) == (0.0, 5, 0.9)  # a given value wins; None is the checkpoint's
    assert Options().for_model(fake_model({"temperature": 0.6})).temp == 0.0
    assert Options().for_model(fake_model({"do_sample": True})).temp == 1.0  # HF's default temperature
    assert Options().for_model(fake_model({"repetition_penalty": 1.3})).repeat_penalty == 1.3  # without do_sample too


def test_checked_once_where_made():
    with pytest.raises(OptionError, match="^top_p: should be a number in"):
        Options(top_p=0)
    with pytest.raises(OptionError, match="^temperature: no such option"):
        Options.of(temperature=0.5)
    assert Options(stop="x").stop == ("x",) and Options(stop=["a", "b"]).stop == ("a", "b")
    with pytest.raises(OptionError, match="^max_context: 300 is larger than the model's context"):
        Options(max_context=300).for_model(fake_model())
    with pytest.raises(OptionError, match="^seed"):
        Options().update(seed=-1)


def test_summary_is_what_verbose_shows():
    o = Options(seed=3).for_model(fake_model())
    assert summary(o) == ("temp 0.0, top-k 0, top-p 1.0, min-p 0.0, repeat-penalty 1.0 (last 64), seed 3, "
                          "context 256")


def test_prompt_checks():
    model = fake_model(context=4, vocab=10)
    check_prompt([1, 2, 3, 4], model)
    for ids, why in [([], "the prompt is empty"), ([1] * 5, "the prompt is 5 tokens, longer than the context of 4"),
                     ([1, 10], "token id 10 is outside the model's vocabulary")]:
        with pytest.raises(minigen.MinigenError, match=why):
            check_prompt(ids, model)
    with pytest.raises(minigen.MinigenError, match="context of 2 tokens; shorten"):
        check_prompt([1, 2, 3], model, max_context=2, flag=None)


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_every_option_with_a_flag_is_a_flag_of_generate_and_chat(command):
    """The CLI's run flags are the table's: names, defaults and help, nothing written twice."""
    cmd = main.commands[command]
    params = {p.name: p for p in cmd.params}
    for f in flags_of(command):
        p = params[f.name]
        assert sorted(p.opts) == sorted(spec(f).flags) and p.help == spec(f).help, f.name
        assert p.default == (f.default if not p.multiple else None) or (p.is_flag and f.default is False), f.name
    api_only = {f.name for f in fields(Options) if not spec(f).flags}
    assert "record_attention" in api_only and not api_only & set(params)


def test_chat_session_checks_its_options_without_a_run(monkeypatch):
    model, tok = minigen.load(FIXTURES / "qwen2")
    monkeypatch.setattr(chat_module, "Run", lambda *a, **k: pytest.fail("a Run made to check the options"))
    session = chat_module.ChatSession(model, tok, max_tokens=5, temp=0)
    assert session.options.max_tokens == 5 and session.options.max_context == model.config.max_position_embeddings
    with pytest.raises(OptionError, match="^top_k"):
        chat_module.ChatSession(model, tok, top_k=-1)


def test_a_bad_flag_is_refused_before_the_model_loads(monkeypatch):
    from minigen.cli import run
    monkeypatch.setattr(run, "load_timed", lambda spec: pytest.fail("loaded the model"))
    r = CliRunner().invoke(main, ["generate", "--model", str(FIXTURES / "gpt2"), "--top-p", "2", "hi"])
    assert r.exit_code == 2 and "--top-p" in r.output

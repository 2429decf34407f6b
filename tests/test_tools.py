"""Tool calls (serve/tools.py), per template family, on the chat templates committed under
tests/fixtures/chat_templates/ (as llama.cpp ships them).

The reference is each checkpoint's own template: an assistant message with tool_calls, rendered by it,
is the text its model was trained to write, and it must parse back into the same calls (in one piece
and token by token), and follow the grammars that enforce tool_choice (llguidance's matcher fed its ids).
Granite 3.3's template does not render past calls; its system prompt's instruction (`<|tool_call|>`
followed by a JSON list) is the reference there.
"""
import json
from pathlib import Path

import numpy as np
import pytest

import minigen
from minigen.generation import constraint as C
from minigen.generation.sequence import eos_token_ids
from minigen.serve import tools as T
from minigen.text.template import render_chat_template

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}},
         {"type": "function", "function": {"name": "add", "description": "a + b",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                                                           "b": {"type": "number"}},
                                                          "required": ["a", "b"]}}}]
CALLS = [("abcDEF123", "get_weather", {"city": "Paris"}), ("xyzXYZ789", "add", {"a": 1, "b": 2.5})]
USER = [{"role": "user", "content": "The weather in Paris? And 1 + 2.5?"}]
FAMILIES = {   # template -> (syntax, the end-of-turn text its rendering puts after the calls)
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("hermes", "<|im_end|>\n"),
    "Qwen3-0.6B.jinja": ("hermes", "<|im_end|>\n"),
    "ibm-granite-granite-4.0.jinja": ("hermes", "<|end_of_text|>\n"),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("llama3", "<|eot_id|>"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("mistral", "</s>"),
}
NO_TOOLS = ["google-gemma-2-2b-it.jinja", "microsoft-Phi-3.5-mini-instruct.jinja", "HuggingFaceTB-SmolLM3-3B.jinja",
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"]


def rendered_reply(template: str, n: int) -> str:
    """The text the template renders for an assistant message holding the first n CALLS."""
    kw = dict(bos_token="<s>", eos_token="</s>", tools=TOOLS)
    calls = [{"id": i, "type": "function", "function": {"name": f, "arguments": a}} for i, f, a in CALLS[:n]]
    before = render_chat_template(template, USER, True, **kw)
    full = render_chat_template(template, USER + [{"role": "assistant", "content": "", "tool_calls": calls}], False, **kw)
    assert full.startswith(before)
    return full[len(before):]


def parse(syntax, text: str, piece: int | None = None):
    """(content, [(name, arguments)], the events) of text given whole or in pieces of `piece` characters."""
    p = T.Calls(syntax)
    pieces = [text] if piece is None else [text[i:i + piece] for i in range(0, len(text), piece)]
    events = [e for x in pieces for e in p.add(x)] + p.end()
    content = "".join(e[1] for e in events if e[0] == "text")
    return content, [(name, json.loads(args)) for _, name, args in p.calls], events


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_templates_own_calls_parse_back(name):
    template = (TEMPLATES / name).read_text()
    syntax = T.syntax_of(template)
    family, end = FAMILIES[name]
    assert syntax is not None and syntax.name == family
    n = 2 if syntax.many else 1
    text = rendered_reply(template, n)
    want = [(f, a) for _, f, a in CALLS[:n]]
    content, got, _ = parse(syntax, text)
    assert got == want and content.replace("<think>\n\n</think>\n\n", "") == end
    for piece in (1, 2, 3, 7):   # streamed: the same calls, the argument pieces adding up
        assert parse(syntax, text, piece)[:2] == (content, got)


def test_granite_3_writes_a_list_after_its_marker():
    template = (TEMPLATES / "ibm-granite-granite-3.3-2B-Instruct.jinja").read_text()
    assert "respond only with <|tool_call|> followed by a JSON list of tools used" in template
    syntax = T.syntax_of(template)
    assert syntax.name == "granite"
    text = '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add", "arguments": {"a": 1, "b": 2.5}}]'
    assert parse(syntax, text)[:2] == ("", [(f, a) for _, f, a in CALLS])


@pytest.mark.parametrize("name", NO_TOOLS + ["LFM2.5-8B-A1B.jinja"])
def test_templates_without_a_known_call_syntax(name):
    """Gemma 2, Phi-3.5, this SmolLM3 template and DeepSeek-R1-Distill do not render `tools`; LFM2.5 does,
    in Python call syntax, which is not parsed (the server refuses tools for it, naming why)."""
    assert T.syntax_of((TEMPLATES / name).read_text()) is None


def test_text_around_calls_is_content_and_ids_follow_the_syntax():
    hermes, mistral, llama = (next(s for s in T.SYNTAXES if s.name == n) for n in ("hermes", "mistral", "llama3"))
    content, got, events = parse(hermes, 'Let me check. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
                                         '</tool_call>\n<tool_call', 4)
    assert content == "Let me check. \n<tool_call" and got == [("add", {"a": 1, "b": 2})]
    assert events[0] == ("text", "Let ") and T.Calls(hermes).add("<tool_") == []   # a marker's start is held back
    assert parse(llama, "  The answer is 4.")[:2] == ("  The answer is 4.", [])
    assert parse(llama, '{"name": "add", "parameters": {"a": 1, "b": 2}}')[1] == [("add", {"a": 1, "b": 2})]
    p = T.Calls(mistral)
    p.add('[TOOL_CALLS][{"name": "add", "arguments": {}}]')
    assert len(p.calls[0][0]) == 9 and p.calls[0][0].isalnum()
    p = T.Calls(hermes)
    p.add('<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>')
    assert p.calls[0][0].startswith("call_")


@pytest.fixture(scope="module")
def tok():
    model, tok = minigen.load(Path(__file__).parent / "fixtures" / "qwen2")
    return model, tok


def follows(constraint, model, tok, text: str) -> bool:
    """Whether llguidance's matcher takes the ids of `text` and then allows EOS (the grammar complete)."""
    f = constraint.bind(tok, model.config.vocab_size, eos_token_ids(model)).processor()
    f(np.zeros(model.config.vocab_size, np.float32), [0])
    ids = tok.encode(text, add_special_tokens=False)
    try:
        f.follow(ids)
    except minigen.MinigenError:
        return False
    return bool(f.allowed()[eos_token_ids(model)[0]])


@pytest.mark.parametrize("name", sorted(FAMILIES) + ["granite"])
def test_the_grammars_take_the_templates_calls(name, tok):
    model, tok = tok
    if name == "granite":
        syntax = next(s for s in T.SYNTAXES if s.name == "granite")
        text = '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add", "arguments": {"a": 1, "b": 2.5}}]'
        end = ""
    else:
        syntax = T.syntax_of((TEMPLATES / name).read_text())
        text, end = rendered_reply((TEMPLATES / name).read_text(), 2 if syntax.many else 1), FAMILIES[name][1]
        text = text[:len(text) - len(end)].replace("<think>\n\n</think>\n\n", "")
    g = lambda choice, parallel=True: T.constraint(syntax, TOOLS, choice, parallel, tok)   # noqa: E731
    assert follows(g("required"), model, tok, text) and follows(g("auto"), model, tok, text)
    assert follows(g("auto"), model, tok, "Paris is sunny, I think.")
    assert follows(g("auto"), model, tok, "First, " + text)   # text, then calls (Llama 3: all of it prose)
    assert len(parse(syntax, "First, " + text)[1]) == (len(CALLS[:2 if syntax.many else 1]) if syntax.open else 0)
    assert not follows(g("required"), model, tok, "Paris is sunny.")
    assert not follows(g("get_weather"), model, tok, text) or not syntax.many     # both calls: add is not allowed
    wrong = text.replace('"Paris"', "42")
    assert not follows(g("required"), model, tok, wrong)                          # city must be a string
    if syntax.many:
        assert not follows(g("required", parallel=False), model, tok, text)      # one call only


def test_tool_schemas_that_do_not_compile_name_the_problem(tok):
    model, tok = tok
    hermes = next(s for s in T.SYNTAXES if s.name == "hermes")
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "integr"}}}]
    with pytest.raises(ValueError, match="integr"):
        T.constraint(hermes, bad, "required", True, tok)


def test_a_special_token_marker_is_written_as_the_token(tok):
    model, tok = tok
    assert T.lit(tok, "<|im_end|>\nx") == '<[2]> "\\nx"'
    assert T.lit(tok, "<|im_end|>x") == '<[2]> "x"' and T.lit(tok, "<tool_call>") == '"<tool_call>"'


REFS = json.loads((TEMPLATES / "references.json").read_text(encoding="utf-8"))


@pytest.mark.usefixtures("rendered_today")
@pytest.mark.parametrize("ref", [r for r in REFS["renders"] if r.get("tools") and r["text"]],
                         ids=lambda r: f"{r['template'][:-6]}-{r['conversation']}-{'gen' if r['add_generation_prompt'] else 'nogen'}")
def test_openai_messages_with_tools_render_as_transformers(ref):
    """The conversation as an OpenAI client sends it (arguments as a JSON string, content null) through the
    server's messages(), rendered with the tools: transformers' rendering of it (arguments as an object)."""
    from minigen.serve.api import messages
    wire = json.loads(json.dumps(REFS["conversations"][ref["conversation"]]))
    for m in wire:
        for call in m.get("tool_calls", []):
            call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
        if m.get("tool_calls"):
            m["content"] = None
    template = (TEMPLATES / ref["template"]).read_text(encoding="utf-8")
    got = render_chat_template(template, messages(wire), ref["add_generation_prompt"], tools=REFS["tools"],
                               **REFS["variables"])
    assert got == ref["text"]


def test_an_added_token_not_marked_special_is_written_as_the_token():
    """Qwen2.5's <tool_call> is an added token with special false; llguidance takes it as special, so the
    grammar must name it by id: as a string, the matcher allowed the token and then refused it."""
    from tokenizers import AddedToken
    model, tok = minigen.load(Path(__file__).parent / "fixtures" / "qwen2")
    tok.hf.add_tokens([AddedToken("<tool_call>", special=False), AddedToken("</tool_call>", special=False)])
    opener = tok.hf.token_to_id("<tool_call>")
    assert opener < model.config.vocab_size and T.lit(tok, "<tool_call>\n") == f'<[{opener}]> "\\n"'
    hermes = next(s for s in T.SYNTAXES if s.name == "hermes")
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert tok.encode(text, add_special_tokens=False)[0] == opener
    for choice in ("required", "auto"):
        assert follows(T.constraint(hermes, TOOLS, choice, True, tok), model, tok, text)

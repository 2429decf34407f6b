"""`minigen serve` with response_format and tools, through the official openai client (pydantic models with
`.parse`, `tools=` and `tool_calls` read back, streams), on 127.0.0.1 (a free port).

The model is the tiny random qwen2 fixture wearing Qwen2.5-7B-Instruct's chat template (committed under
tests/fixtures/chat_templates/, which renders tools and writes calls in <tool_call> tags), its context
raised to 4,096 positions so that the template's tool prompt fits. A random model writes nothing useful
unaided, so whatever comes back valid is the constraint's doing. References: `jsonschema` for every
reply that finished, the template rendered directly (transformers' way: arguments as objects) for a
conversation with tool results, and the same request unstreamed for a stream.
"""
import dataclasses
import json
import threading
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")
jsonschema = pytest.importorskip("jsonschema")

import minigen  # noqa: E402
from minigen.serve.http import Server, build  # noqa: E402
from minigen.text.template import render_chat_template  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
QWEN25 = (FIXTURES / "chat_templates" / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
NAME = "qwen2"
TIMEOUT = 60
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": {
             "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
             "required": ["a", "b"], "additionalProperties": False}}}]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
LONG = 400   # tokens: enough for a random model to close its JSON


class Running:
    def __init__(self, model, tok):
        self.app = build(model, tok, NAME)
        self.server = Server(("127.0.0.1", 0), self.app)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.server.server_address[1]}/v1", api_key="none",
                                    timeout=TIMEOUT, max_retries=0)

    def close(self):
        self.server.shutdown()
        self.app.scheduler.stop(1.0)
        self.server.server_close()


def fixture_model(template: str | None):
    model, tok = minigen.load(FIXTURES / "qwen2")
    model.config = dataclasses.replace(model.config, max_position_embeddings=4096)
    tok.chat_template = template
    return model, tok


@pytest.fixture(scope="module")
def loaded():
    return fixture_model(QWEN25)


@pytest.fixture(scope="module")
def server(loaded):
    s = Running(*loaded)
    yield s
    s.close()


def create(server, **kw):
    return server.client.chat.completions.create(model=NAME, messages=kw.pop("messages", MESSAGES), **kw)


def check_calls(message, names=None):
    assert message.tool_calls
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in (names or PARAMETERS)
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


# --- response_format -------------------------------------------------------------------------------------

class Weather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=10)
    celsius: int
    sunny: bool


def test_parse_with_a_pydantic_model(server):
    finished = 0
    for seed in range(3):
        r = server.client.chat.completions.parse(model=NAME, messages=MESSAGES, response_format=Weather,
                                                 max_tokens=LONG, temperature=1.0, seed=seed)
        choice = r.choices[0]
        if choice.finish_reason == "stop":
            assert isinstance(choice.message.parsed, Weather)
            jsonschema.validate(json.loads(choice.message.content), Weather.model_json_schema())
            finished += 1
    assert finished >= 2


def test_json_object_and_a_schema_in_completions(server):
    finished = 0
    for seed in range(4):
        r = create(server, response_format={"type": "json_object"}, max_tokens=LONG, temperature=1.0, seed=seed)
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(r.choices[0].message.content), dict)
            finished += 1
    assert finished >= 1
    schema = {"type": "array", "items": {"type": "integer"}, "maxItems": 3}
    r = server.client.completions.create(model=NAME, prompt="Numbers:", max_tokens=LONG, temperature=0,
                                         extra_body={"response_format": {"type": "json_schema",
                                                                         "json_schema": {"name": "n", "schema": schema}}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].text), schema)


def test_a_schema_that_cannot_finish_in_max_tokens_ends_on_length(server):
    r = create(server, response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}},
               max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3


# --- tools ------------------------------------------------------------------------------------------------

def test_required_and_a_named_function_give_valid_calls(server):
    r = create(server, tools=TOOLS, tool_choice="required", max_tokens=LONG, temperature=0)
    assert r.choices[0].finish_reason == "tool_calls"
    check_calls(r.choices[0].message)
    finished = 0
    for seed in range(2):
        r = create(server, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}},
                   max_tokens=LONG, temperature=1.0, seed=seed)
        if r.choices[0].finish_reason == "tool_calls":
            check_calls(r.choices[0].message, ["add"])
            finished += 1
    assert finished >= 1
    r = create(server, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=LONG, temperature=0)
    assert r.choices[0].finish_reason == "tool_calls" and len(r.choices[0].message.tool_calls) == 1


def test_a_stream_of_tool_call_deltas_adds_up_to_the_reply(server):
    whole = create(server, tools=TOOLS, tool_choice="required", max_tokens=LONG, temperature=0).choices[0]
    calls, finish, first = {}, None, []
    for chunk in create(server, tools=TOOLS, tool_choice="required", max_tokens=LONG, temperature=0, stream=True):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for d in choice.delta.tool_calls or []:
            if d.index not in calls:   # a call's first delta: its id, type and name, arguments ""
                first.append(d)
                calls[d.index] = [d.id, d.function.name, ""]
            calls[d.index][2] += d.function.arguments or ""
        assert not (choice.delta.content or "").strip()
    assert finish == "tool_calls" == whole.finish_reason
    assert all(d.id and d.type == "function" and d.function.arguments == "" for d in first)
    assert [(n, a) for _, n, a in calls.values()] == [(c.function.name, c.function.arguments)
                                                     for c in whole.message.tool_calls]


def test_tool_results_go_back_through_the_template(server, loaded):
    r = create(server, tools=TOOLS, tool_choice="required", max_tokens=LONG, temperature=0)
    message = r.choices[0].message
    results = [{"role": "tool", "tool_call_id": c.id, "content": "sunny, 21 C"} for c in message.tool_calls]
    follow = create(server, messages=MESSAGES + [message] + results, tools=TOOLS, max_tokens=4, temperature=0)
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # the prompt is the template's rendering of the conversation, with the calls' arguments as objects
    _, tok = loaded
    past = {"role": "assistant", "content": message.content or "", "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                      "arguments": json.loads(c.function.arguments)}}
        for c in message.tool_calls]}
    text = render_chat_template(QWEN25, MESSAGES + [past] + results, True, tools=TOOLS, **tok.special_tokens())
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text
    assert follow.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False))


def test_tool_choice_none_renders_no_tools_and_parses_no_calls(server):
    none = create(server, tools=TOOLS, tool_choice="none", max_tokens=8, temperature=0)
    plain = create(server, max_tokens=8, temperature=0)
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens and not none.choices[0].message.tool_calls


# --- what the server does not implement is a 400 naming it ------------------------------------------------

@pytest.mark.parametrize("extra, param", [
    ({"frobnicate": 1}, "frobnicate"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"audio": {"voice": "alloy"}}, "audio"),
    ({"stream_options": {"include_usage": True, "extra": 1}, "stream": True}, "stream_options.extra"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "integr"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "bogus": 1}}},
     "response_format.json_schema.bogus"),
    ({"tools": [{"type": "function", "function": {"name": "f", "bogus": 1}}]}, "tools[0].function.bogus"),
    ({"tools": [{"type": "function", "function": {"name": "f g"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "integr"}}}]},
     "tools[0].function.parameters"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "hi", "name": "bob"}]}, "messages[0].name"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{no"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
])
def test_fields_not_implemented_are_400_naming_them(server, extra, param):
    body = {"model": NAME, "messages": MESSAGES, "max_tokens": 2, **extra}
    with pytest.raises(openai.BadRequestError) as e:
        server.client.chat.completions.create(**{k: body.pop(k) for k in ("model", "messages")}, extra_body=body)
    assert e.value.body["param"] == param and e.value.body["message"].startswith(param), e.value.body


def test_the_defaults_clients_send_are_accepted(server):
    r = create(server, max_tokens=2, n=1, presence_penalty=0, frequency_penalty=0, logit_bias={}, store=False,
               modalities=["text"], user="someone", parallel_tool_calls=True, stream_options=None)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_tools_for_a_template_that_does_not_render_them_are_400():
    s = Running(*fixture_model("{% for m in messages %}{{ m.content }}{% endfor %}"))
    try:
        with pytest.raises(openai.BadRequestError) as e:
            create(s, tools=TOOLS, max_tokens=2)
        assert e.value.body["param"] == "tools" and "does not render tools" in e.value.body["message"]
        assert create(s, tools=TOOLS, tool_choice="none", max_tokens=2).choices[0].finish_reason in ("stop", "length")
    finally:
        s.close()


def test_the_grammar_tokenizer_is_built_when_the_server_starts():
    """build() makes llguidance's tokenizer of the model off the first constrained request's time, the
    one bind() then finds: a fresh tokenizer object, so that no earlier test built it."""
    from minigen.generation import constraint as C
    from minigen.generation.sequence import eos_token_ids
    model, tok = fixture_model(QWEN25)
    app = build(model, tok, NAME)
    try:
        warm = [t for t in threading.enumerate() if t.name == "minigen-llguidance"]
        for t in warm:
            t.join(TIMEOUT)
        eos = tuple(eos_token_ids(model))
        assert (id(tok.hf), model.config.vocab_size, eos) in C._TOKENIZERS
        bound = C.json_object().bind(tok, model.config.vocab_size, eos)
        assert bound.tokenizer is C._TOKENIZERS[(id(tok.hf), model.config.vocab_size, eos)][1]
    finally:
        app.scheduler.stop(1.0)

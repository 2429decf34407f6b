"""The OpenAI API's shapes: a request's JSON -> a Request; text, log-probs and usage -> replies and chunks.

`parse` is the one place request fields become a run's Options (`temperature` -> temp, ...): every
field is checked for its type and range here, and a bad one is an ApiError naming it, which the HTTP
layer sends as OpenAI's error object (`{"error": {"message", "type", "param", "code"}}`). No field is
ignored in silence: a field this server does not implement is a 400 naming it (FIELDS), and so is one
it takes only at the value that changes nothing (DEFAULT_ONLY: `n` 1, `presence_penalty` 0, ...), at
any other value; inside `messages`, `response_format`, `tools` and `tool_choice` too.

`response_format` (json_object, json_schema) and `tools` with `tool_choice` become the run's
Options.constraint (generation/constraint.py, bound here to the tokenizer); the tools are rendered
through the chat template, and the reply's calls are parsed by tools.Calls (serve/tools.py).

Defaults: `temperature` and the other samplers not given come from the checkpoint's
generation_config.json, as in `minigen generate`; `max_tokens` not given is the rest of the context
for chat and 16 for completions (OpenAI's defaults).
"""
from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import replace

import numpy as np
from dataclasses import dataclass, field

from ..errors import MinigenError, OptionError, is_int, is_number, short
from ..files import parse_json
from ..generation.sampling import largest, log_softmax
from ..generation import constraint as constraints
from ..generation.constraint import JSON_DEFAULTS
from ..generation.options import REQUEST_FIELDS, Options
from ..generation.options import check_prompt as check_ids
from ..generation.sequence import chat_ids, eos_token_ids
from ..text.tokenizer import token_text
from . import tools as calls
from .tools import Syntax

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_TOP_LOGPROBS = 20
COMPLETION_MAX_TOKENS = 16   # OpenAI's default for /v1/completions
UNSUPPORTED_ZERO = ("presence_penalty", "frequency_penalty")   # accepted only as 0 (OpenAI's default)
# The request fields each route implements; `user` (an end user's id, for the operator) changes no output.
COMMON = {"model", "max_tokens", "stop", "stream", "stream_options", "logprobs", "response_format", "user", "n",
          "logit_bias", *UNSUPPORTED_ZERO, *REQUEST_FIELDS}
FIELDS = {"chat": COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                            "parallel_tool_calls", "store", "modalities"},
          "completion": COMMON | {"prompt", "echo", "best_of"}}
DEFAULT_ONLY = {"logit_bias": {}, "store": False, "modalities": ["text"], "echo": False, "best_of": 1}   # else a 400
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class ApiError(Exception):
    """A request the server refuses: HTTP status, one line, and the request field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class Request:
    kind: str                    # "chat" | "completion"
    ids: list[int]               # the prompt's token ids (chat: the conversation through the template)
    options: Options             # checked (Options.of); max_context None: the model's
    model: str
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage
    logprobs: int | None = None  # None: none asked for; k: the chosen token's log-prob and k alternatives
    syntax: Syntax | None = None  # tools may be called: the reply's calls are parsed (tools.Calls)
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))


def parse(kind: str, raw: bytes, model_name: str, tokenizer, engine) -> Request:
    """A POST body of /v1/chat/completions ("chat") or /v1/completions ("completion") -> a Request, for the
    model `engine` (a Model) served as `model_name`; a constraint ends on its EOS ids."""
    body = parse_body(raw)
    check_fields(body, kind)
    model = get(body, "model", lambda v: isinstance(v, str), "a string", model_name)
    if model != model_name:
        raise ApiError(404, f"model: the model {model!r} does not exist; this server has {model_name!r} "
                            f"(GET /v1/models)", "model", "model_not_found")
    if get(body, "n", is_int, "an integer", 1) != 1:
        raise ApiError(400, "n: only n = 1 is supported (one choice per request)", "n")
    for name in UNSUPPORTED_ZERO:
        if get(body, name, is_number, "a number", 0) != 0:
            raise ApiError(400, f"{name}: not supported (use repetition_penalty)", name)
    text_rule, constraint = response_format(body)
    syntax = None
    if kind == "chat":
        tools, syntax, constraint = tool_calls(body, tokenizer, text_rule, constraint)
        ids, where = chat_prompt(tokenizer, messages(body.get("messages")), tools), "messages"
        logprobs = chat_logprobs(body)
    else:
        ids, where = completion_prompt(tokenizer, body.get("prompt")), "prompt"
        logprobs = get(body, "logprobs", lambda v: is_int(v) and 0 <= v <= MAX_TOP_LOGPROBS,
                       f"an integer from 0 to {MAX_TOP_LOGPROBS}")
    check_prompt(ids, where, engine)
    stream = get(body, "stream", lambda v: isinstance(v, bool), "true or false", False)
    usage = get(body, "stream_options", lambda v: isinstance(v, dict), "an object", {})
    include_usage = get(usage, "include_usage", lambda v: isinstance(v, bool), "true or false", False,
                        where="stream_options.include_usage")
    known(usage, {"include_usage"}, "stream_options")
    options = run_options(body, kind, engine.config.max_position_embeddings)
    if constraint is not None:
        try:
            options = replace(options, constraint=constraint.bind(tokenizer, engine.config.vocab_size,
                                                                  eos_token_ids(engine)))
        except MinigenError as e:
            raise ApiError(400, f"{'tools' if syntax else 'response_format'}: {e}", "tools" if syntax else "response_format")
    return Request(kind, ids, options, model, stream, stream and include_usage, logprobs, syntax,
                   ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24])


def check_fields(body: dict, kind: str):
    """A 400 naming the first field this route does not implement, or gives at a value it takes only as
    OpenAI's default (DEFAULT_ONLY); null is as absent, as in OpenAI's API."""
    for name, value in body.items():
        if value is None:
            continue
        if name not in FIELDS[kind]:
            raise ApiError(400, f"{name}: this server does not implement this field (docs/serve.md lists the "
                                f"fields it does)", name)
        if name in DEFAULT_ONLY and value != DEFAULT_ONLY[name]:
            raise ApiError(400, f"{name}: only {json.dumps(DEFAULT_ONLY[name])} is supported, got {short(value, 40)}",
                           name)


def known(obj: dict, names: set, where: str):
    """A 400 naming the first key of `obj` (not null) that is not among `names`."""
    extra = sorted(k for k, v in obj.items() if k not in names and v is not None)
    if extra:
        raise ApiError(400, f"{where}.{extra[0]}: this server does not implement this field", f"{where}.{extra[0]}")


# --- response_format and tools -> a constraint -----------------------------------------------------------

def response_format(body: dict) -> tuple[str | None, "constraints.Constraint | None"]:
    """(a Lark rule for the reply, the Constraint) of `response_format`: text, json_object, json_schema."""
    rf = get(body, "response_format", lambda v: isinstance(v, dict), "an object")
    if rf is None:
        return None, None
    known(rf, {"type", "json_schema"}, "response_format")
    kind = rf.get("type")
    if kind == "text":
        return None, None
    if kind == "json_object":
        return f"%json {json.dumps({'type': 'object', 'x-guidance': JSON_DEFAULTS})}", constraints.json_object()
    if kind != "json_schema":
        raise ApiError(400, f"response_format.type: should be text, json_object or json_schema, got "
                            f"{short(kind, 40)}", "response_format.type")
    where = "response_format.json_schema"
    spec = get(rf, "json_schema", lambda v: isinstance(v, dict), "an object", where=where)
    if spec is None:
        raise ApiError(400, f"{where}: missing (an object with the schema)", where)
    known(spec, {"name", "schema", "strict", "description"}, where)
    get(spec, "name", lambda v: isinstance(v, str), "a string", where=f"{where}.name")
    get(spec, "description", lambda v: isinstance(v, str), "a string", where=f"{where}.description")
    get(spec, "strict", lambda v: isinstance(v, bool), "true or false", where=f"{where}.strict")
    schema = get(spec, "schema", lambda v: isinstance(v, (dict, bool)), "an object", {}, where=f"{where}.schema")
    try:
        made = constraints.json_schema(schema)
    except ValueError as e:
        raise ApiError(400, f"{where}.schema: {e}", f"{where}.schema") from None
    body_schema = {"x-guidance": JSON_DEFAULTS, **schema} if isinstance(schema, dict) else schema
    return f"%json {json.dumps(body_schema)}", made


def tool_calls(body: dict, tokenizer, text_rule, constraint):
    """(the tools for the chat template, the call syntax when calls are parsed, the Constraint) of
    `tools`, `tool_choice` and `parallel_tool_calls`."""
    tools = get(body, "tools", lambda v: isinstance(v, list), "a list of tools")
    choice = body.get("tool_choice")
    parallel = get(body, "parallel_tool_calls", lambda v: isinstance(v, bool), "true or false", True)
    if not tools:
        if choice not in (None, "none"):
            raise ApiError(400, "tool_choice: needs tools", "tool_choice")
        return None, None, constraint
    tools = [check_tool(t, i) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) < len(names):
        raise ApiError(400, f"tools: the function name {next(n for n in names if names.count(n) > 1)!r} is given "
                            f"twice", "tools")
    choice = tool_choice(choice, names)
    if choice == "none":   # the model is not told of the tools, and nothing is parsed as a call
        return None, None, constraint
    syntax = calls.syntax_of(tokenizer.chat_template)
    if syntax is None:
        renders = bool(tokenizer.chat_template and re.search(r"\btools\b", tokenizer.chat_template))
        raise ApiError(400, "tools: this model's chat template " + (
            "writes tool calls in a syntax this server does not parse (it parses: "
            + ", ".join(x.name for x in calls.SYNTAXES) + ")" if renders else "does not render tools"), "tools")
    try:
        made = calls.constraint(syntax, tools, choice, parallel, tokenizer, text_rule)
    except ValueError as e:
        raise ApiError(400, f"tools: {e}", "tools") from None
    return tools, syntax, made


def check_tool(tool, i: int) -> dict:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise ApiError(400, f'{where}: should be {{"type": "function", "function": {{"name": ..., ...}}}}, got '
                            f"{short(tool, 40)}", where)
    known(tool, {"type", "function"}, where)
    f = tool["function"]
    known(f, {"name", "description", "parameters", "strict"}, f"{where}.function")
    name = f.get("name")
    if not (isinstance(name, str) and TOOL_NAME.fullmatch(name)):
        raise ApiError(400, f"{where}.function.name: should be 1 to 64 letters, digits, _ or -, got {short(name, 40)}",
                       f"{where}.function.name")
    get(f, "description", lambda v: isinstance(v, str), "a string", where=f"{where}.function.description")
    get(f, "strict", lambda v: isinstance(v, bool), "true or false", where=f"{where}.function.strict")
    params = get(f, "parameters", lambda v: isinstance(v, dict), "a JSON schema (an object)",
                 where=f"{where}.function.parameters")
    if params is not None:
        try:
            constraints.json_schema(params)
        except ValueError as e:
            raise ApiError(400, f"{where}.function.parameters: {e}", f"{where}.function.parameters") from None
    return tool


def tool_choice(choice, names: list[str]) -> str:
    """"none", "auto" (the default with tools), "required", or the name of the function to call."""
    if choice is None:
        return "auto"
    if choice in ("none", "auto", "required"):
        return choice
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) and choice.get("type") == "function" \
        and isinstance(choice.get("function"), dict) else None
    if name is None:
        raise ApiError(400, 'tool_choice: should be "none", "auto", "required" or {"type": "function", "function": '
                            f'{{"name": ...}}}}, got {short(choice, 40)}', "tool_choice")
    known(choice, {"type", "function"}, "tool_choice")
    known(choice["function"], {"name"}, "tool_choice.function")
    if name not in names:
        raise ApiError(400, f"tool_choice.function.name: {name!r} is not one of the tools", "tool_choice.function.name")
    return name


def parse_body(raw: bytes) -> dict:
    try:
        body = parse_json(raw, "the request body", constants=False)
    except MinigenError as e:
        raise ApiError(400, str(e)) from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body: expected a JSON object")
    return body


def get(body: dict, name: str, ok, what: str, default=None, where: str | None = None):
    """body[name], or `default` when absent or null; ApiError naming the field when `ok` refuses it."""
    value = body.get(name)
    if value is None:
        return default
    if not ok(value):
        raise ApiError(400, f"{where or name}: should be {what}, got {short(value, 40)}", where or name)
    return value


def run_options(body: dict, kind: str, context: int) -> Options:
    """The request's fields as a run's Options, checked where they are made (Options.of), errors naming the request field."""
    names = ("max_completion_tokens", "max_tokens") if kind == "chat" else ("max_tokens",)
    given = next((n for n in names if body.get(n) is not None), None)
    values = {opt: body.get(name) for name, opt in REQUEST_FIELDS.items()}
    values["max_tokens"] = body[given] if given else context if kind == "chat" else COMPLETION_MAX_TOKENS
    stop = body.get("stop")
    values["stop"] = () if stop is None else (stop,) if isinstance(stop, str) else \
        tuple(stop) if isinstance(stop, list) else stop
    try:
        options = Options.of(**values)
    except OptionError as e:
        field_name = given if e.option == "max_tokens" else \
            next((n for n, o in REQUEST_FIELDS.items() if o == e.option), e.option)
        raise ApiError(400, f"{field_name}: {e.message}", field_name) from None
    if options.max_tokens < 1:   # as vLLM: a request must leave room for one token
        raise ApiError(400, f"{given}: should be at least 1, got {options.max_tokens}", given)
    return options


def messages(value) -> list[dict]:
    """OpenAI's messages -> [{"role", "content"}] for the chat template: content as a string or a list of
    text parts; "developer" is the system role; an assistant's `tool_calls` (their arguments as objects,
    as the templates render them and as vLLM passes them) and a tool's result with its `tool_call_id`."""
    if not isinstance(value, list) or not value:
        raise ApiError(400, 'messages: should be a non-empty list of {"role": ..., "content": ...}', "messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where}: should be an object with role and content, got {short(m, 40)}", where)
        role = m.get("role")
        if role not in ROLES:
            raise ApiError(400, f"{where}.role: should be one of system, user, assistant, tool, got {short(role, 40)}",
                           f"{where}.role")
        known(m, {"role", "content"} | {"assistant": {"tool_calls"}, "tool": {"tool_call_id"}}.get(role, set()), where)
        if m.get("refusal") is not None:
            raise ApiError(400, f"{where}.refusal: this server does not implement this field", f"{where}.refusal")
        message = {"role": ROLES[role], "content": content_text(m.get("content"), role, f"{where}.content")}
        if role == "tool":
            message["tool_call_id"] = get(m, "tool_call_id", lambda v: isinstance(v, str), "a string", "",
                                          where=f"{where}.tool_call_id")
        if role == "assistant" and m.get("tool_calls"):
            message["tool_calls"] = [past_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(
                get(m, "tool_calls", lambda v: isinstance(v, list), "a list", where=f"{where}.tool_calls"))]
        out.append(message)
    return out


def past_call(call, where: str) -> dict:
    """An assistant's earlier call, as the templates read it: {"id", "type", "function": {"name", "arguments": {...}}}."""
    f = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("arguments"), str)):
        raise ApiError(400, f'{where}: should be {{"id": ..., "type": "function", "function": {{"name": ..., '
                            f'"arguments": "<JSON>"}}}}, got {short(call, 40)}', where)
    known(call, {"id", "type", "function"}, where)
    known(f, {"name", "arguments"}, f"{where}.function")
    try:
        arguments = json.loads(f["arguments"])
    except json.JSONDecodeError as e:
        raise ApiError(400, f"{where}.function.arguments: not JSON ({e.msg} at column {e.colno})",
                       f"{where}.function.arguments") from None
    return {"id": str(call.get("id") or ""), "type": "function", "function": {"name": f["name"], "arguments": arguments}}


def content_text(content, role: str, where: str) -> str:
    if isinstance(content, str):
        return content
    if content is None and role in ("assistant", "tool"):
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ApiError(400, f"{where}: should be a string or a list of text parts "
                        f'({{"type": "text", "text": ...}}), got {short(content, 40)}', where)


def chat_prompt(tokenizer, msgs: list[dict], tools: list | None = None) -> list[int]:
    if not tokenizer.chat_template:
        raise ApiError(400, "messages: this model has no chat template; use /v1/completions", "messages")
    try:
        return chat_ids(tokenizer, msgs, **({"tools": tools} if tools else {}))
    except MinigenError as e:  # the template refused the conversation (raise_exception), or its limits
        raise ApiError(400, f"messages: {e}", "messages") from None


def completion_prompt(tokenizer, prompt) -> list[int]:
    """A string (encoded with the tokenizer's special tokens, as `minigen generate` does) or token ids; a
    list of one of either (OpenAI's batch form, with n = 1)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        try:
            return tokenizer.encode(prompt)
        except MinigenError as e:
            raise ApiError(400, f"prompt: {e}", "prompt") from None
    if isinstance(prompt, list) and prompt and all(is_int(i) for i in prompt):
        return [int(i) for i in prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise ApiError(400, "prompt: only one prompt per request is supported", "prompt")
    raise ApiError(400, f"prompt: should be a string or a non-empty list of token ids, got {short(prompt, 40)}",
                   "prompt")


def chat_logprobs(body: dict) -> int | None:
    wanted = get(body, "logprobs", lambda v: isinstance(v, bool), "true or false", False)
    top = get(body, "top_logprobs", lambda v: is_int(v) and 0 <= v <= MAX_TOP_LOGPROBS,
              f"an integer from 0 to {MAX_TOP_LOGPROBS}")
    if top is not None and not wanted:
        raise ApiError(400, "top_logprobs: needs logprobs set to true", "top_logprobs")
    return (top or 0) if wanted else None


def check_prompt(ids: list[int], where: str, model) -> None:
    """The prompt's ids by the one check every command applies (options.check_prompt), as a 400 naming the
    request field; a prompt longer than the context is OpenAI's context_length_exceeded."""
    try:
        check_ids(ids, model, flag=None)
    except MinigenError as e:
        code = "context_length_exceeded" if len(ids) > model.config.max_position_embeddings else None
        raise ApiError(400, f"{where}: {str(e).removeprefix('prompt: ')}", where, code) from None


# --- replies -------------------------------------------------------------------------------------------

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def head(req: Request, chunk: bool) -> dict:
    obj = {"chat": "chat.completion", "completion": "text_completion"}[req.kind]
    return {"id": req.id, "object": obj + (".chunk" if chunk and req.kind == "chat" else ""),
            "created": req.created, "model": req.model, "system_fingerprint": "minigen"}


def finish_reason(finish: str, called: bool) -> str:
    """OpenAI's finish_reason: "tool_calls" when the reply called tools and ended as it meant to."""
    return "tool_calls" if called and FINISH[finish] == "stop" else FINISH[finish]


def reply(req: Request, text: str, finish: str, entries: list | None, use: dict,
          tool_calls: list | None = None) -> dict:
    """The whole reply of a request with stream false; `tool_calls` [(id, name, arguments text)]."""
    if req.kind == "chat":
        message = {"role": "assistant", "content": text, "refusal": None}
        if tool_calls:
            message["content"] = text if text.strip() else None
            message["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                                     for i, n, a in tool_calls]
        choice = {"index": 0, "message": message, "logprobs": chat_logprobs_object(entries),
                  "finish_reason": finish_reason(finish, bool(tool_calls))}
    else:
        choice = {"index": 0, "text": text, "logprobs": completion_logprobs_object(entries),
                  "finish_reason": FINISH[finish]}
    return {**head(req, False), "choices": [choice], "usage": use}


def chunk(req: Request, text: str | None, entries: list | None = None, finish: str | None = None,
          role: bool = False, call: dict | None = None, called: bool = False) -> dict:
    """One server-sent event of a stream: the role (chat's first), a piece of text, a tool call's delta
    (`call`, as tool_delta makes it), or the finish (`called`: "tool_calls" if the reply called tools)."""
    if req.kind == "chat":
        delta = {"role": "assistant", "content": ""} if role else {"tool_calls": [call]} if call else \
            {} if text is None else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": chat_logprobs_object(entries)}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": completion_logprobs_object(entries)}
    choice["finish_reason"] = None if finish is None else finish_reason(finish, called)
    out = {**head(req, True), "choices": [choice]}
    if req.include_usage:
        out["usage"] = None
    return out


def tool_delta(event: tuple) -> dict:
    """A tools.Calls event as OpenAI streams it: a call's first delta (index, id, type, name, arguments
    ""), then pieces of its arguments."""
    if event[0] == "call":
        _, index, call_id, name = event
        return {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
    _, index, text = event
    return {"index": index, "function": {"arguments": text}}


def usage_chunk(req: Request, use: dict) -> dict:
    return {**head(req, True), "choices": [], "usage": use}


# Log-prob entries: (token text, its UTF-8 bytes, log-prob, [(text, bytes, log-prob) of the alternatives]).

def logprob_entry(tokenizer, logits, token: int, k: int) -> tuple:
    """The entry of one generated token: log-probs of the model's own distribution (log_softmax of the
    raw logits, before temperature and the filters), as vLLM reports them by default.
    To be replaced by Step.logprob / Step.top_logprobs(k) (the scores issue) when they land."""
    lp = log_softmax(logits)                                                 # (V,)
    top = largest(lp, k)
    return token_text(tokenizer, token) + (float(lp[token]), [token_text(tokenizer, int(i)) + (float(lp[i]),)
                                                              for i in top])


def chat_logprobs_object(entries: list | None) -> dict | None:
    if entries is None:
        return None
    return {"content": [{"token": t, "logprob": lp, "bytes": list(b),
                         "top_logprobs": [{"token": at, "logprob": alp, "bytes": list(ab)} for at, ab, alp in top]}
                        for t, b, lp, top in entries], "refusal": None}


def completion_logprobs_object(entries: list | None, offset: int = 0) -> dict | None:
    if entries is None:
        return None
    offsets, at = [], offset
    for t, _, _, _ in entries:
        offsets.append(at)
        at += len(t)
    return {"tokens": [t for t, _, _, _ in entries], "token_logprobs": [lp for _, _, lp, _ in entries],
            "top_logprobs": [{at: alp for at, _, alp in top} for _, _, _, top in entries], "text_offset": offsets}

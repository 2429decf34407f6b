"""The OpenAI API's shapes: a request's JSON -> a Request; text, log-probs and usage -> replies and chunks.

`parse` is the one place request fields become a run's Options (`temperature` -> temp, ...): every
field is checked for its type and range here, and a bad one is an ApiError naming it, which the HTTP
layer sends as OpenAI's error object (`{"error": {"message", "type", "param", "code"}}`). Fields this
server does not know are ignored, as OpenAI's own server and vLLM ignore them; known ones it cannot
honour (`n` > 1, a non-zero `presence_penalty`) are refused rather than silently dropped.

Defaults: `temperature` and the other samplers not given come from the checkpoint's
generation_config.json, as in `minigen generate`; `max_tokens` not given is the rest of the context
for chat and 16 for completions (OpenAI's defaults).
"""
from __future__ import annotations

import time
import uuid

import numpy as np
from dataclasses import dataclass, field

from ..errors import MinigenError, OptionError, is_int, is_number, short
from ..files import parse_json
from ..generation.sampling import log_softmax
from ..generation.options import REQUEST_FIELDS, Options
from ..generation.options import check_prompt as check_ids
from ..generation.sequence import chat_ids
from ..text.tokenizer import token_text

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_TOP_LOGPROBS = 20
COMPLETION_MAX_TOKENS = 16   # OpenAI's default for /v1/completions
UNSUPPORTED_ZERO = ("presence_penalty", "frequency_penalty")   # accepted only as 0 (OpenAI's default)


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
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))


def parse(kind: str, raw: bytes, model_name: str, tokenizer, engine) -> Request:
    """A POST body of /v1/chat/completions ("chat") or /v1/completions ("completion") -> a Request, for the
    model `engine` (a Model) served as `model_name`."""
    body = parse_body(raw)
    model = get(body, "model", lambda v: isinstance(v, str), "a string", model_name)
    if model != model_name:
        raise ApiError(404, f"model: the model {model!r} does not exist; this server has {model_name!r} "
                            f"(GET /v1/models)", "model", "model_not_found")
    if get(body, "n", is_int, "an integer", 1) != 1:
        raise ApiError(400, "n: only n = 1 is supported (one choice per request)", "n")
    for name in UNSUPPORTED_ZERO:
        if get(body, name, is_number, "a number", 0) != 0:
            raise ApiError(400, f"{name}: not supported (use repetition_penalty)", name)
    if kind == "chat":
        ids, where = chat_prompt(tokenizer, messages(body.get("messages"))), "messages"
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
    return Request(kind, ids, run_options(body, kind, engine.config.max_position_embeddings), model, stream, stream and include_usage, logprobs,
                   ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24])


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
    text parts; "developer" is the system role."""
    if not isinstance(value, list) or not value:
        raise ApiError(400, 'messages: should be a non-empty list of {"role": ..., "content": ...}', "messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where}: should be an object with role and content, got {short(m, 40)}", where)
        role = m.get("role")
        if role not in ROLES:
            raise ApiError(400, f"{where}.role: should be one of system, user, assistant, got {short(role, 40)}",
                           f"{where}.role")
        out.append({"role": ROLES[role], "content": content_text(m.get("content"), role, f"{where}.content")})
    return out


def content_text(content, role: str, where: str) -> str:
    if isinstance(content, str):
        return content
    if content is None and role == "assistant":
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ApiError(400, f"{where}: should be a string or a list of text parts "
                        f'({{"type": "text", "text": ...}}), got {short(content, 40)}', where)


def chat_prompt(tokenizer, msgs: list[dict]) -> list[int]:
    if not tokenizer.chat_template:
        raise ApiError(400, "messages: this model has no chat template; use /v1/completions", "messages")
    try:
        return chat_ids(tokenizer, msgs)
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


def reply(req: Request, text: str, finish: str, entries: list | None, use: dict) -> dict:
    """The whole reply of a request with stream false."""
    if req.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                  "logprobs": chat_logprobs_object(entries), "finish_reason": FINISH[finish]}
    else:
        choice = {"index": 0, "text": text, "logprobs": completion_logprobs_object(entries),
                  "finish_reason": FINISH[finish]}
    return {**head(req, False), "choices": [choice], "usage": use}


def chunk(req: Request, text: str | None, entries: list | None = None, finish: str | None = None,
          role: bool = False) -> dict:
    """One server-sent event of a stream: the role (chat's first), a piece of text, or the finish."""
    if req.kind == "chat":
        delta = {"role": "assistant", "content": ""} if role else {} if text is None else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": chat_logprobs_object(entries)}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": completion_logprobs_object(entries)}
    choice["finish_reason"] = None if finish is None else FINISH[finish]
    out = {**head(req, True), "choices": [choice]}
    if req.include_usage:
        out["usage"] = None
    return out


def usage_chunk(req: Request, use: dict) -> dict:
    return {**head(req, True), "choices": [], "usage": use}


# Log-prob entries: (token text, its UTF-8 bytes, log-prob, [(text, bytes, log-prob) of the alternatives]).

def logprob_entry(tokenizer, logits, token: int, k: int) -> tuple:
    """The entry of one generated token: log-probs of the model's own distribution (log_softmax of the
    raw logits, before temperature and the filters), as vLLM reports them by default.
    To be replaced by Step.logprob / Step.top_logprobs(k) (the scores issue) when they land."""
    lp = log_softmax(logits)                                                 # (V,)
    top = np.argsort(-lp, kind="stable")[:k] if k else []
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

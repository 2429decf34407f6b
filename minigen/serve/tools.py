"""Tool calls: the model's call syntax, the grammar that enforces `tool_choice`, and the parser that turns
what the model wrote into OpenAI's `tool_calls`, as the text comes.

A checkpoint's chat template says how its model calls tools; the syntaxes are data (SYNTAXES), each
found by a string its templates write (Qwen2.5 / Qwen3 / Granite 4 write `<tool_call>`, Mistral
`[TOOL_CALLS]`, Granite 3 `<|tool_call|>`, Llama 3.x asks for `{"name": ..., "parameters": ...}`). A
call is a JSON object, {"name": N, "arguments": {...}} (Llama 3: "parameters"), after an opening marker
and before a closing one, or several in one JSON array after the marker.

The grammar (`grammar`), for generation/constraint.py: `required` and a named function allow only
calls, each call's arguments valid against its function's `parameters` schema (llguidance's JSON schema,
the name first); `auto` allows any text, and once the model writes the opening marker, a call that
follows the same grammar (llguidance's lazy lexemes: the grammar starts where the call does). A marker
that is an added token of the tokenizer is written as that token, otherwise as text.

`Calls` parses the output as it comes: text outside calls is content (a tail that could be the start
of a marker held back, as a stop string is), and each call yields its name as soon as it is written,
then the text of its arguments as it grows, so a stream sends OpenAI's deltas: the first with the
call's index, id, type and name, the next ones with pieces of `arguments`.
"""
from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass

from ..generation import constraint as constraints
from ..generation.constraint import JSON_DEFAULTS


@dataclass(frozen=True)
class Syntax:
    """How one family's model writes tool calls."""
    name: str
    marker: str              # a string of the chat template that names this syntax
    open: str                # before a call, or before the array of calls; "" : the reply starts with the call
    close: str = ""          # after a call (not an array)
    key: str = "arguments"   # the key of a call's arguments
    array: bool = False      # the calls in one JSON array after `open`
    sep: str = "\n"          # between calls that are not in an array
    many: bool = True        # the template renders more than one call in a message
    id_chars: int = 0        # 9: Mistral's templates need ids of 9 letters and digits; 0: OpenAI's call_...
    extra: tuple = ()        # (key, JSON schema) of optional keys after the arguments, as the templates write them


SYNTAXES = (   # tried in order: the first whose marker the template holds
    Syntax("mistral", "[TOOL_CALLS]", "[TOOL_CALLS]", array=True, id_chars=9,
           extra=(("id", {"type": "string", "pattern": "^[A-Za-z0-9]{9}$"}),)),
    Syntax("granite", "<|tool_call|>", "<|tool_call|>", array=True),
    Syntax("hermes", "<tool_call>", "<tool_call>\n", "\n</tool_call>"),
    Syntax("llama3", '"parameters": ', "", key="parameters", many=False),
)
TEXT = r"/(.|\n)*/"


def syntax_of(template: str | None) -> Syntax | None:
    """The tool-call syntax of a chat template that renders `tools`, or None."""
    if not template or not re.search(r"\btools\b", template):
        return None
    return next((s for s in SYNTAXES if s.marker in template), None)


# --- the grammar --------------------------------------------------------------------------------------

def grammar(syntax: Syntax, tools: list[dict], choice: str, parallel: bool, tokenizer,
            text_rule: str | None = None) -> str:
    """The Lark grammar of a reply (llguidance's syntax): `choice` "auto", "required", or a function's
    name; `tools` OpenAI's [{"type": "function", "function": {...}}]; `parallel` more than one call
    allowed; `text_rule` a grammar for a reply that is not a call (a response_format's `%json {...}`),
    else any text."""
    functions = [t["function"] for t in tools if choice in ("auto", "required") or t["function"]["name"] == choice]
    one, many = call_schema(syntax, functions), parallel and syntax.many
    if syntax.array:   # one JSON array holds the calls
        items = {k: v for k, v in one.items() if k != "x-guidance"}
        body = {"type": "array", "items": items, "minItems": 1, **({} if many else {"maxItems": 1}),
                "x-guidance": JSON_DEFAULTS}
    else:
        body = one
    opener, closer = lit(tokenizer, syntax.open), lit(tokenizer, syntax.close)
    more = f" ({lit(tokenizer, syntax.sep)} call)*" if many and not syntax.array else ""
    rules = [f"call: {opener} body {closer}".replace("  ", " ").strip(), f"body: %json {json.dumps(body)}",
             f"TEXT: {TEXT}"]
    if choice != "auto":
        start = f"call{more}"
    elif text_rule is not None:                   # a reply in the response format, or calls
        start, rules = f"reply | call{more}", rules + [f"reply: {text_rule}"]
    elif not syntax.open:                         # the reply is the call: text is what does not start as one
        start, rules[-1] = f"PROSE | call{more}", r"PROSE: /([^{\s](.|\n)*)?/"
    elif opener.startswith("<["):                 # a special token opens a call: text cannot hold it
        start = "TEXT (call TEXT)*" if many else "TEXT (call TEXT)?"
    else:   # a marker of text: what comes before it matches lazily, up to the first one (llguidance's recipe)
        start = f"(head body {closer})* TEXT" if many else f"(head body {closer})? TEXT"
        rules.append(f"head[lazy]: TEXT {opener}")
    return "\n".join(["%llguidance {}", f"start: {start}"] + rules) + "\n"


def call_schema(syntax: Syntax, functions: list[dict]) -> dict:
    """The JSON schema of one call: {"name": its name, <key>: its parameters}, the name first."""
    one = [{"type": "object", "properties": {"name": {"const": f["name"]},
                                             syntax.key: f.get("parameters") or {"type": "object", "properties": {}},
                                             **dict(syntax.extra)},
            "required": ["name", syntax.key], "additionalProperties": False} for f in functions]
    return {**(one[0] if len(one) == 1 else {"anyOf": one}), "x-guidance": JSON_DEFAULTS}


def lit(tokenizer, text: str) -> str:
    """`text` as Lark items: each added token of the tokenizer in it as <[id]>, the rest as strings. Every
    added token, not only those marked special: llguidance takes them all as special (Qwen2.5's
    <tool_call> is not marked so, and as a string its forced text made the matcher refuse the token)."""
    if not text:
        return ""
    specials = {t.content: i for i, t in tokenizer.hf.get_added_tokens_decoder().items()}
    pattern = "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True) if s)
    parts = re.split(f"({pattern})", text) if pattern else [text]
    return " ".join(f"<[{specials[p]}]>" if p in specials else json.dumps(p, ensure_ascii=False) for p in parts if p)


def constraint(syntax, tools, choice, parallel, tokenizer, text_rule=None) -> constraints.Constraint:
    """grammar(...) compiled (ValueError in one line when a function's parameters do not compile)."""
    return constraints.lark(grammar(syntax, tools, choice, parallel, tokenizer, text_rule), kind="tools")


# --- parsing what the model wrote --------------------------------------------------------------------

HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*')


def call_id(syntax: Syntax) -> str:
    if syntax.id_chars:
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(syntax.id_chars))
    return "call_" + secrets.token_hex(12)


class Calls:
    """The output, piece by piece, as events: ("text", s) for content; ("call", index, id, name) when a
    call's name is written; ("args", index, s) for pieces of its arguments' text. `end()` at the end
    flushes what was held back. `calls` [(id, name, arguments text)] holds the calls made so far."""

    def __init__(self, syntax: Syntax):
        self.syntax, self.buf, self.state = syntax, "", "text" if syntax.open else "start"
        self.calls: list[list] = []       # [id, name, arguments text]
        self.call: dict | None = None     # the call being read: {"start": index in buf of its "{"}
        self.sent = 0                     # characters of the current call's arguments sent
        self.after_call = False           # no text since the last call: spaces here are not content

    def add(self, piece: str) -> list[tuple]:
        self.buf += piece
        out: list[tuple] = []
        while self._step(out, final=False):
            pass
        return out

    def end(self) -> list[tuple]:
        out: list[tuple] = []
        while self._step(out, final=True):
            pass
        if self.call is None and self.buf:   # a call cut short (max_tokens) before its name: its text is content
            out.append(("text", (self.syntax.open if self.state in ("object", "array") else "") + self.buf))
        self.buf = ""   # (a call cut short after its name has what it wrote of its arguments)
        return out

    def _step(self, out: list, final: bool) -> bool:
        s, buf = self.syntax, self.buf
        if self.state == "start":            # Llama 3: a call only when the reply starts with one
            stripped = buf.lstrip()
            if not stripped:
                return False
            self.state = "object" if stripped[0] == "{" else "plain"
            return True
        if self.state == "plain":
            if buf:
                out.append(("text", buf))
                self.buf = ""
            return False
        if self.state == "text":
            at = buf.find(s.open)
            hold = 0 if final or at >= 0 else max((n for n in range(min(len(s.open) - 1, len(buf)), 0, -1)
                                                   if buf.endswith(s.open[:n])), default=0)
            between = self.after_call and not buf[:at if at >= 0 else len(buf) - hold].strip()   # after a call
            if at >= 0:
                if at and not between:
                    out.append(("text", buf[:at]))
                self.after_call = False
                self.buf, self.state = buf[at + len(s.open):], "array" if s.array else "object"
                return True
            if between:   # spaces after a call: held until text or another call follows; dropped at the end
                self.buf = "" if final else buf
                return False
            if len(buf) > hold:
                self.after_call = False
                out.append(("text", buf[:len(buf) - hold]))
                self.buf = buf[len(buf) - hold:]
            return False
        if self.state == "array":            # between the calls of an array: [ , ] and spaces
            stripped = buf.lstrip(" \t\r\n[,")
            if stripped.startswith("]"):
                self.buf, self.state, self.after_call = stripped[1:], "text", True
                return True
            if stripped.startswith("{"):
                self.buf, self.state = stripped, "object"
                return True
            self.buf = stripped
            return False
        if self.state == "object":
            return self._object(out)
        if self.state == "closing":          # after a call: its closing marker
            rest = buf.lstrip() if s.close.strip() else buf
            close = s.close.strip() if s.close.strip() else s.close
            if rest.startswith(close):
                self.buf, self.state, self.after_call = rest[len(close):], "text", True
                return True
            if close.startswith(rest) and not final:
                return False
            self.state = "text"
            return True
        return False

    def _object(self, out: list) -> bool:
        """Inside a call's object: the name once written, then the arguments' text as it grows."""
        buf = self.buf
        if self.call is None:
            m = HEAD.match(buf)
            if not m:
                return self._whole(out)
            self.calls.append([call_id(self.syntax), json.loads(m.group(1)), ""])
            out.append(("call", len(self.calls) - 1, self.calls[-1][0], self.calls[-1][1]))
            self.call, self.sent = {"args": m.end()}, 0
        start = self.call["args"]
        start += len(buf) - start - len(buf[start:].lstrip())   # the spaces before the arguments are not theirs
        try:
            _, end = json.JSONDecoder().raw_decode(buf, start)
        except json.JSONDecodeError:
            end = None
        text = buf[start:] if end is None else buf[start:end]
        if len(text) > self.sent:
            out.append(("args", len(self.calls) - 1, text[self.sent:]))
            self.calls[-1][2] += text[self.sent:]
            self.sent = len(text)
        if end is None:
            return False
        close = buf.find("}", end)
        if close < 0:
            return False
        self.buf, self.call = buf[close + 1:], None
        self.state = "array" if self.syntax.array else "closing"
        return True

    def _whole(self, out: list) -> bool:
        """A call whose name does not come first: parsed once its object is whole."""
        try:
            obj, end = json.JSONDecoder().raw_decode(self.buf.lstrip())
        except json.JSONDecodeError:
            return False
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
            self.state = "plain" if not self.syntax.open else "text"
            return True
        args = json.dumps(obj.get(self.syntax.key, obj.get("arguments", {})), ensure_ascii=False)
        self.calls.append([call_id(self.syntax), obj["name"], args])
        i = len(self.calls) - 1
        out += [("call", i, self.calls[i][0], obj["name"]), ("args", i, args)]
        self.buf = self.buf.lstrip()[end:]
        self.state = "array" if self.syntax.array else "closing"
        return True

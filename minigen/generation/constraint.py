"""Output that follows a JSON schema, a regular expression or a grammar: a logits processor per sequence.

A `Constraint` is what a run asks for (Options.constraint): a JSON schema, any JSON object, a regular
expression, or a grammar (Lark, as llguidance writes it; a GBNF grammar from llama.cpp is converted as
llguidance converts it). Making one compiles it with llguidance, so a schema or grammar that does not
compile is a ValueError of one line before any model is loaded. `bind(tokenizer, vocab, eos)` attaches the
tokenizer llguidance masks with (built from tokenizer.json's text, once per tokenizer and vocabulary:
~0.2 s for 49k tokens), sized to the model's logits and ending on the model's EOS ids.

`processor()` makes the logits processor of one sequence: an llguidance matcher that keeps itself in
step with the `tokens` every loop passes its processors (the prompt, the tokens generated, and while
speculative decoding verifies, the drafts kept so far). Its first call sees the prompt's end; later
calls consume the ids it has not seen and roll back what differs (rejected drafts, a draft model's own
guesses), so the same processor works in generate_step, a Batch, the server's scheduler and `verify`.
It sets every token the grammar does not allow to -inf before anything else sees the logits (the
repetition penalty, temperature, top-k / top-p / min-p), so sampling draws from the model's
distribution restricted to the grammar, and greedy output equals unconstrained greedy output wherever
that already follows it. Once the grammar is complete, only EOS is allowed: the loop ends on "eos".

Import cost: llguidance (~0.1 s) is imported on first use, not with this module.
"""
from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from ..errors import MinigenError
from .ids import common_prefix

KINDS = ("json_schema", "json_object", "regex", "grammar")
# Between JSON tokens: a space, or a newline and an indent of up to 20 spaces or tabs (llama.cpp's JSON
# grammars allow two newlines). llguidance's default is any run of whitespace, and a small model can fill
# max_tokens with it. A schema's own "x-guidance" overrides this.
JSON_DEFAULTS = {"whitespace_pattern": r" |\n[ \t]{0,20}"}


@dataclass(frozen=True)
class Constraint:
    """A compiled constraint: `kind` (KINDS, or "lark" for grammars minigen writes itself, as tool calls),
    `source` (what was given, as text), `grammar` (llguidance's, checked). Bound (`bind`): the llguidance
    tokenizer, the vocabulary size V of the model's logits and its EOS ids."""
    kind: str
    source: str
    grammar: str = field(repr=False)
    tokenizer: object = field(default=None, repr=False, compare=False)
    vocab: int = field(default=0, repr=False, compare=False)
    eos: tuple = field(default=(), repr=False, compare=False)

    def bind(self, tokenizer, vocab: int, eos: Sequence[int]) -> "Constraint":
        """This constraint with the llguidance tokenizer of `tokenizer` (a minigen Tokenizer), sized to the
        model's logits (`vocab`) and ending on its EOS ids (sequence.eos_token_ids)."""
        eos = _eos(eos, vocab)
        if not eos:
            raise MinigenError("constraint: the model has no EOS token id, so a complete output could not end")
        return replace(self, tokenizer=ll_tokenizer(tokenizer, vocab, eos), vocab=vocab, eos=eos)

    def processor(self) -> "Follow":
        """A new processor for one sequence (each sequence needs its own: it holds the matcher's state)."""
        if self.tokenizer is None:
            raise MinigenError("constraint: not bound to a tokenizer (Run and the server bind it; "
                               "elsewhere call constraint.bind(tokenizer, vocab, eos) first)")
        return Follow(self)

    def __str__(self) -> str:
        return self.kind


# --- making one ------------------------------------------------------------------------------------------

def json_schema(schema) -> Constraint:
    """Output that is JSON valid against `schema` (a dict, a bool, or its JSON text)."""
    text = schema if isinstance(schema, str) else json.dumps(schema, ensure_ascii=False)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(value, (dict, bool)):
        raise ValueError(f"a JSON schema is an object (or true / false), got {type(value).__name__}")
    return Constraint("json_schema", text, _compile(lambda ll: ll.LLMatcher.grammar_from_json_schema(
        text, defaults=JSON_DEFAULTS)))


def json_object() -> Constraint:
    """Output that is any JSON object (OpenAI's response_format json_object)."""
    c = json_schema({"type": "object"})
    return replace(c, kind="json_object")


def regex(pattern: str) -> Constraint:
    """Output that matches `pattern` whole (Rust's regex syntax: Python's, without lookarounds or backreferences)."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError("a regular expression is a non-empty string")
    return Constraint("regex", pattern, _compile(lambda ll: ll.LLMatcher.grammar_from_regex(pattern)))


def grammar(text: str) -> Constraint:
    """Output that the grammar `text` derives from `start`: Lark as llguidance writes it, or llama.cpp's
    GBNF (`root ::= ...`), converted to Lark as llguidance's gbnf_to_lark does."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a grammar is a non-empty text")

    def make(ll):
        from llguidance.gbnf_to_lark import any_to_lark
        try:
            lark = any_to_lark(text)
        except Exception as e:  # noqa: BLE001 (the converter raises its own kinds, with the position)
            raise ValueError(f"GBNF: {one_line(str(e))}") from None
        return ll.LLMatcher.grammar_from_lark(lark)

    return Constraint("grammar", text, _compile(make, own_position=True))


def lark(text: str, kind: str = "lark") -> Constraint:
    """A Lark grammar minigen writes itself (tool calls): compiled and checked as `grammar`'s."""
    return Constraint(kind, text, _compile(lambda ll: ll.LLMatcher.grammar_from_lark(text), own_position=True))


MAKERS = {"json_schema": json_schema, "json_object": lambda on: json_object(), "regex": regex, "grammar": grammar}


def from_value(value) -> Constraint:
    """Options.constraint as a caller may give it: a Constraint, or one of {"json_schema": schema},
    {"json_object": true}, {"regex": pattern}, {"grammar": text}. ValueError in one line otherwise."""
    if isinstance(value, Constraint):
        return value
    if not (isinstance(value, dict) and len(value) == 1 and next(iter(value)) in MAKERS):
        raise ValueError(f"should be one of {{{', '.join(f'{k!r}: ...' for k in KINDS)}}} (one key), "
                         f"or a Constraint")
    (kind, arg), = value.items()
    if kind == "json_object" and arg is not True:
        raise ValueError("json_object: should be true")
    try:
        return MAKERS[kind](arg)
    except ValueError as e:
        raise ValueError(f"{kind}: {e}") from None


def _compile(make, own_position: bool = False) -> str:
    """llguidance's grammar from make(llguidance), checked (without a tokenizer: the grammar itself).
    `own_position`: an error's "at line(column)" is in the text given (a grammar), not in the grammar
    llguidance made of it (a schema, a regex), and is kept."""
    ll = _llguidance()
    try:
        text = make(ll)
    except ValueError as e:
        raise ValueError(one_line(str(e))) from None
    error = ll.LLMatcher.validate_grammar(text)
    if error:
        raise ValueError(one_line(error if own_position else re.sub(r"^at \d+\(\d+\): ", "", error)))
    return text


def one_line(message: str) -> str:
    """llguidance's message in one line: its echo of the grammar (`   1 | ...` and a caret line) dropped."""
    lines = [ln.strip() for ln in message.splitlines()]
    kept = [ln for ln in lines if ln and not ln.startswith("^") and not (ln[:1].isdigit() and " | " in ln)]
    text = re.sub(r"^at (\d+)\((\d+)\): ", r"line \1, column \2: ", " ".join(kept)) or "does not compile"
    return text if len(text) <= 300 else text[:297] + "..."


def _llguidance():
    try:
        import llguidance
        import llguidance.numpy  # noqa: F401 (fill_next_token_bitmask)
    except ImportError:
        raise MinigenError("constrained output needs the llguidance package (pip install llguidance)") from None
    return llguidance


# --- the tokenizer llguidance masks with -------------------------------------------------------------

_TOKENIZERS: dict = {}        # (id of the tokenizers.Tokenizer, V, eos) -> (that Tokenizer, LLTokenizer)
_TOKENIZERS_LOCK = threading.Lock()


def warm(tokenizer, vocab: int, eos: Sequence[int]) -> None:
    """Build a model's llguidance tokenizer ahead of its first constrained request (a server starting: 0.4 s
    for 49k tokens, 1.7 s for 152k, off the request's time); nothing if it cannot be built, which that
    request then reports."""
    try:
        ll_tokenizer(tokenizer, vocab, _eos(eos, vocab))
    except MinigenError:
        pass


def _eos(eos: Sequence[int], vocab: int) -> tuple:
    return tuple(int(i) for i in eos if 0 <= i < vocab)


def ll_tokenizer(tokenizer, vocab: int, eos: tuple):
    """llguidance's tokenizer for a minigen Tokenizer, made from tokenizer.json's text once (kept while
    the process lives, as the model is): V = the model's logits (ids past the tokenizer's are never allowed)."""
    hf = tokenizer.hf
    key = (id(hf), vocab, eos)
    with _TOKENIZERS_LOCK:
        if key not in _TOKENIZERS:
            ll = _llguidance()
            try:
                made = ll.LLTokenizer(hf.to_str(), n_vocab=vocab, eos_token=list(eos))
            except Exception as e:  # noqa: BLE001 (a tokenizer llguidance cannot read: one line)
                raise MinigenError(f"constraint: llguidance cannot use this tokenizer ({one_line(str(e))})") from None
            _TOKENIZERS[key] = (hf, made)   # holding hf keeps its id from being reused
        return _TOKENIZERS[key][1]


# --- the processor of one sequence -------------------------------------------------------------------

class Follow:
    """The logits processor of one sequence: (scores (V,), tokens so far) -> scores with every token the
    grammar does not allow next at -inf. See the module's docstring for how it follows `tokens`."""

    def __init__(self, constraint: Constraint):
        ll = _llguidance()
        self.matcher = ll.LLMatcher(constraint.tokenizer, constraint.grammar, log_level=0)
        self._check()
        self.vocab, self.eos = constraint.vocab, frozenset(constraint.eos)
        self.bitmask = ll.numpy.allocate_token_bitmask(1, constraint.vocab)    # (1, ceil(V / 32)) int32
        self.fill = ll.numpy.fill_next_token_bitmask
        self.start: int | None = None     # len(tokens) at the first call: where the output starts
        self.fed: list[int] = []          # the output's ids the matcher has consumed

    def __call__(self, scores: np.ndarray, tokens: Sequence[int]) -> np.ndarray:
        if self.start is None:
            self.start = len(tokens)
        self.follow(list(tokens[self.start:]))
        allowed = self.allowed()
        if not allowed.any():
            raise MinigenError("constraint: no token of the vocabulary can continue the output here "
                               f"(after {len(self.fed)} tokens)")
        n = len(scores)   # a draft model's logits may cover fewer ids than the model's
        return np.where(allowed[:n], scores, np.float32(-np.inf)).astype(scores.dtype, copy=False)

    def admits(self, tokens: Sequence[int], draft: Sequence[int]) -> int:
        """How many of `draft`'s first tokens the grammar allows after `tokens` (speculative decoding
        cuts a draft there before verifying it); an EOS counts where the grammar may end."""
        if self.start is None:
            self.start = len(tokens)
        self.follow(list(tokens[self.start:]))
        draft = list(draft)
        n = self.matcher.validate_tokens(draft)
        if n < len(draft) and draft[n] in self.eos:   # llguidance does not count an EOS where the output may end
            head = draft[:n]
            self.matcher.consume_tokens(head)
            ends = self.matcher.is_accepting()
            self.matcher.rollback(len(head))
            n += ends
        self._check()
        return n

    def follow(self, output: list[int]):
        """Bring the matcher to `output`: roll back what differs from what it consumed, consume the rest,
        up to an EOS: the output ends there, and a draft model's guesses past one are never kept (the
        matcher, stopped by an EOS it consumed, was left in a wrong state by rolling it back)."""
        fed = self.fed
        same = len(fed) if output[:len(fed)] == fed else common_prefix(fed, output)
        if same < len(fed):
            if not self.matcher.rollback(len(fed) - same):   # further back than it keeps: from the start
                self.matcher.reset()
                same = 0
            del fed[same:]
        for token in output[same:]:
            if token in self.eos:
                break
            if not self.matcher.consume_token(token):
                self._check()
                raise MinigenError(f"constraint: token {token} does not follow the grammar")
            fed.append(token)

    def allowed(self) -> np.ndarray:
        """(V,) bool: the tokens the grammar allows next."""
        self.fill(self.matcher, self.bitmask)
        self._check()
        return np.unpackbits(self.bitmask.view(np.uint8), bitorder="little")[:self.vocab].view(bool)

    def _check(self):
        if self.matcher.is_error():
            raise MinigenError(f"constraint: {one_line(self.matcher.get_error())}")

"""A conversation with a model: the messages so far, and a KV cache that carries over between turns.

Every turn renders the whole conversation through the chat template, with the generation prompt, and
the model is fed exactly those ids: a reply is the one `generate` gives on that conversation. The
cache still holds what was fed at the previous turn (its prompt and reply), and the new ids start
with the same earlier turns, so only what follows their longest common prefix is computed. The
prefix can end early: a template may render an earlier turn differently once a new one follows
(Qwen3's drops the reasoning of earlier replies), and a reply's text need not encode back to the ids
that were sampled; the cache is then cut back to the prefix and the rest recomputed.

When the conversation outgrows the context, the oldest exchanges (a user message and the replies to
it) are dropped, the system message kept, until the rendered conversation leaves room for the reply
(`max_tokens`, or half the context if that is less) or only the new message is left; a reply that
still reaches the end of the context stops there (finish "context"). A message that does not fit on
its own is refused.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, Sequence

from ..engine.cache import checkpoint, offset, truncate
from ..errors import MinigenError, first_line
from ..files import MiB, atomic_write, read_regular
from .options import Options
from .ids import common_prefix
from .sequence import chat_ids
from .steps import Run


CONVERSATION_LIMIT = 256 * MiB  # a saved conversation (chat --load)


class ChatSession:
    """A conversation with one model. `reply(text)` adds a user message and returns the Reply, which
    streams like a Run; once it ends (or is interrupted, or another call comes first) the text it
    produced is the assistant's message. Options are generate's (max_tokens, temp, ..., max_context:
    options.Options), checked here; `reply`'s override them for one turn."""

    def __init__(self, model, tokenizer, messages: Sequence[dict] = (), system: str | None = None, **options):
        if not tokenizer.chat_template:
            raise MinigenError(f"{model.path}: no chat template (no chat_template.jinja, no chat_template in "
                               f"tokenizer_config.json); a chat needs one")
        self.model, self.tokenizer = model, tokenizer
        self.options = Options.of(**options).for_model(model)
        self.cache = model.make_cache(min(self.options.max_context, 256))
        self.cached: list[int] = []     # the ids whose keys and values the cache holds, in order
        self._open: Reply | None = None
        self.messages = check_messages(list(messages), "messages")
        if system is not None:
            self.set_system(system)

    def reply(self, text: str, **options) -> "Reply":
        """Add a user message and start the reply; `options` override the session's for this turn."""
        self._settle()
        options = self.options.update(**options).for_model(self.model)
        messages, ids, dropped = self.fit(self.messages + [{"role": "user", "content": text}], options)
        keep = self.model.resume(self.cache, common_prefix(self.cached, ids[:-1]), len(ids))   # a snapshot, or 0
        self.cached = self.cached[:keep]
        self._open = Reply(self, Run(self.model, self.tokenizer, ids, options, cache=self.cache), messages, dropped)
        return self._open

    def fit(self, messages: list[dict], options: Options) -> tuple[list[dict], list[int], int]:
        """(messages, their ids, exchanges dropped): the oldest exchanges dropped until the reply has
        room in the context (max_tokens, at most half the context: a huge max_tokens must not erase
        the conversation), or only the newest message is left after the system's. `options` are
        filled in for the model (Options.for_model)."""
        context = options.max_context
        room = min(options.max_tokens, context // 2)
        ids, dropped = chat_ids(self.tokenizer, messages), 0
        while len(ids) + room > context and (shorter := drop_oldest_exchange(messages)) is not None:
            messages, ids, dropped = shorter, chat_ids(self.tokenizer, shorter), dropped + 1
        if len(ids) > context:
            raise MinigenError(f"the message does not fit: rendered alone (with the system message, if any) it is "
                               f"{len(ids)} tokens, more than the context of {context} tokens (--max-context); "
                               f"it was not added")
        return messages, ids, dropped

    def reset(self):
        """Start over, keeping the system message. The cache stays: the next turn reuses its start."""
        self._settle()
        self.messages = self.messages[:1] if has_system(self.messages) else []

    def set_system(self, text: str | None):
        """Set the system message (None removes it); the rest of the conversation stays."""
        self._settle()
        rest = self.messages[1:] if has_system(self.messages) else self.messages
        self.messages = ([{"role": "system", "content": text}] if text is not None else []) + rest

    def save(self, path: str | Path):
        self._settle()
        save_conversation(self.messages, path)

    def _settle(self):
        """End a reply still open, so that the messages include it."""
        if self._open is not None:
            self._open.close()

    def _end_turn(self, reply: "Reply"):
        fed = reply.run.prompt + reply.run.tokens        # every id the model may have been given, in order
        n = truncate(self.cache, offset(self.cache))      # Ctrl-C inside a forward: only some layers were filled
        checkpoint(self.cache)   # recurrent layers: the next turn, which shares this prefix, may return here
        self.cached = fed[:n]
        self.messages = reply.messages + [{"role": "assistant", "content": reply.content}]
        self._open = None


class Reply:
    """One turn's reply: `pieces()` streams it as Run.pieces does; `content` is the text so far, which
    becomes the assistant's message when the reply ends or `close()` is called (after a Ctrl-C)."""

    def __init__(self, session: ChatSession, run: Run, messages: list[dict], dropped: int):
        self.session, self.run, self.messages, self.dropped = session, run, messages, dropped
        self.stats = run.stats      # "prompt" counts only the tokens this turn computed
        self.content = ""
        self.closed = False
        self._stream = None

    def pieces(self) -> Iterator[str]:
        if self.closed:
            return
        self._stream = self.run.pieces()
        try:
            for piece in self._stream:
                self.content += piece
                yield piece
        finally:
            self.close()

    def text(self) -> str:
        for _ in self.pieces():
            pass
        return self.content

    def close(self):
        if not self.closed:
            self.closed = True
            if self._stream is not None:
                self._stream.close()  # a reply left half-read must not feed the cache later
            self.session._end_turn(self)




def has_system(messages: list[dict]) -> bool:
    return bool(messages) and messages[0]["role"] == "system"


def drop_oldest_exchange(messages: list[dict]) -> list[dict] | None:
    """The messages without the first exchange after the system message (its user message and what
    follows up to the next user message); None when no user message would be left after it."""
    head = messages[:1] if has_system(messages) else []
    rest = messages[len(head):]
    following = next((i for i in range(1, len(rest)) if rest[i]["role"] == "user"), None)
    return None if following is None else head + rest[following:]


def check_messages(messages, where: str) -> list[dict]:
    """Copies of the messages, each a dict with string "role" and "content"; MinigenError naming `where`."""
    if not (isinstance(messages, list) and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                               and isinstance(m.get("content"), str) for m in messages)):
        raise MinigenError(f'{where}: expected a JSON list of messages, each {{"role": "...", "content": "..."}}')
    return [dict(m) for m in messages]


def load_conversation(path: str | Path) -> list[dict]:
    """The messages of a conversation saved with `save_conversation` (or written by hand)."""
    text = read_regular(path, CONVERSATION_LIMIT, "conversation file")  # names a directory, a FIFO, ...
    try:
        data = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise MinigenError(f"{path}: not a readable JSON file ({first_line(e)})")
    return check_messages(data, str(path))


def save_conversation(messages: list[dict], path: str | Path):
    """The messages as a JSON list, written whole (files.atomic_write)."""
    with atomic_write(path, "conversation") as tmp:
        tmp.write_text(json.dumps(messages, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")

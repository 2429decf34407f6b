"""Generated ids -> the text a reader sees, as it streams: the streaming detokenizer (the pieces add up to
the tokenizer's decode of the ids) and stop strings, cut where they appear and held back while a piece
could still become one (a stop string can span tokens). `minigen generate`'s Run and the server's replies
both read their text through a `TextStream`.
"""
from __future__ import annotations

from typing import Sequence

from .tokenizer import StreamingDetokenizer


class TextStream:
    """`add(token)` returns the text that token completes (maybe ""); once `stopped` (a stop string was
    reached), nothing more comes; `flush()` at the end gives what was held back."""

    def __init__(self, tokenizer, stops: Sequence[str] = ()):
        self.detok = StreamingDetokenizer(tokenizer)
        self.stops = tuple(s for s in stops if s)
        self.held, self.stopped = "", False

    def add(self, token: int) -> str:
        if self.stopped:
            return ""
        text, self.held, self.stopped = split_at_stop(self.held + self.detok.add(token), self.stops)
        return text

    def flush(self) -> str:
        if self.stopped:
            return ""
        text, self.held, self.stopped = split_at_stop(self.held + self.detok.flush(), self.stops, final=True)
        return text


def split_at_stop(text: str, stops: Sequence[str], final: bool = False) -> tuple[str, str, bool]:
    """(safe to show, held back, stopped): cut at the first stop string; hold back a tail that could
    still become one; at the end (`final`) nothing is held back."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    if hits:
        return text[:min(hits)], "", True
    if final:
        return text, "", False
    hold = max((n for s in stops for n in range(min(len(s) - 1, len(text)), 0, -1)
                if text.endswith(s[:n])), default=0)
    return text[:len(text) - hold], text[len(text) - hold:], False

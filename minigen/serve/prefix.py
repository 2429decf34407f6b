"""KV caches of token-id sequences computed before, so that a request starting the same way (the same
system prompt, the earlier turns of a chat) computes only what follows, within a memory budget.

This is `minigen chat`'s reuse (generation/chat.py) for many conversations at once: when a sequence
finishes, the cache of what it fed the model (its prompt and reply, the last token excepted) is kept
under those ids; a new prompt takes a copy of the entry sharing its longest prefix, cut back to that
prefix (a template may render an earlier reply differently from the ids sampled), and computes the
rest. A copy, because several running requests may start from one entry. Any model's cache can be kept
(cache.LayerCache's `copy`): a hybrid's recurrent layers can return only to the states they hold (the
entry's end, or a snapshot), so a hybrid's entry serves a prompt that continues it whole. Entries are
evicted least recently used first when their bytes pass the budget; an entry that is the start of a newer
one is dropped (the newer one serves it).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from ..engine import cache as caches
from ..generation.ids import common_prefix

MIN_REUSE = 16   # tokens: below this, a copy saves next to nothing


class PrefixCache:
    def __init__(self, config, budget_bytes: int):
        self.config, self.budget = config, budget_bytes
        self.entries: OrderedDict[tuple, list] = OrderedDict()   # ids -> a model's cache, oldest first
        self.bytes = 0
        self.hits = self.reused_tokens = 0

    def lookup(self, ids: Sequence[int], capacity: int) -> tuple[list | None, int]:
        """(a new cache holding the first n ids, n), or (None, 0): at least the last id is left to compute.
        An entry serves the positions every one of its layers can return to (a recurrent layer: its state
        at the end, or a snapshot) that longrope's rule lets a sequence of len(ids) keep (cache.reusable)."""
        best, n = None, 0
        for key, entry in self.entries.items():
            common = caches.reusable(self.config, len(key), common_prefix(key, ids[:len(ids) - 1]), len(ids))
            common = min([common] + [layer.keepable(common) for layer in entry])
            if common > n:
                best, n = key, common
        if best is None or n < MIN_REUSE:
            return None, 0
        self.entries.move_to_end(best)
        self.hits, self.reused_tokens = self.hits + 1, self.reused_tokens + n
        return caches.copy(self.entries[best], n, max(capacity, n)), n

    def store(self, ids: Sequence[int], cache: list):
        """Keep a compact copy of `cache`, which holds the first offset(cache) of `ids`."""
        n = caches.offset(cache)
        if n < MIN_REUSE or self.budget <= 0:
            return
        copy = caches.copy(cache, n, n)
        if copy is None:   # a layer that cannot return to n (a Ctrl-C left the layers at different offsets)
            return
        key = tuple(ids[:n])
        for old in [k for k in self.entries if len(k) <= n and key[:len(k)] == k]:
            self._drop(old)
        size = nbytes(copy)
        if size > self.budget:
            return
        self.entries[key] = copy
        self.bytes += size
        while self.bytes > self.budget:
            self._drop(next(iter(self.entries)))

    def _drop(self, key: tuple):
        self.bytes -= nbytes(self.entries.pop(key))


def nbytes(cache: list) -> int:
    return sum(layer.nbytes for layer in cache)

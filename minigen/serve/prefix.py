"""KV caches of token-id sequences computed before, so that a request starting the same way (the same
system prompt, the earlier turns of a chat) computes only what follows, within a memory budget.

This is `minigen chat`'s reuse (generation/chat.py) for many conversations at once: when a sequence
finishes, the cache of what it fed the model (its prompt and reply, the last token excepted) is kept
under those ids; a new prompt takes a copy of the entry sharing its longest prefix, cut back to that
prefix (a template may render an earlier reply differently from the ids sampled), and computes the
rest. A copy, because several running requests may start from one entry. Entries are evicted least
recently used first when their bytes pass the budget; an entry that is the start of a newer one is
dropped (the newer one serves it).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from ..engine.cache import KVCache, reusable_prefix
from ..generation.speculative import common_prefix

MIN_REUSE = 16   # tokens: below this, a copy saves next to nothing


class PrefixCache:
    def __init__(self, config, budget_bytes: int):
        self.config, self.budget = config, budget_bytes
        self.entries: OrderedDict[tuple, list[KVCache]] = OrderedDict()   # ids -> cache, oldest first
        self.bytes = 0
        self.hits = self.reused_tokens = 0

    def lookup(self, ids: Sequence[int], capacity: int) -> tuple[list[KVCache] | None, int]:
        """(a new cache holding the first n ids, n), or (None, 0): at least the last id is left to compute."""
        best, n = None, 0
        for key in self.entries:
            common = reusable_prefix(self.config, len(key), common_prefix(key, ids[:len(ids) - 1]), len(ids))
            if common > n:
                best, n = key, common
        if best is None or n < MIN_REUSE:
            return None, 0
        self.entries.move_to_end(best)
        self.hits, self.reused_tokens = self.hits + 1, self.reused_tokens + n
        return clone(self.entries[best], n, max(capacity, n)), n

    def store(self, ids: Sequence[int], cache: list[KVCache]):
        """Keep a compact copy of `cache`, which holds the first min(offset) of `ids`. Only attention
        caches: a recurrent layer's state cannot be cut back to a shorter prefix."""
        n = min(layer.offset for layer in cache)
        if n < MIN_REUSE or self.budget <= 0 or not all(type(layer) is KVCache for layer in cache):
            return
        key = tuple(ids[:n])
        for old in [k for k in self.entries if len(k) <= n and key[:len(k)] == k]:
            self._drop(old)
        copy = clone(cache, n, n)
        size = nbytes(copy)
        if size > self.budget:
            return
        self.entries[key] = copy
        self.bytes += size
        while self.bytes > self.budget:
            self._drop(next(iter(self.entries)))

    def _drop(self, key: tuple):
        self.bytes -= nbytes(self.entries.pop(key))


def clone(cache: list[KVCache], n: int, capacity: int) -> list[KVCache]:
    """A new cache with the first n positions of `cache` and room for `capacity` before it grows."""
    out = []
    for layer in cache:
        k, v = layer.fetch()                                                 # (KV, offset, d)
        new = KVCache(k.shape[0], k.shape[2], capacity)
        new.update_and_fetch(k[:, :n], v[:, :n])
        out.append(new)
    return out


def nbytes(cache: list[KVCache]) -> int:
    return sum(layer.keys_t.nbytes + layer.values.nbytes for layer in cache)

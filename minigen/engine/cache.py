"""The per-layer cache. A model's cache is a list, one `LayerCache` per layer, of the kind its token mixer
needs (mixers.MIXERS): for attention, the growing KV cache; for the recurrent layers of hybrids (Gated
DeltaNet, short conv, Mamba2), a fixed-size state (StateCache); for Falcon-H1's layers, both (`Both`).

Every layer cache has the same small interface (`LayerCache`): how many positions it holds (`offset`),
how far back it can be cut (`keepable`) and the cut (`truncate`), a snapshot to return to later
(`checkpoint`), and a copy of its first n positions (`copy`, for the server's prefix cache). What the
mixer reads and writes (keys and values, a state) is the layer kind's own.

The KV cache. A decode step writes one row and reads views of the filled part, so it costs O(current
length); the buffers are only reallocated when full, doubling, never re-concatenated every step. Only
the filled part is ever read, so the buffers start empty rather than zeroed: capacity not yet written
costs no memory (np.zeros would have malloc clear, and so touch, much of it up front). Keys are stored
transposed, (n_kv, head_dim, capacity): the filled part of each head is then a contiguous-row
(head_dim, S) matrix, which makes q · Kᵀ one plain BLAS call (about 5x faster for a decode step than
against a transposed (S, head_dim) view). `update_and_fetch` still hands out keys as (n_kv, S,
head_dim) views, so callers never see the difference. Cutting it back only moves the offset. Large
buffers are in 4 KB pages (pages.py): in NumPy's 2 MB pages, the transposed keys' first
positions would touch every page, and a cache would be resident at its whole capacity.

Rolling back (a rejected speculative token, a chat turn whose template renders earlier turns
differently) is `truncate(cache, n)` on the whole model's cache. A KV layer keeps any n. A recurrent
layer can only return to where its state was kept: `checkpoint(cache)` snapshots every recurrent layer
at the current offset (the last few snapshots are kept), and `truncate(cache, n)` cuts every layer to
the largest m <= n all of them can return to (n itself, a snapshot, or 0) and returns m; the caller
feeds ids[m:n] again. A snapshot costs one copy of the states (Qwen3.5-0.8B: 19 MB, a few ms).

What a cache may keep also depends on the positions' RoPE factors (Phi-3's longrope): `reusable` is
that rule, and `resume` applies it; every caller that feeds a cache goes through them.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from . import pages
from .attention import causal_attention, decode_attention, pooled_decode_attention, slot_runs


class LayerCache(Protocol):
    """What every layer's cache does, whatever it holds."""
    offset: int                                        # positions seen so far

    def keepable(self, n: int) -> int: ...             # the largest m <= n it can be cut back to
    def truncate(self, n: int) -> None: ...            # back to its first n positions (n: keepable)
    def checkpoint(self) -> None: ...                  # keep what it holds now, so truncate may return here
    def copy(self, n: int, capacity: int) -> "LayerCache | None": ...   # a new cache of its first n positions
    @property
    def nbytes(self) -> int: ...


# --- attention: keys and values -------------------------------------------------------------------------

class KVBase:
    """Keys and values of one layer, `offset` positions filled: what KVCache and a pool's slot share. A
    subclass says where the arrays are (`keys_t` (KV, d, capacity), `values` (KV, capacity, d)) and how
    they grow."""
    offset: int

    @property
    def capacity(self) -> int:
        return self.values.shape[1]

    @property
    def nbytes(self) -> int:
        return self.keys_t.nbytes + self.values.nbytes

    def update_and_fetch(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append k, v (n_kv, T, head_dim); return views of all keys and values (n_kv, offset, head_dim)."""
        k_new, v_new = self.extend(k.shape[1])
        k_new[...] = k
        v_new[...] = v
        return self.fetch()

    def extend(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Room for n more positions: views (n_kv, n, head_dim) of their keys and values for the caller
        to fill; the offset moves past them."""
        end = self.offset + n
        if end > self.capacity:
            self._grow(end)
        start, self.offset = self.offset, end
        return self.keys_t[:, :, start:end].transpose(0, 2, 1), self.values[:, start:end]

    def fetch(self) -> tuple[np.ndarray, np.ndarray]:
        """Views (n_kv, offset, head_dim) of all keys and values so far."""
        return self.keys_t[:, :, :self.offset].transpose(0, 2, 1), self.values[:, :self.offset]

    def keepable(self, n: int) -> int:
        return n

    def truncate(self, n: int):
        """Keep the first n positions (0 <= n <= offset); later writes start at n."""
        if not 0 <= n <= self.offset:
            raise ValueError(f"cannot truncate a cache of {self.offset} positions to {n}")
        self.offset = n

    def checkpoint(self):
        """Nothing to keep: any earlier length is a truncate away."""

    def copy(self, n: int, capacity: int) -> "KVCache":
        keys, values = self.fetch()
        new = KVCache(keys.shape[0], keys.shape[2], max(capacity, n))
        new.update_and_fetch(keys[:, :n], values[:, :n])
        return new

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int | None, scale: float,
               softcap: float | None, want_weights: bool = False, on_block=None) -> tuple[np.ndarray, np.ndarray | None]:
        """One sequence's new k and v (T, KV, d) join the cache, and the queries q (T', H, d) of its last
        T' <= T rows attend causally over all of it: each head's output (T', H, d), and the weights
        (H, T', S) when asked (or, with `on_block`, handed over a few rows at a time: causal_attention)."""
        offset = self.offset + len(k) - len(q)                               # the first query's position
        keys, values = self.update_and_fetch(k.transpose(1, 0, 2), v.transpose(1, 0, 2))   # (KV, S, d)
        if len(q) == 1 and not want_weights and on_block is None:           # a decode step: from the buffers
            return decode_attention(q[0], self.keys_t, self.values, self.offset, window, scale, softcap)[None], None
        out, weights = causal_attention(q.transpose(1, 0, 2), keys, values, offset, window, want_weights,
                                        scale, softcap, on_block)            # (H, T', d)
        return out.transpose(1, 0, 2), weights                               # (T', H, d)

    def _grow(self, needed: int):
        raise NotImplementedError


class KVCache(KVBase):
    """A sequence's keys and values of one layer, in arrays of its own."""

    def __init__(self, n_kv: int, head_dim: int, capacity: int = 256):
        self.keys_t = pages.empty((n_kv, head_dim, capacity), np.float32)    # (KV, d, capacity)
        self.values = pages.empty((n_kv, capacity, head_dim), np.float32)    # (KV, capacity, d)
        self.offset = 0

    def _grow(self, needed: int):
        capacity = max(needed, 2 * self.capacity)
        keys_t = pages.empty(self.keys_t.shape[:2] + (capacity,), np.float32)
        values = pages.empty((self.values.shape[0], capacity, self.values.shape[2]), np.float32)
        keys_t[:, :, :self.offset] = self.keys_t[:, :, :self.offset]
        values[:, :self.offset] = self.values[:, :self.offset]
        self.keys_t, self.values = keys_t, values


# --- a batch's attention layers: one array for every sequence ------------------------------------------

class KVPool:
    """The keys and values of one attention layer for every sequence of a batch (generation/batch.py),
    one slot each, in one array: a decode step then attends for all of them at once (`attend`), one
    product over the slots instead of a handful of small ones per sequence. Each sequence sees its slot
    as its layer cache (`PooledKV`). The slots share one capacity, which grows like a KVCache's
    (doubling; each slot copies only its filled part); the slot count doubles when all are taken. The
    arrays start zeroed, not empty as a KVCache's: a pooled product reads past a short slot's end, where
    its zero weights times V must stay zero (0 x a NaN of uninitialised memory would not). pages.zeros
    takes fresh 4 KB pages from the system, touched only when written, so a long sequence beside short
    ones costs little more memory than it would alone (in NumPy's 2 MB pages, every slot in use would be
    resident at the whole capacity). `release` hands a leaving sequence a KVCache of its own."""

    def __init__(self, n_kv: int, head_dim: int, slots: int = 4, capacity: int = 256):
        self.keys_t = pages.zeros((slots, n_kv, head_dim, capacity), np.float32)   # (P, KV, d, C)
        self.values = pages.zeros((slots, n_kv, capacity, head_dim), np.float32)   # (P, KV, C, d)
        self.members: dict[int, PooledKV] = {}                                  # slot -> its cache
        self.first = (slots, capacity)

    @property
    def capacity(self) -> int:
        return self.values.shape[2]

    def take(self, capacity: int) -> "PooledKV":
        """A free slot (the lowest), as an empty cache with room for `capacity` positions."""
        slots = len(self.values)
        free = next((s for s in range(slots) if s not in self.members), slots)
        if free == slots or capacity > self.capacity:
            self._grow(2 * slots if free == slots else slots, max(capacity, self.capacity))
        self.members[free] = member = PooledKV(self, free)
        return member

    def attend(self, members: list["PooledKV"], q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int | None,
               scale: float, softcap: float | None) -> np.ndarray:
        """A decode step of B member sequences: each one's new q (B, H, d), k and v (B, KV, d) join its
        slot, and every q attends over its own keys, in one product per run of neighbouring slots of like
        lengths (attention.slot_runs). Each head's output (B, H, d)."""
        slots, lengths = self.append(members, k, v)                          # (B,) x2
        z = np.empty_like(q)                                                 # (B, H, d)
        for run in slot_runs(tuple(slots.tolist()), tuple(lengths.tolist())):
            z[run] = pooled_decode_attention(q[run], self.keys_t, self.values, slots[run], lengths[run],
                                             window, scale, softcap)
        return z

    def append(self, members: list["PooledKV"], k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One more position for each member: its row of k and v (B, KV, d), written in one go. Returns
        the members' slots and their lengths now, each (B,)."""
        need = max(m.offset for m in members) + 1
        if need > self.capacity:
            self._grow(len(self.values), max(need, 2 * self.capacity))
        slots, at = np.array([m.slot for m in members]), np.array([m.offset for m in members])
        self.keys_t[slots, :, :, at] = k                                     # (B, KV, d) into (P, KV, d, C)
        self.values[slots, :, at] = v                                        # (B, KV, d) into (P, KV, C, d)
        for m in members:
            m.offset += 1
        return slots, at + 1

    def release(self, member: "PooledKV") -> KVCache:
        """The member's keys and values as a KVCache of its own (room for one more position); its slot is free."""
        own = member.copy(member.offset, member.offset + 1)
        del self.members[member.slot]
        if not self.members:   # the batch is empty: its memory goes back (a server idles at its first size)
            self._grow(*self.first)
        return own

    def _grow(self, slots: int, capacity: int):
        keys_t = pages.zeros((slots,) + self.keys_t.shape[1:3] + (capacity,), np.float32)
        values = pages.zeros((slots, self.values.shape[1], capacity, self.values.shape[3]), np.float32)
        for slot, m in self.members.items():   # only what each slot has filled: nothing else is touched
            keys_t[slot, :, :, :m.offset] = self.keys_t[slot, :, :, :m.offset]
            values[slot, :, :m.offset] = self.values[slot, :, :m.offset]
        self.keys_t, self.values = keys_t, values


class PooledKV(KVBase):
    """One sequence's slot of a KVPool, used as its layer cache: its arrays are the pool's, seen through the
    slot, so they follow the pool when it grows."""

    def __init__(self, pool: KVPool, slot: int):
        self.pool, self.slot, self.offset = pool, slot, 0

    @property
    def keys_t(self) -> np.ndarray:
        return self.pool.keys_t[self.slot]                                    # (KV, d, C)

    @property
    def values(self) -> np.ndarray:
        return self.pool.values[self.slot]                                    # (KV, C, d)

    def _grow(self, needed: int):
        self.pool._grow(len(self.pool.values), max(needed, 2 * self.capacity))


def pool(cache: list, pools: list) -> list:
    """`cache` (a whole model's, in place) with each layer that has a pool (pools[i] not None) moved into a
    slot of it: what it holds is copied there. The list stays the caller's."""
    for i, (layer, p) in enumerate(zip(cache, pools)):
        if p is not None and isinstance(layer, KVCache):
            cache[i] = p.take(layer.capacity)
            cache[i].update_and_fetch(*layer.fetch())
    return cache


def unpool(cache: list) -> list:
    """`cache` (in place) with each pooled layer back in arrays of its own, its slot freed."""
    for i, layer in enumerate(cache):
        if isinstance(layer, PooledKV):
            cache[i] = layer.pool.release(layer)
    return cache


# --- recurrent layers: a fixed-size state instead of a growing K/V ------------------------------------

class StateCache:
    """A recurrent layer's state (Gated DeltaNet, short conv, Mamba2): the conv's last K-1 inputs
    (`tail`) and, but for the short conv, the recurrent state; `offset` counts the positions it has
    seen. Its size does not grow with the context, so decode costs the same at any length.

    It cannot be cut back by moving the offset: the state after n tokens is gone once more are fed.
    `checkpoint()` keeps a copy of the state at the current offset (the last `keep` of them), and
    `truncate(n)` restores the one taken at n, or, at 0, starts afresh. A snapshot costs one copy of the
    state (Qwen3.5-0.8B: 1.1 MB per Gated DeltaNet layer, 19 MB for the model); restoring it, one copy back.
    """

    def __init__(self, tail_shape: tuple, state_shape: tuple | None = None, keep: int = 4):
        self.tail = np.zeros(tail_shape, np.float32)                          # (K-1, C)
        self.state = None if state_shape is None else np.zeros(state_shape, np.float32)
        self.offset, self.keep = 0, keep
        self.snapshots: dict[int, tuple] = {}

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for s in [(self.tail, self.state), *self.snapshots.values()] for a in s if a is not None)

    def update(self, tail: np.ndarray, state: np.ndarray | None, n: int):
        """The state after n more positions."""
        self.tail, self.state = tail, state
        self.offset += n

    def checkpoint(self):
        """Keep the state at the current offset, so that truncate() may return here."""
        self.snapshots[self.offset] = (self.tail.copy(), None if self.state is None else self.state.copy())
        for old in sorted(self.snapshots)[:-self.keep]:
            del self.snapshots[old]

    def keepable(self, n: int) -> int:
        """The largest m <= n this layer can be cut back to: n itself if it is the offset or a snapshot,
        else the latest snapshot before n, else 0."""
        return n if n == self.offset else max((s for s in self.snapshots if s <= n), default=0)

    def truncate(self, n: int):
        """Back to the state after the first n positions: the offset itself, a snapshot, or 0."""
        if n == self.offset:
            return
        if n == 0:
            self.tail, self.state = np.zeros_like(self.tail), None if self.state is None else np.zeros_like(self.state)
        elif n in self.snapshots:
            tail, state = self.snapshots[n]
            self.tail, self.state = tail.copy(), None if state is None else state.copy()
        else:
            raise ValueError(f"cannot truncate a recurrent layer at {self.offset} positions to {n}: no snapshot "
                             f"there (it has {sorted(self.snapshots)}); use cache.truncate(cache, n)")
        self.offset = n
        self.snapshots = {s: v for s, v in self.snapshots.items() if s <= n}

    def copy(self, n: int, capacity: int = 0) -> "StateCache | None":
        """A new StateCache at position n, with the snapshots up to it; None unless n is keepable exactly."""
        if self.keepable(n) != n:
            return None
        new = StateCache(self.tail.shape, None if self.state is None else self.state.shape, self.keep)
        new.snapshots = {s: tuple(None if a is None else a.copy() for a in v) for s, v in self.snapshots.items() if s <= n}
        if n == self.offset:
            new.update(self.tail.copy(), None if self.state is None else self.state.copy(), n)
        else:
            new.offset = self.offset   # truncate restores the snapshot at n
            new.truncate(n)
        return new


class Both:
    """Falcon-H1's layers run attention and Mamba2 side by side: the layer's cache is a KV cache (`kv`)
    and a Mamba2 state (`state`), advanced together; each mixer reads its own part."""

    def __init__(self, kv: KVCache, state: StateCache):
        self.kv, self.state = kv, state

    @property
    def offset(self) -> int:
        return self.kv.offset

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes + self.state.nbytes

    def keepable(self, n: int) -> int:
        return self.state.keepable(n)

    def truncate(self, n: int):
        self.state.truncate(n)
        self.kv.truncate(n)

    def checkpoint(self):
        self.state.checkpoint()

    def copy(self, n: int, capacity: int) -> "Both | None":
        state = self.state.copy(n)
        return None if state is None else Both(self.kv.copy(n, capacity), state)


# --- the whole model's cache ---------------------------------------------------------------------------

def truncate(cache: list, n: int) -> int:
    """Cut every layer back to its first n positions, or, when a recurrent layer has no snapshot there, to
    the latest position every layer can return to (0 at worst). Returns the positions kept: the caller
    feeds the tokens after them again."""
    n = min([n] + [layer.keepable(n) for layer in cache])
    for layer in cache:
        layer.truncate(n)
    return n


def checkpoint(cache: list):
    """Snapshot every recurrent layer at the current offset (attention layers need none)."""
    for layer in cache:
        layer.checkpoint()


def copy(cache: list, n: int, capacity: int) -> list | None:
    """A new cache holding the first n positions of `cache` (room for `capacity`), or None where a layer
    cannot return to n (a recurrent one without a snapshot there)."""
    layers = [layer.copy(n, capacity) for layer in cache]
    return None if any(layer is None for layer in layers) else layers


def offset(cache: list) -> int:
    """The positions every layer holds (a Ctrl-C inside a forward may have filled only some)."""
    return min(layer.offset for layer in cache)


# --- what a cache may keep: longrope's rule ------------------------------------------------------------

def reusable(cfg, cached: int, common: int, total: int) -> int:
    """How many positions of a cache whose keys were computed for `cached` positions a forward may keep
    that takes the sequence to `total` positions, when the cache's first `common` positions are the
    sequence's: `common`, unless Phi-3's longrope switch lies between. Longrope rotates every position
    with its long factors once the sequence passes original_max_position_embeddings, and transformers then
    recomputes every cached key with them (Phi3ForCausalLM.prepare_inputs_for_generation): a cache built
    past the switch holds long keys (this rule recomputed them when it was crossed), one below it short
    ones. A sequence reaching past the switch wants long keys at every position, one below it short ones;
    where the kept part could hold the other kind, nothing is kept, and the forward computes the whole
    sequence afresh. (A decode step that crosses the switch is the case common = cached < total.)"""
    return 0 if any(r is not None and r.kind == "longrope" and common <= r.original_max
                    and (cached > r.original_max or total > r.original_max) for r in set(cfg.rope)) else common


def resume(cfg, cache: list, common: int, total: int) -> int:
    """Cut `cache` back to what a forward to `total` positions may keep of its first `common` (the ids they
    hold are the sequence's), by longrope's rule (`reusable`) and what every layer can return to
    (`truncate`). Returns the positions kept: the caller feeds the sequence's ids from there on."""
    return truncate(cache, reusable(cfg, offset(cache), common, total))

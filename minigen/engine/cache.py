"""The per-layer cache: for attention, the growing KV cache, one per layer, preallocated, written at an offset, grown geometrically;
for the recurrent layers of hybrids (Gated DeltaNet, short conv, Mamba2), a fixed-size state (StateCache).

A decode step writes one row and reads views of the filled part, so it costs O(current length);
the buffers are only reallocated when full, doubling, never re-concatenated every step. Only the
filled part is ever read, so the buffers start empty rather than zeroed: capacity not yet written
costs no memory (np.zeros would have malloc clear, and so touch, much of it up front). Cutting it
back (`truncate`, for a conversation whose new turn shares only a prefix with what was computed) only
moves the offset: the rows beyond it are overwritten by the next writes.

Keys are stored transposed, (n_kv, head_dim, capacity): the filled part of each head is then a
contiguous-row (head_dim, S) matrix, which makes q · Kᵀ one plain BLAS call (about 5x faster for a
decode step than against a transposed (S, head_dim) view). `update_and_fetch` still hands out keys
as (n_kv, S, head_dim) views, so callers never see the difference.

Rolling back (a rejected speculative token, a chat turn whose template renders earlier turns
differently) is `truncate(cache, n)` on the whole model's cache: every layer has `offset`,
`truncate(n)` and `keepable(n)`. A KV layer keeps any n (the offset moves). A recurrent layer can
only return to where its state was kept: `checkpoint(cache)` snapshots every recurrent layer at the
current offset (the last few snapshots are kept), and `truncate(cache, n)` cuts every layer to the
largest m <= n all of them can return to (n itself, a snapshot, or 0) and returns m; the caller feeds
ids[m:n] again. A snapshot costs one copy of the states (Qwen3.5-0.8B: 19 MB, a few ms); a miss, the
forward of the tokens between the snapshot and n.
"""
from __future__ import annotations

import numpy as np


class KVCache:
    """Keys and values of one layer; `offset` positions are filled."""

    def __init__(self, n_kv: int, head_dim: int, capacity: int = 256):
        self.keys_t = np.empty((n_kv, head_dim, capacity), np.float32)    # (KV, d, capacity)
        self.values = np.empty((n_kv, capacity, head_dim), np.float32)    # (KV, capacity, d)
        self.offset = 0

    @property
    def capacity(self) -> int:
        return self.values.shape[1]

    def update_and_fetch(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append k, v (n_kv, T, head_dim); return views of all keys and values (n_kv, offset, head_dim)."""
        k_new, v_new = self.extend(k.shape[1])
        k_new[...] = k
        v_new[...] = v
        return self.fetch()

    def extend(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Room for n more positions: views (n_kv, n, head_dim) of their keys and values for the caller
        to fill (a long prompt's row chunks fill theirs on parallel threads); the offset moves past them."""
        end = self.offset + n
        if end > self.capacity:
            self._grow(end)
        start, self.offset = self.offset, end
        return self.keys_t[:, :, start:end].transpose(0, 2, 1), self.values[:, start:end]

    def fetch(self) -> tuple[np.ndarray, np.ndarray]:
        """Views (n_kv, offset, head_dim) of all keys and values so far."""
        return self.keys_t[:, :, :self.offset].transpose(0, 2, 1), self.values[:, :self.offset]

    def truncate(self, n: int):
        """Keep the first n positions (0 <= n <= offset); later writes start at n."""
        if not 0 <= n <= self.offset:
            raise ValueError(f"cannot truncate a cache of {self.offset} positions to {n}")
        self.offset = n

    def _grow(self, needed: int):
        capacity = max(needed, 2 * self.capacity)
        keys_t = np.empty(self.keys_t.shape[:2] + (capacity,), np.float32)
        values = np.empty((self.values.shape[0], capacity, self.values.shape[2]), np.float32)
        keys_t[:, :, :self.offset] = self.keys_t[:, :, :self.offset]
        values[:, :self.offset] = self.values[:, :self.offset]
        self.keys_t, self.values = keys_t, values


# --- a batch's attention layers: one array for every sequence ------------------------------------------

class KVPool:
    """The keys and values of one attention layer for every sequence of a batch (generation/batch.py),
    one slot each, in one array: a decode step then attends for all of them at once, one product over
    the slots (attention.pooled_decode_attention) instead of a handful of small ones per sequence.
    Each sequence sees its slot as a KVCache (`PooledKV`). The slots share one capacity, which grows
    like a KVCache's (doubling; each slot copies only its filled part); the slot count doubles when
    all are taken. The arrays start zeroed, not empty as a KVCache's: a pooled product reads past a
    short slot's end, where its zero weights times V must stay zero (0 x a NaN of uninitialised memory
    would not). np.zeros takes fresh pages from the system, touched only when written, so a long
    sequence beside short ones costs little more memory than it would alone. `release` hands a
    leaving sequence its own KVCache."""

    def __init__(self, n_kv: int, head_dim: int, slots: int = 4, capacity: int = 256):
        self.keys_t = np.zeros((slots, n_kv, head_dim, capacity), np.float32)   # (P, KV, d, C)
        self.values = np.zeros((slots, n_kv, capacity, head_dim), np.float32)   # (P, KV, C, d)
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
        own = KVCache(self.keys_t.shape[1], self.keys_t.shape[2], member.offset + 1)
        own.update_and_fetch(*member.fetch())
        del self.members[member.slot]
        if not self.members:   # the batch is empty: its memory goes back (a server idles at its first size)
            self._grow(*self.first)
        return own

    def _grow(self, slots: int, capacity: int):
        keys_t = np.zeros((slots,) + self.keys_t.shape[1:3] + (capacity,), np.float32)
        values = np.zeros((slots, self.values.shape[1], capacity, self.values.shape[3]), np.float32)
        for slot, m in self.members.items():   # only what each slot has filled: nothing else is touched
            keys_t[slot, :, :, :m.offset] = self.keys_t[slot, :, :, :m.offset]
            values[slot, :, :m.offset] = self.values[slot, :, :m.offset]
        self.keys_t, self.values = keys_t, values


class PooledKV(KVCache):
    """One sequence's slot of a KVPool, used as its KVCache (the arrays are the pool's, seen through
    the slot, so they follow the pool when it grows)."""

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


# --- recurrent layers: a fixed-size state instead of a growing K/V ------------------------------------

class StateCache:
    """A recurrent layer's state (Gated DeltaNet, short conv, Mamba2): the conv's last K-1 inputs
    (`tail`) and, but for the short conv, the recurrent state; `offset` counts the positions it has
    seen. Its size does not grow with the context, so decode costs the same at any length.

    It cannot be cut back by moving the offset: the state after n tokens is gone once more are fed.
    `checkpoint()` keeps a copy of the state at the current offset (the last `keep` of them), and
    `truncate(n)` restores the one taken at n, or, at 0, starts afresh. Callers cut the whole model's
    cache with `truncate(cache, n)`, which keeps as much as every layer can restore and says how much
    that is; what was not kept is recomputed by feeding those tokens again. A snapshot costs one copy
    of the state (Qwen3.5-0.8B: 1.1 MB per Gated DeltaNet layer, 19 MB for the model); restoring it, one copy back.
    """

    def __init__(self, tail_shape: tuple, state_shape: tuple | None = None, keep: int = 4):
        self.tail = np.zeros(tail_shape, np.float32)                          # (K-1, C)
        self.state = None if state_shape is None else np.zeros(state_shape, np.float32)
        self.offset, self.keep = 0, keep
        self.snapshots: dict[int, tuple] = {}

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


class ParallelCache(KVCache):
    """Falcon-H1's layers run attention and Mamba2 side by side: a KVCache that also holds the Mamba2
    part's StateCache (`ssm`), the two advanced together."""

    def __init__(self, n_kv: int, head_dim: int, capacity: int, ssm: StateCache):
        super().__init__(n_kv, head_dim, capacity)
        self.ssm = ssm

    def checkpoint(self):
        self.ssm.checkpoint()

    def keepable(self, n: int) -> int:
        return self.ssm.keepable(n)

    def truncate(self, n: int):
        self.ssm.truncate(n)
        super().truncate(n)


# --- one cache per layer, of the layer's kind -----------------------------------------------------

def delta_net_cache(cfg, capacity: int = 0) -> StateCache:
    m = cfg.delta_net
    conv = 2 * m.key_heads * m.key_dim + m.value_heads * m.value_dim
    return StateCache((m.conv_kernel - 1, conv), (m.value_heads, m.key_dim, m.value_dim))


def short_conv_cache(cfg, capacity: int = 0) -> StateCache:
    return StateCache((cfg.short_conv.kernel - 1, cfg.hidden_size))


def mamba_cache(cfg, capacity: int = 0) -> StateCache:
    m = cfg.mamba
    return StateCache((m.conv_kernel - 1, m.inner + 2 * m.groups * m.state_size), (m.heads, m.head_dim, m.state_size))


CACHES = {   # per token mixer: the layer's cache
    "attention": lambda cfg, capacity: KVCache(cfg.n_kv_heads, cfg.head_dim, capacity),
    "gated_delta": delta_net_cache,
    "short_conv": short_conv_cache,
    "mamba2": mamba_cache,
    "attention+mamba2": lambda cfg, capacity: ParallelCache(cfg.n_kv_heads, cfg.head_dim, capacity, mamba_cache(cfg)),
}


def make_cache(cfg, capacity: int = 256) -> list:
    """One cache per layer of the model `cfg` (a Config), of the kind its token mixer needs."""
    return [CACHES[cfg.mixer(i)](cfg, capacity) for i in range(cfg.n_layers)]


def truncate(cache: list, n: int) -> int:
    """Cut every layer back to its first n positions, or, when a recurrent layer (StateCache) has no
    snapshot there, to the latest position every layer can return to (0 at worst). Returns the
    positions kept: the caller feeds the tokens after them again."""
    n = min([n] + [layer.keepable(n) for layer in cache if hasattr(layer, "keepable")])
    for layer in cache:
        layer.truncate(n)
    return n


def checkpoint(cache: list):
    """Snapshot every recurrent layer at the current offset (attention layers need none)."""
    for layer in cache:
        if hasattr(layer, "checkpoint"):
            layer.checkpoint()


# --- what a cache may keep: longrope's rules ---------------------------------------------------------

def must_recompute(cfg, offset: int, n_new: int) -> bool:
    """Whether the cache has to be rebuilt before feeding n_new tokens at `offset`: longrope switches
    to its long factors once the sequence passes original_max_position_embeddings, and transformers
    then recomputes every cached key with them (Phi3ForCausalLM.prepare_inputs_for_generation)."""
    return any(r is not None and r.kind == "longrope" and 0 < offset <= r.original_max < offset + n_new
               for r in set(cfg.rope))


def reusable_prefix(cfg, cached: int, common: int, total: int) -> int:
    """How many positions of a cache holding `cached` a sequence of `total` ids may keep when its first
    `common` ids are the cached ones: all `common`, unless longrope's switch lies between. Keys cached
    past the switch were computed with the long factors (must_recompute sees to it), below it with the
    short ones; a sequence reaching past it wants the long ones at every position, one below it the
    short ones. Then nothing is kept, and the new forward computes the whole sequence afresh."""
    return 0 if any(r is not None and r.kind == "longrope" and common <= r.original_max
                    and (cached > r.original_max or total > r.original_max) for r in set(cfg.rope)) else common


# --- a batch's caches: attention layers in shared pools -----------------------------------------------

def make_pools(cfg) -> list:
    """Per layer of the model `cfg`: a KVPool for a batch's sequences if it is an attention layer, else None."""
    return [KVPool(cfg.n_kv_heads, cfg.head_dim) if cfg.mixer(i) == "attention" else None
            for i in range(cfg.n_layers)]


def pool(cache: list, pools: list) -> list:
    """`cache` (a whole model's, in place) with each attention layer moved into a slot of its pool:
    what it holds is copied there. The list stays the caller's."""
    for i, (layer, p) in enumerate(zip(cache, pools)):
        if p is not None and type(layer) is KVCache:
            cache[i] = p.take(layer.capacity)
            cache[i].update_and_fetch(*layer.fetch())
    return cache


def unpool(cache: list) -> list:
    """`cache` (in place) with each pooled layer back in arrays of its own, its slot freed."""
    for i, layer in enumerate(cache):
        if isinstance(layer, PooledKV):
            cache[i] = layer.pool.release(layer)
    return cache

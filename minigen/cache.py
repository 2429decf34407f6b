"""The growing KV cache: one per layer, preallocated, written at an offset, grown geometrically.

A decode step writes one row and reads views of the filled part, so it costs O(current length);
the buffers are only reallocated when full, doubling, never re-concatenated every step.
"""
from __future__ import annotations

import numpy as np


class KVCache:
    """Keys and values of one layer, (n_kv, capacity, head_dim) float32; `offset` rows are filled."""

    def __init__(self, n_kv: int, head_dim: int, capacity: int = 256):
        self.keys = np.zeros((n_kv, capacity, head_dim), np.float32)
        self.values = np.zeros((n_kv, capacity, head_dim), np.float32)
        self.offset = 0

    @property
    def capacity(self) -> int:
        return self.keys.shape[1]

    def update_and_fetch(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append k, v (n_kv, T, head_dim); return views of all keys and values (n_kv, offset, head_dim)."""
        end = self.offset + k.shape[1]
        if end > self.capacity:
            self._grow(end)
        self.keys[:, self.offset:end] = k
        self.values[:, self.offset:end] = v
        self.offset = end
        return self.keys[:, :end], self.values[:, :end]

    def _grow(self, needed: int):
        capacity = max(needed, 2 * self.capacity)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = np.zeros((old.shape[0], capacity, old.shape[2]), np.float32)
            new[:, :self.offset] = old[:, :self.offset]
            setattr(self, name, new)


def make_cache(n_layers: int, n_kv: int, head_dim: int, capacity: int = 256) -> list[KVCache]:
    return [KVCache(n_kv, head_dim, capacity) for _ in range(n_layers)]

"""Ways to look at or change a forward pass from outside (minigen.inspect): a `Hooks` object passed to the
forward is called between its steps. Each method gets the layer index and an array and returns the array
to go on with; these defaults change nothing. A forward with hooks keeps every row on the calling thread,
so that each method sees whole arrays."""
from __future__ import annotations

import numpy as np


class Hooks:
    def z(self, layer: int, z: np.ndarray) -> np.ndarray:
        """(T, H, d): each head's output, before the output projection (TransformerLens's hook_z)."""
        return z

    def attn_out(self, layer: int, a: np.ndarray) -> np.ndarray:
        """(T, D): what the attention block (or the layer's other token mixer) adds to the residual stream."""
        return a

    def mlp_out(self, layer: int, m: np.ndarray) -> np.ndarray:
        """(T, D): what the MLP block adds to the residual stream."""
        return m

    def resid(self, layer: int, x: np.ndarray) -> None:
        """(T, D): the residual stream after the layer (read only)."""

    def qkv(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """(T, H, d), (T, KV, d), (T, KV, d): an attention layer's queries, keys and values of this
        forward's rows, as attention takes them (after any q/k norm, RoPE and query scale; read only)."""

"""The tensor fixes: one table (FIXES), on whole tensors in HF's (out, in) orientation (a vector: its rows).

Each takes (w, cfg), cfg the checkpoint's engine Config (heads, KV heads, the recurrent layers' sizes). A
family's `fix` (families.py) applies one when a Hugging Face checkpoint is loaded; a GGUF entry's `fixes`
(gguf/families.py) when a GGUF is converted into one (undoing what llama.cpp's converter did; those may also
change the tensor's shape)."""
from __future__ import annotations

import numpy as np

from ..errors import MinigenError


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute` (conversion/llama.py): per head, interleaved RoPE pairs -> HF's two halves."""
    rows = w.shape[0]
    # (n_head, head_dim/2, 2, ...) -> (n_head, 2, head_dim/2, ...)
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def neox_interleave(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's GPT-NeoX qkv reorder: rows [all q; all k; all v] -> HF's per-head [q; k; v]."""
    d = w.shape[0] // 3 // n_head
    # (3, H, d, ...) -> (H, 3, d, ...)
    return w.reshape(3, n_head, d, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape)


def neox_group(w: np.ndarray, n_head: int) -> np.ndarray:
    """GPT-NeoX's checkpoints interleave q, k, v per head: rows (H, 3, d) -> (3, H, d), minigen's
    [all q; all k; all v] (what llama.cpp also writes)."""
    d = w.shape[0] // 3 // n_head
    return np.ascontiguousarray(w.reshape(n_head, 3, d, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape))


def gated_q(w: np.ndarray, heads: int, kv: int) -> np.ndarray:
    """Qwen3.5's q_proj holds each head's query and output gate side by side, rows (H, 2, d): the fused
    [q_proj; k_proj; v_proj] becomes [all q; k; v; all gates], so that q, k, v lead as in every family."""
    d = w.shape[0] // (2 * heads + 2 * kv)
    qg = w[:2 * heads * d].reshape(heads, 2, d, *w.shape[1:])
    return np.ascontiguousarray(np.concatenate([qg[:, 0].reshape(heads * d, *w.shape[1:]), w[2 * heads * d:],
                                                qg[:, 1].reshape(heads * d, *w.shape[1:])]))


def untile(w: np.ndarray, groups: int, per_group: int, axis: int = 0) -> np.ndarray:
    """Inverse of llama.cpp's _reorder_v_heads (conversion/qwen.py): Qwen3.5 keeps its value heads grouped by
    key head ([k0's v0..v(r-1)], [k1's ...]); llama.cpp tiles them ([v0 of every k], [v1 of every k], ...)
    along `axis` so that ggml can broadcast the key heads. Each head spans the axis's length / (G r) entries."""
    x = np.moveaxis(w, axis, 0)
    d = x.shape[0] // (groups * per_group)
    # (r, G, d, ...) -> (G, r, d, ...)
    x = x.reshape(per_group, groups, d, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)
    return np.ascontiguousarray(np.moveaxis(x, 0, axis))


def a_log(w: np.ndarray) -> np.ndarray:
    """A_log back from llama.cpp's ssm_a = -exp(A_log) (Mamba2, Gated DeltaNet), as a vector."""
    if not np.all(w < 0):
        raise MinigenError("holds values that are not negative, so it is not llama.cpp's -exp(A_log)")
    return np.log(-w.astype(np.float64)).astype(np.float32).reshape(-1)


def _untile_heads(w: np.ndarray, c, axis: int = 0) -> np.ndarray:
    """Qwen3.5's value heads along `axis` back in HF's order (c: the Config, its delta_net sizes)."""
    dn = c.delta_net
    return untile(w, dn.key_heads, dn.value_heads // dn.key_heads, axis)


def _untile_qkv(w: np.ndarray, c) -> np.ndarray:
    """in_proj_qkv's rows (or the conv's channels) [q; k; v]: only v's heads were tiled."""
    qk = 2 * c.delta_net.key_heads * c.delta_net.key_dim
    return np.concatenate([w[:qk], _untile_heads(w[qk:], c)])


FIXES = {
    "conv1d": lambda w, c: np.ascontiguousarray(w.T),               # GPT-2's Conv1D stores (in, out)
    "neox_qkv": lambda w, c: neox_group(w, c.n_heads),              # HF GPT-NeoX -> minigen's fused order
    "neox_per_head": lambda w, c: neox_interleave(w, c.n_heads),    # llama.cpp's GPT-NeoX -> HF's
    "unpermute_q": lambda w, c: unpermute(w, c.n_heads),            # llama.cpp's Llama q -> HF's
    "unpermute_k": lambda w, c: unpermute(w, c.n_kv_heads),         # ... and k, by KV heads
    "gated_q": lambda w, c: gated_q(w, c.n_heads, c.n_kv_heads),    # Qwen3.5's q and output gate, per head
    "depthwise": lambda w, c: np.ascontiguousarray(w.reshape(w.shape[0], w.shape[-1])),  # (C, 1, K) -> (C, K)
    # llama.cpp's recurrent layers, undone when a GGUF is converted (GGUF rows x columns in, HF's shape out)
    "channels": lambda w, c: w.reshape(w.shape[0], 1, w.shape[1]),  # ssm_conv1d, shortconv (C, K) -> (C, 1, K)
    "vector": lambda w, c: w.reshape(-1),                            # Mamba2's ssm_d (H, 1), ssm_norm (G, I/G)
    "a_log": lambda w, c: a_log(w),                                  # Mamba2's ssm_a = -exp(A_log), (H, 1)
    "dn_rows": lambda w, c: _untile_heads(w, c),                     # Qwen3.5's z, b, a rows, dt_bias
    "dn_a_log": lambda w, c: _untile_heads(a_log(w), c),             # ... its ssm_a
    "dn_qkv": lambda w, c: _untile_qkv(w, c),                        # ... in_proj_qkv: v's rows
    "dn_conv": lambda w, c: _untile_qkv(w, c).reshape(w.shape[0], 1, w.shape[1]),  # ... the conv: v's channels
    "dn_out": lambda w, c: _untile_heads(w, c, axis=1),              # ... out_proj: v's columns
}

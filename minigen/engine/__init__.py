"""The forward pass, and nothing else: the config dataclasses, norms/activations/RoPE, attention, the
per-layer cache, the row-split threads, and the decoder that ties them together.

May import: numpy, itself, and `minigen.errors`. This is the part a reader of the seed articles comes
for: `model.py` is the decoder, `attention.py` the softmax(q·kᵀ/√d)·v, `cache.py` the growing K/V store.
"""

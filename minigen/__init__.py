"""minigen: a minimal autoregressive text-generation engine in NumPy.

    model = minigen.load("weights/smollm2-135m-instruct")
    logits = model.logits(model.tokenizer.encode("Hello"))   # (T, vocab) float32
"""
from .errors import MinigenError
from .model import Model, load

__all__ = ["load", "Model", "MinigenError"]

"""minigen: a minimal autoregressive text-generation engine in NumPy.

    model, tokenizer = minigen.load("weights/smollm2-135m-instruct")
    logits = model.logits(tokenizer.encode("Hello"))                # (T, vocab) float32
    text = minigen.generate(model, tokenizer, "Hello", max_tokens=20)  # or minigen.stream(...) for pieces
"""
from .checkpoint import load
from .errors import MinigenError
from .generate import generate, stream
from .model import Model

__all__ = ["load", "Model", "MinigenError", "generate", "stream"]

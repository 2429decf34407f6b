"""minigen: a minimal autoregressive text-generation engine in NumPy.

    model = minigen.load("weights/smollm2-135m-instruct")
    logits = model.logits(model.tokenizer.encode("Hello"))   # (T, vocab) float32
    text = minigen.generate(model, "Hello", max_tokens=20)    # or minigen.stream(...) for pieces
"""
from .errors import MinigenError
from .generate import generate, stream
from .model import Model, load

__all__ = ["load", "Model", "MinigenError", "generate", "stream"]

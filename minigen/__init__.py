"""minigen: a minimal autoregressive text-generation engine in NumPy.

    model, tokenizer = minigen.load("weights/smollm2-135m-instruct")
    logits = model.logits(tokenizer.encode("Hello"))                # (T, vocab) float32
    text = minigen.generate(model, tokenizer, "Hello", max_tokens=20)  # or minigen.stream(...) for pieces
    texts = minigen.generate_batch(model, tokenizer, ["Hello", "Bonjour"], max_tokens=20)  # one batch
    minigen.score(model, tokenizer, "Hello world").logprobs           # each token's log-prob (the first: None)

The public names load on first use (PEP 562), so `import minigen.cli` imports nothing heavy before the
CLI can catch a Ctrl-C (cli/__init__.py).
"""
import os

# Before NumPy loads OpenBLAS: its idle threads then spin 2^18 cycles (~0.1 ms) after a call, not ~0.1 s
# (parallel.py).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "18")

__all__ = ["load", "Model", "MinigenError", "generate", "stream", "generate_batch", "score"]
_WHERE = {"load": "resolve", "Model": "engine.model", "MinigenError": "errors",
          "generate": "generation.steps", "stream": "generation.steps", "generate_batch": "generation.batch",
          "score": "generation.scores"}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'minigen' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value  # found once: the next use is an ordinary attribute
    return value


def __dir__():
    return sorted(list(globals()) + __all__)

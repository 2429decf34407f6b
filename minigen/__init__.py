"""minigen: a minimal autoregressive text-generation engine in NumPy.

    model, tokenizer = minigen.load("weights/smollm2-135m-instruct")
    logits = model.logits(tokenizer.encode("Hello"))                # (T, vocab) float32
    text = minigen.generate(model, tokenizer, "Hello", max_tokens=20)  # or minigen.stream(...) for pieces
    texts = minigen.generate_batch(model, tokenizer, ["Hello", "Bonjour"], max_tokens=20)  # one batch
"""
import os

# Before NumPy loads OpenBLAS: its idle threads then spin ~1.5 ms after a call, not ~0.1 s (parallel.py).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "22")

from .checkpoint.resolve import load  # noqa: E402
from .errors import MinigenError  # noqa: E402
from .generation.steps import generate, stream  # noqa: E402
from .generation.batch import generate_batch  # noqa: E402
from .engine.model import Model  # noqa: E402

__all__ = ["load", "Model", "MinigenError", "generate", "stream", "generate_batch"]

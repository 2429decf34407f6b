"""Results as plain data: JSON text of NumPy values, tokens and prompt positions with their text.

Every inspection result is a dict of JSON types whose fields the docs list; token ids come with their
text ({"id", "text"}), positions in the prompt with theirs ({"index", "text"}).
"""
from __future__ import annotations

import json
import math

import numpy as np


def as_json(result: dict) -> str:
    """The result as JSON text: NumPy arrays and scalars as lists and numbers, NaN as null."""
    return json.dumps(_plain(result), ensure_ascii=False)


def _plain(x):
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return None if not math.isfinite(float(x)) else float(x)
    return x


def token_json(tok, i: int) -> dict:
    return {"id": int(i), "text": token_text(tok, i)}


def token_text(tok, i: int) -> str:
    return tok.token_strings([int(i)])[0] if int(i) < tok.vocab_size else f"<id {int(i)}>"


def position_json(tokens: list[str], i: int) -> dict:
    return {"index": int(i), "text": tokens[i]}


def with_text(tok, items: list[dict]) -> list[dict]:
    return [{**t, "text": token_text(tok, t["id"])} for t in items]

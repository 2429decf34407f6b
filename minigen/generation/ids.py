"""Token ids as generation takes them: a prompt given as ids, checked (`token_ids`), and how much two id
sequences share (`common_prefix`: what of a cache holding one another may keep)."""
from __future__ import annotations

from typing import Sequence as Ids

from ..errors import OptionError, is_int, short


def token_ids(prompt) -> list[int]:
    """A prompt given as ids: a sequence of integers (Python or NumPy), nothing else."""
    if isinstance(prompt, (str, bytes, bytearray, dict)) or not hasattr(prompt, "__iter__"):
        raise OptionError("prompt", f"should be a string or a list of token ids, got {short(prompt, 40)}")
    ids = list(prompt)
    bad = next((i for i in ids if not is_int(i)), None)
    if bad is not None:
        raise OptionError("prompt", f"token ids should be integers, got {short(bad, 40)}")
    return [int(i) for i in ids]


def common_prefix(a: Ids[int], b: Ids[int]) -> int:
    """How many leading ids a and b share (how much of a cache holding a's ids a sequence b may keep)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n

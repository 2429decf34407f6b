"""The exceptions minigen raises for bad input (a checkpoint, a file, a flag), and the small helpers its
one-line messages are made with. The readers every input file goes through are in minigen.files.

May import: numpy (for the number checks) and nothing of minigen.
"""
from __future__ import annotations

import math

import numpy as np


class MinigenError(Exception):
    """A one-line, user-facing error. The CLI prints it without a traceback and exits non-zero."""


class OptionError(MinigenError):
    """A bad value for one option of a run (`top_p`, `seed`, ...): the CLI reports it as a usage error
    (exit 2) naming the flag."""

    def __init__(self, option: str, message: str):
        super().__init__(f"{option}: {message}")
        self.option, self.message = option, message


def short(v, n: int = 60) -> str:
    """repr(v) cut to n characters, for quoting a bad value in a one-line error."""
    text = repr(v)
    return text if len(text) <= n else text[:n - 3] + "..."


def is_int(v) -> bool:
    """An integer that JSON or a caller gave (NumPy's too), not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def is_number(v) -> bool:
    """An int or float (NumPy's too), not a bool."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def is_finite(v) -> bool:
    """A number that is a finite float, or an int that fits one (10**400 does not: float() overflows)."""
    if not is_number(v):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def is_positive(v) -> bool:
    """A finite number > 0."""
    return is_finite(v) and v > 0


def first_line(e: BaseException) -> str:
    """An exception's message cut to its first line (a library's multi-line message in a one-line error)."""
    line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return line if len(line) <= 200 else line[:197] + "..."

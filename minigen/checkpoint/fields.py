"""Typed reads of config.json fields, each error naming the file and the field: what config.py, rope.py
and the families' own readers (families.py) read a checkpoint's config with."""
from __future__ import annotations

from ..errors import MinigenError, is_finite, is_int, is_positive, short


class Fields:
    """Typed reads of config.json fields, each error naming the file and the field."""

    def __init__(self, raw: dict, where: str):
        self.raw, self.where = raw, where

    def _first(self, names, default, check, what):
        for name in names:
            value = self.raw.get(name)
            if value is not None:
                if not check(value):
                    raise MinigenError(f"{self.where}: field {name!r} should be {what}, got {short(value)}")
                return value
        if default is ...:
            raise MinigenError(f"{self.where}: missing required field {names[0]!r}")
        return default

    def int(self, *names, default=...) -> int:
        """A positive integer no larger than 2**53 (past that, sizes turned into floats overflow)."""
        return self._first(names, default, lambda v: is_int(v) and 0 < v <= 2**53, "a positive integer")

    def float(self, *names, default=...) -> float:
        v = self._first(names, default, is_positive, "a positive number")
        return v if v is None else float(v)

    def number(self, *names, default=...) -> float:
        """A finite number of any sign."""
        v = self._first(names, default, is_finite, "a number")
        return v if v is None else float(v)

    def nullable(self, read, name: str, default):
        """`read(name)`, except that a field present and null means None (no window, no cap)."""
        if name in self.raw and self.raw[name] is None:
            return None
        return read(name, default=default)

    def bool(self, *names, default=...) -> bool:
        return self._first(names, default, lambda v: isinstance(v, bool), "true or false")

    def str(self, *names, default=...) -> str:
        return self._first(names, default, lambda v: isinstance(v, str), "a string")

    def dict(self, *names) -> dict:
        return dict(self._first(names, {}, lambda v: isinstance(v, dict), "an object"))

    def list(self, *names, default=...) -> list:
        return self._first(names, default, lambda v: isinstance(v, list), "a list")

    def strings(self, name: str) -> list:
        return self._first((name,), [], lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
                           "a list of strings")

    def check(self, name: str, ok, what: str):
        """The field's value if present, not null, and `ok(value)`; None if absent or null."""
        return self._first((name,), None, ok, what)

    def token_id(self, name: str) -> int | None:
        return self._first((name,), None, lambda v: is_int(v) and v >= 0, "a token id (an integer >= 0)")

    def token_ids(self, name: str) -> tuple:
        v = self._first((name,), None, lambda v: (is_int(v) and v >= 0) or (
            isinstance(v, list) and all(is_int(i) and i >= 0 for i in v)), "a token id or a list of them")
        return () if v is None else tuple(v) if isinstance(v, list) else (v,)

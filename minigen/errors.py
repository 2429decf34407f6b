"""The one exception minigen raises for bad input (a checkpoint, a file, a flag), and the readers every
input file goes through, so that a bad file is reported the same way whatever it holds.

A file is read only if it is a regular file (a FIFO would block, /dev/zero never ends, a directory is
no file) and no larger than a limit given by the caller, in one bounded read: nothing is read before
that is known. JSON is parsed strictly (no NaN/Infinity where a format forbids them, no duplicate keys
where it says so) and every way Python's parser can fail (deep nesting, a 5,000-digit number, bad
UTF-8) becomes one MinigenError naming the file. No message ever quotes the file's bytes.
"""
from __future__ import annotations

import gc
import json
import math
import os
import stat
from pathlib import Path

import numpy as np

MiB = 1 << 20
JSON_LIMIT = 16 * MiB  # config.json, generation_config.json, tokenizer_config.json, index files


class MinigenError(Exception):
    """A one-line, user-facing error. The CLI prints it without a traceback and exits non-zero."""


class OptionError(MinigenError):
    """A bad value for one option of a run (`top_p`, `seed`, ...): the CLI reports it as a usage error
    (exit 2) naming the flag."""

    def __init__(self, option: str, message: str):
        super().__init__(f"{option}: {message}")
        self.option, self.message = option, message


def open_regular(file: str | os.PathLike, what: str = "file"):
    """(binary file object, size) of a regular file; MinigenError naming it otherwise. Opened without
    blocking (a FIFO would wait for a writer), then checked with fstat: what is checked is what is read."""
    file = Path(file)
    try:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise MinigenError(f"{file}: cannot read the {what} ({e.strerror or e})")
    f = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        f.close()
        raise MinigenError(f"{file}: the {what} is {_kind(st.st_mode)}, not a regular file")
    return f, st.st_size


def read_regular(file: str | os.PathLike, limit: int, what: str = "file") -> bytes:
    """The whole content of a regular file of at most `limit` bytes, in one bounded read."""
    f, size = open_regular(file, what)
    with f:
        if size > limit:
            raise MinigenError(f"{file}: the {what} is {size:,} bytes, more than minigen reads ({limit:,})")
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise MinigenError(f"{file}: cannot read the {what} ({e.strerror or e})")
    if len(data) > limit:  # grew while we read it
        raise MinigenError(f"{file}: the {what} is larger than minigen reads ({limit:,} bytes)")
    return data


def read_bounded(file: str | os.PathLike, limit: int, what: str = "file") -> bytes:
    """At most `limit` bytes of a file, a pipe, a FIFO or a device (a prompt from `<(cmd)` is a pipe),
    refusing directories and anything longer (/dev/zero never ends). A FIFO nobody writes to reads as
    empty rather than blocking: it is opened without blocking, then read blocking."""
    file = Path(file)
    try:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise MinigenError(f"{file}: cannot read the {what} ({e.strerror or e})")
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise MinigenError(f"{file}: the {what} is a directory")
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise MinigenError(f"{file}: cannot read the {what} ({e.strerror or e})")
    finally:
        os.close(fd)
    if len(data) > limit:
        raise MinigenError(f"{file}: the {what} is longer than minigen reads ({limit:,} bytes)")
    return data


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket or other special file"


def decode_utf8(data: bytes, where: str, what: str = "text") -> str:
    """UTF-8 text, with the offset of the first bad byte (never the byte itself) when it is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MinigenError(f"{where}: {what} is not valid UTF-8 (bad byte at offset {e.start})")


def parse_json(text: str | bytes, where: str, *, constants: bool = True, unique_keys: bool = False):
    """Parse JSON text; MinigenError naming `where` on any failure. `constants=False` refuses NaN and
    Infinity (not JSON, though Python writes them); `unique_keys=True` refuses an object with a key twice."""
    if isinstance(text, bytes):
        text = decode_utf8(text, where, "the file")

    def bad_constant(name):
        raise ValueError(f"{name} is not a JSON value")

    def pairs(items):
        obj = dict(items)
        if len(obj) < len(items):
            seen = set()
            raise ValueError(f"duplicate key {short(next(k for k, _ in items if k in seen or seen.add(k)))}")
        return obj

    collecting = gc.isenabled()
    gc.disable()  # the cyclic GC runs over every object parsed so far, again and again: 2-3x the time
    try:
        return json.loads(text, parse_constant=None if constants else bad_constant,
                          object_pairs_hook=pairs if unique_keys else None)
    except json.JSONDecodeError as e:
        raise MinigenError(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})")
    except RecursionError:
        raise MinigenError(f"{where}: not valid JSON (nested too deeply)")
    except ValueError as e:  # over-long integers, refused constants, duplicate keys
        raise MinigenError(f"{where}: not valid JSON ({first_line(e)})")
    finally:
        if collecting:
            gc.enable()


def read_json_object(file: Path, limit: int = JSON_LIMIT) -> dict:
    """A JSON file that must hold an object; MinigenError naming the file otherwise."""
    data = parse_json(read_regular(file, limit, "JSON file"), str(file))
    if not isinstance(data, dict):
        raise MinigenError(f"{file}: expected a JSON object")
    return data


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


def is_real(v) -> bool:
    """A finite number (NaN, infinity and ints past float's range are refused: 10**400 overflows float())."""
    if not is_number(v):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def first_line(e: BaseException) -> str:
    """An exception's message cut to its first line (a library's multi-line message in a one-line error)."""
    line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return line if len(line) <= 200 else line[:197] + "..."

"""Reading input files boundedly and writing output files safely: every file minigen reads or writes
goes through here, so that a bad file is reported the same way whatever it holds.

Reading. A file is read only if it is a regular file (a FIFO would block, /dev/zero never ends, a
directory is no file) and no larger than a limit given by the caller, in one bounded read: nothing is
read before that is known. It is opened without blocking and then checked with fstat (what is checked
is what is read); whatever is there instead, a directory, a FIFO, a device, a socket, a broken or looping
symbolic link, a file minigen may not read, is named in one MinigenError with the file's path. JSON is
parsed strictly (no NaN/Infinity where a format forbids them, no duplicate keys where it says so) and
every way Python's parser can fail (deep nesting, a 5,000-digit number, bad UTF-8) becomes one
MinigenError naming the file. No message ever quotes the file's bytes.

Writing. Every file minigen writes for a user (attention dumps, HTML pages, converted checkpoints,
conversations) goes through `atomic_write` (or `atomic_dir`): the data is written to a temporary sibling
and renamed onto the target only when complete, so Ctrl-C, an error or a full disk leaves nothing
behind; and a target that exists but is not a regular file (a device such as /dev/null, a FIFO, a
directory, a socket) is refused before any work, since minigen may run as root and renaming over a
device node replaces it.

May import: minigen.errors only.
"""
from __future__ import annotations

import errno
import gc
import json
import os
import shutil
import stat
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import MinigenError, first_line, short

MiB = 1 << 20
JSON_LIMIT = 16 * MiB  # config.json, generation_config.json, tokenizer_config.json, index files


# --- reading --------------------------------------------------------------------------------------------

def open_regular(file: str | os.PathLike, what: str = "file"):
    """(binary file object, size) of a regular file; MinigenError naming it and what is there otherwise."""
    fd, st = _open(file, what, regular=True)
    return os.fdopen(fd, "rb"), st.st_size


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
    fd, _ = _open(file, what, regular=False)
    try:
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


def _open(file: str | os.PathLike, what: str, regular: bool) -> tuple[int, os.stat_result]:
    """(file descriptor, its fstat) of what `file` names, opened without blocking (a FIFO would wait for a
    writer); a directory (and, if `regular`, anything but a regular file) is refused before any read.
    The check comes before os.fdopen, which refuses a directory with a bare IsADirectoryError."""
    try:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise MinigenError(f"{file}: cannot read the {what} ({_why(file, e)})")
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode) or (regular and not stat.S_ISREG(st.st_mode)):
        os.close(fd)
        raise MinigenError(f"{file}: the {what} is {kind(st.st_mode)}" + (", not a regular file" if regular else ""))
    return fd, st


def _why(file, e: OSError) -> str:
    """Why a file cannot be opened, saying what is there when that is the reason."""
    if e.errno == errno.ENOENT and os.path.islink(file):
        return f"a symbolic link to {short(os.readlink(file), 80)}, which does not exist"
    if e.errno == errno.ELOOP:
        return "a symbolic link that leads to itself"
    return e.strerror or str(e)


def what_is_at(path: str | os.PathLike) -> str:
    """What is at `path`, for a message: "a FIFO", "a directory", "a symbolic link to 'x', which does not
    exist", "nothing"."""
    try:
        return kind(os.stat(path).st_mode)
    except OSError as e:
        return _why(path, e) if os.path.lexists(path) else "nothing"


def kind(mode: int) -> str:
    """What a stat mode says is there, for a message: "a directory", "a FIFO", ..."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


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


def read_json(file: str | os.PathLike, limit: int = JSON_LIMIT, what: str = "JSON file"):
    """Any JSON value from a regular file of at most `limit` bytes; MinigenError naming the file otherwise."""
    return parse_json(read_regular(file, limit, what), str(file))


# --- writing --------------------------------------------------------------------------------------------

def check_target(path: str | os.PathLike, what: str = "file") -> Path:
    """The target as a Path, if minigen may create or replace it; MinigenError naming it otherwise."""
    path = Path(path)
    try:
        st = os.stat(path)  # follows symlinks: a link to /dev/null is a device
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise MinigenError(f"{path}: cannot write here ({e.strerror or e})")
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device, FIFO or socket)"
        raise MinigenError(f"{path}: is {kind}; minigen only writes a new {what} or replaces a regular one")
    if not path.parent.is_dir():
        raise MinigenError(f"{path}: directory {path.parent} does not exist")
    return path


class OutputFile:
    """A file to be written whole. The temporary sibling is created at once, so a path that cannot be
    written fails before any work; fill `tmp`, then `commit()` renames it onto the target. Leaving the
    `with` block without committing (an error, Ctrl-C, SIGTERM) removes it and leaves the target as it was.

        with OutputFile("attn.npz", "attention dump") as out:
            ...long work...; np.savez(out.tmp, ...); out.commit()
    """

    def __init__(self, path: str | os.PathLike, what: str = "file"):
        self.path, self.what = check_target(path, what), what
        self.tmp = _sibling(self.path)
        try:
            os.close(os.open(self.tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))  # the umask applies
        except OSError as e:
            raise MinigenError(f"{self.path}: cannot write in {self.path.parent} ({e.strerror or e})")

    def commit(self):
        try:
            check_target(self.path, self.what)  # still not a device: one may have appeared meanwhile
            os.replace(self.tmp, self.path)
        except OSError as e:
            raise MinigenError(f"{self.path}: could not write the {self.what} ({e.strerror or e})")
        finally:
            self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> "OutputFile":
        return self

    def __exit__(self, *exc):
        self.tmp.unlink(missing_ok=True)
        return False


@contextmanager
def atomic_write(path: str | os.PathLike, what: str = "file") -> Iterator[Path]:
    """with atomic_write(path) as tmp: write to tmp -> renamed onto path when the block ends normally;
    on any exception (Ctrl-C and SIGTERM included) tmp is removed and path is left as it was."""
    with OutputFile(path, what) as out:
        try:
            yield out.tmp
        except OSError as e:
            raise MinigenError(f"{out.path}: could not write the {what} ({e.strerror or e})")
        out.commit()


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """with atomic_dir(out) as tmp: fill the directory tmp -> renamed to `out` (which must not exist or be
    empty) when the block ends normally; on any exception tmp and everything in it is removed."""
    out = Path(path)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MinigenError(f"{out}: already exists and is not an empty directory; choose a new one")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = _sibling(out)
        os.mkdir(tmp, 0o777)  # the umask applies, as to any new directory
    except OSError as e:
        raise MinigenError(f"{out}: cannot create it ({e.strerror or e})")
    try:
        yield tmp
        if out.is_dir():
            out.rmdir()  # empty (checked above); rename cannot replace a directory portably
        os.rename(tmp, out)
    except OSError as e:  # typically: another process made `out` meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
        raise MinigenError(f"{out}: cannot move the result into place ({e.strerror or e})")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _sibling(path: Path) -> Path:
    """A hidden temporary name beside `path`: .NAME.RANDOM.tmp (git-ignored as *.tmp)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")

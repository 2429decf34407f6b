"""Writing output files safely: whole or not at all, and only ever in place of a regular file.

Every file minigen writes for a user (attention dumps, HTML pages, converted checkpoints) goes through
`atomic_write` (or `atomic_dir`): the data is written to a temporary sibling and renamed onto the target
only when complete, so Ctrl-C, an error or a full disk leaves nothing behind; and a target that exists
but is not a regular file (a device such as /dev/null, a FIFO, a directory, a socket) is refused before
any work, since minigen may run as root and renaming over a device node replaces it.
"""
from __future__ import annotations

import os
import shutil
import stat
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import MinigenError


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

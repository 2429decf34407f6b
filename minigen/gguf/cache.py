"""A GGUF converted once: `--model FILE.gguf` and the default model are converted (float32) into the weights
directory on first use and found there afterwards. The one place that decides whether a conversion is there
and current, makes it (the directory appears only when complete; when two processes convert at once, either
result is used), and removes what an earlier version of the same file left.

Slow work is reported through callbacks the caller gives: `note(message)` for one-line notes, and
`progress` for a progress bar (convert.Progress); without them nothing is said.

    weights_dir()/gguf/<name>-<key>/     a GGUF file's conversion; key hashes its path, size and mtime
    weights_dir()/gguf/<name>-<key>-files/  what a GGUF run as stored reads beside the file (gguf/direct.py):
                                         config.json, generation_config.json, the tokenizer files; no weights
    weights_dir()/smollm2-135m-instruct/ the default model (default_model.py)
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable

from ..errors import MinigenError
from ..files import atomic_dir
from .convert import Plan, Progress, Result, _write_json, convert_gguf, read_plan

CONVERTER_VERSION = 2  # part of every conversion's marker: a conversion made by an older converter is redone
MARKER = "minigen-source.json"  # written into each conversion: what it was made from, by which converter
Note = Callable[[str], None]


def weights_dir() -> Path:
    """The repository's `weights/` in a source checkout, else ~/.cache/minigen/weights; MINIGEN_WEIGHTS moves it."""
    if os.environ.get("MINIGEN_WEIGHTS"):
        return Path(os.environ["MINIGEN_WEIGHTS"])
    repo = Path(__file__).resolve().parent.parent.parent
    if (repo / "pyproject.toml").is_file() and (repo / "weights").is_dir():  # a source (editable) checkout
        return repo / "weights"
    return Path.home() / ".cache" / "minigen" / "weights"


def gguf_cache_dir() -> Path:
    """Where converted GGUFs live: <weights dir>/gguf."""
    return weights_dir() / "gguf"


def is_converted(path: Path, any_version: bool = False) -> bool:
    """A complete conversion by this version of minigen's converter (or, with any_version, by any)."""
    if not ((path / "config.json").is_file() and (path / "model.safetensors").is_file()):
        return False
    if any_version:
        return True
    try:
        return json.loads((path / MARKER).read_text(encoding="utf-8")).get("converter") == CONVERTER_VERSION
    except (OSError, ValueError, AttributeError):
        return False


def convert_once(source: Path, out: Path, marker: dict, progress: Progress | None = None,
                 before: Callable[[], None] | None = None) -> tuple[Result, float] | None:
    """Convert SOURCE into OUT (float32) with `marker` (+ the converter's version) written beside it, unless a
    current conversion is there: (result, seconds), or None when none was needed. The file is read and checked
    whole before `before()` is called (a damaged file fails first, with nothing announced or written)."""
    if is_converted(out):
        return None
    plan = read_plan(source)
    if before:
        before()
    start = time.perf_counter()
    try:
        text = json.dumps({**marker, "converter": CONVERTER_VERSION}, indent=2) + "\n"
        result = convert_gguf(source, out, "float32", progress, plan=plan, extra_files={MARKER: text})
    except MinigenError:
        if is_converted(out):  # another process converted it at the same time: use theirs
            return None
        raise
    return result, time.perf_counter() - start


def gguf_checkpoint(source: Path, note: Note | None = None, progress: Progress | None = None) -> Path:
    """The converted checkpoint of a GGUF file, converting it on first use (and after the file changes)."""
    note = note or _silent
    identity = _identity(source)
    key = hashlib.sha256(json.dumps({**identity, "converter": CONVERTER_VERSION}, sort_keys=True).encode()).hexdigest()[:12]
    out = gguf_cache_dir() / f"{_slug(source.stem)}-{key}"
    # beside a progress bar, said before; otherwise said once it worked, so that a file damaged in its tensor
    # data (found only while converting) still gives a one-line error
    announce = lambda: note(f"converting {source.name} into {out} (float32, done once for this file)")  # noqa: E731
    done = convert_once(source, out, identity, progress, before=announce if progress else None)
    if done is not None:
        result, seconds = done
        note(f"converted {source.name} into {out} (float32, done once for this file) in {seconds:.1f} s "
             f"({result.nbytes / 1e6:.0f} MB)")
        _remove_stale(out, identity["path"], note)
    return out


FILES_VERSION = 1   # part of the files directory's marker: a change to what it holds makes it again


def gguf_files(source: Path, note: Note | None = None) -> tuple[Path, Plan]:
    """(the directory of a GGUF's non-weight files, its checked plan without tokenizer files), making the
    directory on first use (and after the file changes). The plan is what gguf/direct.py builds params from."""
    identity = {**_identity(source), "kind": "files"}
    key = hashlib.sha256(json.dumps({**identity, "files": FILES_VERSION}, sort_keys=True).encode()).hexdigest()[:12]
    out = gguf_cache_dir() / f"{_slug(source.stem)}-{key}-files"
    if (out / "config.json").is_file() and (out / MARKER).is_file():
        return out, _plan(source, tuple(identity.items()))
    plan = read_plan(source)
    try:
        with atomic_dir(out) as tmp:
            _write_json(tmp / "config.json", dict(plan.config, torch_dtype="float32", dtype="float32"))
            _write_json(tmp / "generation_config.json", plan.generation)
            for name, text in plan.tokenizer_files.items():
                (tmp / name).write_text(text, encoding="utf-8")
            _write_json(tmp / MARKER, {**identity, "files": FILES_VERSION})
    except MinigenError:
        if not (out / MARKER).is_file():   # else another process made it at the same time: use theirs
            raise
    _remove_stale(out, identity["path"], note or _silent, "files")   # (making them takes ~1 s: not announced)
    return out, plan


@lru_cache(maxsize=4)
def _plan(source: Path, identity: tuple) -> Plan:
    """read_plan without tokenizer files, once per process for a file unchanged (`identity`): resolving a
    --model and loading it each want it (Qwen2.5's header and vocabulary: ~1 s)."""
    return read_plan(source, tokenizer=False)


def _identity(source: Path) -> dict:
    st = source.stat()
    return {"path": str(source.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _slug(stem: str) -> str:
    return re.sub(r"[^\w.-]+", "_", stem)[:80] or "model"


def _remove_stale(keep: Path, source_path: str, note: Note, kind: str | None = None) -> None:
    """Conversions (or, kind "files", files directories) of earlier versions of the same file: they would
    never be used again."""
    for d in keep.parent.iterdir():
        marker = d / MARKER
        if d == keep or not marker.is_file():
            continue
        try:
            made = json.loads(marker.read_text(encoding="utf-8"))
            stale = made.get("path") == source_path and made.get("kind") == kind
        except (OSError, ValueError, AttributeError):
            continue
        if stale:
            shutil.rmtree(d, ignore_errors=True)
            note(f"removed {d}, the {'files' if kind else 'conversion'} of an earlier version of that file")


def _silent(message: str) -> None:
    pass

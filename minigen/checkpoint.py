"""Loading a checkpoint directory: config.json, the weights, generation_config.json -> a Model, and
the tokenizer files -> a Tokenizer. `minigen.load(path)` returns both, as mlx-lm's `load` does.
"""
from __future__ import annotations

from pathlib import Path

from .config import load_config
from .errors import MinigenError, read_json_object
from .families import FAMILIES
from .layers import activation
from .model import Model
from .parallel import release_free_heap
from .tokenizer import Tokenizer
from .weights import load_params


def load(path: str | Path) -> tuple[Model, Tokenizer]:
    """(model, tokenizer) of a Hugging Face checkpoint directory; MinigenError naming the file at fault."""
    path = Path(path)
    if not path.is_dir():
        raise MinigenError(f"{path}: no such checkpoint directory")
    tokenizer = Tokenizer.from_dir(path)  # before the weights: its parsing peak then adds to nothing
    release_free_heap()  # what the tokenizer's JSON parse left in malloc's heap: ~16 MB for the default model
    return load_model(path), tokenizer


def load_model(path: str | Path) -> Model:
    """The Model alone: config, float32 weights, generation config."""
    path = Path(path)
    cfg = load_config(path)
    activation(cfg.act)  # fail at load, not mid-forward, on an unknown activation
    params = load_params(path, cfg, FAMILIES[cfg.model_type])
    return Model(cfg, params, generation_config(path), path)


def generation_config(path: Path) -> dict:
    file = path / "generation_config.json"
    return read_json_object(file) if file.is_file() else {}

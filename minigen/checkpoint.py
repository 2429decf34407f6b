"""Loading a checkpoint directory: config.json, the weights, generation_config.json -> a Model, and
the tokenizer files -> a Tokenizer. `minigen.load(path)` returns both, as mlx-lm's `load` does.
"""
from __future__ import annotations

from os import PathLike
from pathlib import Path

from .config import load_config, parse_generation_config
from .errors import MinigenError, read_json_object
from .families import FAMILIES
from .layers import activation
from .model import Model
from .tokenizer import Tokenizer
from .weights import load_params


def load(path: str | Path) -> tuple[Model, Tokenizer]:
    """(model, tokenizer) of a Hugging Face checkpoint directory; MinigenError naming the file at fault."""
    path = checkpoint_dir(path)
    tokenizer = Tokenizer.from_dir(path)  # before the weights: its parsing peak then adds to nothing
    return load_model(path), tokenizer


def load_model(path: str | Path) -> Model:
    """The Model alone: config, float32 weights, generation config."""
    path = checkpoint_dir(path)
    cfg = load_config(path)
    activation(cfg.act)  # fail at load, not mid-forward, on an unknown activation
    params = load_params(path, cfg, FAMILIES[cfg.model_type])
    return Model(cfg, params, generation_config(path), path)


def checkpoint_dir(path) -> Path:
    if not isinstance(path, (str, PathLike)):
        raise MinigenError(f"a checkpoint path should be a string or a path, got {type(path).__name__}")
    path = Path(path)
    if not path.is_dir():
        raise MinigenError(f"{path}: no such checkpoint directory")
    return path


def generation_config(path: Path) -> dict:
    file = path / "generation_config.json"
    if not (file.exists() or file.is_symlink()):
        return {}
    return parse_generation_config(read_json_object(file), str(file))

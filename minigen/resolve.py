"""Loading a checkpoint, named the three ways people have one: a Hugging Face checkpoint directory, a GGUF
file, or a hub id. `resolve(spec)` turns any of them into a directory (converting a GGUF once into a cache,
fetching a hub id through the Hugging Face cache); `minigen.load(spec)` returns (model, tokenizer) from it,
as mlx-lm's `load` does. Every command's --model goes through `resolve`.

Above both checkpoint/ (a directory's files) and gguf/ (a GGUF converted once), which it ties together.
May import: checkpoint, gguf, engine, text, errors, files; huggingface_hub (when a hub id is fetched).

    weights/smollm2-135m-instruct           a directory: config.json, *.safetensors, tokenizer files
    SmolLM2-135M-Instruct.Q4_1.gguf         a GGUF: run as stored (gguf/direct.py: each matrix in the file's own
                                            type), its config and tokenizer files made once into
                                            <weights dir>/gguf/<name>-<key>-files/, where key hashes the file's
                                            path, size and mtime (a changed file makes them again): gguf/cache.py;
                                            `minigen convert` still makes a float32 directory for those who want one
    (none)                                  the default model (gguf/default_model.py)
    HuggingFaceTB/SmolLM2-360M-Instruct     a hub id: the files minigen reads, from the Hugging Face cache, fetched
                                            into it when the network is allowed (HF_HUB_OFFLINE=1: cache only)
    org/name/file.gguf                      a GGUF file of a hub repository: fetched, then as a GGUF
"""
from __future__ import annotations

import os
from os import PathLike
import re
from dataclasses import dataclass
from pathlib import Path

from .checkpoint.config import load_config, parse_generation_config
from .checkpoint.families import FAMILIES
from .checkpoint.stored import check_activations, check_quantize, quantized, with_int8_activations
from .checkpoint.weights import load_params
from .engine.model import Model
from .engine.quant import warm
from .engine.parallel import release_free_heap
from .errors import MinigenError
from .files import read_json_object, what_is_at
from .gguf.cache import Note, gguf_files
from .gguf.convert import Progress
from .gguf.direct import gguf_params
from .gguf.default_model import PACKAGE, default_gguf
from .text.tokenizer import Tokenizer

# what minigen reads from a hub repository (model-*.safetensors: shards; not consolidated.safetensors duplicates)
HUB_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "chat_template.jinja", "model.safetensors", "model.safetensors.index.json",
             "model-*.safetensors"]
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(/[\w./-]+\.gguf)?")


@dataclass(frozen=True)
class Resolved:
    """What a --model value named, and the directory minigen loads for it."""
    path: Path
    kind: str      # "directory" | "gguf" | "hub" | "hub-gguf" | "default"
    origin: str    # one line for `minigen info`: where it came from
    gguf: Path | None = None   # a GGUF run as stored: the file (path then holds its config and tokenizer files)


def load(spec: str | PathLike, dtype: str | None = None, quantize: str | None = None,
         activations: str | None = None) -> tuple[Model, Tokenizer]:
    """(model, tokenizer) of a checkpoint directory, a GGUF file or a hub id; MinigenError naming the
    file at fault. (The default model: `load(gguf.default_model.default_model_path())`.) A GGUF's first
    conversion or a download happens silently: `resolve(spec, note, progress)` first to hear of it.
    Weights are kept as stored (float16 and bfloat16 matrices in 16 bits) unless dtype="float32";
    quantize="Q8_0" (Q4_0, Q4_K, ...: checkpoint/stored.py) quantizes the matrices at load.
    activations="int8": products with Q4_0 ... Q8_0, Q2_K, Q4_K ... Q6_K and IQ4 matrices round their activations to int8
    per block of 32 and use integer dot products, as llama.cpp does (faster, not exact; default: exact)."""
    if not isinstance(spec, (str, PathLike)):
        raise MinigenError(f"minigen.load: give a checkpoint directory, a .gguf file or a hub id (a string or "
                           f"a path), got {type(spec).__name__}")
    return load_resolved(resolve(spec), dtype, quantize, activations)


def load_resolved(resolved: Resolved, dtype: str | None = None, quantize: str | None = None,
                  activations: str | None = None) -> tuple[Model, Tokenizer]:
    """(model, tokenizer) of what `resolve` found: a checkpoint directory, or a GGUF run as stored."""
    activations = check_activations(activations)
    if activations and dtype == "float32":
        raise MinigenError("--activations int8 multiplies matrices kept in a stored type: not with --dtype float32")
    tokenizer = Tokenizer.from_dir(resolved.path)  # before the weights: its parsing peak then adds to nothing
    release_free_heap()  # what the tokenizer's JSON parse left in malloc's heap: ~16 MB for the default model
    if resolved.gguf is not None:
        model = load_gguf(resolved.gguf, dtype, quantize, int8=bool(activations))
    else:
        model = load_model(resolved.path, dtype, quantize, int8=bool(activations))
    if activations:
        model.params = with_int8_activations(model.params, str(resolved.gguf or resolved.path))
    return model, tokenizer


def load_gguf(source: str | Path, dtype: str | None = None, quantize: str | None = None, int8: bool = False) -> Model:
    """The Model of a GGUF file, its matrices kept in the file's own types (gguf/direct.py); dtype="float32":
    every tensor dequantized, the values a conversion holds; quantize: the float32 values quantized. int8:
    the model will multiply with int8 activations (their kernels load meanwhile: quant.warm)."""
    quantize = check_quantize(quantize)
    files, plan = gguf_files(Path(source))
    if quantize:
        warm([quantize], int8)
    params = gguf_params(plan, "float32" if quantize else dtype, int8)
    if quantize:
        params = quantized(params, quantize)
    release_free_heap()
    return Model(plan.model_config, params, generation_config(files), Path(source))


def load_model(path: str | Path, dtype: str | None = None, quantize: str | None = None, int8: bool = False) -> Model:
    """The Model alone, from a checkpoint directory: config, weights (as stored, or float32 with
    dtype="float32", or quantized to `quantize` at load), generation config. int8 as load_gguf's."""
    quantize = check_quantize(quantize)
    path = checkpoint_dir(path)
    cfg = load_config(path)
    if quantize:
        warm([quantize], int8)
    params = load_params(path, cfg, FAMILIES[cfg.model_type], "float32" if quantize else dtype, int8)
    if quantize:
        params = quantized(params, quantize)
        release_free_heap()   # the float32 matrices the quantized ones replace
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


# --- resolving --model ----------------------------------------------------------------------------------

def resolve(spec: str | Path | None, note: Note | None = None, progress: Progress | None = None) -> Resolved:
    """The checkpoint directory `spec` names (None: the default model). `note` receives one-line messages
    about slow work (a conversion, a download), `progress` drives a conversion's progress bar (gguf.convert's
    Progress); without them nothing is said (the CLI gives both)."""
    note = note or (lambda message: None)
    if spec is None:
        source = default_gguf()
        files, _ = gguf_files(source, note)
        return Resolved(files, "default", f"the default model, {source.name} from {PACKAGE}, run as stored", source)
    path = Path(spec)
    if path.is_dir():
        if path.suffix.lower() == ".gguf" and not os.path.lexists(path / "config.json"):
            raise MinigenError(f"{path}: is a directory, not a GGUF file (nor a checkpoint directory: no config.json)")
        return Resolved(path, "directory", f"checkpoint directory {path}")
    if os.path.lexists(path) and not path.is_file():  # a FIFO, a device, a socket, a broken symbolic link
        raise MinigenError(f"{path}: is {what_is_at(path)}, not a checkpoint directory or a GGUF file")
    if path.is_file():
        if not _is_gguf(path):
            raise MinigenError(f"{path}: not a checkpoint directory or a GGUF file")
        files, _ = gguf_files(path, note)
        return Resolved(files, "gguf", f"GGUF file {path}, run as stored (config and tokenizer files in {files})", path)
    if _HUB_ID.fullmatch(str(spec)) and not str(spec).startswith(("./", "../")):
        return _hub(str(spec), note, progress)
    raise MinigenError(f"{spec}: no such checkpoint directory or GGUF file (nor a hub id like org/name)")


def _is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError as e:
        raise MinigenError(f"{path}: cannot read it ({e.strerror or e})")


# --- hub ids: the Hugging Face cache -------------------------------------------------------------------------

def hub_cache_dir() -> Path:
    """The Hugging Face cache, as huggingface_hub finds it (read here, at call time, not at its import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache",
                                                     "huggingface")
    return Path(home) / "hub"


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _hub(spec: str, note: Note, progress: Progress | None) -> Resolved:
    """org/name -> its snapshot in the HF cache; org/name/file.gguf -> that file, then converted."""
    parts = spec.split("/")
    repo, filename = "/".join(parts[:2]), "/".join(parts[2:]) or None
    cache, offline = hub_cache_dir(), hub_offline()
    where = f"the Hugging Face cache {cache}"
    try:
        from huggingface_hub import hf_hub_download, snapshot_download
        if filename:
            file = Path(hf_hub_download(repo, filename, cache_dir=cache, local_files_only=offline))
        else:
            if not offline and not _cached(cache, repo):
                note(f"fetching {repo} from the Hugging Face hub into {cache}")
            path = Path(snapshot_download(repo, cache_dir=cache, local_files_only=offline, allow_patterns=HUB_FILES))
    except Exception as e:  # huggingface_hub's errors: not cached, no network, no such repo, gated...
        raise MinigenError(_hub_error(spec, e, cache, offline)) from None
    if filename:
        files, _ = gguf_files(file, note)
        return Resolved(files, "hub-gguf", f"hub file {spec} ({where}), run as stored", file)
    if not (path / "config.json").is_file():
        raise MinigenError(f"{spec}: the hub snapshot {path} has no config.json (incomplete in {where}"
                           f"{', and HF_HUB_OFFLINE=1 forbids fetching the rest' if offline else ''})")
    revision = path.name[:12]
    return Resolved(path, "hub", f"hub id {spec}, revision {revision}, from {where}"
                                 f"{' (offline)' if offline else ''}")


def _cached(cache: Path, repo: str) -> bool:
    return (cache / f"models--{repo.replace('/', '--')}" / "snapshots").is_dir()


def _hub_error(spec: str, e: Exception, cache: Path, offline: bool) -> str:
    name = type(e).__name__
    if name in ("LocalEntryNotFoundError", "IncompleteSnapshotError", "OfflineModeIsEnabled"):
        if offline:
            return (f"{spec}: no such local directory or file, not in the Hugging Face cache ({cache}), and "
                    f"HF_HUB_OFFLINE=1 forbids downloading; unset it to fetch the model")
        return (f"{spec}: no such local directory or file, not in the Hugging Face cache ({cache}), and the hub "
                f"cannot be reached")
    if name in ("RepositoryNotFoundError", "GatedRepoError"):
        return f"{spec}: no such local directory or file, nor a model on the Hugging Face hub (or it is private or gated)"
    if name in ("EntryNotFoundError", "RemoteEntryNotFoundError", "RevisionNotFoundError"):
        return f"{spec}: no such file or revision in that hub repository"
    if name == "HFValidationError":
        return f"{spec}: no such checkpoint directory or GGUF file, and not a valid hub id"
    first = (str(e).strip().splitlines() or [name])[0]
    return f"{spec}: cannot fetch it from the Hugging Face hub ({name}: {first})"

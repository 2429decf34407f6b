"""The vocab-only GGUF fixtures of tests/fixtures/gguf_vocab/ (scripts/make_gguf_vocab_fixtures.py) and
llama.cpp's ids for them: shared by test_gguf_tokenizer.py and test_convert.py."""
from __future__ import annotations

import json
import lzma
from pathlib import Path

from conftest import FIXTURES_DIR

VOCAB_DIR = FIXTURES_DIR / "gguf_vocab"
REFS = json.loads((VOCAB_DIR / "refs.json").read_text(encoding="utf-8"))


def unpack(file: str, out_dir: Path) -> Path:
    """tests/fixtures/gguf_vocab/FILE (xz) unpacked into OUT_DIR."""
    out = out_dir / file.removesuffix(".xz")
    out.write_bytes(lzma.decompress((VOCAB_DIR / file).read_bytes()))
    return out


def read_metadata(path) -> dict:
    """A GGUF's metadata as minigen.gguf.convert reads it, for any architecture (convert takes llama only)."""
    from gguf import GGUFReader, GGUFValueType

    meta = {}
    for key, field in GGUFReader(path, "r").fields.items():
        if field.types[0] == GGUFValueType.ARRAY:
            if field.types[-1] == GGUFValueType.STRING:
                meta[key] = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                meta[key] = [field.parts[i][0].item() for i in field.data]
        elif field.types[0] == GGUFValueType.STRING:
            meta[key] = bytes(field.parts[field.data[0]]).decode("utf-8")
        else:
            meta[key] = field.parts[field.data[0]][0].item()
    return meta


def apply_patch(meta: dict, patch: dict | None) -> dict:
    """The variant a refs.json entry describes (as scripts/make_gguf_vocab_fixtures.py made it)."""
    patch = patch or {}
    meta = dict(meta, **patch.get("set", {}))
    for t in patch.get("append", []):
        meta["tokenizer.ggml.tokens"] = [*meta["tokenizer.ggml.tokens"], t["token"]]
        meta["tokenizer.ggml.token_type"] = [*meta["tokenizer.ggml.token_type"], t["type"]]
        meta["tokenizer.ggml.scores"] = [*meta["tokenizer.ggml.scores"], 0.0]
    if patch.get("eot"):
        meta["tokenizer.ggml.eot_token_id"] = meta["tokenizer.ggml.tokens"].index(patch["eot"])
    return meta

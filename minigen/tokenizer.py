"""Text <-> ids through the `tokenizers` library; the streaming detokenizer; the chat template."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from .errors import MinigenError


class Tokenizer:
    """A checkpoint's tokenizer.json plus the bits of tokenizer_config.json generation needs."""

    def __init__(self, hf: HFTokenizer, config: dict, chat_template: str | None):
        self.hf = hf
        self.config = config
        self.chat_template = chat_template

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise MinigenError(f"{file}: missing (minigen needs a tokenizer.json)")
        try:
            hf = HFTokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises its own Exception subclass
            raise MinigenError(f"{file}: not a tokenizer the tokenizers library can read ({_first_line(e)})")
        config = _read_json(path / "tokenizer_config.json") if (path / "tokenizer_config.json").is_file() else {}
        template = config.get("chat_template")
        if (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text(encoding="utf-8")
        if isinstance(template, list):  # older configs: a list of {"name", "template"}
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        return cls(hf, config, template)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_strings(self, ids) -> list[str]:
        """Each id decoded on its own: readable labels for attention plots and traces."""
        return [self.hf.decode([int(i)], skip_special_tokens=False) for i in ids]


def _read_json(file: Path) -> dict:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MinigenError(f"{file}: not valid JSON ({_first_line(e)})")


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]

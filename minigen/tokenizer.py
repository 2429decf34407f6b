"""Text <-> ids through the `tokenizers` library; the streaming detokenizer; the chat template."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from .errors import MinigenError, read_json_object


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
        config = read_json_object(path / "tokenizer_config.json") if (path / "tokenizer_config.json").is_file() else {}
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

    def special_token(self, name: str) -> str | None:
        """`bos_token`, `eos_token`, ... from tokenizer_config.json (a string or an AddedToken dict)."""
        value = self.config.get(name)
        return value.get("content") if isinstance(value, dict) else value

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """The checkpoint's chat template rendered the way transformers renders it."""
        if not self.chat_template:
            raise MinigenError("this checkpoint has no chat template (no chat_template.jinja, "
                               "no chat_template in tokenizer_config.json)")
        return render_chat_template(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                                    **self.special_tokens(), **kwargs)

    def special_tokens(self) -> dict:
        names = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
        return {n: self.special_token(n) for n in names if self.special_token(n) is not None}

    def streamer(self) -> "StreamingDetokenizer":
        return StreamingDetokenizer(self)

    @property
    def byte_fallback_ids(self) -> frozenset[int]:
        """Ids of the <0xNN> tokens of a byte-fallback BPE (SentencePiece style); empty otherwise."""
        if not hasattr(self, "_byte_ids"):
            ids = set()  # read off the model object: serialising the whole tokenizer costs ~20 MB
            if getattr(self.hf.model, "byte_fallback", False):
                ids = {self.hf.token_to_id(f"<0x{b:02X}>") for b in range(256)} - {None}
            self._byte_ids = frozenset(ids)
        return self._byte_ids


class StreamingDetokenizer:
    """Ids in, text pieces out, so that the pieces add up to `decode(all ids)` exactly.

    Each new piece is found by decoding a short window that starts one chunk before the new ids and
    taking what the window adds after the previous chunk: decoding the new ids alone would lose the
    context some decoders need (SentencePiece's Metaspace drops the leading space of the first token
    it sees). A window whose text ends in U+FFFD ends inside a UTF-8 character (byte-level BPE) and
    is held back until the character is complete. A run of byte-fallback tokens is held back until a
    normal token ends it, because the ByteFallback decoder turns the whole run into U+FFFDs if any
    byte in it is invalid. `flush()` renders whatever is left exactly as the full decode does.
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""        # everything returned so far
        self.prefix = 0       # window start: the chunk before the one not yet returned
        self.read = 0         # ids before this index have been returned as text

    def add(self, token: int) -> str:
        self.ids.append(int(token))
        if self.ids[-1] in self.tokenizer.byte_fallback_ids:
            return ""
        prefix_text = self._decode(self.prefix, self.read)
        new_text = self._decode(self.prefix, len(self.ids))
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd") or not new_text.startswith(prefix_text):
            return ""
        piece = new_text[len(prefix_text):]
        self.prefix, self.read = self.read, len(self.ids)
        self.text += piece
        return piece

    def flush(self) -> str:
        """The rest of the text: what the full decode has beyond what was returned."""
        full = self.tokenizer.decode(self.ids, skip_special_tokens=False)
        if full.startswith(self.text):
            piece = full[len(self.text):]
        else:  # a decoder whose output is not prefix-stable; give what the window adds
            piece = self._decode(self.prefix, len(self.ids))[len(self._decode(self.prefix, self.read)):]
        self.text += piece
        self.prefix = self.read = len(self.ids)
        return piece

    def _decode(self, start: int, stop: int) -> str:
        return self.tokenizer.decode(self.ids[start:stop], skip_special_tokens=False) if stop > start else ""


def render_chat_template(template: str, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
    """Render a chat template as transformers does: a sandboxed jinja2 environment with trim_blocks and
    lstrip_blocks, the `raise_exception` and `strftime_now` globals and its own `tojson` filter."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template).render(**{"tools": None, "documents": None, **kwargs}, messages=messages,
                                                 add_generation_prompt=add_generation_prompt)
    except jinja2.TemplateError as e:
        raise MinigenError(f"chat template: {_first_line(e)}")


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]

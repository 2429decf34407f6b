"""Text <-> ids through the `tokenizers` library; the streaming detokenizer; the chat template.

The tokenizer files are checked at load, once: tokenizer.json must be a file the library reads, whose
post-processor names only special tokens it defines and whose regular expressions cannot backtrack
catastrophically (the library panics on both, and a panic is no Python exception); tokenizer_config.json's
chat template and special tokens must have the types transformers reads. Encoding is still guarded: a
panic the checks did not foresee becomes a MinigenError, and Rust's report of it is kept off stderr.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from ..errors import MinigenError, first_line, short
from ..files import MiB, decode_utf8, read_json_object, read_regular
from .template import render_chat_template

TOKENIZER_LIMIT = 256 * MiB   # tokenizer.json: Gemma 3's is 33 MB
TEMPLATE_LIMIT = 16 * MiB     # chat_template.jinja
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class Tokenizer:
    """A checkpoint's tokenizer.json plus the bits of tokenizer_config.json generation needs."""

    def __init__(self, hf: HFTokenizer, config: dict, chat_template: str | None, path: Path | None = None):
        self.hf = hf
        self.config = config
        self.chat_template = chat_template
        self.path = path  # tokenizer.json, to name in errors

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        path = Path(path)
        file = path / "tokenizer.json"
        if not (file.exists() or file.is_symlink()):
            raise MinigenError(f"{file}: missing (minigen needs a tokenizer.json)")
        hf = read_tokenizer(file)
        config_file = path / "tokenizer_config.json"
        config = read_json_object(config_file) if config_file.exists() or config_file.is_symlink() else {}
        check_special_tokens(config, str(config_file))
        template = chat_template(config, str(config_file))
        jinja = path / "chat_template.jinja"
        if jinja.exists() or jinja.is_symlink():
            template = decode_utf8(read_regular(jinja, TEMPLATE_LIMIT, "chat template"), str(jinja), "the chat template")
        return cls(hf, config, template, file)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise MinigenError(f"text to encode should be a string, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate: bytes that were not UTF-8 on the way in
            raise MinigenError(f"the text is not valid Unicode (a lone surrogate at character {e.start}; "
                               f"was it read from bytes that are not UTF-8?)")
        with rust_guard(f"{self.path or 'the tokenizer'}: the tokenizer failed while encoding"):
            return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        with rust_guard(f"{self.path or 'the tokenizer'}: the tokenizer failed while decoding"):
            return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_strings(self, ids) -> list[str]:
        """Each id decoded on its own: readable labels for attention plots and traces."""
        return [self.decode([int(i)]) for i in ids]

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
        return {n: self.special_token(n) for n in SPECIAL_TOKENS if self.special_token(n) is not None}

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


# --- reading and checking the tokenizer files ------------------------------------------------------

def read_tokenizer(file: Path) -> HFTokenizer:
    data = read_regular(file, TOKENIZER_LIMIT, "tokenizer")
    with rust_guard(f"{file}: not a tokenizer the tokenizers library can read", load=True):
        hf = HFTokenizer.from_buffer(data)
    del data
    for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        component = getattr(hf, part)
        if component is not None:
            check_component(json.loads(component.__getstate__()), f"{file}: {part}")
    return hf


def check_component(node, where: str):
    """Walk a normalizer / pre-tokenizer / post-processor: refuse what would make the library panic."""
    if isinstance(node, list):
        for item in node:
            check_component(item, where)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "TemplateProcessing":
        check_template_processing(node, where)
    pattern = node.get("Regex")
    if isinstance(pattern, str) and catastrophic(pattern):
        raise MinigenError(f"{where}: the regular expression {short(pattern)} can backtrack catastrophically "
                           f"(a repeated group around a repeat)")
    for value in node.values():
        check_component(value, where)


def check_template_processing(node: dict, where: str):
    """Every special token the template names must be defined, with as many ids as tokens."""
    special = node.get("special_tokens") or {}
    for name, token in special.items():
        if len(token.get("ids", [])) != len(token.get("tokens", [])):
            raise MinigenError(f"{where}: special token {short(name)} has {len(token.get('ids', []))} ids "
                               f"but {len(token.get('tokens', []))} tokens")
    for piece in (node.get("single") or []) + (node.get("pair") or []):
        name = piece.get("SpecialToken", {}).get("id") if isinstance(piece, dict) else None
        if name is not None and name not in special:
            raise MinigenError(f"{where}: the template uses special token {short(name)}, which it does not define")


def catastrophic(pattern: str) -> bool:
    """Whether a regex has a group that repeats (`*`, `+`, `{n,}`, `{2}`...) around a repeat of its own
    whose length varies: `(a+)+`, `(\\w+\\s?)*`, `(.*a){25}`. Those backtrack exponentially (or to a
    high power), and Oniguruma then gives up with an error the library turns into a panic. Escapes,
    character classes and possessive quantifiers (`(a+)++` cannot backtrack) are understood; other
    slow patterns are left to `rust_guard`."""
    stack = [False]            # per open group: does it contain a repeat of varying length?
    closed = None              # the group just closed, when it is the atom before a quantifier
    i = 0
    while i < len(pattern):
        c, atom = pattern[i], None
        q = _quantifier(pattern, i)
        if c == "\\":
            i = _skip_escape(pattern, i)
        elif c == "[":
            i = _skip_class(pattern, i)
        elif c == "(":
            stack.append(False)
            i += 2 if pattern.startswith("?", i + 1) else 1   # (?:, (?i:, (?=: that ? is no quantifier
        elif c == ")" and len(stack) > 1:
            atom = stack.pop()
            stack[-1] |= atom
            i += 1
        elif q:
            low, high, i = q
            possessive = pattern.startswith("+", i)
            i += 1 if pattern.startswith(("?", "+"), i) else 0
            if closed and (high is None or high >= 2) and not possessive:
                return True
            stack[-1] |= high is None or high - low > 1
        else:
            i += 1
        closed = atom
    return False


def _quantifier(p: str, i: int) -> tuple[int, int | None, int] | None:
    """(least, most or None for unbounded, index after it) of a quantifier at p[i], else None."""
    if p[i] in "*+?":
        return {"*": (0, None), "+": (1, None), "?": (0, 1)}[p[i]] + (i + 1,)
    m = re.compile(r"\{(\d*)(,(\d*))?\}").match(p, i)
    if not m or not (m[1] or m[3]):
        return None
    low = int(m[1] or 0)
    return low, low if m[2] is None else (int(m[3]) if m[3] else None), m.end()


def _skip_escape(p: str, i: int) -> int:
    """The index after an escape: \\x, \\p{L}, \\x{263a}, \\k<name>."""
    i += 2
    if i < len(p) and p[i] == "{" and p[i - 1] in "pPxoku":
        end = p.find("}", i)
        return len(p) if end < 0 else end + 1
    return i


def _skip_class(p: str, i: int) -> int:
    """The index after a character class [...] (nested classes and escapes included)."""
    depth, i = 1, i + 1
    if i < len(p) and p[i] == "^":
        i += 1
    if i < len(p) and p[i] == "]":
        i += 1
    while i < len(p) and depth:
        if p[i] == "\\":
            i = _skip_escape(p, i)
            continue
        depth += {"[": 1, "]": -1}.get(p[i], 0)
        i += 1
    return i


def chat_template(config: dict, where: str) -> str | None:
    """tokenizer_config.json's chat_template: a string, or (older configs) a list of {"name", "template"}
    from which the one named "default" is used."""
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                          and isinstance(t.get("template"), str) for t in template):
        return next((t["template"] for t in template if t["name"] == "default"), None)
    raise MinigenError(f"{where}: field 'chat_template' should be a string or a list of "
                       f"{{\"name\", \"template\"}} strings, got {short(template)}")


def check_special_tokens(config: dict, where: str):
    """bos_token & co: a string, an AddedToken object with a string "content", or null."""
    for name in SPECIAL_TOKENS:
        v = config.get(name)
        if not (v is None or isinstance(v, str) or (isinstance(v, dict) and isinstance(v.get("content"), str))):
            raise MinigenError(f"{where}: field {name!r} should be a string or {{\"content\": string}}, got {short(v)}")


@contextmanager
def rust_guard(what: str, load: bool = False):
    """Turn a panic inside the tokenizers library (pyo3's PanicException, a BaseException) into one
    MinigenError starting with `what`; with `load`, any error the library raises too. Rust prints its
    own report of a panic on stderr: that is held back, and passed on only if nothing went wrong."""
    failure = None
    with _HeldStderr() as held:
        try:
            yield
        except BaseException as e:
            if type(e).__name__ != "PanicException" and not (load and isinstance(e, Exception)):
                raise
            failure, held.discard = e, True
    if failure is not None:
        raise MinigenError(f"{what} ({first_line(failure)})") from None


class _HeldStderr:
    """fd 2 goes to a temporary file while the block runs; then it is restored and, unless `discard`
    is set, what was written is copied to it. Without a temporary file, stderr is left alone."""

    _sink = None  # one temporary file for every call (decode runs once or twice per token)

    def __enter__(self) -> "_HeldStderr":
        self.discard, self.saved = False, None
        try:
            if _HeldStderr._sink is None:
                _HeldStderr._sink = tempfile.TemporaryFile()
            self.saved = os.dup(2)
        except OSError:
            return self
        fd = _HeldStderr._sink.fileno()
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.dup2(fd, 2)
        return self

    def __exit__(self, *exc):
        if self.saved is None:
            return False
        os.dup2(self.saved, 2)
        os.close(self.saved)
        fd = _HeldStderr._sink.fileno()
        size = os.lseek(fd, 0, os.SEEK_CUR)  # fd 2 was a duplicate: it moved the same offset
        held = b"" if self.discard or size == 0 else os.pread(fd, size, 0)
        if held:
            try:
                os.write(2, held)
            except OSError:
                pass
        return False


# --- a token's own bytes ------------------------------------------------------------------------------

def token_text(tokenizer, token: int) -> tuple[str, bytes]:
    """(the token decoded alone, its bytes): byte-level BPE pieces map back to their bytes, so a token
    holding part of a UTF-8 character has its true bytes while its text shows U+FFFD."""
    text = tokenizer.decode([token])
    piece = tokenizer.id_to_token(token)
    if piece is not None and all(c in BYTE_OF for c in piece) and "\ufffd" in text:
        return text, bytes(BYTE_OF[c] for c in piece)
    if piece is not None and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return text, bytes([int(piece[3:5], 16)])                            # byte fallback: <0xE2>
    return text, text.encode("utf-8", "surrogatepass")


def _bytes_to_unicode() -> dict:
    """GPT-2's byte-level alphabet: each byte as a printable character (the inverse is BYTE_OF)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_OF = {c: b for b, c in _bytes_to_unicode().items()}

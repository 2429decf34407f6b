"""Shared by scripts/make_gguf_vocab_fixtures.py and scripts/check_vocab_ggufs.py: llama.cpp's own tokenizer
(`llama-tokenize`, built by ../shared/tools/build-llama-cpp.sh) as the reference, the hard text set, and a
GGUF metadata reader.

`llama-tokenize -m FILE -f TEXT --no-escape` loads only the vocabulary, parses special tokens (its default) and
adds BOS/EOS as the file says; without `--ids` it prints each token as `%6d -> '<piece>'`, the piece being
llama.cpp's `common_token_to_piece` (special tokens as their text): ids and detokenisation in one run.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

LLAMA_CPP = Path(os.environ.get("LLAMA_CPP", Path.home() / ".cache/minigen-llama-cpp/llama_cpp_python-0.3.36/"
                                              "vendor/llama.cpp"))
LLAMA_TOKENIZE = LLAMA_CPP / "build/bin/llama-tokenize"

# runs of spaces and tabs, newlines, digits, code, CJK, emoji (ZWJ sequences), accents and combining marks,
# Arabic/Hindi, mixed case, special tokens inline, leading spaces, the empty string
HARD_TEXTS = [
    "",
    " ",
    "Hello world",
    " Hello world",
    "  two leading spaces",
    "a  b   c    d\t\te \t f",
    "line one\nline two\n\nline four\r\n\r\nwindows\n\n\n",
    "\n\n\t\t  \n  \n",
    " " * 40 + "x" + "\n" * 12 + "y" + "\t" * 7,
    "3 33 333 3333 33333 333333 3333333 3.14159 1,000,000 12345678901234567890 0x1F 1e-9 $12.50 ٣٤٥",
    "def f(x):\n    if x:\n        return [x ** 2 for _ in range(10)]  # comment\n\treturn None\n",
    "    indented\n        more\n            deeper",
    "日本語のテキスト、中文文本。한국어 텍스트 我想在apple工作1314151天～",
    "I love 🍕 and 🎉🎉! 👍🏽 👨\u200d👩\u200d👧\u200d👦 🏳️\u200d🌈 😶\u200d🌫️ 🦙🦙",
    "café naïve résumé Ærøskøbing façade Straße Ελληνικά Привет",
    "e\u0301 a\u0300 n\u0303 combining: Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334a\u0336lgo",
    "مرحبا بالعالم، هذا نص عربي. हिन्दी में लिखा पाठ, नमस्ते दुनिया।",
    "I'm sure they'll say we've done it, can't they? DON'T! 'RE 'Ve a'lL",
    "CamelCaseWords HTTPServer getURLForID iPhone ÉCOLE École McDonald'S x86_64 snake_case ΣΊΣΥΦΟΣ",
    "------======= ''''''```````\"\"\"\"......!!!!!!??????  <tag attr=\"1\">&amp;</tag>",
    "\u00a0non\u00a0breaking\u3000ideographic\u2009thin space\u200bzero width\u0085next",
    "Mixed\ttabs\tand spaces   \t  end   ",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<s>[INST] Hi [/INST] ok</s><s> next",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "text<|endoftext|>more <|endoftext|> spaced",
]


def special_text(tokens: list[str], types: list[int]) -> str:
    """A text with the vocabulary's own control and user-defined tokens inline (and whitespace around them)."""
    special = [t for t, k in zip(tokens, types) if k in (3, 4) and t.strip()][:6]
    if not special:
        return "no special tokens here"
    parts = [f"{s}{w}word" for s, w in zip(special, ("", " ", "\n", "  ", "\t", ""))]
    return " ".join(parts) + special[0]


def llama_tokenize(gguf: Path, text: str) -> tuple[list[int], bytes]:
    """llama.cpp's ids for TEXT and the concatenation of their pieces (bytes: a piece may be part of a character)."""
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
    try:
        out = subprocess.run([str(LLAMA_TOKENIZE), "-m", str(gguf), "-f", f.name, "--no-escape", "--log-disable"],
                             capture_output=True, check=True).stdout
    finally:
        os.unlink(f.name)
    return _parse(out)


def llama_special_ids(gguf: Path) -> dict:
    """What llama.cpp's loader logs: its end-of-generation ids ("eog", sorted) and BOS/EOS/UNK/PAD (or None)."""
    for _ in range(5):  # the log is written by a thread and now and then cut short at exit: retry
        log = subprocess.run([str(LLAMA_TOKENIZE), "-m", str(gguf), "-p", "x", "-lv", "4"],
                             capture_output=True, check=True).stderr.decode("utf-8", "replace")
        if "print_info: max token length" in log:
            break
    else:
        raise RuntimeError(f"{gguf}: llama-tokenize logged no vocabulary summary")
    ids = {"eog": sorted({int(i) for i in re.findall(r"print_info: EOG token += (\d+) ", log)})}
    for key, name in (("bos", "BOS"), ("eos", "EOS"), ("unknown", "UNK"), ("padding", "PAD")):
        m = re.search(rf"print_info: {name} token += (\d+) ", log)
        ids[key] = int(m.group(1)) if m else None
    return ids


_HEAD = re.compile(rb" *(\d+) -> '")
_TAIL = re.compile(rb"'\n(?= *\d+ -> '|\Z)")


def _parse(out: bytes) -> tuple[list[int], bytes]:
    ids, pieces, pos = [], [], 0
    while pos < len(out):
        head = _HEAD.match(out, pos)
        tail = _TAIL.search(out, head.end())
        ids.append(int(head.group(1)))
        pieces.append(out[head.end():tail.start()])
        pos = tail.end()
    return ids, b"".join(pieces)


def read_inp_out(gguf: Path) -> list[tuple[str, list[int]]]:
    """llama.cpp's own test cases for a vocab file (tests/test-tokenizer-0.cpp's format); empty if none."""
    inp, out = Path(f"{gguf}.inp"), Path(f"{gguf}.out")
    if not inp.is_file() or not out.is_file():
        return []
    texts = inp.read_bytes().decode("utf-8").split("\n__ggml_vocab_test__\n")
    if texts[-1] == "":  # test-tokenizer-0 reads no case after a final separator
        texts.pop()
    ids = [[int(x) for x in line.split()] for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(texts) == len(ids), gguf
    return list(zip(texts, ids))


def read_metadata(path: Path) -> dict:
    """A GGUF's key/value metadata as plain Python values, as minigen.gguf.convert reads it (any architecture)."""
    from gguf import GGUFReader, GGUFValueType

    meta = {}
    for key, field in GGUFReader(path, "r").fields.items():
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            if field.types[-1] == GGUFValueType.STRING:
                meta[key] = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                meta[key] = [field.parts[i][0].item() for i in field.data]
        elif kind == GGUFValueType.STRING:
            meta[key] = bytes(field.parts[field.data[0]]).decode("utf-8")
        else:
            meta[key] = field.parts[field.data[0]][0].item()
    return meta

"""GGUF files (behind --gguf): metadata values changed as a tiny Llama is written, and llama.cpp's own
files from tests/fixtures/gguf damaged field by field, cut short or with bytes flipped."""
from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Callable

from .core import FIXTURES, REPO, Case, Run, case_label, converted_loads

# --- GGUF (minigen convert; behind --gguf) ----------------------------------------------------------

def gguf_cases(rng: random.Random, full: bool) -> list[Case]:
    """Corrupted GGUFs: a tiny Llama written as llama.cpp would (tests/test_convert.py's writer), with one
    metadata field changed or dropped on its way into the file."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        import gguf
        import test_convert as TC
    except Exception as e:  # pragma: no cover
        print(f"no GGUF cases: {e}", file=sys.stderr)
        return []
    cases = []

    def with_meta(label: str, key: str | None, value=None, drop=False, out: str | None = None, expect="error"):
        def setup(d: Path) -> Run:
            src = d / "m.gguf"
            _write_gguf(TC, gguf, TC.bpe_checkpoint(d, dict(TC.tiny_checkpoint.CONFIG)), src, key, value, drop)
            target = out or str(d / "out")
            return Run(args=["convert", str(src), target], check=converted_loads(Path(target)))
        cases.append(Case("gguf", label, setup, expect))

    for key, value in [("llama.attention.head_count", 0), ("llama.block_count", 2**32), ("llama.embedding_length", 0),
                       ("llama.attention.head_count_kv", 0), ("llama.context_length", 0),
                       ("tokenizer.ggml.bos_token_id", 10**6), ("llama.rope.freq_base", float("nan")),
                       ("llama.attention.layer_norm_rms_epsilon", -1.0), ("llama.attention.head_count", "x")]:
        with_meta(f"{key}={case_label(value)}", key, value)
    for key in ["llama.attention.head_count", "llama.block_count", "tokenizer.ggml.tokens"]:
        with_meta(f"missing-{key}", key, drop=True)
    # may convert (a BPE without these merges still works), but the result must then load
    with_meta("merges-naming-unknown-tokens", "tokenizer.ggml.merges", ["zzq qqz"], expect="either")
    with_meta("missing-tokenizer.ggml.merges", "tokenizer.ggml.merges", drop=True, expect="either")
    with_meta("output-under-proc", None, out="/proc/minigen-out")
    return cases


def _write_gguf(TC, gguf, hf: Path, src: Path, key: str | None, value, drop: bool):
    """tests/test_convert.write_gguf with one key-value pair replaced (or dropped) as it is added."""
    class Writer(gguf.GGUFWriter):
        def add_key_value(self, k, val, vtype, sub_type=None):
            if k != key:
                return super().add_key_value(k, val, vtype, sub_type)
            if drop:
                return None
            if isinstance(value, str):
                return super().add_key_value(k, value, gguf.GGUFValueType.STRING)
            if isinstance(value, list):
                return super().add_key_value(k, value, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)
            if isinstance(value, float):
                return super().add_key_value(k, value, gguf.GGUFValueType.FLOAT32)
            return super().add_key_value(k, value, gguf.GGUFValueType.UINT64 if value >= 2**32 else gguf.GGUFValueType.UINT32)
    real, TC.gguf.GGUFWriter = TC.gguf.GGUFWriter, Writer
    try:
        TC.write_gguf(hf, src)
    finally:
        TC.gguf.GGUFWriter = real



# --- GGUF bytes: llama.cpp's own files from tests/fixtures/gguf, damaged field by field (behind --gguf) -----

GGUF_FILES = ("llama", "mistral", "gemma3", "gpt_neox", "phi3_longrope", "qwen3", "olmo2", "quants")
_GGUF_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}   # value type -> bytes


def gguf_fields(buf: bytes) -> tuple[list[tuple[str, int, int, str]], int]:
    """Every field of a well-formed GGUF header as (label, position, size, kind), and where the data
    starts. Kinds: version, count, strlen, vtype, atype, acount, value, ndims, dim, ttype, toffset."""
    fields, pos = [("version", 4, 4, "version")], 8

    def u(n, at):
        return int.from_bytes(buf[at:at + n], "little")

    def name(at, suffix):  # a key or tensor name: its length field, then where the name ends
        text = buf[at + 8:at + 8 + u(8, at)].decode()
        fields.append((f"{text}:{suffix}", at, 8, "strlen"))
        return text, at + 8 + u(8, at)
    n_tensors, n_kv = u(8, pos), u(8, pos + 8)
    fields += [("n_tensors", pos, 8, "count"), ("n_kv", pos + 8, 8, "count")]
    pos += 16
    align = 32
    for _ in range(n_kv):
        key, pos = name(pos, "key-length")
        vtype = u(4, pos)
        fields.append((f"{key}:type", pos, 4, "vtype"))
        pos += 4
        if vtype == 8:
            fields.append((f"{key}:length", pos, 8, "strlen"))
            pos += 8 + u(8, pos)
        elif vtype == 9:
            atype, count = u(4, pos), u(8, pos + 4)
            fields += [(f"{key}:item-type", pos, 4, "atype"), (f"{key}:count", pos + 4, 8, "acount")]
            pos += 12
            if atype == 8:
                if count:
                    fields.append((f"{key}:first-length", pos, 8, "strlen"))
                for _ in range(count):
                    pos += 8 + u(8, pos)
            else:
                pos += count * _GGUF_SCALAR[atype]
        else:
            if key == "general.alignment":
                align = u(_GGUF_SCALAR[vtype], pos)
            fields.append((f"{key}:value", pos, _GGUF_SCALAR[vtype], "value"))
            pos += _GGUF_SCALAR[vtype]
    for _ in range(n_tensors):
        tensor, pos = name(pos, "name-length")
        nd = u(4, pos)
        fields.append((f"{tensor}:n_dims", pos, 4, "ndims"))
        pos += 4
        fields += [(f"{tensor}:dim{j}", pos + 8 * j, 8, "dim") for j in range(nd)]
        pos += 8 * nd
        fields += [(f"{tensor}:type", pos, 4, "ttype"), (f"{tensor}:offset", pos + 4, 8, "toffset")]
        pos += 12
    return fields, pos + (-pos % align)


def _gguf_mutations(buf: bytes, rng: random.Random) -> list[tuple[str, Callable[[bytearray], None]]]:
    """(label, change in place) for one file: every count and version, a seeded sample of the other fields
    with values chosen per kind, truncations, and flipped bytes in the header and in the data."""
    fields, data_start = gguf_fields(buf)
    size = len(buf)

    def put(pos, n, v):
        def change(b: bytearray):
            b[pos:pos + n] = (v % (1 << (8 * n))).to_bytes(n, "little")
        return change

    def cut(n):
        def change(b: bytearray):
            del b[n:]
        return change

    def flip(pos, mask):
        def change(b: bytearray):
            b[pos] ^= mask
        return change

    def cur(pos, n):
        return int.from_bytes(buf[pos:pos + n], "little")

    values = {
        "version": [1, 4, 0, 2**32 - 1, 0x03000000],
        "count": [0, 1, -1, 2**63, 2**64 - 1, "+1", "-1"],
        "strlen": [0, 2**63, 2**64 - 1, size, "+1", "-1"],
        "vtype": [13, 99, 2**31, 8, 9, 6, 10, 4, 0],
        "atype": [9, 13, 99, 8, 0, 10],
        "acount": [0, 2**62, 2**64 - 1, "+1", "-1"],
        "value": [0, 2**31 - 1, 2**64 - 1, "-1"],
        "ndims": [0, 3, 5, 2**32 - 1],
        "dim": [0, 1, 2**32, 2**62, 2**64 - 1, "*2", "-1"],
        "ttype": [4, 5, 99, 2**31, 0, 1, 2, 8, 30],
        "toffset": [1, 2**62, 2**64 - 1, size, "+1", "-32", "+32"],
    }
    always = {"version", "count"}
    out = []
    for label, pos, n, kind in fields:
        if kind not in always and rng.random() > 0.12:
            continue
        seen = {cur(pos, n)}
        for v in values[kind]:
            if isinstance(v, str):
                v = {"+": cur(pos, n) + int(v[1:]), "-": cur(pos, n) - int(v[1:]), "*": cur(pos, n) * int(v[1:])}[v[0]]
            v %= 1 << (8 * n)
            if v not in seen:
                seen.add(v)
                out.append((f"{label}={v}", put(pos, n, v)))
    for n in sorted({0, 3, 4, 8, 20, data_start - 1, data_start, data_start + 7, size - 1,
                     *(rng.randrange(24, data_start) for _ in range(4)), *(rng.randrange(data_start, size) for _ in range(2))}):
        out.append((f"truncated-at-{n}", cut(n)))
    for _ in range(10):
        pos = rng.randrange(4, data_start)
        out.append((f"header-byte-{pos}^ff", flip(pos, 0xFF)))
    for _ in range(6):
        pos = rng.randrange(data_start, size)
        out.append((f"data-byte-{pos}^7f", flip(pos, 0x7F)))
    return out


def gguf_byte_cases(rng: random.Random, full: bool) -> list[Case]:
    """llama.cpp-made GGUFs of several architectures and quantisations, each damaged in one field (or cut
    short, or a byte flipped), through `minigen convert` and, for a sample, `generate --model FILE.gguf`
    (converted into a cache under the case's directory). A file that converts must then load and generate."""
    cases = []
    for stem in GGUF_FILES:
        src = FIXTURES / "gguf" / f"{stem}.gguf"
        if not src.is_file():
            continue
        buf = src.read_bytes()
        for label, change in _gguf_mutations(buf, rng):
            def setup(d: Path, buf=buf, change=change, stem=stem, via_model=rng.random() < 0.25) -> Run:
                b = bytearray(buf)
                change(b)
                f = d / f"{stem}.gguf"
                f.write_bytes(bytes(b))
                if via_model:
                    return Run(args=["generate", "--model", str(f), "-m", "3", "-q", "hi"],
                               env={"MINIGEN_WEIGHTS": "{dir}/weights"}, timeout=30)
                return Run(args=["convert", str(f), str(d / "out")], check=converted_loads(d / "out"), timeout=30)
            cases.append(Case("gguf-bytes", f"{stem}/{label}", setup, "either"))
    return cases




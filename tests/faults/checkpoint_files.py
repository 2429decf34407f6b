"""Checkpoint files: safetensors files damaged field by field (judged against the safetensors library's own
parser), shard indexes that point outside the checkpoint or at devices, and something other than a file
(a directory, a FIFO, a broken or looping link) where each file a checkpoint has should be."""
from __future__ import annotations

import json
import os
import random
import shutil
import struct
from pathlib import Path
from typing import Callable

from .core import FIXTURES, SECRET, Case, Run, case_label, copy_fixture, generate, no_secret, special_file, symlink_file, write_file

# --- safetensors -----------------------------------------------------------------------------------

def split_safetensors(blob: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def pack(header, data: bytes, n: int | None = None) -> bytes:
    text = header if isinstance(header, (bytes, str)) else json.dumps(header)
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw) if n is None else n) + raw + data


def library_accepts(blob: bytes) -> bool:
    """The safetensors library's own verdict on a file (its Rust parser; any dtype)."""
    from safetensors._safetensors_rust import deserialize
    try:
        deserialize(blob)
        return True
    except Exception:
        return False


def tensor_mutations(header: dict, data: bytes, rng: random.Random) -> list[tuple[str, bytes]]:
    """(name, file bytes): structural and per-entry corruptions of one safetensors file."""
    names = [k for k in header if k != "__metadata__"]
    t = rng.choice(names)
    e = header[t]
    b, end = e["data_offsets"]
    others = [k for k in names if k != t]
    u = rng.choice(others)
    total = len(data)
    out = []

    def entry(**change):
        h = json.loads(json.dumps(header))
        h[t] = {**h[t], **change}
        return pack(h, data)

    def without(key):
        h = json.loads(json.dumps(header))
        del h[t][key]
        return pack(h, data)

    raw = json.dumps(header).encode()
    base = pack(header, data)
    out += [("len-zero", pack(header, data, 0)), ("len-one", pack(header, data, 1)),
            ("len-past-eof", pack(header, data, len(base))), ("len-2**63", pack(header, data, 2**63)),
            ("len-max", pack(header, data, 2**64 - 1)), ("len-plus-1", pack(header, data, len(raw) + 1)),
            ("len-minus-1", pack(header, data, len(raw) - 1)), ("empty-file", b""), ("4-bytes", base[:4])]
    for cut in sorted({8, 8 + len(raw) // 2, 8 + len(raw), 8 + len(raw) + total // 2, len(base) - 1}):
        out.append((f"truncated-at-{cut}", base[:cut]))
    out += [(f"trailing-{k}", base + b"\0" * k) for k in (1, 8, 4096)]
    out += [("not-json", pack(b"this is not json at all" + b" " * 8, data)),
            ("invalid-utf8", pack(raw.replace(t.encode(), t.encode()[:-1] + b"\xff", 1), data)),
            ("bom", pack(b"\xef\xbb\xbf" + raw, data)),
            ("json-list", pack(b"[1, 2, 3]", data)), ("json-number", pack(b"12345", data)),
            ("json-string", pack(b'"model"', data)), ("json-null", pack(b"null", data)),
            ("deep-nesting", pack(b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", data)),
            ("5000-digit-header", pack(b"1" * 5000, data)),
            ("5000-digit-shape", entry(shape=None).replace(b'"shape": null', b'"shape": [' + b"7" * 5000 + b"]")),
            ("nan-offset", entry(data_offsets=None).replace(b'"data_offsets": null', b'"data_offsets": [NaN, 4]')),
            ("empty-object", pack(b"{}", data)), ("empty-object-no-data", pack(b"{}", b"")),
            ("metadata-only", pack({"__metadata__": {"format": "pt"}}, b"")),
            ("metadata-list", pack({**header, "__metadata__": [1, 2]}, data)),
            ("metadata-int-values", pack({**header, "__metadata__": {"format": 5}}, data)),
            ("padded-with-spaces", pack(raw + b" " * 13, data))]
    for v in ("x", 5, None, [1, 2]):
        h = dict(header)
        h[t] = v
        out.append((f"entry-{type(v).__name__}", pack(h, data)))
    out += [(f"no-{k}", without(k)) for k in ("dtype", "shape", "data_offsets")]
    out += [(f"dtype-{case_label(v)}", entry(dtype=v)) for v in
            (5, None, ["F32"], {"a": 1}, 1.5, "F33", "f32", "", "F64", "I64", "U8", "BF16", "F16", "F32")]
    shape = e["shape"]
    out += [(f"shape-{label}", entry(shape=v)) for label, v in [
        ("string", "64"), ("int", 64), ("float", 64.0), ("floats", [float(s) for s in shape]),
        ("strings", [str(s) for s in shape]), ("negative", [-s for s in shape]), ("2**70", [2**70] + shape[1:]),
        ("nested", [shape]), ("bool", [True] + shape[1:]), ("scalar", []), ("extra-dim", shape + [1]),
        ("dropped-dim", shape[:-1]), ("reversed", shape[::-1]), ("zero", [0] + shape[1:]),
        ("2**64", [2**64] + shape[1:]), ("overflow-product", [2**32, 2**32] + shape),
        ("many-huge-dims", [2**63 - 1] * 100_000)]]
    step = 4
    out += [(f"offsets-{label}", entry(data_offsets=v)) for label, v in [
        ("string", f"{b},{end}"), ("one", [b]), ("three", [b, end, end]), ("floats", [float(b), float(end)]),
        ("strings", [str(b), str(end)]), ("negative", [b - 10**6, end - 10**6]), ("negative-begin", [-step, end]),
        ("reversed", [end, b]), ("shifted-up", [b + step, end + step]),
        ("shifted-down", [max(b - step, 0), max(end - step, 0)]), ("longer", [b, end + step]),
        ("empty", [b, b]), ("past-eof", [total, total + end - b]), ("2**64", [2**64, 2**64 + end - b]),
        ("bools", [False, True]), ("null", None), ("neighbour", header[u]["data_offsets"]),
        ("from-zero", [0, end - b])]]
    dup = raw.replace(b"{", b"{" + json.dumps(t).encode() + b": " + json.dumps(header[u]).encode() + b", ", 1)
    out += [("duplicate-key-other-offsets", pack(dup, data)),
            ("duplicate-key-same", pack(raw.replace(b"{", b"{" + json.dumps(t).encode() + b": "
                                                    + json.dumps(e).encode() + b", ", 1), data))]
    for label, new in [("renamed", t + ".extra"), ("empty-name", ""), ("long-name", "n" * 100_000),
                       ("control-name", "\x1b[31mred\x1b[0m\n")]:
        h = {(new if k == t else k): v for k, v in header.items()}
        out.append((f"name-{label}", pack(h, data)))
    h = {k: v for k, v in header.items() if k != t}
    out.append(("tensor-removed", pack(h, data)))
    same = [k for k in others if header[k]["data_offsets"][1] - header[k]["data_offsets"][0] == end - b
            and header[k]["dtype"] == e["dtype"]]
    if same:
        h = json.loads(json.dumps(header))
        h[t]["data_offsets"], h[same[0]]["data_offsets"] = h[same[0]]["data_offsets"], h[t]["data_offsets"]
        out.append(("offsets-swapped", pack(h, data)))
    out.append(("extra-entry-field", entry(extra={"x": [1, 2]})))
    item = {"F32": 4, "F16": 2, "BF16": 2}[e["dtype"]]
    nan = {"F32": struct.pack("<f", float("nan")), "F16": b"\x00\x7e", "BF16": b"\xc0\x7f"}[e["dtype"]]
    big_data = bytearray(data)
    big_data[b:end] = nan * ((end - b) // item)
    out.append(("weights-nan", pack(header, bytes(big_data))))
    inf = {"F32": struct.pack("<f", float("inf")), "F16": b"\x00\x7c", "BF16": b"\x80\x7f"}[e["dtype"]]
    big_data = bytearray(data)
    big_data[b:end] = inf * ((end - b) // item)
    out.append(("weights-inf", pack(header, bytes(big_data))))
    return out



def safetensors_cases(rng: random.Random, full: bool) -> list[Case]:
    cases = []
    fixtures = ["llama_gqa3", "gpt2", "llama_bf16", "qwen2", "gemma", "mistral_sliding"] if full else ["llama_gqa3", "llama_bf16"]
    for fx in fixtures:
        blob = (FIXTURES / fx / "model.safetensors").read_bytes()
        header, data = split_safetensors(blob)
        for name, new in tensor_mutations(header, data, random.Random(rng.random())):
            accepted = library_accepts(new)
            expect = "either" if accepted else "error"
            if name in ("weights-nan", "weights-inf"):
                expect = "error"  # non-finite logits: one line naming the step (inf may also cancel out: either)
                expect = "either" if name == "weights-inf" else expect
            for which in (("generate", "info") if full else ("generate",)):
                cases.append(Case("safetensors", f"{fx}/{name}/{which}", write_file(fx, "model.safetensors", new, which),
                                  "ok" if name.startswith("weights-") and which == "info" else expect,
                                  key=name in KEY_SAFETENSORS and fx == "llama_gqa3"))
    for fx in ["llama_gqa3"]:
        for target in ["/proc/self/mem", "/dev/zero", "/dev/urandom", "/dev/null", "/etc/passwd", "/proc/self/environ"]:
            cases.append(Case("safetensors", f"{fx}/symlink-{target}", symlink_file(fx, "model.safetensors", target), key=True))
        cases.append(Case("safetensors", f"{fx}/fifo", special_file(fx, "model.safetensors", "fifo"), key=True))
        cases.append(Case("safetensors", f"{fx}/directory", special_file(fx, "model.safetensors", "dir")))
        sizes = [(95_000_000, True), (4_000_000, False), (900_000, False)] if full else [(900_000, True)]
        for size, key in sizes:
            cases.append(Case("safetensors", f"{fx}/huge-header-{size / 10**6:g}MB",
                              _huge_header(fx, size), "error", key=key))
    return cases


KEY_SAFETENSORS = {"deep-nesting", "5000-digit-header", "dtype-5", "shape-int", "shape-2**70", "offsets-negative",
                   "offsets-shifted-up", "offsets-strings", "trailing-1", "duplicate-key-other-offsets",
                   "offsets-from-zero", "weights-nan", "len-max", "tensor-removed", "padded-with-spaces",
                   "offsets-neighbour"}



def _huge_header(fx: str, size: int):
    def setup(d: Path) -> Run:
        ckpt = copy_fixture(fx, d)
        parts, n, i = [], 2, 0
        while n < size:
            item = f'"t{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}'
            parts.append(item)
            n += len(item) + 1
            i += 1
        (ckpt / "model.safetensors").write_bytes(pack("{" + ",".join(parts) + "}", b""))
        return Run(args=generate(ckpt).args, timeout=20)
    return setup



# --- shard index -----------------------------------------------------------------------------------

def index_cases(rng: random.Random, full: bool) -> list[Case]:
    fx = "llama_sharded"
    index = json.loads((FIXTURES / fx / "model.safetensors.index.json").read_text())
    wm = index["weight_map"]
    victim = rng.choice(sorted(wm))
    cases = []

    def remap(value: str, make: Callable[[Path, Path], None] | None = None, expect="error", key=False, label=None):
        def setup(d: Path) -> Run:
            ckpt = copy_fixture(fx, d)
            (d / "outside.safetensors").write_bytes(SECRET + b"\0" * 64)
            if make:
                make(ckpt, d)
            new = json.loads(json.dumps(index))
            shard = new["weight_map"][victim]
            for k in new["weight_map"]:
                if new["weight_map"][k] == shard:
                    new["weight_map"][k] = value
            (ckpt / "model.safetensors.index.json").write_text(json.dumps(new))
            return Run(args=generate(ckpt).args, check=no_secret)
        cases.append(Case("index", f"{fx}/weight-map-{label or case_label(value)}", setup, expect, key=key))

    def valid_copy_outside(ckpt: Path, d: Path):
        shard = wm[victim]
        shutil.copy(ckpt / shard, d / "copy.safetensors")

    remap("/etc/passwd", key=True)
    remap("../../../../../../etc/passwd", key=True, label="dotdot-passwd")
    remap("/proc/self/environ", key=True)
    remap("/proc/self/mem")
    remap("../outside.safetensors", key=True, label="dotdot-secret")
    remap("../copy.safetensors", valid_copy_outside, key=True, label="dotdot-valid-shard")
    remap("sub/passwd", lambda c, d: (c / "sub").symlink_to("/etc"), key=True, label="symlinked-dir-escape")
    remap("sub/copy.safetensors", lambda c, d: (valid_copy_outside(c, d), (c / "sub").symlink_to(d))[0],
          label="symlinked-dir-valid-shard")
    remap("", label="empty")
    remap(".", label="dot")
    remap("..", label="dotdot")
    remap("a\0b", label="nul")
    remap("x" * 5000, label="long")
    remap("nested/dir/", label="trailing-slash")
    remap("..\\copy.safetensors", valid_copy_outside, label="backslash")
    remap("./" + wm[victim], expect="ok", label="dot-slash-prefix")
    remap("loop.safetensors", lambda c, d: ((c / "loop.safetensors").symlink_to("loop2.safetensors"),
                                             (c / "loop2.safetensors").symlink_to("loop.safetensors")), label="symlink-loop")

    def hub_cache(d: Path) -> Run:
        """The Hugging Face hub cache's layout: snapshot files are symlinks to ../../blobs/<hash>."""
        src = FIXTURES / fx
        blobs, snap = d / "models--x--y" / "blobs", d / "models--x--y" / "snapshots" / "abc123"
        blobs.mkdir(parents=True)
        snap.mkdir(parents=True)
        for i, f in enumerate(sorted(p for p in src.iterdir() if not p.name.startswith("reference"))):
            shutil.copy(f, blobs / f"blob{i}")
            (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / f"blob{i}")
        return generate(snap)
    cases.append(Case("index", f"{fx}/hub-cache-symlinks", hub_cache, "ok", key=True))

    def absolute_inside(d: Path) -> Run:
        ckpt = copy_fixture(fx, d)
        new = json.loads(json.dumps(index))
        new["weight_map"] = {k: str(ckpt / v) for k, v in new["weight_map"].items()}
        (ckpt / "model.safetensors.index.json").write_text(json.dumps(new))
        return generate(ckpt)
    cases.append(Case("index", f"{fx}/absolute-paths-inside", absolute_inside, "either"))

    def index_file(content: bytes, label: str, key=False, expect="error"):
        cases.append(Case("index", f"{fx}/index-{label}", write_file(fx, "model.safetensors.index.json", content),
                          expect, key=key))
    index_file(b"not json", "not-json")
    index_file(b"[1, 2]", "list")
    index_file(json.dumps({"weight_map": [1]}).encode(), "weight-map-list", key=True)
    index_file(json.dumps({"weight_map": "x"}).encode(), "weight-map-string")
    index_file(json.dumps({"weight_map": {victim: 5}}).encode(), "weight-map-int-value", key=True)
    index_file(json.dumps({"weight_map": {victim: None}}).encode(), "weight-map-null-value")
    index_file(json.dumps({"metadata": {}}).encode(), "no-weight-map")
    index_file(json.dumps({"weight_map": {}}).encode(), "empty-weight-map")
    index_file(b'{"weight_map": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "deep-nesting", key=True)
    index_file(b'{"weight_map": {}, "x": ' + b"9" * 5000 + b"}", "5000-digits")
    index_file(b"\xff\xfe{}", "invalid-utf8")
    wrong = json.loads(json.dumps(index))
    other = next(v for v in sorted(set(wm.values())) if v != wm[victim])
    wrong["weight_map"][victim] = other
    index_file(json.dumps(wrong).encode(), "tensor-in-wrong-shard")
    extra = json.loads(json.dumps(index))
    extra["weight_map"]["model.layers.99.mlp.up_proj.weight"] = wm[victim]
    index_file(json.dumps(extra).encode(), "tensor-not-in-shard")
    for target in ["/dev/zero", "/proc/self/mem"]:
        cases.append(Case("index", f"{fx}/index-symlink-{target}", symlink_file(fx, "model.safetensors.index.json", target), key=True))
    cases.append(Case("index", f"{fx}/index-fifo", special_file(fx, "model.safetensors.index.json", "fifo"), key=True))

    def shard_special(kind: str):
        def setup(d: Path) -> Run:
            ckpt = copy_fixture(fx, d)
            shard = ckpt / wm[victim]
            shard.unlink()
            if kind == "fifo":
                os.mkfifo(shard)
            else:
                shard.symlink_to(kind)
            return Run(args=generate(ckpt).args, check=no_secret)
        cases.append(Case("index", f"{fx}/shard-{case_label(kind)}", setup, key=True))
    for kind in ("fifo", "/dev/zero", "/proc/self/mem", "/etc/passwd"):
        shard_special(kind)
    return cases





# --- something other than a file where a file should be -----------------------------------------------------

FILE_KINDS = ("dir", "fifo", "broken-link", "loop")
SAYS = {"dir": "directory", "fifo": "FIFO", "broken-link": "symbolic link", "loop": "symbolic link"}
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                    "generation_config.json")


def put(path: Path, kind: str) -> Path:
    """A directory, a FIFO, a link to nothing or a link to itself where `path` was."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    if kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "broken-link":
        path.symlink_to(path.parent / "nothing-here")
    else:
        path.symlink_to(path.name)
    return path


def names_it(path: Path, kind: str):
    """The error must name the file and say what is there (not "4: Is a directory", a file descriptor)."""
    def check(code, out, err, d):
        text = err.decode("utf-8", "replace")
        if code != 0 and not (str(path) in text and SAYS[kind] in text):
            return f"the error does not name {path.name} and what is there: {text.strip()[:160]}"
        return None
    return check


def file_kind_cases(rng: random.Random, full: bool) -> list[Case]:
    """Each file a checkpoint has, the shard index and a shard, a GGUF given as --model or to convert, and a
    conversation given to chat --load, replaced by a directory (the CI subset), a FIFO, a broken or a looping
    symbolic link: one line naming the file and what is there, exit 1 (or click's usage error, exit 2)."""
    cases = []
    kinds = FILE_KINDS if full else ("dir",)

    def add(label: str, make: Callable[[Path], tuple[Path, list, bytes]], kind: str, expect="error", key=True):
        def setup(d: Path) -> Run:
            path, args, stdin = make(d)
            return Run(args=args, stdin=stdin, check=names_it(put(path, kind), kind))
        cases.append(Case("file-kind", f"{label}-{kind}", setup, expect, key=key and kind == "dir"))

    def in_checkpoint(fx: str, name: str):
        def make(d: Path):
            ckpt = copy_fixture(fx, d)
            if name == "shard":
                index = json.loads((ckpt / "model.safetensors.index.json").read_text())
                return ckpt / sorted(set(index["weight_map"].values()))[0], generate(ckpt).args, b""
            return ckpt / name, generate(ckpt, "--chat").args, b""
        return make

    for kind in kinds:
        for name in CHECKPOINT_FILES:
            add(f"llama_gqa3/{name}", in_checkpoint("llama_gqa3", name), kind)
        add("llama_sharded/model.safetensors.index.json", in_checkpoint("llama_sharded", "model.safetensors.index.json"),
            kind, key=False)
        add("llama_sharded/shard", in_checkpoint("llama_sharded", "shard"), kind)
        add("gguf-as-model", lambda d: (d / "m.gguf", ["generate", "--model", str(d / "m.gguf"), "-m", "2", "hi"], b""), kind)
        if kind not in ("dir", "fifo"):  # click itself says that a link to nothing does not exist
            continue
        add("chat-load", lambda d: (d / "conversation.json", ["chat", "--model", str(FIXTURES / "llama_gqa3"), "--load",
                                                               str(d / "conversation.json")], b"hi\n"),
            kind, "usage" if kind == "dir" else "fail", key=False)  # click refuses a directory itself
        add("convert-source", lambda d: (d / "m.gguf", ["convert", str(d / "m.gguf"), str(d / "out")], b""),
            kind, "usage" if kind == "dir" else "error", key=False)
    return cases

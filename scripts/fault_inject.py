"""Seeded fault injection: corrupted checkpoints, odd options, hostile chat templates, signals and broken
streams, all derived from the fixtures in tests/fixtures, run against minigen as a user would run it.

    python scripts/fault_inject.py                 # the full corpus: counts per category and outcome
    python scripts/fault_inject.py --fast          # the CI subset (tests/test_faults.py runs it)
    python scripts/fault_inject.py --seed 7        # another corpus: the seed picks tensors, offsets, values
    python scripts/fault_inject.py -k template -v  # only cases whose name contains 'template'; show each
    python scripts/fault_inject.py --gguf          # add corrupted GGUFs (metadata values; llama.cpp's files
                                                   # damaged field by field) for `convert` and `--model F.gguf`

Each case builds its files in a fresh temporary directory and runs one command (`minigen ...` in a
forked child with limits on time and memory, a Python API call, or a real `python -m minigen` process
for signals and closed or full streams). Outcomes:

    ok-error   a one-line `minigen: error: ...` (or click's usage error, exit 2) and the right exit code
    ok         exit 0 where that is allowed, and the result checks out
    traceback  a Python traceback or a Rust panic on stderr
    hang       over the time limit, or out of memory (MemoryError or killed)
    wrong      exit 0 where the input must be refused, a wrong exit code, an error of several lines,
               a file read outside the checkpoint or bytes of it printed, a temporary file left behind

Nothing is written outside the temporary directories: device and FIFO targets are clones made there
(`mknod`, `mkfifo`), and "disk full" is a file-size limit (RLIMIT_FSIZE), not /dev/full.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
sys.path.insert(0, str(REPO))

OUTCOMES = ("ok-error", "ok", "traceback", "hang", "wrong")
SECRET = b"MINIGEN-SECRET-0123456789abcdef"  # content of files outside a checkpoint: must never be printed


# --- cases ------------------------------------------------------------------------------------------

@dataclass
class Run:
    """What a case runs: `minigen ARGS` (kind "cli"), a Python call (kind "api"), or a real process
    driven by `proc(dir) -> (code, stdout, stderr)` (kind "proc")."""
    kind: str = "cli"
    args: list = field(default_factory=list)
    stdin: bytes = b""
    api: Callable | None = None
    proc: Callable | None = None
    check: Callable | None = None   # (code, stdout, stderr, dir) -> a problem (str) or None
    timeout: float | None = None
    env: dict = field(default_factory=dict)   # set in the child before it runs ("{dir}" is the case's directory)


@dataclass
class Case:
    category: str
    name: str
    setup: Callable[[Path], Run]    # builds the case's files in a temporary directory
    expect: str = "error"           # "error" (exit 1), "usage" (exit 2), "fail" (any non-zero), "either", "ok"
    key: bool = False               # always in the fast subset


def copy_fixture(name: str, to: Path) -> Path:
    out = to / name
    shutil.copytree(FIXTURES / name, out, ignore=shutil.ignore_patterns("reference*.npz"))
    return out


def generate(ckpt: Path, *extra, prompt: str = "Hello world") -> Run:
    return Run(args=["generate", "--model", str(ckpt), "-m", "4", "-q", "--ignore-eos", *extra, prompt])


def info(ckpt: Path) -> Run:
    return Run(args=["info", "--model", str(ckpt)])


def commands(ckpt: Path, which: str) -> Run:
    return info(ckpt) if which == "info" else generate(ckpt)


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
    out += [(f"dtype-{_label(v)}", entry(dtype=v)) for v in
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


def _label(v) -> str:
    text = json.dumps(v)
    return (text if len(text) <= 24 else text[:20] + "...").replace("/", "_") or "empty"


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
                cases.append(Case("safetensors", f"{fx}/{name}/{which}", _write_file(fx, "model.safetensors", new, which),
                                  "ok" if name.startswith("weights-") and which == "info" else expect,
                                  key=name in KEY_SAFETENSORS and fx == "llama_gqa3"))
    for fx in ["llama_gqa3"]:
        for target in ["/proc/self/mem", "/dev/zero", "/dev/urandom", "/dev/null", "/etc/passwd", "/proc/self/environ"]:
            cases.append(Case("safetensors", f"{fx}/symlink-{target}", _symlink_file(fx, "model.safetensors", target), key=True))
        cases.append(Case("safetensors", f"{fx}/fifo", _special_file(fx, "model.safetensors", "fifo"), key=True))
        cases.append(Case("safetensors", f"{fx}/directory", _special_file(fx, "model.safetensors", "dir")))
        sizes = [(95_000_000, True), (4_000_000, False), (900_000, False)] if full else [(900_000, True)]
        for size, key in sizes:
            cases.append(Case("safetensors", f"{fx}/huge-header-{size / 10**6:g}MB",
                              _huge_header(fx, size), "error", key=key))
    return cases


KEY_SAFETENSORS = {"deep-nesting", "5000-digit-header", "dtype-5", "shape-int", "shape-2**70", "offsets-negative",
                   "offsets-shifted-up", "offsets-strings", "trailing-1", "duplicate-key-other-offsets",
                   "offsets-from-zero", "weights-nan", "len-max", "tensor-removed", "padded-with-spaces",
                   "offsets-neighbour"}


def _write_file(fx: str, name: str, content: bytes, which: str = "generate", also: Callable | None = None):
    def setup(d: Path) -> Run:
        ckpt = copy_fixture(fx, d)
        (ckpt / name).write_bytes(content)
        if also:
            also(ckpt)
        return commands(ckpt, which)
    return setup


def _symlink_file(fx: str, name: str, target: str, which: str = "generate"):
    def setup(d: Path) -> Run:
        ckpt = copy_fixture(fx, d)
        (ckpt / name).unlink(missing_ok=True)
        (ckpt / name).symlink_to(target)
        return Run(args=commands(ckpt, which).args, check=_no_secret)
    return setup


def _special_file(fx: str, name: str, kind: str, which: str = "generate"):
    def setup(d: Path) -> Run:
        ckpt = copy_fixture(fx, d)
        (ckpt / name).unlink(missing_ok=True)
        if kind == "fifo":
            os.mkfifo(ckpt / name)
        else:
            (ckpt / name).mkdir()
        return commands(ckpt, which)
    return setup


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


def _no_secret(code, out, err, d):
    if SECRET in out or SECRET in err:
        return "printed bytes of a file outside the checkpoint"
    return None


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
            return Run(args=generate(ckpt).args, check=_no_secret)
        cases.append(Case("index", f"{fx}/weight-map-{label or _label(value)}", setup, expect, key=key))

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
        cases.append(Case("index", f"{fx}/index-{label}", _write_file(fx, "model.safetensors.index.json", content),
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
        cases.append(Case("index", f"{fx}/index-symlink-{target}", _symlink_file(fx, "model.safetensors.index.json", target), key=True))
    cases.append(Case("index", f"{fx}/index-fifo", _special_file(fx, "model.safetensors.index.json", "fifo"), key=True))

    def shard_special(kind: str):
        def setup(d: Path) -> Run:
            ckpt = copy_fixture(fx, d)
            shard = ckpt / wm[victim]
            shard.unlink()
            if kind == "fifo":
                os.mkfifo(shard)
            else:
                shard.symlink_to(kind)
            return Run(args=generate(ckpt).args, check=_no_secret)
        cases.append(Case("index", f"{fx}/shard-{_label(kind)}", setup, key=True))
    for kind in ("fifo", "/dev/zero", "/proc/self/mem", "/etc/passwd"):
        shard_special(kind)
    return cases


# --- config.json, generation_config.json ------------------------------------------------------------

BAD_VALUES = ["x", "", [1], [], {"a": 1}, {}, None, True, False, 1.5, -1, 0, 10**12, 2**64, float("nan"),
              float("-inf"), "1" * 10_000]
CONFIG_EXTRA_KEYS = ["layer_types", "sliding_window", "use_sliding_window", "rope_scaling", "rope_theta",
                     "rope_parameters", "head_dim", "partial_rotary_factor", "attention_bias", "mlp_bias",
                     "num_key_value_heads", "eos_token_id", "bos_token_id", "architectures", "max_window_layers",
                     "tie_word_embeddings", "hidden_act", "torch_dtype", "dtype", "intermediate_size"]


def json_bytes(obj) -> bytes:
    return json.dumps(obj, allow_nan=True).encode()


def config_cases(rng: random.Random, full: bool) -> list[Case]:
    cases = []
    fixtures = ["llama_gqa3", "gpt2", "mistral_sliding", "qwen2", "gemma", "llama3_rope"] if full else ["llama_gqa3", "gpt2"]
    for fx in fixtures:
        cfg = json.loads((FIXTURES / fx / "config.json").read_text())
        keys = sorted(set(cfg) | set(CONFIG_EXTRA_KEYS))
        for key in keys:
            values = BAD_VALUES if full else rng.sample(BAD_VALUES, 2)
            for v in values:
                new = {**cfg, key: v}
                cases.append(Case("config", f"{fx}/{key}={_label(v)}", _write_file(fx, "config.json", json_bytes(new)),
                                  "either"))
    cfg = json.loads((FIXTURES / "llama_gqa3" / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    specific = [
        ("model_type-list", {"model_type": ["llama"]}, "error"), ("model_type-int", {"model_type": 5}, "error"),
        ("rope_scaling-string", {"rope_scaling": "linear"}, "error"),
        ("rope_parameters-string", {"rope_parameters": "x"}, "error"),
        ("layer_types-int", {"layer_types": 3, "model_type": "mistral"}, "error"),
        ("layer_types-strings", {"layer_types": ["x"] * n, "model_type": "mistral"}, "error"),
        ("layer_types-dicts", {"layer_types": [{}] * n, "model_type": "mistral"}, "error"),
        ("layer_types-short", {"layer_types": ["full_attention"], "model_type": "mistral"}, "error"),
        ("layer_types-ignored-by-llama", {"layer_types": 3}, "either"),
        ("eos-x", {"eos_token_id": "x"}, "error"), ("eos-list-x", {"eos_token_id": ["x"]}, "error"),
        ("sliding_window-0", {"sliding_window": 0, "model_type": "mistral"}, "error"),
        ("num_hidden_layers-10**12", {"num_hidden_layers": 10**12}, "error"),
        ("num_hidden_layers-plus-1", {"num_hidden_layers": n + 1}, "error"),
        ("num_hidden_layers-minus-1", {"num_hidden_layers": n - 1}, "error"),
        ("vocab_size-10**12", {"vocab_size": 10**12}, "error"), ("hidden_size-10**12", {"hidden_size": 10**12}, "error"),
        ("intermediate_size-10**12", {"intermediate_size": 10**12}, "error"),
        ("num_attention_heads-10**12", {"num_attention_heads": 10**12}, "error"),
        ("head_dim-10**12", {"head_dim": 10**12}, "error"),
        ("rms_norm_eps-nan", {"rms_norm_eps": float("nan")}, "error"),
        ("rms_norm_eps-negative", {"rms_norm_eps": -1e-5}, "error"),
        ("rms_norm_eps-zero", {"rms_norm_eps": 0}, "error"),
        ("rope_theta-nan", {"rope_parameters": {"rope_theta": float("nan"), "rope_type": "default"}}, "error"),
        ("rope_theta-inf", {"rope_parameters": {"rope_theta": float("inf"), "rope_type": "default"}}, "error"),
        ("rope_factor-0", {"rope_parameters": {"rope_theta": 1e4, "rope_type": "linear", "factor": 0}}, "error"),
        ("rope_factor-nan", {"rope_parameters": {"rope_theta": 1e4, "rope_type": "linear", "factor": float("nan")}}, "error"),
        ("rope-llama3-equal-freq-factors", {"rope_parameters": {"rope_theta": 1e4, "rope_type": "llama3", "factor": 8.0,
                                                               "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                                                               "original_max_position_embeddings": 64}}, "either"),
        ("rope-llama3-original-max-x", {"rope_parameters": {"rope_theta": 1e4, "rope_type": "llama3", "factor": 8.0,
                                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                           "original_max_position_embeddings": "x"}}, "error"),
        ("architectures-int", {"architectures": 5}, "either"), ("architectures-list-int", {"architectures": [5]}, "either"),
        ("torch_dtype-list", {"torch_dtype": ["x"]}, "either"),
        ("max_position_embeddings-10**12", {"max_position_embeddings": 10**12}, "either"),
        ("head_dim-10**400", {"head_dim": 10**400}, "error"), ("hidden_size-2**1024", {"hidden_size": 2**1024}, "error"),
        ("rope_theta-10**400", {"rope_parameters": {"rope_theta": 10**400, "rope_type": "default"}}, "error"),
        ("rms_norm_eps-10**400", {"rms_norm_eps": 10**400}, "error"),
    ]
    for label, change, expect in specific:
        for which in ("generate", "info"):
            new = {**cfg, **change}
            cases.append(Case("config", f"llama_gqa3/{label}/{which}",
                              _write_file("llama_gqa3", "config.json", json_bytes(new), which), expect, key=which == "generate"))
    for label, content in [("not-json", b"{nope"), ("list", b"[]"), ("empty", b""), ("invalid-utf8", b'{"a": "\xff"}'),
                           ("bom", b"\xef\xbb\xbf{}"), ("deep-nesting", b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
                           ("5000-digits", b'{"vocab_size": ' + b"7" * 5000 + b"}"), ("nul", b"\0" * 100)]:
        cases.append(Case("config", f"llama_gqa3/file-{label}", _write_file("llama_gqa3", "config.json", content),
                          key=label in ("deep-nesting", "5000-digits", "invalid-utf8")))
    for target in ["/dev/zero", "/proc/self/mem", "/etc/passwd"]:
        cases.append(Case("config", f"llama_gqa3/symlink-{target}", _symlink_file("llama_gqa3", "config.json", target), key=True))
    cases.append(Case("config", "llama_gqa3/config-fifo", _special_file("llama_gqa3", "config.json", "fifo"), key=True))
    cases.append(Case("config", "llama_gqa3/config-dir", _special_file("llama_gqa3", "config.json", "dir")))
    return cases


GEN_KEYS = ["temperature", "top_k", "top_p", "min_p", "repetition_penalty", "do_sample", "eos_token_id",
            "bos_token_id", "pad_token_id", "max_new_tokens"]


def generation_config_cases(rng: random.Random, full: bool) -> list[Case]:
    cases = []
    base = {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.9, "eos_token_id": 4, "bos_token_id": 1}
    for key in GEN_KEYS:
        for v in (BAD_VALUES if full else rng.sample(BAD_VALUES, 3)):
            new = {**base, key: v}
            cases.append(Case("generation_config", f"llama_gqa3/{key}={_label(v)}",
                              _write_file("llama_gqa3", "generation_config.json", json_bytes(new)), "either"))
    for label, change, expect in [("temperature-hot", {"temperature": "hot"}, "error"),
                                  ("top_p-nan", {"top_p": float("nan")}, "error"),
                                  ("top_k-1.5", {"top_k": 1.5}, "error"), ("eos-x", {"eos_token_id": "x"}, "error"),
                                  ("eos-list-x", {"eos_token_id": [4, "x"]}, "error"),
                                  ("repetition_penalty-0", {"repetition_penalty": 0}, "error"),
                                  ("do_sample-yes", {"do_sample": "yes"}, "error"),
                                  ("temperature-10**400", {"temperature": 10**400}, "error"),
                                  ("greedy-nulls", {"do_sample": False, "temperature": None, "top_p": None}, "ok")]:
        new = {**base, **change}
        cases.append(Case("generation_config", f"llama_gqa3/{label}",
                          _write_file("llama_gqa3", "generation_config.json", json_bytes(new)), expect, key=True))
    for label, content in [("not-json", b"{"), ("list", b"[1]"), ("deep", b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}")]:
        cases.append(Case("generation_config", f"llama_gqa3/file-{label}",
                          _write_file("llama_gqa3", "generation_config.json", content), key=label == "deep"))
    cases.append(Case("generation_config", "llama_gqa3/symlink-/dev/zero",
                      _symlink_file("llama_gqa3", "generation_config.json", "/dev/zero"), key=True))
    return cases


# --- tokenizer files ---------------------------------------------------------------------------------

CATASTROPHIC = ["(a+)+$", "(a|aa)+$", "(a*)*b", "(\\w+\\s?)*$", "(.*a){25}", "(x+x+)+y", "((a+)+)+c"]


def tokenizer_cases(rng: random.Random, full: bool) -> list[Case]:
    fx = "llama_gqa3"
    tok = json.loads((FIXTURES / fx / "tokenizer.json").read_text())
    cases = []
    evil_prompt = "a" * 60 + "!" + " x" * 30

    def variant(label: str, change: Callable[[dict], None], expect="error", key=False, prompt="Hello world"):
        new = json.loads(json.dumps(tok))
        change(new)
        data = json_bytes(new)

        def setup(d: Path) -> Run:
            ckpt = copy_fixture(fx, d)
            (ckpt / "tokenizer.json").write_bytes(data)
            return generate(ckpt, prompt=prompt)
        cases.append(Case("tokenizer", f"{fx}/tokenizer-{label}", setup, expect, key=key))

    def set_path(path: list, value):
        def change(t):
            node = t
            for p in path[:-1]:
                node = node[p]
            node[path[-1]] = value
        return change

    variant("post-processor-unknown-token", set_path(["post_processor", "single", 0], {"SpecialToken": {"id": "<nope>", "type_id": 0}}), key=True)
    variant("post-processor-ids-tokens-mismatch", set_path(["post_processor", "special_tokens", "<s>"], {"id": "<s>", "ids": [1, 2], "tokens": ["<s>"]}), key=True)
    variant("post-processor-id-out-of-vocab", set_path(["post_processor", "special_tokens", "<s>"], {"id": "<s>", "ids": [10**6], "tokens": ["<s>"]}))
    variant("post-processor-bert-unknown", set_path(["post_processor"], {"type": "BertProcessing", "sep": ["[SEP]", 10**6], "cls": ["[CLS]", 10**7]}), "either")
    variant("post-processor-not-object", set_path(["post_processor"], 5))
    for i, pattern in enumerate(CATASTROPHIC if full else CATASTROPHIC[:3]):
        variant(f"regex-{i}-{_label(pattern)}", set_path(["pre_tokenizer"], {"type": "Split", "pattern": {"Regex": pattern},
                                                                    "behavior": "Isolated", "invert": False}),
                "fail", key=i < 2, prompt=evil_prompt)
        variant(f"normalizer-regex-{i}", set_path(["normalizer"], {"type": "Replace", "pattern": {"Regex": pattern}, "content": "b"}),
                "fail", key=i == 0, prompt=evil_prompt)
    variant("regex-invalid", set_path(["pre_tokenizer"], {"type": "Split", "pattern": {"Regex": "(("}, "behavior": "Isolated", "invert": False}))
    variant("model-type-unknown", set_path(["model", "type"], "Nope"))
    variant("model-missing", lambda t: t.pop("model"))
    variant("vocab-list", set_path(["model", "vocab"], [1, 2]))
    variant("merges-unknown-tokens", lambda t: t["model"]["merges"].insert(0, ["zzq", "qqz"]), key=True)
    variant("added-token-id-huge", lambda t: t["added_tokens"].append({**t["added_tokens"][0], "id": 10**9, "content": "<huge>"}), "either")
    variant("added-tokens-wrong-type", set_path(["added_tokens"], "x"))
    variant("decoder-unknown", set_path(["decoder"], {"type": "Nope"}))
    variant("pre-tokenizer-not-object", set_path(["pre_tokenizer"], [1]))
    for label, content in [("not-json", b"{"), ("empty", b""), ("deep", b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
                           ("invalid-utf8", b'{"\xff": 1}')]:
        cases.append(Case("tokenizer", f"{fx}/tokenizer-file-{label}", _write_file(fx, "tokenizer.json", content), key=label == "deep"))
    for target in ["/dev/zero", "/proc/self/mem"]:
        cases.append(Case("tokenizer", f"{fx}/tokenizer-symlink-{target}", _symlink_file(fx, "tokenizer.json", target), key=True))
    cases.append(Case("tokenizer", f"{fx}/tokenizer-fifo", _special_file(fx, "tokenizer.json", "fifo"), key=True))

    # tokenizer_config.json
    tc = json.loads((FIXTURES / fx / "tokenizer_config.json").read_text())
    for key, values in [("chat_template", [["x"], 5, {"a": 1}, [{"name": "default"}], [{"template": 5, "name": "default"}], [5], None, True]),
                        ("bos_token", [5, ["x"], {"content": 5}, {"x": 1}, None]),
                        ("eos_token", [5, {"content": None}, 1.5])]:
        for v in values:
            new = {**tc, key: v}

            def setup(d: Path, new=new) -> Run:
                ckpt = copy_fixture(fx, d)
                (ckpt / "chat_template.jinja").unlink()
                (ckpt / "tokenizer_config.json").write_text(json.dumps(new))
                return generate(ckpt, "--chat")
            cases.append(Case("tokenizer_config", f"{fx}/{key}={_label(v)}", setup, "either",
                              key=key == "chat_template" and v in (5, ["x"])))
    for label, content in [("not-json", b"{"), ("list", b"[]"), ("deep", b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}")]:
        cases.append(Case("tokenizer_config", f"{fx}/tokenizer_config-{label}", _write_file(fx, "tokenizer_config.json", content)))
    for label, content in [("invalid-utf8", b"{{ '\xff' }}"), ("binary", bytes(range(256)) * 4)]:
        def setup(d: Path, content=content) -> Run:
            ckpt = copy_fixture(fx, d)
            (ckpt / "chat_template.jinja").write_bytes(content)
            return generate(ckpt, "--chat")
        cases.append(Case("tokenizer_config", f"{fx}/chat_template.jinja-{label}", setup, key=label == "invalid-utf8"))
    cases.append(Case("tokenizer_config", f"{fx}/chat_template.jinja-fifo", _chat_special("fifo"), key=True))
    cases.append(Case("tokenizer_config", f"{fx}/chat_template.jinja-dev-zero", _chat_special("/dev/zero"), key=True))
    return cases


def _chat_special(kind: str):
    def setup(d: Path) -> Run:
        ckpt = copy_fixture("llama_gqa3", d)
        (ckpt / "chat_template.jinja").unlink()
        if kind == "fifo":
            os.mkfifo(ckpt / "chat_template.jinja")
        else:
            (ckpt / "chat_template.jinja").symlink_to(kind)
        return generate(ckpt, "--chat")
    return setup


# --- chat templates ----------------------------------------------------------------------------------

TEMPLATES = {
    # label: (template, expect)
    "syntax-error": ("{% for %}", "error"),
    "div-zero": ("{{ 1/0 }}", "error"),
    "include": ("{% include 'x.html' %}", "error"),
    "import": ("{% import 'x.html' as x %}", "error"),
    "extends": ("{% extends 'base' %}", "error"),
    "recursive-macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "error"),
    "range-10**6": ("{% for i in range(10**6) %}x{% endfor %}", "either"),
    "range-10**9-step": ("{{ range(0, 10**9, 1000)|list|length }}", "either"),
    "str-times-10**9": ("{{ 'a' * 10**9 }}", "error"),
    "list-times-10**9": ("{{ ([0] * 10**9)|length }}", "error"),
    "pow-tower": ("{{ 10 ** (10 ** 10) }}", "error"),
    "pow-left": ("{{ 10 ** 10 ** 10 }}", "either"),
    "pow-big": ("{{ (7 ** 1000000) % 10 }}", "either"),   # 0.4 s of work: bounded, so it may render
    "nested-loops-2": ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", "error"),
    "nested-loops-3-output": ("{% for i in range(999) %}{% for j in range(999) %}{% for k in range(999) %}x{% endfor %}{% endfor %}{% endfor %}", "error"),
    "center-10**9": ("{{ 'a'.center(10**9) }}", "error"),
    "ljust-10**9": ("{{ 'a'.ljust(10**9) }}", "error"),
    "zfill-10**9": ("{{ '1'.zfill(10**9) }}", "error"),
    "expandtabs": ("{{ '\\t'.expandtabs(10**9) }}", "error"),
    "format-width": ("{{ '{:>999999999}'.format(1) }}", "error"),
    "format-filter-width": ("{{ '%999999999d'|format(1) }}", "error"),
    "percent-width": ("{{ '%999999999d' % 1 }}", "error"),
    "center-filter": ("{{ 'a'|center(10**9) }}", "error"),
    "indent-filter": ("{{ 'a\\nb'|indent(10**9) }}", "error"),
    "wordwrap-filter": ("{{ ('a ' * 1000)|wordwrap(10**9) }}", "either"),
    "slice-filter": ("{{ range(10)|slice(10**9)|list|length }}", "error"),
    "batch-filter": ("{{ range(10)|batch(10**9, 'x')|list|length }}", "error"),
    "lipsum": ("{{ lipsum(10**5) }}", "error"),
    "doubling-string": ("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}", "error"),
    "doubling-plus": ("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}", "error"),
    "join-big": ("{{ range(99999)|join(',') }}", "either"),
    "tojson-indent": ("{{ messages|tojson(indent=10**9) }}", "error"),
    "raise-exception": ("{{ raise_exception('nope') }}", "error"),
    "undefined-attr": ("{{ nothing.attr.more }}", "error"),
    "messages-index": ("{{ messages[5]['content'] }}", "error"),
    "strftime-huge": ("{{ strftime_now('%Y' * 10**6) }}", "error"),
    "escape-class": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "error"),
    "escape-cycler": ("{{ cycler.__init__.__globals__.os.system('true') }}", "error"),
    "escape-self": ("{{ self._TemplateReference__context }}", "either"),
    "escape-format": ("{{ '{0.__class__}'.format(1) }}", "error"),
    "escape-mro-attr": ("{{ messages|attr('__class__') }}", "error"),
    "escape-namespace": ("{{ namespace.__init__.__globals__ }}", "error"),
    "escape-joiner": ("{{ joiner.__init__.__globals__['__builtins__'] }}", "error"),
    "mutate-list": ("{{ messages.append(1) }}", "error"),
    "ok-plain": ("{% for m in messages %}{{ m['content'] }}{% endfor %}", "ok"),
    "empty-output": ("", "fail"),
    "dict-repeat": ("{{ (dict(a=1)|string) * 10**9 }}", "error"),
    "quadratic-list": ("{% set ns = namespace(x=[]) %}{% for i in range(99999) %}{% set ns.x = ns.x + [i] %}{% endfor %}", "error"),
    "nested-string-loops": ("{% for c in 'x' * 99999 %}{% for d in 'y' * 99999 %}{% endfor %}{% endfor %}", "error"),
    "tojson-repeat": ("{{ (messages|tojson) * 1000000 }}", "error"),
    "cycler-huge": ("{{ cycler(*range(99999)).next() }}", "either"),
    "caller": ("{% macro m() %}{{ caller() }}{% endmacro %}{% call m() %}{{ messages[0]['content'] }}{% endcall %}", "ok"),
    "escape-lipsum-globals": ("{{ lipsum.__globals__['os'].system('touch PWNED') }}", "error"),
    "escape-raise-globals": ("{{ raise_exception.__globals__ }}", "error"),
    "escape-strftime-globals": ("{{ strftime_now.__globals__['datetime'] }}", "error"),
    "escape-attr-filter": ("{{ (messages|attr('__class__')).__mro__ }}", "error"),
    "escape-subclasses": ("{{ [].__class__.__base__.__subclasses__() }}", "error"),
    "escape-format-map": ("{{ '{0.__globals__}'.format_map(namespace) }}", "error"),
    "escape-range-self": ("{{ range.__self__ }}", "error"),
    "escape-getattr-chain": ("{{ messages.pop() }}", "error"),
    "lone-surrogate-output": ("{{ '\udcff' }}", "error"),
    "deep-parens": ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "either"),
    "huge-source": ("{# " + "x" * 8_000_000 + " #}ok", "either"),
}


def template_cases(rng: random.Random, full: bool) -> list[Case]:
    cases = []
    for label, (template, expect) in TEMPLATES.items():
        def setup(d: Path, template=template) -> Run:
            ckpt = copy_fixture("llama_gqa3", d)
            (ckpt / "chat_template.jinja").write_text(template, errors="surrogatepass")

            def check(code, out, err, d):
                return "the template escaped the sandbox" if any(d.rglob("PWNED")) else None
            return Run(args=generate(ckpt, "--chat").args, timeout=20, check=check)
        cases.append(Case("template", f"llama_gqa3/{label}", setup, expect,
                          key=label in ("div-zero", "include", "recursive-macro", "range-10**6", "str-times-10**9",
                                        "nested-loops-2", "escape-class", "ok-plain", "center-10**9", "pow-tower",
                                        "format-width", "doubling-string", "slice-filter")))
    return cases


# --- command-line flags and prompts ----------------------------------------------------------------

def flag_cases(rng: random.Random, full: bool) -> list[Case]:
    cases = []
    fx = "llama_gqa3"

    def flags(label: str, args: list, expect="usage", key=False, stdin=b"", files: Callable | None = None):
        def setup(d: Path) -> Run:
            extra = files(d) if files else []
            return Run(args=["generate", "--model", str(FIXTURES / fx), "-m", "3", "-q", *args, *extra], stdin=stdin)
        cases.append(Case("flags", label, setup, expect, key=key))

    for flag, values in [("--temp", ["nan", "inf", "-1", "x", "-inf"]), ("--top-p", ["nan", "0", "1.5", "-0.1", "inf"]),
                         ("--min-p", ["nan", "-0.1", "1.5"]), ("--repeat-penalty", ["nan", "0", "-1", "inf"]),
                         ("--seed", ["-1", "x", "1.5", str(2**64), str(-2**70)]), ("--top-k", ["-1", "1.5", "nan"]),
                         ("--max-context", ["0", "-1", str(10**12), "257", "x"]), ("-m", ["-1", "x", str(10**30)]),
                         ("--repeat-last-n", ["-1", "x"])]:
        for v in values:
            expect = "either" if (flag, v) in (("--seed", str(2**64)), ("-m", str(10**30))) else "usage"
            flags(f"{flag}={v}", [flag, v, "Hello"], expect,
                  key=(flag, v) in (("--temp", "nan"), ("--seed", "-1"), ("--max-context", str(10**12)), ("--top-p", "nan"),
                                    ("--min-p", "nan"), ("--repeat-penalty", "nan")))
    flags("stop-empty", ["--stop", "", "Hello"])
    flags("attn-layers-bad", ["--dump-attention", "x.npz", "--attn-layers", "x", "Hello"], "fail")
    flags("prompt-invalid-utf8-arg", ["Hello \udcff world"], "fail", key=True)
    flags("prompt-stdin-invalid-utf8", ["-p", "-"], "fail", key=True, stdin=b"Hello \xff\xfe world")
    flags("prompt-stdin-empty", ["-p", "-"], "either", stdin=b"")  # as -p "": BOS only, if the tokenizer adds one
    flags("prompt-file-binary", ["-f"], "fail", key=True, files=lambda d: [_write(d / "b.bin", bytes(range(256)))])
    flags("prompt-file-latin1", ["-f"], "fail", key=True, files=lambda d: [_write(d / "l.txt", "café".encode("latin-1"))])
    flags("prompt-file-dev-zero", ["-f", "/dev/zero"], "fail", key=True)
    flags("prompt-file-fifo", ["-f"], "either", key=True, files=lambda d: [_fifo(d / "p.fifo")])  # reads as empty
    flags("prompt-file-dir", ["-f"], "fail", files=lambda d: [str(d)])
    flags("prompt-file-proc-mem", ["-f", "/proc/self/mem"], "fail")
    flags("prompt-huge-arg", ["x " * 100_000], "fail")
    flags("prompt-nul", ["a\0b"], "either")
    flags("stop-escape", ["--stop", "\\n", "Hello"], "either")
    for label, target in [("dev-null-symlink", "devnull-link"), ("char-device-clone", "chardev"), ("fifo", "fifo"),
                          ("directory", "dir")]:
        cases.append(Case("flags", f"--dump-attention-{label}", _output_target(fx, "--dump-attention", target), "fail",
                          key=target in ("devnull-link", "chardev")))
    cases.append(Case("flags", "attention-html-char-device-clone", _output_target(fx, "--html", "chardev"), "fail", key=True))
    return cases


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _fifo(path: Path) -> str:
    os.mkfifo(path)
    return str(path)


def _make_target(d: Path, kind: str) -> str:
    p = d / f"target-{kind}"
    if kind == "devnull-link":
        p.symlink_to(os.devnull)       # os.replace onto p would replace the link, never /dev/null itself
    elif kind == "chardev":
        os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null clone inside the temp dir
    elif kind == "fifo":
        os.mkfifo(p)
    else:
        p.mkdir()
    return str(p)


def _output_target(fx: str, opt: str, kind: str):
    def setup(d: Path) -> Run:
        target = _make_target(d, kind)
        before = _kind(Path(target))
        if opt == "--html":
            args = ["attention", "--model", str(FIXTURES / fx), "--html", target, "Hello world"]
        else:
            args = ["generate", "--model", str(FIXTURES / fx), "-m", "2", "-q", opt, target, "Hello"]

        def check(code, out, err, d, target=target, before=before):
            if _kind(Path(target)) != before:
                return f"replaced {target} ({before} -> {_kind(Path(target))})"
            return None
        return Run(args=args, check=check)
    return setup


def _kind(p: Path) -> str:
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return "missing"
    return "link" if stat.S_ISLNK(st.st_mode) else stat.filemode(st.st_mode)[0]


# --- the Python API ----------------------------------------------------------------------------------

def api_cases(rng: random.Random, full: bool) -> list[Case]:
    cases = []
    fx = str(FIXTURES / "llama_gqa3")
    calls = {
        "top_k=1.5": dict(top_k=1.5), "seed=x": dict(seed="x"), "seed=-1": dict(seed=-1), "stop=5": dict(stop=5),
        "stop=[5]": dict(stop=[5]), "stop=['']": dict(stop=[""]), "max_tokens=None": dict(max_tokens=None),
        "max_tokens=1.5": dict(max_tokens=1.5), "max_tokens=-1": dict(max_tokens=-1), "temp=hot": dict(temp="hot"),
        "temp=nan": dict(temp=float("nan")), "temp=True": dict(temp=True), "top_p=nan": dict(top_p=float("nan")),
        "top_p=0": dict(top_p=0), "min_p=2": dict(min_p=2), "repeat_penalty=0": dict(repeat_penalty=0),
        "repeat_last_n=None": dict(repeat_last_n=None), "max_context=1.5": dict(max_context=1.5),
        "max_context=10**12": dict(max_context=10**12), "ignore_eos=x": dict(ignore_eos="x"),
        "unknown-option": dict(nope=1), "prompt=[1.5]": dict(prompt=[1.5]), "prompt=[]": dict(prompt=[]),
        "prompt=None": dict(prompt=None), "prompt=[-1]": dict(prompt=[-1]), "prompt=[10**9]": dict(prompt=[10**9]),
        "prompt=['a']": dict(prompt=["a"]), "prompt=[True]": dict(prompt=[True]), "prompt=5": dict(prompt=5),
        "prompt=b'x'": dict(prompt=b"x"), "system=5": dict(system=5, chat=True), "chat=x": dict(chat="x"),
        "prompt-surrogate": dict(prompt="a\udcffb"),
        "temp=np.nan": dict(temp="np.float32(nan)"), "top_k=np.float64(2)": dict(top_k="np.float64(2.0)"),
        "stop=('a', 5)": dict(stop=("a", 5)), "stop=b'x'": dict(stop=b"x"), "system=b'x'": dict(system=b"x", chat=True),
        "prompt=2-D array": dict(prompt="np.array([[1, 2]])"), "prompt=float array": dict(prompt="np.array([1.0])"),
        "max_context=0": dict(max_context=0), "repeat_penalty=inf": dict(repeat_penalty=float("inf")),
    }
    ok_calls = {"max_tokens=np.int64(3)": dict(max_tokens="np.int64(3)"), "seed=np.uint64(5)": dict(seed="np.uint64(5)"),
                "prompt=range(3)": dict(prompt="range(1, 4)"), "prompt=np.array": dict(prompt="np.array([1, 2])"),
                "seed=2**70": dict(seed=2**70), "max_tokens=0": dict(max_tokens=0), "stop=[]": dict(stop=[])}
    for label, kw in [*calls.items(), *ok_calls.items()]:
        def call(kw=kw):
            import numpy as np
            import minigen
            model, tok = minigen.load(fx)
            kw = {k: eval(v, {"np": np, "nan": float("nan")}) if isinstance(v, str) and v[:3] in ("np.", "ran") else v
                  for k, v in kw.items()}
            prompt = kw.pop("prompt", "Hello")
            return minigen.generate(model, tok, prompt, **{"max_tokens": 3, **kw})
        cases.append(Case("api", f"generate({label})", lambda d, call=call: Run(kind="api", api=call),
                          "ok" if label in ok_calls else "error",
                          key=label in ("top_k=1.5", "seed=x", "stop=5", "max_tokens=None", "prompt=[1.5]")))
    for label, arg in [("None", None), ("int", 5), ("list", [fx]), ("bytes-path", fx.encode()), ("missing", "/nonexistent/x")]:
        def call(arg=arg):
            import minigen
            return minigen.load(arg)
        cases.append(Case("api", f"load({label})", lambda d, call=call: Run(kind="api", api=call), "either" if label == "bytes-path" else "error",
                          key=label == "None"))

    def big_context(d):
        def call():
            import dataclasses
            import minigen
            from minigen.generation.options import Options
            from minigen.generation.steps import generate_step
            model, tok = minigen.load(fx)
            model.config = dataclasses.replace(model.config, max_position_embeddings=10**12)  # a config's huge context
            steps = generate_step(model, [1, 2, 3], Options(max_tokens=10**12, max_context=10**12))
            for _ in range(3):
                next(steps)
            return "ok"
        return Run(kind="api", api=call)
    cases.append(Case("api", "generate_step(max_tokens=10**12, max_context=10**12)", big_context, "ok", key=True))

    def huge_config_context(d):
        ckpt = copy_fixture("llama_gqa3", d)
        cfg = json.loads((ckpt / "config.json").read_text())
        cfg["max_position_embeddings"] = 10**12
        (ckpt / "config.json").write_text(json.dumps(cfg))
        return Run(args=["generate", "--model", str(ckpt), "-m", str(10**9), "-q", "--stop", "e", "Hello"], timeout=30)
    cases.append(Case("config", "llama_gqa3/max_position_embeddings=10**12-with-long-m", huge_config_context, "either", key=True))
    return cases


# --- signals and streams (real processes) ---------------------------------------------------------

HARNESS = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal, even if the runner ignores SIGINT
marker, where = sys.argv[1], sys.argv[2]
sys.argv = ["minigen"] + sys.argv[3:]
import minigen.cli
if where == "load":
    import minigen.checkpoint.resolve as C
    real = C.load_params
    def slow(*a, **k):
        open(marker, "w").close(); time.sleep(30); return real(*a, **k)
    C.load_params = slow
elif where == "generate":
    import minigen.generation.steps as G
    real = G.generate_step
    def slow(*a, **k):
        for i, s in enumerate(real(*a, **k)):
            if i == 1:
                open(marker, "w").close(); time.sleep(30)
            yield s
    G.generate_step = slow
minigen.cli.main(prog_name="minigen")
"""


def _python_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PYTHONUNBUFFERED", None)  # as a user's shell would have it: stdout block-buffered into files
    return env


def _signal_case(where: str, sig: int, args: Callable[[Path], list], want_code: int):
    def proc(d: Path):
        marker = d / "marker"
        p = subprocess.Popen([sys.executable, "-c", HARNESS, str(marker), where, *args(d)], cwd=d,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_python_env())
        deadline = time.time() + 30
        while not marker.exists() and p.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        if p.poll() is None:
            p.send_signal(sig)
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            return None, out, err
        return p.returncode, out, err

    def check(code, out, err, d):
        left = [p.name for p in d.rglob("*.tmp")]
        if left:
            return f"temporary files left behind: {left}"
        if code != want_code:
            return f"exit code {code}, expected {want_code}"
        return None
    return lambda d: Run(kind="proc", proc=proc, check=check)


def _stream_case(mode: str, args: list):
    def proc(d: Path):
        cmd = [sys.executable, "-m", "minigen", *args]
        if mode in ("closed", "stderr-closed", "stdin-closed", "all-closed"):
            redirect = {"closed": ">&-", "stderr-closed": f"2>&- >{_q(str(d / 'out.txt'))}", "stdin-closed": "<&-",
                        "all-closed": "<&- >&- 2>&-"}[mode]
            shell = " ".join(_q(c) for c in cmd) + " " + redirect
            p = subprocess.run(["bash", "-c", shell], stderr=subprocess.PIPE, env=_python_env(), cwd=d, timeout=60)
            return p.returncode, b"", p.stderr
        if mode == "full":
            def limit():
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (1, 1))
            with open(d / "out.txt", "wb") as f:
                p = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, env=_python_env(), cwd=d, timeout=60,
                                   preexec_fn=limit)
            return p.returncode, b"", p.stderr
        shell = " ".join(_q(c) for c in cmd) + f" | head -c 1 >{_q(str(d / 'head.txt'))}; exit ${{PIPESTATUS[0]}}"
        p = subprocess.run(["bash", "-c", shell], stderr=subprocess.PIPE, env=_python_env(), cwd=d, timeout=60)
        return p.returncode, b"", p.stderr
    return lambda d: Run(kind="proc", proc=proc)


def _q(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def process_cases(rng: random.Random, full: bool) -> list[Case]:
    fx = str(FIXTURES / "llama_gqa3")
    gen = ["generate", "--model", fx, "-m", "40", "--ignore-eos", "Hello world"]
    cases = [
        Case("signal", "sigint-while-loading", _signal_case("load", signal.SIGINT, lambda d: gen, 130), "fail", key=True),
        Case("signal", "sigterm-while-loading", _signal_case("load", signal.SIGTERM, lambda d: gen, 143), "fail", key=True),
        Case("signal", "sigint-while-generating", _signal_case("generate", signal.SIGINT, lambda d: gen, 130), "either"),
        Case("signal", "sigterm-generate-dump", _signal_case("generate", signal.SIGTERM,
                                                             lambda d: gen + ["--dump-attention", str(d / "x.npz")], 143),
             "fail", key=True),
        Case("signal", "sigint-generate-dump", _signal_case("generate", signal.SIGINT,
                                                            lambda d: gen + ["--dump-attention", str(d / "x.npz")], 130),
             "fail"),
        Case("stream", "stdout-closed-generate", _stream_case("closed", gen), "fail", key=True),
        Case("stream", "stdout-closed-info", _stream_case("closed", ["info", "--model", fx]), "fail"),
        Case("stream", "stdout-full-generate", _stream_case("full", gen), "fail", key=True),
        Case("stream", "stdout-full-info", _stream_case("full", ["info", "--model", fx]), "fail", key=True),
        Case("stream", "stdout-broken-pipe", _stream_case("pipe", gen + ["-q"]), "either", key=True),
        Case("stream", "stderr-closed", _stream_case("stderr-closed", gen), "ok", key=True),
        Case("stream", "stderr-closed-bad-checkpoint", _stream_case("stderr-closed", ["generate", "--model", "/nonexistent", "hi"]), "fail"),
        Case("stream", "stdin-closed-prompt-from-stdin", _stream_case("stdin-closed", ["generate", "--model", fx, "-p", "-"]), "fail"),
        Case("stream", "all-closed", _stream_case("all-closed", gen), "fail"),
    ]
    gguf = _default_gguf()
    if gguf is not None and full:
        def convert_sigterm(d: Path) -> Run:
            def proc(d: Path):
                p = subprocess.Popen([sys.executable, "-m", "minigen", "convert", str(gguf), str(d / "out")], cwd=d,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_python_env())
                deadline = time.time() + 60
                while not any(d.glob(".out.*.tmp/*")) and p.poll() is None and time.time() < deadline:
                    time.sleep(0.02)
                time.sleep(0.3)
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                out, err = p.communicate(timeout=60)
                return p.returncode, out, err

            def check(code, out, err, d):
                left = [p.name for p in d.iterdir() if p.name.endswith(".tmp")]
                return f"temporary files left behind: {left}" if left else (
                    None if code == 143 else f"exit code {code}, expected 143")
            return Run(kind="proc", proc=proc, check=check, timeout=120)
        cases.append(Case("signal", "sigterm-during-convert", convert_sigterm, "fail"))
    return cases


def _default_gguf() -> Path | None:
    try:
        from minigen.checkpoint.default_model import gguf_source
        return gguf_source()
    except Exception:
        return None


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
            return Run(args=["convert", str(src), target], check=_converted_loads(Path(target)))
        cases.append(Case("gguf", label, setup, expect))

    for key, value in [("llama.attention.head_count", 0), ("llama.block_count", 2**32), ("llama.embedding_length", 0),
                       ("llama.attention.head_count_kv", 0), ("llama.context_length", 0),
                       ("tokenizer.ggml.bos_token_id", 10**6), ("llama.rope.freq_base", float("nan")),
                       ("llama.attention.layer_norm_rms_epsilon", -1.0), ("llama.attention.head_count", "x")]:
        with_meta(f"{key}={_label(value)}", key, value)
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


def _converted_loads(out: Path):
    def check(code, stdout, stderr, d):
        if code != 0:
            return None
        r = subprocess.run([sys.executable, "-m", "minigen", "generate", "--model", str(out), "-m", "3", "-q", "hi"],
                           capture_output=True, env=_python_env(), timeout=60)
        if r.returncode != 0:
            return f"convert exited 0 but minigen refuses the result: {r.stderr.decode(errors='replace').strip()[:200]}"
        return None
    return check


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
                return Run(args=["convert", str(f), str(d / "out")], check=_converted_loads(d / "out"), timeout=30)
            cases.append(Case("gguf-bytes", f"{stem}/{label}", setup, "either"))
    return cases


# --- running ---------------------------------------------------------------------------------------

@dataclass
class Result:
    case: Case
    outcome: str
    code: int | None
    detail: str
    seconds: float


def all_cases(seed: int = 0, full: bool = True, with_gguf: bool = False) -> list[Case]:
    rng = random.Random(seed)
    makers = [safetensors_cases, index_cases, config_cases, generation_config_cases, tokenizer_cases,
              template_cases, flag_cases, api_cases, process_cases] + ([gguf_cases, gguf_byte_cases] if with_gguf else [])
    return check_unique([c for make in makers for c in make(random.Random(rng.random()), full)])


def check_unique(cases: list[Case]) -> list[Case]:
    names = Counter(f"{c.category}/{c.name}" for c in cases)
    twice = [n for n, k in names.items() if k > 1]
    assert not twice, f"case names must be unique: {twice[:5]}"
    return cases


def fast_cases(seed: int = 0, size: int = 160, gguf_size: int = 36) -> list[Case]:
    """The CI subset: every key case, then a seeded sample of the rest of the small corpus, and a seeded
    sample of the damaged GGUFs."""
    cases = all_cases(seed, full=False)
    key = [c for c in cases if c.key]
    rest = [c for c in cases if not c.key]
    rng = random.Random(seed)
    rng.shuffle(rest)
    ggufs = gguf_byte_cases(random.Random(seed), False)
    return check_unique(key + rest[:max(0, size - len(key))] + rng.sample(ggufs, min(gguf_size, len(ggufs))))


def classify(case: Case, run: Run, code: int | None, out: bytes, err: bytes, d: Path, timed_out: bool) -> tuple[str, str]:
    text = err.decode("utf-8", "replace")
    lines = [l for l in text.splitlines() if l.strip()]
    first = lines[0] if lines else ""
    if timed_out:
        return "hang", "time limit"
    if "MemoryError" in text or "minigen: error: out of memory" in text or code in (-signal.SIGKILL,):
        return "hang", "killed" if code == -signal.SIGKILL else "out of memory"
    if "Traceback (most recent call last)" in text or "panicked at" in text:
        tb = [l for l in lines if not l.startswith(" ")]
        return "traceback", (tb[-1] if tb else first)[:200]
    problem = run.check(code, out, err, d) if run.check else None
    if problem:
        return "wrong", problem
    if code == 0:
        if case.expect in ("error", "usage", "fail"):
            return "wrong", "exit 0; expected an error" + (f" ({first[:120]})" if first else "")
        noise = [l for l in lines if "Warning" in l]
        if noise:
            return "wrong", f"exit 0 with a warning: {noise[0][:160]}"
        return "ok", ""
    if code is None or code < 0:
        return "wrong", f"killed by signal {-code if code else '?'}"
    if case.expect == "ok":
        return "wrong", f"exit {code}: {first[:160]}"
    usage = any(l.startswith("Error:") for l in lines) and any(l.startswith("Usage:") for l in lines)
    one_line = len(lines) == 1 and first.startswith("minigen: error:")
    if case.category == "signal" or case.category == "stream":
        return "ok-error", first[:160]
    if not (one_line or usage):
        return "wrong", f"exit {code}, {len(lines)} lines: {' | '.join(lines[:3])[:200]}"
    if case.expect == "usage" and code != 2:
        return "wrong", f"exit {code} for a usage error: {first[:160]}"
    if case.expect == "error" and code != 1 and not usage:
        return "wrong", f"exit {code}: {first[:160]}"
    return "ok-error", (lines[-1] if usage else first)[:160]


def _child(run: Run, d: Path, mem_limit: int) -> int:
    """In the forked child: run the case with fds 0/1/2 on files, under a memory limit."""
    stdin = d / ".stdin"
    stdin.write_bytes(run.stdin)
    fd0 = os.open(stdin, os.O_RDONLY)
    fd1 = os.open(d / ".stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    fd2 = os.open(d / ".stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for src, dst in ((fd0, 0), (fd1, 1), (fd2, 2)):
        os.dup2(src, dst)
    sys.stdin = open(0, "r", encoding="utf-8", errors="surrogateescape", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
    resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))
    os.environ.update({k: v.replace("{dir}", str(d)) for k, v in run.env.items()})
    os.chdir(d)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if run.kind == "api":
            from minigen import MinigenError
            try:
                run.api()
                return 0
            except MinigenError as e:
                print(f"minigen: error: {e}", file=sys.stderr)
                return 1
        from minigen.cli import main
        main.main(args=run.args, prog_name="minigen")
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except BaseException:
                pass


def _vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def run_cases(cases: list[Case], workers: int = 2, timeout: float = 15.0, verbose: bool = False,
              mem_extra: int = 2 << 30) -> list[Result]:
    import minigen.cli  # noqa: F401  (imported once here, inherited by every forked child)
    import minigen.checkpoint.resolve  # noqa: F401  (minigen's names load on first use: load them here)
    import minigen.generation.chat  # noqa: F401
    import minigen.inspect.dump  # noqa: F401
    import jinja2.sandbox  # noqa: F401
    import tokenizers  # noqa: F401
    root = Path(tempfile.mkdtemp(prefix="minigen-faults-"))
    mem_limit = _vm_size() + mem_extra
    results: list[Result] = []
    pending = list(enumerate(cases))
    running: dict[int, tuple] = {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                i, case = pending.pop(0)
                d = root / f"{i:05d}"
                d.mkdir()
                start = time.time()
                try:
                    run = case.setup(d)
                except Exception as e:
                    results.append(Result(case, "wrong", None, f"setup failed: {e!r}", 0.0))
                    continue
                if run.kind == "proc":
                    try:
                        code, out, err = run.proc(d)
                        outcome, detail = classify(case, run, code, out, err, d, code is None)
                    except subprocess.TimeoutExpired:
                        outcome, detail, code = "hang", "time limit", None
                    results.append(Result(case, outcome, code, detail, time.time() - start))
                    _report(results[-1], verbose)
                    shutil.rmtree(d, ignore_errors=True)
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        code = _child(run, d, mem_limit)
                    finally:
                        os._exit(code if isinstance(code, int) and 0 <= code < 256 else 1)
                running[pid] = (case, run, d, start, start + (run.timeout or timeout))
            time.sleep(0.005)
            for pid, (case, run, d, start, deadline) in list(running.items()):
                done, status = os.waitpid(pid, os.WNOHANG)
                timed_out = False
                if not done:
                    if time.time() < deadline:
                        continue
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    timed_out, status = True, 0
                del running[pid]
                code = os.waitstatus_to_exitcode(status) if not timed_out else None
                out = _read(d / ".stdout")
                err = _read(d / ".stderr")
                outcome, detail = classify(case, run, code, out, err, d, timed_out)
                if outcome in ("ok", "ok-error"):
                    left = [p.name for p in d.rglob("*.tmp")]
                    if left:
                        outcome, detail = "wrong", f"temporary files left behind: {left}"
                results.append(Result(case, outcome, code, detail, time.time() - start))
                _report(results[-1], verbose)
                shutil.rmtree(d, ignore_errors=True)
    finally:
        for pid in running:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
        shutil.rmtree(root, ignore_errors=True)
    return results


def _read(p: Path) -> bytes:
    try:
        return p.read_bytes()[:200_000]
    except OSError:
        return b""


def _report(r: Result, verbose: bool):
    if verbose or r.outcome not in ("ok", "ok-error"):
        print(f"{r.outcome:9} {r.case.category}/{r.case.name} [{r.code}] {r.detail}", flush=True)


def summary(results: list[Result]) -> str:
    table = defaultdict(Counter)
    for r in results:
        table[r.case.category][r.outcome] += 1
    lines = [f"{'category':20}" + "".join(f"{o:>11}" for o in OUTCOMES) + f"{'total':>8}"]
    for cat in sorted(table):
        lines.append(f"{cat:20}" + "".join(f"{table[cat][o]:>11}" for o in OUTCOMES) + f"{sum(table[cat].values()):>8}")
    total = Counter(r.outcome for r in results)
    lines.append(f"{'all':20}" + "".join(f"{total[o]:>11}" for o in OUTCOMES) + f"{len(results):>8}")
    return "\n".join(lines)


def main(argv=None):
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: forked children must not inherit BLAS threads
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast", action="store_true", help="the CI subset")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gguf", action="store_true", help="add corrupted GGUFs (minigen convert)")
    ap.add_argument("-k", dest="pattern", help="only cases whose category/name contains this")
    ap.add_argument("-j", "--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=15.0, help="seconds per case")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--json", metavar="FILE", help="write every result as JSON")
    args = ap.parse_args(argv)
    cases = fast_cases(args.seed) if args.fast else all_cases(args.seed, full=True, with_gguf=args.gguf)
    if args.pattern:
        cases = [c for c in cases if args.pattern in f"{c.category}/{c.name}"]
    start = time.time()
    results = run_cases(cases, args.workers, args.timeout, args.verbose)
    print(summary(results))
    slowest = sorted(results, key=lambda r: -r.seconds)[:5]
    print("slowest: " + ", ".join(f"{r.case.category}/{r.case.name} {r.seconds:.1f} s" for r in slowest))
    print(f"{len(results)} cases in {time.time() - start:.0f} s (seed {args.seed})")
    if args.json:
        Path(args.json).write_text(json.dumps([dict(category=r.case.category, name=r.case.name, outcome=r.outcome,
                                                    code=r.code, detail=r.detail, seconds=round(r.seconds, 2))
                                               for r in results], indent=1))
    return 0 if all(r.outcome in ("ok", "ok-error") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

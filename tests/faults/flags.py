"""Command-line flags and prompts (bad values, prompt files of every kind, output targets that are devices),
and the Python API's arguments."""
from __future__ import annotations

import json
import os
import random
import stat
from pathlib import Path
from typing import Callable

from .core import FIXTURES, Case, Run, copy_fixture, make_fifo, write_to

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
    flags("prompt-file-binary", ["-f"], "fail", key=True, files=lambda d: [write_to(d / "b.bin", bytes(range(256)))])
    flags("prompt-file-latin1", ["-f"], "fail", key=True, files=lambda d: [write_to(d / "l.txt", "café".encode("latin-1"))])
    flags("prompt-file-dev-zero", ["-f", "/dev/zero"], "fail", key=True)
    flags("prompt-file-fifo", ["-f"], "either", key=True, files=lambda d: [make_fifo(d / "p.fifo")])  # reads as empty
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




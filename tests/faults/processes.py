"""Real processes: Ctrl-C and SIGTERM while loading, generating and converting; stdout closed, full or a
broken pipe; stdin and stderr closed."""
from __future__ import annotations

import random
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from .core import FIXTURES, Case, Run, python_env, shell_quote

# --- signals and streams (real processes) ---------------------------------------------------------

HARNESS = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal, even if the runner ignores SIGINT
marker, where = sys.argv[1], sys.argv[2]
sys.argv = ["minigen"] + sys.argv[3:]
import minigen.cli
if where == "load":
    import minigen.resolve as C
    real = C.load_params
    def slow(*a, **k):
        open(marker, "w").close(); time.sleep(30); return real(*a, **k)
    C.load_params = slow
elif where == "generate":
    import minigen.generation.steps as G
    real = G.decode
    def slow(*a, **k):
        for i, s in enumerate(real(*a, **k)):
            if i == 1:
                open(marker, "w").close(); time.sleep(30)
            yield s
    G.decode = slow
minigen.cli.main(prog_name="minigen")
"""



def _signal_case(where: str, sig: int, args: Callable[[Path], list], want_code: int):
    def proc(d: Path):
        marker = d / "marker"
        p = subprocess.Popen([sys.executable, "-c", HARNESS, str(marker), where, *args(d)], cwd=d,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=python_env())
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
            redirect = {"closed": ">&-", "stderr-closed": f"2>&- >{shell_quote(str(d / 'out.txt'))}", "stdin-closed": "<&-",
                        "all-closed": "<&- >&- 2>&-"}[mode]
            shell = " ".join(shell_quote(c) for c in cmd) + " " + redirect
            p = subprocess.run(["bash", "-c", shell], stderr=subprocess.PIPE, env=python_env(), cwd=d, timeout=60)
            return p.returncode, b"", p.stderr
        if mode == "full":
            def limit():
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (1, 1))
            with open(d / "out.txt", "wb") as f:
                p = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, env=python_env(), cwd=d, timeout=60,
                                   preexec_fn=limit)
            return p.returncode, b"", p.stderr
        shell = " ".join(shell_quote(c) for c in cmd) + f" | head -c 1 >{shell_quote(str(d / 'head.txt'))}; exit ${{PIPESTATUS[0]}}"
        p = subprocess.run(["bash", "-c", shell], stderr=subprocess.PIPE, env=python_env(), cwd=d, timeout=60)
        return p.returncode, b"", p.stderr
    return lambda d: Run(kind="proc", proc=proc)



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
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=python_env())
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
        from minigen.gguf.default_model import gguf_source
        return gguf_source()
    except Exception:
        return None




"""What every fault case is made of: a Run (what it runs), a Case (its category, name, setup and expected
outcome), and the helpers that build a case's files from the fixtures in tests/fixtures."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent.parent
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



def case_label(v) -> str:
    text = json.dumps(v)
    return (text if len(text) <= 24 else text[:20] + "...").replace("/", "_") or "empty"



def write_file(fx: str, name: str, content: bytes, which: str = "generate", also: Callable | None = None):
    def setup(d: Path) -> Run:
        ckpt = copy_fixture(fx, d)
        (ckpt / name).write_bytes(content)
        if also:
            also(ckpt)
        return commands(ckpt, which)
    return setup


def symlink_file(fx: str, name: str, target: str, which: str = "generate"):
    def setup(d: Path) -> Run:
        ckpt = copy_fixture(fx, d)
        (ckpt / name).unlink(missing_ok=True)
        (ckpt / name).symlink_to(target)
        return Run(args=commands(ckpt, which).args, check=no_secret)
    return setup


def special_file(fx: str, name: str, kind: str, which: str = "generate"):
    def setup(d: Path) -> Run:
        ckpt = copy_fixture(fx, d)
        (ckpt / name).unlink(missing_ok=True)
        if kind == "fifo":
            os.mkfifo(ckpt / name)
        else:
            (ckpt / name).mkdir()
        return commands(ckpt, which)
    return setup



def no_secret(code, out, err, d):
    if SECRET in out or SECRET in err:
        return "printed bytes of a file outside the checkpoint"
    return None



def json_bytes(obj) -> bytes:
    return json.dumps(obj, allow_nan=True).encode()



def write_to(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def make_fifo(path: Path) -> str:
    os.mkfifo(path)
    return str(path)



def python_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PYTHONUNBUFFERED", None)  # as a user's shell would have it: stdout block-buffered into files
    return env



def shell_quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"



def converted_loads(out: Path):
    def check(code, stdout, stderr, d):
        if code != 0:
            return None
        r = subprocess.run([sys.executable, "-m", "minigen", "generate", "--model", str(out), "-m", "3", "-q", "hi"],
                           capture_output=True, env=python_env(), timeout=60)
        if r.returncode != 0:
            return f"convert exited 0 but minigen refuses the result: {r.stderr.decode(errors='replace').strip()[:200]}"
        return None
    return check




"""Running the corpus: every case in a forked child (or a real process) under limits on time and memory,
each outcome classified, and the summary table."""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from .checkpoint_files import file_kind_cases, index_cases, safetensors_cases
from .configs import config_cases, generation_config_cases
from .core import OUTCOMES, Case, Run
from .flags import api_cases, flag_cases
from .gguf_files import gguf_byte_cases, gguf_cases
from .processes import process_cases
from .templates import template_cases
from .tokenizer_files import tokenizer_cases

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
              template_cases, flag_cases, api_cases, process_cases] + ([gguf_cases, gguf_byte_cases] if with_gguf else []) + [file_kind_cases]
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
    import minigen.resolve  # noqa: F401  (minigen's names load on first use: load them here)
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


def main(argv=None, description: str = "Seeded fault injection against minigen."):
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: forked children must not inherit BLAS threads
    ap = argparse.ArgumentParser(description=description)
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



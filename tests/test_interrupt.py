"""Ctrl-C at the earliest moments of a `minigen` process: while Python imports minigen's modules, while
click parses the flags, while the model loads. Each exits 130 with one line, never a traceback.

A real process per moment, started as the console script starts it (`from minigen.cli import main`).
The SIGINT is sent by the process to itself from an import hook at the moment the named module is
about to be imported, so the moment is exact (no sleeps, no race with the test).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "llama_gqa3"

DRIVER = r"""
import importlib.abc, os, signal, sys
moment = sys.argv[1]
signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal, even if the runner ignores SIGINT

def interrupt():
    os.kill(os.getpid(), signal.SIGINT)  # the handler runs at the next bytecode: a KeyboardInterrupt here

class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == moment:
            sys.meta_path.remove(self)
            interrupt()
        return None

if moment == "parsing":  # while click parses the flags, before the command runs
    import click.core
    parse = click.core.Command.parse_args
    def parse_args(self, ctx, args):
        interrupt()
        return parse(self, ctx, args)
    click.core.Command.parse_args = parse_args
else:
    sys.meta_path.insert(0, Hook())
sys.argv = ["minigen"] + sys.argv[2:]
from minigen.cli import main  # what the console script `minigen` does
sys.exit(main())
"""

# Every heavy import of `minigen info`, in order, then the flags, then the load. (Before minigen/cli/__init__.py
# runs, Python has imported only the package `minigen`, whose __init__ imports nothing heavy: that window is
# the interpreter's own start-up, as for any Python program.)
MOMENTS = ["click", "numpy", "minigen.errors", "minigen.cli.harness", "minigen.generation.options",
           "minigen.cli.inspect", "parsing", "minigen.resolve", "tokenizers", "minigen.checkpoint.weights"]


@pytest.mark.parametrize("moment", MOMENTS)
def test_ctrl_c_early_exits_130_in_one_line(moment):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-c", DRIVER, moment, "info", "--model", str(FIXTURE)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert (p.returncode, p.stderr, p.stdout) == (130, "minigen: interrupted\n", ""), moment


def test_import_minigen_loads_nothing_heavy():
    """`import minigen` alone loads no NumPy: the public names load on first use."""
    code = "import sys, minigen; print(sorted(m for m in ('numpy', 'tokenizers', 'click') if m in sys.modules)); " \
           "print(minigen.MinigenError.__module__, minigen.load.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}).stdout
    assert out.splitlines() == ["[]", "minigen.errors minigen.resolve"]

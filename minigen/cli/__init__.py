"""The command line: parse the flags, call minigen, print. Nothing here decides how anything is computed.

    harness.py  the process: standard streams, signals, exit codes; the prompt reader; --model
    run.py      generate (its run flags come from generation/options.py's table), info, convert
    chat.py     the chat REPL
    inspect.py  attention, ablate, experts, patch, lens, dla, trace
    serve.py    the OpenAI-compatible server (minigen/serve/)

Ctrl-C while Python imports minigen's modules (numpy, tokenizers, ...: the first fraction of a second)
exits 130 with one line, as it does while loading or generating: the imports below are the heavy
ones, and `minigen/__init__.py` imports nothing heavy before them (its names load on first use).
Slow work below (a conversion, a download) is reported through the `note` and `progress_bar` callbacks
harness.py gives: nothing below the CLI prints.

May import: everything (it is the top); a command imports the modules only it needs when it runs.
"""
import sys

try:
    import click

    from . import chat, inspect, run, scores, serve
    from .harness import Group
except KeyboardInterrupt:
    try:
        sys.stderr.write("minigen: interrupted\n")
    except (AttributeError, OSError, ValueError):  # no stderr to say it on
        pass
    raise SystemExit(130) from None


@click.group(cls=Group)
@click.version_option(package_name="minigen")
def main():
    """minigen: run, read and look inside small transformers."""


for command in (run.generate, run.info, chat.chat, run.convert, inspect.attention, inspect.ablate, inspect.experts,
                inspect.patch, inspect.lens, inspect.dla, inspect.trace, scores.score, scores.perplexity, serve.serve):
    main.add_command(command)

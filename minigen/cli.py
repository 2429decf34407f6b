"""The command line: flags and printing only. Work happens in generate.py, convert.py, inspect.py."""
from __future__ import annotations

import sys

import click

from .errors import MinigenError


class Group(click.Group):
    """Turns MinigenError into one line on stderr and exit code 1, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except MinigenError as e:
            click.echo(f"minigen: error: {e}", err=True)
            sys.exit(1)


@click.group(cls=Group)
@click.version_option(package_name="minigen")
def main():
    """minigen: run, read and look inside small transformers."""


# --- generate, info (issue 3) ---------------------------------------------------------------


# --- convert (issue 4) ----------------------------------------------------------------------


# --- attention, trace (issue 5) -------------------------------------------------------------

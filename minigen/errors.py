"""The one exception minigen raises for bad input: a checkpoint, a file, a flag."""


class MinigenError(Exception):
    """A one-line, user-facing error. The CLI prints it without a traceback and exits non-zero."""

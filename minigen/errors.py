"""The one exception minigen raises for bad input (a checkpoint, a file, a flag), and the JSON
reader every checkpoint file goes through so that a bad file is reported the same way."""
from __future__ import annotations

import json
from pathlib import Path


class MinigenError(Exception):
    """A one-line, user-facing error. The CLI prints it without a traceback and exits non-zero."""


def read_json_object(file: Path) -> dict:
    """A JSON file that must hold an object; MinigenError naming the file otherwise."""
    try:
        data = json.loads(Path(file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MinigenError(f"{file}: not valid JSON ({(str(e).strip().splitlines() or [type(e).__name__])[0]})")
    if not isinstance(data, dict):
        raise MinigenError(f"{file}: expected a JSON object")
    return data

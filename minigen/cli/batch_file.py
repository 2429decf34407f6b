"""`generate --batch FILE`'s input: a prompt a line, or a JSON object a line with its own options.

    What is the capital of France?
    {"prompt": "Write a haiku", "max_tokens": 40, "temperature": 0.7}
    {"prompt": [1, 9690, 28], "stop": ["\\n"]}

A JSON line's options are named like generate's (max_tokens, temp, ..., stop) or as in an OpenAI request
(temperature, repetition_penalty: options.REQUEST_FIELDS). Every line is checked before the model loads;
a bad one is one MinigenError naming the file, the line and the field.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import MinigenError, OptionError, short
from ..files import MiB, decode_utf8, read_bounded
from ..generation.batch import check_batchable
from ..generation.options import REQUEST_FIELDS, Options

BATCH_FILE_LIMIT = 64 * MiB


def read_batch_file(path: str | Path) -> tuple[list, list[dict], list[int]]:
    """The prompts of a batch file, each one's options and line number: a line is a prompt, or (starting
    with "{") a JSON object (`json_line`). Blank lines are skipped. MinigenError naming the file and line."""
    text = decode_utf8(read_bounded(path, BATCH_FILE_LIMIT, "batch file"), str(path), "the batch file")
    prompts, options, lines = [], [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            prompt, o = json_line(line) if line.lstrip().startswith("{") else (line, {})
        except MinigenError as e:
            raise MinigenError(f"{path}:{n}: {e}") from None
        prompts.append(prompt)
        options.append(o)
        lines.append(n)
    if not prompts:
        raise MinigenError(f"{path}: no prompts (one a line, or JSON objects with a \"prompt\")")
    return prompts, options, lines


def json_line(line: str) -> tuple:
    """A batch file's JSON line: its "prompt" (text or token ids) and its options, named like generate's
    (max_tokens, temp, ..., stop) or as in an OpenAI request (temperature, repetition_penalty:
    options.REQUEST_FIELDS), checked. MinigenError naming the field at fault."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise MinigenError(f"not a JSON object ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict) or "prompt" not in obj:
        raise MinigenError('a JSON line needs a "prompt" field (text or token ids)')
    prompt = obj.pop("prompt")
    if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                                                         for i in prompt))):
        raise MinigenError(f"prompt: should be a string or a list of token ids, got {short(prompt, 40)}")
    spelled = {name: request for request, name in REQUEST_FIELDS.items() if request != name and request in obj}
    for name, request in spelled.items():
        if name in obj:
            raise MinigenError(f"{request}: give it or {name}, not both")
        obj[name] = obj.pop(request)
    try:
        check_batchable(obj)
        Options.of(**obj)
    except OptionError as e:
        raise MinigenError(f"{spelled.get(e.option, e.option)}: {e.message}") from None
    return prompt, obj

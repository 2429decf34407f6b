"""A real GGUF through `minigen convert`, against transformers loading the same GGUF and llama.cpp's tokenizer.

    /root/ref/bin/python scripts/compare_real_gguf.py FILE.gguf [--greedy 32] [--no-transformers]

Prints, per prompt: the largest |logit difference| (and the largest |logit|, for scale), how many greedy tokens
agree (cached decoding on both sides, EOS ignored); then whether minigen's tokenizer gives llama-tokenize's ids
on the hard text set of make_gguf_fixtures.py. Needs torch + transformers (+ accelerate) beside minigen.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
import minigen  # noqa: E402
from minigen.gguf.convert import convert_gguf  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
]


def minigen_greedy(model, ids: list[int], n: int) -> tuple[np.ndarray, list[int]]:
    cache = model.make_cache()
    logits = model.forward(np.array(ids), cache)
    out, last = [], logits[-1]
    for _ in range(n):
        out.append(int(last.argmax()))
        last = model.forward(np.array(out[-1:]), cache, last_only=True)[-1]
    return logits, out


def transformers_greedy(path: Path, ids: list[int], n: int):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    results = []
    with torch.no_grad():
        for p in ids:
            x = torch.tensor([p])
            logits = model(x).logits[0].numpy()
            gen = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                                 min_new_tokens=n, eos_token_id=None, pad_token_id=0)
            results.append((logits, gen[0, len(p):].tolist()))
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--greedy", type=int, default=32)
    ap.add_argument("--no-transformers", action="store_true")
    args = ap.parse_args()
    from make_gguf_fixtures import TEXTS, llama_tokenize

    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        convert_gguf(args.gguf, Path(work) / "m", progress=False)
        print(f"converted in {time.perf_counter() - start:.1f} s")
        model, tok = minigen.load(Path(work) / "m")
        ids = [llama_tokenize(args.gguf, p) for p in PROMPTS]
        ours = [minigen_greedy(model, p, args.greedy) for p in ids]
        agree = sum(tok.encode(t) == llama_tokenize(args.gguf, t) for t in TEXTS)
        print(f"tokenizer: {agree} of {len(TEXTS)} texts give llama-tokenize's ids; prompts "
              f"{'equal' if [tok.encode(p) for p in PROMPTS] == ids else 'DIFFER'}")
        if args.no_transformers:
            for p, (_, g) in zip(PROMPTS, ours):
                print(repr(p[:30]), "->", repr(tok.decode(g)))
            return
        del model
        theirs = transformers_greedy(args.gguf.resolve(), ids, args.greedy)
        for p, (lo, go), (lt, gt) in zip(PROMPTS, ours, theirs):
            n = next((i for i, (a, b) in enumerate(zip(go, gt)) if a != b), len(go))
            print(f"{p[:30]!r}: max |diff| {np.abs(lo - lt).max():.2e} (max |logit| {np.abs(lt).max():.1f}), "
                  f"greedy {n}/{len(go)} equal; minigen: {tok.decode(go)[:60]!r}")


if __name__ == "__main__":
    main()

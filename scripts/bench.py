"""Benchmark: minigen against HF transformers (when importable) on one checkpoint, plus NumPy's floor.

    python scripts/bench.py --model weights/smollm2-135m-instruct [--runs 3] [--threads 2]

Each engine runs in its own subprocess (so peak RSS is its own) on the same 512-token prompt:
load time, prefill tokens/s (one forward over the prompt), decode tokens/s (128 greedy tokens through
the KV cache), peak RSS; medians over --runs. transformers runs in float32, eager attention, with
torch's threads set to --threads. The roofline is the time of the model's matrix-vector products
alone, every weight matrix once as one decode step needs it (x @ w.T on minigen's loaded, fused
weights): decode speed is reported as a fraction of 1 / that time.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
        "movable metal type, oil-based inks and a wooden press adapted from those used to make wine. ")


def prompt_ids(tokenizer, n: int) -> list[int]:
    """n ids of plain English, the same for both engines (the tokenizer's BOS first if it adds one)."""
    ids = tokenizer.encode(TEXT * (n // 20 + 1))
    return ids[:n]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- workers: one engine per process ------------------------------------------------------------

def worker_minigen(args) -> dict:
    import numpy as np
    import minigen
    from minigen.generate import generate_step

    start = time.perf_counter()
    model, tokenizer = minigen.load(args.model)
    load_s = time.perf_counter() - start
    ids = prompt_ids(tokenizer, args.prompt_tokens)
    prefill, decode, tokens = [], [], None
    for _ in range(args.runs):
        seconds, tokens = [], []  # keep no Step: each holds its (V,) logits
        for step in generate_step(model, ids, max_tokens=args.gen_tokens + 1):  # greedy, EOS ignored
            seconds.append(step.seconds)
            tokens.append(step.token)
        prefill.append(len(ids) / seconds[0])
        decode.append(args.gen_tokens / sum(seconds[1:]))
    return dict(load_s=load_s, prefill=prefill, decode=decode, tokens=tokens, rss_mb=peak_rss_mb(),
                weight_mb=weight_bytes(model) / 2**20, roofline_s=roofline(model, np, args.runs * 5))


def weight_bytes(model) -> int:
    arrays = [a for k, a in model.params.items() if k != "layers"] + \
             [a for layer in model.params["layers"] for a in layer.values()]
    unique = {id(a): a for a in arrays if hasattr(a, "nbytes")}
    return sum(a.nbytes for a in unique.values())


def decode_matrices(model) -> list:
    """Every weight matrix one decode step multiplies a vector by, once (the embedding is a lookup)."""
    mats = [w for layer in model.params["layers"] for w in layer.values() if getattr(w, "ndim", 0) == 2]
    return mats + [model.params["lm_head"]]


def roofline(model, np, repeats: int) -> float:
    """Median seconds of x @ w.T over every decode matrix: the floor NumPy's GEMV sets for one step."""
    mats = decode_matrices(model)
    xs = {w.shape[1]: np.random.default_rng(0).standard_normal((1, w.shape[1])).astype(np.float32) for w in mats}
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for w in mats:
            xs[w.shape[1]] @ w.T
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def worker_hf(args) -> dict:
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    tok = transformers.AutoTokenizer.from_pretrained(args.model)
    load_s = time.perf_counter() - start

    class Enc:  # the same ids as minigen: the tokenizers library through AutoTokenizer
        encode = staticmethod(lambda text: tok(text)["input_ids"])

    ids = prompt_ids(Enc, args.prompt_tokens)
    prefill, decode, tokens = [], [], None
    with torch.inference_mode():
        for _ in range(args.runs):
            start = time.perf_counter()
            out = model(torch.tensor([ids]), use_cache=True)
            token = int(out.logits[0, -1].argmax())
            prefill.append(len(ids) / (time.perf_counter() - start))
            past, tokens = out.past_key_values, [token]
            start = time.perf_counter()
            for _ in range(args.gen_tokens):
                out = model(torch.tensor([[token]]), past_key_values=past, use_cache=True)
                past, token = out.past_key_values, int(out.logits[0, -1].argmax())
                tokens.append(token)
            decode.append(args.gen_tokens / (time.perf_counter() - start))
    return dict(load_s=load_s, prefill=prefill, decode=decode, tokens=tokens, rss_mb=peak_rss_mb(),
                versions=f"transformers {transformers.__version__}, torch {torch.__version__}")


# --- the driver ----------------------------------------------------------------------------------

def run_worker(engine: str, args) -> dict | None:
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "OPENBLAS_NUM_THREADS": str(args.threads),
           "MKL_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, __file__, "--worker", engine, "--model", args.model, "--runs", str(args.runs),
           "--threads", str(args.threads), "--prompt-tokens", str(args.prompt_tokens),
           "--gen-tokens", str(args.gen_tokens)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"{engine}: failed:\n{proc.stderr.strip()[-2000:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def hf_importable() -> bool:
    return subprocess.run([sys.executable, "-c", "import torch, transformers"], capture_output=True).returncode == 0


def report(mg: dict, hf: dict | None, args):
    med = statistics.median
    rows = [("load (s)", mg["load_s"], hf and hf["load_s"], "{:.2f}", False),
            (f"prefill tok/s ({args.prompt_tokens} tokens)", med(mg["prefill"]), hf and med(hf["prefill"]),
             "{:.0f}", True),
            (f"decode tok/s ({args.gen_tokens} greedy)", med(mg["decode"]), hf and med(hf["decode"]), "{:.1f}", True),
            ("peak RSS (MB)", mg["rss_mb"], hf and hf["rss_mb"], "{:.0f}", False)]
    print(f"model: {args.model}, {args.threads} threads, medians of {args.runs} runs"
          + (f"; {hf['versions']}" if hf else "; transformers not importable"))
    print(f"{'':34}{'minigen':>12}{'transformers':>14}{'ratio':>9}")
    for name, a, b, fmt, higher in rows:
        ratio = "" if not b else f"{(a / b if higher else b / a):.2f}x"
        print(f"{name:34}{fmt.format(a):>12}{(fmt.format(b) if b else '-'):>14}{ratio:>9}")
    print("(ratio: how many times better minigen is; for load and RSS, transformers / minigen)")
    roof_tps = 1 / mg["roofline_s"]
    print(f"roofline: GEMVs of one decode step {mg['roofline_s'] * 1e3:.1f} ms -> {roof_tps:.1f} tok/s; "
          f"minigen decode = {100 * med(mg['decode']) / roof_tps:.0f}% of it")
    print(f"weights: {mg['weight_mb']:.0f} MB float32; minigen peak RSS / weights = {mg['rss_mb'] / mg['weight_mb']:.2f}")
    if hf:
        same = sum(a == b for a, b in zip(mg["tokens"], hf["tokens"]))
        print(f"greedy tokens identical: {same}/{len(mg['tokens'])} "
              f"(first difference at {next((i for i, (a, b) in enumerate(zip(mg['tokens'], hf['tokens'])) if a != b), '-')})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--no-hf", action="store_true", help="Measure minigen only.")
    ap.add_argument("--worker", choices=["minigen", "hf"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps((worker_minigen if args.worker == "minigen" else worker_hf)(args)))
        return
    mg = run_worker("minigen", args)
    if mg is None:
        sys.exit(1)
    hf = None if args.no_hf or not hf_importable() else run_worker("hf", args)
    report(mg, hf, args)


if __name__ == "__main__":
    main()

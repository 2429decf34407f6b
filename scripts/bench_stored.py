"""Weights as stored against float32, one checkpoint several ways, side by side in one run (issue 33).

    python scripts/bench_stored.py                       # the default model: its GGUF run as stored, converted float32,
                                                         # a bfloat16 conversion kept in 16 bits and as float32
    python scripts/bench_stored.py --runs "FILE.gguf" "FILE.gguf --dtype float32" "DIR --quantize Q8_0"
    python scripts/bench_stored.py --llama-bench PATH    # and llama.cpp's llama-bench on each GGUF run
    python scripts/bench_stored.py --first-start         # and each once with an empty numba cache (a first start)
    python scripts/bench_stored.py --batch               # decode steps of 1, 4, 8, 16 sequences at once instead
    python scripts/bench_stored.py --batch --llama-bench PATH   # and llama-batched-bench (beside llama-bench) on each GGUF

Each run is a fresh process (`--worker`), the runs taking turns for --rounds rounds so that a busy machine
slows them alike; medians are printed. A run measures: the load (s), the first token's time from the
process's start (imports, load and a cold prefill, which loads the kernels numba cached), prefill tokens/s (warm) of a --prompt-token prompt, decode tokens/s of
--gen-tokens greedy tokens after it, a forward of 8 new tokens against one (after the prompt), and the
process's peak RSS (ru_maxrss). Conversions it needs are made under --work (default: a temporary directory).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START = time.perf_counter()
TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
        "movable metal type, oil-based inks and a wooden press adapted from those used to make wine. ")


def worker(spec: str, prompt_tokens: int, gen_tokens: int) -> dict:
    import minigen
    from minigen.checkpoint.stored import stored_types
    from minigen.engine.cache import truncate

    words = shlex.split(spec)
    opts = {"dtype": None, "quantize": None}
    for flag, value in zip(words[1::2], words[2::2]):
        opts[flag.lstrip("-")] = value
    t = time.perf_counter()
    model, tok = minigen.load(words[0], **opts)
    load_s = time.perf_counter() - t
    ids = tok.encode(TEXT * (prompt_tokens // 20 + 1))[:prompt_tokens]
    cache = model.make_cache(prompt_tokens + gen_tokens + 16)
    t = time.perf_counter()
    logits = model.forward(ids, cache, last_only=True)
    first_token_s, cold_prefill_s = time.perf_counter() - START, time.perf_counter() - t
    truncate(cache, 0)   # again, warm: the first forward loads each kernel numba cached (or compiles it)
    t = time.perf_counter()
    logits = model.forward(ids, cache, last_only=True)
    prefill_s = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(gen_tokens):
        logits = model.forward([int(logits[-1].argmax())], cache, last_only=True)
    decode_s = time.perf_counter() - t
    at = cache[0].offset
    k1, k8 = [], []
    for _ in range(5):
        for k, into in ((1, k1), (8, k8)):
            t = time.perf_counter()
            model.forward(ids[:k], cache)
            into.append(time.perf_counter() - t)
            truncate(cache, at)
    mem = stored_types(model.params)
    return dict(load_s=load_s, first_token_s=first_token_s, cold_prefill_s=cold_prefill_s, prefill=prompt_tokens / prefill_s,
                decode=gen_tokens / decode_s, f8_f1=statistics.median(k8) / statistics.median(k1),
                weights_mb=sum(b for _, b in mem.values()) / 1e6, types=sorted(mem),
                rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def worker_batch(spec: str) -> dict:
    """Tokens/s of a decode step of B sequences in one forward_batch (prompts of 10..10+B-1 tokens), B in
    BATCHES: medians of 6 steps after the prefill."""
    import numpy as np
    import minigen

    words = shlex.split(spec)
    opts = {"dtype": None, "quantize": None}
    for flag, value in zip(words[1::2], words[2::2]):
        opts[flag.lstrip("-")] = value
    model, tok = minigen.load(words[0], **opts)
    base = tok.encode(TEXT)

    def step(B: int) -> float:
        caches = [model.make_cache(128) for _ in range(B)]
        outs = model.forward_batch([np.array(base[:10 + b]) for b in range(B)], caches)
        times = []
        for _ in range(6):
            ids = [np.array([int(o[-1].argmax())]) for o in outs]
            t = time.perf_counter()
            outs = model.forward_batch(ids, caches)
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    step(16)   # warm: every kernel and row count once
    return {str(B): B / step(B) for B in BATCHES}


BATCHES = (1, 4, 8, 16)


def run(spec: str, args, env: dict | None = None) -> dict:
    cmd = [sys.executable, __file__, "--worker" if not args.batch else "--worker-batch", spec,
           "--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit(f"bench_stored: {spec}: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def llama_bench(binary: str, gguf: str, args) -> dict:
    """llama-bench -t 2 at its defaults on the file: decode (-p 0 -n gen-tokens after -d prompt-tokens in its
    cache, as minigen's runs decode after their prompt) and prefill (-p prompt-tokens -n 0) as two runs, so that a
    build whose prompt processing crashes (the native build on some AVX-512 CPUs) still gives its decode speed.
    {"decode": tok/s, "prefill": tok/s or None}."""
    def one(p: int, n: int, depth: int = 0):
        out = subprocess.run([binary, "-m", gguf, "-t", "2", "-p", str(p), "-n", str(n), "-d", str(depth), "-r", "1",
                              "-o", "json"], capture_output=True, text=True)
        return json.loads(out.stdout)[0]["avg_ts"] if out.returncode == 0 else None
    return {"decode": one(0, args.gen_tokens, args.prompt_tokens), "prefill": one(args.prompt_tokens, 0)}


def llama_batched(binary: str, gguf: str) -> dict:
    """llama.cpp's llama-batched-bench (-t 2, its defaults otherwise) on the file, as worker_batch measures minigen:
    B sequences of 16 prompt tokens each, then 32 decode steps of all B at once. {B: decode tokens/s of the B
    together (its S_TG)}, or {} when it fails."""
    out = subprocess.run([binary, "-m", gguf, "-t", "2", "-c", "4096", "-npp", "16", "-ntg", "32",
                          "-npl", ",".join(map(str, BATCHES)), "--output-format", "jsonl"], capture_output=True, text=True)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")] if out.returncode == 0 else []
    return {str(r["pl"]): r["speed_tg"] for r in rows}


def default_runs(work: Path) -> list[str]:
    """The default model's GGUF as stored and as float32, and a bfloat16 conversion of it kept and as float32."""
    from minigen.gguf.convert import convert_gguf
    from minigen.gguf.default_model import gguf_source

    gguf = gguf_source()
    bf16 = work / "smollm2-bf16"
    if not bf16.exists():
        convert_gguf(gguf, bf16, "bfloat16")
    return [str(gguf), f"{gguf} --dtype float32", str(bf16), f"{bf16} --dtype float32"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="+", help="each: a --model value, then --dtype/--quantize as the CLI takes them")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench: also run on each GGUF run's file (with --batch, the "
                    "llama-batched-bench beside it)")
    ap.add_argument("--work", help="where conversions are made (default: a temporary directory)")
    ap.add_argument("--batch", action="store_true", help="decode steps of 1, 4, 8 and 16 sequences instead")
    ap.add_argument("--first-start", action="store_true", help="also one run of each with an empty numba cache, as on "
                    "a new machine: its first token's time from the process's start, the kernels' compiling included")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-batch", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.first_start and args.batch:
        sys.exit("bench_stored: --first-start measures the first token, not batches")
    if args.worker:
        print(json.dumps(worker(args.worker, args.prompt_tokens, args.gen_tokens)))
        return
    if args.worker_batch:
        print(json.dumps(worker_batch(args.worker_batch)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        os.environ.setdefault("MINIGEN_WEIGHTS", str(work / "weights"))   # a GGUF's files directory goes there
        specs = args.runs or default_runs(work)
        results = {s: [] for s in specs}
        files = sorted({shlex.split(s)[0] for s in specs if shlex.split(s)[0].endswith(".gguf")}) if args.llama_bench else []
        peer = {f: [] for f in files}
        first_start = {}
        for s in specs if args.first_start else ():
            with tempfile.TemporaryDirectory() as cache:
                first_start[s] = run(s, args, dict(os.environ, NUMBA_CACHE_DIR=cache))["first_token_s"]
        for _ in range(args.rounds):   # llama.cpp takes its turn in each round, beside minigen's runs
            for s in specs:
                results[s].append(run(s, args))
            for f in files:
                peer[f].append(llama_batched(str(Path(args.llama_bench).with_name("llama-batched-bench")), f) if args.batch
                               else llama_bench(args.llama_bench, f, args))
    if args.batch:
        print(f"{args.rounds} rounds, medians: decode tokens/s of B sequences in one step (x: against B = 1)\n")
        print("| run | " + " | ".join(f"B = {B}" for B in BATCHES) + " |")
        print("|---|" + "---|" * len(BATCHES))
        for s, rs in results.items():
            med = {B: statistics.median(r[str(B)] for r in rs) for B in BATCHES}
            name = " ".join([Path(shlex.split(s)[0]).name] + shlex.split(s)[1:])
            print(f"| {name} | " + " | ".join(f"{med[B]:.1f} ({med[B] / med[1]:.2f}x)" for B in BATCHES) + " |")
        for f in files:
            got = [r for r in peer[f] if len(r) == len(BATCHES)]
            if not got:
                print(f"| llama.cpp {Path(f).name} | llama-batched-bench failed |")
                continue
            med = {B: statistics.median(r[str(B)] for r in got) for B in BATCHES}
            print(f"| llama.cpp {Path(f).name} (llama-batched-bench) | "
                  + " | ".join(f"{med[B]:.1f} ({med[B] / med[1]:.2f}x)" for B in BATCHES) + " |")
        if files:
            print("\nminigen's runs against llama.cpp on the same file, B sequences:\n")
            print("| run | " + " | ".join(f"B = {B}" for B in BATCHES) + " |")
            print("|---|" + "---|" * len(BATCHES))
            for s, rs in results.items():
                f, got = shlex.split(s)[0], [r for r in peer.get(shlex.split(s)[0], []) if len(r) == len(BATCHES)]
                if not got:
                    continue
                name = " ".join([Path(f).name] + shlex.split(s)[1:])
                ratio = {B: statistics.median(r[str(B)] for r in rs) / statistics.median(r[str(B)] for r in got) for B in BATCHES}
                print(f"| {name} | " + " | ".join(f"{ratio[B]:.2f}" for B in BATCHES) + " |")
        return
    keys = ("load_s", "first_token_s", "prefill", "decode", "f8_f1", "weights_mb", "rss_mb")
    print(f"{args.rounds} rounds, medians; prompt {args.prompt_tokens} tokens, {args.gen_tokens} decoded\n")
    cold = " first token s, empty cache |" if first_start else ""
    print(f"| run | types | load s | first token s |{cold} prefill tok/s | decode tok/s | forward(8)/forward(1) | weights MB | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|" + "---|" * bool(first_start))
    for s, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in keys}
        name = " ".join([Path(shlex.split(s)[0]).name] + shlex.split(s)[1:])
        cold = f" {first_start[s]:.2f} |" if first_start else ""
        print(f"| {name} | {', '.join(rs[0]['types'])} | {med['load_s']:.2f} | {med['first_token_s']:.2f} |{cold} "
              f"{med['prefill']:.0f} | {med['decode']:.1f} | {med['f8_f1']:.2f} | {med['weights_mb']:.0f} | {med['rss_mb']:.0f} |")
    if files:
        print("\nllama.cpp on the same files (llama-bench -t 2, one run per round, medians), and minigen's runs against it:\n")
        print("| file | llama.cpp prefill tok/s | llama.cpp decode tok/s | run | decode / llama.cpp |")
        print("|---|---|---|---|---|")
        for f in files:
            dec = [r["decode"] for r in peer[f] if r["decode"]]
            pre = [r["prefill"] for r in peer[f] if r["prefill"]]
            d = statistics.median(dec) if dec else None
            for s, rs in results.items():
                if shlex.split(s)[0] != f:
                    continue
                name = " ".join([Path(f).name] + shlex.split(s)[1:])
                ratio = f"{statistics.median(r['decode'] for r in rs) / d:.2f}" if d else "-"
                print(f"| {Path(f).name} | {statistics.median(pre):.0f} | " if pre else f"| {Path(f).name} | crashed | ", end="")
                print(f"{d:.1f} | {name} | {ratio} |" if d else f"- | {name} | - |")


if __name__ == "__main__":
    main()

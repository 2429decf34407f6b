"""Benchmark: minigen, HF transformers and llama.cpp over a sweep of prompt lengths, and NumPy's floor.

    python scripts/bench.py                                   # the default model; 128, 512, 2048, 4096 tokens
    python scripts/bench.py --lengths 512 --rounds 5 --engines minigen,transformers
    python scripts/bench.py --moe --lengths 512                # routed experts: GraniteMoE prefill

For each prompt length: prefill tokens/s (one forward over the prompt) and decode tokens/s (--gen-tokens
greedy tokens after it, through the KV cache); medians over --rounds. Each engine runs in a process of its
own for each round, the engines taking turns (minigen, transformers, llama.cpp, minigen, ...) so that a
noisy machine slows them alike, and each process warms up on a short prompt before it measures.

- minigen: `generate_step`. Its process also times NumPy's floor for one decode step right before each
  prompt: x @ w.T once over every weight matrix, as a step needs them (the GEMVs alone). Peak RSS is
  measured apart, once per length: a fresh process that loads the model and runs that one generation.
- transformers: float32, eager attention, torch at --threads threads, run by --hf-python (default: this
  interpreter if it imports torch and transformers, else $MINIGEN_REF_PYTHON, else /root/ref/bin/python).
- llama.cpp: `llama-bench` (from --llama-bin: default $LLAMA_CPP_BIN, else the llama-cpp-python build
  under ~/.cache/minigen-llama-cpp) on an F32 GGUF of the same checkpoint, at its defaults otherwise
  (f16 KV cache, flash attention auto): -p N for prefill, -n G -d N for decode after an N-token prompt.
  The GGUF (--gguf, default weights/gguf/NAME-f32.gguf) is made when missing, with llama.cpp's
  convert_hf_to_gguf.py --outtype f32 run by --hf-python.

Prints one table (markdown) with the ratios, and writes a chart of tok/s against prompt length to
--chart, drawn with matplotlib in the --hf-python interpreter: a dependency of this script only.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
        "movable metal type, oil-based inks and a wooden press adapted from those used to make wine. ")
ENGINES = ("minigen", "transformers", "llama.cpp")
WARMUP = 64  # prompt tokens of each process's warm-up run


def prompt_ids(model_dir: Path, n: int) -> list[int]:
    """n ids of plain English, the same for every engine (tokenizer.json through `tokenizers`)."""
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(TEXT * (n // 20 + 1)).ids
    if len(ids) < n:
        sys.exit(f"bench: the prompt text gives only {len(ids)} tokens, fewer than {n}")
    return ids[:n]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- workers: one engine per process; each prints one JSON line --------------------------------------

def worker_minigen(args) -> dict:
    import minigen  # first, as a user's program would: it sets OpenBLAS up before NumPy loads it
    from minigen.generation.options import Options
    from minigen.generation.steps import generate_step

    import numpy as np

    start = time.perf_counter()
    model, _ = minigen.load(args.model)
    load_s = time.perf_counter() - start
    prompts = json.loads(Path(args.prompts).read_text())

    def run(ids: list[int]) -> tuple[float, float, list[int]]:
        seconds, tokens = [], []  # keep no Step: each holds its (V,) logits
        for step in generate_step(model, ids, Options(max_tokens=args.gen_tokens + 1, temp=0, ignore_eos=True)):
            seconds.append(step.seconds)
            tokens.append(step.token)
        return len(ids) / seconds[0], args.gen_tokens / sum(seconds[1:]), tokens

    run(prompts["warmup"])
    out = {}
    for n in args.lengths:
        floor_s = roofline(model, np, 5)
        prefill, decode, tokens = run(prompts[str(n)])
        out[n] = dict(prefill=prefill, decode=decode, floor_s=floor_s, tokens=tokens)
    return dict(load_s=load_s, lengths=out, weight_mb=weight_bytes(model) / 2**20)


def worker_minigen_rss(args) -> dict:
    """Peak RSS of one generation as a user runs it: load, then the prompt and its decode, nothing else."""
    import minigen
    from minigen.generation.options import Options
    from minigen.generation.steps import generate_step

    model, _ = minigen.load(args.model)
    for _ in generate_step(model, json.loads(Path(args.prompts).read_text())[str(args.lengths[0])],
                           Options(max_tokens=args.gen_tokens + 1, temp=0, ignore_eos=True)):
        pass
    return dict(rss_mb=peak_rss_mb())


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


def worker_transformers(args) -> dict:
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    load_s = time.perf_counter() - start
    prompts = json.loads(Path(args.prompts).read_text())

    @torch.inference_mode()
    def run(ids: list[int]) -> tuple[float, float, list[int]]:
        start = time.perf_counter()
        out = model(torch.tensor([ids]), use_cache=True)
        token = int(out.logits[0, -1].argmax())
        prefill = len(ids) / (time.perf_counter() - start)
        past, tokens = out.past_key_values, [token]
        start = time.perf_counter()
        for _ in range(args.gen_tokens):
            out = model(torch.tensor([[token]]), past_key_values=past, use_cache=True)
            past, token = out.past_key_values, int(out.logits[0, -1].argmax())
            tokens.append(token)
        return prefill, args.gen_tokens / (time.perf_counter() - start), tokens

    run(prompts["warmup"])
    out = {}
    for n in args.lengths:
        prefill, decode, tokens = run(prompts[str(n)])
        out[n] = dict(prefill=prefill, decode=decode, tokens=tokens, rss_mb=peak_rss_mb())
    return dict(load_s=load_s, lengths=out,
                versions=f"transformers {transformers.__version__}, torch {torch.__version__}")


def worker_chart(args) -> dict:
    """Draw the chart from the JSON summary on stdin (run by an interpreter that has matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = json.load(sys.stdin)
    lengths = summary["lengths"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), dpi=100)
    for ax, what in zip(axes, ("prefill", "decode")):
        for engine, color in zip(ENGINES, ("#d62728", "#1f77b4", "#2ca02c")):
            ys = [summary["median"].get(engine, {}).get(str(n), {}).get(what) for n in lengths]
            if any(y is not None for y in ys):
                ax.plot(lengths, ys, "o-", color=color, label=engine)
        if what == "decode" and summary.get("floor"):
            ax.plot(lengths, [summary["floor"][str(n)] for n in lengths], ":", color="gray", label="NumPy GEMV floor")
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("tokens/s")
        ax.set_ylim(bottom=0)
        ax.set_title(what if what == "prefill" else f"decode ({summary['gen_tokens']} tokens after the prompt)",
                     fontsize=10)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, loc="lower left")
    fig.suptitle(summary["title"], fontsize=10)
    fig.tight_layout()
    tmp = Path(args.chart).with_suffix(".tmp.png")
    fig.savefig(tmp)
    os.replace(tmp, args.chart)
    return {}


# --- routed experts (--moe): prefill of a GraniteMoE checkpoint against transformers --------------------------
#
# No MoE weights ship with minigen, so the checkpoint is made here: granite-3.1-1b-a400m's layer shape
# (hidden 1024, 16:8 heads, 32 experts of width 512, top 8, its vocabulary and multipliers) with --moe-layers
# of its 24 layers and random weights, saved by transformers into weights/bench-moe/ once. Both engines
# run the same prompt of random ids; transformers with its default attention (sdpa), float32.

MOE_CONFIG = dict(vocab_size=49155, hidden_size=1024, intermediate_size=512, num_attention_heads=16,
                  num_key_value_heads=8, num_local_experts=32, num_experts_per_tok=8, max_position_embeddings=4096,
                  embedding_multiplier=12.0, attention_multiplier=0.015625, residual_multiplier=0.22,
                  logits_scaling=6.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def worker_moe_make(args) -> dict:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GraniteMoeConfig(num_hidden_layers=args.moe_layers, **MOE_CONFIG)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02) if p.ndim > 1 else p.fill_(1.0)
    model.save_pretrained(args.model)
    return dict(params=sum(p.numel() for p in model.parameters()))


def moe_ids(args) -> list[int]:
    import random
    rng = random.Random(0)
    return [rng.randrange(MOE_CONFIG["vocab_size"]) for _ in range(max(args.lengths))]


def worker_moe_minigen(args) -> dict:
    import minigen  # first: it sets OpenBLAS up before NumPy loads it
    from minigen.resolve import load_model
    import numpy as np

    model = load_model(args.model)
    ids = np.array(moe_ids(args))
    out = {}
    model.forward(ids[:WARMUP], model.make_cache(WARMUP), last_only=True)
    for n in args.lengths:
        start = time.perf_counter()
        model.forward(ids[:n], model.make_cache(n), last_only=True)
        out[n] = dict(prefill=n / (time.perf_counter() - start))
    return dict(lengths=out)


def worker_moe_transformers(args) -> dict:
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()  # sdpa
    ids = torch.tensor([moe_ids(args)])
    out = {}
    with torch.inference_mode():
        model(ids[:, :WARMUP], use_cache=True)
        for n in args.lengths:
            start = time.perf_counter()
            model(ids[:, :n], use_cache=True)
            out[n] = dict(prefill=n / (time.perf_counter() - start))
    return dict(lengths=out, attention=model.config._attn_implementation,
                versions=f"transformers {transformers.__version__}, torch {torch.__version__}")


def moe_section(args) -> None:
    """--moe: prefill tok/s of minigen and transformers on a GraniteMoE checkpoint, medians over rounds,
    the engines taking turns; one table with the ratio."""
    args.model = ROOT / "weights" / f"bench-moe-{args.moe_layers}"
    if not (args.model / "config.json").is_file():
        print(f"making {args.model} (granite-3.1-1b-a400m's layers, {args.moe_layers} of them) ...", file=sys.stderr)
        if run_worker("moe-make", args.hf_python, args) is None:
            sys.exit(1)
    runs = {"minigen": [], "transformers": []}
    for r in range(args.rounds):
        for engine in runs:
            print(f"moe round {r + 1}/{args.rounds}: {engine} ...", file=sys.stderr, flush=True)
            result = run_worker("moe-" + engine, sys.executable if engine == "minigen" else args.hf_python, args)
            if result is not None:
                runs[engine].append(result)
    if not all(runs.values()):
        sys.exit(1)
    attention = runs["transformers"][0]["attention"]
    print(f"\nGraniteMoE prefill, tokens/s ({args.model.name}: 32 experts, top 8, hidden 1024; float32, "
          f"{args.threads} threads; transformers attention: {attention}; medians of {args.rounds} rounds)\n")
    print("| prompt | minigen | transformers | minigen / transformers |")
    print("|---|---|---|---|")
    for n in args.lengths:
        m, t = (statistics.median(r["lengths"][str(n)]["prefill"] for r in runs[e]) for e in runs)
        print(f"| {n} | {m:.0f} | {t:.0f} | {m / t:.2f} |")


WORKERS = {"minigen": worker_minigen, "minigen-rss": worker_minigen_rss, "transformers": worker_transformers,
           "chart": worker_chart, "moe-make": worker_moe_make, "moe-minigen": worker_moe_minigen,
           "moe-transformers": worker_moe_transformers}


# --- llama.cpp ---------------------------------------------------------------------------------------

def llama_bin(arg: str | None) -> Path | None:
    """The directory holding llama-bench, or None."""
    candidates = [arg or os.environ.get("LLAMA_CPP_BIN")] if (arg or os.environ.get("LLAMA_CPP_BIN")) else \
        sorted(glob.glob(str(Path.home() / ".cache/minigen-llama-cpp/*/vendor/llama.cpp/build/bin")))
    return next((Path(c) for c in candidates if c and (Path(c) / "llama-bench").is_file()), None)


def ensure_gguf(args, bin_dir: Path) -> Path | None:
    """The F32 GGUF of args.model for llama-bench, converted when missing; None (and why) if it cannot be."""
    gguf = Path(args.gguf) if args.gguf else ROOT / "weights" / "gguf" / f"{Path(args.model).name}-f32.gguf"
    if gguf.is_file():
        return gguf
    script = bin_dir.parent.parent / "convert_hf_to_gguf.py"
    cmd = [args.hf_python or sys.executable, str(script), str(args.model), "--outtype", "f32", "--outfile"]
    if not script.is_file() or not args.hf_python:
        print(f"llama.cpp: no F32 GGUF at {gguf}; make it with:\n  {' '.join(cmd)} {gguf}", file=sys.stderr)
        return None
    gguf.parent.mkdir(parents=True, exist_ok=True)
    tmp = gguf.with_suffix(".tmp")
    print(f"llama.cpp: converting {args.model} to {gguf} (F32, once)", file=sys.stderr)
    proc = subprocess.run(cmd + [str(tmp)], capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        print(f"llama.cpp: conversion failed:\n{proc.stderr.strip()[-1500:]}\nthe command was:\n  {' '.join(cmd)} {gguf}",
              file=sys.stderr)
        return None
    os.replace(tmp, gguf)
    return gguf


def run_llama(args, bin_dir: Path, gguf: Path) -> dict | None:
    """One round of llama-bench: prefill at each length, then decode after a prompt of each length."""
    base = [str(bin_dir / "llama-bench"), "-m", str(gguf), "-r", "1", "-t", str(args.threads), "-o", "json"]
    lengths = ",".join(str(n) for n in args.lengths)
    out = {n: {} for n in args.lengths}
    for flags, key in [(["-p", lengths, "-n", "0"], "prefill"),
                       (["-p", "0", "-n", str(args.gen_tokens), "-d", lengths], "decode")]:
        proc = subprocess.run(base + flags, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"llama.cpp: llama-bench failed:\n{proc.stderr.strip()[-1500:]}", file=sys.stderr)
            return None
        for test in json.loads(proc.stdout):
            n = test["n_prompt"] if key == "prefill" else test["n_depth"]
            out[n][key] = statistics.median(test["samples_ts"])
    return dict(lengths=out, versions=f"llama.cpp build {json.loads(proc.stdout)[0]['build_commit']}")


# --- the driver --------------------------------------------------------------------------------------

def run_worker(name: str, python: str, args, stdin: str | None = None, lengths: list[int] | None = None) -> dict | None:
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "OPENBLAS_NUM_THREADS": str(args.threads),
           "MKL_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
    cmd = [python, __file__, "--worker", name, "--model", str(args.model), "--threads", str(args.threads),
           "--gen-tokens", str(args.gen_tokens), "--lengths", ",".join(map(str, lengths or args.lengths)),
           "--prompts", str(args.prompts), "--chart", str(args.chart), "--moe-layers", str(args.moe_layers)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, input=stdin)
    if proc.returncode != 0:
        print(f"{name}: failed:\n{proc.stderr.strip()[-2000:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def find_hf_python(arg: str | None) -> str | None:
    """An interpreter that imports torch and transformers (and, for the chart, matplotlib)."""
    candidates = [arg] if arg else [sys.executable, os.environ.get("MINIGEN_REF_PYTHON"), "/root/ref/bin/python"]
    for python in filter(None, candidates):
        if shutil.which(python) and subprocess.run([python, "-c", "import torch, transformers"],
                                                   capture_output=True).returncode == 0:
            return python
    return None


def summarize(runs: dict, args) -> dict:
    """Medians over rounds: {engine: {n: {prefill, decode}}}, and per length minigen's floor (tok/s) and
    its decode as a fraction of the floor measured beside it."""
    med = statistics.median
    median = {}
    for engine, rounds in runs.items():
        median[engine] = {n: {k: med([r["lengths"][n][k] for r in rounds if k in r["lengths"].get(n, {})])
                              for k in ("prefill", "decode") if any(k in r["lengths"].get(n, {}) for r in rounds)}
                          for n in map(str, args.lengths)}
    mg = runs.get("minigen", [])
    floor = {n: med([1 / r["lengths"][n]["floor_s"] for r in mg]) for n in map(str, args.lengths)} if mg else {}
    of_floor = {n: med([r["lengths"][n]["decode"] * r["lengths"][n]["floor_s"] for r in mg])
                for n in map(str, args.lengths)} if mg else {}
    return dict(median=median, floor=floor, of_floor=of_floor, lengths=args.lengths,
                gen_tokens=args.gen_tokens, weight_mb=mg[0]["weight_mb"] if mg else None)


def report(summary: dict, runs: dict, args):
    m = summary["median"]
    others = [e for e in ENGINES[1:] if e in m]
    fmt = lambda x, f: "–" if x is None else f.format(x)
    ratio = lambda a, b: "–" if a is None or b is None else f"{a / b:.2f}×"
    cols = ["prompt", "minigen prefill"] + [f"{e} prefill" for e in others] + [f"÷ {e}" for e in others] + \
           ["minigen decode"] + [f"{e} decode" for e in others] + [f"÷ {e}" for e in others] + \
           ["decode / floor", "minigen peak RSS"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for n in map(str, args.lengths):
        get = lambda e, k: m.get(e, {}).get(n, {}).get(k)
        row = [n]
        for k, f in (("prefill", "{:.0f}"), ("decode", "{:.1f}")):
            row += [fmt(get("minigen", k), f)] + [fmt(get(e, k), f) for e in others] + \
                   [ratio(get("minigen", k), get(e, k)) for e in others]
        row += [fmt(summary["of_floor"].get(n) and 100 * summary["of_floor"][n], "{:.0f} %"),
                fmt(summary["rss"].get(n), "{:.0f} MB")]
        print("| " + " | ".join(row) + " |")
    print(f"\ntokens/s, medians of {args.rounds} rounds; decode: {args.gen_tokens} greedy tokens after the prompt; "
          f"{args.threads} threads; ÷: minigen / that engine")
    for engine, rounds in runs.items():
        if rounds:
            load = f", load {statistics.median([r['load_s'] for r in rounds]):.2f} s" if "load_s" in rounds[0] else ""
            print(f"{engine}: {rounds[0].get('versions', 'this tree')}{load}")
    if summary["floor"]:
        print("NumPy GEMV floor of one decode step: " + ", ".join(
            f"{1000 / summary['floor'][n]:.1f} ms ({summary['floor'][n]:.1f} tok/s) before the {n}-token run"
            for n in map(str, args.lengths)))
        print(f"weights: {summary['weight_mb']:.0f} MiB float32; minigen peak RSS / weights: " + ", ".join(
            f"{summary['rss'][n] / summary['weight_mb']:.3f} at {n}" for n in map(str, args.lengths) if n in summary["rss"]))
    if runs.get("minigen") and runs.get("transformers"):
        for n in map(str, args.lengths):
            a, b = runs["minigen"][-1]["lengths"][n]["tokens"], runs["transformers"][-1]["lengths"][n]["tokens"]
            same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            print(f"greedy tokens after {n}: " + ("identical" if same is None else f"differ from token {same}")
                  + f" ({len(a)} tokens)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="Checkpoint directory (default: the default model).")
    ap.add_argument("--lengths", default="128,512,2048,4096", help="Prompt lengths in tokens, comma-separated.")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--engines", default=",".join(ENGINES), help="Any of minigen,transformers,llama.cpp.")
    ap.add_argument("--hf-python", help="Interpreter with torch and transformers (and matplotlib for the chart).")
    ap.add_argument("--llama-bin", help="Directory holding llama-bench.")
    ap.add_argument("--gguf", help="F32 GGUF of the model for llama.cpp (made when missing).")
    ap.add_argument("--chart", default=str(ROOT / "docs" / "speed.png"), help="PNG to write ('' for none).")
    ap.add_argument("--json", help="Also write the raw rounds and the summary here.")
    ap.add_argument("--moe", action="store_true",
                    help="Instead: routed-experts prefill (a GraniteMoE checkpoint made here) against transformers.")
    ap.add_argument("--moe-layers", type=int, default=4, help="Layers of the --moe checkpoint (default 4 of 24).")
    ap.add_argument("--worker", choices=list(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--prompts", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.lengths = sorted(int(n) for n in args.lengths.split(","))
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)))
        return
    sys.path.insert(0, str(ROOT))
    if args.moe:
        args.hf_python = find_hf_python(args.hf_python)
        if not args.hf_python:
            sys.exit("bench --moe: no interpreter with torch and transformers (--hf-python)")
        moe_section(args)
        return
    if args.model is None:
        from minigen.gguf.default_model import default_model_path
        args.model = default_model_path()
    args.model = Path(args.model).resolve()
    engines = [e for e in args.engines.split(",") if e]
    args.hf_python = find_hf_python(args.hf_python)
    if "transformers" in engines and not args.hf_python:
        print("transformers: no interpreter with torch and transformers (--hf-python); skipped", file=sys.stderr)
        engines.remove("transformers")
    bin_dir = llama_bin(args.llama_bin) if "llama.cpp" in engines else None
    gguf = bin_dir and ensure_gguf(args, bin_dir)
    if "llama.cpp" in engines and not gguf:
        print("llama.cpp: " + ("skipped" if bin_dir else "no llama-bench found (--llama-bin); skipped"), file=sys.stderr)
        engines.remove("llama.cpp")
    with tempfile.TemporaryDirectory() as tmp:
        args.prompts = Path(tmp) / "prompts.json"
        args.prompts.write_text(json.dumps({str(n): prompt_ids(args.model, n) for n in args.lengths} |
                                           {"warmup": prompt_ids(args.model, WARMUP)}))
        runs = {e: [] for e in engines}
        for r in range(args.rounds):
            for engine in engines:
                print(f"round {r + 1}/{args.rounds}: {engine} ...", file=sys.stderr, flush=True)
                result = run_llama(args, bin_dir, gguf) if engine == "llama.cpp" else \
                    run_worker(engine, sys.executable if engine == "minigen" else args.hf_python, args)
                if result is not None:
                    runs[engine].append(json.loads(json.dumps(result)))   # int keys -> str, as on the wire
        runs = {e: rs for e, rs in runs.items() if rs}
        if not runs.get("minigen"):
            sys.exit(1)
        summary = summarize(runs, args)
        summary["rss"] = {}
        for n in args.lengths:
            print(f"peak RSS: minigen, {n} tokens ...", file=sys.stderr, flush=True)
            result = run_worker("minigen-rss", sys.executable, args, lengths=[n])
            if result:
                summary["rss"][str(n)] = result["rss_mb"]
        summary["title"] = f"{args.model.name}, float32, {args.threads} threads"
        report(summary, runs, args)
        if args.json:
            Path(args.json).write_text(json.dumps(dict(runs=runs, summary=summary), indent=1))
        if args.chart and args.hf_python:
            Path(args.chart).parent.mkdir(parents=True, exist_ok=True)
            if run_worker("chart", args.hf_python, args, stdin=json.dumps(summary)) is not None:
                print(f"chart: {args.chart}")
        elif args.chart:
            print("chart: not drawn (it needs matplotlib in --hf-python)", file=sys.stderr)


if __name__ == "__main__":
    main()

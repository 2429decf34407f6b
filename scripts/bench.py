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
- transformers: float32, its default attention (sdpa, what its users get; eager is for correctness
  fixtures only), torch at --threads threads, run by --hf-python (default: this interpreter if it
  imports torch and transformers, else $MINIGEN_REF_PYTHON, else /root/ref/bin/python).
- llama.cpp: `llama-bench` (from --llama-bin: default $LLAMA_CPP_BIN, else the llama-cpp-python build
  under ~/.cache/minigen-llama-cpp) on an F32 GGUF of the same checkpoint, at its defaults otherwise
  (f16 KV cache, flash attention auto): -p N for prefill, -n G -d N for decode after an N-token prompt.
  The GGUF (--gguf, default weights/gguf/NAME-f32.gguf) is made when missing, with llama.cpp's
  convert_hf_to_gguf.py --outtype f32 run by --hf-python.

Prints one table (markdown) with the ratios, and writes a chart of tok/s against prompt length to
--chart, drawn with matplotlib in the --hf-python interpreter: a dependency of this script only.

Sections behind flags (each its own table; --no-sweep skips the sweep above):
- --spec: a forward of k new tokens against one (k = 2, 4, 8, 16, after a 150-token prompt), what
  speculative decoding and batching can gain at most; then prompt lookup on input-grounded prompts
  (quote a document, reformat code, fill a form) and a free-form one against plain greedy decoding,
  minigen and transformers' prompt_lookup_num_tokens side by side, the tokens checked identical.
  With --draft-model DIR (a checkpoint sharing --model's tokenizer), the same tasks decoded with it
  drafting (minigen's --draft-model against transformers' assistant_model); with --llama-spec, and --model and
  --draft-model GGUF files, also llama.cpp's llama-speculative on the same files and prompts (at its defaults:
  3 drafts a step; greedy), against llama-bench's plain decoding at the prompt's depth.
- --batch: 1, 4, 8 and 16 prompts of different lengths generated as one batch against one at a time
  (minigen's Batch; transformers' batched generate with left padding), tokens/s of the whole batch.
- --constrained: greedy decoding under a JSON schema (--schema FILE, default SCHEMA) against the same
  number of tokens unconstrained, the two run in turn, tokens/s of each and llguidance's time per token
  (minigen's Follow, timed apart); then llama.cpp's llama-server on --llama-gguf (the model's GGUF file)
  with the same schema in its `json_schema` field, against it without, from its own timings. --model
  may be a .gguf file here (minigen converts it once); without --llama-gguf, llama.cpp is skipped.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
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

    from minigen.resolve import resolve

    files = Path(model_dir) if Path(model_dir).is_dir() else resolve(str(model_dir)).path   # a GGUF's files
    ids = Tokenizer.from_file(str(files / "tokenizer.json")).encode(TEXT * (n // 20 + 1)).ids
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
    """transformers with its default attention (sdpa). The prefill asks for the last row's logits only
    (logits_to_keep=1), as its generate does: the logits of every prompt row (49,152 x 576 per row
    for SmolLM2) are work no generating user pays for, and minigen's prefill skips them too."""
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)   # sdpa
    model.eval()
    load_s = time.perf_counter() - start
    prompts = json.loads(Path(args.prompts).read_text())

    @torch.inference_mode()
    def run(ids: list[int]) -> tuple[float, float, list[int]]:
        start = time.perf_counter()
        out = model(torch.tensor([ids]), use_cache=True, logits_to_keep=1)   # the last row's logits, as generate asks
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


# --- speculative decoding and batching (--spec, --batch) --------------------------------------------

FORWARD_KS = (1, 2, 4, 8, 16)
DOC = (ROOT / "minigen" / "engine" / "cache.py").read_text().split('"""')[1].strip()
CODE = (ROOT / "minigen" / "engine" / "layers.py").read_text()[:1400]
RECORD = json.dumps({"name": "Ada Lovelace", "born": "10 December 1815", "city": "London",
                     "occupation": "mathematician", "known for": "the first published computer program",
                     "email": "ada@example.org", "phone": "+44 20 7946 0958"}, indent=1)
LOOKUP_TASKS = {  # name -> chat message; all but "free-form" are grounded in their input
    "quote a document": f"Here is a document:\n\n{DOC}\n\nCopy its first two paragraphs exactly, word for word.",
    "reformat code": f"Rewrite this Python code with every comment removed, nothing else changed:\n\n{CODE}",
    "fill a form": f"Record:\n{RECORD}\n\nFill this form from the record, one line per field:\n"
                   "Name:\nDate of birth:\nCity:\nOccupation:\nKnown for:\nEmail:\nPhone:",
    "free-form": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}
BATCH_SIZES = (1, 4, 8, 16)


def worker_forward_k(args) -> dict:
    """Median seconds of a forward over k new tokens after a 150-token prompt, k in FORWARD_KS, the
    sizes taking turns in each round."""
    import minigen
    from minigen.engine.cache import truncate
    model, tok = minigen.load(args.model)
    ids = json.loads(Path(args.prompts).read_text())["150"]
    cache = model.make_cache(256)
    model.forward(ids, cache)
    times = {k: [] for k in FORWARD_KS}
    for _ in range(max(args.rounds, 3) * 3):
        for k in FORWARD_KS:
            start = time.perf_counter()
            model.forward(ids[:k], cache)
            times[k].append(time.perf_counter() - start)
            truncate(cache, len(ids))
    return {str(k): statistics.median(v) for k, v in times.items()}


def chat_prompts(model_dir: Path) -> dict:
    """LOOKUP_TASKS through the checkpoint's chat template: {task: ids}."""
    sys.path.insert(0, str(ROOT))
    import minigen
    from minigen.generation.steps import prompt_ids
    _, tok = minigen.load(model_dir)
    return {name: prompt_ids(tok, text, chat=True) for name, text in LOOKUP_TASKS.items()}


def worker_lookup(args) -> dict:
    """Per task: decode tokens/s of plain greedy, of prompt lookup and (with --draft-model) of the draft
    model drafting, the three run interleaved (`in_turn`); drafts accepted, tokens equal."""
    import minigen
    from minigen.generation.steps import Run
    run = Run.from_prompt
    model, tok = minigen.load(args.model)
    drafter = minigen.load(args.draft_model) if args.draft_model else None
    modes = {"plain": {}, "lookup": {"prompt_lookup": True}} | ({"draft": {"draft_model": drafter}} if drafter else {})
    prompts = json.loads(Path(args.prompts).read_text())["lookup"]
    for extra in modes.values():
        run(model, tok, prompts["free-form"][:64], max_tokens=8, **extra).text()   # warm-up
    out = {}
    for name, ids in prompts.items():
        runs = {mode: run(model, tok, ids, max_tokens=args.gen_tokens, ignore_eos=True, **extra)
                for mode, extra in modes.items()}
        in_turn(runs)
        out[name] = {mode: dict(tps=r.stats.decode_tps, tokens=r.tokens, accepted=r.stats.accepted,
                                drafted=r.stats.drafted, forwards=r.stats.forwards) for mode, r in runs.items()}
    return out


def in_turn(runs: dict):
    """Drive the Runs a piece of text at a time each, in turn, to their ends: each one's figures come
    from its own steps' time, and all of them see the machine alike (this VM's speed wanders by 10-20 %
    within minutes, so runs one after another read that drift as a cost or a gain)."""
    live = {mode: r.pieces() for mode, r in runs.items()}
    while live:
        for mode, pieces in list(live.items()):
            if next(pieces, None) is None:
                del live[mode]


def worker_lookup_hf(args) -> dict:
    """transformers' generate on the same prompts, greedy, without and with prompt_lookup_num_tokens=10."""
    import torch
    import transformers
    torch.set_num_threads(args.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    modes = {"plain": {}, "lookup": {"prompt_lookup_num_tokens": 10}}
    if args.draft_model:
        modes["draft"] = {"assistant_model": transformers.AutoModelForCausalLM.from_pretrained(
            args.draft_model, dtype=torch.float32).eval()}
    prompts = json.loads(Path(args.prompts).read_text())["lookup"]
    out = {}
    with torch.inference_mode():
        for extra in modes.values():
            model.generate(torch.tensor([prompts["free-form"][:64]]), max_new_tokens=8, do_sample=False, **extra)
        for name, ids in prompts.items():
            res = {}
            for mode, extra in modes.items():
                x = torch.tensor([ids])
                start = time.perf_counter()
                y = model.generate(x, max_new_tokens=1, min_new_tokens=1, do_sample=False)
                first = time.perf_counter() - start
                start = time.perf_counter()
                y = model.generate(x, max_new_tokens=args.gen_tokens, min_new_tokens=args.gen_tokens,
                                   do_sample=False, **extra)
                seconds = time.perf_counter() - start - first   # decode only, as minigen's figure
                res[mode] = dict(tps=(args.gen_tokens - 1) / seconds, tokens=y[0, len(ids):].tolist())
            out[name] = res
    return out


def batch_prompts(model_dir: Path, n: int) -> list[list[int]]:
    """n prompts of different lengths (40 to ~200 tokens) of plain English."""
    ids = prompt_ids(model_dir, 200 + 8 * n)
    return [ids[8 * i: 8 * i + 40 + (160 * i) // max(1, n - 1)] for i in range(n)]


def worker_batch(args) -> dict:
    """Per batch size: tokens/s of the batch (every sequence's generated tokens over its steps' time,
    prefill included) and of the same prompts one at a time, and both for decoding alone (the tokens
    after each prompt's first, over the time after its prefill); results checked equal. The two run
    interleaved, a batch step then as many one-at-a-time steps as there are prompts, so that they end
    together and see the machine alike (this VM's speed wanders by 10-20 % within minutes)."""
    import minigen
    from minigen.generation.batch import Batch
    from minigen.generation.options import Options
    from minigen.generation.steps import generate_step
    model, _ = minigen.load(args.model)
    data = json.loads(Path(args.prompts).read_text())["batch"]
    list(generate_step(model, data["1"][0][:32], Options.of(max_tokens=4)))   # warm-up
    out = {}
    for n in map(str, BATCH_SIZES):
        prompts = data[n]
        one_by_one = ((i, step) for i, p in enumerate(prompts)
                      for step in generate_step(model, p, Options.of(max_tokens=args.gen_tokens)))
        alone, alone_s, alone_prefill = [[] for _ in prompts], 0.0, 0.0
        batch, got, batch_s, prefill = Batch(model), {}, 0.0, None
        handles = [batch.add(p, Options.of(max_tokens=args.gen_tokens)) for p in prompts]
        while len(batch) or one_by_one is not None:
            if len(batch):
                start = time.perf_counter()
                steps = batch.step()
                seconds = time.perf_counter() - start
                batch_s, prefill = batch_s + seconds, seconds if prefill is None else prefill   # first: every prompt
                for h, step in steps.items():
                    got.setdefault(h, []).append(step.token)
            for _ in prompts:
                start = time.perf_counter()
                item = next(one_by_one, None) if one_by_one is not None else None
                seconds = time.perf_counter() - start
                if item is None:
                    one_by_one = None
                    break
                i, step = item
                alone_s += seconds
                alone_prefill += seconds if not alone[i] else 0.0
                alone[i].append(step.token)
        total = sum(len(a) for a in alone)
        out[n] = dict(batch=total / batch_s, alone=total / alone_s, same=[got[h] for h in handles] == alone,
                      decode_batch=(total - len(prompts)) / max(batch_s - prefill, 1e-9),
                      decode_alone=(total - len(prompts)) / max(alone_s - alone_prefill, 1e-9))
    return out


def worker_batch_hf(args) -> dict:
    """transformers' batched generate (left padding), greedy, per batch size: tokens/s of the batch."""
    import torch
    import transformers
    torch.set_num_threads(args.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    data = json.loads(Path(args.prompts).read_text())["batch"]
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    out = {}
    with torch.inference_mode():
        model.generate(torch.tensor([data["1"][0][:32]]), max_new_tokens=4, do_sample=False)
        for n in map(str, BATCH_SIZES):
            prompts = data[n]
            width = max(map(len, prompts))
            x = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            start = time.perf_counter()
            model.generate(x, attention_mask=mask, max_new_tokens=args.gen_tokens, min_new_tokens=args.gen_tokens,
                           do_sample=False, pad_token_id=pad)
            out[n] = dict(batch=len(prompts) * args.gen_tokens / (time.perf_counter() - start))
    return out


def section_spec(args, hf: bool):
    ids = prompt_ids(args.model, 150)
    args.prompts.write_text(json.dumps({"150": ids, "lookup": chat_prompts(args.model)}))
    fk = run_worker("forward-k", sys.executable, args)
    if fk:
        print("\n| k new tokens | " + " | ".join(map(str, FORWARD_KS)) + " |\n|---|" + "---|" * len(FORWARD_KS))
        print("| forward ms | " + " | ".join(f"{1000 * fk[str(k)]:.1f}" for k in FORWARD_KS) + " |")
        print("| forward(k) / forward(1) | " + " | ".join(f"{fk[str(k)] / fk['1']:.2f}" for k in FORWARD_KS) + " |")
        print(f"\n{Path(args.model).name} (weights as minigen loads it) after a 150-token prompt, medians of "
              f"{max(args.rounds, 3) * 3} rounds; "
              f"{args.threads} threads")
    mg = run_worker("lookup", sys.executable, args)
    tf = run_worker("lookup-hf", args.hf_python, args) if hf else None
    if not mg:
        return
    spec_table(mg, tf, "lookup", "prompt lookup", "transformers lookup")
    grounded = [r["lookup"]["tps"] / r["plain"]["tps"] for n, r in mg.items() if n != "free-form"]
    print(f"\ntokens/s of decoding ({args.gen_tokens} greedy tokens, EOS ignored) after the chat-templated prompt; "
          f"grounded tasks' mean speed-up {statistics.mean(grounded):.2f}×")
    if tf:
        print("minigen's greedy tokens against transformers': " + "; ".join(
            f"{name} " + first_difference(r["plain"]["tokens"], tf[name]["plain"]["tokens"]) for name, r in mg.items()))
    if args.draft_model:
        spec_table(mg, tf, "draft", "draft model", "transformers assistant_model")
        print(f"\n{Path(args.model).name} drafted by {Path(args.draft_model).name}: tokens/s of decoding as above")
        if args.llama_spec:
            llama_spec_table(args, mg)


def llama_spec_table(args, mg: dict):
    """llama.cpp's draft model on the same GGUF files and chat-templated prompts: llama-speculative (greedy,
    its defaults otherwise) against llama-bench's decoding after as many tokens, beside minigen's ratio."""
    bin_dir = llama_bin(args.llama_bin)
    if not (bin_dir and (bin_dir / "llama-speculative").exists() and str(args.model).endswith(".gguf")
            and str(args.draft_model).endswith(".gguf")):
        print("llama.cpp: --llama-spec needs llama-speculative (--llama-bin) and GGUF files for --model and "
              "--draft-model; skipped", file=sys.stderr)
        return
    sys.path.insert(0, str(ROOT))
    import minigen
    _, tok = minigen.load(args.model)
    prompts = json.loads(args.prompts.read_text())["lookup"]
    print("\n| task | llama.cpp plain decode | llama.cpp draft model | ÷ plain | acceptance | minigen draft model ÷ plain |")
    print("|---|---|---|---|---|---|")
    for name, ids in prompts.items():
        text = args.prompts.with_name("llama-prompt.txt")
        text.write_text(tok.decode(ids))   # the template's special tokens as text, which llama.cpp parses back
        spec = subprocess.run([str(bin_dir / "llama-speculative"), "-m", str(args.model), "-md", str(args.draft_model),
                               "-f", str(text), "-n", str(args.gen_tokens), "--temp", "0", "--top-k", "1",
                               "-t", str(args.threads), "-td", str(args.threads), "-c", "4096"],
                              capture_output=True, text=True)
        plain = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(args.model), "-t", str(args.threads), "-p", "0",
                                "-n", str(args.gen_tokens), "-d", str(len(ids)), "-r", "1", "-o", "json"],
                               capture_output=True, text=True)
        speed = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", spec.stderr + spec.stdout)
        accept = re.search(r"accept\s+=\s+([\d.]+)%", spec.stderr + spec.stdout)
        base = json.loads(plain.stdout)[0]["avg_ts"] if plain.returncode == 0 else None
        if not (speed and base):
            print(f"| {name} | llama-speculative or llama-bench failed | | | | |")
            continue
        r = mg[name]
        print(f"| {name} | {base:.1f} | {float(speed.group(1)):.1f} | {float(speed.group(1)) / base:.2f}× | "
              f"{accept.group(1) if accept else '?'} % | {r['draft']['tps'] / r['plain']['tps']:.2f}× |")
    print(f"\nllama.cpp (llama-speculative -t {args.threads} -td {args.threads}, greedy; llama-bench -d PROMPT -n "
          f"{args.gen_tokens}) on the same files, one run each")


def first_difference(a: list, b: list) -> str:
    """'identical', or where two token lists first differ."""
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return "identical" if at is None and len(a) == len(b) else f"differ from token {at if at is not None else min(len(a), len(b))}"


def spec_table(mg: dict, tf: dict | None, mode: str, label: str, hf_label: str):
    """One speculative mode's table: per task, minigen's plain and `mode` decoding (and transformers')."""
    print(f"\n| task | plain decode | {label} | ÷ plain | drafts kept / forward | acceptance | tokens equal |"
          + (f" transformers plain | {hf_label} | ÷ plain | minigen ÷ transformers, {label} |" if tf else ""))
    print("|---|---|---|---|---|---|---|" + ("---|---|---|---|" if tf else ""))
    for name, r in mg.items():
        p, l = r["plain"], r[mode]
        row = [name, f"{p['tps']:.1f}", f"{l['tps']:.1f}", f"{l['tps'] / p['tps']:.2f}×",
               f"{l['accepted'] / max(1, l['forwards'] - 1):.2f}", f"{100 * l['accepted'] / max(1, l['drafted']):.0f} %",
               "yes" if p["tokens"] == l["tokens"] else "NO"]
        if tf:
            t = tf[name]
            row += [f"{t['plain']['tps']:.1f}", f"{t[mode]['tps']:.1f}", f"{t[mode]['tps'] / t['plain']['tps']:.2f}×",
                    f"{l['tps'] / t[mode]['tps']:.2f}×"]
        print("| " + " | ".join(row) + " |")


def section_batch(args, hf: bool):
    args.prompts.write_text(json.dumps({"batch": {str(n): batch_prompts(args.model, n) for n in BATCH_SIZES}}))
    mg = run_worker("batch", sys.executable, args)
    tf = run_worker("batch-hf", args.hf_python, args) if hf else None
    if not mg:
        return
    print("\n| prompts | minigen one at a time | minigen batch | ÷ one at a time | decode only ÷ | same tokens |"
          + (" transformers batch | minigen ÷ transformers |" if tf else ""))
    print("|---|---|---|---|---|---|" + ("---|---|" if tf else ""))
    for n in map(str, BATCH_SIZES):
        r = mg[n]
        row = [n, f"{r['alone']:.1f}", f"{r['batch']:.1f}", f"{r['batch'] / r['alone']:.2f}×",
               f"{r['decode_batch'] / r['decode_alone']:.2f}×", "yes" if r["same"] else "NO"]
        if tf:
            row += [f"{tf[n]['batch']:.1f}", f"{r['batch'] / tf[n]['batch']:.2f}×"]
        print("| " + " | ".join(row) + " |")
    print(f"\ntokens/s of the whole batch: {args.gen_tokens} greedy tokens per prompt (40-200 prompt tokens), "
          f"prefill included; decode only: the tokens after each prompt's first, over the time after its prefill "
          f"(the batch's first step; each prompt's own); {args.threads} threads")


# --- constrained output (--constrained): a JSON schema's mask against none ------------------------------

SCHEMA = {"type": "object", "properties": {"people": {"type": "array", "items": {
    "type": "object", "properties": {"name": {"type": "string"}, "born": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "born", "city"], "additionalProperties": False}, "minItems": 5}},
    "required": ["people"], "additionalProperties": False}
SCHEMA_PROMPT = "List five famous scientists with the year and the city they were born in, as JSON."


def worker_constrained(args) -> dict:
    """Per round: the schema run greedy, then it and the same number of tokens unconstrained (EOS ignored)
    driven in turn; decode tokens/s of each, and the seconds spent in the constraint's processor."""
    import minigen
    from minigen.generation import constraint as C
    from minigen.generation.steps import Run, prompt_ids as chat_prompt
    model, tok = minigen.load(args.model)
    schema = json.loads(Path(args.schema).read_text()) if args.schema else SCHEMA
    ids = chat_prompt(tok, SCHEMA_PROMPT, chat=True)
    spent = [0.0]
    call = C.Follow.__call__

    def timed(self, scores, tokens):
        start = time.perf_counter()
        out = call(self, scores, tokens)
        spent[0] += time.perf_counter() - start
        return out

    C.Follow.__call__ = timed
    start = time.perf_counter()
    Run.from_prompt(model, tok, ids, max_tokens=4, constraint={"json_schema": schema}).text()   # builds the tokenizer
    setup = time.perf_counter() - start
    rounds = []
    for _ in range(args.rounds):
        first = Run.from_prompt(model, tok, ids, max_tokens=args.gen_tokens, constraint={"json_schema": schema})
        text = first.text()
        n = first.stats.generated_tokens
        runs = {"schema": Run.from_prompt(model, tok, ids, max_tokens=args.gen_tokens, constraint={"json_schema": schema}),
                "plain": Run.from_prompt(model, tok, ids, max_tokens=n, ignore_eos=True)}
        spent[0] = 0.0
        in_turn(runs)
        rounds.append(dict(schema=runs["schema"].stats.decode_tps, plain=runs["plain"].stats.decode_tps, tokens=n,
                           mask_us=1e6 * spent[0] / max(1, runs["schema"].stats.generated_tokens),
                           finish=runs["schema"].stats.finish, text=text))
    return dict(rounds=rounds, setup=setup, vocab=model.config.vocab_size, ids=ids)


def llama_server_rates(args, bin_dir: Path, ids: list[int], n: int, schema: dict) -> dict | None:
    """llama-server on --llama-gguf: predicted tokens/s of the same prompt's ids, greedy, with the schema in
    `json_schema` and without (EOS ignored, n tokens), alternating, --rounds times; medians."""
    import socket
    import urllib.request
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([str(bin_dir / "llama-server"), "-m", args.llama_gguf, "--host", "127.0.0.1", "--port",
                             str(port), "-t", str(args.threads), "-c", "4096", "-np", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def post(body: dict) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            return None
        base = {"prompt": ids, "temperature": 0, "cache_prompt": False}
        rates = {"schema": [], "plain": []}
        for _ in range(args.rounds):
            got = post({**base, "n_predict": args.gen_tokens, "json_schema": schema})
            rates["schema"].append(got["timings"]["predicted_per_second"])
            got = post({**base, "n_predict": got["timings"]["predicted_n"], "ignore_eos": True})
            rates["plain"].append(got["timings"]["predicted_per_second"])
        return {k: statistics.median(v) for k, v in rates.items()}
    finally:
        proc.terminate()
        proc.wait(10)


def section_constrained(args):
    mg = run_worker("constrained", sys.executable, args)
    if not mg:
        return
    rs = mg["rounds"]
    med = lambda k: statistics.median(r[k] for r in rs)   # noqa: E731
    print("\n| engine | model | vocabulary | tokens | unconstrained tok/s | with the schema tok/s | ÷ | mask µs / token |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| minigen | {Path(str(args.model)).name} | {mg['vocab']:,} | {rs[0]['tokens']} | {med('plain'):.1f} | "
          f"{med('schema'):.1f} | {med('schema') / med('plain'):.3f} | {med('mask_us'):.0f} |")
    bin_dir = llama_bin(args.llama_bin)
    if args.llama_gguf and bin_dir and (bin_dir / "llama-server").exists():
        schema = json.loads(Path(args.schema).read_text()) if args.schema else SCHEMA
        ll = llama_server_rates(args, bin_dir, mg["ids"], rs[0]["tokens"], schema)
        if ll:
            print(f"| llama.cpp (llama-server, json_schema) | {Path(args.llama_gguf).name} | | {rs[0]['tokens']} | "
                  f"{ll['plain']:.1f} | {ll['schema']:.1f} | {ll['schema'] / ll['plain']:.3f} | |")
    print(f"\ngreedy; the schema's run ends on EOS after {rs[0]['tokens']} tokens ({rs[0]['finish']}), the "
          f"unconstrained one runs as many; medians of {len(rs)} rounds, run in turn; llguidance's tokenizer built "
          f"in {mg['setup']:.2f} s (with the first run); {args.threads} threads. Output: {rs[0]['text'][:160]!r}")


# --- hybrids (--hybrid): random weights in a real config, minigen against transformers' CPU path ------

HYBRID_CONFIGS = {   # name -> the real config.json (tests/real_configs/hybrid/), its text model built
    "Qwen3.5-0.8B": "Qwen3.5-0.8B.json",
    "LFM2-350M": "LFM2-350M.json",
}


def hybrid_checkpoint(name: str, python: str, where: Path) -> Path:
    """A checkpoint of the real config `name` with transformers' random init, saved float32 (made once
    under weights/bench/, as transformers' from_config builds it; the vision tower of Qwen3.5 left out)."""
    out = where / name
    if (out / "model.safetensors").is_file() or (out / "model.safetensors.index.json").is_file():
        return out
    print(f"hybrid: writing a random {name} checkpoint to {out} (once)", file=sys.stderr, flush=True)
    config = ROOT / "tests" / "real_configs" / "hybrid" / HYBRID_CONFIGS[name]
    code = f"""
import json, torch, transformers
raw = json.load(open({str(config)!r}))
text = raw.get("text_config", raw)
if "text_config" in raw:
    text = dict(text, tie_word_embeddings=raw.get("tie_word_embeddings", False))
cfg = transformers.AutoConfig.for_model(**text)
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
model.save_pretrained({str(out)!r})
"""
    subprocess.run([python, "-c", code], check=True, capture_output=True)
    return out


def worker_hybrid_minigen(args) -> dict:
    import minigen  # noqa: F401  (first: it sets OpenBLAS up)
    from minigen.resolve import load_model

    import numpy as np

    model = load_model(Path(args.model))
    return hybrid_rounds(args, lambda ids, cache: model.forward(np.array(ids), cache, last_only=True),
                         lambda t, cache: model.forward(np.array([t]), cache), model.make_cache)


def worker_hybrid_transformers(args) -> dict:
    """transformers' default attention (sdpa) and its torch fallbacks for the recurrent kernels."""
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()

    def prefill(ids, cache):
        with torch.inference_mode():
            out = model(torch.tensor([ids]), use_cache=True, logits_to_keep=1)   # as generate asks
        cache["c"] = getattr(out, "cache", None) or out.past_key_values
        return out.logits[0, -1:].numpy()

    def step(t, cache):
        with torch.inference_mode():
            out = model(torch.tensor([[t]]), cache=cache["c"], use_cache=True)
        cache["c"] = getattr(out, "cache", None) or out.past_key_values
        return out.logits[0, -1:].numpy()

    out = hybrid_rounds(args, prefill, step, lambda n: {})
    out["versions"] = f"transformers {transformers.__version__}, torch {torch.__version__}"
    return out


def hybrid_rounds(args, prefill, step, new_cache) -> dict:
    """Prefill at each length, then --gen-tokens greedy decode steps after it: tokens/s of each."""
    prompts = json.loads(Path(args.prompts).read_text())
    prefill(prompts["warmup"], new_cache(len(prompts["warmup"]) + 8))
    out = {}
    for n in args.lengths:
        ids = prompts[str(n)]
        cache = new_cache(n + args.gen_tokens + 1)
        start = time.perf_counter()
        logits = prefill(ids, cache)
        prefill_s = time.perf_counter() - start
        token, tokens, times = int(logits[-1].argmax()), [], []
        for _ in range(args.gen_tokens):
            start = time.perf_counter()
            logits = step(token, cache)
            times.append(time.perf_counter() - start)
            token = int(logits[-1].argmax())
            tokens.append(token)
        out[n] = dict(prefill=n / prefill_s, decode=len(times) / sum(times), tokens=tokens)
    return dict(lengths=out)


def run_hybrid(args):
    """--hybrid: each model of --hybrid-models, minigen and transformers taking turns for --rounds."""
    import numpy as np
    where = ROOT / "weights" / "bench"
    where.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.hybrid_models.split(","):
        args.model = hybrid_checkpoint(name, args.hf_python, where)
        vocab = json.loads((args.model / "config.json").read_text())["vocab_size"]
        rng = np.random.default_rng(0)
        with tempfile.TemporaryDirectory() as tmp:
            args.prompts = Path(tmp) / "prompts.json"
            args.prompts.write_text(json.dumps({str(n): rng.integers(0, vocab, n).tolist() for n in args.lengths} |
                                               {"warmup": rng.integers(0, vocab, WARMUP).tolist()}))
            runs = {"minigen": [], "transformers": []}
            for r in range(args.rounds):
                for engine in runs:
                    print(f"{name}: round {r + 1}/{args.rounds}: {engine} ...", file=sys.stderr, flush=True)
                    result = run_worker(f"hybrid-{engine}", sys.executable if engine == "minigen" else args.hf_python,
                                        args)
                    if result is not None:
                        runs[engine].append(json.loads(json.dumps(result)))
        rows.append((name, runs))
    hybrid_report(rows, args)


def hybrid_report(rows: list, args):
    med = statistics.median
    print("| model | prompt | minigen prefill | transformers prefill | ÷ | minigen decode | transformers decode | ÷ |")
    print("|---|---|---|---|---|---|---|---|")
    for name, runs in rows:
        for n in map(str, args.lengths):
            get = lambda e, k: med([r["lengths"][n][k] for r in runs[e]]) if runs[e] else None  # noqa: E731
            mp, tp, md, td = get("minigen", "prefill"), get("transformers", "prefill"), \
                get("minigen", "decode"), get("transformers", "decode")
            ratio = lambda a, b: "–" if a is None or b is None else f"{a / b:.2f}×"  # noqa: E731
            fmt = lambda x, f: "–" if x is None else f.format(x)  # noqa: E731
            print(f"| {name} | {n} | {fmt(mp, '{:.0f}')} | {fmt(tp, '{:.0f}')} | {ratio(mp, tp)} | "
                  f"{fmt(md, '{:.1f}')} | {fmt(td, '{:.1f}')} | {ratio(md, td)} |")
    print(f"\ntokens/s, medians of {args.rounds} rounds; random weights in each real config (float32); decode: "
          f"{args.gen_tokens} greedy tokens after the prompt; {args.threads} threads; transformers with its default "
          f"(sdpa) attention and torch fallbacks for the recurrent kernels; ÷: minigen / transformers")
    for name, runs in rows:
        if runs["minigen"] and runs["transformers"]:
            for n in map(str, args.lengths):
                a, b = runs["minigen"][-1]["lengths"][n]["tokens"], runs["transformers"][-1]["lengths"][n]["tokens"]
                print(f"{name}: greedy tokens after {n}: " + first_difference(a, b))


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


WORKERS = {"forward-k": worker_forward_k, "lookup": worker_lookup, "lookup-hf": worker_lookup_hf,
           "batch": worker_batch, "batch-hf": worker_batch_hf,
           "minigen": worker_minigen, "minigen-rss": worker_minigen_rss, "transformers": worker_transformers,
           "chart": worker_chart, "hybrid-minigen": worker_hybrid_minigen,
           "hybrid-transformers": worker_hybrid_transformers, "moe-make": worker_moe_make,
           "moe-minigen": worker_moe_minigen, "moe-transformers": worker_moe_transformers,
           "constrained": worker_constrained}


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
    if getattr(args, "draft_model", None):
        cmd += ["--draft-model", str(args.draft_model)]
    if name == "constrained":
        cmd += ["--rounds", str(args.rounds)] + (["--schema", str(args.schema)] if args.schema else [])
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
            print(f"greedy tokens after {n}: " + first_difference(a, b) + f" ({len(a)} tokens)")


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
    ap.add_argument("--spec", action="store_true", help="Also: forward(k)/forward(1), and prompt lookup against plain decoding.")
    ap.add_argument("--draft-model", help="With --spec: also decode with this checkpoint (sharing --model's "
                                          "tokenizer) drafting, against transformers' assistant_model.")
    ap.add_argument("--batch", action="store_true", help="Also: batches of 1/4/8/16 prompts against one at a time.")
    ap.add_argument("--constrained", action="store_true",
                    help="Also: decoding under a JSON schema against none (minigen; llama.cpp with --llama-gguf).")
    ap.add_argument("--schema", help="With --constrained: a JSON schema file (default: SCHEMA in this script).")
    ap.add_argument("--llama-gguf", help="With --constrained: the model's GGUF file, for llama-server.")
    ap.add_argument("--llama-spec", action="store_true", help="With --spec --draft-model on GGUF files: also llama.cpp's "
                                                              "llama-speculative on them.")
    ap.add_argument("--no-sweep", action="store_true", help="Skip the prompt-length sweep (run only the sections asked for).")
    ap.add_argument("--hybrid", action="store_true",
                    help="Instead: hybrid families (random weights in real configs) against transformers.")
    ap.add_argument("--hybrid-models", default=",".join(HYBRID_CONFIGS), help="With --hybrid: which configs.")
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
    if args.hybrid:
        args.hf_python = find_hf_python(args.hf_python)
        if not args.hf_python:
            sys.exit("bench --hybrid: no interpreter with torch and transformers (--hf-python)")
        return run_hybrid(args)
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
        if args.spec or args.batch or args.constrained:
            print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", file=sys.stderr)
        if args.constrained:
            section_constrained(args)
        if args.spec:
            section_spec(args, "transformers" in engines)
        if args.batch:
            section_batch(args, "transformers" in engines)
        if args.no_sweep:
            return
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

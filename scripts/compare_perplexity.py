"""minigen perplexity beside llama-perplexity: the same GGUF files, text and --ctx; quantisations against a base.

    python scripts/compare_perplexity.py TEXT BASE.gguf [OTHER.gguf ...] [--ctx 512] [--chunks N] [--work DIR]

For BASE (the highest-precision file there is) both tools save its distributions (minigen --save-logits,
llama-perplexity --kl-divergence-base); then each OTHER file is scored against them (--kl-base and
--kl-divergence). Prints a Markdown table: perplexity, mean / median / 99th-percentile KL, top-1 agreement,
each by minigen and by llama-perplexity. Needs llama-perplexity from ../shared/tools/build-llama-cpp.sh
(LLAMA_BIN or ~/.cache/minigen-llama-cpp/.../build/bin); runs minigen from this checkout.
The first minigen run of each GGUF converts it into weights/gguf/ (float32, once).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLAMA_BIN = Path(os.environ.get("LLAMA_BIN", Path.home() / ".cache/minigen-llama-cpp/llama_cpp_python-0.3.36/"
                                "vendor/llama.cpp/build/bin"))


def minigen(text: Path, gguf: Path, ctx: int, chunks: int | None, *extra) -> dict:
    cmd = [sys.executable, "-m", "minigen", "perplexity", str(text), "--model", str(gguf), "--ctx", str(ctx),
           "--json", "-q", *(["--chunks", str(chunks)] if chunks else []), *map(str, extra)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        sys.exit(f"minigen failed: {' '.join(cmd)}\n{out.stderr}")
    return json.loads(out.stdout)


def llama(text: Path, gguf: Path, ctx: int, chunks: int | None, *extra) -> dict:
    cmd = [str(LLAMA_BIN / "llama-perplexity"), "-m", str(gguf), "-f", str(text), "-c", str(ctx), "-b", str(ctx),
           "-t", "2", *(["--chunks", str(chunks)] if chunks else []), *map(str, extra)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    log = out.stdout + out.stderr
    if out.returncode:
        sys.exit(f"llama-perplexity failed: {' '.join(cmd)}\n{log[-2000:]}")
    return parse_llama(log)


def parse_llama(log: str) -> dict:
    """The figures llama-perplexity prints: the final estimate, or the --kl-divergence statistics."""
    got = {}
    if m := re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", log):
        got["ppl"], got["ppl_se"] = float(m[1]), float(m[2])
    patterns = {"ppl": r"Mean PPL\(Q\)\s*:\s*([\d.]+)", "ppl_base": r"Mean PPL\(base\)\s*:\s*([\d.]+)",
                "kl_mean": r"Mean\s+KLD:\s*(-?[\d.]+)", "kl_p99": r"99\.0%\s+KLD:\s*(-?[\d.]+)",
                "kl_median": r"Median\s+KLD:\s*(-?[\d.]+)", "same_top": r"Same top p:\s*([\d.]+)"}
    for key, pattern in patterns.items():
        if m := re.search(pattern, log):
            got[key] = float(m[1])
    if "same_top" in got:
        got["same_top"] /= 100
    if m := re.search(r"calculating perplexity over (\d+) chunks|computing over (\d+) chunks", log):
        got["chunks"] = int(m[1] or m[2])
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("text", type=Path)
    ap.add_argument("base", type=Path)
    ap.add_argument("others", type=Path, nargs="*")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int)
    ap.add_argument("--work", type=Path, default=Path("/tmp/minigen-ppl"))
    ap.add_argument("--reuse-base", action="store_true",
                    help="keep the base's files in --work from an earlier run (the base's row is then not printed)")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    mg_base, ll_base = a.work / f"{a.base.stem}.minigen.logits", a.work / f"{a.base.stem}.llama.kld"
    rows = []
    start = time.perf_counter()
    if not (a.reuse_base and mg_base.is_file() and ll_base.is_file()):
        m = minigen(a.text, a.base, a.ctx, a.chunks, "--save-logits", mg_base)
        ll = llama(a.text, a.base, a.ctx, a.chunks, "--kl-divergence-base", ll_base)
        rows.append((a.base.name, m, ll))
        print(f"{a.base.name}: minigen {m['ppl']:.4f} ± {m['ppl_se']:.4f}, llama-perplexity {ll.get('ppl')} "
              f"({100 * (m['ppl'] / ll['ppl'] - 1):+.3f} %) [{time.perf_counter() - start:.0f} s]", file=sys.stderr)
    for other in a.others:
        m = minigen(a.text, other, a.ctx, a.chunks, "--kl-base", mg_base)
        ll = llama(a.text, other, a.ctx, a.chunks, "--kl-divergence-base", ll_base, "--kl-divergence")
        rows.append((other.name, {**m, **m["kl"]}, ll))
        print(f"{other.name}: done [{time.perf_counter() - start:.0f} s]", file=sys.stderr)
    print(f"\ntext: {a.text.name}, --ctx {a.ctx}, {rows[0][1]['windows']} chunks, {rows[0][1]['scored_tokens']} tokens "
          f"scored; base: {a.base.name}\n")
    print("| file | PPL minigen | PPL llama.cpp | Δ | mean KL minigen | mean KL llama.cpp | median KL (mg / ll) "
          "| 99 % KL (mg / ll) | top-1 same (mg / ll) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, m, ll in rows:
        kl = lambda d, k, f="{:.6f}": f.format(d[k]) if k in d else "–"  # noqa: E731
        print(f"| {name} | {m['ppl']:.4f} ± {m['ppl_se']:.4f} | {ll.get('ppl', float('nan')):.4f} "
              f"| {100 * (m['ppl'] / ll['ppl'] - 1):+.3f} % | {kl(m, 'kl_mean')} | {kl(ll, 'kl_mean')} "
              f"| {kl(m, 'kl_median')} / {kl(ll, 'kl_median')} | {kl(m, 'kl_p99')} / {kl(ll, 'kl_p99')} "
              f"| {kl(m, 'same_top', '{:.2%}')} / {kl(ll, 'same_top', '{:.2%}')} |")


if __name__ == "__main__":
    main()

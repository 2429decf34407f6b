#!/usr/bin/env python3
"""Benchmark of `minigen attention` at the lengths people use (issue 35): the default model (or --model) on a
prompt of plain English (the repository's own docs, cut to each length), per length:

- prefill: a plain forward pass over the prompt (`model.forward(ids, cache, last_only=True)`), its time;
- page: what `minigen attention - --html OUT` does after loading (the scan, the page, the file), its time, the
  process's peak RSS, the page's size, and Chromium's time to render it (headless; scripts/screenshot_html.py:
  navigation to the end of the page's script, which has parsed the page and its data and drawn the grid and the
  zoomed head) and whether the last row, pinned, shows;
- full page: the same with --html-form full, where it can still be made (past its limit it is refused before
  the forward pass, and the row says so);
- census (--census): `minigen attention PROMPT`'s census, its time and peak RSS.

Each measurement runs in a fresh process (peak RSS is the process's own, the model's weights included), the
kinds taking turns within each round; times are medians over --rounds. Targets at 4,096 tokens: peak RSS
<= 2.5 GB, page <= 40 MB, render <= 3 s, page time <= 2x the prefill's.

    python scripts/bench_attention.py                                 # 512, 2048, 4096 tokens
    python scripts/bench_attention.py --lengths 4096 --rounds 3 --census
    OPENBLAS_NUM_THREADS=1 python scripts/bench_attention.py          # on a machine others keep busy

Needs Debian's chromium for the render column (else it says so).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))


def prompt_text(tok, n: int) -> str:
    """n tokens of the repository's docs, decoded (re-encoding gives n tokens again, checked by the worker)."""
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))
    ids = tok.encode(text)
    if len(ids) < n:
        sys.exit(f"bench_attention: the docs give only {len(ids)} tokens, fewer than {n}")
    return tok.decode(ids[:n])


# --- workers: one measurement per process, one JSON line on stdout ---------------------------------------

def worker(kind: str, model_path: str | None, n: int, out: str) -> dict:
    import resource
    from minigen.resolve import load, resolve
    from minigen.errors import MinigenError

    model, tok = load(resolve(model_path).path)
    text = prompt_text(tok, n)
    ids = tok.encode(text)
    start = time.perf_counter()
    result = {"kind": kind, "tokens": len(ids)}
    if kind == "prefill":
        model.forward(ids, model.make_cache(len(ids)), last_only=True)
    else:
        from minigen.inspect import patterns as P
        from minigen.files import OutputFile
        form = {"page": None, "full": "full", "census": None}[kind]
        ask = P.AttentionAsk(prompt=text, html_path=None if kind == "census" else out, html_form=form)
        files = set() if kind == "census" else {"html"}
        try:
            src = ask.source(lambda _: (model, tok), lambda m, t: ids)
            plan = ask.plan(src, files)
        except MinigenError as e:
            return {**result, "refused": str(e)}
        plan.run()
        if kind == "census":
            ask.view(src, plan)
        else:
            with OutputFile(out, "HTML page") as page:
                result["bytes"] = P.write_page(P.render_page(src, plan, None, None), page)["bytes"]
            result["form"] = plan.parts["page form"]
    result["seconds"] = time.perf_counter() - start
    result["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def measure(kind: str, model_path: str | None, n: int, out: str) -> dict:
    cmd = [sys.executable, __file__, "--worker", kind, "--lengths", str(n), "--out", out]
    if model_path:
        cmd += ["--model", model_path]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench_attention: the {kind} worker at {n} tokens failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def render(page: str, row: int) -> tuple[float | None, bool]:
    """Chromium's render time of the page in s (None without chromium), and whether pinned row `row` shows."""
    import screenshot_html as S
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return None, False
    url = Path(page).resolve().as_uri() + f"#row={row}"
    ms, text, _, _ = S.loaded(browser, url, "1600,1000")
    return (None if ms is None else ms / 1000), S.row_shown(text, row)


# --- the table ---------------------------------------------------------------------------------------------

def median(rows: list[dict], key: str):
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="512,2048,4096", help="prompt lengths in tokens")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--model", default=None, help="--model as minigen takes it (default: the default model)")
    ap.add_argument("--census", action="store_true", help="also time the census alone")
    ap.add_argument("--no-full", action="store_true", help="leave out the full-map page")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    if a.worker:
        print(json.dumps(worker(a.worker, a.model, lengths[0], a.out)))
        return 0
    kinds = ["prefill", "page"] + ([] if a.no_full else ["full"]) + (["census"] if a.census else [])
    print(f"# minigen attention at length: {a.model or 'the default model'}, {a.rounds} round(s), "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}, load {os.getloadavg()[0]:.1f}")
    table = []
    with tempfile.TemporaryDirectory(prefix="minigen-bench-attention-") as tmp:
        for n in lengths:
            got = {k: [] for k in kinds}
            for _ in range(a.rounds):
                for kind in kinds:
                    out = os.path.join(tmp, f"{kind}-{n}.html")
                    r = measure(kind, a.model, n, out)
                    if kind in ("page", "full") and "refused" not in r:
                        r["render"], r["row_shown"] = render(out, r["tokens"] - 1)
                    got[kind].append(r)
                    print(f"  {n} {kind}: {json.dumps({k: v for k, v in r.items() if k != 'kind'})}", file=sys.stderr)
            table.append((n, got))
    print("| tokens | prefill s | page s | page / prefill | peak RSS GB | page MB | render s | pinned row | "
          "full page s | full RSS GB | full MB | full render s |" + (" census s | census RSS GB |" if a.census else ""))
    print("|" + " --- |" * (12 + 2 * a.census))
    for n, got in table:
        pre, page = median(got["prefill"], "seconds"), median(got["page"], "seconds")
        cells = [n, f"{pre:.1f}", f"{page:.1f}", f"{page / pre:.2f}", f"{median(got['page'], 'rss_mb') / 1000:.2f}",
                 f"{median(got['page'], 'bytes') / 1e6:.1f} ({got['page'][0]['form']})", fmt(median(got["page"], "render")),
                 "shown" if all(r.get("row_shown") for r in got["page"]) else "NOT shown"]
        full = got.get("full")
        if not full:
            cells += ["-"] * 4
        elif "refused" in full[0]:
            cells += [f"refused before the forward: {full[0]['refused'].split(';')[0]}", "-", "-", "-"]
        else:
            cells += [f"{median(full, 'seconds'):.1f}", f"{median(full, 'rss_mb') / 1000:.2f}",
                      f"{median(full, 'bytes') / 1e6:.1f}", fmt(median(full, "render"))]
        if a.census:
            cells += [f"{median(got['census'], 'seconds'):.1f}", f"{median(got['census'], 'rss_mb') / 1000:.2f}"]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    return 0


def fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


if __name__ == "__main__":
    sys.exit(main())

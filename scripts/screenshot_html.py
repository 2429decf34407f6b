#!/usr/bin/env python3
"""Open an HTML file in headless Chromium and save a PNG: a check that `minigen attention --html`
pages render in a real browser. Needs Debian's chromium (`apt-get install -y chromium`); not part of
the test suite.

    python scripts/screenshot_html.py attn.html attn.png [--select 3,2] [--hide] [--size 1600,1000]
    python scripts/screenshot_html.py attn.html attn.png --view "row=4000" --check

--select L,H opens the page with layer L, head H zoomed (the page reads #layer=L&head=H from the URL);
--view adds more of the hash (vw=1: value-weighted, sqrt=1: sqrt colour scale, row=I: a pinned row,
win=Q,K: the window's first query and key on a long prompt's page).

--check also loads the page once more and reads its DOM after the load event: it prints the time from
navigation to the end of the page's script (its `data-rendered`, performance.now() in ms: parsing the
HTML and its data, decoding, the grid and the zoomed head drawn), Chromium's whole run for that load,
and, with row=I in --view, whether the pinned row's weights are shown ("query I" and its top keys);
it exits 1 if the page did not render or the row is not shown. --budget S fails it past S seconds.
"""
from __future__ import annotations

import argparse
import html
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


def chromium(browser: str, url: str, size: str, *extra: str, timeout: float = 180) -> tuple[subprocess.CompletedProcess, float]:
    """One headless run of `browser` on `url` with a new empty profile: (the finished process, seconds)."""
    with tempfile.TemporaryDirectory(prefix="minigen-chromium-") as profile:
        cmd = [browser, *FLAGS, f"--user-data-dir={profile}", f"--window-size={size}", *extra, url]
        start = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return r, time.perf_counter() - start


def loaded(browser: str, url: str, size: str) -> tuple[int | None, str, float, subprocess.CompletedProcess]:
    """Load the page once and read its DOM after the load event: (ms from navigation to the end of the page's
    script, or None if it did not get there; the text of its #info; chromium's whole run in s; the process)."""
    r, seconds = chromium(browser, url, size, "--dump-dom")
    rendered = re.search(r'data-rendered="(\d+)"', r.stdout)
    info = re.search(r'<div id="info">(.*?)</div>', r.stdout, re.S)
    return (int(rendered[1]) if rendered and r.returncode == 0 else None,
            html.unescape(info[1]) if info else "", seconds, r)


def row_shown(text: str, row: int) -> bool:
    """The page's #info shows pinned row `row` and its top keys."""
    return text.startswith(f"query {row} ") and "\ntop: " in text


def check(browser: str, url: str, size: str, row: int | None, budget: float | None) -> int:
    """Load the page, read its DOM: the render time, and the pinned row. 0 if all is well."""
    ms, text, seconds, r = loaded(browser, url, size)
    if ms is None:
        print(f"screenshot_html: the page did not render (chromium {r.returncode}):\n{r.stderr[-2000:]}", file=sys.stderr)
        return 1
    print(f"rendered in {ms / 1000:.2f} s (navigation to the end of the page's script; chromium's whole run "
          f"{seconds:.2f} s)")
    failed = budget is not None and ms / 1000 > budget
    if failed:
        print(f"screenshot_html: over the {budget:g} s budget", file=sys.stderr)
    if row is not None:
        shown = row_shown(text, row)
        print(f"pinned row {row}: " + ("shown: " + text.replace("\n", " | ") if shown else "NOT shown"))
        failed = failed or not shown
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html", type=Path)
    ap.add_argument("png", type=Path)
    ap.add_argument("--select", help="L,H: the layer and head to zoom")
    ap.add_argument("--hide", action="store_true", help="start with the first token hidden")
    ap.add_argument("--size", default="1600,1000", help="window width,height in pixels")
    ap.add_argument("--view", default="", help="more of the page's URL hash, e.g. vw=1&sqrt=1&row=5")
    ap.add_argument("--check", action="store_true", help="also time the render and check the pinned row")
    ap.add_argument("--budget", type=float, help="with --check: fail past this many seconds")
    ap.add_argument("--browser", default=None, help="chromium binary (default: chromium on PATH)")
    a = ap.parse_args()
    browser = a.browser or shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        print("screenshot_html: no chromium on PATH (apt-get install -y chromium)", file=sys.stderr)
        return 1
    if not a.html.is_file():
        print(f"screenshot_html: {a.html}: no such file", file=sys.stderr)
        return 1
    frag = []
    if a.select:
        layer, head = a.select.split(",")
        frag += [f"layer={int(layer)}", f"head={int(head)}"]
    if a.hide:
        frag.append("hide=1")
    if a.view:
        frag.append(a.view)
    url = a.html.resolve().as_uri() + ("#" + "&".join(frag) if frag else "")
    r, _ = chromium(browser, url, a.size, "--virtual-time-budget=5000", f"--screenshot={a.png.resolve()}")
    if r.returncode != 0 or not a.png.is_file():
        print(f"screenshot_html: chromium failed ({r.returncode}):\n{r.stderr[-2000:]}", file=sys.stderr)
        return 1
    print(f"wrote {a.png}")
    if not a.check:
        return 0
    row = re.search(r"(?:^|&)row=(\d+)", a.view)
    return check(browser, url, a.size, int(row[1]) if row else None, a.budget)


if __name__ == "__main__":
    sys.exit(main())

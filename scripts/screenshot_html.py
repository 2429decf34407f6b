#!/usr/bin/env python3
"""Open an HTML file in headless Chromium and save a PNG: a check that `minigen attention --html`
pages render in a real browser. Needs Debian's chromium (`apt-get install -y chromium`); not part of
the test suite.

    python scripts/screenshot_html.py attn.html attn.png [--select 3,2] [--hide] [--size 1600,1000]

--select L,H opens the page with layer L, head H zoomed (the page reads #layer=L&head=H from the URL);
--view adds more of the hash (vw=1: value-weighted, sqrt=1: sqrt colour scale, row=I: a pinned row).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--virtual-time-budget=5000"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html", type=Path)
    ap.add_argument("png", type=Path)
    ap.add_argument("--select", help="L,H: the layer and head to zoom")
    ap.add_argument("--hide", action="store_true", help="start with the first token hidden")
    ap.add_argument("--size", default="1600,1000", help="window width,height in pixels")
    ap.add_argument("--view", default="", help="more of the page's URL hash, e.g. vw=1&sqrt=1&row=5")
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
    with tempfile.TemporaryDirectory(prefix="minigen-chromium-") as profile:
        cmd = [browser, *FLAGS, f"--user-data-dir={profile}", f"--window-size={a.size}",
               f"--screenshot={a.png.resolve()}", url]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0 or not a.png.is_file():
        print(f"screenshot_html: chromium failed ({r.returncode}):\n{r.stderr[-2000:]}", file=sys.stderr)
        return 1
    print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Terminal text for the census and the top-k chart: lists of lines, the CLI prints them."""
from __future__ import annotations

import numpy as np

from .stats import STAT_HELP, STATS, strongest

KINDS = [  # (label, statistic, lowest?) for the "strongest heads" summary
    ("attention sinks (mass on token 0)", "sink", False),
    ("previous-token heads", "prev", False),
    ("self heads (mass on own position)", "self", False),
    ("focused heads (lowest entropy)", "entropy", True),
    ("broad heads (highest entropy)", "entropy", False),
    ("induction heads (repeated random tokens)", "induction", False),
]


def label(s: str, width: int = 14) -> str:
    s = repr(s)[1:-1]
    return s if len(s) <= width else s[: width - 1] + "…"


def format_census(table: dict[str, np.ndarray], layers: list[int], heads: list[int], n_best: int = 3) -> list[str]:
    """One line per layer x head, then the strongest heads of each kind."""
    cols = list(STATS) + (["induction"] if "induction" in table else [])
    out = ["layer head " + " ".join(f"{c:>9}" for c in cols)]
    for a, l in enumerate(layers):
        for b, h in enumerate(heads):
            out.append(f"{l:5d} {h:4d} " + " ".join(f"{table[c][a, b]:9.3f}" for c in cols))
    out.append("")
    out.append("strongest heads (layer.head value):")
    for name, stat, lowest in KINDS:
        if stat in table:
            best = strongest(table[stat], layers, heads, n_best, lowest)
            out.append(f"  {name:42s} " + "  ".join(f"{l}.{h} {v:.3f}" for l, h, v in best))
    out.append("")
    out += [f"  {c:9s} {STAT_HELP[c]}" for c in STATS]
    if "induction" in table:
        out.append("  induction mean weight from each token of the second repeat to the token after its first occurrence")
    out.append("  (each averaged over query tokens 1..T-1; token 0 can only attend to itself)")
    return out


def format_topk(weights: np.ndarray, tokens: list[str], i: int, k: int = 10, width: int = 40) -> list[str]:
    """Bar chart of the k largest weights of one query row (keys 0..i)."""
    row = np.asarray(weights[: i + 1], dtype=np.float64)
    order = np.argsort(-row, kind="stable")[:k]
    w = max(len(label(tokens[j])) for j in order) + 4
    lines = []
    for j in order:
        n = row[j] * width
        bar = "█" * int(n) + ("▌" if n - int(n) >= 0.5 else "")
        lines.append(f"  {j:5d} {repr(label(tokens[j])).ljust(w)} {100 * row[j]:6.2f}%  {bar}")
    rest = 1.0 - row[order].sum()
    if len(order) < len(row):
        lines.append(f"  {'':5s} {'(others)'.ljust(w)} {100 * rest:6.2f}%")
    return lines

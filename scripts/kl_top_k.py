"""How much KL divergence --save-logits' top-k file loses against the sum over the whole vocabulary.

    python scripts/kl_top_k.py TEXT BASE MODEL [--ctx 512] [--chunks 2] [--k 8 32 128]

BASE and MODEL: anything --model takes (directories, GGUF files). On llama-perplexity's windows of TEXT, prints
the mean KL(base || model) over the full vocabulary and over each top-k + rest file, and the largest
per-position gap.
"""
from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import minigen  # noqa: E402
from minigen.resolve import resolve  # noqa: E402
from minigen.generation import scores as S  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("text", type=Path)
    ap.add_argument("base")
    ap.add_argument("model")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--k", type=int, nargs="+", default=[8, 32, 128])
    a = ap.parse_args()
    base, tok = minigen.load(resolve(a.base).path)
    other, _ = minigen.load(resolve(a.model).path)
    ids = tok.encode(a.text.read_text(encoding="utf-8"))
    bos = S.added_bos(tok)
    full = []                                                    # exact KL per position, float64
    for w in S.windows_for(np.asarray(ids), a.ctx, None, bos, a.chunks):
        for p_rows, q_rows in zip(S.window_logprobs(base, w.ids, w.first), S.window_logprobs(other, w.ids, w.first)):
            p, q = p_rows.astype(np.float64), q_rows.astype(np.float64)
            full.append((np.exp(p) * (p - q)).sum(axis=1))
    full = np.concatenate(full)
    print(f"{len(full)} positions; KL over the whole vocabulary: mean {full.mean():.6f}, median {np.median(full):.6f}, "
          f"99% {np.quantile(full, 0.99):.6f}")
    for k in a.k:
        buf = io.BytesIO()
        S.perplexity(base, ids, a.ctx, None, bos, save=S.LogitsWriter(buf, a.base, k), chunks=a.chunks)
        path = Path(f"/tmp/kl_top_k.{k}.logits")
        path.write_bytes(buf.getvalue())
        kl = S.perplexity(other, ids, a.ctx, None, bos, base=S.BaseLogits(path), chunks=a.chunks).kl
        path.unlink()
        print(f"top-{k} + rest: mean {kl['kl_mean']:.6f} ({100 * (kl['kl_mean'] / full.mean() - 1):+.3f} %), "
              f"median {kl['kl_median']:.6f}, 99% {kl['kl_p99']:.6f}")


if __name__ == "__main__":
    main()

"""Where minigen's time goes: a prompt's forward pass and one decode step after it, piece by piece.

    python scripts/where_time_goes.py                          # the default model; prompts of 512 and 4096 tokens
    python scripts/where_time_goes.py --lengths 512 --repeats 5 --hf-python /root/ref/bin/python

For each prompt length N it prints:

- prefill: the forward pass over N tokens, timed as it runs (threads and all) and split by phase of a
  layer, summed over layers: the attention norm with the q/k/v projection, q/k norm and RoPE; attention
  itself; the output projection with the MLP and the residual adds. The projections' speed is set
  beside the time the same GEMMs take alone in NumPy (OpenBLAS, all threads), and, with --hf-python,
  in torch (transformers' engine; MKL on Intel), as GFLOP/s: the speed the engines' matrix products
  allow.
- decode: one step after the N-token prompt, split into the weight GEMVs (beside NumPy's floor for
  them: the same x @ w.T alone, over every matrix), attention over the cache (with the bytes of K and
  V it reads, as GB/s), norms, RoPE, the activation, the cache write, and the rest (Python, adds,
  the embedding lookup).

Timers wrap the engine's functions (a few hundred ns each; the decode total is also given without
them). Run it on a quiet machine: it measures wall time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import minigen  # noqa: E402  first: it sets OpenBLAS up before NumPy loads it
from minigen.engine import layers, mixers, model as M, moe, parallel  # noqa: E402
from minigen.engine.cache import KVBase  # noqa: E402
from minigen.gguf.default_model import default_model_path  # noqa: E402

import numpy as np  # noqa: E402

TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
        "movable metal type, oil-based inks and a wooden press adapted from those used to make wine. ")


class Clock:
    """Exclusive wall time per label: a timed call inside another is taken out of the outer one."""

    def __init__(self):
        self.seconds, self.calls, self.stack = defaultdict(float), defaultdict(int), []

    def wrap(self, label, fn):
        def timed(*args, **kwargs):
            name = label(*args, **kwargs) if callable(label) else label
            self.stack.append(0.0)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                inner = self.stack.pop()
                self.seconds[name] += spent - inner
                self.calls[name] += 1
                if self.stack:
                    self.stack[-1] += spent
        return timed

    def reset(self):
        self.seconds.clear()
        self.calls.clear()


def weight_names(model) -> dict:
    """id(array) -> its name ('wqkv', 'w_down', 'lm_head', ...), for labelling GEMVs."""
    names = {id(model.params["lm_head"]): "lm_head"}
    for layer in model.params["layers"]:
        for k, v in layer.items():
            if getattr(v, "ndim", 0) == 2:
                names[id(v)] = k
    return names


ENGINE = (M, mixers, layers, moe)   # the modules whose functions the clocks wrap (each imported `linear` itself)


def patch(name: str, make) -> Callable[[], None]:
    """Every engine module's `name` replaced by make(the original); returns a function that puts them back."""
    saved = [(m, getattr(m, name)) for m in ENGINE if hasattr(m, name)]
    for m, fn in saved:
        setattr(m, name, make(fn))
    return lambda: [setattr(m, name, fn) for m, fn in saved]


def instrument(model, clock: Clock):
    """Wrap the engine's pieces with the clock; returns a function that undoes it."""
    names = weight_names(model)
    undos = [patch("linear", lambda fn: clock.wrap(lambda x, w, b=None: "gemv " + names.get(id(w), "?"), fn)),
             patch("norm", lambda fn: clock.wrap("norms", fn)),
             patch("unembed", lambda fn: clock.wrap("gemv lm_head", fn)),   # its final norm counts as a norm
             patch("rope_for", lambda fn: clock.wrap("rope", fn)),
             patch("apply_rope", lambda fn: clock.wrap("rope", fn)),
             patch("activation", lambda fn: lambda name: clock.wrap("activation", fn(name)))]
    saved_attend, saved_extend = KVBase.attend, KVBase.extend
    KVBase.attend = clock.wrap("attention over the cache", saved_attend)
    KVBase.extend = clock.wrap("cache write", saved_extend)

    def undo():
        for u in undos:
            u()
        KVBase.attend, KVBase.extend = saved_attend, saved_extend
    return undo


def prompt(tok, n: int) -> list[int]:
    """n tokens of TEXT, by the model's own tokenizer (a directory's tokenizer.json or a GGUF's vocabulary)."""
    return list(tok.encode(TEXT * (n // 20 + 1)))[:n]


# --- prefill: phases of a layer --------------------------------------------------------------------

BEFORE, AFTER = "norm, q/k/v projection, RoPE", "o_proj, MLP, residual adds"
PHASES = {"norm": BEFORE, "qkv_heads": BEFORE, "linear": AFTER, "after_mixer": AFTER}   # parallel.by_rows's functions
WEIGHTS = {BEFORE: ["wqkv"], AFTER: ["wo", "w_gate_up", "w_up", "w_down"]}             # each phase's weight GEMMs


class PhaseClock:
    """Times the layer's row-wise phases (its calls to parallel.by_rows) and attention over the cache."""

    def __init__(self):
        self.seconds = defaultdict(float)

    def install(self):
        real_parallel, real_attend = parallel, KVBase.attend
        clock = self

        class Shim:
            def __getattr__(self, name):
                return getattr(real_parallel, name)

            @staticmethod
            def by_rows(fn, *rows, **kw):
                label = PHASES.get(fn.__name__, fn.__name__)
                start = time.perf_counter()
                try:
                    return real_parallel.by_rows(fn, *rows, **kw)
                finally:
                    clock.seconds[label] += time.perf_counter() - start

        def attend(*args, **kwargs):
            start = time.perf_counter()
            try:
                return real_attend(*args, **kwargs)
            finally:
                clock.seconds["attention"] += time.perf_counter() - start

        M.parallel, mixers.parallel, KVBase.attend = Shim(), Shim(), attend

        def undo():
            M.parallel, mixers.parallel, KVBase.attend = real_parallel, real_parallel, real_attend
        return undo


def projection_shapes(model) -> dict:
    """{phase: [(out, in) of each weight GEMM of one layer in that phase]} (lm_head apart)."""
    p = model.params["layers"][0]
    return {phase: [p[k].shape for k in keys if k in p] for phase, keys in WEIGHTS.items()}


def alone(x, w):
    """x @ w.T as the model multiplies it: OpenBLAS for a float32 array, the kernels for a matrix kept stored."""
    return w.times(x) if hasattr(w, "times") else x @ w.T


def numpy_gemm_seconds(model, n: int, repeats: int) -> dict:
    """Seconds of the weight GEMMs alone, per phase, over all layers: x (n, in) @ w.T in NumPy."""
    out = {}
    for phase, _ in projection_shapes(model).items():
        keys = [k for k in WEIGHTS[phase] if k in model.params["layers"][0]]
        xs = {}
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for layer in model.params["layers"]:
                for k in keys:
                    w = layer[k]
                    x = xs.setdefault(w.shape[1], np.random.default_rng(0).standard_normal((n, w.shape[1]),
                                                                                          np.float32))
                    alone(x, w)
            times.append(time.perf_counter() - start)
        out[phase] = statistics.median(times)
    return out


TORCH_GEMMS = r"""
import json, statistics, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
spec = json.loads(sys.stdin.read())
out = {}
with torch.inference_mode():
    for phase, item in spec["phases"].items():
        ws = [torch.randn(o, i) for o, i in item["shapes"]]
        xs = {i: torch.randn(spec["n"], i) for _, i in item["shapes"]}
        for w in ws:
            alone(xs[w.shape[1]], w)
        times = []
        for _ in range(spec["repeats"]):
            start = time.perf_counter()
            for _ in range(spec["layers"]):
                for w in ws:
                    alone(xs[w.shape[1]], w)
            times.append(time.perf_counter() - start)
        out[phase] = statistics.median(times)
print(json.dumps(out))
"""


def torch_gemm_seconds(python: str, model, n: int, repeats: int, threads: int) -> dict | None:
    spec = dict(n=n, repeats=repeats, layers=model.config.n_layers,
                phases={k: dict(shapes=[list(s) for s in v]) for k, v in projection_shapes(model).items()})
    try:
        r = subprocess.run([python, "-c", TORCH_GEMMS, str(threads)], input=json.dumps(spec), text=True,
                           capture_output=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"where_time_goes: torch GEMMs not timed ({e})", file=sys.stderr)
        return None
    if r.returncode:
        print(f"where_time_goes: torch GEMMs not timed: {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(r.stdout)


def profile_prefill(model, ids: list[int], repeats: int, hf_python: str | None) -> None:
    n = len(ids)
    clock = PhaseClock()
    model.forward(ids[:64], model.make_cache(64), last_only=True)               # warm up
    walls, phases = [], []
    for _ in range(repeats):
        clock.seconds.clear()
        undo = clock.install()
        try:
            start = time.perf_counter()
            model.forward(ids, model.make_cache(n), last_only=True)
            walls.append(time.perf_counter() - start)
        finally:
            undo()
        phases.append(dict(clock.seconds))
    wall = statistics.median(walls)
    plain = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.forward(ids, model.make_cache(n), last_only=True)
        plain.append(time.perf_counter() - start)
    flops = {k: 2 * n * sum(o * i for o, i in v) * model.config.n_layers for k, v in projection_shapes(model).items()}
    np_gemm = numpy_gemm_seconds(model, n, repeats)
    th_gemm = torch_gemm_seconds(hf_python, model, n, repeats, parallel.n_threads() or 1) \
        if hf_python else None
    print(f"\nprefill, {n} tokens: {statistics.median(plain) * 1e3:.0f} ms ({n / statistics.median(plain):.0f} tok/s); "
          f"with the phase timers {wall * 1e3:.0f} ms")
    print(f"{'phase (all layers)':34} {'ms':>8} {'share':>6}   weight GEMMs, GFLOP/s: minigen in the phase | NumPy alone | torch alone")
    for k in [BEFORE, "attention", AFTER]:
        ms = statistics.median(p.get(k, 0.0) for p in phases)
        line = f"{k:34} {ms * 1e3:8.1f} {ms / wall:6.0%}"
        if k in flops:
            line += f"   {flops[k] / ms / 1e9:6.0f} | {flops[k] / np_gemm[k] / 1e9:6.0f}"
            line += f" | {flops[k] / th_gemm[k] / 1e9:6.0f}" if th_gemm else " |      -"
        print(line)
    rest = wall - sum(statistics.median(p.get(k, 0.0) for p in phases) for k in
                      [BEFORE, "attention", AFTER])
    print(f"{'embedding, final norm, lm_head, rest':34} {rest * 1e3:8.1f} {rest / wall:6.0%}")
    total_flops = sum(flops.values())
    print(f"weight GEMMs alone would allow {n / sum(np_gemm.values()):.0f} tok/s in NumPy"
          + (f", {n / sum(th_gemm.values()):.0f} tok/s in torch" if th_gemm else "")
          + f" ({total_flops / 1e9:.0f} GFLOP)")


# --- decode: one step, piece by piece ------------------------------------------------------------

def gemv_floor(model, repeats: int) -> dict:
    """Median seconds of x @ w.T alone per weight name, over every layer (and lm_head)."""
    names = weight_names(model)
    mats = [w for layer in model.params["layers"] for w in layer.values() if getattr(w, "ndim", 0) == 2]
    mats.append(model.params["lm_head"])
    xs = {w.shape[1]: np.ones((1, w.shape[1]), np.float32) for w in mats}
    runs = []
    for _ in range(repeats):
        t = defaultdict(float)
        for w in mats:
            start = time.perf_counter()
            alone(xs[w.shape[1]], w)
            t["gemv " + names[id(w)]] += time.perf_counter() - start
        runs.append(t)
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def profile_decode(model, ids: list[int], steps: int) -> None:
    n = len(ids)
    cfg = model.config
    cache = model.make_cache(n + 2 * steps + 8)
    logits = model.forward(ids, cache, last_only=True)
    token = int(logits[-1].argmax())
    plain = []
    for _ in range(steps):
        start = time.perf_counter()
        logits = model.forward([token], cache, last_only=True)
        plain.append(time.perf_counter() - start)
        token = int(logits[-1].argmax())
    clock = Clock()
    undo = instrument(model, clock)
    walls, runs = [], []
    try:
        for _ in range(steps):
            clock.reset()
            start = time.perf_counter()
            logits = model.forward([token], cache, last_only=True)
            walls.append(time.perf_counter() - start)
            runs.append((dict(clock.seconds), dict(clock.calls)))
            token = int(logits[-1].argmax())
    finally:
        undo()
    floor = gemv_floor(model, 5)
    wall = statistics.median(walls)
    labels = sorted({k for r, _ in runs for k in r}, key=lambda k: -statistics.median(r.get(k, 0) for r, _ in runs))
    kv_bytes = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4 * (n + steps)
    print(f"\ndecode, one step after {n} tokens: {statistics.median(plain) * 1e3:.2f} ms "
          f"({1 / statistics.median(plain):.1f} tok/s); with the timers {wall * 1e3:.2f} ms; "
          f"NumPy GEMV floor {sum(floor.values()) * 1e3:.2f} ms")
    print(f"{'piece (all layers)':28} {'ms':>7} {'share':>6} {'calls':>6}   floor alone")
    for k in labels:
        ms = statistics.median(r.get(k, 0.0) for r, _ in runs)
        calls = statistics.median(c.get(k, 0) for _, c in runs)
        extra = f"   {floor[k] * 1e3:7.2f} ms" if k in floor else ""
        if k == "attention over the cache":
            extra = f"   reads {kv_bytes / 2**20:.0f} MiB of K and V: {kv_bytes / ms / 1e9:.1f} GB/s"
        print(f"{k:28} {ms * 1e3:7.2f} {ms / wall:6.0%} {calls:6.0f}{extra}")
    rest = wall - sum(statistics.median(r.get(k, 0.0) for r, _ in runs) for k in labels)
    print(f"{'rest (Python, adds, embed)':28} {rest * 1e3:7.2f} {rest / wall:6.0%}")
    gemv = sum(statistics.median(r.get(k, 0.0) for r, _ in runs) for k in labels if k.startswith("gemv"))
    print(f"weight GEMVs {gemv * 1e3:.2f} ms against their floor {sum(floor.values()) * 1e3:.2f} ms; "
          f"everything else {(wall - gemv) * 1e3:.2f} ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a checkpoint directory, .gguf or hub id (default: the default model)")
    ap.add_argument("--lengths", default="512,4096")
    ap.add_argument("--repeats", type=int, default=3, help="prefill runs per length (medians)")
    ap.add_argument("--steps", type=int, default=32, help="decode steps per length (medians)")
    ap.add_argument("--hf-python", default=None,
                    help="an interpreter with torch, to time the same GEMMs in torch (default: none)")
    args = ap.parse_args()
    model, tok = minigen.load(args.model or str(default_model_path()))
    print(f"{model.path}: {model.config.n_layers} layers, {model.n_params / 1e6:.0f} M parameters; "
          f"threads {parallel.n_threads()}")
    for n in [int(x) for x in args.lengths.split(",")]:
        ids = prompt(tok, n)
        profile_prefill(model, ids, args.repeats, args.hf_python)
        profile_decode(model, ids, args.steps)


if __name__ == "__main__":
    main()

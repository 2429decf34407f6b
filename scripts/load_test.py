"""Load test of `minigen serve`, and side by side `transformers serve`: concurrent streaming clients on loopback.

    python scripts/load_test.py                                   # 16 clients, 48 requests, the default model
    python scripts/load_test.py --short --model tests/fixtures/qwen2   # what CI runs (tests/test_serve.py)
    python scripts/load_test.py --compare-transformers --levels 1,4,16 --requests 16 --max-tokens 48
    python scripts/load_test.py --model FILE.gguf --serve-args "--activations int8"   # options of minigen serve

The workload: greedy chat requests (temperature 0) with prompts of different lengths, streamed
(`stream_options.include_usage`); every 8th client hangs up after its second piece of text; every 7th
request is a bad one (malformed JSON, a wrong type) that must get a 400. Printed: requests/s, tokens/s
(completion tokens of every request, over the wall time), p50/p99 time to first token and per-token
latency (the gaps between streamed pieces), and the prompt tokens the server computed (usage's prompt_tokens
less its cached_tokens) per completion token: what concurrency cannot batch away. Then every completed
response is checked against the same request served alone, one at a time: it must be the same text (exit 1
if not).

With --compare-transformers the same streaming workload (no hang-ups, no bad requests) runs against
minigen and against `transformers serve` (/root/ref/bin/transformers, float32, CPU, its default sdpa
attention) at each concurrency of --levels, one after the other in one run; ratios are printed.
Everything is bounded: request count, tokens per request, a timeout per request and for the run.
Servers bind 127.0.0.1 on a free port and are stopped at the end.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRANSFORMERS = "/root/ref/bin/transformers"
TEXT = ("The river rose in the night and by morning the lower fields were under water. The farmers moved "
        "their animals to the hill, where the old church stands, and waited. Nobody had seen a flood like it "
        "since the winter the bridge was lost. By noon the rain stopped, and children came out to throw "
        "stones into the brown water, while their parents counted what the river had taken. ").split(" ")
QUESTIONS = ["Summarise this in one sentence", "What happened to the fields?", "Write a title for this",
             "Who waited on the hill?", "Describe the weather", "List three facts from this text"]
BAD_BODIES = [b'{"messages": [', b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}',
              b'{"messages": "hello"}', b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}']


@dataclass
class Spec:
    index: int
    body: bytes
    kind: str = "ok"                  # "ok" | "hangup" (closes after 2 pieces) | "bad" (expects 400)


@dataclass
class Result:
    spec: Spec
    status: int = 0
    text: str = ""
    tokens: int = 0
    prompt: int = 0                   # prompt tokens (usage), and of them those the server's prefix cache held
    cached: int = 0
    ttft: float | None = None
    gaps: list = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None


def workload(n: int, max_tokens: int, model: str, faults: bool, max_words: int = 120) -> list[Spec]:
    specs = []
    for i in range(n):
        if faults and i % 7 == 6:
            specs.append(Spec(i, BAD_BODIES[i % len(BAD_BODIES)], "bad"))
            continue
        words = 8 + (i * 37) % max_words   # prompts of 8 to 8 + max_words words of text
        doc = " ".join((TEXT * (2 + max_words // len(TEXT)))[(i * 5) % len(TEXT):][:words])
        body = {"model": model, "messages": [{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]}:\n\n{doc}"}],
                "temperature": 0, "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
        specs.append(Spec(i, json.dumps(body).encode(), "hangup" if faults and i % 8 == 3 else "ok"))
    return specs


def request(port: int, spec: Spec, timeout: float) -> Result:
    """One streaming chat request on its own connection; pieces timed as they arrive."""
    r, start = Result(spec), time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", body=spec.body,
                     headers={"Content-Type": "application/json", "Authorization": "Bearer load-test"})
        resp = conn.getresponse()
        r.status = resp.status
        if resp.status != 200:
            resp.read()
            return r
        pieces, last = 0, None
        for line in resp:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                r.tokens = chunk["usage"]["completion_tokens"]
                r.prompt = chunk["usage"].get("prompt_tokens", 0)
                r.cached = (chunk["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            if "error" in chunk:
                r.error = chunk["error"].get("message")
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    now = time.monotonic()
                    r.ttft = r.ttft if r.ttft is not None else now - start
                    if last is not None:
                        r.gaps.append(now - last)
                    last, pieces = now, pieces + 1
                    r.text += piece
            if spec.kind == "hangup" and pieces >= 2:
                conn.sock.shutdown(socket.SHUT_RDWR)
                break
        r.tokens = r.tokens or pieces
    except (OSError, http.client.HTTPException, ValueError) as e:
        r.error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
        r.seconds = time.monotonic() - start
    return r


def run(port: int, specs: list[Spec], clients: int, timeout: float) -> tuple[list[Result], float]:
    start = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda s: request(port, s, timeout), specs))
    return results, time.monotonic() - start


def pct(values: list, p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def figures(results: list[Result], wall: float) -> dict:
    done = [r for r in results if r.spec.kind == "ok" and r.status == 200 and r.error is None]
    streamed = [r for r in results if r.status == 200]
    gaps = [g for r in streamed for g in r.gaps]
    return {"requests": len(done), "requests/s": len(done) / wall, "tokens/s": sum(r.tokens for r in streamed) / wall,
            "ttft p50": pct([r.ttft for r in streamed if r.ttft is not None], 50),
            "ttft p99": pct([r.ttft for r in streamed if r.ttft is not None], 99),
            "token p50": pct(gaps, 50), "token p99": pct(gaps, 99), "wall": wall,
            # prompt tokens the server computed (not taken from its prefix cache) per completion token: a step
            # batches the running sequences' next tokens, but a prompt's rows cost the same batched or not
            "prompt/completion": sum(r.prompt - r.cached for r in streamed) / max(1, sum(r.tokens for r in streamed)),
            "cached": sum(r.cached for r in streamed) / max(1, sum(r.prompt for r in streamed))}


def line(name: str, f: dict) -> str:
    return (f"{name:<26} {f['requests']:>4} req  {f['requests/s']:6.2f} req/s  {f['tokens/s']:7.1f} tok/s  "
            f"TTFT p50 {f['ttft p50']:6.2f} s  p99 {f['ttft p99']:6.2f} s  per token p50 {1000 * f['token p50']:6.1f} ms  "
            f"p99 {1000 * f['token p99']:6.1f} ms  prompt tokens computed per completion token "
            f"{f['prompt/completion']:.2f} ({100 * f['cached']:.0f} % from the prefix cache)  ({f['wall']:.1f} s)")


def check(results: list[Result], port: int, timeout: float) -> list[str]:
    """Problems: a fault not answered as it should be, or a completed reply unlike the same request alone."""
    problems = []
    for r in results:
        k = r.spec.kind
        if k == "bad" and r.status != 400:
            problems.append(f"request {r.spec.index}: a bad request got {r.status}, not 400")
        elif k == "ok" and (r.status != 200 or r.error):
            problems.append(f"request {r.spec.index}: status {r.status}, {r.error}")
        elif k == "ok":
            alone = request(port, r.spec, timeout)
            if alone.text != r.text:
                problems.append(f"request {r.spec.index}: served with others {r.text[:60]!r}..., "
                                f"alone {alone.text[:60]!r}...")
    return problems


# --- servers ---------------------------------------------------------------------------------------------

class Server:
    def __init__(self, argv: list[str], ready, env: dict | None = None, log: Path | None = None):
        self.log = open(log or os.devnull, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.port = ready(self)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def minigen_server(model: str | None, max_batch: int, log: Path | None, extra: str = "") -> Server:
    argv = [sys.executable, "-m", "minigen", "serve", "--port", "0", "--max-batch", str(max_batch),
            "--max-queue", "256"] + (["--model", model] if model else []) + shlex.split(extra)

    def ready(s: Server) -> int:
        for text in s.proc.stderr:
            if m := re.search(r"http://127\.0\.0\.1:(\d+)/v1", text):
                threading.Thread(target=lambda: [s.log.write(x) for x in s.proc.stderr], daemon=True).start()
                return int(m[1])
        raise SystemExit(f"minigen serve did not start (exit {s.proc.wait()})")

    return Server(argv, ready, {"PYTHONUNBUFFERED": "1"}, log)


def transformers_server(model_dir: str, log: Path | None, continuous: bool) -> Server:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [TRANSFORMERS, "serve", model_dir, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--device", "cpu"] + (["--continuous-batching"] if continuous else [])

    def ready(s: Server) -> int:
        threading.Thread(target=lambda: [s.log.write(x) for x in s.proc.stderr], daemon=True).start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and s.proc.poll() is None:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/v1/models")
                if conn.getresponse().status == 200:
                    return port
            except OSError:
                time.sleep(1)
        raise SystemExit(f"transformers serve did not start (see {log})")

    return Server(argv, ready, {"TRANSFORMERS_VERBOSITY": "error"}, log)


def warm(port: int, model: str, timeout: float):
    """One short request, so that loading and first-call costs are not counted."""
    request(port, workload(1, 4, model, False)[0], timeout)


def default_model_dir() -> str:
    sys.path.insert(0, str(ROOT))
    from minigen.gguf.default_model import default_model_path
    return str(default_model_path())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="checkpoint for minigen serve (default: the default model)")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--max-words", type=int, default=120, help="prompts of 8 to 8 + this many words")
    p.add_argument("--timeout", type=float, default=300, help="seconds per request")
    p.add_argument("--short", action="store_true", help="CI's run: 4 clients, 10 requests, 8 tokens")
    p.add_argument("--compare-transformers", action="store_true")
    p.add_argument("--continuous-batching", action="store_true", help="transformers serve --continuous-batching")
    p.add_argument("--levels", default="1,4,16", help="concurrent clients for --compare-transformers")
    p.add_argument("--log-dir", type=Path, help="keep the servers' logs here")
    p.add_argument("--serve-args", default="", help="more options for minigen serve, e.g. '--activations int8'")
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout's SIGTERM still stops the servers
    if a.short:
        a.clients, a.requests, a.max_tokens, a.max_words = 4, 10, 8, 16
    log = (lambda name: a.log_dir / name) if a.log_dir else (lambda name: None)
    if a.log_dir:
        a.log_dir.mkdir(parents=True, exist_ok=True)
    if a.compare_transformers:
        return compare(a, log)
    server = minigen_server(a.model, a.max_batch, log("minigen.log"), a.serve_args)
    try:
        name = json.loads(http_get(server.port, "/v1/models"))["data"][0]["id"]
        warm(server.port, name, a.timeout)
        results, wall = run(server.port, workload(a.requests, a.max_tokens, name, True, a.max_words), a.clients, a.timeout)
        print(f"{a.requests} requests, {a.clients} concurrent clients, max {a.max_tokens} tokens, "
              f"--max-batch {a.max_batch}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        print(line("minigen", figures(results, wall)))
        problems = check(results, server.port, a.timeout)
    finally:
        server.stop()
    for problem in problems:
        print("FAIL", problem)
    print(f"{sum(r.spec.kind == 'ok' for r in results)} completed responses checked against the same request "
          f"alone: {'all equal' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0


def compare(a, log) -> int:
    levels = [int(x) for x in a.levels.split(",")]
    model_dir = a.model or default_model_dir()
    rows = {}
    for engine in ("minigen", "transformers"):
        server = minigen_server(model_dir, max(levels), log("minigen.log"), a.serve_args) if engine == "minigen" else \
            transformers_server(model_dir, log("transformers.log"), a.continuous_batching)
        try:
            name = json.loads(http_get(server.port, "/v1/models"))["data"][0]["id"] if engine == "minigen" else model_dir
            warm(server.port, name, a.timeout)
            for clients in levels:
                specs = workload(max(a.requests, clients), a.max_tokens, name, False, a.max_words)
                results, wall = run(server.port, specs, clients, a.timeout)
                bad = [r for r in results if r.status != 200 or r.error]
                rows[engine, clients] = f = figures(results, wall)
                print(line(f"{engine} x{clients}", f) + (f"  [{len(bad)} failed: {bad[0].error or bad[0].status}]"
                                                          if bad else ""), flush=True)
        finally:
            server.stop()
    print(f"\nload average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; {a.max_tokens} tokens per request, greedy")
    print("| clients | minigen tok/s | transformers tok/s | ratio | minigen TTFT p50 | transformers TTFT p50 |")
    print("|---|---|---|---|---|---|")
    for c in levels:
        m, t = rows["minigen", c], rows["transformers", c]
        print(f"| {c} | {m['tokens/s']:.1f} | {t['tokens/s']:.1f} | {m['tokens/s'] / t['tokens/s']:.2f}x | "
              f"{m['ttft p50']:.2f} s | {t['ttft p50']:.2f} s |")
    top = max(levels)
    print(f"minigen at {top} clients / minigen at {min(levels)}: "
          f"{rows['minigen', top]['tokens/s'] / rows['minigen', min(levels)]['tokens/s']:.2f}x")
    return 0


def http_get(port: int, path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    return conn.getresponse().read()


if __name__ == "__main__":
    sys.exit(main())

"""`minigen serve` with real clients: the official `openai` package and raw sockets, against a server on
127.0.0.1 (a free port), on the tiny qwen2 parity fixture (a real checkpoint directory with a chat
template, 256 tokens of context).

References are independent of minigen.serve: `minigen generate` (the CLI, in process) on the same
messages or prompt, and log_softmax of `Model.logits` on the prompt and the generated ids. Tests that
need a request to stay in the batch (queue full, a client going away) run the server in process over a
batch step that advances only when the test gives it a step ("permits"), so nothing depends on timing.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import greedy

openai = pytest.importorskip("openai")

import minigen  # noqa: E402
from minigen.cli import main  # noqa: E402
from minigen.generation.sampling import log_softmax  # noqa: E402
from minigen.serve.http import Server, build  # noqa: E402
from minigen.generation.batch import Batch  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "qwen2"
NAME = "qwen2"
KEY = "sk-test-key"
TIMEOUT = 30  # seconds, for every client call: a hang fails the test instead of the suite
MESSAGES = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def loaded():
    return minigen.load(FIXTURE)


class Gated(Batch):
    """The server's own batch step, advancing only as many steps as the test has allowed (`allow`); without
    a permit a step returns nothing, so the scheduler goes on seeing cancellations."""

    def __init__(self, model, prefill_chunk: int | None = None):
        super().__init__(model, prefill_chunk)
        self.permits = threading.Semaphore(0)
        self.steps = []   # each step's handles that got a token

    def allow(self, n: int):
        for _ in range(n):
            self.permits.release()

    def step(self):
        if not self.permits.acquire(timeout=0.02):
            return {}
        out = super().step()
        self.steps.append(set(out))
        return out


class Running:
    def __init__(self, loaded, **kwargs):
        model, tok = loaded
        self.lines = []
        self.app = build(model, tok, NAME, log=self.lines.append, **kwargs)
        self.server = Server(("127.0.0.1", 0), self.app)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=KEY, timeout=TIMEOUT,
                                    max_retries=0)

    def close(self):
        self.server.shutdown()
        self.app.scheduler.stop(1.0)
        self.server.server_close()

    def health(self) -> dict:
        return json.loads(raw(self.port, "GET", "/health")[1])


@pytest.fixture(scope="module")
def server(loaded):
    s = Running(loaded, api_key=KEY)
    yield s
    s.close()


@pytest.fixture()
def gated(loaded):
    model, tok = loaded
    s = Running(loaded, max_batch=1, max_queue=1, batch=Gated(model))
    yield s
    s.app.scheduler.batch.allow(10_000)
    s.close()


def raw(port: int, method: str, path: str, body: bytes | str | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    conn.request(method, path, body=body, headers={"Authorization": f"Bearer {KEY}", **(headers or {})})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data, dict(r.getheaders())


def generate_cli(*args) -> str:
    result = CliRunner().invoke(main, ["generate", "--model", str(FIXTURE), "-q", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result.stdout


def wait_for(predicate, what: str, seconds: float = TIMEOUT):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# --- replies equal minigen generate --------------------------------------------------------------

def test_chat_equals_generate_chat(server):
    want = generate_cli("--chat", "--system", MESSAGES[0]["content"], MESSAGES[1]["content"], "--temp", "0", "-m", 24)
    r = server.client.chat.completions.create(model=NAME, messages=MESSAGES, temperature=0, max_tokens=24)
    assert r.choices[0].message.content == want and r.choices[0].message.role == "assistant"
    assert r.object == "chat.completion" and r.model == NAME
    assert r.usage.completion_tokens >= 1 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    chunks = list(server.client.chat.completions.create(model=NAME, messages=MESSAGES, temperature=0, max_tokens=24,
                                                        stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == r.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_completion_equals_generate(server, loaded):
    _, tok = loaded
    prompt = "The quick brown fox"
    want = generate_cli(prompt, "--temp", "0", "-m", 20)
    r = server.client.completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=20)
    assert r.choices[0].text == want and r.object == "text_completion"
    by_ids = server.client.completions.create(model=NAME, prompt=tok.encode(prompt), temperature=0, max_tokens=20)
    assert by_ids.choices[0].text == want
    pieces = [c.choices[0].text for c in server.client.completions.create(
        model=NAME, prompt=prompt, temperature=0, max_tokens=20, stream=True)]
    assert "".join(pieces) == want and len(pieces) > 2


def test_stream_is_the_decode_of_the_ids(server, loaded):
    """Streamed deltas add up to the tokenizer's decode of the generated ids (the log-prob entries give
    the ids' text one by one; greedy, so the ids are the argmax of each step)."""
    model, tok = loaded
    stream = server.client.chat.completions.create(model=NAME, messages=MESSAGES, temperature=0, max_tokens=40,
                                                   stream=True, logprobs=True)
    text, entries = "", []
    for c in stream:
        if c.choices:
            text += c.choices[0].delta.content or ""
            entries += (c.choices[0].logprobs.content or []) if c.choices[0].logprobs else []
    ids = greedy_ids(model, tok, len(entries))
    assert text == tok.decode(ids) and [e.token for e in entries] == [tok.decode([i]) for i in ids]


def greedy_ids(model, tok, n):
    prompt = tok.encode(tok.apply_chat_template(MESSAGES), add_special_tokens=False)
    return greedy(model, prompt, n)[0]


def test_chat_logprobs_are_the_models(server, loaded):
    model, tok = loaded
    r = server.client.chat.completions.create(model=NAME, messages=MESSAGES, temperature=0, max_tokens=8,
                                              logprobs=True, top_logprobs=3)
    entries = r.choices[0].logprobs.content
    prompt = tok.encode(tok.apply_chat_template(MESSAGES), add_special_tokens=False)
    ids = greedy_ids(model, tok, len(entries))
    logprobs = [log_softmax(row) for row in model.logits(prompt + ids)[len(prompt) - 1:]]
    for e, i, lp in zip(entries, ids, logprobs):
        top = np.argsort(-lp)[:3]
        assert e.token == tok.decode([i]) and e.logprob == pytest.approx(float(lp[i]), abs=1e-4)
        assert [a.logprob for a in e.top_logprobs] == pytest.approx([float(lp[t]) for t in top], abs=1e-4)
        assert [a.token for a in e.top_logprobs] == [tok.decode([int(t)]) for t in top]
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token


def test_completion_logprobs(server):
    r = server.client.completions.create(model=NAME, prompt="Hello there", temperature=0, max_tokens=6, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.token_logprobs) == len(lp.tokens)
    assert all(len(t) == 2 and max(t.values()) == pytest.approx(v, abs=1e-5) for t, v in zip(lp.top_logprobs,
                                                                                                lp.token_logprobs))
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])


def test_stop_and_sampling_fields(server):
    full = server.client.completions.create(model=NAME, prompt="one two", temperature=0, max_tokens=20).choices[0]
    stop = full.text[3:6]
    cut = server.client.completions.create(model=NAME, prompt="one two", temperature=0, max_tokens=20, stop=[stop])
    assert cut.choices[0].text == full.text[:full.text.find(stop)] and cut.choices[0].finish_reason == "stop"
    extra = {"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.3}
    a, b = (server.client.completions.create(model=NAME, prompt="one two", temperature=1.0, top_p=0.9, seed=7,
                                             max_tokens=10, extra_body=extra).choices[0].text for _ in range(2))
    assert a == b  # the same seed, the same draws
    assert a == generate_cli("one two", "--temp", 1.0, "--top-p", 0.9, "--seed", 7, "-m", 10, "--top-k", 5,
                             "--min-p", 0.05, "--repeat-penalty", 1.3)


def test_models_health_and_log(server):
    models = server.client.models.list()
    assert [m.id for m in models.data] == [NAME]
    assert server.health()["status"] == "ok"
    server.client.completions.create(model=NAME, prompt="Hi", max_tokens=2, temperature=0)
    line = next(line for line in reversed(server.lines) if line.startswith("POST /v1/completions 200"))
    assert re.search(r"prompt=\d+ cached=\d+ completion=2 ttft=[\d.]+s [\d.]+ tok/s", line), line


def test_prefix_cache_reuses_a_conversation(server):
    first = server.client.chat.completions.create(model=NAME, messages=MESSAGES, temperature=0, max_tokens=10)
    follow = MESSAGES + [{"role": "assistant", "content": first.choices[0].message.content},
                         {"role": "user", "content": "And then?"}]
    r = server.client.chat.completions.create(model=NAME, messages=follow, temperature=0, max_tokens=10)
    assert r.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    fresh = Running((server.app.model, server.app.tokenizer.inner), prefix_bytes=0)
    try:
        alone = fresh.client.chat.completions.create(model=NAME, messages=follow, temperature=0, max_tokens=10)
    finally:
        fresh.close()
    assert alone.usage.prompt_tokens_details.cached_tokens == 0
    assert r.choices[0].message.content == alone.choices[0].message.content


# --- faults ---------------------------------------------------------------------------------------

def error_of(status_data) -> dict:
    status, data, _ = status_data
    return {"status": status, **json.loads(data)["error"]}


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (json.dumps({"messages": MESSAGES, "temperature": "hot"}), "temperature"),
    (json.dumps({"messages": MESSAGES, "max_tokens": -1}), "max_tokens"),
    (json.dumps({"messages": MESSAGES, "max_completion_tokens": 1.5}), "max_completion_tokens"),
    (json.dumps({"messages": MESSAGES, "max_tokens": 0}), "max_tokens"),   # generated until the context filled
    (json.dumps({"messages": MESSAGES, "max_completion_tokens": 0}), "max_completion_tokens"),
    (json.dumps({"messages": MESSAGES, "top_p": 0}), "top_p"),
    (json.dumps({"messages": MESSAGES, "stream": "yes"}), "stream"),
    (json.dumps({"messages": MESSAGES, "stop": [1]}), "stop"),
    (json.dumps({"messages": MESSAGES, "n": 2}), "n"),
    (json.dumps({"messages": MESSAGES, "top_logprobs": 2}), "top_logprobs"),
    (json.dumps({"messages": "hello"}), "messages"),
    (json.dumps({"messages": [{"role": "robot", "content": "x"}]}), "messages[0].role"),
    (json.dumps({"messages": [{"role": "user", "content": 5}]}), "messages[0].content"),
])
def test_bad_requests_are_400_naming_the_field(server, body, param):
    e = error_of(raw(server.port, "POST", "/v1/chat/completions", body))
    assert e["status"] == 400 and e["param"] == param and e["type"] == "invalid_request_error"
    assert param is None or e["message"].startswith(param)


def test_a_completion_of_no_tokens_is_400(server):
    e = error_of(raw(server.port, "POST", "/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 0})))
    assert e["status"] == 400 and e["param"] == "max_tokens" and "at least 1" in e["message"]


def test_unknown_fields_are_400_naming_them(server):
    e = error_of(raw(server.port, "POST", "/v1/completions",
                     json.dumps({"prompt": "Hi", "max_tokens": 2, "temperature": 0, "frobnicate": [1, {}]})))
    assert e["status"] == 400 and e["param"] == "frobnicate" and "does not implement" in e["message"]
    status, data, _ = raw(server.port, "POST", "/v1/completions",   # null is as absent
                          json.dumps({"prompt": "Hi", "max_tokens": 2, "temperature": 0, "frobnicate": None}))
    assert status == 200 and json.loads(data)["choices"][0]["finish_reason"] in ("stop", "length")


def test_unknown_model_too_long_prompt_and_big_body(server):
    with pytest.raises(openai.NotFoundError) as e:
        server.client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert e.value.body["param"] == "model" and e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        server.client.completions.create(model=NAME, prompt=[5] * 300)
    assert e.value.body["code"] == "context_length_exceeded" and "300 tokens" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        server.client.completions.create(model=NAME, prompt=[5, 100000])
    assert "outside the model's vocabulary" in e.value.body["message"]
    s = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
              b"Content-Length: %d\r\n\r\n{" % (KEY.encode(), 9 << 20))
    assert read_until(s, b"\r\n").startswith(b"HTTP/1.1 413")  # refused before the body is read
    s.close()
    assert raw(server.port, "GET", "/v1/nothing")[0] == 404 and raw(server.port, "GET", "/v1/completions")[0] == 405


def test_api_key(server):
    bad = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="sk-wrong", timeout=TIMEOUT,
                        max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert raw(server.port, "GET", "/v1/models", headers={"Authorization": ""})[0] == 401
    assert raw(server.port, "GET", "/health", headers={"Authorization": ""})[0] == 200


def open_stream(port: int, body: dict) -> socket.socket:
    """A streaming request on a raw socket, its headers read; the caller reads events or closes it."""
    data = json.dumps({**body, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return s


def read_until(s: socket.socket, marker: bytes) -> bytes:
    got = b""
    while marker not in got:
        more = s.recv(65536)
        assert more, f"connection closed before {marker!r}: {got[-200:]!r}"
        got += more
    return got


def test_a_long_prompt_joins_in_pieces_between_the_running_requests_tokens(loaded):
    """With a prefill chunk of 8, a request whose prompt is longer joins a running one: its prompt goes 8 ids
    a step, the running request getting a token from each of those steps; both replies equal `minigen
    generate` of their messages."""
    model, tok = loaded
    s = Running(loaded, api_key=KEY, batch=Gated(model, prefill_chunk=8))
    try:
        batch, replies = s.app.scheduler.batch, {}
        long = [{"role": "user", "content": "Tell me about the river and the fields and the hill and the church " * 3}]
        n_long = len(tok.encode(tok.apply_chat_template(long), add_special_tokens=False))
        post = lambda key, body: threading.Thread(target=lambda: replies.update(
            {key: raw(s.port, "POST", "/v1/chat/completions", json.dumps({**body, "temperature": 0}))})).start()
        post("a", {"messages": MESSAGES, "max_tokens": 30})
        wait_for(lambda: s.health()["running"] == 1, "the first request to run")
        batch.allow(2)
        wait_for(lambda: len(batch.steps) == 2, "its prompt and a token")
        post("b", {"messages": long, "max_tokens": 5})
        wait_for(lambda: s.health()["running"] == 2, "the second request to join")
        batch.allow(10_000)
        wait_for(lambda: len(replies) == 2, "both replies")
        a, b = sorted(set().union(*batch.steps))
        joined = next(i for i, got in enumerate(batch.steps) if b in got)   # the step of b's first token
        pieces = -(-n_long // 8)
        assert n_long > 24 and all(a in got for got in batch.steps[:joined + 1])
        assert [b in got for got in batch.steps[joined + 1 - pieces:joined + 1]] == [False] * (pieces - 1) + [True]
        for key, messages, n in [("a", MESSAGES, 30), ("b", long, 5)]:
            status, data, _ = replies[key]
            want = generate_cli("--chat", *(("--system", messages[0]["content"]) if len(messages) > 1 else ()),
                                messages[-1]["content"], "--temp", "0", "-m", n)
            assert status == 200 and json.loads(data)["choices"][0]["message"]["content"] == want, key
    finally:
        batch.allow(10_000)
        s.close()


def test_queue_full_is_429_and_a_client_leaving_frees_its_slot(gated):
    batch, port = gated.app.scheduler.batch, gated.port
    a = open_stream(port, {"messages": MESSAGES, "max_tokens": 200, "temperature": 0})
    wait_for(lambda: gated.health()["running"] == 1, "the first request to run")
    waiting = {}
    b = threading.Thread(target=lambda: waiting.update(r=raw(port, "POST", "/v1/chat/completions",
                         json.dumps({"messages": MESSAGES, "max_tokens": 3, "temperature": 0}))))
    b.start()
    wait_for(lambda: gated.health()["waiting"] == 1, "the second request to wait")
    status, data, headers = raw(port, "POST", "/v1/chat/completions", json.dumps({"messages": MESSAGES}))
    assert status == 429 and headers["Retry-After"] == "1" and json.loads(data)["error"]["type"] == "rate_limit_error"
    batch.allow(1)
    read_until(a, b'"content": "')  # the role chunk, then a first piece of text
    a.close()                        # mid-stream: 199 tokens to go, and no step allowed
    wait_for(lambda: gated.health()["running"] == 1 and gated.health()["waiting"] == 0, "the slot to be freed")
    batch.allow(10)
    b.join(TIMEOUT)
    assert waiting["r"][0] == 200
    assert any(line.startswith("POST /v1/chat/completions 499") for line in gated.lines)


def poisoned(tmp_path: Path, token: int) -> Path:
    """The fixture with one token's embedding row infinite (and the output projection untied, so that only
    a prompt holding that token meets it): such a prompt's logits are not finite, every other's are the
    fixture's own."""
    from safetensors.numpy import load_file, save_file
    out = tmp_path / "poisoned"
    out.mkdir()
    for f in FIXTURE.iterdir():
        if f.suffix != ".npz" and f.name != "model.safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    tensors = load_file(FIXTURE / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    tensors["model.embed_tokens.weight"][token] = np.inf
    save_file(tensors, out / "model.safetensors")
    config = json.loads((FIXTURE / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    return out


@pytest.mark.filterwarnings("ignore:invalid value encountered")   # the poisoned row, in the server's thread
def test_one_request_failing_leaves_the_others(loaded, tmp_path):
    """On the server's own batch: a request whose logits turn non-finite ends alone, with a 500 naming why,
    while another request in the same batch steps goes on to the text `minigen generate` gives it."""
    _, tok = loaded
    bad, good = tok.encode("bad request"), tok.encode("good request")
    token = next(t for t in bad if t not in good)
    model, tok = minigen.load(poisoned(tmp_path, token))
    s = Running((model, tok), batch=Gated(model))
    try:
        result = {}
        t = threading.Thread(target=lambda: result.update(r=s.client.completions.create(
            model=NAME, prompt="good request", max_tokens=30, temperature=0)))
        t.start()
        wait_for(lambda: s.health()["running"] == 1, "the good request to join")
        s.app.scheduler.batch.allow(3)   # the good one's prefill and two steps, alone
        with pytest.raises(openai.InternalServerError) as e:
            threading.Timer(0.3, lambda: s.app.scheduler.batch.allow(10_000)).start()   # the bad one joins first
            s.client.completions.create(model=NAME, prompt=bad, max_tokens=30)
        assert "logits are not finite" in e.value.body["message"]
        t.join(TIMEOUT)
        assert result["r"].choices[0].text == generate_cli("good request", "--temp", 0, "-m", 30)
        assert s.health() == {"status": "ok", "running": 0, "waiting": 0}
    finally:
        s.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_server_with_exit_0(sig):
    proc = subprocess.Popen([sys.executable, "-m", "minigen", "serve", "--model", str(FIXTURE), "--port", "0"],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stderr.readline()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)[1])
        s = open_stream(port, {"messages": MESSAGES, "max_tokens": 250, "temperature": 0})
        read_until(s, b"data: ")
        proc.send_signal(sig)
        assert proc.wait(timeout=TIMEOUT) == 0
        rest = b""
        while more := s.recv(65536):  # the stream ends (finished, or cancelled by the shutdown), the socket closes
            rest += more
        s.close()
        assert "stopping" in proc.stderr.read()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2)
    finally:
        proc.kill()
        proc.wait()


def test_load_test_short():
    """CI's short load test: concurrent streams, hang-ups and bad requests; every reply equal to it alone."""
    script = Path(__file__).parent.parent / "scripts" / "load_test.py"
    done = subprocess.run([sys.executable, str(script), "--short", "--model", str(FIXTURE)], capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\d+ completed responses checked against the same request alone: all equal", done.stdout)


def test_prefix_cache_longest_match_budget_and_lru(loaded):
    from minigen.engine.cache import copy
    from minigen.serve.prefix import PrefixCache, nbytes

    model, _ = loaded
    rng = np.random.default_rng(0)
    seqs = [list(rng.integers(0, 512, 40)) for _ in range(3)]

    def cached(ids):
        cache = model.make_cache(64)
        model.forward(np.array(ids), cache)
        return cache

    one = nbytes(copy(cached(seqs[0][:30]), 30, 30))  # an entry of 30 tokens, stored compact
    prefix = PrefixCache(model.config, 2 * one + 1)   # room for two entries of 30 tokens
    for ids in seqs:
        prefix.store(ids[:30], cached(ids[:30]))
    assert [len(k) for k in prefix.entries] == [30, 30] and prefix.bytes <= prefix.budget  # the oldest went
    assert prefix.lookup(seqs[0][:20] + [1, 2], 64) == (None, 0)                          # evicted
    query = seqs[2][:25] + [7, 7, 7]
    cache, n = prefix.lookup(query, 64)
    assert n == 25 and cache[0].offset == 25
    fresh = model.forward(np.array(query[25:]), cache)              # the rest, on the copied prefix
    assert np.allclose(fresh, model.logits(query)[25:], atol=1e-5)
    roomy = PrefixCache(model.config, 1 << 30)
    for ids in (seqs[0][:30], seqs[1][:30], seqs[1][:36]):         # a longer entry replaces its own start
        roomy.store(ids, cached(ids))
    assert list(roomy.entries) == [tuple(seqs[0][:30]), tuple(seqs[1][:36])]

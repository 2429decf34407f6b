"""The routes, on the standard library's ThreadingHTTPServer: parse, call, reply.

The standard library, as mlx_lm.server does, and no ASGI stack: the model is the bottleneck (one
scheduler thread does all the computing), a thread per connection is plenty for the handful of
clients a CPU engine serves, and server-sent events are plain chunked HTTP/1.1 writes. A client
that goes away is seen at the next write (streaming) or within POLL seconds (waiting), and its
sequence leaves the batch.

    GET  /health                 {"status": "ok", "running": n, "waiting": n} (no API key needed)
    GET  /v1/models              the one model
    POST /v1/chat/completions    messages through the chat template
    POST /v1/completions         a prompt string or token ids
"""
from __future__ import annotations

import hmac
import json
import select
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from ..files import MiB
from . import api
from .output import ClientGone, JobFailed, Locked, Output
from .prefix import PrefixCache
from ..generation import constraint
from ..generation.batch import Batch
from ..generation.sequence import eos_token_ids
from .scheduler import ForkGate, Job, QueueFull, Scheduler, Stopping
from .tools import Calls

MAX_BODY = 8 * MiB        # bytes of request body (a prompt of a long context as ids is well under 1 MiB)
IO_TIMEOUT = 60.0         # seconds a client may take to send its request or read a write
RETRY_AFTER = 1           # seconds, in a 429's Retry-After


@dataclass
class App:
    model: object
    tokenizer: object            # output.Locked: one call at a time
    name: str                    # the model's id in requests and /v1/models
    scheduler: Scheduler
    api_key: str | None = None
    log: Callable[[str], None] = lambda line: None
    created: int = 0

    @property
    def context(self) -> int:
        return self.model.config.max_position_embeddings


def build(model, tokenizer, name: str, max_batch: int = 8, max_queue: int = 32, prefix_bytes: int = 512 * MiB,
          api_key: str | None = None, log: Callable[[str], None] = lambda line: None, batch=None,
          prefill_chunk: int | None = None) -> App:
    """The App of one model, its scheduler started: `batch` defaults to a new Batch of the model, computing
    at most `prefill_chunk` prompt ids a step (None: prompts whole)."""
    gate = ForkGate()
    tokenizer = Locked(tokenizer, gate)
    prefix = PrefixCache(model.config, prefix_bytes) if prefix_bytes else None
    scheduler = Scheduler(Batch(model, prefill_chunk) if batch is None else batch, max_batch, max_queue, prefix, gate)
    scheduler.start()
    threading.Thread(target=constraint.warm, args=(tokenizer.inner, model.config.vocab_size, eos_token_ids(model)),
                     name="minigen-llguidance", daemon=True).start()
    return App(model, tokenizer, name, scheduler, api_key, log, int(time.time()))


class Server(ThreadingHTTPServer):
    daemon_threads = True        # an idle keep-alive connection does not hold up the exit
    allow_reuse_address = True
    request_queue_size = 128     # the listen backlog: 16 clients connecting at once overflowed the default 5

    def __init__(self, address, app: App):
        self.app = app
        super().__init__(address, Handler)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = IO_TIMEOUT
    server_version = "minigen"

    # --- routing ------------------------------------------------------------------------------------

    def do_GET(self):
        self._route({"/health": self.health, "/v1/models": self.models}, "GET")

    def do_POST(self):
        self._route({"/v1/chat/completions": lambda: self.generate("chat"),
                     "/v1/completions": lambda: self.generate("completion")}, "POST")

    def _route(self, routes: dict, method: str):
        self.started, self.figures, self.body_read = time.monotonic(), "", method != "POST"
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        self.status = 200
        try:
            if path not in routes:
                known = {"/health", "/v1/models", "/v1/chat/completions", "/v1/completions"}
                raise api.ApiError(405 if path in known else 404, f"{method} {path}: no such route"
                                   if path not in known else f"{path} does not take {method}")
            if path != "/health":
                self._authorize()
            routes[path]()
        except api.ApiError as e:
            self._error(e)
        except ClientGone:
            self.status, self.close_connection = 499, True
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            self.status, self.close_connection = 499, True
        except Exception as e:  # noqa: BLE001 (one request's bug never takes the server down)
            self._error(api.ApiError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error"))
        self.app.log(f"{method} {self.path} {self.status}{self.figures} {time.monotonic() - self.started:.2f}s")

    @property
    def app(self) -> App:
        return self.server.app

    def _authorize(self):
        key = self.app.api_key
        if key is None:
            return
        given = self.headers.get("Authorization", "")
        token = given[7:] if given.startswith("Bearer ") else ""
        if not hmac.compare_digest(token.encode("utf-8", "surrogateescape"), key.encode("utf-8")):
            raise api.ApiError(401, "invalid or missing API key (Authorization: Bearer KEY)", code="invalid_api_key")

    # --- routes -------------------------------------------------------------------------------------

    def health(self):
        self._json(200, {"status": "ok", **self.app.scheduler.load()})

    def models(self):
        self._json(200, {"object": "list", "data": [{"id": self.app.name, "object": "model",
                                                     "created": self.app.created, "owned_by": "minigen"}]})

    def generate(self, kind: str):
        a = self.app
        req = api.parse(kind, self._body(), a.name, a.tokenizer, a.model)
        job = Job(req.ids, req.options)
        try:
            a.scheduler.submit(job)
        except QueueFull:
            raise api.ApiError(429, "the server is busy: every batch slot and queue place is taken; retry",
                               code="rate_limit_exceeded", kind="rate_limit_error",
                               headers={"Retry-After": str(RETRY_AFTER)}) from None
        except Stopping:
            raise api.ApiError(503, "the server is shutting down", kind="server_error") from None
        out = Output(req, job, a.tokenizer, self._client_gone)
        try:
            if req.stream:
                self._stream(req, out)
            else:
                self._whole(req, out)
        finally:
            job.cancel()
            self._note(req, job, out)

    def _whole(self, req: api.Request, out: Output):
        text, entries = [], [] if req.logprobs is not None else None
        try:
            for piece, got in out.pieces():
                text.append(piece)
                if entries is not None:
                    entries += got
        except JobFailed as e:
            raise api.ApiError(e.status, str(e), kind="server_error") from None
        text, called = "".join(text), None
        if req.syntax is not None:   # the calls out of the text; what is left is the content
            calls = Calls(req.syntax)
            text = "".join(e[1] for e in calls.add(text) + calls.end() if e[0] == "text")
            called = [tuple(c) for c in calls.calls]
        self._json(200, api.reply(req, text, out.finish, entries,
                                  api.usage(len(req.ids), out.tokens, out.job.cached_tokens), called))

    def _stream(self, req: api.Request, out: Output):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if req.kind == "chat":
            self._event(api.chunk(req, None, role=True))
        calls = Calls(req.syntax) if req.syntax is not None else None
        held = [] if req.logprobs is not None else None   # log-prob entries of text the calls parser holds back
        try:
            for piece, entries in out.pieces():
                if calls is None:
                    self._event(api.chunk(req, piece, entries))
                    continue
                held = self._tool_events(req, calls.add(piece), None if held is None else held + entries)
            if calls is not None:
                held = self._tool_events(req, calls.end(), held)
            self._event(api.chunk(req, None if req.kind == "chat" else "", held or None, finish=out.finish,
                                  called=bool(calls and calls.calls)))
            if req.include_usage:
                self._event(api.usage_chunk(req, api.usage(len(req.ids), out.tokens, out.job.cached_tokens)))
        except JobFailed as e:  # the headers are gone: the error is an event, as vLLM sends it
            self._event(api.ApiError(e.status, str(e), kind="server_error").body())
        self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")

    def _tool_events(self, req: api.Request, events: list, held: list | None) -> list | None:
        """tools.Calls events as chunks: content, or a tool call's deltas; the log-prob entries held go with
        the first chunk. Returns what is still held."""
        for event in events:
            call = api.tool_delta(event) if event[0] != "text" else None
            self._event(api.chunk(req, event[1] if call is None else None, held, call=call))
            held = None if held is None else []
        return held

    # --- the wire ------------------------------------------------------------------------------------

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise api.ApiError(411, "send the body with a Content-Length (chunked uploads are not supported)")
        length = self.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            raise api.ApiError(411 if length is None else 400, "the request needs a Content-Length")
        if int(length) > MAX_BODY:
            raise api.ApiError(413, f"the request body is {int(length):,} bytes, more than the server reads "
                                    f"({MAX_BODY:,})")
        body = self.rfile.read(int(length))
        self.body_read = True
        return body

    def _client_gone(self) -> bool:
        """Whether the peer has closed the connection (readable, with nothing to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _json(self, status: int, obj: dict, headers: dict | None = None):
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
        self.status = status
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, e: api.ApiError):
        if not self.body_read:  # what the client is still sending cannot be taken for the next request
            self.close_connection = True
        try:
            self._json(e.status, e.body(), e.headers)
        except OSError:
            self.status, self.close_connection = 499, True

    def _event(self, obj: dict):
        self._write_chunk(b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n")

    def _write_chunk(self, data: bytes):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _note(self, req: api.Request, job: Job, out: Output):
        ttft = f"{out.first_token - job.submitted:.3f}s" if out.first_token else "-"
        rate = (out.tokens - 1) / (time.monotonic() - out.first_token) if out.first_token and out.tokens > 1 else 0
        self.figures = (f" prompt={len(req.ids)} cached={job.cached_tokens} completion={out.tokens} "
                        f"ttft={ttft} {rate:.1f} tok/s")

    def log_message(self, format, *args):  # noqa: A002 (the base class's name): one line per request, ours
        pass

"""`minigen attention PROMPT --serve`: the page over HTTP on 127.0.0.1, and the exact weights of any rows of
any kept head, recomputed from the prompt's queries and keys (scan.Kept) as the forward pass computed them
(engine.attention.causal_weights), so that nothing is lost by the compact page.

    GET /          the page; served, it asks for the exact rows it shows (the pinned row, the window)
    GET /weights?layer=L&head=H&q0=A&q1=B[&k0=C&k1=D]
                   {"layer", "head", "q0", "q1", "k0", "k1", "dtype": "float32", "weights"}: base64 of the
                   little-endian float32 weights (B - A, D - C) of queries A..B-1 on keys C..D-1 (default:
                   0..B-1; zeros past each row's own position), at most MAX_CELLS of them
    GET /health    {"status": "ok", "tokens": T, "layers": [...], "heads": [...]}

A bad request gets 400 and {"error": ...} naming the field at fault; an unknown path 404. The routes are
`answer`, a function of the request, which the standard library's ThreadingHTTPServer calls (`serve`).
"""
from __future__ import annotations

import base64
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import parse_qs, urlsplit

import numpy as np

MAX_CELLS = 1 << 22   # weights in one answer: 16 MB of float32, ~21 MB of base64


@dataclass
class App:
    page: bytes                   # the page's HTML
    kept: object                  # scan.Kept: each kept layer's q and k
    layers: list[int]
    heads: list[int]
    T: int
    log: Callable[[str], None] = lambda line: None


class BadRequest(ValueError):
    pass


def answer(app: App, target: str) -> tuple[int, str, bytes]:
    """(status, content type, body) for a GET of `target` (path and query)."""
    url = urlsplit(target)
    try:
        if url.path in ("/", "/index.html"):
            return 200, "text/html; charset=utf-8", app.page
        if url.path == "/health":
            return _json(200, {"status": "ok", "tokens": app.T, "layers": app.layers, "heads": app.heads})
        if url.path == "/weights":
            return _json(200, weights(app, parse_qs(url.query)))
    except BadRequest as e:
        return _json(400, {"error": str(e)})
    return _json(404, {"error": f"no such route: {url.path} (try /, /weights, /health)"})


def weights(app: App, query: dict) -> dict:
    layer, head = _int(query, "layer"), _int(query, "head")
    if layer not in app.layers:
        raise BadRequest(f"layer {layer}: not one of the page's layers ({app.layers[0]}-{app.layers[-1]}, "
                         f"those with attention)")
    if head not in app.heads:
        raise BadRequest(f"head {head}: not one of the page's heads ({', '.join(map(str, app.heads))})")
    q0, q1 = _int(query, "q0"), _int(query, "q1")
    k0, k1 = _int(query, "k0", 0), _int(query, "k1", q1)
    if not 0 <= q0 < q1 <= app.T:
        raise BadRequest(f"q0 {q0}, q1 {q1}: need 0 <= q0 < q1 <= {app.T} (queries q0..q1-1)")
    if not 0 <= k0 < k1 <= q1:
        raise BadRequest(f"k0 {k0}, k1 {k1}: need 0 <= k0 < k1 <= q1 = {q1} (keys k0..k1-1; none past the last query)")
    if (q1 - q0) * (k1 - k0) > MAX_CELLS:
        raise BadRequest(f"{q1 - q0} x {k1 - k0} weights: at most {MAX_CELLS} in one answer; ask for fewer rows")
    w = app.kept.weights(layer, head, q0, q1)[:, k0:k1]                    # (q1 - q0, k1 - k0)
    return {"layer": layer, "head": head, "q0": q0, "q1": q1, "k0": k0, "k1": k1, "dtype": "float32",
            "weights": base64.b64encode(np.ascontiguousarray(w, "<f4").tobytes()).decode("ascii")}


def _int(query: dict, name: str, default: int | None = None) -> int:
    values = query.get(name)
    if not values:
        if default is None:
            raise BadRequest(f"{name}: missing (e.g. /weights?layer=0&head=0&q0=0&q1=1)")
        return default
    try:
        return int(values[-1])
    except ValueError:
        raise BadRequest(f"{name} {values[-1]!r}: not an integer") from None


def _json(status: int, body: dict) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(body).encode()


class Handler(BaseHTTPRequestHandler):
    server_version = "minigen-attention"
    app: App

    def do_GET(self):
        status, kind, body = answer(self.app, self.path)
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):   # the browser went away
            pass

    def log_message(self, fmt, *args):
        self.app.log(f"{self.address_string()} {fmt % args}")


def serve(app: App, port: int = 0) -> ThreadingHTTPServer:
    """A server for `app` on 127.0.0.1:port (0: a free one; server.server_address says which), answering
    on a thread of its own until `shutdown()`."""
    handler = type("AppHandler", (Handler,), {"app": app})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    return server

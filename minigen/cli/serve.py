"""`minigen serve`: the OpenAI-compatible server (minigen/serve/) on one loaded model.

SIGTERM and SIGINT stop it: no new connection or request is taken, running requests get up to
GRACE seconds to finish and are cancelled after that, and the process exits 0.
"""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import click

from ..errors import MinigenError
from ..files import MiB
from .harness import Command, load_timed, model_option, until_signal

GRACE = 3.0   # seconds running requests may take to finish after SIGTERM/SIGINT
PREFILL_CHUNK = 256   # prompt tokens a step computes


def model_id(model_path: str | None, resolved) -> str:
    """The model's name in requests and /v1/models: a hub id as given, else the file or directory's name."""
    if resolved.kind.startswith("hub"):
        return model_path
    return Path(model_path).name if model_path else resolved.path.name


def positive(ctx, param, value):
    if value is not None and value < 1:
        raise click.BadParameter(f"should be >= 1, got {value}")
    return value


@click.command(cls=Command)
@model_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; only with --api-key on a shared network).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port to listen on (0: a free one, printed at start).")
@click.option("--api-key", envvar="MINIGEN_API_KEY", metavar="KEY",
              help="Require 'Authorization: Bearer KEY' (also from $MINIGEN_API_KEY).")
@click.option("--max-batch", type=int, default=8, show_default=True, callback=positive,
              help="Sequences generated at once; more requests wait in the queue.")
@click.option("--max-queue", type=int, default=32, show_default=True, callback=positive,
              help="Requests waiting for a batch slot; beyond them a request gets 429 (retry).")
@click.option("--prefix-cache-mb", type=click.IntRange(0), default=512, show_default=True,
              help="Memory for KV caches of prompts seen before (0: off).")
@click.option("--prefill-chunk", type=click.IntRange(0), default=PREFILL_CHUNK, show_default=True,
              help="While requests are generating, the prompt tokens a step computes for those joining: a longer "
                   "prompt goes in pieces, the running requests getting a token between them (0: prompts whole).")
@click.option("-q", "--quiet", is_flag=True, help="No line per request on stderr.")
def serve(model_path, host, port, api_key, max_batch, max_queue, prefix_cache_mb, prefill_chunk, quiet):
    """Serve the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models, /health) over HTTP.

    Concurrent requests share the model's steps (continuous batching): a request joins the running
    batch at the next step and leaves it when it ends. One line per request on stderr.
    """
    from ..serve.http import Server, build   # numpy, tokenizers: loaded when the command runs
    loaded = load_timed(model_path, renders=True)
    model, tokenizer, load_seconds = loaded.model, loaded.tokenizer, loaded.seconds
    name = model_id(model_path, loaded.resolved)
    log = (lambda line: None) if quiet else (lambda line: click.echo(line, err=True))
    app = build(model, tokenizer, name, max_batch, max_queue, prefix_cache_mb * MiB, api_key, log,
                prefill_chunk=prefill_chunk or None)
    scheduler = app.scheduler
    try:
        server = Server((host, port), app)
    except OSError as e:
        scheduler.stop(0)
        raise MinigenError(f"cannot listen on {host}:{port} ({e.strerror or e})")
    with until_signal() as wait:
        listener = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        listener.start()
        host_shown, port_shown = server.server_address[:2]
        click.echo(f"minigen serve: {name} ({model.config.model_type}, loaded in {load_seconds:.1f} s) on "
                   f"http://{host_shown}:{port_shown}/v1 (max batch {max_batch}, queue {max_queue})", err=True)
        try:
            wait()
        finally:
            click.echo("minigen serve: stopping", err=True)
            server.shutdown()          # no new connections
            scheduler.stop(GRACE)      # no new requests; the running ones finish or are cancelled
            server.server_close()
            time.sleep(0.2)            # handler threads send their last events
    sys.exit(0)

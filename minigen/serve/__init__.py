"""`minigen serve`: an OpenAI-compatible HTTP server over one loaded model, batching concurrent requests.

    api.py        a request's JSON -> a Request (ids and run Options, the one place fields map to options);
                  replies and stream chunks shaped as the OpenAI API shapes them
    scheduler.py  one thread that owns the model: a bounded queue, continuous batching over a step
                  (`add` / `step` / `cancel`), the prefix cache of KV caches
    prefix.py     KV caches of token-id prefixes seen before, within a memory budget
    http.py       the routes on the standard library's ThreadingHTTPServer: parse, call, reply
    tools.py      tool calls: each template family's call syntax, the grammar of tool_choice, the reply parsed

May import: generation, engine, text, errors, files. Nothing here prints: the CLI gives a `log` callback.
"""

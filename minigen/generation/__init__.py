"""Logits -> tokens -> text: sampling, the step loop and its options (validated once), chat sessions.

    options.py   the options of a run, one table (flags, checks, defaults, summary), and the prompt checks
    sampling.py  logits -> next token: pure functions (log_softmax is inspect's too)
    steps.py     generate_step (the loop on ids), Run (text, stop strings, figures), generate, stream
    chat.py      ChatSession: a conversation and the KV cache kept between turns
    constraint.py  a JSON schema, regex or grammar as a logits processor (llguidance's masks), per sequence

May import: engine, text, errors, files.
"""

"""Logits -> tokens -> text: sampling, the step loops and their options (validated once), chat sessions,
batches, speculative decoding, scores.

    options.py      the options of a run, one table (flags, checks, defaults, summary), and the prompt checks
    sampling.py     logits -> next token: pure functions (log_softmax is inspect's too)
    sequence.py     one sequence being generated, its rules for every loop, and the Step each token gives
    steps.py        generate_step (plain decoding), Run (text, stop strings, figures), generate, stream
    speculative.py  drafters (prompt lookup, a draft model), verification, speculative decoding
    batch.py        Batch: several sequences, one forward a step; batch_runs, generate_batch
    chat.py         ChatSession: a conversation and the KV cache kept between turns
    scores.py       log-probs of a text, perplexity, KL
    constraint.py   a JSON schema, regex or grammar as a logits processor (llguidance's masks), per sequence
    ids.py          prompt ids checked; the common prefix of two id sequences

May import: engine, text, errors, files.
"""

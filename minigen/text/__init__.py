"""Text <-> ids: the tokenizer and its guards, the streaming detokenizer, and the chat template rendered
in a sandboxed child process.

May import: errors, files; `tokenizers` and `jinja2`.
"""

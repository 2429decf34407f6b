"""Logits -> tokens -> text: sampling, the step loop and its options (validated once), chat sessions.

May import: engine, text, errors, files.
"""

"""The inspection commands' arguments: layers, heads and tokens, read and checked against the model (or a
dump) in one place, each error naming its flag. Every inspection command resolves its arguments here.

    selection("0,5-7", n, "layer", "--attn-layers")   -> [0, 5, 6, 7]; None or "all": every one
    head_items("18.6,17.*", cfg, "--heads")           -> [(18, 6), (17, 0), (17, 1), ...]
    expert_items("3.5,0.*", cfg, "--expert")          -> [(3, 5), (0, 0), (0, 1), ...]: routed experts
    index(-1, n, "layer", "--heads")                  -> n - 1: negative indices count from the end
    layer_head(cfg, layer, head)                      the --layer/--head pair of one head
    query_window("4000-4095", T)                      -> (4000, 4096): one window of query rows (--attn-queries)
    position(tokens, "-1" | "cat", "--token")         -> a position in the prompt
    vocab_token(tok, " Paris" | "#42", "--target", V) -> a token id
"""
from __future__ import annotations

import re

from ..engine.mixers import has_attention
from ..errors import MinigenError, ranges


def index(i: int, n: int, what: str, flag: str) -> int:
    """i in 0..n-1, a negative i counting from the end."""
    j = i + n if i < 0 else i
    if not 0 <= j < n:
        raise MinigenError(f"{flag}: {what} {i} out of range (the model has {n}: 0-{n - 1})")
    return j


def selection(text: str | None, n: int, what: str, flag: str) -> list[int]:
    """'0,5-7' -> [0, 5, 6, 7]; None or 'all' -> everything. Negative indices count from the end."""
    if text is None or text.strip() in ("", "all"):
        return list(range(n))
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*)?", part)
        if not m:
            raise MinigenError(f"{flag} {text!r}: expected numbers and ranges like 0,5-7")
        lo = int(m[1])
        if m[2] is not None and int(m[2]) < lo:
            raise MinigenError(f"{flag} {text!r}: the range {part.strip()} is empty (write it low-high)")
        for i in [lo] if m[2] is None else range(lo, int(m[2]) + 1):
            j = index(i, n, what, flag)
            if j not in out:
                out.append(j)
    return sorted(out)


def query_window(text: str, T: int) -> tuple[int, int]:
    """--attn-queries A-B (or one query A): rows A..B of T, as (A, B + 1)."""
    try:
        picked = selection(text, T, "query", "--attn-queries")
    except MinigenError as e:
        if "out of range" not in str(e):
            raise
        raise MinigenError(f"--attn-queries {text!r}: out of range (there are {T} query rows: 0-{T - 1})") from None
    a, b = picked[0], picked[-1] + 1
    if picked != list(range(a, b)):
        raise MinigenError(f"--attn-queries {text!r}: one window of queries, like 4000-4095")
    return a, b


def head_items(text: str, cfg, flag: str = "--heads") -> list[tuple[int, int]]:
    """'18.6,17.4' -> [(18, 6), (17, 4)]; 'L.*' is every head of layer L; negative layers count from the end."""
    return _layer_items(text, cfg.n_layers, cfg.n_heads, "head", "18.6,17.4", flag,
                        lambda layer: attention_layer(cfg, layer, flag))


def expert_items(text: str, cfg, flag: str = "--expert") -> list[tuple[int, int]]:
    """'3.5,0.1' -> [(3, 5), (0, 1)]: routed experts as head_items reads heads ('3.*': all of layer 3's)."""
    return _layer_items(text, cfg.n_layers, cfg.n_experts, "expert", "3.5,0.1", flag)


def _layer_items(text: str, n_layers: int, n: int, what: str, example: str, flag: str,
                 check=lambda layer: layer) -> list[tuple[int, int]]:
    """LAYER.ITEM pairs, each layer through `check` (which refuses a layer without such items)."""
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(-?\d+)\.(\*|\d+)\s*", part)
        if not m:
            raise MinigenError(f"{flag} {text!r}: expected LAYER.{what.upper()} items like {example} "
                               f"(or {example.split('.')[0]}.* for a whole layer)")
        layer = check(index(int(m[1]), n_layers, "layer", flag))
        items = range(n) if m[2] == "*" else [index(int(m[2]), n, what, flag)]
        out += [(layer, i) for i in items if (layer, i) not in out]
    return out


def layer_head(cfg, layer: int, head: int):
    """--layer and --head naming one head of the model."""
    if not 0 <= layer < cfg.n_layers:
        raise MinigenError(f"--layer {layer} out of range (the model has {cfg.n_layers} layers: 0-{cfg.n_layers - 1})")
    if not 0 <= head < cfg.n_heads:
        raise MinigenError(f"--head {head} out of range (the model has {cfg.n_heads} heads: 0-{cfg.n_heads - 1})")
    attention_layer(cfg, layer, "--layer")


def attention_layers(cfg) -> list[int]:
    """The layers that have attention (all, but in hybrids: Qwen3.5, LFM2, Granite 4.0-H)."""
    return [i for i in range(cfg.n_layers) if has_attention(cfg, i)]


def attention_layer(cfg, layer: int, flag: str) -> int:
    """A layer that has heads; in hybrids a Gated DeltaNet, short conv or Mamba2 layer has none (its
    whole output is the component "attn" of that layer)."""
    if not has_attention(cfg, layer):
        raise MinigenError(f"{flag}: layer {layer} has no attention (its token mixer is {cfg.mixer(layer)}); "
                           f"the layers with attention are {ranges(attention_layers(cfg))}")
    return layer


def attention_selection(text: str | None, cfg, flag: str = "--attn-layers") -> list[int]:
    """`selection` over the model's own layer indices, restricted to the layers with attention: by
    default all of them; a layer without attention named explicitly is refused, saying what it is."""
    if text is None or text.strip() in ("", "all"):
        return attention_layers(cfg)
    return [attention_layer(cfg, i, flag) for i in selection(text, cfg.n_layers, "layer", flag)]


def position(tokens: list[str], spec: str | int | None, flag: str = "--token") -> int:
    """A position in the prompt: an index (negative counts from the end), or text naming a token: the last
    token that reads TEXT, spaces around it aside ("Mr" finds a final " Mr"). Default: the last token."""
    T = len(tokens)
    if spec is None:
        return T - 1
    s = str(spec)
    try:
        i = int(s)
    except ValueError:
        matches = [j for j, t in enumerate(tokens) if t == s or t.strip() == s.strip()]
        if not matches:
            raise MinigenError(f"{flag} {s!r}: no token of the prompt reads {s!r} (tokens: "
                               + " ".join(repr(t) for t in tokens[:12]) + (" ..." if T > 12 else "") + ")")
        return matches[-1]
    if not -T <= i < T:
        raise MinigenError(f"{flag} {i}: past the prompt, which has {T} tokens (0-{T - 1})")
    return i % T


def vocab_token(tok, spec: str, flag: str, vocab_size: int) -> int:
    """A token of the vocabulary for --answer, --target and the like: its text, which must encode to
    exactly one token (" Mary" with its space), or #ID."""
    if spec.startswith("#") and spec[1:].isdigit():
        i = int(spec[1:])
        if i >= vocab_size:
            raise MinigenError(f"{flag} {spec}: outside the vocabulary (0-{vocab_size - 1})")
        return i
    ids = tok.encode(spec, add_special_tokens=False)
    if len(ids) != 1:
        pieces = " ".join(repr(t) for t in tok.token_strings(ids)) if ids else "nothing"
        raise MinigenError(f"{flag} {spec!r}: that text is {len(ids)} tokens ({pieces}), not one; give one "
                           f"token's text (mind the leading space, e.g. ' Paris') or #ID")
    return ids[0]

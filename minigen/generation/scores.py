"""Scores of a text under a model: per-token log-probs, an answer's log-prob, perplexity, KL divergence.

Nothing here prints: progress goes through the `on_window` callback.

A window of ids is run through the model a chunk of rows at a time with one KV cache, so at most
(CHUNK, V) logits exist at once whatever the window's length (V = 262,144 for Gemma 3: 128 MiB at
CHUNK 128); rows nobody scores (llama-perplexity's first half) go through with `last_only`, skipping
the unembedding. Row p of a window is log p(ids[p + 1] | ids[:p + 1]).

Perplexity's two methods:
- "llama" (llama.cpp's llama-perplexity): the text tokenized once, cut into len // n_ctx chunks of
  n_ctx tokens (the tail left out), each run alone; when the tokenizer adds a BOS, each chunk's first
  token is replaced by it. Positions n_ctx/2 .. n_ctx-2 are scored, each predicting the next token.
- "stride" (the transformers perplexity guide): windows of up to n_ctx tokens starting every `stride`
  tokens; each scores only the tokens that no earlier window scored, with the rest as context, so every
  token but the first is scored exactly once. PPL = exp(total NLL / tokens scored). (The guide's loop
  weights each window's mean loss by its target count minus one; here each token counts once.)
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from ..errors import MinigenError
from .sequence import top_entries

CHUNK = 128


def log_softmax_rows(logits: np.ndarray) -> np.ndarray:
    """(n, V) -> (n, V) float32 log-probs; the sum in float64, as llama.cpp sums."""
    x = logits - logits.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True, dtype=np.float64)).astype(np.float32)


def window_logprobs(model, ids: Sequence[int], first: int = 0, chunk: int = CHUNK) -> Iterator[np.ndarray]:
    """Log-probs (n, V) of rows first .. len(ids)-2 of one window, a chunk at a time, in order. Every chunk
    is computed for the window's whole length (`length`: longrope's factors are those transformers gives a
    call over the whole window)."""
    ids = np.asarray(ids)
    cache, n = model.make_cache(len(ids)), len(ids)
    if first > 0:
        model.forward(ids[:first], cache, last_only=True, length=n)  # context only: no unembedding of its rows
    for start in range(first, len(ids) - 1, chunk):
        end = min(start + chunk, len(ids) - 1)
        yield log_softmax_rows(model.forward(ids[start:end], cache, length=n))   # (end - start, V)


# --- a text's tokens ---------------------------------------------------------------------------------

@dataclass
class TokenScore:
    id: int
    text: str
    logprob: float | None              # None for the first token: nothing before it predicts it
    rank: int | None = None            # 1 = the model's most likely token at that position
    top: list = field(default_factory=list)   # [(id, logprob), ...] the alternatives, best first


@dataclass
class Scored:
    tokens: list[TokenScore]

    @property
    def total(self) -> float:
        return float(sum(t.logprob for t in self.tokens if t.logprob is not None))

    @property
    def ids(self) -> list[int]:
        return [t.id for t in self.tokens]

    @property
    def logprobs(self) -> list[float | None]:
        return [t.logprob for t in self.tokens]


def score_ids(model, tokenizer, ids: Sequence[int], top_k: int = 0, start: int = 1) -> Scored:
    """Every token's log-prob given those before it (tokens from `start` on are scored, with their rank
    and top_k alternatives); the first `start` tokens are context (logprob None)."""
    ids = [int(i) for i in ids]
    check_length(model, len(ids))
    out = [TokenScore(i, tokenizer.decode([i]), None) for i in ids[:max(start, 1)]]
    pos = max(start, 1)
    for rows in window_logprobs(model, ids, first=pos - 1):
        for row in rows:
            i = ids[pos]
            out.append(TokenScore(i, tokenizer.decode([i]), float(row[i]), int((row > row[i]).sum()) + 1,
                                  top_entries(row, top_k) if top_k else []))
            pos += 1
    return Scored(out)


def score(model, tokenizer, text: str, top_k: int = 0) -> Scored:
    """A text's per-token log-probs: `minigen.score(model, tokenizer, text).logprobs` (the first token's is
    None; the tokenizer adds BOS where the checkpoint does, and then the first real token is scored)."""
    if not isinstance(text, str):
        raise MinigenError(f"score: the text should be a string, got {type(text).__name__}")
    ids = tokenizer.encode(text)
    if len(ids) < 2:
        raise MinigenError(f"score: the text is {len(ids)} token(s); at least 2 are needed (one to predict from)")
    return score_ids(model, tokenizer, ids, top_k)


def score_answer(model, tokenizer, prompt_ids: Sequence[int], answer: str, top_k: int = 5) -> dict:
    """An answer's log-prob after a prompt: total, per token (each with its rank and the top_k alternatives).
    The answer is encoded on its own, without special tokens, and appended to the prompt's ids."""
    answer_ids = tokenizer.encode(answer, add_special_tokens=False)
    if not answer_ids:
        raise MinigenError(f"--answer {answer!r}: encodes to no tokens")
    prompt_ids = list(prompt_ids)
    if not prompt_ids:
        raise MinigenError("the prompt is empty (no tokens to predict the answer from)")
    scored = score_ids(model, tokenizer, prompt_ids + answer_ids, top_k, start=len(prompt_ids))
    tokens = scored.tokens[len(prompt_ids):]
    return {"answer": answer, "ids": answer_ids, "logprob": float(sum(t.logprob for t in tokens)),
            "first_rank": tokens[0].rank, "tokens": tokens}


def added_bos(tokenizer) -> int | None:
    """The BOS id the tokenizer puts before a text, or None when it adds none (llama.cpp's add_bos)."""
    plain, added = tokenizer.encode("a", add_special_tokens=False), tokenizer.encode("a")
    return added[0] if len(added) > len(plain) and added[-len(plain):] == plain else None


def check_length(model, n: int):
    context = model.config.max_position_embeddings
    if n > context:
        raise MinigenError(f"the text is {n} tokens, longer than the model's context ({context} tokens); "
                           f"minigen perplexity scores a long text window by window")


# --- perplexity --------------------------------------------------------------------------------------

@dataclass
class Window:
    ids: np.ndarray     # (n,) the window's ids
    first: int          # rows first .. n-2 are scored (each predicting the next id)


def llama_windows(tokens: np.ndarray, n_ctx: int, bos: int | None = None) -> list[Window]:
    """llama-perplexity's chunks: len // n_ctx of n_ctx tokens, the first replaced by BOS when one is added."""
    out = []
    for i in range(len(tokens) // n_ctx):
        ids = tokens[i * n_ctx:(i + 1) * n_ctx].copy()
        if bos is not None:
            ids[0] = bos
        out.append(Window(ids, n_ctx // 2))
    return out


def stride_windows(tokens: np.ndarray, n_ctx: int, stride: int) -> list[Window]:
    """The transformers guide's windows: [begin, begin + n_ctx) every `stride`, scoring the tokens past
    the previous window's end."""
    out, prev_end = [], 0
    for begin in range(0, len(tokens), stride):
        end = min(begin + n_ctx, len(tokens))
        ids = tokens[begin:end]
        out.append(Window(ids, max(len(ids) - (end - prev_end) - 1, 0)))
        prev_end = end
        if end == len(tokens):
            break
    return out


def windows_for(tokens: np.ndarray, n_ctx: int, stride: int | None, bos: int | None,
                chunks: int | None = None) -> list[Window]:
    """The windows of either method (`chunks`: only the first ones, as llama-perplexity's --chunks)."""
    if n_ctx < 2:
        raise MinigenError(f"--ctx {n_ctx}: a window needs at least 2 tokens")
    if len(tokens) < n_ctx:
        raise MinigenError(f"the text is {len(tokens)} tokens, shorter than one window of {n_ctx} (--ctx); "
                           f"give a longer text or a smaller --ctx")
    if chunks is not None and chunks < 1:
        raise MinigenError(f"--chunks {chunks}: should be at least 1")
    if stride is None:
        return llama_windows(tokens, n_ctx, bos)[:chunks]
    if not 1 <= stride <= n_ctx:
        raise MinigenError(f"--stride {stride}: should be between 1 and --ctx ({n_ctx})")
    return stride_windows(tokens, n_ctx, stride)[:chunks]


@dataclass
class Progress:
    """What the callback sees after each window: the running estimate and its standard error."""
    window: int
    windows: int
    count: int          # tokens scored so far
    ppl: float
    se: float           # standard error of ppl (llama-perplexity's: ppl * sqrt(var(nll) / (count - 1)))


@dataclass
class Result:
    method: str
    n_ctx: int
    stride: int | None
    n_tokens: int
    windows: int
    nll: np.ndarray                    # (count,) float64, each scored token's negative log-prob
    kl: dict | None = None             # with a base: see kl_report

    @property
    def count(self) -> int:
        return len(self.nll)

    @property
    def ppl(self) -> float:
        return math.exp(self.nll.mean())

    @property
    def se(self) -> float:
        return ppl_error(self.nll.sum(), (self.nll ** 2).sum(), len(self.nll))


def ppl_error(s: float, s2: float, n: int) -> float:
    """llama-perplexity's uncertainty: PPL * sqrt((mean(nll^2) - mean(nll)^2) / (n - 1))."""
    mean, var = s / n, s2 / n - (s / n) ** 2
    return math.exp(mean) * math.sqrt(var / (n - 1)) if n > 1 and var > 0 else 0.0


def perplexity(model, tokens: Sequence[int], n_ctx: int, stride: int | None = None, bos: int | None = None,
               save: "LogitsWriter | None" = None, base: "BaseLogits | None" = None,
               on_window: Callable[[Progress], None] | None = None, chunks: int | None = None,
               chunk: int = CHUNK) -> Result:
    """Perplexity of `tokens` (the whole text, tokenized once) by llama-perplexity's method, or by the
    transformers guide's sliding windows with `stride`. `save` keeps each scored position's distribution
    for a later `base`, against which KL divergence and top-1 agreement are measured."""
    tokens = np.asarray(tokens, dtype=np.int64)
    check_length(model, n_ctx)
    windows = windows_for(tokens, n_ctx, stride, bos, chunks)
    fields = _header_fields(tokens, n_ctx, stride, bos, sum(len(w.ids) - 1 - w.first for w in windows),
                            model.config.vocab_size)
    if base is not None:
        base.check(fields)
    if save is not None:
        save.start(fields)
    nll, kld, same, s, s2, pos = [], [], 0, 0.0, 0.0, 0
    for n, w in enumerate(windows, 1):
        p = w.first
        for rows in window_logprobs(model, w.ids, w.first, chunk):
            targets = w.ids[p + 1:p + 1 + len(rows)]
            lp = rows[np.arange(len(rows)), targets].astype(np.float64)
            nll.append(-lp)
            s, s2 = s - lp.sum(), s2 + (lp ** 2).sum()
            if save is not None:
                save.write(rows, lp)
            if base is not None:
                k, agree = base.compare(rows, pos)
                kld.append(k)
                same += agree
            p, pos = p + len(rows), pos + len(rows)
        if on_window:
            on_window(Progress(n, len(windows), pos, math.exp(s / pos), ppl_error(s, s2, pos)))
    result = Result("llama" if stride is None else "stride", n_ctx, stride, len(tokens), len(windows),
                    np.concatenate(nll))
    if base is not None:
        result.kl = kl_report(result.nll, base.nll(), np.concatenate(kld), same)
    return result


# --- a base model's distributions, and KL divergence against them ------------------------------------
#
# The file keeps, per scored position, the base's top-k tokens with their log-probs, the log of the mass
# of all the others together, and the log-prob of the token that came (for the base's perplexity).
# KL(base || model) is then computed over those k + 1 outcomes. Why not every log-prob: at V = 49,152
# a float16 row is 96 KiB per token (llama.cpp's uint16 file is the same size), 1 GB for 10k tokens;
# top-32 is 264 bytes. Merging the tail into one outcome can only lower KL (the log-sum inequality),
# and the part it drops is bounded by the tail's mass; docs/scores.md measures the difference on the
# default model against the full computation.

MAGIC = b"minigen-logits\n"
TOP_K = 32


def _header_fields(tokens: np.ndarray, n_ctx: int, stride: int | None, bos: int | None, count: int, vocab: int):
    return {"tokens_sha256": hashlib.sha256(np.asarray(tokens, "<i8").tobytes()).hexdigest(),
            "n_tokens": int(len(tokens)), "ctx": n_ctx, "stride": stride, "bos": bos, "positions": count,
            "vocab": vocab}


def record_dtype(k: int) -> np.dtype:
    return np.dtype([("target", "<f4"), ("rest", "<f4"), ("ids", "<i4", (k,)), ("logprobs", "<f4", (k,))])


class LogitsWriter:
    """Writes a base model's distributions into an open binary file, position after position;
    `perplexity` starts it with what the run was (the text's hash, the windows)."""

    def __init__(self, f, model: str, k: int = TOP_K):
        self.f, self.model, self.k = f, model, k

    def start(self, fields: dict):
        self.k = min(self.k, fields["vocab"])
        header = {"format": "minigen-logits", "version": 1, "top_k": self.k, "model": self.model, **fields}
        raw = json.dumps(header).encode()
        self.f.write(MAGIC + len(raw).to_bytes(8, "little") + raw)
        self.dtype = record_dtype(self.k)

    def write(self, rows: np.ndarray, target_lp: np.ndarray):
        rec = np.zeros(len(rows), self.dtype)
        top = np.argpartition(-rows, self.k - 1, axis=1)[:, :self.k] if self.k < rows.shape[1] else \
            np.tile(np.arange(rows.shape[1]), (len(rows), 1))
        top_lp = np.take_along_axis(rows, top, axis=1)
        order = np.argsort(-top_lp, axis=1, kind="stable")
        rec["ids"] = np.take_along_axis(top, order, axis=1)
        rec["logprobs"] = np.take_along_axis(top_lp, order, axis=1)
        rec["rest"] = rest_logmass(rows, rec["ids"])
        rec["target"] = target_lp
        self.f.write(rec.tobytes())


def rest_logmass(rows: np.ndarray, top: np.ndarray) -> np.ndarray:
    """log of the probability outside the top ids, per row, summed directly (not 1 - sum, which cancels)."""
    p = np.exp(rows)
    np.put_along_axis(p, top, 0.0, axis=1)
    with np.errstate(divide="ignore"):
        return np.log(p.sum(axis=1, dtype=np.float64))


class BaseLogits:
    """A file written by LogitsWriter (perplexity --save-logits), read lazily (memory-mapped)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                head = f.read(len(MAGIC) + 8)
                if len(head) < len(MAGIC) + 8 or not head.startswith(MAGIC):
                    raise MinigenError(f"{self.path}: not a file written by minigen perplexity --save-logits")
                n = int.from_bytes(head[len(MAGIC):], "little")
                if n > 1 << 20:
                    raise MinigenError(f"{self.path}: damaged header (length {n})")
                self.header = json.loads(f.read(n))
        except OSError as e:
            raise MinigenError(f"{self.path}: {e.strerror or e}") from None
        except (ValueError, UnicodeDecodeError):
            raise MinigenError(f"{self.path}: damaged header (not JSON)") from None
        k, count = self.header.get("top_k"), self.header.get("positions")
        if not (isinstance(k, int) and isinstance(count, int) and k > 0 and count > 0):
            raise MinigenError(f"{self.path}: damaged header (top_k, positions)")
        dtype = record_dtype(k)
        offset = len(MAGIC) + 8 + n
        if self.path.stat().st_size != offset + count * dtype.itemsize:
            raise MinigenError(f"{self.path}: {self.path.stat().st_size} bytes, expected "
                               f"{offset + count * dtype.itemsize} for {count} positions (cut short or damaged)")
        self.records = np.memmap(self.path, dtype, "r", offset, (count,))

    def check(self, want: dict):
        """MinigenError unless this file was made on the same text, tokens and windows."""
        for key in ("ctx", "stride", "n_tokens", "tokens_sha256", "bos", "vocab", "positions"):
            if self.header.get(key) != want[key]:
                flag = {"ctx": "--ctx", "stride": "--stride"}.get(key)
                hint = (f" (give {flag} {self.header.get(key)})" if flag and self.header.get(key) is not None else
                        " (give the same --chunks)" if key == "positions" else "")
                raise MinigenError(f"--kl-base {self.path}: made with {key} {self.header.get(key)}, this run has "
                                   f"{want[key]}{hint}; the base must be scored on the same text and windows")

    def nll(self) -> np.ndarray:
        return -self.records["target"].astype(np.float64)

    def compare(self, rows: np.ndarray, pos: int) -> tuple[np.ndarray, int]:
        """KL(base || model) at the positions pos .. pos + len(rows) - 1, and how many share the top-1 token."""
        rec = self.records[pos:pos + len(rows)]
        p_lp = rec["logprobs"].astype(np.float64)                            # (n, k)
        q_lp = np.take_along_axis(rows, rec["ids"].astype(np.int64), axis=1).astype(np.float64)
        p_rest, q_rest = rec["rest"].astype(np.float64), rest_logmass(rows, rec["ids"].astype(np.int64))
        with np.errstate(invalid="ignore"):
            kl = np.where(np.isfinite(p_lp), np.exp(p_lp) * (p_lp - q_lp), 0.0).sum(axis=1)
            tail = np.where(np.isfinite(p_rest), np.exp(p_rest) * (p_rest - q_rest), 0.0)
        same = int((rows.argmax(axis=1) == rec["ids"][:, 0]).sum())
        return kl + tail, same


def kl_report(nll: np.ndarray, base_nll: np.ndarray, kld: np.ndarray, same: int) -> dict:
    """llama-perplexity --kl-divergence's figures: KL (mean, median, 99th percentile, max), top-1
    agreement, both perplexities and their difference."""
    n = len(kld)
    ppl, base = math.exp(nll.mean()), math.exp(base_nll.mean())
    top = same / n
    return {"positions": n, "kl_mean": float(kld.mean()), "kl_se": float(kld.std() / math.sqrt(n - 1)) if n > 1 else 0.0,
            "kl_median": float(np.median(kld)), "kl_p99": float(np.quantile(kld, 0.99)), "kl_max": float(kld.max()),
            "same_top": top, "same_top_se": math.sqrt(top * (1 - top) / (n - 1)) if n > 1 else 0.0,
            "ppl": ppl, "ppl_base": base, "ppl_diff": ppl - base, "ppl_ratio": ppl / base}

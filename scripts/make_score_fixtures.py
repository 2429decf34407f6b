"""References for log-probs and perplexity (issue 21), computed by transformers on the parity fixtures.

    /root/ref/bin/python scripts/make_score_fixtures.py            # every fixture with a reference.npz
    /root/ref/bin/python scripts/make_score_fixtures.py gemma gpt2  # or some

Writes tests/fixtures/<name>/reference_scores.npz from the checkpoint reloaded in float32 with eager attention:

    greedy_logprobs  (20, V) float32  torch.log_softmax of the logits that predict each of reference.npz's 20
                                      greedy ids: one full forward over input_ids + greedy_ids[:-1]
    ppl_ids          (N,) int64       N = 150 random ids (seeded by the name), BOS first where the tokenizer adds one
    llama_ctx        0-d int          32: llama-perplexity's chunks, N // 32 of them, each run alone, its first id
                                      replaced by BOS where one is added, labels = the ids at 17 .. 31
                                      (positions 16 .. 30 predicting the next): transformers' loss per chunk
    llama_losses     (N // 32,) float64
    llama_counts     (N // 32,) int64  tokens each loss averages
    stride_ctx, stride  0-d int       40, 12: the transformers perplexity guide's windows [begin, begin + 40) for
                                      begin = 0, 12, 24, ... up to the window that reaches the end; labels -100 but
                                      for the last trg_len = end - prev_end ids, as the guide sets them
    stride_losses    (W,) float64     outputs.loss of each window (labels shifted inside transformers)
    stride_counts    (W,) int64       how many labels that loss averages (after the shift)
    transformers_version, torch_version  0-d str

The windows are written out here from the two methods' definitions (llama.cpp's tools/perplexity and the guide),
not taken from minigen.
"""
from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import numpy as np
import torch
import transformers

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
N, LLAMA_CTX, STRIDE_CTX, STRIDE = 150, 32, 40, 12


def adds_bos(tok) -> int | None:
    plain, added = tok("a", add_special_tokens=False).input_ids, tok("a").input_ids
    return added[0] if len(added) > len(plain) and added[-len(plain):] == plain else None


def loss(model, ids: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
    with torch.no_grad():
        out = model(torch.tensor(ids[None]), labels=torch.tensor(labels[None]))
    return float(out.loss), int((labels[1:] != -100).sum())


def llama_chunks(model, ids: np.ndarray, bos: int | None):
    losses, counts = [], []
    for i in range(len(ids) // LLAMA_CTX):
        chunk = ids[i * LLAMA_CTX:(i + 1) * LLAMA_CTX].copy()
        if bos is not None:
            chunk[0] = bos
        labels = np.full_like(chunk, -100)
        first = LLAMA_CTX // 2
        labels[first + 1:] = chunk[first + 1:]          # positions first .. n_ctx-2 predict these
        l, c = loss(model, chunk, labels)
        losses.append(l), counts.append(c)
    return np.array(losses), np.array(counts)


def guide_windows(model, ids: np.ndarray):
    losses, counts, prev_end = [], [], 0
    for begin in range(0, len(ids), STRIDE):
        end = min(begin + STRIDE_CTX, len(ids))
        trg_len = end - prev_end
        window = ids[begin:end]
        labels = window.copy()
        labels[:-trg_len] = -100
        l, c = loss(model, window, labels)
        losses.append(l), counts.append(c)
        prev_end = end
        if end == len(ids):
            break
    return np.array(losses), np.array(counts)


def make(name: str):
    d = FIXTURES / name
    ref = np.load(d / "reference.npz")
    auto = transformers.AutoModelForCausalLM
    if json.loads((d / "config.json").read_text())["model_type"] == "mistral3":  # a wrapper with no CausalLM class
        auto = transformers.AutoModelForImageTextToText
    model = auto.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    tok = transformers.AutoTokenizer.from_pretrained(d)
    ids = np.concatenate([ref["input_ids"], ref["greedy_ids"][:-1]])
    with torch.no_grad():
        logits = model(torch.tensor(ids[None])).logits[0]
    T = len(ref["input_ids"])
    greedy = torch.log_softmax(logits[T - 1:], dim=-1).numpy().astype(np.float32)
    assert greedy.shape[0] == len(ref["greedy_ids"])
    assert (greedy.argmax(-1) == ref["greedy_ids"]).all(), "greedy ids differ from reference.npz"
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    bos = adds_bos(tok)
    vocab = min(len(tok), model.config.get_text_config().vocab_size)
    images = [i for i in (getattr(model.config, k, None) for k in ("image_token_id", "image_token_index")) if i is not None]
    ppl_ids = rng.choice(np.setdiff1d(np.arange(vocab), images), N).astype(np.int64)  # a wrapper's image ids left out
    if bos is not None:
        ppl_ids[0] = bos
    llama_losses, llama_counts = llama_chunks(model, ppl_ids, bos)
    stride_losses, stride_counts = guide_windows(model, ppl_ids)
    np.savez(d / "reference_scores.npz", greedy_logprobs=greedy, ppl_ids=ppl_ids, llama_ctx=LLAMA_CTX,
             llama_losses=llama_losses, llama_counts=llama_counts, stride_ctx=STRIDE_CTX, stride=STRIDE,
             stride_losses=stride_losses, stride_counts=stride_counts,
             transformers_version=transformers.__version__, torch_version=torch.__version__)
    print(f"{name}: bos {bos}, llama ppl {np.exp(np.average(llama_losses, weights=llama_counts)):.2f}, "
          f"stride ppl {np.exp(np.average(stride_losses, weights=stride_counts)):.2f}, "
          f"{(d / 'reference_scores.npz').stat().st_size} bytes")


def main():
    names = sys.argv[1:] or sorted(p.parent.name for p in FIXTURES.glob("*/reference.npz")
                                   if not p.parent.name.startswith("real_"))
    torch.manual_seed(0)
    for name in names:
        make(name)


if __name__ == "__main__":
    main()

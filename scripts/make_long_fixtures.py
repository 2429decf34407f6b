"""Long-prompt references: transformers on prompts longer than minigen's attention block (128 rows),
so that blocked attention, its skipped keys and Mistral's sliding window across blocks are checked
against transformers itself, not only against minigen's own unblocked attention.

    /root/ref/bin/python scripts/make_long_fixtures.py             # all; torch==2.13.0 + transformers
    /root/ref/bin/python scripts/make_long_fixtures.py gemma2      # or name some

Writes tests/fixtures/<name>/reference_long.npz for existing fixture checkpoints:
    input_ids   (T,)                 int64    T = 300 random ids (fixed seed), BOS first where the family adds one
    positions   (P,)                 int64    every 10th position and the last
    logits      (P, V)               float32  transformers' logits at those positions (eager, float32)
    attn_rows   (n_layers, n_heads, 10, T) float32  attention weights of the last 10 query rows
    greedy_ids  (12,)                int64    greedy continuation (argmax of full forwards)
"""
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
NAMES = ["llama_gqa3", "mistral_sliding", "gemma", "qwen2",
         # sliding windows across blocks on some layers only (Gemma 2/3), on every layer (Phi-3), longrope
         "gemma2", "gemma3_text_v4", "phi3"]
T = 300


def main(names: list[str]):
    torch.manual_seed(0)
    for name in names or NAMES:
        path = FIXTURES / name
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                                  attn_implementation="eager").eval()
        short = np.load(path / "reference.npz")["input_ids"]
        rng = np.random.default_rng(7)
        ids = rng.integers(3, model.config.vocab_size - 1, T)
        ids[0] = short[0]  # keep the fixture's first token (BOS where the family adds one)
        with torch.no_grad():
            out = model(torch.tensor(ids)[None], output_attentions=True)
        positions = np.array(sorted(set(range(0, T, 10)) | {T - 1}))
        logits = out.logits[0].numpy()
        attn = torch.stack(out.attentions)[:, 0, :, -10:, :].numpy()       # (L, H, 10, T)
        seq = list(ids)
        with torch.no_grad():
            for _ in range(12):
                seq.append(int(model(torch.tensor(seq)[None]).logits[0, -1].argmax()))
        np.savez_compressed(path / "reference_long.npz", input_ids=ids.astype(np.int64), positions=positions,
                            logits=logits[positions].astype(np.float32), attn_rows=attn.astype(np.float32),
                            greedy_ids=np.array(seq[T:], dtype=np.int64),
                            transformers_version=np.array(transformers.__version__))
        window = getattr(model.config, "sliding_window", None)
        print(f"{name}: T={T}, window={window}, wrote {(path / 'reference_long.npz').stat().st_size // 1024} KB")


if __name__ == "__main__":
    main(sys.argv[1:])

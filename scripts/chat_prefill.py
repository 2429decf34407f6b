"""The second turn of a chat: its prefill with the cache kept (minigen chat) against recomputing the
whole conversation (what `generate --chat` does on the same conversation).

    python scripts/chat_prefill.py [--model PATH] [--runs 5] [--reply-tokens 128]

Turn 1 is a system message, a question and the model's greedy reply (at most --reply-tokens); turn 2
a follow-up question. Per run: a fresh ChatSession answers turn 1, then turn 2 with one token, and
its prefill time is read from the reply's stats (they count only the tokens computed); then a fresh
Run prefills the whole turn-2 conversation with a new cache. The two alternate, and the medians are
printed: tokens computed, seconds, tokens/s. Both replies' first token must agree (it is checked).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import minigen  # noqa: E402
from minigen.generation.chat import ChatSession  # noqa: E402
from minigen.generation.steps import Run, chat_ids  # noqa: E402

SYSTEM = "You are a helpful assistant. Answer clearly and in some detail."
TURNS = ["Explain how a refrigerator keeps food cold.", "Why does it need electricity for that?"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="checkpoint directory (default: the default model)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--reply-tokens", type=int, default=128)
    args = ap.parse_args()
    if args.model is None:
        from minigen.gguf.default_model import default_model_path
        args.model = default_model_path()
    model, tok = minigen.load(args.model)
    kept, whole = [], []
    for _ in range(args.runs):
        session = ChatSession(model, tok, system=SYSTEM, temp=0)
        first = session.reply(TURNS[0], max_tokens=args.reply_tokens).text()
        second = session.reply(TURNS[1], max_tokens=1)
        token = second.text()
        kept.append((second.stats.prompt_tokens, second.stats.prefill_seconds))
        fresh = Run.from_prompt(model, tok, chat_ids(tok, second.messages), max_tokens=1, temp=0)
        assert fresh.text() == token, "the kept cache and the recomputation disagree"
        whole.append((fresh.stats.prompt_tokens, fresh.stats.prefill_seconds))
    print(f"{args.model}: turn 1 reply {len(tok.encode(first, add_special_tokens=False))} tokens, "
          f"{args.runs} runs, medians")
    for name, rows in (("cache kept (chat)", kept), ("whole conversation", whole)):
        n, s = rows[0][0], statistics.median(t for _, t in rows)
        print(f"  {name:<20} {n:5d} tokens  {s * 1000:8.1f} ms  {n / s:7.1f} tokens/s")
    ratio = statistics.median(t for _, t in whole) / statistics.median(t for _, t in kept)
    print(f"  second-turn prefill {ratio:.1f}x faster with the cache kept")


if __name__ == "__main__":
    main()

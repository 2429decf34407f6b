"""Print, per committed fixture, the largest differences between minigen and transformers' reference.

    python scripts/parity_report.py
"""
from pathlib import Path

import numpy as np

import minigen

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"


def main():
    print(f"{'fixture':18s} {'family':8s} {'max|Δlogit|':>12s} {'max|Δattn|':>11s}  greedy")
    for ref_file in sorted(FIXTURES.glob("*/reference.npz")):
        model, ref = minigen.load(ref_file.parent), np.load(ref_file)
        record = []
        cache = model.make_cache()
        logits = model.forward(ref["input_ids"], cache, record=record)
        ids = [int(logits[-1].argmax())]
        while len(ids) < len(ref["greedy_ids"]):
            ids.append(int(model.forward(np.array(ids[-1:]), cache, last_only=True)[-1].argmax()))
        same = "identical" if ids == ref["greedy_ids"].tolist() else "DIFFERENT"
        print(f"{ref_file.parent.name:18s} {model.config.model_type:8s} "
              f"{np.abs(logits - ref['logits']).max():12.2e} "
              f"{np.abs(np.stack(record) - ref['attentions']).max():11.2e}  {same} ({len(ids)} tokens)")


if __name__ == "__main__":
    main()

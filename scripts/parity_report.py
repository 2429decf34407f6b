"""Print, per committed fixture, the largest differences between minigen and transformers' reference.

    python scripts/parity_report.py
"""
from pathlib import Path

import numpy as np

import minigen
from minigen.generation.options import Options
from minigen.generation.steps import generate_step

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"


def main():
    print(f"{'fixture':18s} {'family':8s} {'max|Δlogit|':>12s} {'max|Δattn|':>11s}  greedy")
    for ref_file in sorted(FIXTURES.glob("*/reference.npz")):
        model, ref = minigen.load(ref_file.parent)[0], np.load(ref_file)
        record = []
        logits = model.forward(ref["input_ids"], model.make_cache(), record=record)
        # greedy through the generation loop (EOS ignored), as `minigen generate --temp 0` runs it
        greedy = Options(max_tokens=len(ref["greedy_ids"]), temp=0, ignore_eos=True)
        ids = [step.token for step in generate_step(model, ref["input_ids"], greedy)]
        same = "identical" if ids == ref["greedy_ids"].tolist() else "DIFFERENT"
        print(f"{ref_file.parent.name:18s} {model.config.model_type:8s} "
              f"{np.abs(logits - ref['logits']).max():12.2e} "
              f"{attention_difference(record, ref['attentions']):11.2e}  {same} ({len(ids)} tokens)")


def attention_difference(record: list, want: np.ndarray) -> float:
    """The largest difference over the attention layers (a hybrid records only those; its reference too)."""
    record = [r for r in record if r is not None]   # a hybrid records None for its layers without attention
    if len(record) != len(want):
        raise SystemExit(f"{len(record)} attention layers recorded, {len(want)} in the reference")
    return max(float(np.abs(r - w[:, :r.shape[1], :r.shape[2]]).max()) if r.shape == w.shape else float("nan")
               for r, w in zip(record, want))


if __name__ == "__main__":
    main()

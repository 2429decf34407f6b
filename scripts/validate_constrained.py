"""Constrained output on a real model: every output that finished validates against its schema.

    python scripts/draft_pair.py weights/bench && python scripts/validate_constrained.py   # Qwen2.5-Coder-0.5B-Instruct
    python scripts/validate_constrained.py --model weights/smollm2-135m-instruct --seeds 2

Schemas and prompts written for this script (none of the test fixtures shaped them), each run greedy and
sampled (temperature 0.8, --seeds seeds), all of them as one batch (minigen.generation.batch), through the
model's chat template. An output that ended on EOS (the API's finish_reason "stop") must parse as JSON
and validate against its schema with the `jsonschema` package; one that reached --max-tokens is counted
apart. Also, for each prompt, the model's output unconstrained, to show what the constraint changes.
Exit status 1 if any finished output does not validate. The model is converted on first use (a .gguf).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QWEN = str(ROOT / "weights" / "bench" / "qwen2.5-coder-0.5b-instruct")   # scripts/draft_pair.py weights/bench makes it
CASES = [
    ("Give me a recipe for pancakes as JSON.",
     {"type": "object", "properties": {"title": {"type": "string"}, "servings": {"type": "integer", "minimum": 1},
                                       "ingredients": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                                       "vegetarian": {"type": "boolean"}},
      "required": ["title", "servings", "ingredients", "vegetarian"], "additionalProperties": False}),
    ("Extract the people from: 'Ada Lovelace met Charles Babbage in London in 1833.'",
     {"type": "object", "properties": {"people": {"type": "array", "items": {
         "type": "object", "properties": {"name": {"type": "string"}, "role": {"type": "string"}},
         "required": ["name"], "additionalProperties": False}}, "year": {"type": "integer"}},
      "required": ["people", "year"], "additionalProperties": False}),
    ("Rate the movie Jaws from 1 to 5 and say why.",
     {"type": "object", "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5},
                                       "reason": {"type": "string", "maxLength": 200}},
      "required": ["stars", "reason"], "additionalProperties": False}),
    ("What is the chemical formula of water, and is it polar?",
     {"type": "object", "properties": {"formula": {"type": "string", "pattern": "^[A-Z][A-Za-z0-9]*$"},
                                       "polar": {"type": "boolean"}}, "required": ["formula", "polar"]}),
    ("Plan a three-day trip to Rome.",
     {"type": "array", "items": {"type": "object", "properties": {
         "day": {"type": "integer"}, "activities": {"type": "array", "items": {"type": "string"}, "maxItems": 4}},
         "required": ["day", "activities"], "additionalProperties": False}, "minItems": 3, "maxItems": 3}),
    ("Classify the sentiment of: 'The service was slow but the food was great.'",
     {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "mixed", "neutral"]},
                                       "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
      "required": ["sentiment", "confidence"], "additionalProperties": False}),
    ("When was the Eiffel Tower finished? Give the date.",
     {"type": "object", "properties": {"date": {"type": "string", "format": "date"}, "city": {"type": "string"}},
      "required": ["date"], "additionalProperties": False}),
    ("Convert 3 miles to kilometres.",
     {"anyOf": [{"type": "number"}, {"type": "object", "properties": {"km": {"type": "number"}}, "required": ["km"]}]}),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=QWEN)
    ap.add_argument("--seeds", type=int, default=1, help="Sampled runs per case, besides the greedy one.")
    ap.add_argument("--max-tokens", type=int, default=160)
    a = ap.parse_args()
    import jsonschema
    import minigen
    from minigen.generation.batch import batch_runs
    model, tok = minigen.load(a.model)
    prompts, options, schemas = [], [], []
    for prompt, schema in CASES:
        for temp, seed in [(0, None)] + [(0.8, s) for s in range(a.seeds)]:
            prompts.append(prompt)
            options.append({"max_tokens": a.max_tokens, "temp": temp, "seed": seed, "constraint": {"json_schema": schema}})
            schemas.append(schema)
    start = time.perf_counter()
    results = batch_runs(model, tok, prompts, options, chat=True, max_batch=16)
    plain = batch_runs(model, tok, [p for p, _ in CASES], {"max_tokens": a.max_tokens, "temp": 0}, chat=True)
    seconds = time.perf_counter() - start
    finished = valid = 0
    for r, schema in zip(results, schemas):
        if r.finish_reason != "eos":
            continue
        finished += 1
        try:
            jsonschema.validate(json.loads(r.text), schema, format_checker=jsonschema.FormatChecker())
            valid += 1
        except (json.JSONDecodeError, jsonschema.ValidationError) as e:
            print(f"INVALID: {r.text!r}: {str(e).splitlines()[0]}")
    for (prompt, schema), r in zip(CASES, plain):
        try:
            jsonschema.validate(json.loads(r.text), schema)
            unaided = "valid"
        except (json.JSONDecodeError, jsonschema.ValidationError):
            unaided = "not valid"
        print(f"- {prompt}\n  constrained: {results[[p for p in prompts].index(prompt)].text!r}\n"
              f"  unconstrained ({unaided}): {r.text[:120]!r}")
    unaided_ok = sum(1 for (p, s), r in zip(CASES, plain) if _valid(r.text, s, jsonschema))
    print(f"\n{Path(str(a.model)).name}: {len(results)} constrained outputs, {finished} finished (EOS), "
          f"{valid} of them valid ({100 * valid / max(1, finished):.0f} %); {len(results) - finished} reached "
          f"{a.max_tokens} tokens. Unconstrained greedy: {unaided_ok} of {len(CASES)} valid. {seconds:.0f} s")
    return 0 if valid == finished else 1


def _valid(text: str, schema: dict, jsonschema) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False


if __name__ == "__main__":
    sys.exit(main())

"""Check minigen against transformers on scaled-down copies of REAL hub config.json files, and write
the tests/fixtures/real_<name>/ fixtures (needs torch + transformers; the tests do not).

    /root/ref/bin/python scripts/make_real_config_fixtures.py            # compare all, write fixtures
    /root/ref/bin/python scripts/make_real_config_fixtures.py --check    # compare only

For every config in tests/real_configs/ (see its README.md): shrink it (tests/real_configs/shrink.py:
every field and quirk kept, sizes shrunk), write random weights under the real checkpoint's tensor
names and file layout (GPT-2 without `transformer.` and with h.N.attn.bias / masked_bias buffers,
tied or untied lm_head as on the hub, shards + index), then
  1. load that directory with transformers' AutoModelForCausalLM.from_pretrained (float32, eager) and
     check it holds exactly the weights written (nothing silently re-initialised);
  2. load it with minigen.load and compare logits (<= 1e-4) and attention weights (<= 1e-5) on a
     16-token prompt, and the 20-step greedy continuation.
Any mismatch is printed and the script exits 1. FIXTURES (below) are also saved as parity fixtures
with reference.npz in the format of scripts/make_fixtures.py.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "real_configs"))
sys.path.insert(0, str(ROOT))
import shrink  # noqa: E402
import minigen  # noqa: E402

OUT = ROOT / "tests" / "fixtures"
T_PROMPT, N_GREEDY, MIN_GAP = 16, 20, 1e-3
# real config -> fixture directory; each catches something the synthetic fixtures do not
# (stored in the real checkpoint's dtype: GPT-2 float32, the others bfloat16)
FIXTURES = {
    "gpt2": ("real_gpt2", "float32"),                      # original names, attn.bias/masked_bias buffers
    "Qwen2.5-0.5B-Instruct": ("real_qwen2_5", "bfloat16"),  # sliding_window present, use_sliding_window false
    "Llama-3.2-1B-Instruct": ("real_llama3_2", "bfloat16"), # llama3 rope factor 32 / 8192, head_dim, eos list, tied
    "Mistral-7B-v0.1": ("real_mistral_v0_1", "bfloat16"),   # sliding window 8 < prompt, 2 shards, untied
    "gemma-7b": ("real_gemma_7b", "bfloat16"),             # hidden_act gelu + hidden_activation, head_dim != D/H, 4 shards
}


def hf_load(path: Path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def check_weights(model, written: dict, cfg: dict) -> list[str]:
    """Every tensor transformers holds equals the one written (modulo naming and tying)."""
    problems = []
    sd = model.state_dict()
    for k, v in written.items():
        key = k if k in sd else None
        if key is None:
            problems.append(f"transformers has no parameter {k}")
            continue
        if not np.array_equal(sd[key].numpy(), v):
            problems.append(f"transformers' {k} differs from the file (re-initialised?)")
    return problems


def hf_reference(model, ids: list[int]) -> dict:
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_attentions=True)
        seq, gaps = list(ids), []
        for _ in range(N_GREEDY):
            logits = model(torch.tensor([seq])).logits[0, -1]
            top = torch.topk(logits, 2).values
            gaps.append(float(top[0] - top[1]))
            seq.append(int(logits.argmax()))
    return {"input_ids": np.array(ids, np.int64), "logits": out.logits[0].numpy().astype(np.float32),
            "greedy_ids": np.array(seq[len(ids):], np.int64),
            "attentions": np.stack([a[0].numpy() for a in out.attentions]).astype(np.float32),
            "min_gap": min(gaps)}


def minigen_reference(path: Path, ids: list[int]) -> dict:
    m = minigen.load(path)[0]
    record: list = []
    logits = m.forward(np.array(ids), m.make_cache(64), record=record)
    seq = list(ids)
    for _ in range(N_GREEDY):
        seq.append(int(m.logits(np.array(seq))[-1].argmax()))
    return {"logits": logits, "attentions": np.stack(record), "greedy_ids": np.array(seq[len(ids):])}


def compare(name: str, seed: int, path: Path, dtype: str = "float32") -> tuple[dict, list[str]]:
    """Write the shrunk checkpoint to a NEW directory `path` (minigen caches memory maps by file path
    within a process, so a rewritten file at an old path would be read stale) and compare."""
    cfg = shrink.shrink(shrink.real_config(name))
    written = shrink.random_tensors(cfg, seed)
    if dtype == "bfloat16":
        written = {k: torch.from_numpy(v).to(torch.bfloat16).float().numpy() for k, v in written.items()}
    shrink.write_checkpoint(path, cfg, written, shrink.LAYOUTS[name], dtype)
    model = hf_load(path)
    problems = check_weights(model, {k: v for k, v in written.items()
                                     if not (k == "lm_head.weight" and not shrink.LAYOUTS[name].get("lm_head"))}, cfg)
    ids = np.random.default_rng(seed + 7).integers(0, cfg["vocab_size"], T_PROMPT).tolist()
    ref = hf_reference(model, ids)
    ours = minigen_reference(path, ids)
    dl = float(np.abs(ours["logits"] - ref["logits"]).max())
    da = float(np.abs(ours["attentions"] - ref["attentions"]).max())
    if dl > 1e-4:
        problems.append(f"logits differ by {dl:.2e}")
    if da > 1e-5:
        problems.append(f"attention weights differ by {da:.2e}")
    if ref["min_gap"] > MIN_GAP and not np.array_equal(ours["greedy_ids"], ref["greedy_ids"]):
        problems.append(f"greedy ids {ours['greedy_ids'].tolist()} != {ref['greedy_ids'].tolist()}")
    hf_layers = getattr(model.config, "layer_types", None)
    print(f"{name:26s} seed {seed}: max |dlogits| {dl:.1e}  max |dattn| {da:.1e}  "
          f"hf layer_types {hf_layers}  hf act {getattr(model.config, 'hidden_act', None) or model.config.activation_function}"
          f"  {'OK' if not problems else 'MISMATCH: ' + '; '.join(problems)}")
    return ref, problems


def main(check_only: bool) -> None:
    failures = 0
    for name in shrink.NAMES:
        with tempfile.TemporaryDirectory() as tmp:
            _, problems = compare(name, 0, Path(tmp) / name)
            failures += bool(problems)
    if not check_only:
        for name, (fixture, dtype) in FIXTURES.items():
            tmp = Path(tempfile.mkdtemp())
            for seed in range(1, 50):
                ref, problems = compare(name, seed, tmp / f"seed{seed}", dtype)
                if problems:
                    raise SystemExit(f"{name}: {problems}")
                if ref["min_gap"] > MIN_GAP and len(set(ref["greedy_ids"].tolist())) >= 6:
                    break
            else:
                raise SystemExit(f"{name}: no seed with a clear greedy path")
            path = OUT / fixture
            shutil.rmtree(path, ignore_errors=True)
            shutil.copytree(tmp / f"seed{seed}", path)
            shutil.rmtree(tmp)
            np.savez(path / "reference.npz", **{k: v for k, v in ref.items() if k != "min_gap"},
                     real_config=np.array(name), seed=np.array(seed),
                     transformers_version=np.array(transformers.__version__),
                     torch_version=np.array(torch.__version__))
            size = sum(f.stat().st_size for f in path.iterdir())
            print(f"wrote {path.relative_to(ROOT)} ({size // 1024} KB)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main("--check" in sys.argv[1:])

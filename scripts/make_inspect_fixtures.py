"""References for minigen.inspect's logit lens and head ablation, computed by transformers.

    /root/ref/bin/python scripts/make_inspect_fixtures.py            # one fixture per family
    /root/ref/bin/python scripts/make_inspect_fixtures.py gemma gpt2  # or some

Writes tests/fixtures/<name>/inspect_reference.npz from the fixture's checkpoint, reloaded in float32 with
eager attention, on the first T = 8 ids of its reference.npz prompt:

    input_ids  (T,)               int64
    lens       (n_layers + 1, T, V) float32  row 0: `output_hidden_states[0]` (the embeddings as the family
                                            makes them: scaled, positions added); row l: the output of decoder
                                            layer l-1 (a forward hook on the layer); each through the model's
                                            final norm, lm_head and final soft-cap. The last row is checked to
                                            equal the model's logits; hidden_states[l] is checked to equal the
                                            layer hook's output (transformers' last hidden state is after the
                                            final norm, so it cannot serve as a lens row itself).
    ablations  0-d str            JSON list of {"heads": [[layer, head], ...], "mode": "zero" | "mean"}
    ablated    (K, T, V) float32  logits with those heads ablated: a forward pre-hook on each layer's output
                                  projection (o_proj / c_proj / dense) sets the head's slice of its input to 0
                                  ("zero") or to that slice's mean over the T positions ("mean")
    transformers_version, torch_version   0-d str

The head sets are chosen from the config alone (first and last layer, first and last head, every head), so a
new fixture family needs no edit here: only its output-projection module name in O_PROJ if it is new.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
T = 8
O_PROJ = re.compile(r"(?:layers|h)\.(\d+)\.(?:self_attn\.o_proj|attn\.c_proj|attention\.dense)$")
FAMILIES = {"gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "olmo2",
            "gpt_neox", "smollm3", "granite", "granitemoe", "olmo3", "ministral3"}


PREFERRED = {"llama": "llama_gqa3"}  # the llama fixture with GQA; the other llama variants test loading


def fixtures(names: list[str]) -> list[str]:
    """Named fixtures, or one synthetic fixture per family minigen runs (those with a reference.npz)."""
    if names:
        return names
    by_family: dict[str, list[str]] = {}
    for d in sorted(FIXTURES.iterdir()):
        if d.name.startswith("real_") or not (d / "reference.npz").is_file():
            continue
        family = json.loads((d / "config.json").read_text()).get("model_type")
        if family in FAMILIES:
            by_family.setdefault(family, []).append(d.name)
    return sorted(PREFERRED.get(f) if PREFERRED.get(f) in n else n[0] for f, n in by_family.items())


def head_sets(n_layers: int, n_heads: int) -> list[dict]:
    last = n_layers - 1
    return [
        {"heads": [[0, 0]], "mode": "zero"},
        {"heads": [[0, n_heads - 1], [last, 1 % n_heads]], "mode": "zero"},
        {"heads": [[0, 1 % n_heads], [last, 0]], "mode": "mean"},
        {"heads": [[l, h] for l in range(n_layers) for h in range(n_heads)], "mode": "mean"},
    ]


def output_projections(model) -> dict[int, torch.nn.Module]:
    found = {int(m[1]): mod for name, mod in model.named_modules() if (m := O_PROJ.search(name))}
    assert sorted(found) == list(range(model.config.num_hidden_layers)), sorted(found)
    return found


def decoder_layers(model) -> list[torch.nn.Module]:
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == model.config.num_hidden_layers:
            return list(mod)
    raise AssertionError("no decoder layer list")


def final_norm(model) -> torch.nn.Module:
    base = model.base_model
    for attr in ("norm", "ln_f", "final_layer_norm"):
        if hasattr(base, attr):
            return getattr(base, attr)
    raise AssertionError("no final norm")


def unembed(model, h: torch.Tensor) -> torch.Tensor:
    logits = model.get_output_embeddings()(final_norm(model)(h)) / getattr(model.config, "logits_scaling", 1.0)
    cap = getattr(model.config, "final_logit_softcapping", None)
    return cap * torch.tanh(logits / cap) if cap else logits


def lens(model, ids: torch.Tensor) -> np.ndarray:
    outs = []
    hooks = [layer.register_forward_hook(lambda mod, args, out: outs.append(out[0] if isinstance(out, tuple) else out))
             for layer in decoder_layers(model)]
    try:
        res = model(ids, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    hs = res.hidden_states
    L = len(outs)
    for l in range(L - 1):  # hidden_states[l + 1] is layer l's output, except the last (after the final norm)
        torch.testing.assert_close(hs[l + 1], outs[l], rtol=0, atol=0)
    rows = [unembed(model, hs[0])] + [unembed(model, o) for o in outs]
    torch.testing.assert_close(rows[-1], res.logits, rtol=0, atol=1e-5)
    return torch.stack(rows)[:, 0].numpy()


def ablated(model, ids: torch.Tensor, heads: list, mode: str) -> np.ndarray:
    cfg = model.config
    H = cfg.num_attention_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    by_layer: dict[int, list[int]] = {}
    for l, h in heads:
        by_layer.setdefault(l, []).append(h)

    def pre_hook(layer):
        def hook(mod, args):
            x = args[0].clone()                                  # (1, T, H d): heads side by side
            z = x.view(*x.shape[:-1], H, d)
            for h in by_layer[layer]:
                z[..., h, :] = 0 if mode == "zero" else z[..., h, :].mean(dim=-2, keepdim=True)
            return (x,) + args[1:]
        return hook

    projs = output_projections(model)
    hooks = [projs[l].register_forward_pre_hook(pre_hook(l)) for l in by_layer]
    try:
        return model(ids).logits[0].numpy()
    finally:
        for h in hooks:
            h.remove()


def make(name: str):
    path = FIXTURES / name
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    ids = np.load(path / "reference.npz")["input_ids"][:T].astype(np.int64)
    x = torch.tensor(ids)[None]
    sets = head_sets(model.config.num_hidden_layers, model.config.num_attention_heads)
    with torch.no_grad():
        clean = model(x).logits[0].numpy()
        lens_rows = lens(model, x)
        abl = np.stack([ablated(model, x, s["heads"], s["mode"]) for s in sets])
    for a in abl:
        assert np.abs(a - clean).max() > 1e-3, "an ablation that changes nothing tests nothing"
    out = path / "inspect_reference.npz"
    np.savez_compressed(out, input_ids=ids, lens=lens_rows.astype(np.float32), ablations=np.array(json.dumps(sets)),
                        ablated=abl.astype(np.float32), transformers_version=np.array(transformers.__version__),
                        torch_version=np.array(torch.__version__))
    print(f"{name} ({model.config.model_type}): lens {lens_rows.shape}, {len(sets)} ablations, "
          f"wrote {out.stat().st_size // 1024} KB")


if __name__ == "__main__":
    torch.manual_seed(0)
    for n in fixtures(sys.argv[1:]):
        make(n)

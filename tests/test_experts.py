"""Routed experts from outside (minigen/inspect/experts.py, `minigen experts`, `minigen ablate --expert`)
against transformers: each GraniteMoE fixture's expert_reference.npz holds the routing
GraniteMoeTopKRouter returned for the prompt (a forward hook) and the logits with experts' down
projections zeroed (scripts/make_family_fixtures.py)."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

import minigen
from minigen.cli import main
from minigen.errors import MinigenError
from minigen.generation.sampling import log_softmax
from minigen.inspect import commands, experts, hooks

from conftest import FIXTURES_DIR

NAMES = ["granitemoe", "granitemoe_v4", "granitemoehybrid_moe", "granitemoehybrid_moe_v4"]


def reference(name):
    with np.load(FIXTURES_DIR / name / "expert_reference.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("name", NAMES)
def test_routing_is_transformers_routing(name):
    ref = reference(name)
    model = minigen.load(FIXTURES_DIR / name)[0]
    rows = experts.routing(model, ref["input_ids"])
    got = np.stack([r["experts"] for r in rows])                               # (L, T, k)
    assert got.tolist() == ref["experts"].tolist()
    np.testing.assert_allclose(np.stack([r["weights"] for r in rows]), ref["weights"], atol=1e-5)
    k, E = model.config.experts_per_token, model.config.n_experts
    assert all(r["load"].sum() == k * len(ref["input_ids"]) and len(r["load"]) == E for r in rows)


@pytest.mark.parametrize("name", NAMES)
def test_expert_ablation_equals_transformers_with_the_expert_zeroed(name):
    ref = reference(name)
    model = minigen.load(FIXTURES_DIR / name)[0]
    clean = model.logits(ref["input_ids"])
    for experts_set, want in zip(json.loads(str(ref["ablations"])), ref["ablated"]):
        ablated = experts.without_experts(model, [tuple(p) for p in experts_set])
        got = hooks.logits_of(ablated, hooks.final_residual(ablated, ref["input_ids"]))
        assert np.abs(got - want).max() <= 1e-4
        assert np.abs(got - clean).max() > 1e-3
    np.testing.assert_array_equal(model.logits(ref["input_ids"]), clean)  # the original is untouched


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


CLI_NAMES = ["granitemoe", "granitemoehybrid_moe"]   # GraniteMoE; Granite 4.0-H with a shared MLP beside


@pytest.mark.parametrize("name", CLI_NAMES)
def test_experts_command_json_lists_each_token_s_experts(name):
    ref = reference(name)
    model, tok = minigen.load(FIXTURES_DIR / name)
    prompt = tok.decode(ref["input_ids"], skip_special_tokens=True)
    r = cli("experts", prompt, "--model", FIXTURES_DIR / name, "--json", "--layers", "1")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [layer["layer"] for layer in out["layers"]] == [1]
    routes = out["layers"][0]["routes"]
    assert [[x["expert"] for x in t["experts"]] for t in routes] == ref["experts"][1].tolist()
    text = cli("experts", prompt, "--model", FIXTURES_DIR / name)
    assert text.exit_code == 0 and "layer 0" in text.output and "tokens per expert" in text.output


@pytest.mark.parametrize("name", CLI_NAMES)
def test_ablate_expert_and_the_sweep_over_experts(name):
    """`ablate --expert` against transformers, at the position the reference's ablations move most: its
    log-probs before (the reference's clean logits) and after (its logits with those experts' outputs zeroed),
    and the KL between them; the sweep's KL of one expert against its own reference."""
    path = FIXTURES_DIR / name
    ref = reference(name)
    with np.load(path / "reference.npz") as z:
        clean_ids, clean = z["input_ids"], z["logits"]
    assert clean_ids.tolist() == ref["input_ids"].tolist()
    lp = lambda x: log_softmax(x.astype(np.float64))                            # noqa: E731
    kls = np.array([(np.exp(lp(clean)) * (lp(clean) - lp(a))).sum(-1) for a in ref["ablated"]])   # (sets, T)
    which, pos = np.unravel_index(np.argmax(kls), kls.shape)                 # the set and position it moves most
    pairs = json.loads(str(ref["ablations"]))[which]
    before, after = lp(clean[pos]), lp(ref["ablated"][which][pos])
    model, tok = minigen.load(path)
    prompt = tok.decode(ref["input_ids"], skip_special_tokens=True)
    spec = ",".join(f"{l}.{e}" for l, e in pairs)
    r = cli("ablate", prompt, "--model", path, "--expert", spec, "--token", pos, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["components"] == [{"kind": "expert", "layer": l, "head": None, "expert": e, "name": f"expert {l}.{e}"}
                                 for l, e in pairs]
    target = int(np.argmax(before))
    assert out["target"]["id"] == target
    assert abs(out["logp_before"] - before[target]) < 1e-4 and abs(out["logp_after"] - after[target]) < 1e-4
    kl = float((np.exp(before) * (before - after)).sum())
    assert kl > 1e-4 and abs(out["kl"] - kl) <= 1e-6 + 1e-3 * kl
    r = cli("ablate", prompt, "--model", path, "--sweep", "experts", "--token", pos, "--json")
    assert r.exit_code == 0, r.output
    effects = {(e["layer"], e["expert"]): e["kl"] for e in json.loads(r.stdout)["effects"]}
    assert len(effects) == model.config.n_layers * model.config.n_experts
    single = json.loads(str(ref["ablations"]))[0][0]                         # one expert: its own reference
    assert abs(effects[tuple(single)] - kls[0, pos]) <= 1e-5 + 1e-3 * kls[0, pos]


@pytest.mark.parametrize("name, row", [
    ("granitemoe", "6 per layer, 2 per token (topk_softmax)\n"),
    ("granitemoehybrid_moe", "8 per layer, 3 per token (topk_softmax), and a shared MLP of width 24\n"),
])
def test_info_shows_the_experts(name, row):
    r = cli("info", "--model", FIXTURES_DIR / name)
    assert r.exit_code == 0, r.output
    assert "experts:" in r.stdout and row in r.stdout


@pytest.mark.parametrize("args, words", [
    (["--expert", "0.6"], "expert 6 out of range"),
    (["--expert", "3"], "LAYER.EXPERT"),
    (["--expert", "0.1", "--mode", "mean"], "--mode zero"),
])
def test_bad_expert_flags_say_what_is_wrong(args, words):
    r = cli("ablate", "hello", "--model", FIXTURES_DIR / "granitemoe", *args)
    assert r.exit_code != 0 and words in r.output and "Traceback" not in r.output


def test_a_dense_model_has_no_experts():
    r = cli("experts", "hello", "--model", FIXTURES_DIR / "granite")
    assert r.exit_code == 1 and "no routed experts" in r.output
    with pytest.raises(MinigenError, match="no routed experts"):
        commands.components(minigen.load(FIXTURES_DIR / "granite")[0], None, None, None, "0.1")

"""What heads do (issue 11): the logit lens and head ablation against transformers, direct logit attribution,
activation patching and value-weighted attention on hand-built cases, and the commands' text and JSON."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

import minigen
from minigen.engine.linear import dense
from minigen.cli import main
from minigen.inspect import ablated_logits, logit_lens
from minigen.inspect.effects import Component, ablated_runs, ablation, changes_for, every, patching
from minigen.inspect.hooks import BATCH, Intervention, final_residual, layer_inputs, logits_of, patch, resume, resume_each
from minigen.inspect.internals import trace_head, value_norms
from minigen.inspect.lens import direct_attribution
from minigen.inspect.stats import value_weighted

from conftest import FIXTURES, FIXTURES_DIR
from inspect_fixture import FAMILY_EXTRAS, make_induction_gpt2, random_model

# One fixture per family with transformers' references (scripts/make_inspect_fixtures.py); a new family's
# fixture joins by having tests/fixtures/<name>/inspect_reference.npz. Every family must have one
# (test_families.py checks it).
REFERENCES = sorted(p.parent.name for p in FIXTURES_DIR.glob("*/inspect_reference.npz"))


def cli(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def reference(name):
    with np.load(FIXTURES_DIR / name / "inspect_reference.npz") as z:
        return {k: z[k] for k in z.files}


# --- against transformers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", REFERENCES)
def test_logit_lens_equals_transformers(name):
    ref = reference(name)
    model = minigen.load(FIXTURES_DIR / name)[0]
    lens = logit_lens(model, ref["input_ids"])
    assert lens.dtype == np.float32 and lens.shape == (model.config.n_layers + 1, len(ref["input_ids"]), model.config.vocab_size)
    np.testing.assert_allclose(lens, ref["lens"], atol=2e-5, rtol=0)
    np.testing.assert_array_equal(lens[-1], model.logits(ref["input_ids"]))


@pytest.mark.parametrize("name", REFERENCES)
def test_ablated_logits_equal_transformers(name):
    ref = reference(name)
    model = minigen.load(FIXTURES_DIR / name)[0]
    clean = model.logits(ref["input_ids"])
    for spec, expected in zip(json.loads(str(ref["ablations"])), ref["ablated"]):
        got = ablated_logits(model, ref["input_ids"], [tuple(h) for h in spec["heads"]], spec["mode"])
        assert got.dtype == np.float32 and got.shape == clean.shape
        np.testing.assert_allclose(got, expected, atol=2e-5, rtol=0, err_msg=str(spec))
        assert np.abs(got - clean).max() > 1e-3                     # the ablation did something


# --- invariants on every family (random weights) ------------------------------------------------------------

@pytest.fixture(scope="module", params=sorted(FAMILY_EXTRAS))
def family_model(request):
    return random_model(request.param)


IDS = np.array([3, 17, 5, 9, 17, 22, 5, 30, 11])


def test_ablating_nothing_changes_nothing(family_model):
    clean = family_model.logits(IDS)
    np.testing.assert_array_equal(ablated_logits(family_model, IDS, []), clean)
    x, _ = layer_inputs(family_model, IDS)
    for start in range(family_model.config.n_layers):           # resuming at any layer is the same forward
        np.testing.assert_allclose(logits_of(family_model, resume(family_model, x[start], start)), clean, atol=1e-5)


def test_runs_resumed_together_equal_each_alone(family_model):
    """hooks.resume_each (a sweep's and patching's runs from one layer as one batch) against resume, one
    run at a time: every head ablated alone (zero and mean: a mean over its own run's positions), each
    layer's blocks, a patched residual row; more runs than one batch holds."""
    m, cfg = family_model, family_model.config
    x, _ = layer_inputs(m, IDS)
    layer = next(l for l in range(cfg.n_layers) if minigen.engine.mixers.has_attention(cfg, l))
    comps = [Component("head", layer, h) for h in range(cfg.n_heads)] + [Component("attn", layer), Component("mlp", layer)]
    changes = [changes_for([c], mode) for c in comps for mode in ("zero", "mean")] * 2       # > BATCH runs
    changes.append(None)
    xs = [x[layer]] * len(changes)
    xs[-1] = x[layer].copy()
    xs[-1][3] += 0.5
    assert len(changes) > BATCH
    together = resume_each(m, xs, layer, changes)
    for xi, c, got in zip(xs, changes, together):
        want = resume(m, xi, layer, Intervention(c))
        scale = np.abs(want).max(axis=-1, keepdims=True)        # a batch's product sums in its own order
        assert (np.abs(got - want) <= 1e-5 * scale).all(), np.abs(got - want).max()
    assert np.abs(together[0] - together[1]).max() > 1e-4          # zero and mean differ: each run its own


def test_lens_rows(family_model):
    lens = logit_lens(family_model, IDS)
    np.testing.assert_array_equal(lens[-1], family_model.logits(IDS))
    m = family_model
    np.testing.assert_allclose(lens[0], logits_of(m, minigen.engine.model.embed(m.params, m.config, IDS, np.arange(len(IDS)))),
                               atol=1e-6)


def test_mean_ablation_of_a_constant_head_changes_nothing(family_model):
    """A head whose output is already its mean at every position: replace z by a constant first (a change
    of our own), then mean-ablating it on top must give exactly that run."""
    const = {("z", 1): lambda z: np.concatenate([np.full_like(z[:, :1], 0.3), z[:, 1:]], axis=1)}
    base = final_residual(family_model, IDS, Intervention(const))
    both = Intervention({("z", 1): lambda z: changes_for([Component("head", 1, 0)], "mean")[("z", 1)](const[("z", 1)](z))})
    np.testing.assert_allclose(final_residual(family_model, IDS, both), base, atol=1e-4, rtol=1e-5)


def test_dla_parts_add_up_to_the_logit(family_model):
    m = family_model
    for target, vs in [(7, None), (3, 12)]:
        r = direct_attribution(m, IDS, len(IDS) - 1, target, vs)
        assert r["total"] == pytest.approx(r["logit"], abs=1e-4)
        heads = np.array(r["heads"])
        np.testing.assert_allclose(heads.sum(1) + r["attn_bias"], r["attn"], atol=1e-4)   # heads + bias = block
        logits = m.logits(IDS)[-1].astype(np.float64)
        want = logits[target] - (0 if vs is None else logits[vs])
        cap = m.config.final_softcap
        if cap:  # the parts sum to the logit before the cap; the model's is after it
            if vs is None:
                assert cap * np.tanh(r["logit"] / cap) == pytest.approx(logits[target], abs=1e-4)
        else:
            assert r["logit"] == pytest.approx(want, abs=1e-4)
        assert r["capped"] == pytest.approx(want, abs=1e-4)


def test_patching_the_only_difference_restores_everything(family_model):
    """Clean and corrupted differ at one position q: patching the residual stream entering layer 0 there
    restores exactly all of it, anywhere else nothing; patching every position of the last block's input
    likewise; a patched head's output is the clean one."""
    m = family_model
    clean, corrupt = IDS, IDS.copy()
    q = 4
    corrupt[q] = 29
    r = patching(m, clean, corrupt, answer=7, wrong=13, what="resid")
    restored = np.array(r["restored"])
    assert restored[0, q] == pytest.approx(1, abs=1e-4)
    assert np.abs(np.delete(restored[0], q)).max() < 1e-6
    assert np.abs(restored[:, :q]).max() < 1e-6                     # before q the runs are the same
    heads = np.array(patching(m, clean, corrupt, answer=7, wrong=13, what="heads")["restored"])
    assert heads.shape == (m.config.n_layers, m.config.n_heads)
    xc, kc = layer_inputs(m, clean)
    xr, _ = layer_inputs(m, corrupt)
    keep = Intervention({("z", 1): patch(kc.kept["z"][1], heads=[2])}, keep=True)
    resume(m, xr[1], 1, keep)
    np.testing.assert_array_equal(keep.kept["z"][1][:, 2], kc.kept["z"][1][:, 2])


def test_patching_the_induction_head_restores_the_answer(tmp_path):
    """The hand-built two-layer model (inspect_fixture): layer 1 head 0 is an induction head and nothing
    else writes to the last position except its own embedding and the previous-token head, which see the
    same tokens in both prompts. Patching that one head restores the whole logit difference."""
    model, tok = minigen.load(make_induction_gpt2(tmp_path / "ind", copy=20.0))
    clean, corrupt = tok.encode("a b c d e f a"), tok.encode("a g c d e f a")
    b, g = tok.encode("b")[0], tok.encode("g")[0]
    r = patching(model, clean, corrupt, answer=b, wrong=g, what="heads")
    assert r["logit_diff_clean"] > 1 and r["logit_diff_corrupted"] < -1
    restored = np.array(r["restored"])
    assert restored[1, 0] == pytest.approx(1, abs=1e-5)
    assert np.abs(restored[1, 1]) < 1e-6 and np.abs(restored[0]).max() < 0.5


# --- value-weighted attention ---------------------------------------------------------------------------------

def test_value_weighted_on_a_hand_built_case():
    a = np.array([[[1, 0, 0], [0.5, 0.5, 0], [0.8, 0.1, 0.1]]])      # (H=1, T=3, T)
    norms = np.array([[0.0, 2.0, 6.0]])                           # the sink sends nothing
    w = value_weighted(a, norms)
    np.testing.assert_allclose(w[0, 1], [0, 1, 0])
    np.testing.assert_allclose(w[0, 2], [0, 0.25, 0.75])          # 0.1*2 : 0.1*6
    assert np.all(w[0, 0] == 0)                                     # nothing sent at all: an empty row


@pytest.mark.parametrize("name", ["llama_gqa3", "gpt2", "qwen2"])
def test_value_norms_are_the_trace_values_through_w_o(name):
    """‖v_j W_O[:, h]‖ from the value rows the step-by-step trace computes on its own (head_weights slices)."""
    model = minigen.load(FIXTURES_DIR / name)[0]
    ids = np.array(minigen.load(FIXTURES_DIR / name)[1].encode("The cat sat on the mat"))
    norms = value_norms(model, ids)
    c = model.config
    for layer, head in [(0, 1), (c.n_layers - 1, c.n_heads - 1)]:
        steps, _ = trace_head(model, ids, layer, head)
        wo = dense(model.params["layers"][layer]["wo"])[:, head * c.head_dim:(head + 1) * c.head_dim]   # (D, d)
        np.testing.assert_allclose(norms[layer, head], np.linalg.norm(steps.v @ wo.T, axis=-1), rtol=1e-4)


# --- the commands ------------------------------------------------------------------------------------------------

PROMPT = "The cat sat on the mat. The cat sat on the"


def run_json(*args):
    r = cli(*args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_lens_command():
    r = cli("lens", PROMPT, "--model", FIXTURES_DIR / "gpt2", "-k", 3)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[2].split()[0] == "embed" and lines[-1].split()[0] == "1" and len(lines) == 2 + 3
    j = run_json("lens", PROMPT, "--model", FIXTURES_DIR / "gpt2", "-k", 3, "--target", "#7")
    assert j["command"] == "lens" and j["target"]["id"] == 7 and len(j["rows"]) == 3
    model, tok = minigen.load(FIXTURES_DIR / "gpt2")
    ids = tok.encode(PROMPT)
    lens = logit_lens(model, ids)[:, -1].astype(np.float64)
    p = np.exp(lens - lens.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    for row, probs in zip(j["rows"], p):
        assert row["target_p"] == pytest.approx(probs[7], rel=1e-4)
        assert row["target_rank"] == int((probs > probs[7]).sum()) + 1
        assert [t["id"] for t in row["top"]] == list(np.argsort(-probs)[:3])


def test_ablate_command_and_sweep():
    j = run_json("ablate", PROMPT, "--model", FIXTURES_DIR / "llama_gqa3", "--heads", "0.3,2.*", "--mode", "mean")
    assert [c["name"] for c in j["components"]] == ["0.3"] + [f"2.{h}" for h in range(9)]
    model, tok = minigen.load(FIXTURES_DIR / "llama_gqa3")
    ids = tok.encode(PROMPT)
    after = ablated_logits(model, ids, [(0, 3)] + [(2, h) for h in range(9)], "mean")[-1].astype(np.float64)
    logp = after - np.log(np.exp(after - after.max()).sum()) - after.max()
    assert j["logp_after"] == pytest.approx(logp[j["target"]["id"]], abs=1e-4)
    assert j["kl"] > 0 and j["top_before"][0]["id"] == j["target"]["id"]
    s = run_json("ablate", PROMPT, "--model", FIXTURES_DIR / "gpt2", "--sweep", "heads")
    assert len(s["effects"]) == 8 and [e["kl"] for e in s["effects"]] == sorted((e["kl"] for e in s["effects"]), reverse=True)
    gpt2, tok2 = minigen.load(FIXTURES_DIR / "gpt2")
    for e in s["effects"]:   # each row of the sweep (its logits made 64 rows to a product) is that head's ablation alone
        alone = ablation(gpt2, tok2.encode(PROMPT), [Component("head", e["layer"], e["head"])], "zero", -1, s["target"]["id"])
        assert e["kl"] == pytest.approx(alone["kl"], rel=1e-4, abs=1e-7)
        assert e["delta_logp"] == pytest.approx(alone["delta_logp"], rel=1e-4, abs=1e-6)
    r = cli("ablate", PROMPT, "--model", FIXTURES_DIR / "gpt2", "--sweep", "mlp", "--rank", "logp")
    assert r.exit_code == 0 and "ranked by the drop in log p" in r.output, r.output


def test_patch_command():
    clean, corrupt = "The cat sat on the mat. The cat", "The mat sat on the mat. The cat"
    model, tok = minigen.load(FIXTURES_DIR / "gpt2")
    top = np.argsort(-model.logits(tok.encode(clean))[-1])
    answers = ["--answer", f"#{top[0]}", "--wrong", f"#{top[1]}"]
    r = cli("patch", clean, corrupt, "--model", FIXTURES_DIR / "gpt2", *answers)
    assert r.exit_code == 0, r.output
    assert "restored" in r.output and "largest:" in r.output
    j = run_json("patch", clean, corrupt, "--model", FIXTURES_DIR / "gpt2", "--what", "resid", *answers)
    assert j["what"] == "resid" and len(j["restored"]) == 2 and len(j["restored"][0]) == len(j["clean_tokens"])
    same = [c["index"] for c in j["columns"] if c["clean"] == c["corrupted"]]
    assert 0 < len(same) < len(j["columns"])
    assert all(j["restored"][0][q] == 0 for q in same)               # layer 0: a same token patches nothing
    assert j["logit_diff_clean"] != j["logit_diff_corrupted"]


def test_dla_command():
    j = run_json("dla", PROMPT, "--model", FIXTURES_DIR / "gemma", "--target", "#5", "--vs", "#9")
    assert j["target"]["id"] == 5 and j["vs"]["id"] == 9 and j["total"] == pytest.approx(j["logit"], abs=1e-4)
    r = cli("dla", PROMPT, "--model", FIXTURES_DIR / "gemma")
    assert r.exit_code == 0 and "sum of the parts" in r.output, r.output


@pytest.mark.parametrize("args,words", [
    (["ablate", PROMPT], ["nothing to ablate"]),
    (["ablate", PROMPT, "--heads", "9.0"], ["--heads", "layer 9 out of range"]),
    (["ablate", PROMPT, "--heads", "0.1", "--sweep", "heads"], ["--sweep"]),
    (["ablate", PROMPT, "--heads", "x"], ["--heads", "LAYER.HEAD"]),
    (["lens", PROMPT, "--target", "cat sat"], ["--target", "not one"]),
    (["patch", PROMPT, "The cat"], ["same length"]),
    (["patch", PROMPT, PROMPT, "--answer", "#3", "--wrong", "#3"], ["same token"]),
    (["patch", PROMPT, PROMPT, "--answer", "#3", "--wrong", "#4"], ["nothing to restore"]),
    (["dla", PROMPT, "--vs", "#100000"], ["--vs", "outside the vocabulary"]),
])
def test_bad_arguments(args, words):
    r = cli(*args, "--model", FIXTURES_DIR / "gpt2")
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    for w in words:
        assert w in r.output, r.output


@pytest.mark.parametrize("name", ["qwen3_5", "lfm2", "falcon_h1", "granitemoehybrid", "granitemoe"])
def test_hybrid_and_expert_runs_resumed_together_equal_each_alone(name):
    """The same on hybrids (recurrent layers' states, one per run) and routed experts: every layer's
    mixer and MLP ablated alone (effects.ablated_runs), against resume one run at a time. The two paths sum
    in their own orders (one run's few rows go through the numba twins once any test loaded the kernels, a
    batch's through NumPy), and Qwen3.5's fixture carries a last digit through its recurrence into ~2e-5 of a
    row's scale (transformers' own float32 is 1.9e-4 from float64 on it): compared within 1e-4 of the scale,
    the project's standard for logits. A run given another run's state or ablation is off by O(1)."""
    m = minigen.load(FIXTURES_DIR / name)[0]
    x, _ = layer_inputs(m, IDS)
    comps = every("attn", m.config) + every("mlp", m.config)
    for c, got in zip(*ablated_runs(m, x, comps, "mean")):
        want = resume(m, x[c.layer], c.layer, Intervention(changes_for([c], "mean")))
        scale = np.abs(want).max(axis=-1, keepdims=True)
        assert (np.abs(got - want) <= 1e-4 * scale).all(), (str(c), (np.abs(got - want) / scale).max())

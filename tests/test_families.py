"""Every family through every command, and what is particular to each (parity itself: test_parity.py).

One fixture per family (tests/fixtures, transformers 5.24 references): generate's greedy text equals
transformers', --dump-attention --attn-verify, the census, the induction probe and the HTML page run,
and `trace` matches the model while showing the family's own steps (q/k norm, scale, soft-cap,
partial or absent RoPE, no pre-norm).
"""
import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import minigen
from minigen.resolve import load_model
from minigen.cli import main
from minigen.errors import MinigenError
from minigen.inspect import load_attention

from conftest import FIXTURES, FIXTURES_DIR, HYBRID_FIXTURES, load_reference

ONE_PER_FAMILY = sorted({family: name for name, family in sorted(FIXTURES.items(), reverse=True)}.values())


def cli(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def test_every_family_has_its_fixtures():
    """The one check that a family is covered: transformers' parity fixtures (reference.npz) in both
    config spellings where transformers 5 writes the new one, listed in conftest.FIXTURES under the
    model_type their config.json says, and an inspect reference (inspect_reference.npz)."""
    from minigen.checkpoint.families import FAMILIES
    assert set(FIXTURES.values()) | set(HYBRID_FIXTURES.values()) == set(FAMILIES)
    spellings = {}
    for name, family in {**FIXTURES, **HYBRID_FIXTURES}.items():
        raw = json.loads((FIXTURES_DIR / name / "config.json").read_text())
        text_type = raw.get("text_config", {}).get("model_type")  # a multimodal wrapper's language model
        assert family in (raw["model_type"], text_type) and (FIXTURES_DIR / name / "reference.npz").is_file(), name
        new = "rope_parameters" in raw or ("dtype" in raw and "torch_dtype" not in raw)
        spellings.setdefault(family, set()).add("5.x" if new else "4.x")
    new_families = {"gemma2", "gemma3_text", "qwen3", "phi3", "olmo2", "gpt_neox", "smollm3", "qwen3_5_text",
                    "lfm2", "granitemoehybrid", "falcon_h1", "granite", "granitemoe", "olmo3", "ministral3"}
    assert all(spellings[f] == {"5.x", "4.x"} for f in new_families), spellings
    inspected = {FIXTURES[p.parent.name] for p in FIXTURES_DIR.glob("*/inspect_reference.npz")} | \
        {HYBRID_FIXTURES[p.parent.name] for p in FIXTURES_DIR.glob("*/reference_inspect.npz")}   # test_hybrids.py's
    assert inspected == set(FAMILIES), set(FAMILIES) - inspected


@pytest.mark.parametrize("name", ONE_PER_FAMILY)
def test_generate_dump_census_probe_html(name, tmp_path):
    ref = load_reference(name)
    model, tok = minigen.load(FIXTURES_DIR / name)
    prompt = tok.decode(ref["input_ids"], skip_special_tokens=True)
    if tok.encode(prompt) != ref["input_ids"].tolist():
        pytest.fail(f"{name}: the prompt does not round-trip through the tokenizer")
    dump = tmp_path / "d.npz"
    r = cli("generate", prompt, "--model", FIXTURES_DIR / name, "-n", 6, "--temp", 0, "--ignore-eos", "-q",
            "--dump-attention", dump, "--attn-verify")
    assert r.exit_code == 0, r.output
    assert r.stdout == tok.decode(ref["greedy_ids"][:6])
    assert "all" in r.stderr and "rows match an uncached recomputation" in r.stderr
    d = load_attention(dump)
    assert len(d["layers"]) == model.config.n_layers
    html = tmp_path / "p.html"
    r = cli("attention", prompt, "--model", FIXTURES_DIR / name, "--probe", "induction", "--probe-length", 8,
            "--html", html)
    assert r.exit_code == 0, r.output
    assert "strongest heads" in r.output and "induction" in r.output
    assert html.read_text().startswith("<!doctype html>")


TRACE_STEPS = {  # fixture, layer: what its trace must say
    ("gemma2", 0): ["soft-capped: 5 * tanh(s / 5)", "x 0.2041 = 1/sqrt(24) (query_pre_attn_scalar", "sliding window 16"],
    ("gemma3_text", 0): ["after the q norm (RMSNorm over the head's d_k dims", "linear scaling", "theta 200000"],
    ("gemma3_text", 1): ["after the q norm", "theta 3000", "sliding window"],
    ("qwen3", 1): ["after the q norm (RMSNorm over the head's d_k dims"],
    ("phi3", 0): ["dims 0-7 rotate, the rest pass through", "the first 8 of 16 dims"],
    ("olmo2", 1): ["RMSNorm over all", "as it is (olmo2 norms attention's output"],
    ("gpt_neox", 0): ["LayerNorm", "the first 8 of 16 dims", "q bias b_Q"],
    ("smollm3", 0): ["no RoPE in this layer"],
    ("smollm3", 1): ["after RoPE"],
}


@pytest.mark.parametrize("name,layer", sorted(TRACE_STEPS))
def test_trace_shows_the_familys_steps_and_matches(name, layer):
    cfg = load_model(FIXTURES_DIR / name).config
    r = cli("trace", "The cat sat on the mat, and the cat sat", "--model", FIXTURES_DIR / name,
            "--layer", layer, "--head", cfg.n_heads - 1)
    assert r.exit_code == 0, r.output
    assert "equal within" in r.output
    for words in TRACE_STEPS[name, layer]:
        assert words in r.output, (words, r.output)
    assert ("after RoPE" in r.output) == (cfg.rope[layer] is not None)


def test_family_features_really_change_the_output(tmp_path):
    """Each feature, switched off in config.json, moves the logits away from transformers' (so the
    parity tests could not pass with the feature ignored)."""
    edits = [
        ("gemma2_v4", {"attn_logit_softcapping": None}), ("gemma2", {"final_logit_softcapping": None}),
        ("gemma2", {"query_pre_attn_scalar": 16}), ("gemma3_text_v4", {"rope_local_base_freq": 1000000.0}),
        ("gemma3_text_v4", {"sliding_window_pattern": 6}), ("phi3_longrope", {"rope_parameters": None}),
        ("phi3", {"sliding_window": None}), ("gpt_neox_v4", {"use_parallel_residual": False}),
        ("gpt_neox_v4", {"rotary_pct": 1.0}), ("smollm3_v4", {"no_rope_layers": [1, 1, 1, 1]}),
        ("qwen3", {"head_dim": None}),
    ]
    for i, (name, edit) in enumerate(edits):
        path = shutil.copytree(FIXTURES_DIR / name, tmp_path / f"{i}")
        (path / "config.json").write_text(json.dumps({**json.loads((path / "config.json").read_text()), **edit}))
        ref = load_reference(name)
        try:
            logits = load_model(path).logits(ref["input_ids"])
        except MinigenError:
            continue  # the edit made the weights impossible (qwen3's head_dim): also caught
        assert np.abs(logits - ref["logits"]).max() > 1e-2, (name, edit)


@pytest.mark.parametrize("edit,words", [
    ({"model_type": "gemma3_text", "use_bidirectional_attention": True}, ["use_bidirectional_attention"]),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, ["rope scaling type 'dynamic'"]),
    ({"rope_scaling": {"rope_type": "yarn", "factor": -2.0}}, ["'yarn'", "'factor'"]),
    ({"hidden_act": "gelu_quick"}, ["activation 'gelu_quick'"]),
    ({"layer_types": ["chunked_attention"] * 3}, ["layer_types"]),
    ({"model_type": "smollm3", "no_rope_layers": [1, 2, 1]}, ["no_rope_layers"]),
    ({"model_type": "phi3", "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}},
     ["longrope", "short_factor"]),
])
def test_unsupported_settings_name_the_field_and_value(edit, words, tmp_path):
    path = shutil.copytree(FIXTURES_DIR / "qwen3", tmp_path / "m")
    (path / "config.json").write_text(json.dumps({**json.loads((path / "config.json").read_text()), **edit}))
    with pytest.raises(MinigenError) as e:
        load_model(path)
    for w in words:
        assert w in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_longrope_generation_across_the_switch_equals_transformers_generate():
    """Phi-3 longrope: a 20-token prompt generated past original_max_position_embeddings (32). At the
    step that crosses it transformers re-runs the whole sequence with the long factors; so must we."""
    from minigen.generation.options import Options
    from minigen.generation.steps import generate_step
    ref = dict(np.load(FIXTURES_DIR / "phi3_longrope_v4" / "reference_generate.npz"))
    model = load_model(FIXTURES_DIR / "phi3_longrope_v4")
    steps = list(generate_step(model, ref["input_ids"], Options(max_tokens=len(ref["generate_ids"]), temp=0, ignore_eos=True)))
    assert [s.token for s in steps] == ref["generate_ids"].tolist()
    assert np.abs(np.stack([s.logits for s in steps]) - ref["generate_logits"]).max() <= 1e-4
    assert len(ref["input_ids"]) < model.config.rope[0].original_max < len(ref["input_ids"]) + len(steps)

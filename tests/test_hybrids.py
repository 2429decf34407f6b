"""Families whose layers are not all attention (Qwen3.5, LFM2, Granite 4.0(-H), Falcon-H1): their real
config.json files read by hand, the prompt in pieces = in one piece, and rolling a recurrent cache back.
Parity with transformers (logits, greedy, attention, cached = uncached) is test_parity.py's, on the same
fixtures (scripts/make_hybrid_fixtures.py)."""
from pathlib import Path

import numpy as np
import pytest

import minigen
from minigen.checkpoint.config import load_config, parse_config
from minigen.engine.cache import StateCache, checkpoint, truncate
from minigen.errors import MinigenError

from conftest import FIXTURES_DIR, HYBRID_FIXTURES, load_reference
from test_chat import forwards  # noqa: F401  (a fixture: every Model.forward call, logged)

REAL = Path(__file__).parent / "real_configs" / "hybrid"
PIECES = (0, 5, 23, 70)   # as scripts/make_hybrid_fixtures.py feeds transformers


def pieces(model, ids, bounds=PIECES) -> np.ndarray:
    cache = model.make_cache(8)
    bounds = list(bounds) + [len(ids)]
    return np.concatenate([model.forward(ids[a:b], cache) for a, b in zip(bounds, bounds[1:])])


# --- real config.json files, read by hand -----------------------------------------------------------

def test_qwen3_5_as_published():
    c = load_config(REAL / "Qwen3.5-0.8B.json")
    assert (c.wrapper, c.model_type) == ("qwen3_5", "qwen3_5_text")      # the text model of the published wrapper
    assert (c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads, c.head_dim) == (24, 1024, 8, 2, 256)
    assert c.layer_mixers == ("gated_delta", "gated_delta", "gated_delta", "attention") * 6
    m = c.delta_net
    assert (m.key_heads, m.value_heads, m.key_dim, m.value_dim, m.conv_kernel) == (16, 16, 128, 128, 4)
    assert (c.intermediate_size, c.vocab_size, c.tie_word_embeddings, c.eos_token_ids) == (3584, 248320, True, (248044,))
    assert {(r.theta, r.dim) for r in c.rope} == {(1e7, 64)}          # 25 % of 256 rotates
    assert c.attn_gate and c.qk_norm == "head" and c.norm_eps == 1e-6


def test_lfm2_350m():
    c = load_config(REAL / "LFM2-350M.json")
    assert (c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads, c.head_dim) == (16, 1024, 16, 8, 64)
    attn = [i for i, k in enumerate(c.layer_mixers) if k == "attention"]
    assert attn == [2, 5, 8, 10, 12, 14] and set(c.layer_mixers) == {"attention", "short_conv"}
    assert c.intermediate_size == 4608           # block_ff_dim 6656 -> int(2 * 6656 / 3) = 4437 -> 18 x 256
    assert (c.short_conv.kernel, c.short_conv.bias, c.tie_word_embeddings) == (3, False, True)
    assert {r.theta for r in c.rope} == {1e6} and c.norm_eps == 1e-5 and c.eos_token_ids == (7,)


def test_falcon_h1_tiny():
    c = load_config(REAL / "Falcon-H1-Tiny-90M-Instruct.json")
    assert (c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads, c.head_dim) == (24, 512, 8, 2, 64)
    assert c.layer_mixers == ("attention+mamba2",) * 24
    m = c.mamba
    assert (m.heads, m.head_dim, m.groups, m.state_size, m.conv_kernel, m.inner) == (24, 32, 1, 64, 4, 768)
    assert (m.norm, m.conv_bias, m.in_bias, m.out_bias) == (False, True, False, False)
    assert (c.embed_multiplier, c.logits_multiplier) == (0.11083984375, 0.078125)
    assert c.weight_scales == ()                 # every other multiplier is 1 in this checkpoint
    assert {r.theta for r in c.rope} == {1e11} and c.eos_token_ids == (228, 11)


def granite(**fields) -> dict:
    raw = {"model_type": "granitemoehybrid", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 4,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 0, "mamba_n_heads": 8,
           "mamba_d_head": 16, "mamba_d_state": 32, "layer_types": ["mamba", "attention", "mamba", "mamba"],
           "shared_intermediate_size": 96, "attention_multiplier": 0.0078125, "embedding_multiplier": 12.0,
           "residual_multiplier": 0.22, "logits_scaling": 8.0, "position_embedding_type": "nope"}
    return {**raw, **fields}


def test_granite_hybrid_reads_both_layer_type_spellings():
    old, new = parse_config(granite()), parse_config(granite(layer_types=["linear_attention", "full_attention",
                                                                          "linear_attention", "linear_attention"]))
    assert old.layer_mixers == new.layer_mixers == ("mamba2", "attention", "mamba2", "mamba2")
    assert old.rope == (None,) * 4                # NoPE
    assert (old.attn_scale, old.embed_multiplier, old.residual_multiplier, old.logits_multiplier) == \
        (0.0078125, 12.0, 0.22, 0.125)
    assert (old.intermediate_size, old.mamba.inner, old.mamba.groups) == (96, 128, 1)


def test_granite_hybrid_with_routed_experts_reads_both_mlps():
    """Granite 4.0-H Tiny's MLP sizes (64 experts of 512, top 6, a shared MLP of 1024): the experts' width is
    intermediate_size, the shared one's shared_intermediate_size; num_local_experts 0 is the shared MLP alone."""
    c = parse_config(granite(num_local_experts=64, num_experts_per_tok=6, intermediate_size=512,
                             shared_intermediate_size=1024))
    assert (c.mlp, c.n_experts, c.experts_per_token, c.router) == ("moe", 64, 6, "topk_softmax")
    assert (c.intermediate_size, c.shared_intermediate_size) == (512, 1024)
    dense = parse_config(granite(intermediate_size=512))
    assert (dense.mlp, dense.intermediate_size, dense.shared_intermediate_size) == ("gated", 96, 0)
    absent = {k: v for k, v in granite().items() if k != "num_local_experts"}   # transformers' defaults: 8, top 2
    assert (parse_config(absent).n_experts, parse_config(absent).experts_per_token) == (8, 2)


@pytest.mark.parametrize("fields, message", [
    (dict(num_local_experts=4, num_experts_per_tok=6), "'num_experts_per_tok' should be at most num_local_experts"),
    (dict(num_local_experts=4, num_experts_per_tok=0), "'num_experts_per_tok' should be a positive integer"),
    (dict(num_local_experts=-2), "'num_local_experts' should be a positive integer"),
    (dict(layer_types=["mamba", "conv", "mamba", "mamba"]), "layer_types"),
    (dict(mamba_d_head=24), "mamba_d_head"),
    (dict(position_embedding_type="alibi"), "position_embedding_type"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(time_step_limit=[0.0]), "time_step_limit"),
])
def test_granite_settings_minigen_does_not_run_are_refused(fields, message):
    with pytest.raises(MinigenError, match=message):
        parse_config(granite(**fields))


def test_a_kernel_the_weights_contradict_is_refused_naming_the_tensor(tmp_path):
    import json
    import shutil
    shutil.copytree(FIXTURES_DIR / "lfm2", tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["conv_L_cache"] = 4
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(MinigenError, match=r"conv\.conv\.weight.*shape \[32, 1, 3\], expected \[32, 1, 4\]"):
        minigen.load(tmp_path / "m")


def test_an_expert_count_the_weights_contradict_is_refused_naming_the_tensor(tmp_path):
    import json
    import shutil
    shutil.copytree(FIXTURES_DIR / "granitemoehybrid_moe", tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["num_local_experts"] = 6                                     # the weights hold 8
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(MinigenError, match=r"block_sparse_moe\.\w+(\.\w+)*\.weight.*shape \[8, .*expected \[6, "):
        minigen.load(tmp_path / "m")
    cfg["num_local_experts"] = 0                                     # dense: the experts' tensors are unexpected
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(MinigenError, match=r"unexpected tensor 'model\.layers\.0\.block_sparse_moe\."):
        minigen.load(tmp_path / "m")


# --- the prompt in pieces, and rolling back --------------------------------------------------------

@pytest.mark.parametrize("name", sorted(HYBRID_FIXTURES))
def test_prompt_in_pieces_equals_one_piece(name):
    """minigen over the prompt in 4 pieces (pieces shorter than the conv kernel, and crossing the
    chunks) against minigen in one piece. Gated DeltaNet's two algorithms (chunked for a prompt, a
    step for one token) are the same recurrence in another order: on these tiny random models they
    differ by up to ~1e-4, as transformers' own (reference logits_pieces) differ by up to 5e-5."""
    model, _ = minigen.load(FIXTURES_DIR / name)
    ref = load_reference(name)
    whole = model.logits(ref["input_ids"])
    tol = 2e-4 if model.config.delta_net else 1e-5
    assert np.abs(pieces(model, ref["input_ids"]) - whole).max() <= tol
    assert np.abs(ref["logits_pieces"] - ref["logits"]).max() <= 1e-4   # transformers' own, for the record


@pytest.mark.parametrize("name", ["qwen3_5_text", "lfm2", "granitemoehybrid", "falcon_h1"])
def test_rolling_back_to_a_checkpoint_then_feeding_again(name):
    """Back to a snapshot, the same tokens fed again give exactly what they gave the first time."""
    model, _ = minigen.load(FIXTURES_DIR / name)
    ids = load_reference(name)["input_ids"]
    fresh = model.make_cache(8)
    model.forward(ids[:30], fresh)
    expected = model.forward(ids[30:], fresh)       # the first 30, then the rest, never rolled back
    cache = model.make_cache(8)
    model.forward(ids[:30], cache)
    checkpoint(cache)
    model.forward(ids[30:50], cache)
    assert truncate(cache, 40) == 30               # no snapshot at 40: back to the one at 30
    assert {layer.offset for layer in cache} == {30}
    assert np.array_equal(model.forward(ids[30:], cache), expected)
    assert truncate(cache, 20) == 0                # before every snapshot: start afresh
    assert np.array_equal(model.forward(ids, cache), model.logits(ids))


def test_state_cache_keeps_its_last_snapshots():
    c = StateCache((2, 3), (1, 2, 2), keep=2)
    for n in (1, 2, 3):
        c.update(c.tail + n, c.state + n, 1)
        c.checkpoint()
    assert sorted(c.snapshots) == [2, 3]
    assert c.keepable(2) == 2 and c.keepable(1) == 0
    c.truncate(2)
    assert c.offset == 2 and c.tail[0, 0] == 3 and sorted(c.snapshots) == [2]
    with pytest.raises(ValueError, match="no snapshot"):
        c.truncate(1)


# --- chat: every reply equals generation on the whole conversation, the recurrent state carried over --

@pytest.mark.parametrize("name", ["lfm2", "qwen3_5_text"])
def test_chat_replies_equal_generate_and_reuse_the_snapshot(name, forwards):
    from test_chat import LINES, SYSTEM, chat, flags, prefills, reference
    path, options = FIXTURES_DIR / name, dict(max_tokens=8, ignore_eos=True)
    replies, renders, _ = reference(path, LINES, SYSTEM, **options)
    forwards.clear()
    r = chat(path, "--system", SYSTEM, *flags(options), input="\n".join(LINES) + "\n")
    assert r.exit_code == 0, r.output
    assert r.stdout == "".join(reply + "\n" for reply in replies)
    for t, (fed, offset) in enumerate(prefills(forwards, renders)):
        if t:  # the snapshot at the end of the previous turn: only the reply's end and the new message computed
            assert offset >= len(renders[t - 1])


def test_chat_with_a_template_that_rewrites_earlier_turns(tmp_path, forwards):
    """Qwen3's template renders an earlier reply without the <think></think> block the generation prompt
    had: the common prefix ends before the snapshot at the end of that turn, so the recurrent layers
    restart from an earlier one (here: none, 0) and the reply still equals generation afresh."""
    import shutil
    from test_chat import LINES, SYSTEM, chat, flags, prefills, reference
    path = tmp_path / "qwen3_5_template"
    shutil.copytree(FIXTURES_DIR / "qwen3_5_text", path)
    template = (FIXTURES_DIR / "chat_templates" / "Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    (path / "chat_template.jinja").write_text("{%- set enable_thinking = false %}\n" + template, encoding="utf-8")
    options = dict(max_tokens=8, ignore_eos=True)
    replies, renders, _ = reference(path, LINES[:2], SYSTEM, **options)
    forwards.clear()
    r = chat(path, "--system", SYSTEM, *flags(options), input="\n".join(LINES[:2]) + "\n")
    assert r.exit_code == 0 and r.stdout == "".join(reply + "\n" for reply in replies)
    (_, _), (_, offset) = prefills(forwards, renders)
    assert offset == 0                                   # no snapshot inside the shared prefix


# --- inspection --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, layer, steps", [("qwen3_5_text", 1, "the delta rule"), ("lfm2", 0, "depthwise conv"),
                                                ("granitemoehybrid", 2, "exp(Δ A) S + Δ x Bᵀ")])
def test_trace_on_a_recurrent_layer_shows_one_step_checked_against_the_model(name, layer, steps):
    from click.testing import CliRunner
    from minigen.cli import main
    r = CliRunner().invoke(main, ["trace", "Once upon a time there was a robot", "--model", str(FIXTURES_DIR / name),
                                  "--layer", str(layer), "--head", "1", "--token", "-1"])
    assert r.exit_code == 0, r.output
    assert steps in r.stdout and "state before this token" in r.stdout and "equal within" in r.stdout


def test_attention_commands_cover_the_layers_with_attention(tmp_path):
    from click.testing import CliRunner
    from minigen.cli import main
    from minigen.inspect import load_attention
    path = FIXTURES_DIR / "qwen3_5_text"
    r = CliRunner().invoke(main, ["attention", "Once upon a time there was a robot", "--model", str(path)])
    assert r.exit_code == 0 and "layers without attention: 0-2 (gated_delta)" in r.stdout
    assert "    3    0 " in r.stdout
    r = CliRunner().invoke(main, ["attention", "Once upon a time", "--model", str(path), "--attn-layers", "1"])
    assert r.exit_code != 0 and "layer 1 has no attention (its token mixer is gated_delta)" in r.output
    dump = tmp_path / "d.npz"
    r = CliRunner().invoke(main, ["generate", "Once upon a time", "--model", str(path), "-n", "4", "--temp", "0",
                                  "-q", "--dump-attention", str(dump), "--attn-verify"])
    assert r.exit_code == 0, r.output
    d = load_attention(dump)
    assert sorted(d["layers"]) == [3] and d["meta"]["mixers"] == ["gated_delta"] * 3 + ["attention"]


@pytest.mark.parametrize("name", sorted(p.parent.name for p in FIXTURES_DIR.glob("*/reference_inspect.npz")))
def test_lens_and_ablation_equal_transformers_hooks(name):
    """The logit lens against transformers' output_hidden_states, and zeroing one layer's token mixer
    (a Gated DeltaNet, short conv or Mamba2 layer ablated like a head) against forward hooks that zero
    the same modules' outputs (scripts/make_hybrid_fixtures.py --inspect)."""
    from minigen.inspect import logit_lens
    from minigen.inspect.effects import Component, changes_for
    from minigen.inspect.hooks import Intervention, final_residual, logits_of
    model, _ = minigen.load(FIXTURES_DIR / name)
    ids = load_reference(name)["input_ids"]
    with np.load(FIXTURES_DIR / name / "reference_inspect.npz") as z:
        ref = {k: z[k] for k in z.files}
    assert np.abs(logit_lens(model, ids) - ref["lens"]).max() <= 1e-4
    layer = int(ref["ablated_layer"])
    x = final_residual(model, ids, Intervention(changes_for([Component("attn", layer)], "zero")))
    assert np.abs(logits_of(model, x) - ref["ablated"]).max() <= 1e-4


@pytest.mark.parametrize("name", ["qwen3_5_text", "lfm2", "granitemoehybrid", "falcon_h1"])
def test_speculative_decoding_keeps_the_greedy_tokens(name):
    """Rejected drafts cannot be dropped from a recurrent state: the step snapshots it before verifying,
    returns there and refeeds what was kept. The tokens stay those of plain greedy decoding."""
    from test_speculative import PLANS, Scripted, plain, spec
    from minigen.generation import speculative as S
    model, _ = minigen.load(FIXTURES_DIR / name)
    ids = load_reference(name)["input_ids"].tolist()
    truth, _ = plain(model, ids, max_tokens=16)
    for plan in PLANS[::3]:
        tokens, finish, offset, _ = spec(model, ids, Scripted(truth, len(ids), plan, model.config.vocab_size),
                                         max_tokens=16)
        assert tokens == truth and finish == "length", (name, plan)
    assert spec(model, ids, S.PromptLookup(8), max_tokens=16)[0] == truth


def test_info_names_each_layers_mixer_and_what_is_not_loaded():
    from click.testing import CliRunner
    from minigen.cli import main
    r = CliRunner().invoke(main, ["info", "--model", str(FIXTURES_DIR / "qwen3_5")])
    assert r.exit_code == 0, r.output
    assert "token mixers:      gated_delta in layers 0-2; attention in layers 3" in r.stdout
    assert "vision:" in r.stdout and "not loaded and not counted above" in r.stdout
    r = CliRunner().invoke(main, ["info", "--model", str(FIXTURES_DIR / "lfm2")])
    assert "short_conv in layers 0,2; attention in layers 1,3" in r.stdout and "vision:" not in r.stdout

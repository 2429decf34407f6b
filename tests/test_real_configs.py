"""The config.json files of the checkpoints users really download (tests/real_configs/, see its
README.md), read by minigen the way a person reads them by hand; scaled-down copies of each
written under the real checkpoint's tensor names and file layout load and run; and the
tests/fixtures/real_* checkpoints (scripts/make_real_config_fixtures.py) match transformers.

The expected numbers below are written by hand from the real config.json files, not computed.
"""
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import minigen
from minigen.checkpoint.config import load_config
from conftest import greedy

sys.path.insert(0, str(Path(__file__).parent / "real_configs"))
import shrink  # noqa: E402

FIXTURES_DIR = Path(__file__).parent / "fixtures"

LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192.0}

# name: layers, heads, kv heads, head_dim, hidden, intermediate, vocab, rope theta, rope scaling,
#       tied, sliding window (None = full attention on every layer), activation, eos ids, norm eps
EXPECTED = {
    "gpt2": dict(layers=12, heads=12, kv=12, hd=64, hidden=768, inter=3072, vocab=50257, theta=None,
                 scaling=None, tied=True, window=None, act="gelu_new", eos=(50256,), eps=1e-5),
    "distilgpt2": dict(layers=6, heads=12, kv=12, hd=64, hidden=768, inter=3072, vocab=50257, theta=None,
                       scaling=None, tied=True, window=None, act="gelu_new", eos=(50256,), eps=1e-5),
    "SmolLM2-135M": dict(layers=30, heads=9, kv=3, hd=64, hidden=576, inter=1536, vocab=49152, theta=100000.0,
                         scaling=None, tied=True, window=None, act="silu", eos=(0,), eps=1e-5),
    "SmolLM2-135M-Instruct": dict(layers=30, heads=9, kv=3, hd=64, hidden=576, inter=1536, vocab=49152,
                                  theta=100000.0, scaling=None, tied=True, window=None, act="silu", eos=(2,), eps=1e-5),
    "SmolLM2-360M": dict(layers=32, heads=15, kv=5, hd=64, hidden=960, inter=2560, vocab=49152, theta=100000.0,
                         scaling=None, tied=True, window=None, act="silu", eos=(0,), eps=1e-5),
    "SmolLM2-1.7B-Instruct": dict(layers=24, heads=32, kv=32, hd=64, hidden=2048, inter=8192, vocab=49152,
                                  theta=130000.0, scaling=None, tied=True, window=None, act="silu", eos=(2,), eps=1e-5),
    "SmolLM-135M": dict(layers=30, heads=9, kv=3, hd=64, hidden=576, inter=1536, vocab=49152, theta=10000.0,
                        scaling=None, tied=True, window=None, act="silu", eos=(0,), eps=1e-5),
    "Qwen2.5-0.5B": dict(layers=24, heads=14, kv=2, hd=64, hidden=896, inter=4864, vocab=151936, theta=1e6,
                         scaling=None, tied=True, window=None, act="silu", eos=(151643,), eps=1e-6),
    "Qwen2.5-0.5B-Instruct": dict(layers=24, heads=14, kv=2, hd=64, hidden=896, inter=4864, vocab=151936,
                                  theta=1e6, scaling=None, tied=True, window=None, act="silu", eos=(151645,), eps=1e-6),
    "Qwen2.5-1.5B-Instruct": dict(layers=28, heads=12, kv=2, hd=128, hidden=1536, inter=8960, vocab=151936,
                                  theta=1e6, scaling=None, tied=True, window=None, act="silu", eos=(151645,), eps=1e-6),
    "Qwen2-0.5B": dict(layers=24, heads=14, kv=2, hd=64, hidden=896, inter=4864, vocab=151936, theta=1e6,
                       scaling=None, tied=True, window=None, act="silu", eos=(151643,), eps=1e-6),
    "Llama-3.2-1B": dict(layers=16, heads=32, kv=8, hd=64, hidden=2048, inter=8192, vocab=128256, theta=500000.0,
                         scaling=LLAMA3, tied=True, window=None, act="silu", eos=(128001,), eps=1e-5),
    "Llama-3.2-1B-Instruct": dict(layers=16, heads=32, kv=8, hd=64, hidden=2048, inter=8192, vocab=128256,
                                  theta=500000.0, scaling=LLAMA3, tied=True, window=None, act="silu",
                                  eos=(128001, 128008, 128009), eps=1e-5),
    "Llama-3.2-3B-Instruct": dict(layers=28, heads=24, kv=8, hd=128, hidden=3072, inter=8192, vocab=128256,
                                  theta=500000.0, scaling=LLAMA3, tied=True, window=None, act="silu",
                                  eos=(128001, 128008, 128009), eps=1e-5),
    "TinyLlama-1.1B-Chat-v1.0": dict(layers=22, heads=32, kv=4, hd=64, hidden=2048, inter=5632, vocab=32000,
                                     theta=10000.0, scaling=None, tied=False, window=None, act="silu", eos=(2,), eps=1e-5),
    "Mistral-7B-v0.1": dict(layers=32, heads=32, kv=8, hd=128, hidden=4096, inter=14336, vocab=32000, theta=10000.0,
                            scaling=None, tied=False, window=4096, act="silu", eos=(2,), eps=1e-5),
    "Mistral-7B-v0.3": dict(layers=32, heads=32, kv=8, hd=128, hidden=4096, inter=14336, vocab=32768, theta=1e6,
                            scaling=None, tied=False, window=None, act="silu", eos=(2,), eps=1e-5),
    # hub Gemma 1 configs say hidden_act "gelu" but mean the tanh approximation (transformers converts it)
    "gemma-2b": dict(layers=18, heads=8, kv=1, hd=256, hidden=2048, inter=16384, vocab=256000, theta=10000.0,
                     scaling=None, tied=True, window=None, act="gelu_pytorch_tanh", eos=(1,), eps=1e-6),
    "gemma-1.1-2b-it": dict(layers=18, heads=8, kv=1, hd=256, hidden=2048, inter=16384, vocab=256000, theta=10000.0,
                            scaling=None, tied=True, window=None, act="gelu_pytorch_tanh", eos=(1,), eps=1e-6),
    "gemma-7b": dict(layers=28, heads=16, kv=16, hd=256, hidden=3072, inter=24576, vocab=256000, theta=10000.0,
                     scaling=None, tied=True, window=None, act="gelu_pytorch_tanh", eos=(1,), eps=1e-6),
}

# The families added later: the same fields, plus what they add. `sliding` spells the layer pattern
# (S sliding, F full), `thetas` the RoPE base per layer (None: no RoPE there), `rope_dim` the rotated
# dims per head; scale is the attention scale's 1/x^2 (query_pre_attn_scalar or head_dim).
LONGROPE_4096_131072 = ("longrope", 4096, (1 + math.log(32) / math.log(4096)) ** 0.5)
GEMMA3_1B_PATTERN = "SSSSSF" * 4 + "SS"
EXPECTED.update({
    "gemma-2-2b": dict(layers=26, heads=8, kv=4, hd=256, hidden=2304, inter=9216, vocab=256000, theta=10000.0,
                       scaling=None, tied=True, window=4096, sliding="SF" * 13, act="gelu_pytorch_tanh", eos=(1,),
                       eps=1e-6, scale=256, softcaps=(50.0, 30.0)),
    "gemma-2-2b-it": dict(layers=26, heads=8, kv=4, hd=256, hidden=2304, inter=9216, vocab=256000, theta=10000.0,
                          scaling=None, tied=True, window=4096, sliding="SF" * 13, act="gelu_pytorch_tanh",
                          eos=(1, 107), eps=1e-6, scale=256, softcaps=(50.0, 30.0)),
    "gemma-3-270m": dict(layers=18, heads=4, kv=1, hd=256, hidden=640, inter=2048, vocab=262144, theta=None,
                         thetas=[1e6 if t == "F" else 1e4 for t in "SSSSSF" * 3], scaling=None, tied=True, window=512,
                         sliding="SSSSSF" * 3, act="gelu_pytorch_tanh", eos=(1,), eps=1e-6, scale=256, qk_norm="head"),
    "gemma-3-1b-it": dict(layers=26, heads=4, kv=1, hd=256, hidden=1152, inter=6912, vocab=262144, theta=None,
                          thetas=[1e6 if t == "F" else 1e4 for t in GEMMA3_1B_PATTERN], scaling=None, tied=True,
                          window=512, sliding=GEMMA3_1B_PATTERN, act="gelu_pytorch_tanh", eos=(1, 106), eps=1e-6,
                          scale=256, qk_norm="head"),
    "Qwen3-0.6B": dict(layers=28, heads=16, kv=8, hd=128, hidden=1024, inter=3072, vocab=151936, theta=1e6,
                       scaling=None, tied=True, window=None, act="silu", eos=(151645,), eps=1e-6, qk_norm="head"),
    "Phi-3-mini-4k-instruct": dict(layers=32, heads=32, kv=32, hd=96, hidden=3072, inter=8192, vocab=32064,
                                   theta=10000.0, scaling=None, tied=False, window=2047, act="silu", eos=(32000,),
                                   eps=1e-5),
    "Phi-3.5-mini-instruct": dict(layers=32, heads=32, kv=32, hd=96, hidden=3072, inter=8192, vocab=32064,
                                  theta=10000.0, scaling=None, longrope=LONGROPE_4096_131072, tied=False,
                                  window=262144, act="silu", eos=(32000,), eps=1e-5),
    "Phi-4-mini-instruct": dict(layers=32, heads=24, kv=8, hd=128, hidden=3072, inter=8192, vocab=200064,
                                theta=10000.0, scaling=None, longrope=LONGROPE_4096_131072, rope_dim=96, tied=True,
                                window=262144, act="silu", eos=(200020,), eps=1e-5),
    "SmolLM3-3B": dict(layers=36, heads=16, kv=4, hd=128, hidden=2048, inter=11008, vocab=128256, theta=None,
                       thetas=[None if i % 4 == 3 else 5e6 for i in range(36)], scaling=None, tied=True, window=None,
                       act="silu", eos=(128012,), eps=1e-6),
    "OLMo-2-0425-1B": dict(layers=16, heads=16, kv=16, hd=128, hidden=2048, inter=8192, vocab=100352, theta=500000.0,
                           scaling=None, tied=False, window=None, act="silu", eos=(100257,), eps=1e-6, qk_norm="proj",
                           post_norms_only=True),
    **{name: dict(layers=layers, heads=heads, kv=heads, hd=hidden // heads, hidden=hidden, inter=4 * hidden,
                  vocab=50304, theta=10000.0, scaling=None, rope_dim=hidden // heads // 4, tied=False, window=None,
                  act="gelu", eos=(0,), eps=1e-5, parallel=True)
       for name, layers, heads, hidden in [("pythia-70m", 6, 8, 512), ("pythia-160m", 12, 12, 768),
                                           ("pythia-410m", 24, 16, 1024), ("pythia-1b", 16, 8, 2048)]},
})
# Issue 19's families. Granite's attention scale is attention_multiplier (1/64: "scale" 4096); Qwen2.5 with the
# YaRN block its model card says to add (factor 4 over 32768; attention factor 0.1 ln 4 + 1).
YARN_QWEN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
             "attention_factor": 0.1 * math.log(4.0) + 1}
EXPECTED.update({
    "granite-3.1-1b-a400m-instruct": dict(layers=24, heads=16, kv=8, hd=64, hidden=1024, inter=512, vocab=49155,
                                          theta=1.5e6, scaling=None, tied=True, window=None, act="silu", eos=(0,),
                                          eps=1e-6, scale=4096, multipliers=(12.0, 0.22, 6.0), experts=(32, 8)),
    "granite-3.3-2b-instruct": dict(layers=40, heads=32, kv=8, hd=64, hidden=2048, inter=8192, vocab=49159,
                                    theta=1e7, scaling=None, tied=True, window=None, act="silu", eos=(), eps=1e-5,
                                    scale=4096, multipliers=(12.0, 0.22, 8.0)),
    "Qwen2.5-1.5B-Instruct-yarn": dict(layers=28, heads=12, kv=2, hd=128, hidden=1536, inter=8960, vocab=151936,
                                       theta=1e6, scaling=YARN_QWEN, tied=True, window=None, act="silu",
                                       eos=(151645,), eps=1e-6),
})
QKV_BIAS = ("Qwen2", "gpt2", "distilgpt2", "pythia")  # names starting so have q/k/v biases

REAL_FIXTURES = ["real_gpt2", "real_qwen2_5", "real_llama3_2", "real_mistral_v0_1", "real_gemma_7b"]


def test_every_real_config_has_expectations_and_a_layout():
    files = sorted(p.stem for p in (Path(__file__).parent / "real_configs").glob("*.json"))
    assert files == sorted(EXPECTED)
    assert set(shrink.NAMES) <= set(files)  # the real tensor layouts read off the hub, where known


def rope_scaling(r) -> tuple | None:
    """A Rope's scaling, or the expectation's dict, as comparable tuples (YaRN: its attention factor, rounded)."""
    if r is None or isinstance(r, dict):
        if r and r["rope_type"] == "yarn":
            return "yarn", r["factor"], r["original_max_position_embeddings"], round(r["attention_factor"], 12)
        return r and (r["rope_type"], r["factor"], r["low_freq_factor"], r["high_freq_factor"],
                      r["original_max_position_embeddings"])
    if r.kind == "yarn":
        return "yarn", r.factor, r.original_max, round(r.attention_factor, 12)
    return None if r.kind == "default" else (r.kind, r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_config_reads_as_by_hand(name):
    c = load_config(Path(__file__).parent / "real_configs" / f"{name}.json")
    e = EXPECTED[name]
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim) == (e["layers"], e["heads"], e["kv"], e["hd"])
    assert (c.hidden_size, c.intermediate_size, c.vocab_size) == (e["hidden"], e["inter"], e["vocab"])
    assert c.group == e["heads"] // e["kv"]
    if e["theta"] is not None:
        assert {r.theta for r in c.rope} == {e["theta"]}
    if "thetas" in e:
        assert [r and r.theta for r in c.rope] == e["thetas"]
    longrope = e.get("longrope")
    if longrope:
        assert {(r.kind, r.original_max) for r in c.rope} == {longrope[:2]}
        assert [r.attention_factor for r in c.rope] == pytest.approx([longrope[2]] * c.n_layers)
        assert {len(r.short_factor) for r in c.rope} == {len(r.long_factor) for r in c.rope} == {c.rope[0].dim // 2}
    else:
        assert {rope_scaling(r) for r in c.rope if r} == ({rope_scaling(e["scaling"])} if c.positions == "rope" else set())
    assert {r.dim for r in c.rope if r} <= {e.get("rope_dim", e["hd"])}
    assert c.tie_word_embeddings is e["tied"]
    sliding = e.get("sliding", ("S" if e["window"] is not None else "F") * c.n_layers)
    assert "".join("S" if c.is_sliding(i) else "F" for i in range(c.n_layers)) == sliding
    if e["window"] is not None:
        assert c.sliding_window == e["window"]
    assert c.attn_scale == pytest.approx(e.get("scale", e["hd"]) ** -0.5)
    assert (c.attn_softcap, c.final_softcap) == e.get("softcaps", (None, None))
    assert c.qk_norm == e.get("qk_norm")
    assert (c.pre_norms, c.post_norms) == ((False, True) if e.get("post_norms_only") else
                                           (True, c.model_type.startswith("gemma") and c.model_type != "gemma"))
    assert c.parallel_residual is e.get("parallel", False)
    assert c.act == e["act"]
    assert c.eos_token_ids == e["eos"]
    assert c.norm_eps == pytest.approx(e["eps"])
    assert c.positions == ("learned" if name.endswith("gpt2") else "rope")
    assert c.qkv_bias is name.startswith(QKV_BIAS)
    m = e.get("multipliers", (1.0, 1.0, 1.0))   # embedding, residual, logits_scaling
    assert (c.embed_multiplier, c.residual_multiplier, c.logits_multiplier) == (m[0], m[1], pytest.approx(1 / m[2]))
    assert (c.mlp == "moe", c.n_experts, c.experts_per_token) == ((True, *e["experts"]) if "experts" in e else
                                                                 (False, 0, 0))


@pytest.mark.parametrize("name", shrink.NAMES)
def test_scaled_down_copy_in_real_layout_loads_and_runs(name, tmp_path):
    """The real config with its sizes shrunk, random weights under the real checkpoint's tensor names
    (GPT-2: no prefix + attn.bias/masked_bias buffers; tied lm_head absent; shards + index), loads
    and gives the same finite logits as the same weights under save_pretrained's names."""
    cfg = shrink.shrink(shrink.real_config(name))
    weights = shrink.random_tensors(cfg, seed=3)
    real = shrink.write_checkpoint(tmp_path / "real", cfg, weights, shrink.LAYOUTS[name])
    model = minigen.load(real)[0]
    ids = np.random.default_rng(0).integers(0, cfg["vocab_size"], 16)
    logits = model.logits(ids)
    assert logits.shape == (16, shrink.VOCAB) and logits.dtype == np.float32
    assert np.isfinite(logits).all() and logits.std() > 1e-3
    plain = shrink.write_checkpoint(tmp_path / "plain", cfg, weights,
                                    {"prefix": "transformer.", "lm_head": True, "shards": 1})
    np.testing.assert_array_equal(minigen.load(plain)[0].logits(ids), logits)


@pytest.mark.parametrize("name", REAL_FIXTURES)
def test_real_fixture_matches_transformers(name, reference):
    ref = reference(name)
    model = minigen.load(FIXTURES_DIR / name)[0]
    record: list = []
    logits = model.forward(ref["input_ids"], model.make_cache(64), record=record)
    assert np.abs(logits - ref["logits"]).max() <= 1e-4
    assert np.abs(np.stack(record) - ref["attentions"]).max() <= 1e-5
    assert greedy(model, ref["input_ids"], len(ref["greedy_ids"]))[0] == ref["greedy_ids"].tolist()


@pytest.mark.parametrize("name, edit", [
    ("real_qwen2_5", {"use_sliding_window": True}),         # the tiny window must stay unused
    ("real_llama3_2", {"rope_scaling": None}),             # llama3 scaling must be applied
    ("real_mistral_v0_1", {"sliding_window": None}),       # the window must be applied
])
def test_real_fixtures_would_catch_a_misread_field(name, edit, reference, tmp_path):
    path = shutil.copytree(FIXTURES_DIR / name, tmp_path / name)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, **edit}))
    ref = reference(name)
    assert np.abs(minigen.load(path)[0].logits(ref["input_ids"]) - ref["logits"]).max() > 1e-2


def test_reload_after_rewrite_reads_the_new_weights(tmp_path):
    cfg = shrink.shrink(shrink.real_config("SmolLM2-135M"))
    layout, ids = shrink.LAYOUTS["SmolLM2-135M"], np.arange(8)
    shrink.write_checkpoint(tmp_path / "m", cfg, shrink.random_tensors(cfg, 1), layout)
    minigen.load(tmp_path / "m")[0].logits(ids)
    shutil.rmtree(tmp_path / "m")
    shrink.write_checkpoint(tmp_path / "m", cfg, shrink.random_tensors(cfg, 2), layout)
    shrink.write_checkpoint(tmp_path / "fresh", cfg, shrink.random_tensors(cfg, 2), layout)
    np.testing.assert_array_equal(minigen.load(tmp_path / "m")[0].logits(ids), minigen.load(tmp_path / "fresh")[0].logits(ids))

"""gguf_arch on hand-made metadata: what llama.cpp's files leave implicit, and the RoPE tensors back to config."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from minigen.checkpoint.config import parse_config
from minigen.errors import MinigenError
from minigen.checkpoint.families import FAMILIES
from minigen.gguf.families import GGUF
from minigen.checkpoint.fixes import FIXES, neox_interleave, unpermute
from minigen.gguf.arch import ARCHS, Meta, Tensors, family_config, llama3_rope


def llama_cpp_rope_freqs(theta, dim, factor, low, high, old):
    """conversion/llama.py's generate_extra_tensors, transcribed (float32 in, as llama.cpp writes it)."""
    freqs = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


@pytest.mark.parametrize("theta, dim, factor, low, high, old", [
    (500000.0, 128, 8.0, 1.0, 4.0, 8192),    # Llama 3.1 8B
    (500000.0, 64, 32.0, 1.0, 4.0, 8192),    # Llama 3.2 1B
    (10000.0, 16, 8.0, 1.0, 4.0, 32),        # tests/fixtures/llama3_rope (one blended frequency)
    (500000.0, 128, 16.0, 1.0, 2.5, 4096),   # made up: fitted from the blended frequencies
])
def test_llama3_rope_is_rebuilt_from_rope_freqs(theta, dim, factor, low, high, old):
    factors = llama_cpp_rope_freqs(theta, dim, factor, low, high, old)
    got = llama3_rope(factors, theta, dim, "f.gguf")
    assert got["rope_type"] == "llama3" and got["factor"] == factor and got["low_freq_factor"] == 1.0
    again = llama_cpp_rope_freqs(theta, dim, got["factor"], got["low_freq_factor"], got["high_freq_factor"],
                                 got["original_max_position_embeddings"])
    np.testing.assert_allclose(again, factors, rtol=2e-6)


def test_rope_freqs_all_ones_is_no_scaling_and_others_are_refused():
    assert llama3_rope(np.ones(32, np.float32), 10000.0, 64, "f.gguf") is None
    with pytest.raises(MinigenError, match="rope_freqs.weight holds RoPE factors that are not Llama 3"):
        llama3_rope(np.linspace(3, 1, 32).astype(np.float32), 10000.0, 64, "f.gguf")
    with pytest.raises(MinigenError, match="should hold 32 positive factors"):
        llama3_rope(np.ones(31, np.float32), 10000.0, 64, "f.gguf")


def meta(arch, **kv):
    return Meta({f"{arch}.{k}": v for k, v in kv.items()}, arch, "f.gguf")


GEMMA3 = dict(block_count=12, embedding_length=640, feed_forward_length=2048, context_length=32768,
              **{"attention.head_count": 4, "attention.head_count_kv": 1, "attention.key_length": 256,
                 "attention.value_length": 256, "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 1e6,
                 "attention.sliding_window": 512})


def tensors(vocab=512, hidden=640, output=False):
    t = {"token_embd.weight": (hidden, vocab)}
    if output:
        t["output.weight"] = (hidden, vocab)
    return Tensors(t)


def test_gemma3_linear_scaling_applies_to_full_layers_only():
    cfg = family_config("gemma3", meta("gemma3", **GEMMA3, **{"rope.scaling.type": "linear",
                                                              "rope.scaling.factor": 8.0}), tensors())
    c = parse_config(cfg)
    assert c.layer_types[:6] == ("sliding_attention",) * 5 + ("full_attention",)
    full, local = c.rope[5], c.rope[0]
    assert (full.kind, full.factor, full.theta) == ("linear", 8.0, 1e6)
    assert (local.kind, local.theta) == ("default", 10000.0)
    assert c.attn_scale == 256 ** -0.5 and c.sliding_window == 512 and c.final_softcap is None


def test_gemma_27b_scales_attention_by_hidden_over_heads():
    kv = dict(GEMMA3, block_count=62, embedding_length=5376, **{"attention.head_count": 32,
                                                                "attention.key_length": 128,
                                                                "attention.value_length": 128})
    assert family_config("gemma3", meta("gemma3", **kv), tensors(hidden=5376))["query_pre_attn_scalar"] == 168


def test_gemma3_per_layer_pattern_and_no_window():
    flags = [True, False] * 6
    cfg = family_config("gemma3", meta("gemma3", **GEMMA3, **{"attention.sliding_window_pattern": flags}), tensors())
    assert parse_config(cfg).layer_types == ("sliding_attention", "full_attention") * 6
    no_window = dict(GEMMA3, **{"attention.sliding_window": 0})
    assert parse_config(family_config("gemma3", meta("gemma3", **no_window), tensors())).sliding_window is None


def test_smollm3_has_no_rope_on_every_fourth_layer_as_llama_cpp():
    kv = dict(block_count=8, embedding_length=64, feed_forward_length=128, context_length=4096,
              **{"attention.head_count": 4, "attention.head_count_kv": 2, "attention.layer_norm_rms_epsilon": 1e-6,
                 "rope.freq_base": 2e6, "rope.dimension_count": 16})
    c = parse_config(family_config("smollm3", meta("smollm3", **kv), tensors(hidden=64)))
    assert [r is None for r in c.rope] == [False, False, False, True] * 2


def test_an_olmo2_file_with_a_window_is_olmo3_as_llama_cpp_reads_it():
    kv = dict(block_count=8, embedding_length=64, feed_forward_length=128, context_length=4096,
              **{"attention.head_count": 4, "attention.layer_norm_rms_epsilon": 1e-6, "attention.sliding_window": 64,
                 "rope.freq_base": 5e5, "rope.freq_base_swa": 1e4, "rope.scaling.type": "yarn",
                 "rope.scaling.factor": 8.0, "rope.scaling.original_context_length": 512})
    c = parse_config(family_config("olmo2", meta("olmo2", **kv), tensors(hidden=64)))
    assert c.model_type == "olmo3" and c.sliding_window == 64
    assert "".join("S" if c.is_sliding(i) else "F" for i in range(8)) == "SSSF" * 2   # llama.cpp's period 4
    assert {(r.kind, r.theta) for r, t in zip(c.rope, c.layer_types) if t == "sliding_attention"} == {("default", 1e4)}
    assert {(r.kind, r.theta, r.factor, r.original_max) for r, t in zip(c.rope, c.layer_types)
            if t == "full_attention"} == {("yarn", 5e5, 8.0, 512)}
    plain = parse_config(family_config("olmo2", meta("olmo2", **{k: v for k, v in kv.items()
                                                                 if "sliding" not in k}), tensors(hidden=64)))
    assert plain.model_type == "olmo2"


def test_an_mmproj_file_is_refused_for_what_it_is(tmp_path):
    import gguf
    from minigen.gguf.convert import read_plan

    w = gguf.GGUFWriter(str(tmp_path / "mmproj-model-f16.gguf"), "clip")
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_tensor("v.patch_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file()
    w.close()
    with pytest.raises(MinigenError, match="multimodal projector \\(mmproj\\) file"):
        read_plan(tmp_path / "mmproj-model-f16.gguf")


def test_unpermute_inverts_llama_cpp_permute():
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    n_head = 8
    permuted = w.reshape(n_head, 2, 8, 3).swapaxes(1, 2).reshape(w.shape)  # conversion/llama.py's permute
    np.testing.assert_array_equal(unpermute(permuted, n_head), w)
    bias = np.arange(128, dtype=np.float32)
    np.testing.assert_array_equal(unpermute(bias.reshape(n_head, 2, 8).swapaxes(1, 2).reshape(-1), n_head), bias)


def test_neox_interleave_inverts_llama_cpp_reorder():
    H, d = 4, 6
    qkv = np.arange(H * 3 * d * 5, dtype=np.float32).reshape(H * 3 * d, 5)  # HF: per head [q; k; v]
    heads = qkv.reshape(H, 3, d, 5)
    gguf = np.concatenate([heads[:, i].reshape(-1, 5) for i in range(3)])  # conversion/gptneox.py
    np.testing.assert_array_equal(neox_interleave(gguf, H), qkv)


def test_neox_fixes_are_inverse():
    """Loading an HF GPT-NeoX groups q, k, v (neox_qkv); converting llama.cpp's grouped rows gives HF's
    per-head order back (neox_per_head): one undoes the other, on matrices and biases."""
    w = np.arange(4 * 3 * 6 * 5, dtype=np.float32).reshape(72, 5)
    cfg = SimpleNamespace(n_heads=4, n_kv_heads=4)
    for x in (w, w[:, 0].copy()):
        np.testing.assert_array_equal(FIXES["neox_per_head"](FIXES["neox_qkv"](x, cfg), cfg), x)


def test_one_registry():
    """Every GGUF architecture minigen converts is a GGUF entry of a family, every fix it names is in the
    one table, and only a family with parameters llama.cpp writes as tensors accepts them."""
    assert ARCHS == {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma", "gemma2": "gemma2",
                     "gemma3": "gemma3_text", "phi3": "phi3", "gpt2": "gpt2", "olmo2": "olmo2", "gptneox": "gpt_neox",
                     "smollm3": "smollm3", "granite": "granite", "granitemoe": "granitemoe", "mistral3": "ministral3",
                     "qwen35": "qwen3_5_text", "lfm2": "lfm2", "granitehybrid": "granitemoehybrid",
                     "falcon-h1": "falcon_h1"}
    for name, family in FAMILIES.items():
        assert set(family.fix.values()) <= set(FIXES), name
    for name, g in GGUF.items():
        assert name in FAMILIES and set(g.fixes.values()) <= set(FIXES), name
        assert g.rope_factors in (None, "llama3", "longrope"), name


def test_longrope_only_where_the_family_writes_its_factors():
    """A llama file saying rope.scaling.type longrope: llama.cpp writes longrope factors for Phi-3 only (the
    family entry says so), so the key itself is refused by name."""
    kv = dict(block_count=2, embedding_length=64, feed_forward_length=128, context_length=4096,
              **{"attention.head_count": 4, "attention.layer_norm_rms_epsilon": 1e-6, "rope.scaling.type": "longrope"})
    with pytest.raises(MinigenError, match="llama.rope.scaling.type is 'longrope', which minigen does not run"):
        family_config("llama", meta("llama", **kv), tensors(hidden=64))
    phi3 = family_config("phi3", meta("phi3", **kv), tensors(hidden=64))
    assert phi3["rope_scaling"] is None  # the factors come from the tensors, read by convert

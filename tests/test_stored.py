"""Weights kept as stored in the forward pass (issue 33): a model whose matrices are StoredMatrix computes the
logits of the float32 model made by dequantizing the same matrices (checkpoint/stored.py's `dequantized`), on
the tiny fixtures of every family and mixer; the inspection commands that read weights work on either."""
import numpy as np
import pytest

from conftest import FIXTURES_DIR, greedy
from minigen.checkpoint.stored import check_quantize, dequantized, quantized, stored_types
from minigen.engine.model import Model
from minigen.engine.quant import StoredMatrix
from minigen.errors import MinigenError
from minigen.resolve import load_model

PROMPT = np.array([1, 5, 9, 2, 7, 3, 11, 4, 6, 8, 10, 12])
# every mixer and MLP kind: attention (fused qkv, biases, GQA), Qwen3.5's gated attention and Gated DeltaNet,
# LFM2's short conv, Mamba2 with routed experts, Falcon-H1's scaled projections, GPT-2's Conv1D, tied embeddings
FAMILIES = ["llama_gqa3", "qwen2", "gpt2", "gpt_neox", "phi3", "qwen3_5_text", "lfm2", "granitemoe",
            "granitemoehybrid_moe", "falcon_h1", "gemma2"]


def close(a, b, tol=1e-4):
    scale = float(np.abs(b).max())
    assert float(np.abs(a - b).max()) <= tol * scale, (float(np.abs(a - b).max()), scale)


def stored_and_reference(name: str, type: str = "Q8_0") -> tuple[Model, Model]:
    base = load_model(FIXTURES_DIR / name)
    params = quantized(base.params, type)
    return Model(base.config, params, base.generation_config), Model(base.config, dequantized(params), base.generation_config)


# BF16 takes rows of any length (Q8_0 needs whole blocks of 32: those fixtures' experts and narrow matrices
# stay float32 under Q8_0)
CASES = [(n, "Q8_0") for n in FAMILIES] + [(n, "BF16") for n in ("llama_gqa3", "phi3", "granitemoe",
                                                                  "granitemoehybrid_moe", "qwen3_5_text")]


@pytest.mark.parametrize("name,type", CASES)
def test_stored_model_equals_its_dequantized_model(name, type):
    stored, ref = stored_and_reference(name, type)
    assert any(isinstance(v, (StoredMatrix, list)) for layer in stored.params["layers"] for v in layer.values())
    close(stored.logits(PROMPT), ref.logits(PROMPT))
    assert greedy(stored, PROMPT, 6)[0] == greedy(ref, PROMPT, 6)[0]
    assert stored.n_params == ref.n_params


def test_batch_and_reference_path_on_a_stored_model(monkeypatch):
    stored, ref = stored_and_reference("llama_gqa3", "Q4_0")
    caches = [stored.make_cache(), stored.make_cache()]
    got = stored.forward_batch([PROMPT[:5], PROMPT], caches)
    close(got[1], ref.forward(PROMPT, ref.make_cache(), last_only=True))
    from minigen.engine.quant import matrix
    monkeypatch.setattr(matrix, "HAVE_KERNELS", False)   # what MINIGEN_KERNELS=0 sets: the NumPy path
    close(stored.logits(PROMPT), ref.logits(PROMPT))


def test_row_slices_of_a_stored_matrix():
    w = np.random.default_rng(1).standard_normal((200, 64)).astype(np.float32)
    m = StoredMatrix.quantize(w, "Q8_0")
    for lo, hi in [(0, 128), (64, 200), (10, 70), (128, 200)]:
        assert np.array_equal(m[lo:hi].dequantize(), m.dequantize()[lo:hi])
    x = np.ones((3, 64), np.float32)
    close(m[64:200].times(x), x @ m.dequantize()[64:200].T, 1e-5)


def test_inspection_reads_stored_weights():
    from minigen.inspect import internals, lens
    stored, ref = stored_and_reference("llama_gqa3")
    for k in ("w_q", "w_k", "w_v"):
        assert np.array_equal(internals.head_weights(stored, 0, 1)[k], internals.head_weights(ref, 0, 1)[k])
    a = lens.direct_attribution(stored, PROMPT, 5, 3)
    b = lens.direct_attribution(ref, PROMPT, 5, 3)
    assert abs(a["total"] - b["total"]) <= 1e-3 * max(1.0, abs(b["total"]))


def test_quantize_type_checked_and_counted():
    assert check_quantize("q4_k") == "Q4_K"
    with pytest.raises(MinigenError, match="--quantize Q3_K: not a type"):
        check_quantize("Q3_K")
    stored, _ = stored_and_reference("llama_gqa3", "Q4_K")   # rows of 64: Q4_K falls back to Q5_0 as llama.cpp does
    assert "Q5_0" in stored_types(stored.params)


# --- 16-bit safetensors kept in 16 bits ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama_bf16", "qwen3", "phi3", "granitemoe_v4", "gpt_neox_v4"])
def test_bf16_checkpoint_kept_in_16_bits_equals_float32(name):
    kept, f32 = load_model(FIXTURES_DIR / name), load_model(FIXTURES_DIR / name, dtype="float32")
    types = stored_types(kept.params)
    assert {"BF16", "F16"} & set(types) and set(stored_types(f32.params)) == {"float32"}
    # (no memory check on these: tiles of 64 outputs pad tiny matrices; the bench measures a real model's)
    close(kept.logits(PROMPT), f32.logits(PROMPT))
    assert greedy(kept, PROMPT, 8)[0] == greedy(f32, PROMPT, 8)[0]


def test_load_options_checked():
    with pytest.raises(MinigenError, match="--dtype float16"):
        load_model(FIXTURES_DIR / "llama_bf16", dtype="float16")
    with pytest.raises(MinigenError, match="--quantize Q2_X"):
        load_model(FIXTURES_DIR / "llama_bf16", quantize="Q2_X")
    q = load_model(FIXTURES_DIR / "llama_bf16", quantize="Q8_0")
    assert "Q8_0" in stored_types(q.params)


def test_a_float32_model_does_not_load_numba():
    """numba (and the kernels) load with the first stored product, not with minigen: a float32 checkpoint's
    run never imports them, a stored one's does (a fresh interpreter each)."""
    import subprocess
    import sys
    code = ("import sys, minigen; m, t = minigen.load(sys.argv[1], dtype=sys.argv[2] or None); "
            "m.logits(t.encode('hello')); print('numba' in sys.modules)")
    run = lambda dtype: subprocess.run([sys.executable, "-c", code, str(FIXTURES_DIR / "llama_bf16"), dtype],
                                       capture_output=True, text=True, timeout=120).stdout.strip()
    assert run("float32") == "False"
    assert run("") == "True"

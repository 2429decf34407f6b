"""A GGUF run as stored (gguf/direct.py): on every committed GGUF fixture (llama.cpp's converter and quantizer
made them), the model built straight from the file, its matrices kept in the file's types, gives the logits of
the float32 checkpoint `minigen convert` makes of the same file (to 1e-4 of their scale) and the same greedy
tokens; a type the kernels do not run is refused naming the tensor and the type."""
from __future__ import annotations

import json

import numpy as np
import pytest

import minigen
from conftest import FIXTURES_DIR, greedy
from minigen.checkpoint.stored import stored_types
from minigen.engine.quant import StoredMatrix
from minigen.errors import MinigenError
from minigen.gguf.convert import convert_gguf
from minigen.resolve import load_gguf, load_model

GGUF = FIXTURES_DIR / "gguf"
NAMES = sorted(k for k in json.loads((GGUF / "archs.json").read_text(encoding="utf-8")) if not k.startswith("_"))
PROMPT = np.array([1, 5, 9, 2, 7, 3, 11, 4, 6, 8, 10, 12])


@pytest.fixture(autouse=True)
def weights_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGEN_WEIGHTS", str(tmp_path / "weights"))   # the files directories go there


def close(a, b, tol=1e-4):
    scale = float(np.abs(b).max())
    assert float(np.abs(a - b).max()) <= tol * scale, (float(np.abs(a - b).max()), scale)


def converted(name, tmp_path):
    convert_gguf(GGUF / f"{name}.gguf", tmp_path / name, progress=False)
    return load_model(tmp_path / name, dtype="float32")


@pytest.mark.parametrize("name", [n for n in NAMES if n != "quants"])
def test_direct_gguf_equals_the_converted_float32_model(name, tmp_path):
    direct, ref = load_gguf(GGUF / f"{name}.gguf"), converted(name, tmp_path)
    assert direct.config == ref.config
    close(direct.logits(PROMPT), ref.logits(PROMPT))
    assert greedy(direct, PROMPT, 6)[0] == greedy(ref, PROMPT, 6)[0]
    assert direct.n_params == ref.n_params


def test_direct_keeps_quantized_matrices_stored():
    model = load_gguf(GGUF / "granitemoehybrid_q8_0.gguf")
    assert "Q8_0" in stored_types(model.params)
    assert any(isinstance(v, StoredMatrix) and v.type == "Q8_0" for layer in model.params["layers"] for v in layer.values())


def test_a_type_minigen_does_not_run_is_refused_naming_it(tmp_path):
    with pytest.raises(MinigenError, match=r"quants\.gguf: tensor blk\.\d+\.\w+\.weight: GGUF type (IQ|TQ|MXFP4)\S* "
                                           r"is not one minigen runs .*--dtype float32"):
        load_gguf(GGUF / "quants.gguf")
    close(load_gguf(GGUF / "quants.gguf", dtype="float32").logits(PROMPT), converted("quants", tmp_path).logits(PROMPT))


def test_load_of_a_gguf_runs_it_as_stored_with_its_tokenizer(tmp_path):
    model, tok = minigen.load(GGUF / "llama.gguf")
    assert model.path == GGUF / "llama.gguf" and "F16" in stored_types(model.params)
    ref_model, ref_tok = minigen.load(tmp_path / "llama") if convert_gguf(GGUF / "llama.gguf", tmp_path / "llama",
                                                                           progress=False) else None
    assert tok.encode("The cat sat") == ref_tok.encode("The cat sat")
    assert len(list((tmp_path / "weights" / "gguf").iterdir())) == 1   # the files directory: no weights in it
    assert not list((tmp_path / "weights" / "gguf").glob("*/model.safetensors"))
    q = minigen.load(GGUF / "llama.gguf", quantize="Q8_0")[0]
    assert set(stored_types(q.params)) <= {"Q8_0", "float32"}


def test_info_says_which_path_and_types(tmp_path):
    from click.testing import CliRunner
    from minigen.cli import main
    r = CliRunner().invoke(main, ["info", "--model", str(GGUF / "granitemoehybrid_q8_0.gguf")])
    assert r.exit_code == 0, r.output
    assert "run as stored" in r.stdout and "Q8_0 13 (" in r.stdout and "F16 4 (" in r.stdout
    assert "products:" in r.stdout and "kernels (numba)" in r.stdout
    r = CliRunner().invoke(main, ["info", "--model", str(FIXTURES_DIR / "llama_bf16"), "--quantize", "Q4_0"])
    assert r.exit_code == 0 and "Q4_0" in r.stdout, r.output
    r = CliRunner().invoke(main, ["info", "--model", str(FIXTURES_DIR / "llama_bf16"), "--dtype", "float32"])
    assert r.exit_code == 0 and "products:          OpenBLAS (float32)" in r.stdout, r.output
    r = CliRunner().invoke(main, ["info", "--model", str(FIXTURES_DIR / "llama_bf16"), "--quantize", "Q9"])
    assert r.exit_code == 1 and r.stderr.strip().splitlines() == [
        "minigen: error: --quantize Q9: not a type minigen quantizes to (one of F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, "
        "Q5_1, Q4_K)"]


def test_without_kernels_a_gguf_loads_as_float32(monkeypatch, tmp_path):
    """MINIGEN_KERNELS=0 (or no numba): nothing kept stored (each product would dequantize again), the same logits."""
    from minigen.engine.quant import matrix
    stored = load_gguf(GGUF / "granitemoehybrid_q8_0.gguf")
    monkeypatch.setattr(matrix, "HAVE_KERNELS", False)
    plain = load_gguf(GGUF / "granitemoehybrid_q8_0.gguf")
    assert set(stored_types(plain.params)) == {"float32"}
    close(plain.logits(PROMPT), stored.logits(PROMPT))
    q = load_model(FIXTURES_DIR / "llama_bf16", quantize="Q8_0")
    assert set(stored_types(q.params)) == {"float32"}   # the quantized values, as float32


def test_fused_parts_of_two_types_are_kept_apart(tmp_path):
    """A Q4_K_M file stores attn_v (and some ffn_down) in Q6_K beside Q4_K q and k: the fused wqkv is then a
    StoredRows of one matrix per type. Here q, k Q8_0 beside an F16 v and ffn_up (written by gguf-py)."""
    import gguf
    from test_convert import write_gguf
    from minigen.engine.quant import StoredRows

    def mixed(name, t):
        if name.endswith(("attn_v.weight", "ffn_up.weight")):
            return name, (gguf.quants.quantize(t, gguf.GGMLQuantizationType.F16), gguf.GGMLQuantizationType.F16)
        return name, (gguf.quants.quantize(t, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0) \
            if t.ndim == 2 else t
    src = write_gguf(FIXTURES_DIR / "llama_linear_rope", tmp_path / "mixed.gguf", tensor_hook=mixed)
    direct = load_gguf(src)
    layer = direct.params["layers"][0]
    assert isinstance(layer["wqkv"], StoredRows) and layer["wqkv"].type == "Q8_0+F16"
    assert isinstance(layer["w_gate_up"], StoredRows) and stored_types(direct.params)["F16"][0] == 2 * direct.config.n_layers
    convert_gguf(src, tmp_path / "mixed", progress=False)
    ref = load_model(tmp_path / "mixed", dtype="float32")
    close(direct.logits(PROMPT), ref.logits(PROMPT))
    assert greedy(direct, PROMPT, 6)[0] == greedy(ref, PROMPT, 6)[0]


def test_every_type_the_kernels_run_through_a_real_quantized_file(monkeypatch, tmp_path):
    """quants.gguf (llama-quantize, 18 types): with the refusal lifted, each matrix of a type the kernels run
    kept stored, the rest float32: the converted model's logits. Kept here: the Q6_K embedding (and tied
    output), Q2_K, Q3_K, Q5_K, Q6_K, Q4_0, Q4_1, Q8_0, IQ4_NL and IQ4_XS projections, and layer 0's wqkv of Q2_K
    q, Q3_K k and Q4_K v; its Q5_0, Q5_1, F16 and BF16 tensors are v or k of a wqkv whose q is a type minigen
    does not run (IQ3_S, MXFP4), so that wqkv is float32."""
    from minigen.gguf import direct
    monkeypatch.setattr(direct, "_refuse_types", lambda *a: None)
    model = load_gguf(GGUF / "quants.gguf")
    kept = set(stored_types(model.params)) - {"float32"}
    assert kept == {"Q2_K", "Q3_K", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "IQ4_NL", "IQ4_XS"}, kept
    close(model.logits(PROMPT), converted("quants", tmp_path).logits(PROMPT))


# --- --activations int8 -----------------------------------------------------------------------------------

INT8_IN_QUANTS = {"Q4_0", "Q4_1", "Q2_K", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "IQ4_NL", "IQ4_XS"}   # quants.gguf's int8 types


def test_int8_activations_through_the_forward_equal_their_numpy_twin(monkeypatch, tmp_path):
    """--activations int8 on quants.gguf (llama-quantize's Q4_0, Q4_1, Q2_K, Q4_K, Q5_K, Q6_K, Q8_0, IQ4_NL, IQ4_XS
    beside Q3_K and float32): every product with a matrix of those nine types rounds its activations, each
    call in the forward equal to its NumPy twin (int8.reference) on the same input, the others stay exact;
    the logits differ from the exact model's by what the rounding costs (not zero: the option is on).
    Each call is compared on its own input, not a whole forward against a twin forward: rounding to int8
    is a step, so float32's last digit in one layer (the kernels' order of sums, which differs between
    CPUs) may move a code by one in the next, and the two forwards apart by more than any sum's rounding."""
    from minigen.checkpoint.stored import int8_types, with_int8_activations
    from minigen.engine.quant import int8, matrix
    from minigen.gguf import direct
    monkeypatch.setattr(direct, "_refuse_types", lambda *a: None)
    exact = load_gguf(GGUF / "quants.gguf")
    fast = minigen.engine.model.Model(exact.config, with_int8_activations(exact.params, "quants.gguf"),
                                      exact.generation_config, exact.path)
    assert int8_types(fast.params) == INT8_IN_QUANTS and not int8_types(exact.params)
    calls, kernel = [], matrix.StoredMatrix.times_int8

    def recorded(m, x, threads=None):
        y = kernel(m, x, threads)
        calls.append((m, np.array(x), y))
        return y
    monkeypatch.setattr(matrix.StoredMatrix, "times_int8", recorded)
    got = fast.logits(PROMPT)
    assert {m.type for m, _, _ in calls} == INT8_IN_QUANTS
    for m, x, y in calls:
        close(y, int8.reference(m, x))
    ref = exact.logits(PROMPT)
    err = float(np.abs(got - ref).max()) / float(np.abs(ref).max())
    assert 1e-5 < err < 5e-2, err


def test_a_load_warms_the_kernels_of_the_types_it_keeps(monkeypatch):
    """A loader hands quant.warm the types it keeps before it reads their bytes (their kernels then load while
    the tiles are made), with int8 when the model will round its activations: a GGUF run as stored, a 16-bit
    checkpoint, --quantize; a float32 load warms nothing."""
    from minigen import resolve
    from minigen.checkpoint import weights
    from minigen.gguf import direct
    calls = []
    for module in (direct, weights, resolve):
        monkeypatch.setattr(module, "warm", lambda types, int8=False: calls.append((set(types), int8)))
    monkeypatch.setattr(direct, "_refuse_types", lambda *a: None)   # (its IQ3_S matrix then stays float32)
    model, _ = minigen.load(str(GGUF / "quants.gguf"), activations="int8")
    [(types, int8)] = calls
    assert int8 and set(stored_types(model.params)) - {"float32"} <= types
    calls.clear()
    minigen.load(str(GGUF / "quants.gguf"), dtype="float32")
    minigen.load(str(FIXTURES_DIR / "llama_bf16"), dtype="float32")
    assert calls == []
    minigen.load(str(FIXTURES_DIR / "llama_bf16"))
    minigen.load(str(FIXTURES_DIR / "llama_bf16"), quantize="Q8_0", activations="int8")
    assert calls == [({"BF16"}, False), ({"Q8_0"}, True)]


def test_int8_activations_refused_where_they_cannot_run(tmp_path):
    with pytest.raises(MinigenError, match=r"--activations int8: .*llama_bf16 keeps no matrix in a type it runs with int8"):
        minigen.load(str(FIXTURES_DIR / "llama_bf16"), activations="int8")
    with pytest.raises(MinigenError, match="not with --dtype float32"):
        minigen.load(str(GGUF / "llama.gguf"), dtype="float32", activations="int8")
    with pytest.raises(MinigenError, match="--activations int4: not one minigen runs"):
        minigen.load(str(GGUF / "llama.gguf"), activations="int4")


def test_info_names_the_int8_products(tmp_path):
    from click.testing import CliRunner
    from minigen.cli import main
    out = CliRunner().invoke(main, ["info", "--model", str(FIXTURES_DIR / "llama_bf16"), "--quantize", "Q8_0",
                                    "--activations", "int8"])
    assert out.exit_code == 0, out.output
    assert "Q8_0 with activations rounded to int8 (--activations int8, not exact)" in out.output
    assert "24 bits" not in out.output


@pytest.mark.parametrize("vnni", [True, False])
def test_info_names_the_one_row_in_24_bits(monkeypatch, vnni):
    """Where the CPU has AVX-512 VNNI (matrix.vnni512, as int8.VNNI512 reads it) `minigen info` says that a decode
    step's product of an int8-able type is integer sums of x in 24 bits; elsewhere it does not."""
    from click.testing import CliRunner
    from minigen.cli import main
    from minigen.engine.quant import matrix
    monkeypatch.setattr(matrix, "vnni512", lambda: vnni)
    out = CliRunner().invoke(main, ["info", "--model", str(FIXTURES_DIR / "llama_bf16"), "--quantize", "Q4_0"])
    assert out.exit_code == 0, out.output
    assert ("one row (a decode step) of Q4_0: exact integer sums of x in 24 bits (AVX-512 VNNI)" in out.output) == vnni
    out = CliRunner().invoke(main, ["info", "--model", str(FIXTURES_DIR / "llama_bf16"), "--quantize", "Q8_0"])
    assert out.exit_code == 0 and "24 bits" not in out.output, out.output   # Q8_0's one row: its float kernel


def test_int8_activations_batch_equals_each_alone(monkeypatch):
    """A sequence's products do not depend on the rows beside it: a batch step on the int8 path equals each
    sequence run alone, to what rounding to int8 costs. Not to the bit: each int8 product's rows are the
    same bits together and alone (test_quant_kernels), but the exact kernels' one-row form rounds otherwise
    than their many-row one, and a last digit moved by it before an int8 product can move a code by one."""
    from minigen.checkpoint.stored import with_int8_activations
    from minigen.gguf import direct
    monkeypatch.setattr(direct, "_refuse_types", lambda *a: None)
    exact = load_gguf(GGUF / "quants.gguf")
    fast = minigen.engine.model.Model(exact.config, with_int8_activations(exact.params, "quants.gguf"),
                                      exact.generation_config, exact.path)
    prompts = [PROMPT[:3 + 2 * i] for i in range(10)]   # 10 rows: the 8-row kernel and the one-row one
    got = fast.forward_batch(prompts, [fast.make_cache() for _ in prompts])
    for p, g in zip(prompts, got):
        close(g, fast.forward(p, fast.make_cache(), last_only=True), 1e-2)

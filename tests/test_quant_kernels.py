"""StoredMatrix and its kernels: the numba product equals its NumPy twin (the matrix dequantized by
formats.py, then `@`), for every stored type and row counts 1 ... 33 and a long one, to float32's
rounding of a sum (never its last digit: per output, within 1e-5 of sum_i |x_i w_i|); the compiled
decoder equals formats.py bit for bit; the embedding lookup, the layout's round trip, the NumPy path
without numba, and the refusals of what it does not hold."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from minigen.engine.quant import matrix as matrix_module
from minigen.engine.quant.formats import FORMATS, IN_24_BITS, INT8_TYPES, dequantize
from minigen.engine.quant.matrix import StoredMatrix, refuse_type, type_name
from minigen.errors import MinigenError
from memory_maps import in_small_pages, vm_flags
from quant_blocks import random_matrix

TYPES = list(FORMATS)
ROWS = [1, 2, 3, 4, 5, 6, 7, 8, 16, 17, 32, 33, 70]   # 2-8: rows in registers (kernels.times), 8, 4, 2, 1 at a time
SHAPES = {"F32": (130, 96), "F16": (200, 100), "BF16": (65, 256)}   # float inputs need not be whole groups of 32


def shape_of(name):
    return SHAPES.get(name, (200, 512) if FORMATS[name].block == 256 else (150, 320))


@pytest.fixture(scope="module")
def matrices():
    rng = np.random.default_rng(33)
    out = {}
    for name in TYPES:
        o, i = shape_of(name)
        raw = random_matrix(name, o, i, rng)
        out[name] = (StoredMatrix.from_bytes(raw, name, (o, i), name=f"test.{name}"), raw)
    return out


def assert_product(y, x, w):
    """y = x @ w.T to float32's rounding of a sum, relative to each output's scale."""
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64)
    assert y.shape == ref.shape and y.dtype == np.float32
    assert (np.abs(y - ref) <= 1e-5 * scale + 1e-30).all(), float((np.abs(y - ref) / (scale + 1e-30)).max())


@pytest.mark.parametrize("name", TYPES)
def test_layout_round_trip(matrices, name):
    m, raw = matrices[name]
    assert m.shape == shape_of(name) and m.type == name
    assert np.array_equal(m.raw(), raw)
    assert np.array_equal(m.raw(slice(63, 131)), raw[63:131])
    assert np.array_equal(m.dequantize(), dequantize(raw, name))
    assert m.nbytes == m.tiles.nbytes and m.nbytes >= raw.nbytes


@pytest.mark.parametrize("name", TYPES)
def test_tiles_made_in_parts_equal_those_made_whole(matrices, name, monkeypatch):
    """A large matrix is tiled in one part per thread (a load's gather on both cores): three parts here,
    the last one padded past the outputs, the same bytes."""
    m, raw = matrices[name]
    monkeypatch.setattr(matrix_module, "SPLIT_BYTES", 0)
    monkeypatch.setattr(matrix_module, "n_threads", lambda: 3)
    parts = StoredMatrix.from_bytes(raw, name, m.shape)
    assert np.array_equal(parts.tiles, m.tiles) and np.array_equal(parts.raw(), raw)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_tiles_are_kept_from_huge_pages():
    """NumPy asks for 2 MB pages for arrays of 4 MB or more; the tiles, a whole model's worth of fresh memory
    at load, are in 4 KB pages (their first touch cost 2-5x as much in huge pages on a VM here)."""
    raw = random_matrix("Q8_0", 2048, 2048, np.random.default_rng(4))
    tiles = StoredMatrix.from_bytes(raw, "Q8_0", (2048, 2048)).tiles
    assert tiles.nbytes >= 4 << 20
    assert in_small_pages(tiles), vm_flags(tiles)


@pytest.mark.parametrize("name", TYPES)
def test_rows_are_the_lookup(matrices, name):
    m, raw = matrices[name]
    ids = [0, 63, 64, m.shape[0] - 1, 5, 5]
    assert np.array_equal(m.rows(ids), dequantize(raw, name)[ids])
    with pytest.raises(MinigenError, match=f"test.{name}: token id out of range"):
        m.rows([m.shape[0]])


@pytest.mark.parametrize("name", TYPES)
def test_numpy_path_equals_the_definition(matrices, name, monkeypatch):
    """Without numba: chunks dequantized by formats.py, then OpenBLAS."""
    monkeypatch.setattr(matrix_module, "HAVE_KERNELS", False)
    monkeypatch.setattr(matrix_module, "CHUNK", 64)
    m, raw = matrices[name]
    x = np.random.default_rng(1).standard_normal((3, m.shape[1])).astype(np.float32)
    assert_product(m.times(x), x, dequantize(raw, name))


# --- with numba -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kernels():
    return pytest.importorskip("numba", reason="the kernels need numba") and matrix_module._compiled()[0]


@pytest.mark.parametrize("name", TYPES)
def test_compiled_decoder_is_bit_equal(kernels, matrices, name):
    m, raw = matrices[name]
    assert np.array_equal(m.dequantize_fast().view(np.uint32), dequantize(raw, name).view(np.uint32))
    assert np.array_equal(m.dequantize_fast(slice(70, 140)), dequantize(raw, name)[70:140])


@pytest.mark.parametrize("name", TYPES)
def test_kernel_equals_numpy_twin(kernels, matrices, name):
    m, raw = matrices[name]
    w = m.dequantize()
    rng = np.random.default_rng(FORMATS[name].ggml_type)
    for n in ROWS:
        x = rng.standard_normal((n, m.shape[1])).astype(np.float32)
        assert_product(m.times_kernel(x), x, w)
        assert_product(m.times_blas(x), x, w)


def test_few_rows_keep_their_sums_in_registers(kernels):
    """One row is always the factored one-row form, on AVX2 too (8 lanes: 2 and 4 rows, not 1, 3 or 5)."""
    assert [k for k in range(1, 20) if kernels.in_registers(k, 16)] == list(range(1, kernels.FEW + 1))
    assert [k for k in range(1, 20) if kernels.in_registers(k, 8)] == [1, 2, 4, 6, 8][:1 + kernels.FEW // 2]


def test_times_switches_to_blas_on_long_inputs(kernels, matrices, monkeypatch):
    m, _ = matrices["Q4_K"]
    called = []
    monkeypatch.setattr(StoredMatrix, "times_blas", lambda self, x: called.append(len(x)) or np.zeros((len(x), 1)))
    rows = matrix_module.blas_rows()
    assert rows in (matrix_module.BLAS_ROWS, matrix_module.BLAS_ROWS_ZEN)
    m.times(np.zeros((rows - 1, m.shape[1]), np.float32))
    m.times(np.zeros((rows, m.shape[1]), np.float32))
    assert called == [rows]


def test_long_products_share_a_scratch_buffer_until_the_forward_ends(kernels, matrices, monkeypatch):
    """times_blas dequantizes each chunk into this thread's scratch buffer: matrices of other shapes after one
    another in it (chunks of 64 outputs here) are still each one's product; a forward pass frees it."""
    import minigen
    from conftest import FIXTURES_DIR
    monkeypatch.setattr(matrix_module, "CHUNK", 64)
    rng = np.random.default_rng(3)
    for name in ("Q4_K", "Q8_0", "F16", "Q4_K"):
        m, raw = matrices[name]
        x = rng.standard_normal((5, m.shape[1])).astype(np.float32)
        assert_product(m.times_blas(x), x, m.dequantize())
    assert matrix_module._scratch
    model, tok = minigen.load(FIXTURES_DIR / "gguf" / "llama.gguf")
    model.logits(tok.encode("a prompt"))
    assert not matrix_module._scratch


def test_a_decode_step_beside_busy_cores_keeps_the_kernels_to_one_thread(kernels, matrices):
    """parallel.step_alone (a decode step while other processes hold a core) sets numba's threads to one for
    the whole step and gives them back after; asking again for one inside is free; the product is the same.
    blas_alone alone (a decode step's attention) leaves them."""
    import numba
    from minigen.engine import parallel
    from minigen.engine.quant import kernels as k
    m, raw = matrices["Q4_1"]
    x = np.random.default_rng(5).standard_normal((2, m.shape[1])).astype(np.float32)
    before = numba.get_num_threads()
    with parallel.blas_alone():
        assert numba.get_num_threads() == before
    with parallel.step_alone():
        assert numba.get_num_threads() == 1
        assert type(k.threads(1)).__name__ == "nullcontext"   # already one: no get/set per product
        y = m.times(x, 1)
        with k.threads(2):
            assert numba.get_num_threads() == min(2, numba.config.NUMBA_NUM_THREADS)
        assert numba.get_num_threads() == 1
    assert numba.get_num_threads() == before
    assert_product(y, x, dequantize(raw, "Q4_1"))


@pytest.mark.parametrize("out", [64, 300, 1000])
def test_each_thread_multiplies_its_own_range_of_tiles(kernels, out):
    """kernels._run gives each of numba's threads a contiguous range of the tiles (one tile, fewer tiles than
    threads, an odd count): on one thread or two every output is computed once, the products equal, the values
    (dequantize_fast) too, exact and int8."""
    import numba
    m = StoredMatrix.from_bytes(random_matrix("Q4_0", out, 256, np.random.default_rng(out)), "Q4_0", (out, 256))
    w = m.dequantize()
    threads = sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)})
    for k in (1, 3, 12):
        x = np.random.default_rng(k).standard_normal((k, 256)).astype(np.float32)
        ys = [m.times_kernel(x, n) for n in threads]
        assert all(np.array_equal(y, ys[0]) for y in ys)
        assert_product(ys[0], x, w)
        assert all(np.array_equal(m.times_int8(x, n), m.times_int8(x, threads[0])) for n in threads)
    assert all(np.array_equal(m.dequantize_fast(threads=n), w) for n in threads)


def test_kernel_on_real_blocks(kernels):
    """Blocks of the real files (tests/fixtures/quant/real_blocks.npz) as whole matrices."""
    from pathlib import Path
    with np.load(Path(__file__).parent / "fixtures" / "quant" / "real_blocks.npz") as z:
        rng = np.random.default_rng(3)
        for key in [k for k in z.files if not k.endswith(":type")]:
            name, raw = str(z[f"{key}:type"]), z[key]
            n_in = raw.shape[1] // FORMATS[name].nbytes * FORMATS[name].block
            m = StoredMatrix.from_bytes(raw, name, (len(raw), n_in), key)
            x = rng.standard_normal((5, n_in)).astype(np.float32)
            assert_product(m.times_kernel(x), x, dequantize(raw, name))


def test_quantize_gives_a_stored_matrix(kernels):
    w = np.random.default_rng(5).standard_normal((70, 256)).astype(np.float32)
    m = StoredMatrix.quantize(w, "Q4_K", name="blk.0.ffn_up.weight")
    assert (m.type, m.shape) == ("Q4_K", (70, 256))
    x = np.ones((2, 256), np.float32)
    assert_product(m.times(x), x, m.dequantize())
    assert np.abs(m.dequantize() - w).max() < 0.3 * np.abs(w).max()


# --- what it refuses -----------------------------------------------------------------------------------

def test_refusals():
    with pytest.raises(MinigenError, match="blk.3.attn_q.weight: GGUF type IQ2_XS is not one minigen runs"):
        type_name(17, "blk.3.attn_q.weight")
    with pytest.raises(MinigenError, match="output.weight: GGUF type IQ3_S is not one minigen runs"):
        raise refuse_type("output.weight", "IQ3_S")
    assert type_name(12, "x") == "Q4_K" and type_name(30, "x") == "BF16"
    with pytest.raises(MinigenError, match="t.w: GGUF type number 99 is not"):
        type_name(99, "t.w")
    with pytest.raises(MinigenError, match="t.w: GGUF type IQ3_S is not one minigen runs"):
        StoredMatrix.from_bytes(np.zeros(110, np.uint8), "IQ3_S", (1, 256), "t.w")
    with pytest.raises(MinigenError, match=r"t.w: 100 bytes do not hold a Q4_0 matrix of shape \(2, 64\)"):
        StoredMatrix.from_bytes(np.zeros(100, np.uint8), "Q4_0", (2, 64), "t.w")
    with pytest.raises(MinigenError, match=r"t.w: .*\(rows of 48 must be whole blocks of 32\)"):
        StoredMatrix.from_bytes(np.zeros(54, np.uint8), "Q4_0", (2, 48), "t.w")
    with pytest.raises(MinigenError, match=r"t.w: cannot quantize to Q6_K"):
        StoredMatrix.quantize(np.zeros((2, 256), np.float32), "Q6_K", "t.w")
    with pytest.raises(MinigenError, match=r"t.w: shape \(2, 100\) cannot be Q4_K"):
        StoredMatrix.quantize(np.zeros((2, 100), np.float32), "Q4_K", "t.w")


# --- the int8-activation option ----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"])
def test_int8_equals_its_numpy_twin(kernels, matrices, name):
    """int8.reference: activations rounded per block of 32 (llama.cpp's quantize_row_q8_0) times the
    exact weights, in NumPy; the kernel's integer dot products equal it to float32's rounding. And its
    distance from the exact product, the option's cost, stays what rounding x to int8 gives."""
    from minigen.engine.quant import int8
    m, raw = matrices[name]
    w = dequantize(raw, name)
    rng = np.random.default_rng(8)
    for n in [1, 2, 3, 4, 6, 8, 12, 17, 33]:   # ROWS at a time (8, Q6_K 4), then HALF (4, 2), then one
        x = rng.standard_normal((n, m.shape[1])).astype(np.float32)
        y = m.times_int8(x)
        ref = int8.reference(m, x)
        scale = np.abs(x) @ np.abs(w).T
        assert (np.abs(y - ref) <= 1e-5 * scale).all()
        assert 1e-4 < (np.abs(y - x @ w.T) / scale).max() < 1e-2


def extreme_matrices(name):
    """(fill, a 64 x 512 matrix of type `name` whose every code byte is `fill`) for fill 0xFF, 0x80, 0x7F: the
    largest unsigned codes (Q8_0's -1, -128, 127), their float16 scales 0.01."""
    from quant_blocks import F16_FIELDS
    f = FORMATS[name]
    for fill in (0xFF, 0x80, 0x7F):
        blocks = np.full((64, 512 // f.block, f.nbytes), fill, np.uint8)
        for at in F16_FIELDS[name]:
            blocks[..., at:at + 2] = np.full(blocks.shape[:2] + (1,), 0.01, np.float16).view(np.uint8)
        yield fill, StoredMatrix.from_bytes(blocks.reshape(64, -1), name, (64, 512), name=f"test.{name}")


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"])
def test_int8_sums_hold_the_extreme_codes(kernels, name):
    """The integer sums where they are largest: every code byte 0xFF, 0x80 or 0x7F (the largest unsigned
    codes; Q8_0's -1, -128, 127) times activations rounded to +-127 of one sign, or of alternating signs
    (an int16 pair sum, as AVX2's vpmaddubsw makes, would saturate at 2^15 if a type's codes allowed it)."""
    from minigen.engine.quant import int8
    for fill, m in extreme_matrices(name):
        w = m.dequantize()
        for x in (np.ones((1, 512), np.float32), -np.ones((1, 512), np.float32),
                  np.tile(np.float32([1, 1, -1, -1]), (3, 128))):
            ref = int8.reference(m, x)
            scale = np.abs(x) @ np.abs(w).T
            assert (np.abs(m.times_int8(x) - ref) <= 1e-5 * scale).all(), (name, fill, x[0, :4])


def test_int8_rows_together_equal_each_alone(kernels, matrices):
    """A row's int8 product is the same bits whether it goes through the 8-row, the 4-row or the one-row kernel:
    the same integer sums and the same float operations in the same order (no FMA contraction, which LLVM
    chose differently in each: a batch's rounding to int8 in the next layer then parted from the same
    sequence alone)."""
    from minigen.engine.quant import int8
    rng = np.random.default_rng(11)
    for name in int8.TYPES:
        m, _ = matrices[name]
        x = rng.standard_normal((13, m.shape[1])).astype(np.float32)   # 8 + 4 + 1 rows (Q6_K: 4 + 4 + 4 + 1)
        alone = np.concatenate([m.times_int8(x[i:i + 1]) for i in range(len(x))])
        assert np.array_equal(m.times_int8(x), alone), name


def test_int8_activations_are_llama_cpp_s(kernels):
    """quantize_row_q8_0: d = max|x| / 127, q = roundf(x · (1/d)) (d kept in float32, where llama.cpp
    rounds it to float16); a block of zeros gives zeros."""
    from minigen.engine.quant import int8
    x = np.zeros((2, 64), np.float32)
    x[0, :32] = np.linspace(-2, 3, 32)
    q, d, s = int8.quantize_activations(x)
    assert d[0, 0] == np.float32(3) / np.float32(127) and d[0, 1] == 0 and d[1, 0] == 0
    v = x[0, :32] * (np.float32(1) / d[0, 0])
    assert np.array_equal(q[0, :32], np.where(np.abs(v) % 1 == 0.5, np.trunc(v) + np.sign(v), np.round(v)))
    assert (q[0, 32:] == 0).all() and s[0, 0] == q[0, :32].sum() and np.abs(q).max() == 127


def test_int8_refuses_other_types(kernels, matrices):
    m, _ = matrices["Q3_K"]
    with pytest.raises(MinigenError, match="test.Q3_K: Q3_K cannot be multiplied with int8 activations"):
        m.times_int8(np.zeros((1, m.shape[1]), np.float32))


def test_int8_compiled_rounding_equals_the_numpy_rule(kernels):
    """The compiled quantizer times_int8 uses (int8.quantize_compiled: int8 codes, a scale per 32, code sums
    per 16) rounds exactly as quantize_activations, halves included, and sums what it rounded."""
    from minigen.engine.quant import int8
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 256)).astype(np.float32) * np.float32(3)
    x[1, :32] = 0
    x[2, :32] = np.arange(-16, 16, dtype=np.float32) / np.float32(2)   # -7.5 ... 7.5: halves
    x[2, 0] = 127                                                      # so d = 1, and x · (1/d) = x
    assert (np.abs(x[2, 1:32] % 1) == 0.5).sum() == 16
    q, d, s = int8.quantize_activations(x)
    cq, cd, cs = int8.quantize_compiled(x)
    assert cq.dtype == np.int8 and np.array_equal(cq, q) and np.array_equal(cd, d)
    assert np.array_equal(cs.reshape(3, -1, 2).sum(axis=2), s)
    assert np.array_equal(cs, q.reshape(3, -1, 16).sum(axis=2))


# --- one row in 24 bits: the exact path's decode step on AVX-512 VNNI --------------------------------------

@pytest.mark.parametrize("name", INT8_TYPES)
def test_one_row_in_24_bits_is_as_exact_as_the_float_kernel(kernels, matrices, name, monkeypatch):
    """Where the CPU has AVX-512 VNNI, one row of the exact product (a decode step) goes through int8.times_24: x in
    24 bits per block of 32 as three int8 digit planes, exact integer sums. It equals its float64 twin
    (int8.reference24) to float32's rounding, and the exact product as closely as the float kernel does (1e-6 of
    sum_i |x_i w_i|, ten times tighter than assert_product). Elsewhere, and for the types outside formats.IN_24_BITS
    (Q8_0, whose float kernel is faster), one row stays in the float kernel."""
    from minigen.engine.quant import int8
    m, raw = matrices[name]
    w = dequantize(raw, name).astype(np.float64)
    calls = []
    monkeypatch.setattr(int8, "times_24", lambda m, x, f=int8.times_24: calls.append(len(x)) or f(m, x))
    rng = np.random.default_rng(24)
    for x in (rng.standard_normal((1, m.shape[1])).astype(np.float32),
              rng.standard_normal((1, m.shape[1])).astype(np.float32) * np.float32(1e4) ** rng.uniform(-1, 1, (1, m.shape[1])).astype(np.float32)):
        y = m.times_kernel(x)
        scale = np.abs(x).astype(np.float64) @ np.abs(w).T
        assert (np.abs(y - x.astype(np.float64) @ w.T) <= 1e-6 * scale).all()
        if int8.VNNI512 and name in IN_24_BITS:
            assert (np.abs(y - int8.reference24(m, x)) <= 1e-6 * scale).all()
    assert m.times_kernel(np.ones((2, m.shape[1]), np.float32)).shape == (2, m.shape[0])   # two rows: the float kernel
    assert calls == ([1, 1] if int8.VNNI512 and name in IN_24_BITS else [])
    assert matrix_module.vnni512() == int8.VNNI512   # what info says


def test_24_bit_activations_are_three_digits_of_each_block(kernels):
    """The compiled quantizer of times_24 (int8.quantize24_compiled) rounds as int8.quantize24 (halves away from
    zero, dx = max|x| / TOP24 per block of 32), never past TOP24, and stores each X as its balanced base-256 digits
    (int8.digits24), which give X back; its sums per 16 are those of X. A block of zeros is zeros; a NaN makes its
    block's scale NaN, and the product's outputs NaN, as a float sum's would be."""
    from minigen.engine.quant import int8
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    x[0, :32] = 0
    x[1, 32:64] *= np.float32(1e-30)
    x[1, 64] = 1e30
    x[2] = rng.uniform(0.5, 2, 512).astype(np.float32)   # where x · (1/dx) rounds past TOP24 in some blocks
    X, d = int8.quantize24(x)
    past = np.abs(np.round(x[2].reshape(-1, 32) * (np.float32(1) / d[2])[:, None])) > int8.TOP24
    assert past.any() and np.abs(X).max() == int8.TOP24 and (X[0, :32] == 0).all() and d[0, 0] == 0
    q, cd, cs = int8.quantize24_compiled(x)
    digits = int8.digits24(X)
    assert np.array_equal(q.reshape(3, int8.PLANES, 512), digits) and np.array_equal(cd, d)
    digits = digits.astype(np.int64)
    assert np.array_equal(digits[:, 0] + 256 * digits[:, 1] + 65536 * digits[:, 2], X)
    assert np.array_equal(cs, X.reshape(3, -1, 16).sum(axis=2).astype(np.float32))
    x[1, 70] = np.nan
    assert np.isnan(int8.quantize24_compiled(x)[1][1, 2]) and not np.isnan(int8.quantize24_compiled(x)[1][1, 1])
    m = StoredMatrix.quantize(rng.standard_normal((64, 512)).astype(np.float32), "Q4_K")
    assert np.isnan(m.times_kernel(x[1:2])).all() and np.isfinite(m.times_kernel(x[2:3])).all()


@pytest.mark.parametrize("name", ["Q4_1", "Q5_K", "Q6_K", "Q8_0", "IQ4_XS"])
def test_24_bit_sums_hold_the_extreme_codes(kernels, name):
    """One row's sums in 24 bits where they are largest: every code byte 0xFF, 0x80 or 0x7F, times x of one sign at
    its block's largest (every digit at +-127) or of alternating signs: each plane's sum stays an exact int32."""
    for fill, m in extreme_matrices(name):
        w = m.dequantize().astype(np.float64)
        for x in (np.ones((1, 512), np.float32), -np.ones((1, 512), np.float32), np.tile(np.float32([1, 1, -1, -1]), (1, 128))):
            scale = np.abs(x) @ np.abs(w).T
            assert (np.abs(m.times_kernel(x) - x @ w.T) <= 1e-6 * scale).all(), (name, fill, x[0, :4])


AVX2_CHECK = ("import numpy as np, sys; sys.path.insert(0, 'tests'); from quant_blocks import random_matrix\n"
              "from minigen.engine.quant import int8, kernels, StoredMatrix\n"
              "assert not int8.VNNI and kernels.LANES == 8\n"
              "rng = np.random.default_rng(5)\n"
              "for name in ('Q4_K', 'Q5_K', 'Q6_K', 'Q8_0', 'Q5_0', 'Q3_K', 'IQ4_XS', 'BF16'):\n"
              "    m = StoredMatrix.from_bytes(random_matrix(name, 80, 512, rng), name, (80, 512))\n"
              "    for x in (rng.standard_normal((n, 512)).astype(np.float32) for n in (1, 2, 4, 7)):\n"
              "        w = m.dequantize()\n"
              "        scale = np.abs(x) @ np.abs(w).T\n"
              "        assert (np.abs(m.times_kernel(x) - x @ w.T) <= 1e-5 * scale).all(), name\n"
              "        if name in int8.TYPES:\n"
              "            assert (np.abs(m.times_int8(x) - int8.reference(m, x)) <= 1e-5 * scale).all(), name\n"
              "print('ok')\n")


def start_avx2_check():
    """The AVX2 check in a fresh interpreter (MINIGEN_AVX2=1), started and not waited for: conftest starts it when
    the suite's collection holds the test below, so that its compiling runs on the second core beside the rest
    of the suite. It shares the tests' numba cache (conftest's NUMBA_CACHE_DIR): kernels.sources_cache_dir gives
    MINIGEN_AVX2=1 a directory of its own there, so the two forms never load each other's code, and a second
    run of the suite loads what the first compiled."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, MINIGEN_AVX2="1")
    return subprocess.Popen([sys.executable, "-c", AVX2_CHECK], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=str(__import__("pathlib").Path(__file__).resolve().parent.parent))


def test_kernels_as_an_avx2_cpu_runs_them_equal_the_numpy_twin(kernels, request):
    """Where the CPU has AVX2 and nothing newer the exact kernels work on 8 lanes and the int8 sums are plain
    IR, no vpdpbusd (MINIGEN_AVX2=1 compiles them so here, in a fresh interpreter): both equal their NumPy
    twins."""
    run = getattr(request.config, "minigen_avx2_check", None) or start_avx2_check()
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0 and out.strip() == "ok", err[-2000:]


@pytest.mark.parametrize("shuffle", [True, False], ids=["pshufb", "portable"])
def test_iq4_lookup_gives_every_code_its_value(kernels, monkeypatch, shuffle):
    """The IQ4 kernels' table lookup (kernels._iq4_values), compiled alone at each pass width: by the CPU's
    byte shuffle, and by the portable selects a CPU without one gets: code q becomes IQ4_VALUES[q]."""
    import ctypes
    from llvmlite import binding, ir
    from minigen.engine.quant import formats, kernels as k
    if not shuffle:
        monkeypatch.setattr(k, "SHUFFLE", {})
    i8, i64 = ir.IntType(8), ir.IntType(64)
    for n in (k.LANES, 2 * k.LANES, 4 * k.LANES):      # the pass widths: a piece, ROWS_PASS, PASS
        module = ir.Module(name=f"iq4_{n}")
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [i8.as_pointer(), ir.FloatType().as_pointer()]), "lookup")
        b = ir.IRBuilder(fn.append_basic_block())
        unit = k._Unit.__new__(k._Unit)                 # what _iq4_values uses of a unit: its builder and pieces
        unit.b, unit.width, unit.pieces = b, n, list(range(0, n, k.LANES))
        codes = b.load(b.bitcast(fn.args[0], ir.VectorType(i8, n).as_pointer()), align=1)
        for j, v in enumerate(k._iq4_values(unit, codes)):
            b.store(v, b.bitcast(b.gep(fn.args[1], [ir.Constant(i64, j * k.LANES)]), v.type.as_pointer()), align=4)
        b.ret_void()
        target = binding.Target.from_default_triple().create_target_machine(   # each engine owns its own
            cpu=binding.get_host_cpu_name(), features=binding.get_host_cpu_features().flatten())
        engine = binding.create_mcjit_compiler(binding.parse_assembly(str(module)), target)
        engine.finalize_object()
        run = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(engine.get_function_address("lookup"))
        q = np.resize(np.arange(16, dtype=np.uint8)[::-1], n)
        out = np.empty(n, np.float32)
        run(q.ctypes.data, out.ctypes.data)
        assert np.array_equal(out, formats.IQ4_VALUES[q]), (n, out[:16])


def test_compiled_before_says_which_types_numba_holds(kernels, monkeypatch, tmp_path):
    """matrix.compiled_before reads numba's index (kernels.in_cache): a type's one-row product (int8.times_24's where
    the CPU has AVX-512 VNNI) is not there until it has been compiled once, then it is (and another type still is
    not); the same for the int8 product."""
    import numba
    from minigen.engine.quant import int8, kernels as k
    before = matrix_module.compiled_before
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))   # products made now keep their cache here
    monkeypatch.setattr(k, "WORKS", tuple(tuple(k._work(kind, way) for way in (k.ONE, k.FEW_ROWS, k.MANY, k.VALUES))
                                           for kind in range(len(k.KINDS))))
    monkeypatch.setattr(int8, "WORKS", {kind: (int8._work(kind, True), int8._work(kind, False)) for kind in int8.EMIT})
    monkeypatch.setattr(int8, "WORKS24", {kind: int8._work(kind, True, int8.PLANES) for kind in int8.WORKS24})
    assert not before(["Q4_0"]) and not before([], ["Q4_0"]) and before([])
    m = StoredMatrix.from_bytes(random_matrix("Q4_0", 64, 256, np.random.default_rng(0)), "Q4_0", (64, 256))
    x = np.ones((1, 256), np.float32)
    m.times_kernel(x)
    assert before(["Q4_0"]) and not before(["Q4_0", "Q8_0"]) and not before(["Q4_0"], ["Q4_0"])
    m.times_int8(x)
    assert before(["Q4_0"], ["Q4_0"])


def test_warm_loads_what_numba_holds_and_compiles_nothing(kernels, monkeypatch, tmp_path):
    """matrix.warm (a loader's helper thread) loads the kernels of its types that numba's cache holds, the int8
    ones only when asked, and compiles none: with an empty cache it loads nothing; after a first start made the
    one-row products, a later start's warm loads those (not the two-row and many-row ones, never made)."""
    import numba
    from minigen.engine.quant import int8, kernels as k
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))

    def fresh():   # the works as a new process has them: nothing loaded yet
        monkeypatch.setattr(k, "WORKS", tuple(tuple(k._work(kind, way) for way in (k.ONE, k.FEW_ROWS, k.MANY, k.VALUES))
                                              for kind in range(len(k.KINDS))))
        monkeypatch.setattr(int8, "WORKS", {kind: (int8._work(kind, True), int8._work(kind, False)) for kind in int8.EMIT})
        monkeypatch.setattr(int8, "WORKS24", {kind: int8._work(kind, True, int8.PLANES) for kind in int8.WORKS24})
        kind = k.KINDS["Q4_0"]
        one = int8.WORKS24.get(kind) or k.WORKS[kind][k.ONE]
        return one, k.WORKS[kind][k.FEW_ROWS], k.WORKS[kind][k.MANY], int8.WORKS[kind][0]

    loaded = lambda fn: fn._wrapper_address is not None   # noqa: E731
    works = fresh()
    matrix_module.warm(["Q4_0", "F32"], int8=True).join()
    assert not any(map(loaded, works))
    m = StoredMatrix.from_bytes(random_matrix("Q4_0", 64, 256, np.random.default_rng(0)), "Q4_0", (64, 256))
    m.times_kernel(np.ones((1, 256), np.float32))   # a first start's products: compiled, kept in the cache
    m.times_int8(np.ones((1, 256), np.float32))
    one, two, many, int8_one = works = fresh()
    matrix_module.warm(["Q4_0"]).join()
    assert loaded(one) and not loaded(two) and not loaded(many) and not loaded(int8_one)
    works = fresh()
    matrix_module.warm(["Q4_0"], int8=True).join()
    assert [loaded(fn) for fn in works] == [True, False, False, True]
    assert matrix_module.warm(["F32"]) is None and matrix_module.warm([]) is None
    monkeypatch.setattr(matrix_module, "HAVE_KERNELS", False)
    assert matrix_module.warm(["Q4_0"]) is None


def test_a_product_asked_for_on_two_threads_at_once_compiles_once(kernels, monkeypatch, tmp_path):
    """kernels.address compiles a type's work the first time it is asked for, once, when two threads (a long
    prompt's halves) ask at the same moment."""
    import threading
    import time
    import numba
    from minigen.engine.quant import kernels as k
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    fn = k._work(k.KINDS["Q4_0"], k.ONE)
    compiles, compile = [], fn.compile

    def slow_compile():
        compiles.append(1)
        time.sleep(0.2)   # both threads are asking by now
        compile()
    fn.compile = slow_compile
    addresses = []
    threads = [threading.Thread(target=lambda: addresses.append(k.address(fn))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(compiles) == 1 and len(set(addresses)) == 1 and addresses[0]


def test_each_compiled_product_keeps_a_cache_of_its_own(kernels):
    """Every (type, way) product and dequantizer, exact and int8, has a name of its own, and so its own numba
    index: closures sharing one index had two processes compiling at once cross their entries, and a later start
    run one type's code for another's (as a Zen 3: 34 failures, 'NRT_adapt_ndarray_to_python: descr is NULL')."""
    from minigen.engine.quant import int8, kernels as k
    fns = ([f for ways in k.WORKS for f in ways] + [f for pair in int8.WORKS.values() for f in pair]
           + [k._run, int8._run, k._run_alone, int8._run_alone])
    paths = {f._cache._cache_file._index_path for f in fns}
    assert len(fns) == 4 * 16 + 2 * len(int8.EMIT) + 4 and len(paths) == len(fns)


ONE_THREAD_BESIDE_TWO = """
import threading, numpy as np, numba
from minigen.engine.quant.matrix import StoredMatrix
m = StoredMatrix.quantize(np.random.default_rng(0).standard_normal((512, 256)).astype(np.float32), "Q4_0")
x1, x8 = np.ones((1, 256), np.float32), np.ones((8, 256), np.float32)
m.times(x1)
from minigen.engine.quant import kernels
print(numba.threading_layer(), kernels.slow_starts(), flush=True)
def alone():
    for _ in range(300):
        m.times(x1, 1), m.times(x8, 1), m.times_int8(x1, 1), m.dequantize_fast(threads=1)
t = threading.Thread(target=alone)
t.start()
for _ in range(300):
    m.times(x1), m.times(x8)
t.join()
print("done")
"""


def test_one_thread_products_stay_out_of_numbas_threading_layer(kernels):
    """A product on one thread runs outside numba's threading layer (kernels._run_alone, int8._run_alone). Where
    libgomp is missing that layer is numba's workqueue, which aborts the process when two threads start parallel
    loops at once, as a long prompt's halves (parallel.in_threads) and quant.warm beside a first forward pass
    would. Under the workqueue: one-thread products (one row, 8 rows, int8, the values) on a thread of their own
    beside the main thread's two-thread ones."""
    import os
    import subprocess
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue"}
    r = subprocess.run([sys.executable, "-c", ONE_THREAD_BESIDE_TWO], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0 and r.stdout.split() == ["workqueue", "True", "done"], (r.stdout, r.stderr[-3000:])


def test_where_loops_start_slowly_small_products_keep_to_one_thread(kernels, monkeypatch):
    """Where numba's parallel loops start slowly (its workqueue: kernels.slow_starts), a product of fewer than
    SLOW_START_BYTES of tiles runs on the calling thread (_run_alone) and a larger one on numba's threads; where they
    start fast (OpenMP), both run on the threads."""
    import numba
    from minigen.engine.quant import kernels as k
    calls = []
    monkeypatch.setattr(k, "_run", lambda *a, f=k._run: calls.append("threads") or f(*a))
    monkeypatch.setattr(k, "_run_alone", lambda *a, f=k._run_alone: calls.append("alone") or f(*a))
    rng = np.random.default_rng(4)
    small = StoredMatrix.from_bytes(random_matrix("Q4_0", 64, 256, rng), "Q4_0", (64, 256))
    big = StoredMatrix.from_bytes(random_matrix("Q4_0", 4096, 2048, rng), "Q4_0", (4096, 2048))
    assert small.nbytes < k.SLOW_START_BYTES <= big.nbytes
    split = "threads" if numba.config.NUMBA_NUM_THREADS > 1 else "alone"
    with k.threads(2):
        for slow in (False, True):
            monkeypatch.setattr(k, "_slow_starts", slow)
            calls.clear()
            for m in (small, big):
                x = np.ones((2, m.shape[1]), np.float32)
                assert_product(m.times_kernel(x), x, m.dequantize())
            assert calls == (["alone", split] if slow else [split, split])


def test_kernels_cache_follows_every_kernel_source(kernels, tmp_path):
    """numba's cache of the kernels lives in a directory named by a hash of every kernel source (numba itself
    checks only the file of the function it loads: int8.py's code, built from kernels.py's IR, would stay
    cached after kernels.py changed). Here: the cache of int8's product is under it, and it changes when
    any one of the files does."""
    import os
    import shutil
    from pathlib import Path
    import numba
    from minigen.engine.quant import int8, kernels as k
    assert numba.config.CACHE_DIR == k.sources_cache_dir(os.environ["NUMBA_CACHE_DIR"])   # conftest sets it
    assert all(f._cache._cache_path.startswith(numba.config.CACHE_DIR + os.sep) for f in int8.WORKS[k.KINDS["Q4_K"]])
    here = Path(k.__file__).parent
    shutil.copytree(here, tmp_path / "quant", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(here.parent / "compiled.py", tmp_path / "compiled.py")
    seen = {k.sources_cache_dir("base", tmp_path / "quant")}
    assert seen == {k.sources_cache_dir("base", here)}
    for name in ("quant/kernels.py", "quant/formats.py", "compiled.py"):
        with open(tmp_path / name, "a") as f:
            f.write("\n# changed\n")
        seen.add(k.sources_cache_dir("base", tmp_path / "quant"))
    assert len(seen) == 4 and all(d.startswith(os.path.join("base", "minigen-")) for d in seen)


def test_the_avx2_forms_have_a_cache_of_their_own(kernels, monkeypatch):
    """MINIGEN_AVX2=1 emits other code for the same CPU, and numba keys its cache by the CPU: the two forms
    keep their code in different directories, so neither loads the other's."""
    from minigen.engine.quant import kernels as k
    monkeypatch.delenv("MINIGEN_AVX2", raising=False)
    native = k.sources_cache_dir("base")
    monkeypatch.setenv("MINIGEN_AVX2", "1")
    assert k.sources_cache_dir("base") != native
    monkeypatch.setenv("MINIGEN_AVX2", "0")
    assert k.sources_cache_dir("base") == native


def test_kernels_cache_falls_back_where_it_cannot_be_written(kernels, tmp_path):
    """A cache directory that cannot be made (its path runs through a file: even root cannot) gives way to the
    next candidate (kernels.py: the home directory's cache, then the system's temporary directory)."""
    from minigen.engine.quant import kernels as k
    (tmp_path / "file").write_text("not a directory")
    blocked, free = str(tmp_path / "file" / "cache"), str(tmp_path / "cache")
    assert k.writable_cache_dir(blocked, free) == free and (tmp_path / "cache").is_dir()
    assert k.writable_cache_dir(free, blocked) == free

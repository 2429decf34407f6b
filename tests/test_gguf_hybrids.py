"""Converting llama.cpp's GGUFs of the hybrid families (qwen35, lfm2, granitehybrid, falcon-h1): what each
recurrent tensor holds in the file, undone on hand-made arrays, and a damaged or unsupported file refused in
one line naming the file and the tensor or key. The fixtures' logits, greedy ids and tokenizers against
transformers and llama.cpp are checked by tests/test_gguf_archs.py with every other architecture.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest

from conftest import FIXTURES_DIR
from minigen.checkpoint.fixes import FIXES, untile
from minigen.engine.config import DeltaNet
from minigen.errors import MinigenError
from minigen.gguf.convert import convert_gguf, read_plan

GGUF = FIXTURES_DIR / "gguf"


def llama_cpp_reorder(w: np.ndarray, k_heads: int, per_k: int, head_dim: int, dim: int = 0) -> np.ndarray:
    """conversion/qwen.py's _reorder_v_heads, transcribed in numpy: grouped value heads -> tiled."""
    shape = list(w.shape)
    new = shape[:dim] + [k_heads, per_k, head_dim] + shape[dim + 1:]
    perm = list(range(len(new)))
    perm[dim], perm[dim + 1] = perm[dim + 1], perm[dim]
    return w.reshape(new).transpose(perm).reshape(shape)


QWEN = SimpleNamespace(delta_net=DeltaNet(key_heads=2, value_heads=6, key_dim=4, value_dim=5, conv_kernel=4,
                                          eps=1e-6))


def test_untile_inverts_llama_cpp_value_head_reorder():
    rows = np.arange(6 * 5 * 3, dtype=np.float32).reshape(30, 3)
    np.testing.assert_array_equal(untile(llama_cpp_reorder(rows, 2, 3, 5), 2, 3), rows)
    cols = rows.T.copy()
    np.testing.assert_array_equal(FIXES["dn_out"](llama_cpp_reorder(cols, 2, 3, 5, dim=1), QWEN), cols)
    qkv = np.arange((2 * 2 * 4 + 30) * 3, dtype=np.float32).reshape(-1, 3)   # [q; k; v], only v tiled
    tiled = np.concatenate([qkv[:16], llama_cpp_reorder(qkv[16:], 2, 3, 5)])
    np.testing.assert_array_equal(FIXES["dn_qkv"](tiled, QWEN), qkv)
    conv = FIXES["dn_conv"](tiled[:, :3], QWEN)                               # the conv's channels: (C, 1, K)
    assert conv.shape == (46, 1, 3)
    np.testing.assert_array_equal(conv[:, 0], qkv)


def test_a_log_comes_back_from_minus_exp():
    a_log = np.linspace(-1, 1, 6).astype(np.float32)
    stored = (-np.exp(a_log)).reshape(6, 1)                       # Mamba2: (H, 1), as llama.cpp unsqueezes it
    np.testing.assert_allclose(FIXES["a_log"](stored, None), a_log, rtol=0, atol=1e-7)
    tiled = llama_cpp_reorder(-np.exp(a_log), 2, 3, 1)            # Qwen3.5: a vector, value heads tiled
    np.testing.assert_allclose(FIXES["dn_a_log"](tiled, QWEN), a_log, rtol=0, atol=1e-7)


# --- bad files: a fixture rewritten with one thing wrong ------------------------------------------------------

def rewrite(src: Path, out: Path, kv: dict | None = None, drop: str | None = None, tensor=None,
            extra: dict | None = None) -> Path:
    """A copy of an F32 GGUF fixture with metadata keys set ({key: (value, type)}; a value None: the key left
    out), a tensor dropped or changed (tensor: (name, fn of its array)), tensors added ({name: array})."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(out), r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value, vtype = f.contents(), f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        if kv and key in kv:
            value, vtype = kv.pop(key)
            sub = gguf.GGUFValueType.UINT32 if vtype == gguf.GGUFValueType.ARRAY else None
            if value is None:
                continue
        w.add_key_value(key, value, vtype, sub_type=sub)
    for key, (value, vtype) in (kv or {}).items():
        w.add_key_value(key, value, vtype)
    for t in r.tensors:
        if t.name == drop:
            continue
        data = np.array(t.data)
        if tensor and t.name == tensor[0]:
            data = tensor[1](data)
        w.add_tensor(t.name, data)
    for name, data in (extra or {}).items():
        w.add_tensor(name, data)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file()
    w.close()
    return out


def refused(path: Path, *words: str, convert: bool = False, tmp: Path | None = None) -> str:
    with pytest.raises(MinigenError) as e:
        convert_gguf(path, tmp / "out", progress=False) if convert else read_plan(path)
    line = str(e.value)
    assert "\n" not in line and line.startswith(str(path)), line
    for w in words:
        assert w in line, line
    return line


U32, ARRAY = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.ARRAY


@pytest.mark.parametrize("name, kv, words", [
    ("granitemoehybrid_moe", {"granitehybrid.expert_used_count": (9, U32)},
     ["granitehybrid.expert_used_count", "(9) is more than expert_count (8)"]),
    ("granitemoehybrid_moe", {"granitehybrid.expert_shared_feed_forward_length": (None, U32)},
     ["granitehybrid.expert_shared_feed_forward_length", "is missing", "shared MLP"]),
    ("granitemoehybrid_moe", {"granitehybrid.expert_count": (6, U32)},
     ["blk.0.ffn_gate_inp.weight", "shape [8, 32], expected [6, 32]"]),
    ("lfm2", {"lfm2.attention.sliding_window": (64, U32)}, ["lfm2.attention.sliding_window"]),
    ("lfm2", {"lfm2.attention.head_count_kv": ([0, 2, 0, 1], ARRAY)}, ["lfm2.attention.head_count_kv", "differs"]),
    ("qwen3_5", {"qwen35.ssm.inner_size": (30, U32)}, ["qwen35.ssm.inner_size", "time_step_rank"]),
    ("qwen3_5", {"qwen35.nextn_predict_layers": (5, U32)}, ["qwen35.nextn_predict_layers"]),
    ("falcon_h1", {"falcon-h1.ssm.time_step_rank": (3, U32)}, ["falcon-h1.ssm.inner_size", "time_step_rank (3)"]),
], ids=["granite-top-k", "granite-no-shared-width", "granite-expert-count", "lfm2-window", "lfm2-kv", "qwen-inner",
        "qwen-nextn", "falcon-heads"])
def test_metadata_minigen_does_not_run_is_named(tmp_path, name, kv, words):
    refused(rewrite(GGUF / f"{name}.gguf", tmp_path / "bad.gguf", kv=dict(kv)), *words)


def test_missing_and_misshapen_recurrent_tensors_are_named(tmp_path):
    refused(rewrite(GGUF / "qwen3_5.gguf", tmp_path / "a.gguf", drop="blk.0.ssm_a"), "missing tensor blk.0.ssm_a")
    refused(rewrite(GGUF / "granitemoehybrid.gguf", tmp_path / "b.gguf",
                    tensor=("blk.2.ssm_conv1d.weight", lambda w: w[:, :3].copy())), "blk.2.ssm_conv1d.weight", "shape")
    refused(rewrite(GGUF / "lfm2.gguf", tmp_path / "c.gguf",
                    tensor=("blk.0.shortconv.in_proj.weight", lambda w: w[:-1].copy())),
            "blk.0.shortconv.in_proj.weight", "shape")
    refused(rewrite(GGUF / "granitemoehybrid.gguf", tmp_path / "d.gguf", drop="blk.1.ffn_up.weight"),
            "blk.1.ffn_gate.weight", "no ffn_up")
    refused(rewrite(GGUF / "granitemoehybrid_moe.gguf", tmp_path / "e.gguf", drop="blk.1.ffn_up_shexp.weight"),
            "blk.1.ffn_gate_shexp.weight", "no ffn_up_shexp")
    refused(rewrite(GGUF / "granitemoehybrid_moe.gguf", tmp_path / "f.gguf", drop="blk.2.ffn_up_exps.weight"),
            "blk.2.ffn_gate_exps.weight", "no ffn_up_exps")


def test_the_shared_mlp_in_both_of_its_names_is_refused(tmp_path):
    """Granite 4.0-H's shared MLP is ffn_down in a dense file and ffn_down_shexp beside experts: a file with both
    would write one Hugging Face tensor twice."""
    down = np.array(next(t.data for t in gguf.GGUFReader(GGUF / "granitemoehybrid_moe.gguf").tensors
                         if t.name == "blk.0.ffn_down_shexp.weight"))
    bad = rewrite(GGUF / "granitemoehybrid_moe.gguf", tmp_path / "a.gguf", extra={"blk.0.ffn_down.weight": down})
    refused(bad, "blk.0.ffn_down_shexp.weight and blk.0.ffn_down.weight",
            "model.layers.0.shared_mlp.output_linear.weight")


def test_an_ssm_a_that_is_not_minus_exp_is_refused(tmp_path):
    bad = rewrite(GGUF / "falcon_h1.gguf", tmp_path / "a.gguf", tensor=("blk.1.ssm_a", lambda w: np.abs(w)))
    refused(bad, "tensor blk.1.ssm_a", "-exp(A_log)", convert=True, tmp=tmp_path)
    assert not (tmp_path / "out").exists()


def test_the_mtp_block_is_left_out():
    """Qwen3.5's multi-token-prediction block (blk.4 of a 4-layer model): not converted, as transformers does
    not load mtp.* either."""
    plan = read_plan(GGUF / "qwen3_5.gguf")
    assert plan.config["num_hidden_layers"] == 4
    assert not [t for t in plan.tensors if t.gguf_name.startswith("blk.4.")]
    assert plan.config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]

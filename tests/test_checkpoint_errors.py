"""Bad checkpoints fail with one clear MinigenError naming the file, tensor or field at fault."""
import json
import shutil

import numpy as np
import pytest

import minigen
from minigen import MinigenError

import tiny_checkpoint


@pytest.fixture
def ckpt(tmp_path):
    return tiny_checkpoint.write(tmp_path / "ckpt")


def fails(path, *words):
    with pytest.raises(MinigenError) as e:
        minigen.load(path)
    msg = str(e.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


def test_missing_directory(tmp_path):
    fails(tmp_path / "nope", "nope", "no such checkpoint directory")


def test_truncated_safetensors(ckpt):
    f = ckpt / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    fails(ckpt, "model.safetensors", "truncated")


def test_corrupt_safetensors_header(ckpt):
    f = ckpt / "model.safetensors"
    f.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!" + b"\x00" * 64)
    fails(ckpt, "model.safetensors", "corrupt")


def test_tiny_garbage_file(ckpt):
    (ckpt / "model.safetensors").write_bytes(b"abc")
    fails(ckpt, "model.safetensors", "truncated")


def test_wrong_shape(ckpt):
    w = tiny_checkpoint.tensors()
    w["model.layers.1.self_attn.k_proj.weight"] = np.zeros((8, 32), np.float32)
    tiny_checkpoint.write(ckpt, weights=w)
    fails(ckpt, "model.layers.1.self_attn.k_proj.weight", "[8, 32]", "[16, 32]")


def test_missing_tensor(ckpt):
    w = tiny_checkpoint.tensors()
    del w["model.layers.0.mlp.up_proj.weight"]
    tiny_checkpoint.write(ckpt, weights=w)
    fails(ckpt, "missing tensor", "model.layers.0.mlp.up_proj.weight")


def test_unexpected_tensor(ckpt):
    w = tiny_checkpoint.tensors()
    w["model.layers.2.mlp.up_proj.weight"] = np.zeros((48, 32), np.float32)  # a layer config does not have
    tiny_checkpoint.write(ckpt, weights=w)
    fails(ckpt, "unexpected tensor", "model.layers.2.mlp.up_proj.weight")


def test_untied_without_lm_head(ckpt):
    tiny_checkpoint.write(ckpt, cfg={**tiny_checkpoint.CONFIG, "tie_word_embeddings": False})
    fails(ckpt, "lm_head.weight")


def test_unknown_model_type(ckpt):
    (ckpt / "config.json").write_text(json.dumps({**tiny_checkpoint.CONFIG, "model_type": "bert"}))
    fails(ckpt, "config.json", "'bert'", "unsupported model_type")


def test_config_not_json(ckpt):
    (ckpt / "config.json").write_text("{ this is not json")
    fails(ckpt, "config.json", "not valid JSON")


def test_config_missing_field(ckpt):
    cfg = dict(tiny_checkpoint.CONFIG)
    del cfg["num_hidden_layers"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    fails(ckpt, "config.json", "num_hidden_layers")


def test_config_bad_field_type(ckpt):
    (ckpt / "config.json").write_text(json.dumps({**tiny_checkpoint.CONFIG, "hidden_size": "32"}))
    fails(ckpt, "config.json", "hidden_size")


def test_missing_config(ckpt):
    (ckpt / "config.json").unlink()
    fails(ckpt, "config.json", "missing")


def test_missing_tokenizer(ckpt):
    (ckpt / "tokenizer.json").unlink()
    fails(ckpt, "tokenizer.json", "missing")


def test_corrupt_tokenizer(ckpt):
    (ckpt / "tokenizer.json").write_text('{"version": "1.0", "model": 42}')
    fails(ckpt, "tokenizer.json")


def test_unsupported_rope_type(ckpt):
    cfg = {**tiny_checkpoint.CONFIG, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}
    (ckpt / "config.json").write_text(json.dumps(cfg))
    fails(ckpt, "config.json", "'dynamic'")


def test_unsupported_dtype(ckpt):
    from safetensors.numpy import save_file
    w = tiny_checkpoint.tensors()
    w["model.norm.weight"] = w["model.norm.weight"].astype(np.float64)
    save_file(w, str(ckpt / "model.safetensors"))
    fails(ckpt, "model.norm.weight", "F64")


def test_shard_missing(ckpt, tmp_path):
    from safetensors.numpy import save_file
    w = tiny_checkpoint.tensors()
    names = sorted(w)
    (ckpt / "model.safetensors").unlink()
    save_file({k: w[k] for k in names[:5]}, str(ckpt / "model-00001-of-00002.safetensors"))
    index = {"metadata": {}, "weight_map": {k: "model-0000%d-of-00002.safetensors" % (1 if i < 5 else 2)
                                            for i, k in enumerate(names)}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    fails(ckpt, "model-00002-of-00002.safetensors", "missing")


def test_token_id_out_of_range(ckpt):
    model = minigen.load(ckpt)[0]
    with pytest.raises(MinigenError, match="outside the vocabulary"):
        model.logits([1, 2, 64])


@pytest.mark.parametrize("breakage", ["truncated", "missing_tensor", "bad_config", "no_tokenizer", "unknown_type"])
@pytest.mark.parametrize("command", [["info"], ["generate", "-n", "2", "t1 t2"]])
def test_cli_reports_bad_checkpoint_in_one_line(ckpt, breakage, command):
    from click.testing import CliRunner
    from minigen.cli import main
    if breakage == "truncated":
        f = ckpt / "model.safetensors"
        f.write_bytes(f.read_bytes()[:1000])
    elif breakage == "missing_tensor":
        w = tiny_checkpoint.tensors()
        del w["model.norm.weight"]
        tiny_checkpoint.write(ckpt, weights=w)
    elif breakage == "bad_config":
        (ckpt / "config.json").write_text("[1, 2")
    elif breakage == "no_tokenizer":
        (ckpt / "tokenizer.json").unlink()
    else:
        (ckpt / "config.json").write_text(json.dumps({**tiny_checkpoint.CONFIG, "model_type": "t5"}))
    result = CliRunner().invoke(main, [command[0], "--model", str(ckpt), *command[1:]])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minigen: error: "), result.stderr
    assert "Traceback" not in result.output + result.stderr
    assert result.stdout == ""

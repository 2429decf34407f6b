"""The text half of multimodal checkpoints (families.WRAPPERS: gemma3, mistral3, qwen3_5): text_config read
as the language model's family, either weight layout, the vision tower left unread, image tokens refused.
Parity with transformers on the wrapper fixtures is in test_parity.py."""
import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import load_file, save_file

import minigen
from minigen.checkpoint.config import parse_config
from minigen.cli import main
from minigen.errors import MinigenError

from conftest import FIXTURES_DIR, load_reference

TEXT = {"model_type": "qwen3", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "vocab_size": 64, "head_dim": 8}


def relayout(src, dst, renames):
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    out = {}
    for k, v in tensors.items():
        new = next((to + k[len(old):] for old, to in renames if k.startswith(old)), k)
        out[new] = v
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("name", ["mistral3", "gemma3"])
def test_both_weight_layouts_give_the_same_model(name, tmp_path):
    """The hub layout (language_model.model.*) renamed into transformers 5's (model.language_model.*,
    lm_head, model.vision_tower.*) loads into the same logits."""
    ref = load_reference(name)
    v5 = relayout(FIXTURES_DIR / name, tmp_path / "v5", [
        ("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head."),
        ("vision_tower.", "model.vision_tower."), ("multi_modal_projector.", "model.multi_modal_projector.")])
    a = minigen.load(FIXTURES_DIR / name)[0].logits(ref["input_ids"])
    np.testing.assert_array_equal(minigen.load(v5)[0].logits(ref["input_ids"]), a)


def test_two_layouts_in_one_checkpoint_are_refused(tmp_path):
    path = shutil.copytree(FIXTURES_DIR / "mistral3", tmp_path / "m")
    tensors = load_file(str(path / "model.safetensors"))
    tensors["model.language_model.norm.weight"] = tensors["language_model.model.norm.weight"]
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(MinigenError, match="two layouts"):
        minigen.load(path)


def test_the_vision_tower_is_not_loaded_and_info_says_so():
    model = minigen.load(FIXTURES_DIR / "gemma3")[0]
    names = {k for layer in model.params["layers"] for k in layer} | set(model.params)
    assert not any("vision" in n or "projector" in n for n in names)
    r = CliRunner().invoke(main, ["info", "--model", str(FIXTURES_DIR / "gemma3")])
    assert r.exit_code == 0, r.output
    assert "gemma3_text (the language model of gemma3" in r.output
    assert "vision:" in r.output and "not loaded and not counted above" in r.output


@pytest.mark.parametrize("name, token", [("mistral3", "[IMG]"), ("gemma3_v5", "<image_soft_token>")])
def test_an_image_token_in_a_prompt_is_an_error_naming_it(name, token):
    model, tok = minigen.load(FIXTURES_DIR / name)
    image = tok.hf.token_to_id(token)
    assert model.config.image_token_ids == (image,)
    with pytest.raises(MinigenError, match=f"token id {image} at position 2 is the checkpoint's image token"):
        model.logits([3, 4, image, 5])
    r = CliRunner().invoke(main, ["generate", f"look {token} here", "--model", str(FIXTURES_DIR / name), "-n", "2"])
    assert r.exit_code == 1 and f"token id {image}" in r.output and "Traceback" not in r.output


def test_tying_is_the_wrappers_own_default():
    """transformers ties by the top-level tie_word_embeddings: True for Gemma 3 and Mistral 3, False for
    Qwen3.5, whatever text_config says."""
    text = dict(TEXT, tie_word_embeddings=False)
    assert parse_config({"model_type": "mistral3", "text_config": text}).tie_word_embeddings is True
    assert parse_config({"model_type": "qwen3_5", "text_config": dict(TEXT, tie_word_embeddings=True)}) \
        .tie_word_embeddings is False
    c = parse_config({"model_type": "mistral3", "text_config": text, "tie_word_embeddings": False,
                      "image_token_index": 10, "architectures": ["Mistral3ForConditionalGeneration"]})
    assert (c.tie_word_embeddings, c.wrapper, c.image_token_ids, c.architectures) == \
        (False, "mistral3", (10,), ("Mistral3ForConditionalGeneration",))


@pytest.mark.parametrize("raw, words", [
    ({"model_type": "gemma3"}, "'text_config', which is missing"),
    ({"model_type": "gemma3", "text_config": [1]}, "field 'text_config' should be an object"),
    ({"model_type": "mistral3", "text_config": dict(TEXT, num_attention_heads=0)}, "(text_config): field"),
])
def test_bad_wrapper_configs_name_the_field(raw, words):
    with pytest.raises(MinigenError) as e:
        parse_config(raw)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_qwen3_5s_layout_is_read_generically(tmp_path):
    """Qwen3.5's wrapper (model.language_model.*, model.visual.*, mtp.* which transformers ignores, lm_head)
    around a text family: here a float32 llama fixture's weights and config, so its transformers reference holds."""
    path = relayout(FIXTURES_DIR / "llama_yarn", tmp_path / "q", [("model.", "model.language_model.")])
    tensors = load_file(str(path / "model.safetensors"))
    tensors.update({"model.visual.patch_embed.proj.weight": np.zeros((4, 4), np.float32),
                    "mtp.fc.weight": np.zeros((4, 4), np.float32)})
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    text = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({
        "model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text,
        "tie_word_embeddings": text["tie_word_embeddings"], "image_token_id": 3}))
    model = minigen.load(path)[0]
    ref = load_reference("llama_yarn")
    assert model.config.wrapper == "qwen3_5" and model.config.model_type == "llama"
    assert np.abs(model.logits(ref["input_ids"]) - ref["logits"]).max() <= 1e-4

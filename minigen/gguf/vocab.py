"""GGUF `tokenizer.ggml.*` -> tokenizer.json + tokenizer_config.json that tokenise exactly as llama.cpp does.

llama.cpp (`src/llama-vocab.cpp`) is the reference: `encode(text)` must give the ids `llama-tokenize` gives
(special tokens parsed, BOS/EOS as the file says). Two kinds of vocabulary, rebuilt with `tokenizers`:

- `llama` (SentencePiece BPE: Llama 2, TinyLlama, Mistral, Phi-3, Gemma 1-3). llama.cpp joins the pair of
  adjacent pieces whose join is the token with the highest *score*, leftmost first, and spells what no token
  covers as <0xNN> byte tokens. As a `tokenizers` BPE: merges derived from the scores (every split of a token
  into two tokens, best score first), byte_fallback; the normalizer writes " " as "▁" and, when
  `add_space_prefix` (llama.cpp's default; Gemma's files say false), prepends one "▁" to every stretch of
  text between special tokens, as llama.cpp does.
- `gpt2` (byte-level BPE: GPT-2, Llama 3, Qwen2/2.5/3, SmolLM, OLMo, Phi-2, ...). The file's merges as given;
  the text is first split by the regexes llama.cpp uses for the file's `tokenizer.ggml.pre` (PRE_KINDS, each
  regex splitting the pieces of the one before, matches and gaps alike), then mapped to the byte alphabet.

Special tokens: control (type 3) and unknown (type 2) tokens become special added tokens and user-defined
(type 4) ones plain added tokens, matched in the raw text before anything else, as llama.cpp does with special
parsing on (its default in llama-tokenize; minigen encodes chat templates that way). llama.cpp also treats some
tokens as control by their text (`<|im_end|>`, `<end_of_turn>`, ...) and stops generation on them: the same
text tables are here, and `special_ids(meta)["eog"]` is the list generation should stop on.

Where a tokenizer.json cannot say what llama.cpp does (checked by scripts/check_vocab_ggufs.py, which finds no
difference on llama.cpp's own vocab files): SentencePiece tokens of *equal* score are merged leftmost first by
llama.cpp, while merge ranks order them by id here (files whose scores are all equal, which convert_hf_to_gguf
writes for a Llama without tokenizer.model, tokenise differently); llama.cpp matches special tokens longest
first over the whole text, `tokenizers` leftmost-longest (they differ only for overlapping special tokens).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import MinigenError

# llama.cpp's token types (llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # SentencePiece's visible space, "▁"

# --- pre-tokenizers: llama.cpp's regexes per tokenizer.ggml.pre (llm_tokenizer_bpe in src/llama-vocab.cpp) ------

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# Llama 3's "(?i:'s|'t|...)" spelt without the inline flag, as llama.cpp spells it
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
# words as runs of upper- then lower-case letters; llama.cpp's spelling of \p{Lu}... as "a letter that is not a-z"
_UPPER_LOWER = r"((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
_UPPER_LOWER2 = r"((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER_LOWER}|[^\r\n\p{{L}}\p{{N}}]?{_UPPER_LOWER2}|\p{{N}}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER_LOWER}{_CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER_LOWER2}{_CONTRACTIONS}?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class Pre:
    """How llama.cpp pre-tokenizes one family of `tokenizer.ggml.pre` names."""
    splits: tuple[str, ...]       # regexes, applied in turn
    ignore_merges: bool = False   # a piece that is itself a token is not merged (Llama 3's tokenizer.json too)
    add_bos: bool = False         # llama.cpp's add_bos when the file has no tokenizer.ggml.add_bos_token


PRE_KINDS = {
    "default": Pre((r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]")),
    "gpt2": Pre((GPT2,)),
    "starcoder": Pre((r"\p{N}", GPT2)),  # each digit on its own, then GPT-2's regex
    "llama3": Pre((LLAMA3,), ignore_merges=True, add_bos=True),
    "dbrx": Pre((LLAMA3,)),  # Llama 3's regex, without its other defaults
    "qwen2": Pre((QWEN2,)),
    "qwen35": Pre((QWEN35,)),
    "falcon": Pre((r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]")),
    "tekken": Pre((TEKKEN,), ignore_merges=True, add_bos=True),
    "gpt-4o": Pre((GPT4O,)),
}

# tokenizer.ggml.pre -> PRE_KINDS key, as llama_vocab::impl::load maps them (for the kinds above)
PRE_NAMES = {
    "default": "default",
    **dict.fromkeys(("gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4",
                     "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "gigachat", "a.x-4.0", "mellum",
                     "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe"), "gpt2"),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b",
                     "mellum2"), "starcoder"),
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano"), "llama3"),
    **dict.fromkeys(("dbrx", "smaug-bpe"), "dbrx"),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan",
                     "solar-open"), "qwen2"),
    "qwen35": "qwen35",
    "falcon": "falcon",
    "tekken": "tekken",
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), "gpt-4o"),
}

# --- special tokens llama.cpp recognises by their text ------------------------------------------------------

# tokens that end generation: made control tokens if the file says otherwise (llama_vocab::impl::load)
EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
))
# fill-in-the-middle tokens by kind: control tokens too; llama.cpp ends generation on the pad, repo and file
# separator ones (the file's tokenizer.ggml.fim_<kind>_token_id if it has one, else these by their text)
FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_FIM_EOG = ("fim_pad", "fim_rep", "fim_sep")
_CONTROL_TEXTS = EOG_TEXTS.union(*FIM_TEXTS.values())

# id keys (tokenizer.ggml.<key>_token_id) and llama.cpp's defaults when a file has none, per vocabulary kind
ID_KEYS = ("bos", "eos", "eot", "eom", "unknown", "padding", *_FIM_EOG)
_DEFAULT_IDS = {"llama": {"bos": 1, "eos": 2, "unknown": 0}, "gpt2": {"bos": 11, "eos": 11}}


@dataclass
class Vocab:
    """A GGUF vocabulary, checked, with llama.cpp's defaults and text rules applied."""
    model: str                  # "llama" (SentencePiece) or "gpt2" (byte-level BPE)
    tokens: list[str]
    types: list[int]            # after llama.cpp's by-text control rule
    scores: list[float]
    merges: list[tuple[str, str]]
    pre: Pre | None
    ids: dict                   # ID_KEYS -> id or None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    rstrip_special: bool        # Phi-3: whitespace after its special tokens is dropped


def build_tokenizer(meta: dict, source="GGUF"):
    """The `tokenizers.Tokenizer` for a GGUF vocabulary (META: the file's metadata, arrays as lists)."""
    return _build(read_vocab(meta, source))


def tokenizer_files(meta: dict, source="GGUF") -> dict[str, str]:
    """File name -> text: tokenizer.json and tokenizer_config.json (special tokens, chat template)."""
    v = read_vocab(meta, source)
    if "tokenizer.huggingface.json" in meta:  # some GGUFs carry the original file verbatim
        tok_json = meta["tokenizer.huggingface.json"]
    else:
        tok_json = _build(v).to_str()
    config = json.dumps(_tokenizer_config(v, meta), indent=2, ensure_ascii=False) + "\n"
    return {"tokenizer.json": tok_json, "tokenizer_config.json": config}


def special_ids(meta: dict, source="GGUF") -> dict:
    """ID_KEYS -> an id or None (as the file says, llama.cpp's defaults applied), and eog: the ids llama.cpp
    ends generation on, EOS first."""
    v = read_vocab(meta, source, merges=False)
    return {**v.ids, "eog": _eog_ids(v)}


def _build(v: Vocab):
    tk = _sentencepiece(v) if v.model == "llama" else _byte_level(v)
    _add_special_tokens(tk, v)
    tk.post_processor = _post_processor(v)
    return tk


def _tokenizer_config(v: Vocab, meta: dict) -> dict:
    arch = meta.get("general.architecture")
    config = {
        "add_bos_token": v.add_bos,
        "add_eos_token": v.add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": meta.get(f"{arch}.context_length", 2048),
        # not the model's own class: transformers would rebuild its pre-tokenizer and lose llama.cpp's
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    for key, name in (("bos", "bos_token"), ("eos", "eos_token"), ("unknown", "unk_token"), ("padding", "pad_token")):
        if v.ids[key] is not None:
            config[name] = v.tokens[v.ids[key]]
    config["added_tokens_decoder"] = {
        str(i): {"content": v.tokens[i], "lstrip": False, "normalized": False, "rstrip": _rstrip(v, i),
                 "single_word": False, "special": t != USER_DEFINED}
        for i, t in _added(v)}
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = meta["tokenizer.chat_template"]
    return config


# --- reading and checking the metadata ----------------------------------------------------------------------


def read_vocab(meta: dict, source="GGUF", merges: bool = True) -> Vocab:
    """Everything the tokenizer needs from META, checked once: MinigenError naming the key otherwise.
    merges=False: without the BPE merges (none read or checked: what the special ids need; checking Qwen's
    151k merges takes ~0.5 s, and a GGUF run as stored reads its ids at every start)."""
    model = meta.get("tokenizer.ggml.model")
    if model not in ("llama", "gpt2"):
        raise MinigenError(f"{source}: tokenizer.ggml.model {model!r} is not supported "
                           f"(supported: 'llama' = SentencePiece, 'gpt2' = byte-level BPE)")
    tokens = _tokens(meta, source)
    types = _int_list(meta, "tokenizer.ggml.token_type", len(tokens), NORMAL, source)
    scores = _float_list(meta, "tokenizer.ggml.scores", len(tokens), source)
    pre = _pre(meta, source) if model == "gpt2" else None
    merges = _merges(meta, tokens, source) if model == "gpt2" and merges else []
    ids = _ids(meta, model, len(tokens), source)
    default_bos = True if model == "llama" else pre.add_bos
    name = str(meta.get("general.name", "")).lower()
    return Vocab(model, tokens, _llama_cpp_types(tokens, types), scores, merges, pre, ids,
                 add_bos=_flag(meta, "tokenizer.ggml.add_bos_token", default_bos, source),
                 add_eos=_flag(meta, "tokenizer.ggml.add_eos_token", False, source),
                 add_space_prefix=_flag(meta, "tokenizer.ggml.add_space_prefix", model == "llama", source),
                 rstrip_special="phi-3" in name or "phi3" in name)


def _tokens(meta: dict, source) -> list[str]:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise MinigenError(f"{source}: tokenizer.ggml.tokens is missing or not a list of strings")
    # llama.cpp renames an empty token so that no token is empty
    tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    if len(set(tokens)) != len(tokens):
        seen = {}
        for i, t in enumerate(tokens):
            if t in seen:
                raise MinigenError(f"{source}: tokenizer.ggml.tokens holds {t!r} twice (ids {seen[t]} and {i})")
            seen[t] = i
    return tokens


def _int_list(meta: dict, key: str, n: int, default: int, source) -> list[int]:
    values = meta.get(key)
    if values is None:
        return [default] * n
    if not isinstance(values, list) or not all(isinstance(x, int) for x in values):
        raise MinigenError(f"{source}: {key} is not a list of integers")
    if len(values) != n:
        raise MinigenError(f"{source}: {key} has {len(values)} entries for {n} tokens")
    return values


def _float_list(meta: dict, key: str, n: int, source) -> list[float]:
    values = meta.get(key)
    if values is None:
        return [0.0] * n
    if not isinstance(values, list) or not all(isinstance(x, (int, float)) for x in values):
        raise MinigenError(f"{source}: {key} is not a list of numbers")
    if len(values) != n:
        raise MinigenError(f"{source}: {key} has {len(values)} entries for {n} tokens")
    return [float(x) for x in values]


def _pre(meta: dict, source) -> Pre:
    name = meta.get("tokenizer.ggml.pre", "default")  # llama.cpp: missing -> "default" (with a warning)
    if name not in PRE_NAMES:
        raise MinigenError(f"{source}: tokenizer.ggml.pre {name!r} is not supported "
                           f"(supported: {', '.join(sorted(PRE_NAMES))})")
    return PRE_KINDS[PRE_NAMES[name]]


def _merges(meta: dict, tokens: list[str], source) -> list[tuple[str, str]]:
    merges = meta.get("tokenizer.ggml.merges", [])  # gguf's writer leaves out an empty array
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        raise MinigenError(f"{source}: tokenizer.ggml.merges is not a list of strings")
    vocab, pairs = set(tokens), []
    for i, m in enumerate(merges):
        cut = m.find(" ", 1)  # as llama.cpp splits them: at the first space after the first character
        a, b = (m[:cut], m[cut + 1:]) if cut > 0 else (m, "")
        if not (a in vocab and b in vocab and a + b in vocab):
            raise MinigenError(f"{source}: tokenizer.ggml.merges entry {i} ({m!r}) is not two tokens of "
                               f"tokenizer.ggml.tokens that join into a third")
        pairs.append((a, b))
    return pairs


def _ids(meta: dict, model: str, n: int, source) -> dict:
    ids = {}
    for key in ID_KEYS:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        if i is None:
            i = _DEFAULT_IDS[model].get(key)
            i = i if i is not None and i < n else None
        elif not isinstance(i, int) or not 0 <= i < n:
            raise MinigenError(f"{source}: tokenizer.ggml.{key}_token_id {i!r} is not a token id (0..{n - 1})")
        ids[key] = i
    return ids


def _flag(meta: dict, key: str, default: bool, source) -> bool:
    value = meta.get(key, default)
    if not isinstance(value, (bool, int)):
        raise MinigenError(f"{source}: {key} is not a boolean")
    return bool(value)


def _llama_cpp_types(tokens: list[str], types: list[int]) -> list[int]:
    """Token types as llama.cpp uses them: end-of-generation and fill-in-the-middle texts are control tokens."""
    return [CONTROL if t in _CONTROL_TEXTS else k for t, k in zip(tokens, types)]


def _eog_ids(v: Vocab) -> list[int]:
    """EOS first, then EOT, EOM, the FIM pad/repo/separator tokens and the others llama.cpp knows by text."""
    ids = [v.ids[k] for k in ("eos", "eot", "eom", *_FIM_EOG) if v.ids[k] is not None]
    by_text = EOG_TEXTS.union(*(FIM_TEXTS[k] for k in _FIM_EOG if v.ids[k] is None))
    ids += [i for i, t in enumerate(v.tokens) if t in by_text]
    return list(dict.fromkeys(ids))


# --- building -------------------------------------------------------------------------------------------------


def _sentencepiece(v: Vocab):
    from tokenizers import Tokenizer, decoders, models, normalizers

    unk = v.tokens[v.ids["unknown"]] if v.ids["unknown"] is not None else None
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(v.tokens)}, merges=_score_merges(v),
                              unk_token=unk, byte_fallback=True, fuse_unk=False))
    prepend = [normalizers.Prepend(SPACE)] if v.add_space_prefix else []
    tk.normalizer = normalizers.Sequence(prepend + [normalizers.Replace(" ", SPACE)])
    strip = [decoders.Strip(" ", 1, 0)] if v.add_space_prefix else []  # llama.cpp's detokenize drops it too
    tk.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()] + strip)
    return tk


def _score_merges(v: Vocab) -> list[tuple[str, str]]:
    """Every split of a token into two tokens, best score first: the order llama.cpp's SPM merges in.
    Tokens of equal score are ordered by id (llama.cpp takes the leftmost pair then; a merge rank cannot say so)."""
    vocab = set(v.tokens)
    ranked = []
    for i, token in enumerate(v.tokens):
        for cut in range(1, len(token)):
            if token[:cut] in vocab and token[cut:] in vocab:
                ranked.append((-v.scores[i], i, token[:cut], token[cut:]))
    ranked.sort(key=lambda r: (r[0], r[1]))
    return [(a, b) for _, _, a, b in ranked]


def _byte_level(v: Vocab):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(v.tokens)}, merges=v.merges, fuse_unk=False,
                              byte_fallback=False, ignore_merges=v.pre.ignore_merges))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in v.pre.splits]
    tk.pre_tokenizer = pre_tokenizers.Sequence(splits + [pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                  use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    return tk


def _added(v: Vocab) -> list[tuple[int, int]]:
    """(id, type) of the tokens llama.cpp matches in the raw text before tokenising the rest."""
    return [(i, t) for i, t in enumerate(v.types) if t in (CONTROL, UNKNOWN, USER_DEFINED)]


def _rstrip(v: Vocab, i: int) -> bool:
    # llama.cpp, for models named Phi-3: every special token but these three eats the whitespace after it
    return v.rstrip_special and v.tokens[i] not in ("<unk>", "<s>", "<|endoftext|>")


def _add_special_tokens(tk, v: Vocab) -> None:
    from tokenizers import AddedToken

    added = [(AddedToken(v.tokens[i], special=t != USER_DEFINED, normalized=False, rstrip=_rstrip(v, i)), t)
             for i, t in _added(v)]
    tk.add_special_tokens([a for a, t in added if t != USER_DEFINED])
    tk.add_tokens([a for a, t in added if t == USER_DEFINED])


def _post_processor(v: Vocab):
    from tokenizers import processors

    bos = [v.ids["bos"]] if v.add_bos and v.ids["bos"] is not None else []
    eos = [v.ids["eos"]] if v.add_eos and v.ids["eos"] is not None else []
    if not bos and not eos:
        return None

    def sequence(name: str, type_id: int) -> list[str]:
        return ([f"{v.tokens[i]}:{type_id}" for i in bos] + [f"${name}:{type_id}"]
                + [f"{v.tokens[i]}:{type_id}" for i in eos])

    return processors.TemplateProcessing(single=sequence("A", 0), pair=sequence("A", 0) + sequence("B", 1),
                                         special_tokens=[(v.tokens[i], i) for i in dict.fromkeys(bos + eos)])

"""The options of a run, in one table, and the checks of a prompt against a model.

`Options` is the table: each field is one option, made with `option(...)`, which says everything about
it: its default, its check and how the error words it, its CLI flags and help, where its value comes
from when none is given (the checkpoint's generation_config.json, the model's context), and how `-v`'s
summary shows it. The validation (`Options.__post_init__`), the CLI's flags (cli/run.py), the
keywords of minigen.generate/stream and ChatSession, and `summary` all read the table, so adding an
option (--logprobs, --prompt-lookup, --draft-model, --batch, ...) is one entry here plus the code that
uses its value; `commands` says which commands get its flag (generate and chat unless it says less).

An Options is checked when it is made (types and ranges: an OptionError naming the option, which the
CLI reports as a usage error naming the flag); `for_model` fills what the checkpoint decides and checks
what depends on the model (`max_context`). `check_prompt` is the one check of a prompt's ids, for every
command that runs one: not empty, within the context, within the vocabulary. Inner code trusts both.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from typing import Callable, Sequence

from ..errors import MinigenError, OptionError, is_int, is_finite, short
from . import constraint as constraints


@dataclass(frozen=True)
class Spec:
    """What the table says about one option besides its name and default."""
    check: Callable[[object], bool]
    what: str                            # the error reads "<name>: should be <what>, got ..."
    flags: tuple[str, ...] = ()          # CLI flags; () for an option of the API only
    commands: tuple[str, ...] = ("generate", "chat")   # the commands that have the flags
    help: str = ""
    type: type | None = None             # what the CLI parses: int, float, str; None with a flag: a switch
    multiple: bool = False               # the flag may be repeated (its values become a tuple)
    parse: Callable[[str], object] | None = None   # the flag's text -> value; a ValueError is a usage error
    show_default: bool = False
    fallback: Callable | None = None     # model -> the value when the option is None
    show: str | None = None              # in the settings summary: "temp {}"; " (last {})" joins the one before


def option(default, check: Callable[[object], bool], what: str, **spec) -> field:
    return field(default=default, metadata={"spec": Spec(check, what, **spec)})


def spec(f) -> Spec:
    return f.metadata["spec"]


def _whole(low: int) -> Callable[[object], bool]:
    return lambda v: is_int(v) and v >= low


def _maybe(ok: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: v is None or ok(v)


def _switch(v) -> bool:
    return isinstance(v, bool)


def unescape_stop(text: str) -> str:
    """--stop TEXT: the escapes \\n, \\t, \\r and \\\\ are processed, so --stop "\\n\\n" stops at a blank line."""
    if text == "":
        raise ValueError("an empty stop string would stop before the first token")
    return re.sub(r"\\([ntr\\])", lambda m: {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[m[1]], text)


def _from_config(key: str, unset: float, off: float, cast: type, sampled: bool = True) -> Callable:
    """The value from generation_config.json (HF's semantics: without do_sample the checkpoint is greedy,
    whatever temperature it lists, and the filters are off); `unset` when it does not give one."""
    def fallback(model):
        gc = model.generation_config or {}
        if sampled and not gc.get("do_sample", False):
            return off
        return cast(gc.get(key) or unset)
    return fallback


@dataclass(frozen=True)
class Options:
    """Everything a run can be asked for; None means the checkpoint decides (see `for_model`)."""
    max_tokens: int = option(256, _whole(0), "an integer >= 0", flags=("-m", "-n", "--max-tokens"), type=int,
                             show_default=True, help="Tokens to generate at most (>= 0).")
    temp: float | None = option(None, _maybe(lambda v: is_finite(v) and v >= 0), "a number >= 0", flags=("--temp",),
                                type=float, fallback=_from_config("temperature", 1.0, 0.0, float), show="temp {}",
                                help="Temperature, >= 0; 0 is greedy. [default: from generation_config.json, else 0]")
    top_k: int | None = option(None, _maybe(_whole(0)), "an integer >= 0", flags=("--top-k",), type=int,
                               fallback=_from_config("top_k", 0, 0, int), show="top-k {}",
                               help="Keep the k most likely tokens (0: off).")
    top_p: float | None = option(None, _maybe(lambda v: is_finite(v) and 0 < v <= 1), "a number in (0, 1]",
                                 flags=("--top-p",), type=float, fallback=_from_config("top_p", 1.0, 1.0, float),
                                 show="top-p {}", help="Keep the smallest set reaching p, in (0, 1] (1: off).")
    min_p: float | None = option(None, _maybe(lambda v: is_finite(v) and 0 <= v <= 1), "a number in [0, 1]",
                                 flags=("--min-p",), type=float, fallback=_from_config("min_p", 0.0, 0.0, float),
                                 show="min-p {}",
                                 help="Keep tokens at least min-p times the top one, in [0, 1] (0: off).")
    repeat_penalty: float | None = option(
        None, _maybe(lambda v: is_finite(v) and v > 0), "a number > 0", flags=("--repeat-penalty",), type=float,
        fallback=_from_config("repetition_penalty", 1.0, 1.0, float, sampled=False), show="repeat-penalty {}",
        help="Penalise tokens seen recently, as HF's repetition_penalty, > 0 (1: off).")
    repeat_last_n: int = option(64, _whole(0), "an integer >= 0", flags=("--repeat-last-n",), type=int,
                                show_default=True, show=" (last {})",
                                help="Window of the repeat penalty, in tokens (0: the whole sequence).")
    seed: int | None = option(None, _maybe(_whole(0)), "an integer >= 0", flags=("--seed",), type=int,
                              show="seed {}", help="Seed for sampling (>= 0): the same seed gives the same text.")
    stop: tuple = option((), lambda v: isinstance(v, tuple) and all(isinstance(x, str) and x for x in v),
                         "a non-empty string or a list of them", flags=("--stop",), type=str, multiple=True,
                         parse=unescape_stop,
                         help="Stop when this text appears (not printed); \\n, \\t, \\r, \\\\ are escapes. "
                              "Repeatable.")
    ignore_eos: bool = option(False, _switch, "true or false", flags=("--ignore-eos",),
                              help="Keep going past the end-of-sequence token.")
    max_context: int | None = option(None, _maybe(_whole(1)), "an integer >= 1", flags=("--max-context",), type=int,
                                     fallback=lambda model: model.config.max_position_embeddings,
                                     show="context {}",
                                     help="Context size in tokens (default and maximum: the model's).")
    record_attention: bool = option(False, _switch, "true or false")   # generate's --dump-attention sets it
    prompt_lookup: bool = option(False, _switch, "true or false", flags=("--prompt-lookup",),
                                 help="Speculative decoding: draft from n-grams of the prompt and output, verify "
                                      "several per forward (the same output; faster where the text repeats).")
    draft_model: tuple | None = option(                                # (Model, Tokenizer) of a small model that drafts
        None, _maybe(lambda v: isinstance(v, tuple) and len(v) == 2 and hasattr(v[0], "forward")),
        "a (model, tokenizer) pair, as minigen.load returns")
    draft_tokens: int | None = option(None, _maybe(lambda v: is_int(v) and 0 <= v <= 64), "an integer in 0..64",
                                      flags=("--draft-tokens",), type=int,
                                      help="At most this many drafts per forward (default 16, adaptive; 0: none).")
    # (speculative decoding, generation/speculative.py: at most draft_tokens drafts per forward; None: 16)
    constraint: constraints.Constraint | None = option(   # generation/constraint.py; the CLI's --json-schema & co
        None, _maybe(lambda v: isinstance(v, constraints.Constraint)),
        "a JSON schema, a regex or a grammar: {\"json_schema\": ...}, {\"json_object\": true}, {\"regex\": ...}, "
        "{\"grammar\": ...}")

    def __post_init__(self):
        stop = self.stop
        if isinstance(stop, (str, list)):  # one stop string, or a list of them, as the API takes them
            object.__setattr__(self, "stop", (stop,) if isinstance(stop, str) else tuple(stop))
        if self.constraint is not None:   # the dict forms compiled here: a bad schema is an OptionError
            try:
                object.__setattr__(self, "constraint", constraints.from_value(self.constraint))
            except ValueError as e:
                raise OptionError("constraint", str(e)) from None
        for f in fields(self):
            value = getattr(self, f.name)
            if not spec(f).check(value):
                raise OptionError(f.name, f"should be {spec(f).what}, got {short(value, 40)}")
        for clash, name, message in _clashes(self):
            if clash:
                raise OptionError(name, message)

    @classmethod
    def of(cls, **options) -> "Options":
        """Options from keywords named like the fields; an unknown name is an OptionError naming it."""
        return cls().update(**options)

    def update(self, **changes) -> "Options":
        """These options with some changed, checked again (an unknown name is an OptionError)."""
        unknown = set(changes) - set(NAMES)
        if unknown:
            raise OptionError(sorted(unknown)[0], f"no such option (options: {', '.join(NAMES)})")
        return replace(self, **changes) if changes else self

    def for_model(self, model) -> "Options":
        """Every None the checkpoint decides filled in (generation_config.json, the model's context), and
        max_context checked against the model's."""
        model_context = model.config.max_position_embeddings
        if self.max_context is not None and self.max_context > model_context:
            raise OptionError("max_context", f"{self.max_context} is larger than the model's context "
                                             f"({model_context} tokens, max_position_embeddings)")
        filled = {f.name: spec(f).fallback(model) for f in fields(self)
                  if getattr(self, f.name) is None and spec(f).fallback is not None}
        return replace(self, **filled) if filled else self


def _clashes(o: Options) -> list[tuple[bool, str, str]]:
    """Options that do not go together: (given together, the option named, the message)."""
    return [(o.record_attention and (o.prompt_lookup or o.draft_model is not None),
             "prompt_lookup" if o.prompt_lookup else "draft_model",
             "cannot be combined with recording attention (a verifying forward holds drafts)"),
            (o.prompt_lookup and o.draft_model is not None, "draft_model",
             "choose one drafter: prompt_lookup or draft_model, not both"),
            (o.constraint is not None and o.ignore_eos, "ignore_eos",
             "cannot be combined with a constraint (a complete output allows only EOS next)")]


NAMES = tuple(f.name for f in fields(Options))
REQUEST_FIELDS = {   # the OpenAI API's (and vLLM's) spelling of a request field -> the Options field
    "temperature": "temp", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "repetition_penalty": "repeat_penalty", "seed": "seed",
}


def flags_of(command: str) -> tuple:
    """The fields of Options that `command` (generate, chat) has flags for, in the table's order."""
    return tuple(f for f in fields(Options) if spec(f).flags and command in spec(f).commands)


def summary(options: Options) -> str:
    """The settings as `-v` shows them: "temp 0.0, top-k 0, ..., repeat-penalty 1.0 (last 64), seed None, ..."."""
    out = ""
    for f in fields(options):
        show = spec(f).show
        if show is not None:
            out += ("" if show.startswith(" ") or not out else ", ") + show.format(getattr(options, f.name))
    return out


def check_prompt(ids: Sequence[int], model, max_context: int | None = None, flag: str | None = "--max-context"):
    """A prompt's ids, for any command that runs them: at least one, no more than the context (the
    model's, or `max_context`), each within the model's vocabulary. `flag`: what sets the context."""
    context = max_context or model.config.max_position_embeddings
    if len(ids) == 0:
        raise MinigenError("the prompt is empty (no tokens to start from)")
    if len(ids) > context:
        raise MinigenError(f"the prompt is {len(ids)} tokens, longer than the context of {context} tokens"
                           + (f" ({flag})" if flag else "") + "; shorten it")
    vocab = model.config.vocab_size
    outside = next((i for i in ids if not 0 <= i < vocab), None)
    if outside is not None:  # ids given, or a tokenizer larger than the model's vocab_size
        raise MinigenError(f"prompt: token id {outside} is outside the model's vocabulary (0..{vocab - 1})")

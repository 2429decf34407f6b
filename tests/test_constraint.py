"""Constrained output (generation/constraint.py): the mask removes only what the grammar forbids.

References, none of them minigen's own constrained output: unconstrained greedy decoding on the same model
(a constraint that its output already follows must not change a token), `re.fullmatch` and the
`jsonschema` package (every output that finished on EOS matches its regex / validates against its
schema), and the same constraint run alone (a batch, speculative decoding, a draft model's guesses).
"""
import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import minigen
from minigen.cli import main
from minigen.errors import OptionError
from minigen.generation import constraint as C
from minigen.generation.batch import batch_runs
from minigen.generation.options import Options
from minigen.generation.sequence import eos_token_ids
from minigen.generation.speculative import speculative_step
from minigen.generation.steps import Run, generate_step

jsonschema = pytest.importorskip("jsonschema")

FIXTURES = Path(__file__).parent / "fixtures"
PROMPTS = ["The capital of France is", "def fib(n):", "Hello"]


def load(name):
    return minigen.load(FIXTURES / name)


def token_set(ids):
    """A grammar over tokens: any sequence of the ids given (a random model's output is not UTF-8 text)."""
    return C.lark("start: tok*\ntok: <[" + ",".join(str(i) for i in sorted(set(ids))) + "]>\n")


def run_ids(model, tok, prompt, **options):
    r = Run.from_prompt(model, tok, prompt, **options)
    r.text()
    return list(r.tokens), r.stats.finish


# --- compiling: one line, before any model ------------------------------------------------------------

@pytest.mark.parametrize("value, message", [
    ({"json_schema": {"type": "integr"}}, "json_schema: Invalid type: integr"),
    ({"json_schema": "{not json"}, "json_schema: not JSON"),
    ({"json_schema": [1, 2]}, "json_schema: a JSON schema is an object"),
    ({"regex": "a(b"}, "regex: invalid regex"),
    ({"regex": ""}, "regex: a regular expression is a non-empty string"),
    ({"grammar": "start: foo"}, 'grammar: line 1, column 8: unknown name: "foo"'),
    ({"grammar": "root ::= foo"}, "grammar: GBNF: Rule 'foo' not found"),
    ({"json_object": False}, "json_object: should be true"),
    ({"yaml": "x"}, "should be one of"),
    ("a+", "should be one of"),
])
def test_what_does_not_compile_is_one_line_naming_the_option(value, message):
    with pytest.raises(OptionError) as e:
        Options.of(constraint=value)
    assert e.value.option == "constraint" and message in e.value.message and "\n" not in str(e.value)


def test_a_constraint_and_ignore_eos_are_refused_together():
    with pytest.raises(OptionError, match="ignore_eos"):
        Options.of(constraint={"regex": "a"}, ignore_eos=True)


@pytest.mark.parametrize("flags, flag, message", [
    (["--json-schema", '{"type": "integr"}'], "--json-schema", "Invalid type: integr"),
    (["--json-schema", "no-such-file.json"], "--json-schema", "no such file, and not a schema's JSON text"),
    (["--regex", "(a"], "--regex", "unclosed group"),
    (["--grammar", "no-such-file.lark"], "--grammar", "cannot read the grammar"),
    (["--regex", "a", "--json-object"], "--json-object and --regex", "give one constraint"),
])
def test_cli_refuses_a_bad_constraint_before_loading_the_model(tmp_path, flags, flag, message):
    r = CliRunner().invoke(main, ["generate", "x", "--model", str(tmp_path / "no-model")] + flags)
    assert r.exit_code == 2, r.output
    assert flag in r.output and message in r.output and "no-model" not in r.output


def test_cli_grammar_file_lark_and_gbnf(tmp_path):
    (tmp_path / "g.lark").write_text('start: "yes" | "no"\n')
    (tmp_path / "g.gbnf").write_text('root ::= ("yes" | "no") "!"\n')
    for name, pattern in (("g.lark", "(yes|no)"), ("g.gbnf", "(yes|no)!")):
        r = CliRunner().invoke(main, ["generate", "Is it?", "--model", str(FIXTURES / "qwen2"), "-q", "-m", "8",
                                      "--grammar", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        assert re.fullmatch(pattern, r.output), r.output


def test_cli_chat_constrains_every_reply():
    r = CliRunner().invoke(main, ["chat", "--model", str(FIXTURES / "qwen2"), "-q", "-m", "8", "--regex", "(yes|no)"],
                           input="Is it?\nAnd now?\n")
    assert r.exit_code == 0, r.output
    assert all(line in ("yes", "no") for line in r.stdout.splitlines()) and len(r.stdout.splitlines()) == 2


# --- the mask removes only what the grammar forbids ---------------------------------------------------

@pytest.mark.parametrize("name", ["qwen2", "llama_gqa3", "gpt2", "gemma2", "phi3", "smollm3", "qwen3_5_text"])
def test_greedy_output_that_follows_the_grammar_is_unchanged(name):
    """A grammar over a third of the vocabulary and the tokens greedy decoding chose: the same ids
    (qwen2's logits cover 512 ids, its tokenizer 500: the 12 past it are never allowed)."""
    model, tok = load(name)
    V = model.config.vocab_size
    for prompt in PROMPTS:
        ids, finish = run_ids(model, tok, prompt, max_tokens=16)
        others = np.random.default_rng(0).choice(V, V // 3, replace=False)
        assert run_ids(model, tok, prompt, max_tokens=16, constraint=token_set(list(ids) + list(others))) == \
            (ids, finish)
        # and the control: without the first greedy token, the first token is another one of the set
        allowed = set(int(i) for i in others) - {ids[0]}
        got, _ = run_ids(model, tok, prompt, max_tokens=4, constraint=token_set(allowed))
        assert got[0] != ids[0] and set(got) <= allowed


@pytest.fixture(scope="module")
def smollm2():
    from minigen.gguf import default_model
    out = default_model.weights_dir() / default_model.NAME
    if not default_model.is_converted(out) and default_model.gguf_source() is None:
        pytest.skip("no default model")
    return minigen.load(default_model.default_model_path())


def shape(text: str) -> str:
    """A regex of the text's shape: each run of letters, digits or spaces as any such run, the rest as is."""
    return "".join(r"[^\W\d_]+" if t[0].isalpha() else r"\d+" if t[0].isdigit() else r"\s+" if t[0].isspace()
                   else re.escape(t) for t in re.findall(r"[^\W\d_]+|\d+|\s+|.", text, re.S))


def test_greedy_text_that_follows_the_grammar_is_unchanged_on_the_default_model(smollm2):
    """The default model's greedy replies, under regexes of their shape and (its JSON comes in a fence)
    a grammar of a fence around a JSON schema, then any text: the same ids, the same finish."""
    model, tok = smollm2
    cases = [("What is the capital of France?", 16), ("List three colours.", 12),
             ('Reply with only a JSON object with keys "city" and "country" for Paris.', 24)]
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    fenced = C.lark('start: "```json\\n" obj REST\nobj: %json ' + json.dumps(schema) + '\nREST: /(.|\\n)*/\n')
    first = batch_runs(model, tok, [p for p, _ in cases], [{"max_tokens": n} for _, n in cases], chat=True)
    runs = [(i, c) for i, r in enumerate(first) for c in (C.regex(re.escape(r.text)), C.regex(shape(r.text)))
            + ((fenced,) if "JSON" in cases[i][0] else ())]
    again = batch_runs(model, tok, [cases[i][0] for i, _ in runs],
                       [{"max_tokens": cases[i][1], "constraint": c} for i, c in runs], chat=True)
    for (i, _), r in zip(runs, again):
        assert (r.tokens, r.finish_reason) == (first[i].tokens, first[i].finish_reason)
    text = first[-1].text
    assert text.startswith("```json\n{")   # the fenced grammar above was tried on JSON the model wrote


def test_a_grammar_that_cannot_finish_ends_on_length_with_what_was_made():
    model, tok = load("qwen2")
    r = Run.from_prompt(model, tok, "x", max_tokens=6, constraint={"regex": "a{50}"})
    text = r.text()
    assert r.stats.finish == "length" and r.stats.generated_tokens == 6 and re.fullmatch("a+", text)


def test_a_complete_grammar_allows_only_eos():
    model, tok = load("qwen2")
    for seed in range(5):
        r = Run.from_prompt(model, tok, "x", max_tokens=30, temp=1.0, seed=seed, constraint={"regex": "(yes|no)!"})
        assert re.fullmatch("(yes|no)!", r.text()) and r.stats.finish == "eos"


# --- every output that finished is valid ------------------------------------------------------------------

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "array", "items": {"type": "number", "minimum": -5, "maximum": 5}, "maxItems": 4},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
     "required": ["ok"]},
    {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "^[a-z]{1,6}$"}]},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date"},
                                      "point": {"type": "object", "properties": {"x": {"type": "integer"}},
                                                "required": ["x"], "additionalProperties": False}},
     "required": ["when", "point"], "additionalProperties": False},
]


@pytest.mark.parametrize("name", ["qwen2", "llama_gqa3"])
def test_every_finished_output_validates_on_random_models(name):
    """A random model sampled at temperature 1 under each schema: what ends on EOS parses and validates."""
    model, tok = load(name)
    finished = 0
    for i, schema in enumerate(SCHEMAS):
        prompts = [f"{i} {seed}" for seed in range(6)]
        results = batch_runs(model, tok, prompts, [{"max_tokens": 48, "temp": 1.0, "seed": s,
                                                    "constraint": {"json_schema": schema}} for s in range(6)])
        for r in results:
            if r.finish_reason == "eos":
                jsonschema.validate(json.loads(r.text), schema, format_checker=jsonschema.FormatChecker())
                finished += 1
    assert finished >= 10


def test_every_finished_output_validates_on_the_default_model(smollm2):
    """Schemas and prompts written for this test, greedy and sampled, in one batch: 100 % of the outputs
    that finished on EOS validate (jsonschema), and most finish."""
    model, tok = smollm2
    cases = [("Describe a cat as JSON.", {"type": "object", "properties": {"name": {"type": "string"},
                                                                            "legs": {"type": "integer", "minimum": 0}},
                                           "required": ["name", "legs"], "additionalProperties": False}),
             ("Is water wet?", {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                                                 "confidence": {"type": "number"}},
                                "required": ["answer", "confidence"], "additionalProperties": False}),
             ("Name three fruits.", {"type": "array", "items": {"type": "string", "maxLength": 20},
                                     "minItems": 3, "maxItems": 3}),
             ("When did the Second World War end?", {"type": "object", "properties": {
                 "year": {"type": "integer", "minimum": 1900, "maximum": 2100}}, "required": ["year"],
                 "additionalProperties": False})]
    prompts, options = [], []
    for prompt, schema in cases:
        for temp, seed in ((0, None), (0.8, 1)):
            prompts.append(prompt)
            options.append({"max_tokens": 48, "temp": temp, "seed": seed, "constraint": {"json_schema": schema}})
    results = batch_runs(model, tok, prompts, options, chat=True)
    for r, (_, schema) in zip(results, [c for c in cases for _ in range(2)]):
        if r.finish_reason == "eos":
            jsonschema.validate(json.loads(r.text), schema)
    assert sum(r.finish_reason == "eos" for r in results) >= 6, [r.text for r in results]


# --- every loop: the batch, speculative decoding, a draft model ---------------------------------------------

def test_follow_rolls_back_to_any_earlier_point():
    """The processor given shorter or different tokens (rejected drafts) masks as one fed them directly."""
    model, tok = load("qwen2")
    c = C.json_schema(SCHEMAS[0]).bind(tok, model.config.vocab_size, eos_token_ids(model))
    prompt = tok.encode("p")
    text_ids = tok.encode('{"name": "Bob", "age": 42}', add_special_tokens=False)
    f = c.processor()
    f(np.zeros(512, np.float32), prompt)
    for cut in (len(text_ids), 3, 7, 1, len(text_ids), 0, 5):
        f.follow(text_ids[:cut])
        fresh = c.processor()
        fresh.follow(text_ids[:cut])
        assert (f.allowed() == fresh.allowed()).all()
    eos = eos_token_ids(model)[0]
    f.follow(text_ids[:9] + [eos, eos, 5])                            # a draft model's guesses past an EOS
    f.follow(text_ids[:7])
    fresh = c.processor()
    fresh.follow(text_ids[:7])
    assert (f.allowed() == fresh.allowed()).all()
    f.follow(text_ids[:4] + [text_ids[4]])
    f.follow(text_ids[:2])                                            # back past a different branch
    fresh = c.processor()
    fresh.follow(text_ids[:2])
    assert (f.allowed() == fresh.allowed()).all()


def test_a_batch_gives_each_sequence_the_output_it_gets_alone():
    model, tok = load("qwen2")
    per = [{"max_tokens": 24, "constraint": {"json_schema": SCHEMAS[0]}},
           {"max_tokens": 24},
           {"max_tokens": 24, "temp": 1.0, "seed": 3, "constraint": {"regex": "[a-z ]{3,30}"}},
           {"max_tokens": 24, "temp": 0.7, "seed": 5, "constraint": {"json_object": True}}]
    results = batch_runs(model, tok, PROMPTS + ["x"], per)
    for r, prompt, o in zip(results, PROMPTS + ["x"], per):
        assert (r.tokens, r.finish_reason) == run_ids(model, tok, prompt, **o)


class Always:
    """A draft model's guesses at full length on every forward, whatever its policy would choose."""

    def __init__(self, drafter):
        self.d = drafter
        drafter.policy.choose = lambda kind, available: min(available, drafter.policy.max_draft)

    def draft(self, *args, left=None):   # at full length: not skipped for a catch-up that would not pay
        return self.d.draft(*args)

    def feedback(self, *args):
        self.d.feedback(*args)


@pytest.mark.parametrize("name", ["qwen2", "llama_gqa3", "gemma2"])
def test_speculative_decoding_under_a_constraint_gives_the_same_output(name):
    """Prompt lookup (its drafts verified through the mask), and draft models whose guesses go through
    the processor first and are rolled back (the model itself; one with its output rows reversed, so
    that most guesses are rejected): the tokens of plain constrained decoding."""
    from minigen.generation import speculative as S
    model, tok = load(name)
    V = model.config.vocab_size
    ids, _ = run_ids(model, tok, "Hello", max_tokens=40)
    wrong = minigen.load(FIXTURES / name, dtype="float32")[0]   # float32: its rows reversed below
    wrong.params = {**wrong.params, "lm_head": wrong.params["lm_head"][::-1].copy()}
    prompt = tok.encode("Hello")
    for c in (token_set(ids + list(np.random.default_rng(1).choice(V, V // 2, replace=False))),
              C.json_schema(SCHEMAS[0])):
        plain = run_ids(model, tok, "Hello", max_tokens=40, constraint=c)
        lookup = Run.from_prompt(model, tok, "Hello", max_tokens=40, constraint=c, prompt_lookup=True)
        lookup.text()
        assert (list(lookup.tokens), lookup.stats.finish) == plain
        o = Options(max_tokens=40, constraint=c.bind(tok, model.config.vocab_size, eos_token_ids(model)))
        for draft in (model, wrong):
            steps = list(speculative_step(model, prompt, o, drafter=Always(S.DraftModel(draft, 5))))
            assert [s.token for s in steps if s.finish != "eos"] == plain[0] and steps[-1].finish == plain[1]
            assert sum(s.drafted for s in steps) > 0


def test_verify_checks_every_draft_against_the_grammar():
    """A drafter that guesses tokens the grammar forbids: they are rejected, the output is plain's."""
    model, tok = load("qwen2")
    c = C.regex("[ab]{10,40}").bind(tok, model.config.vocab_size, eos_token_ids(model))
    o = Options(max_tokens=30, constraint=c)
    plain = [s.token for s in generate_step(model, tok.encode("x"), o)]

    class Wrong:
        def draft(self, tokens, room, sampler, processors, rng, left=None):
            return [tok.encode("c", add_special_tokens=False)[0]] * min(room, 3), None

        def feedback(self, *args):
            pass

    steps = list(speculative_step(model, tok.encode("x"), o, drafter=Wrong()))
    assert [s.token for s in steps] == plain
    assert sum(s.drafted for s in steps) == 0     # cut before the forward: no row verified a forbidden guess


def test_admits_counts_the_drafts_the_grammar_allows():
    """Follow.admits: the length of the draft's prefix the grammar allows after the output so far,
    the output's own point kept (the matcher rolled back to it, not advanced by the check)."""
    model, tok = load("qwen2")
    c = C.regex("ab{2,3}c").bind(tok, model.config.vocab_size, eos_token_ids(model))
    f = c.processor()
    one = {ch: tok.encode(ch, add_special_tokens=False) for ch in "abc"}
    assert all(len(v) == 1 for v in one.values())
    a, b, cc = one["a"][0], one["b"][0], one["c"][0]
    prompt = tok.encode("x")
    assert f.admits(prompt, [a, b, b, cc]) == 4
    assert f.admits(prompt, [a, cc]) == 1
    assert f.admits(prompt, [b]) == 0
    assert f.admits(prompt + [a, b], [b, b, cc, b]) == 3     # a fourth b is too many; the c ends it
    assert f.admits(prompt + [a, b], [cc]) == 0              # one b is too few
    eos = eos_token_ids(model)[0]
    assert f.admits(prompt + [a, b, b, cc], [eos]) == 1
    assert f.admits(prompt + [a, b], [b, cc, eos, a]) == 3     # an EOS where the output may end counts
    assert f.admits(prompt + [a, b], [b, eos]) == 1
    fresh = c.processor()
    fresh.follow([a, b])
    f.follow([a, b])
    assert (f.allowed() == fresh.allowed()).all()

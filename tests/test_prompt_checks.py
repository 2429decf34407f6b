"""Every command that runs a prompt refuses it the same way: one reader (bounded), one check (options.check_prompt)."""
from pathlib import Path

import pytest
from click.testing import CliRunner

import minigen
from minigen.cli import harness, main

MODEL = Path(__file__).parent / "fixtures" / "llama_gqa3"   # max_position_embeddings 256
LONG = "The cat sat on the mat. " * 60                      # 721 tokens with its BOS

COMMANDS = {
    "generate": ["generate", LONG, "-n", "2"],
    "attention": ["attention", LONG],
    "trace": ["trace", LONG, "--layer", "0", "--head", "0"],
    "lens": ["lens", LONG],
    "ablate": ["ablate", LONG, "--heads", "0.0"],
    "patch": ["patch", LONG, LONG],
    "dla": ["dla", LONG],
}


def cli(*args, input=None):
    return CliRunner().invoke(main, [*args, "--model", str(MODEL)], input=input)


def test_the_long_prompt_is_longer_than_the_context():
    model, tok = minigen.load(MODEL)
    assert len(tok.encode(LONG)) == 721 > model.config.max_position_embeddings == 256


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_prompt_longer_than_the_context_is_refused_in_one_line(command):
    r = cli(*COMMANDS[command])
    assert r.exit_code == 1 and r.stdout == "", (command, r.output)
    hint = " (--max-context)" if command == "generate" else ""  # the flag that sets the context, where there is one
    assert r.stderr == f"minigen: error: the prompt is 721 tokens, longer than the context of 256 tokens{hint}; " \
                       f"shorten it\n"


def test_patch_checks_its_second_prompt_too():
    r = cli("patch", "The cat sat", LONG)
    assert r.exit_code == 1 and "the prompt is 721 tokens" in r.stderr


@pytest.mark.parametrize("command", ["lens", "dla", "attention"])
def test_inspection_prompts_from_stdin_are_bounded_as_generates_are(command, monkeypatch):
    monkeypatch.setattr(harness, "PROMPT_LIMIT", 1000)
    for argv in (["generate", "-p", "-"], [command, "-"]):
        r = cli(*argv, input="a" * 1001)
        assert r.exit_code == 2 and "longer than minigen reads (1,000 bytes)" in r.output, (argv, r.output)
    assert cli(command, "-", input="The cat sat on the mat").exit_code == 0


def test_inspection_prompt_not_utf8_is_a_usage_error_naming_it():
    for argv in (["generate", "-p", "-"], ["lens", "-"]):
        r = cli(*argv, input=b"caf\xe9")
        assert r.exit_code == 2 and "not valid UTF-8 (bad byte at offset 3)" in r.output, argv


def test_chat_takes_the_same_model_flag_as_every_command():
    def model_line(command):
        text = CliRunner().invoke(main, [command, "--help"]).output
        return " ".join(text[text.index("  --model"):text.index("\n  -", text.index("  --model"))].split())
    assert model_line("chat") == model_line("generate") == model_line("lens") == model_line("info")

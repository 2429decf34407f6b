"""The bounded readers (minigen/files.py): whatever stands where a file should be, a directory, a FIFO, a
device, a broken or looping symlink, a file minigen may not read, the error names the file and says what
is there, in one line; nothing hangs and nothing is read past the caller's limit. Then the same through
minigen.load and the CLI, for every file a checkpoint has and every file a command reads."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import minigen
from conftest import FIXTURES_DIR
from minigen.cli import main
from minigen.errors import MinigenError
from minigen.files import read_bounded, read_json_object, read_regular

CHECKPOINT_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                    "chat_template.jinja", "generation_config.json"]


def make(path: Path, kind: str) -> Path:
    """Put a `kind` where `path` is: dir, fifo, device (a link to /dev/null), broken-link, loop."""
    if path.exists() or path.is_symlink():
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    if kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to(os.devnull)
    elif kind == "broken-link":
        path.symlink_to(path.parent / "nothing-here")
    elif kind == "loop":
        path.symlink_to(path.name)
    return path


SAYS = {"dir": "is a directory", "fifo": "is a FIFO", "device": "is a device",
        "broken-link": "a symbolic link to", "loop": "a symbolic link that leads to itself"}


@pytest.mark.parametrize("kind", list(SAYS))
@pytest.mark.parametrize("reader", [lambda f: read_regular(f, 100, "config"), lambda f: read_json_object(f)])
def test_regular_file_readers_name_what_is_there(tmp_path, kind, reader):
    f = make(tmp_path / "config.json", kind)
    with pytest.raises(MinigenError) as e:
        reader(f)  # a FIFO nobody writes to: refused, not waited on
    assert str(e.value).startswith(f"{f}: ") and SAYS[kind] in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["dir", "broken-link", "loop"])
def test_bounded_reader_refuses_what_cannot_be_read(tmp_path, kind):
    f = make(tmp_path / "prompt.txt", kind)
    with pytest.raises(MinigenError, match=SAYS[kind]) as e:
        read_bounded(f, 100, "prompt file")
    assert str(e.value).startswith(f"{f}: ")


def test_bounded_reader_reads_pipes_and_devices(tmp_path):
    assert read_bounded(make(tmp_path / "fifo", "fifo"), 100) == b""  # no writer: empty, at once
    assert read_bounded(make(tmp_path / "null", "device"), 100) == b""
    with pytest.raises(MinigenError, match="longer than minigen reads"):
        read_bounded("/dev/zero", 100)


def _as_nobody(call):
    """call() as an unprivileged user, in a forked child, when the tests run as root (whom no file mode
    stops); its MinigenError message (or "") comes back through a pipe."""
    def run():
        try:
            call()
            return ""
        except MinigenError as e:
            return str(e)
    if os.geteuid() != 0:
        return run()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            os.write(w, run().encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        message = f.read().decode()
    os.waitpid(pid, 0)
    return message


def test_unreadable_file_is_named():
    d = Path(tempfile.mkdtemp())
    try:
        d.chmod(0o755)  # the directory is open to all: only the file's own mode can refuse
        readable, secret = d / "readable.json", d / "secret.json"
        readable.write_text("{}")
        secret.write_text("{}")
        readable.chmod(0o644)
        secret.chmod(0o000)
        assert _as_nobody(lambda: read_json_object(readable)) == ""
        message = _as_nobody(lambda: read_json_object(secret))
        assert message == f"{secret}: cannot read the JSON file (Permission denied)"
    finally:
        shutil.rmtree(d)


def test_limit_is_kept(tmp_path):
    f = tmp_path / "big.json"
    f.write_text("[" + "1," * 100 + "1]")
    with pytest.raises(MinigenError, match="more than minigen reads"):
        read_regular(f, 100, "JSON file")


# --- through minigen.load and the CLI ---------------------------------------------------------------

def checkpoint(tmp_path: Path, fixture: str = "llama_gqa3") -> Path:
    out = tmp_path / fixture
    shutil.copytree(FIXTURES_DIR / fixture, out, ignore=shutil.ignore_patterns("*.npz"))
    return out


@pytest.mark.parametrize("name", CHECKPOINT_FILES)
@pytest.mark.parametrize("kind", ["dir", "fifo"])
def test_load_names_the_file_a_directory_stands_in_for(tmp_path, name, kind):
    ckpt = checkpoint(tmp_path)
    f = make(ckpt / name, kind)
    with pytest.raises(MinigenError, match=f"^{f}: .*{SAYS[kind]}"):
        minigen.load(ckpt)


def test_load_names_a_shard_that_is_a_directory(tmp_path):
    ckpt = checkpoint(tmp_path, "llama_sharded")
    shard = sorted(set(json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"].values()))[0]
    with pytest.raises(MinigenError, match=f"^{ckpt / shard}: the safetensors file is a directory"):
        minigen.load(make(ckpt / shard, "dir").parent)


def one_line_error(r, *words):
    lines = r.stderr.splitlines()
    assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("minigen: error: "), r.output
    assert "Traceback" not in r.output
    for w in words:
        assert w in lines[0], lines[0]


@pytest.mark.parametrize("name", CHECKPOINT_FILES)
def test_cli_names_the_file_not_a_descriptor(tmp_path, name):
    ckpt = checkpoint(tmp_path)
    f = make(ckpt / name, "dir")
    r = CliRunner().invoke(main, ["generate", "--model", str(ckpt), "--chat", "-m", "2", "-q", "hi"])
    one_line_error(r, f"{f}: ", "is a directory")


@pytest.mark.parametrize("kind", ["dir", "fifo", "broken-link"])
def test_cli_model_gguf_that_is_not_a_file(tmp_path, kind):
    f = make(tmp_path / "m.gguf", kind)
    r = CliRunner().invoke(main, ["generate", "--model", str(f), "hi"])
    one_line_error(r, f"{f}: is ", SAYS[kind], "not a GGUF file" if kind == "dir" else "not a checkpoint directory")


def test_convert_a_fifo(tmp_path):
    f = make(tmp_path / "m.gguf", "fifo")
    r = CliRunner().invoke(main, ["convert", str(f), str(tmp_path / "out")])
    one_line_error(r, f"{f}: the GGUF file is a FIFO")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_chat_load_that_is_not_a_file(tmp_path, kind):
    f = make(tmp_path / "conversation.json", kind)
    r = CliRunner().invoke(main, ["chat", "--model", str(FIXTURES_DIR / "llama_gqa3"), "--load", str(f)], input="hi\n")
    one_line_error(r, f"{f}: the conversation file {SAYS[kind]}")


@pytest.mark.parametrize("kind", ["dir", "fifo", "broken-link"])
def test_attention_from_that_is_not_a_file(tmp_path, kind):
    f = make(tmp_path / "dump.npz", kind)
    r = CliRunner().invoke(main, ["attention", "--from", str(f)])
    one_line_error(r, f"{f}: is ", SAYS[kind], "not an attention dump")

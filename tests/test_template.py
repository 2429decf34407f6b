"""Real chat templates render as transformers renders them: the templates of checkpoints of the families
minigen runs (from llama.cpp's models/templates) and transformers' own renderings of them, made by
scripts/make_template_fixtures.py (tests/fixtures/chat_templates/references.json)."""
from __future__ import annotations

import json
import re

import pytest

from conftest import FIXTURES_DIR
from minigen.errors import MinigenError
from minigen.text.template import render_chat_template

DIR = FIXTURES_DIR / "chat_templates"
REFS = json.loads((DIR / "references.json").read_text(encoding="utf-8"))


@pytest.mark.usefixtures("rendered_today")
@pytest.mark.parametrize("ref", REFS["renders"],
                         ids=lambda r: f"{r['template'][:-6]}-{r['conversation']}-{'gen' if r['add_generation_prompt'] else 'nogen'}")
def test_renders_as_transformers(ref):
    template = (DIR / ref["template"]).read_text(encoding="utf-8")
    messages = REFS["conversations"][ref["conversation"]]
    variables = {**REFS["variables"], **({"tools": REFS["tools"]} if ref.get("tools") else {})}
    if ref["error"] is not None:  # the template itself refuses, e.g. Gemma 2 and a system message
        with pytest.raises(MinigenError, match="chat template: .*" + re.escape(ref["error"][:40])):
            render_chat_template(template, messages, ref["add_generation_prompt"], **variables)
        return
    assert render_chat_template(template, messages, ref["add_generation_prompt"], **variables) == ref["text"]


def test_strftime_now_reads_the_clock():
    """Unpinned, a template's strftime_now is today's date where the process runs (as transformers': the
    references were rendered on a pinned day, which the tests above give minigen's clock too)."""
    from datetime import datetime
    before = datetime.now().strftime("%B %d, %Y")
    got = render_chat_template("{{ strftime_now('%B %d, %Y') }}", [], False)
    assert got in {before, datetime.now().strftime("%B %d, %Y")}


def test_the_references_cover_what_matters():
    """Every template rendered, some refusing, one with transformers' {% generation %} block, non-ASCII text."""
    names = {r["template"] for r in REFS["renders"]}
    assert names == {p.name for p in DIR.glob("*.jinja")} and len(names) >= 9
    assert any(r["error"] for r in REFS["renders"]) and sum(r["text"] is not None for r in REFS["renders"]) >= 60
    assert re.search(r"{%-? *generation *-?%}", (DIR / "LFM2.5-8B-A1B.jinja").read_text(encoding="utf-8"))
    assert any("漢字" in (r["text"] or "") for r in REFS["renders"])
    with_tools = {r["template"] for r in REFS["renders"] if r.get("tools") and r["text"] and "get_weather" in r["text"]}
    assert len(with_tools) >= 6   # the templates that render tools: Qwen2.5, Qwen3, Llama 3.2, Mistral, Granite, LFM2.5


def test_a_render_forks_inside_the_guard_of_its_thread_and_renders_outside_it():
    """The server's ForkGate is held for the fork alone (template.fork_inside): the child, forked inside the guard,
    renders while the parent has left it (its template reads a byte the guard's exit writes, in the parent:
    held over the render, the two would wait for each other until the time limit); a render on another
    thread, or outside the context, forks without it."""
    import os
    import threading
    from contextlib import contextmanager
    from minigen.text import template

    entered = []

    @contextmanager
    def guard():
        entered.append(threading.get_ident())
        yield
        os.write(w, b"x")   # left, in the parent: the child may go on

    r, w = os.pipe()
    try:
        with template.fork_inside(guard):
            text = render_chat_template("{{ wait() }}", [], False, wait=lambda: os.read(r, 1).decode())
            other = []
            t = threading.Thread(target=lambda: other.append(render_chat_template("{{ 1 + 1 }}", [], False)))
            t.start()
            t.join()
        after = render_chat_template("{{ 2 + 2 }}", [], False)
    finally:
        os.close(r)
        os.close(w)
    assert text == "x" and entered == [threading.get_ident()]   # once, on this thread
    assert other == ["2"] and after == "4"


def test_renders_share_one_kept_process_which_starts_inside_the_guard():
    """Renders go to one process, started at the first render inside this thread's fork guard (as the server's
    ForkGate wants) and kept: a second render starts nothing and enters no guard."""
    import threading
    from contextlib import contextmanager
    from minigen.text import template

    entered = []

    @contextmanager
    def guard():
        entered.append(threading.get_ident())
        yield

    template.WORKER.stop()
    with template.fork_inside(guard):
        first = render_chat_template("{{ messages[0]['content'] }}", [{"role": "user", "content": "one"}], False)
        pid = template.WORKER.proc.pid
        second = render_chat_template("{{ messages[0]['content'] }}!", [{"role": "user", "content": "two"}], False)
    assert (first, second) == ("one", "two!") and template.WORKER.proc.pid == pid and entered == [threading.get_ident()]
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        assert b"minigen.text.sandbox import work" in f.read()


def test_a_render_past_the_time_limit_ends_the_process_and_the_next_starts_another(monkeypatch):
    from minigen.text import template
    render_chat_template("{{ 1 }}", [], False)   # started (and jinja2 imported) under the usual limit
    stuck, usual = template.WORKER.proc, template.TIME_LIMIT
    monkeypatch.setattr(template, "TIME_LIMIT", 0.5)
    with pytest.raises(MinigenError, match="chat template: rendering took longer than 0.5 s"):
        render_chat_template("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", [], False)
    assert stuck.poll() is not None and template.WORKER.proc is None            # killed, not left running
    monkeypatch.setattr(template, "TIME_LIMIT", usual)   # the next process starts under the usual limit
    assert render_chat_template("{{ 3 * 3 }}", [], False) == "9" and template.WORKER.proc.pid != stuck.pid


def test_the_process_survives_a_render_out_of_memory_and_reads_the_callers_clock(monkeypatch):
    """A template that asks for 1 GB fails within the process's memory limit, and the process renders on; the
    time strftime_now reads is the caller's (pinned here), sent with each render."""
    import datetime
    from minigen.text import template
    render_chat_template("{{ 1 }}", [], False)
    pid = template.WORKER.proc.pid
    with pytest.raises(MinigenError, match="needs more memory than allowed"):
        render_chat_template("{{ 'a' * 10**9 }}", [], False)
    monkeypatch.setattr(template, "now", lambda: datetime.datetime(1999, 12, 31, 23, 59))
    assert render_chat_template("{{ strftime_now('%d %B %Y') }}", [], False) == "31 December 1999"
    assert template.WORKER.proc.pid == pid


def test_the_process_leaves_when_its_parent_is_killed():
    """A parent killed with SIGKILL leaves its render process behind with a closed pipe: it exits."""
    import os
    import subprocess
    import sys
    import time
    code = ("import os, signal, sys; from minigen.text import template; template.render_chat_template('{{ 1 }}', []); "
            "print(template.WORKER.proc.pid, flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":   # exited, not yet reaped by its new parent
                    return
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.05)
    pytest.fail(f"the render process {pid} outlived its parent")


def test_a_forked_child_renders_with_its_own_process():
    """After os.fork the parent's render process is not the child's: the child starts its own and renders,
    and the parent's goes on serving the parent."""
    import os
    from minigen.text import template
    render_chat_template("{{ 1 }}", [], False)
    parent = template.WORKER.proc.pid
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            text = render_chat_template("{{ 6 * 7 }}", [], False)
            os.write(w, f"{text} {template.WORKER.proc.pid}".encode())
            template.WORKER.stop()
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 100).decode().split()
    os.close(r)
    os.waitpid(pid, 0)
    assert got[0] == "42" and int(got[1]) != parent
    assert render_chat_template("{{ 2 }}", [], False) == "2" and template.WORKER.proc.pid == parent


def test_a_render_process_that_cannot_start_gives_way_to_a_forked_child(monkeypatch):
    """A render process that exits before its first answer (here its "interpreter" is /bin/false; elsewhere an
    interpreter whose settings break its start) costs nothing: the render goes to a child forked for it."""
    import sys
    from minigen.text import template
    template.WORKER.stop()
    monkeypatch.setattr(sys, "executable", "/bin/false")
    assert render_chat_template("{{ messages[0]['content'] }}", [{"role": "user", "content": "hi"}], False) == "hi"
    assert template.WORKER.proc is None
    with pytest.raises(MinigenError, match="division by zero"):
        render_chat_template("{{ 1/0 }}", [], False)


class Shouty:
    """A caller's object (a class the render process cannot import: it lives in this test module)."""

    def __init__(self, word):
        self.word = word

    def __str__(self):
        return self.word.upper()


def test_a_variable_the_render_process_cannot_read_goes_to_a_forked_child():
    """Variables pickle by reference to their classes; one whose class the render process cannot import is
    rendered in a child forked for it (which has the class), and the process goes on with the next render."""
    from minigen.text import template
    render_chat_template("{{ 1 }}", [], False)
    pid = template.WORKER.proc.pid
    assert render_chat_template("{{ who }}!", [], False, who=Shouty("hi")) == "HI!"
    assert render_chat_template("{{ 2 }}", [], False) == "2" and template.WORKER.proc.pid == pid

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

"""Hostile chat templates: sandbox escapes, unbounded output and time, errors of every kind."""
from __future__ import annotations

import random
from pathlib import Path

from .core import Case, Run, copy_fixture, generate

# --- chat templates ----------------------------------------------------------------------------------

TEMPLATES = {
    # label: (template, expect)
    "syntax-error": ("{% for %}", "error"),
    "div-zero": ("{{ 1/0 }}", "error"),
    "include": ("{% include 'x.html' %}", "error"),
    "import": ("{% import 'x.html' as x %}", "error"),
    "extends": ("{% extends 'base' %}", "error"),
    "recursive-macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "error"),
    "range-10**6": ("{% for i in range(10**6) %}x{% endfor %}", "either"),
    "range-10**9-step": ("{{ range(0, 10**9, 1000)|list|length }}", "either"),
    "str-times-10**9": ("{{ 'a' * 10**9 }}", "error"),
    "list-times-10**9": ("{{ ([0] * 10**9)|length }}", "error"),
    "pow-tower": ("{{ 10 ** (10 ** 10) }}", "error"),
    "pow-left": ("{{ 10 ** 10 ** 10 }}", "either"),
    "pow-big": ("{{ (7 ** 1000000) % 10 }}", "either"),   # 0.4 s of work: bounded, so it may render
    "nested-loops-2": ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", "error"),
    "nested-loops-3-output": ("{% for i in range(999) %}{% for j in range(999) %}{% for k in range(999) %}x{% endfor %}{% endfor %}{% endfor %}", "error"),
    "center-10**9": ("{{ 'a'.center(10**9) }}", "error"),
    "ljust-10**9": ("{{ 'a'.ljust(10**9) }}", "error"),
    "zfill-10**9": ("{{ '1'.zfill(10**9) }}", "error"),
    "expandtabs": ("{{ '\\t'.expandtabs(10**9) }}", "error"),
    "format-width": ("{{ '{:>999999999}'.format(1) }}", "error"),
    "format-filter-width": ("{{ '%999999999d'|format(1) }}", "error"),
    "percent-width": ("{{ '%999999999d' % 1 }}", "error"),
    "center-filter": ("{{ 'a'|center(10**9) }}", "error"),
    "indent-filter": ("{{ 'a\\nb'|indent(10**9) }}", "error"),
    "wordwrap-filter": ("{{ ('a ' * 1000)|wordwrap(10**9) }}", "either"),
    "slice-filter": ("{{ range(10)|slice(10**9)|list|length }}", "error"),
    "batch-filter": ("{{ range(10)|batch(10**9, 'x')|list|length }}", "error"),
    "lipsum": ("{{ lipsum(10**5) }}", "error"),
    "doubling-string": ("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}", "error"),
    "doubling-plus": ("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}", "error"),
    "join-big": ("{{ range(99999)|join(',') }}", "either"),
    "tojson-indent": ("{{ messages|tojson(indent=10**9) }}", "error"),
    "raise-exception": ("{{ raise_exception('nope') }}", "error"),
    "undefined-attr": ("{{ nothing.attr.more }}", "error"),
    "messages-index": ("{{ messages[5]['content'] }}", "error"),
    "strftime-huge": ("{{ strftime_now('%Y' * 10**6) }}", "error"),
    "escape-class": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "error"),
    "escape-cycler": ("{{ cycler.__init__.__globals__.os.system('true') }}", "error"),
    "escape-self": ("{{ self._TemplateReference__context }}", "either"),
    "escape-format": ("{{ '{0.__class__}'.format(1) }}", "error"),
    "escape-mro-attr": ("{{ messages|attr('__class__') }}", "error"),
    "escape-namespace": ("{{ namespace.__init__.__globals__ }}", "error"),
    "escape-joiner": ("{{ joiner.__init__.__globals__['__builtins__'] }}", "error"),
    "mutate-list": ("{{ messages.append(1) }}", "error"),
    "ok-plain": ("{% for m in messages %}{{ m['content'] }}{% endfor %}", "ok"),
    "empty-output": ("", "fail"),
    "dict-repeat": ("{{ (dict(a=1)|string) * 10**9 }}", "error"),
    "quadratic-list": ("{% set ns = namespace(x=[]) %}{% for i in range(99999) %}{% set ns.x = ns.x + [i] %}{% endfor %}", "error"),
    "nested-string-loops": ("{% for c in 'x' * 99999 %}{% for d in 'y' * 99999 %}{% endfor %}{% endfor %}", "error"),
    "tojson-repeat": ("{{ (messages|tojson) * 1000000 }}", "error"),
    "cycler-huge": ("{{ cycler(*range(99999)).next() }}", "either"),
    "caller": ("{% macro m() %}{{ caller() }}{% endmacro %}{% call m() %}{{ messages[0]['content'] }}{% endcall %}", "ok"),
    "escape-lipsum-globals": ("{{ lipsum.__globals__['os'].system('touch PWNED') }}", "error"),
    "escape-raise-globals": ("{{ raise_exception.__globals__ }}", "error"),
    "escape-strftime-globals": ("{{ strftime_now.__globals__['datetime'] }}", "error"),
    "escape-attr-filter": ("{{ (messages|attr('__class__')).__mro__ }}", "error"),
    "escape-subclasses": ("{{ [].__class__.__base__.__subclasses__() }}", "error"),
    "escape-format-map": ("{{ '{0.__globals__}'.format_map(namespace) }}", "error"),
    "escape-range-self": ("{{ range.__self__ }}", "error"),
    "escape-getattr-chain": ("{{ messages.pop() }}", "error"),
    "lone-surrogate-output": ("{{ '\udcff' }}", "error"),
    "deep-parens": ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "either"),
    "huge-source": ("{# " + "x" * 8_000_000 + " #}ok", "either"),
}


def template_cases(rng: random.Random, full: bool) -> list[Case]:
    cases = []
    for label, (template, expect) in TEMPLATES.items():
        def setup(d: Path, template=template) -> Run:
            ckpt = copy_fixture("llama_gqa3", d)
            (ckpt / "chat_template.jinja").write_text(template, errors="surrogatepass")

            def check(code, out, err, d):
                return "the template escaped the sandbox" if any(d.rglob("PWNED")) else None
            return Run(args=generate(ckpt, "--chat").args, timeout=20, check=check)
        cases.append(Case("template", f"llama_gqa3/{label}", setup, expect,
                          key=label in ("div-zero", "include", "recursive-macro", "range-10**6", "str-times-10**9",
                                        "nested-loops-2", "escape-class", "ok-plain", "center-10**9", "pow-tower",
                                        "format-width", "doubling-string", "slice-filter")))
    return cases




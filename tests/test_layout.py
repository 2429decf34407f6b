"""The package layout holds: read from the source with `ast` (nothing is imported or run).

- minigen/engine imports nothing of minigen but the engine and minigen.errors;
- the module import graph (every import, module-level or inside a function) has no cycle, nor has the graph of
  packages;
- no function imports a minigen module lazily, except where listed below with its reason (a lazy import can
  hide a cycle); third-party lazy imports (jinja2, gguf, huggingface_hub, ...) are not minigen's and are fine;
- nothing below the CLI prints: no print(), no click, no writes to sys.stdout/sys.stderr.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "minigen"

# module (or package) -> why its functions may import minigen modules lazily
LAZY_ALLOWED = {
    "minigen.cli": "start-up time: a command imports the modules only it needs when it runs, so that "
                   "`minigen --help` and the Ctrl-C handler come before NumPy and the engine load",
    "minigen.engine.quant.matrix": "memory and start-up: the numba kernels (and numba, ~60 MB) load on the first "
                                   "product with a stored matrix, so that a float32 model never imports them",
}
PRINTS_ALLOWED = ("minigen.cli", "minigen.serve", "minigen.__main__")


def modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


MODULES = modules()


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def imported(name: str, node: ast.AST) -> list[str]:
    """The minigen modules one import statement of module `name` names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "minigen"]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = name.split(".") if is_package(name) else name.split(".")[:-1]
        base = base[:len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] != "minigen":
        return []
    subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
    return subs or [target]


def imports(name: str) -> tuple[set[str], list[tuple[str, int]]]:
    """(minigen modules imported at module level, [(module, line)] imported inside functions)."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    top, lazy = set(), []

    def walk(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for target in imported(name, child):
                (lazy.append((target, child.lineno)) if in_function else top.add(target))
            walk(child, inner)
    walk(tree, False)
    return top, lazy


def edges(name: str) -> set[str]:
    """The minigen modules `name` imports, at module level or inside its functions (a lazy import is still an
    import: a cycle through one is a cycle)."""
    top, lazy = imports(name)
    return (top | {m for m, _ in lazy}) & set(MODULES)


GRAPH = {name: edges(name) for name in MODULES}


def test_modules_are_found():
    assert {"minigen.engine.model", "minigen.checkpoint.families", "minigen.gguf.convert", "minigen.files"} <= set(MODULES)
    assert "minigen.checkpoint.families" in GRAPH["minigen.checkpoint.config"]


def test_engine_imports_only_itself_and_errors():
    for name in MODULES:
        if name.startswith("minigen.engine"):
            top, lazy = imports(name)
            bad = {m for m in top | {m for m, _ in lazy} if not (m.startswith("minigen.engine") or m == "minigen.errors")}
            assert not bad, f"{name} imports {sorted(bad)}"


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph, as a path, or None."""
    state, stack = {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == "open":
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = "done"
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_cycle_finder_finds_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_between_modules():
    assert cycle(GRAPH) is None, " -> ".join(cycle(GRAPH))


def package_of(name: str) -> str:
    return ".".join(name.split(".")[:2])  # minigen.checkpoint.config -> minigen.checkpoint; minigen.files


def test_no_import_cycle_between_packages():
    """minigen/__init__.py (the public names) sits above everything and is left out."""
    packages: dict[str, set[str]] = {}
    for name, targets in GRAPH.items():
        if name != "minigen":
            packages.setdefault(package_of(name), set()).update(
                package_of(t) for t in targets if package_of(t) != package_of(name) and t != "minigen")
    assert cycle(packages) is None, " -> ".join(cycle(packages))


def test_no_lazy_minigen_imports_but_the_listed():
    found = []
    for name in MODULES:
        if any(name == a or name.startswith(a + ".") for a in LAZY_ALLOWED):
            continue
        found += [f"{MODULES[name].relative_to(PACKAGE.parent)}:{line} imports {target} inside a function"
                  for target, line in imports(name)[1]]
    assert not found, "\n".join(found)


def test_nothing_below_the_cli_prints():
    found = []
    for name, file in MODULES.items():
        if any(name == a or name.startswith(a + ".") for a in PRINTS_ALLOWED):
            continue
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                found.append(f"{name}:{node.lineno} print()")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                found += [f"{name}:{node.lineno} imports click" for n in names if n.split(".")[0] == "click"]
            if isinstance(node, ast.Attribute) and node.attr in ("stdout", "stderr") and \
                    isinstance(node.value, ast.Name) and node.value.id == "sys":
                found.append(f"{name}:{node.lineno} sys.{node.attr}")
    assert not found, "\n".join(found)


def test_every_package_says_what_it_may_import():
    for name, file in MODULES.items():
        if file.name == "__init__.py" and name != "minigen":
            doc = ast.get_docstring(ast.parse(file.read_text(encoding="utf-8"))) or ""
            assert "May import" in doc, f"{file}: the docstring should say what the package may import"


UNITS = ("engine", "checkpoint", "gguf", "text", "generation", "inspect", "cli", "serve", "errors", "files", "resolve")


def declared(doc: str) -> set[str] | None:
    """The minigen packages and modules a docstring's "May import:" paragraph names (None: everything)."""
    text = doc.split("May import:", 1)[1].split("\n\n")[0]
    if "everything" in text:
        return None
    words = set(text.replace("`", " ").replace("minigen.", "").replace(",", " ").replace(";", " ").replace("(", " ")
                .replace(".", " ").split())
    return {u for u in UNITS if u in words}


def test_imports_are_what_each_docstring_allows():
    for name, file in MODULES.items():
        unit = package_of(name)
        top = MODULES.get(unit)
        doc = ast.get_docstring(ast.parse(top.read_text(encoding="utf-8"))) if top else None
        if name == "minigen" or not doc or "May import:" not in doc or (allowed := declared(doc)) is None:
            continue
        used = {package_of(t).split(".")[1] for t in GRAPH[name] if t != "minigen" and package_of(t) != unit}
        assert used <= allowed, f"{name} imports {sorted(used - allowed)}, which {top.name}'s docstring does not allow"

"""The package's layout keeps its own rules (docs/model.md section 10): no module over
:data:`MAX_LINES` lines (a sign that two ideas share a room), and no cycle among the modules'
imports at module level (a module-level cycle makes the import order matter and the layers
unreadable; an import inside a function, done when it runs, is how the command line stays light
and does not count). Both read the source only: no import, no JAX."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "singleloc"
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _module_level_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports when it is imported: top-level ``import`` and
    ``from ... import`` statements (also under ``if``/``try``, not under ``if TYPE_CHECKING``), a
    ``from X import y`` counting ``X.y`` when that is a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(statements):
        for node in statements:
            if isinstance(node, ast.If):
                test = ast.unparse(node.test)
                if "TYPE_CHECKING" not in test:
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)

    visit(tree.body)
    return {m for m in found if m in known and m != name}


def test_no_module_is_over_the_line_limit():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by idea): {long}"


def test_the_module_imports_have_no_cycle():
    modules = _modules()
    graph = {name: _module_level_imports(name, path, set(modules)) for name, path in modules.items()}
    # a package's __init__ importing its own modules is how a package is built, not a cycle
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".") or modules[m].name != "__init__.py"}
    state: dict[str, int] = {}
    cycles = []

    def walk(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node, [])
    assert not cycles, "import cycles at module level: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_can_fail(tmp_path):
    """The checker sees a cycle where there is one (two modules importing each other)."""
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text("from .a import y\nx = 1\n")
    known = {"pkg.a", "pkg.b"}
    assert _module_level_imports("pkg.a", tmp_path / "a.py", known) == {"pkg.b"}
    assert _module_level_imports("pkg.b", tmp_path / "b.py", known) == {"pkg.a"}
    (tmp_path / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n"
                                   "def f():\n    from .b import x\n")
    assert _module_level_imports("pkg.c", tmp_path / "c.py", known) == set()

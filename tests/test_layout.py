"""The package's layout keeps its own rules (docs/model.md section 10): no module over
:data:`MAX_LINES` lines (a sign that two ideas share a room); the folders are layers
(:data:`FLOORS`): a folder imports only folders of lower floors, whether the import runs with the
module, inside a function or for type checking only; and no cycle among the modules' imports, those
inside functions and for type checking only included (an import inside a function keeps the command line
light, but a cycle it closes makes the layers unreadable). Both read the source only: no import, no JAX."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "singleloc"
MAX_LINES = 450

#: The floors, from the ground up: a folder (or a module at the package's root) imports only folders of
#: lower floors; folders on one floor do not import each other. This is the table of allowed arrows.
FLOORS = (
    ("ground", "_version"),  # checks of values and arguments, named choices, atomic files, user code
    ("runtime", "sgd", "attention"),  # compilation, devices, progress; the SGD rule; normalization diagnostics
    ("model",),  # priors, activations, the layer, data
    ("configuration",),  # the specifications and Config
    ("expectations",),  # the routes
    ("preflight",),  # the checks before a run and the estimates
    ("theory",),  # build, the ODE, its solve and results
    ("analysis", "simulation", "bayes"),
    ("pruning",),
    ("io",),  # run folders: every result written and read back
    ("_plot_trajectories",),
    ("plots",),
    ("sweeps", "language_model"),
    ("_commands",),
    ("cli",),
    ("__main__",),
)


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str], *, type_checking: bool = True) -> set[str]:
    """The package's modules that ``name`` imports: ``import`` and ``from ... import`` statements at
    module level, under ``if``/``try`` and inside functions, and (with ``type_checking``) under ``if
    TYPE_CHECKING``; a ``from X import y`` counting ``X.y`` when that is a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
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
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in known and m != name}


def _graph(*, type_checking: bool) -> dict[str, set[str]]:
    """Module -> the modules it imports; a package's ``__init__`` importing its own modules is how a
    package is built (``singleloc/__init__.py`` hands every public name on), not an arrow."""
    modules = _modules()
    graph = {name: _imports(name, path, set(modules), type_checking=type_checking) for name, path in modules.items()}
    return {name: {m for m in targets if not (modules[name].name == "__init__.py" and m.startswith(name + "."))}
            for name, targets in graph.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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
    return cycles


def _folder(module: str) -> str:
    """The folder of ``singleloc.FOLDER.module``, or the module's own name at the package's root."""
    return module.split(".")[1]


def _arrows_up(graph: dict[str, set[str]], floors=FLOORS) -> list[str]:
    """The imports from a folder to one of the same or a higher floor (``FOLDER/module -> FOLDER/module``)."""
    floor = {folder: i for i, names in enumerate(floors) for folder in names}
    bad = []
    for name, targets in graph.items():
        if name == "singleloc":
            continue  # the package's face
        for target in targets:
            a, b = _folder(name), _folder(target)
            if a != b and floor[a] <= floor[b]:
                bad.append(f"{name} -> {target} (floor {floor[a] + 1} -> {floor[b] + 1})")
    return sorted(bad)


def test_no_module_is_over_the_line_limit():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by idea): {long}"


def test_every_folder_stands_on_a_floor():
    folders = {_folder(name) for name in _modules() if name != "singleloc"}
    placed = [folder for names in FLOORS for folder in names]
    assert len(placed) == len(set(placed)), "a folder on two floors"
    assert folders == set(placed), f"folders without a floor: {folders - set(placed)}; floors without a folder: " \
                                   f"{set(placed) - folders}"


def test_no_folder_imports_one_of_its_floor_or_above():
    bad = _arrows_up(_graph(type_checking=True))
    assert not bad, "imports that do not go down a floor (docs/model.md section 10):\n" + "\n".join(bad)


def test_the_module_imports_have_no_cycle():
    cycles = _cycles(_graph(type_checking=True))
    assert not cycles, "import cycles (all imports counted): " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_checks_can_fail(tmp_path):
    """The checker sees an import inside a function and one for type checking, a cycle where there is
    one, and an arrow that runs up a floor."""
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import y\nx = 1\n")
    (tmp_path / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n")
    known = {"pkg.a", "pkg.b", "pkg.c"}
    assert _imports("pkg.a", tmp_path / "a.py", known) == {"pkg.b"}
    assert _imports("pkg.b", tmp_path / "b.py", known) == {"pkg.a"}
    assert _imports("pkg.c", tmp_path / "c.py", known) == {"pkg.a"}
    assert _imports("pkg.c", tmp_path / "c.py", known, type_checking=False) == set()
    assert _cycles({"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}) == [["pkg.a", "pkg.b", "pkg.a"]]
    graph = {"singleloc.low.m": {"singleloc.high.n"}, "singleloc.high.n": set()}
    assert _arrows_up(graph, (("low",), ("high",))) == ["singleloc.low.m -> singleloc.high.n (floor 1 -> 2)"]
    assert _arrows_up(graph, (("high",), ("low",))) == []

"""The public face: the names a type checker reads (the ``TYPE_CHECKING`` imports of
``singleloc/__init__.py``) are exactly the lazily exported ones, and each resolves."""

from __future__ import annotations

import ast
from pathlib import Path

import singleloc


def _type_checking_imports() -> dict[str, tuple[str, str]]:
    tree = ast.parse(Path(singleloc.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING")
    found = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1, ast.dump(node)
        for alias in node.names:
            found[alias.asname or alias.name] = (node.module, alias.name)
    return found


def test_type_checkers_see_exactly_the_exports():
    assert _type_checking_imports() == singleloc._ORIGIN


def test_every_export_resolves_to_its_module_object():
    import importlib

    for public, (module, name) in singleloc._ORIGIN.items():
        value = getattr(singleloc, public)  # a function: wrapped by the check of its arguments (tests/test_api_types.py)
        assert getattr(value, "__wrapped__", value) is getattr(importlib.import_module(f"singleloc.{module}"), name), public

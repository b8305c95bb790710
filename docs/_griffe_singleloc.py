"""Griffe extension of the API reference (``extensions: [docs/_griffe_singleloc.py]`` in mkdocs.yml).

* **The public API as the runtime sees it.** ``singleloc/__init__.py`` may export its names
  lazily (PEP 562 ``__getattr__``), which static analysis cannot follow. For every name of
  ``singleloc.__all__`` that griffe did not find in ``__init__.py``, an alias to the object that
  defines it (found by identity among the package's modules) is added, so ``::: singleloc.NAME``
  works and its anchor is ``singleloc.NAME`` however the package is laid out.
* **Sphinx roles.** The docstrings use ``:func:`~singleloc.integrate```; on the site they become
  code, linked to the API page when the target is rendered there (a public name, or a documented
  member of one), plain code otherwise (private modules, local helpers, undocumented members).
* **Citations of the model.** ``docs/model.md section 5.9`` links to that section of the model
  page (mkdocs-autorefs resolves heading anchors); a number with no such heading stays text.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import griffe
from markdown.extensions.toc import slugify

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|obj|exc|const):`(~?)([\w.]+)(?:\(\))?`")
LOOKUP_ERRORS = (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError)
MODEL = Path(__file__).resolve().parent / "model.md"
CITATION = re.compile(r"docs/model\.md,? sections? (\d+(?:\.\d+)?)")
SECTION = re.compile(r"^#{2,4} ((\d+(?:\.\d+)?)\.? .*)$", re.MULTILINE)


class SingleLoc(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        if pkg.name != "singleloc":
            return
        import singleloc

        public = set(singleloc.__all__)
        for name in sorted(public - set(pkg.members)):
            module, attr = singleloc._ORIGIN[name]  # the object itself, not the argument check singleloc.NAME wraps it in
            target = _defining_path(pkg, getattr(importlib.import_module(f"singleloc.{module}"), attr))
            if target is not None:
                pkg.set_member(name, griffe.Alias(name, target, parent=pkg))

        def replace(match: re.Match) -> str:
            short, path = match.group(1), match.group(2)
            text = path.rsplit(".", 1)[-1] if short else path
            parts = path.split(".")
            if parts[0] == "singleloc":
                parts = parts[1:]
            if parts and parts[0] in public and _rendered(pkg, parts):
                return f"[`{text}`][singleloc.{'.'.join(parts)}]"
            return f"`{text}`"

        anchors = {number: slugify(title, "-") for title, number in SECTION.findall(MODEL.read_text())}

        def cite(match: re.Match) -> str:
            anchor = anchors.get(match.group(1))
            return f"[{match.group(0)}][{anchor}]" if anchor else match.group(0)

        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = CITATION.sub(cite, ROLE.sub(replace, obj.docstring.value))


def _defining_path(pkg: griffe.Module, value) -> str | None:
    """``singleloc._module.name`` of the module-level object ``value`` where it is defined (not
    imported), searched among the imported modules of the package."""
    for module_name, module in sorted(sys.modules.items()):
        if not module_name.startswith("singleloc.") or module is None:
            continue
        for attr, candidate in vars(module).items():
            if candidate is not value:
                continue
            path = f"{module_name}.{attr}"
            try:
                if not pkg[path.removeprefix("singleloc.")].is_alias:
                    return path
            except LOOKUP_ERRORS:
                continue
    return None


def _rendered(pkg: griffe.Module, parts: list[str]) -> bool:
    """Whether the API pages have an anchor for ``singleloc.<parts>``: a public name always (the
    build checks that each has its entry), a member of one when it exists and has a docstring
    (members without one are not rendered)."""
    if len(parts) == 1:
        return True
    try:
        obj = pkg[".".join(parts)]
    except LOOKUP_ERRORS:
        return False
    return not parts[-1].startswith("_") and obj.docstring is not None


def _objects(obj: griffe.Object):
    """The object and every object defined under it (aliases skipped: they are documented where defined)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)

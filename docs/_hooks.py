"""MkDocs hooks of the documentation site (``hooks:`` in mkdocs.yml).

* ``figures/`` (the repository's figures, made by ``experiments/``) is added to the site at build
  time as ``figures/NAME``, so pages link ``figures/NAME.png`` without a copy in ``docs/``.
* ``docs/tutorial.py`` (a jupytext percent script, executed by ``tests/test_tutorial.py``) is
  rendered as the page ``tutorial.md``: markdown cells as text, code cells as Python blocks, each
  followed by what it printed and drew when ``docs/_run_tutorial.py`` last ran it
  (``docs/tutorial_outputs/``; outputs of changed cells are refused with a warning).
* ``<!-- singleloc-help COMMAND -->`` in a page becomes the output of ``singleloc COMMAND --help``
  (``singleloc --help`` for ``-``), so the options on the site are always the CLI's own.
* ``<!-- sweep-columns -->`` becomes the table of the columns of ``sweep.csv`` and their descriptions
  (``singleloc.sweeps._sweep_dataset.COLUMNS``, the descriptions ``sweep.nc`` carries).
* ``<!-- module-docstring NAME -->`` becomes the docstring of the module that defines the public
  ``singleloc.NAME`` (rendered by mkdocstrings), so an API page keeps the rules and conventions
  stated there whatever the private module is called.
* Checks that fail ``mkdocs build --strict``: a public name of ``singleloc`` with no ``:::``
  entry in ``docs/api/``, a CLI command without its page ``docs/commands/COMMAND.md``, a figure of
  ``figures/`` missing from the gallery, an ``experiments/*.py`` named in the gallery that does
  not exist.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import logging
import os
import re
from pathlib import Path

import jupytext
from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.singleloc")

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "figures"
HELP_MARK = re.compile(r"<!-- singleloc-help (\S+) -->")
MODULE_MARK = re.compile(r"<!-- module-docstring (\w+) -->")
API_ENTRY = re.compile(r"^::: singleloc\.(\w+)\s*$", re.MULTILINE)
HELP_COLUMNS = "80"
TUTORIAL_OUTPUTS = "tutorial_outputs"
COLUMNS_MARK = "<!-- sweep-columns -->"


def _tutorial_markdown(script: str, outputs: list[dict] | None) -> str:
    """The percent script as one markdown page, each code cell followed by what it printed and drew
    when ``docs/_run_tutorial.py`` last ran it (``outputs``: its ``outputs.json``). Outputs made from
    other cell sources are not shown, and a warning (fatal under ``--strict``) says to run it again."""
    notebook = jupytext.reads(script, fmt="py:percent")
    parts = []
    code = 0
    stale = outputs is None
    for cell in notebook.cells:
        source = cell.source.strip("\n")
        if not source:
            continue
        if cell.cell_type == "markdown":
            parts.append(source)
            continue
        parts.append(f"```python\n{source}\n```")
        record = outputs[code] if outputs is not None and code < len(outputs) else None
        code += 1
        if record is None or record["source_sha256"] != hashlib.sha256(source.encode()).hexdigest():
            stale = True
            continue
        text = (record["stdout"] + record["stderr"]).rstrip()
        if text:
            parts.append(f"```text\n{text}\n```")
        if record["figure"]:
            parts.append(f"![output of the cell above]({TUTORIAL_OUTPUTS}/{record['figure']})")
    if stale or (outputs is not None and len(outputs) != code):
        log.warning("docs/tutorial_outputs/ does not match docs/tutorial.py (a code cell changed): run "
                    "`python docs/_run_tutorial.py` to show the outputs of the current cells")
    return "\n\n".join(parts) + "\n"


def on_files(files: Files, config) -> Files:
    for path in sorted(FIGURES.iterdir()):
        if path.is_file():
            files.append(File.generated(config, f"figures/{path.name}", abs_src_path=str(path)))
    docs = Path(config["docs_dir"])
    record = docs / TUTORIAL_OUTPUTS / "outputs.json"
    outputs = json.loads(record.read_text()) if record.is_file() else None
    content = _tutorial_markdown((docs / "tutorial.py").read_text(), outputs)
    files.append(File.generated(config, "tutorial.md", content=content))
    return files


def _cli_help(command: str) -> str:
    """``singleloc COMMAND --help`` (``singleloc --help`` for ``-``), at a fixed width, in-process."""
    from singleloc.cli import main

    argv = ["--help"] if command == "-" else [command, "--help"]
    out, err = io.StringIO(), io.StringIO()
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
            main(argv)
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    if not out.getvalue().strip():
        log.warning("`singleloc %s --help` printed no help: %s", " ".join(argv[:-1]), err.getvalue().strip())
    return out.getvalue().rstrip()


def _cli_commands() -> list[str]:
    from singleloc.cli import build_parser

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def _public_names() -> set[str]:
    import singleloc

    names = getattr(singleloc, "__all__", None)
    if names is None:
        names = [n for n in vars(singleloc) if not n.startswith("_") and not isinstance(getattr(singleloc, n), type(singleloc))]
    return set(names)


_documented: set[str] = set()


def on_pre_build(config) -> None:
    _documented.clear()


def on_page_markdown(markdown: str, page, config, files) -> str:
    src = page.file.src_uri
    if src.startswith("api/"):
        _documented.update(API_ENTRY.findall(markdown))
    if src == "gallery.md":
        _check_gallery(markdown)
    markdown = MODULE_MARK.sub(lambda m: _module_docstring(m.group(1)), markdown)
    markdown = markdown.replace(COLUMNS_MARK, _sweep_columns())
    return HELP_MARK.sub(lambda m: f"```text\n{_cli_help(m.group(1))}\n```", markdown)


def _sweep_columns() -> str:
    """The columns of ``sweep.csv`` with their descriptions (``singleloc.sweeps._sweep_dataset.COLUMNS``) as a table."""
    from singleloc.sweeps._sweep_dataset import COLUMNS

    rows = [f"| `{name}` | {text} |" for name, text in COLUMNS.items() if not name.startswith("n_")]
    return "\n".join(["| column | what it holds |", "|---|---|", "| `n_<class>` | heads classified `<class>` at the last "
                      "saved time, mean over seeds |", *rows])


def _module_docstring(name: str) -> str:
    """A mkdocstrings block rendering only the docstring of the module defining ``singleloc.NAME``."""
    import singleloc

    obj = getattr(singleloc, name, None)
    module = getattr(obj, "__module__", None)
    if module is None or not module.startswith("singleloc"):
        log.warning("<!-- module-docstring %s -->: singleloc.%s is not a public object of the package", name, name)
        return ""
    options = ["members: false", "show_root_heading: false", "show_root_toc_entry: false"]
    return f"::: {module}\n    options:\n" + "".join(f"      {o}\n" for o in options)


def _check_gallery(markdown: str) -> None:
    shown = set(re.findall(r"figures/([\w.-]+\.png)", markdown))
    for name in sorted(p.name for p in FIGURES.glob("*.png")):
        if name not in shown:
            log.warning("gallery.md: figures/%s is not shown in the gallery", name)
    for script in sorted(set(re.findall(r"experiments/(\w+\.py)", markdown))):
        if not (ROOT / "experiments" / script).is_file():
            log.warning("gallery.md names experiments/%s, which does not exist", script)


def on_post_build(config) -> None:
    for name in sorted(_public_names() - _documented):
        log.warning("singleloc.%s is public but has no `::: singleloc.%s` entry in docs/api/", name, name)
    for name in sorted(_documented - _public_names() - {"plots"}):
        log.warning("docs/api/ documents singleloc.%s, which is not a public name of singleloc", name)
    docs = Path(config["docs_dir"])
    for command in _cli_commands():
        if not (docs / "commands" / f"{command}.md").is_file():
            log.warning("the CLI command `singleloc %s` has no page docs/commands/%s.md", command, command)

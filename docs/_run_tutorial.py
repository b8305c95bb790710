"""Run docs/tutorial.py cell by cell and keep what each code cell printed and drew, for the site.

``python docs/_run_tutorial.py`` (several minutes: the tutorial itself) executes the code cells of the
jupytext percent script in one namespace, as a notebook does, and writes ``docs/tutorial_outputs/``:
``outputs.json`` (per code cell: the SHA-256 of its source, what it printed on stdout and stderr, and its
figure) and ``cell_NN.png`` for a cell whose last expression is a matplotlib figure. The site's hook
(docs/_hooks.py) shows them below their cells, so ``mkdocs build`` stays offline and fast; it refuses
(a warning, fatal under ``--strict``) outputs whose cell sources no longer match the script: rerun this
after editing a code cell of the tutorial.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import io
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

DOCS = Path(__file__).resolve().parent
SCRIPT = DOCS / "tutorial.py"
OUTPUTS = DOCS / "tutorial_outputs"


def source_digest(source: str) -> str:
    """The digest that ties an output to its cell (shared with the hook)."""
    return hashlib.sha256(source.strip("\n").encode()).hexdigest()


def code_cells(script: str) -> list[str]:
    """The sources of the code cells of the percent script, in order."""
    import jupytext

    notebook = jupytext.reads(script, fmt="py:percent")
    return [cell.source for cell in notebook.cells if cell.cell_type == "code" and cell.source.strip()]


def run_cell(source: str, namespace: dict):
    """Execute one cell; return the value of its last expression (as a notebook shows it), else None."""
    tree = ast.parse(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<tutorial cell>", "exec"), namespace)
    if last is None:
        return None
    return eval(compile(ast.Expression(last.value), "<tutorial cell>", "eval"), namespace)


def main() -> None:
    from matplotlib.figure import Figure

    OUTPUTS.mkdir(exist_ok=True)
    for old in OUTPUTS.glob("cell_*.png"):
        old.unlink()
    namespace: dict = {"__name__": "__main__"}
    records = []
    start, cpu = time.time(), time.process_time()
    with tempfile.TemporaryDirectory() as scratch:
        here = os.getcwd()
        os.chdir(scratch)  # the tutorial writes no files; if it did, they would not land in the repository
        try:
            for n, source in enumerate(code_cells(SCRIPT.read_text())):
                out, err = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
                    warnings.simplefilter("always")
                    warnings.showwarning = lambda message, category, *a, **k: print(
                        f"{category.__name__}: {message}", file=sys.stderr)
                    value = run_cell(source, namespace)
                record = {"source_sha256": source_digest(source), "stdout": out.getvalue(), "stderr": err.getvalue(),
                          "figure": None}
                if isinstance(value, Figure):
                    name = f"cell_{n:02d}.png"
                    value.savefig(OUTPUTS / name, dpi=72, bbox_inches="tight")
                    record["figure"] = name
                records.append(record)
                print(f"cell {n}: {time.time() - start:.0f} s ({time.process_time() - cpu:.0f} s CPU; load average "
                      f"{os.getloadavg()[0]:.1f})", file=sys.__stderr__)
        finally:
            os.chdir(here)
    (OUTPUTS / "outputs.json").write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {OUTPUTS}: {len(records)} cells in {time.time() - start:.0f} s ({time.process_time() - cpu:.0f} s CPU)")


if __name__ == "__main__":
    main()

"""The documentation site works offline and shows the tutorial's outputs (issue 53): no script, style
or font from the network; the tutorial page shows what each code cell printed and drew, and refuses
outputs made from other cells."""

from __future__ import annotations

import importlib.util
import json
import logging
import re
from pathlib import Path

import pytest

pytest.importorskip("jupytext")
pytest.importorskip("mkdocs")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def hooks():
    spec = importlib.util.spec_from_file_location("singleloc_docs_hooks", DOCS / "_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_loads_nothing_from_the_network():
    config = (ROOT / "mkdocs.yml").read_text()
    assert not re.search(r"^\s*-\s*https?://", config, re.MULTILINE)  # no remote script or stylesheet
    assert re.search(r"^\s*font: false", config, re.MULTILINE)  # the theme's web fonts are off
    shipped = re.findall(r"^\s*-\s*(assets/\S+|javascripts/\S+|stylesheets/\S+)", config, re.MULTILINE)
    assert shipped and all((DOCS / path).is_file() for path in shipped)
    css = (DOCS / "assets" / "katex" / "katex.min.css").read_text()
    fonts = set(re.findall(r"url\((fonts/[^)]+)\)", css))
    assert fonts and all((DOCS / "assets" / "katex" / font).is_file() for font in fonts)


SCRIPT = '''# %% [markdown]
# # Title

# %%
x = 2
print(x + 1)

# %% [markdown]
# Text.

# %%
x * 10
'''


def test_tutorial_page_shows_the_outputs_of_its_cells_and_refuses_stale_ones(caplog):
    module = hooks()
    from docs_run import code_cells, source_digest  # noqa: F401  (docs/_run_tutorial.py, below)

    cells = code_cells(SCRIPT)
    outputs = [{"source_sha256": source_digest(cells[0]), "stdout": "3\n", "stderr": "", "figure": None},
               {"source_sha256": source_digest(cells[1]), "stdout": "", "stderr": "", "figure": "cell_01.png"}]
    page = module._tutorial_markdown(SCRIPT, outputs)
    assert "```python\nx = 2\nprint(x + 1)\n```\n\n```text\n3\n```" in page
    assert "](tutorial_outputs/cell_01.png)" in page and "Text." in page and not caplog.records
    with caplog.at_level(logging.WARNING):
        stale = module._tutorial_markdown(SCRIPT.replace("x + 1", "x + 2"), outputs)
    assert "```text\n3\n```" not in stale and "cell_01.png" in stale  # the changed cell's output is not shown
    assert any("python docs/_run_tutorial.py" in r.getMessage() for r in caplog.records)


def test_the_committed_tutorial_outputs_match_the_tutorial():
    from docs_run import code_cells, source_digest

    outputs = json.loads((DOCS / "tutorial_outputs" / "outputs.json").read_text())
    cells = code_cells((DOCS / "tutorial.py").read_text())
    assert [o["source_sha256"] for o in outputs] == [source_digest(c) for c in cells], \
        "docs/tutorial.py changed since its outputs were kept: run python docs/_run_tutorial.py"
    for o in outputs:
        assert o["figure"] is None or (DOCS / "tutorial_outputs" / o["figure"]).is_file()


@pytest.fixture(autouse=True)
def docs_run(monkeypatch):
    """docs/_run_tutorial.py importable as ``docs_run``."""
    import sys

    spec = importlib.util.spec_from_file_location("docs_run", DOCS / "_run_tutorial.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "docs_run", module)
    return module


def test_the_built_site_browses_from_disk_and_its_code_wraps():
    """Issue 61 item 8: opened from disk, a link to a page must name its file (``page.html``), not a
    folder (``page/``, which a browser shows as a directory listing); long code lines wrap."""
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^use_directory_urls: false", config, re.MULTILINE)
    sheets = re.findall(r"^\s*-\s*(stylesheets/\S+\.css)", config, re.MULTILINE)
    assert any("white-space: pre-wrap" in (DOCS / sheet).read_text() for sheet in sheets)


COMMANDS = ("simulate", "integrate", "compare", "plot", "bayes", "prune", "sweep", "diagnose", "attention")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_page_answers_first(command):
    """Each command's page: a command to run before its first section (or in its first one), the
    options (the long --help text) last."""
    text = (DOCS / "commands" / f"{command}.md").read_text()
    sections = re.findall(r"^## (.+)$", text, re.MULTILINE)
    first_section = text.index("\n## ")
    second_section = text.index("\n## ", first_section + 1)
    assert f"singleloc {command}" in text[:second_section] and "```bash" in text[:second_section], command
    assert sections[-1] == "Options", sections

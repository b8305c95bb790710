"""The tutorial (docs/tutorial.py, a jupytext percent script rendered on the documentation site)
runs from top to bottom, so that it cannot go stale. It is run as a plain script in a fresh
process, from an empty working directory, with matplotlib's non-interactive backend; its outputs
are not kept.

Marked ``slow`` (about a minute): CI runs it as its own step (``.ci/run``), after the default suite."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial.py"


@pytest.mark.slow
def test_tutorial_runs(tmp_path):
    env = {**os.environ, "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, str(TUTORIAL)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"docs/tutorial.py failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "tutorial ran in" in done.stdout
    assert not list(tmp_path.iterdir()), "the tutorial must not write files"

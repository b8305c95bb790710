"""The tutorial (docs/tutorial.py, a jupytext percent script rendered on the documentation site)
runs from top to bottom as a user runs it, so that it cannot go stale: a plain script in a fresh
process, from an empty working directory, with matplotlib's non-interactive backend and its phase
lines on stderr (the suite's ``SINGLELOC_PROGRESS`` and pytest's ``PYTEST_CURRENT_TEST`` removed from its
environment); its outputs are not kept.

Marked ``slow`` (about 2.5 minutes of CPU time, mostly JAX compiling): CI runs it as its own step
(``.ci/run``), after the default suite."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial.py"
#: What a user's environment does not have: the suite's setting (tests/conftest.py: the phase lines off) and
#: pytest's marker of a running test (which also turns the phase lines off).
USER_UNSET = ("SINGLELOC_PROGRESS", "PYTEST_CURRENT_TEST")


@pytest.mark.slow
def test_tutorial_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in USER_UNSET}
    env["MPLBACKEND"] = "Agg"
    done = subprocess.run([sys.executable, str(TUTORIAL)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"docs/tutorial.py failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "tutorial ran in" in done.stdout
    # steps 1 and 2 solve on the default route, the exact one for softmax and bsoftmax (step 5 alone on the rule)
    assert "integrate, softmax H=2 L=4 F=2 on the exact route" in done.stderr
    assert "integrate, bsoftmax H=2 L=4 F=2 on the exact route" in done.stderr
    assert not list(tmp_path.iterdir()), "the tutorial must not write files"

"""The README quotes, for its three questions, what ``experiments/readme_numbers.py`` printed and saved
(``figures/readme_numbers.json``): the default test reads both files (it reruns nothing); the slow one reruns
the script and compares its numbers with the saved ones."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SAVED = ROOT / "figures" / "readme_numbers.json"
WORDS = {"none": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


def _quoted(pattern: str) -> tuple[str, ...]:
    text = " ".join((ROOT / "README.md").read_text().split())  # a sentence may break across lines
    found = re.search(pattern, text)
    assert found, f"README.md no longer says {pattern!r}: update it and this test together"
    return found.groups()


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} minutes"


@pytest.fixture(scope="module")
def saved() -> dict:
    return json.loads(SAVED.read_text())


def test_the_main_jobs_heads_per_start_and_seed(saved):
    """The main job's claim says in how many starts and seeds it holds (issue 61), as the script counted them."""
    story = saved["numbers"]["showcase"]
    quoted = _quoted(r"at the figure's horizon `tau = (\d+)`, where the run has not settled, two heads are on each "
                     r"direction in (\d) of the (\d) theory starts and (\d) of the (\d) simulated seeds")
    both = "2 on e1, 2 on e2"
    assert quoted == (f"{story['horizon']:.0f}", str(story["theory"].get(both, 0)), str(sum(story["theory"].values())),
                      str(story["simulation"].get(both, 0)), str(sum(story["simulation"].values())))
    others = [o for kind in ("theory", "simulation") for o in story[kind] if o != both]
    assert all("combination" in o for o in others)  # "the others still hold one to three heads on a combination"


def test_the_escape_and_its_run_time(saved):
    story = saved["numbers"]["specialization"]
    assert _quoted(r"escape near `tau = (\d+)` \(predicted: (\d+)\)") == (
        f"{story['measured_escape']:.0f}", f"{story['predicted_escape']:.0f}")
    assert _quoted(r"into combinations of spikes \(([^)]*)\)")[0] == _minutes(saved["seconds"]["specialization"])
    horizon, state = _quoted(r"at its horizon `tau = (\d+)` the run (has not settled|has settled)")
    assert (horizon, state) == (f"{story['horizon']:.0f}", "has settled" if story["settled"] else "has not settled")


def _count(needed: dict) -> str:
    """A heads-needed count as the README words it: one number, a range where the gaps' errors move it, or "N or
    more" where moving the gaps by their errors leaves no head count of the grid within the threshold."""
    low, high = needed["heads_needed_low"], needed["heads_needed_high"]
    return f"{low}" if low == high else f"{low} or more" if high is None else f"{low}-{high}"


def test_the_heads_needed_and_the_gaps(saved):
    """Every count with the gaps (and their errors) that decide it, a count the errors move quoted as a range."""
    story = saved["numbers"]["heads_needed"]
    for F, words in ((2, r"for two spikes, (\S+(?: or more)?) heads \(gaps of ([^)]*)\)"),
                     (3, r"for three, (\S+ or more|\S+) \(([^)]*)\)")):
        count, gaps = _quoted(words)
        assert count == _count(story["needed"][f"bsoftmax, F={F}"])
        quoted = re.findall(r"([\d.]+) \+- ([\d.e-]+) at H = (\d)", gaps)
        assert quoted, gaps
        for gap, error, heads in quoted:
            g, e = story["gap_to_bayes"][f"bsoftmax, F={F}"][f"H={heads}"]
            assert (gap, error) == (f"{g:.4f}", f"{e:.4f}" if e >= 5e-5 else f"{e:.0e}")  # an exact route's error: 2e-12
    gaps = [story["gap_to_bayes"][f"softmax1, F={F}"]["H=4"][0] for F in (2, 3)]
    assert _quoted(r"softmax1 stays ([\d.]+)-([\d.]+) above the Bayes risk with four") == (f"{min(gaps):.2f}", f"{max(gaps):.2f}")
    assert _quoted(r"this figure; ([^)]*)\)")[0] == _minutes(saved["seconds"]["heads_needed"])


def test_the_heads_pruning_removes(saved):
    story = saved["numbers"]["prune"]
    removable, heads = _quoted(r"the first story \([^)]*\): (\w+) of the (\w+) heads within 0.01")
    assert (WORDS[removable], WORDS[heads]) == (story["removable"], story["heads"])
    rise = min(story["risks"][1:]) - story["risks"][0]  # the cheapest removal, as the README words it
    assert _quoted(r"removing the least useful one raises the risk by ([\d.]+) \(([\d.]+) to ([\d.]+)\)") == (
        f"{rise:.3f}", f"{story['risks'][0]:.3f}", f"{story['risks'][0] + rise:.3f}")
    assert _quoted(r"the first story \(([^)]*)\)")[0] == _minutes(saved["seconds"]["prune"])


@pytest.mark.slow  # the three questions again: half an hour on a loaded 2-core CPU
def test_the_script_reprints_the_saved_numbers(tmp_path, saved):
    env = {**os.environ, "SINGLELOC_FIGURES": str(tmp_path)}
    subprocess.run([sys.executable, str(ROOT / "experiments" / "readme_numbers.py")], env=env, check=True)
    again = json.loads((tmp_path / "readme_numbers.json").read_text())["numbers"]

    def same(a, b, where):
        if isinstance(a, dict):
            assert a.keys() == b.keys(), where
            for key in a:
                same(a[key], b[key], f"{where}.{key}")
        elif isinstance(a, list):
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                same(x, y, f"{where}[{i}]")
        elif isinstance(a, float):  # the same solves on another machine: rounding only
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9, err_msg=where)
        else:
            assert a == b, where

    same(again, saved["numbers"], "numbers")

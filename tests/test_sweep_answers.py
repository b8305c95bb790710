"""Answers, not columns (issue 53): a sweep joins the Bayes risk of every problem, the gap to it and
the heads each activation needs to come within a gap of it, in the CSV, the Dataset, a figure and
the command's output, under one name per quantity; and it computes without writing
(:func:`~singleloc.sweeps._sweep.compute_sweep`) and writes in a step of its own."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np
import pytest
from _tiny import tiny

from singleloc import bayes_risk, load_sweep, parse_grid
from singleloc.analysis._predictions import EscapePrediction, escape_horizon
from singleloc.analysis._sweep_answers import add_heads_needed, count_text, final_risk_error, heads_needed, heads_needed_table
from singleloc.cli import main
from singleloc.sweeps import _sweep, _sweep_compute
from singleloc.sweeps._sweep_dataset import COLUMNS, describe_column

DOCS = Path(__file__).resolve().parents[1] / "docs" / "commands" / "sweep.md"


def fake_prediction(config):
    """An escape predicted at tau = 4 (rate 0.1)."""
    return EscapePrediction(rate=0.1, tau_plateau=1.0, plateau_risk=0.3, predicted_escape=4.0, horizon=escape_horizon(4.0),
                            D=config.simulation.D, path_tau=np.array([1.0, 4.0]), path_rate=np.array([0.1, 0.1])).arrays()


def final_risk(H: int, F: int) -> float:
    return 0.05 / H + 0.01 * F


@pytest.fixture
def fake(monkeypatch):
    """Synthetic entries: the theory's risk ends at 0.05 / H + 0.01 F with a standard error 1e-6
    at the end, the Bayes risk of a problem with F spikes is 0.01 F (error 1e-7), so gap_to_bayes =
    0.05 / H. Counts the Bayes computations."""
    bayes_calls = []

    def theory(config):
        H, F, S = config.model.heads, config.problem.F, config.simulation.seeds
        tau = np.linspace(0, 10, 11)
        M = np.zeros((S, 11, H, F))
        Q = np.tile(np.eye(H), (S, 11, 1, 1))
        risk = np.tile(np.linspace(0.8, final_risk(H, F), 11), (S, 1))
        return {"tau": tau, "M": M, "Q": Q, "b": np.zeros((S, 11, H)), "risk": risk, "risk_se": np.full((S, 11), 1e-6),
                "route": np.asarray("rule")}

    def bayes(config):
        bayes_calls.append(config.problem.F)
        return {"bayes_risk": np.asarray(0.01 * config.problem.F), "bayes_risk_error": np.asarray(1e-7),
                "bayes_route": np.asarray("exact")}

    monkeypatch.setattr(_sweep_compute, "compute_prediction", fake_prediction)
    monkeypatch.setattr(_sweep_compute, "compute_theory", theory)
    monkeypatch.setattr(_sweep_compute, "compute_theories", lambda configs: [theory(c) for c in configs])
    monkeypatch.setattr(_sweep_compute, "compute_bayes", bayes)
    monkeypatch.setattr(_sweep, "classifying_weights", lambda setup, M, Q, b: np.ones(np.shape(b)))  # softmax's, exactly
    return bayes_calls


BASE = tiny()
GRIDS = [parse_grid("model.heads=1,2,4"), parse_grid("problem.F=1,2")]


def read_csv(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_heads_needed_is_the_fewest_heads_within_the_gap():
    rows = [{"activation": a, "F": F, "heads": H, "gap_to_bayes": g, "strength": s}
            for a, F, H, g, s in [("softmax", 2, 1, 0.2, 1), ("softmax", 2, 2, 0.005, 1), ("softmax", 2, 4, 0.009, 1),
                                  ("softmax", 2, 3, 0.004, 1), ("bsoftmax", 2, 1, 0.5, 1), ("bsoftmax", 2, 2, math.nan, 1),
                                  ("softmax", 2, 1, 0.001, 2)]]
    needed = heads_needed(rows, ["model.heads", "strength"], 0.01)
    # not monotone in H: still the fewest within the gap; a NaN gap never counts; strength is a group of its own
    assert needed == {("softmax", 2, 1): 2.0, ("bsoftmax", 2, 1): needed[("bsoftmax", 2, 1)], ("softmax", 2, 2): 1.0}
    assert math.isnan(needed[("bsoftmax", 2, 1)])


def test_sweep_joins_the_bayes_risk_once_per_problem(tmp_path, fake):
    rows, stats = _sweep.sweep(BASE, GRIDS, tmp_path, progress=False, gap=0.02)
    assert sorted(fake) == [1, 2]  # one Bayes entry per problem, not per point
    table = read_csv(tmp_path / "sweep.csv")
    for row in table:
        H, F = int(row["heads"]), int(row["F"])
        assert float(row["bayes_risk"]) == pytest.approx(0.01 * F) and float(row["bayes_risk_error"]) == 1e-7
        assert float(row["final_risk"]) == pytest.approx(final_risk(H, F))
        assert float(row["gap_to_bayes"]) == pytest.approx(0.05 / H)
        assert float(row["final_risk_error"]) == 1e-6
        assert float(row["gap_to_bayes_error"]) == pytest.approx(math.hypot(1e-6, 1e-7), rel=1e-5)
        # 0.05 / H <= 0.02 first at H = 4 (H = 2: 0.025)
        assert float(row["heads_needed"]) == 4.0 and float(row["gap_tol"]) == 0.02
    ds = load_sweep(tmp_path)
    assert ds["heads_needed"].dims == ("problem_F",) and ds["heads_needed"].values.tolist() == [4.0, 4.0]
    np.testing.assert_allclose(ds["gap_to_bayes"].sel(problem_F=2).values, [0.05, 0.025, 0.0125])
    assert "Bayes risk" in ds["bayes_risk"].attrs["description"]
    assert (tmp_path / "heads_needed.png").read_bytes()[:4] == b"\x89PNG"
    # again with a wider gap: from the cache, nothing recomputed, the answer moves
    rows, stats = _sweep.sweep(BASE, GRIDS, tmp_path, progress=False, gap=0.03)
    assert stats.computed == 0 and sorted(fake) == [1, 2] and {r["heads_needed"] for r in rows} == {2.0}


def test_compute_and_write_are_separate_steps(tmp_path, fake):
    rows, _ = _sweep.sweep(BASE, GRIDS, None, cache_dir=tmp_path / "cache", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # rows returned, nothing written but the cache
    outcome = _sweep.compute_sweep(BASE, GRIDS, tmp_path / "cache", progress=False)
    assert outcome.stats.computed == 0 and repr(outcome.rows) == repr(rows)
    _sweep.write_sweep_outputs(tmp_path / "out", outcome, figures=False)
    _sweep.sweep(BASE, GRIDS, tmp_path / "direct", cache_dir=tmp_path / "cache", progress=False, figures=False)
    assert (tmp_path / "out" / "sweep.csv").read_text() == (tmp_path / "direct" / "sweep.csv").read_text()
    with pytest.raises(ValueError, match="needs out"):
        _sweep.sweep(BASE, GRIDS, None)


def test_a_failed_bayes_risk_is_named_in_the_row(tmp_path, fake, monkeypatch):
    def fail(config):
        raise ValueError("problem.L x problem.F too large for the rule")

    monkeypatch.setattr(_sweep_compute, "compute_bayes", fail)
    rows, stats = _sweep.sweep(BASE, [parse_grid("model.heads=1")], tmp_path, progress=False, figures=False)
    (row,) = rows
    assert math.isnan(row["bayes_risk"]) and math.isnan(row["gap_to_bayes"]) and stats.failed == 1
    assert "Bayes risk failed: ValueError: problem.L x problem.F too large" in row["status"]
    assert np.isfinite(row["final_risk"])  # the point's own results stay


def test_the_command_prints_the_answer(tmp_path, fake, capsys):
    args = ["sweep", "default", "--grid", "model.heads=1,2,4", "--grid", "problem.F=1,2", "--set", "theory.points=64",
            "--out", str(tmp_path / "o"), "--no-progress", "--yes", "--force", "--gap", "0.03"]
    assert main(args) == 0  # --yes, --force: estimates scaled from earlier tests' records of fake points are no subject here
    out = capsys.readouterr().out
    assert "heads needed to come within gap_tol = 0.03 of the Bayes risk" in out
    # the fake risks still fall at the horizon: every point is flagged, in the table and in a line of its own
    assert re.search(r"softmax, F=2: 2 \(gap_to_bayes H=1: 0.05 \+- 1e-06 unsettled, H=2: 0.025 \+- 1e-06 unsettled, "
                     r"H=4: 0.0125 \+- 1e-06 unsettled\)", out)
    assert "not settled at the horizon: 6 of 6 points (softmax H=1 F=1," in out
    assert main([*args[:-1], "-1"]) == 2
    assert "singleloc sweep: error: --gap: must be a finite number >= 0, got -1.0" in capsys.readouterr().err


def test_one_name_per_quantity_in_the_csv_the_dataset_the_figure_and_the_docs(tmp_path, fake):
    rows, _ = _sweep.sweep(BASE, GRIDS, tmp_path, progress=False, simulate=False)
    for column in rows[0]:
        if "." not in column:  # not a grid value: described (in sweep.nc, and on the docs page the hook renders)
            assert column in COLUMNS and describe_column(column) == COLUMNS[column], column
    assert describe_column("sim_gap_to_bayes").startswith("simulation: final_risk - bayes_risk")
    assert "<!-- sweep-columns -->" in DOCS.read_text()
    from singleloc.plots import plot_phase_diagram

    titles = [ax.get_title() for ax in plot_phase_diagram(rows).axes if ax.get_title()]
    assert any("first_learned" in t and "predicted_escape" in t for t in titles)  # the CSV's names, not "escape"
    assert any("final_risk" in t for t in titles)


def test_a_rule_route_point_reports_the_exact_bayes_risk():
    """Issue 61 item 1: ``theory.route = rule`` moves the dynamics onto the Sobol rule, not the
    Bayes baseline, which stays the exact risk that ``singleloc bayes`` reports."""
    rule, exact = tiny(rule=True), tiny()
    assert _sweep_compute.bayes_config(rule) == _sweep_compute.bayes_config(exact)  # one entry, whatever the route
    entry = _sweep_compute.compute(_sweep_compute.bayes_config(rule), "bayes")
    reference = bayes_risk(rule.problem.build_prior(), rule.problem.L)  # `singleloc bayes`: the exact route
    assert str(entry["bayes_route"]) == "exact" and reference.points == 0
    assert float(entry["bayes_risk"]) == reference.value and float(entry["bayes_risk_error"]) < 1e-9


def test_a_count_decided_within_the_error_says_so():
    rows = [{"activation": "bsoftmax", "F": 2, "heads": H, "gap_to_bayes": g, "gap_to_bayes_error": e}
            for H, g, e in [(1, 0.13, 1e-4), (2, 0.012, 1e-4), (3, 0.00992, 5e-4), (4, 0.006, math.nan)]]
    add_heads_needed(rows, ["model.heads"], 0.01)
    # H = 3 is 8e-5 under the gap with an error of 5e-4: it may be 3 or 4 heads (H = 4's unstated error counts as 0)
    assert [rows[0][k] for k in ("heads_needed", "heads_needed_low", "heads_needed_high")] == [3.0, 3.0, 4.0]
    assert count_text(rows[0], 4) == "3-4 (within error)"
    table = heads_needed_table(rows, ["model.heads"])
    assert "bsoftmax, F=2: 3-4 (within error)" in table and "H=3: 0.00992 +- 0.0005" in table
    assert "H=4: 0.006 (error not stated)" in table
    from singleloc.plots import plot_heads_needed

    legend = [t.get_text() for t in plot_heads_needed(rows).axes[0].get_legend().get_texts()]
    assert "bsoftmax: 3-4 heads (within error)" in legend  # the figure says what the table says
    rows[2]["gap_to_bayes_error"] = 1e-5  # the margin now exceeds the error: one number
    add_heads_needed(rows, ["model.heads"], 0.01)
    assert count_text(rows[0], 4) == "3"
    rows[3]["gap_to_bayes"] = 0.0101  # nothing but H = 3 within the gap, and that within error
    rows[2]["gap_to_bayes_error"] = 5e-4
    add_heads_needed(rows, ["model.heads"], 0.01)
    assert count_text(rows[0], 4) == "3 or more than 4 (within error)"


def test_the_final_risk_error_is_the_larger_stated_one():
    se = np.array([[0.1, 2e-4], [0.1, 3e-4]])  # (seeds, times): the last time counts
    assert final_risk_error({"route": np.asarray("exact"), "risk_error": np.asarray(1e-12), "risk_se": se}) == 3e-4
    assert final_risk_error({"route": np.asarray("exact"), "risk_error": np.asarray(1e-3)}) == 1e-3
    assert final_risk_error({"route": np.asarray("rule"), "risk_error": np.asarray(2e-3)}) == 2e-3  # every route's
    assert math.isnan(final_risk_error({"route": np.asarray("rule"), "risk_error": np.asarray(math.nan),
                                        "risk_se": np.full((2, 2), math.nan)}))  # an entry cached before

"""Figures of runs (issue 53): ``singleloc plot RUN_DIR`` on every kind of run folder, ``load_run``
returning the result objects the plots take, heads matched to the spikes they learn, ``integrate``'s
figure and ``--horizon``, and prune's table numbering heads from 1."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from _tiny import stub_solves, tiny

from singleloc import PruningResult, SimulationResult, TheoryResult, load_config, plots
from singleloc.analysis import _predictions
from singleloc.analysis._predictions import EscapePrediction
from singleloc.cli import main
from singleloc.io._run_folders import load_run, npz_stamp, save_run
from singleloc.pruning import _pruning

CONFIG = tiny("model.heads=3", "problem.F=2")  # the shapes of the arrays below
T = 9


def trajectories(seeds: int, H: int = 3, F: int = 2, value: float = 1.0) -> dict[str, np.ndarray]:
    """Head h of seed s ends on spike h mod F (sign + for even s), with M growing linearly in tau."""
    tau = np.linspace(0.0, 8.0, T)
    M = np.zeros((seeds, T, H, F))
    for s in range(seeds):
        for h in range(H):
            M[s, :, h, h % F] = (1 if s % 2 == 0 else -1) * value * tau / tau[-1] * (1 + 0.1 * h)
    Q = M @ np.swapaxes(M, -1, -2) + 0.5 * np.eye(H)
    return {"tau": tau, "M": M, "Q": Q, "b": np.zeros((seeds, T, H)), "risk": np.tile(np.linspace(0.8, 0.3, T), (seeds, 1))}


def theory_file(seeds_arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``theory.npz`` of seed 0, with a route and stated errors as TheoryResult.arrays writes them."""
    one = {k: (v if k == "tau" else v[0]) for k, v in seeds_arrays.items()}
    return one | {"route": np.asarray("rule"), "points": np.asarray(64), "replicates": np.asarray(1),
                  "drift_error": np.asarray(0.01), "risk_se": np.full(T, np.nan)}


def simulation_file(seeds_arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return seeds_arrays | {"risk_limit": seeds_arrays["risk"] - 0.01}


@pytest.fixture
def folders(tmp_path):
    """Canned run folders of each command (arrays of the right shapes, no computation)."""
    theory, sim = trajectories(1), trajectories(2)
    out = {"integrate": save_run(tmp_path / "integrate", CONFIG, {"theory.npz": theory_file(theory)}),
           "simulate": save_run(tmp_path / "simulate", CONFIG, {"simulation.npz": simulation_file(sim)}),
           "compare": save_run(tmp_path / "compare", CONFIG, {"theory.npz": theory_file(sim), "theory_seeds.npz": sim,
                                                              "simulation.npz": simulation_file(sim)})}
    prune = {"n_removed": np.arange(3), "route": np.asarray("rule"), "order": np.asarray("alignment"),
             "theory_risks": np.array([[0.3, 0.31, 0.5]]), "theory_removed": np.array([[2, 0]])}
    out["prune"] = save_run(tmp_path / "prune", CONFIG, {"prune.npz": prune})
    return out


def test_load_run_gives_the_result_objects(folders):
    sim = trajectories(2)
    run = load_run(folders["compare"])
    assert isinstance(run.theory, TheoryResult) and isinstance(run.simulation, SimulationResult)
    np.testing.assert_array_equal(run.theory.M, sim["M"])  # every seed's theory, from theory_seeds.npz
    np.testing.assert_array_equal(run.simulation.risk_limit, sim["risk"] - 0.01)
    assert (run.theory.route, run.theory.points, run.theory.drift_error) == ("rule", 64, 0.01)  # from theory.npz
    assert run.simulation.K is None and run.pruning is None and list(run.data) == ["theory", "simulation"]
    one = load_run(folders["integrate"]).theory
    assert one.M.shape == (1, T, 3, 2) and one.risk.shape == (1, T) and one.risk_se.shape == (1, T)
    assert load_run(folders["integrate"]).simulation is None
    pruning = load_run(folders["prune"]).pruning
    assert set(pruning) == {"theory"} and isinstance(pruning["theory"], PruningResult)
    assert pruning["theory"].order == "alignment" and list(pruning["theory"].removed[0]) == [2, 0]


@pytest.mark.parametrize("kind, figures", [("integrate", ["theory.png", "phases.png"]), ("simulate", ["simulation.png"]),
                                           ("compare", ["compare.png", "phases.png"]), ("prune", ["prune.png"])])
def test_plot_adds_the_figures_of_every_kind_of_run(folders, capsys, monkeypatch, kind, figures):
    monkeypatch.setenv("SINGLELOC_PROGRESS", "lines")  # the suite's "off" (tests/conftest.py): the lines said here
    folder = folders[kind]
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert main(["plot", str(folder)]) == 0
    for name in figures:
        assert (folder / name).read_bytes()[:4] == b"\x89PNG", name
    assert all((folder / name).read_bytes() == data for name, data in before.items())  # the run's files kept
    assert sorted(p.name for p in folder.iterdir()) == sorted({*before, *figures})
    assert load_run(folder).config_hash == json.loads((folder / "config.json").read_text())["config_hash"]
    captured = capsys.readouterr()
    assert captured.out.startswith("wrote ")
    if "phases.png" in figures:  # the seconds of the heads' classification are said (stderr is no terminal: lines)
        assert re.search(r"singleloc plot: classifying the 3 heads at 9 saved times .* for phases.png \.\.\.\n"
                         r"singleloc plot: classified the heads in [0-9.]+ (ms|s)", captured.err), captured.err


def test_plot_into_another_folder_and_refusals(folders, tmp_path, capsys):
    assert main(["plot", str(folders["compare"]), "--out", str(tmp_path / "figs"), "--log-time"]) == 0
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["compare.png", "phases.png"]
    assert not (folders["compare"] / "compare.png").exists()
    sweep_dir = tmp_path / "sw"
    sweep_dir.mkdir()
    (sweep_dir / "sweep.nc").write_bytes(b"x")
    assert main(["plot", str(sweep_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "output folder of `singleloc sweep`" in err and "load_sweep" in err


def test_matched_heads_orders_heads_by_the_spike_they_learn():
    # seed 0: head 2 on spike 1, head 0 on spike 2 (negative), head 1 nothing; seed 1: four heads, two per spike
    M0 = np.array([[0.1, -1.8], [0.2, 0.1], [2.0, 0.3]])
    assert plots.matched_heads(M0).tolist() == [2, 0, 1]
    M1 = np.array([[[0.0, 1.0], [2.0, 0.0], [0.0, 1.5], [-1.9, 0.1]]])
    assert plots.matched_heads(M1).tolist() == [[1, 2, 3, 0]]  # first round: 1 (spike 1), 2 (spike 2); then 3, 0


def test_compare_figure_averages_like_heads(folders):
    """Seed 1 is seed 0 with its heads permuted and its overlaps negated: matched and sign-aligned,
    the mean over seeds is seed 0's curve, and the legend names every line style."""
    base = trajectories(1, H=2)
    M = np.concatenate([base["M"], -base["M"][:, :, ::-1]])
    theory = TheoryResult(base["tau"], M, np.concatenate([base["Q"]] * 2), np.zeros((2, T, 2)), np.tile(base["risk"], (2, 1)))
    fig = plots.plot_compare(theory, title="t")
    assert len(fig.axes) == 1 + 2 + 1  # risk, two spikes, the alignment panel
    lines = [line for line in fig.axes[1].lines if line.get_label() == "head 1: aligned to spike 1"]  # its class, both seeds
    np.testing.assert_allclose(lines[0].get_ydata(), base["M"][0, :, 0, 0])
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["theory: mean of 2 starts", "theory: min to max over starts", "thin lines: each start (seed) on its own"]
    assert sum(len(line.get_ydata()) == T and line.get_linewidth() < 1 for line in fig.axes[0].lines) == 2  # each start
    sim = SimulationResult(base["tau"], M, theory.Q, theory.b, theory.risk, theory.risk, None, None)
    fig = plots.plot_compare(theory, sim, outcomes=("2 of 2 starts: 2 on e1", "1 of 2 seeds: 2 on e1; 1 of 2: 1 on e1, 1 off"))
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[-2:] == ["simulation: mean of 2 seeds, bars min to max", "largest |simulation - theory| of one seed: 0.000"]
    assert fig._supxlabel.get_text().split("\n") == [f"heads at tau = {base['tau'][-1]:g}, theory: 2 of 2 starts: 2 on e1",
                                                     f"heads at tau = {base['tau'][-1]:g}, simulation: 1 of 2 seeds: 2 on e1; "
                                                     "1 of 2: 1 on e1, 1 off"]


def test_integrate_draws_its_figure_and_takes_a_horizon(tmp_path, capsys, monkeypatch):
    """The horizon's saved times, the figure and the stamp (the solve is canned: the subject is the command)."""
    stub_solves(monkeypatch)
    tiny = ["--set", "theory.points=64", "--set", "problem.L=3", "--set", "sgd.tau_max=300", "--no-progress"]
    assert main(["integrate", "default", *tiny, "--horizon", "20", "--out", str(tmp_path / "a")]) == 0
    run = load_run(tmp_path / "a")
    tau = run.theory.tau
    assert tau[-1] == pytest.approx(20.0) and len(tau) == 201 and tau[2] / tau[1] == pytest.approx(tau[-1] / tau[-2])
    assert npz_stamp(tmp_path / "a" / "theory.npz") == run.config_hash and (tmp_path / "a" / "theory.png").is_file()
    captured = capsys.readouterr()
    assert "on a log grid of 201 saved times" in captured.err
    # the canned risk falls to the end: the run says it has not settled, and its theory.npz stores that
    assert "the run NOT settled: its final risk and head classes are what the horizon caught" in captured.out
    assert re.search(r"risk 0\.8000 -> 0\.5000 \+- 1\.0e-12\n", captured.out), captured.out  # the canned exact route's error
    with np.load(tmp_path / "a" / "theory.npz") as f:
        assert not bool(f["settled"]) and float(f["risk_change"]) > 1e-3
    # auto: the sweep's predicted horizon (the prediction is stubbed: 2.5 x 12 rounded up = 30)
    prediction = EscapePrediction(0.1, 3.0, 0.3, 12.0, 30.0, 1000, np.array([3.0]), np.array([0.1]))
    monkeypatch.setattr(_predictions, "compute_prediction", lambda config: prediction.arrays())
    assert main(["integrate", "default", *tiny, "--horizon", "auto", "--out", str(tmp_path / "b")]) == 0
    assert load_run(tmp_path / "b").theory.tau[-1] == pytest.approx(30.0)
    assert "predicted escape at tau = 12" in capsys.readouterr().err
    # the prediction is kept, and plot's phases.png tells it from the measured escape (issue 61 item 5)
    from singleloc._commands.plot import run_figures

    risk_panel = run_figures(load_run(tmp_path / "b"))["phases.png"].axes[0]
    legend = [t.get_text() for t in risk_panel.get_legend().get_texts()]
    assert "predicted escape: 12 (linearisation)" in legend
    assert [line.get_marker() for line in risk_panel.lines if line.get_label().startswith("predicted")] == ["D"]


def test_integrate_suggests_a_log_grid_for_a_long_linear_one(tmp_path, capsys, monkeypatch):
    import singleloc.theory._ode as ode

    calls = []
    monkeypatch.setattr(ode, "integrate_setup", lambda setup, **kw: calls.append(setup) or _fake_theory(setup))
    assert main(["integrate", "default", "--set", "sgd.tau_max=600", "--out", str(tmp_path / "c")]) == 0
    assert "--set sgd.spacing=log" in capsys.readouterr().err
    assert main(["integrate", "default", "--out", str(tmp_path / "d")]) == 0  # tau_max = 30 on 61 times: fine
    assert "spacing" not in capsys.readouterr().err and len(calls) == 2


def _fake_theory(setup) -> TheoryResult:
    """A trajectory of ``setup``'s shapes on the route it decided (as a solve that did not change route)."""
    H, F, sgd = setup.model.heads, setup.problem.F, setup.sgd
    tau = np.linspace(0, sgd.tau_max, sgd.n_save)
    M = np.zeros((1, len(tau), H, F))
    return TheoryResult(tau, M, np.tile(np.eye(H), (1, len(tau), 1, 1)), np.zeros((1, len(tau), H)), np.ones((1, len(tau))),
                        route=setup.route.route)


def test_prune_numbers_heads_from_one_as_the_figures_do(folders, capsys, monkeypatch):
    """The greedy order removes heads 3 then 1 (0-based 2, 0 in prune.npz): the table says 3 and 1."""
    result = PruningResult("greedy", np.array([[2, 0]]), np.array([[0.30, 0.305, 0.42]]), np.array([[1e-13, 2e-13, 1e-13]]))
    monkeypatch.setattr(_pruning, "prune_layers", lambda setup, data, order, **kw: {"theory": [result]})
    assert main(["prune", str(folders["integrate"])]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [row[-1] for row in rows] == ["3", "1"] and "+- 2.0e-13" in out and "0.0000" not in out
    with np.load(folders["integrate"] / "prune.npz") as d:
        assert d["theory_removed"].tolist() == [[2, 0]] and str(d["order"]) == "greedy"


def test_a_folder_of_another_run_is_refused_and_never_overwritten(folders, tmp_path, capsys):
    """Issue 62: ``plot RUN --out OTHER_RUN`` overwrote the other run's phases.png, and ``attention --out``
    into a run folder added its files beside the run's: both refused in one line naming both runs, a file
    of the other run is never replaced (even with --beside-run), and ``load_run`` refuses the mixed folder."""
    other_config = load_config("default", ["model.heads=3", "sgd.lr=0.3"])  # same shapes, another run
    other = save_run(tmp_path / "other", other_config, {"theory.npz": theory_file(trajectories(1))})
    assert main(["plot", str(other)]) == 0
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    capsys.readouterr()
    mine, theirs = load_run(folders["integrate"]).config_hash, load_run(other).config_hash
    for extra in ([], ["--beside-run"]):
        assert main(["plot", str(folders["integrate"]), "--out", str(other), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and mine in err and theirs in err, err
        assert {p.name: p.read_bytes() for p in other.iterdir()} == before
    bare = save_run(tmp_path / "bare", other_config, {"theory.npz": theory_file(trajectories(1))})
    assert main(["plot", str(folders["integrate"]), "--out", str(bare)]) == 2
    assert "--beside-run" in capsys.readouterr().err
    assert main(["plot", str(folders["integrate"]), "--out", str(bare), "--beside-run"]) == 0  # told: added beside
    with pytest.raises(ValueError, match=f"theory.png was made by another config \\(hash {mine}\\).*mixes"):
        load_run(bare)
    text = tmp_path / "t.txt"
    text.write_text("a short text")
    assert main(["attention", str(text), "--out", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and theirs in err and "t.txt" in err and "--beside-run" in err, err
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before


def test_a_run_whose_arrays_turn_nan_is_refused(tmp_path, capsys):
    """Issue 62: ``plot`` of a run whose arrays turn NaN exited 0 with curves that stop and heads classed as
    "combination heads": ``load_run`` (and so ``plot``) refuses it in one line naming the file, the array
    and the first saved time."""
    sim = trajectories(2)
    sim["Q"][1, 5:] = np.nan
    folder = save_run(tmp_path / "nan", CONFIG, {"simulation.npz": simulation_file(sim)})
    with pytest.raises(ValueError, match=r"simulation.npz: Q is NaN or infinite at saved time 5 of 9 \(tau = 5\)"):
        load_run(folder)
    assert main(["plot", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Q is NaN or infinite" in err and not (folder / "simulation.png").exists()

"""Sweeps: grid parsing, the on-disk cache, the horizon, the CSV and the ``sweep`` command."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from _tiny import EXACT_TINY, cli_sets
from helpers import fake_bayes, fake_prediction, read_csv

from singleloc import load_config
from singleloc.analysis._predictions import escape_horizon, resolve_horizon
from singleloc.cli import main
from singleloc.io._run_folders import save_npz
from singleloc.sweeps import _sweep, _sweep_compute, _sweep_entries
from singleloc.sweeps._grid import grid_points, parse_grid

TINY = [*EXACT_TINY, "problem.F=2", "theory.points=16", "sgd.n_save=5", "simulation.seeds=1", "simulation.D=1000",
        "simulation.test_samples=4096"]  # the slow tests' problem


def test_parse_grid():
    g = parse_grid("model.heads=1,2,4")
    assert (g.section, g.key, g.values, g.name) == ("model", "heads", (1, 2, 4), "model.heads")
    assert parse_grid("model.activation=softmax,bsoftmax").values == ("softmax", "bsoftmax")
    assert parse_grid("problem.mean=[1, 0],[0.5, 0.5]").values == ([1, 0], [0.5, 0.5])
    assert parse_grid("sgd.lr=0.5").values == (0.5,)
    for bad, msg in (("model.heads", "section.key=v1"), ("heads=1,2", "section.key=v1"), ("model.heads=1,,2", "empty value"),
                     ("model.nope=1,2", "unknown key model.nope"), ("nosec.heads=1", "unknown section"),
                     ("model.heads=1,1", "repeated")):
        with pytest.raises(ValueError, match=msg):
            parse_grid(bad)


def test_grid_points_product_and_validation():
    base = load_config("default")
    pts = grid_points(base, [parse_grid("model.heads=1,2,3"), parse_grid("problem.F=1,2")])
    assert len(pts) == 6
    assert [(v["model.heads"], v["problem.F"]) for v, _ in pts][:3] == [(1, 1), (1, 2), (2, 1)]
    assert all(c.model.heads == v["model.heads"] and c.problem.F == v["problem.F"] for v, c in pts)
    with pytest.raises(ValueError, match="grid point model.heads=0.*model.heads"):
        grid_points(base, [parse_grid("model.heads=1,0")])


def test_cache_key_depends_on_config_and_kind_only():
    a = load_config("default")
    assert _sweep_entries.cache_key(a, "theory") == _sweep_entries.cache_key(load_config("default"), "theory")
    assert _sweep_entries.cache_key(a, "theory") != _sweep_entries.cache_key(a, "simulation")
    assert _sweep_entries.cache_key(a, "theory") != _sweep_entries.cache_key(a.replace(sgd={"lr": 0.25}), "theory")


@pytest.fixture
def fake_compute(monkeypatch):
    """Replace the prediction and the ODE by cheap synthetic ones and count the ODE calls: head h
    < F goes from 0 to 2 e_h (aligned for F >= 2; along the mean, so unspecialized, for F = 1). The
    phase summary's attention weights are 1 for every head (softmax's exactly: its rows sum to one)."""
    return _fake_compute(monkeypatch)


def _fake_compute(monkeypatch):
    calls = []
    monkeypatch.setattr(_sweep_compute, "compute_prediction", fake_prediction)
    monkeypatch.setattr(_sweep, "classifying_weights", lambda setup, M, Q, b: np.ones(np.shape(b)))
    monkeypatch.setattr(_sweep_compute, "compute_bayes", fake_bayes)

    def fake(config):
        calls.append(config)
        H, F, S = config.model.heads, config.problem.F, config.simulation.seeds
        tau = np.linspace(0, 10, 21)
        M = np.zeros((S, 21, H, F))
        for h in range(min(H, F)):
            M[:, :, h, h] = np.linspace(0.0, 2.0, 21)
        Q = M @ np.swapaxes(M, -1, -2) + 0.1 * np.eye(H)
        risk = np.tile(np.linspace(0.8, 0.2, 21) * config.sgd.lr, (S, 1))
        return {"tau": tau, "M": M, "Q": Q, "b": np.zeros((S, 21, H)), "risk": risk}

    monkeypatch.setattr(_sweep_compute, "compute_theory", fake)
    monkeypatch.setattr(_sweep_compute, "compute_theories", lambda configs: [fake(c) for c in configs])  # batched points
    return calls


def test_second_sweep_hits_the_cache_and_changes_recompute_only_affected_points(tmp_path, fake_compute):
    base = load_config("default", ["simulation.seeds=2", "theory.points=64"])  # the head weights' quadrature
    grids = [parse_grid("model.heads=1,2"), parse_grid("problem.F=1,2")]
    rows, st = _sweep.sweep(base, grids, tmp_path, progress=False, figures=False)
    assert (st.computed, st.cached, len(fake_compute)) == (4, 0, 4)
    files = sorted((tmp_path / "cache").glob("theory-*.npz"))
    assert len(files) == 4 and len(list((tmp_path / "cache").glob("prediction-*.npz"))) == 4
    mtimes = [f.stat().st_mtime_ns for f in files]
    rows2, st2 = _sweep.sweep(base, grids, tmp_path, progress=False, figures=False)
    assert (st2.computed, st2.cached, len(fake_compute)) == (0, 4, 4)
    assert [f.stat().st_mtime_ns for f in sorted((tmp_path / "cache").glob("theory-*.npz"))] == mtimes
    assert repr(rows2) == repr(rows)  # (NaN escape times compare unequal)
    # a new grid value: only its points are computed
    _, st3 = _sweep.sweep(base, [parse_grid("model.heads=2,3"), grids[1]], tmp_path, progress=False, figures=False)
    assert (st3.computed, st3.cached) == (2, 2)
    # one base value changed: every point depends on it
    _, st4 = _sweep.sweep(base.replace(sgd={"lr": 0.25}), grids, tmp_path, progress=False, figures=False)
    assert (st4.computed, st4.cached) == (4, 0)
    table = read_csv(tmp_path / "sweep.csv")
    assert len(table) == 4
    assert list(table[0])[:10] == ["model.heads", "problem.F", "activation", "heads", "F", "status", "horizon", "lambda",
                                   "tau_plateau", "predicted_escape"]
    for r in table:
        H, F = int(r["heads"]), int(r["F"])
        assert float(r["final_risk"]) == pytest.approx(0.2 * 0.25)
        assert float(r["horizon"]) == (200.0 if H > 1 else 300.0)
        # with F = 1 the only spike is the mean direction: along it, a head is unspecialized;
        # head 1 of H = 2, F = 1 has no spike part (unspecialized too)
        assert float(r["n_aligned"]) == (min(H, F) if F > 1 else 0)
        assert float(r["n_unspecialized"]) == H - float(r["n_aligned"])
        assert float(r["escaped"]) == (1.0 if F > 1 else 0.0)
        assert r["status"] == ("not yet (predicted escape at tau = 40)" if H > 1 and F == 1 else "ok")
        # the synthetic entries state no quadrature (as entries cached before they carried it): blank, not invented
        assert (r["route"], r["gram_route"]) == ("", "") and np.isnan(float(r["risk_error"]))
    assert _sweep.quadrature_summary(rows).endswith("not stated at 4 points (failed, or cached before entries carried it)")


def test_a_fixed_horizon_predicts_only_the_points_that_did_not_escape(tmp_path, fake_compute, monkeypatch):
    """With ``--horizon TAU`` (or ``config``) no prediction is needed to run a point: the escape is predicted after
    the runs, only where a point has not escaped by its horizon (its status says when it would), and nowhere
    else (the prediction took 2.2 min a point where the theory to the horizon took 74 s)."""
    predicted = []
    monkeypatch.setattr(_sweep_compute, "compute_prediction", lambda c: predicted.append(c) or fake_prediction(c))
    grids = [parse_grid("model.heads=1,2"), parse_grid("problem.F=1,2")]
    rows, _ = _sweep.sweep(load_config("default"), grids, tmp_path, horizon=20.0, progress=False, figures=False)
    assert sorted((c.model.heads, c.problem.F) for c in predicted) == [(1, 1), (2, 1)]  # F = 1: not escaped
    assert len(fake_compute) == 4 and all(c.sgd.tau_max == 20.0 for c in fake_compute)
    for r in rows:
        late = r["F"] == 1
        assert r["horizon"] == 20.0 and np.isnan(r["predicted_escape"]) != late
        assert r["status"] == ("not yet (predicted escape at tau = 40)" if late and r["heads"] > 1 else "ok")


def test_damaged_cache_file_is_recomputed(tmp_path, fake_compute):
    base = load_config("default")
    grids = [parse_grid("model.heads=1")]
    _sweep.sweep(base, grids, tmp_path, progress=False, figures=False)
    (f,) = (tmp_path / "cache").glob("theory-*.npz")
    good = f.read_bytes()
    with np.load(f) as d:
        arrays = {k: d[k] for k in d.files}
    # not a zip file; one array missing (both found from the zip's directory, before the run);
    # a whole zip with one array's bytes damaged (found by its CRC when the row is read)
    middle = len(good) // 2
    damaged = [b"not an npz", None, good[:middle] + bytes(b ^ 0xFF for b in good[middle:middle + 64]) + good[middle + 64:]]
    for bad in damaged:
        if bad is None:
            save_npz(f, {k: v for k, v in arrays.items() if k != "Q"})
        else:
            f.write_bytes(bad)
        with pytest.warns(UserWarning, match="is damaged"):
            _, st = _sweep.sweep(base, grids, tmp_path, progress=False, figures=False)
        assert st.computed == 1
        with np.load(f) as d:
            assert sorted(d.files) == sorted(arrays) and all(np.array_equal(d[k], v) for k, v in arrays.items())


def test_simulation_entry_names_its_risks_as_simulation_result(tmp_path, fake_compute, monkeypatch):
    """A simulation entry stores ``risk`` (empirical) and ``risk_limit`` under the names of
    SimulationResult; the phase analysis reads the limit risk, as for the theory."""

    def fake_simulation(config):
        data = _sweep_compute.compute_theory(config)  # the fake theory trajectory
        return {**data, "risk": data["risk"] + 0.5, "risk_limit": data["risk"]}

    monkeypatch.setattr(_sweep_compute, "compute_simulation", fake_simulation)
    base = load_config("default")
    rows, _ = _sweep.sweep(base, [parse_grid("model.heads=2")], tmp_path, simulate=True, progress=False, figures=False)
    (f,) = (tmp_path / "cache").glob("simulation-*.npz")
    with np.load(f) as d:
        assert sorted(d.files) == ["M", "Q", "b", "risk", "risk_limit", "tau"]
        assert d["risk"][0, -1] == pytest.approx(d["risk_limit"][0, -1] + 0.5)
    assert rows[0]["sim_final_risk"] == pytest.approx(rows[0]["final_risk"]) == pytest.approx(0.2 * base.sgd.lr)


def test_cache_key_changes_with_the_cache_layout(monkeypatch):
    a = load_config("default")
    key = _sweep_entries.cache_key(a, "simulation")
    monkeypatch.setattr(_sweep_entries, "CACHE_VERSION", _sweep_entries.CACHE_VERSION - 1)
    assert _sweep_entries.cache_key(a, "simulation") != key


def test_horizon_modes(tmp_path, fake_compute):
    """auto: the prediction's horizon on a log grid of at least 201 times; a number: that time on
    the same grid; config: the configuration as it is. The horizon is part of the cache key."""
    base = load_config("default", ["sgd.n_save=31", "theory.points=64"])
    grids = [parse_grid("model.heads=2")]
    for horizon, want in (("auto", (200.0, "log", 201)), (77.0, (77.0, "log", 201)), ("config", (30.0, "linear", 31))):
        rows, _ = _sweep.sweep(base, grids, tmp_path, horizon=horizon, progress=False, figures=False)
        sgd = fake_compute[-1].sgd
        assert (sgd.tau_max, sgd.spacing, sgd.n_save) == want and rows[0]["horizon"] == want[0]
        assert rows[0]["key"] == _sweep_entries.cache_key(fake_compute[-1], "theory")
    assert len(fake_compute) == 3
    big = base.replace(sgd={"n_save": 401})
    assert resolve_horizon(big, fake_prediction(big), "auto").sgd.n_save == 401
    for bad in ("never", 0, -1.0, float("inf"), True):
        with pytest.raises(ValueError, match="horizon must be"):
            _sweep.sweep(base, grids, tmp_path, horizon=bad, progress=False, figures=False)


def test_a_cached_prediction_sets_its_runs_horizon_in_the_estimate(tmp_path):
    """Before the predictions, a point whose prediction is in the cache is estimated at the horizon it set: a sweep run
    again from its cache announced 16 minutes of runs (at the fallback horizon's keys) that it then read in 16 s."""
    from singleloc.runtime._progress import reporting
    from singleloc.sweeps._sweep_estimate import sweep_costs

    cfg = load_config("default", TINY)
    prediction = fake_prediction(cfg)
    _sweep_entries._store(_sweep_entries._entry_path(tmp_path, cfg, "prediction"), "prediction", prediction)
    run = _sweep_entries._entry_path(tmp_path, resolve_horizon(cfg, prediction, "auto"), "theory")
    with reporting(mode="off"):
        assert list(sweep_costs([({}, cfg)], None, ["theory"], tmp_path, "auto", quiet=True)) == [run.name]
        run.touch()
        assert sweep_costs([({}, cfg)], None, ["theory"], tmp_path, "auto", quiet=True) == {}


@pytest.mark.slow
def test_cli_sweep_auto_horizon_real_prediction(tmp_path):
    """The default horizon with the real prediction and ODE (bsoftmax escapes fast)."""
    out = tmp_path / "auto"
    sets = ["theory.points=64", "simulation.seeds=1", "problem.L=3", "model.activation=bsoftmax"]
    assert main(["sweep", "default", "--grid", "model.heads=2", *[a for s in sets for a in ("--set", s)], "--out", str(out),
                 "--no-progress"]) == 0
    (two,) = read_csv(out / "sweep.csv")
    pred = float(two["predicted_escape"])
    assert 0 < float(two["tau_plateau"]) < pred < np.inf and float(two["lambda"]) > 0
    assert float(two["horizon"]) == escape_horizon(pred)
    assert two["status"] == "ok" and float(two["escaped"]) == 1.0 and float(two["first_learned"]) < float(two["horizon"])
    assert float(two["n_aligned"]) + float(two["n_leaning"]) == 2.0


@pytest.mark.slow
@pytest.mark.exact_route
def test_cli_sweep_real_theory_then_cached(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(_sweep_compute, "compute_prediction", fake_prediction)  # the real one: test_cli_sweep_auto_horizon_...
    out = tmp_path / "sw"
    args = ["sweep", "default", "--grid", "model.activation=softmax,bsoftmax", "--horizon", "config",
            *[a for s in TINY for a in ("--set", s)], "--out", str(out), "--no-progress"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "2 computed, 0 from the cache" in first
    rows = read_csv(out / "sweep.csv")
    assert len(rows) == 2 and {r["activation"] for r in rows} == {"softmax", "bsoftmax"}
    assert all(np.isfinite(float(r["final_risk"])) for r in rows)
    # the quadrature as integrate states it: both on the exact route (risk errors ~1e-12 at these short keys,
    # far under the route's 1e-5), the Gram term of L H = 6 fields on the Sobol rule
    assert all((r["route"], r["gram_route"]) == ("exact", "sobol") for r in rows)
    assert all(0 <= float(r["risk_error"]) < 1e-8 and 0 < float(r["gram_error"]) < 0.1 for r in rows)
    assert "theory quadrature: exact route at 2 points (largest stated risk error" in first
    assert (out / "phase_softmax.png").is_file() and (out / "phase_bsoftmax.png").is_file()
    assert main(args) == 0
    assert "0 computed, 2 from the cache" in capsys.readouterr().out


@pytest.mark.slow
def test_cli_sweep_batched_and_not_give_the_same_table(tmp_path, capsys, monkeypatch):
    """Four points that differ in values only (learning rate, strength): one batched solve or
    four; the CSV (6 digits) is the same, and each run fills its own cache."""
    monkeypatch.setattr(_sweep_compute, "compute_prediction", fake_prediction)
    tables = {}
    for mode in ("--batch", "--no-batch"):
        out = tmp_path / mode
        assert main(["sweep", "default", "--grid", "sgd.lr=0.3,0.5", "--grid", "problem.strength=2.5,3.5", "--horizon", "config",
                     *[a for s in TINY for a in ("--set", s)], "--out", str(out), "--no-progress", mode]) == 0
        assert "4 computed, 0 from the cache" in capsys.readouterr().out
        tables[mode] = (out / "sweep.csv").read_text()
    assert tables["--batch"] == tables["--no-batch"]
    assert len({r["final_risk"] for r in read_csv(tmp_path / "--batch" / "sweep.csv")}) == 4


def test_cli_sweep_with_simulation(tmp_path, capsys, monkeypatch, tiny_theory_seeds, tiny_simulation):
    """A sweep of one point of the canonical tiny problem with ``--simulate``: its theory and simulation
    are the programs of the session's tiny solves (a point integrates its seeds' starts)."""
    monkeypatch.setattr(_sweep_compute, "compute_prediction", fake_prediction)
    out = tmp_path / "sim"
    args = ["sweep", "default", "--grid", "model.activation=softmax", *cli_sets(), "--simulate", "--horizon", "config",
            "--out", str(out), "--cache", str(tmp_path / "c")]
    assert main(args) == 0
    (row,) = read_csv(out / "sweep.csv")
    assert np.isfinite(float(row["sim_final_risk"]))
    assert float(row["final_risk"]) == pytest.approx(float(np.mean(tiny_theory_seeds.risk[:, -1])), rel=1e-5)
    # the theory's quadrature as integrate states it: the users' default route, exact for softmax
    assert row["route"] == "exact" and 0 <= float(row["risk_error"]) < 1e-8
    assert "theory quadrature: exact route at 1 point (largest stated risk error" in capsys.readouterr().out
    assert len(list((tmp_path / "c").glob("simulation-*.npz"))) == 1


@pytest.mark.parametrize("args", [["--grid", "model.heads"], ["--grid", "model.heads=1,x"], ["--grid", "model.nokey=1,2"],
                                  ["--grid", "model.heads=0,1"], ["--grid", "model.heads=1", "--horizon", "soon"],
                                  ["--grid", "model.heads=1", "--horizon", "-5"]])
def test_cli_bad_arguments_exit_2_one_line(tmp_path, capsys, args):
    assert main(["sweep", "default", *args, "--out", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("singleloc sweep: error:") and "\n" not in err


@pytest.fixture(scope="module")
def _two_head_sweep(tmp_path_factory):
    """The folder of ``sweep default --grid model.heads=1,2 --horizon config`` on :func:`fake_compute`'s solves, made
    once for the tests that damage a copy; its arguments."""
    out = tmp_path_factory.mktemp("sweep") / "out"
    args = ["sweep", "default", "--grid", "model.heads=1,2", "--horizon", "config", "--no-progress", "--out", str(out)]
    with pytest.MonkeyPatch.context() as patch:
        _fake_compute(patch)
        assert main(args) == 0
    return out


def _outputs(folder):
    """Every file of a sweep's output folder but its cache: name -> (inode, bytes)."""
    return {p.name: (p.stat().st_ino, p.read_bytes()) for p in sorted(folder.iterdir()) if p.name != "cache"}


@pytest.mark.parametrize("after, code, heads", [(0, None, "1,2"), (1, None, "1,2"), (2, None, "1,2"), (1, "EROFS", "1,2"),
                                               (0, None, "1,2,3")])
def test_a_full_disk_or_read_only_folder_leaves_the_earlier_sweep_whole(tmp_path, capsys, fake_compute, monkeypatch,
                                                                         after, code, heads, _two_head_sweep):
    """Issue 21 item 4: a full disk during the outputs left a new sweep.csv beside the old
    sweep.nc (and a .sweep.nc.tmp-* file, after h5py's tracebacks and a segmentation fault).
    Now the outputs are replaced together or not at all, with one line. The same grid again
    writes the outputs only (its cache is complete: the disk fills at the CSV, the Dataset or a
    figure); one more head fills it at the new point's cache entry."""
    import errno

    from helpers import full_disk_after

    out = shutil.copytree(_two_head_sweep, tmp_path / "out", copy_function=shutil.copy2)
    args = ["sweep", "default", "--grid", "model.heads=1,2", "--horizon", "config", "--no-progress", "--out", str(out)]
    before = _outputs(out)
    assert {"sweep.csv", "sweep.nc", "phase_softmax.png"} <= set(before)
    capsys.readouterr()
    full_disk_after(monkeypatch, after, getattr(errno, code) if code else None)
    assert main([*args[:3], f"model.heads={heads}", *args[4:]]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    words = "Read-only file system" if code else "No space left on device"
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("singleloc sweep: error: could not write ") and words in lines[0], lines[0]
    if heads == "1,2":
        assert lines[0].endswith(f"nothing was written to '{out}', which is unchanged"), lines[0]
    else:
        assert f"{out / 'cache'}" in lines[0]
    assert _outputs(out) == before  # the same files, not even rewritten, and no temporary file
    assert not [p for p in (out / "cache").iterdir() if p.name.startswith(".")]


def test_a_new_sweep_removes_its_own_stale_figures_only(tmp_path, fake_compute):
    out = tmp_path / "out"
    base = ["sweep", "default", "--horizon", "config", "--no-progress", "--out", str(out)]
    assert main([*base, "--grid", "model.activation=softmax,softmax1", "--grid", "model.heads=1"]) == 0
    assert (out / "phase_softmax1.png").is_file()
    (out / "phase_mine.png").write_bytes(b"\x89PNG not singleloc's")
    assert main([*base, "--grid", "model.activation=softmax", "--grid", "model.heads=1"]) == 0
    assert not (out / "phase_softmax1.png").exists() and (out / "phase_softmax.png").is_file()
    assert (out / "phase_mine.png").read_bytes() == b"\x89PNG not singleloc's"


@pytest.mark.slow
def test_sweep_with_auto_points_resolves_them_once_per_point(tmp_path):
    """``theory.points = "auto"`` in a sweep (issue 23 item 1: every point failed with "a number is
    needed here"): the prediction, the theory and the phase summary of a point use one number, the
    one :func:`resolve_points` picks at the point's starts; a sweep that gives that number
    explicitly integrates the same configurations (same theory keys) to the same table."""
    sets = [s for s in TINY if not s.startswith("theory.points")]
    grids = [parse_grid("model.heads=1,2")]
    auto = load_config("default", sets + ["theory.points=auto", "theory.tol=0.05"])
    rows, _ = _sweep.sweep(auto, grids, tmp_path / "auto", horizon="config", progress=False, figures=False)
    assert [r["status"].split(" (")[0] for r in rows] == ["ok", "not yet"]  # none failed; two heads escape later
    from singleloc import build, initial_conditions, resolve_points

    for row in rows:
        H = row["heads"]
        point = auto.replace(model={"heads": H})
        chosen = resolve_points(build(point), initial_conditions(point)).config
        assert isinstance(chosen.theory.points, int)
        fixed, _ = _sweep.sweep(chosen, [parse_grid(f"model.heads={H}")], tmp_path / f"fixed{H}", horizon="config",
                                progress=False, figures=False)
        assert fixed[0]["key"] == row["key"] and fixed[0]["final_risk"] == row["final_risk"]

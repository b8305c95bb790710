"""Never silent, and estimates before the work (issue 49 items 2 and 3): the phase lines of the
commands, the live line on a terminal, the records of measured times per device and shape family
(written, read back and used), the sweep's estimate per point and its refusal above an hour.

No test asserts on wall time: the times in the lines are matched as numbers, and where a time
matters its clock is a fake one (``singleloc.runtime._progress.clock``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import singleloc as sl
from singleloc.cli import main
from singleloc.preflight import _estimates
from singleloc.preflight._build import build
from singleloc.preflight._estimates import REFERENCE, TheorySolve, Timings, solve_size
from singleloc.runtime import _compilation, _progress
from singleloc.runtime._numerics import WEIGHTED_STEPS, expected_steps
from singleloc.runtime._progress import Bar, Estimate
from singleloc.simulation import _simulation_estimate
from singleloc.sweeps import _sweep, _sweep_compute
from singleloc.sweeps._grid import grid_points, parse_grid
from singleloc.theory._step_budget import STEP_MARGIN, step_budget

SETS = ["theory.route=rule", "theory.points=64", "sgd.tau_max=2", "sgd.n_save=3", "simulation.D=200", "simulation.seeds=1"]
ARGS = [a for s in SETS for a in ("--set", s)]
TIME = r"[0-9.e+-]+ (s|min|h)"


class FakeClock:
    """A clock that moves by ``step`` seconds at every reading."""

    def __init__(self, step: float = 1.0):
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


@pytest.fixture
def records(tmp_path, monkeypatch):
    """Fresh records of this device at ``tmp_path / "timings.json"`` (a command writes them, a Python caller keeps them
    in its process), the device's calibration at the reference CPU's, a Python caller's lines off (the commands' as
    without a terminal), and a process that holds no compiled solve yet (so that a solve compiles or loads its program)."""
    monkeypatch.setattr(_estimates, "timings_path", lambda: tmp_path / "timings.json")
    monkeypatch.setattr(_estimates, "measure_benchmark", lambda: dict(REFERENCE["benchmark"]))
    monkeypatch.delenv(_progress.MODE_ENV, raising=False)
    monkeypatch.setattr(_estimates, "_IN_PROCESS", set())
    monkeypatch.setattr(_compilation, "_LOADED", {})
    with _progress.reporting(mode="off"):
        yield tmp_path / "timings.json"


@pytest.fixture
def fake_compute(monkeypatch):
    """Predictions and solves that cost nothing (tests/test_sweep.py's synthetic ones); the list of
    the points computed."""
    from helpers import fake_bayes, fake_prediction

    calls = []

    def prediction(config):
        calls.append(config)
        return fake_prediction(config)

    def theory(config):
        calls.append(config)
        H, F, S, T = config.model.heads, config.problem.F, config.simulation.seeds, 5
        M = np.zeros((S, T, H, F))
        return {"tau": np.linspace(0, 2, T), "M": M, "Q": np.tile(np.eye(H), (S, T, 1, 1)), "b": np.zeros((S, T, H)),
                "risk": np.tile(np.linspace(0.8, 0.4, T), (S, 1))}

    monkeypatch.setattr(_sweep_compute, "compute_prediction", prediction)
    monkeypatch.setattr(_sweep_compute, "compute_bayes", fake_bayes)
    monkeypatch.setattr(_sweep, "classifying_weights", lambda setup, M, Q, b: np.ones(np.shape(b)))  # softmax's exactly
    monkeypatch.setattr(_sweep_compute, "compute_theory", theory)
    monkeypatch.setattr(_sweep_compute, "compute_theories", lambda configs: [theory(c) for c in configs])
    return calls


def stderr_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_the_records_are_kept_per_device_and_shape_family_and_written_by_the_commands_only(tmp_path):
    path = tmp_path / "timings.json"
    a = Timings(path, "cpu: A x 2")
    a.record("integrate:0", "integrate", "zero", 1.0, 2.0)  # a Python caller's: kept in its process
    assert a.family("integrate:0")["rates"] == [2.0] and not path.exists()
    with _progress.reporting(record=True):  # a command's: written
        a.record("integrate:1", "integrate", "one", 1.0, 2.0, compile=30.0)
        Timings(path, "cpu: A x 2").record("integrate:1", "integrate", "one", 1.0, 4.0)  # another process's
    back = Timings(path, "cpu: A x 2").family("integrate:1")  # read back from the file
    assert back["rates"] == [2.0, 4.0] and back["compile"] == 30.0 and back["label"] == "one"
    assert Timings(path, "gpu: NVIDIA H200").family("integrate:1") == {}  # another device: its own records
    assert Timings(path, "cpu: A x 2").family("integrate:2") == {}  # another family
    path.write_text("{ damaged")
    assert Timings(path, "cpu: A x 2").family("integrate:1") == {}  # ignored, then replaced by the next record
    with _progress.reporting(record=True):
        Timings(path, "cpu: A x 2").record("integrate:3", "integrate", "three", 1.0, 1.0)
    assert Timings(path, "cpu: A x 2").family("integrate:3")["rates"] == [1.0]


def test_the_calibration_is_measured_once_in_a_process_and_never_written(records, monkeypatch):
    """The kernel reads the share of the processor a process gets now: kept in the process, not in the file."""
    calls = []
    twice = {"run": 2 * REFERENCE["benchmark"]["run"], "compile": REFERENCE["benchmark"]["compile"]}
    monkeypatch.setattr(_estimates, "measure_benchmark", lambda: calls.append(1) or twice)
    with _progress.reporting(record=True):
        assert (_estimates.speed("run"), _estimates.speed("compile"), _estimates.speed("run")) == (2.0, 1.0, 2.0)
        _estimates.timings().record("a", "kind", "family a", 1.0, 1.0)
    assert len(calls) == 1 and "benchmark" not in records.read_text()


def test_the_calibration_compiles_its_kernel_in_every_process_and_never_stores_it(monkeypatch):
    """Its ``compile`` reading is the compiler's speed now: the kernel is not kept in the persistent cache (where a later
    process would load it in a millisecond and read nothing). The writes of this process are watched, not the folder,
    which the suite's other worker fills at the same time, after a first measurement has made the small programs of its
    input (``jnp.linspace``), which a cache that does not hold them yet stores."""
    import jax
    from jax._src import compilation_cache

    assert jax.config.jax_compilation_cache_dir, "the suite runs with a persistent compilation cache (tests/conftest.py)"
    stored, put = [], compilation_cache.put_executable_and_time
    _estimates.measure_benchmark()
    monkeypatch.setattr(compilation_cache, "put_executable_and_time", lambda *a, **k: stored.append(a[0]) or put(*a, **k))
    readings = [_estimates.measure_benchmark() for _ in range(2)]
    assert all(r["compile"] > 10 * r["run"] > 0 for r in readings), readings  # compiling a loop takes longer than running it
    assert stored == []


def test_a_fixed_cost_is_the_familys_else_its_model_times_the_kinds_measured_over_modelled_else_the_speed(records):
    t = _estimates.timings()
    t.record("a", "kind", "family a", 1.0, compile=30.0, references={"compile": 10.0})  # compiled 3x its model
    t.record("b", "kind", "family b", 1.0, compile=4.0)  # no model recorded: not a ratio
    assert _estimates.fixed("kind", "a", "compile", 99.0) == (30.0, "")
    assert _estimates.fixed("kind", "c", "compile", 20.0) == (60.0, "as other families here")  # twice a's program
    assert _estimates.fixed("other", "d", "compile", 20.0) == (20.0, "from this CPU's speed")  # the reference's


def test_a_solves_steps_follow_the_expected_steps_then_grow_as_the_root_of_its_span_then_as_the_span():
    assert solve_size(1.0, 200.0, 0, 2.0) == pytest.approx(REFERENCE["solve"] * expected_steps(2.0, 200.0))
    assert solve_size(1.0, 4 * 700.0, 0) / solve_size(1.0, 700.0, 0) == pytest.approx(2.0)
    assert solve_size(1.0, 4 * 5000.0, 0) / solve_size(1.0, 5000.0, 0) == pytest.approx(4.0)  # stability-held steps
    # trained head weights: in proportion to the span from the start, WEIGHTED_STEPS times the law
    assert solve_size(1.0, 700.0, 0, weighted=True) == pytest.approx(2.3 * REFERENCE["solve"] * expected_steps(1.0, 700.0))
    assert expected_steps(1.0, 700.0, weighted=True) == pytest.approx(WEIGHTED_STEPS * expected_steps(1.0, 700.0))
    assert solve_size(1.0, 1000.0, 10) - solve_size(1.0, 1000.0, 0) == pytest.approx(10 * REFERENCE["saved"])


def test_a_solves_step_budget_counts_its_head_weighting():
    """The budget that stops a solve (integrate's and the stability flows') expects a trained weighting's steps."""
    uniform, trained = (build(sl.load_config("default", [f"model.head_weights={w}"])).rule for w in ("uniform", "trained"))
    ts = np.linspace(0.0, 3000.0, 61)
    assert step_budget(uniform, ts, 10**9) == int(STEP_MARGIN * expected_steps(uniform.rate(0.0), 3000.0))
    assert step_budget(trained, ts, 10**9) == int(STEP_MARGIN * WEIGHTED_STEPS * expected_steps(uniform.rate(0.0), 3000.0))
    assert step_budget(trained, ts, 1000) == 1000


def test_an_estimate_is_the_model_times_the_rate_of_its_family_else_the_nearest_else_the_speed(records):
    t = _estimates.timings()
    for rate in (50.0, 1.0, 1.0, 3.0):  # the first is too old to count: rates 1, 1, 3, median 1
        t.record("a", "kind", "family a", 1.0, rate)
    t.record("b", "kind", "family b", 100.0, 7.0)
    assert _estimates.estimate("kind", "a", 1.0, 10.0) == Estimate(10.0, "measured on this CPU for this shape family")
    assert _estimates.estimate("kind", "c", 50.0, 10.0) == Estimate(70.0, "scaled from family b on this CPU")  # nearer
    assert _estimates.estimate("other", "d", 1.0, 10.0) == Estimate(10.0, "from this CPU's speed")  # the reference's


def test_a_solve_records_its_times_and_the_next_estimate_is_measured(records, monkeypatch):
    """Written (after the solve, from the phase's clock), read back and used (the estimate of the
    next solve of the family, scaled along tau by the cost model), and the basis said."""
    config = sl.load_config("default", SETS)
    first = TheorySolve("integrate", build(config), 1, 3, 2.0)
    assert first.expect == "compile" and first.why == "first run of this shape family"
    assert first.estimate.basis == "first run of this shape family: from this CPU's speed"
    work = first.work
    expected = REFERENCE["prepare"]["rule"] + REFERENCE["compile"]["rule"] + solve_size(work, 2.0, 3)  # the reference's speed
    assert first.estimate.seconds == pytest.approx(expected)
    monkeypatch.setattr(_progress, "clock", FakeClock(1.0))  # each stage of the phase: one tick
    sl.integrate(config)
    assert not records.exists()  # a Python caller's records stay in its process (issue 60 item 5)
    record = _estimates.timings().family(first.key)
    assert record["rates"] == pytest.approx([1.0 / solve_size(work, 2.0, 3)])
    assert record.get("compile", record.get("load")) == 1.0 and record["prepare"] == 1.0
    assert record["work"] == work and record["label"] == "integrate, softmax H=2 L=4 F=2 on the rule route"
    again = TheorySolve("integrate", build(config), 1, 3, 4.0)  # held by this process now: it only runs
    assert again.expect == "run" and again.estimate.basis == "measured on this CPU for this shape family"
    assert dict(again.estimate.parts) == pytest.approx({"building the rules": 1.0,
                                                        "solving": solve_size(work, 4.0, 3) / solve_size(work, 2.0, 3)})
    wider = config.replace(model={"heads": 3})
    other = TheorySolve("integrate", build(wider), 1, 3, 2.0)  # a new family, scaled from this one
    assert "scaled from integrate, softmax H=2 L=4 F=2 on the rule route" in other.estimate.basis
    assert other.estimate.parts[-1][1] == pytest.approx(solve_size(other.work, 2.0, 3) / solve_size(work, 2.0, 3))


def test_a_batch_of_points_is_sized_by_each_points_rate(records):
    """Points solved together take each its own adaptive steps (one CPU device: in turn), so a batch's size is the
    sum of its points' sizes at their own learning rates, whatever their order; it was the first point's law for
    all (a batch of ``sgd.lr = 1e4`` and ``0.5`` announced at the stiff point's steps twice)."""
    config = sl.load_config("default", SETS)
    stiff, mild = (build(config.replace(sgd={"lr": lr})) for lr in (1e4, 0.5))
    alone = [TheorySolve("integrate", s, 1, 3, 2.0).size for s in (stiff, mild)]
    assert alone[0] > 5 * alone[1]  # expected_steps grows as rate^0.75
    for first in (stiff, mild):
        batch = TheorySolve("integrate_points", first, 1, 3, 2.0, [s.sgd.rate for s in (stiff, mild)])
        assert batch.batch == 2 and batch.size == pytest.approx(sum(alone), rel=1e-12)
    assert "extrapolated from rates up to 256" in TheorySolve("integrate", stiff, 1, 3, 2.0).estimate.basis  # 12 h, then
    assert "extrapolated" not in TheorySolve("integrate", mild, 1, 3, 2.0).estimate.basis  # it diverged in 2 minutes


def test_a_solve_stopped_early_records_its_program_but_no_rate(records):
    """A solve stopped early (here where its fields outgrow the exact rule) did a fraction of the work its size
    counts, so its rate would make its family's next estimates that much too short: after a stopped exact solve at
    ``sgd.lr = 1e4`` (9 s of an estimated hour) a sweep estimated the default problem's runs at 0.3 s; its compiling
    or loading is recorded."""
    from _tiny import tiny
    from test_resolved_width import LR, START

    from singleloc.theory._step_budget import UnresolvedFields

    config = tiny(LR, "theory.route=exact")
    key = TheorySolve("integrate", build(config), 1, 3, 2.0).key
    with pytest.raises(UnresolvedFields):
        sl.integrate(config, START)
    record = _estimates.timings().family(key)
    assert record["rates"] == [] and ("compile" in record or "load" in record)


def test_the_command_line_says_each_phase_in_one_line_with_its_time(records, tmp_path, capsys):
    """``--no-progress`` (and any stderr that is not a terminal): the estimate, then one line per
    phase (its start, its end with its time), no carriage returns; then prune's estimate and its
    layers."""
    out = str(tmp_path / "run")
    assert main(["integrate", "default", *ARGS, "--no-progress", "--out", out]) == 0
    lines = stderr_lines(capsys)
    assert not any("\r" in line for line in lines)
    label = "integrate, softmax H=2 L=4 F=2 on the rule route"
    expected = [
        rf"singleloc integrate: {label}, to tau = 2: about {TIME} \(.*first run of this shape family.*\)",
        rf"singleloc integrate: compiling the solve \({label}; first run of this shape family\), about {TIME} \.\.\.",
        rf"singleloc integrate: compiled the solve in {TIME}; solving to tau = 2, about {TIME} \.\.\.",
        rf"singleloc integrate: solved in {TIME}",
    ]
    assert len(lines) == len(expected) and all(re.fullmatch(p, line) for p, line in zip(expected, lines)), lines
    config = sl.load_config("default", SETS)
    key = TheorySolve("integrate", build(config), 1, 3, 2.0).key
    written = json.loads(records.read_text())["devices"][_estimates.device()]["families"][key]
    assert len(written["rates"]) == 1  # the command wrote its record: the next estimate of this family is measured
    assert main(["prune", out, "--no-progress"]) == 0
    lines = stderr_lines(capsys)
    assert re.fullmatch(rf"singleloc prune: pruning 1 layer\(s\) of 2 heads, 3 sub-layer risks each: about {TIME} "
                        r"\(first run of this shape family: from this CPU's speed\)", lines[0]), lines
    assert re.fullmatch(rf"singleloc prune: pruned 1 layer\(s\) in {TIME}", lines[-1]), lines


def test_a_simulation_times_its_compiled_step_before_it_runs_and_records_it(records, capsys):
    config = sl.load_config("default", SETS)
    with _progress.reporting(mode="lines"):
        sl.simulate(config)
    lines = [line for line in stderr_lines(capsys) if "compil" not in line]  # said if it takes more than 3 s
    assert re.fullmatch(rf"singleloc: simulating 400 SGD steps \(sgd.tau_max x simulation.D\) x 1 seeds of model.heads = 2 "
                        rf"keys in simulation.D = 200 dimensions: about {TIME} \(measured: [0-9]+ steps timed on this CPU\)",
                        lines[0]), lines
    assert re.fullmatch(rf"singleloc: simulated 400 SGD steps in {TIME}", lines[-1]), lines
    (record,) = _estimates.timings().families("simulate")
    assert record["rates"][0] > 0 and record["compile"] > 0 and not records.exists()  # kept in the process only
    estimate = _simulation_estimate.simulation_estimate(build(config, theory=False))
    assert estimate.basis == "measured on this CPU for this simulation's sizes"


def test_a_sweep_point_over_an_hour_is_refused_before_anything_runs_unless_yes(records, tmp_path, capsys, fake_compute):
    """The estimate per point comes from this device's records: the escape prediction of the
    two-head point measured at 20 hours here (the one-head point's, scaled by the model's work, over an hour too)."""
    base = sl.load_config("default")
    (_, two), = [p for p in grid_points(base, [parse_grid("model.heads=1,2")]) if p[1].model.heads == 2]
    kind, key, work, size = _estimates._prediction_model(build(two))
    _estimates.timings().record(key, kind, "prediction, softmax H=2", work, 20 * 3600.0 / size)
    args = ["sweep", "default", "--grid", "model.heads=1,2", "--out", str(tmp_path / "sw")]  # --horizon auto: predicted
    assert main(args) == 2
    (line,) = stderr_lines(capsys)
    assert line.startswith("singleloc sweep: error: the point model.heads=2 (escape prediction about 20 h")
    assert "and 1 more point over the limit" in line  # the one-head point, scaled from this measured family
    assert ("more than the 1 h a sweep point may take without --yes; make it cheaper: --set theory.route=rule (its theory "
            "is on the exact route), fewer model.heads") in line
    assert line.endswith("or pass --yes to run it anyway")
    assert fake_compute == [] and not (tmp_path / "sw" / "cache").exists()  # nothing computed, nothing written
    assert main([*args, "--yes", "--force"]) == 0  # --force: the sweep's whole estimate passes 4 h
    lines = stderr_lines(capsys)
    assert re.fullmatch(rf"singleloc sweep: 2 points to compute \(0 from the cache\): about {TIME} \(3 of 4 computations "
                        r"first runs of their shape family, from the nearest measured on this CPU or its speed; horizons "
                        r"'auto' taken as 300 until the escape predictions have set them\)", lines[0])
    assert lines[1].startswith("singleloc sweep: the most expensive: model.heads=2: about 20 h (escape prediction about 20 h")


def test_a_sweeps_accepted_points_are_not_refused_again_by_a_runs_limit(records, tmp_path, fake_compute, monkeypatch):
    """The sweep checks its points (``--yes``) and its whole estimate (``--force``) before they run; a batch of its
    points then ran under the command's run limit and was refused by an estimate of its own (at ``sgd.lr = 1e4``
    beside ``0.5``: 5.8 h, every point of the batch failed, where the sweep had said 80 s), which a cluster's
    workers never applied."""
    limits = []
    monkeypatch.setattr(_sweep_compute, "compute_theory", lambda config: limits.append(_progress.settings().run_limit))
    with _progress.reporting(run_limit=3600.0):
        sl.sweep(sl.load_config("default"), [parse_grid("model.heads=1,2")], cache_dir=tmp_path, horizon="config",
                 progress=False, figures=False, batch=False)
    assert limits == [None, None]


def test_the_time_left_of_a_bar_is_the_estimate_of_what_remains_not_the_pace_of_the_first_items(monkeypatch):
    """A sweep whose third point costs a hundred times its first two: after those two (a second
    each, as estimated) the time left is that point's estimate, not one more second."""
    clock = FakeClock(0.0)
    monkeypatch.setattr(_progress, "clock", clock)
    with _progress.reporting(mode="off"), Bar(3, "sweep", "point") as bar:
        bar.plan([1.0, 1.0, 100.0])
        for _ in range(2):
            clock.t += 1.0
            bar.update(1, 1.0)
        assert bar.left(clock.t) == pytest.approx(100.0)
        clock.t += 30.0  # into the third point
        assert bar.left(clock.t) == pytest.approx(70.0)
    with _progress.reporting(mode="off"), Bar(3, "sweep", "point") as bar:
        bar.plan([1.0, 1.0, 100.0])
        for _ in range(2):
            clock.t += 2.0  # slower than estimated: twice the estimate of what remains
            bar.update(1, 1.0)
        assert bar.left(clock.t) == pytest.approx(200.0)


def test_a_long_phase_says_it_is_still_running_and_a_quiet_one_speaks_after_a_few_seconds(monkeypatch, capsys):
    clock = FakeClock(0.0)
    monkeypatch.setattr(_progress, "clock", clock)
    with _progress.reporting(mode="lines", prefix="singleloc test"):
        with _progress.Phase(("solving to tau = 300", "solved"), [80.0]) as phase:
            phase.tick(clock.t + 30.0)
            phase.tick(clock.t + 61.0)
        with _progress.Phase(("writing", "wrote"), quiet=True) as quiet:
            quiet.tick(clock.t + 1.0)
            quiet.tick(clock.t + 3.5)
        with _progress.Phase(("building", "built"), quiet=True):
            pass
    assert stderr_lines(capsys) == ["singleloc test: solving to tau = 300, about 80 s ...",
                                    "singleloc test: still solving to tau = 300: 61 s (about 80 s estimated)",
                                    "singleloc test: solved in 0.0 s",
                                    "singleloc test: writing ...", "singleloc test: wrote in 0.0 s"]


def test_a_stage_far_past_its_estimate_says_why_it_may_be_slow(monkeypatch, capsys):
    clock = FakeClock(0.0)
    monkeypatch.setattr(_progress, "clock", clock)
    with _progress.reporting(mode="lines", prefix="singleloc test"):
        with _progress.Phase(("solving to tau = 2", "solved"), [10.0], overrun="lower sgd.lr") as phase:
            phase.tick(clock.t + 61.0)  # 6 times the estimate: the plain line
            phase.tick(clock.t + 121.0)  # 12 times
    assert stderr_lines(capsys)[1:3] == ["singleloc test: still solving to tau = 2: 61 s (about 10 s estimated)",
                                         "singleloc test: still solving to tau = 2: 2 min (about 10 s estimated): "
                                         "12 times its estimate; lower sgd.lr"]


def test_the_mode_python_callers_get(monkeypatch):
    monkeypatch.delenv(_progress.MODE_ENV, raising=False)
    assert _progress.mode() == "lines"  # stderr is no terminal here (pytest is not asked: tests/conftest.py sets "off")
    monkeypatch.setenv(_progress.MODE_ENV, "lines")
    assert _progress.mode() == "lines"
    try:
        sl.set_progress("live")
        assert _progress.mode() == "live"
        with _progress.reporting(mode="off"):
            assert _progress.mode() == "off"
        with pytest.raises(ValueError, match="mode = 'loud': expected one of auto, live, lines, off"):
            sl.set_progress("loud")
    finally:
        sl.set_progress("auto")
    assert _progress.mode() == "lines"


def test_the_library_does_not_ask_whether_it_runs_under_pytest():
    """Issue 60 item 5: a test suite silences the lines itself (``SINGLELOC_PROGRESS=off``, tests/conftest.py)."""
    from pathlib import Path

    sources = Path(sl.__file__).parent.rglob("*.py")
    assert [str(p) for p in sources if "PYTEST_CURRENT_TEST" in p.read_text()] == []


def _on_a_terminal(code: str, columns: int = 0) -> tuple[int, str]:
    """Run ``code`` in a Python process whose stdout and stderr are a pseudo-terminal of
    ``columns`` columns (0: one that reports no width, as a fresh pty does); its exit code and output."""
    import fcntl
    import struct
    import termios

    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", _progress.MODE_ENV, "COLUMNS")}
    leader, follower = os.openpty()
    try:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24 if columns else 0, columns, 0, 0))
        proc = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
                              env=env, timeout=60)
        os.set_blocking(leader, False)
        out = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(leader)
        os.close(follower)
    return proc.returncode, out.decode()


def test_a_bar_falls_back_to_lines_on_a_terminal_that_reports_no_width():
    """Issue 61 item 4: tqdm draws nothing on a terminal of 0 columns; the bar says its lines there,
    and draws itself on a terminal with a width."""
    code = ("from singleloc.runtime._progress import Bar\n"
            "with Bar(3, 'counting', 'item', each=True) as bar:\n    [bar.update(1) for _ in range(3)]\n")
    returncode, text = _on_a_terminal(code, columns=0)
    assert returncode == 0, text
    assert "singleloc: counting: 3 items ..." in text and re.search(rf"singleloc: counting: 3 items in {TIME}", text), repr(text)
    returncode, text = _on_a_terminal(code, columns=80)
    assert returncode == 0, text
    assert "|#######             | counting: 1/3 items after" in text and "counting: 3 items ..." not in text, repr(text)


def test_a_terminal_gets_a_live_line_and_the_phase_leaves_one_line_with_its_time(tmp_path):
    """On a pseudo-terminal, a Python caller's default: the status line redrawn in place (with
    the elapsed time against the estimate), then the phase's line."""
    code = ("import time\nfrom singleloc.runtime._progress import Phase\n"
            "with Phase(('waiting for the test', 'waited for the test'), [60.0]):\n    time.sleep(1.6)\n")
    returncode, text = _on_a_terminal(code)
    assert returncode == 0, text
    assert re.search(rf"\rsingleloc: waiting for the test: {TIME} of about 60 s\x1b\[K", text), repr(text)
    assert re.search(rf"\r\x1b\[Ksingleloc: waited for the test in {TIME}\r?\n", text), repr(text)


def test_estimates_say_their_parts_and_basis():
    estimate = Estimate(70.0, "measured on this CPU for this shape family", (("compiling", 60.0), ("solving", 10.0)))
    assert estimate.describe() == ("about 70 s (compiling about 60 s, solving about 10 s; measured on this CPU for this "
                                   "shape family)")
    assert Estimate(5400.0, "").describe() == "about 1.5 h"

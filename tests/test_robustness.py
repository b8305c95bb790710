"""No traceback for any input, and results that can be trusted on disk (issue 11): one test per
class of failure, through the command line, asserting the one-line message, the exit code and
that the previous results are intact."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from _tiny import cli_sets, route_of, stub_solves, tiny
from helpers import interrupt, one_line

from singleloc import load_config
from singleloc._commands import diagnose
from singleloc.cli import main
from singleloc.io._run_folders import load_npz, load_run, npz_stamp, save_npz, save_run
from singleloc.preflight import _resources
from singleloc.preflight._build import build
from singleloc.sweeps import _sweep, _sweep_cache, _sweep_compute
from singleloc.sweeps._grid import parse_grid

#: The default preset's problem (L = 4, F = 2, 4096 test samples: the limits' messages below name them), small.
SETS = ("problem.L=4", "problem.F=2", "sgd.tau_max=1", "simulation.test_samples=4096", "theory.points=256")
TINY, CONFIG = cli_sets(*SETS), tiny(*SETS)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture
def previous_run(tmp_path):
    """A run folder as `simulate` writes it (without computing one)."""
    H, F, S = CONFIG.model.heads, CONFIG.problem.F, CONFIG.simulation.seeds
    arrays = {"tau": np.arange(3.0), "M": np.zeros((S, 3, H, F)), "Q": np.tile(np.eye(H), (S, 3, 1, 1)),
              "b": np.zeros((S, 3, H)), "risk": np.ones((S, 3)), "risk_limit": np.ones((S, 3))}
    return save_run(tmp_path / "run", CONFIG, {"simulation.npz": arrays})


# ----------------------------------------------------------------------------- 1. a run is one unit


@pytest.mark.slow
def test_a_new_run_replaces_the_old_one_and_prune_reads_one_consistent_run(tmp_path, capsys):
    """The sequence of the issue: compare, then simulate with L = 8 into the same folder, then
    prune. The folder now holds the L = 8 run alone; files of another run are refused."""
    out = str(tmp_path / "X")
    assert main(["compare", "default", *TINY, "--out", out]) == 0
    assert {"compare.png", "theory.npz", "theory_seeds.npz", "simulation.npz"} <= set(os.listdir(out))
    capsys.readouterr()
    assert main(["simulate", "default", *TINY, "--set", "problem.L=8", "--out", out]) == 0
    assert "note: " in capsys.readouterr().err and sorted(os.listdir(out)) == ["config.json", "simulation.npz"]
    assert main(["prune", out]) == 0
    run = load_run(out)
    assert run.config.problem.L == 8 and npz_stamp(Path(out) / "prune.npz") == run.config_hash
    # a file of another run put beside it
    assert main(["integrate", "default", *TINY, "--out", str(tmp_path / "other")]) == 0
    (Path(out) / "theory.npz").write_bytes((tmp_path / "other" / "theory.npz").read_bytes())
    before = snapshot(Path(out))
    capsys.readouterr()
    assert main(["prune", out]) == 2
    assert "theory.npz was made by another config" in one_line(capsys, "prune")
    assert snapshot(Path(out)) == before


def test_a_full_disk_fails_in_one_line_and_keeps_the_previous_run(previous_run, capsys, monkeypatch):
    stub_solves(monkeypatch)  # the subject is the folder: a canned simulation
    before = snapshot(previous_run)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(np, "savez", full)
    assert main(["simulate", "default", *TINY, "--out", str(previous_run)]) == 2
    captured = capsys.readouterr()
    line = captured.err.strip().splitlines()[-1]  # after the note that the run would be replaced
    assert "Traceback" not in captured.err and len(captured.err.strip().splitlines()) == 2
    assert line == (f"singleloc simulate: error: could not write the run folder: No space left on device; "
                    f"'{previous_run}' is unchanged")
    assert snapshot(previous_run) == before


@pytest.mark.slow
def test_kill_9_of_a_real_compare_keeps_the_previous_run(previous_run, tmp_path):
    """`singleloc compare` killed with SIGKILL while it computes (after its note on stderr)."""
    before = snapshot(previous_run)
    proc = subprocess.Popen([sys.executable, "-m", "singleloc", "compare", "default", *TINY, "--set", "sgd.tau_max=20",
                             "--out", str(previous_run)], stderr=subprocess.PIPE, text=True)
    assert "holds a run" in proc.stderr.readline()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert snapshot(previous_run) == before


# ----------------------------------------------------------------------------- 2. damaged cache entries


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_data_byte(path):  # the CRC of the member no longer matches
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("risk.npy")
    data[info.header_offset + 30 + len(info.filename) + info.file_size - 1] ^= 0xFF
    path.write_bytes(bytes(data))


def _drop_risk(path):
    save_npz(path, {k: v for k, v in load_npz(path).items() if k != "risk"})


@pytest.mark.parametrize("damage, words", [
    (_truncate, r"(BadZipFile|EOFError|ValueError: not a zip archive)"), (_flip_a_data_byte, "BadZipFile: Bad CRC-32"),
    (lambda p: p.write_bytes(b"not an npz"), "ValueError: not a zip archive"), (_drop_risk, "no array risk"),
])
def test_a_damaged_cache_entry_is_reported_recomputed_and_replaced(tmp_path, monkeypatch, damage, words):
    calls = []

    def compute(config, kind):
        calls.append(kind)
        return {"tau": np.arange(3.0), "M": np.ones((1, 3, 2, 2)), "Q": np.ones((1, 3, 2, 2)), "b": np.zeros((1, 3, 2)),
                "risk": np.full((1, 3), 0.5)}

    monkeypatch.setattr(_sweep_cache, "compute", compute)
    first = _sweep_cache.cached_run(CONFIG, "theory", tmp_path)
    (path,) = tmp_path.glob("theory-*.npz")
    damage(path)
    with pytest.warns(UserWarning, match=f"cache entry {path} is damaged \\({words}.*\\); recomputing it"):
        again = _sweep_cache.cached_run(CONFIG, "theory", tmp_path)
    assert calls == ["theory", "theory"] and again.keys() == first.keys()
    assert load_npz(path).keys() == first.keys()  # replaced by a complete entry
    _sweep_cache.cached_run(CONFIG, "theory", tmp_path)
    assert len(calls) == 2


# ----------------------------------------------------------------------------- 4. presets and paths


def test_a_folder_named_like_a_preset_does_not_hide_it(tmp_path, capsys, monkeypatch):
    stub_solves(monkeypatch)  # the subject is the path: a canned simulation
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "default", *TINY, "--out", "default"]) == 0
    assert main(["simulate", "default", *TINY, "--out", "default"]) == 0
    assert "note: 'default' holds a run" in capsys.readouterr().err
    assert load_run("default").config == CONFIG


@pytest.mark.parametrize("command, make, words", [
    ("simulate", lambda p: p.mkdir() or p, "is a folder; expected a TOML file or a preset name"),
    ("simulate", lambda p: Path("/dev/null"), "'/dev/null' is a character device; expected a TOML file"),
    ("simulate", lambda p: (p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff"), p)[1], "is not UTF-8 text"),
    ("diagnose", lambda p: p.mkdir() or p, "ATTN"),
    ("diagnose", lambda p: Path("/dev/null"), "ATTN '/dev/null' is a character device; expected a .npy file"),
])
def test_a_config_or_attn_path_says_what_it_is(tmp_path, capsys, command, make, words):
    path = make(tmp_path / "thing")
    assert main([command, str(path), "--out", str(tmp_path / "out")]) == 2
    line = one_line(capsys, command)
    assert words in line and str(path) in line


# ----------------------------------------------------------------------------- 5. no tracebacks


@pytest.mark.parametrize("toml, sets, words", [
    ("problem = 3\n", [], "config section [problem] must be a table of keys, got an integer 3"),
    ("[[problem]]\nL = 4\n", [], "config section [problem] must be a table of keys, got an array"),
    ("", ["problem.prior={foo=1}"], "problem.prior: a table must hold the keys"),
    ("", ["problem.prior=[1,2]"], "problem.prior: must be a prior name"),
    ("", ["simulation.seed=100000000000000000000000000000"], "simulation.seed: must be <= 4294967295"),
    ("", ["model.bias_init=1e300"], "model.bias_init: must lie in [-1000, 1000]"),
])
def test_malformed_configs_fail_in_one_line(tmp_path, capsys, toml, sets, words):
    (tmp_path / "c.toml").write_text(toml)
    args = [a for s in sets for a in ("--set", s)]
    assert main(["simulate", str(tmp_path / "c.toml"), *args, "--out", str(tmp_path / "out")]) == 2
    assert words in one_line(capsys, "simulate") and not (tmp_path / "out").exists()


def _bad_npz(run):
    (run / "simulation.npz").write_bytes(b"PK\x03\x04 junk")


def _truncated_npz(run):
    path = run / "simulation.npz"
    path.write_bytes(path.read_bytes()[:300])


def _npz_without_M(run):
    path = run / "simulation.npz"
    save_npz(path, {k: v for k, v in load_npz(path).items() if k != "M"}, npz_stamp(path))


def _config_list(run):
    (run / "config.json").write_text("[1, 2]")


@pytest.mark.parametrize("damage, words", [
    (_bad_npz, "simulation.npz is not a readable .npz file"), (_truncated_npz, "simulation.npz is not a readable .npz file"),
    (_npz_without_M, "has no array 'M'"), (_config_list, "must hold a table of config sections, got a JSON list"),
])
def test_prune_of_a_damaged_run_fails_in_one_line(previous_run, capsys, damage, words):
    damage(previous_run)
    before = snapshot(previous_run)
    assert main(["prune", str(previous_run)]) == 2
    assert words in one_line(capsys, "prune") and snapshot(previous_run) == before


@pytest.mark.parametrize("error, code, words", [
    (KeyboardInterrupt(), 130, "singleloc simulate: interrupted"),
    (FileExistsError(errno.EEXIST, "File exists", "/x/y"), 2, "error: File exists: '/x/y'"),
    (MemoryError("Unable to allocate 64.0 GiB for an array"), 2, "error: Unable to allocate 64.0 GiB"),
    ("jax-oom", 2, "error: out of memory on the device: RESOURCE_EXHAUSTED: Out of memory while trying to allocate"),
])
def test_failures_during_a_run_are_one_line_and_keep_the_previous_run(previous_run, capsys, monkeypatch, error, code, words):
    import jax

    import singleloc.simulation._simulation

    if error == "jax-oom":
        error = jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 68719476736 bytes.\n"
                                           "BufferAssignment OOM Debugging.\n...")

    def failing(*args, **kwargs):
        raise error

    monkeypatch.setattr(singleloc.simulation._simulation, "simulate", failing)
    before = snapshot(previous_run)
    assert main(["simulate", "default", *TINY, "--out", str(previous_run)]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "holds a run" in err[0] and words in err[1], err  # the note, then the one line
    assert snapshot(previous_run) == before
    # --debug (or SINGLELOC_DEBUG=1) adds the traceback, same exit code
    assert main(["simulate", "default", *TINY, "--out", str(previous_run), "--debug"]) == code
    assert "Traceback (most recent call last)" in capsys.readouterr().err
    monkeypatch.setenv("SINGLELOC_DEBUG", "1")
    assert main(["simulate", "default", *TINY, "--out", str(previous_run)]) == code
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_an_unexpected_runtime_error_is_not_hidden(monkeypatch, tmp_path):
    import singleloc.simulation._simulation

    def bug(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(singleloc.simulation._simulation, "simulate", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["simulate", "default", *TINY, "--out", str(tmp_path / "out")])


# ----------------------------------------------------------------------------- 6. bounds on costly values


@pytest.mark.parametrize("command, sets, words", [
    ("simulate", ["simulation.D=1000000000"], "for the simulation (simulation.seeds = 2 x simulation.D = 1000000000"),
    ("simulate", ["problem.L=100000"], "problem.L = 100000"),
    ("integrate", ["theory.points=1073741824", "theory.route=rule"], "for the theory's quadrature (theory.points = 1073741824"),
    ("compare", ["simulation.test_samples=1000000000"], "simulation.test_samples = 1000000000"),
    ("simulate", ["sgd.n_save=400000000", "sgd.tau_max=10000000"], "sgd.n_save = 400000000)"),
])
def test_runs_that_cannot_fit_in_memory_are_refused_before_they_start(tmp_path, capsys, monkeypatch, command, sets, words):
    monkeypatch.setenv(_resources.MEMORY_ENV, "16G")
    args = [a for s in sets for a in ("--set", s)]
    assert main([command, "default", *TINY, *args, "--out", str(tmp_path / "out")]) == 2
    line = one_line(capsys, command)
    assert "the run needs about" in line and "GB" in line and words in line and "SINGLELOC_MEMORY_LIMIT" in line
    assert not (tmp_path / "out").exists()


def test_the_memory_limit_can_be_set_or_turned_off(monkeypatch):
    monkeypatch.setenv(_resources.MEMORY_ENV, "1M")
    assert _resources.available_memory() == (2.0**20, "SINGLELOC_MEMORY_LIMIT=1M")
    with pytest.raises(MemoryError, match="more than the 0.00105 GB available"):
        _resources.check_run(build(CONFIG, theory=False), simulation=True)
    monkeypatch.setenv(_resources.MEMORY_ENV, "none")
    assert _resources.available_memory()[0] == float("inf")
    huge = load_config("default", ["simulation.D=1000000000000", "sgd.tau_max=0.001"])
    _resources.check_run(build(huge, theory=False), simulation=True)
    monkeypatch.setenv(_resources.MEMORY_ENV, "lots")
    with pytest.raises(ValueError, match="expected a size such as"):
        _resources.available_memory()
    monkeypatch.delenv(_resources.MEMORY_ENV)
    assert 0 < _resources.available_memory()[0] < float("inf")


@pytest.mark.parametrize("sets, words", [
    (["problem.L=10601", "model.heads=2"], "problem.L * model.heads = 21202 Gaussian dimensions, more than the 21201"),
    (["problem.L=128", "model.heads=2", "problem.prior=gaussian"],
     "theory.points = 256 must be at least problem.L * model.heads + problem.F (Gaussian prior) = 258"),
    (["problem.L=40", "model.heads=8"], "theory.points = 256 must be at least problem.L * model.heads = 320"),
])
def test_the_quadrature_limits_name_the_keys(tmp_path, capsys, sets, words):
    """The Sobol rule's limits (its subject: the exact route takes any L * H, test_long_context.py)."""
    args = [a for s in (*sets, "theory.route=rule") for a in ("--set", s)]
    assert main(["integrate", "default", *TINY, *args, "--out", str(tmp_path / "out")]) == 2
    assert words in one_line(capsys, "integrate")


# ----------------------------------------------------------------------------- 7. messages name the cause


@pytest.mark.slow
def test_the_dimension_bounds_are_the_real_ones(tmp_path, capsys):
    assert main(["integrate", "default", *TINY, "--set", "simulation.D=3", "--out", str(tmp_path / "a")]) == 2
    assert "simulation.D = 3 must be at least model.heads + problem.F = 4" in one_line(capsys, "integrate")
    assert main(["simulate", "default", *TINY, "--set", "simulation.D=4", "--out", str(tmp_path / "b")]) == 2
    assert "simulation.D = 4 must exceed model.heads + problem.F = 4" in one_line(capsys, "simulate")
    # D = H + F + 1 < H + F + L is enough for a simulation
    assert main(["simulate", "default", *TINY, "--set", "simulation.D=5", "--out", str(tmp_path / "c")]) == 0


# ----------------------------------------------------------------------------- 9. sweep accounting


def test_a_sweep_counts_failed_points_and_keeps_every_failure(tmp_path, monkeypatch):
    from singleloc.analysis._predictions import EscapePrediction

    nan = float("nan")
    prediction = EscapePrediction(nan, nan, nan, float("inf"), 1.0, 64, np.zeros(1), np.zeros(1)).arrays()
    monkeypatch.setattr(_sweep_compute, "compute_prediction", lambda config: prediction)

    def diverge(kind):
        def compute(config):
            raise FloatingPointError(f"{kind} diverged at tau = 1; lower sgd.lr")
        return compute

    monkeypatch.setattr(_sweep_compute, "compute_theory", diverge("ODE"))
    monkeypatch.setattr(_sweep_compute, "compute_simulation", diverge("SGD"))
    rows, stats = _sweep.sweep(CONFIG, [parse_grid("model.heads=1,2")], tmp_path, horizon="config", simulate=True,
                               progress=False, figures=False)
    assert (stats.computed, stats.cached, stats.failed) == (2, 0, 2)
    both = "theory failed: ODE diverged at tau = 1; simulation failed: SGD diverged at tau = 1"
    assert [r["status"] for r in rows] == [both, both]


# ----------------------------------------------------------------------------- 10. silent surprises


def test_dropped_saved_times_are_a_one_line_warning(tmp_path, capsys):
    assert main(["simulate", "default", *TINY, "--set", "sgd.n_save=100000", "--out", str(tmp_path / "a")]) == 0
    line = one_line(capsys, "simulate", "warning")
    assert "sgd.n_save = 100000 saved times fall on 65 distinct SGD steps" in line
    with np.load(tmp_path / "a" / "simulation.npz") as d:
        assert d["tau"].shape == (65,)


def test_a_rising_risk_is_a_one_line_warning(tmp_path, capsys):
    from singleloc import warn_if_risk_rose
    from singleloc.theory._theory_result import TheoryResult

    setup = build(CONFIG, theory=False)

    def theory(risk):
        risk = np.asarray(risk, float)
        return TheoryResult(np.arange(risk.shape[1]), None, None, None, risk)

    with pytest.warns(UserWarning, match=r"the theory risk rose during training \(0.81 -> 1.04, .*sgd.lr = 0.5"):
        warn_if_risk_rose(setup, theory=theory([[0.81, 0.9, 1.04]]))
    with pytest.warns(UserWarning, match="simulation's limit risk rose"):
        sim = type("Sim", (), {"risk_limit": np.array([[0.81, 1.04], [0.80, 1.05]])})
        warn_if_risk_rose(setup, simulation=sim)
    with warnings.catch_warnings():  # within the noise of the test sets (2 x 4096 sequences): no warning
        warnings.simplefilter("error")
        sim = type("Sim", (), {"risk_limit": np.array([[0.80, 0.81], [0.80, 0.82]])})
        warn_if_risk_rose(setup, simulation=sim)
        warn_if_risk_rose(setup, theory=theory([[0.81, 0.5, 0.81 + 1e-7]]))
    # through the command line: lr = 1e4 (the case of the issue), on the Sobol rule (on the exact route a diverging
    # solve shrinks its steps for minutes before it stops)
    assert main(["integrate", "default", *TINY, "--set", "sgd.lr=10000", "--set", "theory.route=rule",
                 "--out", str(tmp_path / "a")]) in (0, 2)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and len(captured.err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- issue 21: wrong numbers, silently


@pytest.mark.parametrize("ts, t0, words", [
    ([1.0, 0.5], 0.0, r"ts must be strictly increasing .* ts\[0\] = 1 then ts\[1\] = 0.5"),
    ([0.0, 0.0, 1.0], 0.0, r"ts must be strictly increasing"),
    ([-1.0, 0.0, 1.0], 0.0, r"ts starts at -1, before the start y0 at t0 = 0"),
    ([0.0, np.nan], 0.0, r"ts must be finite, got ts\[1\] = nan"),
    ([0.0, np.inf], 0.0, r"ts must be finite"),
    ([[0.0, 1.0]], 0.0, r"^integrate: ts must be a real array of shape \(T,\) or a sequence of numbers, got list"),
    ([], 0.0, r"ts must be a non-empty 1-D sequence"),
    ("later", 0.0, r"^integrate: ts must be a real array of shape \(T,\) or a sequence of numbers, got str"),
    ([0.0, 1.0], np.nan, r"t0 must be finite"),
])
def test_integrate_refuses_saved_times_it_would_mislabel(ts, t0, words):
    """Issue 21 item 1: a descending, negative or non-finite ``ts`` was solved as given (backwards,
    or from ts[0]); now a ValueError naming ``ts`` before anything is compiled (a TypeError for a wrong type or shape)."""
    import singleloc as sl

    with pytest.raises((TypeError, ValueError), match=words):
        sl.integrate(CONFIG, ts=ts, **({} if t0 == 0 else {"t0": t0}))


def test_integrate_from_zero_to_a_later_first_time_labels_the_states_by_their_tau(tiny_theory):
    """Issue 21 item 1: ``ts = [1, 2]`` started the solve at 1, labelling the start's risk tau = 1.
    Now the solve starts at t0 = 0 and the state at 1 is the one of the full grid at 1 (the session's solve of the
    tiny problem, saved at tau = 0, 1, 2: the same program)."""
    import singleloc as sl

    full = tiny_theory
    np.testing.assert_array_equal(full.tau, [0.0, 1.0, 2.0])
    later = sl.integrate(tiny(), ts=[1.0, 2.0])
    np.testing.assert_array_equal(later.tau, [1.0, 2.0])
    assert later.M.shape[1] == later.risk.shape[1] == later.risk_se.shape[1] == 2
    np.testing.assert_allclose(later.risk, full.risk[:, 1:], rtol=1e-12)
    np.testing.assert_allclose(later.M, full.M[:, 1:], rtol=1e-12)
    assert later.risk[0, 0] < full.risk[0, 0] - 1e-3  # not the start's risk
    shifted = sl.integrate(tiny(), ts=[-1.0, 0.0, 1.0], t0=-1.0)  # an explicit start time: the ODE is autonomous
    np.testing.assert_allclose(shifted.risk, full.risk, rtol=1e-12)


@pytest.mark.parametrize("n_save, expected", [(2, [0.0, 30.0]), (3, [0.0, 0.03, 30.0])])
def test_a_log_grid_of_two_saved_times_ends_at_tau_max(n_save, expected):
    """Issue 21 item 2: ``spacing = log, n_save = 2`` saved tau 0..0.03 although tau_max = 30."""
    from singleloc.simulation._simulation import save_steps

    cfg = load_config("default", ["sgd.spacing=log", f"sgd.n_save={n_save}"])
    np.testing.assert_allclose(cfg.sgd.save_times(), expected)
    np.testing.assert_array_equal(save_steps(cfg.sgd, cfg.simulation.D), np.round(np.asarray(expected) * cfg.simulation.D))


@pytest.mark.parametrize("tau_max", ["1e300", "1e8"])
def test_a_simulation_of_more_steps_than_it_can_count_is_refused(tmp_path, capsys, tau_max):
    """Issue 21 item 3: ``tau_max = 1e300`` gave a cast warning, exit 0 and saved tau [-4.6e16, 0]."""
    out = tmp_path / "out"
    assert main(["simulate", "default", *TINY, "--set", f"sgd.tau_max={tau_max}", "--out", str(out)]) == 2
    line = one_line(capsys, "simulate")
    assert "sgd.tau_max: tau_max * simulation.D" in line and "more than the 2147483647" in line
    assert not out.exists()


# ----------------------------------------------------------------------------- issue 21: promises not kept


def test_prune_into_another_run_folder_says_it_replaces_it(previous_run, tmp_path, capsys, monkeypatch):
    """Issue 21 item 9: ``prune A --out B`` replaced the run in B without the note the other commands print.
    (The pruning itself is a stand-in: what is tested is the folder handling.)"""
    import singleloc as sl
    from singleloc.pruning import _pruning

    fake = lambda config, M, Q, b, order, **kw: sl.PruningResult(order, np.array([[1]]), np.array([[0.5, 0.6]]))  # noqa: E731
    monkeypatch.setattr(_pruning, "prune_theory", fake)
    other = save_run(tmp_path / "B", CONFIG, {"simulation.npz": dict(np.load(previous_run / "simulation.npz"))})
    assert main(["prune", str(previous_run), "--out", str(other)]) == 0
    err = capsys.readouterr().err
    assert f"singleloc prune: note: {str(other)!r} holds a run; it is replaced when this one completes" in err
    assert sorted(os.listdir(other)) == ["config.json", "prune.npz", "prune.png"]  # B is now the prune of A
    assert npz_stamp(other / "prune.npz") == load_run(previous_run).config_hash
    assert main(["prune", str(previous_run), "--out", str(tmp_path / "new")]) == 0  # a new folder: no note
    assert "note:" not in capsys.readouterr().err


@pytest.mark.parametrize("call", ["simulate", "integrate", "sweep", "save_run", "prune_theory", "initial_conditions",
                                  "build", "predicted_escape", "config_hash", "save_theory"])
def test_the_python_api_names_a_config_given_as_a_preset_name(tmp_path, call):
    """Issue 21 item 12: ``sl.simulate("default")`` failed with AttributeError: 'str' object has no attribute 'model';
    so did ``sl.initial_conditions("default")`` and the other functions that take a Config."""
    import singleloc as sl

    result = sl.TheoryResult(np.zeros(1), np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 2)), np.zeros((1, 1)))
    calls = {"simulate": lambda: sl.simulate("default"), "integrate": lambda: sl.integrate("default"),
             "sweep": lambda: sl.sweep("default", [], tmp_path), "save_run": lambda: sl.save_run(tmp_path / "r", "default", {}),
             "prune_theory": lambda: sl.prune_theory({"model": {}}, np.zeros((2, 2)), np.eye(2), np.zeros(2)),
             "initial_conditions": lambda: sl.initial_conditions("default"),
             "build": lambda: sl.build("default"),
             "predicted_escape": lambda: sl.predicted_escape("default"), "config_hash": lambda: sl.config_hash("default"),
             "save_theory": lambda: sl.save_theory(tmp_path / "r", "default", result)}
    where = {"save_theory": "save_theory"}.get(call, call.split("_")[0])
    with pytest.raises(TypeError, match=rf"{where}.*: (config|base) must be a singleloc.Config( or a \S+)?, got .*; pass "
                                        r"singleloc.load_config\("):
        calls[call]()


@pytest.mark.parametrize("value", ["1.2.3G", "1..2", "G", "1e-3G", "-1G"])
def test_a_malformed_memory_limit_is_named(monkeypatch, value):
    """Issue 21 item 12: ``SINGLELOC_MEMORY_LIMIT=1.2.3G`` gave float()'s message without the variable."""
    monkeypatch.setenv(_resources.MEMORY_ENV, value)
    with pytest.raises(ValueError, match=rf"^SINGLELOC_MEMORY_LIMIT='{value}': expected a size such as"):
        _resources.available_memory()


@pytest.mark.parametrize("address, error, words", [
    ("nonsense", ValueError, " is not usable: missing port number"),
    ("foo://x:1", ValueError, " is not usable: unknown address scheme 'foo'"),
    ("tcp://127.0.0.1:1", ConnectionError, ": cannot connect .*unset DASK_SCHEDULER_ADDRESS"),
    ("tcp://127.0.0.1:70000", ValueError, r" is not usable: port 70000 is not a TCP port \(1 to 65535\)"),  # issue 62
])
def test_a_bad_scheduler_address_is_named_with_its_variable(monkeypatch, address, error, words):
    """Issue 21 item 12: a bad ``DASK_SCHEDULER_ADDRESS`` was not named in its error."""
    pytest.importorskip("distributed")
    import dask

    from singleloc.runtime._distributed import SCHEDULER_ENV, open_cluster

    monkeypatch.setenv(SCHEDULER_ENV, address)
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}), open_cluster() as cluster:
        with pytest.raises(error, match=rf"the Dask scheduler address '{address}' \(DASK_SCHEDULER_ADDRESS\){words}"):
            cluster.client()


# ----------------------------------------------------------------------------- issue 21: the compilation cache heals


@pytest.fixture
def jax_cache_dir():
    """``set(folder)``: JAX's compilation cache folder for this test (the session's is restored after)."""
    import jax

    before = jax.config.jax_compilation_cache_dir
    yield lambda folder: jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_compilation_cache_dir", before)


def test_a_damaged_stored_program_is_compiled_again_and_replaced(tmp_path, monkeypatch, jax_cache_dir):
    """Issue 21 item 8: a truncated ``exported/*.bin`` raised struct.error on every run until deleted."""
    import jax.numpy as jnp

    from singleloc.runtime import _compilation

    pytest.importorskip("flatbuffers")
    jax_cache_dir(str(tmp_path))
    monkeypatch.setattr(_compilation, "_LOADED", {})
    twice = lambda x: 2 * x + 1  # noqa: E731
    x = jnp.arange(3.0)
    np.testing.assert_array_equal(_compilation.exported_call("damaged-test", twice, x), [1.0, 3.0, 5.0])
    (stored,) = (tmp_path / "exported").glob("damaged-test-*.bin")
    size = stored.stat().st_size
    for damage in (lambda b: b[: len(b) // 2], lambda b: b"", lambda b: bytes(len(b))):
        stored.write_bytes(damage(stored.read_bytes()))
        monkeypatch.setattr(_compilation, "_LOADED", {})  # as a new process
        with pytest.warns(UserWarning, match=r"the stored program .*damaged-test-.*\.bin' is damaged .*compiling it again "
                                             "and replacing it"):
            np.testing.assert_array_equal(_compilation.exported_call("damaged-test", twice, x), [1.0, 3.0, 5.0])
        assert stored.stat().st_size == size  # replaced by a good one
    monkeypatch.setattr(_compilation, "_LOADED", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(_compilation.exported_call("damaged-test", twice, x), [1.0, 3.0, 5.0])


def test_an_unusable_cache_folder_is_named_with_its_variable(tmp_path, monkeypatch, jax_cache_dir):
    """Issue 21 item 8: an unusable cache folder is a warning naming it and SINGLELOC_CACHE_DIR; the run goes on."""
    from singleloc.runtime import _compilation

    (tmp_path / "file").write_text("")
    jax_cache_dir(None)  # as in a new process
    monkeypatch.setenv("SINGLELOC_CACHE_DIR", str(tmp_path / "file" / "cache"))
    with pytest.warns(UserWarning, match=r"the compilation cache folder '.*file/cache' \(from SINGLELOC_CACHE_DIR\) cannot be "
                                         r"used \(Not a directory\); programs are compiled in every run"):
        assert _compilation.enable_compilation_cache() is None


# ----------------------------------------------------------------------------- issue 21: outputs, sizes, costs


def _attention(tmp_path, name="attn"):
    rng = np.random.default_rng(0)
    weights = rng.dirichlet(np.ones(8), size=(2, 3, 8))  # 2 x 3 heads, 8 rows of 8 tokens
    np.save(tmp_path / f"{name}.npy", weights)
    np.save(tmp_path / "values.npy", rng.standard_normal((2, 3, 8, 4)))
    return tmp_path / f"{name}.npy"


def _files_in(folder):
    return {p.name: (p.stat().st_ino, p.read_bytes()) for p in sorted(folder.iterdir()) if p.suffix in (".json", ".png")}


@pytest.fixture(scope="module")
def _diagnosis(tmp_path_factory):
    """A diagnosis of :func:`_attention`'s weights with top-N values (attn.npy, values.npy, out/), made once."""
    folder = tmp_path_factory.mktemp("diagnosis")
    assert main(["diagnose", str(_attention(folder)), "--values", str(folder / "values.npy"), "--out", str(folder / "out")]) == 0
    return folder


@pytest.fixture
def diagnosis(tmp_path, _diagnosis):
    """The test's own copy of :func:`_diagnosis`'s files, in ``tmp_path``: the arguments that made it."""
    shutil.copytree(_diagnosis, tmp_path, dirs_exist_ok=True, copy_function=shutil.copy2)
    return ["diagnose", str(tmp_path / "attn.npy"), "--values", str(tmp_path / "values.npy"), "--out", str(tmp_path / "out")]


@pytest.mark.parametrize("after, code", [(0, None), (1, None), (3, None), (2, errno.EACCES)])  # 2: the checks of --out
def test_diagnose_on_a_full_disk_or_read_only_folder_writes_all_or_nothing(tmp_path, capsys, monkeypatch, after, code,
                                                                          diagnosis):
    """Issue 21 item 4: diagnose on a full disk left the new JSON beside the old figures."""
    from helpers import full_disk_after

    args, out = diagnosis, tmp_path / "out"
    before = _files_in(out)
    assert set(before) == {"attn_diagnostics.json", "attn_vanishing.png", "attn_jacobian.png", "attn_topn.png"}
    capsys.readouterr()
    full_disk_after(monkeypatch, after, code)
    assert main([*args, "--seed", "1"]) == 2
    line = one_line(capsys, "diagnose")
    assert ("Permission denied" if code else "No space left on device") in line
    assert line.endswith(f"nothing was written to '{out}', which is unchanged")
    assert _files_in(out) == before and not [p for p in out.iterdir() if p.name.startswith(".")]


def test_diagnose_removes_its_own_figure_that_a_new_diagnosis_does_not_make(tmp_path, capsys, diagnosis):
    attn, out = tmp_path / "attn.npy", tmp_path / "out"
    assert (out / "attn_topn.png").is_file()
    assert main(["diagnose", str(attn), "--out", str(out)]) == 0  # no top-N: the old STEM_topn.png would mismatch
    assert not (out / "attn_topn.png").exists() and (out / "attn_jacobian.png").is_file()
    (out / "attn_topn.png").write_bytes(b"\x89PNG a figure of the user's")
    assert main(["diagnose", str(attn), "--out", str(out)]) == 0
    assert (out / "attn_topn.png").read_bytes() == b"\x89PNG a figure of the user's"  # not singleloc's: kept


@pytest.mark.parametrize("command, sets", [("integrate", ["sgd.n_save=1e6"]), ("integrate", ["sgd.n_save=10000000"]),
                                           ("compare", ["sgd.n_save=9000", "theory.replicates=2"])])
def test_more_saved_times_than_the_theory_can_evaluate_are_refused(tmp_path, capsys, command, sets):
    """Issue 21 item 5: ``integrate --set sgd.n_save=1e6`` aborted in XLA (exit 134)."""
    args = [a for s in sets for a in ("--set", s)]
    assert main([command, "default", *TINY, *args, "--out", str(tmp_path / "out")]) == 2
    line = one_line(capsys, command)
    assert "sgd.n_save = " in line and "more than the 16384" in line and "e.g. sgd.n_save = " in line
    assert not (tmp_path / "out").exists()


_STUCK = """
import sys
import jax
import singleloc.theory._ode
from singleloc.cli import main

def stuck(setup, *args, **kwargs):  # a solve that XLA does not leave for about a minute
    inner = lambda i, y: jax.lax.fori_loop(0, 2**31 - 1, lambda j, z: z * 1.0000001 + 1e-9, y)
    spin = jax.jit(lambda x: jax.lax.fori_loop(0, 8, inner, x))
    print("solving", file=sys.stderr, flush=True)
    return spin(1.0).block_until_ready()

singleloc.theory._ode.integrate_setup = stuck
sys.argv = ["singleloc", "integrate", "default", "--no-progress", "--out", sys.argv[1]]
sys.exit(main())
"""


@pytest.mark.slow
def test_ctrl_c_ends_the_process_while_xla_runs(tmp_path):
    """Issue 21 item 6: Ctrl-C printed "interrupted" but the process ran on for minutes (the main
    thread inside XLA sees the signal only when XLA returns)."""
    (tmp_path / "stuck.py").write_text(_STUCK)
    code, seconds, err = interrupt(["stuck.py", str(tmp_path / "out")], tmp_path, wait_for="solving", delay=1.0)
    assert code == 130 and seconds < 3.0, (code, seconds, err)
    assert err.strip().splitlines()[-1] == "singleloc integrate: interrupted" and "Traceback" not in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


@pytest.mark.slow
def test_ctrl_c_of_a_long_integrate_ends_it_at_once(tmp_path):
    """The issue's case: ``integrate --set sgd.tau_max=1e6``, interrupted while it compiles or solves."""
    args = ["-m", "singleloc", "integrate", "default", "--set", "sgd.tau_max=1e6", "--set", "theory.points=256",
            "--no-progress", "--force", "--out", "out"]
    code, seconds, err = interrupt(args, tmp_path, delay=15.0)
    assert code == 130 and seconds < 3.0, (code, seconds, err)
    assert err.strip().splitlines()[-1] == "singleloc integrate: interrupted" and "Traceback" not in err


@pytest.mark.parametrize("workers, cpus, words", [
    ("1000000", 2, "--workers = 1000000: 1000000 worker processes need about"),
    ("3", 2, "--workers = 3 is more than the 2 CPUs of this machine (more workers only share them): give --workers <= 2, "
             "or pass --force"),
])
def test_a_sweep_with_more_workers_than_the_machine_runs_is_refused_before_any_cluster(tmp_path, capsys, monkeypatch, workers,
                                                                                       cpus, words):
    """Issue 21 item 7: ``sweep --workers 1000000`` grew by 17 MB/s for minutes, silently."""
    import singleloc.runtime._distributed

    monkeypatch.setattr(_resources, "cpu_count", lambda: cpus)
    monkeypatch.setenv(_resources.MEMORY_ENV, "16G")
    monkeypatch.setattr(singleloc.runtime._distributed, "open_cluster", lambda *a, **k: pytest.fail("a cluster was started"))
    assert main(["sweep", "default", *TINY, "--grid", "model.heads=1", "--workers", workers, "--out", str(tmp_path / "o")]) == 2
    assert words in one_line(capsys, "sweep")
    _resources.check_workers(3, "--workers", force=True)  # --force passes the CPU bound, not the memory one
    with pytest.raises(MemoryError, match="workers = 1000000"):
        _resources.check_workers(1000000, force=True)
    with pytest.raises(ValueError, match="workers must be an integer >= 1, got 0"):
        _resources.check_workers(0)


def test_a_simulation_of_many_hours_is_refused_without_force_and_says_its_cost(tmp_path, capsys, monkeypatch):
    """Issue 21 item 11: a 10000-head simulate passed the memory check without a word on its time.
    (Its time comes from this device's records, none here, and its calibration, stubbed at the
    reference CPU's: singleloc.preflight._estimates.)"""
    from singleloc.preflight import _estimates

    monkeypatch.setattr(_estimates, "timings_path", lambda: tmp_path / "timings.json")
    monkeypatch.setattr(_estimates, "measure_benchmark", lambda: dict(_estimates.REFERENCE["benchmark"]))
    monkeypatch.setenv(_resources.MEMORY_ENV, "16G")
    big = ["--set", "model.heads=2000", "--set", "simulation.D=5000"]
    out = str(tmp_path / "out")
    assert main(["simulate", "default", *big, "--no-progress", "--out", out]) == 2
    line = one_line(capsys, "simulate")
    assert "1.5e+05 SGD steps (sgd.tau_max x simulation.D) x 4 seeds of model.heads = 2000 keys in simulation.D = 5000" in line
    assert " h (from this CPU's speed) and " in line and "more than the 4 h a run may take without --force" in line
    assert "pass --force" in line
    assert not (tmp_path / "out").exists()
    import singleloc.simulation._simulation

    ran = []
    def started(config, progress):
        ran.append(config)
        raise ValueError("started")

    monkeypatch.setattr(singleloc.simulation._simulation, "simulate", started)
    assert main(["simulate", "default", *big, "--no-progress", "--force", "--out", out]) == 2
    assert len(ran) == 1 and "started" in capsys.readouterr().err  # --force: started (it says its measured estimate)


def test_a_long_diagnosis_is_refused_without_force_and_a_minute_long_one_is_announced(tmp_path, capsys, monkeypatch):
    """Issue 21 item 11: ``diagnose --temperature`` with 1000 values ran 25 minutes without a word."""
    attn = _attention(tmp_path)
    temps = [str(0.01 * (i + 1)) for i in range(1000)]
    monkeypatch.setattr(_resources, "cpu_count", lambda: 2)
    monkeypatch.setattr(diagnose, "DIAGNOSE_UNIT", 20.0)  # the 48 rows of 8 tokens as slow as a large model's
    assert main(["diagnose", str(attn), "--temperature", *temps, "--out", str(tmp_path / "o")]) == 2
    line = one_line(capsys, "diagnose")
    assert "48 rows of L = 8 tokens x 1000 temperatures x 3 perturbation sizes x 4 directions: about" in line
    assert "lower --temperature, --epsilon, --directions or --max-rows, or pass --force" in line
    monkeypatch.setattr(diagnose, "DIAGNOSE_UNIT", 25.0)  # 75 s
    assert main(["diagnose", str(attn), "--temperature", "1", "2", "--out", str(tmp_path / "o")]) == 0
    assert "singleloc diagnose: note: 48 rows of L = 8 tokens x 2 temperatures" in capsys.readouterr().err


def test_a_long_integrate_says_so_and_shows_its_progress(tmp_path, capsys, monkeypatch):
    """Issue 21 items 6 and 11: ``integrate --set sgd.tau_max=1e6`` ran for minutes without output."""
    import singleloc.theory._ode

    calls = []
    def started(setup, **kwargs):
        calls.append(kwargs)
        raise ValueError("started")

    monkeypatch.setattr(singleloc.theory._ode, "integrate_setup", started)
    assert main(["integrate", "default", *TINY, "--set", "sgd.tau_max=1e6", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "singleloc integrate: note: sgd.tau_max = 1e+06 is a long solve: up to 100000 adaptive steps" in err
    assert calls == [{"max_steps": 100000, "progress": False}]  # --no-progress in TINY
    assert main(["integrate", "default", *TINY[:-1], "--set", "sgd.tau_max=1e6", "--out", str(tmp_path / "o")]) == 2
    assert calls[-1]["progress"] is True and "its progress bar follows" in capsys.readouterr().err


def test_diagnose_of_a_scalar_is_one_line(tmp_path, capsys):
    """Found in the hostile pass of issue 21: the cost estimate read the last axis of a 0-d array (IndexError)."""
    np.save(tmp_path / "scalar.npy", np.float64(1.0))
    assert main(["diagnose", str(tmp_path / "scalar.npy")]) == 2
    assert "weights must be a non-empty array of shape (..., L), got shape ()" in one_line(capsys, "diagnose")


def test_long_sequences_pass_the_checks_on_the_exact_route_only(monkeypatch):
    """The quadrature limits (points >= L*H for the whitening, L*H <= 21201 Sobol dimensions) are the
    rule route's: the exact route integrates no L*H-dimensional rule but its lr^2 term's, which
    takes any dimension (pseudo-random coordinates beyond Sobol's, no whitening below L*H points)."""
    from singleloc.expectations._fields import gaussian_nodes

    monkeypatch.setenv(_resources.MEMORY_ENV, "none")
    cfg = load_config("default", ["problem.L=11000", "theory.points=64"])
    _resources.check_run(build(cfg.replace(theory={"route": "exact"})), theory_starts=1)
    with pytest.raises(ValueError, match="more than the 21201"):
        _resources.check_run(build(cfg.replace(theory={"route": "rule"})), theory_starts=1)
    long = load_config("default", ["problem.L=4096"])  # the exact route's risk at the saved times does not grow with L
    exact, rule = long.replace(theory={"route": "exact"}), long.replace(theory={"route": "rule"})

    def saved(c):
        return _resources.saved_bytes(c.problem.L, c.model.heads, c.problem.F, c.theory, c.sgd.n_save, route_of(c), 1)
    assert saved(exact) < 1e-3 * saved(rule)
    z = gaussian_nodes(11000, 2, 0, 64, 0, symmetric=False)
    assert z.shape == (64, 22000) and np.all(np.isfinite(z))
    assert abs(float(np.mean(z[:, -1000:] ** 2)) - 1) < 0.05  # the pseudo-random tail is standard normal


@pytest.mark.slow
def test_a_terminals_ctrl_c_while_a_sweep_starts_its_workers_is_one_line(tmp_path):
    """Issue 62: a terminal's Ctrl-C reaches the whole process group; while ``sweep --workers 2`` started its
    workers, a worker also printed a ``KeyboardInterrupt`` traceback (66 lines) after "interrupted". The
    workers now ignore SIGINT (this process closes them): the signal lands as the first worker starts."""
    pytest.importorskip("distributed")
    args = ["-m", "singleloc", "sweep", "default", *cli_sets(*SETS[:3], "simulation.D=64", "simulation.seeds=1"),
            "--grid", "model.heads=1,2", "--workers", "2", "--yes", "--no-progress", "--out", "o"]
    # three processes besides it (spawned: the resource tracker and two workers; forked: the tracker, the fork
    # server and the first worker): the signal lands while the workers start, where it printed the traceback
    code, seconds, err = interrupt(args, tmp_path, delay=0.5, limit=30.0, group=3)
    assert code == 130 and seconds < 5.0, (code, seconds, err)
    assert err.strip().splitlines()[-1] == "singleloc sweep: interrupted" and "Traceback" not in err, err
    assert "leaked" not in err, err


def test_plot_into_a_sweeps_folder_is_refused(previous_run, tmp_path, capsys):
    """Issue 62 item 6 (a hostile pass): ``plot RUN --out SWEEP`` wrote the run's figures among a sweep's files
    without a word (a sweep's folder held no run's files, so no run was seen there)."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.csv").write_text("model.heads,final_risk\n1,0.5\n")
    assert main(["plot", str(previous_run), "--out", str(sweep)]) == 2
    line = one_line(capsys, "plot")
    assert "holds a sweep (sweep.csv)" in line and "choose another --out folder" in line, line
    assert [p.name for p in sweep.iterdir()] == ["sweep.csv"]

"""``integrate --continue RUN_DIR --horizon TAU`` and ``compare --continue``: a stored run continued from its
state at its last saved time equals one solve to the later horizon (the independent reference: the direct
solve at the same saved times), reuses the stored run's compiled program, and bad continuations are refused
in one line naming the option."""

from __future__ import annotations

import numpy as np
import pytest
from _tiny import tiny

import singleloc as sl
from singleloc.cli import main
from singleloc.io._run_folders import save_run

#: Two adaptive solves (Tsit5, ``theory.rtol`` 1e-6, ``atol`` 1e-8 of the tiny problem), one restarted at the stored
#: run's last saved time: each keeps its local error per step below ``rtol |y| + atol`` over a few tens of steps,
#: so the two differ by far less than this (100 times the tolerance, for the growth of the global error).
TOL = 1e-4


def _same(got, want, what):
    for key in ("M", "Q", "b", "risk"):
        np.testing.assert_allclose(getattr(got, key), getattr(want, key), atol=TOL, rtol=0, err_msg=f"{what}: {key}")


def test_integrate_continued_equals_one_solve_to_the_later_horizon(tiny_run, tmp_path, tiny_theory, programs):
    """The continuation solves with the stored run's program (the session's tiny solve, held in this process or
    loaded from the compilation cache): no solve program is compiled."""
    before = len(programs)
    assert main(["integrate", "--continue", str(tiny_run), "--horizon", "4", "--out", str(tmp_path / "b"),
                 "--no-progress"]) == 0
    assert [name for name, loaded in programs[before:] if name in ("jit(_trajectories)", "jit(call)") and not loaded] == []
    run = sl.load_run(tmp_path / "b")
    got = run.theory
    n = tiny_theory.tau.size
    assert got.tau.size == 2 * n - 1 and got.tau[-1] == 4.0 and run.config.sgd.tau_max == 4.0
    for key in ("M", "Q", "b", "risk"):  # the stored part as stored
        np.testing.assert_array_equal(getattr(got, key)[:, :n], getattr(tiny_theory, key))
    _same(got, sl.integrate(tiny("sgd.tau_max=4"), ts=got.tau), "continued vs one solve to tau = 4")


@pytest.mark.slow  # the simulation rerun and two solves of two seeds: a minute on a loaded CPU
def test_compare_continued_reruns_the_simulation_and_continues_the_theory(tmp_path, tiny_theory_seeds, tiny_simulation):
    config = tiny()
    stored = save_run(tmp_path / "a", tiny_theory_seeds.resolved(config), {
        "simulation.npz": tiny_simulation.arrays(), "theory.npz": tiny_theory_seeds.arrays(0),
        "theory_seeds.npz": {k: getattr(tiny_theory_seeds, k) for k in ("tau", "M", "Q", "b", "risk", "risk_se")}})
    assert main(["compare", "--continue", str(stored), "--horizon", "4", "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    run = sl.load_run(tmp_path / "b")
    n = tiny_simulation.tau.size
    np.testing.assert_array_equal(run.simulation.tau, run.theory.tau)
    np.testing.assert_array_equal(run.simulation.risk[:, :n], tiny_simulation.risk)  # rerun from the same seeds
    assert run.simulation.tau[-1] == 4.0
    _same(run.theory, sl.integrate(tiny("sgd.tau_max=4"), sl.initial_conditions(config), ts=run.theory.tau),
          "continued theory of every seed vs one solve to tau = 4")


@pytest.mark.parametrize("argv, words", [
    (["integrate", "--continue", "RUN", "--horizon", "2"], ["--horizon", "tau = 2", "got 2"]),
    (["integrate", "--continue", "RUN", "--horizon", "1"], ["--horizon", "beyond"]),
    (["integrate", "--continue", "RUN"], ["--horizon", "beyond"]),
    (["integrate", "--continue", "EMPTY", "--horizon", "5"], ["--continue", "config.json"]),
    (["integrate", "--continue", "RUN/theory.npz", "--horizon", "5"], ["--continue", "not a folder"]),
    (["compare", "--continue", "RUN", "--horizon", "5"], ["--continue", "theory_seeds.npz", "compare"]),
    (["integrate", "default", "--continue", "RUN", "--horizon", "5"], ["--continue", "without CONFIG"]),
    (["integrate", "--continue", "RUN", "--horizon", "5", "--set", "sgd.lr=1"], ["--continue", "without --set"]),
    (["integrate"], ["CONFIG", "--continue"]),
    (["compare", "default", "--horizon", "5"], ["--horizon", "--continue"]),
])
def test_bad_continuations_are_refused_in_one_line(tiny_run, tmp_path, capsys, argv, words):
    (tmp_path / "empty").mkdir()
    argv = [a.replace("RUN", str(tiny_run)).replace("EMPTY", str(tmp_path / "empty")) for a in argv]
    assert main([*argv, "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert all(w in err for w in words), err
    assert not (tmp_path / "out").exists()


def test_a_run_of_another_version_is_continued_with_a_note(tiny_run, tmp_path, capsys):
    """Issue 62 item 6 (a hostile pass): a run folder written by another version of singleloc was continued without
    a word, its stored part and its continuation then made by two versions."""
    import json
    import shutil

    other = shutil.copytree(tiny_run, tmp_path / "other")
    data = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**data, "singleloc_version": "0.0.1"}))
    assert main(["integrate", "--continue", str(other), "--horizon", "1", "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    note, error = capsys.readouterr().err.strip().splitlines()  # (here refused after the note: a horizon not beyond)
    assert note.startswith("singleloc integrate: note: ") and "singleloc 0.0.1, this is " + sl.__version__ in note, note
    assert error.startswith("singleloc integrate: error: --horizon"), error

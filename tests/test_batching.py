"""Batched sweep points: theory points that differ only in values (learning rate, strength,
horizon, initial scale, seed, D) are one vmapped solve with one compilation, and each point's
result equals its own solve to the solver's tolerance. On the canonical tiny problem (tests/_tiny.py):
a point solved alone is the session's tiny solve of two starts (tiny_theory_seeds' program)."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from _tiny import tiny

from singleloc.cli import main
from singleloc.sweeps import _sweep, _sweep_cache, _sweep_compute

VALUES = [  # every batched key moves between the points
    ["sgd.lr=0.3", "problem.strength=2.5", "sgd.tau_max=0.75", "sgd.init_scale=0.5", "simulation.seed=0", "simulation.D=100"],
    ["sgd.lr=0.5", "problem.strength=3.5", "sgd.tau_max=1", "sgd.init_scale=0.4", "simulation.seed=1", "simulation.D=1000"],
]


def configs(*extra):
    return [tiny(*v, *extra) for v in VALUES]


def solver_tolerance(cfg, x):
    """What two solves of the same problem at ``theory.rtol``/``atol`` may differ by: their local
    error bounds at the scale of ``x``, with a factor 10 for their growth along the horizons (up to 1 time unit)."""
    return 10 * (cfg.theory.rtol * np.max(np.abs(x)) + cfg.theory.atol)


@pytest.fixture(scope="module")
def singles(tiny_theory_seeds):
    """Each point of :func:`configs` solved alone (the session's tiny program), shared by the tests below."""
    return [_sweep_compute.compute_point("theory", c.to_dict()) for c in configs()]


@pytest.fixture(scope="module")
def batched():
    """The points of :func:`configs` and, last, the second one at a learning rate far past stability, as one batched
    solve (one program; values only), shared by the tests below."""
    cfgs = configs()
    return _sweep_compute.compute_points("theory", *(c.to_dict() for c in (*cfgs, cfgs[1].replace(sgd={"lr": 1e5}))))


def test_batched_points_equal_their_own_solves(singles, batched):
    cfgs = configs()
    groups = {_sweep_compute.compile_group("theory", c.to_dict()) for c in cfgs}
    assert len(groups) == 1  # the values do not split the group ...
    assert _sweep_compute.compile_group("theory", cfgs[0].replace(model={"heads": 1}).to_dict()) not in groups  # ... a shape does
    for cfg, b, s in zip(cfgs, batched, singles):
        np.testing.assert_array_equal(b["tau"], s["tau"])  # each point its own horizon
        assert b["tau"][-1] == cfg.sgd.tau_max
        for name in ("M", "Q", "b", "risk"):
            np.testing.assert_allclose(b[name], s[name], rtol=0, atol=solver_tolerance(cfg, s[name]), err_msg=name)
    # the points differ by far more than the tolerance: a result given to the wrong point fails
    gap = np.max(np.abs(singles[0]["risk"][:, -1] - singles[1]["risk"][:, -1]))
    assert gap > 100 * solver_tolerance(cfgs[0], singles[0]["risk"])


def test_a_failing_point_does_not_stop_its_batch(singles, batched):
    """The batch of the test above holds a third point, the second one at a learning rate far past stability:
    its solve stops at the step floor within its first steps (singleloc.theory._step_budget.MIN_STEP) while the
    others finish, each its own solve's result."""
    assert isinstance(batched[2], FloatingPointError) and "sgd.lr" in str(batched[2])
    for cfg, r, s in zip(configs(), batched[:2], singles):
        np.testing.assert_allclose(r["risk"], s["risk"], rtol=0, atol=solver_tolerance(cfg, s["risk"]))


_COUNT = textwrap.dedent("""
    import sys, json
    from pathlib import Path
    import jax
    jax.config.update("jax_enable_x64", True)
    import singleloc as sl
    from singleloc.sweeps import _sweep_cache
    programs = []
    def listener(event, duration, fun_name="", **kw):
        if event == "/jax/core/compile/backend_compile_duration" and fun_name in ("jit(_run_points)", "jit(_trajectories)"):
            programs.append(fun_name)
    jax.monitoring.register_event_duration_secs_listener(listener)
    base = ["theory.points=16", "sgd.n_save=3", "sgd.tau_max=1", "simulation.seeds=1", "problem.L=3"]
    entries = [(sl.load_config("default", base + [f"model.heads={h}", f"sgd.lr={lr}", f"problem.strength={s}"]), "theory")
               for h in (1, 2) for lr in (0.3, 0.5) for s in (2.5, 3.5)]
    done, errors = _sweep_cache.fill_cache(entries, Path(sys.argv[1]), progress=False, batch=sys.argv[2] == "batch")
    print(json.dumps({"programs": programs, "done": len(done), "errors": len(errors)}))
""")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["batch", "no-batch"])
def test_one_compilation_per_shape_group(tmp_path, mode):
    """8 points in 2 shape groups (heads 1, 2; learning rates and strengths are values): two
    compiled solves, batched (one per group) or not (one per shape, the learning rate traced)."""
    env = {**os.environ, "SINGLELOC_CACHE_DIR": "", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", _COUNT, str(tmp_path), mode], capture_output=True, text=True, timeout=600,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    program = "jit(_run_points)" if mode == "batch" else "jit(_trajectories)"
    assert report == {"programs": [program] * 2, "done": 8, "errors": 0}
    assert len(list(tmp_path.glob("theory-*.npz"))) == 8 and not list(tmp_path.glob("*.tmp"))


def test_sweep_command_has_batch_switch(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    assert "--batch, --no-batch" in capsys.readouterr().out


def test_a_large_group_is_cut_for_the_workers():
    one = [list("abcdefghijklmnop")]  # one group of 16 points, 2 workers: two tasks of 8
    assert _sweep_cache.split_groups(one, 2) == [list("abcdefgh"), list("ijklmnop")]
    four = [list("abcd"), list("efgh"), list("ijkl"), list("mnop")]  # enough groups: kept whole
    assert _sweep_cache.split_groups(four, 2) == four and _sweep_cache.split_groups(one, 1) == one
    parts = _sweep_cache.split_groups([list("abcde"), ["x"]], 2)  # at most ceil(6 / 2) = 3 points a task
    assert parts == [["a", "b"], ["c", "d", "e"], ["x"]]
    assert sorted(sum(_sweep_cache.split_groups([list("abcdefg")], 3), [])) == list("abcdefg")


def test_the_memory_check_counts_the_starts_of_a_batched_group(tmp_path, capsys, monkeypatch):
    """8 learning rates x 4 seeds at 16384 points: 32 starts (0.384 GB) in one batched solve, 4
    (0.061 GB) a point without batching, each with its saved times and their risks (0.013 GB, held
    four states at a time); with 500 MiB available (0.31 GB of overhead) only the unbatched sweep may
    start. The Sobol rule's memory (its subject: the exact route's is its Gram rule's,
    tests/test_run_checks.py)."""
    monkeypatch.setenv("SINGLELOC_MEMORY_LIMIT", "500M")
    # nothing computed or written (the command's memory check comes first)
    monkeypatch.setattr(_sweep, "compute_sweep", lambda base, grids, *a, **k: _sweep.SweepOutcome(base, grids, [], {}, False,
                                                                                               _sweep.SweepStats()))
    monkeypatch.setattr(_sweep, "write_sweep_outputs", lambda *a, **k: None)
    args = ["sweep", "default", "--grid", "sgd.lr=0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8", "--set", "theory.points=16384", "--set",
            "theory.route=rule", "--set", "simulation.seeds=4", "--out", str(tmp_path), "--no-progress",
            "--yes"]  # (the time check: tests/test_progress.py)
    assert main(args) == 2
    assert "32 start(s)" in capsys.readouterr().err
    assert main(args + ["--no-batch"]) == 0

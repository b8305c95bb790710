"""Points on Dask: serial path without Dask, failed tasks, a worker killed mid-task, Ctrl-C /
SIGTERM on the client, and an external scheduler. Real clusters (``LocalCluster``, ``dask
scheduler`` / ``dask worker`` processes on 127.0.0.1), no mocks."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from _dask_tasks import STARTUP, process_of, square, square_once_killed
from _tiny import EXACT_TINY

from singleloc import load_config
from singleloc.io._run_folders import load_npz, save_npz
from singleloc.runtime._distributed import _homes, check_cluster, open_cluster, run_points, worker_env
from singleloc.sweeps._grid import parse_grid
from singleloc.sweeps._sweep import sweep
from singleloc.sweeps._sweep_compute import compile_group, compute_point

TINY = list(EXACT_TINY)  # one compilation: strength changes no shape and no static field


def _collect():
    got: dict = {}

    def on_result(key, result):
        assert key not in got, f"result {key} handed over twice"
        got[key] = result

    return got, on_result


def test_serial_is_in_process_and_records_errors():
    got, on_result = _collect()
    report = run_points([(x, (x,)) for x in range(5)], square, on_result, progress=False)
    assert report.where == "serial" and report.completed == [0, 1, 2, 4]
    assert {k: int(v["x"][0]) for k, v in got.items()} == {0: 0, 1: 1, 2: 4, 4: 16}
    assert list(report.errors) == [3] and isinstance(report.errors[3], FloatingPointError)
    with pytest.raises(ValueError, match="repeated"):
        run_points([(1, (1,)), (1, (2,))], square, on_result)
    with pytest.raises(ValueError, match="either"):
        run_points([], square, on_result, workers=2, scheduler="tcp://127.0.0.1:1")
    with pytest.raises(ZeroDivisionError):  # a failing callback stops the run
        run_points([(1, (1,))], square, lambda k, r: 1 / 0, progress=False)


def test_importing_singleloc_or_a_serial_run_does_not_import_dask():
    code = ("import sys, singleloc\nassert not {'distributed', 'dask'} & set(sys.modules)\n"
            "from singleloc.runtime._distributed import run_points\n"
            "r = run_points([(1, (2.0,))], abs, lambda k, v: None, progress=False)\n"
            "assert r.where == 'serial' and r.completed == [1]\n"
            "assert run_points([], abs, print, workers=2).completed == []  # nothing to run, no cluster\n"
            "assert not {'distributed', 'dask'} & set(sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=STARTUP, env=env)


def test_one_check_of_where_to_run_names_the_callers_options(tmp_path, capsys):
    check_cluster(1, "tcp://127.0.0.1:1") or check_cluster(2, None)
    with pytest.raises(ValueError, match="workers must be at least 1, got 0"):
        open_cluster(0).__enter__()
    with pytest.raises(ValueError, match=r"workers > 1 \(a local cluster\) or a scheduler address \(an existing one\), not both"):
        open_cluster(2, "tcp://127.0.0.1:1").__enter__()
    from singleloc.cli import main

    assert main(["sweep", "default", *[f"--set={t}" for t in TINY], "--grid", "model.heads=1", "--workers", "2",
                 "--scheduler", "tcp://127.0.0.1:1", "--out", str(tmp_path / "o")]) == 2
    assert "either --workers N (a local cluster) or --scheduler ADDRESS (an existing one), not both" in capsys.readouterr().err


def test_one_cluster_serves_several_runs_and_starts_only_with_work():
    """A local cluster starts with the first run that has work and serves the next (e.g. the two rounds of a sweep):
    the first run's failing task is reported and the others complete, the second runs on the same processes."""
    with open_cluster(workers=2) as cluster:
        assert run_points([], process_of, print, cluster=cluster).completed == [] and cluster._client is None  # nothing started
        assert cluster.threads == 2 and cluster._client is None
        got, on_result = _collect()
        report = run_points([(x, (x,)) for x in range(6)], square, on_result, cluster=cluster, progress=False)
        assert report.where == "local"
        assert sorted(report.completed) == [0, 1, 2, 4, 5] and len(report.completed) == 5
        assert {k: int(v["x"][0]) for k, v in got.items()} == {x: x * x for x in (0, 1, 2, 4, 5)}
        assert list(report.errors) == [3]
        err = report.errors[3]
        assert isinstance(err, FloatingPointError) and "lower sgd.lr" in str(err)
        pids = [{int(r["pid"]) for r in got.values()}]
        got, on_result = _collect()
        report = run_points([(x, (x,)) for x in range(4)], process_of, on_result, cluster=cluster, progress=False)
        assert report.where == "local" and sorted(report.completed) == [0, 1, 2, 3]
        pids.append({int(r["pid"]) for r in got.values()})
        assert pids[0] == pids[1] and os.getpid() not in pids[0]  # the same worker processes both times
        assert {str(r["cache"]) for r in got.values()} == {jax.config.jax_compilation_cache_dir}  # this session's cache
        with pytest.raises(ValueError, match="not both"):
            run_points([(0, (0,))], process_of, print, cluster=cluster, workers=2)
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids[0]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in pids[0]), "worker processes left running after the block"

def test_worker_killed_mid_task_is_retried_and_every_result_arrives_once(tmp_path):
    flags, cache = tmp_path / "flags", tmp_path / "cache"
    flags.mkdir()
    killed: list[int] = []

    def kill_first_attempt():  # the test kills the worker process running point 0
        deadline = time.monotonic() + STARTUP
        while time.monotonic() < deadline:
            started = list(flags.glob("started-0-*"))
            if started:
                pid = int(started[0].name.split("-")[-1])
                (flags / "killed").touch()
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_first_attempt, daemon=True)
    killer.start()
    got, on_result = _collect()

    def store(key, result):  # as the sweep does: the client writes the cache atomically
        on_result(key, result)
        save_npz(cache / f"{key}.npz", result)

    # all tasks prefer one worker (one group): the preference must not outlive that worker
    report = run_points([(x, (x, str(flags))) for x in range(4)], square_once_killed, store, workers=2, progress=False,
                        group=lambda x, flags: "one")
    killer.join(timeout=5)
    assert len(killed) == 1, "point 0 never started"
    attempts = sorted(flags.glob("started-0-*"))
    assert len(attempts) == 2 and int(got[0]["pid"]) != killed[0]  # run again, by another process
    assert report.errors == {} and sorted(report.completed) == [0, 1, 2, 3] and len(report.completed) == 4
    assert {k: int(v["x"][0]) for k, v in got.items()} == {x: x * x for x in range(4)}
    assert sorted(p.name for p in cache.iterdir()) == [f"{x}.npz" for x in range(4)]  # no temporary file left
    assert all(int(load_npz(cache / f"{x}.npz")["x"][0]) == x * x for x in range(4))


def test_groups_share_a_worker_and_only_value_keys_share_a_group():
    homes = _homes(["a", "b", "a", "c", "b"], ["w1", "w2"])
    assert [h["workers"] for h in homes] == [["w1"], ["w2"], ["w1"], ["w1"], ["w2"]]
    assert all(h["allow_other_workers"] for h in homes) and _homes(["a"], []) == [{}]
    base = load_config("default")
    group = lambda **sections: compile_group("theory", base.replace(**sections).to_dict())  # noqa: E731
    assert group(problem={"strength": 3.5}, sgd={"init_scale": 0.3, "lr": 0.3, "tau_max": 7.0}, simulation={"seed": 4, "D": 50},
                 theory={"qmc_seed": 3, "rtol": 1e-7, "atol": 1e-9}) == group()
    assert len({group(), group(sgd={"n_save": 7}), group(model={"heads": 3}), compile_group("simulation", base.to_dict())}) == 4
    simulation = lambda **sections: compile_group("simulation", base.replace(**sections).to_dict())  # noqa: E731
    assert simulation(simulation={"seed": 4}) != simulation()  # the simulator's programs hold the config's values


INTERRUPTED_RUN = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import numpy as np

    def task(x, flags):  # the spawned workers import this file: no JAX there, they start faster
        (Path(flags) / f"worker-{os.getpid()}").touch()
        if x >= 2:
            time.sleep(600)
        return {"x": np.array([x])}

    if __name__ == "__main__":
        from singleloc.runtime._distributed import run_points
        from singleloc.io._run_folders import save_npz

        def on_result(key, result):
            save_npz(Path(sys.argv[2]) / f"{key}.npz", result)
            print(key, flush=True)

        run_points([(x, (x, sys.argv[1])) for x in range(5)], task, on_result, workers=2, progress=False)
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_interrupted_client_keeps_finished_results_and_closes_the_cluster(tmp_path, sig):
    flags, cache = tmp_path / "flags", tmp_path / "cache"
    flags.mkdir()
    cache.mkdir()
    script = tmp_path / "run.py"
    script.write_text(INTERRUPTED_RUN)
    # SIGINT at its default in the child, as in a terminal: a shell starts background jobs with SIGINT ignored,
    # which Python then keeps (no KeyboardInterrupt), so a test run in the background would hang here
    proc = subprocess.Popen([sys.executable, str(script), str(flags), str(cache)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        done = [proc.stdout.readline().strip() for _ in range(2)]  # points 0 and 1 finish; the others block
        assert sorted(done) == ["0", "1"]
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=STARTUP)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    # issue 21 item 12: no Dask log lines (cancelled tasks, workers killed) or worker tracebacks beside the interrupt
    assert " - distributed." not in err and err.count("Traceback") <= 1, err
    assert sorted(p.name for p in cache.iterdir()) == ["0.npz", "1.npz"]  # complete files only
    assert [int(load_npz(cache / f"{x}.npz")["x"][0]) for x in (0, 1)] == [0, 1]
    workers = [int(p.name.split("-")[1]) for p in flags.glob("worker-*")]
    assert workers
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in workers), "worker processes left running"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def external_cluster(tmp_path):
    """A ``dask scheduler`` and one ``dask worker`` on 127.0.0.1, as separate processes. The
    worker shares this session's persistent compilation cache, so it does not compile again."""
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    here = Path(__file__).parent  # the task functions of this module are imported there by name
    env.update(worker_env(), PYTHONPATH=os.pathsep.join(filter(None, (str(here), str(here.parent), env.get("PYTHONPATH")))))
    cache = jax.config.jax_compilation_cache_dir
    if cache:
        env.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    file = tmp_path / "scheduler.json"
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--no-dashboard", "--scheduler-file", str(file)], env=env, stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + STARTUP
        address = None
        while address is None and time.monotonic() < deadline:  # the file appears before it is written whole
            with contextlib.suppress(OSError, ValueError, KeyError):
                address = json.loads(file.read_text())["address"]
            time.sleep(0.1)
        assert address, f"the dask scheduler wrote no address to {file} within {STARTUP} s"
        procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers", "1",
                                       "--nthreads", "1", "--no-dashboard"], env=env, stderr=subprocess.DEVNULL))
        yield address
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_external_scheduler_gives_the_serial_results(external_cluster, monkeypatch):
    tasks = [(x, (x,)) for x in range(5)]
    serial, on_serial = _collect()
    run_points(tasks, square, on_serial, progress=False)
    remote, on_remote = _collect()
    report = run_points(tasks, square, on_remote, scheduler=external_cluster, progress=False)
    assert report.where == external_cluster and sorted(report.completed) == [0, 1, 2, 4], report.errors
    assert list(report.errors) == [3] and isinstance(report.errors[3], FloatingPointError)
    assert remote.keys() == serial.keys() and all(np.array_equal(remote[k]["x"], serial[k]["x"]) for k in serial)
    with open_cluster(scheduler=external_cluster) as cluster:
        assert cluster.threads == 1  # the fixture's one single-threaded worker: a sweep cuts its groups for that
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", external_cluster)  # Dask's convention, with workers = 1
    assert run_points(tasks[:1], square, lambda k, r: None, progress=False).where == external_cluster


@pytest.mark.slow
def test_external_scheduler_computes_theory_points_as_the_serial_run(external_cluster):
    configs = {s: load_config("default", TINY + [f"problem.strength={s}"]).to_dict() for s in (2.5, 3.5)}
    tasks = [(s, ("theory", cfg)) for s, cfg in configs.items()]
    serial, on_serial = _collect()
    run_points(tasks, compute_point, on_serial, progress=False)
    remote, on_remote = _collect()
    report = run_points(tasks, compute_point, on_remote, scheduler=external_cluster, progress=False)
    assert report.errors == {} and sorted(report.completed) == [2.5, 3.5]
    for s in configs:
        assert remote[s].keys() == serial[s].keys() and {"tau", "M", "Q", "b", "risk"} <= remote[s].keys()  # and the statement
        assert remote[s]["M"].dtype == np.float64  # the worker enabled x64 itself
        for name in serial[s]:
            np.testing.assert_array_equal(remote[s][name], serial[s][name])
    assert not np.allclose(serial[2.5]["risk"], serial[3.5]["risk"])  # the two points differ


@pytest.mark.slow
def test_sweep_on_an_external_cluster_writes_the_serial_csv(external_cluster, tmp_path):
    """The whole sweep (escape predictions, then the runs to their horizons) on the external
    cluster: the client alone writes the cache and the CSV, identical to the serial sweep's."""
    base = load_config("default", TINY + ["model.heads=1"])
    grids = [parse_grid("problem.strength=2.5,3.5")]
    serial_rows, serial_stats = sweep(base, grids, tmp_path / "serial", horizon="config", progress=False, figures=False)
    rows, stats = sweep(base, grids, tmp_path / "remote", horizon="config", progress=False, figures=False,
                        scheduler=external_cluster)
    assert (tmp_path / "remote" / "sweep.csv").read_text() == (tmp_path / "serial" / "sweep.csv").read_text()
    assert stats.computed == serial_stats.computed == 2 and stats.failed == 0
    assert not list((tmp_path / "remote" / "cache").glob("*.tmp"))  # only complete entries
    _, again = sweep(base, grids, tmp_path / "remote", horizon="config", progress=False, figures=False,
                     scheduler=external_cluster)
    assert again.cached == 2 and again.computed == 0  # cached points are not submitted



PREDICTIONS_COMPILED = textwrap.dedent("""
    import sys
    import jax
    jax.config.update("jax_enable_x64", True)  # compute_point leaves a caller's process as it finds it
    from singleloc import load_config
    from singleloc.sweeps._sweep_compute import compile_group, compute_point

    names = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, fun_name="", **kw: names.append(fun_name) if event.endswith("backend_compile_duration") else None)
    base = load_config("default", sys.argv[1:])
    other = base.replace(problem={"strength": 3.5}, sgd={"lr": 0.3, "init_scale": 0.5}, simulation={"seed": 3, "D": 500},
                         theory={"qmc_seed": 4})
    assert compile_group("prediction", base.to_dict()) == compile_group("prediction", other.to_dict())
    compute_point("prediction", base.to_dict())
    compiled = len(names)
    compute_point("prediction", other.to_dict())
    assert compiled > 0 and len(names) == compiled, names[compiled:]
""")


@pytest.mark.slow
def test_escape_predictions_of_one_group_share_their_programs():
    """The claim behind ``SHAPE_KINDS``: in a fresh process without a compilation cache, a
    prediction at other values of the value keys compiles nothing new."""
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": "", "SINGLELOC_CACHE_DIR": ""}
    done = subprocess.run([sys.executable, "-c", PREDICTIONS_COMPILED, *TINY], env=env, capture_output=True, text=True,
                          timeout=STARTUP * 3)
    assert done.returncode == 0, done.stderr[-2000:]

"""Independent points on Dask ``distributed``: in this process, on a local cluster, or on an external one.

:func:`run_points` maps a module-level function over tasks ``(key, args)`` and hands every result
to a callback ``on_result(key, result)`` **in the calling (client) process**, as the results
complete. The workers receive plain arguments (for a sweep, :meth:`Config.to_dict` of its points) and send back
arrays; only the client writes files, so the workers need no shared file system.

Where the tasks run (a :class:`Cluster`, from :func:`open_cluster`, which several calls may share):

* ``workers == 1`` and no scheduler address: one after the other in this process, in the order
  given. Dask is neither imported nor started.
* ``workers > 1``: an embedded :class:`distributed.LocalCluster` of ``workers`` single-threaded processes, started
  when the first task is submitted, with the environment :func:`worker_env`; its workers ignore Ctrl-C (this
  process closes them).
* ``scheduler="tcp://HOST:PORT"`` (or, with ``workers == 1``, ``DASK_SCHEDULER_ADDRESS``, Dask's own convention): an
  existing cluster (``docs/scale.md``), whose workers must have the same version of ``singleloc`` installed.

Faults:

* A task that raises: its exception is recorded under its key (:attr:`PointsReport.errors`) and the other tasks go
  on. Nothing is retried: the computations are deterministic.
* A worker process that dies in the middle of a task (killed, out of memory): the scheduler runs the task again on
  another worker, up to the Dask setting ``distributed.scheduler.allowed-failures`` times (3 by default); past that
  the task is recorded with Dask's ``KilledWorker``. Each result is handed to ``on_result`` once.
* Ctrl-C or SIGTERM on the client: the results completed so far were already handed to ``on_result``; the pending
  tasks are cancelled, the local cluster is closed (by the :class:`Cluster`'s context) and
  :class:`KeyboardInterrupt` propagates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from concurrent.futures import CancelledError
from typing import Any

#: Environment variable holding the address of an external scheduler (Dask's convention).
SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"

#: Environment of the worker processes of a local cluster: XLA's CPU code on one thread, so that ``workers``
#: processes share ``workers`` cores (Dask already sets one thread for OpenMP, MKL and OpenBLAS), and no
#: preallocation of accelerator memory (local workers may share a GPU). Double precision is set by the task itself
#: (an environment variable would be read too late where the caller's main module imports JAX).
WORKER_ENV = {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
              "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


#: Dask settings of a local cluster: workers forked from a server deaf to Ctrl-C (:func:`_fork_server_deaf_to_ctrl_c`);
#: no statistical profiler on the workers (it serves the dashboard, which is off, and slows JAX's deep stacks).
LOCAL_CONFIG = {"distributed.worker.profile.enabled": False, "distributed.worker.multiprocessing-method": "forkserver"}


@dataclasses.dataclass
class PointsReport:
    """What :func:`run_points` did: the keys handed to ``on_result`` (in completion order), the exception of every task
    that raised (by key), the wall time and where the tasks ran (``"serial"``, ``"local"`` or the scheduler address)."""

    completed: list[Hashable]
    errors: dict[Hashable, BaseException]
    seconds: float
    where: str


#: The Dask clusters of this process started and not yet closed (:func:`clusters_open`).
_OPEN: set[int] = set()


def clusters_open() -> bool:
    """Whether a cluster of this process is started (a local one running, an external one
    connected) and not yet closed: Ctrl-C then gives it time to close (``singleloc.cli``)."""
    return bool(_OPEN)


class Cluster:
    """Where tasks run: this process (``where == "serial"``), a local cluster (``"local"``) or the
    external cluster at a scheduler address (``where`` is the address). Made by :func:`open_cluster`, which closes
    it. Dask is imported and a cluster started or connected only when :meth:`client` is first called (by
    :func:`run_points` with tasks to run, or :attr:`threads` of an external cluster)."""

    def __init__(self, workers: int, address: str | None, source: str = "scheduler"):
        self.workers, self.address, self.source = workers, address, source  # source: of the address, for messages
        self.where = address or ("local" if workers > 1 else "serial")
        self._stack, self._client = contextlib.ExitStack(), None

    def client(self):
        """The :class:`distributed.Client` of the cluster, started or connected on the first call."""
        if self.where == "serial":
            raise RuntimeError("a serial Cluster has no Dask client")
        if self._client is None:  # Dask imported here: a serial run neither imports nor starts it
            import dask
            from distributed import Client, LocalCluster

            _OPEN.add(id(self))  # from the start: Ctrl-C while it starts lets it close its workers

            if self.address:
                self._client = self._stack.enter_context(self._connect(Client))
            else:
                with dask.config.set(LOCAL_CONFIG), _workers_killed_on_failure():
                    _fork_server_deaf_to_ctrl_c()
                    cluster = self._stack.enter_context(LocalCluster(  # (the environment now, not the server's)
                        n_workers=self.workers, threads_per_worker=1, processes=True, dashboard_address=None,
                        env={**os.environ, **worker_env()}))
                self._client = self._stack.enter_context(Client(cluster))
                self._client.run(_worker_log_level, logging.ERROR)
        return self._client

    def _connect(self, Client):
        """The client of the external scheduler; a bad or unreachable address is a one-line
        ``ValueError`` / ``ConnectionError`` naming it and where it comes from."""
        from distributed.comm.addressing import parse_address, parse_host_port
        from distributed.comm.registry import get_backend

        what = f"the Dask scheduler address {self.address!r} ({self.source})"
        try:  # the address checked before Client: a Client that fails on the address leaves the next one hanging
            scheme, location = parse_address(self.address)
            get_backend(scheme)
            if scheme in ("tcp", "tls"):
                port = parse_host_port(location)[1]
                if not 1 <= int(port) <= 65535:  # (Dask would wait its connect timeout, 30 s, on it)
                    raise ValueError(f"port {port} is not a TCP port (1 to 65535)")
            return Client(self.address)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{what} is not usable: {err}; expected tcp://HOST:PORT") from None
        except (OSError, TimeoutError) as err:
            raise ConnectionError(f"{what}: cannot connect ({err}); start the scheduler or fix the address"
                                  + (f" (or unset {SCHEDULER_ENV} to run in this process)" if self.source == SCHEDULER_ENV
                                     else "")) from None

    @property
    def threads(self) -> int:
        """The tasks the cluster runs at once: 1 in this process, ``workers`` on a local cluster,
        the worker threads of an external cluster now (connecting to it; at least 1)."""
        if self.where == "serial":
            return 1
        return max(1, sum(self.client().nthreads().values())) if self.address else self.workers

    def close(self, *, quiet: bool = False) -> None:
        """Close the client and a local cluster (its worker processes end); idempotent. ``quiet``: without Dask's
        log lines (after Ctrl-C)."""
        client, self._client = self._client, None
        try:
            if not quiet:
                self._stack.close()
                return
            _silence_dask_logging()
            if client is not None and not self.address:  # a local cluster's workers: no tracebacks as the scheduler goes
                with contextlib.suppress(Exception):
                    client.run(_worker_log_level, logging.CRITICAL + 1, wait=False)
            try:
                self._stack.close()
            finally:
                _restore_dask_logging()
        finally:
            _OPEN.discard(id(self))


def _fork_server_deaf_to_ctrl_c() -> None:
    """Start multiprocessing's fork server, of which a local cluster forks its workers (:data:`LOCAL_CONFIG`), with
    SIGINT ignored, which the workers inherit: a terminal's Ctrl-C then reaches only this process, which closes them
    (Dask has no option for it, dask/distributed#1925). SIGINT is ignored only while the server is spawned, after
    Dask's ``pre-spawn-environ`` is set (the workers start with the server's environment)."""
    import multiprocessing
    from multiprocessing import forkserver

    import dask

    multiprocessing.get_context("forkserver").set_forkserver_preload([])  # workers forked at once (Dask's preload: 4 s)
    os.environ.update({k: os.environ.get(k, str(v)) for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()
                       if v is not None})
    with _signal_taken(signal.SIGINT, signal.SIG_IGN):
        forkserver.ensure_running()


@contextlib.contextmanager
def _workers_killed_on_failure() -> Iterator[None]:
    """A local cluster interrupted (or failing) as it starts, not yet closable: its started workers are killed."""
    import multiprocessing

    try:
        yield
    except BaseException:
        for child in multiprocessing.active_children():
            if child.name.startswith("Dask"):
                child.kill()
        raise


def check_cluster(workers: int, scheduler: str | None, *, local: str = "workers > 1",
                  external: str = "a scheduler address") -> None:
    """``ValueError`` unless ``workers`` and ``scheduler`` name one place to run (:func:`open_cluster`); ``local`` and
    ``external`` name the two in the message (the command line names its options)."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if scheduler and workers > 1:
        raise ValueError(f"give either {local} (a local cluster) or {external} (an existing one), not both")


@contextlib.contextmanager
def open_cluster(workers: int = 1, scheduler: str | None = None) -> Iterator[Cluster]:
    """A :class:`Cluster` for one or more :func:`run_points` calls, closed when the block ends.

    Args:
        workers: ``1``: this process (unless ``scheduler`` or ``DASK_SCHEDULER_ADDRESS`` names a
            cluster); ``N > 1``: a local cluster of ``N`` single-threaded worker processes.
        scheduler: address of an external Dask scheduler, ``tcp://HOST:PORT``.

    Raises:
        ValueError: ``workers < 1``, or both ``workers > 1`` and ``scheduler``.
    """
    check_cluster(workers, scheduler)
    if scheduler:
        cluster = Cluster(workers, scheduler, "scheduler")
    else:
        address = os.environ.get(SCHEDULER_ENV, "").strip() if workers == 1 else ""
        cluster = Cluster(workers, address or None, SCHEDULER_ENV)
    try:
        yield cluster
    except KeyboardInterrupt:
        cluster.close(quiet=True)
        raise
    finally:
        cluster.close()


def run_points(tasks: Sequence[tuple[Hashable, tuple]], fn: Callable[..., Any], on_result: Callable[[Hashable, Any], None],
               *, workers: int = 1, scheduler: str | None = None, cluster: Cluster | None = None, progress: bool = True,
               desc: str = "points", group: Callable[..., Hashable] | None = None, size: Callable[..., int] | None = None,
               costs: Mapping[Hashable, float] | None = None) -> PointsReport:
    """Run ``fn(*args)`` for every task ``(key, args)`` and call ``on_result(key, result)`` in
    this process as each result arrives.

    Args:
        tasks: ``(key, args)`` pairs with distinct keys; the caller leaves out what is done already.
        fn: a module-level (importable) function; it runs on the workers.
        on_result: called once per successful task, in this process; an exception it raises
            stops the run (the pending tasks are cancelled) and propagates.
        workers, scheduler: where to run, as :func:`open_cluster` (a cluster opened for this call
            and closed at its end); not with ``cluster``.
        cluster: an open :class:`Cluster` to run on, left open (:func:`open_cluster`).
        progress: show a progress bar over the completed tasks (or points, with ``size``).
        desc: label of the progress bar.
        group: on a cluster, ``group(*args)`` names the tasks that share compiled programs
            (e.g. :func:`compile_group`): the groups are dealt to the workers in turn and each
            task prefers (loosely) the worker of its group, which has compiled its programs already.
        size: ``size(*args)`` is the number of points of a task, what the progress bar counts; default 1.
        costs: the estimated seconds of tasks (by key), of which the bar's time left is made.

    Returns:
        A :class:`PointsReport`.

    Raises:
        ValueError: repeated keys, ``workers < 1``, both ``workers > 1`` and ``scheduler``, or
            ``workers``/``scheduler`` together with ``cluster``.
        KeyboardInterrupt: Ctrl-C or SIGTERM; the results completed before it were handed to ``on_result``.
    """
    keys = [key for key, _ in tasks]
    if len(set(keys)) != len(keys):
        raise ValueError("run_points: repeated task keys")
    if cluster is not None and (workers != 1 or scheduler):
        raise ValueError("give either an open cluster or workers/scheduler, not both")
    # SIGTERM is turned into KeyboardInterrupt before a cluster of this call starts and until it is closed.
    with _signal_taken(signal.SIGTERM, _interrupt), contextlib.ExitStack() as stack:
        if cluster is None:
            cluster = stack.enter_context(open_cluster(workers, scheduler))
        return _run(tasks, fn, on_result, cluster, progress, desc, group, size, costs or {})


def _run(tasks, fn, on_result, cluster: Cluster, progress, desc, group, size, costs) -> PointsReport:
    from ._progress import Bar

    report = PointsReport([], {}, 0.0, cluster.where)
    t0 = time.perf_counter()
    sizes = {key: size(*args) if size else 1 for key, args in tasks}
    bar = Bar(sum(sizes.values()), desc, "point", each=True, live=progress)  # one line a point without a terminal
    bar.plan([costs.get(key, 0.0) for key, _ in tasks])
    on_cluster = tasks and cluster.where != "serial"  # nothing to run: no cluster started
    outcomes = _on_cluster(tasks, fn, cluster, group) if on_cluster else _serial(tasks, fn)
    # closing(): the pending tasks are cancelled as soon as the loop ends, also when on_result raises.
    with bar, contextlib.closing(outcomes):
        try:
            for key, result, error in outcomes:
                if error is None:
                    on_result(key, result)
                    report.completed.append(key)
                else:
                    report.errors[key] = error
                bar.update(sizes[key], costs.get(key))
        except KeyboardInterrupt:  # quiet before closing() cancels the pending tasks (open_cluster restores it)
            if on_cluster:
                _silence_dask_logging()
            raise
    report.seconds = time.perf_counter() - t0
    return report


Outcome = tuple[Hashable, Any, "BaseException | None"]


def _serial(tasks: Sequence[tuple[Hashable, tuple]], fn: Callable[..., Any]) -> Iterator[Outcome]:
    for key, args in tasks:
        try:
            result = fn(*args)
        except Exception as err:  # recorded like a failed task on a worker
            yield key, None, err
        else:
            yield key, result, None


def _on_cluster(tasks: Sequence[tuple[Hashable, tuple]], fn: Callable[..., Any], cluster: Cluster,
                group: Callable[..., Hashable] | None) -> Iterator[Outcome]:
    from distributed import as_completed

    client = cluster.client()
    homes = _homes([group(*args) for _, args in tasks], list(client.nthreads())) if group else [{}] * len(tasks)
    futures = {client.submit(fn, *args, pure=False, **home): key for (key, args), home in zip(tasks, homes)}
    try:
        for future in as_completed(futures):
            key = futures[future]
            if future.status == "finished":
                yield key, future.result(), None
            elif future.status == "error":
                yield key, None, future.exception()
            else:  # cancelled or lost on the cluster (e.g. by another client)
                yield key, None, CancelledError(f"task {future.status} on the cluster")
            future.release()
    finally:  # interrupted, or on_result raised: drop what is still queued
        pending = [f for f in futures if f.status == "pending"]
        if pending:
            client.cancel(pending)


def _homes(groups: list[Hashable], addresses: list[str]) -> list[dict[str, Any]]:
    """``submit`` options that send the tasks of one group to one worker (loosely), the groups
    dealt to ``addresses`` in turn in the order they first appear."""
    if not addresses:  # an external cluster with no worker yet: no preference
        return [{}] * len(groups)
    home: dict[Hashable, str] = {}
    for g in groups:
        home.setdefault(g, addresses[len(home) % len(addresses)])
    return [{"workers": [home[g]], "allow_other_workers": True} for g in groups]


def worker_env() -> dict[str, str]:
    """The environment of a local cluster's workers: :data:`WORKER_ENV`, its ``XLA_FLAGS`` after
    those of this process, and this process's persistent compilation cache when it is on (read when a worker
    imports JAX): the workers then load the programs that this process, another worker or an earlier run
    compiled (:mod:`singleloc.runtime._compilation`)."""
    flags = " ".join(filter(None, (os.environ.get("XLA_FLAGS", ""), WORKER_ENV["XLA_FLAGS"])))
    env = {**WORKER_ENV, "XLA_FLAGS": flags}
    jax = sys.modules.get("jax")  # not imported: no cache turned on here (the environment is inherited)
    if jax is not None and jax.config.jax_compilation_cache_dir:
        env.update(JAX_COMPILATION_CACHE_DIR=str(jax.config.jax_compilation_cache_dir),
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=str(jax.config.jax_persistent_cache_min_compile_time_secs),
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=str(jax.config.jax_persistent_cache_min_entry_size_bytes))
    return env


async def _worker_log_level(level: int) -> None:  # a coroutine: Client.run(..., wait=False) takes only those
    """Dask's log level in a local worker (run on each): errors only as the cluster starts (a busy worker logs
    "event loop unresponsive" warnings; the errors of tasks come back with the task), none as it closes after
    Ctrl-C (a worker whose scheduler has gone logs every failed heartbeat with its traceback)."""
    logging.getLogger("distributed").setLevel(level)


_DASK_LEVEL: list[int] = []  # the level of Dask's logger while it is silenced


def _silence_dask_logging() -> None:
    """Turn off Dask's log lines in this process (where a local cluster's scheduler and nannies live) until
    :func:`_restore_dask_logging`: after Ctrl-C, every cancelled task and stopped worker would log a traceback."""
    logger = logging.getLogger("distributed")
    if not _DASK_LEVEL:
        _DASK_LEVEL.append(logger.level)
    logger.setLevel(logging.CRITICAL + 1)


def _restore_dask_logging() -> None:
    if _DASK_LEVEL:
        logging.getLogger("distributed").setLevel(_DASK_LEVEL.pop())


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _signal_taken(signum: int, handler) -> Iterator[None]:
    """Within the block, ``handler`` takes the signal ``signum`` (:func:`_interrupt`: SIGTERM raises
    :class:`KeyboardInterrupt` like Ctrl-C, so that the cleanup runs). Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)

"""Factories shared by the test modules (x64 is switched on once, in conftest.py).

* :func:`random_overlaps`: the order parameters ``(M, Q, b)`` of a valid layer, drawn at random;
* :func:`weights_with_overlaps`: finite-D keys whose overlaps are exactly given ones;
* :func:`finite_windows`: many independent finite-D SGD windows from one trained-like state (the drift's and the
  SDE's Monte Carlo);
* :func:`full_disk_after`: a disk that fills after some files; :func:`one_line`: a failed command's one line;
  :func:`interrupt`: a process sent Ctrl-C;
* the sweeps' stand-ins: :func:`fake_prediction`, :func:`fake_bayes`, and :func:`read_csv` of a sweep's table.
"""

from __future__ import annotations

import csv
import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from singleloc import load_config
from singleloc.analysis._predictions import EscapePrediction, escape_horizon


def random_overlaps(rng: np.random.Generator, H: int, F: int, *, m: float, r: float, b: float):
    """``M = m Z_1`` (H, F), ``Q = M M^T + r^2 Z_2 Z_2^T`` (so ``R_orth = Q - M M^T`` is PSD) and
    ``b = b Z_3`` (H,), with standard normal ``Z_1, Z_2, Z_3`` drawn from ``rng`` in that order."""
    M = m * rng.standard_normal((H, F))
    A = r * rng.standard_normal((H, H))
    Q = M @ M.T + A @ A.T
    return M, (Q + Q.T) / 2, b * rng.standard_normal(H)


def weights_with_overlaps(rng: np.random.Generator, M, Q, D: int, orthogonal_spikes):
    """Keys K (H, D) with K k*^T / D = M and K K^T / D = Q exactly, and the spikes k* (F, D)
    (``K = M k* + C Z``, ``C C^T = R_orth = Q - M M^T`` from its eigendecomposition, rounding's negative eigenvalues
    clipped, ``Z`` drawn orthogonal to the spikes with rows of squared norm ``D``). ``orthogonal_spikes(rng, F, D)``
    draws the spikes (the conftest fixture)."""
    H, F = M.shape
    kstar = orthogonal_spikes(rng, F, D)
    basis, _ = np.linalg.qr(np.concatenate([kstar.T, rng.standard_normal((D, H))], axis=1))
    w, v = np.linalg.eigh(Q - M @ M.T)
    K = M @ kstar + (v * np.sqrt(np.clip(w, 0.0, None))) @ (np.sqrt(D) * basis[:, F:].T)
    assert np.allclose(K @ kstar.T / D, M, atol=1e-10) and np.allclose(K @ K.T / D, Q, atol=1e-10)
    return K, kstar


@functools.cache  # the same windows computed once per process (tests/test_momentum.py, test_training_variants.py)
def finite_windows(cfg, n: int, *, t: int = 0, steps: int = 1, flush: int = 0):
    """``(y0, v)``: the flat state ``(M, Q, b)`` (float64, biases trained) of a fixed trained-like layer of 2 heads
    and 2 spikes (spike overlaps ``[[1.2, 0.2], [0.1, 0.9]]`` of the simulator's spikes, an orthogonal part of
    scale 0.6, biases ``(0.3, -0.4)``), and ``D / steps`` times the change of the flat state by ``n`` independent
    windows from it (n, dim): each window is the simulator's steps ``t .. t + steps`` from the rule's initial state
    (a zero velocity), fed the sequences of ``PRNGKey(5)``'s ``n`` keys, then ``flush`` steps of the rule with
    zero gradients, which deliver what a momentum's velocity still holds (and nothing for the other rules).
    Computed once per process for the same arguments (``v`` read-only)."""
    import jax
    import jax.numpy as jnp

    import singleloc as sl
    from singleloc.preflight._build import build
    from singleloc.simulation._simulation import _run_functions
    from singleloc.theory._theory import flatten_state

    init, advance, _ = _run_functions(build(cfg, theory=False))
    ((K0, b0, _), state0), (kstar, _, test) = init(0)
    D, rule = cfg.simulation.D, sl.sgd_rule(cfg.sgd, cfg.model)
    orth = jax.random.normal(jax.random.PRNGKey(11), K0.shape, K0.dtype)
    orth = 0.6 * (orth - (orth @ kstar.T / D) @ kstar)
    K = (jnp.array([[1.2, 0.2], [0.1, 0.9]], K0.dtype) @ kstar + orth).astype(K0.dtype)
    b = jnp.array([0.3, -0.4], b0.dtype)
    zero = sl.LayerParameters(jnp.zeros_like(K), jnp.zeros_like(b))

    def flat(params):
        K, ks = params.K.astype(jnp.float64), kstar.astype(jnp.float64)
        return flatten_state(K @ ks.T / D, K @ K.T / D, params.b.astype(jnp.float64), True)

    def window(key):
        state = advance((sl.LayerParameters(K, b), state0), (kstar, key, test), t, t + steps)
        state = jax.lax.fori_loop(0, flush, lambda _, s: rule.step(0.0, s[0], zero, s[1], D), state)
        return flat(state[0])

    y0 = flat(sl.LayerParameters(K, b))
    v = D / steps * (np.asarray(jax.jit(jax.vmap(window))(jax.random.split(jax.random.PRNGKey(5), n))) - np.asarray(y0))
    v.setflags(write=False)
    return y0, v


def full_disk_after(monkeypatch, files_written: int, code: int | None = None) -> list:
    """Make the disk full after ``files_written`` more files: every later file that
    :func:`singleloc.ground._atomic_files.atomic_write` creates is created (so its clean-up is tested) but
    written to ``/dev/full`` (each write fails with ENOSPC); with ``code`` (e.g. ``errno.EROFS``,
    ``errno.EACCES``) creating it fails with that error instead (a read-only folder). Returns
    the list of the paths created, in order."""
    import errno
    import os

    from singleloc.ground import _atomic_files

    real = _atomic_files._create
    created = []

    def create(path, mode):
        created.append(path)
        if len(created) <= files_written:
            return real(path, mode)
        if code is not None:
            raise OSError(code, os.strerror(code), str(path))
        os.close(real(path, mode))
        return os.open("/dev/full", os.O_RDWR)

    assert errno.ENOSPC and os.path.exists("/dev/full")
    monkeypatch.setattr(_atomic_files, "_create", create)
    return created


def one_line(capsys, command: str, kind: str = "error") -> str:
    """The single line a failed command printed on stderr (and nothing else, no traceback)."""
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith(f"singleloc {command}: {kind}"), lines[0]
    return lines[0]


def interrupt(args, tmp_path, wait_for=None, delay=0.0, limit=10.0, env=None, group=None):
    """Start ``python ARGS`` (SIGINT at its default, as in a terminal; ``env``: its environment), send
    SIGINT once its stderr shows ``wait_for`` (then ``delay`` seconds), and return (exit code, seconds
    until it ended, stderr). ``group = n``: SIGINT to its whole process group, as a terminal's Ctrl-C, once the
    group holds ``n`` processes besides it (then ``delay``); the group must be empty a few seconds later."""
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            start_new_session=group is not None)
    seen = ""
    while wait_for is not None and wait_for not in seen:
        line = proc.stderr.readline()
        assert line, f"ended before {wait_for!r}: {seen}"
        seen += line
    while group is not None and len(_group(proc.pid)) <= group and proc.poll() is None:
        time.sleep(0.02)
    time.sleep(delay)
    start = time.monotonic()
    send = proc.send_signal if group is None else (lambda sig: os.killpg(proc.pid, sig))
    send(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"still running {limit} s after Ctrl-C")
    ended = time.monotonic() - start
    while group is not None and _group(proc.pid) and time.monotonic() < start + limit:
        time.sleep(0.1)
    assert group is None or not _group(proc.pid), f"processes of the group left running: {_group(proc.pid)}"
    return proc.returncode, ended, seen + err


def _group(pgid: int) -> list[int]:
    """The live processes of the process group ``pgid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry))
    return found


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def fake_prediction(config):
    """An escape predicted at tau = 40 (rate 0.1) for H >= 2, none for H = 1."""
    esc = 40.0 if config.model.heads > 1 else np.inf
    return EscapePrediction(rate=0.1 if config.model.heads > 1 else np.nan, tau_plateau=5.0, plateau_risk=0.3,
                            predicted_escape=esc, horizon=escape_horizon(esc), D=config.simulation.D,
                            path_tau=np.array([5.0, 40.0]), path_rate=np.array([0.1, 0.1])).arrays()


def fake_bayes(config):
    """A Bayes risk of 0.01 F (with an error of 1e-6) for a problem with F spikes; it must see the problem only."""
    assert config.to_dict()["model"] == load_config("default").to_dict()["model"]  # one entry per problem
    return {"bayes_risk": np.asarray(0.01 * config.problem.F), "bayes_risk_error": np.asarray(1e-6),
            "bayes_route": np.asarray("exact")}

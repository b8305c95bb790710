"""Integration of the order-parameter ODE with diffrax.

The state is ``(M, Q, b)``; the vector field is :meth:`OrderParameterODE.drift`. The solver
is Tsit5 with a PID step-size controller (``theory.rtol``, ``theory.atol``), saving on the
config's time grid. A terminating event stops the solve when the state stops being a valid
set of overlaps: a non-finite entry, runaway keys (``max |Q| > 1e6``), or ``R_orth = Q - M M^T``
leaving the PSD cone; :func:`integrate` then raises with the time at which it happened.

Initial conditions are the overlaps of a real D-dimensional initialisation
(:func:`~singleloc.initial_overlaps` with the config's ``simulation.seed`` and ``D``), the
same weights the simulator starts from, so that ``M(0) = O(1/sqrt(D))`` as in a finite run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._config import Config
from ._data import initial_overlaps
from ._io import save_run
from ._numerics import Q_RUNAWAY
from ._theory import OrderParameterODE, OrderParameters, r_orth

_PSD_SLACK = 1e-6


@dataclasses.dataclass(frozen=True)
class TheoryResult:
    """ODE trajectories of ``S`` initial conditions at ``T`` saved times.

    ``tau`` (T,), ``M`` (S, T, H, F), ``Q`` (S, T, H, H), ``b`` (S, T, H), ``risk`` (S, T).
    ``theory.npz`` stores the first trajectory with the leading ``S`` axis dropped.
    """

    tau: np.ndarray
    M: np.ndarray
    Q: np.ndarray
    b: np.ndarray
    risk: np.ndarray

    def arrays(self, index: int = 0) -> dict[str, np.ndarray]:
        return {"tau": self.tau, "M": self.M[index], "Q": self.Q[index], "b": self.b[index], "risk": self.risk[index]}

    def save(self, directory: str | Path, config: Config, index: int = 0) -> Path:
        """Write the run folder ``DIR``: ``theory.npz`` (trajectory ``index``) and ``config.json``,
        replacing ``DIR`` as a whole (:func:`singleloc.save_run`); returns ``DIR/theory.npz``."""
        return save_run(directory, config, {"theory.npz": self.arrays(index)}) / "theory.npz"


def _invalid_state(t, y, args, **kwargs):
    M, Q, b = y
    finite = jnp.all(jnp.isfinite(M)) & jnp.all(jnp.isfinite(Q)) & jnp.all(jnp.isfinite(b))
    scale = 1.0 + jnp.max(jnp.abs(jnp.where(jnp.isfinite(Q), Q, 0.0)))
    min_eig = jnp.min(jnp.linalg.eigvalsh(jnp.where(finite, r_orth(M, Q), 0.0)))
    return (~finite) | (scale > Q_RUNAWAY) | (min_eig < -_PSD_SLACK * scale)


def _solve(ode: OrderParameterODE, y0: OrderParameters, ts: jax.Array, rtol: float, atol: float, max_steps: int, progress: bool):
    term = diffrax.ODETerm(lambda t, y, args: ode.drift(*y))
    sol = diffrax.diffeqsolve(
        term,
        diffrax.Tsit5(),
        t0=ts[0],
        t1=ts[-1],
        dt0=None,
        y0=y0,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        event=diffrax.Event(_invalid_state),
        max_steps=max_steps,
        throw=False,
        progress_meter=diffrax.TqdmProgressMeter() if progress else diffrax.NoProgressMeter(),
    )
    M, Q, b = sol.ys
    risk = jax.vmap(lambda m, q, bb: jnp.where(jnp.isfinite(q).all(), ode.risk(m, q, bb), jnp.nan))(M, Q, b)
    return M, Q, b, risk, sol.result == diffrax.RESULTS.successful


@eqx.filter_jit
def _solve_batch(ode, y0, ts, rtol, atol, max_steps, progress):
    return jax.vmap(lambda y: _solve(ode, y, ts, rtol, atol, max_steps, progress))(y0)


def initial_conditions(config: Config, seeds: int | None = None) -> OrderParameters:
    """Overlaps ``(M0, Q0, b0)`` of the simulator's initial weights for seeds ``0..seeds-1``
    (``simulation.seeds`` by default), stacked along a leading axis."""
    pb, sim, sgd, H = config.problem, config.simulation, config.sgd, config.model.heads
    n = sim.seeds if seeds is None else seeds
    Ms, Qs = zip(*(initial_overlaps(sim.seed, s, pb.F, H, sim.D, sgd.init_scale) for s in range(n)))
    b = jnp.full((n, H), config.model.bias_init)
    return OrderParameters(jnp.stack(Ms), jnp.stack(Qs), b)


def integrate(
    config: Config,
    y0: OrderParameters | None = None,
    *,
    ts: np.ndarray | None = None,
    max_steps: int = 100_000,
    progress: bool = True,
) -> TheoryResult:
    """Integrate the order-parameter ODE for one or several initial conditions.

    Args:
        config: the resolved configuration.
        y0: initial ``(M0, Q0, b0)``, each with a leading batch axis ``S`` (or none, for one
            start). Default: the overlaps of seed 0 of the simulator's initialisation.
        ts: saved times (default: the config's ``sgd`` grid).
        max_steps: cap on the number of solver steps.
        progress: show diffrax's progress bar.

    Raises:
        FloatingPointError: the state left the set of valid overlaps (non-finite, runaway
            keys, or ``R_orth`` not PSD); the message gives the time and suggests a remedy.
    """
    if y0 is None:
        y0 = initial_conditions(config, 1)
    y0 = OrderParameters(*(jnp.asarray(x, dtype=jnp.result_type(float)) for x in y0))
    single = y0.M.ndim == 2
    if single:
        y0 = OrderParameters(*(x[None] for x in y0))
    _check_initial(config, y0)
    ts = jnp.asarray(config.sgd.save_times() if ts is None else ts, dtype=y0.M.dtype)
    ode = OrderParameterODE.from_config(config)
    th = config.theory
    M, Q, b, risk, ok = jax.device_get(_solve_batch(ode, y0, ts, th.rtol, th.atol, max_steps, progress))
    valid = np.isfinite(risk)
    if not np.all(ok) or not np.all(valid):
        i = int(np.argmin(np.all(valid, axis=1) & ok))
        k = int(np.argmin(valid[i])) if not np.all(valid[i]) else len(ts) - 1
        raise FloatingPointError(
            f"the order-parameter ODE stopped at tau = {float(ts[k - 1]) if k else 0.0:.4g}..{float(ts[k]):.4g} (start {i}): "
            f"the state left the set of valid overlaps (non-finite values, runaway keys with max |Q| > {Q_RUNAWAY:g}, or "
            f"R_orth = Q - M M^T not PSD) or the solver ran out of steps (max_steps = {max_steps}); lower sgd.lr (now "
            f"{config.sgd.lr}) or tighten theory.rtol/theory.atol"
        )
    return TheoryResult(np.asarray(ts), M, Q, b, risk)


def _check_initial(config: Config, y0: OrderParameters) -> None:
    H, F = config.model.heads, config.problem.F
    S = y0.M.shape[0]
    for name, x, shape in (("M0", y0.M, (S, H, F)), ("Q0", y0.Q, (S, H, H)), ("b0", y0.b, (S, H))):
        if x.shape != shape:
            raise ValueError(f"{name} must have shape {shape[1:]} (model.heads = {H}, problem.F = {F}), got {x.shape[1:]}")
        if not np.all(np.isfinite(np.asarray(x))):
            raise ValueError(f"{name} must be finite")
    Q = np.asarray(y0.Q)
    if not np.allclose(Q, np.swapaxes(Q, -1, -2), atol=1e-10):
        raise ValueError("Q0 must be symmetric")
    R = Q - np.asarray(y0.M) @ np.swapaxes(np.asarray(y0.M), -1, -2)
    if np.min(np.linalg.eigvalsh(R)) < -1e-8 * (1 + np.abs(Q).max()):
        raise ValueError("Q0 - M0 M0^T must be positive semi-definite (the overlaps of real keys)")

"""The starts of the order-parameter ODE: the overlaps of the simulator's initial weights (a real D-dimensional
initialisation, :func:`~singleloc.initial_overlaps`), so that ``M(0) = O(1/sqrt(D))`` as in a finite run.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..configuration._config import Config, gather_specs
from ..configuration._specs import SGD, Model, Problem, Simulation
from ..model._data import initial_overlaps
from ..runtime._numerics import PSD_INPUT
from ..sgd._head_weighting import OrderParameters


@eqx.filter_jit
def _initial_overlaps(seed: int, indices: jax.Array, F: int, H: int, D: int, init_scale: float):
    return jax.vmap(lambda s: initial_overlaps(seed, s, F, H, D, init_scale))(indices)


def initial_conditions(config: Config | None = None, seeds: int | None = None, *, problem: Problem | None = None,
                       model: Model | None = None, sgd: SGD | None = None, simulation: Simulation | None = None
                       ) -> OrderParameters:
    """Overlaps ``(M0, Q0, b0)`` of the simulator's initial weights for seeds ``0..seeds-1``
    (``simulation.seeds`` by default), stacked along a leading axis (one program for all
    seeds; the same bits as the simulator's own initialisation), in the state of the layer's head
    weighting (with trained head weights :class:`~singleloc.WeightedOrderParameters` with ``v0 = 1/H``).

    The run is ``config`` or the specifications by keyword (``problem``: ``F``; ``model``: the
    heads, ``bias_init``, ``head_weights``; ``sgd``: ``init_scale``; ``simulation``: ``D``,
    ``seed``, ``seeds``), defaults for those not given (:func:`~singleloc.configuration._config.gather_specs`)."""
    config = gather_specs("initial_conditions", config, problem=problem, model=model, sgd=sgd, simulation=simulation)
    pb, sim, sgd, H = config.problem, config.simulation, config.sgd, config.model.heads
    n = sim.seeds if seeds is None else seeds
    M, Q = _initial_overlaps(sim.seed, jnp.arange(n), pb.F, H, sim.D, sgd.init_scale)
    return config.model.weighting.state(OrderParameters(M, Q, jnp.full((n, H), config.model.bias_init)))


def batched_starts(y0: OrderParameters) -> OrderParameters:
    """The state ``y0`` (a weighting's ``State``) in the dtype of the solve, with a leading axis (one start: added)."""
    y0 = y0._make(jnp.asarray(x, dtype=jnp.result_type(float)) for x in y0)
    return y0._make(x[None] for x in y0) if y0.M.ndim == 2 else y0


def check_starts(H: int, F: int, y0: OrderParameters) -> None:
    """``ValueError`` naming the part of the batched starts ``y0`` (a weighting's ``State``, whose own parts are
    per-head vectors) that does not fit a layer of ``H`` heads and ``F`` spikes (shape, count of starts,
    finiteness, symmetry of ``Q0``, ``Q0 - M0 M0^T`` PSD)."""
    S = y0.M.shape[0]
    parts = (("M0", y0.M, (S, H, F)), ("Q0", y0.Q, (S, H, H)), ("b0", y0.b, (S, H)))
    for name, x, shape in parts + tuple((f"{field}0", x, (S, H)) for field, x in zip(y0._fields[3:], y0[3:])):
        if x.shape[1:] == shape[1:] and x.shape[0] != S:  # shapes right, counts of starts not
            raise ValueError(f"{name} holds {x.shape[0]} start(s) but M0 holds {S}: give every part of y0 the same leading "
                             f"number of starts, e.g. {name} of shape {shape}")
        if x.shape != shape:
            raise ValueError(f"{name} must have shape {shape[1:]} (model.heads = {H}, problem.F = {F}), got {x.shape[1:]}")
        if not np.all(np.isfinite(np.asarray(x))):
            raise ValueError(f"{name} must be finite")
    Q = np.asarray(y0.Q)
    if not np.allclose(Q, np.swapaxes(Q, -1, -2), atol=1e-10):
        raise ValueError("Q0 must be symmetric")
    R = Q - np.asarray(y0.M) @ np.swapaxes(np.asarray(y0.M), -1, -2)
    if np.min(np.linalg.eigvalsh(R)) < -PSD_INPUT * (1 + np.abs(Q).max()):
        raise ValueError("Q0 - M0 M0^T must be positive semi-definite (the overlaps of real keys)")

"""Finite-D fluctuations of the order parameters: an SDE around the ODE of docs/model.md section 5.

One SGD step changes the order parameters by ``U / D``, with, for one fresh sequence and plain online SGD (the SGD
rule's :meth:`~singleloc.OnlineSGD.update`, :mod:`~singleloc.sgd._sgd_rule`),

    U = -lr ( sum_l c_l nu_l^T  (H, F),   sum_l (c_l g_l^T + g_l c_l^T) - lr sum_l c_l c_l^T  (H, H),   sum_l c_l  (H) )

(the last term of the ``Q`` block is the Gram matrix of the step, ``lr^2 / D`` times ``sum_l c_l c_l^T``; its mean is
the ``lr^2`` term of the drift). For the training variants (docs/model.md section 11) ``U`` is the rule's update of one
sequence at the rate per sequence (``lr(tau) / B``, divided by ``1 - beta`` with momentum, whose echo sums to that of
one such step) with the decay: a step of ``B`` sequences adds ``B`` independent such updates, and ``tau`` counts
sequences, so the SDE below holds for every batch size and momentum. Over ``d tau`` there are ``D d tau`` independent
steps, so the state ``y = (M, Q, b)`` (flattened as :func:`singleloc.theory._theory.flatten_state`) follows, to leading
order in ``1/D``,

    dy = drift(y) d tau + sqrt(Sigma(y) / D) dW,      drift = E[U],   Sigma = Cov(U):

the per-step update covariance of the order parameters divided by D (per unit time).

``Cov(U)`` is an expectation over the local fields like the drift. ``nu_l`` is never drawn: given the head fields it is
Gaussian with mean ``theta 1[l = 0] + M^T (Q^+)^{1/2} w_l`` and covariance ``I - M^T Q^+ M``; the mean enters ``U`` and
the covariance adds ``lr^2 E[sum_l c_l c_l^T] (x) (I - M^T Q^+ M)`` to the ``M`` block
(:meth:`~singleloc.OnlineSGD.update_covariance`).

:func:`integrate_sde` integrates the SDE with diffrax (Euler-Maruyama on a ``VirtualBrownianTree``), one Brownian path
per key, batched with ``vmap``. Drift and diffusion come from one evaluation of :func:`update_moments` per step
(:class:`_SDETerm`): one pass over the rule's nodes, whose mean update is the drift (on the Sobol rule).
"""

from __future__ import annotations

import dataclasses

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Shaped

from ..configuration._config import require_uniform_head_weights
from ..expectations._fields import LocalFields
from ..expectations._sobol_expectation import SobolExpectation
from ..preflight._build import Setup
from ..runtime._compilation import checks_as_nan
from ..runtime._numerics import psd_sqrt
from ..sgd._sgd_rule import Starts
from ._accuracy import resolve_points
from ._theory import OrderParameterODE, flatten_state, unflatten_state
from ._trajectory import Trajectory


def update_moments(ode: OrderParameterODE, M, Q, b, tau=0.0, fields: LocalFields | None = None):
    """``(drift, Sigma)`` at ``(M, Q, b)`` and time ``tau``: the drift over :func:`flatten_state` coordinates and
    ``Sigma = Cov(U)`` (n, n), the per-step update covariance times ``D^2`` (so the diffusion per unit time is ``Sigma /
    D``), both from the SGD rule's update ``U`` of one sequence (:meth:`~singleloc.OnlineSGD.update`,
    :meth:`~singleloc.OnlineSGD.update_covariance`) on one pass over the rule's nodes.

    On the Sobol rule the drift is ``E[U]`` of that same pass (it equals :meth:`~singleloc.OrderParameterODE.drift` up
    to rounding, about 1e-16 relative: the same average over the same nodes); on the exact route it is the ODE's own
    drift (the exact risk's gradient, no second pass over these nodes), so that the SDE's mean is the ODE. ``fields``:
    the Sobol rule of the second moments, by default the route's own
    (:attr:`~singleloc.expectations._expectation.AbstractExpectation.sde_rule`; the exact route has none:
    :func:`integrate_sde` builds the rule route's, on the coordinates of ``theory.axes``)."""
    F = M.shape[1]
    rule = ode.sgd
    tb = bool(rule.train_bias)
    fields = ode.expectation.sde_rule if fields is None else fields
    S, T = fields.factors(Q)  # g_l = w_l S, T = S Q^+
    A = T @ M  # (H, F): nu_bar_l = theta 1[l=0] + A^T w_l

    def integrand(g, theta, w):
        c = jax.grad(ode.expectation.loss)(g.T + b[:, None])  # (H, L)
        nu = w @ A
        nu = nu.at[0].add(theta)
        U = rule.update(tau, M, Q, b, c, g, nu)
        u = flatten_state(U.M, U.Q, U.b, tb)
        return {"u": u, "uu": jnp.outer(u, u), "cc": c @ c.T}

    m = fields.expect(integrand, M, Q, factor=S, with_noise=True)
    xi = jnp.eye(F) - M.T @ (T.T @ T) @ M  # Cov(nu | g), PSD up to rounding
    Sigma = rule.update_covariance(tau, m["u"], m["uu"], m["cc"], xi)
    if isinstance(ode.expectation, SobolExpectation):  # the drift is this pass's mean
        return m["u"], Sigma
    d = ode.drift(M, Q, b, tau)
    return flatten_state(d.M, d.Q, d.b, tb), Sigma


class _SDETerm(diffrax.AbstractTerm):
    """``dy = drift(y) dtau + sqrt(Sigma(y) / D) dW`` as one diffrax term.

    The vector field is the pair ``(drift, sqrt(Sigma / D))`` from one :func:`update_moments` call, the control the pair
    ``(dtau, dW)``, and their product ``drift dtau + sqrt(Sigma / D) dW``: a ``MultiTerm`` of an ``ODETerm`` and a
    ``ControlTerm`` would evaluate the moments once for each. ``b0`` supplies the biases when they do not train.
    """

    ode: OrderParameterODE
    fields: LocalFields
    brownian: diffrax.AbstractBrownianPath
    b0: jax.Array
    inv_D: jax.Array
    H: int = eqx.field(static=True)
    F: int = eqx.field(static=True)

    def vf(self, t, y, args):
        drift, Sigma = update_moments(self.ode, *unflatten_state(y, self.H, self.F, self.b0), t, self.fields)
        return drift, psd_sqrt(Sigma * self.inv_D)

    def contr(self, t0, t1, **kwargs):
        return t1 - t0, self.brownian.evaluate(t0, t1, **kwargs)

    def prod(self, vf, control):
        (drift, diffusion), (dt, dW) = vf, control
        return drift * dt + diffusion @ dW


@dataclasses.dataclass(frozen=True)
class SDEResult(Trajectory):
    """SDE paths (a :class:`~singleloc.Trajectory`): ``tau`` (T,), ``M`` (S, T, H, F), ``Q`` (S, T, H, H),
    ``b`` (S, T, H), ``risk`` (S, T) (the population risk of each state)."""


@eqx.filter_jit
def _solve_paths(ode: OrderParameterODE, fields: LocalFields, v0, b0, keys, inv_D, ts, dt: float, H: int, F: int,
                 max_steps: int):
    """Euler-Maruyama paths from the flat states ``v0``, one per key: ``(M, Q, b, risk)`` at ``ts``."""

    def path(v0, b0, key, inv_D):
        bm = diffrax.VirtualBrownianTree(ts[0], ts[-1], tol=dt / 4, shape=(v0.shape[0],), key=key)
        sol = diffrax.diffeqsolve(_SDETerm(ode, fields, bm, b0, inv_D, H, F), diffrax.Euler(), ts[0], ts[-1], dt, v0,
                                  saveat=diffrax.SaveAt(ts=ts), max_steps=max_steps)
        Ms, Qs, bs = jax.vmap(lambda v: unflatten_state(v, H, F, b0))(sol.ys)
        bs = bs if ode.train_bias else jnp.broadcast_to(b0, (len(ts), H))
        return Ms, Qs, bs, jax.vmap(ode.risk)(Ms, Qs, bs)

    return jax.vmap(path)(v0, b0, keys, inv_D)


def integrate_sde(setup: Setup, y0: Starts, keys: Shaped[jax.Array, "S ..."], *, D=None, ts=None,
                  dt: float = 0.05) -> SDEResult:
    """Integrate the fluctuation SDE from initial states ``y0`` (an ``OrderParameters`` with a leading axis S) with one
    Brownian path per PRNG key (``keys`` (S, 2)), at dimension ``D`` (default ``simulation.D``; a scalar or one value
    per path), saving at ``ts`` (default the ``sgd`` section's grid), for the run ``setup`` (:func:`~singleloc.build`).

    Euler-Maruyama with step ``dt`` on a ``diffrax.VirtualBrownianTree`` (tolerance ``dt/4``). ``Q`` is symmetrised
    through the flattened coordinates; the state is not projected back onto valid overlaps (at the D used here the noise
    is far too small to leave them). ``theory.points = "auto"`` is resolved at the starts ``y0``
    (:func:`~singleloc.resolve_points`).
    """
    require_uniform_head_weights(setup.model, "integrate_sde")
    setup = resolve_points(setup, y0)
    D, H, F, dtype = setup.simulation.D if D is None else D, setup.heads, setup.problem.F, jnp.result_type(float)
    ode = OrderParameterODE.from_setup(setup)
    fields = SobolExpectation.from_setup(setup, points=setup.theory.points).fields  # the rule route's, whatever the drift's
    tb = bool(ode.train_bias)
    ts = np.asarray(setup.sgd.save_times() if ts is None else ts, float)
    max_steps = int(np.ceil((ts[-1] - ts[0]) / dt)) + 10
    b0 = jnp.asarray(y0.b, dtype)
    v0 = jax.vmap(lambda M, Q, b: flatten_state(M, Q, b, tb))(jnp.asarray(y0.M, dtype), jnp.asarray(y0.Q, dtype), b0)
    inv_D = jnp.broadcast_to(1.0 / jnp.asarray(D, dtype), (v0.shape[0],))
    with checks_as_nan():  # a failed path is NaN, reported below in one line
        paths = _solve_paths(ode, fields, v0, b0, jnp.asarray(keys), inv_D, jnp.asarray(ts, dtype), float(dt), H, F,
                             max_steps)
    Ms, Qs, bs, risk = jax.device_get(paths)
    bad = ~np.all(np.isfinite(Qs), axis=(1, 2, 3))
    if bad.any():  # diffrax reports failures as NaN (singleloc.runtime._compilation.checks_as_nan)
        first = int(np.argmax(bad))
        tau = ts[int(np.argmax(~np.isfinite(Qs[first]).all(axis=(1, 2))))]
        raise FloatingPointError(f"SDE path {first} stopped being finite by tau = {tau:.4g} (sgd.lr = {setup.sgd.lr}, "
                                 f"dt = {dt}); lower sgd.lr or dt")
    return SDEResult(ts, np.asarray(Ms), np.asarray(Qs), np.asarray(bs), np.asarray(risk))

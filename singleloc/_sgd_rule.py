"""Online SGD: the one rule behind the simulator, the ODE and the SDE (docs/model.md section 5).

Step ``t`` (time ``tau = t / D``) draws one fresh sequence and updates the keys and biases,

    k_h <- k_h - lr grad_{k_h} l_D,        b_h <- b_h - (lr / D) dl_D/db_h   (when biases train),

:meth:`OnlineSGD.step`, the finite-D update the simulator applies. In order parameters
(docs/model.md section 5.2) the step changes ``(M, Q, b)`` by ``U / D`` with, to leading order
in ``1/D``,

    U = ( -lr sum_l c_l nu_l^T,   -lr sum_l (c_l g_l^T + g_l c_l^T) + lr^2 sum_l c_l c_l^T,   -lr sum_l c_l )

(``c = dl_inf/ds`` (H, L) the gradient of the limit loss at the scores, ``g`` (L, H) the head
fields and ``nu`` (L, F) the spike fields of the sequence; the ``lr^2`` term is the Gram matrix
of the step): :meth:`OnlineSGD.update`, one sequence's update. Over ``d tau`` there are
``D d tau`` independent steps, so the order parameters follow

    drift = E[U]            (:meth:`OnlineSGD.drift`, the ODE's vector field),
    Sigma = Cov(U)          (:meth:`OnlineSGD.update_covariance`, the SDE's),

``Sigma`` being the per-step update covariance times ``D^2`` (the diffusion per unit time is
``Sigma / D``). ``U`` is linear in the products ``c nu^T``, ``c g^T``, ``c``, ``c c^T``, so the
drift is the same map applied to their field averages, :class:`GradientMoments`, which the ODE
computes on either route (the Sobol rule, or the exact risk's gradient plus the rule's Gram
term: :meth:`~singleloc.OrderParameterODE.gradient_moments`).

Every view takes the time ``tau`` (``learning_rate(tau)``: constant here), so that a schedule
changes one method. A variant of the algorithm (mini-batches, weight decay, a learning-rate
schedule) is a subclass overriding the views it changes, and one config field read by
:func:`sgd_rule`; the simulator (:mod:`~singleloc._simulation`), the ODE
(:mod:`~singleloc._theory`) and the SDE (:mod:`~singleloc._fluctuations`) call the rule and
nothing else, so the cross-checks (the SDE's covariance against single SGD steps,
``tests/test_fluctuations.py``; the ODE against the simulation, ``tests/test_simulation.py``)
test every variant.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from ._config import Config


class OrderParameters(NamedTuple):
    """``M`` (H, F) head-spike overlaps, ``Q`` (H, H) head-head overlaps, ``b`` (H,) biases."""

    M: jax.Array
    Q: jax.Array
    b: jax.Array


class GradientMoments(NamedTuple):
    """Field averages of the limit loss's gradient ``c`` (H, L) that the drift of online SGD is made
    of: ``cnu = E[sum_l c_l nu_l^T]`` (H, F), ``cg = E[sum_l c_l g_l^T]`` (H, H), ``c =
    E[sum_l c_l]`` (H,) and ``cc = E[sum_l c_l c_l^T]`` (H, H). For one sequence (no average) they
    are the products themselves."""

    cnu: jax.Array
    cg: jax.Array
    c: jax.Array
    cc: jax.Array


class OnlineSGD(eqx.Module):
    """Plain online SGD, one fresh sequence per step, at the constant learning rate ``lr``
    (module docstring). ``train_bias``: whether the biases follow their gradient.

    ``lr`` is a float for the simulator (its update then rounds as ``k - lr * g`` in the keys'
    precision) and an array in :class:`~singleloc.OrderParameterODE` (a value its compiled
    programs receive).
    """

    lr: float | jax.Array
    train_bias: bool = eqx.field(static=True, default=False)

    def learning_rate(self, tau) -> float | jax.Array:
        """The learning rate at time ``tau``: ``lr``."""
        return self.lr

    def step(self, tau, K: jax.Array, b: jax.Array, gK: jax.Array, gb: jax.Array, D: int) -> tuple[jax.Array, jax.Array]:
        """The finite-D step at time ``tau``: the keys ``K`` (H, D) and biases ``b`` (H,) after one
        sequence whose loss ``l_D`` has the gradients ``gK``, ``gb``:
        ``K - lr gK`` and ``b - (lr / D) gb`` (``b`` when the biases do not train)."""
        lr = self.learning_rate(tau)
        return K - lr * gK, (b - (lr / D) * gb) if self.train_bias else b

    def update(self, tau, M, Q, b, c: jax.Array, g: jax.Array, nu: jax.Array) -> OrderParameters:
        """``U``, ``D`` times the change of ``(M, Q, b)`` by one step at time ``tau`` on one sequence
        with loss gradient ``c`` (H, L), head fields ``g`` (L, H) and spike fields ``nu`` (L, F),
        at the state ``(M, Q, b)`` (module docstring; the ``b`` block is 0 when the biases do not
        train)."""
        return self._increment(tau, GradientMoments(c @ nu, c @ g, jnp.sum(c, axis=1), c @ c.T), b)

    def drift(self, tau, M, Q, b, moments: GradientMoments) -> OrderParameters:
        """``E[U] = (dM, dQ, db) / dtau`` at time ``tau`` and state ``(M, Q, b)`` from the field
        averages ``moments`` (docs/model.md section 5.3; ``dQ`` symmetrised, ``db = 0`` unless the
        biases train)."""
        d = self._increment(tau, moments, b)
        return OrderParameters(d.M, (d.Q + d.Q.T) / 2, d.b)

    def update_covariance(self, tau, mean: jax.Array, second: jax.Array, cc: jax.Array, xi: jax.Array) -> jax.Array:
        """``Sigma = Cov(U)`` (n, n) at time ``tau`` over the flattened coordinates
        (:func:`~singleloc._theory.flatten_state`), from the averages ``mean = E[U]`` and
        ``second = E[U U^T]`` of :meth:`update` taken with ``nu`` at its conditional mean given the
        head fields, ``cc = E[sum_l c_l c_l^T]`` (H, H) and ``xi`` (F, F), the conditional
        covariance of ``nu``: its part of ``U``, ``-lr sum_l c_l xi_l^T``, adds
        ``lr^2 cc (x) xi`` to the ``M`` block (docs/model.md section 5.8)."""
        lr = self.learning_rate(tau)
        n_M = cc.shape[0] * xi.shape[0]
        cov = second - jnp.outer(mean, mean)
        return cov.at[:n_M, :n_M].add(lr**2 * jnp.kron(cc, xi))

    def _increment(self, tau, m: GradientMoments, b) -> OrderParameters:
        """``U`` as the linear map of the products (or of their averages) ``m``."""
        lr = self.learning_rate(tau)
        dM = -lr * m.cnu
        dQ = -lr * (m.cg + m.cg.T) + lr**2 * m.cc
        db = -lr * m.c if self.train_bias else jnp.zeros_like(b)
        return OrderParameters(dM, dQ, db)


def sgd_rule(config: Config) -> OnlineSGD:
    """The SGD rule of a configuration: :class:`OnlineSGD` at ``sgd.lr``, the biases training
    with ``model.train_bias`` (a variant adds its config field and its branch here)."""
    return OnlineSGD(config.sgd.lr, config.model.train_bias)

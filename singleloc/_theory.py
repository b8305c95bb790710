"""Population risk and the order-parameter drift of MODEL.md section 5, by autodiff.

Write ``f(s) = l_inf(s)`` for the limit loss as a function of the scores ``s`` (H, L) with
the relevant token at 0, and ``c = df/ds`` (autodiff). MODEL.md's drift,

    dM/dtau  = -lr E[sum_l c_l nu_l^T]
    dQ/dtau  = -lr E[sum_l (c_l g_l^T + g_l c_l^T)] + lr^2 E[sum_l c_l c_l^T]
    db/dtau  = -lr E[sum_l c_l]                      (only when biases train),

is evaluated without ever drawing ``nu``. Given ``theta``, ``(g_l, nu_l)`` is Gaussian with
``Cov(g_l, nu_l) = M`` and ``Cov(g_l) = Q``, and ``g_0`` carries the mean ``M theta``. Stein's
lemma ``E[c(g) z] = Cov(z, g) E[grad_g c]`` then gives, with

    P = E[c_0 theta^T]  (H, F),     B = sum_l E[d c_l / d s_l]  (H, H, the token-diagonal
                                        blocks of the Hessian of f, by autodiff),

    dM/dtau = -lr (P + B M),
    dQ/dtau = -lr (P M^T + M P^T + B Q + Q B) + lr^2 E[sum_l c_l c_l^T].

The ``O(lr)`` part is the gradient flow of the population risk ``R(M, Q, b) = E[f]`` through
the order parameters (``P = dR/dM`` and ``B = dR/dQ + dR/dQ^T``): ``tests/test_theory.py``
checks this against derivatives of ``R`` alone. Nothing here depends on the activation:
any registered activation gets its ODE from autodiff.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from ._activations import Activation, get_activation
from ._config import Config
from ._fields import LocalFields
from ._layer import limit_loss


class OrderParameters(NamedTuple):
    """``M`` (H, F) head-spike overlaps, ``Q`` (H, H) head-head overlaps, ``b`` (H,) biases."""

    M: jax.Array
    Q: jax.Array
    b: jax.Array


def r_orth(M: jax.Array, Q: jax.Array) -> jax.Array:
    """``R_orth = Q - M M^T``: Gram matrix of the key components orthogonal to the spikes."""
    return Q - M @ M.T


class OrderParameterODE(eqx.Module):
    """Population risk and drift for one problem, layer and learning rate.

    Attributes:
        fields: the quadrature rule over the local fields.
        activation: the attention activation (scores (H, L) -> weights (H, L)).
        lr: the SGD learning rate.
        train_bias: whether the biases follow their own drift.
    """

    fields: LocalFields
    activation: Activation = eqx.field(static=True)
    lr: float = eqx.field(static=True)
    train_bias: bool = eqx.field(static=True)

    @classmethod
    def from_config(cls, config: Config) -> "OrderParameterODE":
        pb, th = config.problem, config.theory
        fields = LocalFields.make(pb.L, config.model.heads, pb.build_prior(), th.points, th.qmc_seed)
        return cls(fields, get_activation(config.model.activation), config.sgd.lr, config.model.train_bias)

    def _loss(self, s: jax.Array) -> jax.Array:
        return limit_loss(self.activation, s, 0)

    def risk(self, M: jax.Array, Q: jax.Array, b: jax.Array) -> jax.Array:
        """Population risk ``R(M, Q, b) = E[(1 - a_eps)^2 + sum_{l != eps} a_l^2]``."""
        return self.fields.expect(lambda g, theta: self._loss(g.T + b[:, None]), M, Q)

    def moments(self, M: jax.Array, Q: jax.Array, b: jax.Array) -> dict[str, jax.Array]:
        """The field averages the drift is made of: ``risk``, ``c_sum`` = E[sum_l c_l] (H,),
        ``P`` (H, F), ``B`` (H, H) and ``cc`` = E[sum_l c_l c_l^T] (H, H)."""

        def integrand(g, theta):
            s = g.T + b[:, None]
            f, c = jax.value_and_grad(self._loss)(s)
            hess = jax.hessian(self._loss)(s)  # (H, L, H, L)
            return {
                "risk": f,
                "c_sum": jnp.sum(c, axis=1),
                "P": jnp.outer(c[:, 0], theta),
                "B": jnp.einsum("hlkl->hk", hess),
                "cc": c @ c.T,
            }

        return self.fields.expect(integrand, M, Q)

    def drift(self, M: jax.Array, Q: jax.Array, b: jax.Array) -> OrderParameters:
        """``(dM, dQ, db) / dtau`` of MODEL.md section 5 (``db = 0`` unless biases train)."""
        m = self.moments(M, Q, b)
        lr, P, B = self.lr, m["P"], m["B"]
        dM = -lr * (P + B @ M)
        PMt = P @ M.T
        dQ = -lr * (PMt + PMt.T + B @ Q + Q @ B) + lr**2 * m["cc"]
        db = -lr * m["c_sum"] if self.train_bias else jnp.zeros_like(b)
        return OrderParameters(dM, (dQ + dQ.T) / 2, db)

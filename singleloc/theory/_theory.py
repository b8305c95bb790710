"""The order-parameter ODE: an SGD rule applied to the field averages of an expectation route.

Write ``f(s) = l_inf(s)`` for the limit loss as a function of the scores ``s`` (H, L) with the relevant token at 0, and
``c = df/ds`` (autodiff). docs/model.md's drift is

    dM/dtau  = -lr E[sum_l c_l nu_l^T]
    dQ/dtau  = -lr E[sum_l (c_l g_l^T + g_l c_l^T)] + lr^2 E[sum_l c_l c_l^T]
    db/dtau  = -lr E[sum_l c_l]                      (only when biases train).

for plain online SGD. :class:`OrderParameterODE` is two objects: the SGD rule (:class:`~singleloc.OnlineSGD` and its
variants), which turns field averages of the loss gradient (:class:`~singleloc.GradientMoments`) into the drift, and the
expectation route (:mod:`~singleloc.expectations._expectation`), which computes those averages and the risk; each
route's module derives them.

The ``O(lr)`` part is the gradient flow of the population risk ``R(M, Q, b) = E[f]`` through the order parameters;
``tests/test_theory.py`` checks it against derivatives of ``R`` alone and against plain Monte Carlo over ``(g, nu)``.
Nothing here depends on the activation: any registered activation gets its ODE from autodiff.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import ArrayLike, Integer, Real

from ..expectations._expectation import AbstractExpectation
from ..expectations._routes import route_class
from ..ground._arguments import checked
from ..preflight._build import Setup, build
from ..runtime._numerics import require_x64
from ..sgd._head_weighting import OrderParameters
from ..sgd._sgd_rule import AbstractSGDRule, GradientMoments

if TYPE_CHECKING:
    from ..configuration._specs import SGD, Model, Problem, Theory


def r_orth(M: Real[ArrayLike, "H F"], Q: Real[ArrayLike, "H H"]) -> jax.Array:
    """``R_orth = Q - M M^T``: Gram matrix of the key components orthogonal to the spikes."""
    return Q - M @ M.T


class OrderParameterODE(eqx.Module):
    """Population risk and drift for one problem, layer and SGD rule (module docstring).

    Attributes:
        expectation: the expectation route (:class:`~singleloc.expectations._expectation.AbstractExpectation`): the
            risk and the field averages, with its statement of their error.
        sgd: the SGD rule (:mod:`~singleloc.sgd._sgd_rule`), which turns the field averages of the loss
            gradient into the drift; its numbers are arrays (values the compiled programs receive,
            so that ODEs that differ only in the learning rate share their programs).
    """

    expectation: AbstractExpectation
    sgd: AbstractSGDRule

    @checked
    def __init__(self, expectation: AbstractExpectation, sgd: AbstractSGDRule):
        self.expectation = expectation
        self.sgd = jax.tree.map(jnp.asarray, sgd)

    @property
    def activation(self):
        """The attention activation (scores (H, L) -> weights (H, L))."""
        return self.expectation.activation

    @property
    def lr(self) -> jax.Array:
        """The learning rate of the SGD rule (at ``tau = 0``)."""
        return self.sgd.learning_rate(0.0)

    @property
    def train_bias(self) -> bool:
        """Whether the biases train (the SGD rule's)."""
        return self.sgd.train_bias

    @classmethod
    @checked
    def from_specs(cls, problem: Problem | None = None, model: Model | None = None, sgd: SGD | None = None,
                   theory: Theory | None = None, *, seeds: Sequence[int] | Integer[ArrayLike, " K"] | None = None,
                   points: int | None = None,
                   check: bool = False) -> OrderParameterODE:
        """The ODE of the specifications (defaults for those not given): the data ``problem``,
        the layer ``model``, the SGD rule ``sgd`` and the numerics ``theory``; the other
        arguments as :meth:`from_setup`'s, which this is on their :func:`~singleloc.build`."""
        from ..configuration._config import gather_specs  # the edge: specifications bundled, then built once

        config = gather_specs("OrderParameterODE.from_specs", problem=problem, model=model, sgd=sgd, theory=theory)
        return cls.from_setup(build(config), seeds=seeds, points=points, check=check)

    @classmethod
    @checked
    def from_setup(cls, setup: Setup, *, seeds: Sequence[int] | Integer[ArrayLike, " K"] | None = None, points: int | None = None,
                   check: bool = False) -> OrderParameterODE:
        """The ODE of the objects ``setup`` (:func:`~singleloc.build`): its SGD rule on the expectation of its route
        (the route class's ``from_setup``, :func:`~singleloc.expectations._routes.route_class`).

        ``seeds``: a stack of rules with these scrambling seeds (leading axis, see :func:`~singleloc.replicate_rules`)
        instead of the one rule of ``theory.qmc_seed``; ``points``: instead of ``theory.points`` (which must be a number
        here: :func:`~singleloc.resolve_points` resolves ``"auto"``); ``check``: with what the route's error statement
        needs (the exact route's finer rule, :meth:`risk_check`).
        """
        require_x64("the order-parameter ODE")
        points = setup.theory.points if points is None else points
        if not isinstance(points, int):
            raise ValueError(f"theory.points = {points!r}: a number is needed here; resolve 'auto' first with "
                             "singleloc.resolve_points(setup) (integrate does it itself)")
        expectation = route_class(setup.route.route).from_setup(setup, points=points, seeds=seeds, check=check)
        return cls(expectation, setup.rule)

    def risk(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> jax.Array:
        """Population risk ``R(M, Q, b) = E[(1 - a_eps)^2 + sum_{l != eps} a_l^2]`` on the route.
        ``v``: trained head weights (``None``: the head average)."""
        return self.expectation.risk(M, Q, b, v)

    def risk_check(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> jax.Array:
        """The risk on the route's finer rule (NaN without one): its difference to :meth:`risk` is
        the route's stated error."""
        return self.expectation.risk_check(M, Q, b, v)

    def gram(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> jax.Array:
        """``E[sum_l c_l c_l^T]`` (H, H), the ``lr^2`` term of ``dQ``, on the route."""
        return self.expectation.gram(M, Q, b, v)

    def gradient_moments(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> GradientMoments:
        """The field averages of the loss gradient the drift is made of, on the route."""
        return self.expectation.gradient_moments(M, Q, b, v)

    def drift(self, M: jax.Array, Q: jax.Array, b: jax.Array, tau=0.0, v: jax.Array | None = None) -> OrderParameters:
        """``(dM, dQ, db) / dtau`` of docs/model.md section 5 at time ``tau`` (``db = 0`` unless
        biases train): the SGD rule's mean update (:meth:`~singleloc.OnlineSGD.drift`) of
        :meth:`gradient_moments` at the head weights ``v``, in the state its head weighting declares (with
        trained head weights also ``dv / dtau``: :class:`~singleloc.WeightedOrderParameters`)."""
        return self.sgd.drift(tau, M, Q, b, self.gradient_moments(M, Q, b, v))

    def exact_drift_error(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> jax.Array:
        """The route's stated relative error of the ``O(lr)`` drift at one state
        (:meth:`~singleloc.LaplaceExpectation.drift_error`; NaN for a route without one)."""
        return self.expectation.drift_error(self.sgd, M, Q, b, v)

    def state_drift(self, y: OrderParameters, tau=0.0) -> OrderParameters:
        """:meth:`drift` of a state ``y`` of the rule's ``State`` (the vector field of the solve), at the head
        weights its weighting reads from it (:meth:`~singleloc.AbstractHeadWeighting.weights`)."""
        return self.drift(y.M, y.Q, y.b, tau, self.sgd.weighting.weights(y))

    def state_risk(self, y: OrderParameters) -> jax.Array:
        """:meth:`risk` of a state ``y`` of the rule's ``State``."""
        return self.risk(y.M, y.Q, y.b, self.sgd.weighting.weights(y))


def flatten_state(M: jax.Array, Q: jax.Array, b: jax.Array, train_bias: bool = True) -> jax.Array:
    """The state as one vector, ``[M.ravel(), Q[upper triangle], b]`` (``b`` only when biases
    train): the coordinates in which the drift is linearised and the SDE is written. The upper
    triangle (row-major, diagonal included) holds each free entry of the symmetric ``Q`` once."""
    iu = jnp.triu_indices(M.shape[0])
    return jnp.concatenate([M.ravel(), Q[iu]] + ([b] if train_bias else []))


def unflatten_state(v: jax.Array, H: int, F: int, b: jax.Array | None = None) -> OrderParameters:
    """Inverse of :func:`flatten_state`: ``Q`` rebuilt symmetric from its upper triangle;
    ``b`` supplies the biases when they are not in ``v``."""
    iu = jnp.triu_indices(H)
    nq = len(iu[0])
    M = v[: H * F].reshape(H, F)
    Qu = jnp.zeros((H, H), v.dtype).at[iu].set(v[H * F : H * F + nq])
    bb = v[H * F + nq :] if len(v) > H * F + nq else b
    return OrderParameters(M, Qu + jnp.triu(Qu, 1).T, bb)

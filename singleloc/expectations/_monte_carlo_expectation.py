"""Plain Monte Carlo over the local fields (``theory.route = "montecarlo"``): the independent check.

Every average is the mean over ``n`` independent draws of one sequence's fields, drawn the way the data is generated
(docs/model.md section 1), with none of the other routes' devices (no Sobol points, no mirrors, no head shifts, no
conditional expectation of the spike fields, no Laplace form): ``theta`` from the prior, the spike fields ``nu_l ~ N(0,
I_F)`` (plus ``theta`` on the relevant token 0) and the head fields

    g_l = M nu_l + R^{1/2} z_l,        R = R_orth = Q - M M^T,   z_l ~ N(0, I_H),

so that ``Cov(g_l) = Q`` and ``Cov(g_l, nu_l) = M`` as for the keys' overlaps. The averages are unbiased, with the
sampling error of ``n`` draws (a standard error ``sd / sqrt(n)``): the route the tests use to check the others
(:class:`~singleloc.SobolExpectation`, :class:`~singleloc.LaplaceExpectation`) without sharing their code. The draws are
fixed at construction (seed ``theory.qmc_seed``), so the route is a deterministic function of the state, and ``2
theory.points`` draws match the Sobol rule's node count.
"""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..model._activations import Activation
from ..model._priors import Prior
from ..runtime._numerics import psd_sqrt
from ..sgd._sgd_rule import GradientMoments
from ._expectation import AbstractExpectation, scrambled_statement, times

#: Draws averaged at once (``lax.map`` batches): the memory of one batch's integrand.
DRAW_BATCH = 4096


def draw_fields(prior: Prior, L: int, H: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` independent draws of ``(z, nu, theta)``: ``z`` (n, L, H) and ``nu`` (n, L, F) standard
    normals, ``theta`` (n, F) from ``prior`` (an atom by its probability, plus its Gaussian part)."""
    rng = np.random.default_rng(seed)
    atoms, probs = prior.atoms_array(), prior.probs_array()
    F = atoms.shape[1]
    theta = atoms[rng.choice(len(probs), size=n, p=probs / probs.sum())]
    if not prior.is_discrete:
        theta = theta + rng.standard_normal((n, F)) @ psd_sqrt(np.asarray(prior.noise_cov, dtype=float))
    return rng.standard_normal((n, L, H)), rng.standard_normal((n, L, F)), theta


class MonteCarloExpectation(AbstractExpectation):
    """Averages over the fixed draws ``z`` (n, L, H), ``nu`` (n, L, F), ``theta`` (n, F) (module
    docstring); a leading axis on all three stacks independent replicates."""

    z: jax.Array
    nu: jax.Array
    theta: jax.Array
    activation: Activation = eqx.field(static=True)
    route: ClassVar[str] = "montecarlo"
    field_nodes: ClassVar[bool] = True
    refined_error: ClassVar[bool] = False
    gram_name: ClassVar[str] = "montecarlo"
    own_gram: ClassVar[str] = "by its own Monte Carlo draws"

    @classmethod
    def from_setup(cls, setup, *, points: int, seeds=None, check: bool = False) -> MonteCarloExpectation:
        """``2 points`` draws from seed ``theory.qmc_seed`` (or one set per seed of ``seeds``, stacked)."""
        return cls.make(setup.activation, setup.prior, setup.problem.L, setup.heads, 2 * points,
                        setup.theory.qmc_seed if seeds is None else seeds)

    @classmethod
    def make(cls, activation: Activation, prior: Prior, L: int, H: int, n: int, seed=0) -> MonteCarloExpectation:
        """``n`` draws of the fields of ``H`` heads on sequences of ``L`` tokens under ``prior`` from ``seed`` (a
        sequence of seeds: one set per seed, stacked along a leading axis)."""
        draws = draw_fields(prior, L, H, n, seed) if np.ndim(seed) == 0 else \
            [np.stack(x) for x in zip(*(draw_fields(prior, L, H, n, int(s)) for s in seed))]
        z, nu, theta = (jnp.asarray(x, jnp.result_type(float)) for x in draws)
        return cls(z=z, nu=nu, theta=theta, activation=activation)

    @classmethod
    def for_risk(cls, choice, prior, L, H, points, seed, nodes):
        """``2 points`` draws from ``seed``."""
        return cls.make(choice.activation, prior, int(L), H, 2 * points, seed)

    @classmethod
    def describe(cls, result) -> str:
        return (f"Monte Carlo route (plain draws): {times(2 * result.points, 'draws', result.replicates)}, standard error "
                f"of the risk {result.risk_error:.1e} (the larger of the start's and the end's)")

    @property
    def replicates(self) -> int:
        return self.z.shape[0] if self.z.ndim == 4 else 1

    def risk_check(self, M, Q, b, v=None):
        """The risk plus its standard error ``sd / sqrt(n)`` over the ``n`` draws: the difference to
        :meth:`risk` is the route's stated error (:meth:`statement`)."""
        first, second = self._mean(lambda g, nu: (lambda x: (x, x * x))(self.loss(g.T + b[:, None], v)), M, Q)
        return first + jnp.sqrt(jnp.maximum(second - first * first, 0.0) / (self.z.shape[-3] - 1))

    def statement(self, report):
        """``risk_error``: the larger standard error of the risk at the start and at the end (of the mean
        over the replicates); the drift's and the Gram term's from further sets of draws
        (:func:`~singleloc.expectations._expectation.scrambled_statement`)."""
        return scrambled_statement(report, float(np.max(report.check)) / np.sqrt(report.check.shape[1]))

    def _mean(self, fn, M, Q):
        """The mean of ``fn(g, nu)`` over the draws, ``g`` (L, H) and ``nu`` (L, F) one sequence's
        head and spike fields (relevant token 0)."""
        root = psd_sqrt(Q - M @ M.T)

        def one(draw):
            z, nu, theta = draw
            nu = nu.at[0].add(theta)
            return fn(nu @ M.T + z @ root, nu)

        n = self.z.shape[0]
        total = jax.lax.map(one, (self.z, self.nu, self.theta), batch_size=min(n, DRAW_BATCH))
        return jax.tree.map(lambda x: jnp.mean(x, axis=0), total)

    def risk(self, M, Q, b, v=None):
        return self._mean(lambda g, nu: self.loss(g.T + b[:, None], v), M, Q)

    def gradient_moments(self, M, Q, b, v=None):
        """``E[sum_l c_l nu_l^T]``, ``E[sum_l c_l g_l^T]``, ``E[sum_l c_l]``, ``E[sum_l c_l c_l^T]``
        (and ``E[dl/dv]``) as means of the products themselves."""

        def products(g, nu):
            if v is None:
                c, cv = jax.grad(self.loss)(g.T + b[:, None]), None
            else:
                c, cv = jax.grad(self.loss, argnums=(0, 1))(g.T + b[:, None], v)
            return GradientMoments(c @ nu, c @ g, jnp.sum(c, axis=1), c @ c.T, cv)

        return self._mean(products, M, Q)

    def gram(self, M, Q, b, v=None):
        def cc(g, nu):
            c = jax.grad(self.loss)(g.T + b[:, None], v)
            return c @ c.T

        return self._mean(cc, M, Q)

    def attention_mass(self, M, Q, b):
        return self._mean(lambda g, nu: jnp.sum(self.activation(g.T + b[:, None]), axis=1), M, Q)

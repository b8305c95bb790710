"""The Sobol route: every field average on one scrambled Sobol rule (``theory.route = "rule"``).

The rule (:class:`~singleloc.LocalFields`) draws the head fields ``g_l = w_l S`` from base normals ``w_l`` and a factor
``S`` of ``Q`` (plus ``M theta`` on token 0), and never the spike fields ``nu``: given ``theta``, ``(g_l, nu_l)`` is
Gaussian with ``Cov(g_l, nu_l) = M``, so ``E[nu_l | g_l] = M^T Q^+ (g_l - E g_l)`` (plus ``theta`` on token 0). With

    P = E[c_0 theta^T]  (H, F),        W = E[sum_l c_l w_l^T]  (H, H),        T = S Q^+,

this gives ``E[sum_l c_l nu_l^T] = P + W T M`` and ``E[sum_l c_l g_l^T] = P M^T + W S``
(:meth:`SobolExpectation.gradient_moments`). Only first derivatives of the loss enter (pathwise estimators, of lower
variance than the Hessian form of Stein's lemma, which we measured at up to 5x the error for large ``Q``). The
pseudo-inverse is safe when ``Q`` is singular: ``|(Q^+)^{1/2} M| <= 1`` because ``Q - M M^T`` is PSD, and a direction in
which ``Q`` vanishes carries no field. Nothing here depends on the activation: any activation gets its drift from
autodiff of the loss. The rule's error is the spread of independent scramblings (:mod:`~singleloc.theory._ode`).

:class:`SobolGram` is the ``lr^2`` term on such a rule alone: the exact route's term where no exact form is taken
(:class:`~singleloc.LaplaceExpectation`), on the rank-aware layout, unwhitened (unbiased:
:mod:`~singleloc.expectations._fields`).
"""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from ..model._activations import Activation
from ..model._layer import limit_loss
from ..sgd._sgd_rule import GradientMoments
from ._expectation import AbstractExpectation, AbstractGramTerm, scrambled_statement, times
from ._fields import LocalFields, replicate_rules


def sobol_fields(setup, points: int, seed: int, seeds=None, **kind) -> LocalFields:
    """A Sobol rule of ``points`` points over the fields of the problem and layer of ``setup``
    (:class:`~singleloc.preflight._build.Setup`): scrambling ``seed``, or (``seeds``) one rule per seed stacked along
    a leading axis (:func:`~singleloc.replicate_rules`); ``kind``: the layout (``symmetric`` or ``principal``)."""
    if seeds is None:
        return LocalFields.make(setup.problem.L, setup.heads, setup.prior, points, seed, **kind)
    return replicate_rules(setup.problem.L, setup.heads, setup.prior, points, seeds, **kind)


def _gram_on(fields: LocalFields, activation: Activation, M, Q, b, v=None) -> jax.Array:
    """``E[sum_l c_l c_l^T]`` on the rule ``fields``."""

    def integrand(g, theta):
        c = jax.grad(lambda s, v: limit_loss(activation, s, 0, v))(g.T + b[:, None], v)
        return c @ c.T

    return fields.expect(integrand, M, Q)


class SobolGram(AbstractGramTerm):
    """The ``lr^2`` term on a Sobol rule of its own (``fields``, rank-aware and unwhitened on the exact route)."""

    fields: LocalFields
    activation: Activation = eqx.field(static=True)
    name: ClassVar[str] = "sobol"
    scrambled: ClassVar[bool] = True

    def gram(self, M, Q, b, v=None):
        return _gram_on(self.fields, self.activation, M, Q, b, v)

    def error(self, evaluation, M, Q, b, v=None):
        """NaN inside the solve: the standard error over independent scramblings (unbiased each: the rule is
        not whitened) is stated after it (:func:`~singleloc.expectations._expectation.solve_report`)."""
        return self.gram(M, Q, b, v), jnp.full((), jnp.nan, M.dtype)


class SobolExpectation(AbstractExpectation):
    """Every average on the scrambled Sobol rule ``fields`` (module docstring)."""

    fields: LocalFields
    activation: Activation = eqx.field(static=True)
    route: ClassVar[str] = "rule"
    field_nodes: ClassVar[bool] = True
    refined_error: ClassVar[bool] = False
    gram_name: ClassVar[str] = "sobol"
    own_gram: ClassVar[str] = "on its own Sobol rule (theory.points)"

    @classmethod
    def from_setup(cls, setup, *, points: int, seeds=None, check: bool = False, whiten: bool = True) -> SobolExpectation:
        """The rule route of ``setup``: ``points`` Sobol points on the coordinates of ``theory.axes`` (scrambling
        ``theory.qmc_seed``, or one rule per seed of ``seeds``, stacked); ``whiten = False``: unbiased (:meth:`scrambling`)."""
        theory = setup.theory
        axes = {"principal": True} if theory.rank_aware else {"symmetric": True}
        fields = sobol_fields(setup, points, theory.qmc_seed, seeds, whiten=whiten, **axes)
        return cls(fields=fields, activation=setup.activation)

    @classmethod
    def scrambling(cls, setup, points):
        """Not whitened: the whitening's bias, which the spread of scramblings does not see
        (:mod:`~singleloc.expectations._fields`), stays out of the statement's reference."""
        return cls.from_setup(setup, points=points, whiten=False)

    @classmethod
    def for_risk(cls, choice, prior, L, H, points, seed, nodes):
        """Unwhitened and rank-aware: each scrambling unbiased, so that their spread states the error
        (docs/model.md section 4.5), and heads that are copies lose no accuracy."""
        return cls(fields=LocalFields.make(int(L), H, prior, points, seed, principal=True, whiten=False),
                   activation=choice.activation)

    @classmethod
    def describe(cls, result) -> str:
        layout = "rank-aware, theory.axes = 'principal'" if result.axes == "principal" else "head-shift rule"
        return (f"rule route (Sobol, {layout}): {times(result.points, 'points', result.replicates)}, standard error of the "
                f"risk {result.risk_error:.1e} (the larger of the start's and the end's, over independent scramblings)")

    def statement(self, report):
        """From further scramblings at the ends (:func:`~singleloc.expectations._expectation.scrambled_statement`)."""
        return scrambled_statement(report)

    @property
    def replicates(self) -> int:
        return self.fields.w.shape[0] if self.fields.w.ndim == 4 else 1

    @property
    def sde_rule(self) -> LocalFields:
        return self.fields

    def risk(self, M, Q, b, v=None):
        return self.fields.expect(lambda g, theta: self.loss(g.T + b[:, None], v), M, Q)

    def moments(self, M: jax.Array, Q: jax.Array, b: jax.Array, factor: jax.Array | None = None,
                v: jax.Array | None = None) -> dict[str, jax.Array]:
        """The rule's averages the drift is made of: ``risk``, ``c_sum`` = E[sum_l c_l] (H,), ``P`` (H, F),
        ``W`` = E[sum_l c_l w_l^T] (H, H) and ``cc`` = E[sum_l c_l c_l^T] (H, H); ``factor``: the rule's factor
        ``S`` of ``Q`` (:meth:`~singleloc.LocalFields.factors`) if already known; with head weights ``v``, also
        ``cv`` = E[dl/dv] (H,). The gradients ``c`` are taken at every node, the products summed over the nodes
        as contractions (:meth:`~singleloc.LocalFields.expect`'s ``contract``)."""

        def integrand(g, theta, w):
            if v is None:
                f, c = jax.value_and_grad(self.loss)(g.T + b[:, None])
                return {"f": f, "c": c, "theta": theta, "w": w}
            f, (c, cv) = jax.value_and_grad(self.loss, argnums=(0, 1))(g.T + b[:, None], v)
            return {"f": f, "c": c, "theta": theta, "w": w, "cv": cv}

        def contract(x, p):
            flat = lambda a, k: a.reshape(p.size, *a.shape[a.ndim - k:])  # the nodes' axes as one
            c, w, theta, p = flat(x["c"], 2), flat(x["w"], 2), flat(x["theta"], 1), p.reshape(-1)
            pc = p[:, None, None] * c
            out = {"risk": p @ flat(x["f"], 0), "c_sum": jnp.sum(pc, axis=(0, 2)), "P": pc[:, :, 0].T @ theta,
                   "W": jnp.einsum("nhl,nlk->hk", pc, w), "cc": jnp.einsum("nhl,ngl->hg", pc, c)}
            return out | ({"cv": p @ flat(x["cv"], 1)} if "cv" in x else {})

        return self.fields.expect(integrand, M, Q, factor=factor, with_noise=True, contract=contract)

    def gradient_moments(self, M, Q, b, v=None):
        return self.risk_and_moments(M, Q, b, v)[1]

    def risk_and_moments(self, M, Q, b, v=None):
        """On the rule, whose fields are ``g_l = w_l S`` with ``T = S Q^+`` (:meth:`~singleloc.LocalFields.factors`):
        ``E[sum_l c_l nu_l^T] = P + W T M`` and ``E[sum_l c_l g_l^T] = P M^T + W S`` (module docstring); with head
        weights ``v`` also ``cv = dR/dv``; the risk from the same pass (the loss at the nodes, summed as a contraction:
        the same value as :meth:`risk` up to the order of the sum)."""
        S, T = self.fields.factors(Q)
        m = self.moments(M, Q, b, S, v)
        P, W = m["P"], m["W"]
        return m["risk"], GradientMoments(P + W @ (T @ M), P @ M.T + W @ S, m["c_sum"], m["cc"], m.get("cv"))

    def gram(self, M, Q, b, v=None):
        return _gram_on(self.fields, self.activation, M, Q, b, v)

    def attention_mass(self, M, Q, b):
        return self.fields.expect(lambda g, theta: jnp.sum(self.activation(g.T + b[:, None]), axis=1), M, Q)

"""The exact route: the risk and its gradient in the Laplace form (``theory.route = "exact"``).

For a normalised-exponential activation (:mod:`~singleloc.expectations._laplace`) the risk is computed exactly, and the
``O(lr)`` drift is its gradient: with ``G_M, G_Q, G_b`` the derivatives of ``R`` (``Q``'s entries as independent
arguments) and ``S = G_Q + G_Q^T``, the mean SGD step of the keys is ``-lr D grad_{k_h} R = -lr (sum_f G_M[h, f] k*_f +
sum_h' S[h, h'] k_h')``, so the field averages the SGD rule takes are

    E[sum_l c_l nu_l^T] = G_M + S M,     E[sum_l c_l g_l^T] = G_M M^T + S Q,     E[sum_l c_l] = G_b,

(:class:`~singleloc.GradientMoments`), and the ``lr^2`` term ``E[sum_l c_l c_l^T]`` is an
:class:`~singleloc.expectations._expectation.AbstractGramTerm` of its own. The derivatives are exact and finite at
identical heads (Price's theorem inside the rule). The Gram term of one head is exact too (a polynomial of degree six in
the token weights, whose moments the Laplace form gives: :mod:`~singleloc.expectations._laplace_gram`), and of two heads
with ``theory.gram = "exact"`` (:class:`LaplaceGram`). Otherwise (up to four distinct heads per term: no cheap exact
form) it stays on the rank-aware Sobol rule (:class:`~singleloc.SobolGram`, :meth:`~singleloc.Theory.gram_rule_points`
points, unwhitened: :mod:`~singleloc.expectations._fields`; at trained states with near copies of six heads an eighth to
a fiftieth of the head-symmetric rule's error, ``benchmarks/06_exact_route.py``), or with ``theory.gram = "montecarlo"``
on plain Monte Carlo (:class:`~singleloc.expectations._monte_carlo_gram.MonteCarloGram`).

The route states its error (:meth:`LaplaceExpectation.statement`): the risk and the ``O(lr)`` drift against a finer
exact rule (``check``: :meth:`~singleloc.expectations._laplace.LaplaceRule.refined`, 1.5 x the nodes), the Gram term
against the finer exact rule or a second, independent Sobol rule; each warns above its threshold
(:data:`RISK_ERROR_WARN`, :data:`DRIFT_ERROR_WARN`, :data:`GRAM_ERROR_WARN`), naming what to change. Fields wider than
the rule resolves stop the solve instead (:meth:`LaplaceExpectation.resolves`; :func:`~singleloc.integrate` then goes on
on the Sobol rule or refuses).
"""

from __future__ import annotations

import warnings
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..model._activations import Activation
from ..runtime._compilation import filter_jit
from ..sgd._sgd_rule import GradientMoments, flat_drift
from ._cubature import REFINEMENT
from ._expectation import AbstractExpectation, AbstractGramTerm, RouteStatement, SolveReport, times
from ._laplace import LaplaceRule, exact_rule
from ._laplace_gram import WIDE_GRAM_SIGMA
from ._laplace_joint import joint_rule_size
from ._monte_carlo_gram import MonteCarloGram
from ._routes import JOINT_UNIT_BYTES
from ._sobol_expectation import SobolGram, sobol_fields
from ._sobol_geometry import node_batch

#: A stated risk error of the exact route above this draws a warning (the exact route aims at 1e-5 and
#: reaches 1e-10 at the states of L = 4 training; large token variances ``alpha^2 Q_hh`` need more nodes).
RISK_ERROR_WARN = 1e-6
#: The same for the stated relative error of its ``O(lr)`` drift (the issue's target is 1e-4).
DRIFT_ERROR_WARN = 1e-4
#: The same for the stated relative error of its ``lr^2`` Gram term (:meth:`LaplaceExpectation.gram_error`).
#: On the Sobol rule it is 1e-3 to 1e-2 at trained states (long keys make attention nearly an argmax, whose
#: gradient lives on thin sets of the fields); the exact two-head term resolves token fields of
#: standard deviation up to about :data:`~singleloc.expectations._laplace_gram.WIDE_GRAM_SIGMA` at ``theory.nodes = 64``.
GRAM_ERROR_WARN = 1e-2
#: The drift's error is computed (after the solve, in a program of its own: in the solve's it added
#: 70% to the compile time) where the stated risk error exceeds this; below it is not computed (NaN).
#: The relative drift error was at most 5e3 times the risk error at the states measured for this
#: choice (trained, specialised, copies, random; softmax, softmax1, ssmax; L = 4 ... 1024), so that
#: below this it is under about 1e-5.
DRIFT_CHECK_ABOVE = 1e-9
#: The ``O(lr)`` drift error where it is not computed (``risk_error`` under :data:`DRIFT_CHECK_ABOVE`).
DRIFT_UNCHECKED = "below 1e-5 (not computed: risk error under 1e-9)"


class LaplaceGram(AbstractGramTerm):
    """The ``lr^2`` term in the Laplace form (:mod:`~singleloc.expectations._laplace_gram`): one head, or two
    heads of a per-head layer, with the head average."""

    rule: LaplaceRule
    name: ClassVar[str] = "exact"

    def gram(self, M, Q, b, v=None):
        if v is not None:
            raise ValueError("the exact Gram term takes the head average only (model.head_weights = 'trained' "
                             "builds the ODE with its Sobol rule)")
        return self.rule.gram(M, Q, b)

    def error(self, evaluation, M, Q, b, v=None):
        """Against the finer exact rule (``evaluation.check``): ``max |G - G'|``."""
        G = self.gram(M, Q, b, v)
        return G, jnp.max(jnp.abs(G - evaluation.check.gram(M, Q, b)))


@jax.jit
def _risk_gradient(rule: LaplaceRule, M, Q, b, v=None):
    """``(dR/dM, dR/dQ, dR/db, dR/dv)`` of the exact risk (``dR/dv`` ``None`` without head
    weights). Jitted on its own, so that a solve that evaluates the drift at several places
    (diffrax's first step, its stages, the start) traces it once."""
    if v is None:
        return (*jax.grad(rule.risk, argnums=(0, 1, 2))(M, Q, b), None)
    return jax.grad(rule.risk, argnums=(0, 1, 2, 3))(M, Q, b, v)


def exact_moments(rule: LaplaceRule, M, Q, b, v, cc) -> GradientMoments:
    """The field averages of the exact route (module docstring) on ``rule``, ``cc`` the Gram term."""
    GM, GQ, Gb, Gv = _risk_gradient(rule, M, Q, b, v)
    S = GQ + GQ.T
    return GradientMoments(GM + S @ M, GM @ M.T + S @ Q, Gb, cc, Gv)


class LaplaceExpectation(AbstractExpectation):
    """The exact route (module docstring).

    Attributes:
        rule: the exact rule of the risk and of the ``O(lr)`` drift.
        gram_term: the ``lr^2`` term (:class:`LaplaceGram`, :class:`~singleloc.SobolGram` or
            :class:`~singleloc.expectations._monte_carlo_gram.MonteCarloGram`).
        activation: the activation; static.
        check: a finer exact rule (:meth:`~singleloc.expectations._laplace.LaplaceRule.refined`) whose risk and
            drift state the error of ``rule``'s, or ``None``.

    Nothing here has the shape of the ``L H`` fields unless the Gram term is on a Sobol rule, so that
    solves that differ in ``L`` alone share their compiled program (the exact rule takes ``L`` as a value).
    """

    rule: LaplaceRule
    gram_term: AbstractGramTerm
    activation: Activation = eqx.field(static=True)
    check: LaplaceRule | None = None
    route: ClassVar[str] = "exact"
    field_nodes: ClassVar[bool] = False
    refined_error: ClassVar[bool] = True
    own_gram: ClassVar[None] = None

    @classmethod
    def from_setup(cls, setup, *, points: int, seeds=None, check: bool = False) -> LaplaceExpectation:
        """The exact route of ``setup``: the exact rule of ``theory.nodes`` (the same for every replicate of
        ``seeds``: it has no scrambling), with ``check`` its refined copy, and the Gram term ``route.gram`` (Sobol
        or Monte Carlo on :meth:`~singleloc.Theory.gram_rule_points` of ``points``, one scrambling per seed)."""
        problem, theory, H, choice = setup.problem, setup.theory, setup.heads, setup.route

        def per_replicate(rule):
            return rule if seeds is None else jax.tree.map(lambda x: jnp.broadcast_to(x, (len(seeds), *x.shape)), rule)

        rule = exact_rule(choice.activation, problem.L, H, setup.prior, nodes=theory.nodes)
        fine = per_replicate(rule.refined()) if check else None
        rule = per_replicate(rule)
        gram_points = theory.gram_rule_points(problem.L, H, points)
        if choice.gram == "exact":
            gram = LaplaceGram(rule)
        elif choice.gram == "montecarlo":
            gram = MonteCarloGram.make(choice.activation, setup.prior, problem.L, H, gram_points, theory.qmc_seed, seeds)
        else:  # unwhitened: one scrambling is unbiased, and the scramblings' spread states the error
            fields = sobol_fields(setup, gram_points, theory.qmc_seed, seeds, principal=True, whiten=False)
            gram = SobolGram(fields=fields, activation=choice.activation)
        return cls(rule=rule, gram_term=gram, activation=choice.activation, check=fine)

    @classmethod
    def for_risk(cls, choice, prior, L, H, points, seed, nodes):
        """The exact rule of ``nodes`` nodes, checked by its refined copy (no Gram term is asked for)."""
        rule = exact_rule(choice.activation, int(L), H, prior, nodes=nodes)
        return cls(rule=rule, gram_term=LaplaceGram(rule), activation=choice.activation, check=rule.refined())

    @classmethod
    def memory_points(cls, choice, theory, L, H, points):
        """The Gram term's rank-aware Sobol rule (:meth:`~singleloc.Theory.gram_rule_points`); one batch of
        nodes at most for the exact or Monte Carlo term, which hold no rule."""
        return (theory.gram_rule_points(L, H, points) if choice.gram == "sobol" else max(node_batch(L, H) // 2, 1)), True

    @classmethod
    def rule_bytes(cls, choice, H, prior):
        """A joint layer's refined exact rule (the larger), :data:`~singleloc.expectations._routes.JOINT_UNIT_BYTES`
        per unit of :func:`~singleloc.expectations._laplace_joint.joint_rule_size`, which grows with ``H`` and the
        atoms; 0 for a per-head layer, whose pair rule is small and does not grow with ``H`` or the prior."""
        return JOINT_UNIT_BYTES * joint_rule_size(H, prior, refined=True) if choice.form.joint else 0

    def stated_points(self, theory, L, H, points):
        """The Gram term's points (or draws), where it is not exact."""
        return points if isinstance(self.gram_term, LaplaceGram) else theory.gram_rule_points(L, H, points)

    @classmethod
    def describe(cls, result) -> str:
        drift = f"{result.exact_drift_error:.1e}" if np.isfinite(result.exact_drift_error) else DRIFT_UNCHECKED
        gram = {"exact": f"lr^2 Gram term exact too (its relative error against the finer rule {result.gram_error:.1e})",
                "montecarlo": f"lr^2 Gram term by plain Monte Carlo (its relative standard error {result.gram_error:.1e})"
                }.get(result.gram_route, f"lr^2 Gram term on the rank-aware Sobol rule (its relative error "
                                         f"{result.gram_error:.1e})")
        text = (f"exact route (Laplace form; risk error {result.risk_error:.1e} and relative drift error {drift} against "
                f"a finer rule), {gram}")
        if result.gram_route == "exact":
            return text
        unit = "antithetic pairs" if result.gram_route == "montecarlo" else "points"
        return f"{text}; the Gram term's {times(result.points, unit, result.replicates)}"

    @property
    def replicates(self) -> int:
        return self.rule.z_outer.shape[0] if self.rule.z_outer.ndim == 2 else 1

    def risk(self, M, Q, b, v=None):
        return self.rule.risk(M, Q, b, v)

    def gradient_moments(self, M, Q, b, v=None):
        """``G_M + S M`` and ``G_M M^T + S Q`` (``S = G_Q + G_Q^T``) from the exact risk's gradient,
        with ``G_b``, the Gram term and, with head weights ``v``, ``cv = dR/dv``."""
        return exact_moments(self.rule, M, Q, b, v, self.gram(M, Q, b, v))

    def gram(self, M, Q, b, v=None):
        return self.gram_term.gram(M, Q, b, v)

    @property
    def second_derivatives(self) -> bool:
        """``False`` for a joint layer: its token expectation is differentiated by Price's theorem with the conditional
        law of the token's covariance held fixed (:func:`~singleloc.expectations._laplace_joint._conditional_law`,
        outside the gradient), so the drift is exact and its derivatives in ``Q`` are not (``d^2 R / dQ_00^2`` came out
        0 by autodiff, -6.1e-5 by differences, bsoftmax at ``L = 3``). A per-head layer's are exact."""
        return not self.rule.form.joint

    def attention_mass(self, M, Q, b):
        return self.rule.attention_mass(M, Q, b)

    @property
    def gram_name(self) -> str:
        return self.gram_term.name

    def resolves(self, M, Q, b):
        """Whether the token fields are within the width the rule resolves
        (:meth:`~singleloc.expectations._laplace.LaplaceRule.resolves`): beyond it the drift is wrong, not merely less
        precise (issue 59: at ``lr = 32`` on the default problem the heads split where the Sobol rule keeps them
        together), so a solve stops there rather than warning after it."""
        return self.rule.resolves(M, Q, b)

    def risk_check(self, M, Q, b, v=None):
        return jnp.full((), jnp.nan, dtype=M.dtype) if self.check is None else self.check.risk(M, Q, b, v)

    def drift_error(self, sgd, M, Q, b, v=None):
        """The stated relative error of the ``O(lr)`` drift at one state: ``max |d - d'| / max |d'|`` over the entries
        of the drift without its ``lr^2`` (Gram) term, ``d`` on the exact rule and ``d'`` on its finer copy ``check``
        (NaN without one). The risk's error alone can hide a drift that is far off: at token variances ``alpha^2 Q_hh``
        of 50 and more (ssmax at ``L = 64``) a risk error of 1e-3 came with drift errors of order one."""
        if self.check is None:
            return jnp.full((), jnp.nan, dtype=M.dtype)
        no_gram = jnp.zeros(Q.shape, Q.dtype)
        flat = lambda rule: flat_drift(sgd.drift(0.0, M, Q, b, exact_moments(rule, M, Q, b, v, no_gram)))
        d, fine = flat(self.rule), flat(self.check)
        return jnp.max(jnp.abs(d - fine)) / jnp.max(jnp.abs(fine))

    def gram_error(self, evaluation, M, Q, b, v=None):
        """The Gram term's stated absolute error (:meth:`AbstractGramTerm.error`: against the finer exact rule, or the
        Monte Carlo term's standard error; NaN on a Sobol rule, whose scramblings state it after the solve) over
        ``max |G|``: at a stationary state the term balances the ``O(lr)`` part of ``dQ``, so this is the relative
        error of that part of the drift there. NaN for a non-finite state; on a Sobol rule the term is not evaluated
        (the solve's program computes nothing for this NaN)."""
        if self.gram_term.scrambled:
            return jnp.full((), jnp.nan, M.dtype)
        G, err = self.gram_term.error(evaluation, M, Q, b, v)  # each term states its own (AbstractGramTerm.error)
        size = jnp.max(jnp.abs(G))
        return jnp.where(jnp.isfinite(Q).all() & (size > 0), err / size, jnp.nan)

    def statement(self, report: SolveReport) -> RouteStatement:
        """The risk's error against the finer rule (the largest at the first and last saved times),
        the ``O(lr)`` drift's (computed where the risk's exceeds :data:`DRIFT_CHECK_ABOVE`) and the
        Gram term's, each warned about above its threshold with what to change."""
        risk_error = float(np.max(report.check))
        exact_gram = isinstance(self.gram_term, LaplaceGram)
        drift_error = _drift_error_at_ends(report.evaluation, report.sgd, report.ys) \
            if risk_error > DRIFT_CHECK_ABOVE else float("nan")
        R = report.theory.replicates
        gram = float(np.max(report.grams)) / (1.0 if exact_gram else np.sqrt(R))
        if risk_error > RISK_ERROR_WARN or drift_error > DRIFT_ERROR_WARN:
            _warn_risk(report, self.rule, risk_error, drift_error)
        if gram > GRAM_ERROR_WARN:
            _warn_gram(report, gram, exact_gram)
        return RouteStatement(risk_error, gram, drift_error)


def largest_token_variance(prior, scale: float, M, Q) -> float:
    """``alpha^2 max_h (Q + M Sigma M^T)_hh`` at states ``M`` (..., H, F), ``Q`` (..., H, H): the largest
    variance of one token's fields, the relevant token's under a prior with a Gaussian part ``Sigma``
    (``alpha = scale``; ``Sigma = 0`` for a discrete prior, where it is the noise tokens' ``alpha^2 Q_hh``
    too). What the exact route's normal rules must resolve: the warning on a large stated error names it."""
    sigma = np.asarray(prior.noise_cov, dtype=float)
    M, Q = np.asarray(M, dtype=float), np.asarray(Q, dtype=float)
    relevant = Q + M @ sigma @ np.swapaxes(M, -1, -2)
    return scale**2 * float(np.max(np.diagonal(relevant, axis1=-2, axis2=-1)))


def _warn_risk(report: SolveReport, rule: LaplaceRule, risk_error: float, drift_error: float) -> None:
    M, Q = report.ys[0], report.ys[1]
    variance = largest_token_variance(report.prior, float(np.max(rule.alpha)), M[:, :, -1], Q[:, :, -1])
    joint = ""
    if rule.form.joint and report.heads >= 2:
        joint = (" (a joint layer's token rule, singleloc.expectations._laplace_joint.JOINT_LEADING, is not refined by "
                 "theory.nodes: its error at trained states is in docs/model.md section 4.6)")
    warnings.warn(f"the exact route's stated errors are {risk_error:.1e} (risk) and {drift_error:.1e} (relative "
                  f"O(lr) drift), against a rule of {REFINEMENT:g} x the nodes: the token fields reach a variance of "
                  f"{variance:.3g} (alpha^2 (Q + M Sigma M^T)_hh, Sigma the prior's Gaussian part), which theory.nodes = "
                  f"{report.theory.nodes} resolves only to that precision; raise "
                  f"theory.nodes (cost grows like its square to cube) and check that the trajectory does not move{joint}",
                  stacklevel=5)


def _warn_gram(report: SolveReport, gram: float, exact_gram: bool) -> None:
    """The warning on a large stated error of the exact route's ``lr^2`` Gram term: what it is, and
    what to do (the term moves the trajectory, not the risk of a given state)."""
    th = report.theory
    if exact_gram:
        advice = (f"the exact two-head term resolves token fields of standard deviation up to about "
                  f"{WIDE_GRAM_SIGMA:g} to 1e-4 and {2 * WIDE_GRAM_SIGMA:g} to 3e-3 at theory.nodes = 64 (now {th.nodes}); "
                  "raise theory.nodes or set theory.gram = 'sobol'")
    elif report.evaluation.gram_name == "montecarlo":
        advice = (f"it is one standard error of plain Monte Carlo over {report.evaluation.gram_term.draws} antithetic "
                  "pairs, unbiased; it falls like 1 / sqrt(theory.gram_points)")
    elif th.replicates > 1:
        advice = (f"its effect on the trajectory, the standard error of the risk over the {th.replicates} replicates "
                  f"(independent Gram rules), is at most {float(np.nanmax(report.risk_se)):.1e}")
    else:
        advice = (f"theory.replicates = 2 or more states its effect on the trajectory (the standard error of the risk over "
                  f"independent Gram rules); raising theory.gram_points (now {report.points}) lowers it slowly")
    against = ("the finer exact rule" if exact_gram else "its own draws' standard error"
               if report.evaluation.gram_name == "montecarlo" else "the spread of 16 independent Sobol rules")
    warnings.warn(f"the exact route's lr^2 Gram term has a stated relative error of {gram:.1e} (against {against}, at "
                  f"the start and the end of the solve): {advice}", stacklevel=5)


def _drift_error_at_ends(evaluation: LaplaceExpectation, sgd, ys) -> float:
    """The largest :meth:`LaplaceExpectation.drift_error` at the starts and the ends of the solve's
    trajectories ``ys`` (leading axes: starts, replicates, saved times)."""
    one = lambda x: x[0]  # the exact rules are the same for every replicate
    expectation = eqx.tree_at(lambda e: (e.rule, e.check), evaluation,
                              (jax.tree.map(one, evaluation.rule), jax.tree.map(one, evaluation.check)))
    ends = [np.concatenate([x[:, :, 0], x[:, :, -1]]).reshape(-1, *x.shape[3:]) for x in ys]
    errors = np.asarray(_drift_errors(expectation, sgd, tuple(jnp.asarray(x) for x in ends)))
    return float(np.nanmax(errors)) if np.any(np.isfinite(errors)) else float("nan")


@filter_jit  # the solve's XLA options (singleloc.runtime._compilation)
def _drift_errors(expectation: LaplaceExpectation, sgd, states) -> jax.Array:
    return jax.lax.map(lambda s: jnp.where(jnp.isfinite(s[1]).all(), expectation.drift_error(sgd, *s), jnp.nan), states)

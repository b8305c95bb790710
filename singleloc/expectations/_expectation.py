"""The seam between the ODE and its quadrature: what an expectation route computes.

The drift of docs/model.md section 5 is the SGD rule applied to field averages of the limit loss's gradient
(:class:`~singleloc.GradientMoments`), and the population risk is one more field average. How those averages are
computed is the *expectation route*: a scrambled Sobol rule over the ``L H`` local fields
(:class:`~singleloc.SobolExpectation`, ``theory.route = "rule"``, any activation), the Laplace form of the
normaliser (:class:`~singleloc.LaplaceExpectation`, ``"exact"``, the normalised-exponential family) or plain
Monte Carlo (:class:`~singleloc.MonteCarloExpectation`, ``"montecarlo"``, the independent check of the other two),
chosen once by :func:`~singleloc.choose_route` (:mod:`~singleloc.expectations._routes`).

Every route is an :class:`AbstractExpectation`: an ``eqx.Module`` whose arrays (nodes, weights) are leaves, so that
an ODE holding one is a pytree the compiled solve receives as an argument, and whose methods are pure functions of
the state ``(M, Q, b)`` (and the trained head weights ``v``). It states its own error: inside the compiled solve
(:meth:`~AbstractExpectation.risk_check`, :meth:`~AbstractExpectation.drift_error`,
:meth:`~AbstractExpectation.gram_error`) and after it (:meth:`~AbstractExpectation.statement`: the numbers a result
carries and the warnings they call for, with the route's own thresholds).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Real

from ..configuration._specs import Theory
from ..model._activations import Activation
from ..model._layer import limit_loss
from ..model._priors import Prior
from ..runtime._compilation import filter_jit
from ..runtime._progress import Phase
from ..sgd._sgd_rule import GradientMoments, flat_drift
from ._fields import LocalFields

#: Independent scramblings of a route's rule that state its error at the ends of a solve (:func:`solve_report`):
#: a standard deviation from ``K`` of them is within 0.70 to 1.29 of the true one (5% to 95%, chi with ``K - 1 = 15``
#: degrees of freedom; tests/test_scrambled_errors.py), at ``2 (K + 2)`` evaluations of the drift (or ``2 K`` of
#: the Gram term alone) per start, where a solve makes hundreds.
SCRAMBLINGS = 16


class AbstractGramTerm(eqx.Module):
    """The ``lr^2`` term of ``dQ``, ``E[sum_l c_l c_l^T]`` (H, H) with ``c = dl/ds`` (H, L) the
    limit loss's gradient at the scores: one route's way of computing it."""

    name: eqx.AbstractClassVar[str]
    #: Whether the term's error is the spread of independent scramblings of its rule, stated after the solve
    #: (:func:`solve_report`), rather than by :meth:`error` inside it.
    scrambled: ClassVar[bool] = False

    @abc.abstractmethod
    def gram(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> jax.Array:
        """``E[sum_l c_l c_l^T]`` at the state ``(M, Q, b)`` (head weights ``v``)."""

    @abc.abstractmethod
    def error(self, evaluation: AbstractExpectation, M: jax.Array, Q: jax.Array, b: jax.Array,
              v: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """``(G, e)``: this term ``G`` at one state and its stated absolute error ``e`` (the largest over the
        entries), ``evaluation`` being the independent expectation of the same problem that evaluates the risks."""


class AbstractExpectation(eqx.Module):
    """The field averages of one problem and layer that the ODE needs, on one route (module docstring).

    Attributes:
        activation: the attention activation (scores (H, L) -> weights (H, L)); static.

    The rest of the package asks a route, never its name, what it costs and how it is described: its
    class variables, :meth:`memory_points`, :meth:`rule_bytes`, :meth:`describe`, :meth:`shard`.
    """

    activation: eqx.AbstractVar[Activation]
    #: The route's name, as ``theory.route`` and the results say it.
    route: eqx.AbstractClassVar[str]
    #: Whether the risk and the ``O(lr)`` drift are averages over nodes of the ``L H`` fields (a Sobol rule,
    #: Monte Carlo draws): their time and memory grow with ``L H``, and the nodes must span the fields (the
    #: time estimates' cost class ``"rule"``); ``False``: a rule whose size does not depend on ``L`` (``"exact"``).
    field_nodes: eqx.AbstractClassVar[bool]
    #: Whether one rule states the error of its risk, against a finer rule of its own (:meth:`risk_check`);
    #: ``False``: the spread of independent replicates states it.
    refined_error: eqx.AbstractClassVar[bool]
    #: A route whose ``lr^2`` (Gram) term is its own (:attr:`gram_name`, which ``theory.gram`` may name; no
    #: ``theory.gram_points``): how, in words (``"on its own Sobol rule (theory.points)"``); ``None``: the route
    #: computes it as those keys say (the exact route).
    own_gram: eqx.AbstractClassVar[str | None]

    @classmethod
    @abc.abstractmethod
    def from_setup(cls, setup, *, points: int, seeds=None, check: bool = False) -> AbstractExpectation:
        """The route of ``setup`` (:func:`~singleloc.build`) on ``points`` Sobol points: ``seeds`` stacks the rules of
        independent scramblings along a leading axis (the replicates), ``check`` adds what its error statement needs."""

    @classmethod
    @abc.abstractmethod
    def for_risk(cls, choice, prior: Prior, L: int, H: int, points: int, seed: int, nodes: int) -> AbstractExpectation:
        """One rule of the route for the risk of one layer (:func:`~singleloc.population_risk`; ``choice`` a
        :class:`~singleloc.RouteChoice`): ``points`` Sobol points of scrambling ``seed`` (``2 points`` draws), or an
        exact rule of ``nodes`` nodes with its finer copy."""

    @classmethod
    @abc.abstractmethod
    def describe(cls, result) -> str:
        """The route and its stated errors in words, from a :class:`~singleloc.TheoryResult` ``result``."""

    @classmethod
    def memory_points(cls, choice, theory: Theory, L: int, H: int, points: int) -> tuple[int, bool]:
        """``(n, principal)``: the Sobol points (or draws) whose nodes the route holds at once, and whether they
        are on the rank-aware layout (the preflight's memory, :mod:`~singleloc.preflight._resources`): by default its
        own rule's, ``points`` on ``theory.axes``."""
        return points, theory.rank_aware

    @classmethod
    def rule_bytes(cls, choice, H: int, prior: Prior) -> int:
        """Peak bytes of a rule of the route's own besides its nodes over the fields (0 by default)."""
        return 0

    def stated_points(self, theory: Theory, L: int, H: int, points: int) -> int:
        """The points (or draws) of the rule a result states (:attr:`~singleloc.TheoryResult.points`):
        by default ``points``, the route's own."""
        return points

    def shard(self, mesh, put) -> AbstractExpectation | None:
        """This route with the nodes of its rules (every :class:`~singleloc.LocalFields` it holds) in one block
        per device of ``mesh`` and the rest on every device (``put(x, mesh, axis=None)`` places an array:
        :mod:`~singleloc.expectations._sharding`), or ``None`` for a route with no nodes to split."""
        is_rule = lambda x: isinstance(x, LocalFields)
        if not any(map(is_rule, jax.tree.leaves(self, is_leaf=is_rule))):
            return None
        return jax.tree.map(lambda x: x.shard(mesh, put) if is_rule(x) else put(x, mesh), self, is_leaf=is_rule)

    def loss(self, s: jax.Array, v: jax.Array | None = None) -> jax.Array:
        """The limit loss at the scores ``s`` (H, L), relevant token 0 (docs/model.md section 3)."""
        return limit_loss(self.activation, s, 0, v)

    @abc.abstractmethod
    def risk(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> jax.Array:
        """Population risk ``R(M, Q, b) = E[(1 - a_eps)^2 + sum_{l != eps} a_l^2]`` (``v``: trained
        head weights, ``None`` for the head average)."""

    @abc.abstractmethod
    def gradient_moments(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> GradientMoments:
        """The field averages of the loss gradient that the SGD rule turns into the drift."""

    def risk_and_moments(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None
                         ) -> tuple[jax.Array, GradientMoments]:
        """:meth:`risk` and :meth:`gradient_moments` on the same rule at one state: two passes over it by default;
        a route whose moments see the loss at every node takes the risk from the same pass."""
        return self.risk(M, Q, b, v), self.gradient_moments(M, Q, b, v)

    @abc.abstractmethod
    def gram(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> jax.Array:
        """``E[sum_l c_l c_l^T]`` (H, H), the ``lr^2`` term of ``dQ``."""

    @abc.abstractmethod
    def attention_mass(self, M: jax.Array, Q: jax.Array, b: jax.Array) -> jax.Array:
        """``w_h = E[sum_l A_hl]`` (H,), the attention each head puts on the sequence
        (:mod:`~singleloc.analysis._attention_mass`)."""

    @classmethod
    def scrambling(cls, setup, points: int) -> AbstractExpectation:
        """One independent, unbiased scrambling of the route's rule (scrambling ``setup.theory.qmc_seed``) of the
        same shapes, for its error statement (:func:`solve_report`): by default :meth:`from_setup`'s."""
        return cls.from_setup(setup, points=points)

    @property
    def replicates(self) -> int:
        """Independent scramblings stacked along the leading axis of the rules (1 for one rule)."""
        return 1

    @property
    def sde_rule(self) -> LocalFields:
        """The Sobol rule of what only a rule computes: the second moments of the SDE's update
        (:func:`~singleloc.theory._fluctuations.update_moments`). ``ValueError`` for a route without one."""
        raise ValueError(f"theory.route = {self.route!r} has no Sobol rule for the SDE's covariance; pass one as fields "
                         "(integrate_sde builds the rule route's for any route) or use theory.route = 'rule'")

    @property
    @abc.abstractmethod
    def gram_name(self) -> str:
        """How the ``lr^2`` term is computed (``"exact"``, ``"sobol"``, ``"montecarlo"``), as a result states it."""

    @property
    def second_derivatives(self) -> bool:
        """Whether ``jax.jacobian`` of the drift is its derivative (:func:`~singleloc.analysis._drift_jacobian.drift_jacobian`);
        ``False`` where the route's derivative rule is exact to first order only (then finite differences)."""
        return True

    def resolves(self, M: jax.Array, Q: jax.Array, b: jax.Array) -> jax.Array:
        """Whether the route's rule resolves the fields of the state to its stated accuracy (a boolean array; a
        solve stops where it does not, :func:`~singleloc.integrate`): ``True`` for a rule over the fields themselves."""
        return jnp.ones((), bool)

    def risk_check(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> jax.Array:
        """The risk on a finer rule, whose difference to :meth:`risk` is the route's stated error
        (NaN for a route without one)."""
        return jnp.full((), jnp.nan, dtype=M.dtype)

    def drift_error(self, sgd, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> jax.Array:
        """The stated relative error of the ``O(lr)`` drift of the rule ``sgd`` at one state, against
        a finer rule (NaN for a route without one)."""
        return jnp.full((), jnp.nan, dtype=M.dtype)

    def gram_error(self, evaluation: AbstractExpectation, M: jax.Array, Q: jax.Array, b: jax.Array,
                   v: jax.Array | None = None) -> jax.Array:
        """The stated relative error of the ``lr^2`` term at one state, ``evaluation`` being the independent expectation
        of the same problem that evaluates the risks (0 for a route whose drift error is stated otherwise)."""
        return jnp.zeros((), M.dtype)

    def statement(self, report: SolveReport) -> RouteStatement:
        """What a result states about this route's error, from what the solve measured (``report``), with the warnings
        it calls for issued (NaN where the route has no such statement)."""
        return RouteStatement()


def times(n: int, unit: str, replicates: int) -> str:
    """``"n unit x R replicate(s)"``, as :meth:`AbstractExpectation.describe` says a rule's size."""
    return f"{n} {unit} x {replicates} replicate{'s' if replicates > 1 else ''}"


@dataclasses.dataclass(frozen=True)
class SolveReport:
    """What one point's solve measured for its route's statement (host arrays; leading axes starts, replicates): ``ys``
    the saved states (a tuple of the state's fields, each (S, R, T, ...)), ``check`` the absolute differences of the
    risk on the finer rule at the first and last saved time (S, R, 2), ``grams`` the Gram term's stated relative errors
    there (S, R, 2), ``risk_se`` the replicates' standard errors of the risk (S, T); ``evaluation`` the expectation that
    evaluated the risks and ``sgd`` the SGD rule; ``theory`` and ``prior`` the specifications the warnings name,
    ``points`` the Sobol points of the route's rule; ``scrambled`` (:class:`Scrambled`) the values of
    :data:`SCRAMBLINGS` independent scramblings of the route's rule at the first and last saved times (``None`` for a
    route with no scrambled rule)."""

    ys: tuple
    check: np.ndarray
    grams: np.ndarray
    risk_se: np.ndarray
    evaluation: AbstractExpectation
    sgd: object
    theory: Theory
    prior: Prior
    heads: int
    points: int
    scrambled: Scrambled | None = None


@dataclasses.dataclass(frozen=True)
class Scrambled:
    """What ``K`` independent, unbiased scramblings of a route's rule give at ``N`` states (the first and last
    saved times of every start), and the rules the solve used there: ``risk`` (K, N) and ``drift`` (K, N, P), the
    flattened drift, with ``used_risk`` (N,) on the rule that evaluated the risks and ``used_drift`` (N, P) on the
    rule that drove the trajectory (all ``None`` where only the Gram term is on a scrambled rule: the exact route),
    and ``gram`` (K, N, H, H), the ``lr^2`` term."""

    risk: np.ndarray | None
    drift: np.ndarray | None
    gram: np.ndarray
    used_risk: np.ndarray | None = None
    used_drift: np.ndarray | None = None

    def risk_error(self) -> float:
        """The error of the risk on the rule that evaluated it, against the mean of the scramblings (a finer,
        unbiased rule), plus twice that mean's standard error: the largest over the states."""
        K = self.risk.shape[0]
        return float(np.max(np.abs(self.used_risk - self.risk.mean(0)) + 2 * self.risk.std(0, ddof=1) / np.sqrt(K)))

    def drift_error(self) -> float:
        """The relative error of the drift of the rule that drove the trajectory, ``max |d - d'| / max |d'|``
        against the mean ``d'`` of the scramblings, plus twice that mean's estimated relative error
        (:func:`relative_drift_error` over ``sqrt(K)``): the largest over the states."""
        mean = self.drift.mean(0)
        own = np.max(np.abs(self.used_drift - mean), axis=-1) / np.max(np.abs(mean), axis=-1)
        return float(np.max(own + 2 * relative_drift_error(np.swapaxes(self.drift, 0, 1)) / np.sqrt(self.drift.shape[0])))

    def gram_errors(self) -> np.ndarray:
        """The relative standard error of ONE rule's Gram term at each state (N,): ``max sd / max |mean|``
        over the entries."""
        size = np.max(np.abs(self.gram.mean(axis=0)), axis=(-2, -1))
        return np.max(self.gram.std(axis=0, ddof=1), axis=(-2, -1)) / np.where(size > 0, size, np.nan)


def relative_drift_error(drifts: Real[ArrayLike, "*S R P"]) -> np.ndarray:
    """Estimated relative error ``max_i |d_i - d*_i| / max_i |d*_i|`` of ONE rule from the drifts (..., R, P) of ``R >=
    2`` independent rules (the estimate: :mod:`~singleloc.theory._accuracy`); divide by ``sqrt(R)`` for their mean."""
    d = np.asarray(drifts)
    R = d.shape[-2]
    if R < 2:
        raise ValueError("an error estimate needs at least two replicates")
    mean = d.mean(axis=-2, keepdims=True)
    others = (R * mean - d) / (R - 1)
    errors = np.sqrt((R - 1) / R) * np.max(np.abs(d - others), axis=-1)
    return errors.mean(axis=-1) / np.max(np.abs(mean[..., 0, :]), axis=-1)


def solve_report(setup, ys, risk, check, grams, risk_se, evaluation: AbstractExpectation, sgd, points: int) -> SolveReport:
    """The :class:`SolveReport` of one point's solve of ``setup``, with the route's scrambled statement at the first
    and last saved times of every start (its first replicate) by :data:`SCRAMBLINGS` further scramblings (seeds from
    ``theory.evaluation_seed + replicates`` on: none of the solve's rules), one rule at a time by one program: for a
    route over nodes of the fields (:attr:`~AbstractExpectation.field_nodes`) their risk, drift and Gram term, with
    the drift on the rule that drove the trajectory and the risk on the one that evaluated it (``risk`` (S, R, T));
    for a Gram term on a scrambled rule of its own (:attr:`AbstractGramTerm.scrambled`) the term, whose relative
    standard errors become ``grams``."""
    gram_term = getattr(evaluation, "gram_term", None)
    drift = evaluation.field_nodes
    scrambled = None
    if drift or (gram_term is not None and gram_term.scrambled):
        theory = setup.theory
        ends = lambda x: np.concatenate([x[:, 0, 0], x[:, 0, -1]])
        states = tuple(jnp.asarray(ends(x)) for x in ys)
        cls = type(evaluation)
        at = lambda seed: dataclasses.replace(setup, theory=dataclasses.replace(theory, qmc_seed=int(seed)))
        first = theory.evaluation_seed + theory.replicates
        used = {}
        with Phase((f"stating the quadrature's error: {SCRAMBLINGS} further scramblings at the start and the end",
                    "stated the quadrature's error"), quiet=True):
            values = [_at_states(cls.scrambling(at(first + k), points), sgd, states, drift) for k in range(SCRAMBLINGS)]
            if drift:
                used = {"used_risk": ends(np.asarray(risk)), "used_drift": np.asarray(
                    _at_states(cls.from_setup(at(theory.qmc_seed), points=points), sgd, states, True)[1])}
        scrambled = Scrambled(*(None if x[0] is None else np.stack([np.asarray(v) for v in x]) for x in zip(*values)), **used)
        if not drift:  # (S, R, 2): the same statement for every replicate
            S = ys[0].shape[0]
            grams = np.broadcast_to(scrambled.gram_errors().reshape(2, S).T[:, None, :], np.shape(grams))
    return SolveReport(ys, check, grams, risk_se, evaluation, sgd, theory=setup.theory, prior=setup.prior,
                       heads=setup.heads, points=points, scrambled=scrambled)


@filter_jit  # the solve's XLA options (singleloc.runtime._compilation)
def _at_states(expectation: AbstractExpectation, sgd, states, drift: bool):
    """``(risk, flat drift, Gram term)`` of ``expectation`` at the states (leading axis ``N``), or with
    ``drift = False`` ``(None, None, Gram term)``, one state at a time."""

    def one(s):
        if not drift:
            return expectation.gram(*s)
        risk, m = expectation.risk_and_moments(*s)
        return risk, flat_drift(sgd.drift(0.0, *s[:3], m)), m.cc

    out = jax.lax.map(one, states)
    return out if drift else (None, None, out)


@dataclasses.dataclass(frozen=True)
class RouteStatement:
    """A route's statement of its error on one solve (:class:`~singleloc.TheoryResult`'s fields of the same names):
    ``risk_error`` against a finer rule or a standard error, ``gram_error`` the relative error of the ``lr^2`` term,
    ``exact_drift_error`` the relative error of the ``O(lr)`` drift against a finer rule, ``drift_error`` that of the
    whole drift from scramblings (:func:`scrambled_statement`); NaN where the route states no such number."""

    risk_error: float = float("nan")
    gram_error: float = float("nan")
    exact_drift_error: float = float("nan")
    drift_error: float = float("nan")


def scrambled_statement(report: SolveReport, risk_error: float | None = None) -> RouteStatement:
    """The statement of a route whose averages are over nodes of the fields, from the scramblings at the ends
    (``report.scrambled``, :func:`solve_report`): the risk's error (or ``risk_error``, the route's own) and the
    drift's of the rules the solve used (of one of the ``theory.replicates``: an upper bound for their mean), and
    the Gram term's relative standard error (of their mean), the largest at the first and last saved times."""
    s = report.scrambled
    return RouteStatement(risk_error=s.risk_error() if risk_error is None else risk_error, drift_error=s.drift_error(),
                          gram_error=float(np.nanmax(s.gram_errors())) / np.sqrt(report.theory.replicates))

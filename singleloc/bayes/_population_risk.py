"""The population risk of a layer at given order parameters, with its numerical error.

:func:`population_risk` is ``R(M, Q, b)`` of docs/model.md section 3: on the exact route
(:mod:`~singleloc.expectations._laplace`) with its error against the finer rule, else on independently
scrambled Sobol rules with their standard error (:class:`RiskEstimate`). :func:`layer_risk` is
the one jitted entry point of a layer's risk that the Bayes baseline and pruning share.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Real

from ..expectations._expectation import AbstractExpectation
from ..expectations._laplace import NODES
from ..expectations._routes import JOINT_RISK_MAX, decide
from ..expectations._sobol_geometry import quadrature_dimension
from ..ground._arguments import require_finite
from ..ground._choices import REPLICATES_MAX
from ..ground._validation import integer
from ..model._activations import get_activation
from ..model._priors import Prior
from ..preflight._resources import OVERHEAD, available_memory, check_memory, check_quadrature, rule_bytes
from ..runtime._numerics import require_x64
from ..sgd._head_weighting import TrainedHeads, UniformHeads


@dataclasses.dataclass(frozen=True)
class RiskEstimate:
    """A risk computed by randomised quadrature, with its numerical error.

    ``value``: mean over independently scrambled rules of ``points`` Sobol points each (plus
    their mirrors); ``error``: the standard error of that mean (sample standard deviation of
    the replicates over ``sqrt(len(replicates))``); ``replicates``: the individual estimates.
    """

    value: float
    error: float
    replicates: tuple[float, ...]
    points: int

    @classmethod
    def from_replicates(cls, values, points: int) -> RiskEstimate:
        v = np.asarray(values, dtype=float)
        return cls(float(v.mean()), float(v.std(ddof=1) / np.sqrt(len(v))), tuple(float(x) for x in v), int(points))

    @classmethod
    def from_refinement(cls, value, refined) -> RiskEstimate:
        """An exact-route risk (:mod:`~singleloc.expectations._laplace`): ``value`` with the error
        ``|value - refined|`` against the finer rule; ``points = 0`` (no Sobol points)."""
        value, refined = float(value), float(refined)
        return cls(value, abs(value - refined), (value, refined), 0)

    def to_dict(self) -> dict:
        return {"value": self.value, "error": self.error, "replicates": list(self.replicates), "points": self.points}


def _check_counts(L, replicates) -> None:
    integer("problem.L", L, 2, example=4)
    integer("replicates (for the error estimate)", replicates, 2, REPLICATES_MAX, example=8)


def _check_rules(prior: Prior, L: int, points, heads: dict[str, tuple[int, bool]]) -> None:
    """The Sobol rules over ``L * H`` fields (``heads``: what plays the heads, for the message ->
    ``(H, rank_aware)``, the rank-aware layout holding ``2 L H`` coordinates) can be built with ``points``
    points, and the largest fits in memory; ``ValueError`` or ``MemoryError`` naming the keys otherwise."""
    points = int(points) if isinstance(points, np.integer) else points
    for key, (H, rank_aware) in heads.items():
        check_quadrature(int(L), H, prior, points, heads_key=key, principal=rank_aware)
    def largest(n: int, L: int = int(L)) -> int:
        return max(rule_bytes(L, H, prior, n, principal=rank_aware) for H, rank_aware in heads.values())

    limit, _ = available_memory()
    if OVERHEAD + largest(points) > limit:  # a value that fits: fewer points (down to the dimension), else fewer tokens
        low = max(16, *(1 << (quadrature_dimension(int(L), H, prior, r) - 1).bit_length() for H, r in heads.values()))
        fits = [f"theory.points = {n}" for n in (points >> k for k in range(1, 40))
                if low <= n and OVERHEAD + largest(n) <= limit]
        fits += [f"problem.L = {n}" for n in (int(L) >> k for k in range(1, 40))
                 if n >= 2 and OVERHEAD + largest(points, n) <= limit]
        check_memory({f"the quadrature (theory.points = {points})": largest(points)}, f"e.g. {fits[0]}" if fits else "")


@eqx.filter_jit
def layer_risk(expectation: AbstractExpectation, M, Q, b, v=None) -> jax.Array:
    """The risk of ``(M, Q, b)`` (head weights ``v``) on an expectation route, jitted: one compilation
    per rule shape and activation (the rule's nodes are traced arguments, so rescrambled rules reuse it)."""
    return expectation.risk(M, Q, b, v)


@eqx.filter_jit
def layer_risk_check(expectation: AbstractExpectation, M, Q, b, v=None) -> jax.Array:
    """:meth:`~singleloc.expectations._expectation.AbstractExpectation.risk_check` (the route's finer rule's risk), jitted."""
    return expectation.risk_check(M, Q, b, v)


def population_risk(prior: Prior, L: int, activation: str, M: Real[ArrayLike, "H F"], Q: Real[ArrayLike, "H H"],
                    b: Real[ArrayLike, " H"], points: int = 4096, seed: int = 0, replicates: int = 8, route: str = "auto",
                    v: Real[ArrayLike, " H"] | None = None, nodes: int = NODES) -> RiskEstimate:
    """Population risk ``R(M, Q, b)`` of a layer (docs/model.md section 3) with its numerical error.

    A normalised-exponential activation (``route = "auto"``): the exact route (:mod:`~singleloc.expectations._laplace`),
    its error against the finer rule (for a joint layer, bsoftmax, only up to
    :data:`~singleloc.expectations._routes.JOINT_RISK_MAX`: four spikes' Bayes point, not eight atoms'; ``route =
    "exact"`` whatever the size, within memory, else ``MemoryError``); otherwise (or ``route = "rule"``) the risk on
    ``replicates`` independently scrambled Sobol rules, with their standard error (``route = "montecarlo"``: on plain
    Monte Carlo draws of ``2 points`` sequences each). ``v`` (H,): trained head weights, ``a_l = sum_h v_h A_hl``
    (default the head average; a joint layer with weights has no exact route). ``nodes``: the exact route's node count,
    as ``theory.nodes`` (default 64; wide token fields, e.g. trained keys on a Gaussian prior of strength 3, need 128:
    the refined rule's error says so). The rule route first checks its rule over the ``L H`` fields (``ValueError`` or
    ``MemoryError``, as :func:`bayes_risk`); its rules are rank-aware (``theory.axes = "principal"``,
    :class:`~singleloc.LocalFields`): heads that are copies lose no accuracy."""
    _check_counts(L, replicates)
    get_activation(activation)  # an unknown activation is named before anything else
    dtype = jnp.result_type(float)
    M, Q, b = (jnp.asarray(x, dtype) for x in (M, Q, b))
    H = M.shape[0]
    if M.ndim != 2 or M.shape[1] != prior.F or Q.shape != (H, H) or b.shape != (H,):
        raise ValueError(f"order parameters must have shapes M (H, {prior.F}), Q (H, H), b (H,), "
                         f"got {M.shape}, {Q.shape}, {b.shape}")
    require_finite("population_risk", M=M, Q=Q, b=b)  # (a NaN risk otherwise)
    if v is not None:
        v = jnp.asarray(v, dtype)
        if v.shape != (H,) or not bool(jnp.all(jnp.isfinite(v))):
            raise ValueError(f"head weights v must be finite with shape ({H},), got shape {v.shape}")
    nodes = integer("nodes", nodes, 8, 1024)  # the bounds of theory.nodes
    weighting = UniformHeads() if v is None else TrainedHeads()  # given weights v: not the head average
    choice = decide(activation, int(L), H, prior, route, weighting=weighting, budget=JOINT_RISK_MAX, key="route")
    route = choice.route_class  # the registry's class, which builds the route's rules (AbstractExpectation.for_risk)
    if route.field_nodes:
        _check_rules(prior, L, points, {"model.heads": (H, True)})
    elif need := route.rule_bytes(choice, H, prior):  # a joint layer's exact rule grows with H and the atoms
        check_memory({f"the exact route's rule ({activation}, {H} heads, {len(prior.atoms)} atoms of the prior)": need})
    if route.refined_error:  # one rule, its error against its finer copy
        require_x64(f"population_risk on the {choice.route} route")  # (in float32: a NaN risk)
        e = route.for_risk(choice, prior, int(L), H, points, seed, nodes)
        return RiskEstimate.from_refinement(layer_risk(e, M, Q, b, v), layer_risk_check(e, M, Q, b, v))
    values = [float(layer_risk(route.for_risk(choice, prior, int(L), H, points, seed + i, nodes), M, Q, b, v))
              for i in range(int(replicates))]
    return RiskEstimate.from_replicates(values, points)

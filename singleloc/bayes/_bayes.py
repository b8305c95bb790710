"""The Bayes-optimal baseline of docs/model.md section 6.

Posterior of the location. Given a sequence, only the spike fields ``nu_l`` (F,) of the tokens carry information on
``eps``: under ``eps = l`` token ``l`` has ``nu_l ~ N(theta, I_F)`` and every other token ``N(0, I_F)``, so

    p_l = w(nu_l) / sum_l' w(nu_l'),     w(nu) = E_theta[ exp(theta . nu - |theta|^2 / 2) ].

The Bayes estimator ``sum_l p_l x_l`` has the limit risk ``E[(1 - p_eps)^2 + sum_{l != eps} p_l^2]`` (the loss of
docs/model.md section 3 with ``a = p``).

The log-weight in closed form. Every prior is a mixture of ``N(a_k, S)`` with probabilities ``pi_k`` and a common
covariance ``S`` (``S = 0`` for the discrete priors). For one component, completing the square in ``theta`` gives, for
any PSD ``S`` (singular included),

    E_{theta ~ N(a, S)}[exp(theta . nu - |theta|^2/2)]
        = det(I + S)^{-1/2} exp( a . nu - |a|^2/2 + 1/2 (nu - a)^T S (I + S)^{-1} (nu - a) ),

so ``log w(nu) = logsumexp_k [log pi_k + a_k . nu - |a_k|^2/2 + 1/2 (nu - a_k)^T S (I+S)^{-1} (nu - a_k)] - 1/2 logdet(I
+ S)``. For ``S = 0`` this is the finite sum over the support; for one Gaussian ``N(mu, S)`` with ``S`` invertible its
``nu``-dependent part equals docs/model.md's ``1/2 (S^-1 mu + nu)^T (S^-1 + I)^-1 (S^-1 mu + nu)`` (use ``(S^-1 + I)^-1
= S (I + S)^-1`` and ``(S^-1 + I)^-1 S^-1 = (I + S)^-1``).

The expectation over ``nu``, two routes. Exact: for a discrete prior the Bayes estimator is a bsoftmax layer (Bayes
points, below), whose risk the exact route computes by the Laplace form of its normaliser whatever ``L``
(:mod:`~singleloc.expectations._laplace`; error stated against the refined rule, 1e-12 at the spikes priors);
:func:`bayes_risk` takes it where the layer's rule is affordable (:func:`bayes_route`: up to four spikes, or four binary
or flipped atoms). Rule: the spike fields have the law of head fields with ``H = F``, ``M = I_F``, ``Q = I_F`` (``g =
nu``), so the risk is one :meth:`LocalFields.expect` with those order parameters; :func:`bayes_risk` averages
``replicates`` independently scrambled rules and reports their standard error (randomised QMC), so the error estimate is
measured, not assumed; :func:`~singleloc.population_risk` does the same for the risk of a layer at given ``(M, Q, b)``.
The two routes share no code past the prior: the rule's closed-form posterior is the exact route's independent check.

Bayes points. For a discrete prior with ``K`` atoms (of positive probability), bsoftmax with ``H = K`` heads, ``M_h =
theta^(h)``, ``R_orth = 0`` (``Q = M M^T``) and ``b_h = log pi_h - |theta^(h)|^2 / 2`` has scores ``s_hl = theta^(h) .
nu_l + b_h`` and weights ``a_l = sum_h exp(s_hl) / sum_{h', l'} exp(s_h'l') = p_l``: it *is* the Bayes estimator
(:func:`bayes_point`). With one atom (``K = 1``), bsoftmax with one head is softmax, so the same point is the softmax
Bayes point (``M = strength``, ``Q = strength^2`` for F = 1).

Checks. A Sobol rule is checked before it is built (``ValueError`` or ``MemoryError`` naming the keys);
:func:`check_bayes` checks both rules of ``singleloc bayes`` at once.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Real

from ..expectations._fields import LocalFields
from ..expectations._routes import JOINT_RISK_MAX, decide, route_class
from ..model._priors import Prior
from ..theory._theory import OrderParameters
from ._population_risk import RiskEstimate, _check_counts, _check_rules, population_risk


def _weight_params(prior: Prior, dtype):
    """The arrays of the closed form, of ``dtype``: atoms (K, F), log pi (K,), ``G = S (I + S)^-1`` (F, F) or
    ``None`` for a discrete prior, and ``logdet(I + S)``."""
    atoms, G, logdet = prior.atoms_array(), None, 0.0
    with np.errstate(divide="ignore"):
        log_pi = np.log(prior.probs_array())  # -inf for atoms of probability 0
    if not prior.is_discrete:
        S = np.asarray(prior.noise_cov, dtype=float)
        eye = np.eye(S.shape[0])
        G, logdet = np.linalg.solve(eye + S, S), float(np.linalg.slogdet(eye + S)[1])
    return tuple(None if x is None else jnp.asarray(x, dtype) for x in (atoms, log_pi, G, logdet))


def _log_weight(nu, atoms, log_pi, G, logdet):
    lin = nu @ atoms.T - 0.5 * jnp.sum(atoms**2, axis=-1) + log_pi  # (..., K)
    if G is None:
        return jax.nn.logsumexp(lin, axis=-1)
    d = nu[..., None, :] - atoms  # (..., K, F)
    quad = 0.5 * jnp.einsum("...kf,fg,...kg->...k", d, G, d)
    return jax.nn.logsumexp(lin + quad, axis=-1) - 0.5 * logdet


def log_weight(prior: Prior, nu: Real[ArrayLike, "*S F"]) -> jax.Array:
    """``log E_theta[exp(theta . nu - |theta|^2 / 2)]`` for spike fields ``nu`` (..., F).

    Exact (closed form per mixture component), valid for singular covariances; the result has
    the shape ``nu.shape[:-1]``.
    """
    dtype = jnp.result_type(jnp.asarray(nu).dtype, float)
    return _log_weight(jnp.asarray(nu, dtype), *_weight_params(prior, dtype))


def posterior(prior: Prior, nu: Real[ArrayLike, "*S F"]) -> jax.Array:
    """Posterior of the location ``p`` (..., L) from the spike fields ``nu`` (..., L, F)."""
    return jax.nn.softmax(log_weight(prior, nu), axis=-1)


def check_bayes(prior: Prior, L: int, points: int) -> None:
    """The rules of the Bayes risk (over ``L F`` fields, :func:`bayes_risk`) and, for a discrete
    prior, of the risk at its Bayes point (``K`` heads, the atoms: :func:`bayes_point`,
    :func:`~singleloc.population_risk`) can be built with ``points`` Sobol points and fit in memory,
    checked before either is computed; ``ValueError`` or ``MemoryError`` naming the keys."""
    _check_counts(L, 2)
    atoms = {"the number of atoms of the prior": (len(prior.atoms), True)} if prior.is_discrete else {}  # population_risk's
    _check_rules(prior, L, points, {"problem.F": (prior.F, False), **atoms})


@eqx.filter_jit
def _bayes_risk_on_rule(rule: LocalFields, params) -> jax.Array:
    F = rule.atoms.shape[1]
    eye = jnp.eye(F, dtype=rule.w.dtype)

    def loss(nu, theta):
        p = jax.nn.softmax(_log_weight(nu, *params), axis=-1)
        return (1.0 - p[0]) ** 2 + jnp.sum(p[1:] ** 2)

    return rule.expect(loss, eye, eye)


#: The routes of the Bayes risk (a layer's ``theory.route`` but ``"montecarlo"``: the posterior on the Sobol
#: rule is the Bayes risk's independent check).
BAYES_ROUTES = ("auto", "exact", "rule")


def bayes_route(prior: Prior, route: str = "auto") -> str:
    """The route of :func:`bayes_risk`: ``"exact"`` or ``"rule"`` (module docstring). ``route``:
    ``"auto"`` takes the exact route for a discrete prior whose Bayes point is affordable there
    (:data:`~singleloc.expectations._routes.JOINT_RISK_MAX`); ``"exact"`` for any discrete prior
    (``ValueError`` for one with a Gaussian part); ``"rule"`` never."""
    if route not in BAYES_ROUTES:
        raise ValueError(f"route must be one of {', '.join(map(repr, BAYES_ROUTES))}, got {route!r}")
    if route != "auto" and not route_class(route).field_nodes and not prior.is_discrete:
        raise ValueError(f"route (theory.route) = {route!r}: prior {prior.name!r} has a Gaussian part, so the Bayes "
                         "estimator is no finite bsoftmax layer and has no exact route; use 'auto' or 'rule' (the Sobol rule)")
    # the Bayes estimator of a discrete prior is bsoftmax with K heads: that layer's route, decided as any layer's
    K = int(np.sum(prior.probs_array() > 0))
    return decide("bsoftmax", 2, K, prior, route if prior.is_discrete else "rule", budget=JOINT_RISK_MAX, key="route").route


def bayes_risk(prior: Prior, L: int, points: int = 4096, seed: int = 0, replicates: int = 8,
               route: str = "auto") -> RiskEstimate:
    """Bayes risk ``E[(1 - p_eps)^2 + sum_{l != eps} p_l^2]`` of the location for ``L`` tokens.

    Two routes (:func:`bayes_route`, module docstring): the exact one (``points = 0`` in the result, its error
    against the refined rule) or ``replicates`` scrambled Sobol rules with their standard error. The rule's stated
    error is its scatter between scramblings: at long sequences it misses a bias (two spikes at ``L = 64``: 3.4e-3
    low, 7.5 stated errors, against the exact route and plain Monte Carlo; docs/model.md 6.5).

    Args:
        prior: the prior of ``theta``.
        L: sequence length (>= 2).
        points: Sobol points per rule (a power of two); each rule also uses their mirrors.
        seed: scrambling seed of the first rule; replicate ``i`` uses ``seed + i``.
        replicates: number of independent scramblings (>= 2, for the error estimate).
        route: ``"auto"`` (default), ``"exact"`` or ``"rule"`` (:func:`bayes_route`).

    Raises:
        ValueError: an unknown ``route``, ``"exact"`` for a prior with a Gaussian part, or a rule over
            the ``L F`` spike fields that cannot be built with ``points`` points (too few, or more
            dimensions than SciPy's Sobol sequence has).
        MemoryError: the rule does not fit in the available memory (:mod:`singleloc.preflight._resources`).
    """
    _check_counts(L, replicates)
    chosen = route_class(bayes_route(prior, route))
    if not chosen.field_nodes:  # the Bayes point's bsoftmax layer on the exact route
        M, Q, b = bayes_point(prior)
        return population_risk(prior, L, "bsoftmax", M, Q, b, route=chosen.route)
    _check_rules(prior, L, points, {"problem.F": (prior.F, False)})
    params = _weight_params(prior, jnp.result_type(float))
    # unwhitened, as population_risk's: the whitening's bias was 30 standard errors at L = 64, 512 points
    rules = (LocalFields.make(int(L), prior.F, prior, points, seed + i, whiten=False) for i in range(int(replicates)))
    return RiskEstimate.from_replicates([float(_bayes_risk_on_rule(rule, params)) for rule in rules], points)


def bayes_point(prior: Prior, dtype=None) -> OrderParameters:
    """Order parameters at which bsoftmax with ``H = K`` heads is the Bayes estimator.

    ``K`` is the number of atoms of positive probability of a discrete prior; head ``h`` gets
    ``M_h = theta^(h)``, ``Q = M M^T`` (``R_orth = 0``) and ``b_h = log pi_h - |theta^(h)|^2/2``.
    For a one-atom prior (``K = 1``) this is also the softmax Bayes point (biases cancel).

    Raises:
        ValueError: the prior has a Gaussian part (no finite number of heads is exact).
    """
    if not prior.is_discrete:
        raise ValueError(f"prior {prior.name!r} has a Gaussian part: the Bayes estimator is not a finite bsoftmax layer "
                         "(bayes_point needs a discrete prior)")
    probs = prior.probs_array()
    keep = probs > 0
    atoms = prior.atoms_array()[keep]
    dtype = jnp.result_type(float) if dtype is None else dtype
    M = jnp.asarray(atoms, dtype)
    b = jnp.asarray(np.log(probs[keep]) - 0.5 * np.sum(atoms**2, axis=1), dtype)
    return OrderParameters(M, M @ M.T, b)

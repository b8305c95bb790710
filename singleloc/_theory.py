"""Population risk and the order-parameter drift of docs/model.md section 5, by autodiff.

Write ``f(s) = l_inf(s)`` for the limit loss as a function of the scores ``s`` (H, L) with
the relevant token at 0, and ``c = df/ds`` (autodiff). docs/model.md's drift is

    dM/dtau  = -lr E[sum_l c_l nu_l^T]
    dQ/dtau  = -lr E[sum_l (c_l g_l^T + g_l c_l^T)] + lr^2 E[sum_l c_l c_l^T]
    db/dtau  = -lr E[sum_l c_l]                      (only when biases train).

for plain online SGD. The rule itself lives in :mod:`~singleloc._sgd_rule`
(:class:`~singleloc.OnlineSGD`): this module computes the field averages it is made of
(:class:`~singleloc.GradientMoments`: ``E[sum_l c_l nu_l^T]``, ``E[sum_l c_l g_l^T]``,
``E[sum_l c_l]``, ``E[sum_l c_l c_l^T]``), and the rule turns them into the drift.

The quadrature draws ``g_l = Q^{1/2} w_l`` (plus ``M theta`` on token 0) and never ``nu``:
given ``theta``, ``(g_l, nu_l)`` is Gaussian with ``Cov(g_l, nu_l) = M``, so
``E[nu_l | g_l] = M^T Q^+ (g_l - E g_l)`` (plus ``theta`` on token 0). With

    P = E[c_0 theta^T]  (H, F),        W = E[sum_l c_l w_l^T]  (H, H),

this gives ``E[sum_l c_l nu_l^T] = P + W (Q^+)^{1/2} M`` and
``E[sum_l c_l g_l^T] = P M^T + W Q^{1/2}``, so

    dM/dtau = -lr (P + W (Q^+)^{1/2} M),
    dQ/dtau = -lr (P M^T + M P^T + W Q^{1/2} + Q^{1/2} W^T) + lr^2 E[sum_l c_l c_l^T].

Only first derivatives of the loss enter (pathwise estimators, of lower variance than the
Hessian form of Stein's lemma, which we measured at up to 5x the error for large ``Q``).
The pseudo-inverse root is safe when ``Q`` is singular: ``|(Q^+)^{1/2} M| <= 1`` because
``Q - M M^T`` is PSD, and a direction in which ``Q`` vanishes carries no field.

The ``O(lr)`` part is the gradient flow of the population risk ``R(M, Q, b) = E[f]`` through
the order parameters; ``tests/test_theory.py`` checks it against derivatives of ``R`` alone
and against plain Monte Carlo over ``(g, nu)``. Nothing here depends on the activation:
any registered activation gets its ODE from autodiff.

The exact route. For a normalised-exponential activation (:mod:`~singleloc._laplace`) the
risk is computed exactly, and the ``O(lr)`` drift is its gradient: with ``G_M, G_Q, G_b`` the
derivatives of ``R`` (``Q``'s entries as independent arguments) and ``S = G_Q + G_Q^T``,
the mean SGD step of the keys is ``-lr D grad_{k_h} R = -lr (sum_f G_M[h, f] k*_f + sum_h' S[h, h'] k_h')``,
so

    dM/dtau = -lr (G_M + S M),
    dQ/dtau = -lr (G_M M^T + S Q + (G_M M^T + S Q)^T) + lr^2 E[sum_l c_l c_l^T],
    db/dtau = -lr G_b.

The derivatives are exact and finite at identical heads (Price's theorem inside the rule).
The ``lr^2`` (Gram) term of one head is exact too (a polynomial of degree six in the token
weights, whose moments the Laplace form gives: :mod:`~singleloc._laplace_gram`), and of two heads
with ``theory.gram = "exact"``. Otherwise, a product of two gradients with up to four distinct heads per term
(four Laplace variables: no cheap exact form), it stays on a Sobol rule, the rank-aware one of
``gram_fields`` (the well-defined principal axes of ``Q`` on coordinates of their own, the rest on a
symmetric root: :func:`~singleloc._numerics.rank_aware_factor_and_pinv`): at trained states with
(near) copies of six heads it has an eighth to a fiftieth of the error of the head-symmetric rule at
the same points, the same for distinct heads (``benchmarks/06_exact_route.py``), with
``theory.gram_points`` points (16384 by default for ``L * H <= 256``:
:meth:`~singleloc.Theory.gram_rule_points`). Its error is stated with the solve (the Gram on the
evaluation rule's scrambling against the dynamics rule's, at the start and the end).
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp

from ._activations import Activation, exponential_form, get_activation
from ._arguments import require_arrays
from ._config import Config, gather_specs, require_config
from ._fields import LocalFields, replicate_rules
from ._laplace import LaplaceRule, exact_rule
from ._layer import limit_loss
from ._numerics import require_x64
from ._resources import on_exact_route
from ._sgd_rule import GradientMoments, OnlineSGD, OrderParameters, WeightedOrderParameters, flat_drift, sgd_rule
from ._specs import SGD, Model, Problem, Theory


def r_orth(M: jax.Array, Q: jax.Array) -> jax.Array:
    """``R_orth = Q - M M^T``: Gram matrix of the key components orthogonal to the spikes."""
    require_arrays("r_orth", M=M, Q=Q)
    return Q - M @ M.T


class OrderParameterODE(eqx.Module):
    """Population risk and drift for one problem, layer and SGD rule.

    ``OrderParameterODE(fields, activation, lr, train_bias, ...)`` is plain online SGD
    (:class:`~singleloc.OnlineSGD`); ``OrderParameterODE(fields, activation, sgd=rule, ...)``
    takes any rule. ``lr`` and ``train_bias`` read the rule's.

    Attributes:
        fields: the quadrature rule over the local fields.
        activation: the attention activation (scores (H, L) -> weights (H, L)).
        sgd: the SGD rule (:mod:`~singleloc._sgd_rule`), which turns the field averages of the
            loss gradient into the drift; its numbers are arrays (values the compiled programs
            receive, so that ODEs that differ only in the learning rate share their programs).
        exact: the exact rule of the risk and of the ``O(lr)`` drift (module docstring), or
            ``None`` (the Sobol rule for everything).
        exact_check: a finer exact rule (:meth:`~singleloc._laplace.LaplaceRule.refined`)
            whose risk states the error of ``exact``'s (:meth:`risk_check`), or ``None``.
        gram_fields: on the exact route, the rank-aware (principal) Sobol rule of the ``lr^2``
            term (:meth:`gram`); ``None`` on the rule route, where ``fields`` serves for all, and
            where the exact route has the term exactly (:attr:`exact_gram`).
    """

    fields: LocalFields
    activation: Activation = eqx.field(static=True)
    sgd: OnlineSGD
    exact: LaplaceRule | None = None
    exact_check: LaplaceRule | None = None
    gram_fields: LocalFields | None = None

    def __init__(self, fields: LocalFields, activation: Activation, lr=None, train_bias: bool | None = None,
                 exact: LaplaceRule | None = None, exact_check: LaplaceRule | None = None,
                 gram_fields: LocalFields | None = None, *, sgd: OnlineSGD | None = None):
        if sgd is None:
            if lr is None:
                raise TypeError("OrderParameterODE needs the learning rate lr (plain online SGD) or an SGD rule sgd=")
            sgd = OnlineSGD(lr, bool(train_bias))
        elif lr is not None or train_bias is not None:
            raise TypeError("OrderParameterODE takes either lr and train_bias or sgd=, not both (the rule holds them)")
        self.fields, self.activation = fields, activation
        self.sgd = jax.tree.map(jnp.asarray, sgd)
        self.exact, self.exact_check, self.gram_fields = exact, exact_check, gram_fields

    @property
    def lr(self) -> jax.Array:
        """The learning rate of the SGD rule (at ``tau = 0``)."""
        return self.sgd.learning_rate(0.0)

    @property
    def train_bias(self) -> bool:
        """Whether the biases train (the SGD rule's)."""
        return self.sgd.train_bias

    @classmethod
    def from_specs(cls, problem: Problem | None = None, model: Model | None = None, sgd: SGD | None = None,
                   theory: Theory | None = None, *, seeds: Sequence[int] | None = None, points: int | None = None,
                   check: bool = False) -> OrderParameterODE:
        """The ODE of the specifications (defaults for those not given): the data ``problem``,
        the layer ``model``, the SGD rule ``sgd`` and the numerics ``theory``; the other
        arguments as :meth:`from_config`'s, which this is on the bundle of the four."""
        config = gather_specs("OrderParameterODE.from_specs", problem=problem, model=model, sgd=sgd, theory=theory)
        return cls.from_config(config, seeds=seeds, points=points, check=check)

    @classmethod
    def from_config(cls, config: Config, *, seeds: Sequence[int] | None = None, points: int | None = None,
                    check: bool = False) -> OrderParameterODE:
        """The ODE of a configuration, with its rule closed under the cyclic head shifts.

        ``seeds``: a stack of rules with these scrambling seeds (leading axis, see
        :func:`~singleloc.replicate_rules`) instead of the one rule of ``theory.qmc_seed``;
        ``points``: instead of ``theory.points`` (which must be a number here:
        :func:`~singleloc.resolve_points` resolves ``"auto"``). The exact rule follows ``theory.route`` (:func:`exact_route`);
        ``check``: with its finer copy for :meth:`risk_check`.
        """
        require_config(config, "OrderParameterODE.from_config")
        require_x64("the order-parameter ODE")
        pb, th = config.problem, config.theory
        points = th.points if points is None else points
        if not isinstance(points, int):
            raise ValueError(f"theory.points = {points!r}: a number is needed here; resolve 'auto' first with "
                             "singleloc.resolve_points(config) (integrate does it itself)")
        H, prior = config.model.heads, pb.build_prior()

        def sobol_rule(n=points, **kind):
            if seeds is None:
                return LocalFields.make(pb.L, H, prior, n, th.qmc_seed, **kind)
            return replicate_rules(pb.L, H, prior, n, seeds, **kind)

        def per_replicate(rule):  # one exact rule for every replicate (it has no scrambling)
            if rule is None or seeds is None:
                return rule
            return jax.tree.map(lambda x: jnp.broadcast_to(x, (len(seeds), *x.shape)), rule)

        exact = per_replicate(exact_route(config))
        fine = per_replicate(exact_route(config, refined=True)) if check and exact is not None else None
        exact_gram = exact is not None and exact_gram_term(config, exact)
        gram = sobol_rule(th.gram_rule_points(pb.L, H, points), principal=True) if exact is not None and not exact_gram else None
        axes = {"principal": True} if th.rank_aware else {"symmetric": True}
        return cls(sobol_rule(**axes), get_activation(config.model.activation), exact=exact, exact_check=fine,
                   gram_fields=gram, sgd=sgd_rule(config))

    def _loss(self, s: jax.Array, v: jax.Array | None = None) -> jax.Array:
        return limit_loss(self.activation, s, 0, v)

    def risk(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> jax.Array:
        """Population risk ``R(M, Q, b) = E[(1 - a_eps)^2 + sum_{l != eps} a_l^2]``: exact on the
        exact route, else on the Sobol rule. ``v``: trained head weights (``None``: the head
        average)."""
        if self.exact is not None:
            return self.exact.risk(M, Q, b, v)
        return self.fields.expect(lambda g, theta: self._loss(g.T + b[:, None], v), M, Q)

    def risk_check(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> jax.Array:
        """The risk on the finer exact rule ``exact_check`` (NaN without one): its difference to
        :meth:`risk` is the stated error of the exact route."""
        if self.exact_check is None:
            return jnp.full((), jnp.nan, dtype=M.dtype)
        return self.exact_check.risk(M, Q, b, v)

    @property
    def exact_gram(self) -> bool:
        """Whether the ``lr^2`` Gram term is exact too (the exact route with ``theory.gram`` asking for it
        where it can: :func:`exact_gram_term`, :mod:`~singleloc._laplace_gram`)."""
        return self.exact is not None and self.gram_fields is None

    def gram(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> jax.Array:
        """``E[sum_l c_l c_l^T]`` (H, H), the ``lr^2`` term of ``dQ``: exactly where :attr:`exact_gram`
        (one head, or two: ``theory.gram``), else on the Sobol rule (the rank-aware ``gram_fields`` on the
        exact route)."""
        if self.exact_gram:
            if v is not None:
                raise ValueError("the exact Gram term takes the head average only (model.head_weights = 'trained' "
                                 "builds the ODE with its Sobol rule)")
            return self.exact.gram(M, Q, b)

        def integrand(g, theta):
            c = jax.grad(self._loss)(g.T + b[:, None], v)
            return c @ c.T

        return (self.fields if self.gram_fields is None else self.gram_fields).expect(integrand, M, Q)

    def moments(self, M: jax.Array, Q: jax.Array, b: jax.Array, factor: jax.Array | None = None,
                v: jax.Array | None = None) -> dict[str, jax.Array]:
        """The field averages the drift is made of: ``risk``, ``c_sum`` = E[sum_l c_l] (H,),
        ``P`` (H, F), ``W`` = E[sum_l c_l w_l^T] (H, H) and ``cc`` = E[sum_l c_l c_l^T] (H, H);
        ``factor``: the rule's factor ``S`` of ``Q`` (:meth:`~singleloc.LocalFields.factors`) if
        already known; with head weights ``v``, also ``cv`` = E[dl/dv] (H,)."""

        def integrand(g, theta, w):
            if v is None:
                f, c = jax.value_and_grad(self._loss)(g.T + b[:, None])
                extra = {}
            else:
                f, (c, cv) = jax.value_and_grad(self._loss, argnums=(0, 1))(g.T + b[:, None], v)
                extra = {"cv": cv}
            return {"risk": f, "c_sum": jnp.sum(c, axis=1), "P": jnp.outer(c[:, 0], theta), "W": c @ w, "cc": c @ c.T,
                    **extra}

        return self.fields.expect(integrand, M, Q, factor=factor, with_noise=True)

    def gradient_moments(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> GradientMoments:
        """The field averages of the loss gradient the drift is made of (module docstring): on the
        rule, whose fields are ``g_l = w_l S`` with ``T = S Q^+`` (:meth:`~singleloc.LocalFields.factors`),
        ``E[sum_l c_l nu_l^T] = P + W T M`` and ``E[sum_l c_l g_l^T] = P M^T + W S``; on the exact route,
        ``G_M + G M`` and ``G_M M^T + G Q`` (``G = G_Q + G_Q^T``) from the exact risk's gradient, with
        ``G_b`` and the rule's Gram term. With head weights ``v``: ``cv = dR/dv``
        (exact, or on the rule)."""
        if self.exact is not None:
            return _exact_moments(self.exact, M, Q, b, v, self.gram(M, Q, b, v))
        S, T = self.fields.factors(Q)
        m = self.moments(M, Q, b, S, v)
        P, W = m["P"], m["W"]
        return GradientMoments(P + W @ (T @ M), P @ M.T + W @ S, m["c_sum"], m["cc"], m.get("cv"))

    def drift(self, M: jax.Array, Q: jax.Array, b: jax.Array, tau=0.0, v: jax.Array | None = None
              ) -> OrderParameters | WeightedOrderParameters:
        """``(dM, dQ, db) / dtau`` of docs/model.md section 5 at time ``tau`` (``db = 0`` unless
        biases train): the SGD rule's mean update (:meth:`~singleloc.OnlineSGD.drift`) of
        :meth:`gradient_moments`; with trained head weights ``v``, also ``dv / dtau``
        (:class:`~singleloc.WeightedOrderParameters`)."""
        return self.sgd.drift(tau, M, Q, b, self.gradient_moments(M, Q, b, v))

    def exact_drift_error(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> jax.Array:
        """The stated relative error of the exact route's ``O(lr)`` drift at one state: ``max |d - d'| /
        max |d'|`` over the entries of the drift without its ``lr^2`` (Gram) term, ``d`` on the exact
        rule and ``d'`` on its finer copy ``exact_check`` (NaN without one). The risk's error alone can
        hide a drift that is far off: at token variances ``alpha^2 Q_hh`` of 50 and more (ssmax at
        ``L = 64``) a risk error of 1e-3 came with drift errors of order one."""
        if self.exact_check is None:
            return jnp.full((), jnp.nan, dtype=M.dtype)
        no_gram = jnp.zeros(Q.shape, Q.dtype)
        flat = lambda rule: flat_drift(self.sgd.drift(0.0, M, Q, b, _exact_moments(rule, M, Q, b, v, no_gram)))
        d, fine = flat(self.exact), flat(self.exact_check)
        return jnp.max(jnp.abs(d - fine)) / jnp.max(jnp.abs(fine))

    def state_drift(self, y: OrderParameters | WeightedOrderParameters, tau=0.0
                    ) -> OrderParameters | WeightedOrderParameters:
        """:meth:`drift` of a state ``y`` of either kind (the vector field of the solve)."""
        return self.drift(y.M, y.Q, y.b, tau, getattr(y, "v", None))

    def state_risk(self, y: OrderParameters | WeightedOrderParameters) -> jax.Array:
        """:meth:`risk` of a state ``y`` of either kind."""
        return self.risk(y.M, y.Q, y.b, getattr(y, "v", None))


@jax.jit
def _risk_gradient(rule: LaplaceRule, M, Q, b, v=None):
    """``(dR/dM, dR/dQ, dR/db, dR/dv)`` of the exact risk (``dR/dv`` ``None`` without head
    weights). Jitted on its own, so that a solve that evaluates the drift at several places
    (diffrax's first step, its stages, the start) traces it once."""
    if v is None:
        return (*jax.grad(rule.risk, argnums=(0, 1, 2))(M, Q, b), None)
    return jax.grad(rule.risk, argnums=(0, 1, 2, 3))(M, Q, b, v)


def _exact_moments(rule: LaplaceRule, M, Q, b, v, cc) -> GradientMoments:
    """The field averages of the exact route (module docstring), ``cc`` the Gram term."""
    GM, GQ, Gb, Gv = _risk_gradient(rule, M, Q, b, v)
    S = GQ + GQ.T
    return GradientMoments(GM + S @ M, GM @ M.T + S @ Q, Gb, cc, Gv)


def exact_route(config: Config, *, refined: bool = False) -> LaplaceRule | None:
    """The exact rule ``theory.route`` asks for (the decision is
    :func:`~singleloc._resources.on_exact_route`'s): ``None`` for ``"rule"`` and, with ``"auto"``,
    for an activation that is not a normalised exponential; ``"exact"`` with such an activation
    raises. ``refined``: the finer rule of the error statement."""
    th, pb, H = config.theory, config.problem, config.model.heads
    if not on_exact_route(config):
        if th.route == "exact" and config.model.trained_head_weights and exponential_form(
                get_activation(config.model.activation), pb.L) is not None:
            raise ValueError(f"theory.route = 'exact': activation {config.model.activation!r} with model.head_weights = "
                             "'trained' has no exact route (a joint layer's head mixture is not a normalised "
                             "exponential); use 'auto' or 'rule'")
        if th.route == "exact":
            raise ValueError(f"theory.route = 'exact': activation {config.model.activation!r} is not a normalised "
                             "exponential (softmax, softmax1, bsoftmax, ssmax or one declaring exponential_form); use "
                             "'auto' or 'rule'")
        return None
    rule = exact_rule(get_activation(config.model.activation), pb.L, H, pb.build_prior(), nodes=th.nodes)
    return rule.refined() if refined else rule


#: ``theory.gram = "auto"`` takes the exact Gram term of two heads from this many fields ``L * H`` on:
#: there it costs less than the Sobol rule's share of a drift (one Gram term at a trained ``H = 2``
#: state, shared 2-core machine: 41 against 21 ms at ``L = 8``, 44 against 53 ms at ``L = 32``, 46
#: against 276 ms at ``L = 256``), whose points shrink from ``L * H > 256`` on to fit its memory budget.
GRAM_EXACT_FROM = 64


def exact_gram_term(config: Config, exact: LaplaceRule) -> bool:
    """Whether the exact route ``exact`` of ``config`` has the ``lr^2`` Gram term exactly
    (``theory.gram``: ``"exact"`` for one or two heads of a per-head layer with the head average;
    ``"auto"`` for one head, and for two from ``L * H >=`` :data:`GRAM_EXACT_FROM` on;
    :mod:`~singleloc._laplace_gram`)."""
    choice, H = config.theory.gram, config.model.heads
    possible = exact.exact_gram and not config.model.trained_head_weights
    if choice == "exact" and not possible:
        why = ("trained head weights" if config.model.trained_head_weights else
               "a joint layer" if exact.form.joint else f"H = {H}")
        raise ValueError(f"theory.gram = 'exact': the exact Gram term takes one head, or two heads of a per-head layer "
                         f"with the head average, not {why}; use 'auto' or 'sobol'")
    auto = H == 1 or config.problem.L * H >= GRAM_EXACT_FROM
    return possible and (choice == "exact" or (choice == "auto" and auto))


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

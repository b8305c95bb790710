"""Exact population risk of normalised-exponential layers, at a cost independent of ``L``.

The family. An activation is a *normalised exponential* (:class:`~singleloc.ExponentialForm`) when, with ``x_hl = alpha
(g_hl + b_h)``,

* per head (``joint = False``): ``A_hl = exp(x_hl) / (kappa + sum_l' exp(x_hl'))`` -- softmax
  (``alpha = 1, kappa = 0``), softmax1 (``kappa = 1``), scalable softmax (``alpha = s log L``);
* joint (``joint = True``): ``a_l = u_l / (kappa + sum_l' u_l')`` with ``u_l = sum_h exp(x_hl)``
  -- bsoftmax (``alpha = 1, kappa = 0``), whose head average is one distribution over tokens.

The Laplace form. ``1 / Z^k = int_0^inf t^(k-1) exp(-t Z) dt / (k-1)!`` turns every normaliser into a product over
tokens, ``exp(-t Z) = exp(-t kappa) prod_l exp(-t exp(x_l))``, and the tokens are independent given ``theta``: the ``L -
1`` noise tokens give the ``(L-1)``-th power of ONE token's expectation. With ``y = log t`` and the profiles

    rho_k(u) = exp(k u - e^u)   (k = 0, 1, 2),        omega(u) = 1 - rho_0(u) = -expm1(-e^u),

(so that ``t^k e^{k x} exp(-t e^x) = rho_k(y + x)``) the risk ``R = 1 - 2 E[a_0] + E[a_0^2] + (L - 1) E[a_1^2]`` (token
0 relevant) needs, per head,

    E[A_h0]     = int dy e^{-kappa e^y} E0[rho_1(y + x_h)] P(y)^(L-1),
    E[A_h0^2]   = int dy e^{-kappa e^y} E0[rho_2(y + x_h)] P(y)^(L-1),
    E[A_h1^2]   = int dy e^{-kappa e^y} E1[rho_2(y + x_h)] E0[rho_0(y + x_h)] P(y)^(L-2),

with ``P = 1 - E1[omega(y + x_h)]`` (noise token ``E1``, relevant token ``E0``), and for a pair of heads the same with
two variables ``(y, y')`` and two-dimensional token expectations such as ``E[rho_1(y + x_h) rho_1(y' + x_h')]``. Heads
never enter more than two at a time: the risk of a per-head layer is a sum over pairs of heads of two-dimensional
integrals. A joint layer has one normaliser, one variable ``y`` and the token expectations ``E[rho_k(y + lse(x))]`` over
the ``H`` fields of one token (``lse = log sum_h exp``).

The rules, and why they are exact to the precision stated.

* ``y``: the trapezoidal rule on ``n_t`` equispaced nodes over a range computed from the
  state (closed-form bounds, outside the gradient): below it every integrand is bounded by
  ``E[exp(k (y + x))] <= eps`` (the tail of ``int_0 t^(k-1)`` near ``t = 0``); above it the
  relevant token's factor is below ``Phi(-6.5) + rho(log 50)`` (``x`` exceeds ``y``'s
  complement with that probability only). The integrands are analytic in the strip
  ``|Im y| < pi/2`` and decay at both ends, so the rule converges geometrically, with an
  error of order ``exp(-pi^2 / step)`` (``step = 0.5``: 3e-9).
* Token expectations: standard normal rules on the Gaussian fields of one token
  (:func:`~singleloc.expectations._cubature.normal_rule`: the trapezoidal rule on ``[-8, 8]`` from 32
  nodes, Gauss-Hermite below; the profiles make the integrand analytic only in a strip of
  half-width ``pi / (2 s)`` for a field of width ``s``, where the trapezoidal rule converges
  like ``exp(-pi^2 / (s step))`` and Gauss-Hermite more slowly); a single head's field
  wider than ``WIDE_SIGMA`` on the profile grid instead (:meth:`LaplaceRule.single`: the
  profiles, not the Gaussian, carry the fine structure, so its accuracy does not fall with the
  field's width at all). A pair of heads is
  written as the first head's field ``x = m + sqrt(C11) z`` (``n_outer`` trapezoidal nodes,
  ``nodes * ceil(alpha)`` from :func:`exact_rule` (``theory.nodes``): 64 per unit of ``alpha`` resolve fields of
  standard deviation ``alpha sqrt(Q_hh)`` up to about 3 to 1e-10 in the risk and 1e-7 in its
  gradient, up to :data:`RESOLVED_SIGMA` = 5 within the route's stated accuracy; a solve stops where its fields
  grow wider, :meth:`LaplaceRule.resolves`) and the second head's given the first,
  ``x' = m' + (C12 / C11)(x - m) + sqrt(C22 - C12^2/C11) z'``. The second head's profiles smoothed by
  that conditional Gaussian are one function of their argument: they are tabulated on a lattice
  and interpolated (:func:`~singleloc.expectations._laplace_profiles.smoothed_profiles`: on ``n_inner`` normal
  nodes for a narrow conditional width, on the profile grid for a wide one, so that no width
  loses accuracy; interpolation error below 1e-10), which costs a table plus a few operations per
  argument instead of ``n_inner`` profile evaluations. Identical heads make the conditional variance vanish: its derivative
  is taken by the heat equation (Price's theorem), ``d E[f(u + s z)] / d(s^2) = E[f''(u + s z)] / 2``,
  so the gradient stays finite and exact at ``R_orth = 0``.
* A joint layer's ``H``-dimensional token expectation, in conditional product form: given the token's
  principal directions but the smallest, the fields are independent and every profile of ``lse(x)`` is a
  polynomial in one head's smoothed profiles (:mod:`~singleloc.expectations._laplace_joint`).
* ``theta``: the atoms of the prior exactly; a Gaussian part is folded into the relevant
  token's covariance, ``C0 = alpha^2 (Q + M Sigma M^T)`` (the relevant token's fields are
  Gaussian given the atom).
* Powers: ``P^(L-1) = exp((L-1) log1p(-E1[omega]))`` with ``E1[omega]`` computed directly (a sum
  of non-negative terms), so ``L`` up to any size costs nothing and loses no digits.

Nothing here depends on ``L`` but the exponents: the cost of a risk is ``O(H^2 n_t^2 n_outer)`` for a per-head layer,
``O(H n_t N)`` for a joint one with ``N`` nodes.

The risk's error is stated against a finer rule (:meth:`LaplaceRule.refined`, :mod:`~singleloc.expectations._cubature`).
The layers are :mod:`~singleloc.expectations._laplace_heads` and :mod:`~singleloc.expectations._laplace_joint`, the Gram
term :mod:`~singleloc.expectations._laplace_gram`, the profiles :mod:`~singleloc.expectations._laplace_profiles`.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..model._activations import Activation, ExponentialForm, exponential_form
from ..model._priors import Prior
from ._cubature import REFINEMENT, normal_rule, refined_sizes
from ._laplace_gram import laplace_gram
from ._laplace_heads import PerHeadLayer
from ._laplace_joint import JointLayer
from ._laplace_profiles import (
    OMEGA,
    RHO0,
    RHO1,
    RHO2,
    U_GRID_STEP,
    WIDE_SIGMA,
    _profiles,
    grid_smoothing,
    normal_smoothing,
    profile_grid,
    smoothed_profiles,
)

#: The upper end of the ``y`` range puts the relevant token's ``y + x`` above ``log(U_TOP)``
#: except with probability ``Phi(-TAIL_SIGMAS)``.
U_TOP = math.log(50.0)
TAIL_SIGMAS = 6.5
#: Bound on the neglected lower tail of each ``y`` integral.
TAIL_EPS = 1e-11
#: Smallest variance of a head's field (a head of zero norm has a constant field).
VAR_FLOOR = 1e-300
#: Smallest variance of a pair's first field: its conditional mean ``C12 / C11`` and variance
#: ``C22 - C12^2 / C11`` have derivatives of order ``1 / C11^2``, which must not overflow (a head of
#: zero norm, e.g. ``sgd.init_scale = 0``, gave NaN gradients). The change of the risk is of the
#: order of the floor; at ``Q = 0`` the ``O(lr)`` drift does not depend on ``dR/dQ``.
PAIR_VAR_FLOOR = 1e-12
#: The default ``nodes`` of :func:`exact_rule` (``theory.nodes``): the one source of the rule's node counts.
NODES = 64
#: The widest token field, a standard deviation ``alpha sqrt((Q + M Sigma M^T)_hh)``, that :data:`NODES` nodes resolve
#: within the route's stated accuracy; ``nodes`` nodes resolve ``nodes / NODES`` times as wide (:meth:`LaplaceRule.resolves`).
RESOLVED_SIGMA = 5.0


class LaplaceRule(eqx.Module):
    """Deterministic rule for the exact risk of a normalised-exponential layer (module docstring).

    Build it with :func:`exact_rule` (or :meth:`make`, every node count given). It holds the normal rules, the
    profile grid, the prior and the expectations every layer shares; its ``layer``
    (:class:`~singleloc.expectations._laplace_heads.PerHeadLayer` or :class:`~singleloc.expectations._laplace_joint.JointLayer`)
    composes them into the risk and the attention masses. Its node counts are static, its ranges follow the state;
    ``L`` and ``alpha`` are arrays (exponents and factors only), so rules that differ in them share one program.
    """

    z_outer: jax.Array
    w_outer: jax.Array
    z_inner: jax.Array
    w_inner: jax.Array
    u_grid: jax.Array  # (n_u,) the profile grid of the one-token expectations of wide fields
    atoms: jax.Array  # (K, F)
    probs: jax.Array  # (K,)
    prior_cov: jax.Array  # (F, F), the Gaussian part of the prior
    L: jax.Array  # () the sequence length, a float
    alpha: jax.Array  # () the form's scale (ExponentialForm.scale)
    layer: PerHeadLayer | JointLayer
    offset: float = eqx.field(static=True)  # the form's offset kappa (ExponentialForm.offset)
    n_t: int = eqx.field(static=True)
    heads: int = eqx.field(static=True)
    discrete: bool = eqx.field(static=True, default=False)  # no Gaussian part: both tokens' fields share C

    @classmethod
    def make(cls, form: ExponentialForm, L: int, H: int, prior: Prior, *, n_t: int, n_outer: int, n_inner: int,
             joint_sizes: tuple | None = None, u_step: float = U_GRID_STEP) -> LaplaceRule:
        """The rule for ``H`` heads over sequences of ``L >= 2`` tokens under ``prior``, with ``n_t``
        nodes of ``y``, normal rules of ``n_outer`` (a pair's first field) and ``n_inner`` nodes (the
        tables of smoothed profiles); :func:`exact_rule` chooses them.

        ``joint_sizes``: a joint layer's normal-rule sizes on its leading principal directions
        (:meth:`~singleloc.expectations._laplace_joint.JointLayer.make`). ``u_step``: the step of the profile grid
        (:meth:`single`)."""
        if L < 2:
            raise ValueError(f"problem.L must be >= 2 for the exact route, got {L}")
        if joint_sizes is not None and not form.joint:
            raise ValueError(f"joint_sizes = {joint_sizes}: a per-head layer has no joint token rule")
        dtype = jnp.result_type(float)
        as_array = lambda x: jnp.asarray(x, dtype)
        zo, wo = normal_rule(n_outer)
        zi, wi = normal_rule(n_inner)
        F = prior.atoms_array().shape[1]
        layer = JointLayer.make(H, F, joint_sizes, dtype) if form.joint else PerHeadLayer.make(H, n_outer, dtype)
        return cls(as_array(zo), as_array(wo), as_array(zi), as_array(wi), as_array(profile_grid(u_step)),
                   as_array(prior.atoms_array()), as_array(prior.probs_array()), as_array(np.asarray(prior.noise_cov)),
                   as_array(int(L)), as_array(form.scale), layer, float(form.offset), int(n_t), int(H), prior.is_discrete)

    @property
    def form(self) -> ExponentialForm:
        """The layer's normalised-exponential form (its ``scale`` the array :attr:`alpha`)."""
        return ExponentialForm(self.alpha, self.offset, isinstance(self.layer, JointLayer))

    def refined(self) -> LaplaceRule:
        """The same rule with :data:`~singleloc.expectations._cubature.REFINEMENT` times the nodes of every kind
        (:func:`~singleloc.expectations._cubature.refined_sizes`) and, in a joint layer, the first direction of the
        degree-5 rule on a normal rule of its own (the error estimate's reference)."""
        n_t, n_outer, n_inner = refined_sizes(self.n_t, self.z_outer.shape[0], self.z_inner.shape[0])
        prior = Prior(np.asarray(self.atoms), np.asarray(self.probs), np.asarray(self.prior_cov))
        return LaplaceRule.make(self.form, int(self.L), self.heads, prior, n_t=n_t, n_outer=n_outer, n_inner=n_inner,
                                joint_sizes=self.layer.refined_sizes(),
                                u_step=float(self.u_grid[1] - self.u_grid[0]) / REFINEMENT)

    # -- the risk, the attention masses and the Gram term ------------------------------------
    def risk(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> jax.Array:
        """``R(M, Q, b) = E[(1 - a_0)^2 + sum_{l >= 1} a_l^2]`` (token 0 relevant), exactly to the
        rule's precision; ``v``: trained head weights, ``a_l = sum_h v_h A_hl`` (per-head layers
        only: a joint layer's head mixture is not a normalised exponential)."""
        return self.layer.risk(self, *self.state(M, Q, b), v)

    def attention_mass(self, M: jax.Array, Q: jax.Array, b: jax.Array) -> jax.Array:
        """``w_h = E[sum_l A_hl]`` (H,): the attention weight each head puts on a sequence
        (:func:`singleloc.attention_mass`), exactly: ``E[A_h0] + (L - 1) E[A_h1]`` from the same
        one-head (per-head layer) or one-token (joint layer) integrals as the risk."""
        return self.layer.attention_mass(self, *self.state(M, Q, b))

    @property
    def exact_gram(self) -> bool:
        """Whether :meth:`gram` is exact for this rule: one head, or two heads of a per-head layer
        (:mod:`~singleloc.expectations._laplace_gram`; more heads hold moments of up to four distinct heads)."""
        return self.layer.exact_gram(self.heads)

    def gram(self, M: jax.Array, Q: jax.Array, b: jax.Array) -> jax.Array:
        """The ``lr^2`` Gram term ``E[sum_l c_l c_l^T]`` (H, H) of the head average, exactly
        (:func:`~singleloc.expectations._laplace_gram.laplace_gram`) where :attr:`exact_gram`."""
        if not self.exact_gram:
            raise ValueError(f"the exact Gram term takes one head or two heads of a per-head layer, got H = {self.heads}"
                             f"{' (a joint layer)' if self.form.joint else ''}: the Sobol rule holds it there")
        return laplace_gram(self, M, Q, b)

    @property
    def widest(self) -> float:
        """The largest standard deviation of a token field that the rule resolves: :data:`RESOLVED_SIGMA` per
        :data:`NODES` nodes of a pair's first field (``nodes * ceil(alpha)``, :func:`exact_rule`), whose spacing,
        ``16 / n_outer`` standard deviations, is what wide fields outgrow (module docstring)."""
        return RESOLVED_SIGMA * self.z_outer.shape[-1] / NODES

    def resolves(self, M: jax.Array, Q: jax.Array, b: jax.Array) -> jax.Array:
        """Whether every token field of the state is at most :attr:`widest` wide (the relevant token's covariance
        ``C0`` of :meth:`token_laws` bounds the noise token's)."""
        C0 = self.token_laws(*self.state(M, Q, b))[3]
        return jnp.max(jnp.diagonal(C0)) <= self.widest**2

    # -- the laws of one token's fields ------------------------------------------------------
    def state(self, M: jax.Array, Q: jax.Array, b: jax.Array):
        """``(M, Q, b)`` in the rule's dtype, ``Q`` symmetrised (its entries are independent
        arguments of the gradient; the risk depends on their symmetric part)."""
        M, Q, b = (jnp.asarray(x, self.atoms.dtype) for x in (M, Q, b))
        return M, (Q + Q.T) / 2, b

    def token_laws(self, M: jax.Array, Q: jax.Array, b: jax.Array):
        """Scaled means and covariances ``(m1, C1, m0, C0)`` of a state (:meth:`state`): noise token ``(alpha b, alpha^2
        Q)``; relevant token per atom ``alpha (b + M a_k)`` (H, K) with ``alpha^2 (Q + M Sigma M^T)``."""
        a = self.alpha
        m1 = a * b
        C1 = a**2 * Q
        m0 = a * (b[:, None] + M @ self.atoms.T)  # (H, K)
        C0 = a**2 * (Q + M @ self.prior_cov @ M.T)
        return m1, C1, m0, C0

    def atoms_mean(self, fn):
        """The relevant token's expectation ``fn(k)`` of atom ``k`` (an array or a tuple of arrays),
        averaged over the prior's atoms."""
        values = jax.vmap(fn)(jnp.arange(self.probs.shape[0]))
        return jax.tree_util.tree_map(lambda v: jnp.tensordot(self.probs, v, axes=1), values)

    # -- the y nodes ------------------------------------------------------------------------
    def y_range(self, moments1, moments0, fields1, fields0, powers=(1, 2)):
        """The ``y`` nodes (..., n_t) and steps (...) for a token whose normaliser term is ``exp(X)`` (``X = x_h``, one
        head of a per-head layer, or ``X = lse(x)``, a joint layer's token), for moments of the weights up to the
        largest of ``powers`` (the risk's: 2), outside the gradient.

        ``moments1`` (len(powers), ...): ``log E1[exp(k X)] / k`` of a noise token; ``moments0`` (len(powers), ..., K):
        the relevant token's, per atom. ``fields1``: the means and standard deviations (..., G) of fields ``x_g`` with
        ``X >= max_g x_g`` (``G = 1`` per head, ``G = H`` for ``lse``); ``fields0``: the relevant token's, means per
        atom (..., G, K). The lower end keeps every neglected tail ``E[exp(k (y + X))]`` below ``TAIL_EPS`` (a noise
        token's carries the factor ``L``); above the upper end ``y + X > log(U_TOP)`` for both tokens, where their
        profiles vanish, except with probability ``Phi(-TAIL_SIGMAS)``."""
        moments1, moments0, fields1, fields0 = jax.lax.stop_gradient((moments1, moments0, fields1, fields0))
        log_eps, log_L = math.log(TAIL_EPS), jnp.log(self.L)
        lows = [bound for k, f1, f0 in zip(powers, moments1, moments0)
                for bound in ((log_eps - log_L) / k - f1, log_eps / k - jnp.max(f0, axis=-1))]
        lo = jnp.min(jnp.stack(lows), axis=0)
        low1 = jnp.max(fields1[0] - TAIL_SIGMAS * fields1[1], axis=-1)
        low0 = jnp.max(jnp.min(fields0[0], axis=-1) - TAIL_SIGMAS * fields0[1], axis=-1)
        hi = jnp.maximum(U_TOP - jnp.maximum(low0, low1), lo + 1.0)
        s = jnp.linspace(0.0, 1.0, self.n_t)
        return lo[..., None] + (hi - lo)[..., None] * s, (hi - lo) / (self.n_t - 1)

    def head_ranges(self, m1, v1, m0, v0, powers=(1, 2)):
        """:meth:`y_range` of every head of a per-head layer, ``(H, n_t)`` and ``(H,)``, from its fields'
        means and variances (:meth:`token_laws`): ``log E[exp(k x)] / k = m + k v / 2``."""
        ks = np.asarray(powers, dtype=float)[:, None]
        moments1, moments0 = m1 + ks * v1 / 2, m0 + (ks * v0 / 2)[..., None]
        fields1, fields0 = (m1[:, None], jnp.sqrt(v1)[:, None]), (m0[:, None], jnp.sqrt(v0)[:, None])
        return self.y_range(moments1, moments0, fields1, fields0, powers)

    # -- one token's and one pair's profile expectations ------------------------------------
    def single(self, y, m, v, which=(RHO0, RHO1, RHO2, OMEGA)):
        """``E[f(y + x)]`` (len(which), n_t) of the profiles ``which`` (default the four of the
        risk) for ``x ~ N(m, v)``.

        A narrow field (``sqrt(v) <= WIDE_SIGMA``) on the outer normal rule's nodes
        (:func:`~singleloc.expectations._laplace_profiles.normal_smoothing`), a wide one on the profile grid
        (:func:`~singleloc.expectations._laplace_profiles.grid_smoothing`): normal-rule nodes are ``s`` times further
        apart than the profiles' own scale, so their error grows with ``s`` (64 Gauss-Hermite nodes: 4e-9 at
        ``s = 1``, 3e-6 at ``s = 1.5``; the two rules cross near ``s = 0.6``); the grid's does not."""
        narrow = normal_smoothing(y + m, jnp.sqrt(jnp.maximum(v, VAR_FLOOR)), self.z_outer, self.w_outer, which)
        wide = grid_smoothing(y + m, jnp.sqrt(jnp.maximum(v, WIDE_SIGMA**2)), self.u_grid, which)  # finite where not taken
        return jnp.where(v > WIDE_SIGMA**2, wide, narrow)

    def pair(self, combos, y, yp, m, mp, C11, C12, C22, outer_rule=None, batches=None):
        """``E[f_a(y + x) f_b(y' + x')]`` (len(combos), *batch, n_t, n_t) on the grid ``y x y'`` for the profile pairs
        ``(a, b)`` in ``combos``, ``(x, x')`` Gaussian with means ``(m, m')`` and covariance ``[[C11, C12], [C12,
        C22]]`` (module docstring): the first field on the normal rule ``outer_rule`` (nodes and weights; default the
        rule's outer one), the second given the first smoothed by its conditional Gaussian
        (:func:`~singleloc.expectations._laplace_profiles.smoothed_profiles`). The means may be arrays of the shape
        ``batch`` (e.g. one per atom of the prior): they share the covariance, so the second field's table of smoothed
        profiles is built once for all of them. ``batches``: per combo, the part of the (one-dimensional) batch it is
        wanted at (a slice; default all): then a list of the combos' arrays, each product taken on its part only."""
        z, w = (self.z_outer, self.w_outer) if outer_rule is None else outer_rule
        C11 = jnp.maximum(C11, PAIR_VAR_FLOOR)
        sx = jnp.sqrt(C11) * z  # x - m at the outer nodes
        beta = C12 / C11
        s2 = C22 - C12**2 / C11
        m, mp = (jnp.asarray(x)[..., None, None] for x in (m, mp))
        firsts, seconds = (tuple(sorted({pair[i] for pair in combos})) for i in (0, 1))
        outer = w * _profiles(y[:, None] + m + sx, firsts)  # (., *batch, n_t, n_outer)
        inner = smoothed_profiles(yp[None, :] + mp + beta * sx[:, None], s2, self.z_inner, self.w_inner, self.u_grid,
                                  seconds, WIDE_SIGMA)  # (., *batch, n_outer, n_t)
        if batches is None:
            return jnp.stack([outer[firsts.index(a)] @ inner[seconds.index(b)] for a, b in combos])
        return [outer[firsts.index(a)][part] @ inner[seconds.index(b)][part] for (a, b), part in zip(combos, batches)]


def exact_rule(activation: Activation | str, L: int, H: int, prior: Prior, *, nodes: int = NODES,
               **kwargs) -> LaplaceRule | None:
    """The :class:`LaplaceRule` of an activation that declares its normalised-exponential form
    (:func:`~singleloc.exponential_form`), or ``None``. ``nodes`` (``theory.nodes``): the normal rules
    of ``nodes`` nodes (the pairs' outer rule ``nodes * ceil(alpha)``: a token field's width is ``alpha sqrt(Q_hh)``)
    and ``2 nodes`` nodes of the Laplace variable; the other keywords as :meth:`LaplaceRule.make`."""
    form = exponential_form(activation, L)
    if form is None:
        return None
    return LaplaceRule.make(form, L, H, prior, n_t=2 * nodes, n_outer=nodes * max(1, math.ceil(form.scale)),
                            n_inner=nodes, **kwargs)

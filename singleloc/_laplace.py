"""Exact population risk of normalised-exponential layers, at a cost independent of ``L``.

The family. An activation is a *normalised exponential* (:class:`~singleloc.ExponentialForm`)
when, with ``x_hl = alpha (g_hl + b_h)``,

* per head (``joint = False``): ``A_hl = exp(x_hl) / (kappa + sum_l' exp(x_hl'))`` -- softmax
  (``alpha = 1, kappa = 0``), softmax1 (``kappa = 1``), scalable softmax (``alpha = s log L``);
* joint (``joint = True``): ``a_l = u_l / (kappa + sum_l' u_l')`` with ``u_l = sum_h exp(x_hl)``
  -- bsoftmax (``alpha = 1, kappa = 0``), whose head average is one distribution over tokens.

The Laplace form. ``1 / Z^k = int_0^inf t^(k-1) exp(-t Z) dt / (k-1)!`` turns every normaliser
into a product over tokens, ``exp(-t Z) = exp(-t kappa) prod_l exp(-t exp(x_l))``, and the
tokens are independent given ``theta``: the ``L - 1`` noise tokens give the ``(L-1)``-th power of
ONE token's expectation. With ``y = log t`` and the profiles

    rho_k(u) = exp(k u - e^u)   (k = 0, 1, 2),        omega(u) = 1 - rho_0(u) = -expm1(-e^u),

(so that ``t^k e^{k x} exp(-t e^x) = rho_k(y + x)``) the risk
``R = 1 - 2 E[a_0] + E[a_0^2] + (L - 1) E[a_1^2]`` (token 0 relevant) needs, per head,

    E[A_h0]     = int dy e^{-kappa e^y} E0[rho_1(y + x_h)] P(y)^(L-1),
    E[A_h0^2]   = int dy e^{-kappa e^y} E0[rho_2(y + x_h)] P(y)^(L-1),
    E[A_h1^2]   = int dy e^{-kappa e^y} E1[rho_2(y + x_h)] E0[rho_0(y + x_h)] P(y)^(L-2),

with ``P = 1 - E1[omega(y + x_h)]`` (noise token ``E1``, relevant token ``E0``), and for a
pair of heads the same with two variables ``(y, y')`` and two-dimensional token
expectations such as ``E[rho_1(y + x_h) rho_1(y' + x_h')]``. Heads never enter more than
two at a time: the risk of a per-head layer is a sum over pairs of heads of
two-dimensional integrals. A joint layer has one normaliser, one variable ``y`` and the
token expectations ``E[rho_k(y + lse(x))]`` over the ``H`` fields of one token
(``lse = log sum_h exp``).

The rules, and why they are exact to the precision stated.

* ``y``: the trapezoidal rule on ``n_t`` equispaced nodes over a range computed from the
  state (closed-form bounds, outside the gradient): below it every integrand is bounded by
  ``E[exp(k (y + x))] <= eps`` (the tail of ``int_0 t^(k-1)`` near ``t = 0``); above it the
  relevant token's factor is below ``Phi(-6.5) + rho(log 50)`` (``x`` exceeds ``y``'s
  complement with that probability only). The integrands are analytic in the strip
  ``|Im y| < pi/2`` and decay at both ends, so the rule converges geometrically, with an
  error of order ``exp(-pi^2 / step)`` (``step = 0.5``: 3e-9).
* Token expectations: standard normal rules on the Gaussian fields of one token
  (:func:`~singleloc._laplace_profiles.normal_rule`: the trapezoidal rule on ``[-8, 8]`` from 32
  nodes, Gauss-Hermite below; the profiles make the integrand analytic only in a strip of
  half-width ``pi / (2 s)`` for a field of width ``s``, where the trapezoidal rule converges
  like ``exp(-pi^2 / (s step))`` and Gauss-Hermite more slowly); a single head's field
  wider than ``WIDE_SIGMA`` on the profile grid instead (:meth:`LaplaceRule._single`: the
  profiles, not the Gaussian, carry the fine structure, so its accuracy does not fall with the
  field's width at all). A pair of heads is
  written as the first head's field ``x = m + sqrt(C11) z`` (``n_outer`` trapezoidal nodes,
  ``nodes * ceil(alpha)`` from :func:`exact_rule` (``theory.nodes``): 64 per unit of ``alpha`` resolve fields of
  standard deviation ``alpha sqrt(Q_hh)`` up to about 3 to 1e-10 in the risk and 1e-7 in its
  gradient) and the second head's given the first,
  ``x' = m' + (C12 / C11)(x - m) + sqrt(C22 - C12^2/C11) z'``. The second head's profiles smoothed by
  that conditional Gaussian are one function of their argument: they are tabulated on a lattice
  and interpolated (:func:`~singleloc._laplace_profiles.smoothed_profiles`: on ``n_inner`` normal
  nodes for a narrow conditional width, on the profile grid for a wide one, so that no width
  loses accuracy; interpolation error below 1e-10), which costs a table plus a few operations per
  argument instead of ``n_inner`` profile evaluations. Identical heads make the conditional variance vanish: its derivative
  is taken by the heat equation (Price's theorem), ``d E[f(u + s z)] / d(s^2) = E[f''(u + s z)] / 2``,
  so the gradient stays finite and exact at ``R_orth = 0``.
* A joint layer's ``H``-dimensional token expectation, in conditional product form
  (:func:`_joint_token`). Write the token's covariance ``C = delta I + S^T S`` with ``delta`` its
  smallest eigenvalue: given the standard normals ``z`` on the ``H - 1`` principal directions of
  ``C - delta I``, the fields are independent, ``x_h = mu_h(z) + sqrt(delta) Z_h``, and
  ``exp(-t u) = prod_h rho_0(y + x_h)`` (``u = sum_h exp(x_h)``) makes every profile of ``lse(x)``
  a polynomial in one head's profiles smoothed by ``N(0, delta)``: tabulated once, interpolated. The
  smallest variance is integrated exactly; on the others a tensor of normal rules along the
  leading directions (where trained keys are wide, :data:`JOINT_LEADING`) and the next one times a
  symmetric rule of degree 5 on the rest (the anisotropy of ``R_orth``: small). Heads that are copies leave
  ``delta = 0`` and fewer active directions; the derivative in ``(mu, C)`` is by Price's theorem
  on the same nodes, never through the eigendecomposition.
* ``theta``: the atoms of the prior exactly; a Gaussian part is folded into the relevant
  token's covariance, ``C0 = alpha^2 (Q + M Sigma M^T)`` (the relevant token's fields are
  Gaussian given the atom).
* Powers: ``P^(L-1) = exp((L-1) log1p(-E1[omega]))`` with ``E1[omega]`` computed directly (a sum
  of non-negative terms), so ``L`` up to any size costs nothing and loses no digits.

Nothing here depends on ``L`` but the exponents: the cost of a risk is
``O(H^2 n_t^2 n_outer)`` for a per-head layer, ``O(H n_t N)`` for a joint one with ``N`` nodes.

Error statement. The risk is compared with that of a finer rule
(:meth:`LaplaceRule.refined`, 1.5 x the nodes of every kind, and a joint layer's first degree-5
direction on a normal rule of its own): the difference bounds the error of the coarse rule for a
geometrically convergent rule.
"""

from __future__ import annotations

import itertools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._activations import Activation, ExponentialForm, exponential_form
from ._laplace_gram import laplace_gram
from ._laplace_profiles import (
    OMEGA,
    RHO0,
    RHO1,
    RHO2,
    _power,
    _profiles,
    grid_smoothing,
    interpolated,
    normal_rule,
    normal_smoothing,
    smoothed_profiles,
    smoothing_table,
)
from ._numerics import principal_factor
from ._priors import Prior

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

#: Fields of a larger standard deviation than this have their one-token expectations on the
#: profile grid (:meth:`LaplaceRule._single`), smaller ones on Gauss-Hermite nodes.
WIDE_SIGMA = 0.6
#: The profile grid: ``u`` from ``U_GRID_LOW`` (``e^u`` below 1e-15: the profiles' lower tails are
#: negligible there, also times ``L = 4096``) to ``U_GRID_HIGH`` (``rho_k`` below ``e^-90``) in steps
#: of ``U_GRID_STEP`` (trapezoidal error of order ``exp(-pi^2 / step)``, 7e-18).
U_GRID_LOW = -36.0
U_GRID_HIGH = 4.5
U_GRID_STEP = 0.25

#: Default node counts of the rule.
N_T = 128
N_OUTER = 64
N_INNER = 64
#: The ``lr^2`` Gram term's pair moments (:mod:`~singleloc._laplace_gram`) take this many times the outer
#: nodes: their profiles (up to the sixth power) are narrower than the risk's, and a wide first field
#: aliases them on the risk's outer rule (64 nodes: 9% off at a token standard deviation of 6, 1e-10 on
#: three times the nodes; :data:`~singleloc._laplace_gram.WIDE_GRAM_SIGMA`). The term then takes about 1.5x
#: the time (62-78 against 46-54 ms at a trained state, L = 8 to 256).
GRAM_OUTER = 3
#: Joint layers (bsoftmax), :func:`_joint_token`: the sizes of the normal rules
#: (:func:`~singleloc._laplace_profiles.normal_rule`, trapezoidal from 32 nodes) on the leading
#: principal directions of the token's covariance less its smallest variance, largest first; on
#: ``min(max(F, 2), 3, H - 1)`` of them (:func:`joint_layout`: trained keys are wide along the ``F``
#: directions of ``M``). The next direction, the first whose variance is the anisotropy of ``R_orth``
#: (small: its isotropic part is the smoothed ``delta``), on :data:`JOINT_SMALL` Gauss-Hermite nodes,
#: any others on a symmetric rule of degree 5 (:func:`symmetric_degree5`).
#: Measured (docs/model.md 4.6, against 1.5 x the nodes): at a trained H = 3, F = 2 state (key variances
#: 5.8 and 7.0, 0.15 on the third direction) (64, 48) leaves a risk error of 5e-16 and a relative
#: gradient error of 2e-13 ((48, 32), at half the cost: 4.5e-10 and 4.3e-8, and 6e-6 of the O(lr)
#: drift); at an H = 4 state with variances 10.3 and 11.9 and a third direction of 0.07 beyond the
#: smallest, that direction on the degree-5 rule (3 nodes) left 4.8e-5 of the O(lr) drift, on 4, 5 and
#: 6 Gauss-Hermite nodes 1.4e-6, 7e-8 and 3e-8.
JOINT_LEADING = (64, 48, 16)
JOINT_SMALL = 5
#: The refined rule (:meth:`LaplaceRule.refined`) takes the first direction of the degree-5 rule out
#: of it, onto a normal rule of this many nodes: the stated error then covers that rule too.
JOINT_PROMOTED = 6


# -- the rule --------------------------------------------------------------------------------

class LaplaceRule(eqx.Module):
    """Deterministic rule for the exact risk of a normalised-exponential layer (module docstring).

    Build it with :meth:`make`; :meth:`risk` is ``R(M, Q, b)``. Its node counts are static
    (``n_t`` nodes of ``y`` per head, normal rules of the token fields), its ranges
    follow the state.
    """

    z_outer: jax.Array
    w_outer: jax.Array
    z_gram: jax.Array  # the two-head Gram term's outer rule (GRAM_OUTER x the nodes; empty for other layers)
    w_gram: jax.Array
    z_inner: jax.Array
    w_inner: jax.Array
    u_grid: jax.Array  # (n_u,) the profile grid of the one-token expectations of wide fields
    z_joint: jax.Array  # (N, H - 1) standard normals of a joint layer's rule (:func:`joint_nodes`; (0, 0): per-head layer)
    w_joint: jax.Array
    atoms: jax.Array  # (K, F)
    probs: jax.Array  # (K,)
    prior_cov: jax.Array  # (F, F), the Gaussian part of the prior
    form: ExponentialForm = eqx.field(static=True)
    L: int = eqx.field(static=True)
    n_t: int = eqx.field(static=True)
    heads: int = eqx.field(static=True)
    joint_layout: tuple = eqx.field(static=True)  # (sizes, small) of a joint layer's rule (:func:`joint_layout`)

    @classmethod
    def make(cls, form: ExponentialForm, L: int, H: int, prior: Prior, *, n_t: int = N_T, n_outer: int = N_OUTER,
             n_inner: int = N_INNER, joint_sizes: tuple | None = None, u_step: float = U_GRID_STEP) -> LaplaceRule:
        """The rule for ``H`` heads over sequences of ``L >= 2`` tokens under ``prior``.

        ``joint_sizes``: a joint layer's normal-rule sizes on its leading principal directions (at
        most ``H - 1``; the others on the degree-5 rule), default :func:`joint_layout`. ``u_step``:
        the step of the profile grid (:meth:`_single`).
        """
        if L < 2:
            raise ValueError(f"problem.L must be >= 2 for the exact route, got {L}")
        dtype = jnp.result_type(float)
        zo, wo = normal_rule(n_outer)
        pair_gram = H == 2 and not form.joint  # the exact Gram term's moments of two heads: the one use of it
        zg, wg = normal_rule(GRAM_OUTER * n_outer) if pair_gram else (np.zeros(0), np.zeros(0))
        zi, wi = normal_rule(n_inner)
        layout, (zj, wj) = ((), 0), (np.zeros((0, 0)), np.zeros((0,)))
        if form.joint:
            F = prior.atoms_array().shape[1]
            layout = joint_layout(H, F) if joint_sizes is None else (tuple(joint_sizes), H - 1 - len(joint_sizes))
            if layout[1] < 0:
                raise ValueError(f"joint_sizes = {joint_sizes}: at most H - 1 = {H - 1} sizes (the principal directions "
                                 "but the smallest)")
            zj, wj = joint_nodes(*layout)
        as_array = lambda x: jnp.asarray(x, dtype)
        u = np.linspace(U_GRID_LOW, U_GRID_HIGH, int(math.ceil((U_GRID_HIGH - U_GRID_LOW) / u_step)) + 1)
        return cls(as_array(zo), as_array(wo), as_array(zg), as_array(wg), as_array(zi), as_array(wi), as_array(u),
                   as_array(zj), as_array(wj),
                   as_array(prior.atoms_array()), as_array(prior.probs_array()), as_array(np.asarray(prior.noise_cov)),
                   form, int(L), int(n_t), int(H), layout)

    def refined(self, factor: float = 1.5) -> LaplaceRule:
        """The same rule with ``factor`` times the nodes of every kind and, in a joint layer, the first
        direction of the degree-5 rule on :data:`JOINT_PROMOTED` nodes (the error estimate's
        reference)."""
        grow = lambda n: int(math.ceil(factor * n))
        sizes, small = self.joint_layout
        sizes = tuple(grow(n) for n in sizes) + ((JOINT_PROMOTED,) if small else ())
        prior = Prior(np.asarray(self.atoms), np.asarray(self.probs), np.asarray(self.prior_cov))
        return LaplaceRule.make(self.form, self.L, self.heads, prior, n_t=grow(self.n_t), n_outer=grow(self.z_outer.shape[0]),
                                n_inner=grow(self.z_inner.shape[0]), joint_sizes=sizes if self.form.joint else None,
                                u_step=float(self.u_grid[1] - self.u_grid[0]) / factor)

    # -- the laws of one token's fields ------------------------------------------------------
    def _token_laws(self, M, Q, b):
        """Scaled means and covariances: noise token ``(alpha b, alpha^2 Q)``; relevant token per
        atom ``alpha (b + M a_k)`` with ``alpha^2 (Q + M Sigma M^T)``."""
        a = self.form.scale
        m1 = a * b
        C1 = a**2 * Q
        m0 = a * (b[:, None] + M @ self.atoms.T)  # (H, K)
        C0 = a**2 * (Q + M @ self.prior_cov @ M.T)
        return m1, C1, m0, C0

    def _state(self, M, Q, b):
        """``(M, Q, b)`` in the rule's dtype, ``Q`` symmetrised (its entries are independent
        arguments of the gradient; the risk depends on their symmetric part)."""
        M, Q, b = (jnp.asarray(x, self.atoms.dtype) for x in (M, Q, b))
        return M, (Q + Q.T) / 2, b

    def risk(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None) -> jax.Array:
        """``R(M, Q, b) = E[(1 - a_0)^2 + sum_{l >= 1} a_l^2]`` (token 0 relevant), exactly to the
        rule's precision; ``v``: trained head weights, ``a_l = sum_h v_h A_hl`` (per-head layers
        only: a joint layer's head mixture is not a normalised exponential)."""
        M, Q, b = self._state(M, Q, b)
        if self.form.joint:
            if v is not None:
                raise ValueError("the exact route of a joint layer (bsoftmax) takes uniform head weights only; "
                                 "model.head_weights = 'trained' goes on theory.route = 'rule'")
            return self._joint_risk(M, Q, b)
        H = Q.shape[0]
        v = jnp.full((H,), 1.0 / H, M.dtype) if v is None else jnp.asarray(v, M.dtype)
        return self._per_head_risk(M, Q, b, v)

    @property
    def exact_gram(self) -> bool:
        """Whether :meth:`gram` is exact for this rule: one head, or two heads of a per-head layer
        (:mod:`~singleloc._laplace_gram`; more heads hold moments of up to four distinct heads)."""
        return self.heads == 1 or (self.heads == 2 and not self.form.joint)

    def gram(self, M: jax.Array, Q: jax.Array, b: jax.Array) -> jax.Array:
        """The ``lr^2`` Gram term ``E[sum_l c_l c_l^T]`` (H, H) of the head average, exactly
        (:func:`~singleloc._laplace_gram.laplace_gram`) where :attr:`exact_gram`."""
        if not self.exact_gram:
            raise ValueError(f"the exact Gram term takes one head or two heads of a per-head layer, got H = {self.heads}"
                             f"{' (a joint layer)' if self.form.joint else ''}: the Sobol rule holds it there")
        return laplace_gram(self, M, Q, b)

    # -- per-head layers ----------------------------------------------------------------------
    def _ranges(self, m1, v1, m0, v0, powers=(1, 2)):
        """``y`` nodes (H, n_t) and steps (H,) of every head (outside the gradient), for moments
        of the weights up to the largest of ``powers`` (the risk's: 2)."""
        L = self.L
        m1, v1, m0, v0 = (jax.lax.stop_gradient(x) for x in (m1, v1, m0, v0))
        log_eps = math.log(TAIL_EPS)
        # lower end: E[exp(k (y + x))] <= eps for the special token (noise terms carry a factor L - 1)
        lows = []
        for k in powers:
            lows.append((log_eps - math.log(L)) / k - m1 - k * v1 / 2)
            lows.append(log_eps / k - jnp.max(m0, axis=1) - k * v0 / 2)
        lo = jnp.min(jnp.stack(lows), axis=0)
        # upper end: the relevant token's factor (or a noise token's) is negligible
        hi = jnp.minimum(U_TOP - jnp.min(m0, axis=1) + TAIL_SIGMAS * jnp.sqrt(v0), U_TOP - m1 + TAIL_SIGMAS * jnp.sqrt(v1))
        hi = jnp.maximum(hi, lo + 1.0)
        s = jnp.linspace(0.0, 1.0, self.n_t)
        return lo[:, None] + (hi - lo)[:, None] * s, (hi - lo) / (self.n_t - 1)

    def _single(self, y, m, v, which=(RHO0, RHO1, RHO2, OMEGA)):
        """``E[f(y + x)]`` (len(which), n_t) of the profiles ``which`` (default the four of the
        risk) for ``x ~ N(m, v)``.

        A narrow field (``sqrt(v) <= WIDE_SIGMA``) on the outer Gauss-Hermite nodes. A wide one on
        the profile grid ``u_p`` instead, where the profiles, not the Gaussian, carry the fine
        structure: ``E[f(y + x)] = int f(u) phi_s(u - y - m) du`` for ``f = rho_k`` and, as
        ``omega' = rho_1``, ``E[omega(y + x)] = int rho_1(u) Phi((y + m - u) / s) du`` (a sum of
        non-negative terms), ``rho_0 = 1 - omega``. Gauss-Hermite nodes are spread over the
        Gaussian, ``s`` times further apart than the profiles' own scale, so their error grows with
        ``s`` (64 nodes: 4e-9 at ``s = 1``, 3e-6 at ``s = 1.5``; the two rules cross near
        ``s = 0.6``); the grid's does not (a trapezoidal rule of an integrand analytic in
        ``|Im u| < pi/2``)."""
        narrow = normal_smoothing(y + m, jnp.sqrt(jnp.maximum(v, VAR_FLOOR)), self.z_outer, self.w_outer, which)[0]
        wide = grid_smoothing(y + m, jnp.sqrt(jnp.maximum(v, WIDE_SIGMA**2)), self.u_grid, which)[0]  # finite where not taken
        return jnp.where(v > WIDE_SIGMA**2, wide, narrow)

    def _pair(self, combos, y, yp, m, mp, C11, C12, C22, outer_rule=None):
        """``E[f_a(y + x) f_b(y' + x')]`` (len(combos), n_t, n_t) on the grid ``y x y'`` for the profile
        pairs ``(a, b)`` in ``combos``, ``(x, x')`` Gaussian with means ``(m, m')`` and covariance
        ``[[C11, C12], [C12, C22]]`` (module docstring); ``outer_rule``: the first field's nodes and
        weights (default the rule's outer ones)."""
        outer, inner, firsts, seconds = self._pair_factors(combos, y, yp, m, mp, C11, C12, C22, outer_rule)
        return jnp.stack([outer[firsts.index(a)] @ inner[seconds.index(b)] for a, b in combos])

    def _pair_factors(self, combos, y, yp, m, mp, C11, C12, C22, outer_rule=None):
        """The weighted first-field profiles (len(firsts), n_t, n_outer) and the second field's
        smoothed profiles given the first (len(seconds), n_outer, n_t) of :meth:`_pair`, for the
        profiles ``firsts`` and ``seconds`` that ``combos`` uses."""
        z, w = (self.z_outer, self.w_outer) if outer_rule is None else outer_rule
        C11 = jnp.maximum(C11, PAIR_VAR_FLOOR)
        sx = jnp.sqrt(C11) * z  # x - m at the outer nodes
        beta = C12 / C11
        s2 = C22 - C12**2 / C11
        firsts, seconds = (tuple(sorted({pair[i] for pair in combos})) for i in (0, 1))
        outer = w * _profiles(y[:, None] + m + sx, firsts)  # (., n_t, n_outer)
        inner = smoothed_profiles(yp[None, :] + mp + beta * sx[:, None], s2, self.z_inner, self.w_inner, self.u_grid,
                                  seconds, WIDE_SIGMA)  # (., n_outer, n_t)
        return outer, inner, firsts, seconds

    def attention_mass(self, M: jax.Array, Q: jax.Array, b: jax.Array) -> jax.Array:
        """``w_h = E[sum_l A_hl]`` (H,): the attention weight each head puts on a sequence
        (:func:`singleloc.attention_mass`), exactly: ``E[A_h0] + (L - 1) E[A_h1]`` from the same
        one-head (per-head layer) or one-token (joint layer) integrals as the risk."""
        M, Q, b = self._state(M, Q, b)
        return self._joint_terms(M, Q, b)[1] if self.form.joint else self._head_terms(M, Q, b)[1]["mass"]

    def _head_terms(self, M, Q, b):
        """What a per-head layer's risk and attention mass need of each head alone: the token laws,
        the ``y`` nodes ``Y`` and weights ``pre`` (H, n_t), and per head ``E[A_h0]``, ``E[A_h0^2] +
        (L - 1) E[A_h1^2]``, the noise token's ``E1[omega]`` on its nodes and ``E[sum_l A_hl]``."""
        H, L, kappa = Q.shape[0], self.L, self.form.offset
        laws = self._token_laws(M, Q, b)
        m1, C1, m0, C0 = laws
        v1, v0 = jnp.diag(C1), jnp.diag(C0)
        Y, step = self._ranges(m1, v1, m0, v0)
        pre = step[:, None] * jnp.exp(-kappa * jnp.exp(Y))  # (H, n_t)

        def single(h):
            y = Y[h]
            noise = self._single(y, m1[h], v1[h])
            rel = self._atoms_mean(lambda k: self._single(y, m0[h, k], v0[h]))
            p1, p2 = _power(noise[OMEGA], L - 1), _power(noise[OMEGA], L - 2)
            w = pre[h]
            first = jnp.sum(w * rel[RHO1] * p1)
            same = jnp.sum(w * rel[RHO2] * p1) + (L - 1) * jnp.sum(w * noise[RHO2] * rel[RHO0] * p2)
            mass = first + (L - 1) * jnp.sum(w * noise[RHO1] * rel[RHO0] * p2)
            return {"first": first, "same": same, "omega": noise[OMEGA], "mass": mass}

        return (laws, Y, pre), jax.vmap(single)(jnp.arange(H))

    def _atoms_mean(self, fn):
        """The relevant token's expectation ``fn(k)`` of atom ``k`` (an array or a tuple of arrays),
        averaged over the prior's atoms."""
        values = jax.vmap(fn)(jnp.arange(self.probs.shape[0]))
        return jax.tree_util.tree_map(lambda v: jnp.tensordot(self.probs, v, axes=1), values)

    def _per_head_risk(self, M, Q, b, v):
        """The risk ``1 - 2 sum_h v_h E[A_h0] + sum_{h, g} v_h v_g E[sum_l A_hl A_gl]`` of the
        mixture ``a = sum_h v_h A_h`` (the head average: ``v = 1/H``)."""
        H, L = Q.shape[0], self.L
        ((m1, C1, m0, C0), Y, pre), heads = self._head_terms(M, Q, b)
        EA0, EAA_same, omega = heads["first"], heads["same"], heads["omega"]
        pairs = np.array(list(itertools.combinations(range(H), 2)), dtype=np.int32).reshape(-1, 2)

        def pair(hh):
            h, g = hh[0], hh[1]
            y, yp = Y[h], Y[g]
            noise = self._pair(((RHO0, OMEGA), (RHO1, RHO1)), y, yp, m1[h], m1[g], C1[h, h], C1[h, g], C1[g, g])
            W = omega[h][:, None] + noise[0]  # 1 - E[rho_0 rho_0] as a sum of non-negative terms
            rel = self._atoms_mean(lambda k: self._pair(((RHO0, RHO0), (RHO1, RHO1)), y, yp, m0[h, k], m0[g, k], C0[h, h],
                                                        C0[h, g], C0[g, g]))
            w = pre[h][:, None] * pre[g][None, :]
            return jnp.sum(w * rel[1] * _power(W, L - 1)) + (L - 1) * jnp.sum(w * noise[1] * rel[0] * _power(W, L - 2))

        cross = 0.0
        if len(pairs):
            cross = jax.lax.map(jax.checkpoint(pair), jnp.asarray(pairs)) @ (v[pairs[:, 0]] * v[pairs[:, 1]])
        return 1.0 - 2.0 * (v @ EA0) + v**2 @ EAA_same + 2.0 * cross

    # -- joint layers -------------------------------------------------------------------------
    def _joint_risk(self, M, Q, b):
        return self._joint_terms(M, Q, b)[0]

    def _joint_terms(self, M, Q, b):
        """A joint layer's risk and its heads' attention masses ``H E[sum_l exp(x_hl) / Z]``, the
        latter from the token expectations ``E[rho_1(y + lse(x)) p_h(x)]`` (``p = softmax(x)``: the
        share of head ``h`` in ``u = sum_h exp(x_h)``) on the same nodes."""
        L, kappa, H = self.L, self.form.offset, Q.shape[0]
        m1, C1, m0, C0 = self._token_laws(M, Q, b)
        y, step = self._joint_range(m1, C1, m0, C0)
        pre = step * jnp.exp(-kappa * jnp.exp(y))
        z, w, tab = self.z_joint, self.w_joint, (self.z_inner, self.w_inner, self.u_grid)
        noise = _joint_token(y, m1, C1, z, w, tab)
        rel = self._atoms_mean(lambda k: _joint_token(y, m0[:, k], C0, z, w, tab))
        shares1 = _joint_shares(y, m1, C1, z, w, tab)  # (n_t, H)
        shares0 = self._atoms_mean(lambda k: _joint_shares(y, m0[:, k], C0, z, w, tab))
        p1, p2 = _power(noise[OMEGA], L - 1), _power(noise[OMEGA], L - 2)
        Ea0 = jnp.sum(pre * rel[RHO1] * p1)
        Ea00 = jnp.sum(pre * rel[RHO2] * p1)
        Ea11 = jnp.sum(pre * noise[RHO2] * rel[RHO0] * p2)
        mass = H * ((pre * p1) @ shares0 + (L - 1) * (pre * rel[RHO0] * p2) @ shares1)
        return 1.0 - 2.0 * Ea0 + Ea00 + (L - 1) * Ea11, mass

    def _joint_range(self, m1, C1, m0, C0):
        L = self.L
        m1, C1, m0, C0 = (jax.lax.stop_gradient(x) for x in (m1, C1, m0, C0))
        v1, v0 = jnp.diag(C1), jnp.diag(C0)
        log_eps = math.log(TAIL_EPS)

        def log_moments(m, C):  # log E[u], log E[u^2] for u = sum_h exp(x_h), x ~ N(m, C)
            v = jnp.diag(C)
            first = jax.nn.logsumexp(m + v / 2)
            second = jax.nn.logsumexp(m[:, None] + m[None, :] + (v[:, None] + v[None, :]) / 2 + C)
            return first, second

        f1, s1 = log_moments(m1, C1)
        f0, s0 = jax.vmap(lambda mk: log_moments(mk, C0), in_axes=1)(m0)
        lo = jnp.min(jnp.stack([log_eps - math.log(L) - f1, (log_eps - math.log(L) - s1) / 2,
                                log_eps - jnp.max(f0), (log_eps - jnp.max(s0)) / 2]))
        hi = jnp.minimum(U_TOP - jnp.max(jnp.min(m0, axis=1) - TAIL_SIGMAS * jnp.sqrt(v0)),
                         U_TOP - jnp.max(m1 - TAIL_SIGMAS * jnp.sqrt(v1)))
        hi = jnp.maximum(hi, lo + 1.0)
        return jnp.linspace(lo, hi, self.n_t), (hi - lo) / (self.n_t - 1)


def joint_layout(H: int, F: int, leading: tuple = JOINT_LEADING) -> tuple[tuple[int, ...], int]:
    """``(sizes, small)`` of the rule of a joint layer of ``H`` heads under a prior on ``F`` directions:
    normal rules of ``sizes`` on ``min(max(F, 2), len(leading), H - 1)`` leading principal directions
    (:data:`JOINT_LEADING`) and the next one (:data:`JOINT_SMALL`), the degree-5 rule on the ``small``
    others."""
    r = min(max(F, 2), len(leading), H - 1)
    sizes = tuple(leading[:r]) + ((JOINT_SMALL,) if H - 1 > r else ())
    return sizes, H - 1 - len(sizes)


def joint_rule_size(H: int, prior: Prior, *, refined: bool = False) -> int:
    """The work of a joint layer's exact rule per Laplace node: its token nodes (:func:`joint_layout`,
    :func:`joint_nodes`) times the heads times the prior's atoms (every atom's token expectation runs
    over every node and head); ``refined``: of the rule :meth:`LaplaceRule.refined` builds. Time and
    memory grow with it: about 75 microseconds of one drift per unit on the shared 2-core machine
    (4.7 s at 61440: ``H = 4`` on the Gaussian prior with ``F = 2``), and about 0.5 kB of memory per
    unit of the refined rule (:func:`~singleloc._resources.exact_rule_bytes`)."""
    sizes, small = joint_layout(H, prior.F)
    if refined:
        sizes = tuple(math.ceil(1.5 * n) for n in sizes) + ((JOINT_PROMOTED,) if small else ())
        small = max(small - 1, 0)
    return math.prod(sizes) * (2 * small * small + 1) * H * len(prior.atoms)


def symmetric_degree5(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The fully symmetric rule of degree 5 for ``E[f(z)]``, ``z ~ N(0, I_n)``, on ``2 n^2 + 1`` points:
    the origin, ``+-sqrt(3) e_i`` and ``+-sqrt(3) e_i +- sqrt(3) e_j`` (``i < j``), weights
    ``(n^2 - 7n + 18) / 18``, ``(4 - n) / 18`` and ``1 / 36`` (the moment equations ``E[1] = E[z_i^2] =
    E[z_i^2 z_j^2] = 1``, ``E[z_i^4] = 3``; every odd moment vanishes by symmetry). ``n = 1`` is the
    three-point Gauss-Hermite rule; ``n = 0`` one point."""
    points, weights = [np.zeros(n)], [(n * n - 7 * n + 18) / 18]
    r = math.sqrt(3.0)
    for i in range(n):
        for sign in (1.0, -1.0):
            points.append(sign * r * np.eye(n)[i])
            weights.append((4 - n) / 18)
    for i, j in itertools.combinations(range(n), 2):
        for si, sj in itertools.product((1.0, -1.0), repeat=2):
            points.append(r * (si * np.eye(n)[i] + sj * np.eye(n)[j]))
            weights.append(1 / 36)
    return np.array(points).reshape(len(weights), n), np.array(weights)


def joint_nodes(sizes: tuple, small: int) -> tuple[np.ndarray, np.ndarray]:
    """Standard normal nodes ``(N, len(sizes) + small)`` and weights of a joint layer's rule
    (:func:`_joint_token`), coordinate ``j`` along the ``j``-th principal direction: the tensor rule
    of :func:`~singleloc._laplace_profiles.normal_rule` of ``sizes`` times :func:`symmetric_degree5` on
    the ``small`` last ones."""
    nodes, weights = np.zeros((1, 0)), np.ones(1)
    for z, w in (normal_rule(n) for n in sizes):
        nodes = np.concatenate([np.repeat(nodes, len(w), axis=0), np.tile(z[:, None], (len(weights), 1))], axis=1)
        weights = np.repeat(weights, len(w)) * np.tile(w, len(weights))
    zs, ws = symmetric_degree5(small)
    nodes = np.concatenate([np.repeat(nodes, len(ws), axis=0), np.tile(zs, (len(weights), 1))], axis=1)
    return nodes, np.repeat(weights, len(ws)) * np.tile(ws, len(weights))


#: A joint layer's per-head ``rho_0`` factors are floored here before they divide a product of them
#: (:func:`_conditional_terms`): every term of the token's expectations is a product of bounded
#: factors, so the floor changes none by more than about this size.
RHO0_FLOOR = 1e-30
#: The heads' profiles a joint layer's token needs (:func:`_token_from_heads`).
JOINT_PROFILES = (RHO0, RHO1, RHO2, OMEGA)


def _conditional_law(C, dims: int):
    """``(delta, S)``: ``C = delta I + S^T S`` with ``delta`` the least eigenvalue of ``C`` (clipped at
    zero) and ``S`` (dims, H) the principal factor (:func:`principal_factor`) of ``C - delta I`` on its
    ``dims`` leading directions (``dims = H - 1`` holds all of it: its last eigenvalue is zero).
    Outside the gradient (the derivatives are by Price's theorem, :func:`_joint_token`)."""
    C = jax.lax.stop_gradient(C)
    delta = jnp.maximum(jnp.linalg.eigvalsh(C)[0], 0.0)
    return delta, principal_factor(C - delta * jnp.eye(C.shape[0], dtype=C.dtype))[:dims]


def _conditional_terms(values):
    """The pieces of the product form from the heads' smoothed profiles ``values`` (4, ..., H) at one
    ``y`` (:func:`_joint_token`): ``P = prod_h r0_h``, ``q_k = r_k / r0`` (k = 1, 2, per head) with
    ``r0`` floored at :data:`RHO0_FLOOR`, ``A = sum_h q_1`` and the exclusive products
    ``prod_{g < h} r0_g`` (the telescoped ``omega``)."""
    r0, r1, r2, om = values
    a = jnp.maximum(r0, RHO0_FLOOR)
    P = jnp.prod(a, axis=-1)
    q1, q2 = r1 / a, r2 / a
    before = jnp.cumprod(jnp.concatenate([jnp.ones_like(a[..., :1]), a[..., :-1]], axis=-1), axis=-1)
    return a, P, q1, q2, jnp.sum(q1, axis=-1), before


def _rho2_factor(q1, q2, A):
    """``rho_2(lse) / P = sum_h q2_h + sum_{h != g} q1_h q1_g``, as ``sum q2 + A^2 - sum q1^2``."""
    return jnp.sum(q2, axis=-1) + A**2 - jnp.sum(q1**2, axis=-1)


def _token_from_heads(values):
    """One token's ``E[f(y + lse(x)) | z]`` (4, ...) for ``f = rho_0, rho_1, rho_2, omega`` from the
    heads' smoothed profiles (fields independent given ``z``):

        rho_0(lse) = P,   rho_1(lse) = P sum_h q1_h,   rho_2(lse) = P (sum_h q2_h + sum_{h != g} q1_h q1_g),
        omega(lse) = sum_h omega_h prod_{g < h} r0_g   (non-negative terms: no digits lost near 0)."""
    _, P, q1, q2, A, before = _conditional_terms(values)
    return jnp.stack([P, P * A, P * _rho2_factor(q1, q2, A), jnp.sum(values[OMEGA] * before, axis=-1)])


@jax.custom_jvp
def _joint_token(y, mean, C, z, w, table_rule):
    """``E[f(y + lse(x))]`` (4, n_t) of the four profiles for the ``H`` fields ``x ~ N(mean, C)`` of
    one token, in conditional product form.

    Write ``C = delta I + S^T S`` (:func:`_conditional_law`): given the standard normals ``z`` on the
    ``H - 1`` principal directions of ``C - delta I`` (the nodes ``z`` (N, H - 1), weights ``w``), the
    fields ``x_h = mu_h + sqrt(delta) Z_h`` with ``mu = mean + z S`` are independent, so
    ``exp(-t u) = prod_h rho_0(y + x_h)`` (``u = sum_h exp(x_h)``) makes each profile of ``lse(x)`` a
    polynomial in one head's profiles smoothed by ``N(0, delta)`` (:func:`_token_from_heads`), which
    are tabulated once and interpolated (:func:`~singleloc._laplace_profiles.smoothing_table`). The
    smallest principal variance is integrated exactly, and heads that are copies leave ``delta = 0``
    and fewer active directions. ``table_rule``: ``(z_inner, w_inner, u_grid)`` of the tables.

    Derivatives by Price's theorem, ``dE[F] = E[grad F] dmean + E[tr(hess F dC)] / 2``, with the
    gradient and Hessian of the conditional expectation in ``mu`` from the tabulated derivatives of
    the smoothed profiles (:func:`_joint_token_jvp`): never through ``S``."""
    tables, mu = _conditional_fields(mean, C, z, table_rule, (0,))
    return jax.lax.map(lambda yy: _token_from_heads(interpolated(*tables, yy + mu, JOINT_PROFILES, (0,))[0]) @ w, y).T


def _conditional_fields(mean, C, z, table_rule, orders):
    """The table of the heads' profiles smoothed by ``N(0, delta)`` and of their derivatives
    (``orders``; :func:`~singleloc._laplace_profiles.smoothing_table`, on ``table_rule = (z_inner,
    w_inner, u_grid)``) and the conditional means ``mu = mean + z S`` (N, H) at the nodes ``z``
    (:func:`_conditional_law`)."""
    zi, wi, u = table_rule
    delta, S = _conditional_law(C, z.shape[1])
    return smoothing_table(delta, zi, wi, u, JOINT_PROFILES, WIDE_SIGMA, orders), mean + z @ S


@_joint_token.defjvp
def _joint_token_jvp(primals, tangents):
    """Price's theorem on the conditional product form. With ``a = r0``, ``l = a' / a``,
    ``q_k = r_k / a`` (derivatives in the head's conditional mean, from the tables of the smoothed
    profiles' derivatives) every profile is ``G = P Psi(A, B, C)`` of the sums ``A = sum q1``,
    ``B = sum q2``, ``C = sum q1^2`` (``Psi`` = 1, ``A``, ``B + A^2 - C``), so

        d_h G = P (l_h Psi + e_h),    e_h = sum_s Psi_s ds_h,
        d_h d_g G = P (Psi l_h l_g + l_h e_g + e_h l_g + c q1'_h q1'_g) + [h = g] P (l'_h Psi + f_h)

    (``c = Psi_AA``, ``f_h = sum_s Psi_s d^2 s_h``), and ``omega(lse) = 1 - rho_0(lse)``."""
    y, mean, C, z, w, table_rule = primals
    _, dmean, dC = tangents[:3]
    tables, mu = _conditional_fields(mean, C, z, table_rule, (0, 1, 2))

    def one(yy):
        values, first, second = interpolated(*tables, yy + mu, JOINT_PROFILES, (0, 1, 2))  # (4, N, H) each
        a, P, q1, q2, A, _ = _conditional_terms(values)
        l1 = first[RHO0] / a
        l2 = second[RHO0] / a - l1**2
        q1p = first[RHO1] / a - q1 * l1
        q2p = first[RHO2] / a - q2 * l1
        q1pp = second[RHO1] / a - 2 * q1p * l1 - q1 * second[RHO0] / a
        q2pp = second[RHO2] / a - 2 * q2p * l1 - q2 * second[RHO0] / a
        Psi = (jnp.ones_like(A), A, _rho2_factor(q1, q2, A))
        e = (jnp.zeros_like(q1), q1p, 2 * A[:, None] * q1p + q2p - 2 * q1 * q1p)
        f = (jnp.zeros_like(q1), q1pp, 2 * A[:, None] * q1pp + q2pp - 2 * (q1p**2 + q1 * q1pp))
        wP = w * P
        outer = lambda c, x, xp: jnp.einsum("n,nh,ng->hg", c, x, xp)
        grads, hessians = [], []
        for k in range(3):
            grads.append((wP * Psi[k]) @ l1 + wP @ e[k])
            cross = outer(wP, l1, e[k])
            hess = outer(wP * Psi[k], l1, l1) + cross + cross.T + jnp.diag(wP @ (l2 * Psi[k][:, None] + f[k]))
            hessians.append(hess + (2.0 * outer(wP, q1p, q1p) if k == 2 else 0.0))
        grads.append(-grads[0])
        hessians.append(-hessians[0])
        return _token_from_heads(values) @ w, jnp.stack(grads), jnp.stack(hessians)

    value, grad, hess = jax.lax.map(one, y)  # (n_t, 4), (n_t, 4, H), (n_t, 4, H, H)
    dC = (dC + dC.T) / 2
    tangent = jnp.einsum("tkh,h->tk", grad, dmean) + 0.5 * jnp.einsum("tkhg,hg->tk", hess, dC)
    return value.T, tangent.T


def _joint_shares(y, mean, C, z, w, table_rule):
    """``E[rho_1(y + lse(x)) softmax(x)_h]`` (n_t, H): each head's share ``P q1_h`` of ``rho_1(lse)``
    (:func:`_joint_token`; no derivatives: the attention mass is not differentiated)."""
    tables, mu = _conditional_fields(mean, C, z, table_rule, (0,))

    def one(yy):
        _, P, q1, _, _, _ = _conditional_terms(interpolated(*tables, yy + mu, JOINT_PROFILES, (0,))[0])
        return (w * P) @ q1

    return jax.lax.map(one, y)


def exact_rule(activation: Activation, L: int, H: int, prior: Prior, *, nodes: int = N_OUTER,
               **kwargs) -> LaplaceRule | None:
    """The :class:`LaplaceRule` of an activation that declares its normalised-exponential form
    (:func:`~singleloc.exponential_form`), or ``None``. ``nodes`` (``theory.nodes``): the normal rules
    of ``nodes`` nodes (the pairs' outer rule ``nodes`` per unit of the form's scale ``alpha``, i.e.
    ``nodes * ceil(alpha)``: a token field's width is ``alpha sqrt(Q_hh)``, so scalable softmax, ``alpha
    = log L``, keeps the resolution per unit of key length that softmax has) and ``2 nodes`` nodes of
    the Laplace variable; the other keywords as :meth:`LaplaceRule.make`."""
    form = exponential_form(activation, L)
    if form is None:
        return None
    return LaplaceRule.make(form, L, H, prior, n_t=2 * nodes, n_outer=nodes * max(1, math.ceil(form.scale)),
                            n_inner=nodes, **kwargs)

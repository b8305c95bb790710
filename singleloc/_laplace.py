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
  ``n_outer * ceil(alpha)`` from :func:`exact_rule`: 64 per unit of ``alpha`` resolve fields of
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
* A joint layer's ``H``-dimensional token expectation. With ``H <= 2`` in product form
  (:meth:`LaplaceRule._product_token`): ``exp(-t u) = prod_h rho_0(y + x_h)`` turns every profile
  of ``lse(x)`` into sums of products of one head's profiles, so one token's expectations are one
  head's and a pair's (the pair rule above, on the diagonal ``y' = y``), exact at the widths of
  trained keys. With ``H = 3`` a tensor rule of normal rules (:data:`JOINT_TENSOR` sizes) or, for more
  heads, Gauss-Hermite rules on the leading
  directions times scrambled Sobol normals with their mirrors (``joint_points``), both in the
  principal axes of the token's covariance, largest variance
  on the first coordinate (:func:`principal_factor`: heads that are copies leave only the
  leading coordinates active, where a Sobol rule is best); the derivative in ``(mu, C)`` is
  by Price's theorem, never through the eigendecomposition.
* ``theta``: the atoms of the prior exactly; a Gaussian part is folded into the relevant
  token's covariance, ``C0 = alpha^2 (Q + M Sigma M^T)`` (the relevant token's fields are
  Gaussian given the atom).
* Powers: ``P^(L-1) = exp((L-1) log1p(-E1[omega]))`` with ``E1[omega]`` computed directly (a sum
  of non-negative terms), so ``L`` up to any size costs nothing and loses no digits.

Nothing here depends on ``L`` but the exponents: the cost of a risk is
``O(H^2 n_t^2 n_outer)`` for a per-head layer, ``O(n_t N)`` for a joint one with ``N`` nodes
(``O(n_t n_outer)`` in product form).

Error statement. The risk is compared with that of a finer rule
(:meth:`LaplaceRule.refined`, 1.5 x the nodes of every kind): the difference bounds the error of
the coarse rule for a geometrically convergent rule.
"""

from __future__ import annotations

import itertools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._activations import Activation, ExponentialForm, exponential_form
from ._laplace_profiles import (
    OMEGA,
    RHO0,
    RHO1,
    RHO2,
    _power,
    _profile,
    _profiles,
    grid_smoothing,
    normal_rule,
    normal_smoothing,
    smoothed_profiles,
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
#: Joint layers with H = 3 (H <= 2 are in product form, ``LaplaceRule._product_token``, unless a
#: size is given here for them): a tensor rule, these sizes along the principal directions (largest
#: variance first; :func:`~singleloc._laplace_profiles.normal_rule`: trapezoidal from 32 nodes). The
#: leading directions carry the width of trained keys: at a trained bsoftmax H = 3, F = 2 state
#: (tau = 160, key variances 5.7 and 6.9 on two directions, 0.15 on the third) 24 Gauss-Hermite
#: nodes on every direction left a relative O(lr) drift error of 5.7e-4, (64, 32, 16) 5.0e-5 and
#: (64, 48, 16) 6.2e-9 (against (96, 72, 48)), at twice the cost of (64, 24, 16).
JOINT_TENSOR = {3: (64, 48, 16)}
#: Joint layers with H >= 4: Gauss-Hermite sizes on the three leading principal directions and
#: Sobol points on the rest. Specialised heads put comparable variance on several directions:
#: (24, 8, 4) x 64 was off by 5e-4 (H = 4, F = 2) to 1.1e-2 (H = 4, F = 4) there; (24, 16, 8) x 16,
#: at the same number of nodes, by 1.3e-5 to 4.2e-4 (against (28, 24, 12) x 16; docs/model.md 4.6).
JOINT_LEADING = (24, 16, 8)
JOINT_POINTS = 16


# -- the rule --------------------------------------------------------------------------------

class LaplaceRule(eqx.Module):
    """Deterministic rule for the exact risk of a normalised-exponential layer (module docstring).

    Build it with :meth:`make`; :meth:`risk` is ``R(M, Q, b)``. Its node counts are static
    (``n_t`` nodes of ``y`` per head, normal rules of the token fields), its ranges
    follow the state.
    """

    z_outer: jax.Array
    w_outer: jax.Array
    z_inner: jax.Array
    w_inner: jax.Array
    u_grid: jax.Array  # (n_u,) the profile grid of the one-token expectations of wide fields
    z_joint: jax.Array  # (N, H) standard normals of a joint layer's token fields (N = 0: per-head layer)
    w_joint: jax.Array
    atoms: jax.Array  # (K, F)
    probs: jax.Array  # (K,)
    prior_cov: jax.Array  # (F, F), the Gaussian part of the prior
    form: ExponentialForm = eqx.field(static=True)
    L: int = eqx.field(static=True)
    n_t: int = eqx.field(static=True)
    joint_points: int = eqx.field(static=True)

    @classmethod
    def make(cls, form: ExponentialForm, L: int, H: int, prior: Prior, *, n_t: int = N_T, n_outer: int = N_OUTER,
             n_inner: int = N_INNER, joint_points: int = JOINT_POINTS, joint_tensor: dict | None = None,
             joint_leading: tuple | None = None, seed: int = 0, u_step: float = U_GRID_STEP) -> LaplaceRule:
        """The rule for ``H`` heads over sequences of ``L >= 2`` tokens under ``prior``.

        ``joint_tensor``: the tensor rule's sizes along the principal directions for a joint layer
        of ``H`` heads, ``{H: sizes}`` (default :data:`JOINT_TENSOR`, ``H = 3``; without an entry,
        ``H <= 2`` are in product form, :meth:`_product_token`); more heads use Gauss-Hermite rules of ``joint_leading``
        sizes (default ``(24, 16, 8)``) on the leading principal directions and ``joint_points``
        Sobol points (scrambling ``seed``) with their mirrors on the others. ``u_step``: the step
        of the profile grid (:meth:`_single`).
        """
        if L < 2:
            raise ValueError(f"problem.L must be >= 2 for the exact route, got {L}")
        dtype = jnp.result_type(float)
        zo, wo = normal_rule(n_outer)
        zi, wi = normal_rule(n_inner)
        zj, wj = np.zeros((0, H)), np.zeros((0,))
        if form.joint:
            zj, wj = joint_nodes(H, joint_points, seed, joint_tensor or JOINT_TENSOR, joint_leading)
        as_array = lambda x: jnp.asarray(x, dtype)
        u = np.linspace(U_GRID_LOW, U_GRID_HIGH, int(math.ceil((U_GRID_HIGH - U_GRID_LOW) / u_step)) + 1)
        return cls(as_array(zo), as_array(wo), as_array(zi), as_array(wi), as_array(u), as_array(zj), as_array(wj),
                   as_array(prior.atoms_array()), as_array(prior.probs_array()), as_array(np.asarray(prior.noise_cov)),
                   form, int(L), int(n_t), int(joint_points))

    def refined(self, factor: float = 1.5, seed: int = 1) -> LaplaceRule:
        """The same rule with ``factor`` times the nodes of every kind but a joint layer's Sobol
        points, which are rescrambled with ``seed`` (the error estimate's reference; more Sobol
        points would multiply the joint rule's memory, several gigabytes at H = 4)."""
        H = self.z_joint.shape[-1]
        grow = lambda n: int(math.ceil(factor * n))
        tensor = {h: tuple(grow(n) for n in sizes) for h, sizes in JOINT_TENSOR.items()}
        leading = tuple(grow(n) for n in JOINT_LEADING)
        prior = Prior(np.asarray(self.atoms), np.asarray(self.probs), np.asarray(self.prior_cov))
        return LaplaceRule.make(self.form, self.L, H, prior, n_t=grow(self.n_t), n_outer=grow(self.z_outer.shape[0]),
                                n_inner=grow(self.z_inner.shape[0]), joint_points=self.joint_points,
                                joint_tensor=tensor, joint_leading=leading, seed=seed,
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

    # -- per-head layers ----------------------------------------------------------------------
    def _ranges(self, m1, v1, m0, v0):
        """``y`` nodes (H, n_t) and steps (H,) of every head (outside the gradient)."""
        L = self.L
        m1, v1, m0, v0 = (jax.lax.stop_gradient(x) for x in (m1, v1, m0, v0))
        log_eps = math.log(TAIL_EPS)
        # lower end: E[exp(k (y + x))] <= eps for the special token (noise terms carry a factor L - 1)
        lows = []
        for k in (1, 2):
            lows.append((log_eps - math.log(L)) / k - m1 - k * v1 / 2)
            lows.append(log_eps / k - jnp.max(m0, axis=1) - k * v0 / 2)
        lo = jnp.min(jnp.stack(lows), axis=0)
        # upper end: the relevant token's factor (or a noise token's) is negligible
        hi = jnp.minimum(U_TOP - jnp.min(m0, axis=1) + TAIL_SIGMAS * jnp.sqrt(v0), U_TOP - m1 + TAIL_SIGMAS * jnp.sqrt(v1))
        hi = jnp.maximum(hi, lo + 1.0)
        s = jnp.linspace(0.0, 1.0, self.n_t)
        return lo[:, None] + (hi - lo)[:, None] * s, (hi - lo) / (self.n_t - 1)

    def _single(self, y, m, v):
        """``E[f(y + x)]`` (4, n_t) of the four profiles for ``x ~ N(m, v)``.

        A narrow field (``sqrt(v) <= WIDE_SIGMA``) on the outer Gauss-Hermite nodes. A wide one on
        the profile grid ``u_p`` instead, where the profiles, not the Gaussian, carry the fine
        structure: ``E[f(y + x)] = int f(u) phi_s(u - y - m) du`` for ``f = rho_1, rho_2`` and, as
        ``omega' = rho_1``, ``E[omega(y + x)] = int rho_1(u) Phi((y + m - u) / s) du`` (a sum of
        non-negative terms), ``rho_0 = 1 - omega``. Gauss-Hermite nodes are spread over the
        Gaussian, ``s`` times further apart than the profiles' own scale, so their error grows with
        ``s`` (64 nodes: 4e-9 at ``s = 1``, 3e-6 at ``s = 1.5``; the two rules cross near
        ``s = 0.6``); the grid's does not (a trapezoidal rule of an integrand analytic in
        ``|Im u| < pi/2``)."""
        every = (RHO0, RHO1, RHO2, OMEGA)
        narrow = normal_smoothing(y + m, jnp.sqrt(jnp.maximum(v, VAR_FLOOR)), self.z_outer, self.w_outer, every)[0]
        wide = grid_smoothing(y + m, jnp.sqrt(jnp.maximum(v, WIDE_SIGMA**2)), self.u_grid, every)[0]  # finite where not taken
        return jnp.where(v > WIDE_SIGMA**2, wide, narrow)

    def _pair(self, combos, y, yp, m, mp, C11, C12, C22):
        """``E[f_a(y + x) f_b(y' + x')]`` (len(combos), n_t, n_t) on the grid ``y x y'`` for the profile
        pairs ``(a, b)`` in ``combos``, ``(x, x')`` Gaussian with means ``(m, m')`` and covariance
        ``[[C11, C12], [C12, C22]]`` (module docstring)."""
        outer, inner, which = self._pair_factors(combos, y, yp, m, mp, C11, C12, C22)
        return jnp.stack([outer[a] @ inner[which.index(b)] for a, b in combos])

    def _pair_diagonal(self, combos, y, m, mp, C11, C12, C22):
        """:meth:`_pair` on the diagonal ``y' = y`` only: (len(combos), n_t), the two fields of one
        token under one normaliser (a joint layer's product form, :meth:`_product_token`)."""
        outer, inner, which = self._pair_factors(combos, y, y, m, mp, C11, C12, C22)
        return jnp.stack([jnp.einsum("to,ot->t", outer[a], inner[which.index(b)]) for a, b in combos])

    def _pair_factors(self, combos, y, yp, m, mp, C11, C12, C22):
        """The weighted first-field profiles (4, n_t, n_outer) and the second field's smoothed
        profiles given the first (len(which), n_outer, n_t) of :meth:`_pair`."""
        C11 = jnp.maximum(C11, PAIR_VAR_FLOOR)
        sx = jnp.sqrt(C11) * self.z_outer  # x - m at the outer nodes
        beta = C12 / C11
        s2 = C22 - C12**2 / C11
        outer = self.w_outer * _profiles(y[:, None] + m + sx)  # (4, n_t, n_outer)
        which = tuple(sorted({b for _, b in combos}))  # only the second head's profiles that are used
        inner = smoothed_profiles(yp[None, :] + mp + beta * sx[:, None], s2, self.z_inner, self.w_inner, self.u_grid, which,
                                  WIDE_SIGMA)  # (., n_outer, n_t)
        return outer, inner, which

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
        if self.z_joint.shape[0] == 0:  # the product form (H <= 2)
            noise, shares1 = self._product_token(y, m1, C1)
            rel, shares0 = self._atoms_mean(lambda k: self._product_token(y, m0[:, k], C0))
        else:
            z, w = self.z_joint, self.w_joint
            S1, S0 = principal_factor(jax.lax.stop_gradient(C1)), principal_factor(jax.lax.stop_gradient(C0))
            noise = _lse_profiles(y, m1, C1, S1, z, w)
            rel = self._atoms_mean(lambda k: _lse_profiles(y, m0[:, k], C0, S0, z, w))
            shares1 = _lse_shares(y, m1, S1, z, w)  # (n_t, H)
            shares0 = self._atoms_mean(lambda k: _lse_shares(y, m0[:, k], S0, z, w))
        p1, p2 = _power(noise[OMEGA], L - 1), _power(noise[OMEGA], L - 2)
        Ea0 = jnp.sum(pre * rel[RHO1] * p1)
        Ea00 = jnp.sum(pre * rel[RHO2] * p1)
        Ea11 = jnp.sum(pre * noise[RHO2] * rel[RHO0] * p2)
        mass = H * ((pre * p1) @ shares0 + (L - 1) * (pre * rel[RHO0] * p2) @ shares1)
        return 1.0 - 2.0 * Ea0 + Ea00 + (L - 1) * Ea11, mass

    def _product_token(self, y, m, C):
        """One token's ``E[f(y + lse(x))]`` (4, n_t) and the heads' shares ``E[rho_1(y + lse(x))
        softmax(x)_h]`` (n_t, H) for ``x ~ N(m, C)`` with ``H <= 2`` fields, in product form:
        ``exp(-t u) = prod_h rho_0(y + x_h)``, so with ``f_h = f(y + x_h)``

            rho_0(lse) = rho_0,1 rho_0,2,     rho_1(lse) = rho_1,1 rho_0,2 + rho_0,1 rho_1,2,
            rho_2(lse) = rho_2,1 rho_0,2 + 2 rho_1,1 rho_1,2 + rho_0,1 rho_2,2,
            omega(lse) = omega_1 + rho_0,1 omega_2   (a sum of non-negative terms),

        one head's expectations (:meth:`_single`) and a pair's on the diagonal ``y' = y``
        (:meth:`_pair_diagonal`): exact at any width of the second field and, for the first, to a
        standard deviation of about 3 (module docstring), where a tensor rule in the principal axes
        loses accuracy with the width of both. Head ``h``'s share of ``rho_1(lse)`` is its term of
        that sum."""
        one = self._single(y, m[0], C[0, 0])
        if m.shape[0] == 1:
            return one, one[RHO1][:, None]
        combos = ((RHO1, RHO0), (RHO0, RHO1), (RHO0, RHO0), (RHO2, RHO0), (RHO1, RHO1), (RHO0, RHO2), (RHO0, OMEGA))
        p10, p01, p00, p20, p11, p02, p0w = self._pair_diagonal(combos, y, m[0], m[1], C[0, 0], C[0, 1], C[1, 1])
        token = {RHO0: p00, RHO1: p10 + p01, RHO2: p20 + 2.0 * p11 + p02, OMEGA: one[OMEGA] + p0w}
        return jnp.stack([token[f] for f in range(4)]), jnp.stack([p10, p01], axis=-1)

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


def joint_nodes(H: int, points: int, seed: int, tensor: dict, leading: tuple = None) -> tuple[np.ndarray, np.ndarray]:
    """Standard normal nodes (N, H) and weights of a joint layer's token rule, coordinate ``j``
    along the ``j``-th principal direction (:func:`principal_factor`): a tensor rule of
    :func:`~singleloc._laplace_profiles.normal_rule` of the ``tensor[H]`` sizes for ``H`` in
    ``tensor``; else Gauss-Hermite rules of ``leading`` sizes (default
    ``JOINT_LEADING``) on the leading coordinates times ``points`` scrambled Sobol normals
    (:func:`~singleloc._fields.sobol_normals`, with their mirrors) on the others."""
    if H in tensor:
        rules = [normal_rule(n) for n in tensor[H]]
        sobol = None
    elif H <= 2:  # no nodes: the product form (LaplaceRule._product_token)
        return np.zeros((0, H)), np.zeros((0,))
    else:
        rules = [normal_rule(n) for n in (leading or JOINT_LEADING)]
        from ._fields import sobol_normals

        base = sobol_normals(H - len(rules), points, seed)
        sobol = np.concatenate([base, -base], axis=0)
    grids = np.meshgrid(*[z for z, _ in rules], indexing="ij")
    nodes = np.stack([g.ravel() for g in grids], axis=1)
    weights = np.prod(np.meshgrid(*[w for _, w in rules], indexing="ij"), axis=0).ravel()
    if sobol is not None:
        n = len(sobol)
        nodes = np.concatenate([np.repeat(nodes, n, axis=0), np.tile(sobol, (len(weights), 1))], axis=1)
        weights = np.repeat(weights, n) / n
    return nodes, weights


@jax.custom_jvp
def _lse_profiles(y, mean, C, S, z, w):
    """``E[f(y + lse(x))]`` (4, n_t) of the four profiles for ``x ~ N(mean, C)`` on the nodes
    ``mean + z S`` (``S^T S = C``, :func:`principal_factor`); derivatives in ``(mean, C)`` by
    Price's theorem, never through ``S``."""
    ell = jax.nn.logsumexp(mean + z @ S, axis=-1)  # (N,)
    return _profiles(y[:, None] + ell[None, :]) @ w


def _lse_shares(y, mean, S, z, w):
    """``E[rho_1(y + lse(x)) softmax(x)_h]`` (n_t, H) for ``x ~ N(mean, S^T S)`` on the nodes
    ``mean + z S``: each head's share of ``rho_1`` (no derivatives: the attention mass is not
    differentiated)."""
    x = mean + z @ S
    return _profile(y[:, None] + jax.nn.logsumexp(x, axis=-1)[None, :], RHO1) @ (w[:, None] * jax.nn.softmax(x, axis=-1))


@_lse_profiles.defjvp
def _lse_profiles_jvp(primals, tangents):
    y, mean, C, S, z, w = primals
    _, dmean, dC, _, _, _ = tangents
    x = mean + z @ S
    ell = jax.nn.logsumexp(x, axis=-1)
    u = y[:, None] + ell[None, :]
    p = jax.nn.softmax(x, axis=-1)  # (N, H): the gradient of lse
    dC = (dC + dC.T) / 2
    a = p @ dmean
    q = jnp.einsum("ni,ij,nj->n", p, dC, p)
    s = p @ jnp.diag(dC)
    d1, d2 = (jnp.stack([_profile(u, p, order) for p in range(4)]) for order in (1, 2))
    # Price: dE[F] = E[grad F] dmean + E[tr(hess F dC)] / 2, with grad F = f' p and
    # hess F = f'' p p^T + f' (diag p - p p^T)
    tangent = (d1 * (a + 0.5 * (s - q))) @ w + (0.5 * d2 * q) @ w
    return _profiles(u) @ w, tangent


def exact_rule(activation: Activation, L: int, H: int, prior: Prior, *, n_outer: int = N_OUTER,
               **kwargs) -> LaplaceRule | None:
    """The :class:`LaplaceRule` of an activation that declares its normalised-exponential form
    (:func:`~singleloc.exponential_form`), or ``None``. ``n_outer``: the pairs' outer nodes per unit
    of the form's scale ``alpha`` (the rule gets ``n_outer * ceil(alpha)``: a token field's width is
    ``alpha sqrt(Q_hh)``, so scalable softmax, ``alpha = log L``, keeps the resolution per unit of key
    length that softmax has); the other keywords as :meth:`LaplaceRule.make`."""
    form = exponential_form(activation, L)
    if form is None:
        return None
    return LaplaceRule.make(form, L, H, prior, n_outer=n_outer * max(1, math.ceil(form.scale)), **kwargs)

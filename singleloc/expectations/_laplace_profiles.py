"""The profiles of the exact route's Laplace form and their Gaussian smoothings (:mod:`~singleloc.expectations._laplace`).

With ``y = log t`` the Laplace form needs, per token, ``rho_k(u) = exp(k u - e^u)`` (``k = 0, 1, 2``) and ``omega(u) = 1
- rho_0(u) = -expm1(-e^u)`` at ``u = y + x``; their derivatives are sums of them (:func:`derivative`), and their
smoothing by a Gaussian, ``E[f(u + s Z)]``, has its derivative in ``s^2`` by the heat equation (Price's theorem), finite
at ``s = 0`` where heads are copies. Two rules smooth them: normal rules for a narrow Gaussian (:func:`normal_smoothing`)
and the profile grid for a wide one (:func:`grid_smoothing`); a pair's second field, smoothed at many arguments, goes
through a table of either on a lattice, interpolated (:func:`smoothed_profiles`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

#: Profiles are evaluated with ``u`` clipped at this value: beyond it ``rho_k`` is an exact
#: zero and ``omega`` an exact one in float64, and ``e^u`` stays finite in their derivatives.
U_CLIP = 50.0

#: Fields of a larger standard deviation than this are smoothed on the profile grid
#: (:func:`grid_smoothing`), smaller ones on a normal rule (:func:`normal_smoothing`):
#: :meth:`~singleloc.expectations._laplace.LaplaceRule.single`, :func:`smoothed_profiles`.
WIDE_SIGMA = 0.6
#: The profile grid: ``u`` from ``U_GRID_LOW`` (``e^u`` below 1e-15: the profiles' lower tails are
#: negligible there, also times ``L = 4096``) to ``U_GRID_HIGH`` (``rho_k`` below ``e^-90``) in steps
#: of ``U_GRID_STEP`` (trapezoidal error of order ``exp(-pi^2 / step)``, 7e-18).
U_GRID_LOW = -36.0
U_GRID_HIGH = 4.5
U_GRID_STEP = 0.25


def profile_grid(step: float = U_GRID_STEP) -> np.ndarray:
    """The profile grid of :func:`grid_smoothing`: equispaced from :data:`U_GRID_LOW` to
    :data:`U_GRID_HIGH`, in steps of at most ``step``."""
    return np.linspace(U_GRID_LOW, U_GRID_HIGH, int(math.ceil((U_GRID_HIGH - U_GRID_LOW) / step)) + 1)


# -- profiles ------------------------------------------------------------------------------
# Stacked along a leading axis of 4: rho_0, rho_1, rho_2 (rho_k(u) = exp(k u - e^u)) and
# omega(u) = 1 - rho_0(u) = -expm1(-e^u). The higher profiles rho_k, k >= 3 (the Gram term's
# moments, :mod:`~singleloc.expectations._laplace_gram`), follow omega: profile ``rho(k)``.
RHO0, RHO1, RHO2, OMEGA = range(4)


def rho(k: int) -> int:
    """The profile index of ``rho_k(u) = exp(k u - e^u)``, ``k >= 0``."""
    return (RHO0, RHO1, RHO2)[k] if k < 3 else OMEGA + k - 2


def _exponentials(u):
    """``(e^u, rho_0(u) = exp(-e^u))`` with ``u`` clipped at :data:`U_CLIP`: the two exponentials every profile
    and derivative at ``u`` is a polynomial of (:func:`_profile`)."""
    e = jnp.exp(jnp.minimum(u, U_CLIP))
    return e, jnp.exp(-e)


def _profile(u, which: int, exponentials=None):
    """Profile ``which`` at ``u``. One profile at a time, so that a sum over nodes fuses with its evaluation (no stacked
    intermediate the size of the nodes); ``exponentials``: those of :func:`_exponentials` at ``u``, where several
    profiles share them."""
    e, r0 = _exponentials(u) if exponentials is None else exponentials
    if which == OMEGA:
        return -jnp.expm1(-e)
    k = _power_of(which)
    return e**k * r0 if k else r0


def _power_of(p: int) -> int:
    """``k`` of the profile ``rho_k`` (:func:`rho`)."""
    return p if p < OMEGA else p - 1


def derivative(p: int, order: int) -> dict:
    """The ``order``-th derivative of profile ``p`` as a sum of profiles ``{profile: coefficient}``: ``rho_k' = k rho_k -
    rho_{k+1}`` (as ``e^u rho_k = rho_{k+1}``), ``omega' = rho_1``. Smoothing by a Gaussian is linear, so the smoothed
    derivatives are the same sums of the smoothed profiles: one table of values serves every order."""
    if order == 0:
        return {p: 1.0}
    if p == OMEGA:
        return derivative(RHO1, order - 1)
    terms: dict = {}
    for q, c in derivative(p, order - 1).items():
        k = _power_of(q)
        terms[q] = terms.get(q, 0.0) + k * c
        terms[rho(k + 1)] = terms.get(rho(k + 1), 0.0) - c
    return {q: c for q, c in terms.items() if c}


def jvp_profiles(which) -> tuple:
    """The profiles whose values give those of ``which`` and their first two derivatives (:func:`derivative`), sorted:
    a JVP's table."""
    return tuple(sorted({q for p in which for order in (0, 1, 2) for q in derivative(p, order)}))


def derivatives(values, which):
    """The profiles ``which`` and their first and second derivatives, three arrays ``(len(which), ...)``, from the
    (smoothed) ``values`` ``(len(profiles), ...)`` of ``profiles = jvp_profiles(which)``."""
    profiles = jvp_profiles(which)
    return tuple(jnp.stack([sum(c * values[profiles.index(q)] for q, c in derivative(p, order).items()) for p in which])
                 for order in (0, 1, 2))


def _profiles(u, which=(RHO0, RHO1, RHO2, OMEGA)):
    """The profiles ``which`` (default the four of the risk) at ``u``, shape ``(len(which), *u.shape)``."""
    return jnp.stack([_profile(u, p) for p in which])


def normal_smoothing(c, s, z, w, which):
    """``E[f(c + s Z)]`` ``(len(which), *c.shape)`` for the profiles ``f`` listed in ``which``, ``Z`` on the standard
    normal nodes ``z`` with weights ``w``: exact for a narrow Gaussian (``s`` up to a few times the profiles' own scale,
    :func:`~singleloc.expectations._cubature.normal_rule`). Several profiles share the two exponentials at the nodes
    (held apart from the sums, which XLA would each recompute them in)."""
    x = c[..., None] + s * z
    shared = jax.lax.optimization_barrier(_exponentials(x)) if len(which) > 1 else None
    return jnp.stack([jnp.sum(w * _profile(x, p, shared), axis=-1) for p in which])


def grid_smoothing(c, s, u, which):
    """``E[f(c + s Z)]`` ``(len(which), *c.shape)`` for the profiles in ``which`` on the profile grid ``u``
    (equispaced, covering the profiles' support): ``int f(v) phi_s(v - c) dv`` for ``rho_k`` (``k >= 1``) and, as
    ``omega' = rho_1``, ``E[omega(c + s Z)] = int rho_1(v) Phi((c - v) / s) dv`` (a sum of non-negative terms), ``rho_0
    = 1 - omega``. The profiles, not the Gaussian, carry the fine structure, so the rule is exact for any ``s`` above
    the grid's step (a trapezoidal rule of an integrand analytic in ``|Im v| < pi/2``), however wide."""
    step = u[1] - u[0]
    d = (u - c[..., None]) / s  # (..., n_u)
    density = step * jnp.exp(-0.5 * d**2) / (s * np.sqrt(2 * np.pi))
    omega = step * (jax.scipy.special.ndtr(-d) @ _profile(u, RHO1)) if {RHO0, OMEGA} & set(which) else None
    return jnp.stack([omega if p == OMEGA else 1.0 - omega if p == RHO0 else density @ _profile(u, p) for p in which])


# -- the smoothed profiles of a pair's second field: tables on a lattice, interpolated ---------
#: Values of the argument at which the smoothed profiles are tabulated (:func:`smoothed_profiles`).
TABLE_POINTS = 1024
#: Points of the Lagrange interpolation between them.
INTERPOLATION_POINTS = 8
#: Standard deviations beyond the profile grid's upper end at which a smoothed profile has reached its
#: asymptote (the Gaussian mass below that end: ``Phi(-8.5)``, 1e-17).
TABLE_TAIL_SIGMAS = 8.5


def _lattice(s2, u):
    """``(lo, h)``: the lattice ``lo + h k`` (``k < TABLE_POINTS``) outside of which every smoothed
    profile equals its asymptote to ``exp(u[0])`` (below, ``E[rho_k(c + s Z)] <= exp(k c + k^2 s^2 / 2)``;
    above, the Gaussian mass below the grid's upper end). Its step is 0.04 for ``s = 0`` and grows
    like ``s`` for wide fields, whose smoothed profiles vary on that scale."""
    lo = jnp.minimum(u[0] - s2 / 2, u[0] / 2 - s2)
    hi = u[-1] + TABLE_TAIL_SIGMAS * jnp.sqrt(s2)
    return lo, (hi - lo) / (TABLE_POINTS - 1)


def _lagrange_weights(x):
    """Weights ``(*x.shape, P)`` of the ``P = INTERPOLATION_POINTS`` point Lagrange interpolation at ``x`` from the
    nodes ``0, 1, ..., P - 1``: ``prod_{r != q} (x - r) / (q - r)``, the products left and right of ``q`` built up one
    factor at a time (no division by ``x - q``; unrolled, so that they fuse into one elementwise pass)."""
    P = INTERPOLATION_POINTS
    d = [x - r for r in range(P)]
    left, right = [jnp.ones_like(x)], [jnp.ones_like(x)]
    for r in range(P - 1):
        left.append(left[-1] * d[r])
        right.append(right[-1] * d[P - 1 - r])
    denominators = [math.prod(q - r for r in range(P) if r != q) for q in range(P)]
    return jnp.stack([left[q] * right[P - 1 - q] / denominators[q] for q in range(P)], axis=-1)


def smoothing_table(s2, z, w, u, which, wide=WIDE_SIGMA):
    """The smoothed profiles ``E[f(c + sqrt(s2) Z)]`` of :func:`smoothed_profiles` tabulated on the lattice of
    :func:`_lattice`, ``(lo, h, windows)``: on the normal rule ``z, w`` for ``sqrt(s2) <= wide`` (default
    :data:`WIDE_SIGMA`), on the profile grid ``u`` above. Built once, looked up at many arguments
    (:func:`interpolated`), as the table's windows: row ``k`` of ``windows`` ``(TABLE_POINTS - P + 1, len(which)
    P)`` holds the ``P = INTERPOLATION_POINTS`` values from lattice point ``k`` on of every profile, so that an
    argument reads the values of its interpolation as one contiguous row."""
    s2 = jnp.maximum(s2, 0.0)
    lo, h = _lattice(jax.lax.stop_gradient(s2), u)
    lattice = lo + h * jnp.arange(TABLE_POINTS, dtype=u.dtype)
    table = jax.lax.cond(s2 > wide**2, lambda: grid_smoothing(lattice, jnp.sqrt(s2), u, which),
                         lambda: normal_smoothing(lattice, jnp.sqrt(s2), z, w, which))
    P = INTERPOLATION_POINTS
    windows = jnp.stack([table[:, q:TABLE_POINTS - P + 1 + q] for q in range(P)], axis=-1)  # (rows, k, P)
    return lo, h, windows.transpose(1, 0, 2).reshape(TABLE_POINTS - P + 1, -1)


def interpolated(lo, h, windows, c, which):
    """The tabulated smoothed profiles ``which`` (:func:`smoothing_table`) at the arguments ``c``, ``(len(which),
    *c.shape)``: :data:`INTERPOLATION_POINTS`-point Lagrange interpolation inside the lattice (one row of the windows
    per argument, contracted with its weights), the asymptotes outside it (``rho_0 = 1`` below, ``omega = 1`` above,
    every other profile zero)."""
    P = INTERPOLATION_POINTS
    t = (c - lo) / h
    k0 = jnp.clip(jnp.floor(t).astype(jnp.int32) - (P // 2 - 1), 0, TABLE_POINTS - P)
    window = windows.at[k0].get(mode="promise_in_bounds").reshape(c.shape + (-1, P))  # (*c.shape, rows, P)
    value = jnp.einsum("...rp,...p->r...", window, _lagrange_weights(t - k0))
    shape = (len(which),) + (1,) * c.ndim
    low, high = (np.array([float(p == asymptote) for p in which]).reshape(shape) for asymptote in (RHO0, OMEGA))
    return jnp.where(t < 0, low, jnp.where(t > TABLE_POINTS - 1, high, value))


def _tabulated(c, s2, z, w, u, which, wide):
    """The smoothed profiles ``which`` of :func:`smoothed_profiles` at ``c``, ``(len(which), *c.shape)``: a table
    (:func:`smoothing_table`), interpolated."""
    return interpolated(*smoothing_table(s2, z, w, u, which, wide), c, which)


@functools.partial(jax.custom_jvp, nondiff_argnums=(5, 6))
def smoothed_profiles(c, s2, z, w, u, which, wide):
    """``E[f(c + sqrt(s2) Z)]`` (``len(which)``, ``*c.shape``) for the profiles ``f`` in ``which``
    (static): the profiles smoothed by a Gaussian of variance ``s2 >= 0`` (a scalar), at many
    arguments ``c``: one function of ``c``, tabulated (:func:`smoothing_table`: exact at any width) and
    interpolated (:func:`interpolated`: error below 1e-10 at the lattice's step, 0.04 for ``s2 = 0``, less for
    wide Gaussians), at the cost of the table plus a few operations per argument.

    Derivatives: in ``c`` the smoothed derivative profile, in ``s2`` the heat equation (Price's
    theorem) ``d E[f(c + s Z)] / d(s2) = E[f''(c + s Z)] / 2``, finite at ``s2 = 0`` (heads that are
    copies); both sums of smoothed profiles (:func:`derivative`), tabulated and interpolated with the values."""
    return _tabulated(c, s2, z, w, u, which, wide)


@smoothed_profiles.defjvp
def _smoothed_profiles_jvp(which, wide, primals, tangents):
    c, s2, z, w, u = primals
    dc, ds2 = tangents[:2]
    value, first, second = derivatives(_tabulated(c, s2, z, w, u, jvp_profiles(which), wide), which)
    return value, first * dc + 0.5 * second * ds2


def _power(omega, n):
    """``(1 - omega)^n`` for ``omega`` in ``[0, 1]`` (a sum of non-negative terms, computed directly) and ``n >= 0`` (a
    number or an array: the sequence length is traced), as ``exp(n log1p(-omega))``: no digits lost for large ``n``, and
    finite derivatives where ``omega`` reaches one (the power is then zero, or one for ``n = 0``)."""
    inside = omega < 1.0
    safe = jnp.where(inside, jnp.clip(omega, 0.0, 1.0), 0.0)
    return jnp.where(inside, jnp.exp(n * jnp.log1p(-safe)), jnp.where(n == 0, 1.0, 0.0))

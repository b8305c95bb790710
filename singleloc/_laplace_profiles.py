"""The profiles of the exact route's Laplace form and their Gaussian smoothings (:mod:`~singleloc._laplace`).

With ``y = log t`` the Laplace form needs, per token, ``rho_k(u) = exp(k u - e^u)`` (``k = 0, 1,
2``) and ``omega(u) = 1 - rho_0(u) = -expm1(-e^u)`` at ``u = y + x``; their derivatives are in
closed form, and their smoothing by a Gaussian, ``E[f(u + s Z)]``, has its derivative in ``s^2``
by the heat equation (Price's theorem), finite at ``s = 0`` where heads are copies.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from scipy.special import roots_hermitenorm

#: Profiles are evaluated with ``u`` clipped at this value: beyond it ``rho_k`` is an exact
#: zero and ``omega`` an exact one in float64, and ``e^u`` stays finite in their derivatives.
U_CLIP = 50.0

#: Standard normal rules of at least this many nodes are trapezoidal (:func:`normal_rule`).
TRAPEZOID_FROM = 32
#: Half-width, in standard deviations, of the trapezoidal normal rule (the mass beyond: 1.2e-15).
NORMAL_RANGE = 8.0


def gauss_hermite(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights (summing to one) of the ``n``-point rule for ``E[f(z)]``, ``z ~ N(0, 1)``."""
    z, w = roots_hermitenorm(n)
    return z, w / w.sum()


def normal_rule(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights (summing to one) of an ``n``-point rule for ``E[f(z)]``, ``z ~ N(0, 1)``,
    for the profiles' ``f(z) = rho(u + s z)``: from :data:`TRAPEZOID_FROM` nodes the trapezoidal
    rule on ``[-8, 8]`` (weights ``phi(z_k)``, normalised), below it Gauss-Hermite.

    Why. ``rho(u + s z)`` is analytic in the strip ``|Im z| < pi / (2 s)`` only, and the rule's
    error is set by that strip: the trapezoidal rule of step ``delta`` converges like
    ``exp(-pi^2 / (s delta))``, Gauss-Hermite's nodes crowd at the centre and do worse at every
    width (measured, ``max |E[rho_k]|`` error over ``u``: 64 nodes at ``s = 2``, trapezoidal 2e-7
    against Gauss-Hermite's 9e-5; at ``s = 3`` 4e-5 against 2e-3; both 2e-16 for ``s <= 0.2``).
    With fewer nodes the trapezoidal step is too coarse for the Gaussian itself
    (``exp(-2 pi^2 / delta^2)``), and Gauss-Hermite is kept."""
    if n < TRAPEZOID_FROM:
        return gauss_hermite(n)
    z = np.linspace(-NORMAL_RANGE, NORMAL_RANGE, n)
    w = np.exp(-0.5 * z**2)
    return z, w / w.sum()


# -- profiles ------------------------------------------------------------------------------
# Stacked along a leading axis of 4: rho_0, rho_1, rho_2 (rho_k(u) = exp(k u - e^u)) and
# omega(u) = 1 - rho_0(u) = -expm1(-e^u).
RHO0, RHO1, RHO2, OMEGA = range(4)


def _profile(u, which: int, order: int = 0):
    """Profile ``which`` at ``u`` (``order`` 0), or its first or second derivative, in closed form:
    ``rho_k' = (k - e^u) rho_k``, ``rho_k'' = ((k - e^u)^2 - e^u) rho_k``, ``omega' = rho_1``,
    ``omega'' = (1 - e^u) rho_1``. One profile at a time, so that a sum over nodes fuses with
    its evaluation (no stacked intermediate the size of the nodes)."""
    e = jnp.exp(jnp.minimum(u, U_CLIP))
    r0 = jnp.exp(-e)
    if which == OMEGA:
        return (-jnp.expm1(-e), e * r0, (1 - e) * e * r0)[order]
    k = float(which)
    rho = e**which * r0 if which else r0
    return (rho, (k - e) * rho, ((k - e) ** 2 - e) * rho)[order]


def _profiles(u):
    """The four profiles at ``u``, shape ``(4, *u.shape)``."""
    return jnp.stack([_profile(u, p) for p in range(4)])


@functools.partial(jax.custom_jvp, nondiff_argnums=(4,))
def _smoothed(u, s2, z, w, which):
    """``E[f(u + sqrt(s2) Z)]`` for the profiles ``f`` listed in ``which`` (static; leading axis
    ``len(which)``), ``Z`` on the nodes ``z`` with weights ``w``: the profiles smoothed by a
    Gaussian of variance ``s2 >= 0`` (broadcast against ``u``)."""
    x = u[..., None] + jnp.sqrt(jnp.maximum(s2, 0.0))[..., None] * z
    return jnp.stack([jnp.sum(w * _profile(x, p), axis=-1) for p in which])


@_smoothed.defjvp
def _smoothed_jvp(which, primals, tangents):
    u, s2, z, w = primals
    du, ds2, _, _ = tangents
    x = u[..., None] + jnp.sqrt(jnp.maximum(s2, 0.0))[..., None] * z
    mean = lambda p, order: jnp.sum(w * _profile(x, p, order), axis=-1)
    value = jnp.stack([mean(p, 0) for p in which])
    # heat equation: d/d(s2) E[f(u + s Z)] = E[f''(u + s Z)] / 2 (Price), finite at s2 = 0
    tangent = jnp.stack([mean(p, 1) * du + 0.5 * mean(p, 2) * ds2 for p in which])
    return value, tangent


def _power(omega, n: int):
    """``(1 - omega)^n`` for ``omega`` in ``[0, 1]`` (a sum of non-negative terms, computed
    directly), as ``exp(n log1p(-omega))``: no digits lost for large ``n``, and finite
    derivatives where ``omega`` reaches one (the power is then zero, or one for ``n = 0``)."""
    if n == 0:
        return jnp.ones_like(omega)
    inside = omega < 1.0
    safe = jnp.where(inside, jnp.clip(omega, 0.0, 1.0), 0.0)
    return jnp.where(inside, jnp.exp(n * jnp.log1p(-safe)), 0.0)

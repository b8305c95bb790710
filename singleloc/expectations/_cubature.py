"""Rules for expectations over standard normals, and the refinement that states their error.

The exact route (:mod:`~singleloc.expectations._laplace`) integrates smooth functions of Gaussian token fields
on deterministic rules: one-dimensional normal rules (:func:`normal_rule`: trapezoidal from
:data:`TRAPEZOID_FROM` nodes, Gauss-Hermite below), the fully symmetric rule of degree 5 in several
dimensions (:func:`symmetric_degree5`), and their tensor products (:func:`joint_nodes`). Every
rule's error is stated against the same rule with :data:`REFINEMENT` times the nodes of every kind
(:func:`refined_sizes`): for a geometrically convergent rule the difference bounds the error of
the coarser one.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy.special import roots_hermitenorm

#: Standard normal rules of at least this many nodes are trapezoidal (:func:`normal_rule`).
TRAPEZOID_FROM = 32
#: Half-width, in standard deviations, of the trapezoidal normal rule (the mass beyond: 1.2e-15).
NORMAL_RANGE = 8.0
#: The finer rule of every stated error of the exact route has this many times the nodes of each kind.
REFINEMENT = 1.5


def refined_sizes(*sizes: int) -> tuple[int, ...]:
    """The node counts of the finer rule: ``ceil(REFINEMENT n)`` for every ``n`` in ``sizes``."""
    return tuple(int(math.ceil(REFINEMENT * n)) for n in sizes)


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
    """Standard normal nodes ``(N, len(sizes) + small)`` and weights of the tensor rule of
    :func:`normal_rule` of ``sizes`` (one per coordinate, in order) times :func:`symmetric_degree5`
    on the ``small`` last coordinates: a joint layer's rule
    (:func:`~singleloc.expectations._laplace_joint._joint_token`), coordinate ``j`` along the ``j``-th principal
    direction of its token's covariance."""
    nodes, weights = np.zeros((1, 0)), np.ones(1)
    for z, w in [*map(normal_rule, sizes), symmetric_degree5(small)]:
        nodes = np.concatenate([np.repeat(nodes, len(w), axis=0), np.tile(z.reshape(len(w), -1), (len(weights), 1))], axis=1)
        weights = np.repeat(weights, len(w)) * np.tile(w, len(weights))
    return nodes, weights

"""Rules for expectations over standard normals, and the refinement that states their error.

The exact route (:mod:`~singleloc.expectations._laplace`) integrates smooth functions of Gaussian token fields on
deterministic rules: one-dimensional normal rules (:func:`normal_rule`: trapezoidal from :data:`TRAPEZOID_FROM` nodes,
Gauss-Hermite below), the fully symmetric rule of degree 5 in several dimensions (:func:`symmetric_degree5`), and a
combination of their tensor products (:func:`joint_nodes`). Every rule's error is stated against the same rule with
:data:`REFINEMENT` times the nodes of every kind (:func:`refined_sizes`): for a geometrically convergent rule the
difference bounds the error of the coarser one.
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
#: A joint layer's token rule (:func:`joint_nodes`) leaves out its nodes of a smaller weight than this (a quarter of
#: a tensor of trapezoidal rules: its corners), whose integrands are bounded: at most 4e-14 of the weight in all.
NODE_FLOOR = 1e-16
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
    rule on ``[-8, 8]`` (weights ``phi(z_k)``, normalised), below it Gauss-Hermite (:mod:`~singleloc.expectations._laplace`:
    on the strip of analyticity the trapezoidal rule converges faster at every width; 64 nodes at ``s = 2``: 2e-7
    against Gauss-Hermite's 9e-5; with fewer nodes its step is too coarse for the Gaussian itself)."""
    if n < TRAPEZOID_FROM:
        return gauss_hermite(n)
    z = np.linspace(-NORMAL_RANGE, NORMAL_RANGE, n)
    w = np.exp(-0.5 * z**2)
    return z, w / w.sum()


def symmetric_degree5(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The fully symmetric rule of degree 5 for ``E[f(z)]``, ``z ~ N(0, I_n)``, on ``2 n^2 + 1`` points: the origin,
    ``+-sqrt(3) e_i`` and ``+-sqrt(3) e_i +- sqrt(3) e_j`` (``i < j``), weights ``(n^2 - 7n + 18) / 18``, ``(4 - n) /
    18`` and ``1 / 36`` (the moment equations ``E[1] = E[z_i^2] = E[z_i^2 z_j^2] = 1``, ``E[z_i^4] = 3``; every odd
    moment vanishes by symmetry). ``n = 1`` is the three-point Gauss-Hermite rule; ``n = 0`` one point."""
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


def _tensor(*rules) -> tuple[np.ndarray, np.ndarray]:
    """The tensor product of rules ``(nodes (n, d), weights (n,))``, coordinates in order."""
    nodes, weights = np.zeros((1, 0)), np.ones(1)
    for z, w in rules:
        nodes = np.concatenate([np.repeat(nodes, len(w), axis=0), np.tile(z.reshape(len(w), -1), (len(weights), 1))], axis=1)
        weights = np.repeat(weights, len(w)) * np.tile(w, len(weights))
    return nodes, weights


def _on_axes(rule: tuple[np.ndarray, np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """``sum_j (rule_j - delta_0)``: the one-dimensional ``rule`` on each of ``n`` coordinates, the others at 0,
    less the origin once per coordinate (weights summing to zero)."""
    z, w = rule
    nodes = [np.zeros((1, n))] + [np.outer(z, np.eye(n)[j]) for j in range(n)]
    return np.concatenate(nodes), np.concatenate([[-float(n)], np.tile(w, n)])


def _merged(nodes: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rule with coinciding nodes merged (weights added) and nodes of zero weight dropped."""
    keys, index = np.unique(np.round(nodes, 12), axis=0, return_inverse=True)
    merged = np.bincount(index.ravel(), weights, minlength=len(keys))
    keep = np.abs(merged) > 1e-15
    return keys[keep], merged[keep]


def small_rules(n: int, axis: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Two difference rules on ``n`` small coordinates, ``(D1, D2)``, whose sum with the origin ``delta_0`` is
    the rule ``S = symmetric_degree5(n) + sum_j (GH_axis - GH_3)_j``: exact for every polynomial of degree 5 and
    for powers of one coordinate up to ``2 axis - 1`` (the degree-5 rule's marginal on a coordinate is the
    three-point Gauss-Hermite rule, which the ``axis``-point one replaces). ``D1 = sum_j (GH_axis - delta_0)_j``
    holds each coordinate's own effect, ``D2 = S - delta_0 - D1`` the cross terms (moments ``z_i^2 z_j^2`` on
    the off-axis points); the weights of each sum to zero."""
    gh = gauss_hermite(axis)
    D1 = _on_axes(gh, n)
    cross = [symmetric_degree5(n), _on_axes(gh, n), _on_axes(gauss_hermite(3), n), D1]
    signs = (1.0, 1.0, -1.0, -1.0)
    nodes = np.concatenate([z for z, _ in cross] + [np.zeros((1, n))])
    weights = np.concatenate([s * w for s, (_, w) in zip(signs, cross)] + [[-1.0]])
    return _merged(*D1), _merged(nodes, weights)


def joint_nodes(levels: tuple, small: int, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Standard normal nodes ``(N, len(levels[0]) + small)`` and weights of a joint layer's token rule
    (:func:`~singleloc.expectations._laplace_joint._joint_token`), coordinate ``j`` along the ``j``-th principal
    direction of its token's covariance: a combination (sparse-grid) rule over the leading and the ``small``
    coordinates,

        L_0 x delta_0  +  L_1 x D1  +  L_2 x D2,

    ``L_i`` the tensor of :func:`normal_rule` of ``levels[i]`` (one size per leading coordinate, finest first)
    and ``D1, D2`` of :func:`small_rules`: the leading directions of the full effect on the finest rule,
    each small direction's own effect (of the order of its variance) on a coarser one, the cross terms (of
    the order of products of two variances) on the coarsest. The ``N`` nodes are ``|L_0| + |L_1| |D1| +
    |L_2| |D2|``, linear in the small directions' own nodes and quadratic in their number, never a product
    of the leading rule with all of them. Nodes of weight below :data:`NODE_FLOOR` are left out."""
    nodes, weights = map(np.concatenate, zip(*(_tensor(a, b) for a, b in _joint_parts(levels, small, axis) if len(b[1]))))
    keep = np.abs(weights) >= NODE_FLOOR
    return nodes[keep], weights[keep]


def _joint_parts(levels: tuple, small: int, axis: int) -> list:
    """The pairs of rules ``(L_i, delta_0 | D1 | D2)`` whose tensors make :func:`joint_nodes`."""
    lead = [_tensor(*map(normal_rule, sizes)) for sizes in levels]
    return [(lead[0], (np.zeros((1, small)), np.ones(1)))] + (list(zip(lead[1:], small_rules(small, axis))) if small else [])


def joint_node_count(levels: tuple, small: int, axis: int) -> int:
    """``len(joint_nodes(levels, small, axis)[1])`` from the weights alone: for each leading node the nodes of the
    small rule whose product of weights reaches :data:`NODE_FLOOR` (no tensor of the nodes, which at 32 heads took
    seconds to build for a memory check that refuses it)."""
    count = 0
    for (_, a), (_, b) in _joint_parts(levels, small, axis):
        b = np.sort(np.abs(b))
        count += int(np.sum(len(b) - np.searchsorted(b, NODE_FLOOR / np.abs(a))))
    return count

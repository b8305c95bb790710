"""The ``lr^2`` Gram term of a one-head layer, exactly, in the Laplace form (:mod:`~singleloc._laplace`).

The term. The loss ``(1 - a_0)^2 + sum_{l >= 1} a_l^2`` (token 0 relevant) of one normalised
exponential head ``A_l = exp(alpha s_l) / (kappa + sum_m exp(alpha s_m))`` (softmax, softmax1,
scalable softmax, and bsoftmax, which is softmax at ``H = 1``) has, as
``dA_m / ds_l = alpha A_m (delta_ml - A_l)`` for any offset ``kappa``, the score gradient

    c_l = alpha A_l (e_l - e_bar),    e_l = 2 (A_l - delta_l0),    e_bar = sum_m e_m A_m = 2 (S_2 - A_0),

with ``S_k = sum_m A_m^k``, so that the Gram term of ``dQ`` is

    G = E[sum_l c_l^2] = 4 alpha^2 E[sum_l A_l^2 (B_l - S_2)^2],    B_0 = 2 A_0 - 1,  B_l = A_l + A_0 (l >= 1),
      = 4 alpha^2 E[sum_l A_l^2 B_l^2 - 2 S_2 sum_l A_l^2 B_l + S_2^3]:

a polynomial (:func:`gram_polynomial`) in the relevant token's weight ``A_0`` and the noise tokens'
power sums ``p_k = sum_{l >= 1} A_l^k``, of degree six.

Its moments. A product of power sums is a sum, over the set partitions of its factors, of sums over
*distinct* noise tokens with the factors of a block merged into one power (:func:`distinct_moments`).
The Laplace form ``1 / Z^K = int_0^inf t^(K-1) e^(-t Z) dt / (K-1)!`` then turns each into one
integral over ``y = log t`` of one-token expectations, as for the risk:

    E[A_0^a sum_{distinct l_1..l_j >= 1} prod_i A_{l_i}^(k_i)]
        = (L-1)_j / (K-1)! int dy e^(-kappa e^y) r^0_a(y) prod_i r^1_(k_i)(y) r^1_0(y)^(L-1-j),

with ``K = a + sum_i k_i``, ``(L-1)_j = (L-1)(L-2)...(L-j)`` and ``r^0_k, r^1_k`` the relevant and a
noise token's ``E[rho_k(y + x)]`` (``rho_k(u) = exp(k u - e^u)``, up to ``k = 6``;
``r^1_0 = 1 - E[omega]`` through the power of :mod:`~singleloc._laplace`). The ``y`` rule and the
one-token expectations are the risk's (:meth:`~singleloc._laplace.LaplaceRule._single`), the lower
end of the range moved for the sixth moments, so the term is exact to the same precision and costs
a few one-head risks, whatever ``L``. Its error is stated against the refined rule
(:meth:`~singleloc._laplace.LaplaceRule.refined`), as the risk's.

Two heads or more. Then ``e_l`` holds the head average, and the Gram term's entries are moments
of up to four distinct heads: four Laplace variables, with no cheap exact form. They stay on
the rank-aware Sobol rule (:class:`~singleloc.OrderParameterODE`).
"""

from __future__ import annotations

import math
from fractions import Fraction

import jax.numpy as jnp

from ._laplace_profiles import OMEGA, _power, rho

#: The highest power of one token's weight in the Gram term (the degree of :func:`gram_polynomial`).
DEGREE = 6

# A polynomial: {(a, ks): coefficient} for the monomial A_0^a prod_{k in ks} p_k (ks sorted).
Polynomial = dict


def _times(p: Polynomial, q: Polynomial) -> Polynomial:
    out: Polynomial = {}
    for (a1, k1), c1 in p.items():
        for (a2, k2), c2 in q.items():
            key = (a1 + a2, tuple(sorted(k1 + k2)))
            out[key] = out.get(key, 0) + c1 * c2
    return {key: c for key, c in out.items() if c}


def _plus(*ps: Polynomial, scale=(1,)) -> Polynomial:
    out: Polynomial = {}
    for p, s in zip(ps, scale * len(ps) if len(scale) == 1 else scale):
        for key, c in p.items():
            out[key] = out.get(key, 0) + s * c
    return {key: c for key, c in out.items() if c}


def gram_polynomial() -> Polynomial:
    """``sum_l A_l^2 (B_l - S_2)^2`` (module docstring) as a polynomial in ``A_0`` and the noise
    tokens' power sums: ``{(a, ks): coefficient}`` for ``A_0^a prod_{k in ks} p_k``."""
    one, x = {(0, ()): 1}, {(1, ()): 1}
    p = lambda k: {(0, (k,)): 1}  # noqa: E731
    x2 = _times(x, x)
    two_x_less_one = _plus(x, one, scale=(2, -1))
    s2 = _plus(x2, p(2))
    # sum_l A_l^2 B_l^2 = A_0^2 (2 A_0 - 1)^2 + p_4 + 2 A_0 p_3 + A_0^2 p_2
    squares = _plus(_times(x2, _times(two_x_less_one, two_x_less_one)), p(4), _times(x, p(3)), _times(x2, p(2)),
                    scale=(1, 1, 2, 1))
    # sum_l A_l^2 B_l = A_0^2 (2 A_0 - 1) + p_3 + A_0 p_2
    linear = _plus(_times(x2, two_x_less_one), p(3), _times(x, p(2)))
    return _plus(squares, _times(s2, linear), _times(s2, _times(s2, s2)), scale=(1, -2, 1))


def _set_partitions(items: list) -> list[list[list]]:
    if not items:
        return [[]]
    first, out = items[0], []
    for part in _set_partitions(items[1:]):
        out.append([[first], *part])
        out += [[*part[:i], [first, *block], *part[i + 1:]] for i, block in enumerate(part)]
    return out


def distinct_moments(poly: Polynomial, L: int) -> dict[tuple[int, tuple[int, ...]], float]:
    """The polynomial's expectation as moments over distinct noise tokens: ``{(a, ks): weight}``,
    each ``E[A_0^a sum_{distinct l_1..l_j} prod_i A_{l_i}^(k_i)]`` (``j = len(ks)``) counted with
    the falling factorial ``(L-1)_j`` folded into its weight (terms with ``j > L - 1`` vanish)."""
    out: dict = {}
    for (a, ks), c in poly.items():
        for part in _set_partitions(list(ks)):
            merged = tuple(sorted(sum(block) for block in part))
            count = math.prod(range(L - 1, L - 1 - len(merged), -1))
            if count:
                out[(a, merged)] = out.get((a, merged), 0) + Fraction(c) * count
    return {key: float(c) for key, c in out.items() if c}


def one_head_gram(rule, M: jnp.ndarray, Q: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """``E[sum_l c_l c_l^T]`` (1, 1) of a one-head layer on the exact rule ``rule``
    (:class:`~singleloc._laplace.LaplaceRule`; module docstring)."""
    L, kappa, alpha = rule.L, rule.form.offset, rule.form.scale
    m1, C1, m0, C0 = rule._token_laws(*rule._state(M, Q, b))
    v1, v0 = jnp.diag(C1), jnp.diag(C0)
    Y, step = rule._ranges(m1, v1, m0, v0, powers=range(1, DEGREE + 1))
    y, pre = Y[0], step[0] * jnp.exp(-kappa * jnp.exp(Y[0]))
    profiles = tuple(rho(k) for k in range(DEGREE + 1))
    noise = rule._single(y, m1[0], v1[0], (*profiles, OMEGA))
    rel = rule._atoms_mean(lambda k: rule._single(y, m0[0, k], v0[0], profiles))
    total = 0.0
    for (a, ks), weight in distinct_moments(gram_polynomial(), L).items():
        K = a + sum(ks)
        integrand = pre * rel[a] * _power(noise[-1], L - 1 - len(ks))
        for k in ks:
            integrand = integrand * noise[k]
        total = total + weight / math.factorial(K - 1) * jnp.sum(integrand)
    return (4.0 * alpha**2 * total).reshape(1, 1)

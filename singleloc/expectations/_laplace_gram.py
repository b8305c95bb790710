"""The ``lr^2`` Gram term of one or two heads, exactly, in the Laplace form (:mod:`~singleloc.expectations._laplace`).

The term. The loss ``(1 - a_0)^2 + sum_{l >= 1} a_l^2`` (token 0 relevant) of the head average ``a_l = sum_h v_h A_hl``
(``v_h = 1 / H``) of normalised exponential heads ``A_hl = exp(alpha s_hl) / (kappa + sum_m exp(alpha s_hm))`` (softmax,
softmax1, scalable softmax; bsoftmax is softmax at ``H = 1``) has, as ``dA_hm / ds_hl = alpha A_hm (delta_ml - A_hl)``
for any offset ``kappa``, the score gradient

    c_hl = alpha v_h A_hl (e_l - e_bar_h),    e_l = 2 (a_l - delta_l0),    e_bar_h = sum_m e_m A_hm.

One head: ``e_bar = 2 (S_2 - A_0)`` with ``S_k = sum_m A_m^k``, and

    G = E[sum_l c_l^2] = 4 alpha^2 E[sum_l A_l^2 B_l^2 - 2 S_2 sum_l A_l^2 B_l + S_2^3],
    B_0 = 2 A_0 - 1,  B_l = A_l + A_0 (l >= 1).

In general every entry ``sum_l c_hl c_gl`` is a polynomial of degree six in the relevant token's weights ``A_h0`` and
the noise tokens' power sums ``p_k = sum_{l >= 1} prod_h A_hl^(k_h)`` (:func:`gram_polynomials`, built by expanding the
definitions above symbolically).

Its moments. A product of power sums is a sum, over the set partitions of its factors, of sums over *distinct* noise
tokens with the factors of a block merged into one power (:func:`distinct_moments`). The Laplace form ``1 / Z^K =
int_0^inf t^(K-1) e^(-t Z) dt / (K-1)!`` then turns each into one integral per head over ``y_h = log t_h`` of one-token
expectations, as for the risk; for one head

    E[A_0^a sum_{distinct l_1..l_j >= 1} prod_i A_{l_i}^(k_i)]
        = (L-1)_j / (K-1)! int dy e^(-kappa e^y) r^0_a(y) prod_i r^1_(k_i)(y) r^1_0(y)^(L-1-j),

with ``K = a + sum_i k_i``, ``(L-1)_j = (L-1)(L-2)...(L-j)`` and ``r^0_k, r^1_k`` the relevant and a noise token's
``E[rho_k(y + x)]`` (``rho_k(u) = exp(k u - e^u)``, up to ``k = 6``; ``r^1_0 = 1 - E[omega]`` through the power of
:mod:`~singleloc.expectations._laplace`), and for two heads the same with two variables and the pair rule's
two-dimensional token expectations. Moments of one head (in a two-head entry, those in which the other head's powers all
vanish) are one-dimensional. The ``y`` rule and the token expectations are the risk's (the lower end of the range moved
for the sixth moments), so the term is exact to the same precision, whatever ``L``. Its error is stated against the
refined rule (:meth:`~singleloc.expectations._laplace.LaplaceRule.refined`), as the risk's. Cost: about a millisecond
for one head (20 moments), tens of milliseconds for two (177 moments over 46 pair products of profiles), whatever ``L``
(:data:`~singleloc.expectations._routes.GRAM_EXACT_FROM`). Three heads or more hold moments of up to four distinct
heads, with no cheap exact form.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np

from ._laplace_profiles import OMEGA, RHO0, _power, rho

#: Two heads: the pair moments' outer rule (:data:`~singleloc.expectations._laplace_heads.GRAM_OUTER` times ``theory.nodes = 64``)
#: resolves the Gram term's moments to 1e-4 for token fields of standard deviation up to about this, and to 3e-3
#: up to twice it (two aligned heads of growing key length, against 96 and 160 nodes and Sobol rules: the table of
#: docs/model.md section 4.6). Its stated error equals its actual error there; above
#: :data:`~singleloc.expectations._laplace_expectation.GRAM_ERROR_WARN` it warns.
WIDE_GRAM_SIGMA = 6.0

#: The highest power of one token's weight in the Gram term (the degree of :func:`gram_polynomials`).
DEGREE = 6

# A polynomial in the relevant token's weights A_h0 and the noise tokens' power sums
# p_k = sum_{l >= 1} prod_h A_hl^(k_h): {(a, ks): coefficient} for the monomial prod_h A_h0^(a_h) prod_{k in ks} p_k
# (a and every k a tuple over the heads, ks sorted). A *token* polynomial, the same in one token's
# own weights A_hl: {kappa: polynomial} for prod_h A_hl^(kappa_h) times the polynomial.
Polynomial = dict


def _times(p: Polynomial, q: Polynomial) -> Polynomial:
    out: Polynomial = {}
    for (a1, k1), c1 in p.items():
        for (a2, k2), c2 in q.items():
            key = (tuple(x + y for x, y in zip(a1, a2)), tuple(sorted(k1 + k2)))
            out[key] = out.get(key, 0) + c1 * c2
    return {key: c for key, c in out.items() if c}


def _plus(*ps: Polynomial, scale=None) -> Polynomial:
    out: Polynomial = {}
    for p, s in zip(ps, scale or [1] * len(ps)):
        for key, c in p.items():
            out[key] = out.get(key, 0) + s * c
    return {key: c for key, c in out.items() if c}


def _token_times(f: dict, g: dict) -> dict:
    out: dict = {}
    for k1, p in f.items():
        for k2, q in g.items():
            k = tuple(x + y for x, y in zip(k1, k2))
            out[k] = _plus(out.get(k, {}), _times(p, q))
    return {k: p for k, p in out.items() if p}


def _token_plus(*fs: dict, scale=None) -> dict:
    out: dict = {}
    for f, s in zip(fs, scale or [1] * len(fs)):
        for k, p in f.items():
            out[k] = _plus(out.get(k, {}), p, scale=[1, s])
    return {k: p for k, p in out.items() if p}


def _over_tokens(relevant: dict, noise: dict, H: int) -> Polynomial:
    """``sum_l f(l)`` for a token polynomial that is ``relevant`` at token 0 and ``noise`` at the others."""
    zero = (0,) * H
    out = _plus(*[_times(p, {(k, ()): 1}) for k, p in relevant.items()])
    for k, p in noise.items():
        if k == zero:
            raise ValueError("a sum over the noise tokens of a constant (L - 1) is not a moment")
        out = _plus(out, _times(p, {(zero, (k,)): 1}))
    return out


def gram_polynomials(H: int) -> dict[tuple[int, int], Polynomial]:
    """``sum_l c_hl c_gl / alpha^2`` of the head average of ``H`` heads as polynomials (one per entry
    ``h <= g``): ``c_hl = alpha v_h A_hl (e_l - e_bar_h)``, ``e_l = 2 (sum_k v_k A_kl - delta_l0)``,
    ``e_bar_h = sum_m e_m A_hm``, ``v_h = 1 / H`` (module docstring)."""
    zero, v = (0,) * H, Fraction(1, H)
    unit = lambda h: tuple(int(i == h) for i in range(H))  # noqa: E731
    weight = lambda h: {unit(h): {(zero, ()): 1}}  # noqa: E731  A_hl
    constant = {zero: {(zero, ()): 1}}

    def e(relevant: bool) -> dict:
        mean = _token_plus(*[weight(k) for k in range(H)], scale=[2 * v] * H)
        return _token_plus(mean, constant, scale=[1, -2]) if relevant else mean

    e_bar = [_over_tokens(_token_times(e(True), weight(h)), _token_times(e(False), weight(h)), H) for h in range(H)]

    def term(h, g, relevant):
        gap = lambda k: _token_plus(e(relevant), {zero: e_bar[k]}, scale=[1, -1])  # noqa: E731
        return _token_times(_token_times(weight(h), weight(g)), _token_times(gap(h), gap(g)))

    return {(h, g): _plus(_over_tokens(term(h, g, True), term(h, g, False), H), scale=[v * v])
            for h in range(H) for g in range(h, H)}


def _set_partitions(items: list) -> list[list[list]]:
    if not items:
        return [[]]
    first, out = items[0], []
    for part in _set_partitions(items[1:]):
        out.append([[first], *part])
        out += [[*part[:i], [first, *block], *part[i + 1:]] for i, block in enumerate(part)]
    return out


def distinct_moments(poly: Polynomial) -> dict[tuple[int, tuple[int, ...]], float]:
    """The polynomial as sums over distinct noise tokens: ``{(a, ks): c}`` with ``poly = sum c A_0^a sum_{distinct
    l_1..l_j >= 1} prod_i A_{l_i}^(k_i)`` (``j = len(ks)``; the blocks of a set partition of a product of power sums
    merged). Whatever ``L``: a sum over ``j`` distinct noise tokens has ``(L-1)_j`` equal terms in expectation (none for
    ``j > L - 1``), a factor :func:`laplace_gram` applies."""
    out: dict = {}
    for (a, ks), c in poly.items():
        for part in _set_partitions(list(ks)):
            merged = tuple(sorted(tuple(map(sum, zip(*block))) for block in part))
            out[(a, merged)] = out.get((a, merged), 0) + Fraction(c)
    return {key: float(c) for key, c in out.items() if c}


@functools.cache
def _moment_table(H: int):
    """Every distinct-token moment the Gram entries ``h <= g`` need, as static index arrays: per moment
    its heads' total powers ``K`` (M, H), the relevant token's powers ``a`` (M, H), the noise blocks'
    powers (M, MAX_BLOCKS, H; padded with ``-1``: a factor one), the number of blocks ``j`` (M,), the
    coefficients (M, E) of the moments in the ``E`` entries (:func:`distinct_moments`) and the factors
    ``prod_h 1 / (K_h - 1)!`` (M,) of their Laplace integrals; none depends on ``L``."""
    polys = gram_polynomials(H)
    entries = sorted(polys)
    per_entry = [distinct_moments(polys[e]) for e in entries]
    keys = sorted({key for mom in per_entry for key in mom})
    blocks = max((len(ks) for _, ks in keys), default=0)
    K = np.array([[a[i] + sum(k[i] for k in ks) for i in range(H)] for a, ks in keys])
    scale = np.array([math.prod(1.0 / math.factorial(x - 1) for x in row if x) for row in K])
    coefficients = np.array([[mom.get(key, 0.0) for mom in per_entry] for key in keys])
    noise = np.full((len(keys), blocks, H), -1)
    for m, (_, ks) in enumerate(keys):
        if ks:
            noise[m, :len(ks)] = ks
    return (entries, K, np.array([a for a, _ in keys]), noise, np.array([len(ks) for _, ks in keys]), coefficients, scale,
            blocks)


def _powers_of(omega, L, blocks: int):
    """``(1 - omega)^(L - 1 - j)`` for ``j = 0 ... blocks`` (stacked; zero where ``j > L - 1``; ``L`` an array)."""
    j = jnp.arange(blocks + 1, dtype=omega.dtype).reshape(-1, *(1,) * omega.ndim)
    return jnp.where(j <= L - 1, _power(omega, jnp.maximum(L - 1 - j, 0)), 0.0)


def laplace_gram(rule, M: jnp.ndarray, Q: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """``E[sum_l c_l c_l^T]`` (H, H) of a per-head layer of ``H <= 2`` heads (the head average) on
    the exact rule ``rule`` (:class:`~singleloc.expectations._laplace.LaplaceRule`, through its public one-token and
    pair expectations; module docstring): each moment of one head on the risk's one-head rule, of two
    heads on its pair rule (on the per-head layer's Gram outer rule), all moments of a kind
    gathered from stacked one-token expectations and summed at once."""
    H, L, kappa, alpha = Q.shape[0], rule.L, rule.offset, rule.alpha
    if H > 2:
        raise ValueError(f"the exact Gram term takes one or two heads, got H = {H}")
    m1, C1, m0, C0 = rule.token_laws(*rule.state(M, Q, b))
    v1, v0 = jnp.diag(C1), jnp.diag(C0)
    Y, step = rule.head_ranges(m1, v1, m0, v0, powers=range(1, DEGREE + 1))
    pre = step[:, None] * jnp.exp(-kappa * jnp.exp(Y))
    entries, K, a, noise, j, coefficients, scale, blocks = _moment_table(H)
    falling = jnp.cumprod(jnp.concatenate([jnp.ones(1, Y.dtype), L - 1 - jnp.arange(blocks, dtype=Y.dtype)]))  # (L-1)_j
    weights = coefficients * falling[j][:, None] * scale[:, None]  # every factor of a moment but its integral
    profiles = tuple(rho(k) for k in range(DEGREE + 1))
    integrals = jnp.zeros(len(K), Y.dtype)
    # moments of one head alone, on the one-head rule: every head's one-token expectations at once (vmapped), the
    # moments of head h gathered from head h's (row ``heads`` of ``rows``)
    alone = ((K > 0).sum(axis=1) == 1)[:, None] & (K > 0)  # (M, H)
    rows, heads = np.nonzero(alone)

    def one_head(y, m1, v1, m0, v0):  # the noise token and every atom's relevant token in one vmapped evaluation
        means, variances = jnp.concatenate([m1[None], m0]), jnp.concatenate([v1[None], jnp.broadcast_to(v0, m0.shape)])
        tokens = jax.vmap(lambda m, v: rule.single(y, m, v, (*profiles, OMEGA)))(means, variances)  # (1 + K, 8, n_t)
        return tokens[0], jnp.tensordot(rule.probs, tokens[1:, :-1], axes=1)

    nz, rel = jax.vmap(one_head)(Y, m1, v1, m0, v0)  # (H, 8, n_t), (H, 7, n_t)
    factors = jnp.concatenate([nz[:, :-1], jnp.ones_like(nz[:, :1])], axis=1)[heads[:, None], noise[rows, :, heads]]  # -1: one
    powers = _powers_of(nz[:, -1], L, blocks)  # (blocks + 1, H, n_t)
    value = pre[heads] * rel[heads, a[rows, heads]] * powers[j[rows], heads] * jnp.prod(factors, axis=1)
    integrals = integrals.at[rows].set(jnp.sum(value, axis=-1))
    rows = np.flatnonzero((K > 0).all(axis=1)) if H == 2 else np.zeros(0, int)
    if len(rows):  # moments of both heads: the pair rule (head 0 the first field)
        pair = lambda k: (rho(k[0]), rho(k[1]))  # noqa: E731
        noise_combos = sorted({pair(k) for k in noise[rows].reshape(-1, 2) if k[0] >= 0} | {(RHO0, OMEGA)})
        rel_combos = sorted({pair(k) for k in a[rows]})
        outer = (rule.layer.z_gram, rule.layer.w_gram)  # finer than the risk's: the sixth powers are narrow
        pairs = rule.pair(noise_combos, Y[0], Y[1], m1[0], m1[1], C1[0, 0], C1[0, 1], C1[1, 1], outer)
        rel = rule.atoms_mean(lambda k: rule.pair(rel_combos, Y[0], Y[1], m0[0, k], m0[1, k], C0[0, 0], C0[0, 1], C0[1, 1],
                                                    outer))
        omega = nz[0, -1][:, None] + pairs[noise_combos.index((RHO0, OMEGA))]  # 1 - E[rho_0 rho_0'], non-negative terms
        # a moment is sum_ij (pre pre' rel[r])_ij (prod of its noise factors and power)_ij: the noise side is
        # formed once per distinct group (factors, j), and every (r, group) sum is one matrix product
        index = np.array([[noise_combos.index(pair(k)) if k[0] >= 0 else len(noise_combos) for k in row]
                          for row in noise[rows]])
        groups, group = np.unique(np.concatenate([index, j[rows, None]], axis=1), axis=0, return_inverse=True)
        factors = jnp.concatenate([pairs, jnp.ones_like(pairs[:1])])[groups[:, :-1]]  # (G, blocks, n_t, n_t)
        noise_side = jnp.prod(factors, axis=1) * _powers_of(omega, L, blocks)[groups[:, -1]]
        rel_side = pre[0][:, None] * pre[1][None, :] * rel
        sums = rel_side.reshape(len(rel_combos), -1) @ noise_side.reshape(len(groups), -1).T  # (R, G)
        r = np.array([rel_combos.index(pair(k)) for k in a[rows]])
        integrals = integrals.at[rows].set(sums[r, group.ravel()])
    values = integrals @ weights  # one per entry h <= g
    G = [[None] * H for _ in range(H)]
    for (h, g), value in zip(entries, values):
        G[h][g] = G[g][h] = value
    return alpha**2 * jnp.stack([jnp.stack(row) for row in G])

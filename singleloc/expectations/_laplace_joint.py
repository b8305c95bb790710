"""A joint layer's exact risk (bsoftmax): one normaliser for all heads, in conditional product form.

The layer. ``a_l = u_l / (kappa + sum_l' u_l')`` with ``u_l = sum_h exp(x_hl)``: the Laplace form of
:mod:`~singleloc.expectations._laplace` has one variable ``y`` and the token expectations ``E[rho_k(y + lse(x))]`` over
the ``H`` fields of one token (``lse = log sum_h exp``), so that

    E[a_0]   = int dy e^{-kappa e^y} E0[rho_1(y + lse)] P(y)^(L-1),
    E[a_0^2] = int dy e^{-kappa e^y} E0[rho_2(y + lse)] P(y)^(L-1),
    E[a_1^2] = int dy e^{-kappa e^y} E1[rho_2(y + lse)] E0[rho_0(y + lse)] P(y)^(L-2),

``P = 1 - E1[omega(y + lse)]``, and the risk ``1 - 2 E[a_0] + E[a_0^2] + (L - 1) E[a_1^2]`` costs ``O(H n_t N)`` for
``N`` token nodes, whatever ``L``.

The token expectation (:func:`_joint_token`). Write the token's covariance ``C = delta I + S^T S`` with ``delta`` its
smallest eigenvalue: given the standard normals ``z`` on the ``H - 1`` principal directions of ``C - delta I``, the
fields are independent, ``x_h = mu_h(z) + sqrt(delta) Z_h``, and ``exp(-t u) = prod_h rho_0(y + x_h)`` (``u = sum_h
exp(x_h)``) makes every profile of ``lse(x)`` a polynomial in one head's profiles smoothed by ``N(0, delta)``: tabulated
once, interpolated. The smallest variance is integrated exactly; the others by a combination rule
(:func:`~singleloc.expectations._cubature.joint_nodes`): the leading directions (where trained keys are wide,
:data:`JOINT_LEADING`) on a tensor of normal rules, each of the ``n`` other directions' own effect (of the order of its
variance, the anisotropy of ``R_orth``: small) on :data:`JOINT_SMALL` Gauss-Hermite nodes times that tensor coarsened
(:data:`JOINT_COARSENING`), the cross terms of two of them (of the order of a product of two variances) on the degree-5
rule times a coarser tensor still (:func:`joint_layout`). Heads that are copies leave ``delta = 0`` and fewer active
directions; the derivative in ``(mu, C)`` is by Price's theorem on the same nodes, never through the eigendecomposition.

Cost. ``O((1 + K) n_t N H)`` for ``K`` atoms, ``n_t`` Laplace nodes and ``N = |T_0| + |T_1| (4n + 1) + |T_2| 2n^2``
token nodes (``T_i`` the leading tensors; ``H - 1 - n`` leading directions): linear in ``H`` where the leading tensor
dominates, quadratic in ``n`` beyond (:func:`joint_rule_size`: 9580 nodes at ``H = 4`` and 60032 at ``H = 8`` under two
spikes; docs/benchmarks/11).
"""

from __future__ import annotations

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..model._priors import Prior
from ..runtime._numerics import principal_factor
from ._cubature import joint_node_count, joint_nodes, refined_sizes
from ._laplace_profiles import OMEGA, RHO0, RHO1, RHO2, _power, derivatives, interpolated, jvp_profiles, smoothing_table

#: The sizes of the normal rules (:func:`~singleloc.expectations._cubature.normal_rule`, trapezoidal from 32 nodes)
#: on the leading principal directions of the token's covariance less its smallest variance, largest
#: first; on ``min(max(F, 2), 3, H - 1)`` of them (:func:`joint_layout`: trained keys are wide along the
#: ``F`` directions of ``M``). The others, the anisotropy of ``R_orth`` (small: its isotropic part is the
#: smoothed ``delta``), on the combination rule of :func:`~singleloc.expectations._cubature.joint_nodes`.
#: At a trained H = 3, F = 2 state (key variances 5.8 and 7.0, 0.15 on the third direction) (64, 48) leaves a
#: risk error of 5e-16 and a relative gradient error of 2e-13 against 1.5 x the nodes (docs/model.md 4.6).
JOINT_LEADING = (64, 48, 16)
#: The leading rules of the combination rule (:func:`~singleloc.expectations._cubature.joint_nodes`): the full
#: effect on :data:`JOINT_LEADING`, each small direction's own effect on its sizes divided by the second
#: entry, the cross terms of two small directions by the third (every size rounded up): the O(lr) drift of four
#: trained-like heads near two spikes within 1.6e-7 of 96 x 72 x 8 normal nodes on 9580 nodes (the other choices
#: measured: docs/benchmarks/11).
JOINT_COARSENING = (1, 1.25, 2)
#: Gauss-Hermite nodes of each small direction's own rule (the degree-5 rule's three raised to this; on a
#: direction of variance 0.07 beyond the smallest, 3 nodes left 4.8e-5 of the O(lr) drift, 4, 5 and 6
#: nodes 1.4e-6, 7e-8 and 3e-8).
JOINT_SMALL = 5
#: A joint layer's per-head ``rho_0`` factors are floored here before they divide a product of them
#: (:func:`_conditional_terms`): every term of the token's expectations is a product of bounded
#: factors, so the floor changes none by more than about this size.
RHO0_FLOOR = 1e-30
#: The token nodes a joint layer's expectations take at a time (:func:`_over_nodes`), so that a chunk stays in the
#: processor's cache (all at once, ``H = 8`` cost 28 times ``H = 4`` for 9 times the work; in chunks 16).
NODE_CHUNK = 1024
#: The heads' profiles a joint layer's token needs (:func:`_token_from_heads`).
JOINT_PROFILES = (RHO0, RHO1, RHO2, OMEGA)
#: The tabulated profiles of the derivatives (:func:`_joint_token_jvp`): ``rho_0 ... rho_4`` and ``omega``, whose
#: derivatives are sums of them (``rho_k' = k rho_k - rho_{k+1}``), so that one table of values serves all three
#: orders.
JVP_PROFILES = jvp_profiles(JOINT_PROFILES)


# -- sizing ------------------------------------------------------------------------------------

def joint_layout(H: int, F: int) -> tuple:
    """``(levels, small, axis)`` of the rule of a joint layer of ``H`` heads under a prior on ``F`` directions
    (:func:`~singleloc.expectations._cubature.joint_nodes`): normal rules on ``r = min(max(F, 2), len(JOINT_LEADING),
    H - 1)`` leading principal directions, of :data:`JOINT_LEADING` and its coarsenings (:data:`JOINT_COARSENING`),
    and the ``small = H - 1 - r`` others on :data:`JOINT_SMALL` nodes each and the degree-5 rule."""
    r = min(max(F, 2), len(JOINT_LEADING), H - 1)
    return _layout(tuple(JOINT_LEADING[:r]), H - 1 - r, JOINT_SMALL)


def _layout(sizes: tuple, small: int, axis: int) -> tuple:
    return tuple(tuple(math.ceil(n / d) for n in sizes) for d in JOINT_COARSENING), small, axis


def refined_layout(layout: tuple) -> tuple:
    """The layout of the refined rule (the error statement's reference): every normal rule on
    :func:`~singleloc.expectations._cubature.refined_sizes`, and as many Gauss-Hermite nodes on each small direction."""
    levels, small, axis = layout
    return tuple(refined_sizes(*sizes) for sizes in levels), small, refined_sizes(axis)[0]


@functools.cache
def _nodes(layout: tuple) -> tuple[np.ndarray, np.ndarray]:
    return joint_nodes(*layout)


def joint_rule_size(H: int, prior: Prior, *, refined: bool = False) -> int:
    """The work of a joint layer's exact rule per Laplace node: its token nodes (:func:`joint_layout`,
    :func:`~singleloc.expectations._cubature.joint_nodes`) times the heads times the prior's atoms (every atom's
    token expectation runs over every node and head); ``refined``: of the refined rule
    (:func:`refined_layout`). Time and memory grow with it (:data:`~singleloc.expectations._routes.JOINT_EXACT_MAX`,
    :data:`~singleloc.expectations._routes.JOINT_UNIT_BYTES`)."""
    layout = joint_layout(H, prior.F)
    return joint_node_count(*(refined_layout(layout) if refined else layout)) * H * len(prior.atoms)


# -- the layer ---------------------------------------------------------------------------------

class JointLayer(eqx.Module):
    """The joint layer's part of a :class:`~singleloc.expectations._laplace.LaplaceRule`: the token rule
    ``z`` (N, H - 1), ``w`` (N,) of :func:`~singleloc.expectations._cubature.joint_nodes` on ``layout``
    (:func:`joint_layout`), and the risk and attention masses in conditional product form."""

    z: jax.Array
    w: jax.Array
    layout: tuple = eqx.field(static=True)

    @classmethod
    def make(cls, H: int, F: int, sizes: tuple | None, dtype) -> JointLayer:
        """The rule of ``H`` heads under a prior on ``F`` directions; ``sizes``: the normal rules on its
        leading principal directions (at most ``H - 1``; the others small, :func:`joint_layout`), or a whole
        layout (:meth:`refined_sizes`); default :func:`joint_layout`."""
        if sizes is None or not isinstance(sizes[0], tuple):
            layout = joint_layout(H, F) if sizes is None else _layout(tuple(sizes), H - 1 - len(sizes), JOINT_SMALL)
        else:
            layout = tuple(sizes)
        if layout[1] < 0:
            raise ValueError(f"joint_sizes = {sizes}: at most H - 1 = {H - 1} sizes (the principal directions "
                             "but the smallest)")
        z, w = _nodes(layout)
        return cls(jnp.asarray(z, dtype), jnp.asarray(w, dtype), layout)

    def refined_sizes(self) -> tuple:
        """The ``sizes`` of :meth:`make` for the refined rule: its layout (:func:`refined_layout`)."""
        return refined_layout(self.layout)

    def exact_gram(self, H: int) -> bool:
        """Whether the exact Gram term holds: one head (the layer is then softmax)."""
        return H == 1

    def risk(self, rule, M, Q, b, v=None):
        """The risk ``1 - 2 E[a_0] + E[a_0^2] + (L - 1) E[a_1^2]`` (module docstring)."""
        if v is not None:
            raise ValueError("the exact route of a joint layer (bsoftmax) takes uniform head weights only; "
                             "model.head_weights = 'trained' goes on theory.route = 'rule'")
        return self._terms(rule, M, Q, b)[0]

    def attention_mass(self, rule, M, Q, b):
        """The heads' attention masses ``H E[sum_l exp(x_hl) / Z]`` (H,)."""
        return self._terms(rule, M, Q, b)[1]

    def _terms(self, rule, M, Q, b):
        """The risk and the heads' attention masses, the latter from the token expectations ``E[rho_1(y + lse(x))
        p_h(x)]`` (``p = softmax(x)``: the share of head ``h`` in ``u = sum_h exp(x_h)``) on the same nodes."""
        L, kappa, H = rule.L, rule.offset, Q.shape[0]
        m1, C1, m0, C0 = rule.token_laws(M, Q, b)
        y, step = _token_range(rule, m1, C1, m0, C0)
        pre = step * jnp.exp(-kappa * jnp.exp(y))
        z, w, tab = self.z, self.w, (rule.z_inner, rule.w_inner, rule.u_grid)
        noise = _joint_token(y, m1, C1, z, w, tab)
        rel = rule.atoms_mean(lambda k: _joint_token(y, m0[:, k], C0, z, w, tab))
        shares1 = _joint_shares(y, m1, C1, z, w, tab)  # (n_t, H)
        shares0 = rule.atoms_mean(lambda k: _joint_shares(y, m0[:, k], C0, z, w, tab))
        p1, p2 = _power(noise[OMEGA], L - 1), _power(noise[OMEGA], L - 2)
        Ea0 = jnp.sum(pre * rel[RHO1] * p1)
        Ea00 = jnp.sum(pre * rel[RHO2] * p1)
        Ea11 = jnp.sum(pre * noise[RHO2] * rel[RHO0] * p2)
        mass = H * ((pre * p1) @ shares0 + (L - 1) * (pre * rel[RHO0] * p2) @ shares1)
        return 1.0 - 2.0 * Ea0 + Ea00 + (L - 1) * Ea11, mass


def _token_range(rule, m1, C1, m0, C0):
    """The ``y`` nodes (n_t,) and step of a joint layer (:meth:`~singleloc.expectations._laplace.LaplaceRule.y_range`)
    for ``X = lse(x) >= max_h x_h``: ``log E[u]`` and ``log E[u^2] / 2`` of ``u = sum_h exp(x_h)`` in closed form."""
    def log_moments(m, C):  # log E[u], log E[u^2] / 2 for x ~ N(m, C)
        v = jnp.diag(C)
        second = jax.nn.logsumexp(m[:, None] + m[None, :] + (v[:, None] + v[None, :]) / 2 + C)
        return jnp.stack([jax.nn.logsumexp(m + v / 2), second / 2])

    moments0 = jax.vmap(lambda mk: log_moments(mk, C0), in_axes=1, out_axes=1)(m0)  # (2, K)
    fields1, fields0 = (m1, jnp.sqrt(jnp.diag(C1))), (m0, jnp.sqrt(jnp.diag(C0)))
    return rule.y_range(log_moments(m1, C1), moments0, fields1, fields0)


# -- one token in conditional product form ----------------------------------------------------

def _conditional_law(C, dims: int):
    """``(delta, S)``: ``C = delta I + S^T S`` with ``delta`` the least eigenvalue of ``C`` (clipped at
    zero) and ``S`` (dims, H) the principal factor (:func:`~singleloc.runtime._numerics.principal_factor`) of
    ``C - delta I`` on its ``dims`` leading directions (``dims = H - 1`` holds all of it: its last
    eigenvalue is zero). Outside the gradient (the derivatives are by Price's theorem, :func:`_joint_token`)."""
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
    """``E[f(y + lse(x))]`` (4, n_t) of the four profiles for the ``H`` fields ``x ~ N(mean, C)`` of one token, in
    conditional product form (module docstring): ``C = delta I + S^T S`` (:func:`_conditional_law`), the nodes ``z`` (N,
    H - 1) and weights ``w`` on the principal directions of ``C - delta I``, the fields' conditional means ``mu = mean +
    z S``; ``table_rule``: ``(z_inner, w_inner, u_grid)`` of the tables of the profiles smoothed by ``N(0, delta)``.
    Derivatives by Price's theorem, ``dE[F] = E[grad F] dmean + E[tr(hess F dC)] / 2``, with the gradient and Hessian of
    the conditional expectation in ``mu`` from the tabulated derivatives of the smoothed profiles
    (:func:`_joint_token_jvp`): never through ``S``."""
    tables, mu = _conditional_fields(mean, C, z, table_rule)
    return _over_nodes(lambda yy, m, ww: _token_from_heads(interpolated(*tables, yy + m, JOINT_PROFILES)) @ ww,
                       y, mu, w).T


def _over_nodes(fn, y, mu, w):
    """``sum_nodes fn(yy, mu, w)`` (any tree of arrays) at every ``yy`` of ``y``, stacked: the nodes (their
    conditional means ``mu`` (N, H) and weights ``w``) in chunks of :data:`NODE_CHUNK`, the last padded with nodes
    of weight zero, so that one chunk's interpolated profiles stay in the processor's cache at any ``N H``."""
    c = min(NODE_CHUNK, w.shape[0])
    pad = -w.shape[0] % c
    chunks = (jnp.pad(mu, ((0, pad), (0, 0))).reshape(-1, c, mu.shape[1]), jnp.pad(w, (0, pad)).reshape(-1, c))
    total = lambda parts: jax.tree.map(lambda x: jnp.sum(x, axis=0), parts)  # noqa: E731
    return jax.lax.map(lambda yy: total(jax.lax.map(lambda a: fn(yy, *a), chunks)), y)


def _conditional_fields(mean, C, z, table_rule, which=JOINT_PROFILES):
    """The table of the heads' profiles ``which`` smoothed by ``N(0, delta)``
    (:func:`~singleloc.expectations._laplace_profiles.smoothing_table`, on ``table_rule = (z_inner, w_inner,
    u_grid)``) and the conditional means ``mu = mean + z S`` (N, H) at the nodes ``z`` (:func:`_conditional_law`)."""
    zi, wi, u = table_rule
    delta, S = _conditional_law(C, z.shape[1])
    return smoothing_table(delta, zi, wi, u, which), mean + z @ S


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
    tables, mu = _conditional_fields(mean, C, z, table_rule, JVP_PROFILES)

    def one(yy, mu, w):
        values, first, second = derivatives(interpolated(*tables, yy + mu, JVP_PROFILES), JOINT_PROFILES)  # (4, N, H) each
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

    value, grad, hess = _over_nodes(one, y, mu, w)  # (n_t, 4), (n_t, 4, H), (n_t, 4, H, H)
    dC = (dC + dC.T) / 2
    tangent = jnp.einsum("tkh,h->tk", grad, dmean) + 0.5 * jnp.einsum("tkhg,hg->tk", hess, dC)
    return value.T, tangent.T


def _joint_shares(y, mean, C, z, w, table_rule):
    """``E[rho_1(y + lse(x)) softmax(x)_h]`` (n_t, H): each head's share ``P q1_h`` of ``rho_1(lse)``
    (:func:`_joint_token`; no derivatives: the attention mass is not differentiated)."""
    tables, mu = _conditional_fields(mean, C, z, table_rule)

    def one(yy, mu, w):
        _, P, q1, _, _, _ = _conditional_terms(interpolated(*tables, yy + mu, JOINT_PROFILES))
        return (w * P) @ q1

    return _over_nodes(one, y, mu, w)

"""A per-head layer's exact risk and attention masses: heads one and two at a time.

The layer. ``A_hl = exp(x_hl) / (kappa + sum_l' exp(x_hl'))`` per head (softmax, softmax1, scalable softmax) and the
head mixture ``a_l = sum_h v_h A_hl`` (the head average: ``v = 1/H``). Its risk

    R = 1 - 2 sum_h v_h E[A_h0] + sum_{h, g} v_h v_g E[sum_l A_hl A_gl]

needs, in the Laplace form of :mod:`~singleloc.expectations._laplace`, one head's integrals over ``y``
(:meth:`~singleloc.expectations._laplace.LaplaceRule.single`) for ``E[A_h0]`` and ``E[sum_l A_hl^2]`` and each pair's
over ``(y, y')`` (:meth:`~singleloc.expectations._laplace.LaplaceRule.pair`); the attention mass ``E[sum_l A_hl] =
E[A_h0] + (L - 1) E[A_h1]`` comes from the one-head integrals.

Cost model. The risk is ``H (H - 1) / 2`` pairs (one at a time, ``lax.map``; checkpointed, so that the gradient
recomputes a pair in its backward pass instead of storing its nodes), each: one table of the second field's smoothed
profiles (``TABLE_POINTS`` arguments on ``n_inner`` normal nodes, or, for a conditional width above ``WIDE_SIGMA``, on
the profile grid's 163 points with an exponential and a normal CDF each), interpolated at ``n_outer x n_t`` arguments
per token law; the first field's profiles on ``n_t x n_outer`` nodes; and ``(n_t x n_outer) @ (n_outer x n_t)``
products. The table depends on the pair's conditional variance only, so it is built once for the noise token and every
atom of a discrete prior (whose fields share the covariance ``C1``; a Gaussian part gives the relevant token a table
of its own, shared by its atoms). Per pair, a value costs ``2 n_t n_outer n_t`` multiply-adds per product (four with a
discrete prior: :data:`PAIR_BATCHES` takes each combo on the tokens that use it) plus ``TABLE_POINTS n_inner``
evaluations of each tabulated profile and ``(1 + K) n_t n_outer`` interpolations. Its gradient (``jax.grad``, as the
drift takes it) is one value, its linearisation and transpose, in the checkpoint's backward pass (one table of five
profiles, whose sums are the three profiles' values and first two derivatives: ``rho_0 ... rho_3`` and ``omega``, not
nine rows), where the forward pass's value is unused and JAX drops it, so there is no recomputation to save (where the
time goes, and what did not pay: docs/benchmarks/06).

The ``lr^2`` Gram term of one or two heads (:mod:`~singleloc.expectations._laplace_gram`) takes its pair moments on
:data:`GRAM_OUTER` times the pair rule's outer nodes, which this layer holds (``H = 2`` only).
"""

from __future__ import annotations

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._cubature import normal_rule
from ._laplace_profiles import OMEGA, RHO0, RHO1, RHO2, _power

#: The ``lr^2`` Gram term's pair moments (:mod:`~singleloc.expectations._laplace_gram`) take this many times the outer
#: nodes: their profiles (up to the sixth power) are narrower than the risk's, and a wide first field aliases them
#: on the risk's outer rule (9% off at a token standard deviation of 6; docs/model.md section 4.6).
GRAM_OUTER = 3
#: The profile pairs of a pair of heads: the noise token's ``E[rho_0 omega']`` and ``E[rho_1 rho_1']`` (the first two),
#: the relevant token's ``E[rho_1 rho_1']`` and ``E[rho_0 rho_0']`` (the last two): one list, so that one table of the
#: second field's smoothed profiles serves both tokens where their fields share a covariance (a discrete prior).
PAIR_COMBOS = ((RHO0, OMEGA), (RHO1, RHO1), (RHO0, RHO0))
#: Where the noise token and the atoms share one table (a discrete prior: the means ``(noise, atom_1, ...)``), the part
#: of those means each of :data:`PAIR_COMBOS` is wanted at: no product for a combo that a token does not use.
PAIR_BATCHES = (slice(0, 1), slice(None), slice(1, None))


class PerHeadLayer(eqx.Module):
    """The per-head layer's part of a :class:`~singleloc.expectations._laplace.LaplaceRule`: the Gram term's
    outer rule ``z_gram``, ``w_gram`` (:data:`GRAM_OUTER` times the pair rule's outer nodes; empty
    unless ``H = 2``, the one use of it), and the risk and attention masses (module docstring)."""

    z_gram: jax.Array
    w_gram: jax.Array

    @classmethod
    def make(cls, H: int, n_outer: int, dtype) -> PerHeadLayer:
        """The layer of ``H`` heads whose pair rule has ``n_outer`` outer nodes."""
        zg, wg = normal_rule(GRAM_OUTER * n_outer) if H == 2 else (np.zeros(0), np.zeros(0))
        return cls(jnp.asarray(zg, dtype), jnp.asarray(wg, dtype))

    def refined_sizes(self) -> None:
        """A per-head layer has no sizes of its own to refine (its Gram rule follows the outer nodes)."""
        return None

    def exact_gram(self, H: int) -> bool:
        """Whether the exact Gram term holds: one or two heads (three or more hold moments of up to
        four distinct heads, :mod:`~singleloc.expectations._laplace_gram`)."""
        return H <= 2

    def risk(self, rule, M, Q, b, v=None):
        """The risk of the mixture ``a = sum_h v_h A_h`` (module docstring; ``v``: default the head average ``1/H``)."""
        H, L = Q.shape[0], rule.L
        v = jnp.full((H,), 1.0 / H, M.dtype) if v is None else jnp.asarray(v, M.dtype)
        ((m1, C1, m0, C0), Y, pre), heads = self._head_terms(rule, M, Q, b)
        EA0, EAA_same, omega = heads["first"], heads["same"], heads["omega"]
        pairs = np.array(list(itertools.combinations(range(H), 2)), dtype=np.int32).reshape(-1, 2)

        def pair(hh):
            h, g = hh[0], hh[1]
            y, yp = Y[h], Y[g]
            if rule.discrete:  # both tokens' fields have the covariance C1: one table for the noise token and every atom
                means = [jnp.concatenate([m1[k][None], m0[k]]) for k in (h, g)]
                both = rule.pair(PAIR_COMBOS, y, yp, *means, C1[h, h], C1[h, g], C1[g, g], batches=PAIR_BATCHES)
                noise, rel = (both[0][0], both[1][0]), jnp.stack([both[1][1:], both[2]])
            else:
                noise = rule.pair(PAIR_COMBOS[:2], y, yp, m1[h], m1[g], C1[h, h], C1[h, g], C1[g, g])
                rel = rule.pair(PAIR_COMBOS[1:], y, yp, m0[h], m0[g], C0[h, h], C0[h, g], C0[g, g])
            rel = jnp.tensordot(rule.probs, rel, axes=([0], [1]))  # the atoms' average: (RHO1 RHO1, RHO0 RHO0)
            W = omega[h][:, None] + noise[0]  # 1 - E[rho_0 rho_0] as a sum of non-negative terms
            w = pre[h][:, None] * pre[g][None, :]
            return jnp.sum(w * rel[0] * _power(W, L - 1)) + (L - 1) * jnp.sum(w * noise[1] * rel[1] * _power(W, L - 2))

        cross = 0.0
        if len(pairs):
            cross = jax.lax.map(jax.checkpoint(pair), jnp.asarray(pairs)) @ (v[pairs[:, 0]] * v[pairs[:, 1]])
        return 1.0 - 2.0 * (v @ EA0) + v**2 @ EAA_same + 2.0 * cross

    def attention_mass(self, rule, M, Q, b):
        """``E[sum_l A_hl] = E[A_h0] + (L - 1) E[A_h1]`` (H,) from the one-head integrals."""
        return self._head_terms(rule, M, Q, b)[1]["mass"]

    def _head_terms(self, rule, M, Q, b):
        """What the risk and attention mass need of each head alone: the token laws, the ``y`` nodes
        ``Y`` and weights ``pre`` (H, n_t), and per head ``E[A_h0]``, ``E[A_h0^2] + (L - 1) E[A_h1^2]``,
        the noise token's ``E1[omega]`` on its nodes and ``E[sum_l A_hl]``."""
        H, L, kappa = Q.shape[0], rule.L, rule.offset
        laws = rule.token_laws(M, Q, b)
        m1, C1, m0, C0 = laws
        v1, v0 = jnp.diag(C1), jnp.diag(C0)
        Y, step = rule.head_ranges(m1, v1, m0, v0)
        pre = step[:, None] * jnp.exp(-kappa * jnp.exp(Y))  # (H, n_t)

        def single(h):
            y = Y[h]
            noise = rule.single(y, m1[h], v1[h])
            rel = rule.atoms_mean(lambda k: rule.single(y, m0[h, k], v0[h]))
            p1, p2 = _power(noise[OMEGA], L - 1), _power(noise[OMEGA], L - 2)
            w = pre[h]
            first = jnp.sum(w * rel[RHO1] * p1)
            same = jnp.sum(w * rel[RHO2] * p1) + (L - 1) * jnp.sum(w * noise[RHO2] * rel[RHO0] * p2)
            mass = first + (L - 1) * jnp.sum(w * noise[RHO1] * rel[RHO0] * p2)
            return {"first": first, "same": same, "omega": noise[OMEGA], "mass": mass}

        return (laws, Y, pre), jax.vmap(single)(jnp.arange(H))

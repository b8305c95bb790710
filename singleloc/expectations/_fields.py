"""Expectations over the local fields of docs/model.md section 4, by a deterministic rule.

The population risk and the ODE drift are expectations of functions of the scores of one sequence. With the relevant
token fixed at position 0 (exact for token-permutation equivariant activations, since ``eps`` is uniform), the fields
are

    g_l = Q^{1/2} w_l            (l = 1..L-1),      g_0 = M theta + Q^{1/2} w_0,

with ``w_l ~ N(0, I_H)`` i.i.d. and ``theta`` from the prior (or any factor ``S`` of ``Q``, ``S^T S = Q``, in place of
``Q^{1/2}``: the same law). The spike fields ``nu`` never have to be drawn: wherever they appear (the drift of ``M``)
their conditional mean given ``g`` replaces them (see ``_theory.py``), so the rule integrates over ``L * H`` Gaussian
dimensions, plus ``F`` for the Gaussian part of the prior.

The rule. The atoms of the prior are summed exactly with their probabilities; the Gaussian dimensions use scrambled
Sobol points mapped to normals by the inverse CDF, together with their antithetic mirrors ``-z`` (so every odd moment is
integrated exactly), linearly whitened so that second moments are exact too (moment matching: it cut the error of second
moments tenfold at 1024 points). The points are drawn once, from a fixed seed, and held for the whole solve: the
expectations are deterministic functions of ``(M, Q, b)``, continuous on both layouts below.

The whitening's bias. The whitening ``C^{-1/2}`` is a function of all the nodes, so a whitened rule is not unbiased: its
error has a part, of order ``d / n`` (``d`` Gaussian coordinates, ``n`` points), that independent scramblings share and
their spread does not see. Where ``n >> d`` it is negligible; at long sequences it is not (two identical bsoftmax heads,
``L = 64``, a trained key, rank-aware, ``d = 256``: the Gram term ``E[sum_l c_l c_l^T]`` 31%, 8.7%, 1.6% and 0.27% off
the exact value at ``n / d`` = 2, 4, 16, 64, 4 to 14 of the scramblings' standard errors; unwhitened, within 1 to 4 of
them, with the same spread). So the exact route's Gram rule is not whitened (``whiten = False``:
tests/test_gram_terms.py).

Rank-aware fields. With ``principal=True`` (the ODE's rule with ``theory.axes = "principal"``,
:func:`~singleloc.population_risk`'s and the exact route's Gram term's) the fields are ``g_l = w_l S`` with the
rank-aware factor ``S`` (2H, H) of ``Q`` (:func:`~singleloc.runtime._numerics.rank_aware_factor_and_pinv`: every
principal direction that is well defined on coordinates of its own, the rest on a symmetric root, blended continuously)
and the Sobol coordinates assigned row-major in ``S`` -- the first ``L`` to every token's leading direction -- so that
heads that are (near) copies put the variance on the leading coordinates (docs/model.md section 4.4 for what it gains
and gives up). Identical heads keep identical fields, the fields are continuous in ``Q``, and a permutation of the heads
maps the rule onto itself where every principal direction is determined, else up to the symmetric block's rows.
:meth:`LocalFields.factors` gives each rule's factor with ``T = S Q^+``, which the drift needs.

Exchange symmetry of the heads (``theory.axes = "heads"``, the ODE's default). ``Q^{1/2}`` is the symmetric PSD square
root (eigenvalues clipped at zero): continuous, defined for singular ``Q`` (identical heads), and
permutation-equivariant, ``(P Q P^T)^{1/2} = P Q^{1/2} P^T``. Permuting the heads of a state therefore permutes the
fields of node ``w`` into the fields of node ``w P``, and the rule is exactly equivariant under the permutations ``P``
that map its node set onto itself. With ``symmetric=True`` the nodes are closed under the cyclic shifts of the head
columns of ``w``: ``points / H`` Sobol points, each with its ``H`` shifts and their mirrors (``2 points`` nodes, as
without the closure). The drift is then exactly equivariant under the cyclic shifts of the heads -- every permutation
for ``H <= 2`` -- and so is the solve: a start mapped onto itself by a shift of the heads together with a symmetry of
the problem (e.g. swapping two spikes of the ``spikes`` prior) keeps that symmetry, and quadrature error alone cannot
split equivalent heads. Without the closure the rule breaks the symmetry at the level of its error, and in long runs
such heads drift apart along the slow directions (docs/model.md section 4.4). Identical heads stay identical with either
rule: their fields coincide at every node.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Integer
from scipy.special import ndtri

from ..ground._arguments import checked
from ..model._priors import Prior
from ..runtime._numerics import psd_sqrt_and_pinv_sqrt, rank_aware_factor_and_pinv
from ._sobol_geometry import SOBOL_MAX_DIM, factor_rows, node_batch

#: Bits of the Sobol integers (as SciPy's).
SOBOL_BITS = 30


@functools.lru_cache(maxsize=8)
def _directions(dim: int) -> np.ndarray:
    """The direction integers (dim, SOBOL_BITS) of the first ``dim`` Sobol coordinates (Bratley and Fox): the first
    ``s`` of a coordinate (``s`` the degree of its primitive polynomial ``x^s + a_1 x^(s-1) + ... + 1``) from Joe and
    Kuo's table (``new-joe-kuo-6.21201``, read from SciPy's data file: ``scipy.stats``, half a second to import for its
    distributions, is not imported), the rest ``v_j = v_(j-s) ^ (v_(j-s) << s) ^ XOR_(k < s-1, a_(k+1) = 1) v_(j-k-1)
    << (k + 1)``, at the top bit."""
    folder = importlib.util.find_spec("scipy").submodule_search_locations[0]
    with np.load(os.path.join(folder, "stats", "_sobol_direction_numbers.npz")) as table:
        poly, v = table["poly"][:dim].astype(np.int64), table["vinit"][:dim].astype(np.int64)
    degree, v = np.array([int(p).bit_length() - 1 for p in poly], int), np.pad(v, ((0, 0), (0, SOBOL_BITS - v.shape[1])))
    for j in range(1, SOBOL_BITS):
        new = v[np.arange(dim), np.maximum(j - degree, 0)]
        for k in range(min(j, degree.max(initial=0))):
            new ^= np.where((k < degree) & (poly >> np.maximum(degree - 1 - k, 0)) & 1, v[:, j - k - 1] << (k + 1), 0)
        v[:, j] = np.where(j >= degree, new, v[:, j])
    v[:1] = 1
    return v << (SOBOL_BITS - 1 - np.arange(SOBOL_BITS))


def sobol_normals(dim: int, n: int, seed: int) -> np.ndarray:
    """The first ``n`` points (n, dim) of the Sobol sequence (Gray-code order, ``2^m >= n`` drawn and cut), scrambled by
    a random lower triangular matrix on the bits of every direction integer and a random digital shift (LMS + shift,
    from ``numpy.random.default_rng(seed)``: SciPy's ``qmc.Sobol(dim, scramble=True, seed=seed)`` to the bit,
    tests/test_expectations.py), mapped to standard normals by the inverse CDF."""
    rng, top = np.random.default_rng(seed), SOBOL_BITS - 1 - np.arange(SOBOL_BITS)
    shift = rng.integers(2, size=(dim, SOBOL_BITS), dtype=np.uint32) @ (2 ** np.arange(SOBOL_BITS, dtype=np.uint32))
    scramble = np.tril(rng.integers(2, size=(dim, SOBOL_BITS, SOBOL_BITS), dtype=np.uint32)) | np.eye(SOBOL_BITS, dtype=np.uint32)
    columns = (scramble.astype(np.int64) << top[:, None]).sum(axis=1)  # column i of each matrix as an integer
    v, directions = _directions(dim), np.zeros((dim, SOBOL_BITS), np.int64)
    for i in range(SOBOL_BITS):  # the matrix times each direction's bits (mod 2)
        directions ^= np.where((v >> top[i]) & 1, columns[:, i, None], 0)
    points = shift[None].astype(np.int64)
    for b in range(max(int(np.ceil(np.log2(n))), 0)):  # point 2^b + i is point 2^b - 1 - i with bit b flipped
        points = np.concatenate([points, points[::-1] ^ directions[:, b]])
    return ndtri(np.clip(points[:n] * 2.0**-SOBOL_BITS, 1e-12, 1 - 1e-12))


def head_shifts(L: int, H: int, extra: int = 0) -> np.ndarray:
    """Index permutations (H, L*H + extra) of flattened nodes ``(w (L, H), u (extra,))``: row
    ``k`` shifts the head columns of ``w`` cyclically by ``k`` and leaves ``u`` alone."""
    heads = (np.arange(H)[None, :] + np.arange(H)[:, None]) % H  # (k, h) -> source head of head h
    w_index = np.arange(L)[None, :, None] * H + heads[:, None, :]  # (k, L, H)
    u_index = np.broadcast_to(L * H + np.arange(extra), (H, extra))
    return np.concatenate([w_index.reshape(H, L * H), u_index], axis=1)


def gaussian_nodes(L: int, H: int, extra: int, points: int, seed: int, symmetric: bool, whiten: bool = True) -> np.ndarray:
    """Base nodes (n, L*H + extra) of the rule: scrambled Sobol normals, whitened (``whiten``) so that their orbit (with
    the head shifts when ``symmetric``, and the mirrors ``-z``) has exactly the first and second moments of ``N(0, I)``.
    ``n = points`` without the closure and ``points // H`` with it. Without ``whiten`` every node is exactly ``N(0, I)``
    in law and the average is unbiased (the whitening's bias: module docstring).

    Long sequences (the exact route needs this rule only for its ``lr^2`` term, at any ``L``): coordinates beyond
    SciPy's Sobol limit (21201) are pseudo-random normals from ``seed``; with fewer orbit points than coordinates the
    nodes are not whitened (the mirrors still integrate every odd moment exactly). The rule route refuses both cases
    before it builds a rule (:func:`~singleloc.preflight._resources.check_quadrature`)."""
    dim = L * H + extra
    shifts = head_shifts(L, H, extra) if symmetric and H > 1 else np.arange(dim)[None, :]
    n = max(points // len(shifts), 1)
    z = sobol_normals(min(dim, SOBOL_MAX_DIM), n, seed)
    if dim > SOBOL_MAX_DIM:
        z = np.concatenate([z, np.random.default_rng(seed).standard_normal((n, dim - SOBOL_MAX_DIM))], axis=1)
    if not whiten or n * len(shifts) < dim:
        return z
    C = z.T @ z / n  # second moments of the base points (and of their mirrors)
    C = np.mean([C[np.ix_(p, p)] for p in shifts], axis=0)  # ... of the orbit: shift-invariant
    w, v = np.linalg.eigh(C)
    return z @ (v / np.sqrt(w)) @ v.T  # C^{-1/2} commutes with the shifts: the orbit stays closed


class LocalFields(eqx.Module):
    """Quadrature rule for expectations over the local fields of ``L`` tokens and ``H`` heads.

    Build it with :meth:`make`; then ``rule.expect(fn, M, Q)`` returns ``E[fn(g, theta)]`` where ``g`` (L, H) are the
    head fields (token 0 relevant) and ``theta`` (F,) the latent. ``fn`` may return any pytree of arrays.

    The nodes are the base points ``w``, ``u`` under the cyclic head shifts ``0..orbit-1`` (``orbit = H`` for a
    symmetric rule, 1 otherwise) and the sign flip, each with weight ``1 / (2 * orbit * n)``. ``shards > 1``: the base
    points are in ``shards`` equal blocks, the last ``padding`` of them of weight zero (:meth:`split`).
    """

    w: jax.Array  # (n, L, H) base standard normals for the head fields
    u: jax.Array  # (n, G) base standard normals for the Gaussian part of the prior (G = 0 or F)
    atoms: jax.Array  # (K, F)
    probs: jax.Array  # (K,)
    cov_sqrt: jax.Array  # (F, G): theta = atom + cov_sqrt @ u
    orbit: int = eqx.field(static=True)
    batch_size: int = eqx.field(static=True)
    shards: int = eqx.field(static=True, default=1)
    padding: int = eqx.field(static=True, default=0)
    principal: bool = eqx.field(static=True, default=False)

    @classmethod
    @checked
    def make(cls, L: int, H: int, prior: Prior, points: int = 4096, seed: int = 0, batch_size: int | None = None, *,
             symmetric: bool = False, principal: bool = False, whiten: bool = True) -> LocalFields:
        """A rule of ``2 * points`` nodes from ``points`` Sobol points (a power of two) and their
        mirrors; ``symmetric``: closed under the cyclic shifts of the heads (module docstring).
        ``batch_size``: nodes evaluated at once (default :func:`~singleloc.expectations._sobol_geometry.node_batch`,
        fewer at large ``L * H``); ``principal``: rank-aware, not with ``symmetric`` (module docstring);
        ``whiten = False``: not whitened, so that one scrambling's average is unbiased (:func:`gaussian_nodes`)."""
        if points < 1 or points & (points - 1):
            raise ValueError(f"theory.points must be a power of two, got {points}")
        if principal and symmetric:
            raise ValueError("a principal (rank-aware) rule cannot also be closed under the head shifts")
        G = 0 if prior.is_discrete else prior.F
        width = factor_rows(H, principal)
        z = gaussian_nodes(L, width, G, points, seed, symmetric, whiten)
        d = L * width
        w = z[:, :d].reshape(-1, width, L).transpose(0, 2, 1) if principal else z[:, :d].reshape(-1, L, H)
        dtype = jnp.result_type(float)
        return cls(w=jnp.asarray(w, dtype), u=jnp.asarray(z[:, d:], dtype), atoms=jnp.asarray(prior.atoms_array(), dtype),
                   probs=jnp.asarray(prior.probs_array(), dtype),
                   cov_sqrt=jnp.asarray(prior.cov_sqrt() if G else np.zeros((prior.F, 0)), dtype),
                   orbit=H if symmetric and H > 1 else 1, principal=principal,
                   batch_size=node_batch(L, H) if batch_size is None else int(batch_size))

    def split(self, shards: int) -> LocalFields:
        """The same rule with its base points in ``shards`` equal blocks (one per device): padded with copies of the
        last base point, of weight zero (module docstring). Leading (replicate) axes are kept."""
        n = self.w.shape[-3] - self.padding
        pad = -n % shards

        def padded(x, axis):
            x = jax.lax.slice_in_dim(x, 0, n, axis=axis)
            return jnp.concatenate([x] + [jax.lax.slice_in_dim(x, n - 1, n, axis=axis)] * pad, axis=axis)

        return dataclasses.replace(self, w=padded(self.w, -3), u=padded(self.u, -2), shards=shards, padding=pad)

    def shard(self, mesh, put) -> LocalFields:
        """The same rule in one block of base points per device of ``mesh`` (:meth:`split`), block ``k`` on
        device ``k`` (node axes: ``w`` (..., n, L, H), ``u`` (..., n, G)), the prior's arrays on every device
        (``put(x, mesh, axis=None)``: :mod:`~singleloc.expectations._sharding`)."""
        rule = self.split(mesh.size)
        return dataclasses.replace(rule, w=put(rule.w, mesh, -3), u=put(rule.u, mesh, -2), atoms=put(rule.atoms, mesh),
                                   probs=put(rule.probs, mesh), cov_sqrt=put(rule.cov_sqrt, mesh))

    def factors(self, Q: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(S, T)``: the factor ``S`` of this rule's fields ``g_l = w_l S`` (``S^T S = Q``) and ``T = S Q^+`` (``T^T T
        = Q^+``): the rank-aware pair (:func:`~singleloc.runtime._numerics.rank_aware_factor_and_pinv`) for a principal
        rule, ``(Q^{1/2}, (Q^+)^{1/2})`` otherwise. A field average ``E[c w^T] = W`` gives ``E[c g^T] = W S`` and ``E[c
        g^T] Q^+ = W T``."""
        return rank_aware_factor_and_pinv(Q) if self.principal else psd_sqrt_and_pinv_sqrt(Q)

    def expect(self, fn: Callable, M: jax.Array, Q: jax.Array, *, factor: jax.Array | None = None,
               with_noise: bool = False, contract: Callable | None = None):
        """``E[fn(g, theta)]`` over the fields of order parameters ``M`` (H, F), ``Q`` (H, H).

        ``factor``: this rule's factor ``S`` of ``Q`` (:meth:`factors`) when the caller already has it.
        ``with_noise=True`` calls ``fn(g, theta, w)`` with the standard normals ``w`` (L, H) behind
        ``g = w S`` (``w`` (L, 2H) for a principal rule, whose factor has ``2 H`` rows).
        ``contract``: the weighted sum over the nodes is taken by ``contract(values, p)`` instead, ``values``
        being ``fn``'s values at a batch of nodes (leading axes: base points, shifts, signs, atoms) and ``p``
        their weights (those axes; summing to 1 over all batches): a product of two per-node factors then
        becomes one contraction over the nodes rather than a tiny product at each (the rule route's drift).
        """
        S = self.factors(Q)[0] if factor is None else factor
        H = self.w.shape[-1]
        shifts = jnp.arange(self.orbit)

        def at_image(w, u, shift, sign):
            w = sign * jnp.take(w, (jnp.arange(H) + shift) % H, axis=-1)
            noise = self.cov_sqrt @ (sign * u)
            g = w @ S

            def at_atom(atom):
                theta = atom + noise
                fields = g.at[0].add(M @ theta)
                return fn(fields, theta, w) if with_noise else fn(fields, theta)

            values = jax.vmap(at_atom)(self.atoms)
            return values if contract else jax.tree.map(lambda v: jnp.tensordot(self.probs, v, axes=1), values)

        def at_node(node):
            w, u = node
            images = jax.vmap(jax.vmap(at_image, (None, None, None, 0)), (None, None, 0, None))
            values = images(w, u, shifts, jnp.array([1.0, -1.0], w.dtype))
            return values if contract else jax.tree.map(lambda v: jnp.mean(v, axis=(0, 1)), values)

        def at_nodes(nodes):  # at most batch_size nodes (base points and their images) at once
            if 2 * self.orbit * nodes[0].shape[0] <= self.batch_size:
                return jax.vmap(at_node)(nodes)
            return jax.lax.map(at_node, nodes, batch_size=max(self.batch_size // (2 * self.orbit), 1))

        nodes = (self.w, self.u)
        if contract is not None:  # blocks (one per device) of batches of base points, the padding weighing zero
            n, per = self.w.shape[-3], max(self.batch_size // (2 * self.orbit), 1)
            weights = jnp.where(jnp.arange(n) < n - self.padding, 1 / (2 * self.orbit * (n - self.padding)), 0.0)
            m = n // self.shards
            k = -(-m // per) if m > per else 1
            per = -(-m // k)

            def batches(x):
                x = x.reshape(self.shards, m, *x.shape[1:])
                pad = jnp.zeros((self.shards, k * per - m, *x.shape[2:]), x.dtype)
                return jnp.concatenate([x, pad], axis=1).reshape(self.shards, k, per, *x.shape[2:])

            def part(batch):
                nodes, p = batch
                p = jnp.broadcast_to(p[:, None, None, None] * self.probs, (p.shape[0], self.orbit, 2, self.probs.shape[0]))
                return contract(jax.vmap(at_node)(nodes), p)

            parts = jax.vmap(lambda block: jax.lax.map(part, block))(jax.tree.map(batches, (nodes, weights.astype(self.w.dtype))))
            return jax.tree.map(lambda v: jnp.sum(v, axis=(0, 1)), parts)
        if self.shards == 1:
            return jax.tree.map(lambda v: jnp.mean(v, axis=0), at_nodes(nodes))
        # block k on device k (_sharding): the contraction over the blocks is XLA's all-reduce
        blocks = jax.tree.map(lambda x: x.reshape(self.shards, x.shape[0] // self.shards, *x.shape[1:]), nodes)
        n = self.w.shape[-3]
        weights = jnp.where(jnp.arange(n) < n - self.padding, 1 / (n - self.padding), 0.0).astype(self.w.dtype)
        weights = weights.reshape(self.shards, -1)
        return jax.tree.map(lambda v: jnp.tensordot(weights, v, axes=2), jax.vmap(at_nodes)(blocks))


def replicate_rules(L: int, H: int, prior: Prior, points: int, seeds: Sequence[int] | Integer[ArrayLike, " K"],
                    **kwargs) -> LocalFields:
    """Independently scrambled rules (one per seed) stacked along a leading axis: ``jax.vmap``
    a function of the rule over it (``in_axes=0`` on the rule)."""
    rules = [LocalFields.make(L, H, prior, points, int(seed), **kwargs) for seed in seeds]
    return jax.tree.map(lambda *leaves: jnp.asarray(np.stack(leaves)), *rules)

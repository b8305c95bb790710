"""The ``lr^2`` Gram term by plain Monte Carlo, with its standard error (``theory.gram = "montecarlo"``).

The term ``G = E[sum_l c_l c_l^T]`` (H, H), ``c = dl/ds`` the limit loss's gradient at the scores, is the mean over
``n`` independent antithetic pairs of sequences,

    G_hat = (1/n) sum_i y_i,    y_i = (f(z_i, u_i) + f(-z_i, -u_i)) / 2,    f(z, u) = sum_{atoms k} p_k sum_l c_l c_l^T,

with the head fields ``g_l = z_l Q^{1/2}`` (any factor ``S^T S = Q`` gives the same law), plus ``M theta`` on the
relevant token 0, ``z`` (L, H) and ``u`` (G,) standard normals, ``theta = a_k + Sigma^{1/2} u`` (the prior's atoms
summed exactly with their probabilities, its Gaussian part drawn). Every ``y_i`` has the law of the others and mean
``G``: the estimate is unbiased for any ``L``, ``H``, layer (per-head or joint) and head weights, and its standard error
``sd(y) / sqrt(n)`` (the sample standard deviation of the ``y_i``, entry by entry) is estimated from the same draws.
Nothing is fitted to the draws (no whitening, no control variate), so nothing biases it: the Sobol rule with whitened
nodes did, by more than its scramblings' spread (:mod:`~singleloc.expectations._fields`, tests/test_gram_terms.py).

Memory and time. The draws are made inside the compiled program from a fixed key, ``batch`` pairs at a time
(``jax.random.fold_in(key, i)`` for batch ``i``) in a ``lax.scan`` that keeps the batches' means and sums of squares:
memory ``batch x L x H`` numbers (:func:`~singleloc.expectations._sobol_geometry.node_batch`, about
:data:`~singleloc.expectations._sobol_geometry.BATCH_NUMBERS` whatever ``L``), time ``n x L x H``. The key is fixed, so
the same draws serve every state: the term is a deterministic, continuous function of ``(M, Q, b)``, as the ODE's
step-size controller needs, and a solve is reproducible from the seed.
"""

from __future__ import annotations

import math
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..model._activations import Activation
from ..model._layer import limit_loss
from ..model._priors import Prior
from ..runtime._numerics import psd_sqrt
from ._expectation import AbstractGramTerm
from ._sobol_geometry import node_batch


class MonteCarloGram(AbstractGramTerm):
    """``E[sum_l c_l c_l^T]`` by plain Monte Carlo over ``batches x pairs`` antithetic pairs of sequences
    drawn from ``key`` (module docstring), with its standard error (:meth:`gram_and_error`).

    Attributes:
        key: the raw PRNG key (2,) of the draws (a leading axis stacks independent replicates).
        atoms, probs, cov_sqrt: the prior (atoms (K, F), probabilities (K,), Gaussian part's root (F, G)).
        L: tokens per sequence; pairs: antithetic pairs per batch; batches: batches; activation: static.
    """

    key: jax.Array
    atoms: jax.Array
    probs: jax.Array
    cov_sqrt: jax.Array
    L: int = eqx.field(static=True)
    pairs: int = eqx.field(static=True)
    batches: int = eqx.field(static=True)
    activation: Activation = eqx.field(static=True)
    name: ClassVar[str] = "montecarlo"

    @classmethod
    def make(cls, activation: Activation, prior: Prior, L: int, H: int, draws: int, seed: int = 0,
             seeds=None) -> MonteCarloGram:
        """At least ``draws`` antithetic pairs (rounded up to whole batches) of sequences of ``L`` tokens and
        ``H`` heads under ``prior``, from ``seed`` (or one key per seed of ``seeds``, every leaf stacked along a
        leading replicates axis)."""
        if draws < 2:
            raise ValueError(f"theory.gram_points: the Monte Carlo Gram term needs at least 2 draws, got {draws}")
        pairs = max(1, min(int(draws), node_batch(L, H) // 2))
        dtype = jnp.result_type(float)
        G = 0 if prior.is_discrete else prior.F
        leaves = dict(atoms=jnp.asarray(prior.atoms_array(), dtype), probs=jnp.asarray(prior.probs_array(), dtype),
                      cov_sqrt=jnp.asarray(prior.cov_sqrt() if G else np.zeros((prior.F, 0)), dtype))
        if seeds is None:
            key = jax.random.PRNGKey(int(seed))
        else:
            key = jnp.stack([jax.random.PRNGKey(int(s)) for s in seeds])
            leaves = {k: jnp.broadcast_to(x, (len(seeds), *x.shape)) for k, x in leaves.items()}
        return cls(key=key, **leaves, L=int(L), pairs=pairs, batches=math.ceil(int(draws) / pairs), activation=activation)

    @property
    def draws(self) -> int:
        """The number ``n`` of antithetic pairs averaged."""
        return self.pairs * self.batches

    def gram_and_error(self, M: jax.Array, Q: jax.Array, b: jax.Array, v: jax.Array | None = None
                       ) -> tuple[jax.Array, jax.Array]:
        """``(G_hat, se)``, both (H, H): the mean of the pairs' averages ``y_i`` and its standard error
        ``sd(y) / sqrt(n)``, entry by entry (module docstring; ``v``: trained head weights)."""
        H, G = Q.shape[0], self.cov_sqrt.shape[1]
        root = psd_sqrt(Q)
        score_gradient = jax.grad(lambda s: limit_loss(self.activation, s, 0, v))

        def one_sequence(z, u):
            g = z @ root

            def at_atom(atom):
                c = score_gradient(g.at[0].add(M @ (atom + self.cov_sqrt @ u)).T + b[:, None])
                return c @ c.T

            return jnp.tensordot(self.probs, jax.vmap(at_atom)(self.atoms), axes=1)

        def batch(_, i):
            kz, ku = jax.random.split(jax.random.fold_in(self.key, i))
            z = jax.random.normal(kz, (self.pairs, self.L, H), Q.dtype)
            u = jax.random.normal(ku, (self.pairs, G), Q.dtype)
            y = (jax.vmap(one_sequence)(z, u) + jax.vmap(one_sequence)(-z, -u)) / 2
            mean = jnp.mean(y, axis=0)
            return None, (mean, jnp.sum((y - mean) ** 2, axis=0))

        _, (means, squares) = jax.lax.scan(batch, None, jnp.arange(self.batches))
        mean = jnp.mean(means, axis=0)  # equal batches: the mean of all pairs
        spread = jnp.sum(squares, axis=0) + self.pairs * jnp.sum((means - mean) ** 2, axis=0)
        n = self.draws
        return mean, jnp.sqrt(spread / (n - 1) / n)

    def gram(self, M, Q, b, v=None):
        return self.gram_and_error(M, Q, b, v)[0]

    def error(self, evaluation, M, Q, b, v=None):
        """Its standard error, from its own draws (``evaluation`` is not needed)."""
        G, se = self.gram_and_error(M, Q, b, v)
        return G, jnp.max(se)

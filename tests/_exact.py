"""The exact route's rules at the node counts the exact route's tests (tests/test_laplace*.py) were written for,
the programs they share, and the trained-like states they visit."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import singleloc as sl
from singleloc.expectations._laplace import LaplaceRule
from singleloc.model._activations import exponential_form


# The programs the tests share: compiled once per layer kind, heads, prior shape and node counts (``L``
# and ``alpha`` are arrays of the rule), so the cases that differ in ``L`` alone, or that are softmax
# and ssmax, run on one program. Risk-only checks take ``_risk``; those with a gradient take
# ``_value_and_grad`` (also for their risks where that program is compiled anyway: two heads, two spikes).
@eqx.filter_jit
def _risk(rule, M, Q, b):
    return rule.risk(M, Q, b)


#: The node counts these tests were written for (``theory.nodes = 64`` at a scale ``alpha <= 1``).
NODES = {"n_t": 128, "n_outer": 64, "n_inner": 64}


def rule_for(name, L, H, prior, **kwargs):
    return LaplaceRule.make(exponential_form(sl.get_activation(name), L), L, H, prior, **{**NODES, **kwargs})


@eqx.filter_jit
def _value_and_grad(rule, M, Q, b):
    return jax.value_and_grad(rule.risk, argnums=(0, 1, 2))(M, Q, b)


@eqx.filter_jit
def _mass(rule, M, Q, b):
    return rule.attention_mass(M, Q, b)


def trained_state(kind, H, F, rng):
    """States of the kinds the ODE visits late in training."""
    M = np.zeros((H, F))
    if kind == "copies":  # softmax, F = 1, H = 6 at tau = 300 (issue 20): every entry alike
        M[:, 0] = 1.96
        Q = np.full((H, H), 3.86)
    elif kind == "near":  # leaning heads, R_orth ~ 0.05 I
        M[:, 0] = 1.96
        Q = M @ M.T + 0.05 * np.eye(H) + 0.01
    elif kind == "specialised":
        for h in range(H):
            M[h, h % F] = 2.3
        Q = M @ M.T + 0.05 * np.eye(H)
    else:
        M = 0.3 * rng.standard_normal((H, F))
        A = 0.5 * rng.standard_normal((H, H))
        Q = M @ M.T + A @ A.T / H
    b = 0.3 * rng.standard_normal(H)
    return jnp.asarray(M), jnp.asarray(Q), jnp.asarray(b)

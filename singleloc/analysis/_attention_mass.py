"""The attention mass of each head at given overlaps.

``w_h = E[sum_l A_hl]``, the attention weight head ``h`` puts on the sequence, by the ODE's own expectations:
exactly on the exact route (:meth:`~singleloc.expectations._laplace.LaplaceRule.attention_mass`, the risk's one-head
integrals), by its quadrature rule otherwise. The output weights are ``a_l = (1/H) sum_h A_hl``, so ``w_h / H`` is the
head's share of ``sum_l a_l``: a softmax head has ``w_h = 1`` always, a softmax1 head ``w_h < 1`` (``-> 0`` as its
bias or its scores go to minus infinity), and bsoftmax heads share ``sum_h w_h = H``. The phase analysis calls a head
off when ``w_h`` is below a fraction of a full head's (:func:`~singleloc.analysis._head_classes.classify_heads`). Not
the head weights ``v_h`` of ``model.head_weights``, which mix the heads.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Real

from ..preflight._resources import auto_points
from ..runtime._compilation import exported_call
from ..theory._theory import OrderParameterODE


@eqx.filter_jit
def _attention_mass_many(ode: OrderParameterODE, M: jax.Array, Q: jax.Array, b: jax.Array) -> jax.Array:
    return jax.lax.map(lambda s: ode.expectation.attention_mass(*s), (M, Q, b))


def attention_mass(ode: OrderParameterODE, M: Real[ArrayLike, "*S H F"], Q: Real[ArrayLike, "*S H H"],
                   b: Real[ArrayLike, "*S H"]) -> np.ndarray:
    """``w_h = E[sum_l A_hl]`` (..., H) at overlaps ``M`` (..., H, F), ``Q`` (..., H, H), ``b`` (..., H)
    (module docstring)."""
    M, Q, b = np.asarray(M, float), np.asarray(Q, float), np.asarray(b, float)
    H, F = M.shape[-2:]
    flat = jnp.asarray(M.reshape(-1, H, F)), jnp.asarray(Q.reshape(-1, H, H)), jnp.asarray(b.reshape(-1, H))
    masses = exported_call("attention_mass", _attention_mass_many, ode, *flat)  # stored: a later process does not trace it
    return np.asarray(masses).reshape(M.shape[:-2] + (H,))


def classifying_weights(setup, M, Q, b) -> np.ndarray:
    """:func:`attention_mass` for the head classes of a run of ``setup`` (:func:`~singleloc.preflight._build.build`),
    whose one use of it is a head ``off`` below 0.05: on the run's route, but a joint layer's exact masses, which
    cost its whole rule at every state (bsoftmax, ``H = 4``: about a second a state), on the Sobol rule at its auto
    points (within 3.5e-8 of the exact ones at tests/test_phase_analysis.py's state)."""
    if setup.route.form is not None and setup.route.form.joint and not setup.route.route_class.field_nodes:
        setup = setup.on_rule_route(auto_points(setup.problem.L, setup.heads, setup.prior))
    return attention_mass(OrderParameterODE.from_setup(setup), M, Q, b)

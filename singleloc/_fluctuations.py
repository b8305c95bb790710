"""Finite-D fluctuations of the order parameters: an SDE around the ODE of MODEL.md section 5.

One SGD step changes the order parameters by ``-(lr / D) u`` (plus the deterministic
``(lr^2 / D) sum_l c_l c_l^T`` in ``Q``), with, for one fresh sequence,

    u = ( sum_l c_l nu_l^T  (H, F),   sum_l (c_l g_l^T + g_l c_l^T)  (H, H),   sum_l c_l  (H) ).

Over ``d tau`` there are ``D d tau`` independent steps, so the state ``y = (M, Q, b)``
(flattened as :func:`singleloc._phases.flatten_state`) follows, to leading order in ``1/D``,

    dy = drift(y) d tau + sqrt(Sigma(y) / D) dW,      Sigma = lr^2 Cov(u):

the per-step update covariance of the order parameters divided by D (per unit time). The
Gram-matrix term of ``Q`` fluctuates at a smaller order and is left in the drift.

``Cov(u)`` is an expectation over the local fields like the drift. ``nu_l`` is never drawn:
given the head fields it is Gaussian with mean ``theta 1[l = 0] + M^T (Q^+)^{1/2} w_l`` and
covariance ``I - M^T Q^+ M``; the mean enters ``u`` and the covariance adds
``E[sum_l c_l c_l^T] (x) (I - M^T Q^+ M)`` to the ``M`` block.

:func:`integrate_sde` integrates the SDE with diffrax (Euler-Maruyama on a
``VirtualBrownianTree``), one Brownian path per key, batched with ``vmap``.
"""

from __future__ import annotations

import dataclasses

import numpy as np


def _jax():
    import jax
    import jax.numpy as jnp

    return jax, jnp


def update_moments(ode, M, Q, b):
    """``(drift, Sigma)`` at ``(M, Q, b)``: the drift over :func:`flatten_state` coordinates
    and ``Sigma = lr^2 Cov(u)`` (n, n), the per-step update covariance times ``D^2`` (so the
    diffusion per unit time is ``Sigma / D``)."""
    jax, jnp = _jax()
    from ._fields import psd_sqrt_and_pinv_sqrt
    from ._phases import flatten_state

    H, F = M.shape
    tb = bool(ode.train_bias)
    Qh, Qh_pinv = psd_sqrt_and_pinv_sqrt(Q)
    A = Qh_pinv @ M  # (H, F): nu_bar_l = theta 1[l=0] + A^T w_l
    iu = jnp.triu_indices(H)

    def integrand(g, theta, w):
        c = jax.grad(ode._loss)(g.T + b[:, None])  # (H, L)
        nu = w @ A
        nu = nu.at[0].add(theta)
        UM = c @ nu
        UQ = c @ g
        UQ = UQ + UQ.T
        parts = [UM.ravel(), UQ[iu]] + ([c.sum(1)] if tb else [])
        u = jnp.concatenate(parts)
        return {"u": u, "uu": jnp.outer(u, u), "cc": c @ c.T}

    m = ode.fields.expect(integrand, M, Q, Qh=Qh, with_noise=True)
    cov = m["uu"] - jnp.outer(m["u"], m["u"])
    xi = jnp.eye(F) - M.T @ (Qh_pinv @ Qh_pinv) @ M  # Cov(nu | g), PSD up to rounding
    n_M = H * F
    cov = cov.at[:n_M, :n_M].add(jnp.kron(m["cc"], xi))
    d = ode.drift(M, Q, b)
    return flatten_state(d.M, d.Q, d.b, tb), ode.lr**2 * cov


def _sqrt_psd(S):
    _, jnp = _jax()
    w, v = jnp.linalg.eigh((S + S.T) / 2)
    return (v * jnp.sqrt(jnp.clip(w, 0.0, None))) @ v.T


@dataclasses.dataclass(frozen=True)
class SDEResult:
    """SDE paths: ``tau`` (T,), ``M`` (S, T, H, F), ``Q`` (S, T, H, H), ``b`` (S, T, H),
    ``risk`` (S, T) (the population risk of each state)."""

    tau: np.ndarray
    M: np.ndarray
    Q: np.ndarray
    b: np.ndarray
    risk: np.ndarray


def integrate_sde(config, y0, keys, *, D=None, ts=None, dt: float = 0.05) -> SDEResult:
    """Integrate the fluctuation SDE from initial states ``y0`` (an ``OrderParameters`` with a
    leading axis S) with one Brownian path per PRNG key (``keys`` (S, 2)), at dimension ``D``
    (default ``config.simulation.D``; a scalar or one value per path), saving at ``ts``
    (default the config's grid).

    Euler-Maruyama with step ``dt`` on a ``diffrax.VirtualBrownianTree`` (tolerance ``dt/4``).
    ``Q`` is symmetrised through the flattened coordinates; the state is not projected back
    onto valid overlaps (at the D used here the noise is far too small to leave them).
    """
    import diffrax
    import equinox as eqx

    jax, jnp = _jax()
    from ._phases import flatten_state, unflatten_state
    from ._theory import OrderParameterODE

    D = config.simulation.D if D is None else D
    ode = OrderParameterODE.from_config(config)
    H, F = config.model.heads, config.problem.F
    tb = bool(ode.train_bias)
    dtype = jnp.result_type(float)
    ts = np.asarray(config.sgd.save_times() if ts is None else ts, float)  # numpy: constants under jit
    t0, t1 = float(ts[0]), float(ts[-1])
    max_steps = int(np.ceil((t1 - t0) / dt)) + 10
    b_fixed = jnp.asarray(y0.b, dtype)
    v0 = jax.vmap(lambda M, Q, b: flatten_state(M, Q, b, tb))(jnp.asarray(y0.M, dtype), jnp.asarray(y0.Q, dtype), b_fixed)
    n = v0.shape[1]

    inv_D = jnp.broadcast_to(1.0 / jnp.asarray(D, dtype), (v0.shape[0],))

    def solve(ode, v0, b0, key, inv_D):
        def split(v):
            return unflatten_state(v, H, F, b0)

        def drift(t, v, args):
            return update_moments(ode, *split(v))[0]

        def diffusion(t, v, args):
            return _sqrt_psd(update_moments(ode, *split(v))[1] * inv_D)

        bm = diffrax.VirtualBrownianTree(t0, t1, tol=dt / 4, shape=(n,), key=key)
        terms = diffrax.MultiTerm(diffrax.ODETerm(drift), diffrax.ControlTerm(diffusion, bm))
        sol = diffrax.diffeqsolve(terms, diffrax.Euler(), t0, t1, dt, v0, saveat=diffrax.SaveAt(ts=jnp.asarray(ts, dtype)), max_steps=max_steps)
        Ms, Qs, bs = jax.vmap(split)(sol.ys)
        bs = bs if tb else jnp.broadcast_to(b0, (len(ts), H))
        risk = jax.vmap(ode.risk)(Ms, Qs, bs)
        return Ms, Qs, bs, risk

    run = eqx.filter_jit(jax.vmap(solve, in_axes=(None, 0, 0, 0, 0)))
    Ms, Qs, bs, risk = jax.device_get(run(ode, v0, b_fixed, jnp.asarray(keys), inv_D))
    return SDEResult(ts, np.asarray(Ms), np.asarray(Qs), np.asarray(bs), np.asarray(risk))

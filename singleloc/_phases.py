"""Phases of the dynamics: plateaus, escapes, head specialization and redundancy, and the
linear stability of the unspecialized fixed point (MODEL.md section 5).

Everything in the first half works on plain arrays, so it applies equally to a theory
trajectory (:class:`~singleloc.TheoryResult`) and to a simulation
(:class:`~singleloc.SimulationResult`): ``tau`` (T,), ``risk`` (T,) or (S, T), ``M``
(..., T, H, F), ``Q`` (..., T, H, H).

Post-processing rules (the numbers are the keyword defaults):

* **Plateaus.** With ``u = log tau`` (saved points with ``tau > 0``), the normalised rate
  ``sigma(u) = |dR/du| / (max R - min R)`` (``np.gradient`` on the saved grid). A plateau is
  a local minimum of ``sigma`` below ``plateau_tol = 0.1`` that is *prominent*: on each side
  ``sigma`` rises to at least ``prominence = 2`` times the minimum before the next local
  minimum (or the end of the curve). The two ends of the curve are plateaus when ``sigma`` is
  below ``plateau_tol`` there (the start ``tau -> 0`` always is, in ``log tau``). A plateau's
  value is the risk at its minimum of ``sigma``.
* **Escape.** The escape time from a plateau is the first ``tau`` after its centre at which
  the risk has fallen halfway from the plateau value to the next plateau's value (the final
  risk after the last plateau), linearly interpolated between saved points.
* **Alignment.** ``cos_hf = M_hf / sqrt(Q_hh)``: the cosine between key ``h`` and spike ``f``
  (both normalised: ``|k*_f|^2 = D``). The profile of head ``h`` is ``u_h = M_h / |M_h|``
  in R^F and its spike fraction ``phi_h = |M_h| / sqrt(Q_hh)``.
* **Specialization.** Head ``h`` is specialized to latent direction ``d_k`` (unit vectors,
  default the spikes ``e_f``) when ``phi_h >= min_fraction = 0.3``,
  ``|u_h . d_k| >= threshold = 0.9`` and ``|u_h . d_k| >= u_h . mu + margin`` (``margin =
  0.05``), where ``mu`` is the unit mean direction ``E[theta] / |E[theta]|`` (the profile of
  the unspecialized phase; the condition is dropped when ``E[theta] = 0``). The specialization
  time of a head is the first saved ``tau`` from which it stays specialized (to any direction)
  up to the end; a change of a head's label after it first specialized is a *rearrangement*.
* **Redundancy.** Heads ``h != h'`` are redundant when their key cosine
  ``Q_hh' / sqrt(Q_hh Q_h'h') > 0.99``. They share a *profile* when their spike parts point the
  same way, ``M_h . M_h' / (|M_h| |M_h'|) > 0.99``, with both spike fractions ``>= 0.3``: the
  keys may still differ off the spikes (``R_orth``), but the heads look for the same signal.
* **Escape from the unspecialized phase** (:attr:`PhaseAnalysis.escape_time`): the escape
  from the last plateau whose centre precedes the first time any head is specialized; NaN if
  no head specializes, or if the risk has no plateau before (the first specialization time,
  :attr:`PhaseAnalysis.first_specialization`, is defined whenever a head specializes).

The second half linearises the ODE. The *symmetric subspace* is the set of states invariant
under permutations of the heads: ``M_h = m`` for every head, ``R_orth = r_d I + r_o 1 1^T``,
``b_h = b_0``. It is invariant under the flow (the quadrature rule is permutation-equivariant),
and contains the unspecialized fixed point, found by integrating the restricted flow and
polishing with a root finder (:func:`unspecialized_point`). :func:`linearize` gives the Jacobian
of :meth:`OrderParameterODE.drift` over the flattened state ``(M, upper triangle of Q, b)``
with ``jax.jacobian``; its eigenvectors that break the head symmetry carry the escape, and the
largest real part among them is the escape rate ``lambda`` (:func:`escape_rate`).

The log D law. The escape direction starts at amplitude ``O(D^{-1/2})`` (the random initial
overlaps) and grows like ``exp(lambda tau)``, so it reaches ``O(1)`` at
``tau_esc = tau_0 + (1 / (2 lambda)) log D``: :func:`predicted_escape_slope`.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

# --------------------------------------------------------------------------------------
# Trajectory analysis (numpy)
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Plateau:
    """A plateau of a risk curve: its centre (the saved time of least slope), its extent
    (first and last saved times with ``sigma < plateau_tol`` around the centre) and value."""

    tau: float
    start: float
    end: float
    risk: float


def _log_slope(tau: np.ndarray, risk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the saved points with ``tau > 0`` and the normalised rate ``sigma`` there."""
    idx = np.flatnonzero(tau > 0)
    r = risk[idx]
    span = float(np.nanmax(risk) - np.nanmin(risk))
    if len(idx) < 3 or not np.isfinite(span) or span <= 0:
        return idx, np.zeros(len(idx))
    return idx, np.abs(np.gradient(r, np.log(tau[idx]))) / span


def plateaus(tau, risk, *, plateau_tol: float = 0.1, prominence: float = 2.0) -> list[Plateau]:
    """Plateaus of one risk curve, in time order (see the module docstring for the rule)."""
    tau, risk = np.asarray(tau, float), np.asarray(risk, float)
    if tau.ndim != 1 or risk.shape != tau.shape:
        raise ValueError(f"plateaus expects tau (T,) and risk (T,), got {tau.shape} and {risk.shape}")
    idx, sigma = _log_slope(tau, risk)
    n = len(sigma)
    if n == 0:
        return []
    if n < 3 or np.all(sigma == 0):
        return [Plateau(float(tau[idx[0]]), float(tau[idx[0]]), float(tau[idx[-1]]), float(risk[idx[-1]]))]
    # candidate centres: interior local minima and the two ends
    cands = [0] + [i for i in range(1, n - 1) if sigma[i] <= sigma[i - 1] and sigma[i] < sigma[i + 1]] + [n - 1]
    centres = []
    for j, i in enumerate(cands):
        if sigma[i] >= plateau_tol:
            continue
        lo = cands[j - 1] if j > 0 else None
        hi = cands[j + 1] if j + 1 < len(cands) else None
        left = sigma[lo : i + 1].max() if lo is not None else np.inf
        right = sigma[i : hi + 1].max() if hi is not None else np.inf
        need = prominence * max(sigma[i], 1e-3 * plateau_tol)
        if left >= need and right >= need:
            centres.append(i)
    out = []
    for i in centres:
        a = i
        while a > 0 and sigma[a - 1] < plateau_tol:
            a -= 1
        b = i
        while b < n - 1 and sigma[b + 1] < plateau_tol:
            b += 1
        out.append(Plateau(float(tau[idx[i]]), float(tau[idx[a]]), float(tau[idx[b]]), float(risk[idx[i]])))
    # merge plateaus whose extents overlap (a flat stretch with a wiggle): keep the flatter
    merged: list[Plateau] = []
    for p in out:
        if merged and p.start <= merged[-1].end:
            continue
        merged.append(p)
    return merged


def halfway_time(tau, risk, after: float, r_from: float, r_to: float) -> float:
    """First ``tau >= after`` at which ``risk`` has moved halfway from ``r_from`` to ``r_to``
    (linear interpolation between saved points); NaN if it never does."""
    tau, risk = np.asarray(tau, float), np.asarray(risk, float)
    target = 0.5 * (r_from + r_to)
    sign = 1.0 if r_to <= r_from else -1.0
    past = sign * (risk - target) <= 0  # True once the risk has crossed the target
    start = int(np.searchsorted(tau, after, side="left"))
    for i in range(max(start, 1), len(tau)):
        if past[i] and not past[i - 1]:
            r0, r1 = risk[i - 1], risk[i]
            w = 0.0 if r1 == r0 else (target - r0) / (r1 - r0)
            return float(tau[i - 1] + w * (tau[i] - tau[i - 1]))
    if start < len(tau) and past[start] and start == 0:
        return float(tau[0])
    return float("nan")


def escape_times(tau, risk, plateau_list: Sequence[Plateau] | None = None, **kwargs) -> np.ndarray:
    """Escape time from every plateau but the last (module docstring): an array of length
    ``len(plateaus) - 1`` if the curve ends on a plateau, else ``len(plateaus)``."""
    tau, risk = np.asarray(tau, float), np.asarray(risk, float)
    ps = plateaus(tau, risk, **kwargs) if plateau_list is None else list(plateau_list)
    out = []
    for k, p in enumerate(ps):
        nxt = ps[k + 1].risk if k + 1 < len(ps) else float(risk[-1])
        if k + 1 == len(ps) and p.end >= tau[-1]:
            break  # the final plateau: nothing to escape to
        out.append(halfway_time(tau, risk, p.tau, p.risk, nxt))
    return np.asarray(out, float)


def head_cosines(Q) -> np.ndarray:
    """``Q_hh' / sqrt(Q_hh Q_h'h')`` (..., H, H)."""
    Q = np.asarray(Q, float)
    d = np.sqrt(np.clip(np.diagonal(Q, axis1=-2, axis2=-1), 1e-300, None))
    return Q / (d[..., :, None] * d[..., None, :])


def alignment(M, Q) -> np.ndarray:
    """``cos_hf = M_hf / sqrt(Q_hh)`` (..., H, F): cosine between key h and spike f."""
    M, Q = np.asarray(M, float), np.asarray(Q, float)
    d = np.sqrt(np.clip(np.diagonal(Q, axis1=-2, axis2=-1), 1e-300, None))
    return M / d[..., :, None]


def specialization(M, Q, *, mean=None, directions=None, threshold: float = 0.9, margin: float = 0.05, min_fraction: float = 0.3) -> np.ndarray:
    """Label of each head (..., H): the index ``k`` of the latent direction it is specialized
    to, or -1 (rule in the module docstring).

    Args:
        M, Q: overlaps (..., H, F) and (..., H, H).
        mean: ``E[theta]`` (F,) of the prior; ``None`` or zero drops the mean condition.
        directions: (K, F) latent directions (normalised here); default the spikes ``e_f``.
    """
    M, Q = np.asarray(M, float), np.asarray(Q, float)
    F = M.shape[-1]
    dirs = np.eye(F) if directions is None else np.atleast_2d(np.asarray(directions, float))
    dirs = dirs / np.linalg.norm(dirs, axis=1, keepdims=True)
    norm = np.linalg.norm(M, axis=-1)
    qd = np.sqrt(np.clip(np.diagonal(Q, axis1=-2, axis2=-1), 1e-300, None))
    frac = norm / qd
    u = M / np.clip(norm, 1e-300, None)[..., None]
    cos = np.abs(u @ dirs.T)  # (..., H, K)
    ok = (cos >= threshold) & (frac >= min_fraction)[..., None]
    if mean is not None and np.linalg.norm(mean) > 1e-12:
        mu = np.asarray(mean, float) / np.linalg.norm(mean)
        ok &= cos >= (u @ mu)[..., None] + margin
    best = np.argmax(np.where(ok, cos, -1.0), axis=-1)
    return np.where(ok.any(axis=-1), best, -1)


def redundant_pairs(Q, threshold: float = 0.99) -> np.ndarray:
    """Number of head pairs ``h < h'`` with key cosine above ``threshold`` (...,)."""
    c = head_cosines(Q)
    H = c.shape[-1]
    iu = np.triu_indices(H, 1)
    return np.sum(c[..., iu[0], iu[1]] > threshold, axis=-1)


def shared_profiles(M, Q, threshold: float = 0.99, min_fraction: float = 0.3) -> np.ndarray:
    """Number of head pairs ``h < h'`` whose spike parts point the same way (...,): cosine of
    ``M_h`` and ``M_h'`` above ``threshold``, both spike fractions ``|M_h| / sqrt(Q_hh)`` at
    least ``min_fraction``."""
    M, Q = np.asarray(M, float), np.asarray(Q, float)
    norm = np.linalg.norm(M, axis=-1)
    frac = norm / np.sqrt(np.clip(np.diagonal(Q, axis1=-2, axis2=-1), 1e-300, None))
    u = M / np.clip(norm, 1e-300, None)[..., None]
    c = u @ np.swapaxes(u, -1, -2)
    ok = (frac >= min_fraction)[..., :, None] & (frac >= min_fraction)[..., None, :]
    H = M.shape[-2]
    iu = np.triu_indices(H, 1)
    return np.sum((c > threshold)[..., iu[0], iu[1]] & ok[..., iu[0], iu[1]], axis=-1)


def specialization_times(tau, labels) -> np.ndarray:
    """First saved ``tau`` from which each head stays specialized to the end (..., H); NaN
    for a head that is not specialized at the end. ``labels`` (..., T, H) from
    :func:`specialization`."""
    tau, labels = np.asarray(tau, float), np.asarray(labels)
    spec = labels >= 0  # (..., T, H)
    # index of the last unspecialized time; the head is specialized from the next one on
    T = spec.shape[-2]
    rev = np.flip(~spec, axis=-2)
    last_off = T - 1 - np.argmax(rev, axis=-2)  # (..., H), valid where any ~spec
    any_off = (~spec).any(axis=-2)
    first_on = np.where(any_off, last_off + 1, 0)
    out = np.where(first_on < T, tau[np.minimum(first_on, T - 1)], np.nan)
    return np.where(spec[..., -1, :], out, np.nan)


def rearrangements(tau, labels) -> list[tuple[float, int, int, int]]:
    """Changes of label of heads that were already specialized: ``(tau, head, old, new)`` for
    one trajectory (``labels`` (T, H))."""
    tau, labels = np.asarray(tau, float), np.asarray(labels)
    events = []
    for h in range(labels.shape[1]):
        seen = False
        for t in range(1, labels.shape[0]):
            seen |= labels[t - 1, h] >= 0
            if seen and labels[t, h] != labels[t - 1, h]:
                events.append((float(tau[t]), h, int(labels[t - 1, h]), int(labels[t, h])))
    return sorted(events)


@dataclasses.dataclass(frozen=True)
class PhaseAnalysis:
    """Phases of ``S`` trajectories on a common time grid (see :func:`analyze`).

    ``tau`` (T,); ``labels`` (S, T, H) specialization labels; ``n_specialized`` (S, T) number
    of specialized heads; ``n_directions`` (S, T) number of distinct directions covered;
    ``redundant`` (S, T) redundant pairs; ``cos`` (S, T, H, F) alignments;
    ``specialization_times`` (S, H); ``plateaus`` (per trajectory, a list of
    :class:`Plateau`); ``escapes`` (per trajectory, the escape times of every plateau);
    ``escape_time`` (S,) the escape from the unspecialized phase; ``first_specialization`` (S,)
    the first saved time at which a head is specialized; ``final_risk`` (S,);
    ``rearrangements`` (per trajectory, a list of ``(tau, head, old, new)``).
    """

    tau: np.ndarray
    labels: np.ndarray
    n_specialized: np.ndarray
    n_directions: np.ndarray
    redundant: np.ndarray
    profiles: np.ndarray
    cos: np.ndarray
    specialization_times: np.ndarray
    plateaus: list
    escapes: list
    escape_time: np.ndarray
    first_specialization: np.ndarray
    final_risk: np.ndarray
    rearrangements: list

    def summary(self, index: int | None = None) -> dict:
        """Scalars for tables: means over trajectories (or one trajectory)."""
        sel = slice(None) if index is None else slice(index, index + 1)

        def nanmean(x):
            return float(np.nanmean(x)) if np.any(np.isfinite(x)) else float("nan")

        return {
            "final_risk": float(np.nanmean(self.final_risk[sel])),
            "n_specialized": float(np.mean(self.n_specialized[sel, -1])),
            "n_directions": float(np.mean(self.n_directions[sel, -1])),
            "redundant_pairs": float(np.mean(self.redundant[sel, -1])),
            "shared_profiles": float(np.mean(self.profiles[sel, -1])),
            "escape_time": nanmean(self.escape_time[sel]),
            "first_specialization": nanmean(self.first_specialization[sel]),
        }


def analyze(tau, M, Q, risk, *, mean=None, directions=None, threshold: float = 0.9, margin: float = 0.05, min_fraction: float = 0.3,
            redundancy: float = 0.99, plateau_tol: float = 0.1, prominence: float = 2.0) -> PhaseAnalysis:
    """Phase analysis of one trajectory (``M`` (T, H, F), ``Q`` (T, H, H), ``risk`` (T,)) or
    of several (a leading axis ``S``); keyword arguments as in the module docstring.

    ``mean`` is ``E[theta]`` (``config.problem.build_prior().mean()``).
    """
    tau = np.asarray(tau, float)
    M, Q, risk = np.asarray(M, float), np.asarray(Q, float), np.asarray(risk, float)
    if M.ndim == 3:
        M, Q, risk = M[None], Q[None], risk[None]
    if M.ndim != 4 or Q.shape[:3] != M.shape[:3] or risk.shape != M.shape[:2] or len(tau) != M.shape[1]:
        raise ValueError(f"analyze expects tau (T,), M (S, T, H, F), Q (S, T, H, H), risk (S, T); got {tau.shape}, {M.shape}, {Q.shape}, {risk.shape}")
    labels = specialization(M, Q, mean=mean, directions=directions, threshold=threshold, margin=margin, min_fraction=min_fraction)
    K = M.shape[-1] if directions is None else np.atleast_2d(directions).shape[0]
    n_dir = np.sum(np.stack([(labels == k).any(axis=-1) for k in range(K)], axis=-1), axis=-1)
    spec_t = specialization_times(tau, labels)
    pls, escs, esc, rearr, first = [], [], [], [], []
    for s in range(M.shape[0]):
        ps = plateaus(tau, risk[s], plateau_tol=plateau_tol, prominence=prominence)
        e = escape_times(tau, risk[s], ps)
        pls.append(ps)
        escs.append(e)
        on = np.flatnonzero((labels[s] >= 0).any(axis=-1))
        t_first = tau[on[0]] if len(on) else np.nan
        first.append(t_first)
        cand = [k for k, p in enumerate(ps) if p.tau < t_first and k < len(e)]
        esc.append(e[cand[-1]] if cand else np.nan)
        rearr.append(rearrangements(tau, labels[s]))
    return PhaseAnalysis(
        tau=tau, labels=labels, n_specialized=np.sum(labels >= 0, axis=-1), n_directions=n_dir,
        redundant=redundant_pairs(Q, redundancy), profiles=shared_profiles(M, Q, redundancy, min_fraction), cos=alignment(M, Q),
        specialization_times=spec_t, plateaus=pls, escapes=escs, escape_time=np.asarray(esc, float),
        first_specialization=np.asarray(first, float), final_risk=risk[:, -1].copy(), rearrangements=rearr,
    )


# --------------------------------------------------------------------------------------
# Linear stability of the unspecialized fixed point (jax)
# --------------------------------------------------------------------------------------


def _jax():
    import jax
    import jax.numpy as jnp

    return jax, jnp


def flatten_state(M, Q, b, train_bias: bool = True):
    """``(M, Q, b)`` -> vector ``[M.ravel(), Q[triu], b]`` (``b`` only when biases train)."""
    _, jnp = _jax()
    H = M.shape[0]
    iu = np.triu_indices(H)
    parts = [M.ravel(), Q[iu]] + ([b] if train_bias else [])
    return jnp.concatenate(parts)


def unflatten_state(v, H: int, F: int, b=None):
    """Inverse of :func:`flatten_state`; ``b`` supplies the biases when they are not in ``v``."""
    _, jnp = _jax()
    iu = np.triu_indices(H)
    nq = len(iu[0])
    M = v[: H * F].reshape(H, F)
    Qu = jnp.zeros((H, H), v.dtype).at[iu].set(v[H * F : H * F + nq])
    Q = Qu + jnp.triu(Qu, 1).T
    bb = v[H * F + nq :] if len(v) > H * F + nq else b
    return M, Q, bb


@dataclasses.dataclass(frozen=True)
class Linearization:
    """The drift linearised at a state: ``jacobian`` (n, n) over ``flatten_state`` coordinates,
    its ``eigenvalues`` (n,) sorted by decreasing real part, the matching ``eigenvectors``
    (n, n) (columns), ``asymmetry`` (n,) the fraction of each eigenvector outside the
    head-symmetric subspace, and the ``method`` used (``"autodiff"`` or ``"finite-difference"``)."""

    jacobian: np.ndarray
    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    asymmetry: np.ndarray
    method: str
    H: int
    F: int
    train_bias: bool

    def mode_M(self, i: int) -> np.ndarray:
        """The ``M`` block (H, F) of eigenvector ``i`` (real part, unit max-norm)."""
        v = np.real(self.eigenvectors[: self.H * self.F, i]).reshape(self.H, self.F)
        return v / max(np.abs(v).max(), 1e-300)


def _symmetric_projection(v: np.ndarray, H: int, F: int, train_bias: bool) -> tuple[np.ndarray, np.ndarray]:
    """(full-matrix representation of v, of its head-symmetric projection), flattened."""
    iu = np.triu_indices(H)
    nq = len(iu[0])
    M = v[: H * F].reshape(H, F)
    Qu = np.zeros((H, H), v.dtype)
    Qu[iu] = v[H * F : H * F + nq]
    Q = Qu + np.triu(Qu, 1).T
    b = v[H * F + nq :] if train_bias else np.zeros(0, v.dtype)
    Ms = np.broadcast_to(M.mean(0), M.shape)
    off = (Q.sum() - np.trace(Q)) / (H * (H - 1)) if H > 1 else 0.0
    dia = np.trace(Q) / H
    Qs = (dia - off) * np.eye(H) + off * np.ones((H, H))
    bs = np.full_like(b, b.mean()) if len(b) else b
    full = np.concatenate([M.ravel(), Q.ravel(), b])
    sym = np.concatenate([Ms.ravel(), Qs.ravel(), bs])
    return full, sym


def _flat_drift(ode, v, b, H: int, F: int):
    Mv, Qv, bv = unflatten_state(v, H, F, b)
    d = ode.drift(Mv, Qv, bv)
    return flatten_state(d.M, d.Q, d.b, bool(ode.train_bias))


def _filter_jit(fn):
    import equinox as eqx

    return eqx.filter_jit(fn)


_FLAT = {}


def _compiled(name: str):
    """Jitted helpers, built once per process (equinox treats the ODE module as an argument,
    so one compilation serves every state of the same shapes)."""
    if name not in _FLAT:
        jax, _ = _jax()
        if name == "drift":
            _FLAT[name] = _filter_jit(_flat_drift)
        elif name == "jacobian":
            _FLAT[name] = _filter_jit(lambda ode, v, b, H, F: jax.jacobian(_flat_drift, argnums=1)(ode, v, b, H, F))
        elif name == "symmetric":
            _FLAT[name] = _filter_jit(lambda ode, x, H, F: symmetric_drift(ode, x, H, F))
        elif name == "risk":
            _FLAT[name] = _filter_jit(lambda ode, M, Q, b: ode.risk(M, Q, b))
    return _FLAT[name]


def drift_jacobian(ode, M, Q, b, *, method: str = "auto", step: float = 1e-6) -> tuple[np.ndarray, str]:
    """Jacobian of ``ode.drift`` over :func:`flatten_state` coordinates at ``(M, Q, b)``.

    ``method="autodiff"``: ``jax.jacobian``. ``"finite-difference"``: central differences with
    relative ``step``. ``"auto"``: autodiff, falling back to differences where autodiff is not
    finite (``jnp.linalg.eigh`` has no derivative at repeated eigenvalues of ``Q``, which is
    the case at symmetric states with ``H >= 3``, or with ``M = 0``).
    """
    _, jnp = _jax()
    M, Q = jnp.asarray(M, dtype=jnp.result_type(float)), jnp.asarray(Q, dtype=jnp.result_type(float))
    b = jnp.asarray(b, dtype=M.dtype)
    H, F = M.shape
    v0 = flatten_state(M, Q, b, bool(ode.train_bias))
    if method in ("auto", "autodiff"):
        J = np.asarray(_compiled("jacobian")(ode, v0, b, H, F))
        if np.all(np.isfinite(J)) or method == "autodiff":
            return J, "autodiff"
    elif method != "finite-difference":
        raise ValueError(f"method must be 'auto', 'autodiff' or 'finite-difference', got {method!r}")
    fj = _compiled("drift")
    cols = []
    for i in range(len(v0)):
        h = step * max(1.0, abs(float(v0[i])))
        e = jnp.zeros_like(v0).at[i].set(h)
        cols.append((np.asarray(fj(ode, v0 + e, b, H, F)) - np.asarray(fj(ode, v0 - e, b, H, F))) / (2 * h))
    return np.stack(cols, axis=1), "finite-difference"


def linearize(ode, M, Q, b, *, method: str = "auto") -> Linearization:
    """Eigen-decomposition of the drift's Jacobian at ``(M, Q, b)`` (:class:`Linearization`)."""
    M, Q, b = np.asarray(M, float), np.asarray(Q, float), np.asarray(b, float)
    H, F = M.shape
    J, used = drift_jacobian(ode, M, Q, b, method=method)
    w, V = np.linalg.eig(J)
    order = np.argsort(-w.real, kind="stable")
    w, V = w[order], V[:, order]
    asym = []
    for i in range(len(w)):
        full_r, sym_r = _symmetric_projection(np.real(V[:, i]), H, F, ode.train_bias)
        full_i, sym_i = _symmetric_projection(np.imag(V[:, i]), H, F, ode.train_bias)
        num = np.linalg.norm(full_r - sym_r) ** 2 + np.linalg.norm(full_i - sym_i) ** 2
        den = np.linalg.norm(full_r) ** 2 + np.linalg.norm(full_i) ** 2
        asym.append(np.sqrt(num / den) if den > 0 else 0.0)
    return Linearization(J, w, V, np.asarray(asym), used, H, F, bool(ode.train_bias))


def orthogonal_fraction(lin: Linearization, mean=None) -> np.ndarray:
    """For each eigenvector, the fraction of its ``M`` block orthogonal to the mean direction
    ``E[theta]`` in R^F (1 for every mode when ``mean`` is None or zero)."""
    n = len(lin.eigenvalues)
    if mean is None or np.linalg.norm(mean) < 1e-12:
        return np.ones(n)
    mu = np.asarray(mean, float) / np.linalg.norm(mean)
    P = np.eye(lin.F) - np.outer(mu, mu)
    out = []
    for i in range(n):
        Mi = lin.eigenvectors[: lin.H * lin.F, i].reshape(lin.H, lin.F)
        tot = np.linalg.norm(Mi)
        out.append(np.linalg.norm(Mi @ P) / tot if tot > 1e-12 else 0.0)
    return np.asarray(out)


def escape_rate(lin: Linearization, *, mean=None, min_asymmetry: float = 0.5, min_orthogonal: float = 0.5) -> float:
    """The escape rate ``lambda``: the largest real part among the eigenvalues whose
    eigenvector breaks the head symmetry (asymmetry fraction above ``min_asymmetry``) and, when
    the prior's ``mean`` is given, whose ``M`` block points mostly away from the mean direction
    (fraction above ``min_orthogonal``): a mode along which the heads leave the unspecialized
    profile. Modes that only split the heads' norms along the mean direction are left out."""
    sel = (lin.asymmetry > min_asymmetry) & (orthogonal_fraction(lin, mean) > min_orthogonal)
    if not np.any(sel):
        return float("nan")
    return float(np.max(lin.eigenvalues.real[sel]))


def escape_mode(lin: Linearization, *, mean=None, min_asymmetry: float = 0.5, min_orthogonal: float = 0.5) -> int:
    """Index of the eigenpair that :func:`escape_rate` selects (-1 if none)."""
    sel = (lin.asymmetry > min_asymmetry) & (orthogonal_fraction(lin, mean) > min_orthogonal)
    if not np.any(sel):
        return -1
    return int(np.flatnonzero(sel)[np.argmax(lin.eigenvalues.real[sel])])


def mode_amplitude(lin: Linearization, index: int, M) -> np.ndarray:
    """Amplitude of overlaps ``M`` (..., H, F) along the ``M`` block of eigenvector ``index``:
    ``|<M, V_M>| / |V_M|``. Applied to the initial overlaps it is the ``O(D^{-1/2})`` seed of
    the escape."""
    V = np.real(lin.eigenvectors[: lin.H * lin.F, index]).reshape(lin.H, lin.F)
    return np.abs(np.einsum("...hf,hf->...", np.asarray(M, float), V)) / np.linalg.norm(V)


def escape_subspace(lin: Linearization, *, mean=None, rtol: float = 0.02, min_asymmetry: float = 0.5, min_orthogonal: float = 0.5) -> np.ndarray:
    """Orthonormal basis (n, H*F) of the ``M`` blocks of the escape modes: every selected
    mode (as in :func:`escape_rate`) whose rate is within ``rtol`` of the escape rate. With a
    symmetric prior the escape is degenerate (one mode per equivalent latent direction)."""
    lam = escape_rate(lin, mean=mean, min_asymmetry=min_asymmetry, min_orthogonal=min_orthogonal)
    if not np.isfinite(lam):
        return np.zeros((0, lin.H * lin.F))
    sel = (lin.asymmetry > min_asymmetry) & (orthogonal_fraction(lin, mean) > min_orthogonal) & (lin.eigenvalues.real >= lam - rtol * abs(lam))
    V = lin.eigenvectors[: lin.H * lin.F, sel]
    B = np.concatenate([V.real, V.imag], axis=1)
    u, sv, _ = np.linalg.svd(B, full_matrices=False)
    return u[:, sv > 1e-8 * sv.max()].T


def subspace_amplitude(basis: np.ndarray, M) -> np.ndarray:
    """Norm of the projection of overlaps ``M`` (..., H, F) on an :func:`escape_subspace`."""
    M = np.asarray(M, float)
    flat = M.reshape(M.shape[:-2] + (-1,))
    return np.linalg.norm(flat @ basis.T, axis=-1)


def linear_escape_time(path_tau, path_rate, amplitude, threshold: float = 0.1) -> np.ndarray:
    """Time at which ``amplitude * exp(int_0^tau rate)`` reaches ``threshold``: the escape of
    the linearised dynamics along a plateau whose escape rate ``path_rate`` (at ``path_tau``,
    e.g. from :func:`escape_rate_along`) drifts (adiabatic approximation). NaN if not reached
    within the path."""
    t, lam = np.asarray(path_tau, float), np.asarray(path_rate, float)
    growth = np.concatenate([[0.0], np.cumsum(0.5 * (lam[1:] + lam[:-1]) * np.diff(t))])
    need = np.log(threshold / np.asarray(amplitude, float))
    out = np.interp(need, growth, t, left=0.0, right=np.nan) if np.all(np.diff(growth) > 0) else np.full(np.shape(need), np.nan)
    return np.where(need <= 0, 0.0, out)


def unstable_modes(lin: Linearization, *, tol: float = 1e-6, min_asymmetry: float = 0.0) -> list[dict]:
    """Unstable eigenpairs (``Re lambda > tol``), decreasing: ``rate``, ``asymmetry``, the ``M``
    block of the eigenvector (H, F) and ``direction``, the spike ``f`` its ``M`` block loads
    most on (largest column norm)."""
    out = []
    for i, lam in enumerate(lin.eigenvalues):
        if lam.real > tol and lin.asymmetry[i] >= min_asymmetry:
            Mi = lin.mode_M(i)
            out.append({"rate": float(lam.real), "imag": float(lam.imag), "asymmetry": float(lin.asymmetry[i]), "M": Mi,
                        "direction": int(np.argmax(np.linalg.norm(Mi, axis=0)))})
    return out


def predicted_escape_slope(rate: float) -> float:
    """``d tau_esc / d log D = 1 / (2 lambda)``: the amplitude ``D^{-1/2} exp(lambda tau)`` of
    the escape direction reaches a fixed size when ``lambda tau = (1/2) log D + const``."""
    return 1.0 / (2.0 * rate)


# -- the symmetric subspace -------------------------------------------------------------


def symmetric_state(x, H: int, F: int):
    """Head-symmetric state from ``x = [m (F), r_d, r_o, b_0]``: ``M_h = m``,
    ``Q = M M^T + r_d I + r_o 1 1^T``, ``b_h = b_0`` (``r_o`` is absent when ``H = 1``)."""
    _, jnp = _jax()
    m = x[:F]
    rd = x[F]
    ro = x[F + 1] if H > 1 else 0.0
    b0 = x[-1]
    M = jnp.broadcast_to(m, (H, F))
    Q = M @ M.T + rd * jnp.eye(H) + ro * jnp.ones((H, H))
    return M, Q, b0 * jnp.ones(H)


def symmetric_coordinates(M, Q, b) -> np.ndarray:
    """Projection of a state onto the symmetric subspace, as ``x`` of :func:`symmetric_state`."""
    M, Q, b = np.asarray(M, float), np.asarray(Q, float), np.asarray(b, float)
    H, F = M.shape
    m = M.mean(0)
    R = Q - M @ M.T
    dia = np.trace(R) / H
    off = (R.sum() - np.trace(R)) / (H * (H - 1)) if H > 1 else 0.0
    x = [*m, dia - off] + ([off] if H > 1 else []) + [b.mean()]
    return np.asarray(x, float)


def symmetric_drift(ode, x, H: int, F: int):
    """The drift restricted to the symmetric subspace, in the coordinates ``x``."""
    _, jnp = _jax()
    M, Q, b = symmetric_state(x, H, F)
    dM, dQ, db = ode.drift(M, Q, b)
    dR = dQ - dM @ M.T - M @ dM.T
    dia = jnp.trace(dR) / H
    parts = [dM.mean(0)]
    if H > 1:
        off = (dR.sum() - jnp.trace(dR)) / (H * (H - 1))
        parts.append(jnp.stack([dia - off, off]))
    else:
        parts.append(jnp.stack([dia]))
    parts.append(jnp.stack([db.mean()]))
    return jnp.concatenate(parts)


@dataclasses.dataclass(frozen=True)
class FixedPoint:
    """The unspecialized fixed point: state ``M`` (H, F), ``Q`` (H, H), ``b`` (H,); symmetric
    coordinates ``x``; ``residual`` = max |drift| there; ``converged``; its ``risk``; and the
    symmetric trajectory ``path_tau``, ``path_x``, ``path_risk`` that led to it."""

    M: np.ndarray
    Q: np.ndarray
    b: np.ndarray
    x: np.ndarray
    residual: float
    converged: bool
    risk: float
    path_tau: np.ndarray
    path_x: np.ndarray
    path_risk: np.ndarray


def symmetric_flow(ode, x0, H: int, F: int, tau_max: float, dt: float = 0.1, n_save: int = 101):
    """Integrate the restricted flow from ``x0`` (RK4, step ``dt``); returns ``(tau, x, risk)``
    at ``n_save`` equally spaced times."""
    jax, jnp = _jax()
    f = lambda x: symmetric_drift(ode, x, H, F)  # noqa: E731
    n_steps = max(int(np.ceil(tau_max / dt)), 1)
    h = tau_max / n_steps
    per = max(n_steps // (n_save - 1), 1)
    n_out = n_steps // per

    def rk4(x, _):
        k1 = f(x)
        k2 = f(x + h / 2 * k1)
        k3 = f(x + h / 2 * k2)
        k4 = f(x + h * k3)
        return x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4), None

    @jax.jit
    def run(x):
        def chunk(x, _):
            x, _ = jax.lax.scan(rk4, x, None, length=per)
            return x, x

        _, xs = jax.lax.scan(chunk, x, None, length=n_out)
        return xs

    x0 = jnp.asarray(x0, dtype=jnp.result_type(float))
    xs = np.concatenate([np.asarray(x0)[None], np.asarray(run(x0))])
    taus = np.arange(len(xs)) * per * h
    risk_fn = jax.jit(jax.vmap(lambda x: ode.risk(*symmetric_state(x, H, F))))
    return taus, xs, np.asarray(risk_fn(jnp.asarray(xs)))


def unspecialized_point(ode, H: int, F: int, x0=None, *, init_scale: float = 0.5, bias_init: float = 0.0, tau_flow: float = 60.0,
                        dt: float = 0.1, polish: bool = True, tol: float = 1e-10) -> FixedPoint:
    """The unspecialized (head-symmetric) fixed point of the ODE.

    Integrates the restricted flow from ``x0`` (default: ``M = 0``, ``R_orth = init_scale^2 I``,
    ``b = bias_init``, the ``D -> infinity`` limit of a random start) for ``tau_flow``, then
    polishes with ``scipy.optimize.root`` over the coordinates the drift depends on (a common
    bias shift is a symmetry of softmax and bsoftmax and is left alone). ``converged`` tells
    whether the residual fell below ``tol``; where the restricted flow creeps (slow modes),
    the polished point can lie far from where the trajectory is at finite times.
    """
    jax, jnp = _jax()
    from scipy import optimize

    if x0 is None:
        x0 = np.asarray([0.0] * F + [init_scale**2] + ([0.0] if H > 1 else []) + [bias_init])
    taus, xs, risks = symmetric_flow(ode, x0, H, F, tau_flow, dt)
    x = xs[-1].copy()
    sd = _compiled("symmetric")
    f = lambda x: sd(ode, x, H, F)  # noqa: E731
    n = len(x)
    if polish:
        # coordinates with a vanishing row and column of the restricted Jacobian are gauge
        eps = 1e-6
        J = np.stack([(np.asarray(f(jnp.asarray(x + eps * e))) - np.asarray(f(jnp.asarray(x - eps * e)))) / (2 * eps) for e in np.eye(n)], 1)
        scale = max(np.abs(J).max(), 1e-300)
        free = [i for i in range(n) if np.abs(J[:, i]).max() > 1e-8 * scale or np.abs(J[i, :]).max() > 1e-8 * scale]

        def g(y):
            z = x.copy()
            z[free] = y
            return np.asarray(f(jnp.asarray(z)))[free]

        sol = optimize.root(g, x[free], method="hybr", options={"xtol": 1e-13})
        cand = x.copy()
        cand[free] = sol.x
        if np.all(np.isfinite(cand)) and np.max(np.abs(np.asarray(f(jnp.asarray(cand))))) < np.max(np.abs(np.asarray(f(jnp.asarray(x))))):
            x = cand
    res = float(np.max(np.abs(np.asarray(f(jnp.asarray(x))))))
    M, Q, b = (np.asarray(a) for a in symmetric_state(jnp.asarray(x), H, F))
    risk = float(_compiled("risk")(ode, jnp.asarray(M), jnp.asarray(Q), jnp.asarray(b)))
    return FixedPoint(M, Q, b, x, res, res < tol, risk, taus, xs, risks)


def escape_rate_along(ode, tau, xs, H: int, F: int, *, mean=None, method: str = "auto") -> np.ndarray:
    """Escape rate (:func:`escape_rate`) of the linearisation at each symmetric state ``xs``
    (from :func:`symmetric_flow`): the instantaneous growth rate of the symmetry-breaking
    direction along a plateau that has not yet reached its fixed point."""
    _, jnp = _jax()
    out = []
    for x in xs:
        M, Q, b = symmetric_state(jnp.asarray(x), H, F)
        out.append(escape_rate(linearize(ode, np.asarray(M), np.asarray(Q), np.asarray(b), method=method), mean=mean))
    return np.asarray(out)

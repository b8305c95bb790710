"""Phases of a trajectory: plateaus, escapes, what each head has learned, redundancy
(docs/model.md section 5; docs/phases.md).

Everything here works on plain NumPy arrays, so it applies equally to a theory trajectory
(:class:`~singleloc.TheoryResult`) and to a simulation (:class:`~singleloc.SimulationResult`):
``tau`` (T,), ``risk`` (T,) or (S, T), ``M`` (..., T, H, F), ``Q`` (..., T, H, H). The linear
stability of the unspecialized fixed point, which predicts the escapes, is in
:mod:`singleloc._stability`.

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
* **Head-spike cosines.** ``cos_hf = M_hf / sqrt(Q_hh)``: the cosine between key ``h`` and
  spike ``f`` (both normalised: ``|k*_f|^2 = D``). The *profile* of head ``h`` is
  ``u_h = M_h / |M_h|`` in R^F and its *spike fraction* ``phi_h = |M_h| / sqrt(Q_hh)``
  (:func:`head_profiles`).
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
* **Head classes** (:func:`classify_heads`, at every saved time). With ``mu`` the unit mean
  direction (none for a zero-mean prior), ``f`` the nearest spike (largest ``|u_hf|``, sign
  ``s``), ``w_h`` the head's attention weight (:func:`singleloc._predictions.head_weights`),
  the first rule that applies:

  1. ``off``: ``w_h < off_fraction = 0.05``: the head puts less than 5% of a full head's weight
     on the sequence, so it contributes less than ``0.05 / H`` to the output weights ``a``
     (a softmax1 head whose bias or scores went to minus infinity; a bsoftmax head outweighed
     by the others). Never without ``weights``; never for softmax (``w_h = 1``).
  2. ``redundant``: key cosine ``>= redundancy = 0.99`` with a lower-index head that is not
     off: a copy of it (its own profile is that head's).
  3. ``unspecialized``: spike fraction ``phi_h < min_fraction = 0.3``, or (``mu`` defined) the
     part of the key in the spike span orthogonal to the mean direction is small,
     ``psi_h = |M_h - (M_h . mu) mu| / sqrt(Q_hh) < mean_tol = 0.1``: the mean-direction
     profile of the plateau (for ``F = 1`` the only spike is the mean direction).
  4. ``aligned``: specialized to a spike (the rule above: ``|cos| >= 0.9``, ``margin`` closer
     than the mean direction).
  5. ``leaning``: ``mu`` defined and ``u_h = alpha mu + beta s e_f + r`` with ``alpha > 0``,
     ``beta > 0`` and ``|r| <= plane_tol = 0.2``: between the mean direction and one spike (the
     softmax heads of the default problem end at ``M_h ~ (2.04, 1.14)``: 29 degrees from
     ``e_1``, 16 from the mean).
  6. ``combination``: any other spike profile: a combination of spikes that is neither the
     mean, nor one spike, nor between them (``e_1 - e_2`` under the spikes prior; ``e_1 +
     e_2`` under a zero-mean prior such as ``flipped``).

  ``aligned``, ``leaning`` and ``combination`` are the *learned* classes. The angles of the
  profile to the nearest spike and to the mean are reported for every head.
* **Escape from the unspecialized phase.** A trajectory has *escaped* when a head is in a
  learned class at its last saved time; :attr:`PhaseAnalysis.first_learned` is the first
  saved time from which some head stays learned to the end (NaN if none),
  :attr:`PhaseAnalysis.first_specialization` the first saved time at which some head is
  aligned, and :attr:`PhaseAnalysis.escape_time` the halfway time from the last plateau whose centre
  precedes it to the next plateau's value (the final risk after the last plateau, also when
  that plateau's extent runs to the end: a drop too small for the rate criterion, as for late
  softmax heads); NaN if the risk has no plateau before.

Norms are floored at :data:`singleloc._numerics.TINY` before a division: a zero key has cosine
0 with everything, and a head with ``M_h = 0`` has spike fraction 0 (never specialized).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ._numerics import TINY

# -- plateaus and escapes -------------------------------------------------------------------


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


# -- what each head looks at ----------------------------------------------------------------


def _key_norms(Q: np.ndarray) -> np.ndarray:
    """``sqrt(Q_hh)`` (..., H), floored at ``sqrt(TINY)``."""
    return np.sqrt(np.clip(np.diagonal(Q, axis1=-2, axis2=-1), TINY, None))


def head_cosines(Q) -> np.ndarray:
    """Key-key cosines ``Q_hh' / sqrt(Q_hh Q_h'h')`` (..., H, H)."""
    Q = np.asarray(Q, float)
    d = _key_norms(Q)
    return Q / (d[..., :, None] * d[..., None, :])


def head_spike_cosines(M, Q) -> np.ndarray:
    """``cos_hf = M_hf / sqrt(Q_hh)`` (..., H, F): cosine between key ``h`` and spike ``f``."""
    M, Q = np.asarray(M, float), np.asarray(Q, float)
    return M / _key_norms(Q)[..., :, None]


def head_profiles(M, Q) -> tuple[np.ndarray, np.ndarray]:
    """``(u, phi)``: each head's profile ``u_h = M_h / |M_h|`` (..., H, F), the unit direction
    of its spike part in R^F (zero when ``M_h = 0``), and its spike fraction
    ``phi_h = |M_h| / sqrt(Q_hh)`` (..., H), the part of the key that lies in the spike span."""
    M, Q = np.asarray(M, float), np.asarray(Q, float)
    norm = np.linalg.norm(M, axis=-1)
    return M / np.clip(norm, TINY, None)[..., None], norm / _key_norms(Q)


def specialization(M, Q, *, mean=None, directions=None, threshold: float = 0.9, margin: float = 0.05,
                   min_fraction: float = 0.3) -> np.ndarray:
    """Label of each head (..., H): the index ``k`` of the latent direction it is specialized
    to, or -1 (rule in the module docstring).

    Args:
        M: overlaps (..., H, F).
        Q: overlaps (..., H, H).
        mean: ``E[theta]`` (F,) of the prior; ``None`` or zero drops the mean condition.
        directions: (K, F) latent directions (normalised here); default the spikes ``e_f``.
    """
    u, frac = head_profiles(M, Q)
    F = u.shape[-1]
    dirs = np.eye(F) if directions is None else np.atleast_2d(np.asarray(directions, float))
    dirs = dirs / np.linalg.norm(dirs, axis=1, keepdims=True)
    cos = np.abs(u @ dirs.T)  # (..., H, K)
    ok = (cos >= threshold) & (frac >= min_fraction)[..., None]
    if mean is not None and np.linalg.norm(mean) > 1e-12:
        mu = np.asarray(mean, float) / np.linalg.norm(mean)
        ok &= cos >= (u @ mu)[..., None] + margin
    best = np.argmax(np.where(ok, cos, -1.0), axis=-1)
    return np.where(ok.any(axis=-1), best, -1)


#: The head classes of :func:`classify_heads`, in the order of their integer codes.
HEAD_CLASSES = ("unspecialized", "aligned", "leaning", "combination", "redundant", "off")

#: The classes of a head that has left the unspecialized profile.
LEARNED_CLASSES = ("aligned", "leaning", "combination")


@dataclasses.dataclass(frozen=True)
class HeadClasses:
    """What each head has learned (:func:`classify_heads`): ``code`` (..., H), an index into
    :data:`HEAD_CLASSES`; ``spike`` (..., H) the nearest spike ``f`` (largest ``|u_hf|``);
    ``angle_spike`` (..., H) the angle in degrees between the profile ``u_h`` and ``+-e_f``;
    ``angle_mean`` (..., H) between ``u_h`` and the mean direction (NaN for a zero-mean prior);
    both angles NaN where ``M_h = 0``."""

    code: np.ndarray
    spike: np.ndarray
    angle_spike: np.ndarray
    angle_mean: np.ndarray

    def names(self) -> np.ndarray:
        """The class names (..., H)."""
        return np.asarray(HEAD_CLASSES)[self.code]

    def counts(self) -> dict[str, np.ndarray]:
        """Number of heads in each class (...,), by name."""
        return {name: np.sum(self.code == k, axis=-1) for k, name in enumerate(HEAD_CLASSES)}

    def learned(self) -> np.ndarray:
        """Whether each head is in a learned class (..., H)."""
        return np.isin(self.code, [HEAD_CLASSES.index(c) for c in LEARNED_CLASSES])


def classify_heads(M, Q, *, mean=None, weights=None, threshold: float = 0.9, margin: float = 0.05, min_fraction: float = 0.3,
                   mean_tol: float = 0.1, plane_tol: float = 0.2, redundancy: float = 0.99,
                   off_fraction: float = 0.05) -> HeadClasses:
    """The class of every head (rules and defaults in the module docstring).

    Args:
        M: overlaps (..., H, F).
        Q: overlaps (..., H, H).
        mean: ``E[theta]`` (F,); ``None`` or zero for a zero-mean prior (no mean direction:
            no ``leaning`` class, and ``unspecialized`` only by the spike fraction).
        weights: ``w_h = E[sum_l A_hl]`` (..., H) from :func:`singleloc._predictions.head_weights`;
            ``None``: no head is ``off``.
    """
    M, Q = np.asarray(M, float), np.asarray(Q, float)
    u, phi = head_profiles(M, Q)
    F = u.shape[-1]
    has_mean = mean is not None and np.linalg.norm(mean) > 1e-12
    mu = np.asarray(mean, float) / np.linalg.norm(mean) if has_mean else np.zeros(F)
    nonzero = np.linalg.norm(M, axis=-1) > 0
    f = np.argmax(np.abs(u), axis=-1)
    uf = np.take_along_axis(u, f[..., None], axis=-1)[..., 0]  # s |u_f| with s = sign(u_f)
    angle_spike = np.where(nonzero, np.degrees(np.arccos(np.clip(np.abs(uf), 0.0, 1.0))), np.nan)
    c_mean = u @ mu
    angle_mean = np.where(nonzero & has_mean, np.degrees(np.arccos(np.clip(c_mean, -1.0, 1.0))), np.nan)
    # leaning: u = alpha mu + beta s e_f + r (least squares on the two unit vectors)
    s = np.where(uf >= 0, 1.0, -1.0)
    c = s * mu[f]  # cosine between mu and s e_f
    det = 1.0 - c**2
    safe = np.where(det > 1e-9, det, 1.0)
    alpha = (c_mean - c * np.abs(uf)) / safe
    beta = (np.abs(uf) - c * c_mean) / safe
    resid = np.linalg.norm(u - alpha[..., None] * mu - (beta * s)[..., None] * np.eye(F)[f], axis=-1)
    leaning = has_mean & (det > 1e-9) & (alpha > 0) & (beta > 0) & (resid <= plane_tol)
    # unspecialized: no spike part, or no part away from the mean direction
    psi = phi * np.sqrt(np.clip(1.0 - c_mean**2, 0.0, None)) if has_mean else phi
    unspecialized = (phi < min_fraction) | (psi < mean_tol)
    aligned = specialization(M, Q, mean=mean, threshold=threshold, margin=margin, min_fraction=min_fraction) >= 0
    code = np.select([unspecialized, aligned, leaning], [0, 1, 2], default=3)
    off = np.zeros(code.shape, bool) if weights is None else np.asarray(weights, float) < off_fraction
    cos = head_cosines(Q)
    H = code.shape[-1]
    redundant = np.zeros(code.shape, bool)
    for h in range(1, H):
        redundant[..., h] = np.any((cos[..., :h, h] >= redundancy) & ~off[..., :h], axis=-1)
    code = np.where(off, HEAD_CLASSES.index("off"), np.where(redundant, HEAD_CLASSES.index("redundant"), code))
    return HeadClasses(code.astype(np.int8), f, angle_spike, angle_mean)


def _count_pairs(pair_mask: np.ndarray) -> np.ndarray:
    """Number of pairs ``h < h'`` where a (..., H, H) mask is true (...,)."""
    iu = np.triu_indices(pair_mask.shape[-1], 1)
    return np.sum(pair_mask[..., iu[0], iu[1]], axis=-1)


def redundant_pairs(Q, threshold: float = 0.99) -> np.ndarray:
    """Number of head pairs ``h < h'`` with key cosine above ``threshold`` (...,)."""
    return _count_pairs(head_cosines(Q) > threshold)


def shared_profiles(M, Q, threshold: float = 0.99, min_fraction: float = 0.3) -> np.ndarray:
    """Number of head pairs ``h < h'`` whose spike parts point the same way (...,): cosine of
    ``M_h`` and ``M_h'`` above ``threshold``, both spike fractions ``|M_h| / sqrt(Q_hh)`` at
    least ``min_fraction``."""
    u, frac = head_profiles(M, Q)
    big = frac >= min_fraction
    return _count_pairs((u @ np.swapaxes(u, -1, -2) > threshold) & big[..., :, None] & big[..., None, :])


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


# -- the analysis of a batch of trajectories ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PhaseAnalysis:
    """Phases of ``S`` trajectories on a common time grid (see :func:`analyze`).

    ``tau`` (T,); ``classes`` (:class:`HeadClasses` over (S, T, H)) what each head has
    learned; ``escaped`` (S,) whether a head is in a learned class at the end; ``labels``
    (S, T, H) the spike (latent direction) each head is aligned to, or -1;
    ``n_specialized`` (S, T) number of aligned heads (labels >= 0, copies included);
    ``n_directions`` (S, T) number of distinct directions they cover;
    ``redundant`` (S, T) redundant pairs; ``profiles`` (S, T) pairs with a shared profile;
    ``cos`` (S, T, H, F) head-spike cosines (:func:`head_spike_cosines`);
    ``specialization_times`` (S, H) from which each head stays aligned; ``plateaus`` (per
    trajectory, a list of :class:`Plateau`); ``escapes`` (per trajectory, the escape times of
    every plateau); ``escape_time`` (S,) the escape from the unspecialized phase;
    ``first_learned`` (S,) the first saved time from which a head stays in a learned class;
    ``first_specialization`` (S,) the first saved time at which a head is aligned;
    ``final_risk`` (S,); ``rearrangements`` (per trajectory, a list of ``(tau, head,
    old, new)`` changes of the aligned direction).
    """

    tau: np.ndarray
    classes: HeadClasses
    escaped: np.ndarray
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
    first_learned: np.ndarray
    first_specialization: np.ndarray
    final_risk: np.ndarray
    rearrangements: list

    def summary(self, index: int | None = None) -> dict:
        """Scalars for tables: means over trajectories (or one trajectory) at the last saved
        time: ``final_risk``, ``escaped`` (fraction of trajectories), ``escape_time``,
        ``first_learned``, ``first_specialization``, ``n_<class>`` for every class of :data:`HEAD_CLASSES`,
        ``leaning_angle_spike`` and ``leaning_angle_mean`` (mean angles of the leaning heads,
        in degrees; NaN if none), ``n_directions`` and ``shared_profiles``."""
        sel = slice(None) if index is None else slice(index, index + 1)

        def nanmean(x):
            return float(np.nanmean(x)) if np.any(np.isfinite(x)) else float("nan")

        code = self.classes.code[sel, -1]
        lean = code == HEAD_CLASSES.index("leaning")
        out = {
            "final_risk": float(np.nanmean(self.final_risk[sel])),
            "escaped": float(np.mean(self.escaped[sel])),
            "escape_time": nanmean(self.escape_time[sel]),
            "first_learned": nanmean(self.first_learned[sel]),
            "first_specialization": nanmean(self.first_specialization[sel]),
        }
        out.update({f"n_{name}": float(np.mean(code == k, axis=0).sum()) for k, name in enumerate(HEAD_CLASSES)})
        out["leaning_angle_spike"] = nanmean(np.where(lean, self.classes.angle_spike[sel, -1], np.nan))
        out["leaning_angle_mean"] = nanmean(np.where(lean, self.classes.angle_mean[sel, -1], np.nan))
        out["n_directions"] = float(np.mean(self.n_directions[sel, -1]))
        out["shared_profiles"] = float(np.mean(self.profiles[sel, -1]))
        return out


def analyze(tau, M, Q, risk, *, mean=None, weights=None, directions=None, threshold: float = 0.9, margin: float = 0.05,
            min_fraction: float = 0.3, mean_tol: float = 0.1, plane_tol: float = 0.2, redundancy: float = 0.99,
            off_fraction: float = 0.05, plateau_tol: float = 0.1, prominence: float = 2.0) -> PhaseAnalysis:
    """Phase analysis of one trajectory (``M`` (T, H, F), ``Q`` (T, H, H), ``risk`` (T,)) or
    of several (a leading axis ``S``); keyword arguments as in the module docstring.

    ``mean`` is ``E[theta]`` (``config.problem.build_prior().mean()``); ``weights`` (S, T, H)
    or (T, H) the heads' attention weights (:func:`singleloc._predictions.head_weights`),
    without which no head is classified ``off``; ``directions`` the latent directions of the
    ``labels`` (default the spikes).
    """
    tau = np.asarray(tau, float)
    M, Q, risk = np.asarray(M, float), np.asarray(Q, float), np.asarray(risk, float)
    if M.ndim == 3:
        M, Q, risk = M[None], Q[None], risk[None]
        weights = None if weights is None else np.asarray(weights, float)[None]
    if M.ndim != 4 or Q.shape[:3] != M.shape[:3] or risk.shape != M.shape[:2] or len(tau) != M.shape[1]:
        raise ValueError("analyze expects tau (T,), M (S, T, H, F), Q (S, T, H, H), risk (S, T); "
                         f"got {tau.shape}, {M.shape}, {Q.shape}, {risk.shape}")
    if weights is not None and np.shape(weights) != M.shape[:3]:
        raise ValueError(f"analyze expects weights of shape {M.shape[:3]} (S, T, H), got {np.shape(weights)}")
    labels = specialization(M, Q, mean=mean, directions=directions, threshold=threshold, margin=margin, min_fraction=min_fraction)
    classes = classify_heads(M, Q, mean=mean, weights=weights, threshold=threshold, margin=margin, min_fraction=min_fraction,
                             mean_tol=mean_tol, plane_tol=plane_tol, redundancy=redundancy, off_fraction=off_fraction)
    learned = classes.learned().any(axis=-1)  # (S, T)
    K = M.shape[-1] if directions is None else np.atleast_2d(directions).shape[0]
    n_dir = np.sum(np.stack([(labels == k).any(axis=-1) for k in range(K)], axis=-1), axis=-1)
    pls, escs, esc, rearr, first, first_aligned = [], [], [], [], [], []
    for s in range(M.shape[0]):
        ps = plateaus(tau, risk[s], plateau_tol=plateau_tol, prominence=prominence)
        e = escape_times(tau, risk[s], ps)
        pls.append(ps)
        escs.append(e)
        # first saved time from which some head stays learned to the end
        off = np.flatnonzero(~learned[s])
        start = 0 if len(off) == 0 else off[-1] + 1
        t_first = tau[start] if start < len(tau) else np.nan
        first.append(t_first)
        on = np.flatnonzero((labels[s] >= 0).any(axis=-1))
        first_aligned.append(tau[on[0]] if len(on) else np.nan)
        # the escape from the last plateau before it, also when that plateau runs to the end of
        # the curve (a drop too small for the rate criterion, as for late softmax heads)
        cand = [k for k, p in enumerate(ps) if p.tau < t_first]
        k = cand[-1] if cand else -1
        esc.append(np.nan if k < 0 else halfway_time(tau, risk[s], ps[k].tau, ps[k].risk,
                                                     ps[k + 1].risk if k + 1 < len(ps) else risk[s, -1]))
        rearr.append(rearrangements(tau, labels[s]))
    return PhaseAnalysis(
        tau=tau, classes=classes, escaped=learned[:, -1].copy(), labels=labels, n_specialized=np.sum(labels >= 0, axis=-1),
        n_directions=n_dir,
        redundant=redundant_pairs(Q, redundancy), profiles=shared_profiles(M, Q, redundancy, min_fraction),
        cos=head_spike_cosines(M, Q), specialization_times=specialization_times(tau, labels), plateaus=pls, escapes=escs,
        escape_time=np.asarray(esc, float), first_learned=np.asarray(first, float),
        first_specialization=np.asarray(first_aligned, float), final_risk=risk[:, -1].copy(),
        rearrangements=rearr,
    )

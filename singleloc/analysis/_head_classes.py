"""What each head has learned: head-spike cosines, profiles, specialization, redundancy and the
head classes (docs/model.md section 5; docs/phases.md).

Plain NumPy arrays ``M`` (..., H, F) and ``Q`` (..., H, H), from a theory trajectory or a
simulation (a time axis ``T`` before ``H`` for :func:`specialization_times` and
:func:`rearrangements`). The rules (the numbers are the keyword defaults):

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
  ``s``), ``w_h`` the head's attention weight (:func:`singleloc.attention_mass`),
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

Norms are floored at :data:`singleloc.runtime._numerics.TINY` before a division: a zero key has cosine
0 with everything, and a head with ``M_h = 0`` has spike fraction 0 (never specialized).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
from jaxtyping import ArrayLike, Real

from ..ground._arguments import require_finite
from ..runtime._numerics import TINY


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
    return np.where(ok.any(axis=-1), np.argmax(np.where(ok, cos, -1.0), axis=-1), -1)


#: The head classes of :func:`classify_heads`, in the order of their integer codes.
HEAD_CLASSES = ("unspecialized", "aligned", "leaning", "combination", "redundant", "off")

#: The classes of a head that has left the unspecialized profile.
LEARNED_CLASSES = ("aligned", "leaning", "combination")

#: Every class of :data:`HEAD_CLASSES` with its one-letter abbreviation, in the order in which
#: tables and figures list them (the learned classes first).
CLASS_LETTERS = {"aligned": "A", "leaning": "L", "combination": "C", "redundant": "R", "off": "O", "unspecialized": "U"}


def class_counts_text(counts) -> str:
    """``"1.5A 0.5L"``: the count ``counts[name]`` of every class present (count > 0), abbreviated
    (:data:`CLASS_LETTERS`) and in that order; empty when no class is present."""
    return " ".join(f"{v:g}{letter}" for name, letter in CLASS_LETTERS.items() if (v := counts[name]) > 0)


@dataclasses.dataclass(frozen=True)
class HeadClasses:
    """What each head has learned (:func:`classify_heads`): ``code`` (..., H), an index into :data:`HEAD_CLASSES`;
    ``spike`` (..., H) the nearest spike ``f`` (largest ``|u_hf|``); ``angle_spike`` (..., H) the angle in degrees
    between the profile ``u_h`` and ``+-e_f``; ``angle_mean`` (..., H) between ``u_h`` and the mean direction (NaN
    for a zero-mean prior); both angles NaN where ``M_h = 0``."""

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


def classify_heads(M: Real[ArrayLike, "*S H F"], Q: Real[ArrayLike, "*S H H"], *, mean: Real[ArrayLike, " F"] | None = None,
                   weights: Real[ArrayLike, "*S H"] | None = None, threshold: float = 0.9, margin: float = 0.05,
                   min_fraction: float = 0.3, mean_tol: float = 0.1, plane_tol: float = 0.2, redundancy: float = 0.99,
                   off_fraction: float = 0.05) -> HeadClasses:
    """The class of every head (rules and defaults in the module docstring).

    Args:
        M: overlaps (..., H, F).
        Q: overlaps (..., H, H).
        mean: ``E[theta]`` (F,); ``None`` or zero for a zero-mean prior (no mean direction:
            no ``leaning`` class, and ``unspecialized`` only by the spike fraction).
        weights: ``w_h = E[sum_l A_hl]`` (..., H) from :func:`singleloc.attention_mass`;
            ``None``: no head is ``off``.
    """
    require_finite("classify_heads", M=M, Q=Q, mean=mean, weights=weights)  # NaN overlaps have no class
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
    redundant = np.zeros(code.shape, bool)
    for h in range(1, code.shape[-1]):
        redundant[..., h] = np.any((cos[..., :h, h] >= redundancy) & ~off[..., :h], axis=-1)
    code = np.where(off, HEAD_CLASSES.index("off"), np.where(redundant, HEAD_CLASSES.index("redundant"), code))
    return HeadClasses(code.astype(np.int8), f, angle_spike, angle_mean)


def head_outcomes(classes: HeadClasses) -> list[str]:
    """What the heads of each trajectory have learned, in words, from their classes at one time (S, H): how many
    heads are on each spike (aligned to it, or a copy of one that is: ``redundant`` within the aligned angle), then
    how many are in each other class: ``"2 on e1, 2 on e2"``, ``"2 on e1, 1 on e2, 1 unspecialized"``."""
    aligned = np.degrees(np.arccos(0.9))  # the aligned class's threshold on |cos|, as an angle
    words = []
    for code, spike, angle in zip(*(np.atleast_2d(x) for x in (classes.code, classes.spike, classes.angle_spike))):
        names = [HEAD_CLASSES[c] for c in code]
        on = [n == "aligned" or (n == "redundant" and a <= aligned) for n, a in zip(names, angle)]
        parts = Counter(f"on e{f + 1}" if o else n for n, f, o in zip(names, spike, on))
        words.append(", ".join(f"{k} {p}" for p, k in sorted(parts.items(), key=lambda x: (not x[0].startswith("on"), x[0]))))
    return words


def outcomes_text(outcomes: list[str], unit: str) -> str:
    """How many trajectories end with each outcome of :func:`head_outcomes`, the most common first:
    ``"3 of 4 starts: 2 on e1, 2 on e2; 1 of 4: 2 on e1, 1 on e2, 1 off"``."""
    n = len(outcomes)
    return "; ".join(f"{c} of {n}{f' {unit}' if i == 0 else ''}: {o}" for i, (o, c) in enumerate(Counter(outcomes).most_common()))


def final_outcomes(setup, *results, units: tuple[str, ...] | None = None) -> list[list[str]] | list[str]:
    """:func:`head_outcomes` of every trajectory of each of ``results`` (theory, simulation: ``M`` (S, T, H, F),
    ``Q``, ``b``) at its last saved time, classed with the heads' attention weights on ``setup``'s route
    (:func:`~singleloc.attention_mass`), so that a head switching off counts; with ``units``
    (``("starts", "seeds")``), each result's :func:`outcomes_text` instead."""
    from ..theory._theory import OrderParameterODE
    from ._attention_mass import attention_mass

    last = [tuple(np.asarray(getattr(r, k), float)[:, -1] for k in ("M", "Q", "b")) for r in results]
    M, Q, b = (np.concatenate(x) for x in zip(*last))
    weights = attention_mass(OrderParameterODE.from_setup(setup), M, Q, b)
    words = head_outcomes(classify_heads(M, Q, mean=setup.prior.mean(), weights=weights))
    ends = np.cumsum([0, *(x[0].shape[0] for x in last)])
    each = [words[i:j] for i, j in zip(ends[:-1], ends[1:])]
    return each if units is None else [outcomes_text(w, unit) for w, unit in zip(each, units)]


def _count_pairs(pair_mask: np.ndarray) -> np.ndarray:
    """Number of pairs ``h < h'`` where a (..., H, H) mask is true (...,)."""
    iu = np.triu_indices(pair_mask.shape[-1], 1)
    return np.sum(pair_mask[..., iu[0], iu[1]], axis=-1)


def redundant_pairs(Q, threshold: float = 0.99) -> np.ndarray:
    """Number of head pairs ``h < h'`` with key cosine above ``threshold`` (...,)."""
    return _count_pairs(head_cosines(Q) > threshold)


def shared_profiles(M, Q, threshold: float = 0.99, min_fraction: float = 0.3) -> np.ndarray:
    """Number of head pairs ``h < h'`` whose spike parts point the same way (...,): cosine of ``M_h`` and ``M_h'``
    above ``threshold``, both spike fractions ``|M_h| / sqrt(Q_hh)`` at least ``min_fraction``."""
    u, frac = head_profiles(M, Q)
    big = frac >= min_fraction
    return _count_pairs((u @ np.swapaxes(u, -1, -2) > threshold) & big[..., :, None] & big[..., None, :])


def specialization_times(tau, labels) -> np.ndarray:
    """First saved ``tau`` from which each head stays specialized to the end (..., H); NaN for a head that is not
    specialized at the end. ``labels`` (..., T, H) from :func:`specialization`."""
    tau, spec = np.asarray(tau, float), np.asarray(labels) >= 0  # (..., T, H)
    T = spec.shape[-2]
    # the saved time after the last unspecialized one (the first when there is none)
    first_on = np.where((~spec).any(axis=-2), T - np.argmax(np.flip(~spec, axis=-2), axis=-2), 0)
    return np.where(spec[..., -1, :], tau[np.minimum(first_on, T - 1)], np.nan)


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

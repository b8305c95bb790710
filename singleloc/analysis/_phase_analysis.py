"""Phases of a trajectory: plateaus, escapes, what each head has learned, redundancy
(docs/model.md section 5; docs/phases.md).

Plain NumPy arrays, from a theory trajectory or a simulation alike: ``tau`` (T,), ``risk`` (T,) or (S, T), ``M``
(..., T, H, F), ``Q`` (..., T, H, H). :func:`analyze` reads the plateaus and escapes of the risk curve
(:mod:`singleloc.analysis._plateaus`) and what each head has learned (:mod:`singleloc.analysis._head_classes`) at every
saved time, by the rules stated there. One rule is its own:

* **Escape from the unspecialized phase.** A trajectory has *escaped* when a head is in a learned class at its last
  saved time; :attr:`PhaseAnalysis.first_learned` is the first saved time from which some head stays learned to the
  end (NaN if none), :attr:`PhaseAnalysis.first_specialization` the first saved time at which some head is aligned,
  and :attr:`PhaseAnalysis.escape_time` the halfway time from the last plateau whose centre precedes it to the next
  plateau's value (the final risk after the last plateau, also when that plateau's extent runs to the end: a drop
  too small for the rate criterion, as for late softmax heads); NaN if the risk has no plateau before.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jaxtyping import ArrayLike, Real

from ._head_classes import (
    HEAD_CLASSES,
    HeadClasses,
    classify_heads,
    head_spike_cosines,
    rearrangements,
    redundant_pairs,
    shared_profiles,
    specialization,
    specialization_times,
)
from ._plateaus import escape_times, halfway_time, plateaus
from ._settled import Settledness, settledness


@dataclasses.dataclass(frozen=True)
class PhaseAnalysis:
    """Phases of ``S`` trajectories on a common time grid (see :func:`analyze`).

    ``tau`` (T,); ``classes`` (:class:`HeadClasses` over (S, T, H)) what each head has learned; ``escaped`` (S,)
    whether a head is in a learned class at the end; ``labels`` (S, T, H) the spike (latent direction) each head is
    aligned to, or -1; ``n_specialized`` (S, T) number of aligned heads (labels >= 0, copies included);
    ``n_directions`` (S, T) number of distinct directions they cover; ``redundant`` (S, T) redundant pairs;
    ``profiles`` (S, T) pairs with a shared profile; ``cos`` (S, T, H, F) head-spike cosines
    (:func:`~singleloc.analysis._head_classes.head_spike_cosines`); ``specialization_times`` (S, H) from which each
    head stays aligned; ``plateaus`` (per trajectory, a list of :class:`Plateau`); ``escapes`` (per trajectory, the
    escape times of every plateau); ``escape_time``, ``first_learned``, ``first_specialization`` (S,) (module
    docstring); ``final_risk`` (S,); ``rearrangements`` (per trajectory, a list of ``(tau, head, old, new)``
    changes of the aligned direction); ``settled`` whether each trajectory has settled at its last saved time
    (:mod:`singleloc.analysis._settled`).
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
    settled: Settledness

    def summary(self, index: int | None = None) -> dict:
        """Scalars for tables: means over trajectories (or one trajectory) at the last saved time: ``final_risk``,
        ``escaped`` (fraction of trajectories), ``escape_time``, ``first_learned``, ``first_specialization``,
        ``n_<class>`` for every class of :data:`HEAD_CLASSES`, ``leaning_angle_spike`` and ``leaning_angle_mean``
        (mean angles of the leaning heads, in degrees; NaN if none), ``n_directions``, ``shared_profiles``,
        ``settled`` (fraction of the trajectories settled, :mod:`singleloc.analysis._settled`) and ``risk_change``
        (the largest relative change of their risks over the criterion's window)."""
        sel = slice(None) if index is None else slice(index, index + 1)

        def nanmean(x):
            return float(np.nanmean(x)) if np.any(np.isfinite(x)) else float("nan")

        code = self.classes.code[sel, -1]
        lean = code == HEAD_CLASSES.index("leaning")
        return {"final_risk": float(np.nanmean(self.final_risk[sel])), "escaped": float(np.mean(self.escaped[sel])),
                **{key: nanmean(getattr(self, key)[sel]) for key in ("escape_time", "first_learned", "first_specialization")},
                **{f"n_{name}": float(np.mean(code == k, axis=0).sum()) for k, name in enumerate(HEAD_CLASSES)},
                "leaning_angle_spike": nanmean(np.where(lean, self.classes.angle_spike[sel, -1], np.nan)),
                "leaning_angle_mean": nanmean(np.where(lean, self.classes.angle_mean[sel, -1], np.nan)),
                "n_directions": float(np.mean(self.n_directions[sel, -1])),
                "shared_profiles": float(np.mean(self.profiles[sel, -1])),
                "settled": float(np.mean(self.settled.settled[sel])), "risk_change": float(np.max(self.settled.risk_change[sel]))}


def analyze(tau: Real[ArrayLike, " T"], M: Real[ArrayLike, "*S T H F"], Q: Real[ArrayLike, "*S T H H"],
            risk: Real[ArrayLike, "*S T"], *, mean: Real[ArrayLike, " F"] | None = None,
            weights: Real[ArrayLike, "*S T H"] | None = None, directions: Real[ArrayLike, "..."] | None = None,
            threshold: float = 0.9, margin: float = 0.05, min_fraction: float = 0.3, mean_tol: float = 0.1,
            plane_tol: float = 0.2, redundancy: float = 0.99, off_fraction: float = 0.05, plateau_tol: float = 0.1,
            prominence: float = 2.0) -> PhaseAnalysis:
    """Phase analysis of one trajectory (``M`` (T, H, F), ``Q`` (T, H, H), ``risk`` (T,)) or of several (a leading
    axis ``S``); keyword arguments as in the rules of :mod:`singleloc.analysis._plateaus` (``plateau_tol``,
    ``prominence``) and :mod:`singleloc.analysis._head_classes` (the others).

    ``mean`` is ``E[theta]`` (``config.problem.build_prior().mean()``); ``weights`` (S, T, H) or (T, H) the heads'
    attention weights (:func:`singleloc.attention_mass`), without which no head is classified ``off``;
    ``directions`` the latent directions of the ``labels`` (default the spikes).
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
    # first saved time from which some head stays learned to the end (NaN where none is learned at the end)
    first = specialization_times(tau, np.where(learned, 0, -1)[..., None])[..., 0]
    pls, escs, esc, rearr, first_aligned = [], [], [], [], []
    for s in range(M.shape[0]):
        ps = plateaus(tau, risk[s], plateau_tol=plateau_tol, prominence=prominence)
        pls.append(ps)
        escs.append(escape_times(tau, risk[s], ps))
        on = np.flatnonzero((labels[s] >= 0).any(axis=-1))
        first_aligned.append(tau[on[0]] if len(on) else np.nan)
        cand = [k for k, p in enumerate(ps) if p.tau < first[s]]  # the escape from the last plateau before it
        k = cand[-1] if cand else -1
        esc.append(np.nan if k < 0 else halfway_time(tau, risk[s], ps[k].tau, ps[k].risk,
                                                     ps[k + 1].risk if k + 1 < len(ps) else risk[s, -1]))
        rearr.append(rearrangements(tau, labels[s]))
    return PhaseAnalysis(
        tau=tau, classes=classes, escaped=learned[:, -1].copy(), labels=labels, n_specialized=np.sum(labels >= 0, axis=-1),
        n_directions=n_dir, redundant=redundant_pairs(Q, redundancy), profiles=shared_profiles(M, Q, redundancy, min_fraction),
        cos=head_spike_cosines(M, Q), specialization_times=specialization_times(tau, labels), plateaus=pls, escapes=escs,
        escape_time=np.asarray(esc, float), first_learned=first, first_specialization=np.asarray(first_aligned, float),
        final_risk=risk[:, -1].copy(), rearrangements=rearr, settled=settledness(tau, risk, classes.code))

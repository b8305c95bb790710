"""Priors of the latent signal ``theta`` in R^F (docs/model.md section 1).

Every prior of the package is a finite mixture of Gaussians with a common covariance,

    theta = atoms[k] + Sigma^{1/2} u,    k ~ probs,  u ~ N(0, I_F),

which covers the exact discrete priors (``Sigma = 0``: spikes, flipped, binary, discrete) and the Gaussian prior
(one atom at the mean, ``Sigma = cov``). The theory engine uses this form to integrate over ``theta`` exactly on
the atoms and by quadrature over ``u``; the Bayes baseline has a closed form for each component.

A user-defined prior is simply ``Prior(atoms, probs, noise_cov)``, or one of the factories
:func:`spikes`, :func:`flipped`, :func:`binary`, :func:`discrete`, :func:`gaussian`.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Real

from ..ground._user_code import UserCodeError
from ..ground._validation import integer, number
from ..runtime._numerics import PSD_ROUNDING, psd_sqrt


def _as_tuple(a: np.ndarray):
    return tuple(map(_as_tuple, a)) if a.ndim > 1 else tuple(float(x) for x in a)


@dataclasses.dataclass(frozen=True)
class Prior:
    """Mixture prior ``theta = atoms[k] + noise_cov^{1/2} u`` (see the module docstring).

    Attributes:
        atoms: ``(K, F)`` support points of the discrete part.
        probs: ``(K,)`` their probabilities (non-negative, summing to one).
        noise_cov: ``(F, F)`` PSD covariance of the Gaussian part (zeros for a discrete prior).
        name: label used in messages and files.
    """

    atoms: tuple
    probs: tuple
    noise_cov: tuple
    name: str = "custom"

    def __post_init__(self):
        for key in ("atoms", "probs", "noise_cov"):
            try:
                np.asarray(getattr(self, key), dtype=float)
            except (TypeError, ValueError):
                raise ValueError(f"prior {self.name}: {key} must be numeric, got {getattr(self, key)!r:.60}") from None
        atoms = np.asarray(self.atoms, dtype=float)
        if atoms.ndim != 2 or atoms.shape[0] < 1 or atoms.shape[1] < 1:
            raise ValueError(f"prior {self.name}: atoms must have shape (K, F) with K, F >= 1, got {atoms.shape}")
        k, f = atoms.shape
        probs = np.asarray(self.probs, dtype=float)
        if probs.shape != (k,):
            raise ValueError(f"prior {self.name}: probs must have shape ({k},), got {probs.shape}")
        if not np.all(np.isfinite(atoms)):
            raise ValueError(f"prior {self.name}: atoms must be finite")
        if not np.all(np.isfinite(probs)) or np.any(probs < 0) or abs(probs.sum() - 1.0) > 1e-8:
            raise ValueError(f"prior {self.name}: probs must be non-negative and sum to 1, got {probs.tolist()}")
        cov = np.asarray(self.noise_cov, dtype=float)
        if cov.shape != (f, f):
            raise ValueError(f"prior {self.name}: cov must have shape ({f}, {f}), got {cov.shape}")
        if not np.all(np.isfinite(cov)) or not np.allclose(cov, cov.T, atol=1e-12):
            raise ValueError(f"prior {self.name}: cov must be a finite symmetric matrix")
        _require_psd(cov, f"prior {self.name}: cov")
        object.__setattr__(self, "atoms", _as_tuple(atoms))
        object.__setattr__(self, "probs", _as_tuple(probs))
        object.__setattr__(self, "noise_cov", _as_tuple(cov))

    @property
    def F(self) -> int:
        """Number of latent directions (spikes)."""
        return len(self.atoms[0])

    @property
    def is_discrete(self) -> bool:
        """True when the Gaussian part vanishes: theta takes finitely many values."""
        return not np.any(np.asarray(self.noise_cov))

    def atoms_array(self) -> np.ndarray:
        return np.asarray(self.atoms, dtype=float)

    def probs_array(self) -> np.ndarray:
        return np.asarray(self.probs, dtype=float)

    def cov_sqrt(self) -> np.ndarray:
        """Symmetric square root of ``noise_cov``."""
        return psd_sqrt(np.asarray(self.noise_cov, dtype=float))

    def mean(self) -> np.ndarray:
        """``E[theta]`` (F,)."""
        return self.probs_array() @ self.atoms_array()

    def cov(self) -> np.ndarray:
        """``Cov[theta]`` (F, F): spread of the atoms plus the Gaussian part."""
        a, p, mu = self.atoms_array(), self.probs_array(), self.mean()
        return (a - mu).T @ ((a - mu) * p[:, None]) + np.asarray(self.noise_cov, dtype=float)

    def sample(self, key: jax.Array, shape: tuple[int, ...] = ()) -> jax.Array:
        """Draw ``theta`` of shape ``shape + (F,)``."""
        k_atom, k_noise = jax.random.split(key)
        atoms = jnp.asarray(self.atoms_array())
        idx = jax.random.choice(k_atom, atoms.shape[0], shape=shape, p=jnp.asarray(self.probs_array()))
        theta = atoms[idx]
        if not self.is_discrete:
            u = jax.random.normal(k_noise, shape + (self.F,), dtype=theta.dtype)
            theta = theta + u @ jnp.asarray(self.cov_sqrt(), dtype=theta.dtype)
        return theta


def check_prior(prior: Any, reference: str, key: str = "problem.prior") -> None:
    """The probe of a prior a factory returned (:mod:`~singleloc.ground._user_code`); :class:`UserCodeError`
    naming ``reference``."""
    if not isinstance(prior, Prior):
        raise UserCodeError(f"{key}: {reference!r} must return a singleloc.Prior, got {type(prior).__name__}")
    with np.errstate(all="ignore"):
        moments = (prior.mean(), prior.cov())
    if not all(np.all(np.isfinite(m)) for m in moments):
        raise UserCodeError(f"{key}: {reference!r} returned a prior whose mean or covariance overflows float64 (atoms up "
                            f"to {np.max(np.abs(prior.atoms_array())):.3g}); scale its atoms and covariance down")


def _dimension(F: Any) -> int:
    """``problem.F``: an integer ``>= 1`` whose ``F x F`` float64 atoms and covariance fit in this machine's memory."""
    F, memory = integer("problem.F", F, 1), os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if 16 * F * F > memory:
        raise ValueError(f"problem.F: {F} is too large: the prior's F x F float64 atoms and covariance need "
                         f"{16 * F * F / 1e9:.3g} GB, more than this machine's {memory / 1e9:.3g} GB; e.g. problem.F = 2")
    return F


def spikes(F: int, strength: float) -> Prior:
    """``theta = strength * e_f`` with ``f`` uniform in ``1..F``."""
    F, s = _dimension(F), number("problem.strength", strength, positive=True)
    return Prior(s * np.eye(F), np.full(F, 1.0 / F), np.zeros((F, F)), name="spikes")


def flipped(F: int, strength: float) -> Prior:
    """``theta = +- strength * e_f``, ``f`` and the sign uniform (zero mean)."""
    F, s = _dimension(F), number("problem.strength", strength, positive=True)
    atoms = np.concatenate([s * np.eye(F), -s * np.eye(F)])
    return Prior(atoms, np.full(2 * F, 1.0 / (2 * F)), np.zeros((F, F)), name="flipped")


def binary(F: int, strength: float, p: float = 0.5) -> Prior:
    """``theta = strength * u`` with ``u_f ~ Bernoulli(p)`` i.i.d. (``2^F`` atoms)."""
    F, s = _dimension(F), number("problem.strength", strength, positive=True)
    p = float(p)
    if not 0.0 < p < 1.0:
        raise ValueError(f"problem.p must lie in (0, 1), got {p}")
    if F > 12:
        raise ValueError(f"problem.F = {F} is too large for the binary prior (2^F atoms); use F <= 12")
    u = np.array(list(itertools.product([0.0, 1.0], repeat=F)))
    probs = np.prod(np.where(u > 0, p, 1.0 - p), axis=1)
    return Prior(s * u, probs, np.zeros((F, F)), name="binary")


def discrete(support: Real[ArrayLike, "A F"] | Sequence[Sequence[float]],
             probs: Real[ArrayLike, " A"] | Sequence[float]) -> Prior:
    """User-given support points ``(K, F)`` and probabilities ``(K,)``."""
    support = np.asarray(support, dtype=float)
    if support.ndim != 2:
        raise ValueError(f"problem.support must be a list of K points of dimension F, got shape {support.shape}")
    probs = np.asarray(probs, dtype=float)
    if probs.shape != (support.shape[0],):
        raise ValueError(f"problem.probs must have one probability per support point ({support.shape[0]}), got {probs.shape}")
    if np.any(probs < 0) or abs(probs.sum() - 1.0) > 1e-8:
        raise ValueError(f"problem.probs must be non-negative and sum to 1, got {probs.tolist()}")
    F = support.shape[1]
    return Prior(support, probs, np.zeros((F, F)), name="discrete")


def gaussian(mean: Real[ArrayLike, " F"] | Sequence[float],
             cov: Real[ArrayLike, "..."] | Sequence[float] | Sequence[Sequence[float]]) -> Prior:
    """``theta ~ N(mean, cov)``; ``cov`` may be a scalar (isotropic) or an ``(F, F)`` PSD matrix."""
    mean = np.atleast_1d(np.asarray(mean, dtype=float))
    if mean.ndim != 1:
        raise ValueError(f"problem.mean must be a vector, got shape {mean.shape}")
    F = mean.shape[0]
    cov = np.asarray(cov, dtype=float)
    if cov.ndim == 0:
        cov = float(cov) * np.eye(F)
    elif cov.ndim == 1 and cov.shape == (F,):
        cov = np.diag(cov)
    if cov.shape != (F, F):
        raise ValueError(f"problem.cov must be a scalar, a length-{F} diagonal or an ({F}, {F}) matrix, got shape {cov.shape}")
    if not np.allclose(cov, cov.T, atol=1e-12):
        raise ValueError("problem.cov must be symmetric")
    _require_psd(cov, "problem.cov")
    return Prior(mean[None, :], np.ones(1), cov, name="gaussian")


def _require_psd(cov: np.ndarray, name: str) -> None:
    """``ValueError`` naming ``name`` unless the symmetric ``cov`` is positive semi-definite up to
    rounding (:data:`~singleloc.runtime._numerics.PSD_ROUNDING`)."""
    eigenvalues = np.linalg.eigvalsh(cov)
    if eigenvalues.min() < -PSD_ROUNDING * max(1.0, np.abs(cov).max()):
        raise ValueError(f"{name} must be positive semi-definite, its eigenvalues are {eigenvalues.tolist()}")


def _discrete_of(problem) -> Prior:
    """``discrete`` from a problem section: ``support`` (default ``strength * I_F``) with ``probs``
    (default uniform)."""
    support = problem.support if problem.support is not None else (problem.strength * np.eye(problem.F)).tolist()
    return discrete(support, problem.probs if problem.probs is not None else [1.0 / len(support)] * len(support))


def _gaussian_of(problem) -> Prior:
    """``gaussian`` from a problem section: ``mean`` (default 0) and ``cov`` (default ``strength^2 I_F``)."""
    mean = problem.mean if problem.mean is not None else [0.0] * problem.F
    return gaussian(mean, problem.cov if problem.cov is not None else problem.strength**2)


#: The named priors of ``problem.prior``: each a function of the ``[problem]`` section (its ``F`` and the
#: keys it reads: ``strength``, ``p``, ``support``, ``probs``, ``mean``, ``cov``) returning the
#: :class:`Prior`. A new named prior is a function here and one line in this table.
PRIOR_FACTORIES = {
    "spikes": lambda problem: spikes(problem.F, problem.strength),
    "flipped": lambda problem: flipped(problem.F, problem.strength),
    "binary": lambda problem: binary(problem.F, problem.strength, problem.p),
    "discrete": _discrete_of,
    "gaussian": _gaussian_of,
}

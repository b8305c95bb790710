"""Head pruning of a trained layer (MODEL.md section 7).

A layer with ``H`` heads is pruned by removing heads one at a time; the layer that keeps a
subset ``S`` of ``H'`` heads is the same activation applied to those ``H'`` heads only, so the
aggregation is renormalised over the kept heads, ``a = (1/H') sum_{h in S} A_h``, and
bsoftmax's factor ``H`` becomes ``H'`` (both follow from applying the activation and
:func:`~singleloc.token_weights` to the ``(H', L)`` scores of the kept heads).

Two evaluators of the risk of a kept subset:

* theory (:class:`TheoryRisk`): the population risk of the kept rows/columns of
  ``(M, Q, b)``, with an :class:`~singleloc.OrderParameterODE` built for ``H'`` heads (its
  quadrature rule over the local fields depends on ``H'``; one is built and cached per ``H'``);
* weights (:class:`WeightsRisk`): the kept rows of the keys ``K`` and biases ``b``,
  evaluated on fresh sequences drawn in the law of :func:`singleloc._simulation.test_losses`
  (finite-D empirical loss or the limit loss), with the same sequences for every subset
  (common random numbers, so that differences between subsets are measured with little noise).

Three orders of removal (:data:`ORDERS`):

* ``greedy``: at each step remove the head whose removal raises the risk least (ties go to
  the lowest head index);
* ``alignment``: remove the least aligned head first, by ``|M_h|`` (Euclidean norm of row ``h``
  of ``M``, the overlap with the spike subspace);
* ``random``: ``draws`` uniformly random orders from ``numpy.random.default_rng(seed)``;
  the result holds every draw, and its mean and spread.

An explicit order (a sequence of head indices) is accepted too.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from ._activations import get_activation
from ._config import Config
from ._data import overlaps
from ._layer import token_weights
from ._theory import OrderParameterODE, OrderParameters

ORDERS = ("greedy", "alignment", "random")


@dataclasses.dataclass(frozen=True)
class PruningResult:
    """Risk of a layer against the number of heads removed.

    Attributes:
        order: ``"greedy"``, ``"alignment"``, ``"random"`` or ``"given"`` (explicit order).
        removed: ``(draws, H - 1)`` int, the heads removed, in order (indices of the original
            layer); one row unless the order is random.
        risks: ``(draws, H)``, the risk after removing ``k = 0 .. H-1`` heads.
        stderr: ``(draws, H)`` Monte Carlo standard error of each risk (weights evaluator),
            or ``None`` (theory: a deterministic quadrature).
    """

    order: str
    removed: np.ndarray
    risks: np.ndarray
    stderr: np.ndarray | None = None

    @property
    def heads(self) -> int:
        """``H``, the number of heads of the unpruned layer."""
        return self.risks.shape[1]

    @property
    def n_removed(self) -> np.ndarray:
        """``0 .. H-1``."""
        return np.arange(self.heads)

    @property
    def risk(self) -> np.ndarray:
        """``(H,)`` risk against heads removed (the mean over draws for ``random``)."""
        return self.risks.mean(axis=0)

    @property
    def risk_std(self) -> np.ndarray:
        """``(H,)`` standard deviation over draws (zeros for a single order)."""
        if self.risks.shape[0] < 2:
            return np.zeros(self.heads)
        return self.risks.std(axis=0, ddof=1)

    def removable(self, tol: float = 0.01) -> int:
        """How many heads (along this order, on the mean curve) can be removed before the
        risk rises by more than ``tol`` above the unpruned risk."""
        return removable_heads(self.risk, tol)


def removable_heads(risk: Sequence[float], tol: float = 0.01) -> int:
    """The largest ``k`` with ``risk[j] <= risk[0] + tol`` for every ``j <= k``."""
    risk = np.asarray(risk, dtype=float)
    over = np.nonzero(risk > risk[0] + tol)[0]
    return int(over[0] - 1) if len(over) else len(risk) - 1


def keep_heads(M, Q, b, kept: Sequence[int]) -> OrderParameters:
    """The order parameters of the sub-layer of heads ``kept``: rows of ``M`` and ``b``,
    rows and columns of ``Q``."""
    idx = np.asarray(kept, dtype=int)
    return OrderParameters(jnp.asarray(M)[idx], jnp.asarray(Q)[np.ix_(idx, idx)], jnp.asarray(b)[idx])


# -- evaluators ---------------------------------------------------------------------------


@eqx.filter_jit
def _population_risk(ode: OrderParameterODE, M, Q, b):
    return ode.risk(M, Q, b)


class TheoryRisk:
    """Population risk of sub-layers of the layer ``(M, Q, b)`` (``M`` (H, F), ``Q`` (H, H),
    ``b`` (H,)). ``risk(kept)`` evaluates the heads ``kept`` with an ODE object for
    ``len(kept)`` heads, built from ``config`` (problem, activation, ``theory.points``,
    ``theory.qmc_seed``) and cached."""

    def __init__(self, config: Config, M, Q, b):
        dtype = jnp.result_type(float)
        self.config = config
        self.M, self.Q, self.b = (jnp.asarray(x, dtype) for x in (M, Q, b))
        H = self.M.shape[0]
        if self.M.shape != (H, config.problem.F) or self.Q.shape != (H, H) or self.b.shape != (H,):
            raise ValueError(f"order parameters must have shapes (H, F), (H, H), (H,) with F = {config.problem.F}; "
                             f"got M {self.M.shape}, Q {self.Q.shape}, b {self.b.shape}")
        self.heads = H
        self._odes: dict[int, OrderParameterODE] = {}

    def ode(self, heads: int) -> OrderParameterODE:
        """The (cached) :class:`OrderParameterODE` of a layer with ``heads`` heads."""
        if heads not in self._odes:
            self._odes[heads] = OrderParameterODE.from_config(self.config.replace(model={"heads": heads}))
        return self._odes[heads]

    def __call__(self, kept: Sequence[int]) -> tuple[float, float]:
        """``(risk, 0.0)`` of the sub-layer of heads ``kept`` (no Monte Carlo error)."""
        M, Q, b = keep_heads(self.M, self.Q, self.b, kept)
        return float(_population_risk(self.ode(len(kept)), M, Q, b)), 0.0


class WeightsRisk:
    """Risk of sub-layers of the finite-D layer with keys ``K`` (H, D), biases ``b`` (H,) and
    spikes ``kstar`` (F, D), on ``samples`` fresh sequences (the same sequences for every
    subset). ``loss="empirical"``: the finite-D loss ``|x_eps - yhat|^2 / D``;
    ``loss="limit"``: the limit loss of MODEL.md section 3 of the same scores.

    The sequences are drawn in law exactly as :func:`singleloc._simulation.test_losses` draws
    them (tokens split on an orthonormal basis ``U`` of the span of the keys and spikes, ``y``
    their coordinates; the complement adds ``|w|^2 chi2(D - r)`` to ``|x_eps - yhat|^2``),
    but once per layer, in numpy, from ``numpy.random.default_rng(key)``: the basis spans all
    ``H`` keys, so every kept subset is scored on the same sequences, and no JAX program is
    compiled per subset size (a jitted ``test_losses`` compiles per shape, ~10-20 s each on a
    loaded 2-core machine, and a pruning run needs H shapes per layer).
    """

    def __init__(self, config: Config, K, b, kstar, *, samples: int | None = None, key: int = 0,
                 loss: str = "empirical"):
        if loss not in ("empirical", "limit"):
            raise ValueError(f"loss must be 'empirical' or 'limit', got {loss!r}")
        K, b, kstar = (np.asarray(x, dtype=np.float64) for x in (K, b, kstar))
        H, D = K.shape
        F = config.problem.F
        if b.shape != (H,) or kstar.shape != (F, D):
            raise ValueError(f"weights must have shapes K (H, D), b (H,), kstar (F, D) with F = {F}; "
                             f"got K {K.shape}, b {b.shape}, kstar {kstar.shape}")
        L = config.problem.L
        r = H + F
        if D < r + L:
            raise ValueError(f"D = {D} must be at least H + F + L = {r + L}")
        n = config.simulation.test_samples if samples is None else int(samples)
        if n < 2:
            raise ValueError(f"samples must be >= 2, got {n}")
        self.K, self.b, self.kstar, self.heads, self.D = K, b, kstar, H, D
        self.act = get_activation(config.model.activation)
        self.loss = loss
        rng = np.random.default_rng(key)
        U = np.linalg.qr(np.concatenate([K, kstar]).T)[0].T  # (r, D), orthonormal rows
        self.KU = K @ U.T / np.sqrt(D)  # (H, r): scores are KU y_l + b
        shift = U @ kstar.T / np.sqrt(D)  # (r, F)
        prior = config.problem.build_prior()
        theta = prior.atoms_array()[rng.choice(len(prior.probs), size=n, p=prior.probs_array())]
        if not prior.is_discrete:
            theta = theta + rng.standard_normal((n, F)) @ prior.cov_sqrt()
        self.eps = rng.integers(0, L, size=n)
        y = rng.standard_normal((n, L, r))
        y[np.arange(n), self.eps] += theta @ shift.T
        self.y = y
        # the complement of the span enters w^T Gram w only as |w|^2 chi2(D - r) (rotation invariance)
        self.chi2 = rng.chisquare(D - r, size=n)
        self.target = np.eye(L)[self.eps]

    def overlaps(self) -> tuple[np.ndarray, np.ndarray]:
        """``M = K k*^T / D`` and ``Q = K K^T / D`` of the full layer."""
        M, Q = overlaps(self.K, self.kstar)
        return np.asarray(M), np.asarray(Q)

    def losses(self, kept: Sequence[int]) -> np.ndarray:
        """``(samples,)`` losses of the sub-layer of heads ``kept``."""
        idx = np.asarray(kept, dtype=int)
        s = np.einsum("hr,nlr->nhl", self.KU[idx], self.y) + self.b[idx][:, None]
        a = np.asarray(token_weights(self.act, jnp.asarray(s)), dtype=np.float64)  # (n, L)
        w = self.target - a
        if self.loss == "limit":
            return np.sum(w**2, axis=1)
        return (np.sum(np.einsum("nl,nlr->nr", w, self.y) ** 2, axis=1) + np.sum(w**2, axis=1) * self.chi2) / self.D

    def __call__(self, kept: Sequence[int]) -> tuple[float, float]:
        """``(mean loss, its standard error)`` of the sub-layer of heads ``kept``."""
        losses = self.losses(kept)
        return float(losses.mean()), float(losses.std(ddof=1) / np.sqrt(len(losses)))


# -- orders -------------------------------------------------------------------------------


def prune(evaluate: Callable[[Sequence[int]], tuple[float, float]], heads: int, order: str | Sequence[int] = "greedy",
          *, alignment: np.ndarray | None = None, draws: int = 16, seed: int = 0) -> PruningResult:
    """Remove heads one at a time along ``order`` and record the risk.

    Args:
        evaluate: ``kept -> (risk, stderr)`` for a subset of head indices.
        heads: ``H``.
        order: ``"greedy"``, ``"alignment"``, ``"random"``, or an explicit sequence of ``H - 1``
            (or ``H``; the last is then ignored) distinct head indices, removed in that order.
        alignment: ``(H,)`` ``|M_h|``, required for ``order="alignment"``.
        draws: number of random orders (``order="random"`` only).
        seed: seed of the random orders.
    """
    H = int(heads)
    if H < 1:
        raise ValueError(f"a layer needs at least one head, got {H}")
    if isinstance(order, str):
        if order not in ORDERS:
            raise ValueError(f"unknown pruning order {order!r} (known: {', '.join(ORDERS)})")
        if order == "greedy":
            return _greedy(evaluate, H)
        if order == "alignment":
            if alignment is None:
                raise ValueError("order 'alignment' needs the alignments |M_h|")
            alignment = np.asarray(alignment, dtype=float)
            if alignment.shape != (H,):
                raise ValueError(f"alignment must have shape ({H},), got {alignment.shape}")
            sequences = [np.argsort(alignment, kind="stable")[: H - 1]]
        else:
            if int(draws) < 1:
                raise ValueError(f"draws must be >= 1, got {draws}")
            rng = np.random.default_rng(seed)
            sequences = [rng.permutation(H)[: H - 1] for _ in range(int(draws))]
        label = order
    else:
        seq = [int(h) for h in order]
        if len(seq) not in (H - 1, H) or sorted(set(seq)) != sorted(seq) or not all(0 <= h < H for h in seq):
            raise ValueError(f"an explicit order must list {H - 1} distinct head indices in 0..{H - 1}, got {list(order)}")
        sequences, label = [np.asarray(seq[: H - 1], dtype=int)], "given"
    risks, errs = [], []
    for seq in sequences:
        kept = list(range(H))
        r, e = [], []
        for k in range(H):
            if k:
                kept.remove(int(seq[k - 1]))
            rk, ek = evaluate(kept)
            r.append(rk)
            e.append(ek)
        risks.append(r)
        errs.append(e)
    return PruningResult(label, np.asarray(sequences, dtype=int).reshape(len(sequences), H - 1), np.asarray(risks), np.asarray(errs))


def _greedy(evaluate, H: int) -> PruningResult:
    kept = list(range(H))
    r0, e0 = evaluate(kept)
    risks, errs, removed = [r0], [e0], []
    for _ in range(H - 1):
        trials = [evaluate([k for k in kept if k != h]) for h in kept]
        i = int(np.argmin([t[0] for t in trials]))
        removed.append(kept.pop(i))
        risks.append(trials[i][0])
        errs.append(trials[i][1])
    return PruningResult("greedy", np.asarray([removed], dtype=int).reshape(1, H - 1), np.asarray([risks]), np.asarray([errs]))


def _finish(result: PruningResult, deterministic: bool) -> PruningResult:
    return dataclasses.replace(result, stderr=None) if deterministic else result


def prune_theory(config: Config, M, Q, b, order: str | Sequence[int] = "greedy", *, draws: int = 16,
                 seed: int = 0) -> PruningResult:
    """Prune the layer with order parameters ``M`` (H, F), ``Q`` (H, H), ``b`` (H,), scoring
    every kept subset by its population risk (see :class:`TheoryRisk`)."""
    evaluate = TheoryRisk(config, M, Q, b)
    align = np.linalg.norm(np.asarray(M, dtype=float), axis=1)
    return _finish(prune(evaluate, evaluate.heads, order, alignment=align, draws=draws, seed=seed), True)


def prune_weights(config: Config, K, b, kstar, order: str | Sequence[int] = "greedy", *, draws: int = 16,
                  seed: int = 0, samples: int | None = None, key: int = 0,
                  loss: str = "empirical") -> PruningResult:
    """Prune the finite-D layer ``K`` (H, D), ``b`` (H,) with spikes ``kstar`` (F, D), scoring
    every kept subset on the same ``samples`` fresh sequences (default
    ``simulation.test_samples``) drawn from ``numpy.random.default_rng(key)`` (see
    :class:`WeightsRisk`). The greedy
    choices are made on these Monte Carlo estimates; ``stderr`` holds their standard errors.
    ``alignment`` uses ``|M_h|`` with ``M = K k*^T / D``."""
    evaluate = WeightsRisk(config, K, b, kstar, samples=samples, key=key, loss=loss)
    align = np.linalg.norm(evaluate.overlaps()[0], axis=1)
    return prune(evaluate, evaluate.heads, order, alignment=align, draws=draws, seed=seed)


def finetune(config: Config, M, Q, b, kept: Sequence[int], ts, **kwargs):
    """Continue the ODE from the pruned layer: :func:`~singleloc.integrate` of the
    ``len(kept)``-head model from ``y0`` = the kept rows/columns of ``(M, Q, b)``, saved at
    ``ts`` (which start at the pruning time, e.g. 0). Returns a :class:`~singleloc.TheoryResult`."""
    from ._ode import integrate

    y0 = keep_heads(M, Q, b, kept)
    return integrate(config.replace(model={"heads": len(kept)}), y0, ts=np.asarray(ts), **kwargs)

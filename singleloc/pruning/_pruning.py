"""Head pruning of a trained layer (docs/model.md section 7).

A layer with ``H`` heads is pruned by removing heads one at a time; the layer that keeps a subset ``S`` of ``H'``
heads is the same activation applied to those ``H'`` heads only, so the aggregation is renormalised over the kept
heads, ``a = (1/H') sum_{h in S} A_h``, and bsoftmax's factor ``H`` becomes ``H'`` (both follow from applying the
activation and :func:`~singleloc.token_weights` to the ``(H', L)`` scores of the kept heads).

Two evaluators of the risk of a kept subset:

* theory (:class:`TheoryRisk`): the population risk of the kept rows/columns of
  ``(M, Q, b)``, with an :class:`~singleloc.OrderParameterODE` built for ``H'`` heads (its
  quadrature rule over the local fields depends on ``H'``; one is built and cached per ``H'``;
  with ``theory.replicates > 1``, one per replicate, and the risk has a quadrature error);
* weights (:class:`WeightsRisk`): the kept rows of the keys ``K`` and biases ``b``,
  evaluated on the simulator's held-out sequences (:mod:`singleloc.model._heldout`: exact in law at
  any D, finite-D empirical loss or the limit loss), with the same sequences for every subset
  (common random numbers, so that differences between subsets are measured with little noise).

Three orders of removal (:data:`~singleloc.PRUNING_ORDERS`):

* ``greedy``: at each step remove the head whose removal raises the risk least (ties go to
  the lowest head index);
* ``alignment``: remove first the head with the smallest spike-overlap norm ``|M_h|`` (the
  Euclidean norm of row ``h`` of ``M``, i.e. of the head's overlaps with the ``F`` spikes).
  The name is the one the CLI accepts; the order ranks by these norms, not by the
  head-spike cosines ``M_hf / sqrt(Q_hh)`` of the phase analysis;
* ``random``: ``draws`` uniformly random orders from ``numpy.random.default_rng(seed)``;
  the result holds every draw, and its mean and spread.

An explicit order (a sequence of head indices) is accepted too; :func:`prune_run` prunes the layers of a run folder.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Integer, Real

from ..bayes._population_risk import RiskEstimate, layer_risk, layer_risk_check
from ..configuration._config import Config, gather_specs, require_uniform_head_weights
from ..configuration._specs import SGD, Model, Problem, Simulation, Theory
from ..ground._arguments import _short, checked
from ..ground._choices import PRUNING_DRAWS_MAX, PRUNING_ORDERS
from ..ground._validation import integer
from ..model._activations import get_activation
from ..model._data import overlaps
from ..model._heldout import draw_heldout, heldout_losses
from ..preflight._build import Setup, build
from ..preflight._estimates import prune_evaluations, pruning
from ..preflight._resources import check_memory, check_quadrature, theory_bytes
from ..theory._accuracy import resolve_points
from ..theory._ode import integrate
from ..theory._theory import OrderParameterODE, OrderParameters
from ._pruning_result import PruningResult


def keep_heads(M: Real[ArrayLike, "H F"], Q: Real[ArrayLike, "H H"], b: Real[ArrayLike, " H"],
               kept: Sequence[int] | Integer[ArrayLike, " K"]) -> OrderParameters:
    """The order parameters of the sub-layer of heads ``kept``: rows of ``M`` and ``b``, rows and columns of ``Q``."""
    idx = np.asarray(kept, dtype=int)
    if len(set(idx.tolist())) != idx.size or not all(0 <= i < np.shape(M)[0] for i in idx.tolist()):
        raise ValueError(f"keep_heads: kept must be distinct heads in 0..{np.shape(M)[0] - 1}, got {idx.tolist()}")
    return OrderParameters(jnp.asarray(M)[idx], jnp.asarray(Q)[np.ix_(idx, idx)], jnp.asarray(b)[idx])


# compiled once per shape: the draw per (H, D, samples, L, prior), the losses per subset size H'
_draw_heldout = eqx.filter_jit(draw_heldout)
_heldout_losses = eqx.filter_jit(heldout_losses)


def pruning_setup(setup: Setup, heads: int | None = None) -> Setup:
    """The setup with which :class:`TheoryRisk` scores the sub-layers of a layer of ``heads`` heads (default
    ``model.heads``), checked before a rule is built: ``theory.route = "auto"`` and ``theory.points = "auto"`` fixed
    to the full layer's (one route and rule for every sub-layer), the Sobol rule buildable with its points
    (:func:`~singleloc.preflight._resources.check_quadrature`) and within memory. ``ValueError`` or ``MemoryError``
    naming the keys otherwise (also for ``model.head_weights = "trained"``: pruning is for the head average)."""
    require_uniform_head_weights(setup.model, "pruning")
    if heads is not None and int(heads) != setup.heads:
        setup = setup.replace(model={"heads": int(heads)})
    th, pb, route = setup.theory, setup.problem, setup.route
    if th.route == "auto" and route.route_class.field_nodes:  # else a joint layer's smaller sub-layers go exact
        setup = setup.replace(theory={"route": route.route})
    if th.points != "auto" and route.route_class.field_nodes:
        check_quadrature(pb.L, setup.heads, setup.prior, th.points, principal=th.rank_aware)
    setup = resolve_points(setup)
    check_memory({f"the theory's quadrature (theory.points = {setup.theory.points})":
                  theory_bytes(pb.L, setup.heads, setup.prior, setup.theory, route, 1)})
    return setup


class TheoryRisk:
    """Population risk of sub-layers of the layer ``(M, Q, b)`` (``M`` (H, F), ``Q`` (H, H), ``b`` (H,)): called
    with the heads ``kept``, it evaluates them with ODE objects for ``len(kept)`` heads, built from ``setup`` (its
    route kept) and cached, after :func:`pruning_setup` (``ValueError`` or ``MemoryError`` naming the keys).

    On the exact route (``theory.route``, a normalised-exponential activation) a risk is the exact one and its
    error the difference to the finer exact rule. On the Sobol rule, with ``theory.replicates = R > 1`` a risk is
    the mean over ``R`` independently scrambled rules and comes with its standard error (their spread over
    ``sqrt(R)``): the quadrature error of the risk of the given layer. With ``R = 1`` the error is not estimated
    (0.0). :func:`prune_theory` builds one from a config or the specifications by keyword."""

    @checked
    def __init__(self, setup: Setup, M: Real[ArrayLike, "H F"] = None, Q: Real[ArrayLike, "H H"] = None,
                 b: Real[ArrayLike, " H"] = None):
        require_uniform_head_weights(setup.model, "TheoryRisk")
        dtype = jnp.result_type(float)
        self.M, self.Q, self.b = (jnp.asarray(x, dtype) for x in (M, Q, b))
        H, F = self.M.shape[0], setup.problem.F
        if self.M.shape != (H, F) or self.Q.shape != (H, H) or self.b.shape != (H,):
            raise ValueError(f"order parameters must have shapes (H, F), (H, H), (H,) with F = {F}; "
                             f"got M {self.M.shape}, Q {self.Q.shape}, b {self.b.shape}")
        self.setup, self.heads = pruning_setup(setup, heads=H), H  # checked; one route and rule for every sub-layer
        self._odes: dict[int, list[OrderParameterODE]] = {}

    def of_layer(self, M: Real[ArrayLike, "H F"], Q: Real[ArrayLike, "H H"], b: Real[ArrayLike, " H"]) -> TheoryRisk:
        """The risks of the sub-layers of another layer of the same shape, on the same (cached) rules: checked and
        built once for the layers of a run (:func:`prune_run`)."""
        other = copy.copy(self)
        other.M, other.Q, other.b = (jnp.asarray(x, self.M.dtype) for x in (M, Q, b))
        return other

    def odes(self, heads: int) -> list[OrderParameterODE]:
        """The (cached) :class:`OrderParameterODE` objects of a layer with ``heads`` heads, one per replicate ``r``
        on the rule of scrambling ``Theory.evaluation_seed + r``, where :func:`~singleloc.integrate` evaluates
        replicate ``r``'s risk (so that the unpruned risk is the risk ``integrate`` reports)."""
        if heads not in self._odes:
            th, sub = self.setup.theory, self.setup if heads == self.heads else self.setup.replace(model={"heads": heads})
            self._odes[heads] = [OrderParameterODE.from_setup(sub.replace(theory={"qmc_seed": th.evaluation_seed + r}),
                                                              check=True) for r in range(th.replicates)]
        return self._odes[heads]

    def __call__(self, kept: Sequence[int]) -> tuple[float, float]:
        """``(risk, standard error)`` of the sub-layer of heads ``kept`` (class docstring)."""
        M, Q, b = keep_heads(self.M, self.Q, self.b, kept)
        odes = self.odes(len(kept))
        if odes[0].expectation.refined_error:  # one rule, its error against its finer copy
            exact = odes[0].expectation
            estimate = RiskEstimate.from_refinement(layer_risk(exact, M, Q, b), layer_risk_check(exact, M, Q, b))
            return estimate.value, estimate.error
        risks = [float(layer_risk(ode.expectation, M, Q, b)) for ode in odes]
        if len(risks) == 1:
            return risks[0], 0.0
        estimate = RiskEstimate.from_replicates(risks, self.setup.theory.points)
        return estimate.value, estimate.error


class WeightsRisk:
    """Risk of sub-layers of the finite-D layer with keys ``K`` (H, D), biases ``b`` (H,) and spikes ``kstar`` (F,
    D), on ``samples`` fresh sequences (the same sequences for every subset). ``loss="empirical"``: the finite-D
    loss ``|x_eps - yhat|^2 / D``; ``loss="limit"``: the limit loss of docs/model.md section 3 of the same scores.

    The sequences are those of the simulator's test risk (:func:`~singleloc.model._heldout.draw_heldout` from the
    JAX key ``key``, an int for ``jax.random.PRNGKey(key)``; with every head kept and the simulator's key
    ``fold_in(seed_keys(seed, s).test, i)`` this is its test risk of seed ``s`` at saved time ``i``): every kept
    subset is scored exactly in law on the same sequences (common random numbers).

    The run is ``setup`` (a :class:`~singleloc.preflight._build.Setup`: ``problem`` and its prior; ``model``: the
    activation; ``simulation``: ``test_samples``, the default of ``samples``); :func:`prune_weights` builds one from
    a config or the specifications by keyword.
    """

    @checked
    def __init__(self, setup: Setup, K: Real[ArrayLike, "H D"] = None, b: Real[ArrayLike, " H"] = None,
                 kstar: Real[ArrayLike, "F D"] = None, *, samples: int | None = None, key: int | jax.Array = 0,
                 loss: str = "empirical"):
        require_uniform_head_weights(setup.model, "WeightsRisk")
        if loss not in ("empirical", "limit"):
            raise ValueError(f"loss must be 'empirical' or 'limit', got {loss!r}")
        K = jnp.asarray(K)
        K = K.astype(jnp.result_type(K.dtype, jnp.float32))
        b, kstar = jnp.asarray(b, K.dtype), jnp.asarray(kstar, K.dtype)
        H, D = K.shape
        F = setup.problem.F
        if b.shape != (H,) or kstar.shape != (F, D):
            raise ValueError(f"weights must have shapes K (H, D), b (H,), kstar (F, D) with F = {F}; "
                             f"got K {K.shape}, b {b.shape}, kstar {kstar.shape}")
        L = setup.problem.L
        if D < H + F + L:
            raise ValueError(f"D = {D} must be at least H + F + L = {H + F + L}")
        n = setup.simulation.test_samples if samples is None else int(samples)
        if n < 2:
            raise ValueError(f"samples must be >= 2, got {n}")
        key = jax.random.PRNGKey(key) if isinstance(key, (int, np.integer)) else key
        self.K, self.b, self.kstar, self.heads, self.D = K, b, kstar, H, D
        self.act = get_activation(setup.model.activation)
        self.loss = loss
        self.sequences = _draw_heldout(key, setup.prior, K, kstar, n, L)

    def overlaps(self) -> tuple[np.ndarray, np.ndarray]:
        """``M = K k*^T / D`` and ``Q = K K^T / D`` of the full layer."""
        M, Q = overlaps(self.K, self.kstar)
        return np.asarray(M), np.asarray(Q)

    def losses(self, kept: Sequence[int]) -> np.ndarray:
        """``(samples,)`` losses of the sub-layer of heads ``kept``."""
        finite, limit = _heldout_losses(self.act, self.sequences, self.b, jnp.asarray(kept, dtype=int))
        return np.asarray(limit if self.loss == "limit" else finite, dtype=np.float64)

    def __call__(self, kept: Sequence[int]) -> tuple[float, float]:
        """``(mean loss, its standard error)`` of the sub-layer of heads ``kept``."""
        losses = self.losses(kept)
        return float(losses.mean()), float(losses.std(ddof=1) / np.sqrt(len(losses)))


def prune(evaluate: Callable[[Sequence[int]], tuple[float, float]], heads: int,
          order: str | Sequence[int] | Integer[ArrayLike, " K"] = "greedy",
          *, overlap_norms: np.ndarray | None = None, draws: int = 16, seed: int = 0) -> PruningResult:
    """Remove heads one at a time along ``order`` and record the risk.

    Args:
        evaluate: ``kept -> (risk, stderr)`` for a subset of head indices.
        heads: ``H``.
        order: ``"greedy"``, ``"alignment"``, ``"random"``, or an explicit sequence of ``H - 1``
            (or ``H``; the last is then ignored) distinct head indices, removed in that order.
        overlap_norms: ``(H,)`` spike-overlap norms ``|M_h|``, required for ``order="alignment"``
            (which removes the smallest first; ties go to the lowest head index).
        draws: number of random orders (``order="random"`` only).
        seed: seed of the random orders.
    """
    integer("prune: heads", heads, 1)
    H = int(heads)
    if isinstance(order, str):
        if order not in PRUNING_ORDERS:
            raise ValueError(f"unknown pruning order {order!r} (known: {', '.join(PRUNING_ORDERS)})")
        if order == "greedy":
            return _greedy(evaluate, H)
        if order == "alignment":
            if overlap_norms is None:
                raise ValueError("order 'alignment' needs the spike-overlap norms |M_h| (overlap_norms)")
            overlap_norms = np.asarray(overlap_norms, dtype=float)
            if overlap_norms.shape != (H,):
                raise ValueError(f"overlap_norms must have shape ({H},), got {overlap_norms.shape}")
            sequences = [np.argsort(overlap_norms, kind="stable")[: H - 1]]
        else:
            draws = integer("draws", draws, 1, PRUNING_DRAWS_MAX, example=16)
            rng = np.random.default_rng(seed)
            sequences = [rng.permutation(H)[: H - 1] for _ in range(int(draws))]
        label = order
    else:
        seq = [int(h) for h in order]
        if len(seq) not in (H - 1, H) or sorted(set(seq)) != sorted(seq) or not all(0 <= h < H for h in seq):
            raise ValueError(f"an explicit order must list {H - 1} distinct head indices in 0..{H - 1}, got {list(order)}")
        sequences, label = [np.asarray(seq[: H - 1], dtype=int)], "given"
    scores = np.asarray([[evaluate([h for h in range(H) if h not in seq[:k]]) for k in range(H)] for seq in sequences])
    removed = np.asarray(sequences, dtype=int).reshape(len(sequences), H - 1)
    return PruningResult(label, removed, scores[..., 0], scores[..., 1])


def _greedy(evaluate, H: int) -> PruningResult:
    kept, removed = list(range(H)), []
    scores = [evaluate(kept)]  # (risk, stderr) after each removal
    for _ in range(H - 1):
        trials = [evaluate([k for k in kept if k != h]) for h in kept]
        i = int(np.argmin([t[0] for t in trials]))
        removed.append(kept.pop(i))
        scores.append(trials[i])
    scores = np.asarray([scores])
    return PruningResult("greedy", np.asarray([removed], dtype=int).reshape(1, H - 1), scores[..., 0], scores[..., 1])


def prune_theory(config: Config | None = None, M: Real[ArrayLike, "H F"] = None, Q: Real[ArrayLike, "H H"] = None,
                 b: Real[ArrayLike, " H"] = None, order: str | Sequence[int] | Integer[ArrayLike, " K"] = "greedy", *,
                 problem: Problem | None = None, model: Model | None = None, sgd: SGD | None = None,
                 theory: Theory | None = None, draws: int = 16, seed: int = 0) -> PruningResult:
    """Prune the layer with order parameters ``M`` (H, F), ``Q`` (H, H), ``b`` (H,), scoring every kept
    subset by its population risk with its quadrature error in ``stderr`` where one is stated
    (:class:`TheoryRisk`). The run is ``config`` or the specifications by keyword."""
    config = gather_specs("prune_theory", config, problem=problem, model=model, sgd=sgd, theory=theory)
    return _pruned(TheoryRisk(build(config), M, Q, b), M, order, draws, seed)


def _pruned(evaluate: TheoryRisk, M, order, draws: int, seed: int) -> PruningResult:
    """:func:`prune` of the layer of ``evaluate`` (its ``M``: the alignment order's norms) with its stated errors."""
    norms = np.linalg.norm(np.asarray(M, dtype=float), axis=1)
    result = prune(evaluate, evaluate.heads, order, overlap_norms=norms, draws=draws, seed=seed)
    # one Sobol rule states no error; the exact route states its own (against the finer exact rule)
    refined = evaluate.setup.route.route_class.refined_error
    return dataclasses.replace(result, stderr=None) if evaluate.setup.theory.replicates == 1 and not refined else result


def prune_run(run, order: str | Sequence[int] | Integer[ArrayLike, " K"] = "greedy", *, draws: int = 16,
              seed: int = 0) -> dict[str, list[PruningResult]]:
    """Prune the trained layers of a run folder read back by :func:`~singleloc.load_run`, with :func:`prune_theory`:
    the final state of ``theory.npz`` (one layer) and the final order parameters of every seed of ``simulation.npz``
    (one layer per seed; the keys are not stored: for finite-D data, :func:`prune_weights`), all on one rule of the
    run's config (:func:`pruning_setup`, :meth:`TheoryRisk.of_layer`).

    Returns:
        ``{kind: [PruningResult, ...]}`` for each kind of ``run.data`` (``"theory"``: one result;
        ``"simulation"``: one per seed), in the run's order.
    """
    if not (hasattr(run, "config") and hasattr(run, "data")):  # a Run: the run folders stand a floor above (io/)
        raise TypeError(f"prune_run: run must be a singleloc.Run, got {type(run).__name__} {_short(run)}; "
                        "pass singleloc.load_run(folder)")
    return prune_layers(pruning_setup(build(run.config)), run.data, order, draws=draws, seed=seed)


def prune_layers(setup: Setup, data: dict, order: str | Sequence[int], *, draws: int = 16,
                 seed: int = 0) -> dict[str, list[PruningResult]]:
    """:func:`prune_run` of a run's ``data`` (``{kind: arrays}``) on ``setup``, checked and resolved by
    :func:`pruning_setup` (the ``prune`` command's, its route decided once)."""
    results, evaluate = {}, None
    count = sum(1 if kind == "theory" else np.shape(d["M"])[0] for kind, d in data.items())
    with pruning(setup, count, prune_evaluations(setup.heads, order, draws)) as bar:  # said, counted, recorded
        for kind, d in data.items():  # theory.npz: (T, ...) of seed 0; simulation.npz: (S, T, ...)
            M, Q, b = (np.asarray(d[k], dtype=float) for k in "MQb")
            layers = [(M[-1], Q[-1], b[-1])] if kind == "theory" else [(M[s, -1], Q[s, -1], b[s, -1]) for s in range(M.shape[0])]
            results[kind] = []
            for layer in layers:
                evaluate = TheoryRisk(setup, *layer) if evaluate is None else evaluate.of_layer(*layer)
                results[kind].append(_pruned(evaluate, layer[0], order, draws, seed))
                bar.update()
    return results


def prune_weights(config: Config | None = None, K: Real[ArrayLike, "H D"] = None, b: Real[ArrayLike, " H"] = None,
                  kstar: Real[ArrayLike, "F D"] = None, order: str | Sequence[int] | Integer[ArrayLike, " K"] = "greedy", *,
                  problem: Problem | None = None, model: Model | None = None, simulation: Simulation | None = None,
                  draws: int = 16, seed: int = 0, samples: int | None = None, key: int | jax.Array = 0,
                  loss: str = "empirical") -> PruningResult:
    """Prune the finite-D layer ``K`` (H, D), ``b`` (H,) with spikes ``kstar`` (F, D), scoring every kept
    subset on the same fresh sequences (:class:`WeightsRisk`); the greedy choices are made on these Monte
    Carlo estimates, ``stderr`` holds their standard errors, and ``alignment`` ranks by ``|M_h|`` with
    ``M = K k*^T / D``. The run is ``config`` or the specifications by keyword."""
    config = gather_specs("prune_weights", config, problem=problem, model=model, simulation=simulation)
    evaluate = WeightsRisk(build(config, theory=False), K, b, kstar, samples=samples, key=key, loss=loss)
    norms = np.linalg.norm(evaluate.overlaps()[0], axis=1)
    return prune(evaluate, evaluate.heads, order, overlap_norms=norms, draws=draws, seed=seed)


def finetune(config: Config | None = None, M: Real[ArrayLike, "H F"] = None, Q: Real[ArrayLike, "H H"] = None,
             b: Real[ArrayLike, " H"] = None,
             kept: Sequence[int] | Integer[ArrayLike, " K"] = None, ts: Real[ArrayLike, " T"] = None, *,
             problem: Problem | None = None, model: Model | None = None, sgd: SGD | None = None,
             theory: Theory | None = None, **kwargs):
    """Continue the ODE from the pruned layer: :func:`~singleloc.integrate` of the
    ``len(kept)``-head model from ``y0`` = the kept rows/columns of ``(M, Q, b)``, saved at
    ``ts`` (which start at the pruning time, e.g. 0). Returns a :class:`~singleloc.TheoryResult`.
    The run is ``config`` or the specifications by keyword (``model``: the unpruned layer)."""
    config = gather_specs("finetune", config, problem=problem, model=model, sgd=sgd, theory=theory)
    require_uniform_head_weights(config.model, "finetune")
    y0 = keep_heads(M, Q, b, kept)
    ts = np.asarray(ts, dtype=float)
    kwargs.setdefault("t0", float(ts.flat[0]) if ts.size else 0.0)  # the pruned layer is the state at ts[0]
    return integrate(config.replace(model={"heads": len(kept)}), y0, ts=ts, **kwargs)


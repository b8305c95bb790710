"""What a run needs, checked before it starts: the dimension, the quadrature rule, memory.

Dimension. The simulator's held-out risk splits ``R^D`` into the span of the keys and spikes
(``H + F`` directions) and its complement, drawn as a ``chi2(D - H - F)``
(:mod:`singleloc._heldout`): a simulation needs ``D > H + F``. The theory starts from the
overlaps of ``H`` random keys with ``F`` orthogonal spikes, whose ``R_orth = Q - M M^T`` is
the Gram matrix of the keys' components outside the spikes' span: it is nonsingular, as a
generic ODE start must be, only for ``D >= H + F``.

Quadrature. The rule of :class:`~singleloc.LocalFields` integrates over ``d = L H + G`` Gaussian
dimensions (``G = F`` for a prior with a Gaussian part, else 0) with scrambled Sobol points,
which SciPy provides up to :data:`SOBOL_MAX_DIM` dimensions, and whitens the node set, which
needs at least ``d`` points: ``2 points`` nodes (the points and their mirrors) span only
``points`` dimensions, and fewer than ``d`` leave a zero eigenvalue that the whitening divides by.

Memory. Peak bytes, fitted to the peak resident memory of CPU runs (JAX 0.10; within 30 %,
above in most cases), for ``S`` seeds (or ODE starts):

* simulation (float32): ``4 S [D (10 L + 5 (H + F)) + n L (3 (H + F) + 4 H)]``, ``n`` the
  test samples (one step's sample, gradient and keys; the held-out draw of one saved time);
* theory (float64): ``8 [7 N d + 2 S B K (4 L H + H F + 2 H^2)]`` with ``N = 2 points`` nodes,
  ``B = min(N, 8192)`` nodes evaluated at once and ``K`` atoms of the prior (the nodes in
  NumPy while they are built; the vmapped integrand). A solve whose nodes are split over
  several devices (:mod:`~singleloc._sharding`) evaluates up to ``B`` nodes on each; the
  estimate counts ``B`` once (on CPU host devices, which share the host's memory, the integrand
  part can reach the device count times that);
* the saved times (``T = sgd.n_save``, ``R`` replicates): ``8 T R (2 S s + 6 B L H)``, ``s``
  the numbers of one saved state (:func:`state_size`), and the risk at the saved times, whose
  integrand XLA materialises for all of them at once (10 GB at ``T = 4000`` on the rule); the
  simulation stores ``4 S 2 T s`` more. At most :data:`SAVED_MAX` saved times per start
  and replicate: above, XLA's evaluation of the risk needs terabytes or aborts (issue 21);
* plus :data:`OVERHEAD` for the runtime and the compiled programs.

A run whose estimate exceeds the available memory (``MemAvailable`` of ``/proc/meminfo``,
else the free physical pages) is refused before it starts, with the estimate and the keys
that drive it. ``SINGLELOC_MEMORY_LIMIT`` overrides the available memory (bytes, or with a
suffix ``K``, ``M``, ``G``, ``T``: ``SINGLELOC_MEMORY_LIMIT=200G``); ``none`` turns the check off.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path

from ._config import Config
from ._priors import Prior
from ._routes import exact_rule_bytes, route_of
from ._sobol_geometry import SOBOL_MAX_DIM, node_batch, quadrature_dimension
from ._timings import duration as duration  # re-exported: the durations of messages

#: Bytes of the runtime and compiled programs, on top of the arrays.
OVERHEAD = 300 * 2**20

MEMORY_ENV = "SINGLELOC_MEMORY_LIMIT"

#: Most saved times of one ODE start (and replicate): the risk at the saved times is one
#: vectorised evaluation, which XLA materialises whole for many of them (issue 21 item 5).
SAVED_MAX = 16384

#: Most SGD steps of a simulation: step ``t`` draws its sequence from ``fold_in(train, t)``, whose
#: data is 32-bit, and the step counter of ``fori_loop`` is int32 without JAX's x64 mode.
STEP_MAX = 2**31 - 1


def check_dimension(config: Config, use: str) -> None:
    """``simulation.D`` large enough for ``use`` = ``"simulation"`` (``D > H + F``) or
    ``"theory"`` (``D >= H + F``, the initial overlaps); ``ValueError`` naming the keys."""
    H, F, D = config.model.heads, config.problem.F, config.simulation.D
    if use == "simulation" and D <= H + F:
        raise ValueError(f"simulation.D = {D} must exceed model.heads + problem.F = {H + F}: the held-out risk integrates "
                         "the token components outside the span of the keys and spikes")
    if use == "theory" and D < H + F:
        raise ValueError(f"simulation.D = {D} must be at least model.heads + problem.F = {H + F}: the ODE starts from the "
                         "overlaps of D-dimensional keys and spikes, which are degenerate for smaller D")


def check_steps(config: Config) -> None:
    """The simulation's ``round(sgd.tau_max * simulation.D)`` SGD steps can be counted
    (:data:`STEP_MAX`); ``ValueError`` naming the keys otherwise."""
    tau_max, D = config.sgd.tau_max, config.simulation.D
    steps = tau_max * D
    if not steps <= STEP_MAX:
        raise ValueError(f"sgd.tau_max: tau_max * simulation.D = {tau_max:g} * {D} = {steps:.3g} SGD steps, more than the "
                         f"{STEP_MAX} a simulation can count (each step draws its sequence from a 32-bit step index); "
                         "lower sgd.tau_max or simulation.D")


def check_quadrature(L: int, heads: int, prior: Prior, points: int, heads_key: str = "model.heads",
                     principal: bool = False) -> None:
    """The rule over ``L * heads`` fields (on the rank-aware layout, ``principal``: ``2 L heads``
    coordinates) can be built with ``points`` Sobol points; ``ValueError`` naming the keys otherwise
    (``heads_key`` names what plays the heads). ``points = "auto"`` is resolved by ``integrate`` only:
    here it is an error."""
    if not isinstance(points, int):
        raise ValueError(f"theory.points = {points!r}: this computation needs a number of points ('auto' is chosen "
                         "by integrate from the drift at the start); give a power of two, e.g. theory.points = 4096")
    d = quadrature_dimension(L, heads, prior, principal)
    gaussian = "" if prior.is_discrete else " + problem.F (Gaussian prior)"
    dims = (f"{'2 * ' if principal else ''}problem.L * {heads_key}" + gaussian
            + (" (the rank-aware rule)" if principal else ""))
    if d > SOBOL_MAX_DIM:
        raise ValueError(f"the theory's quadrature integrates over {dims} = {d} Gaussian dimensions, more than the "
                         f"{SOBOL_MAX_DIM} of SciPy's Sobol sequence; lower problem.L or {heads_key}")
    if points < d:
        need = 1 << (d - 1).bit_length()
        raise ValueError(f"theory.points = {points} must be at least {dims} = {d} (the quadrature's whitening needs as many "
                         f"points as dimensions): use theory.points = {need} or more")


def simulation_bytes(config: Config) -> int:
    """Estimated peak bytes of :func:`~singleloc.simulate` (module docstring)."""
    pb, H, sim = config.problem, config.model.heads, config.simulation
    r = H + pb.F
    return 4 * sim.seeds * (sim.D * (10 * pb.L + 5 * r) + sim.test_samples * pb.L * (3 * r + 4 * H)
                            + 2 * config.sgd.n_save * state_size(config))


def state_size(config: Config) -> int:
    """Numbers saved per saved time and start: ``M`` (H, F), ``Q`` (H, H), ``b`` (H) and two risks."""
    H, F = config.model.heads, config.problem.F
    return H * F + H * H + H + 2


def check_saved_times(config: Config) -> None:
    """At most :data:`SAVED_MAX` saved times per ODE start and replicate; ``ValueError`` naming
    ``sgd.n_save`` and the bound otherwise."""
    n, R = config.sgd.n_save, config.theory.replicates
    if n * R > SAVED_MAX:
        times = f"sgd.n_save = {n}" + (f" x theory.replicates = {R}" if R > 1 else "")
        raise ValueError(f"{times} saved times per ODE start, more than the {SAVED_MAX} the theory evaluates its risk at "
                         f"(one vectorised evaluation over the saved times: at 60000 XLA asks for terabytes, at 70000 it "
                         f"aborts); lower sgd.n_save to at most {SAVED_MAX // R}")


def saved_bytes(config: Config, starts: int) -> int:
    """Estimated peak bytes of the theory's saved states and of its risk at the saved times
    (module docstring; on the exact route that risk is the Laplace rule's, whose size does not
    depend on ``L``: only the saved states count)."""
    pb, H, th = config.problem, config.model.heads, config.theory
    saved = config.sgd.n_save * th.replicates
    batch = node_batch(pb.L, H)
    nodes = min(2 * th.points, batch) if isinstance(th.points, int) else batch
    risk = 0 if route_of(config).exact else 6 * nodes * pb.L * H
    return 8 * saved * (2 * starts * state_size(config) + risk)


def theory_bytes(config: Config, starts: int, heads: int | None = None) -> int:
    """Estimated peak bytes of the quadrature for ``starts`` ODE starts (module docstring);
    ``heads`` replaces ``model.heads`` (a pruned layer's largest sub-layer)."""
    pb, H, th = config.problem, config.model.heads if heads is None else heads, config.theory
    points = th.points
    exact = route_of(config).exact
    if exact:  # its one Sobol rule, the Gram term's (rank-aware), has as many or more points
        points = th.gram_rule_points(pb.L, H, th.points)
    return rule_bytes(pb.L, H, pb.build_prior(), points, starts, principal=exact or th.rank_aware)


def rule_bytes(L: int, heads: int, prior: Prior, points: int, starts: int = 1, principal: bool = False) -> int:
    """Estimated peak bytes of a rule of ``points`` Sobol points (``N = 2 points`` nodes) over
    ``L * heads`` fields (+ ``F`` for a Gaussian part; ``principal``: the rank-aware layout's
    ``2 L heads`` coordinates) and its integrand for ``starts`` states (module docstring)."""
    N, H, F = 2 * points, heads, prior.F
    d = quadrature_dimension(L, H, prior, principal)
    return 8 * (7 * N * d + 2 * starts * min(N, node_batch(L, H)) * len(prior.atoms) * (4 * L * H + H * F + 2 * H * H))


def _parse_size(text: str) -> float:
    match = re.fullmatch(r"\s*((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e\+?[0-9]+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not match:
        raise ValueError(f"{MEMORY_ENV}={text!r}: expected a size such as 2000000000, 64G or 512M, or 'none'")
    return float(match.group(1)) * 1024 ** " kmgt".index(match.group(2) or " ")


def available_memory() -> tuple[float, str]:
    """Bytes a run may use and where the figure comes from (``inf`` when the check is off)."""
    limit = os.environ.get(MEMORY_ENV, "").strip()
    if limit:
        return (float("inf"), f"{MEMORY_ENV}=none") if limit.lower() == "none" else (_parse_size(limit), f"{MEMORY_ENV}={limit}")
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        match = re.search(r"^MemAvailable:\s+(\d+) kB", meminfo.read_text(), re.MULTILINE)
        if match:
            return 1024.0 * int(match.group(1)), "MemAvailable in /proc/meminfo"
    return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")), "free physical pages"


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def check_memory(parts: dict[str, int]) -> None:
    """Refuse (``MemoryError``, one line) when the estimates ``parts`` (description -> bytes)
    and :data:`OVERHEAD` exceed :func:`available_memory`."""
    total = OVERHEAD + sum(parts.values())
    limit, source = available_memory()
    if total > limit:
        listed = " + ".join(f"{_gb(n)} for {what}" for what, n in sorted(parts.items(), key=lambda kv: -kv[1]))
        raise MemoryError(f"the run needs about {_gb(total)} ({listed}), more than the {_gb(limit)} available ({source}); "
                          f"lower those values, or set {MEMORY_ENV} (a size, or none) to override the estimate")


def check_run(config: Config, *, simulation: bool = False, theory_starts: int = 0) -> None:
    """Everything above, before a command computes: the dimension and memory of a simulation
    of every seed, and of the theory for ``theory_starts`` ODE starts (0: no theory)."""
    pb, H, sim = config.problem, config.model.heads, config.simulation
    parts = {}
    if simulation:
        check_dimension(config, "simulation")
        check_steps(config)
        parts[f"the simulation (simulation.seeds = {sim.seeds} x simulation.D = {sim.D} x problem.L = {pb.L}, "
              f"simulation.test_samples = {sim.test_samples}, sgd.n_save = {config.sgd.n_save})"] = simulation_bytes(config)
    if theory_starts:
        check_dimension(config, "theory")
        exact = route_of(config).exact
        if config.theory.points != "auto":  # "auto" is checked as the points are chosen (singleloc._accuracy)
            if not exact:
                check_quadrature(pb.L, H, pb.build_prior(), config.theory.points,
                                 principal=config.theory.rank_aware)
            parts[f"the theory's quadrature (theory.points = {config.theory.points} x problem.L = {pb.L} x model.heads = {H}, "
                  f"{theory_starts} start(s))"] = theory_bytes(config, theory_starts * config.theory.replicates)
        if exact and (joint := exact_rule_bytes(config.model.activation, H, pb.build_prior())):
            parts[f"the exact route's rule of a joint layer (model.heads = {H}, problem.F = {pb.F}, "
                  f"{len(pb.build_prior().atoms)} atoms of the prior)"] = joint
        check_saved_times(config)
        parts[f"the theory's saved times and their risks (sgd.n_save = {config.sgd.n_save} x {theory_starts} start(s))"] = \
            saved_bytes(config, theory_starts)
    check_memory(parts)


#: Bytes of one local Dask worker process before it computes (Python, JAX and the package).
WORKER_BYTES = OVERHEAD


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_workers(workers: int, name: str = "workers", force: bool = False) -> None:
    """A local cluster of ``workers`` processes can start: an integer >= 1, each process's
    :data:`WORKER_BYTES` within the available memory and (unless ``force``) at most one per
    CPU (:func:`cpu_count`; more only share the same cores); one line naming ``name`` otherwise."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {workers!r}")
    limit, source = available_memory()
    if workers > 1 and workers * WORKER_BYTES > limit:
        raise MemoryError(f"{name} = {workers}: {workers} worker processes need about {_gb(workers * WORKER_BYTES)} before "
                          f"they compute, more than the {_gb(limit)} available ({source}); at most "
                          f"{int(limit // WORKER_BYTES)} fit, and {cpu_count()} (the CPUs) are useful")
    if workers > cpu_count() and not force:
        raise ValueError(f"{name} = {workers} is more than the {cpu_count()} CPUs of this machine (more workers only share "
                         f"them): give {name} <= {cpu_count()}, or pass --force to start them anyway")


# ----------------------------------------------------------------------------- what a run will cost

#: Seconds of ``diagnose``'s cost model, measured on a 2-core CPU (scaled by 2 / the CPUs of this
#: machine): its finite differences and Jacobians cost ``DIAGNOSE_UNIT (L / 256) (1 + E K) / 13`` per
#: analysed row and temperature (``E`` perturbation sizes, ``K`` directions). Estimates within a
#: factor of about 2; they tell a run of minutes from one of days. (The theory's and the
#: simulation's times are measured on the device that runs them: :mod:`singleloc._estimates`.)
DIAGNOSE_UNIT = 0.33e-3
MEASURED_CPUS = 2


@dataclasses.dataclass(frozen=True)
class Cost:
    """What a run will cost: ``work`` in words (steps, sizes), the estimated ``seconds`` and
    peak ``memory`` in bytes, the ``keys`` that drive it (for the message) and the ``basis`` of
    the time (what it was estimated from, when it says more than the model above)."""

    work: str
    seconds: float
    memory: float
    keys: str
    basis: str = ""

    def describe(self) -> str:
        basis = f" ({self.basis})" if self.basis else ""
        return f"{self.work}: about {duration(self.seconds)}{basis} and {_gb(self.memory)} of memory (estimated)"


def _speed() -> float:
    return MEASURED_CPUS / max(1, min(cpu_count(), 64))


def diagnose_cost(shape: tuple, max_rows: int, temperatures: int, epsilons: int, directions: int) -> Cost:
    """The cost of ``diagnose`` of weights of ``shape`` (model above; a shape that
    :func:`~singleloc.diagnose_attention` refuses costs nothing, and is refused there)."""
    L = shape[-1] if shape else 0
    heads = int(math.prod(shape[:-2])) if len(shape) >= 2 else 1
    queries = shape[-2] if len(shape) >= 2 else 1
    rows = heads * (min(max_rows, queries) if max_rows else queries)
    seconds = rows * temperatures * DIAGNOSE_UNIT * (L / 256) * (1 + epsilons * directions) / 13 * _speed()
    work = (f"{rows} rows of L = {L} tokens x {temperatures} temperatures x {epsilons} perturbation sizes x {directions} "
            "directions")
    return Cost(work, seconds, 8.0 * rows * L * (4 + temperatures), "--temperature, --epsilon, --directions or --max-rows")

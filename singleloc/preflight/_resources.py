"""What a run needs, checked before it starts: the dimension, the quadrature rule, memory.

Dimension. The simulator's held-out risk draws the complement of the keys' and spikes' span as a
``chi2(D - H - F)`` (:mod:`singleloc.model._heldout`): a simulation needs ``D > H + F``; the theory's start,
the overlaps of ``H`` random keys with ``F`` spikes, has a nonsingular ``R_orth`` only for ``D >= H + F``.

Quadrature. The rule of :class:`~singleloc.LocalFields` integrates over ``d = L H + G`` Gaussian dimensions
(``G = F`` for a prior with a Gaussian part) with scrambled Sobol points, which SciPy provides up to
:data:`SOBOL_MAX_DIM` dimensions, and its whitening needs at least ``d`` points (``2 points`` nodes, the points
and their mirrors, span only ``points`` dimensions).

Memory. Peak bytes, fitted to the peak resident memory of CPU runs (JAX 0.10; within 30 %,
above in most cases), for ``S`` seeds (or ODE starts):

* simulation (float32): ``4 S [D (10 L + 5 (H + F)) + n L (3 (H + F) + 4 H)]``, ``n`` the
  test samples (one step's sample, gradient and keys; the held-out draw of one saved time);
* theory (float64): ``8 [7 N d + 2 S B K (4 L H + H F + 2 H^2)]`` with ``N = 2 points`` nodes,
  ``B = min(N, 8192)`` nodes evaluated at once and ``K`` atoms of the prior (the nodes in
  NumPy while they are built; the vmapped integrand). A solve whose nodes are split over
  several devices (:mod:`~singleloc.expectations._sharding`) evaluates up to ``B`` nodes on each; the
  estimate counts ``B`` once (on CPU host devices, which share the host's memory, the integrand
  part can reach the device count times that);
* the saved times (``T = sgd.n_save``, ``R`` replicates): ``8 R (2 T S s + 6 min(T, 4) B L H)``, ``s``
  the numbers of one saved state (:func:`state_size`), and the risk at the saved times, whose
  integrand is held for :data:`RISK_BATCH` = 4 of them at a time (softmax1, H = 8, L = 64, 4096 points,
  T = 201: 1.4 GB at its peak); the simulation stores ``4 S 2 T s`` more. At most :data:`SAVED_MAX` saved times per start
  and replicate: above, XLA's evaluation of the risk needs terabytes or aborts;
* plus :data:`OVERHEAD` for the runtime and the compiled programs.

A run whose estimate exceeds the available memory (``MemAvailable`` of ``/proc/meminfo``,
else the free physical pages) is refused before it starts, with the estimate and the keys
that drive it. ``SINGLELOC_MEMORY_LIMIT`` overrides the available memory (bytes, or with a
suffix ``K``, ``M``, ``G``, ``T``: ``SINGLELOC_MEMORY_LIMIT=200G``); ``none`` turns the check off. What a run costs in
time and memory together, for the commands' check of a huge run, is a :class:`Cost`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import numpy as np

from ..configuration._specs import Simulation, Theory
from ..expectations._routes import RouteChoice, exact_route_exists
from ..expectations._sobol_geometry import SOBOL_MAX_DIM, factor_rows, node_batch, quadrature_dimension
from ..model._priors import Prior
from ..runtime._progress import cpu_count, duration
from ._build import Setup

#: Saved states whose risks the theory evaluates together (a loop over batches of them; all at once hold a joint
#: layer's token rule once per state).
RISK_BATCH = 4

#: Bytes of the runtime and compiled programs, on top of the arrays.
OVERHEAD = 300 * 2**20

MEMORY_ENV = "SINGLELOC_MEMORY_LIMIT"

#: The first number of points ``theory.points = "auto"`` tries, and the fewest it may take
#: (:func:`~singleloc.choose_points`).
FIRST_POINTS = 1024
MIN_POINTS = 64

#: Most saved times of one ODE start (and replicate) (:func:`check_saved_times`).
SAVED_MAX = 16384

#: Most SGD steps of a simulation: step ``t`` draws its sequence from ``fold_in(train, t)``, whose
#: data is 32-bit, and the step counter of ``fori_loop`` is int32 without JAX's x64 mode.
STEP_MAX = 2**31 - 1


def check_dimension(H: int, F: int, D: int, use: str) -> None:
    """``simulation.D`` large enough for ``H`` heads and ``F`` spikes for ``use`` = ``"simulation"`` (``D > H + F``) or
    ``"theory"`` (``D >= H + F``, the initial overlaps); ``ValueError`` naming the keys."""
    if use == "simulation" and D <= H + F:
        raise ValueError(f"simulation.D = {D} must exceed model.heads + problem.F = {H + F}: the held-out risk integrates "
                         "the token components outside the span of the keys and spikes; e.g. simulation.D = "
                         f"{max(H + F + 1, 1000)}")
    if use == "theory" and D < H + F:
        raise ValueError(f"simulation.D = {D} must be at least model.heads + problem.F = {H + F}: the ODE starts from the "
                         "overlaps of D-dimensional keys and spikes, which are degenerate for smaller D; e.g. simulation.D = "
                         f"{max(H + F, 1000)}")


def check_steps(tau_max: float, D: int) -> None:
    """The simulation's ``round(sgd.tau_max * simulation.D)`` SGD steps can be counted
    (:data:`STEP_MAX`); ``ValueError`` naming the keys otherwise."""
    steps = tau_max * D
    if not steps <= STEP_MAX:
        raise ValueError(f"sgd.tau_max: tau_max * simulation.D = {tau_max:g} * {D} = {steps:.3g} SGD steps, more than the "
                         f"{STEP_MAX} a simulation can count (each step draws its sequence from a 32-bit step index); "
                         f"e.g. sgd.tau_max = {STEP_MAX // D:g}")


#: The keys a simulation holds in float32, with whether it squares them (|theta|^2 in the loss, the
#: keys' overlaps ``Q ~ init_scale^2``) and an example value for the message.
FLOAT32_KEYS = (("problem", "strength", True, 2.5), ("sgd", "lr", False, 0.5), ("sgd", "init_scale", True, 0.5),
                ("sgd", "weight_decay", False, 0.0), ("sgd", "bias_decay", False, 0.0), ("sgd", "schedule_tau", False, 10.0),
                ("sgd", "decay_factor", False, 0.1), ("sgd", "warmup_tau", False, 1.0))


def check_float32(setup: Setup) -> None:
    """The values a simulation holds in float32 (:data:`FLOAT32_KEYS`, the prior's atoms and
    covariance) are in its range (:func:`~singleloc.ground._validation.representable`): ``ValueError``
    naming the key otherwise (``problem.strength = 1e300`` would be infinite data)."""
    from ..ground._validation import representable

    for section, key, squared, example in FLOAT32_KEYS:
        representable(f"{section}.{key}", getattr(getattr(setup, section), key), "float32", squared=squared,
                      where="the simulation, which runs in float32", example=example)
    atoms, cov = setup.prior.atoms_array(), np.asarray(setup.prior.noise_cov)
    representable("problem.prior", float(np.max(np.abs(atoms))), "float32", squared=True,
                  where="the simulation's atoms of the prior", example=2.5)
    representable("problem.prior", float(np.max(np.abs(cov))), "float32", where="the simulation's covariance of the prior",
                  example=1.0)


def check_quadrature(L: int, heads: int, prior: Prior, points: int, heads_key: str = "model.heads",
                     principal: bool = False, exact_hint: bool = False) -> None:
    """The rule over ``L * heads`` fields (on the rank-aware layout, ``principal``: ``2 L heads`` coordinates) can be
    built with ``points`` Sobol points; ``ValueError`` naming the keys otherwise (``heads_key`` names what plays the
    heads). ``points = "auto"`` is resolved by ``integrate`` only: here it is an error."""
    if not isinstance(points, int):
        raise ValueError(f"theory.points = {points!r}: this computation needs a number of points ('auto' is chosen "
                         "by integrate from the drift at the start); give a power of two, e.g. theory.points = 4096")
    d = quadrature_dimension(L, heads, prior, principal)
    gaussian = "" if prior.is_discrete else " + problem.F (Gaussian prior)"
    dims = (f"{'2 * ' if principal else ''}problem.L * {heads_key}" + gaussian
            + (" (the rank-aware rule)" if principal else ""))
    if d > SOBOL_MAX_DIM:
        room = SOBOL_MAX_DIM - (0 if prior.is_discrete else prior.F)
        fit = (f"problem.L = {room // factor_rows(heads, principal)}" if room // factor_rows(heads, principal) >= 2 else
               f"{heads_key} = {room // (2 * factor_rows(1, principal))} at problem.L = 2")
        raise ValueError(f"the theory's quadrature integrates over {dims} = {d} Gaussian dimensions, more than the "
                         f"{SOBOL_MAX_DIM} of SciPy's Sobol sequence; e.g. {fit}"
                         + (", or the exact route (theory.route = 'auto' or 'exact'), which takes any L" if exact_hint else ""))
    if points < d:
        need = 1 << (d - 1).bit_length()
        raise ValueError(f"theory.points = {points} must be at least {dims} = {d} (the quadrature's whitening needs as many "
                         f"points as dimensions): use theory.points = {need} or more")


def simulation_bytes(L: int, H: int, F: int, sim: Simulation, n_save: int) -> int:
    """Estimated peak bytes of :func:`~singleloc.simulate` of ``sim`` with ``n_save`` saved times (module docstring)."""
    return 4 * sim.seeds * (sim.D * (10 * L + 5 * (H + F)) + sim.test_samples * L * (3 * (H + F) + 4 * H)
                            + 2 * n_save * state_size(H, F))


def state_size(H: int, F: int) -> int:
    """Numbers saved per saved time and start: ``M`` (H, F), ``Q`` (H, H), ``b`` (H) and two risks."""
    return H * F + H * H + H + 2


def check_saved_times(n: int, R: int) -> None:
    """At most :data:`SAVED_MAX` saved times (``sgd.n_save = n``) per ODE start and replicate (``R``); ``ValueError``
    naming ``sgd.n_save`` and the bound otherwise."""
    if n * R > SAVED_MAX:
        times = f"sgd.n_save = {n}" + (f" x theory.replicates = {R}" if R > 1 else "")
        # the fewest saved times are 2: past SAVED_MAX / 2 replicates only fewer replicates help
        remedy = f"sgd.n_save = {SAVED_MAX // R}" if SAVED_MAX // R >= 2 else f"theory.replicates = {SAVED_MAX // n}"
        raise ValueError(f"{times} saved times per ODE start, more than the {SAVED_MAX} the theory evaluates its risk at "
                         f"(one vectorised evaluation over the saved times: at 60000 XLA asks for terabytes, at 70000 it "
                         f"aborts); e.g. {remedy}")


def saved_bytes(L: int, H: int, F: int, th: Theory, n_save: int, route: RouteChoice, starts: int) -> int:
    """Estimated peak bytes of the theory's ``n_save`` saved states (times ``th.replicates``) and of its risk at the
    saved times on ``route`` (module docstring; on the exact route that risk is the Laplace rule's, whose size does
    not depend on ``L``: only the saved states count)."""
    batch = node_batch(L, H)
    nodes = min(2 * th.points, batch) if isinstance(th.points, int) else batch
    risk = 6 * nodes * L * H if route.route_class.field_nodes else 0
    return 8 * th.replicates * (2 * n_save * starts * state_size(H, F) + min(n_save, RISK_BATCH) * risk)


def theory_bytes(L: int, H: int, prior: Prior, th: Theory, route: RouteChoice, starts: int) -> int:
    """Estimated peak bytes of the quadrature of ``route`` (``th``'s points) over ``L`` tokens and ``H`` heads
    for ``starts`` ODE starts (module docstring)."""
    points, principal = route.route_class.memory_points(route, th, L, H, th.points)  # the nodes it holds
    return rule_bytes(L, H, prior, points, starts, principal=principal)


def rule_bytes(L: int, heads: int, prior: Prior, points: int, starts: int = 1, principal: bool = False) -> int:
    """Estimated peak bytes of a rule of ``points`` Sobol points (``N = 2 points`` nodes) over
    ``L * heads`` fields (+ ``F`` for a Gaussian part; ``principal``: the rank-aware layout's
    ``2 L heads`` coordinates) and its integrand for ``starts`` states (module docstring)."""
    N, H, F = 2 * points, heads, prior.F
    d = quadrature_dimension(L, H, prior, principal)
    return 8 * (7 * N * d + 2 * starts * min(N, node_batch(L, H)) * len(prior.atoms) * (4 * L * H + H * F + 2 * H * H))


def available_memory() -> tuple[float, str]:
    """Bytes a run may use and where the figure comes from (``inf`` when the check is off)."""
    limit = os.environ.get(MEMORY_ENV, "").strip()
    if limit.lower() == "none":
        return float("inf"), f"{MEMORY_ENV}=none"
    if limit:
        size = re.fullmatch(r"\s*((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e\+?[0-9]+)?)\s*([kmgt]?)i?b?\s*", limit.lower())
        if not size:
            raise ValueError(f"{MEMORY_ENV}={limit!r}: expected a size such as 2000000000, 64G or 512M, or 'none'")
        return float(size.group(1)) * 1024 ** " kmgt".index(size.group(2) or " "), f"{MEMORY_ENV}={limit}"
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        match = re.search(r"^MemAvailable:\s+(\d+) kB", meminfo.read_text(), re.MULTILINE)
        if match:
            return 1024.0 * int(match.group(1)), "MemAvailable in /proc/meminfo"
    return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")), "free physical pages"


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def check_memory(parts: dict[str, int], remedy: str = "") -> None:
    """Refuse (``MemoryError``, one line) when the estimates ``parts`` (description -> bytes)
    and :data:`OVERHEAD` exceed :func:`available_memory`; ``remedy``: a change that fits (``"e.g.
    theory.points = 1024"``), else the message says to lower the values named."""
    total = OVERHEAD + sum(parts.values())
    limit, source = available_memory()
    if total > limit:
        listed = " + ".join(f"{_gb(n)} for {what}" for what, n in sorted(parts.items(), key=lambda kv: -kv[1]))
        raise MemoryError(f"the run needs about {_gb(total)} ({listed}), more than the {_gb(limit)} available ({source}); "
                          f"{remedy or 'lower those values'}, or set {MEMORY_ENV} (a size, or none) to override the estimate")


def auto_points(L: int, H: int, prior: Prior, points: int | str = "auto") -> int:
    """The rule's ``points`` as a run takes them: for ``"auto"`` the first number it tries (:func:`~singleloc.choose_points`:
    at least ``FIRST_POINTS`` and the quadrature's dimension), the least it may build."""
    if points != "auto":
        return points
    dim = L * H + (0 if prior.is_discrete else prior.F)
    return max(FIRST_POINTS, MIN_POINTS, 1 << (dim - 1).bit_length())


def check_run(setup: Setup, *, simulation: bool = False, theory_starts: int = 0) -> None:
    """Everything above, before a command computes: the dimension and memory of a simulation of every seed, and of the
    theory for ``theory_starts`` ODE starts (0: no theory) on the run's chosen route (``setup``:
    :func:`~singleloc.preflight._build.build`). With ``theory.points = "auto"`` the theory is checked at the first
    points it tries (:func:`auto_points`; it may take more). A run that does not fit is refused with a value of one of
    its keys that fits (:func:`_fitting_value`)."""
    pb, H, route = setup.problem, setup.heads, setup.route
    if simulation:
        check_dimension(H, pb.F, setup.simulation.D, "simulation")
        check_steps(setup.sgd.tau_max, setup.simulation.D)
        check_float32(setup)
    if theory_starts:
        check_dimension(H, pb.F, setup.simulation.D, "theory")
        if route.route_class.field_nodes:
            th = setup.theory
            check_quadrature(pb.L, H, setup.prior, auto_points(pb.L, H, setup.prior, th.points), principal=th.rank_aware,
                             exact_hint=exact_route_exists(route.form, setup.model.weighting))
        check_saved_times(setup.sgd.n_save, setup.theory.replicates)
    parts = _memory_parts(setup, simulation, theory_starts)
    limit, _ = available_memory()
    if OVERHEAD + sum(parts.values()) > limit:
        check_memory(parts, _fitting_value(setup, simulation, theory_starts, limit))


def _memory_parts(setup: Setup, simulation: bool, theory_starts: int) -> dict[str, int]:
    """The estimated bytes of a run (:func:`check_run`), by what holds them."""
    pb, H, sim, th, n_save, prior, route = (setup.problem, setup.heads, setup.simulation, setup.theory, setup.sgd.n_save,
                                            setup.prior, setup.route)
    parts = {}
    if simulation:
        parts[f"the simulation (simulation.seeds = {sim.seeds} x simulation.D = {sim.D} x problem.L = {pb.L}, "
              f"simulation.test_samples = {sim.test_samples}, sgd.n_save = {n_save})"] = \
            simulation_bytes(pb.L, H, pb.F, sim, n_save)
    if theory_starts:
        auto = th.points == "auto"
        if auto:
            th = dataclasses.replace(th, points=auto_points(pb.L, H, prior))
        rule = (f"the theory's quadrature (theory.points = {th.points}" if route.route_class.field_nodes else
                f"the exact route's Gram rule (theory.gram_points = {th.gram_rule_points(pb.L, H, th.points)}") + \
            (" at least, 'auto'" if auto else "")
        parts[f"{rule} x problem.L = {pb.L} x model.heads = {H}, {theory_starts} start(s))"] = \
            theory_bytes(pb.L, H, prior, th, route, theory_starts * th.replicates)
        if joint := route.route_class.rule_bytes(route, H, prior):
            parts[f"the exact route's rule of a joint layer (model.heads = {H}, problem.F = {pb.F}, "
                  f"{len(prior.atoms)} atoms of the prior)"] = joint
        parts[f"the theory's saved times and their risks (sgd.n_save = {n_save} x {theory_starts} start(s))"] = \
            saved_bytes(pb.L, H, pb.F, th, n_save, route, theory_starts)
    return parts


def _fitting_value(setup: Setup, simulation: bool, theory_starts: int, limit: float) -> str:
    """``"e.g. KEY = VALUE"``: the largest value, halving from the current one, of the first key (the simulation's seeds
    and test samples, the rules' points, the saved times, then the heads and the tokens, whose runs decide their own
    route: :meth:`Setup.replace`) at which the run fits in ``limit`` bytes; ``""`` when none does."""
    th, pb, H, prior = setup.theory, setup.problem, setup.heads, setup.prior
    keys = [("simulation", "seeds", setup.simulation.seeds, 1)] if simulation else []
    keys += [("simulation", "test_samples", setup.simulation.test_samples, 1)] if simulation else []
    if theory_starts:
        points = auto_points(pb.L, H, prior, th.points)
        if setup.route.route_class.field_nodes:  # its rule over the fields, down to their dimension
            low = 1 << (quadrature_dimension(pb.L, H, prior, th.rank_aware) - 1).bit_length()
            keys += [("theory", "points", points, max(16, low))]
        else:  # the Gram term's rule, down to theory.points
            keys += [("theory", "gram_points", th.gram_rule_points(pb.L, H, points), max(16, points))]
        keys += [("sgd", "n_save", setup.sgd.n_save, 2)]
    keys += [("model", "heads", H, 1), ("problem", "L", pb.L, 2)]  # the sizes themselves, last
    for section, key, value, minimum in keys:
        while value // 2 >= minimum:
            value //= 2
            trial = setup.replace(**{section: {key: value}})
            if OVERHEAD + sum(_memory_parts(trial, simulation, theory_starts).values()) <= limit:
                return f"e.g. {section}.{key} = {value}"
    return ""


def check_workers(workers: int, name: str = "workers", force: bool = False) -> None:
    """A local cluster of ``workers`` processes can start: an integer >= 1, each process's
    :data:`OVERHEAD` (Python, JAX and the package) within the available memory and (unless ``force``) at most one per
    CPU (:func:`cpu_count`; more only share the same cores); one line naming ``name`` otherwise."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {workers!r}")
    limit, source = available_memory()
    if workers > 1 and workers * OVERHEAD > limit:
        raise MemoryError(f"{name} = {workers}: {workers} worker processes need about {_gb(workers * OVERHEAD)} before "
                          f"they compute, more than the {_gb(limit)} available ({source}); at most "
                          f"{int(limit // OVERHEAD)} fit, and {cpu_count()} (the CPUs) are useful")
    if workers > cpu_count() and not force:
        raise ValueError(f"{name} = {workers} is more than the {cpu_count()} CPUs of this machine (more workers only share "
                         f"them): give {name} <= {cpu_count()}, or pass --force to start them anyway")


@dataclasses.dataclass(frozen=True)
class Cost:
    """What a run will cost, for the commands' check of a huge run (:func:`singleloc._commands._common.check_cost`):
    ``work`` in words, the estimated ``seconds`` and peak ``memory`` in bytes, the ``keys`` that drive it and the
    ``basis`` of the time."""

    work: str
    seconds: float
    memory: float
    keys: str
    basis: str = ""

    def describe(self) -> str:
        basis = f" ({self.basis})" if self.basis else ""
        return f"{self.work}: about {duration(self.seconds)}{basis} and {_gb(self.memory)} of memory (estimated)"


def cpu_speed() -> float:
    """The 2-core CPU's time over this machine's, for the cost models measured there without a calibration."""
    return 2 / max(1, min(cpu_count(), 64))

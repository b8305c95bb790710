"""What a computation will take, said before it starts, from times measured on this device.

**The model.** Each kind of computation (a theory solve, a pruning, an escape prediction, a simulation) has a cost model
in *reference seconds*, its time on the 2-core CPU where the models were fitted (:data:`REFERENCE`). A device keeps
*rates*: measured seconds per reference second, per *shape family* (the computations that share one compiled program,
:func:`~singleloc.runtime._compilation.compile_group`). :func:`estimate` is the model's seconds times the family's rate
(the median of its latest three), else the rate of the nearest family of its kind here (in the model's work per unit),
else the device's :func:`speed`: a short calibration against the same on the reference CPU. Fixed costs (compiling,
loading from the persistent cache, building the rules) are the family's measured seconds, else the model's times the
median measured-over-modelled of its kind's families here, else the model's at the compiler's speed now (the calibration's
kernel compiled).

**The file.** ``timings.json`` in the compilation cache folder (none with ``SINGLELOC_CACHE_DIR=""``): ``{"version": 5,
"devices": {DEVICE: {"families": {KEY: {"kind", "label", "work", "rates", "compile", "load", "prepare", "references",
"env"}}}}}`` (``references``: the model's fixed costs). Only the commands write it (atomically, re-read first), within
:func:`~singleloc.runtime._progress.reporting`'s ``record``; a Python caller keeps what it measures in its process.
Deleting it resets the estimates; a damaged file is ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import timeit
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..configuration._specs import Theory
from ..expectations._routes import RouteChoice
from ..ground._atomic_files import atomic_write
from ..ground._choices import ROUTE_WORDS
from ..model._priors import Prior
from ..runtime._numerics import FITTED_RATE, expected_steps
from ..runtime._progress import Bar, Estimate, Phase, announce, clock, cpu_count, mode, settings
from ._build import Setup
from ._resources import auto_points

#: The reference CPU (2 cores, quiet: load about 1, 2026-12-07), with its calibration (:func:`measure_benchmark` in float64:
#: ``run`` 2.9-3.4 ms, ``compile`` 0.08-0.10 s). ``compile``: a solve's program from an empty cache (exact route: 7.6-14.6 s
#: on eight problems, one to eight heads; ``exact_gram``, two heads with their exact Gram term, ``L H >= 64``: 20-25 s,
#: 0.76x since its one-token expectations are one vmapped evaluation;
#: rule: 2.2-2.9 s on six); ``load``: from the persistent cache; ``prepare``: building its rules and starts (exact 0.8-1.6 s,
#: rule 0.01-0.2 s); ``solve``: drift evaluations (:func:`theory_work`) per adaptive step (Tsit5's six stages), ``saved`` per
#: saved time (:func:`solve_size`); ``sgd_step``: one SGD step per ``seeds x batch x L x D x (H + F)`` and ``sgd_overhead``
#: per step besides (133 and 205 us a step at 14400 and 96000 units), ``measure``: one saved time's held-out risk per
#: ``seeds x test_samples x L x (H + F)``, ``sim_compile`` its programs (2.8-5.4 s); ``risk``: drift evaluations per
#: sub-layer risk of pruning, ``risk_compile`` its program per head; ``prediction``: an escape prediction's programs,
#: ``prediction_drifts`` its drift evaluations besides the Jacobians of its 16 rates (the path's 300 and the Jacobians'
#: ``2 (F + H)`` each, at 2.25 times the rule's cost per unit: :func:`_prediction_model`).
REFERENCE = {
    "benchmark": {"run": 3.0e-3, "compile": 0.09},
    "compile": {"exact": 10.0, "exact_gram": 17.0, "rule": 2.6}, "load": {"exact": 0.7, "exact_gram": 1.2, "rule": 0.17},
    "prepare": {"exact": 1.3, "rule": 0.15}, "solve": 6.0, "saved": 0.35, "sgd_step": 8.8e-10, "sgd_overhead": 1.2e-4,
    "measure": 4.0e-8, "sim_compile": 4.0, "risk": 5.0, "risk_compile": {"exact": 3.3, "rule": 1.3}, "prediction": 4.0,
    "prediction_drifts": 675,
}
VERSION, RATES_KEPT = 5, 3


def device() -> str:
    """``"gpu: NVIDIA H200"``, ``"cpu: AMD EPYC x 2"`` (JAX's first device; a CPU by its model and count)."""
    import jax

    d, model = jax.devices()[0], "cpu"
    if d.platform != "cpu":
        return f"{d.platform}: {d.device_kind}"
    with contextlib.suppress(OSError):
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        model = found.group(1).strip() if found else model
    return f"cpu: {model} x {cpu_count()}"


def timings_path() -> Path | None:
    """Where the records are kept (module docstring); ``None``: in this process only."""
    import jax

    from ..runtime._compilation import cache_dir

    folder = jax.config.jax_compilation_cache_dir or cache_dir()
    return Path(folder) / "timings.json" if folder else None


class Timings:
    """The records of device ``name`` at ``path`` (module docstring); ``here``: the device in words (``"this CPU"``)."""

    def __init__(self, path: Path | None, name: str):
        platform, _, kind = name.partition(": ")
        self.path, self.device, self.data, self.benchmark = path, name, self._read(path), None
        self.here = "this CPU" if platform == "cpu" else f"this {platform.upper()} ({kind})"

    @staticmethod
    def _read(path: Path | None) -> dict[str, Any]:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            data = json.loads(path.read_text())
            if data.get("version") == VERSION and isinstance(data.get("devices"), dict):
                return data
        return {"version": VERSION, "devices": {}}  # none yet, or damaged: replaced by the next record

    def mine(self) -> dict[str, Any]:
        return self.data["devices"].setdefault(self.device, {"families": {}})

    def family(self, key: str) -> dict[str, Any]:
        return self.mine()["families"].get(key, {})

    def families(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.mine()["families"].values() if f.get("kind") == kind]

    def record(self, key: str, kind: str, label: str, work: float, rate: float | None = None, **fields: float) -> None:
        """Add to family ``key``: ``rate`` joins its latest rates, ``fields`` (``compile=12.3``) replace its own."""
        if settings().record:
            self.data = self._read(self.path)  # other processes' records stay
        entry = self.mine()["families"].setdefault(key, {"rates": []})
        entry.update(kind=kind, label=label, work=work, **fields)
        if rate is not None and rate >= 0:
            entry["rates"] = (entry["rates"] + [rate])[-RATES_KEPT:]
        if self.path is not None and settings().record:  # written by the commands only
            text = json.dumps(self.data, indent=1, sort_keys=True).encode()
            with contextlib.suppress(OSError):  # not writable: kept in this process
                self.path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(self.path, lambda fh: fh.write(text))


_CURRENT: list[Timings] = []


def timings() -> Timings:
    """The records of this device at :func:`timings_path` (one object per path and device in a process)."""
    path, name = timings_path(), device()
    if not _CURRENT or (_CURRENT[0].path, _CURRENT[0].device) != (path, name):
        _CURRENT[:] = [Timings(path, name)]
    return _CURRENT[0]


def measure_benchmark() -> dict[str, float]:
    """Seconds of a compiled kernel of small operations one after another, as a drift's are (400 rounds of a 64 x 16
    matrix product, ``tanh`` and a sum of exponentials: one thread, so that it reads the speed of one operation and the
    share of the processor this process gets now; ``run``, the mean of 25 runs) on JAX's first device, and of its first
    call less a run (``compile``: tracing, lowering and compiling it with the solve's options, the faster of two, never
    kept in the persistent cache, so that every process reads its compiler now)."""
    import jax
    import jax.numpy as jnp

    from ..runtime._compilation import compiler_options

    x = jnp.linspace(-1.0, 1.0, 1024).reshape(64, 16)
    body = lambda _, y: (z := jnp.tanh(y @ x[:16]) + x) - 0.01 * jnp.exp(-z ** 2).sum(axis=1, keepdims=True)
    kept, firsts = jax.config.jax_persistent_cache_min_compile_time_secs, []
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1e9)
    try:
        for _ in range(2):  # the faster of two compilations (one alone read 0.09-0.18 s at a load of 3)
            run, t0 = jax.jit(lambda x: jax.lax.fori_loop(0, 400, body, x).sum(), compiler_options=compiler_options()), clock()
            run(x).block_until_ready()
            firsts.append(clock() - t0)
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", kept)
    mean = timeit.timeit(lambda: run(x).block_until_ready(), number=25) / 25
    return {"run": mean, "compile": max(min(firsts) - mean, 0.0)}


def speed(kind: str = "run") -> float:
    """How much slower this device is now than the reference: ``"run"``, its kernels; ``"compile"``, its compiler
    (measured once per process and device; 1 where no estimate is shown, refused or recorded: not worth measuring)."""
    s = settings()
    if mode() == "off" and not s.record and s.run_limit is None and s.point_limit is None:
        return 1.0
    t = timings()
    t.benchmark = t.benchmark or measure_benchmark()
    return t.benchmark[kind] / REFERENCE["benchmark"][kind]


def _median(values) -> float:
    return sorted(values)[len(values) // 2]


def estimate(kind: str, key: str, work: float, size: float) -> Estimate:
    """The seconds of a computation of ``kind`` in family ``key`` whose model says ``size`` reference seconds (``work``:
    its work per unit, to find the nearest family): ``size`` times the family's rate, else the nearest family's of its
    kind here, else :func:`speed`."""
    t = timings()
    if t.family(key).get("rates"):
        return Estimate(size * _median(t.family(key)["rates"]), f"measured on {t.here} for this shape family")
    others = [r for r in t.families(kind) if r.get("rates") and r.get("work", 0) > 0]
    if others and work > 0:
        near = min(others, key=lambda r: abs(math.log(r["work"] / work)))
        return Estimate(size * _median(near["rates"]), f"scaled from {near['label']} on {t.here}")
    return Estimate(size * speed("run"), f"from {t.here}'s speed")


def first_run(e: Estimate) -> Estimate:
    """``e`` with its basis ``"first run of this shape family: ..."`` where it is not the family's measurement."""
    return e if e.basis.startswith("measured") else Estimate(e.seconds, f"first run of this shape family: {e.basis}", e.parts)


def fixed(kind: str, key: str, name: str, reference: float) -> tuple[float, str]:
    """A fixed cost (``name``: ``"compile"``, ``"load"``, ``"prepare"``) of family ``key``, whose model says ``reference``
    seconds, and where it comes from (``""``: measured for it): its own, else ``reference`` times the median of its kind's
    families' measured over their model's seconds (their ``"references"``: a program twice as large compiles twice as
    long), else ``reference`` at the compiler's speed now."""
    t = timings()
    if name in t.family(key):
        return t.family(key)[name], ""
    others = [r[name] / r["references"][name] for r in t.families(kind) if name in r and r.get("references", {}).get(name)]
    return ((reference * _median(others), "as other families here") if others else
            (reference * speed("compile"), f"from {t.here}'s speed"))


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _label(setup: Setup) -> str:
    """``"softmax H=2 L=4 F=2"``."""
    return f"{setup.model.activation} H={setup.heads} L={setup.problem.L} F={setup.problem.F}"


def route_costs(route: RouteChoice) -> tuple[str, str]:
    """The cost class of the chosen ``route`` (``"rule"`` for a route that averages over the fields' nodes, as the Sobol
    rule and Monte Carlo do: :attr:`~singleloc.AbstractExpectation.field_nodes`; else ``"exact"``) and its name in words."""
    return "rule" if route.route_class.field_nodes else "exact", ROUTE_WORDS[route.route]


def theory_work(L: int, H: int, prior: Prior, th: Theory, route: RouteChoice, starts: int) -> float:
    """The reference seconds of one drift evaluation of ``L`` tokens, ``H`` heads and the ``prior``'s atoms on the run's
    ``route``, times its starts and replicates (evaluated in turn): a model fitted to the drifts of 13 problems (2026-12-06,
    load 6-8; within 1.45x of each), scaled to the quiet reference by the rates of 15 solves there (2026-12-07: the exact
    route's 0.14-0.29 of the fit, the rule's 0.3-0.6): on the rule route ``3.2e-8`` s per node, field and atom (``points x
    L H x atoms``; at ``L = 64`` a drift alone costs 2.6 times more per unit, but inside the solve of eight heads to ``tau =
    2100`` about 0.6 times); on the exact route ``(L / 4)^0.35`` times, per atom, ``0.6`` ms per head, and past one head
    ``5`` ms (the Gram term on its Sobol rule; the exact two-head term ``15`` ms and flat in ``L``: drifts of 45-52 ms at
    ``L`` = 64 ... 1024 against 19-22 ms at 4 and 16), at one head ``0.8`` ms (its exact Gram term: one head's drift is
    0.14-0.19 of two heads'), and ``1.6`` ms per pair of heads; a Gaussian prior's one atom counts twice (wide fields, on
    the profile grid: two heads' drift 0.9-1.2 times that under two spikes); a joint layer's rule ``2e-5`` s per unit
    (:func:`~singleloc.expectations._laplace_joint.joint_rule_size`) and half the pairs' (bsoftmax to ``tau = 100``,
    quiet: two heads solved in 3.2 s, three in 58 s)."""
    per, atoms, pairs = starts * th.replicates, len(prior.atoms), H * (H - 1) / 2
    if route.route_class.field_nodes:
        return per * 3.2e-8 * auto_points(L, H, prior, th.points) * L * H * atoms
    atoms *= 1 if prior.is_discrete else 2
    if route.two_head_exact_gram(H):
        return per * atoms * (6e-4 * H + 1.5e-2 + 1.6e-3)
    exact = atoms * (6e-4 * H + (5e-3 + 1.6e-3 * pairs if H > 1 else 8e-4)) * (L / 4) ** 0.35
    if route.form is not None and route.form.joint:
        from ..expectations._laplace_joint import joint_rule_size

        return per * (2.0e-5 * joint_rule_size(H, prior) + 0.5 * exact)
    return per * exact


def solve_size(work: float, span: float, saved: int, rate: float = 1.0, diluted: float = 1.0, weighted: bool = False
               ) -> float:
    """The reference seconds of a solve over ``span`` of ``tau`` with ``saved`` times at the rate per sequence ``rate``:
    ``REFERENCE["solve"]`` drift evaluations per adaptive step, ``REFERENCE["saved"]`` per saved time's risk. The steps:
    :func:`~singleloc.runtime._numerics.expected_steps` (as ``rate^0.75`` past 1) up to ``tau = 215``, then as
    ``span^0.5`` (the fast modes settle: five problems, 16-57 steps to 200, 57-114 to 1700-2100, 85-199 to 3000), past
    ``tau = 3000`` as ``span`` again (near a fixed point the stability of the fastest decaying mode holds the step: one
    and two softmax heads, spikes and Gaussian prior, 84-347 steps to 3000, 370-2205 to 20000, the law 120 and 803).
    ``diluted``: the sequence length of a layer whose attention on the relevant token starts at ``1 / L``: past ``L = 64``
    the steps fall as ``(64 / L)^0.5`` (the default problem to ``tau = 300``: 38, 28, 22, 11, 10 steps at ``L`` = 64 ...
    1024). ``weighted``: trained head weights, whose mode holds the step from the start: the expected steps of such a
    solve, in proportion to the span (two heads: 76-164 steps to 300, 379-1712 to 3000, 4758 to 20000)."""
    settling = 1.0 if weighted else (215.0 / min(max(span, 215.0), 3000.0)) ** 0.5
    steps = expected_steps(rate, span, weighted) * settling * min(1.0, 64.0 / diluted) ** 0.5
    return work * (REFERENCE["solve"] * steps + REFERENCE["saved"] * saved)


def _prediction_model(setup: Setup) -> tuple[str, str, float, float]:
    """The kind, key, work and reference seconds of an escape prediction's drift evaluations: the symmetric path and the
    Jacobians of its 16 rates (along ``F + H`` antisymmetric directions each, by central differences), on the Sobol rule
    at :meth:`~singleloc.configuration._specs.Theory.prediction_points` whatever the run's route
    (:func:`~singleloc.analysis._predictions.prediction_setup`)."""
    from ..runtime._compilation import compile_group

    pb, H, th = setup.problem, setup.heads, setup.theory
    points = auto_points(pb.L, H, setup.prior, th.points) if setup.route.on_sobol_rule else None
    rule = setup.on_rule_route(th.prediction_points(pb.L, H, points))  # as the prediction takes it, unprobed
    work = theory_work(pb.L, H, setup.prior, rule.theory, rule.route, 1)
    size = (REFERENCE["prediction_drifts"] + 2.25 * 16 * 2 * (pb.F + H)) * work
    return "prediction:rule", f"prediction:{_digest(compile_group('prediction', setup.config.to_dict()))}", work, size


def _programs(kind: str, key: str, reference: float) -> float:
    """Seconds making the programs of family ``key``: loaded where it has run here with the persistent cache, as measured
    (before its first load, half its compile time: traced and lowered again, then read), else compiled (:func:`fixed`)."""
    import jax

    rec = timings().family(key)
    if jax.config.jax_compilation_cache_dir and ("load" in rec or "compile" in rec):
        return rec.get("load", 0.5 * rec.get("compile", 0.0))
    return fixed(kind, key, "compile", reference)[0]


@contextlib.contextmanager
def _timed(key: str, kind: str, label: str, work: float, size: float, compiling: float, units: int = 1) -> Iterator[None]:
    """Record the computation of the block: the seconds making its programs (JAX's compilation events, as compiling if
    XLA compiled one, the persistent cache missing it or absent, else as loading; ``compiling``: the model's) and the rate
    of the rest (``units`` of ``size`` reference seconds)."""
    import jax

    from ..runtime._progress import PROGRAMS_MADE, _listen_to_compiles

    _listen_to_compiles()
    t0, before = clock(), dict(PROGRAMS_MADE)
    yield
    programs = PROGRAMS_MADE["seconds"] - before["seconds"]
    compiled = PROGRAMS_MADE["misses"] > before["misses"] or not jax.config.jax_compilation_cache_dir
    timings().record(key, kind, label, work, max(clock() - t0 - programs, 0.0) / (units * size),
                     references={"compile": compiling}, **{"compile" if compiled else "load": programs})


def prediction_estimate(setup: Setup) -> Estimate:
    """The estimate of an escape prediction: its drift evaluations and its programs (:func:`_programs`)."""
    kind, key, work, size = _prediction_model(setup)
    run = estimate(kind, key, work, size)
    return first_run(Estimate(_programs(kind, key, REFERENCE["prediction"]) + run.seconds, run.basis))


def recorded(setup: Setup) -> contextlib.AbstractContextManager[None]:
    """Record the time of the escape prediction of ``setup`` computed in the block."""
    kind, key, work, size = _prediction_model(setup)
    return _timed(key, kind, f"prediction, {_label(setup)}", work, size, REFERENCE["prediction"])


#: The families whose solve this process has compiled or loaded (nothing to compile or load).
_IN_PROCESS: set[str] = set()


class TheorySolve:
    """The estimate, the phases and the record of one solve: ``program`` (``"integrate"`` or ``"integrate_points"``),
    the ``setup`` of its first point, ``starts`` per point, ``saved`` times, the ``span`` of ``tau`` (the longest of a
    batch), ``rates``: the rates per sequence of the points solved together, each at its own steps (one point: the
    setup's); ``cached``: whether the program can come from the persistent cache (not
    with diffrax's progress bar, a host callback, which then draws instead of the live line); ``built``: its rules are."""

    def __init__(self, program: str, setup: Setup, starts: int, saved: int, span: float, rates: Sequence[float] = (),
                 cached: bool = True, built: bool = False):
        import jax

        from ..runtime._compilation import _environment, compile_group

        route, words = route_costs(setup.route)
        made = "exact_gram" if setup.route.two_head_exact_gram(setup.heads) else route
        rates = rates or (setup.sgd.rate,)
        batch = len(rates)
        self.work = theory_work(setup.problem.L, setup.heads, setup.prior, setup.theory, setup.route, starts * batch)
        self.span, self.batch, self.draw, self.kind = float(span), batch, cached, f"{program}:{route}"
        form, group = setup.route.form, setup.config.to_dict()
        diluted = setup.problem.L if form is None or form.scale == 1 else 1.0
        weighted = not setup.model.weighting.head_average
        self.size = sum(solve_size(self.work / batch, self.span, saved, rate, diluted, weighted) for rate in rates)
        if made == "exact_gram":  # one program for every L
            group["problem"] = {k: v for k, v in group["problem"].items() if k != "L"}
        self.key = f"{program}:{_digest(compile_group('theory', group), route, starts, saved, batch)}"
        self.label, self._prepared, self.finished = f"{program}, {_label(setup)} on the {words} route", None, True
        self.env, self.cache = _digest(repr(_environment())), cached and bool(jax.config.jax_compilation_cache_dir)
        self.references = {"prepare": REFERENCE["prepare"][route], "compile": REFERENCE["compile"][made],
                           "load": REFERENCE["load"][made]}
        rec = timings().family(self.key)
        self.expect, self.why = (
            ("run", "") if self.key in _IN_PROCESS else
            ("compile", "programs are compiled in every process without the compilation cache") if not self.cache else
            ("load", "") if rec.get("env") == self.env and ("compile" in rec or "load" in rec) else
            ("compile", "the package changed since its last run" if rec else "first run of this shape family"))
        solve = estimate(self.kind, self.key, self.work, self.size)
        prepare = 0.0 if built else fixed(self.kind, self.key, "prepare", self.references["prepare"])[0]
        first, how = fixed(self.kind, self.key, self.expect, self.references[self.expect]) if self.expect != "run" else (0, "")
        if self.expect == "load" and how and "compile" in rec:  # compiled here, never loaded yet
            first, how = rec["compile"] * self.references["load"] / self.references["compile"], "scaled from its compile time"
        doing = {"run": "", "load": "loading the stored program", "compile": "compiling"}[self.expect]
        basis = first_run(solve).basis + (f"; {doing} {how}" if how and solve.basis.startswith("measured") else "")
        if max(rates) > FITTED_RATE:  # sgd.lr = 1e4: "about 12 h", then it diverged in 2 min
            basis += (f"; its steps extrapolated from rates up to {FITTED_RATE:g}: at sgd.lr = {setup.sgd.lr:g} a solve "
                      "usually diverges or stops long before")
        self.estimate = Estimate(prepare + first + solve.seconds, basis, (("building the rules", prepare),)
                                 + (((doing, first),) if doing else ()) + (("solving", solve.seconds),))

    @classmethod
    def of_batch(cls, problems) -> TheorySolve:
        """The solve of points solved together (:func:`~singleloc.theory._ode.integrate_points`: their prepared problems,
        whose rules are built), announced."""
        span, first = max(float(p.args[3][-1] - p.args[3][0]) for p in problems), problems[0]
        solve = cls("integrate_points", first.setup, int(first.args[2].M.shape[0]), first.saved, span,
                    [p.setup.sgd.rate for p in problems], built=True)
        solve.announce(f"{solve.label}, {len(problems)} points to tau = {span:g}")
        return solve

    def announce(self, what: str | None = None) -> None:
        """Say the estimate (refused over the limit: :func:`~singleloc.runtime._progress.announce`)."""
        announce(what or f"{self.label}, to tau = {self.span:g}", self.estimate,
                 "lower sgd.tau_max (or --horizon), model.heads or problem.L, or set theory.route = rule")

    @contextlib.contextmanager
    def preparing(self) -> Iterator[Phase]:
        """The phase of building the solve's rules and starts (said if it lasts), recorded."""
        with Phase(("building the quadrature rules", "built the quadrature rules"), [self.estimate.parts[0][1]],
                   quiet=True) as phase:
            yield phase
        self._prepared = phase.seconds[-1]

    @contextlib.contextmanager
    def solving(self) -> Iterator[Phase]:
        """The solve's phase: compiling or loading, then solving (moved on by JAX's compilation event of the solve's
        program); then the times are recorded: the first stage's as compiling or loading, the rate of the solve's where
        it ran to its end (the caller sets :attr:`finished`: a solve stopped early, by its step budget or by fields its
        rule does not resolve, did a fraction of the work its size counts, and its rate would make the family's next
        estimates that much too short)."""
        solve = (f"solving to tau = {self.span:g}" + (f" ({self.batch} points together)" if self.batch > 1 else ""), "solved")
        stages = {"run": [solve], "load": [(f"loading the stored solve ({self.label})", "loaded the stored solve"), solve],
                  "compile": [(f"compiling the solve ({self.label}; {self.why})", "compiled the solve"), solve]}[self.expect]
        with Phase(stages, [s for _, s in self.estimate.parts[1:]], draw=self.draw,  # not over diffrax's bar
                   follow_compiles=("jit(call)", "jit(_trajectories)", "jit(_run_points)"),
                   overrun="a stiff ODE takes many small steps (a learning rate past stability: lower sgd.lr); "
                           "Ctrl-C stops it") as phase:
            yield phase
        self._record(phase)

    def _record(self, phase: Phase) -> None:
        _IN_PROCESS.add(self.key)
        fields = {} if self._prepared is None else {"prepare": self._prepared}
        if len(phase.seconds) == 2:  # its program compiled or was loaded (the compilation event came), then ran
            fields["compile" if phase.cache_misses or not self.cache else "load"] = phase.seconds[0]
        old = timings().family(self.key)
        fields = {k: 0.5 * (v + old[k]) if k in old and old.get("env") == self.env else v for k, v in fields.items()}
        timings().record(self.key, self.kind, self.label, self.work, phase.seconds[-1] / self.size if self.finished else None,
                         env=self.env if self.cache else old.get("env"), references=self.references, **fields)


def prune_evaluations(H: int, order, draws: int) -> int:
    """Sub-layer risks one layer's pruning evaluates (greedy: ``H (H + 1) / 2``)."""
    return H * (H + 1) // 2 if order == "greedy" else H * (draws if order == "random" else 1)


@contextlib.contextmanager
def pruning(setup: Setup, layers: int, evaluations: int) -> Iterator[Bar]:
    """Announce the pruning on ``setup``'s route of ``layers`` layers of ``evaluations`` sub-layer risks each (a risk
    ``REFERENCE["risk"]`` drifts; its programs, a risk per head), count them in the caller's bar, record the times."""
    H = setup.heads
    route, work = route_costs(setup.route)[0], theory_work(setup.problem.L, H, setup.prior, setup.theory, setup.route, 1)
    key, size = f"prune:{_digest(_label(setup), route, work, evaluations)}", REFERENCE["risk"] * work * evaluations
    per = estimate(f"prune:{route}", key, work, size)
    compiling = REFERENCE["risk_compile"][route] * H
    first = _programs(f"prune:{route}", key, compiling)
    whole = first_run(Estimate(first + layers * per.seconds, per.basis))
    announce(f"pruning {layers} layer(s) of {H} heads, {evaluations} sub-layer risks each", whole, "lower model.heads")
    with (_timed(key, f"prune:{route}", f"prune, {_label(setup)}", work, size, compiling, layers),
          Bar(layers, "pruning", "layer", estimate=whole, each=True, done="pruned {n} layer(s)", announced=True) as bar):
        yield bar

"""What a computation will take, said before it starts, from times measured on this device.

Theory solves (:func:`~singleloc.integrate`, :func:`~singleloc.theory._ode.integrate_points`). A solve
is one compiled program per shape family (:func:`theory_family`), so its time is the time to
compile that program (or to load it from the persistent compilation cache, or nothing when this
process holds it) and the time to solve, which grows with the span of ``tau`` solved.
:class:`TheorySolve` estimates both from the records of :mod:`singleloc.runtime._timings`: for a family
run before on this device, its own compile or load time and the line through its solves' times
against ``tau``; for a new family, the compile time of the same route's families here and the
solve time of the nearest of them (in :func:`theory_work`, the quadrature's size: nodes times
fields times starts) scaled by the work; on a device without records, the reference times of
the 2-core CPU where this was fitted (:data:`REFERENCE`) scaled by :func:`speed`, the device's
calibration against that CPU's. It then runs the solve as a phase that follows JAX's
compilation events (:class:`~singleloc.runtime._progress.Phase`: ``compiling the solve (...)``, then
``solving to tau = ...``) and records what it measured, so that the next estimate of the family
is measured.

Pruning (:func:`prune_estimate`): the seconds per sub-layer risk measured for the family (the
first layer also compiles one risk per head count), else the reference's. Simulations and
``compare``: :mod:`singleloc.simulation._simulation_estimate`; sweeps: :mod:`singleloc.sweeps._sweep_estimate`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Iterator
from typing import Any

from ..configuration._choices import ROUTE_WORDS
from ..configuration._config import Config
from ._progress import Phase, announce
from ._progress_bar import Bar
from ._timings import Estimate, device_label, predict, timings

#: The reference: the 2-core CPU where the cost models were fitted (shared, at load 5-7 on
#: 2026-12-04), with its calibration (:func:`~singleloc.runtime._timings.measure_benchmark`) at the same
#: time. ``compile``: a theory solve's program from an empty cache (tracing, exporting, XLA's
#: compilation: 34 s on the exact route, 4.2 s on the rule route, the default problem); ``load``:
#: the same from the persistent cache (1.1 s); ``prepare``: building its rules and starts (about 1 s);
#: ``solve``: drift evaluations (:func:`theory_work`)
#: per unit of ``tau`` solved (the adaptive steps), ``saved`` per saved time (its risk, the error
#: checks): 6.2 s to ``tau = 300`` at 27 ms a drift, 61 saved times; ``sgd_step``: seconds of one
#: SGD step per ``seeds x batch x L x D x (H + F)`` (6.0 s for the default simulation), ``sim_compile``
#: the compilation of its step and measurement (8 s);
#: ``measure``: seconds of one saved time's held-out risk per ``seeds x test_samples x L x (H + F)``;
#: ``risk``: drift evaluations per sub-layer risk of pruning, ``risk_compile`` its program per head
#: count (11 s for the default layer); ``prediction``: an escape prediction's program (62 s in all
#: for the default problem), and ``prediction_drifts`` its drift evaluations besides the Jacobians
#: of its ``n_rates = 16`` rates, of ``H F + H^2 + H`` columns each.
REFERENCE = {
    "benchmark": {"run": 1.84e-3, "host": 1.26e-2},
    "compile": {"exact": 34.0, "rule": 4.2}, "load": {"exact": 1.1, "rule": 0.5}, "prepare": 1.0,
    "solve": 0.7, "saved": 0.35, "sgd_step": 3.1e-9, "measure": 2.0e-8, "sim_compile": 8.0,
    "risk": 0.5, "risk_compile": {"exact": 5.0, "rule": 2.0},
    "prediction": {"exact": 50.0, "rule": 10.0}, "prediction_drifts": 300,
}

#: The families whose solve this process has compiled or loaded (no compile or load to wait for).
_IN_PROCESS: set[str] = set()


def speed(kind: str = "run") -> float:
    """How much slower this device is than the reference (``kind``: ``"run"`` for the device's
    kernels, ``"host"`` for the compiler's host), from :meth:`~singleloc.runtime._timings.Timings.benchmark`."""
    return timings().benchmark()[kind] / REFERENCE["benchmark"][kind]


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _environment() -> str:
    """What makes a stored program stale: the package's sources, the versions and options
    (:func:`singleloc.runtime._compilation._environment`)."""
    from ._compilation import _environment

    return _digest(repr(_environment()))


def _route(config: Config) -> str:
    """The cost class of the route: ``"exact"``, or ``"rule"`` for a route over the fields' nodes (the Sobol
    rule, plain Monte Carlo)."""
    return _route_and_gram(config)[0]


def _route_and_gram(config: Config) -> tuple[str, str | None]:
    """:func:`_route` and, on the exact route, how its Gram term is computed (``"exact"``, ``"sobol"``, ...)."""
    from ..expectations._routes import route_of

    choice = route_of(config)
    return ("rule", None) if choice.route_class.field_nodes else ("exact", choice.gram)


def _label(config: Config) -> str:
    """``"softmax H=2 L=4 F=2"``."""
    pb, m = config.problem, config.model
    return f"{m.activation} H={m.heads} L={pb.L} F={pb.F}"


def theory_features(config: Config, starts: int, saved: int | None = None) -> dict[str, Any]:
    """What the cost of a solve depends on (for scaling one family's times to another's)."""
    pb, H, th = config.problem, config.model.heads, config.theory
    prior = pb.build_prior()
    points = th.points if isinstance(th.points, int) else 4096
    route, gram = _route_and_gram(config)
    features = {"route": route, "gram": gram, "activation": config.model.activation, "H": H, "F": pb.F, "L": pb.L,
                "atoms": len(prior.atoms), "points": points, "replicates": th.replicates, "starts": starts,
                "saved": config.sgd.n_save if saved is None else saved}
    if features["route"] == "exact":
        from ..model._activations import exponential_form, get_activation

        form = exponential_form(get_activation(config.model.activation), pb.L)
        if form is not None and form.joint:
            from ..expectations._laplace_joint import joint_rule_size

            features["joint"] = joint_rule_size(H, prior)
    return features


def theory_work(features: dict[str, Any]) -> float:
    """The seconds of one drift evaluation on the reference CPU (:data:`REFERENCE`), a model fitted
    there: on the rule route ``3.2e-8`` s per node, field and atom (``2 points x L H x atoms``);
    on the exact route ``3.3`` ms per ``H^2 atoms`` with the Gram term on the Sobol rule, ``11`` ms with the exact
    two-head Gram term (the pairs of heads on the Laplace rule and the Gram term: neither grows with ``L``, whose
    exponents are values) and ``57`` microseconds per unit of a joint layer's rule
    (:func:`~singleloc.expectations._laplace_joint.joint_rule_size`); times the starts and replicates (one vmapped
    evaluation). Measured at load 6 on the 2-core CPU: 27 ms (softmax, H = 2, L = 4), 89 ms (L = 64, the exact Gram
    term), 159 ms (softmax1, H = 4, F = 3), 1.05 s (bsoftmax, H = 3), 4 ms (the rule route's default, 4096 points).
    (The model before scaled the exact route by ``1 + L / 22``: ``L = 1024`` after ``L = 64`` was announced at 40
    times its solve.)"""
    f = features
    per = f["starts"] * f["replicates"]
    if f["route"] == "rule":
        return per * 3.2e-8 * 2.0 * f["points"] * f["L"] * f["H"] * f["atoms"]
    pairs = 2.8e-3 * f["H"] ** 2 * f["atoms"] * (3.9 if f.get("gram") == "exact" else 1.18)
    return per * (57e-6 * f["joint"] + 0.1 * pairs if f.get("joint") else pairs)


def solve_size(features: dict[str, Any], span: float) -> float:
    """The reference seconds of a solve over ``span`` of ``tau``: :func:`theory_work` times the
    drift evaluations of the adaptive steps (``REFERENCE["solve"]`` per unit of ``tau``) and of
    the risks at the saved times (``REFERENCE["saved"]`` each)."""
    return theory_work(features) * (REFERENCE["solve"] * span + REFERENCE["saved"] * features.get("saved", 61))


def theory_family(program: str, config: Config, starts: int, saved: int, batch: int = 1) -> str:
    """The shape family of a solve: its program, the configuration without the values the program
    receives as arguments (:func:`~singleloc.runtime._compilation.compile_group`), the route, the starts,
    the saved times and the points solved together."""
    from ._compilation import compile_group

    return f"{program}:{_digest(compile_group('theory', config.to_dict()), _route(config), starts, saved, batch)}"


def _nearest(records: list[dict], work: float, key) -> dict | None:
    """The record whose work is nearest ``work`` (in ratio), among those with a value ``key``."""
    usable = [r for r in records if key(r) and theory_work(r["features"]) > 0]
    return min(usable, key=lambda r: abs(math.log(theory_work(r["features"]) / work)), default=None)


class TheorySolve:
    """The estimate, the phases and the record of one solve (module docstring): ``program``
    (``"integrate"`` or ``"integrate_points"``), the ``config`` of its first point, ``starts``
    per point, ``saved`` times, ``span`` of ``tau`` solved (the longest of a batch), ``batch``
    points solved together; ``cached``: whether the program can come from the persistent cache
    (not with diffrax's progress bar, a host callback)."""

    def __init__(self, program: str, config: Config, starts: int, saved: int, span: float, batch: int = 1,
                 cached: bool = True):
        import jax

        from ..expectations._routes import route_of

        self.program, self.config, self.span, self.batch = program, config, float(span), batch
        self.key = theory_family(program, config, starts, saved, batch)
        self.features = theory_features(config, starts * batch, saved)
        self.label = f"{program}, {_label(config)} on the {ROUTE_WORDS[route_of(config).route]} route"
        self.environment = _environment()
        self.cache = cached and bool(jax.config.jax_compilation_cache_dir)
        self.meter = not cached  # diffrax's progress bar shows the solve
        self.record = timings().family(self.key)
        self.expect, self.why = self._expectation()
        self.estimate = self._estimate()

    @classmethod
    def of_batch(cls, problems) -> TheorySolve:
        """The solve of points solved together (:func:`~singleloc.theory._ode.integrate_points`: their
        prepared problems, whose ``args`` are the starts, the saved times, ...), announced."""
        y0 = problems[0].args[2]
        span = max(float(p.args[3][-1] - p.args[3][0]) for p in problems)
        solve = cls("integrate_points", problems[0].config, int(y0.M.shape[0]), problems[0].saved, span, batch=len(problems))
        prepared = solve.estimate.parts[0][1]  # the rules of the points are built already
        solve.estimate = Estimate(solve.estimate.seconds - prepared, solve.estimate.basis,
                                  (("building the rules", 0.0),) + solve.estimate.parts[1:])
        solve.announce(f"{solve.label}, {len(problems)} points to tau = {span:g}")
        return solve

    def _expectation(self) -> tuple[str, str]:
        """``("run" | "load" | "compile", why)``: what the program needs before it solves."""
        if self.key in _IN_PROCESS:
            return "run", "compiled in this process"
        if not self.cache:
            return "compile", "programs are compiled in every process without the compilation cache"
        rec = self.record
        if rec and rec.get("env") == self.environment and ("compile" in rec or "load" in rec):
            return "load", "stored by an earlier run"
        return "compile", "the package changed since its last run" if rec else "first run of this shape family"

    def _estimate(self) -> Estimate:
        records = [r for r in timings().families(self.program) if r.get("features", {}).get("route") == self.features["route"]]
        route, work = self.features["route"], theory_work(self.features)
        size = lambda features: lambda span: solve_size(features, span)  # noqa: E731
        here = device_label(timings().device)
        rec, basis = self.record, []
        # before the solve: compile or load
        first = 0.0
        if self.expect != "run":
            if rec and self.expect in rec:
                first = rec[self.expect]
            elif rec and self.expect == "load" and "compile" in rec:  # compiled here before, never loaded yet
                first = rec["compile"] * REFERENCE["load"][route] / REFERENCE["compile"][route]
                basis.append("loading scaled from its compile time here")
            else:
                others = sorted(r[self.expect] for r in records if self.expect in r)
                first = others[len(others) // 2] if others else REFERENCE[self.expect][route] * speed("host")
                basis.append(f"{'compiling' if self.expect == 'compile' else 'loading'} "
                             + ("as this route's other families here" if others else f"from {here}'s speed"))
        # the solve
        if rec and rec.get("runs"):
            solve = predict(rec["runs"], self.span, size(self.features))
        else:
            near = _nearest(records, work, lambda r: r.get("runs"))
            if near is not None:  # its measured rate against the reference model, times this one's model
                solve = (predict(near["runs"], self.span, size(near["features"]))
                         * solve_size(self.features, self.span) / solve_size(near["features"], self.span))
                basis.append(f"solving scaled from {near.get('label', 'a similar family')}")
            else:
                solve = solve_size(self.features, self.span) * speed("run")
                basis.append(f"solving from {here}'s speed")
        if basis == [f"compiling from {here}'s speed", f"solving from {here}'s speed"]:
            basis = [f"from {here}'s speed"]
        prepare = rec["prepare"] if rec and "prepare" in rec else REFERENCE["prepare"] * speed("host")
        text = (f"measured on {here} for this shape family" if not basis else
                ("first run of this shape family: " if not rec else "") + "; ".join(basis))
        what = {"run": "", "load": "loading the stored program", "compile": "compiling"}[self.expect]
        parts = (("building the rules", prepare),) + (((what, first),) if what else ()) + (("solving", solve),)
        return Estimate(prepare + first + solve, text, parts)

    def announce(self, what: str | None = None) -> None:
        """Say the estimate (and refuse it over the limit: :func:`~singleloc.runtime._progress.announce`)."""
        announce(what or f"{self.label}, to tau = {self.span:g}", self.estimate,
                 "lower sgd.tau_max (or --horizon), model.heads or problem.L, or set theory.route = rule")

    def stages(self) -> list[tuple[str, str]]:
        solve = (f"solving to tau = {self.span:g}" + (f" ({self.batch} points together)" if self.batch > 1 else ""), "solved")
        if self.expect == "run":
            return [solve]
        if self.expect == "load":
            return [(f"loading the stored solve ({self.label})", "loaded the stored solve"), solve]
        return [(f"compiling the solve ({self.label}; {self.why})", "compiled the solve"), solve]

    @contextlib.contextmanager
    def preparing(self) -> Iterator[Phase]:
        """The phase of building the solve's rules and starts (quiet: said if it lasts), recorded."""
        with Phase(("building the quadrature rules", "built the quadrature rules"), [self.estimate.parts[0][1]],
                   quiet=True) as phase:
            yield phase
        self._prepared = phase.seconds[-1]

    @contextlib.contextmanager
    def solving(self) -> Iterator[Phase]:
        """The solve's phase (compiling or loading, then solving, moved on by JAX's compilation
        event of the solve's program), then its record (module docstring)."""
        parts = [s for _, s in self.estimate.parts[1:]]
        phase = Phase(self.stages(), parts, follow_compiles=("jit(call)", "jit(_trajectories)", "jit(_run_points)"),
                      draw=not self.meter,  # not over diffrax's own bar (progress=True)
                      overrun="a stiff ODE takes many small steps (a learning rate past stability: lower sgd.lr); "
                              "Ctrl-C stops it")
        with phase:
            yield phase
        self._record(phase)

    def _record(self, phase: Phase) -> None:
        _IN_PROCESS.add(self.key)
        two = len(phase.seconds) == 2  # its program compiled or was loaded (the compilation event came), then ran
        before, solve = (phase.seconds[0], phase.seconds[1]) if two else (0.0, phase.seconds[-1])
        fields = {}
        if two and (phase.cache_misses or not self.cache):
            fields["compile"] = before
        elif two:
            fields["load"] = before
        if getattr(self, "_prepared", None) is not None:
            fields["prepare"] = self._prepared
        old = self.record or {}
        fields = {k: 0.5 * (v + old[k]) if k in old and old.get("env") == self.environment else v for k, v in fields.items()}
        timings().record(self.key, self.program, label=self.label, features=self.features, run=(self.span, solve),
                         env=self.environment if self.cache else old.get("env"), **fields)


# ----------------------------------------------------------------------------- pruning


def _prune_family(config: Config) -> tuple[str, dict[str, Any]]:
    features = theory_features(config, 1)
    return f"prune:{_digest(features)}", features


def prune_evaluations(H: int, order, draws: int) -> int:
    """Sub-layer risks one layer's pruning evaluates (greedy: ``H (H + 1) / 2``)."""
    if order == "greedy":
        return H * (H + 1) // 2
    return H * (draws if order == "random" else 1)


def prune_estimate(config: Config, layers: int, evaluations: int) -> Estimate:
    """The time of pruning ``layers`` layers of ``evaluations`` risks each (module docstring)."""
    key, features = _prune_family(config)
    rec = timings().family(key)
    here = device_label(timings().device)
    work = theory_work(features)
    if rec and rec.get("runs"):
        per = predict(rec["runs"], evaluations)
        first = rec.get("compile", 0.0)
        return Estimate(first + layers * per, f"measured on {here} for this shape family")
    route = features["route"]
    first = REFERENCE["risk_compile"][route] * features["H"] * speed("host")
    per = REFERENCE["risk"] * work * evaluations * speed("run")
    return Estimate(first + layers * per, f"first run of this shape family: from {here}'s speed")


@contextlib.contextmanager
def pruning(config: Config, layers: int, evaluations: int) -> Iterator[Bar]:
    """Announce the pruning of ``layers`` layers of ``evaluations`` sub-layer risks each, count
    them in a bar (updated by the caller after each layer), and record the times: the first
    layer's excess over the others as the compilation of the risks."""
    key, features = _prune_family(config)
    estimate = prune_estimate(config, layers, evaluations)
    announce(f"pruning {layers} layer(s) of {config.model.heads} heads, {evaluations} sub-layer risks each", estimate,
             "lower model.heads")
    with Bar(layers, "pruning", "layer", estimate=estimate, each=True, done="pruned {n} layer(s)", announced=True) as bar:
        yield bar
    times = [b - a for a, b in zip([bar.start, *bar.marks], bar.marks)]
    if times:
        steady = times[1:] or times
        per = sum(steady) / len(steady)
        timings().record(key, "prune", label=f"prune, {_label(config)}", features=features, run=(evaluations, per),
                         compile=max(times[0] - per, 0.0))

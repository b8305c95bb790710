"""What a simulation (:func:`~singleloc.simulate`) and ``compare`` will take, said before they start.

:func:`simulation_clock` compiles the SGD step and the measurement of the saved times (one
phase), times a few steps of the compiled step on the device (and one measurement), and says the
extrapolated time before the run starts: what the device does, not what a CPU constant says (an
H200 ran a simulation announced as 17 minutes in 18 s). Its bar records the run's times for the
family (:mod:`singleloc.runtime._timings`). :func:`simulation_estimate` is the estimate before anything is
compiled (the command line's check of a huge run, ``compare``'s and ``sweep``'s estimates):
measured for this family, else scaled from the device's other simulations by ``seeds x batch x L
x D x (H + F)``, else from its speed (:data:`~singleloc.preflight._estimates.REFERENCE`).
"""

from __future__ import annotations

import math
from typing import Any

from ..configuration._config import Config
from ..preflight._estimates import REFERENCE, TheorySolve, _digest, _label, speed
from ..runtime import _timings
from ..runtime._progress import Phase, announce
from ..runtime._progress_bar import Bar
from ..runtime._timings import Estimate, device_label, timings


def _simulation_family(config: Config) -> tuple[str, dict[str, Any], float, float]:
    """The key, features, steps and saved times of a simulation."""
    pb, m, sim, sgd = config.problem, config.model, config.simulation, config.sgd
    features = {"activation": m.activation, "H": m.heads, "F": pb.F, "L": pb.L, "D": sim.D, "seeds": sim.seeds,
                "batch": sgd.batch, "test_samples": sim.test_samples, "atoms": len(pb.build_prior().atoms)}
    return f"simulate:{_digest(features)}", features, round(sgd.tau_max * sim.D / sgd.batch), sgd.n_save


def _sgd_size(f: dict[str, Any]) -> float:
    return f["seeds"] * f["batch"] * f["L"] * f["D"] * (f["H"] + f["F"])


def _measure_size(f: dict[str, Any]) -> float:
    return f["seeds"] * f["test_samples"] * f["L"] * (f["H"] + f["F"])


def simulation_estimate(config: Config) -> Estimate:
    """The time of :func:`~singleloc.simulate` before anything is compiled (module docstring)."""
    key, features, steps, saved = _simulation_family(config)
    rec = timings().family(key)
    here = device_label(timings().device)
    if rec and "step" in rec:
        return Estimate(steps * rec["step"] + saved * rec.get("measure", 0.0) + rec.get("compile", 0.0),
                        f"measured on {here} for this simulation's sizes")
    others = [r for r in timings().families("simulate") if "step" in r]
    if others:
        near = min(others, key=lambda r: abs(math.log(_sgd_size(r["features"]) / _sgd_size(features))))
        scale = _sgd_size(features) / _sgd_size(near["features"])
        return Estimate(steps * near["step"] * scale + saved * near.get("measure", 0.0) * _measure_size(features)
                        / _measure_size(near["features"]) + near.get("compile", 0.0),
                        f"scaled from a simulation of other sizes on {here}")
    seconds = (steps * REFERENCE["sgd_step"] * _sgd_size(features) + saved * REFERENCE["measure"] * _measure_size(features)
               ) * speed("run")
    return Estimate(seconds, f"from {here}'s speed")


def simulation_work(config: Config) -> str:
    """The simulation in words (the estimate's line)."""
    sim, H = config.simulation, config.model.heads
    steps = round(config.sgd.tau_max * sim.D)
    return (f"{steps:.3g} SGD steps (sgd.tau_max x simulation.D) x {sim.seeds} seeds of model.heads = {H} keys in "
            f"simulation.D = {sim.D} dimensions")


#: What drives a simulation's cost (the messages' advice).
SIMULATION_KEYS = "sgd.tau_max, simulation.D, simulation.seeds or model.heads"


def simulation_cost(config: Config):
    """The cost of :func:`~singleloc.simulate` before it is compiled (:class:`~singleloc.preflight._costs.Cost`:
    :func:`simulation_estimate` and the memory estimate), for the command line's check of a huge run."""
    from ..preflight._costs import Cost
    from ..preflight._resources import OVERHEAD, simulation_bytes

    estimate = simulation_estimate(config)
    return Cost(simulation_work(config), estimate.seconds, OVERHEAD + simulation_bytes(config), SIMULATION_KEYS,
                estimate.basis)


#: Seconds of SGD steps timed (at least) before a simulation states its measured estimate.
TIMED = 0.25


class _SimulationBar(Bar):
    """The simulation's bar, which records the family's times when it closes."""

    def __init__(self, *args, record=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.on_close = record

    def close(self) -> None:
        super().close()
        if self.on_close is not None:
            self.on_close(self.elapsed)


def simulation_clock(config: Config, advance, measure, params, consts, steps, progress: bool = True):
    """Compile the simulation's SGD step ``advance`` and measurement ``measure`` (jitted, as
    :func:`~singleloc.simulate` builds them) for ``params`` and ``consts``, time a few steps and
    one measurement on the device, say the estimate of the run over the saved ``steps`` before it
    starts (refused over the run limit) and return the compiled ``advance``, ``measure`` and the
    run's :class:`~singleloc.runtime._progress.Bar` (``progress=False``: no live bar), which records the
    measured times when it closes. The timed steps are thrown away (the run is unchanged)."""
    import jax

    key, features, _, _ = _simulation_family(config)
    total, saved = int(steps[-1]), len(steps)
    what = (f"compiling the simulation (SGD step and held-out risk: {_label(config)}, D={config.simulation.D}, "
            f"{config.simulation.seeds} seeds)")
    rec = timings().family(key) or {}  # compiled here before: loaded from the cache, quickly (said only if it lasts)
    expected = rec.get("compile", REFERENCE["sim_compile"] * speed("host"))
    with Phase((what, "compiled the simulation"), [expected], quiet="compile" in rec) as compiling:
        advance = advance.lower(params, consts, 0, 1).compile()
        measure = measure.lower(params, consts, 0).compile()
        jax.block_until_ready((advance(params, consts, 0, 1), measure(params, consts, 0)))  # first calls allocate: untimed
    n, seconds = 1, 0.0
    while n < total:  # time n steps, n growing fourfold until they take TIMED seconds or a quarter of the run
        n = min(4 * n, max(total // 4, 1))
        t0 = _timings.clock()
        jax.block_until_ready(advance(params, consts, 0, n))
        seconds = _timings.clock() - t0
        if seconds >= TIMED or n >= total // 4:
            break
    step = seconds / n if n else 0.0
    t0 = _timings.clock()
    jax.block_until_ready(measure(params, consts, 0))
    per_measure = _timings.clock() - t0
    here = device_label(timings().device)
    estimate = Estimate(total * step + saved * per_measure, f"measured: {n} steps timed on {here}")
    announce(f"simulating {simulation_work(config)}", estimate, f"lower {SIMULATION_KEYS}")

    def record(elapsed: float) -> None:
        # the step's time from the whole run, once it is long enough to say more than the timed steps
        run_step = (elapsed - saved * per_measure) / total if elapsed > 4 * seconds and total else step
        timings().record(key, "simulate", label=f"simulate, {_label(config)} D={config.simulation.D}", features=features,
                         run=(total, elapsed), step=max(run_step, 0.0) or step, measure=per_measure,
                         compile=compiling.seconds[-1])

    bar = _SimulationBar(total, "simulate", "step", estimate=estimate, unit_scale=True, live=progress, record=record,
                         done="simulated {n} SGD steps", watched=False, announced=True)
    return advance, measure, bar.__enter__()


def compare_estimate(config: Config) -> Estimate:
    """The time of ``compare``: the simulation and the theory from every seed's start."""
    sim = simulation_estimate(config)
    theory = TheorySolve("integrate", config, config.simulation.seeds, config.sgd.n_save, config.sgd.tau_max).estimate
    return Estimate(sim.seconds + theory.seconds, f"simulation {sim.basis}; theory {theory.basis}",
                    (("simulating", sim.seconds), ("the theory", theory.seconds)))

"""What a simulation (:func:`~singleloc.simulate`) and ``compare`` will take, said before they start.

Before anything is compiled, :func:`simulation_estimate` is :func:`~singleloc.preflight._estimates.estimate` of the cost
model: SGD steps times a fixed cost and ``seeds x batch x L x D x (H + F)``, and saved times times ``seeds x test_samples
x L x (H + F)``, plus compiling. Before it runs, :func:`simulation_clock` compiles the step, times a few steps on the
device and says the extrapolated time.
"""

from __future__ import annotations

import contextlib

from ..preflight._build import Setup
from ..preflight._estimates import REFERENCE, TheorySolve, _digest, _label, estimate, fixed, timings
from ..preflight._resources import OVERHEAD, Cost, simulation_bytes
from ..runtime._progress import Bar, Estimate, Phase, announce, clock

#: What drives a simulation's cost (the messages' advice).
SIMULATION_KEYS = "sgd.tau_max, simulation.D, simulation.seeds or model.heads"
#: Seconds of SGD steps timed (at least) before a simulation states its measured estimate.
TIMED = 0.25


def _model(setup: Setup, steps: float, saved: int) -> tuple[str, float, float]:
    """The family's key, the model's work per SGD step and the reference seconds of ``steps`` and ``saved`` times."""
    pb, sim, sgd = setup.problem, setup.simulation, setup.sgd
    heads_fields = pb.L * (setup.heads + pb.F)
    key = f"simulate:{_digest(_label(setup), sim.D, sim.seeds, sgd.batch, sim.test_samples, setup.prior.atoms)}"
    work = REFERENCE["sgd_step"] * sim.seeds * sgd.batch * sim.D * heads_fields + REFERENCE["sgd_overhead"]
    return key, work, steps * work + saved * REFERENCE["measure"] * sim.seeds * sim.test_samples * heads_fields


def simulation_estimate(setup: Setup) -> Estimate:
    """The time of :func:`~singleloc.simulate` before anything is compiled (module docstring)."""
    key, work, size = _model(setup, round(setup.sgd.tau_max * setup.simulation.D / setup.sgd.batch), setup.sgd.n_save)
    run = estimate("simulate", key, work, size)
    compiling, _ = fixed("simulate", key, "compile", REFERENCE["sim_compile"])
    return Estimate(run.seconds + compiling, run.basis.replace("shape family", "simulation's sizes"))


def simulation_work(setup: Setup) -> str:
    """The simulation in words (the estimate's line)."""
    sim = setup.simulation
    return (f"{round(setup.sgd.tau_max * sim.D):.3g} SGD steps (sgd.tau_max x simulation.D) x {sim.seeds} seeds of "
            f"model.heads = {setup.heads} keys in simulation.D = {sim.D} dimensions")


def simulation_cost(setup: Setup) -> Cost:
    """The cost of :func:`~singleloc.simulate` before it is compiled, for the command line's check of a huge run."""
    e, pb = simulation_estimate(setup), setup.problem
    size = simulation_bytes(pb.L, setup.heads, pb.F, setup.simulation, setup.sgd.n_save)
    return Cost(simulation_work(setup), e.seconds, OVERHEAD + size, SIMULATION_KEYS, e.basis)


@contextlib.contextmanager
def simulation_clock(setup: Setup, advance, measure, params, consts, steps, progress: bool = True):
    """Compile the jitted SGD step ``advance`` and measurement ``measure`` for ``params`` and ``consts``, time a few steps
    and one measurement (thrown away: the run is unchanged), say the estimate of the run over the saved ``steps`` (refused
    over the run limit), and yield the compiled ``advance``, ``measure`` and the run's bar (``progress=False``: lines);
    then record the run's rate."""
    import jax

    total, saved = int(steps[-1]), len(steps)
    key, work, size = _model(setup, total, saved)
    what = (f"compiling the simulation (SGD step and held-out risk: {_label(setup)}, D={setup.simulation.D}, "
            f"{setup.simulation.seeds} seeds)")
    expected, how = fixed("simulate", key, "compile", REFERENCE["sim_compile"])
    with Phase((what, "compiled the simulation"), [expected], quiet=not how) as compiling:  # loaded quickly if measured
        advance = advance.lower(params, consts, 0, 1).compile()
        measure = measure.lower(params, consts, 0).compile()
        jax.block_until_ready((advance(params, consts, 0, 1), measure(params, consts, 0)))  # first calls allocate
    n, seconds = 1, 0.0
    while n < total:  # n steps, n growing fourfold until they take TIMED seconds or a quarter of the run
        n = min(4 * n, max(total // 4, 1))
        t0 = clock()
        jax.block_until_ready(advance(params, consts, 0, n))
        seconds = clock() - t0
        if seconds >= TIMED or n >= total // 4:
            break
    t0 = clock()
    jax.block_until_ready(measure(params, consts, 0))
    guess = Estimate(total * seconds / n + saved * (clock() - t0), f"measured: {n} steps timed on {timings().here}")
    announce(f"simulating {simulation_work(setup)}", guess, f"lower {SIMULATION_KEYS}")
    with Bar(total, "simulate", "step", estimate=guess, live=progress, done="simulated {n} SGD steps", announced=True) as bar:
        yield advance, measure, bar
    timings().record(key, "simulate", f"simulate, {_label(setup)} D={setup.simulation.D}", work,
                     (clock() - bar.start) / size, compile=compiling.seconds[-1],
                     references={"compile": REFERENCE["sim_compile"]})


def compare_estimate(setup: Setup) -> Estimate:
    """The time of ``compare``: the simulation and the theory from every seed's start."""
    sim = simulation_estimate(setup)
    theory = TheorySolve("integrate", setup, setup.simulation.seeds, setup.sgd.n_save, setup.sgd.tau_max).estimate
    return Estimate(sim.seconds + theory.seconds, f"simulation {sim.basis}; theory {theory.basis}",
                    (("simulating", sim.seconds), ("the theory", theory.seconds)))

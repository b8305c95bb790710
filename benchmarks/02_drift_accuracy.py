"""Work-precision of the field quadrature: relative drift error against points and time.

For (H, L, F) in {(2, 4, 2), (4, 4, 2), (8, 8, 4), (16, 8, 4)} (softmax, the default spikes prior and
learning rate) at two states -- the start (initial overlaps of seed 0, D = 1000) and a trained-like state
(``M ~ 0.8 N(0, 1)``, ``Q = M M^T + A A^T / sqrt(H)`` with ``A ~ 0.5 N(0, 1)``, ``b = 0``) -- the drift
of the ODE's rule (Sobol points closed under the cyclic head shifts, mirrors, whitening) with ``n``
points is compared with a reference of 16 x the largest ``n`` (another scrambling). Printed per ``n``:

* ``error``: the relative error ``max |d - d_ref| / max |d_ref|``, mean over 3 scramblings;
* ``estimate``: the error of one rule estimated from the 3 scramblings alone
  (:func:`singleloc.relative_drift_error`), what ``theory.points = "auto"`` relies on;
* ``CPU``: CPU seconds of one jitted drift (process time: the machine may be shared).

``--alternatives`` adds, at n = 4096 and the same node budget, rules that were tried and not kept:
plain Sobol without the head closure (today's rule before the closure), plain Monte Carlo, Sobol with
the coordinates in head-major order. Closing the nodes under permutations of the L - 1 noise tokens was
not tried on the machine: the integrands are symmetric in the noise tokens (the loss and the sums over
``l`` in the drift), so the images of a node under those permutations repeat its values exactly, and
the closure only removes distinct points.

Last, ``theory.points = "auto"`` at (H, L, F) = (16, 8, 4) with ``theory.tol = 1e-3``: the choice, its
estimated error and its actual error against 16 x the points.

Run: ``python benchmarks/02_drift_accuracy.py [--quick] [--alternatives] [--save PATH]`` (``--save``: the numbers as
JSON, ``benchmarks/_common.py``).
"""

from __future__ import annotations

import argparse
import time

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import add_save_option, save  # noqa: E402

import singleloc as sl  # noqa: E402
from singleloc.expectations._fields import sobol_normals  # noqa: E402
from singleloc.sgd._sgd_rule import flat_drift  # noqa: E402

CONFIGS = [(2, 4, 2), (4, 4, 2), (8, 8, 4), (16, 8, 4)]
POINTS = [1024, 4096, 16384, 65536]
SCRAMBLINGS = 3
REFERENCE_SEED = 12345


@eqx.filter_jit
def drift(ode, M, Q, b):
    return flat_drift(ode.drift(M, Q, b))


def config(H, L, F, points=4096, seed=0):
    return sl.load_config("default", [f"model.heads={H}", f"problem.L={L}", f"problem.F={F}", f"theory.points={points}",
                                      f"theory.qmc_seed={seed}"])


def states(cfg):
    H, F = cfg.model.heads, cfg.problem.F
    y0 = sl.initial_conditions(cfg, 1)
    rng = np.random.default_rng(0)
    M = rng.normal(size=(H, F)) * 0.8
    A = rng.normal(size=(H, H)) * 0.5
    trained = (jnp.asarray(M), jnp.asarray(M @ M.T + A @ A.T / np.sqrt(H)), jnp.zeros(H))
    return {"start": (y0.M[0], y0.Q[0], y0.b[0]), "trained": trained}


def timed(ode, state):
    d = jax.block_until_ready(drift(ode, *state))  # compiles
    t0 = time.process_time()
    d = jax.block_until_ready(drift(ode, *state))
    return np.asarray(d), time.process_time() - t0


def relative(d, ref):
    return float(np.max(np.abs(d - ref)) / np.max(np.abs(ref)))


def work_precision(points: list[int]) -> list[dict]:
    rows = []
    print("| H | L | F | state | points | error | estimate | CPU s / drift |")
    print("|---|---|---|---|---|---|---|---|")
    for H, L, F in CONFIGS:
        ref_points = 16 * max(points)
        ref_ode = sl.OrderParameterODE.from_setup(sl.build(config(H, L, F, ref_points, REFERENCE_SEED)))
        for label, state in states(config(H, L, F)).items():
            ref = np.asarray(drift(ref_ode, *state))
            for n in points:
                runs = [timed(sl.OrderParameterODE.from_setup(sl.build(config(H, L, F, n, seed))), state)
                        for seed in range(SCRAMBLINGS)]
                d = np.stack([r[0] for r in runs])
                error = np.mean([relative(x, ref) for x in d])
                estimate = float(sl.relative_drift_error(d))
                cpu = np.median([r[1] for r in runs])
                print(f"| {H} | {L} | {F} | {label} | {n} | {error:.1e} | {estimate:.1e} | {cpu:.3f} |", flush=True)
                rows.append({"H": H, "L": L, "F": F, "state": label, "points": n, "error": error, "estimate": estimate,
                             "cpu_s_per_drift": cpu})
    return rows


def alternative_rule(kind: str, cfg, n: int, seed: int) -> sl.OrderParameterODE:
    """Rules that were measured and not kept, with ``2 n`` nodes like the ODE's rule."""
    L, H = cfg.problem.L, cfg.model.heads
    if kind == "plain Sobol":
        fields = sl.LocalFields.make(L, H, cfg.problem.build_prior(), n, seed)
    else:
        if kind == "Monte Carlo":
            z = np.random.default_rng(seed).standard_normal((n, L * H))
        else:  # head-major Sobol: the coordinates of one head consecutive
            z = sobol_normals(L * H, n, seed).reshape(n, H, L).transpose(0, 2, 1).reshape(n, L * H)
        w, v = np.linalg.eigh(z.T @ z / n)
        z = z @ (v / np.sqrt(w)) @ v.T
        base = sl.LocalFields.make(L, H, cfg.problem.build_prior(), n, seed)
        w = jnp.asarray(z.reshape(n, L, H))
        fields = sl.LocalFields(w, base.u, base.atoms, base.probs, base.cov_sqrt, 1, base.batch_size)
    expectation = sl.SobolExpectation(fields=fields, activation=sl.get_activation(cfg.model.activation))
    return sl.OrderParameterODE(expectation, sl.OnlineSGD(cfg.sgd.lr, cfg.model.train_bias))


def alternatives(n: int = 4096) -> list[dict]:
    rows = []
    print(f"\nRules not kept, at n = {n} (same node budget), error as above (mean of {SCRAMBLINGS} scramblings):")
    print("| H | L | F | state | head closure (kept) | plain Sobol | Monte Carlo | head-major Sobol |")
    print("|---|---|---|---|---|---|---|---|")
    for H, L, F in CONFIGS:
        cfg = config(H, L, F, n)
        ref_ode = sl.OrderParameterODE.from_setup(sl.build(config(H, L, F, 16 * 65536, REFERENCE_SEED)))
        for label, state in states(cfg).items():
            ref = np.asarray(drift(ref_ode, *state))
            kept = [relative(np.asarray(drift(sl.OrderParameterODE.from_setup(sl.build(config(H, L, F, n, s))), *state)), ref)
                    for s in range(SCRAMBLINGS)]
            row = [np.mean(kept)]
            for kind in ("plain Sobol", "Monte Carlo", "head-major Sobol"):
                row.append(np.mean([relative(np.asarray(drift(alternative_rule(kind, cfg, n, s), *state)), ref)
                                    for s in range(SCRAMBLINGS)]))
            print(f"| {H} | {L} | {F} | {label} | {' | '.join(f'{e:.1e}' for e in row)} |", flush=True)
            rows.append({"H": H, "L": L, "F": F, "state": label, "points": n,
                         **dict(zip(("head closure", "plain Sobol", "Monte Carlo", "head-major Sobol"), row))})
    return rows


def auto_rule(H=16, L=8, F=4, tol=1e-3) -> dict:
    """The automatic choice and its actual error (the caller checks ``error <= tol``)."""
    cfg = sl.load_config("default", [f"model.heads={H}", f"problem.L={L}", f"problem.F={F}", "theory.points=auto",
                                     f"theory.tol={tol}"])
    y0 = sl.initial_conditions(cfg, 1)
    t0 = time.process_time()
    choice = sl.choose_points(sl.build(cfg), y0)
    t_choice = time.process_time() - t0
    print(f"\ntheory.points = 'auto' at H={H}, L={L}, F={F}, tol={tol:g}: tried "
          f"{', '.join(f'{n}: {e:.1e}' for n, e in choice.tried)} -> {choice.points} points "
          f"(estimated error {choice.error:.1e}; the choice took {t_choice:.0f} CPU s)")
    state = (y0.M[0], y0.Q[0], y0.b[0])
    ref = np.asarray(drift(sl.OrderParameterODE.from_setup(sl.build(cfg.replace(theory={"points": 16 * choice.points,
                                                                                "qmc_seed": REFERENCE_SEED}))), *state))
    d, t = timed(sl.OrderParameterODE.from_setup(sl.build(cfg.replace(theory={"points": choice.points}))), state)
    error = relative(d, ref)
    print(f"actual relative drift error at the start against 16 x the points: {error:.1e} (target {tol:g}); "
          f"{t:.2f} CPU s per drift")
    return {"H": H, "L": L, "F": F, "tol": tol, "tried": [list(x) for x in choice.tried], "points": choice.points,
            "estimated_error": choice.error, "choice_cpu_s": t_choice, "error": error, "cpu_s_per_drift": t}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="points up to 16384 only (reference 16 x 16384)")
    parser.add_argument("--alternatives", action="store_true", help="also the rules that were not kept")
    args = add_save_option(parser).parse_args()
    results = {"work_precision": work_precision(POINTS[:-1] if args.quick else POINTS)}
    if args.alternatives:
        results["alternatives"] = alternatives()
    auto = results["auto"] = auto_rule()
    save(args, __file__, results)
    assert auto["error"] <= auto["tol"], auto["error"]


if __name__ == "__main__":
    main()

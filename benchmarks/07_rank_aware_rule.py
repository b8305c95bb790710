"""The rule route's two field layouts at trained states with redundant heads: ``theory.axes``.

The rule route (any registered activation; bsoftmax beyond its affordable exact rule) integrates
over the ``L H`` Gaussian fields on a scrambled Sobol rule. ``theory.axes = "heads"`` draws
``g_l = w_l Q^{1/2}`` on a rule closed under the cyclic shifts of the heads (the rule before this
benchmark, and the default); ``"principal"`` draws ``g_l = w_l S`` with the rank-aware factor ``S``
(2H, H) of ``Q`` (each principal direction that is well defined on coordinates of its own, the rest
on a symmetric root, blended continuously; the leading direction first), so that heads that are
(near) copies put their variance on the leading Sobol coordinates (docs/model.md section 4.4). Both
at the same number of nodes.

1. Work-precision at near-copy states (softmax and softmax1, ``L = 4``, one spike, ``H`` in
   {2, 4, 8}: ``M_h ~ 1.96``, ``Q = M M^T + R`` with ``R = 0.02 + A A^T + 0.03 I``, ``A ~ 0.05 N(0, 1)``,
   ``b = 0``): the risk error and the relative ``O(lr)`` drift error ``max |d - d_ex| / max |d_ex|``
   (``lr = 1e-6``, so the Gram term is below the precision shown) of each layout at 1024 ... 16384
   points, root mean square over 8 scramblings (and the median of the risk's |error|: single
   scramblings are heavy-tailed), against the exact route (``theory.nodes = 64``; its own error
   ~1e-10 there), and the milliseconds per drift.
2. End to end (section 2; ``--quick`` skips it): the issue's run, softmax, one spike of strength 2.5,
   ``L = 4``, ``H = 6``, to ``tau = 300`` (the heads end almost identical): the final risk on each
   layout (4096 points) against the exact route's trajectory, the exact risk of each layout's
   final state (the error of its dynamics alone), and the seconds of each solve.

Run: ``python benchmarks/07_rank_aware_rule.py [--quick] [--save PATH]``.
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
from singleloc.sgd._sgd_rule import flat_drift  # noqa: E402

AXES = ("heads", "principal")
SCRAMBLINGS = 8


@eqx.filter_jit
def risk_and_drift(ode, M, Q, b):
    return ode.risk(M, Q, b), flat_drift(ode.drift(M, Q, b))


def near_copies(H: int, seed: int = 0):
    """The near-copy state of section 1."""
    rng = np.random.default_rng(seed)
    M = 1.96 + 0.01 * rng.standard_normal((H, 1))
    A = 0.05 * rng.standard_normal((H, H))
    Q = M @ M.T + 0.02 + A @ A.T + 0.03 * np.eye(H)
    return jnp.asarray(M), jnp.asarray(Q), jnp.zeros(H)


def work_precision(activations, heads, points) -> list[dict]:
    rows = []
    for act in activations:
        for H in heads:
            base = sl.load_config("default", [f"model.heads={H}", "problem.F=1", f"model.activation={act}", "sgd.lr=1e-6",
                                              "model.train_bias=false"])
            state = near_copies(H)
            exact = sl.OrderParameterODE.from_setup(sl.build(base.replace(theory={"route": "exact"})), points=1024)
            r_ex, d_ex = (np.asarray(x) for x in risk_and_drift(exact, *state))
            for n in points:
                row = {"activation": act, "H": H, "points": n}
                for axes in AXES:
                    risk_err, drift_err, ms = [], [], []
                    for seed in range(SCRAMBLINGS):
                        cfg = base.replace(theory={"route": "rule", "axes": axes, "qmc_seed": seed})
                        ode = sl.OrderParameterODE.from_setup(sl.build(cfg), points=n)
                        r, d = jax.block_until_ready(risk_and_drift(ode, *state))
                        t = time.perf_counter()
                        jax.block_until_ready(risk_and_drift(ode, *state))
                        ms.append(1e3 * (time.perf_counter() - t))
                        risk_err.append(float(r) - float(r_ex))
                        drift_err.append(float(np.max(np.abs(np.asarray(d) - d_ex)) / np.max(np.abs(d_ex))))
                    row[axes] = {"risk_error": float(np.sqrt(np.mean(np.square(risk_err)))),
                                 "risk_error_median": float(np.median(np.abs(risk_err))),
                                 "drift_error": float(np.sqrt(np.mean(np.square(drift_err)))), "ms": float(np.median(ms))}
                ratio = row["heads"]["risk_error"] / row["principal"]["risk_error"]
                med = {a: row[a]["risk_error_median"] for a in AXES}
                print(f"{act:8s} H = {H}, {n:5d} points: risk error heads {row['heads']['risk_error']:.1e} / principal "
                      f"{row['principal']['risk_error']:.1e} ({ratio:.0f}x; median |error| {med['heads']:.1e} / "
                      f"{med['principal']:.1e}); drift error {row['heads']['drift_error']:.1e} / "
                      f"{row['principal']['drift_error']:.1e}; ms per risk + drift {row['heads']['ms']:.0f} / "
                      f"{row['principal']['ms']:.0f}", flush=True)
                rows.append(row)
    return rows


def end_to_end() -> dict:
    base = sl.load_config("default", ["model.heads=6", "problem.F=1", "sgd.tau_max=300"])
    prior = base.problem.build_prior()
    out = {}
    t = time.perf_counter()
    exact = sl.integrate(base.replace(theory={"route": "exact"}))
    out["exact"] = {"final_risk": float(exact.risk[0, -1]), "seconds": time.perf_counter() - t}
    print(f"H = 6, F = 1, tau = 300: exact route final risk {out['exact']['final_risk']:.6f}", flush=True)
    for axes in AXES:
        t = time.perf_counter()
        run = sl.integrate(base.replace(theory={"route": "rule", "axes": axes}))
        seconds = time.perf_counter() - t
        own = float(run.risk[0, -1])
        state_exact = sl.population_risk(prior, base.problem.L, "softmax", run.M[0, -1], run.Q[0, -1], run.b[0, -1]).value
        out[axes] = {"final_risk": own, "exact_risk_of_final_state": state_exact, "seconds": seconds}
        print(f"  {axes:9s}: final risk {own:.6f} ({own - out['exact']['final_risk']:+.1e}), exact risk of its final "
              f"state {state_exact:.6f} ({state_exact - out['exact']['final_risk']:+.1e}), {seconds:.0f} s", flush=True)
    return out


def main():
    parser = add_save_option(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    parser.add_argument("--quick", action="store_true", help="softmax only, H in {2, 8}, up to 4096 points, no section 2")
    args = parser.parse_args()
    if args.quick:
        results = {"work_precision": work_precision(("softmax",), (2, 8), (1024, 4096))}
    else:
        results = {"work_precision": work_precision(("softmax", "softmax1"), (2, 4, 8), (1024, 4096, 16384)),
                   "end_to_end": end_to_end()}
    save(args, __file__, results)


if __name__ == "__main__":
    main()

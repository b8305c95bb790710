"""The exact route's ``lr^2`` Gram term ``E[sum_l c_l c_l^T]`` on its three routes: accuracy against independent
references, cost against ``L`` and ``H`` (issue 50).

1. Accuracy at trained states whose term is known independently: ``H`` copies of a trained key (``M = 2.5``,
   ``Q = 6.5``, one spike of strength 2.5; the term is ``G_1 / H^2`` in every entry, ``G_1`` the exact one-head
   term) of bsoftmax (``H = 2``) and softmax (``H = 4``) at ``L`` = 16, 256, 1024, and two near-copy softmax heads
   at ``L`` = 16, 256 against the exact two-head term. Routes: the rank-aware Sobol rule whitened (the code
   before: ``LocalFields.make(..., whiten=True)``) and unwhitened (the exact route's rule now), four scramblings
   at ``theory.gram_rule_points``, and the Monte Carlo term (``theory.gram = "montecarlo"``) at as many antithetic
   pairs. Printed: the relative error of the largest entry, the stated relative error (the Sobol rule: the
   scramblings' standard error of their mean, and of one scrambling, twice that; Monte Carlo: its own standard
   error) and the error in units of the stated one.
2. Cost against ``L`` (4 ... 4096, two near-copy softmax heads): milliseconds per Gram term on each route at its
   default points (``theory.gram_rule_points``: 16384 up to ``L H = 256``, then fewer), with the points, and the
   bytes the Sobol rule's nodes hold (the Monte Carlo term holds one batch of draws).
3. One exact drift (the exact ``O(lr)`` part plus the Gram term) at ``H`` = 2, 4, 8, ``L = 8``, softmax, near
   copies: milliseconds for the ``O(lr)`` part alone and for the whole drift with each Gram term.

Times are medians of 3 calls after compilation, ratios in one run (the machine may be shared).
Run: ``python benchmarks/08_gram_terms.py [--quick] [--sections 1,2,3] [--save PATH]``; ``--quick``: section 1 at
``L`` = 16 and 256, section 2 up to ``L = 1024``.
"""

from __future__ import annotations

import argparse

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import add_save_option, save, timed  # noqa: E402

import singleloc as sl  # noqa: E402
from singleloc.expectations._fields import LocalFields  # noqa: E402
from singleloc.expectations._laplace_expectation import _risk_gradient  # noqa: E402
from singleloc.expectations._sobol_expectation import SobolGram  # noqa: E402
from singleloc.sgd._sgd_rule import flat_drift  # noqa: E402

M1, Q1 = 2.5, 6.5


def expectation(activation, L, H, gram, *extra, F=1):
    cfg = sl.load_config("default", [f"model.activation={activation}", f"model.heads={H}", f"problem.L={L}",
                                     f"problem.F={F}", "theory.route=exact", f"theory.gram={gram}", *extra])
    return cfg, sl.OrderParameterODE.from_setup(sl.build(cfg))


@eqx.filter_jit
def gram(term, M, Q, b):
    return term.gram(M, Q, b)


@eqx.filter_jit
def gram_and_error(term, M, Q, b):
    return term.gram_and_error(M, Q, b)


@eqx.filter_jit
def drift(ode, M, Q, b):
    return flat_drift(ode.drift(M, Q, b))


def copies(H):
    return jnp.full((H, 1), M1), jnp.full((H, H), Q1), jnp.zeros(H)


def near_copies(H):
    M = jnp.full((H, 1), M1) - 0.05 * jnp.arange(H)[:, None]
    R = 0.2 * jnp.eye(H) + 0.05
    return M, M @ M.T + R, jnp.zeros(H)


def accuracy(Ls) -> list[dict]:
    rows = []
    cases = [("bsoftmax", 2, "copies"), ("softmax", 4, "copies"), ("softmax", 2, "near copies")]
    print("\n1. accuracy: relative error of the largest entry | stated relative error | error / stated")
    for activation, H, kind in cases:
        for L in Ls:
            if kind == "near copies" and L > 256:
                continue
            state = copies(H) if kind == "copies" else near_copies(H)
            if kind == "copies":
                one = expectation("softmax", L, 1, "exact")[1].expectation.gram_term
                ref = np.full((H, H), float(gram(one, jnp.array([[M1]]), jnp.array([[Q1]]), jnp.zeros(1))[0, 0]) / H**2)
            else:
                ref = np.asarray(gram(expectation(activation, L, H, "exact")[1].expectation.gram_term, *state))
            cfg, ode = expectation(activation, L, H, "sobol")
            points = cfg.theory.gram_rule_points(L, H, cfg.theory.points)
            prior, act = cfg.problem.build_prior(), sl.get_activation(activation)
            top = np.unravel_index(np.argmax(np.abs(ref)), ref.shape)
            row = {"activation": activation, "H": H, "L": L, "state": kind, "points": points, "reference": ref[top]}
            for name, whiten in (("sobol whitened (before)", True), ("sobol", False)):
                values = np.array([np.asarray(gram(SobolGram(fields=LocalFields.make(L, H, prior, points, s, principal=True,
                                                                                     whiten=whiten), activation=act),
                                                   *state))[top] for s in range(4)])
                mean, se = values.mean(), values.std(ddof=1) / 2
                row[name] = {"relative_error": mean / ref[top] - 1, "stated_mean": se / abs(ref[top]),
                             "stated_one": 2 * se / abs(ref[top]), "spread_of_errors": values / ref[top] - 1}
            term = expectation(activation, L, H, "montecarlo")[1].expectation.gram_term
            value, se = (np.asarray(x)[top] for x in gram_and_error(term, *state))
            row["montecarlo"] = {"relative_error": value / ref[top] - 1, "stated_one": se / abs(ref[top]), "draws": term.draws}
            rows.append(row)
            w, s, m = row["sobol whitened (before)"], row["sobol"], row["montecarlo"]
            print(f"  {activation:8s} H={H} L={L:5d} {kind:11s} {points:6d} pts | whitened: mean of 4 {w['relative_error']:+.2e} "
                  f"(stated {w['stated_mean']:.1e}, {w['relative_error'] / w['stated_mean']:+.1f}x) | unwhitened: "
                  f"{s['relative_error']:+.2e} (stated {s['stated_mean']:.1e}, {s['relative_error'] / s['stated_mean']:+.1f}x) | "
                  f"MC: one {m['relative_error']:+.2e} (stated {m['stated_one']:.1e}, "
                  f"{m['relative_error'] / m['stated_one']:+.1f}x)")
    return rows


def cost_against_L(Ls) -> list[dict]:
    rows = []
    H = 2
    print("\n2. one Gram term against L (two near-copy softmax heads): ms per term, points, node bytes")
    for L in Ls:
        state = near_copies(H)
        row = {"L": L}
        for name in ("sobol", "montecarlo", "exact"):
            cfg, ode = expectation("softmax", L, H, name)
            term = ode.expectation.gram_term
            _, ms = timed(gram, term, *state)
            row[name] = ms
        points = cfg.theory.gram_rule_points(L, H, cfg.theory.points)
        row["points"] = points
        row["sobol_node_bytes"] = 8 * points * L * 2 * H
        rows.append(row)
        print(f"  L={L:5d} ({points:5d} points, Sobol nodes {row['sobol_node_bytes'] / 2**20:6.1f} MiB): sobol "
              f"{row['sobol']:8.1f} ms, montecarlo {row['montecarlo']:8.1f} ms, exact {row['exact']:7.1f} ms")
    return rows


def drift_against_H(Hs, L=8) -> list[dict]:
    rows = []
    print(f"\n3. one exact drift at L = {L}, softmax, near copies: ms")
    for H in Hs:
        state = near_copies(H)
        row = {"H": H}
        for name in ("sobol", "montecarlo"):
            cfg, ode = expectation("softmax", L, H, name)
            _, row[name] = timed(drift, ode, *state)
        _, row["O(lr) part"] = timed(_risk_gradient, ode.expectation.rule, *state)  # the exact risk's gradient
        rows.append(row)
        print(f"  H={H}: O(lr) part {row['O(lr) part']:7.1f} ms | drift with the Sobol Gram term {row['sobol']:7.1f} ms, "
              f"with the Monte Carlo one {row['montecarlo']:7.1f} ms")
    return rows


def main():
    parser = add_save_option(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sections", default="1,2,3")
    args = parser.parse_args()
    sections = {int(s) for s in args.sections.split(",")}
    results = {}
    if 1 in sections:
        results["accuracy"] = accuracy([16, 256] if args.quick else [16, 256, 1024])
    if 2 in sections:
        results["cost_against_L"] = cost_against_L([4, 64, 1024] if args.quick else [4, 16, 64, 256, 1024, 4096])
    if 3 in sections:
        results["drift_against_H"] = drift_against_H([2, 4, 8])
    save(args, __file__, results)


if __name__ == "__main__":
    main()

"""The joint layer (bsoftmax) on the exact route at many heads: cost, program size and accuracy (issue 59, item 3).

1. Cost: at trained-like states (heads near ``F`` spikes of strength 2.5, ``M_{h, h mod F} = 2.4 - 0.05 h``, a random
   ``R_orth`` of scale 0.15; key variances 10 to 16 on ``F`` directions, 0.03 to 0.1 on the others beyond the
   smallest) for ``H`` = 2, 3, 4, 5, 8, ``F`` = 1, 2 and ``L`` = 8, 1024 (``--heads``, ``--spikes``, ``--lengths``):
   the token rule's nodes, its size (``joint_rule_size``: nodes x heads x atoms, what ``theory.route = "auto"``
   budgets), the StableHLO operations of the lowered risk-and-gradient program (the ``O(lr)`` drift's part), its
   compile seconds and the milliseconds per risk and gradient (one call after compilation).
2. Accuracy, ``L = 16``, two spikes: (a) the stated error (against the refined rule, as a solve states it): risk
   and relative gradient; (b) identical heads: ``H`` copies of one head with biases ``b_h`` are one softmax head
   with bias ``lse(b)`` (``sum_h exp(k.xi + b_h) = exp(k.xi + lse(b))``), so the risk is the one head's and, the
   softmax ``p = softmax(b)`` being the derivative of ``lse`` at the copies, ``dR/dM_h = p_h dR_1/dM`` and
   ``dR/db_h = p_h dR_1/db`` (``Q`` moves the heads apart at second order in ``lse``: no identity); (c) plain
   Monte Carlo of the risk (``n`` sequences of the fields' law, numpy, its standard error); the process's peak
   memory (after the refined rule at each ``H``).

Run: ``python benchmarks/11_joint_layer.py [--quick] [--sections cost,accuracy] [--heads 2,4] [--save PATH]``. Times are of one
run on the shared machine; its load is saved with the numbers (``benchmarks/_common.py``).
"""

from __future__ import annotations

import argparse
import re
import resource
import time

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import add_save_option, save, timed  # noqa: E402

import singleloc as sl  # noqa: E402
from singleloc.expectations._laplace_joint import joint_rule_size  # noqa: E402

OPS = re.compile(r"= \"?(stablehlo|chlo)\.|= call @")
ACT = sl.get_activation("bsoftmax")


def near_the_spikes(H: int, F: int):
    """A trained-like state: heads near the ``F`` spikes, a random ``R_orth`` of scale 0.15 (seed 0)."""
    M = np.zeros((H, F))
    for h in range(H):
        M[h, h % F] = 2.4 - 0.05 * h
        if F > 1:
            M[h, (h + 1) % F] = 0.05 * h
    A = 0.1 * np.random.default_rng(0).normal(size=(H, H))
    return M, M @ M.T + 0.15 * np.eye(H) + 0.03 + A @ A.T, np.linspace(-0.2, 0.2, H)


@eqx.filter_jit
def value_and_grad(rule, M, Q, b):
    value, grads = jax.value_and_grad(rule.risk, argnums=(0, 1, 2))(M, Q, b)
    return jnp.concatenate([value[None]] + [jnp.ravel(g) for g in grads])


def program(rule, state):
    """StableHLO operations and compile seconds of the risk-and-gradient program."""
    arrays, static = eqx.partition((rule, *state), eqx.is_array)
    lowered = jax.jit(lambda a: value_and_grad(*eqx.combine(a, static))).trace(arrays).lower()
    t0 = time.perf_counter()
    lowered.compile()
    return sum(1 for line in lowered.as_text().splitlines() if OPS.search(line)), time.perf_counter() - t0


def cost(quick: bool, spikes=(1, 2), heads=(2, 3, 4, 5, 8), lengths=(8, 1024)) -> list[dict]:
    print("| F | H | L | nodes | size | ops | compile s | ms per gradient |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for F in spikes:
        prior = sl.spikes(F, 2.5)
        for H in (2, 4, 8) if quick else heads:
            for L in (8,) if quick else lengths:
                rule = sl.exact_rule(ACT, L, H, prior)
                state = tuple(jnp.asarray(x) for x in near_the_spikes(H, F))
                ops, compile_s = program(rule, state)
                ms = timed(value_and_grad, rule, *state, repeats=1)[1]
                row = {"F": F, "H": H, "L": L, "nodes": int(rule.layer.w.shape[0]), "size": joint_rule_size(H, prior),
                       "ops": ops, "compile_s": compile_s, "ms": ms}
                print(f"| {F} | {H} | {L} | {row['nodes']} | {row['size']} | {ops} | {compile_s:.1f} | {ms:.0f} |", flush=True)
                rows.append(row)
    return rows


def monte_carlo(prior, L, M, Q, b, n, seed=0, chunk=20000):
    """Plain Monte Carlo of the bsoftmax risk ``E[(1 - a_0)^2 + sum_{l >= 1} a_l^2]`` from the fields' law (MODEL.md:
    noise tokens ``N(b, Q)``, the relevant one ``N(b + M theta, Q)`` for an atom ``theta``): mean and standard error."""
    rng = np.random.default_rng(seed)
    atoms, probs = np.asarray(prior.atoms_array()), np.asarray(prior.probs_array())
    chol, losses = np.linalg.cholesky(Q + 1e-300 * np.eye(len(b))), []
    for _ in range(n // chunk):
        theta = atoms[rng.choice(len(probs), size=chunk, p=probs)]
        x = b + rng.normal(size=(chunk, L, len(b))) @ chol.T
        x[:, 0] += theta @ M.T
        u = np.exp(x - x.max(axis=(1, 2), keepdims=True)).sum(axis=2)
        a = u / u.sum(axis=1, keepdims=True)
        losses.append((1 - a[:, 0]) ** 2 + np.sum(a[:, 1:] ** 2, axis=1))
    losses = np.concatenate(losses)
    return float(losses.mean()), float(losses.std(ddof=1) / np.sqrt(len(losses)))


def accuracy(quick: bool) -> list[dict]:
    prior, L = sl.spikes(2, 2.5), 16
    rows = []
    print("\n| H | stated risk error | stated gradient error | copies: risk | copies: dR/dM, dR/db | exact risk | "
          "Monte Carlo (s.e.) | peak GB |")
    print("|---|---|---|---|---|---|---|---|")
    for H in (4,) if quick else (4, 8):
        rule = sl.exact_rule(ACT, L, H, prior)
        state = tuple(jnp.asarray(x) for x in near_the_spikes(H, 2))
        out, fine = np.asarray(value_and_grad(rule, *state)), np.asarray(value_and_grad(rule.refined(), *state))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # GB: the refined rule's program, the largest
        risk_error = abs(out[0] - fine[0])
        grad_error = float(np.max(np.abs(out[1:] - fine[1:])) / np.max(np.abs(fine[1:])))
        # identical heads against one softmax head with bias lse(b)
        m, q, bias = np.array([[1.9, 0.4]]), np.array([[4.3]]), np.linspace(-0.5, 0.5, H)
        one = np.asarray(value_and_grad(sl.exact_rule(ACT, L, 1, prior), jnp.asarray(m), jnp.asarray(q),
                                        jnp.asarray([np.log(np.exp(bias).sum())])))
        many = np.asarray(value_and_grad(rule, jnp.asarray(np.repeat(m, H, 0)), jnp.full((H, H), q[0, 0]), jnp.asarray(bias)))
        p = np.exp(bias) / np.exp(bias).sum()
        gM, gb = many[1:1 + 2 * H].reshape(H, 2), many[1 + 2 * H + H * H:]
        copies_risk = abs(many[0] - one[0])
        copies_grad = float(max(np.max(np.abs(gM - p[:, None] * one[1:3])), np.max(np.abs(gb - p * one[-1]))))
        mc, se = monte_carlo(prior, L, *near_the_spikes(H, 2), n=200_000 if quick else 2_000_000)
        row = {"H": H, "risk_error": risk_error, "gradient_error": grad_error, "copies_risk": copies_risk,
               "copies_gradient": copies_grad, "risk": float(out[0]), "monte_carlo": mc, "monte_carlo_se": se, "peak_gb": peak}
        print(f"| {H} | {risk_error:.1e} | {grad_error:.1e} | {copies_risk:.1e} | {copies_grad:.1e} | {out[0]:.6f} | "
              f"{mc:.6f} ({se:.1e}) | {peak:.2f} |", flush=True)
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sections", default="cost,accuracy")
    for name, default in (("spikes", "1,2"), ("heads", "2,3,4,5,8"), ("lengths", "8,1024")):
        parser.add_argument(f"--{name}", default=default, help=f"section 1's {name} (default {default})")
    args = add_save_option(parser).parse_args()
    grid = {name: tuple(int(x) for x in getattr(args, name).split(",")) for name in ("spikes", "heads", "lengths")}
    results = {}
    if "cost" in args.sections.split(","):
        results["cost"] = cost(args.quick, **grid)
    if "accuracy" in args.sections.split(","):
        results["accuracy"] = accuracy(args.quick)
    save(args, "11_joint_layer", results)


if __name__ == "__main__":
    main()

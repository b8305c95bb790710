"""The exact route against the Sobol rule: work-precision at trained states, cost against L and H.

1. Work-precision of the risk at trained states (softmax and bsoftmax; heads that are exact copies,
   near copies with ``R_orth = 0.05 I``, specialised heads): the exact route at ``theory.nodes`` in
   {16, 24, 32, 48, 64} and the Sobol rule at 1024 ... 65536 points (3 scramblings), both against the
   exact route at 160 nodes. Printed: absolute risk error and milliseconds per risk.
2. The same for the ``O(lr)`` drift (relative error ``max |d - d_ref| / max |d_ref|``; ``lr = 1e-6``,
   so that the ``lr^2`` Gram term is below the precision shown).
3. Cost against ``L`` (4 ... 4096, H = 2) and ``H`` (1 ... 16, L = 8): milliseconds per exact risk and
   per exact ``O(lr)`` drift, and the stated error (against the refined rule), at a trained state.
4. One full drift (exact ``O(lr)`` part plus the Gram term on 4096 Sobol points) at H = 8, L = 8 on a
   trained state, against the Sobol rule's drift at 65536 points.
5. The ``lr^2`` Gram term ``E[sum_l c_l c_l^T]`` at trained states (``lr = 0.5``): the head-symmetric
   Sobol rule (the rule route's) against the rank-aware one (the exact route's) at 1024 ... 16384
   points (4 scramblings), both against the rank-aware rule at 2^19 points; the error relative to
   the largest entry of the ``O(lr)`` drift (the solve's ``gram_error`` is relative to the Gram term itself).
6. Wide fields: one softmax head at ``L = 64`` with token standard deviations ``s = sqrt(Q)`` from 0.5
   to 32 (the long keys of ssmax training reach 25 at ``L = 256``): the risk and its gradient on 64
   Gauss-Hermite nodes (the first rule), on 64 trapezoidal nodes (the normal rule of narrow fields,
   ``singleloc.expectations._cubature.normal_rule``) and on the profile grid (the default above
   ``s = 0.6``), all against 8193 trapezoidal nodes in ``z`` and 1024 nodes of the Laplace variable.
7. Joint layers (bsoftmax) at trained states, the conditional product form (the smallest principal
   variance smoothed into every head's profiles): two heads at token widths 1 to 3.5, three to five
   heads on two spikes; the default rule and one of half its normal rules' sizes against a reference
   with 1.5 x those sizes and every direction of the degree-5 rule on 8 normal nodes: risk error,
   relative gradient error and milliseconds per gradient.
8. The exact two-head Gram term at wide fields: two aligned softmax heads of key length ``s`` (``M = s I``,
   ``R_orth = s^2/128``, spikes, strength 2.5), ``L`` = 4 and 64: the term at 64 nodes with its pair moments
   on the risk's outer rule (``GRAM_OUTER = 1``, the code before) and on ``GRAM_OUTER`` times it (the
   default), against 160 nodes and against 4 scramblings of 2^16 rank-aware Sobol points (their standard
   error); relative errors (largest entry) and milliseconds per term.
9. One program for every ``L``: the risk with its gradient and the exact Gram term of two heads (softmax,
   ssmax, bsoftmax; one head of softmax), near copies, ``theory.nodes = 64``, at ``L`` = 4 ... 4096 in one
   process: the programs compiled at each ``L`` (JAX's backend-compile events), the first call's seconds
   (compilation included) and milliseconds per call after it. ``L`` and the scale ``alpha`` are arrays of
   the rule, so a sweep compiles once per layer; ssmax's pair rule has ``nodes * ceil(alpha)`` outer nodes,
   so it compiles once per value of ``ceil(log L)``.
10. Where a per-head drift's time goes (softmax, ``L = 8``, ``H = 8``, 4 with ``--quick``, near copies): the drift, the
   risk, its gradient, the Gram term and one pair's parts, process CPU ms (run it single-threaded, ``XLA_FLAGS=
   "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"``, so that the time is the work at any load).

Times are medians of 3 calls after compilation, as ratios in one run (the machine may be shared).
Run: ``python benchmarks/06_exact_route.py [--quick] [--sections 3,4] [--save PATH]`` (``--save``: the numbers as
JSON, ``benchmarks/_common.py``).
"""

from __future__ import annotations

import argparse
import itertools
import time

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import add_save_option, save  # noqa: E402
from _common import timed as median_ms  # noqa: E402

import singleloc as sl  # noqa: E402
from singleloc.expectations import _laplace_heads as lh  # noqa: E402
from singleloc.expectations import _laplace_profiles as lp  # noqa: E402
from singleloc.sgd._sgd_rule import flat_drift  # noqa: E402

REFERENCE_NODES = 160


@eqx.filter_jit
def risk(ode, M, Q, b):
    return ode.risk(M, Q, b)


@eqx.filter_jit
def drift(ode, M, Q, b):
    return flat_drift(ode.drift(M, Q, b))


def timed(fn, *args, repeats=3):
    out, ms = median_ms(fn, *args, repeats=repeats)
    return np.asarray(out), ms


def config(activation, H, L, F, **theory):
    return sl.load_config("default").replace(model={"activation": activation, "heads": H}, problem={"L": L, "F": F},
                                             sgd={"lr": 1e-6}, theory=theory)


def trained(kind, H, F):
    M = np.zeros((H, F))
    if kind == "copies":
        M[:, 0] = 1.96
        Q = np.full((H, H), 3.86)
    elif kind == "near copies":
        M[:, 0] = 1.96
        Q = M @ M.T + 0.05 * np.eye(H)
    else:
        for h in range(H):
            M[h, h % F] = 2.3
        Q = M @ M.T + 0.05 * np.eye(H)
    return jnp.asarray(M), jnp.asarray(Q), jnp.asarray(np.linspace(-0.2, 0.2, H))


def work_precision(quick: bool) -> list[dict]:
    cases = [("softmax", 6, 4, 1, "copies"), ("softmax", 8, 8, 2, "near copies"), ("bsoftmax", 4, 4, 2, "specialised"),
             ("bsoftmax", 6, 4, 1, "copies")]
    nodes = [16, 24, 32, 48, 64]
    points = [1024, 4096, 16384] if quick else [1024, 4096, 16384, 65536]
    rows = []
    print("| activation | H | L | F | state | route | size | risk error | ms / risk | O(lr) drift error | ms / drift |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for act, H, L, F, kind in cases:
        state = trained(kind, H, F)
        ref = sl.OrderParameterODE.from_setup(sl.build(config(act, H, L, F, nodes=REFERENCE_NODES)))
        r_ref, d_ref = float(risk(ref, *state)), np.asarray(drift(ref, *state))
        scale = np.max(np.abs(d_ref))
        for n in nodes:
            ode = sl.OrderParameterODE.from_setup(sl.build(config(act, H, L, F, nodes=n)))
            r, tr = timed(risk, ode, *state)
            d, td = timed(drift, ode, *state)
            err_r, err_d = abs(float(r) - r_ref), np.max(np.abs(d - d_ref)) / scale
            print(f"| {act} | {H} | {L} | {F} | {kind} | exact | {n} nodes | {err_r:.1e} | {tr:.1f} | "
                  f"{err_d:.1e} | {td:.1f} |", flush=True)
            rows.append({"activation": act, "H": H, "L": L, "F": F, "state": kind, "route": "exact", "nodes": n,
                         "risk_error": err_r, "ms_per_risk": tr, "drift_error": err_d, "ms_per_drift": td})
        for n in points:
            odes = [sl.OrderParameterODE.from_setup(sl.build(config(act, H, L, F, route="rule", points=n, qmc_seed=s)))
                    for s in range(3)]
            runs = [(timed(risk, ode, *state), timed(drift, ode, *state)) for ode in odes]
            err_r = np.mean([abs(float(r[0][0]) - r_ref) for r in runs])
            err_d = np.mean([np.max(np.abs(r[1][0] - d_ref)) / scale for r in runs])
            t_r, t_d = np.median([r[0][1] for r in runs]), np.median([r[1][1] for r in runs])
            print(f"| {act} | {H} | {L} | {F} | {kind} | rule | {n} points | {err_r:.1e} | {t_r:.1f} | {err_d:.1e} | {t_d:.1f} |",
                  flush=True)
            rows.append({"activation": act, "H": H, "L": L, "F": F, "state": kind, "route": "rule", "points": n,
                         "risk_error": err_r, "ms_per_risk": t_r, "drift_error": err_d, "ms_per_drift": t_d})
    return rows


def cost_tables(quick: bool) -> list[dict]:
    out = []
    print("\nCost of the exact route (softmax, near copies, theory.nodes = 64): against L at H = 2, against H at L = 8")
    print("| H | L | ms / risk | ms / O(lr) drift | stated risk error |")
    print("|---|---|---|---|---|")
    rows = [(2, L) for L in (4, 16, 64, 256, 1024, 4096)] + [(H, 8) for H in ((1, 2, 4, 8) if quick else (1, 2, 4, 8, 16))]
    for H, L in rows:
        cfg = config("softmax", H, L, 1)
        state = trained("near copies", H, 1)
        ode = sl.OrderParameterODE.from_setup(sl.build(cfg), check=True)
        r, tr = timed(risk, ode, *state)
        _, td = timed(drift, ode, *state)
        fine = float(eqx.filter_jit(lambda o, *s: o.risk_check(*s))(ode, *state))
        print(f"| {H} | {L} | {tr:.1f} | {td:.1f} | {abs(float(r) - fine):.1e} |", flush=True)
        out.append({"H": H, "L": L, "ms_per_risk": tr, "ms_per_drift": td, "stated_risk_error": abs(float(r) - fine)})
    return out


def full_drift(H=8, L=8, F=2) -> dict:
    state = trained("near copies", H, F)
    cfg = sl.load_config("default").replace(model={"heads": H}, problem={"L": L, "F": F})
    exact = sl.OrderParameterODE.from_setup(sl.build(cfg))
    d, t = timed(drift, exact, *state)
    rule = sl.OrderParameterODE.from_setup(sl.build(cfg.replace(theory={"route": "rule", "points": 65536})))
    d_rule, t_rule = timed(drift, rule, *state)
    difference = np.max(np.abs(d - d_rule)) / np.max(np.abs(d))
    print(f"\nOne full drift at H = {H}, L = {L}, F = {F} (near copies, lr = {cfg.sgd.lr}): exact route with the Gram term on "
          f"4096 points {t:.0f} ms; the Sobol rule at 65536 points {t_rule:.0f} ms; relative difference {difference:.1e}")
    return {"H": H, "L": L, "F": F, "lr": cfg.sgd.lr, "exact_ms": t, "rule_65536_ms": t_rule, "relative_difference": difference}


def gram_precision(quick: bool) -> list[dict]:
    rows = []
    print("\nThe lr^2 Gram term (lr = 0.5): mean error over 4 scramblings relative to the largest O(lr) drift entry")
    print("| activation | H | L | F | state | rule | points | relative error | ms / Gram |")
    print("|---|---|---|---|---|---|---|---|---|")
    cases = [("softmax", 6, 4, 1, "copies"), ("softmax", 6, 4, 1, "near copies"), ("bsoftmax", 4, 4, 2, "specialised")]
    gram = eqx.filter_jit(lambda fields, ode, *s: eqx.tree_at(lambda o: o.expectation.gram_term.fields, ode, fields).gram(*s))
    for act, H, L, F, kind in cases:
        state = trained(kind, H, F)
        cfg = config(act, H, L, F).replace(sgd={"lr": 0.5})
        ode = sl.OrderParameterODE.from_setup(sl.build(cfg))
        d = ode.drift(*state)
        first = float(jnp.max(jnp.abs(flat_drift(d._replace(Q=d.Q - ode.lr**2 * ode.gram(*state))))))
        prior = cfg.problem.build_prior()
        ref = gram(sl.LocalFields.make(L, H, prior, 1 << (16 if quick else 19), 99, principal=True), ode, *state)
        for principal in (False, True):
            for n in (1024, 4096) if quick else (1024, 4096, 16384):
                errs, ts = [], []
                for seed in range(4):
                    fields = sl.LocalFields.make(L, H, prior, n, seed, principal=principal, symmetric=not principal)
                    g, t = timed(gram, fields, ode, *state)
                    errs.append(float(ode.lr) ** 2 * float(np.max(np.abs(g - np.asarray(ref)))) / first)
                    ts.append(t)
                name = "rank-aware" if principal else "head-symmetric"
                print(f"| {act} | {H} | {L} | {F} | {kind} | {name} | {n} | {np.mean(errs):.1e} | {np.median(ts):.1f} |",
                      flush=True)
                rows.append({"activation": act, "H": H, "L": L, "F": F, "state": kind, "rule": name, "points": n,
                             "relative_error": np.mean(errs), "ms_per_gram": np.median(ts)})
    return rows


def wide_fields(quick: bool) -> list[dict]:
    from singleloc.expectations import _cubature, _laplace

    print("\nWide fields: one softmax head, L = 64; risk error | relative gradient error")
    print("| s | Gauss-Hermite (64 nodes) | trapezoidal (64 nodes) | profile grid | ms / gradient (grid) |")
    print("|---|---|---|---|---|")
    prior = sl.spikes(1, 2.5)
    rule = sl.exact_rule(sl.get_activation("softmax"), 64, 1, prior)
    trapezoid_from, _cubature.TRAPEZOID_FROM = _cubature.TRAPEZOID_FROM, 10**9
    rule_gh = sl.exact_rule(sl.get_activation("softmax"), 64, 1, prior)  # every normal rule Gauss-Hermite
    _cubature.TRAPEZOID_FROM = trapezoid_from
    z = np.linspace(-12.0, 12.0, 8193)
    w = np.exp(-z**2 / 2)
    dense = sl.LaplaceRule.make(rule.form, 64, 1, prior, n_t=1024, n_outer=64, n_inner=64)
    reference = eqx.tree_at(lambda r: (r.z_outer, r.w_outer), dense, (jnp.asarray(z), jnp.asarray(w / w.sum())))
    def grad(r, *x):  # the risk and then its gradient's entries, as one vector; traced anew at every call of this
        return eqx.filter_jit(lambda r, *x: jnp.concatenate([jnp.ravel(a) for a in jax.tree.leaves(
            jax.value_and_grad(r.risk, argnums=(0, 1, 2))(*x))]))(r, *x)

    rows, switch = [], _laplace.WIDE_SIGMA
    for s in (0.5, 1.0, 2.0, 8.0, 32.0) if quick else (0.5, 1.0, 1.5, 2.0, 4.0, 8.0, 16.0, 25.0, 32.0):
        state = (jnp.array([[0.8 * s]]), jnp.array([[s * s]]), jnp.array([0.1]))
        errors = {}
        for label, r, limit in (("gauss_hermite", rule_gh, 1e6), ("trapezoidal", rule, 1e6), ("profile_grid", rule, switch)):
            _laplace.WIDE_SIGMA = limit  # read when the program is traced
            compiled = eqx.filter_jit(lambda *x, r=r: grad(r, *x))  # traced with this WIDE_SIGMA
            out, t = timed(compiled, *state)
            _laplace.WIDE_SIGMA = 1e6
            ref = np.asarray(grad(reference, *state))
            errors[label] = (abs(out[0] - ref[0]), float(np.max(np.abs(out[1:] - ref[1:])) / np.max(np.abs(ref[1:]))), t)
        _laplace.WIDE_SIGMA = switch
        gh, tr, grid = errors["gauss_hermite"], errors["trapezoidal"], errors["profile_grid"]
        print(f"| {s:g} | {gh[0]:.1e} \\| {gh[1]:.1e} | {tr[0]:.1e} \\| {tr[1]:.1e} | {grid[0]:.1e} \\| {grid[1]:.1e} "
              f"| {grid[2]:.1f} |", flush=True)
        rows.append({"s": s, "gauss_hermite_risk_error": gh[0], "gauss_hermite_gradient_error": gh[1],
                     "trapezoidal_risk_error": tr[0], "trapezoidal_gradient_error": tr[1],
                     "grid_risk_error": grid[0], "grid_gradient_error": grid[1], "grid_ms": grid[2]})
    return rows


def joint_states(quick: bool):
    """Trained-like bsoftmax states on two spikes: two heads on one spike each or on a mixture of
    both, at widths ``m``; three to five heads near the spikes with a random ``R_orth`` of scale 0.15."""
    for kind, m in itertools.product(("one spike each", "mixture"), (1.0, 2.0, 3.0) if quick else (1.0, 2.0, 2.5, 3.0, 3.5)):
        M = m * (np.eye(2) if kind == "one spike each" else (np.eye(2) + 0.2 * np.ones((2, 2))) / 1.2)
        yield 2, kind, M, M @ M.T + np.array([[0.15, 0.03], [0.03, 0.15]]), np.array([0.1, -0.1])
    rng = np.random.default_rng(0)
    for H in (3, 4) if quick else (3, 4, 5):
        M = np.zeros((H, 2))
        for h in range(H):
            M[h, h % 2], M[h, (h + 1) % 2] = 2.4 - 0.05 * h, 0.05 * h
        A = 0.1 * rng.normal(size=(H, H))
        yield H, "near the spikes", M, M @ M.T + 0.15 * np.eye(H) + 0.03 + A @ A.T, np.linspace(-0.2, 0.2, H)


def joint_layers(quick: bool) -> list[dict]:
    """Section 7: joint layers in conditional product form at trained states, the default rule and
    one of half its leading sizes against a reference (1.5 x the leading sizes, every other
    direction on 8 normal nodes)."""
    print("\nJoint layers (bsoftmax), L = 16, two spikes: risk error | relative gradient error, ms per gradient; "
          "token std: the largest; small std: those of the directions beyond the two leading ones and the smallest")
    print("| H | heads | token std | small std | default (nodes) | ms | half leading sizes | ms |")
    print("|---|---|---|---|---|---|---|---|")
    prior = sl.spikes(2, 2.5)
    act = sl.get_activation("bsoftmax")
    value_grad = eqx.filter_jit(lambda r, *x: jnp.concatenate([jnp.ravel(a) for a in jax.tree.leaves(
        jax.value_and_grad(r.risk, argnums=(0, 1, 2))(*x))]))
    rows = []
    for H, kind, M, Q, b in joint_states(quick):
        default = sl.exact_rule(act, 16, H, prior)
        (sizes, *_), small, _ = default.layer.layout  # the finest leading rule, the small directions
        rules = {"default": default, "half": sl.exact_rule(act, 16, H, prior, joint_sizes=tuple(n // 2 for n in sizes))}
        reference = sl.exact_rule(act, 16, H, prior, joint_sizes=tuple(3 * n // 2 for n in sizes) + (8,) * small)
        state = tuple(jnp.asarray(x) for x in (M, Q, b))
        ref = np.asarray(value_grad(reference, *state))
        out = {}
        for label, rule in rules.items():
            v, t = timed(value_grad, rule, *state)
            out[label] = (abs(v[0] - ref[0]), float(np.max(np.abs(v[1:] - ref[1:])) / np.max(np.abs(ref[1:]))), t)
        lam = np.linalg.eigvalsh(Q)
        std, small_std = float(np.sqrt(lam[-1])), np.sqrt(np.maximum(lam[1:max(H - 2, 1)] - lam[0], 0.0))
        (dr, dg, dt), (hr, hg, ht) = out["default"], out["half"]
        small_text = ", ".join(f"{x:.2f}" for x in small_std) or "-"
        print(f"| {H} | {kind} | {std:.2f} | {small_text} | {dr:.1e} \\| {dg:.1e} ({default.layer.w.shape[0]}) | {dt:.0f} | "
              f"{hr:.1e} \\| {hg:.1e} | {ht:.0f} |", flush=True)
        rows.append({"H": H, "heads": kind, "token_std": std, "small_std": small_std.tolist(),
                     "nodes": int(default.layer.w.shape[0]), "risk_error": dr, "gradient_error": dg, "ms": dt,
                     "half_risk_error": hr, "half_gradient_error": hg, "half_ms": ht})
    return rows


def wide_gram(quick: bool) -> list[dict]:
    from singleloc.expectations import _laplace_heads

    print("\nThe exact two-head Gram term at wide fields (relative error | ms per term)")
    print("| L | s | risk's outer rule | GRAM_OUTER x | against Sobol (its s.e.) |")
    print("|---|---|---|---|---|")
    make = lambda L, n, prior: sl.exact_rule(sl.get_activation("softmax"), L, 2, prior, nodes=n)  # noqa: E731
    term = eqx.filter_jit(lambda r, *x: r.gram(*x))
    sobol = eqx.filter_jit(lambda ode, *x: ode.gram(*x))
    default, rows = _laplace_heads.GRAM_OUTER, []
    for L in (4,) if quick else (4, 64):
        prior = sl.spikes(2, 2.5)
        ode = sl.OrderParameterODE.from_setup(sl.build(config("softmax", 2, L, 2, route="rule", axes="principal")))
        for s in (4.0, 6.0, 8.0) if quick else (4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0):
            M = jnp.diag(jnp.array([s, s]))
            state = (M, M @ M.T + s * s / 128 * jnp.eye(2), jnp.zeros(2))
            ref = np.asarray(term(make(L, REFERENCE_NODES, prior), *state))
            rel = lambda G, R=ref: float(np.max(np.abs(G - R)) / np.max(np.abs(R)))  # noqa: E731
            _laplace_heads.GRAM_OUTER = 1  # read when the rule is made
            before, t_before = timed(term, make(L, 64, prior), *state)
            _laplace_heads.GRAM_OUTER = default
            after, t_after = timed(term, make(L, 64, prior), *state)
            row = {"L": L, "s": s, "before": rel(before), "before_ms": t_before, "after": rel(after), "after_ms": t_after}
            text = ""
            if s <= 8.0:
                points = 2**14 if quick else 2**16
                G = np.array([sobol(eqx.tree_at(lambda o: o.expectation.fields, ode, sl.LocalFields.make(L, 2, prior, points, k,
                                                                                              principal=True)), *state)
                              for k in range(4)])
                row.update(sobol=rel(after, G.mean(0)), sobol_se=float(np.max(G.std(0, ddof=1) / 2) / np.max(np.abs(ref))))
                text = f"{row['sobol']:.1e} ({row['sobol_se']:.1e})"
            print(f"| {L} | {s:g} | {row['before']:.1e} \\| {t_before:.0f} | {row['after']:.1e} \\| {t_after:.0f} | {text} |",
                  flush=True)
            rows.append(row)
    return rows


def length_sweep(quick: bool) -> list[dict]:
    """Section 9: the risk with its gradient and the exact Gram term across ``L`` on one program."""
    compiled: list[str] = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(str(kwargs.get("fun_name")))

    value_grad = eqx.filter_jit(lambda r, *x: jnp.concatenate([jnp.ravel(a) for a in jax.tree.leaves(
        jax.value_and_grad(r.risk, argnums=(0, 1, 2))(*x))]))
    term = eqx.filter_jit(lambda r, *x: r.gram(*x))
    lengths = (4, 64, 1024, 4096) if quick else (4, 16, 64, 256, 1024, 4096)
    prior = sl.spikes(1, 2.5)
    print("\nOne program for every L (near copies, theory.nodes = 64): programs compiled at each L, the first call (s, "
          "compilation included), ms per call after it")
    print("| activation | H | L | outer nodes | compiled | risk + gradient: first (s) \\| ms | Gram term: first (s) \\| ms |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for act, H in (("softmax", 2), ("ssmax", 2), ("bsoftmax", 2), ("softmax", 1)):
            state = trained("near copies", H, 1)
            for L in lengths:
                before = len(compiled)
                rule = sl.exact_rule(sl.get_activation(act), L, H, prior)
                t0 = time.perf_counter()
                jax.block_until_ready(value_grad(rule, *state))
                first = time.perf_counter() - t0
                _, ms = timed(value_grad, rule, *state)
                gram_first, gram_ms = float("nan"), float("nan")
                if rule.exact_gram:
                    t0 = time.perf_counter()
                    jax.block_until_ready(term(rule, *state))
                    gram_first = time.perf_counter() - t0
                    _, gram_ms = timed(term, rule, *state)
                row = {"activation": act, "H": H, "L": L, "outer_nodes": int(rule.z_outer.shape[0]),
                       "compiled": len(compiled) - before, "first_s": first, "ms": ms, "gram_first_s": gram_first,
                       "gram_ms": gram_ms}
                print(f"| {act} | {H} | {L} | {row['outer_nodes']} | {row['compiled']} | {first:.1f} \\| {ms:.0f} | "
                      f"{gram_first:.1f} \\| {gram_ms:.0f} |", flush=True)
                rows.append(row)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    return rows


def profile(quick: bool) -> list[dict]:
    """Section 10: the drift by part at one state (process CPU ms, min and median of 9)."""
    H = 4 if quick else 8
    cfg = sl.load_config("default").replace(model={"heads": H}, problem={"L": 8})
    M, Q, b = trained("near copies", H, cfg.problem.F)
    ode = sl.OrderParameterODE.from_setup(sl.build(cfg))
    e, rule = ode.expectation, ode.expectation.rule
    m1, C1, m0, C0 = rule.token_laws(*rule.state(M, Q, b))
    Y, step = rule.head_ranges(m1, jnp.diag(C1), m0, jnp.diag(C0))
    pre, omega = step[:, None] * jnp.exp(-rule.offset * jnp.exp(Y)), rule.single(Y[0], m1[0], C1[0, 0])[lp.OMEGA]
    means = [jnp.concatenate([m1[k][None], m0[k]]) for k in (0, 1)]

    def pair(means, C11, C12, C22):  # the (0, 1) pair's term, as PerHeadLayer.risk takes it (discrete prior)
        both = rule.pair(lh.PAIR_COMBOS, Y[0], Y[1], *means, C11, C12, C22, batches=lh.PAIR_BATCHES)
        noise, rel = (both[0][0], both[1][0]), jnp.tensordot(rule.probs, jnp.stack([both[1][1:], both[2]]), axes=([0], [1]))
        W, w = omega[:, None] + noise[0], pre[0][:, None] * pre[1][None, :]
        return jnp.sum(w * rel[0] * lp._power(W, rule.L - 1)) + (rule.L - 1) * jnp.sum(w * noise[1] * rel[1] * lp._power(
            W, rule.L - 2))

    seconds, laws = (lp.RHO0, lp.RHO1, lp.OMEGA), (means, C1[0, 0], C1[0, 1], C1[1, 1])
    s2, sx = C1[1, 1] - C1[0, 1] ** 2 / C1[0, 0], jnp.sqrt(C1[0, 0]) * rule.z_outer
    c = Y[1] + means[1][:, None, None] + (C1[0, 1] / C1[0, 0]) * sx[None, :, None]
    table = jax.jit(lambda s2, p: lp.smoothing_table(s2, rule.z_inner, rule.w_inner, rule.u_grid, p, lp.WIDE_SIGMA),
                    static_argnums=1)
    look_up = jax.jit(lambda t, c, p: lp.interpolated(*t, c, p), static_argnums=2)
    jvp = lp.jvp_profiles(seconds)  # the profiles whose table serves the values and derivatives
    n = rule.z_outer.shape[0]
    parts = {"drift": (eqx.filter_jit(lambda o, *s: flat_drift(o.drift(*s))), (ode, M, Q, b)),
             "risk gradient": (eqx.filter_jit(lambda e, *s: jax.grad(e.rule.risk, argnums=(0, 1, 2))(*s)), (e, M, Q, b)),
             "risk": (eqx.filter_jit(lambda e, *s: e.rule.risk(*s)), (e, M, Q, b)),
             "Gram term": (eqx.filter_jit(lambda e, *s: e.gram(*s)), (e, M, Q, b)),
             "one pair": (jax.jit(pair), laws), "one pair, gradient": (jax.jit(jax.grad(pair, argnums=(0, 1, 2, 3))), laws),
             "table": (table, (s2, seconds)), "table, derivatives' profiles": (table, (s2, jvp)),
             "interpolation": (look_up, (table(s2, seconds), c, seconds)),
             "interpolation, derivatives' profiles": (look_up, (table(s2, jvp), c, jvp)),
             "first field's profiles": (jax.jit(lambda m: lp._profiles(Y[0][:, None] + m[:, None, None] + sx, seconds[:2])),
                                        (means[0],)),
             "six products": (jax.jit(jnp.matmul), (jnp.ones((6, rule.n_t, n)), jnp.ones((6, n, rule.n_t))))}
    ms = {k: [] for k in parts}
    for _, (k, (f, args)) in itertools.product(range(10), parts.items()):  # the first round compiles
        t = time.process_time()
        jax.block_until_ready(f(*args))
        ms[k].append(1e3 * (time.process_time() - t))
    def mflop(f, args):  # XLA's count, for the parts without a loop (jax.jit; it counts a loop's body once)
        if isinstance(f, eqx.Module):
            return float("nan")
        cost = f.lower(*args).compile().cost_analysis()
        return float((cost[0] if isinstance(cost, list) else cost).get("flops", np.nan)) / 1e6

    rows = [{"part": k, "H": H, "min_ms": float(np.min(v[1:])), "median_ms": float(np.median(v[1:])),
             "mflop": mflop(*parts[k])} for k, v in ms.items()]
    print(f"\nWhere a drift's time goes (softmax, L = 8, H = {H}, near copies): process CPU ms, and XLA's count of "
          "floating-point operations (MFLOP; blank for programs with a loop)")
    print("| part | min | median | MFLOP |\n|---|---|---|---|")
    print("\n".join(f"| {r['part']} | {r['min_ms']:.2f} | {r['median_ms']:.2f} | {r['mflop']:.1f} |" for r in rows))
    by = {r["part"]: r for r in rows}
    rate = by["six products"]["mflop"] / by["six products"]["min_ms"]  # GFLOP/s of a matrix product here
    pairs = H * (H - 1) // 2
    print(f"The pairs' gradients at the matrix product's rate ({rate:.1f} GFLOP/s): {pairs} x "
          f"{by['one pair, gradient']['mflop']:.0f} MFLOP = {pairs * by['one pair, gradient']['mflop'] / rate:.0f} ms, "
          f"the floor of this layout (measured: {pairs * by['one pair, gradient']['min_ms']:.0f} ms)")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rule sizes and head counts")
    parser.add_argument("--sections", default="1,2,3,4,5,6,7,8,9,10", help="which sections to run (default all: 1,...,10; "
                        "1 and 2 run together)")
    args = add_save_option(parser).parse_args()
    sections = {int(x) for x in args.sections.split(",")}
    results = {}
    if sections & {1, 2}:
        results["work_precision"] = work_precision(args.quick)
    if 3 in sections:
        results["cost"] = cost_tables(args.quick)
    if 4 in sections:
        results["full_drift"] = full_drift()
    if 5 in sections:
        results["gram"] = gram_precision(args.quick)
    if 6 in sections:
        results["wide_fields"] = wide_fields(args.quick)
    if 7 in sections:
        results["joint_layers"] = joint_layers(args.quick)
    if 8 in sections:
        results["wide_gram"] = wide_gram(args.quick)
    if 9 in sections:
        results["length_sweep"] = length_sweep(args.quick)
    if 10 in sections:
        results["profile"] = profile(args.quick)
    save(args, __file__, results)


if __name__ == "__main__":
    main()

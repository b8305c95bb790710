"""Gradient sensitivity of softmax against the temperature (docs/model.md section 8).

Logits: the scores of the trained-like head of the single-location model (F = 1, point prior
``theta = strength``, one head with ``M = strength``, ``Q = strength^2``), i.e.
``l_i = strength * x_i[0]`` with ``x_i[0] ~ N(0, 1)`` and ``+strength`` at the relevant token,
for ``ROWS`` sequences of length ``L``. For each temperature ``T`` (log grid 1e-3 .. 1e3):

* the exact Jacobian ``J = (diag(alpha) - alpha alpha^T)/T`` of ``l -> softmax(l/T)`` and its
  spectral norm (largest eigenvalue; :func:`singleloc.softmax_jacobian_norm`), mean and
  median over rows, against the worst case ``1/(2T)`` (two tied top logits);
* the finite-difference estimate ``|softmax((l + eps v)/T) - softmax(l/T)| / eps`` for random
  unit ``v`` (``DIRECTIONS`` per row, seeded) and ``eps`` in {1e-3, 1e-1, 10}, mean over rows
  and directions, with the exact directional norm ``|J v|`` for the same ``v``.

Printed: the log-log slope and the coefficient ``c`` of a ``c/T`` fit of the mean exact norm
at high temperature (``T >= 30``, where ``alpha`` is nearly uniform and ``c -> 1/L``); the
temperature ``T*`` at which the median exact norm peaks (below it ``alpha`` becomes one-hot
and ``J -> 0`` exponentially, ``~ exp(-gap/T)/T``) next to the median gap between the two
largest logits; the low-temperature plateau of the *mean* norm (rows with near-tied top
logits keep ``|J| ~ 1/(2T)``, and their share shrinks like ``T``, so the mean tends to a
constant proportional to the density of the top gap at 0); and, for each ``eps``, the
temperature below which the finite difference departs by more than 10% from ``|J v|``
and its plateau at ``T = 1e-3`` against the ceiling ``sqrt(2)/eps``.

Run: ``python experiments/normalization_jacobian.py`` (one to two minutes on two CPU cores);
writes ``figures/normalization_jacobian.png``. ``--quick``: 400 rows.
"""

from __future__ import annotations

import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import figure, figures_dir, parser  # noqa: E402

import singleloc as sl  # noqa: E402

STRENGTH = 2.0
L = 64
ROWS = 4000
DIRECTIONS = 4
TEMPERATURES = np.logspace(-3, 3, 61)
FIT_FROM = 30.0
SEED = 0


def jv_norm(logits, T, v):
    """``|J v|`` for every row (rows, L) and direction ``v`` (rows, K, L): the forward-mode
    derivative of the activation ``singleloc.softmax(l / T)`` along ``v``, in float64."""
    l = jnp.broadcast_to(jnp.asarray(logits)[:, None, :], v.shape)
    _, jv = jax.jvp(lambda x: sl.softmax(x / T), (l,), (jnp.asarray(v),))
    return np.linalg.norm(np.asarray(jv), axis=-1)


def sweep(logits, v):
    """Mean/median exact norm, mean |J v| and mean finite differences over the temperature grid."""
    out = {"mean": [], "median": [], "jv": [], **{e: [] for e in sl.FD_EPSILONS}}
    for T in TEMPERATURES:
        n = sl.softmax_jacobian_norm(logits, T)
        out["mean"].append(n.mean())
        out["median"].append(np.median(n))
        out["jv"].append(jv_norm(logits, T, v).mean())
        for e in sl.FD_EPSILONS:
            out[e].append(sl.finite_difference_sensitivity(logits, T, e, directions=v).mean())
    return {k: np.array(y) for k, y in out.items()}


def main():
    args = parser(__doc__, cache=False).parse_args()
    t0 = time.time()
    n_rows = 400 if args.quick else ROWS
    rng = np.random.default_rng(SEED)
    x0 = rng.standard_normal((n_rows, L))
    x0[:, 0] += STRENGTH  # relevant token at position 0
    logits = STRENGTH * x0
    v = sl.random_directions(logits.shape, DIRECTIONS, seed=SEED + 1)
    order = np.argsort(-logits, axis=-1)
    rows = np.arange(n_rows)
    gap = logits[rows, order[:, 0]] - logits[rows, order[:, 1]]
    tied = logits.copy()
    tied[rows, order[:, 1]] = tied[rows, order[:, 0]]  # worst case: the two top logits tied

    g = sweep(logits, v)
    w = sweep(tied, v)

    hot = TEMPERATURES >= FIT_FROM
    slope = np.polyfit(np.log(TEMPERATURES[hot]), np.log(g["mean"][hot]), 1)[0]
    c = np.exp(np.mean(np.log(g["mean"][hot] * TEMPERATURES[hot])))
    cold = TEMPERATURES <= 0.1
    slope_tied = np.polyfit(np.log(TEMPERATURES[cold]), np.log(w["mean"][cold]), 1)[0]
    k_peak = int(np.argmax(g["median"]))
    k_peak_mean = int(np.argmax(g["mean"]))
    print(f"softmax Jacobian vs temperature: logits of the trained-like head (theta = M = {STRENGTH:g}, "
          f"Q = {STRENGTH**2:g}), L = {L}, {n_rows} rows, {DIRECTIONS} random unit directions per row")
    for title, r in (("generic rows (as sampled)", g), ("worst-case rows (two top logits tied)", w)):
        print(f"\n{title}")
        print("   T      exact mean  exact median    1/(2T)     |Jv| mean  " + "  ".join(f"FD eps={e:g}" for e in sl.FD_EPSILONS))
        for k in range(0, TEMPERATURES.size, 5):
            T = TEMPERATURES[k]
            print(f"{T:8.3g}  {r['mean'][k]:11.4g} {r['median'][k]:12.4g} {0.5 / T:10.4g} {r['jv'][k]:12.4g}  "
                  + "  ".join(f"{r[e][k]:11.4g}" for e in sl.FD_EPSILONS))
    print(f"\n1/T law at high temperature (T >= {FIT_FROM:g}): log-log slope {slope:+.3f}, "
          f"mean |J| ~= {c:.4f}/T (alpha -> uniform gives 1/L = {1 / L:.4f})")
    print(f"1/T law for tied top logits (T <= 0.1): log-log slope {slope_tied:+.3f}, mean |J| * T = "
          f"{np.mean(w['mean'][cold] * TEMPERATURES[cold]):.4f} (bound 1/2)")
    print(f"generic rows: the median exact norm peaks at T* = {TEMPERATURES[k_peak]:.3g} (|J| = {g['median'][k_peak]:.3g}; "
          f"median top-two logit gap {np.median(gap):.3g}) and collapses below (alpha one-hot); the mean peaks at "
          f"T = {TEMPERATURES[k_peak_mean]:.3g} (|J| = {g['mean'][k_peak_mean]:.3g}) and saturates at "
          f"{g['mean'][0]:.3g} for T = {TEMPERATURES[0]:g} (share of rows with gap < T: {np.mean(gap < TEMPERATURES[0]):.4f})")
    for e in sl.FD_EPSILONS:
        rel = np.abs(g[e] / g["jv"] - 1)
        bad = np.nonzero(rel > 0.1)[0]
        dep = "never on the grid" if not bad.size else f"T <= {TEMPERATURES[bad.max()]:.3g}"
        sat = np.nonzero(w[e] < 0.5 * w["jv"])[0]
        t_sat = "none on the grid" if not sat.size else f"T = {TEMPERATURES[sat.max()]:.3g}"
        print(f"FD eps = {e:g}: generic rows depart from |Jv| by > 10% for {dep}; tied rows saturate "
              f"(FD < |Jv|/2) below {t_sat}, plateau {w[e][0]:.4g} at T = {TEMPERATURES[0]:g} "
              f"(ceiling sqrt(2)/eps = {np.sqrt(2) / e:.4g})")

    fig = figure(figsize=(12, 9.5))
    axes = fig.subplots(2, 2)
    for row, (name, r) in enumerate((("generic rows", g), ("two top logits tied", w))):
        ax = axes[row, 0]
        ax.loglog(TEMPERATURES, 0.5 / TEMPERATURES, color="gray", lw=1, ls="-.", label="1/(2T): worst case")
        if row == 0:
            ax.loglog(TEMPERATURES, c / TEMPERATURES, color="gray", lw=1, ls=":", label=f"{c:.4f}/T: fit for T >= {FIT_FROM:g}")
        ax.loglog(TEMPERATURES, r["mean"], color="k", lw=2, label="exact |J|_2, mean over rows")
        ax.loglog(TEMPERATURES, r["median"], color="k", lw=1.2, ls="--", label="exact |J|_2, median over rows")
        if row == 0:
            ax.axvline(TEMPERATURES[k_peak], color="C3", lw=0.8, ls="--")
            ax.text(TEMPERATURES[k_peak] * 1.15, 2e-5, f"T* = {TEMPERATURES[k_peak]:.2g}\n(median peak)", color="C3", fontsize=8)
        ax.set_ylim(1e-5, 1e3)
        ax.set(xlabel="temperature T", ylabel="Jacobian norm of softmax(l/T)",
               title=f"exact Jacobian, {name} (trained-like head, L = {L})")
        ax.legend(fontsize=8, loc="upper right")
        ax = axes[row, 1]
        ax.loglog(TEMPERATURES, r["jv"], color="k", lw=2, label="exact |J v|, mean")
        for i, e in enumerate(sl.FD_EPSILONS):
            ax.loglog(TEMPERATURES, r[e], color=f"C{i}", marker="o", ms=3, lw=1, label=f"finite difference, eps = {e:g}")
            ax.axhline(np.sqrt(2) / e, color=f"C{i}", lw=0.6, ls=":")
        ax.set_ylim(1e-6, 3e3)
        ax.set(xlabel="temperature T", ylabel="|softmax((l + eps v)/T) - softmax(l/T)| / eps",
               title=f"finite differences, {name} (dotted: sqrt(2)/eps)")
        ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    path = sl.save_figure(figures_dir(args) / "normalization_jacobian.png", fig)
    print(f"\nwrote {path} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()

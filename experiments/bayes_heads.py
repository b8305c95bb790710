"""Final risk after training against the number of heads H, for softmax, softmax1 and bsoftmax,
with the Bayes risk (docs/model.md section 6).

Setting: L = 4, spikes prior with F = 3 directions (support size K = 3), strength 2.5;
H in {1, 2, 3, 4, 6}. softmax trains no bias (it cancels); softmax1 and bsoftmax train their
biases. SGD: lr = 0.5, keys initialised with scale 0.5. The ODE is integrated from the
overlaps of a real D = 1000 initialisation (seed 0), up to tau = 2e4 on a log grid, with
``theory.points = 1024``; the final risk is re-evaluated at the final ``(M, Q, b)`` on 4
independent rules of 8192 points (see ``bayes_strength.py`` for why and for the check against
2048-point dynamics). Convergence: the relative change of the ODE's risk over the last 10% of
tau is printed for every point; points above 1e-3 are flagged (``*``) and drawn open.

Quadrature caveat at large H: the rule integrates over L * H Gaussian dimensions (24 at H = 6).
For bsoftmax the re-evaluated final risk of the state from 1024-point dynamics is 0.2566 at H = 3
and 0.2541 at H = 6; with 4096-point dynamics 0.2563 and 0.2520. So H <= 3 is resolved to 3e-4,
H = 6 only to about 2e-3 (the ODE's *own* risk at H = 6, 1024 points, even falls below the Bayes
risk: the dynamics fit the error of the fixed rule). The conclusions below do not depend on it.

Also printed: the Bayes risk (8 scramblings of 4096 points, with its standard error) and the
risk of bsoftmax at its Bayes point with H = K (``M_h = theta^(h)``, ``Q = M M^T``,
``b_h = log pi_h - |theta^(h)|^2/2``), which must equal it.

Run: ``python experiments/bayes_heads.py``; writes ``figures/bayes_heads.png``. ``--quick``: H in
{1, 3}, tau_max = 100, 256 quadrature points.
"""

from __future__ import annotations

import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import figure, figures_dir, parser  # noqa: E402

import singleloc as sl  # noqa: E402

L, F, STRENGTH = 4, 3, 2.5
HEADS = (1, 2, 3, 4, 6)
ACTIVATIONS = ("softmax", "softmax1", "bsoftmax")
LR, INIT_SCALE, D_THEORY, TAU_MAX, POINTS = 0.5, 0.5, 1000, 20000.0, 1024
EVAL = {"points": 8192, "seed": 1000, "replicates": 4}  # re-evaluation of the final risk
CONVERGED = 1e-3
COLORS = {"softmax": "C0", "softmax1": "C1", "bsoftmax": "C2"}
QUICK = {"heads": (1, 3), "tau_max": 100.0, "points": 256}


def config(activation: str, heads: int, tau_max: float = TAU_MAX, points: int = POINTS):
    return sl.load_config({
        "problem": {"L": L, "F": F, "prior": "spikes", "strength": STRENGTH},
        "model": {"heads": heads, "activation": activation, "train_bias": activation != "softmax"},
        "sgd": {"lr": LR, "init_scale": INIT_SCALE, "tau_max": tau_max, "spacing": "log", "n_save": 41},
        "simulation": {"D": D_THEORY, "seeds": 1},
        "theory": {"points": points},
    })


def main() -> int:
    args = parser(__doc__, cache=False).parse_args()
    heads, tau_max, points = (QUICK["heads"], QUICK["tau_max"], QUICK["points"]) if args.quick else (HEADS, TAU_MAX, POINTS)
    t_start = time.time()
    prior = config("bsoftmax", F).problem.build_prior()
    bayes = sl.bayes_risk(prior, L, points=4096, replicates=8)
    M, Q, b = sl.bayes_point(prior)
    at_point = sl.population_risk(prior, L, "bsoftmax", M, Q, b, points=4096, replicates=8)
    K = M.shape[0]
    print(f"L = {L}, spikes prior F = {F} (K = {K}), strength {STRENGTH}, lr = {LR}, tau_max = {tau_max:g}, "
          f"theory.points = {points}")
    print(f"Bayes risk {bayes.value:.5f} +- {bayes.error:.1e}; bsoftmax at the Bayes point (H = K = {K}): "
          f"{at_point.value:.5f} +- {at_point.error:.1e}")

    ts = np.unique(np.concatenate([[0.0], np.geomspace(1e-2, tau_max, 48), [0.9 * tau_max]]))
    i90 = int(np.argmin(np.abs(ts - 0.9 * tau_max)))
    final = {a: np.full(len(heads), np.nan) for a in ACTIVATIONS}
    change = {a: np.full(len(heads), np.nan) for a in ACTIVATIONS}
    error = {a: np.full(len(heads), np.nan) for a in ACTIVATIONS}
    for act in ACTIVATIONS:
        for j, H in enumerate(heads):
            t0 = time.time()
            cfg = config(act, H, tau_max, points)
            try:
                res = sl.integrate(cfg, sl.initial_conditions(cfg, 1), ts=ts, progress=False)
            except FloatingPointError as err:
                print(f"  {act} H = {H}: integration failed: {err}")
                continue
            r = res.risk[0]
            fin = sl.population_risk(prior, L, act, res.M[0, -1], res.Q[0, -1], res.b[0, -1], **EVAL)
            final[act][j], error[act][j], change[act][j] = fin.value, fin.error, abs(r[-1] - r[i90]) / r[-1]
            print(f"  {act:9s} H = {H}: final risk {fin.value:.5f} +- {fin.error:.1e} (ODE's own {r[-1]:.5f}; gap to Bayes "
                  f"{fin.value - bayes.value:+.5f}), rel. change over last 10% of tau {change[act][j]:.1e}  "
                  f"[{time.time() - t0:.0f} s]", flush=True)

    print("\nfinal risk at tau_max (gap to Bayes); * = rel. change over the last 10% of tau > 1e-3")
    print(f"{'H':>3s}" + "".join(f"{a:>22s}" for a in ACTIVATIONS))
    for j, H in enumerate(heads):
        cells = [f"{final[a][j]:10.5f} ({final[a][j] - bayes.value:+.4f}){'*' if not change[a][j] <= CONVERGED else ' '}"
                 for a in ACTIVATIONS]
        print(f"{H:3d}" + "".join(f"{c:>22s}" for c in cells))
    print(f"largest standard error of a final risk: {np.nanmax([error[a] for a in ACTIVATIONS]):.1e}")
    j = heads.index(K)
    print(f"at H = K = {K}: bsoftmax - Bayes = {final['bsoftmax'][j] - bayes.value:+.5f}; "
          f"softmax floor (min over H of softmax - Bayes) = {np.nanmin(final['softmax']) - bayes.value:+.5f}; "
          f"softmax1 min over H - Bayes = {np.nanmin(final['softmax1']) - bayes.value:+.5f}")

    fig = figure(figsize=(5.2, 3.8), layout="constrained")
    ax = fig.subplots()
    ax.axhline(bayes.value, color="k", lw=1.4, label="Bayes risk")
    for act in ACTIVATIONS:
        conv = change[act] <= CONVERGED
        ax.plot(heads, final[act], "-", color=COLORS[act], lw=1.2, label=act)
        ax.plot(np.array(heads)[conv], final[act][conv], "o", color=COLORS[act], ms=5)
        ax.plot(np.array(heads)[~conv], final[act][~conv], "o", mfc="none", color=COLORS[act], ms=6)
    ax.axvline(K, color="grey", ls=":", lw=1)
    ax.text(K, ax.get_ylim()[1], " H = K", va="top", fontsize=8, color="grey")
    ax.set_xlabel("number of heads H")
    ax.set_ylabel(f"risk at tau = {tau_max:g} (theory)")
    ax.set_title(f"spikes prior, F = K = {F}, strength {STRENGTH}, L = {L}", fontsize=10)
    ax.set_xticks(heads)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=8)
    path = sl.save_figure(figures_dir(args) / "bayes_heads.png", fig)
    print(f"wrote {path}; total runtime {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Vanishing attention against the sequence length in the single-location model (docs/model.md section 8).

Setting: F = 1 spike, point prior ``theta = strength`` (``spikes`` prior with F = 1), one head
with the order parameters of a trained layer, ``M = strength``, ``Q = strength^2`` (key
aligned with the spike, ``R_orth = 0``), ``b = 0``. For softmax this head is exactly the
Bayes-optimal estimator (docs/model.md section 6), so here softmax's weights are the posterior
of the location. Activations: softmax, softmax1, bsoftmax (identical to softmax for one
head: ``H exp(s)/sum_{h,l} exp(s)`` with ``H = 1``) and ssmax (``softmax(log(L) s)``, scale 1).

Part 1, limit ``D -> infinity`` (Monte Carlo over the local fields of docs/model.md section 4,
relevant token at position 0, which permutation equivariance allows): ``nu_l ~ N(0, 1)``,
``g_l = M nu_l + sqrt(Q - M^2) xi_l`` for noise tokens, plus the shift ``(M theta, theta)`` at
``eps``. Reported against L: the mean (and median) aggregated weight on the relevant token
``a_eps``, its log-log slope for L >= 64 (1/L decay: slope -1), and the limit risk
``E[(1 - a_eps)^2 + sum_{l != eps} a_l^2]`` of docs/model.md section 3.

Part 2, the top-N diagnostics with the relevant token as ground truth. They need token
vectors; we use the tokens themselves at a moderate dimension ``D`` (the values of this
layer are the tokens, ``yhat = sum_l a_l x_l``): ``x_l ~ N(0, I_D)``, ``x_eps = z + strength
e_1`` (spike ``k* = sqrt(D) e_1``), key ``k = strength k*``, so the scores are
``strength * x_l[0]``, the same law as in part 1. (The D -> infinity proxy would make the
tokens orthonormal after scaling, for which every selected token is trivially separable;
a moderate D keeps the norm fluctuations.) Reported against L: how often the top-1 token is
``eps``, the separability ``N_s/N`` at N = 4 (3 at L = 4) and N = 16 (at N = 1 it is 1 by
construction), how often ``eps`` is selected *and* separable at N = 4, and the critical top-N
(:func:`singleloc.critical_top_n`: the first N of the doubling grid 1, 2, 4, ... at which the
representation distance at the next grid value is not significantly larger, one-sided
two-sample KS test across sequences at level 0.01; the samples are the sequences). bsoftmax
is left out of part 2 (its weights equal softmax's).

Run: ``python experiments/normalization_length.py`` (one to two minutes on two CPU cores); writes
``figures/normalization_length.png``. ``--quick``: a tenth of the sequences.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from _common import figure, figures_dir, parser

import singleloc as sl

STRENGTH = 2.0
M, Q = STRENGTH, STRENGTH**2
LENGTHS = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
ACTIVATIONS = ["softmax", "softmax1", "bsoftmax", "ssmax"]
ACTIVATIONS_P2 = ["softmax", "softmax1", "ssmax"]  # bsoftmax = softmax for one head
SAMPLES = 20_000  # sequences per L, part 1
CHUNK = 2_000
D = 32  # token dimension, part 2
SEQUENCES = 400  # sequences per L, part 2
SIGNIFICANCE = 0.01
FIT_FROM = 64
SEED = 0


def local_fields(key, n, L):
    """Scores (n, 1, L) and nu (n, L) with the relevant token at position 0."""
    k_nu, k_xi = jax.random.split(key)
    nu = jax.random.normal(k_nu, (n, L)).at[:, 0].add(STRENGTH)  # shift theta at eps
    xi = jax.random.normal(k_xi, (n, L))
    g = M * nu + jnp.sqrt(jnp.maximum(Q - M**2, 0.0)) * xi  # mean M*theta at eps
    return g[:, None, :], nu


def part1(samples: int):
    """Mean/median weight on eps and limit risk against L, for each activation, and Bayes."""
    out = {name: {"mean": [], "median": [], "risk": []} for name in ACTIVATIONS}
    out["bayes"] = {"mean": [], "median": [], "risk": []}
    fns = {}
    for name in ACTIVATIONS:
        act = sl.get_activation(name)
        fns[name] = jax.jit(
            jax.vmap(lambda s, act=act: (sl.token_weights(act, s)[0], sl.limit_loss(act, s, 0)))
        )

    @jax.jit
    @jax.vmap
    def bayes(nu):  # posterior of the location, point prior: p_l ∝ exp(theta nu_l - theta^2/2)
        p = sl.softmax(STRENGTH * nu)
        return p[0], (1 - p[0]) ** 2 + jnp.sum(p[1:] ** 2)

    key = jax.random.PRNGKey(SEED)
    for L in LENGTHS:
        acc = {name: ([], []) for name in out}
        for c in range(samples // CHUNK):
            s, nu = local_fields(jax.random.fold_in(jax.random.fold_in(key, L), c), CHUNK, L)
            for name in ACTIVATIONS:
                w, r = fns[name](s)
                acc[name][0].append(np.asarray(w))
                acc[name][1].append(np.asarray(r))
            w, r = bayes(nu)
            acc["bayes"][0].append(np.asarray(w))
            acc["bayes"][1].append(np.asarray(r))
        for name, (w, r) in acc.items():
            w, r = np.concatenate(w), np.concatenate(r)
            out[name]["mean"].append(w.mean())
            out[name]["median"].append(np.median(w))
            out[name]["risk"].append(r.mean())
    return {name: {k: np.array(v) for k, v in d.items()} for name, d in out.items()}


def part2(rng, sequences: int):
    """Top-N diagnostics of D-dimensional tokens with eps as ground truth."""
    res = {name: {"top1": [], "sep16": [], "sep4": [], "eps_sep4": [], "critical": []} for name in ACTIVATIONS_P2}
    for L in LENGTHS:
        X = rng.standard_normal((sequences, L, D))
        X[:, 0, 0] += STRENGTH  # relevant token at position 0: x_eps = z + strength e_1
        scores = jnp.asarray(STRENGTH * X[:, None, :, 0])  # (S, H=1, L): <k, x_l>/sqrt(D)
        grid = [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if n < L]
        for name in ACTIVATIONS_P2:
            act = sl.get_activation(name)
            w = np.asarray(jax.vmap(lambda s, act=act: sl.token_weights(act, s))(scores), dtype=np.float64)
            t1 = sl.top_n_diagnostics(w, X, 1)
            t4 = sl.top_n_diagnostics(w, X, min(4, L - 1))  # N = 3 at L = 4
            sep16 = np.nanmean(sl.top_n_diagnostics(w, X, 16).separability) if L > 16 else np.nan
            eps_sep = t4.selected[:, 0] & (t4.token_distance[:, 0] < t4.radius)
            crit = sl.critical_top_n(w, X, grid, significance=SIGNIFICANCE)
            r = res[name]
            r["top1"].append(t1.selected[:, 0].mean())
            r["sep16"].append(sep16)
            r["sep4"].append(np.nanmean(t4.separability))
            r["eps_sep4"].append(eps_sep.mean())
            r["critical"].append(np.nan if crit.critical_n is None else crit.critical_n)
    return {name: {k: np.array(v, dtype=float) for k, v in d.items()} for name, d in res.items()}


def slope(y):
    L = np.array(LENGTHS, dtype=float)
    keep = L >= FIT_FROM
    return np.polyfit(np.log(L[keep]), np.log(y[keep]), 1)[0]


def main():
    args = parser(__doc__, cache=False).parse_args()
    samples, sequences = (SAMPLES // 10, SEQUENCES // 10) if args.quick else (SAMPLES, SEQUENCES)
    t0 = time.time()
    p1 = part1(samples)
    p2 = part2(np.random.default_rng(SEED), sequences)
    L = np.array(LENGTHS, dtype=float)

    print(f"single-location model, F = 1, theta = {STRENGTH}, one head M = {M}, Q = {Q}, b = 0; "
          f"{samples} sequences per L (limit), {sequences} D = {D} sequences per L (top-N)")
    print("\nweight on the relevant token, mean over sequences (median in brackets), and limit risk")
    header = "    L " + "".join(f"{n:>24s}" for n in ACTIVATIONS + ["bayes"])
    print(header)
    for i, l in enumerate(LENGTHS):
        row = "".join(f"{p1[n]['mean'][i]:9.4f} ({p1[n]['median'][i]:.4f}) {p1[n]['risk'][i]:5.3f}"
                      for n in ACTIVATIONS + ["bayes"])
        print(f"{l:5d} {row}")
    print(f"\nlog-log slope of the mean weight on eps for L >= {FIT_FROM} (1/L decay: -1); median in brackets")
    for n in ACTIVATIONS + ["bayes"]:
        print(f"  {n:9s} {slope(p1[n]['mean']):+.3f} ({slope(p1[n]['median']):+.3f}),  "
              f"L * mean weight at L = 1024: {1024 * p1[n]['mean'][-1]:.2f}")
    ratio = p1["ssmax"]["mean"] / p1["softmax"]["mean"]
    print("  ssmax / softmax mean weight: " + ", ".join(f"L={l}: {r:.2f}" for l, r in zip(LENGTHS, ratio)))
    diff = p1["ssmax"]["risk"] - p1["softmax"]["risk"]
    print("  ssmax - softmax limit risk:  " + ", ".join(f"L={l}: {d:+.3f}" for l, d in zip(LENGTHS, diff)))
    print(f"  max |softmax - bayes| risk: {np.max(np.abs(p1['softmax']['risk'] - p1['bayes']['risk'])):.2e} "
          "(softmax is the Bayes estimator here)")

    print(f"\ntop-N diagnostics, tokens in D = {D}, relevant token as ground truth")
    print("    L  act        P(top1=eps)  Ns/N(N=4) Ns/N(N=16)  P(eps sel.&sep., N=4)  critical N  (/L)")
    for i, l in enumerate(LENGTHS):
        for n in ACTIVATIONS_P2:
            r = p2[n]
            c = r["critical"][i]
            cs = "   none" if np.isnan(c) else f"{int(c):7d}  ({c / l:.3f})"
            print(f"{l:5d}  {n:9s} {r['top1'][i]:12.3f} {r['sep4'][i]:10.3f} {r['sep16'][i]:10.3f} "
                  f"{r['eps_sep4'][i]:22.3f}  {cs}")

    colors = {"softmax": "C0", "softmax1": "C1", "bsoftmax": "C2", "ssmax": "C3", "bayes": "k"}
    styles = {"softmax": "-", "softmax1": "--", "bsoftmax": ":", "ssmax": "-", "bayes": "none"}
    fig = figure(figsize=(11, 8.5))
    axes = fig.subplots(2, 2)
    ax = axes[0, 0]
    for n in ACTIVATIONS:
        ax.loglog(L, p1[n]["mean"], styles[n], marker="o", ms=4, color=colors[n],
                  label=f"{n}, mean (slope {slope(p1[n]['mean']):+.2f})")
    for n in ("softmax", "ssmax"):
        ax.loglog(L, p1[n]["median"], ls="--", marker="v", ms=4, color=colors[n], alpha=0.6,
                  label=f"{n}, median (slope {slope(p1[n]['median']):+.2f})")
    ax.loglog(L, p1["bayes"]["mean"], "x", color="k", label="Bayes posterior, mean")
    ax.loglog(L, p1["softmax"]["median"][-1] * 1024 / L, color="gray", lw=0.8, ls="-.", label="1/L")
    ax.set_ylim(1e-3, 1.5)
    ax.set(xlabel="sequence length L", ylabel="weight on relevant token  a_eps",
           title=f"vanishing attention (theta = {STRENGTH:g}, M = {M:g}, Q = {Q:g}, b = 0)")
    ax.legend(fontsize=7.5, loc="lower left")
    ax = axes[0, 1]
    for n in ACTIVATIONS:
        ax.semilogx(L, p1[n]["risk"], styles[n], marker="o", ms=4, color=colors[n], label=n)
    ax.semilogx(L, p1["bayes"]["risk"], "x", color="k", label="Bayes risk")
    ax.set(xlabel="sequence length L", ylabel="limit risk  E[(1-a_eps)^2 + sum a_l^2]",
           title="limit risk at fixed order parameters")
    ax.legend(fontsize=8)
    ax = axes[1, 0]
    for n in ("softmax", "ssmax"):
        ax.semilogx(L, p2[n]["sep4"], marker="o", ms=4, color=colors[n], label=f"{n}: N_s/N, N = 4")
        ax.semilogx(L, p2[n]["sep16"], ls="--", marker="o", ms=4, color=colors[n], label=f"{n}: N_s/N, N = 16")
        ax.semilogx(L, p2[n]["eps_sep4"], ls=":", marker="s", ms=4, color=colors[n],
                    label=f"{n}: eps selected & separable, N = 4")
    ax.semilogx(L, p2["softmax"]["top1"], color="k", lw=0.8, marker="^", ms=4, label="P(top-1 token = eps)")
    ax.set(xlabel="sequence length L", ylabel="fraction", ylim=(-0.02, 1.02),
           title=f"separability, tokens in D = {D} (softmax1 = softmax)")
    ax.legend(fontsize=7.5, loc="lower left")
    ax = axes[1, 1]
    for n in ACTIVATIONS_P2:
        ax.loglog(L, p2[n]["critical"], styles[n], marker="o", ms=5, color=colors[n], label=n)
    ax.loglog(L, 0.06 * L, color="gray", lw=0.8, ls="-.", label="0.06 L (GPT-2, source paper)")
    ax.set(xlabel="sequence length L", ylabel="critical top-N (KS, level 0.01)",
           title=f"critical top-N: distance stops growing ({sequences} sequences)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = sl.save_figure(figures_dir(args) / "normalization_length.png", fig)
    print(f"\nwrote {path} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()

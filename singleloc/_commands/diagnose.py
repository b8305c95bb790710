"""``singleloc diagnose ATTN.npy``: normalization diagnostics of dumped attention (MODEL.md s. 8)."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np

from .. import _diagnostics as dg
from .._io import save_figure, save_json

DESCRIPTION = """\
Normalization diagnostics (MODEL.md section 8) of attention weights dumped from any model.

ATTN.npy holds weights whose LAST axis runs over the tokens of a row; for two or more axes
the second-to-last is the query axis and the axes before it index heads, e.g. GPT-2 as
(layers, heads, L, L). Rows need not sum to one, weights must be finite and non-negative.

Printed and written: (1) vanishing attention: L*max(alpha), L*min(alpha) and the effective
logit bound a (the smallest a with logits in [-a, a] giving the row by softmax), to compare
with exp(-2a)/L <= alpha_i <= exp(2a)/L; (2) gradient sensitivity at each temperature T, using
the logits log(alpha) (exact up to a per-row shift, which softmax ignores; T = 1 is the dumped
row): the spectral and Frobenius norms of the exact Jacobian (diag(a) - a a^T)/T of
softmax(l/T), and the finite difference |softmax((l + eps v)/T) - softmax(l/T)|/eps for random
unit v; (3) with --values: for each top-N, the representation distance d = sum over unselected
i of |alpha_i x_i - s| with s = sum over the N largest weights of alpha_i x_i, the geometric
separability N_s/N, and the critical top-N (the first N of the grid at which d at the next N
is not significantly larger, one-sided two-sample Kolmogorov-Smirnov test across heads or rows).

Files (atomic) in --out: STEM_diagnostics.json (all numbers), STEM_vanishing.png,
STEM_jacobian.png and, with --values, STEM_topn.png, where STEM is the file name of ATTN.npy
without ".npy"."""


def _int_at_least(minimum: int, kind: str):
    """An argparse type: an integer >= ``minimum``, named ``kind`` in the error message."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = minimum - 1
        if n < minimum:
            raise argparse.ArgumentTypeError(f"expected a {kind} integer, got {text!r}")
        return n

    return parse


_positive_int = _int_at_least(1, "positive")
_nonnegative_int = _int_at_least(0, "non-negative")


def register(sub) -> None:
    p = sub.add_parser(
        "diagnose",
        help="normalization diagnostics (vanishing attention, top-N distance, separability, "
        "Jacobian vs temperature) of attention weights saved as .npy",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("attn", metavar="ATTN.npy", type=Path,
                   help="attention weights (..., L): last axis = tokens of a row, second-to-last = queries, "
                   "earlier axes = heads (e.g. GPT-2: (layers, heads, L, L))")
    p.add_argument("--values", type=Path, metavar="V.npy", default=None,
                   help="token vectors x_i for the top-N diagnostics: (..., L, d) with the same leading axes as "
                   "ATTN without its query axis (one set of vectors per head, shared by its query rows), or "
                   "ATTN.shape + (d,) (one set per row); without it the top-N diagnostics are skipped")
    p.add_argument("--top-n", dest="top_n", type=_positive_int, nargs="+", metavar="N", default=None,
                   help="sizes N of the top-N selection, increasing, each < L; the critical top-N is searched on "
                   "this grid (default: 1 2 4 8 ... below L)")
    p.add_argument("--temperature", type=float, nargs="+", metavar="T", default=None,
                   help="temperatures T > 0 of the gradient sensitivity of softmax(log(alpha)/T) "
                   "(default: 0.001 0.01 0.03 0.1 0.3 1 3 10 100)")
    p.add_argument("--epsilon", type=float, nargs="+", metavar="EPS", default=list(dg.FD_EPSILONS),
                   help="perturbation sizes eps > 0 of the finite-difference sensitivity (default: 0.001 0.1 10)")
    p.add_argument("--directions", type=_positive_int, default=4, metavar="K",
                   help="random unit directions v per row for the finite differences (default: 4)")
    p.add_argument("--mask", choices=("auto", "none", "causal"), default="auto",
                   help="which tokens belong to a row: 'causal' = tokens 0..q for query q (needs a square L x L "
                   "last pair of axes), 'none' = all L tokens (zero weights count as tokens), 'auto' (default) = "
                   "causal if the last two axes are square and every weight above the diagonal is exactly 0")
    p.add_argument("--max-rows", dest="max_rows", type=_nonnegative_int, default=32, metavar="R",
                   help="analyse at most R query rows per head, evenly spaced and always including the last one "
                   "(default: 32; 0 = all rows; the run time grows linearly with it: of the order of a minute for "
                   "GPT-2's 144 heads at L = 1024 with the default on two CPU cores)")
    p.add_argument("--ks-over", dest="ks_over", choices=("auto", "heads", "rows"), default="auto",
                   help="samples of the Kolmogorov-Smirnov test: 'heads' = d averaged over each head's query rows, "
                   "'rows' = every row, 'auto' (default) = heads when ATTN has at least 2 heads, else rows")
    p.add_argument("--significance", type=float, default=0.01, metavar="ALPHA",
                   help="level of the Kolmogorov-Smirnov test, in (0, 1) (default: 0.01)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random directions (default: 0)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="output folder, created if missing (default: the folder of ATTN.npy)")
    p.set_defaults(func=run)


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def _load(name: str, path: Path) -> np.ndarray:
    if not path.is_file():
        raise FileNotFoundError(f"{name} {str(path)!r} does not exist")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as err:  # numpy raises several types for a malformed file
        raise ValueError(f"{name} {str(path)!r} is not a readable .npy array ({_one_line(err)})") from None
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} {str(path)!r} must hold a real numeric array, got dtype {getattr(arr, 'dtype', '?')}")
    return arr


def _check(name: str, arr: np.ndarray) -> np.ndarray:
    arr = np.asarray(arr, dtype=np.float64)
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains inf")
    return arr


def _stats(x: np.ndarray) -> dict:
    x = np.asarray(x, dtype=np.float64).ravel()
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"mean": None, "median": None, "min": None, "max": None}
    return {"mean": float(x.mean()), "median": float(np.median(x)), "min": float(x.min()), "max": float(x.max())}


def _fmt(x) -> str:
    return "     n/a" if x is None or not np.isfinite(x) else f"{x:8.4g}"


def run(args) -> int:
    for t in args.temperature or []:
        if not (np.isfinite(t) and t > 0):
            raise ValueError(f"--temperature values must be positive and finite, got {t}")
    for e in args.epsilon:
        if not (np.isfinite(e) and e > 0):
            raise ValueError(f"--epsilon values must be positive and finite, got {e}")
    if not 0 < args.significance < 1:
        raise ValueError(f"--significance must lie in (0, 1), got {args.significance}")
    temperatures = args.temperature or [0.001, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0]

    raw = _load("ATTN", args.attn)
    if raw.ndim < 1 or any(n == 0 for n in raw.shape):
        raise ValueError(f"ATTN must be a non-empty array of shape (..., L), got shape {raw.shape}")
    L = raw.shape[-1]
    if L < 2:
        raise ValueError(f"ATTN rows need at least 2 tokens, got L = {L}")
    has_queries = raw.ndim >= 2
    Lq = raw.shape[-2] if has_queries else 1
    heads_shape = raw.shape[:-2] if has_queries else ()
    n_heads = int(np.prod(heads_shape)) if heads_shape else 1

    # Query rows analysed (evenly spaced, including the last), read lazily from the file.
    if has_queries and args.max_rows and Lq > args.max_rows:
        rows = np.unique(np.linspace(Lq - 1, 0, args.max_rows).round().astype(int))
    else:
        rows = np.arange(Lq)
    w = _check("ATTN", raw[..., rows, :] if has_queries else raw)
    if (w < 0).any():
        raise ValueError("ATTN weights must be non-negative")

    square = has_queries and Lq == L
    if args.mask == "causal" and not square:
        raise ValueError(f"--mask causal needs square (L, L) last axes, got shape {raw.shape}")
    causal_mask = (np.arange(L)[None, :] <= rows[:, None]) if square else None
    if args.mask == "causal":
        use_causal = True
    elif args.mask == "auto":
        use_causal = bool(square and not np.any(w[..., ~causal_mask]))
    else:
        use_causal = False
    mask = np.broadcast_to(causal_mask, w.shape) if use_causal else np.ones(w.shape, dtype=bool)
    if use_causal and np.any(w[..., ~causal_mask] > 0):
        raise ValueError("--mask causal: ATTN has positive weights above the diagonal (future tokens)")
    length = mask.sum(axis=-1)
    if not (np.where(mask, w, 0.0) > 0).any(axis=-1).all():
        raise ValueError("ATTN has a row without any positive weight")
    keep = np.broadcast_to(length >= 2, w.shape[:-1])  # rows with a single token carry no information
    if not keep.any():
        raise ValueError("ATTN: no analysed row has at least 2 tokens (raise --max-rows)")

    values = None
    if args.values is not None:
        vraw = _load("--values", args.values)
        if has_queries and vraw.ndim == raw.ndim and vraw.shape[:-2] == heads_shape and vraw.shape[-2] == L:
            values = _check("--values", vraw)[..., None, :, :]  # shared by the query rows of a head
        elif vraw.ndim == raw.ndim + 1 and vraw.shape[:-1] == raw.shape:
            values = _check("--values", vraw[..., rows, :, :] if has_queries else vraw)
        else:
            per_head = ", ".join(str(n) for n in heads_shape + (L,))
            per_row = ", ".join(str(n) for n in raw.shape)
            raise ValueError(
                f"--values of shape {vraw.shape} does not match ATTN {raw.shape}: expected ({per_head}, d) "
                f"(per head) or ({per_row}, d) (per row)"
            )

    top_n = args.top_n or [n for n in 2 ** np.arange(0, 20) if n < L]
    top_n = [int(n) for n in top_n]
    for n in top_n:
        if not 1 <= n < L:
            raise ValueError(f"--top-n values must satisfy 1 <= N < L = {L}, got {n}")
    if any(b <= a for a, b in zip(top_n, top_n[1:])):
        raise ValueError(f"--top-n values must be increasing, got {top_n}")

    out = args.out if args.out is not None else args.attn.resolve().parent
    stem = args.attn.stem
    mask_name = "causal" if use_causal else "none"
    print(f"ATTN {args.attn}: shape {raw.shape}, {n_heads} head(s), {len(rows)} of {Lq} query row(s) per head, "
          f"L = {L}, mask: {mask_name}")
    result: dict = {
        "attn": str(args.attn), "shape": list(raw.shape), "heads": n_heads, "query_rows": rows.tolist(),
        "mask": mask_name, "rows_analysed": int(keep.sum()),
    }

    # (1) vanishing attention
    va = dg.vanishing_attention(w, mask=mask)
    sums = np.sum(np.where(mask, w, 0.0), axis=-1)
    van = {
        "L_times_max_weight": _stats(va.max_scaled[keep]),
        "L_times_min_weight": _stats(va.min_scaled[keep]),
        "effective_logit_bound": _stats(va.a[keep]),
        "row_sum": _stats(sums[keep]),
    }
    result["vanishing"] = van
    print(f"\nvanishing attention ({int(keep.sum())} rows with >= 2 tokens; uniform rows give L*alpha = 1)")
    print("  quantity                          median      mean       min       max")
    for label, key in (("L * max_i alpha_i", "L_times_max_weight"), ("L * min_i alpha_i", "L_times_min_weight"),
                       ("effective logit bound a", "effective_logit_bound"), ("row sum", "row_sum")):
        s = van[key]
        print(f"  {label:30s} {_fmt(s['median'])}  {_fmt(s['mean'])}  {_fmt(s['min'])}  {_fmt(s['max'])}")

    # (2) gradient sensitivity
    logits = dg.logits_from_weights(w, mask)
    lk = logits[keep]
    directions = dg.random_directions(lk.shape, args.directions, seed=args.seed, mask=np.isfinite(lk))
    jac = []
    for T in temperatures:
        spec = dg.softmax_jacobian_norm(lk, T)
        frob = dg.softmax_jacobian_norm(lk, T, norm="frobenius")
        fd = {f"{e:g}": float(dg.finite_difference_sensitivity(lk, T, e, directions=directions).mean()) for e in args.epsilon}
        jac.append({"T": T, "spectral_mean": float(spec.mean()), "spectral_median": float(np.median(spec)),
                    "frobenius_mean": float(frob.mean()), "bound": 0.5 / T, "finite_difference": fd})
    result["jacobian"] = jac
    print("\ngradient sensitivity of softmax(log(alpha)/T): exact Jacobian norms and finite differences (means over rows)")
    print("         T  |J|_2 mean  |J|_2 median  |J|_F mean    1/(2T)" + "".join(f"{'FD eps=' + format(e, 'g'):>14s}" for e in args.epsilon))
    for r in jac:
        print(f"  {r['T']:8.3g}  {_fmt(r['spectral_mean']):>10s}  {_fmt(r['spectral_median']):>12s}  {_fmt(r['frobenius_mean']):>10s}"
              f"  {_fmt(r['bound']):>8s}" + "".join(f"{_fmt(v):>14s}" for v in r["finite_difference"].values()))

    # (3) top-N diagnostics
    topn = None
    if values is None:
        print("\ntop-N diagnostics skipped (no --values)")
    else:
        ks_over = args.ks_over if args.ks_over != "auto" else ("heads" if n_heads >= 2 else "rows")
        if ks_over == "heads" and not has_queries:
            ks_over = "rows"
        rows_d, rows_sep = [], []
        for n in top_n:
            t = dg.top_n_diagnostics(w, values, n, mask=mask)
            rows_d.append(t.distance)
            rows_sep.append(t.separability)
        pool = (-1,) if ks_over == "heads" else ()
        samples = []
        for d in rows_d:
            if pool:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    d = np.nanmean(d, axis=-1)
            samples.append(np.ravel(d))
        crit = dg.ks_critical_n(top_n, np.stack(samples), significance=args.significance) if len(top_n) >= 2 else None
        topn = {"N": top_n, "ks_samples": ks_over, "significance": args.significance,
                "distance": [_stats(d) for d in rows_d], "separability": [_stats(s) for s in rows_sep],
                "ks_statistic": None if crit is None else [None if not np.isfinite(x) else float(x) for x in crit.statistic],
                "ks_pvalue": None if crit is None else [None if not np.isfinite(x) else float(x) for x in crit.pvalue],
                "critical_n": None if crit is None else crit.critical_n}
        result["top_n"] = topn
        print(f"\ntop-N diagnostics (values {args.values}, d = {values.shape[-1]}; KS samples: {ks_over}, "
              f"{samples[0][np.isfinite(samples[0])].size} of them)")
        print("      N   mean d      mean N_s/N   KS stat   p (d at next N larger)")
        for k, n in enumerate(top_n):
            ks = "" if crit is None or k >= len(top_n) - 1 else f"{_fmt(crit.statistic[k])}  {_fmt(crit.pvalue[k])}"
            print(f"  {n:5d}  {_fmt(topn['distance'][k]['mean'])}    {_fmt(topn['separability'][k]['mean'])}    {ks}")
        if crit is None:
            print("critical top-N: needs at least two --top-n values")
        elif crit.critical_n is None:
            print(f"critical top-N: none on the grid (d keeps growing significantly up to N = {top_n[-1]})")
        else:
            print(f"critical top-N: {crit.critical_n} ({crit.critical_n / L:.3g} L): d at the next N is not "
                  f"significantly larger (level {args.significance:g})")

    files = [save_json(out / f"{stem}_diagnostics.json", result)]
    files += _figures(out, stem, va, keep, length, jac, args.epsilon, topn, L)
    print("\nwrote " + ", ".join(str(f) for f in files))
    return 0


def _figures(out: Path, stem: str, va, keep, length, jac, epsilons, topn, L) -> list[Path]:
    from matplotlib.figure import Figure

    paths = []
    fig = Figure(figsize=(11, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    mx, mn = va.max_scaled[keep], va.min_scaled[keep]
    lo = max(min(mn[mn > 0].min() if (mn > 0).any() else 1e-3, 1.0) / 2, 1e-12)
    hi = max(mx.max(), 1.0) * 2
    bins = np.logspace(np.log10(lo), np.log10(hi), 50)
    ax1.hist(np.clip(mx, lo, hi), bins=bins, alpha=0.6, label="L * max alpha")
    ax1.hist(np.clip(mn, lo, hi), bins=bins, alpha=0.6, label="L * min alpha (zeros at the left edge)")
    ax1.axvline(1.0, color="k", lw=0.8, ls="--", label="uniform row")
    ax1.set(xscale="log", xlabel="L * weight", ylabel="rows", title="vanishing attention: weights in units of 1/L")
    ax1.legend(fontsize=8)
    lens = np.broadcast_to(length, keep.shape)[keep]
    wmax = va.max_weight[keep]
    ax2.loglog(lens, wmax, ".", ms=2, alpha=0.3, color="C0", label="rows")
    ul = np.unique(lens)
    ax2.loglog(ul, [np.median(wmax[lens == u]) for u in ul], "o-", ms=3, color="C3", label="median per length")
    ax2.loglog(ul, 1.0 / ul, color="k", lw=0.8, ls="--", label="1/L")
    ax2.set(xlabel="tokens in the row", ylabel="max_i alpha_i", title="largest weight against the row length")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    paths.append(save_figure(out / f"{stem}_vanishing.png", fig))

    fig = Figure(figsize=(6.5, 4.6))
    ax = fig.subplots()
    T = np.array([r["T"] for r in jac])
    ax.loglog(T, 0.5 / T, color="gray", lw=1, ls="-.", label="1/(2T): worst case")
    ax.loglog(T, [r["spectral_mean"] for r in jac], "k-", lw=2, label="exact |J|_2, mean")
    ax.loglog(T, [max(r["spectral_median"], 1e-300) for r in jac], "k--", lw=1.2, label="exact |J|_2, median")
    for i, e in enumerate(epsilons):
        ax.loglog(T, [r["finite_difference"][f"{e:g}"] for r in jac], "o-", ms=3, lw=1, color=f"C{i}",
                  label=f"finite difference, eps = {e:g}")
    top = max(max(r["bound"] for r in jac), 1e-3)
    ax.set_ylim(max(min(min(r["spectral_mean"] for r in jac), 1e-8) / 10, 1e-12), top * 3)
    ax.set(xlabel="temperature T", ylabel="sensitivity of softmax(log(alpha)/T)", title="gradient sensitivity")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(save_figure(out / f"{stem}_jacobian.png", fig))

    if topn is not None:
        fig = Figure(figsize=(11, 4.2))
        ax1, ax2 = fig.subplots(1, 2)
        N = np.array(topn["N"])
        d = [s["mean"] if s["mean"] is not None else np.nan for s in topn["distance"]]
        sep = [s["mean"] if s["mean"] is not None else np.nan for s in topn["separability"]]
        ax1.plot(N, d, "o-", color="C0")
        ax2.plot(N, sep, "o-", color="C1")
        for ax in (ax1, ax2):
            ax.set_xscale("log")
            if topn["critical_n"] is not None:
                ax.axvline(topn["critical_n"], color="C3", lw=0.8, ls="--", label=f"critical top-N = {topn['critical_n']}")
                ax.legend(fontsize=8)
        ax1.set(xlabel="N (top-N)", ylabel="mean representation distance d", title=f"distance (L = {L})")
        ax2.set(xlabel="N (top-N)", ylabel="mean N_s / N", ylim=(-0.02, 1.02), title="geometric separability")
        fig.tight_layout()
        paths.append(save_figure(out / f"{stem}_topn.png", fig))
    return paths

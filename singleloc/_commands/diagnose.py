"""``singleloc diagnose ATTN.npy``: normalization diagnostics of dumped attention (docs/model.md section 8)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..ground._atomic_files import OUTPUT_KEY, check_output_folder, png_has_text, written_together
from ..ground._choices import KS_SAMPLES, MASKS
from ._common import add_force_argument, add_out_argument, check_cost, int_at_least

DESCRIPTION = """\
Normalization diagnostics (docs/model.md section 8) of attention weights dumped from any model.

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
without ".npy". In Python: singleloc.diagnose_attention and singleloc.plots."""


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
    p.add_argument("--top-n", dest="top_n", type=int_at_least(1), nargs="+", metavar="N", default=None,
                   help="sizes N of the top-N selection, increasing, each < L; the critical top-N is searched on "
                   "this grid (default: 1 2 4 8 ... below L)")
    p.add_argument("--temperature", type=float, nargs="+", metavar="T", default=None,
                   help="temperatures T > 0 of the gradient sensitivity of softmax(log(alpha)/T) "
                   "(default: 0.001 0.01 0.03 0.1 0.3 1 3 10 100)")
    p.add_argument("--epsilon", type=float, nargs="+", metavar="EPS", default=None,
                   help="perturbation sizes eps > 0 of the finite-difference sensitivity (default: 0.001 0.1 10)")
    p.add_argument("--directions", type=int_at_least(1), default=4, metavar="K",
                   help="random unit directions v per row for the finite differences (default: 4)")
    p.add_argument("--mask", choices=MASKS, default="auto",
                   help="which tokens belong to a row: 'causal' = tokens 0..q for query q (needs a square L x L "
                   "last pair of axes), 'none' = all L tokens (zero weights count as tokens), 'auto' (default) = "
                   "causal if the last two axes are square and every weight above the diagonal is exactly 0")
    p.add_argument("--max-rows", dest="max_rows", type=int_at_least(0), default=32, metavar="R",
                   help="analyse at most R query rows per head, evenly spaced and always including the last one "
                   "(default: 32; 0 = all rows; the run time grows linearly with it: of the order of a minute for "
                   "GPT-2's 144 heads at L = 1024 with the default on two CPU cores)")
    p.add_argument("--ks-over", dest="ks_over", choices=KS_SAMPLES, default="auto",
                   help="samples of the Kolmogorov-Smirnov test: 'heads' = d averaged over each head's query rows, "
                   "'rows' = every row, 'auto' (default) = heads when ATTN has at least 2 heads, else rows")
    p.add_argument("--significance", type=float, default=0.01, metavar="ALPHA",
                   help="level of the Kolmogorov-Smirnov test, in (0, 1) (default: 0.01)")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="seed of the random directions (default: 0)")
    add_force_argument(p)
    add_out_argument(p, default="the folder of ATTN.npy")
    p.set_defaults(func=run)


#: Seconds per analysed row and temperature of diagnose's finite differences and Jacobians, ``DIAGNOSE_UNIT (L / 256)
#: (1 + E K) / 13`` (``E`` perturbation sizes, ``K`` directions) on a 2-core CPU, scaled by 2 / the CPUs here (within a
#: factor of about 2: it tells a run of minutes from one of days).
DIAGNOSE_UNIT = 0.33e-3


def diagnose_cost(shape: tuple, max_rows: int, temperatures: int, epsilons: int, directions: int):
    """The cost of diagnosing weights of ``shape`` (:data:`DIAGNOSE_UNIT`; a shape that
    :func:`~singleloc.diagnose_attention` refuses costs nothing, and is refused there)."""
    import math

    from ..preflight._resources import Cost, cpu_speed

    L = shape[-1] if shape else 0
    queries = shape[-2] if len(shape) >= 2 else 1
    rows = (int(math.prod(shape[:-2])) if len(shape) >= 2 else 1) * (min(max_rows, queries) if max_rows else queries)
    seconds = rows * temperatures * DIAGNOSE_UNIT * (L / 256) * (1 + epsilons * directions) / 13 * cpu_speed()
    work = (f"{rows} rows of L = {L} tokens x {temperatures} temperatures x {epsilons} perturbation sizes x {directions} "
            "directions")
    return Cost(work, seconds, 8.0 * rows * L * (4 + temperatures), "--temperature, --epsilon, --directions or --max-rows")


def run(args) -> int:
    import numpy as np

    from ..attention._attention_diagnosis import FIGURES, TEMPERATURES, diagnose_attention
    from ..attention._sensitivity import FD_EPSILONS
    from ..io._run_folders import load_npy, save_figure, save_json
    from ..plots import plot_sensitivity, plot_top_n, plot_vanishing
    from ..runtime._progress import Phase

    weights = load_npy(args.attn, "ATTN")
    values = None if args.values is None else load_npy(args.values, "--values")
    out = args.out if args.out is not None else args.attn.resolve().parent
    check_output_folder(out)  # before the work (--out itself was checked by the parser)
    temperatures, epsilons = args.temperature or TEMPERATURES, args.epsilon or FD_EPSILONS
    cost = diagnose_cost(weights.shape, args.max_rows, len(temperatures), len(epsilons), args.directions)
    check_cost("diagnose", cost, args.force)
    heads = int(np.prod(weights.shape[:-2])) if weights.ndim > 2 else 1
    tokens = weights.shape[-1] if weights.ndim else 0  # a 0-d array is refused inside, in one line
    with Phase((f"diagnosing {heads} head(s) of {tokens} tokens (vanishing attention, sensitivity at "
                f"{len(temperatures)} temperatures{', top-N' if values is not None else ''})", "diagnosed"), [cost.seconds]):
        diagnosis = diagnose_attention(
            weights, values, top_n=args.top_n, temperatures=temperatures, epsilons=epsilons,
            directions=args.directions, mask=args.mask, max_rows=args.max_rows, ks_samples=args.ks_over,
            significance=args.significance, seed=args.seed)
    print(f"ATTN {args.attn}: {diagnosis.table()}")

    stem = args.attn.stem
    mark = {OUTPUT_KEY: f"diagnose {stem}"}  # how a later diagnose of ATTN recognises its figures
    figures = {"vanishing": plot_vanishing, "jacobian": plot_sensitivity, "topn": plot_top_n}
    if diagnosis.top_n is None:
        del figures["topn"]

    def own_figures(written):  # an earlier diagnose's figures that this one does not make (STEM_topn.png)
        return [p for p in (out / f"{stem}_{name}.png" for name in FIGURES) if p not in written
                and png_has_text(p, OUTPUT_KEY, mark[OUTPUT_KEY])]

    with Phase((f"drawing {len(figures)} figures", "drew the figures"), quiet=True), \
            written_together(out, stale=own_figures) as files:  # all of them, or none on a full disk
        save_json(out / f"{stem}_diagnostics.json", {"attn": str(args.attn), **diagnosis.to_dict()})
        for name, plot in figures.items():
            save_figure(out / f"{stem}_{name}.png", plot(diagnosis), mark)
    print("\nwrote " + ", ".join(str(f) for f in files))
    return 0

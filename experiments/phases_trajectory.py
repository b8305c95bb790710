"""One trajectory through its phases, drawn with ``singleloc.plots.plot_phases``.

bsoftmax with trained biases, L=4, H=2 heads, F=2 spikes of strength 3, lr=1; the ODE from
the simulator's initial overlaps at D=1000 (seed 0). Panels: the risk with its plateaus and
the escape from the unspecialized plateau; the alignments M_hf / sqrt(Q_hh) with the
specialization times; the numbers of specialized heads and covered directions; the head
pairs with redundant keys or a shared spike profile. Writes figures/phases_trajectory.png
(about 40 s; ``--quick``: 256 quadrature points instead of 1024; ``--cache DIR`` keeps the
trajectory).
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

from _common import cache_dir, figures_dir, parser, stage  # noqa: E402

import singleloc as sl  # noqa: E402
from singleloc.plots import plot_phases  # noqa: E402


def main() -> None:
    args = parser(__doc__).parse_args()
    points = 256 if args.quick else 1024
    cfg = sl.load_config("bsoftmax", ["problem.strength=3.0", "sgd.lr=1.0", f"theory.points={points}", "sgd.tau_max=60",
                                      "sgd.n_save=241"])
    cache = cache_dir(args, "phases_trajectory")
    r = stage(cache, "theory", lambda: vars(sl.integrate(cfg, sl.initial_conditions(cfg, 1), progress=False)))
    a = sl.analyze(r["tau"], r["M"], r["Q"], r["risk"], mean=cfg.problem.build_prior().mean())
    s = a.summary()
    print(f"plateaus {[(round(p.tau, 2), round(p.risk, 4)) for p in a.plateaus[0]]}, escape {a.escape_time[0]:.2f}, "
          f"specialization times {a.specialization_times[0]}, final risk {s['final_risk']:.4f}")
    fig = plot_phases(a, r["risk"], 0, title="bsoftmax, H=2, F=2 spikes of strength 3, lr=1: the ODE from a D=1000 start")
    path = sl.save_figure(figures_dir(args) / "phases_trajectory.png", fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

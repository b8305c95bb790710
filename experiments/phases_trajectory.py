"""One trajectory through its phases, drawn with ``singleloc.plots.plot_phases``.

bsoftmax with trained biases, L=4, H=2 heads, F=2 spikes of strength 3, lr=1; the ODE from
the simulator's initial overlaps at D=1000 (seed 0). Panels: the risk with its plateaus and
the escape from the unspecialized plateau; the alignments M_hf / sqrt(Q_hh) with the
specialization times; the numbers of specialized heads and covered directions; the head
pairs with redundant keys or a shared spike profile. Writes figures/phases_trajectory.png
(about 40 s).
"""

from __future__ import annotations

from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

from singleloc import initial_conditions, integrate, load_config  # noqa: E402
from singleloc import _phase_analysis as ph  # noqa: E402
from singleloc._io import save_figure  # noqa: E402
from singleloc.plots import plot_phases  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    cfg = load_config("bsoftmax", ["problem.strength=3.0", "sgd.lr=1.0", "theory.points=1024", "sgd.tau_max=60", "sgd.n_save=241"])
    r = integrate(cfg, initial_conditions(cfg, 1), progress=False)
    a = ph.analyze(r.tau, r.M, r.Q, r.risk, mean=cfg.problem.build_prior().mean())
    s = a.summary()
    print(f"plateaus {[(round(p.tau, 2), round(p.risk, 4)) for p in a.plateaus[0]]}, escape {a.escape_time[0]:.2f}, "
          f"specialization times {a.specialization_times[0]}, final risk {s['final_risk']:.4f}")
    fig = plot_phases(a, r.risk, 0, title="bsoftmax, H=2, F=2 spikes of strength 3, lr=1: the ODE from a D=1000 start")
    save_figure(ROOT / "figures" / "phases_trajectory.png", fig)


if __name__ == "__main__":
    main()

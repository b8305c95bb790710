"""``singleloc.plots``: figures through the Figure API, without global matplotlib state."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import numpy as np
from matplotlib.figure import Figure

import singleloc
from singleloc import plots


def test_the_package_leaves_plotting_alone(tmp_path):
    """In one fresh interpreter: ``import singleloc`` (and a computing entry point) imports neither
    ``singleloc.plots`` nor matplotlib; then a notebook user's backend survives ``singleloc.plots``
    and a figure written with it, and no pyplot figure registry is created."""
    code = (
        "import sys\n"
        "import singleloc\n"
        "singleloc.simulate\n"
        "print('singleloc.plots' in sys.modules, 'matplotlib' in sys.modules)\n"
        "import matplotlib, numpy as np\n"
        "import singleloc.plots as plots\n"
        "from singleloc import PruningResult\n"
        "fig = plots.plot_pruning({'x': PruningResult('greedy', np.array([[1]]), np.array([[0.2, 0.3]]))})\n"
        f"plots.save_figure({str(tmp_path / 'p.png')!r}, fig)\n"
        "print(matplotlib.get_backend(), 'matplotlib.pyplot' in sys.modules)\n"
    )
    env = {"MPLBACKEND": "svg", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           **{k: os.environ[k] for k in ("PYTHONPATH", "SINGLELOC_CACHE_DIR") if k in os.environ}}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, check=True).stdout
    imported, backend = out.strip().splitlines()[-2:]
    assert imported.split() == ["False", "False"]  # the package imports no plotting
    assert backend.split() == ["svg", "False"]  # the user's backend, no pyplot
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_every_figure_is_a_figure_with_its_panels(tmp_path):
    rng = np.random.default_rng(0)
    S, T, H, F = 2, 11, 2, 2
    tau = np.linspace(0, 5, T)
    M = np.cumsum(rng.standard_normal((S, T, H, F)) * 0.2, axis=1)
    Q = M @ np.swapaxes(M, -1, -2) + np.eye(H)
    risk = 0.5 * np.exp(-tau)[None] + np.zeros((S, 1))
    run = types.SimpleNamespace(tau=tau, M=M, risk=risk)
    analysis = singleloc.analyze(tau, M, Q, risk, mean=np.zeros(F))
    rows = [{"heads": h, "F": f, "final_risk": 0.1 * h, "n_aligned": 1, "n_leaning": 1, "n_combination": 0,
             "first_learned": 1.0, "escaped": 1.0, "predicted_escape": 2.0, "lambda": 0.1, "horizon": 5.0}
            for h in (1, 2) for f in (1, 2)]
    pruning = {"greedy": singleloc.PruningResult("greedy", np.array([[1]]), np.array([[0.2, 0.3]]))}
    w = rng.dirichlet(np.ones(6), size=(2, 6))
    diagnosis = singleloc.diagnose_attention(w, rng.standard_normal((2, 6, 3)), temperatures=[1.0])
    figures = {
        "compare": (plots.plot_compare(run, run, title="t"), 1 + F),
        "phases": (plots.plot_phases(analysis, risk), 4),
        "diagram": (plots.plot_phase_diagram(rows), 4 + 4),  # four heat maps with their colour bars
        "pruning": (plots.plot_pruning(pruning, F=1), 1),
        "vanishing": (plots.plot_vanishing(diagnosis), 2),
        "sensitivity": (plots.plot_sensitivity(diagnosis), 1),
        "top_n": (plots.plot_top_n(diagnosis), 2),
    }
    for name, (fig, panels) in figures.items():
        assert isinstance(fig, Figure) and len(fig.axes) == panels, name
        assert plots.save_figure(tmp_path / f"{name}.png", fig).stat().st_size > 0

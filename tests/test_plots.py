"""``singleloc.plots``: figures through the Figure API, without global matplotlib state."""

from __future__ import annotations

import dataclasses
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


def _phases_example():
    """A trajectory whose head 1 aligns with spike 1 from tau = 3 while head 2 stays on the mean of
    the spikes, its risk falling from one plateau to another at tau = 3."""
    tau = np.linspace(0.0, 10.0, 41)
    grow = np.clip(tau - 3.0, 0.0, 1.0)[:, None]
    M = np.zeros((41, 2, 2))
    M[:, 0] = 0.5 * (1 - grow) * np.array([1.0, 1.0]) + 2.0 * grow * np.array([1.0, 0.0])
    M[:, 1] = [0.5, 0.5]
    Q = M @ np.swapaxes(M, -1, -2) + 0.1 * np.eye(2)
    risk = 0.3 - 0.1 * grow[:, 0]
    return tau, M, Q, risk


def test_phases_tells_the_predicted_escape_from_the_measured_one_and_draws_what_it_names():
    tau, M, Q, risk = _phases_example()
    analysis = singleloc.analyze(tau, M, Q, risk, mean=np.array([1.0, 1.0]))
    analysis = dataclasses.replace(analysis, escape_time=np.array([3.2]))  # a measured escape, whatever the plateau rule
    fig = plots.plot_phases(analysis, risk, predicted_escape=2.5)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "predicted escape: 2.5 (linearisation)" in legend and "measured escape: 3.2" in legend
    names = analysis.classes.names()[0, -1]
    key = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert key[:2] == [f"head 1 ({names[0]} at the end)", f"head 2 ({names[1]} at the end)"]
    triangles = [line for line in fig.axes[1].lines if line.get_marker() == "v"]
    assert len(triangles) == np.isfinite(analysis.specialization_times[0]).sum() == 1
    assert "specializes (stays aligned from here)" in key
    none = singleloc.analyze(tau, np.tile(M[:1], (41, 1, 1)), np.tile(Q[:1], (41, 1, 1)), risk, mean=np.array([1.0, 1.0]))
    fig = plots.plot_phases(none, risk)  # no head specializes: no triangle, and none named
    assert not any(line.get_marker() == "v" for line in fig.axes[1].lines)
    assert all("triangle" not in ax.get_title() for ax in fig.axes)
    assert "specializes (stays aligned from here)" not in [t.get_text() for t in fig.axes[1].get_legend().get_texts()]


def test_the_compare_legend_names_the_heads_by_their_class():
    """The label of a head in theory.png is its class in phases.png (issue 61 item 5: "head learning
    spike k" for heads the analysis called combinations)."""
    tau, M, Q, risk = _phases_example()
    M[:, 1] = np.linspace(0, 1, 41)[:, None] * np.array([1.0, -1.0])  # head 2: e_1 - e_2, a combination
    Q = M @ np.swapaxes(M, -1, -2) + 0.1 * np.eye(2)
    run = types.SimpleNamespace(tau=tau, M=M[None], Q=Q[None], risk=risk[None])
    mean = np.array([1.0, 1.0])
    classes = singleloc.analyze(tau, M, Q, risk, mean=mean).classes.names()[0, -1]
    assert sorted(classes) == ["aligned", "combination"]
    fig = plots.plot_compare(run, mean=mean)
    labels = {t.get_text() for t in fig.axes[1].get_legend().get_texts()}
    assert labels == {"head 1: aligned to spike 1", "head 2: combination"}


def _overlapping_tick_labels(fig) -> list:
    fig.canvas.draw()  # Figure API: the Agg canvas attached by savefig's machinery
    renderer = fig.canvas.get_renderer()
    found = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            boxes = [t.get_window_extent(renderer) for t in axis.get_ticklabels(which="both") if t.get_visible() and t.get_text()]
            found += [(ax.get_title(), a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
    return found


def test_the_attention_figures_tick_labels_do_not_overlap():
    rng = np.random.default_rng(1)
    L = 64
    w = np.tril(np.exp(2 * rng.standard_normal((3, L, L))))
    w /= w.sum(-1, keepdims=True)
    diagnosis = singleloc.diagnose_attention(w, rng.standard_normal((3, L, 4)), top_n=[2, 3, 4, 5, 6], temperatures=[1.0])
    for plot in (plots.plot_vanishing, plots.plot_top_n, plots.plot_sensitivity):
        fig = plot(diagnosis)
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
        assert not _overlapping_tick_labels(fig), plot.__name__


def test_legends_go_where_they_cover_the_least_data():
    tau, M, Q, risk = _phases_example()
    run = types.SimpleNamespace(tau=tau, M=M[None], Q=Q[None], risk=risk[None])
    figures = [plots.plot_compare(run, run), plots.plot_phases(singleloc.analyze(tau, M, Q, risk), risk)]
    legends = [ax.get_legend() for fig in figures for ax in fig.axes if ax.get_legend() is not None]
    assert len(legends) >= 5 and all(legend._loc == 0 for legend in legends)  # 0: "best"

"""The one helper shared by the experiment scripts.

* :func:`parser`: an ``argparse`` parser with the options every experiment understands,
  ``--cache DIR`` (keep each stage's arrays in DIR and reuse them, so a figure can be redrawn
  without recomputing) and ``--quick`` (a smaller version, for checking that a script runs);
* :func:`stage`: run one stage of a computation, or load it from the cache;
* :func:`figure`: a matplotlib ``Figure`` (no pyplot, no global backend switch);
* :func:`fit`: least squares with standard errors (the escape-time laws);
* :func:`fixed_point`: the unspecialized fixed point of a config's ODE, as the arrays of a stage;
* ``FIGURES``: the repository's ``figures/`` folder, wherever the script is run from, or the
  folder named by the environment variable ``SINGLELOC_FIGURES`` (to run a script without
  overwriting the committed figures); :func:`figures_dir`: ``FIGURES``, or a temporary folder
  with ``--quick``.

Figures and JSON files are written atomically with ``singleloc.save_figure`` /
``singleloc.save_json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

import singleloc as sl
from singleloc import load_npz, save_figure, save_json, save_npz

__all__ = ["FIGURES", "cache_dir", "figure", "figures_dir", "fit", "fixed_point", "parser", "save_figure", "save_json", "stage"]

FIGURES = Path(os.environ.get("SINGLELOC_FIGURES") or Path(__file__).resolve().parents[1] / "figures").resolve()


def parser(doc: str | None, *, cache: bool = True) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of ``doc``, with ``--quick`` and, unless
    ``cache=False`` (a script without stages worth keeping), ``--cache``."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if cache:
        p.add_argument("--cache", metavar="DIR", type=Path, help="keep the stages' arrays in DIR and reuse them")
    p.add_argument("--quick", action="store_true", help="a smaller run, to check that the script works")
    return p


def cache_dir(args: argparse.Namespace, script: str, subfolder: str = "") -> Path | None:
    """``args.cache / script / subfolder`` (``/ "quick"`` with ``--quick``, so that a full run never
    reuses a quick run's stages), or None without ``--cache``. ``script`` (the experiment's name) keeps
    the stages of different scripts apart when they share one ``--cache`` folder: their stage names
    (``fixed``, ``theory``, ...) repeat."""
    if getattr(args, "cache", None) is None:
        return None
    return Path(args.cache) / script / subfolder / ("quick" if getattr(args, "quick", False) else "")


def figures_dir(args: argparse.Namespace) -> Path:
    """Where a script writes its figures and JSON files: ``FIGURES``, or with ``--quick`` the
    folder ``singleloc-quick`` in the system's temporary directory, so that a check never
    overwrites the committed figures."""
    return Path(tempfile.gettempdir()) / "singleloc-quick" if getattr(args, "quick", False) else FIGURES


def stage(cache: Path | None, name: str, fn: Callable[[], Mapping]) -> dict[str, np.ndarray]:
    """Run ``fn() -> mapping of arrays``, or load it from ``cache/name.npz`` when present."""
    path = cache / f"{name}.npz" if cache else None
    if path is not None and path.is_file():
        return load_npz(path)
    data = {k: np.asarray(v) for k, v in fn().items()}
    if path is not None:
        save_npz(path, data)
    return data


def fixed_point(config, ode, **kwargs) -> dict[str, np.ndarray]:
    """``singleloc.unspecialized_point`` of ``config``'s ODE ``ode``, from the ``D -> infinity`` limit
    of the config's random start (its ``model.heads``, ``problem.F``, ``sgd.init_scale`` and
    ``model.bias_init``; ``kwargs`` as there): every field of the ``FixedPoint`` as an array."""
    fp = sl.unspecialized_point(ode, config.model.heads, config.problem.F, init_scale=config.sgd.init_scale,
                                bias_init=config.model.bias_init, **kwargs)
    return {f.name: np.asarray(getattr(fp, f.name)) for f in dataclasses.fields(fp)}


def figure(**kwargs) -> Figure:
    """A new matplotlib ``Figure`` (``kwargs`` as for ``Figure``)."""
    return Figure(**kwargs)


def fit(y, *xs) -> tuple[np.ndarray, np.ndarray, float]:
    """Least squares ``y = c_0 + sum_i c_i x_i`` over the finite ``y``.

    Returns the coefficients ``c``, their standard errors (from the residuals, with
    ``len(y) - len(c)`` degrees of freedom, at least one) and the residual standard deviation.
    """
    X = np.column_stack([np.ones(len(y))] + [np.asarray(x, float) for x in xs])
    y = np.asarray(y, float)
    ok = np.isfinite(y)
    X, y = X[ok], y[ok]
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    res = y - X @ coef
    dof = max(len(y) - X.shape[1], 1)
    cov = np.linalg.inv(X.T @ X) * (res @ res) / dof
    return coef, np.sqrt(np.diag(cov)), float(np.sqrt(res @ res / dof))

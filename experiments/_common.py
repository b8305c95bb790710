"""The one helper shared by the experiment scripts.

* :func:`parser`: an ``argparse`` parser with the options every experiment understands,
  ``--cache DIR`` (keep each stage's arrays in DIR and reuse them, so a figure can be redrawn
  without recomputing) and ``--quick`` (a smaller version, for checking that a script runs);
* :func:`stage`: run one stage of a computation, or load it from the cache;
* :func:`figure`: a matplotlib ``Figure`` (no pyplot, no global backend switch);
* ``FIGURES``: the repository's ``figures/`` folder, wherever the script is run from.

Figures and JSON files are written atomically with ``singleloc.save_figure`` /
``singleloc.save_json``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from singleloc import load_npz, save_figure, save_json, save_npz

__all__ = ["FIGURES", "cache_dir", "figure", "parser", "save_figure", "save_json", "stage"]

FIGURES = Path(__file__).resolve().parents[1] / "figures"


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of ``doc``, with ``--cache`` and ``--quick``."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", metavar="DIR", type=Path, help="keep the stages' arrays in DIR and reuse them")
    p.add_argument("--quick", action="store_true", help="a smaller run, to check that the script works")
    return p


def cache_dir(args: argparse.Namespace, subfolder: str = "") -> Path | None:
    """``args.cache / subfolder``, or None without ``--cache``."""
    return None if args.cache is None else Path(args.cache) / subfolder


def stage(cache: Path | None, name: str, fn: Callable[[], Mapping]) -> dict[str, np.ndarray]:
    """Run ``fn() -> mapping of arrays``, or load it from ``cache/name.npz`` when present."""
    path = cache / f"{name}.npz" if cache else None
    if path is not None and path.is_file():
        return load_npz(path)
    data = {k: np.asarray(v) for k, v in fn().items()}
    if path is not None:
        save_npz(path, data)
    return data


def figure(**kwargs) -> Figure:
    """A new matplotlib ``Figure`` (``kwargs`` as for ``Figure``)."""
    return Figure(**kwargs)

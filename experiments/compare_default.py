"""The default comparison: ``singleloc compare default``, copied to figures/compare_default.png.

Run: ``python experiments/compare_default.py`` (about a minute on a laptop CPU). ``--cache DIR``:
the command's output folder (its arrays are kept there; a folder that already holds
``compare.png`` is redrawn from its arrays by ``singleloc plot``); ``--quick``: the same to tau = 2.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from _common import cache_dir, figures_dir, parser

from singleloc.cli import main as singleloc_command


def compare_figure(doc: str, preset: str, name: str) -> None:
    """Run ``singleloc compare PRESET`` (or redraw a cached run with ``singleloc plot``) and copy its
    ``compare.png`` to ``figures/NAME``; prints the command's lines and its wall time."""
    args = parser(doc).parse_args()
    quick = ["--set", "sgd.tau_max=2"] if args.quick else []
    with tempfile.TemporaryDirectory() as tmp:
        out = cache_dir(args, Path(name).stem) or Path(tmp) / "run"
        start = time.perf_counter()
        if (out / "compare.png").is_file():
            done = singleloc_command(["plot", str(out)])
        else:
            done = singleloc_command(["compare", preset, "--out", str(out), "--no-progress", *quick])
        if done != 0:
            raise SystemExit(f"singleloc compare {preset} failed")
        print(f"singleloc took {time.perf_counter() - start:.0f} s")
        figures = figures_dir(args)
        figures.mkdir(parents=True, exist_ok=True)
        path = Path(shutil.copyfile(out / "compare.png", figures / name))
    print(f"wrote {path}")


if __name__ == "__main__":
    compare_figure(__doc__, "default", "compare_default.png")

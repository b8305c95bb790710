"""The README's main figure: ``singleloc compare default``, copied to figures/compare_default.png.

Run: ``python experiments/compare_default.py`` (about a minute on a laptop CPU).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from singleloc.cli import main

FIGURES = Path(__file__).resolve().parents[1] / "figures"

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        assert main(["compare", "default", "--out", tmp, "--no-progress"]) == 0
        FIGURES.mkdir(exist_ok=True)
        shutil.copyfile(Path(tmp) / "compare.png", FIGURES / "compare_default.png")

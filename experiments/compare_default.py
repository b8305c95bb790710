"""The README's main figure: ``singleloc compare default``, copied to figures/compare_default.png.

Run: ``python experiments/compare_default.py`` (about a minute on a laptop CPU). ``--cache DIR``:
the command's output folder (its arrays are kept there; a folder that already holds
``compare.png`` is reused); ``--quick``: the same to tau = 2.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from _common import cache_dir, figures_dir, parser

from singleloc.cli import main as singleloc_command


def main() -> None:
    args = parser(__doc__).parse_args()
    quick = ["--set", "sgd.tau_max=2"] if args.quick else []
    with tempfile.TemporaryDirectory() as tmp:
        out = cache_dir(args, "compare_default") or Path(tmp)
        if not (out / "compare.png").is_file():
            if singleloc_command(["compare", "default", "--out", str(out), "--no-progress", *quick]) != 0:
                raise SystemExit("singleloc compare default failed")
        figures = figures_dir(args)
        figures.mkdir(parents=True, exist_ok=True)
        path = Path(shutil.copyfile(out / "compare.png", figures / "compare_default.png"))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

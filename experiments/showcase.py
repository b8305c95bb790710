"""The README's first figure: ``singleloc compare showcase``, copied to figures/showcase.png.

bsoftmax with four heads and trained biases on the zero-mean prior theta in {+-3.5 e_1, +-2.5 e_2}:
the risk sits on a plateau while the heads learn nothing, then they leave it for e_1 first and e_2 later, not
alike in every start (the heads of each start and seed at tau = 40: experiments/readme_numbers.py); theory (the
Sobol rule) against D = 1000 simulations, 4 seeds, tau up to 40.
Run: ``python experiments/showcase.py`` (151 s the first time, compiling, 79 s once
compiled, on a 2-core CPU at a load average of 13; 49 s and 34 s of CPU).
``--cache DIR``: keep the command's output folder (a folder that already holds the run is redrawn);
``--quick``: the same to tau = 2.
"""

from __future__ import annotations

from compare_default import compare_figure

if __name__ == "__main__":
    compare_figure(__doc__, "showcase", "showcase.png")

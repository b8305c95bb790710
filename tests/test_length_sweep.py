"""One compiled solve for a sweep over ``L`` (issue 49 item 1): on the exact route ``L`` is a value of
the rule (the noise tokens enter only through powers), the exact two-head Gram term has no table that
depends on ``L``, and the route carries no array of the fields' shape (the SDE's Sobol rule is its
own), so integrating at L = 64, 1024 and 4096 after L = 4 compiles nothing: counted with JAX's
backend-compile events (conftest's ``programs``). Slow: the first solve compiles the exact two-head Gram term (a minute or two
on a 2-core CPU)."""

from __future__ import annotations

import numpy as np
import pytest

import singleloc as sl


@pytest.mark.slow
def test_a_sweep_over_L_compiles_one_solve(programs):
    risks = {}
    for L in (4, 64, 1024, 4096):
        before = len(programs)
        cfg = sl.load_config("default", [f"problem.L={L}", "theory.route=exact", "theory.gram=exact",
                                         "sgd.tau_max=5", "sgd.n_save=3"])
        risks[L] = sl.integrate(cfg).risk[0]
        if L > 4:
            assert programs[before:] == [], f"L = {L} made {programs[before:]}"
    # the solve was made once (so the count can fail): traced as itself, exported (a lambda) or served by the stored program
    assert {"jit(_trajectories)", "jit(<lambda>)", "jit(call)"} & {name for name, _ in programs}
    # the risk at the start: the initial keys are nearly orthogonal to the spikes and to each other, so
    # attention is nearly uniform and R = 1 - 1/L to leading order; it grows with L towards 1
    starts = np.array([risks[L][0] for L in (4, 64, 1024, 4096)])
    assert np.all(np.diff(starts) > 0) and abs(starts[-1] - (1 - 1 / 4096)) < 0.01

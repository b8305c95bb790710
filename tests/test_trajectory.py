"""The one trajectory record (singleloc.Trajectory) that the ODE, the simulation and the SDE return."""

import dataclasses

import numpy as np

import singleloc as sl


def test_every_solver_returns_a_trajectory_with_its_fields_first():
    names = ["tau", "M", "Q", "b", "risk"]
    for kind in (sl.TheoryResult, sl.SimulationResult, sl.SDEResult):
        assert issubclass(kind, sl.Trajectory)
        assert [f.name for f in dataclasses.fields(kind)][:5] == names  # positional construction unchanged


def test_r_orth_is_the_keys_gram_matrix_off_the_spikes(rng):
    """``Q - M M^T`` from the overlaps against the keys projected off the spikes directly:
    orthonormal spikes of norm sqrt(D), ``M = K k*^T / D``, ``Q = K K^T / D``."""
    S, T, H, F, D = 2, 3, 3, 2, 50
    basis, _ = np.linalg.qr(rng.standard_normal((D, F)))
    kstar = np.sqrt(D) * basis.T  # (F, D)
    K = rng.standard_normal((S, T, H, D))
    M = K @ kstar.T / D
    Q = K @ np.swapaxes(K, -1, -2) / D
    off = K - (K @ basis) @ basis.T  # the keys' components orthogonal to the spikes
    record = sl.SimulationResult(np.arange(T, dtype=float), M, Q, np.zeros((S, T, H)), np.ones((S, T)), np.ones((S, T)),
                                 None, None)
    np.testing.assert_allclose(record.r_orth(), off @ np.swapaxes(off, -1, -2) / D, rtol=1e-12, atol=1e-12)
    assert record.starts == S
    Ms, Qs, bs = record.state(1, 0)
    np.testing.assert_array_equal(Ms, M[1, 0])
    np.testing.assert_array_equal(Qs, Q[1, 0])
    assert bs.shape == (H,)

"""Factories shared by the test modules (x64 is switched on once, in conftest.py).

* :func:`random_overlaps`: the order parameters ``(M, Q, b)`` of a valid layer, drawn at random;
* :func:`weights_with_overlaps`: finite-D keys whose overlaps are exactly given ones.
"""

from __future__ import annotations

import numpy as np

from singleloc.model._data import keys_with_overlaps


def random_overlaps(rng: np.random.Generator, H: int, F: int, *, m: float, r: float, b: float):
    """``M = m Z_1`` (H, F), ``Q = M M^T + r^2 Z_2 Z_2^T`` (so ``R_orth = Q - M M^T`` is PSD) and
    ``b = b Z_3`` (H,), with standard normal ``Z_1, Z_2, Z_3`` drawn from ``rng`` in that order."""
    M = m * rng.standard_normal((H, F))
    A = r * rng.standard_normal((H, H))
    Q = M @ M.T + A @ A.T
    return M, (Q + Q.T) / 2, b * rng.standard_normal(H)


def weights_with_overlaps(rng: np.random.Generator, M, Q, D: int, orthogonal_spikes):
    """Keys K (H, D) with K k*^T / D = M and K K^T / D = Q exactly, and the spikes k* (F, D)
    (:func:`singleloc.model._data.keys_with_overlaps`, with Z drawn orthogonal to the spikes).
    ``orthogonal_spikes(rng, F, D)`` draws the spikes (the conftest fixture)."""
    H, F = M.shape
    kstar = orthogonal_spikes(rng, F, D)
    basis, _ = np.linalg.qr(np.concatenate([kstar.T, rng.standard_normal((D, H))], axis=1))
    K = keys_with_overlaps(M, Q, kstar, np.sqrt(D) * basis[:, F:].T)  # Z (H, D) orthogonal to the spikes
    assert np.allclose(K @ kstar.T / D, M, atol=1e-10) and np.allclose(K @ K.T / D, Q, atol=1e-10)
    return K, kstar


def full_disk_after(monkeypatch, files_written: int, code: int | None = None) -> list:
    """Make the disk full after ``files_written`` more files: every later file that
    :func:`singleloc.ground._atomic_files.atomic_write` creates is created (so its clean-up is tested) but
    written to ``/dev/full`` (each write fails with ENOSPC); with ``code`` (e.g. ``errno.EROFS``,
    ``errno.EACCES``) creating it fails with that error instead (a read-only folder). Returns
    the list of the paths created, in order."""
    import errno
    import os

    from singleloc.ground import _atomic_files

    real = _atomic_files._create
    created = []

    def create(path, mode):
        created.append(path)
        if len(created) <= files_written:
            return real(path, mode)
        if code is not None:
            raise OSError(code, os.strerror(code), str(path))
        os.close(real(path, mode))
        return os.open("/dev/full", os.O_RDWR)

    assert errno.ENOSPC and os.path.exists("/dev/full")
    monkeypatch.setattr(_atomic_files, "_create", create)
    return created

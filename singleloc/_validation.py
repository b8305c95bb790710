"""The one family of validators of numbers given by a user: an integer in a range and a finite
number, positive or non-negative, optionally below a bound. Each raises ``ValueError`` naming the
parameter (``"problem.L: must be >= 2, got 1"``). Config values (:mod:`singleloc._specs`), the
priors' parameters, the Bayes risk's counts, the diagnostics' sizes, temperatures and levels
(:mod:`singleloc._attention_rows`) and the CLI's integer arguments
(:func:`singleloc._commands._common.int_at_least`) are checked with them. NumPy only (no JAX:
the CLI's parser imports this module).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def integer(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an ``int``: an integer, or a float with an integer value (not a bool), at least
    ``minimum`` and at most ``maximum`` (when given)."""
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer, float, np.floating))
            or (isinstance(value, (float, np.floating)) and not math.isfinite(value)) or int(value) != value):
        raise ValueError(f"{name}: must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}: must be <= {maximum}, got {value}")
    return int(value)


def number(name: str, value: Any, *, positive: bool = False, nonneg: bool = False,
           below: float | None = None) -> float:
    """``value`` as a finite ``float`` (a number, not a bool), ``> 0`` with ``positive``, ``>= 0``
    with ``nonneg`` and ``< below`` (when given)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name}: must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name}: must be finite, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name}: must be > 0, got {value}")
    if nonneg and value < 0:
        raise ValueError(f"{name}: must be >= 0, got {value}")
    if below is not None and value >= below:
        raise ValueError(f"{name}: must be < {below}, got {value}")
    return value

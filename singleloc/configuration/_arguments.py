"""The Python API's arguments checked at the door (issue 54 item 9): a preset name where a config is
expected, a string where an array is, a prior's name where a :class:`~singleloc.Prior` is. Each check
raises ``TypeError`` naming the function, the argument and what to pass instead, before the value
reaches NumPy or JAX (whose own errors, ``could not convert string to float: 'a'`` 23 frames deep,
name neither). (:func:`~singleloc.configuration._config.require_config` checks a config the same way.)

Arrays may be anything NumPy reads as numbers, and JAX arrays or tracers (their dtype is read, not
their values), so the checks also run inside ``jax.jit``.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def require_arrays(where: str, **arrays: Any) -> None:
    """``TypeError`` naming the first of ``arrays`` (name -> value; ``None`` is skipped: a default)
    that is not numeric: a string, a mapping, or anything NumPy reads as non-numbers."""
    for name, value in arrays.items():
        if value is None:
            continue
        dtype = getattr(value, "dtype", None)
        if dtype is None and not isinstance(value, (str, bytes, dict)):
            try:
                dtype = np.asarray(value).dtype
            except (TypeError, ValueError):  # ragged nesting, objects NumPy cannot hold
                dtype = None
        if dtype is None or np.dtype(dtype).kind not in "biufc":
            raise TypeError(f"{where}: {name} must be a numeric array, got {type(value).__name__} {_short(value)}")


def require_starts(where: str, y0: Any) -> None:
    """``TypeError`` unless ``y0`` is ``None`` (the default start) or the starts ``(M0, Q0, b0)``
    (or ``(M0, Q0, b0, v0)`` with head weights) as numeric arrays."""
    if y0 is None:
        return
    if isinstance(y0, (str, bytes, dict)) or not isinstance(y0, (tuple, list)) or len(y0) not in (3, 4):
        raise TypeError(f"{where}: y0 must be the starts (M0, Q0, b0) (or (M0, Q0, b0, v0)) as arrays, got "
                        f"{type(y0).__name__} {_short(y0)}; e.g. singleloc.initial_conditions(config, 1)")
    require_arrays(where, **dict(zip(("M0", "Q0", "b0", "v0"), y0)))


def require_prior(where: str, prior: Any) -> None:
    """``TypeError`` unless ``prior`` is a :class:`~singleloc.Prior` (a prior's name is named with the remedy)."""
    from ..model._priors import Prior

    if not isinstance(prior, Prior):
        hint = (f"singleloc.{prior}(F, strength)" if prior in ("spikes", "flipped", "binary") else
                "config.problem.build_prior()") if isinstance(prior, str) else "config.problem.build_prior()"
        raise TypeError(f"{where}: prior must be a singleloc.Prior, got {type(prior).__name__} {_short(prior)}; pass {hint}")


def require_ode(where: str, ode: Any) -> None:
    """``TypeError`` unless ``ode`` is an :class:`~singleloc.OrderParameterODE`."""
    from ..theory._theory import OrderParameterODE

    if not isinstance(ode, OrderParameterODE):
        raise TypeError(f"{where}: ode must be a singleloc.OrderParameterODE, got {type(ode).__name__} {_short(ode)}; "
                        "pass singleloc.OrderParameterODE.from_config(config)")


def require_activation(where: str, activation: Any) -> None:
    """``TypeError`` unless ``activation`` is a function ``scores -> weights`` (a name is named with the remedy)."""
    if not callable(activation):
        hint = f"singleloc.get_activation({activation!r})" if isinstance(activation, str) else "singleloc.softmax"
        raise TypeError(f"{where}: activation must be a function scores -> weights, got {type(activation).__name__} "
                        f"{_short(activation)}; pass {hint}")

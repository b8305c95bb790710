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

from ._validation import integer, number


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


def require_finite(where: str, **arrays: Any) -> None:
    """``ValueError`` naming the first of ``arrays`` (``None`` skipped) that holds NaN or infinite values
    (a traced array, whose values are not known, passes)."""
    for name, value in arrays.items():
        if value is None:
            continue
        try:
            a = np.asarray(value, dtype=float)
        except Exception:  # a JAX tracer: checked where it is concrete
            continue
        bad = a.size - np.count_nonzero(np.isfinite(a))
        if bad:
            raise ValueError(f"{where}: {name} holds {bad} NaN or infinite value(s) of {a.size}; expected finite numbers")


def require_real(where: str, name: str, value: Any, **bounds: Any) -> None:
    """``TypeError`` unless ``value`` is a real number (not a bool) or a real numeric array (a JAX array
    or tracer: its dtype is read); ``ValueError`` for a concrete number outside ``bounds``
    (:func:`~singleloc.ground._validation.number`'s ``positive``, ``nonneg``, ``below``)."""
    dtype = getattr(value, "dtype", None)
    if isinstance(value, (bool, np.bool_)) or (dtype is None and not isinstance(value, (int, float))) or \
            (dtype is not None and np.dtype(dtype).kind not in "iuf"):
        raise TypeError(f"{where}: {name} must be a real number, got {type(value).__name__} {_short(value)}")
    if dtype is None:
        number(f"{where}: {name}", value, **bounds)
    elif np.ndim(value) == 0:
        try:
            concrete = float(value)
        except Exception:  # a JAX tracer: its value is not known here
            return
        number(f"{where}: {name}", concrete, **bounds)


def require_count(where: str, name: str, value: Any, minimum: int) -> None:
    """``TypeError`` unless ``value`` is an integer (not a bool), ``ValueError`` below ``minimum``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{where}: {name} must be an integer, got {type(value).__name__} {_short(value)}")
    integer(f"{where}: {name}", value, minimum)


def require_flag(where: str, **flags: Any) -> None:
    """``TypeError`` naming the first of ``flags`` that is not ``True`` or ``False``."""
    for name, value in flags.items():
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{where}: {name} must be True or False, got {type(value).__name__} {_short(value)}")


def require_starts(where: str, y0: Any) -> None:
    """``TypeError`` unless ``y0`` is ``None`` (the default start) or the starts ``(M0, Q0, b0)``
    (or ``(M0, Q0, b0, v0)`` with head weights) as numeric arrays."""
    if y0 is None:
        return
    if isinstance(y0, (str, bytes, dict)) or not isinstance(y0, (tuple, list)) or len(y0) not in (3, 4):
        raise TypeError(f"{where}: y0 must be the starts (M0, Q0, b0) (or (M0, Q0, b0, v0)) as arrays, got "
                        f"{type(y0).__name__} {_short(y0)}; e.g. singleloc.initial_conditions(config, 1)")
    require_arrays(where, **dict(zip(("M0", "Q0", "b0", "v0"), y0)))


def require_instance(where: str, name: str, value: Any, kind: type, remedy: str = "") -> None:
    """``TypeError`` naming ``where`` and ``name`` unless ``value`` is a ``kind`` (a public class of the
    package); ``remedy``: how to make one."""
    if not isinstance(value, kind):
        raise TypeError(f"{where}: {name} must be a singleloc.{kind.__name__}, got {type(value).__name__} {_short(value)}"
                        + (f"; pass {remedy}" if remedy else ""))


def require_activation(where: str, activation: Any) -> None:
    """``TypeError`` unless ``activation`` is a function ``scores -> weights`` (a name is named with the remedy)."""
    if not callable(activation):
        hint = f"singleloc.get_activation({activation!r})" if isinstance(activation, str) else "singleloc.softmax"
        raise TypeError(f"{where}: activation must be a function scores -> weights, got {type(activation).__name__} "
                        f"{_short(activation)}; pass {hint}")

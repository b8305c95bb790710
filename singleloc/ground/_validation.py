"""The one family of validators of numbers given by a user: an integer in a range and a finite number, positive or
non-negative, optionally below a bound, within the range of the type it reaches. Each raises ``ValueError`` naming the
parameter and suggesting a value that passes (``"problem.L: must be >= 2, got 1; e.g. problem.L = 2"``). NumPy only (no
JAX: the CLI's parser imports this module).

Ranges of types. A number must be representable where it goes, or NumPy and JAX fail deep inside (``"Python int too
large to convert to C long"``): an integer is at most :data:`INT64_MAX` unless a smaller bound is given (a count that
indexes or sizes a JAX array: :data:`INT32_MAX`, JAX's integer without its x64 mode); a float that reaches float32 or
float64 lies in that type's range, or its square does where the computation squares it (:func:`representable`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Largest integers of the types a count or a seed reaches.
INT32_MAX = int(np.iinfo(np.int32).max)
INT64_MAX = int(np.iinfo(np.int64).max)
#: Seeds are 32-bit: ``jax.random.PRNGKey`` keeps only the low 32 bits of a larger seed when
#: JAX's x64 mode is off, so larger seeds would not give the same weights in every process
#: (:func:`~singleloc.seed_keys`, ``simulation.seed``; ``theory.qmc_seed`` alike, whose rules take the seeds ``qmc_seed + r``).
SEED_MAX = 2**32 - 1

#: Names of the float types a value reaches, for the messages.
FLOAT_TYPES = {"float32": np.float32, "float64": np.float64}


def suggest(name: str, value: Any) -> str:
    """``"; e.g. problem.L = 2"`` (a config key, ``section.key``) or ``"; e.g. 2"`` (another parameter)."""
    text = f"{value:g}" if isinstance(value, float) else repr(value) if isinstance(value, str) else f"{value}"
    key = "." in name and " " not in name and not name.startswith("-")
    return f"; e.g. {name} = {text}" if key else f"; e.g. {text}"


def integer(name: str, value: Any, minimum: int, maximum: int | None = None, *, example: int | None = None) -> int:
    """``value`` as an ``int``: an integer, or a float with an integer value (not a bool), at least
    ``minimum`` and at most ``maximum`` (default :data:`INT64_MAX`: larger integers reach no array).
    ``example``: the value suggested when it is refused (default: the nearest allowed one)."""
    top = INT64_MAX if maximum is None else maximum

    def fail(why: str, near: int) -> None:
        raise ValueError(f"{name}: {why}{suggest(name, near if example is None else example)}")

    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer, float, np.floating))
            or (isinstance(value, (float, np.floating)) and not math.isfinite(value)) or int(value) != value):
        finite = isinstance(value, (float, np.floating)) and math.isfinite(value)
        fail(f"must be an integer, got {value!r}", min(max(round(value), minimum), top) if finite else minimum)
    if value < minimum:
        fail(f"must be >= {minimum}, got {value}", minimum)
    if value > top:
        fail(f"must be <= {top}{'' if maximum is not None else ' (the largest 64-bit integer)'}, got {value}",
             top if maximum is not None else minimum)
    return int(value)


def number(name: str, value: Any, *, positive: bool = False, nonneg: bool = False, below: float | None = None,
           example: float | None = None) -> float:
    """``value`` as a finite ``float`` (a number, not a bool), ``> 0`` with ``positive``, ``>= 0``
    with ``nonneg`` and ``< below`` (when given). ``example``: the value suggested when it is refused
    (default: ``1``, or ``|value|`` for a negative one, or ``below / 2``); it is formatted in full
    (``repr``), so that a bound and a refused value never print alike."""
    def fail(why: str, got: Any, default: float) -> None:
        raise ValueError(f"{name}: {why}, got {got}{suggest(name, default if example is None else example)}")

    fallback = 1.0 if below is None or below > 1 else below / 2
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        fail("must be a number", repr(value), fallback)
    if isinstance(value, (int, np.integer)) and abs(int(value)) > int(np.finfo(np.float64).max):
        fail("must be a float64 number (at most 1.8e308 in magnitude)", f"an integer of {len(str(abs(int(value))))} digits",
             fallback)
    value = float(value)
    if not math.isfinite(value):
        fail("must be finite", value, fallback)
    if positive and value <= 0:
        fail("must be > 0", repr(value), -value if value < 0 else fallback)
    if nonneg and value < 0:
        fail("must be >= 0", repr(value), -value)
    if below is not None and value >= below:
        fail(f"must be < {below!r}", repr(value), below / 2 if below > 0 else below - 1)
    return value


def representable(name: str, value: float, dtype: str, *, squared: bool = False, where: str = "",
                  example: float | None = None) -> None:
    """``ValueError`` unless the finite ``value`` lies in the range of the float type ``dtype``
    (``"float32"``, ``"float64"``): at most its largest number in magnitude and, unless zero, at least
    its smallest normal one (a smaller one is flushed to zero, and a ratio by it is then ``0/0``). With
    ``squared`` its square must not overflow (a square that underflows to zero is harmless: a term
    negligible to the type's precision). ``where`` names the computation that holds it in ``dtype``."""
    info = np.finfo(FLOAT_TYPES[dtype])
    top, tiny = float(info.max), float(info.tiny)
    if squared:
        top, tiny = math.sqrt(top), 0.0
    size = abs(float(value))
    if size <= top and (size == 0 or size >= tiny):
        return
    why = f"its square must be a {dtype} number" if squared else f"it must be a {dtype} number"
    if size > top:
        bound = f"|{name}| <= {top:.3g}"
    else:
        bound = f"|{name}| >= {tiny:.3g} or 0 ({dtype} holds a smaller one as 0)"
        why = why.replace(" number", " normal number")
    default = example if example is not None else (1.0 if size > top else 0.0)
    raise ValueError(f"{name}: {value!r} is out of range{' for ' + where if where else ''}: {why}, so {bound}"
                     f"{suggest(name, default)}")

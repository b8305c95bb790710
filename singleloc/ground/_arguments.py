"""The Python API's arguments checked at the door: each public function (wrapped by
:func:`checked` when :mod:`singleloc` hands it out) and each public record (:func:`check_fields`) checks its
arguments against their annotations with beartype, arrays against jaxtyping's dtypes and shapes
(``Real[ArrayLike, "H F"]``, a name shared by the arguments of one call), and answers a wrong one with one
``TypeError`` line naming the function, the argument and what it expects, before NumPy or JAX sees it. The
package's own calls reach the private modules and pay nothing; beartype is imported at the first check. What
a type cannot say (a range, finite values) stays with the callee (:func:`~singleloc.ground._validation.number`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _short(value: Any, limit: int = 60) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


_WORDS = {int: "an integer", float: "a number", bool: "True or False", str: "a string", Path: "a path",
          type(None): "None", Mapping: "a mapping", dict: "a mapping", Callable: "a function"}
_PLURALS = {int: "integers", float: "numbers", str: "strings"}
#: What to pass instead of a name (or a dict) given where an object is expected.
_REMEDIES = {"singleloc.Config": "singleloc.load_config({})", "singleloc.Prior": "a prior, e.g. singleloc.spikes(F, strength)"}


def _expects(hint: Any, optional: bool) -> str:
    """What ``hint`` asks for, in words (``None`` left out where it only marks an ``optional`` argument)."""
    from jaxtyping import AbstractArray

    words: list[str] = []
    for arg in typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,):
        if arg is type(None) and optional:
            continue
        if typing.get_origin(arg) is typing.Annotated:
            word = arg.__metadata__[0]
        elif isinstance(arg, type) and issubclass(arg, AbstractArray):
            dims = arg.dim_str.replace(",", " ").split()
            kind = arg.__name__.split("[")[0].lower()
            word = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} array" + ("" if dims == ["..."] else
                                                                     f" of shape ({', '.join(dims)}{',' * (len(dims) == 1)})")
        elif typing.get_origin(arg) in (Sequence, list) or (typing.get_origin(arg) is tuple and arg.__args__[-1] is Ellipsis):
            item, inner = arg.__args__[0], _expects(arg.__args__[0], False).removeprefix("a ")
            inner = _PLURALS.get(item) or (inner.replace("sequence", "sequences", 1) if inner.startswith("sequence ") else
                                           inner + " items")
            word = f"a {'tuple' if typing.get_origin(arg) is tuple else 'sequence'} of {inner}"
        elif arg in _WORDS or typing.get_origin(arg) in _WORDS:
            word = _WORDS.get(arg) or _WORDS[typing.get_origin(arg)]
        elif getattr(arg, "__module__", "") == "jax" and arg.__name__.endswith("Array"):
            word = "a JAX array"
        elif isinstance(arg, type):
            word = f"a {'singleloc.' * arg.__module__.startswith('singleloc')}{arg.__name__}"
        else:
            word = repr(arg).replace("typing.", "").replace("collections.abc.", "")
        words += [word] * (word not in words)
    return " or ".join(w for w in words if w != "an integer" or "a number" not in words)


def _got(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{type(value).__name__} of dtype {value.dtype} and shape {tuple(value.shape)}"
    return f"{type(value).__name__} {_short(value)}"


@functools.cache
def beartype_conf():
    """The check's configuration: an integer where a float is expected, NumPy's scalars as Python's."""
    from beartype import BeartypeConf, FrozenDict

    return BeartypeConf(hint_overrides=FrozenDict({float: float | int | np.floating | np.integer, int: int | np.integer}))


def _check(where: str, values: Mapping[str, Any], hints: Mapping[str, Any], optional: frozenset = frozenset()) -> None:
    """``TypeError`` naming ``where`` and the first of ``values`` (name -> value) that its hint refuses; the
    arrays' named dimensions must agree across ``values``."""
    from beartype.door import is_bearable
    from jaxtyping import jaxtyped

    conf = beartype_conf()
    with jaxtyped("context"):
        for name, value in values.items():
            hint = hints.get(name)
            if hint is not None and not is_bearable(value, hint, conf=conf):
                expects = _expects(hint, name in optional)
                if value is None and name in optional:  # data a call needs, optional in the signature for the keywords before
                    raise TypeError(f"{where}: missing {name} ({expects})")
                raise TypeError(f"{where}: {name} must be {expects}, got {_got(value)}{_remedy(value, expects)}")


def _remedy(value: Any, expects: str) -> str:
    """What to pass instead of a name, a dict or a configuration given where an object is expected."""
    fix = next((fix.format(_short(value)) for kind, fix in _REMEDIES.items() if kind in expects), None)
    if fix is None and isinstance(value, Mapping) and expects.startswith("a singleloc.") and " " not in expects[2:]:
        fix = f"{expects[2:]}(**{_short(value)})"
    if "singleloc.Setup" in expects and type(value).__name__ == "Config":  # a configuration where its objects are taken
        return "; pass singleloc.build(config)"
    return f"; pass {fix}" if fix and isinstance(value, (str, Path, Mapping)) else ""


class _Public(dict):
    """The names a module imports for its type checker only (``TYPE_CHECKING``), read from :mod:`singleloc`
    (always imported; no import arrow upwards)."""

    def __missing__(self, name: str) -> Any:  # a KeyError sends eval on to the module's globals
        try:
            return getattr(sys.modules["singleloc"], name)
        except AttributeError:
            raise KeyError(name) from None


def beyond_the_door(stacklevel: int) -> int:
    """``stacklevel`` for :func:`warnings.warn` (counted from the function that calls it) with one more level for
    each frame of :func:`checked`'s wrapper it passes: a warning meant for the caller of a public function names the
    caller's line, not the door's."""
    frame, level, step = sys._getframe(1), stacklevel, 1
    while frame is not None and step < level:
        frame, step = frame.f_back, step + 1
        level += frame is not None and frame.f_code is _DOOR
    return level


def checked(fn):
    """``fn`` checking its arguments against its annotations, read at its first call (module docstring)."""
    signature, where = inspect.signature(fn), fn.__qualname__.removesuffix(".__init__")

    @functools.cache
    def hints() -> tuple[dict, frozenset]:
        own = typing.get_type_hints(fn, localns=_Public(), include_extras=True)
        return ({name: own[name] for name in signature.parameters if name in own},
                frozenset(name for name, p in signature.parameters.items() if p.default is None))

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as err:
            raise TypeError(f"{where}: {err}") from None
        bound.apply_defaults()  # a None default where data are needed is named as missing
        _check(where, bound.arguments, *hints())
        return fn(*args, **kwargs)

    return wrapper


_DOOR = checked(lambda: None).__code__  # the code of every wrapper


_field_hints = functools.cache(lambda kind: typing.get_type_hints(kind, localns=_Public(), include_extras=True))


def check_fields(record: Any) -> None:
    """``TypeError`` naming the record's class and the first field (of a dataclass or an ``eqx.Module``) that its
    annotation refuses: a record's ``__check_init__`` or ``__post_init__``."""
    fields = dataclasses.fields(record)
    _check(type(record).__name__, {f.name: getattr(record, f.name) for f in fields}, _field_hints(type(record)),
           frozenset(f.name for f in fields if f.default is None))


def require_finite(where: str, **arrays: Any) -> None:
    """``ValueError`` naming the first of ``arrays`` (``None`` skipped) that holds NaN or infinite values: a value no
    type states (called after the door: the arrays are concrete)."""
    for name, value in arrays.items():
        a = np.asarray(np.nan if value is None else value, dtype=float)
        if value is not None and (bad := a.size - np.count_nonzero(np.isfinite(a))):
            raise ValueError(f"{where}: {name} holds {bad} NaN or infinite value(s) of {a.size}; expected finite numbers")

"""The Python API's arguments checked at the door (issue 54 item 9, issue 62 item 4): each public function
(wrapped by :func:`checked` when it is looked up in :mod:`singleloc`) and each public record (its
``__check_init__``/``__post_init__`` calls :func:`check_fields`) checks its arguments against their
annotations with beartype, arrays against jaxtyping's dtypes and shapes (``Real[ArrayLike, "H F"]``,
names shared by the arguments of one call), and answers a wrong one with one ``TypeError`` line naming the
function, the argument and what it expects, before the value reaches NumPy or JAX. The package's own calls
go to the private modules and pay nothing; beartype is imported at the first checked call, not with
:mod:`singleloc`. What a type cannot say (a range, finite values) stays with the callee
(:func:`~singleloc.ground._validation.number`, :func:`require_finite`).
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


def _short(value: Any, limit: int = 40) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


_WORDS = {int: "an integer", float: "a number", bool: "True or False", str: "a string", Path: "a path",
          type(None): "None", Mapping: "a mapping"}
_PLURALS = {int: "integers", float: "numbers", str: "strings"}


#: What to pass instead of a name (or a dict) given where an object is expected.
_REMEDIES = {"singleloc.Config": "singleloc.load_config({})", "singleloc.Prior": "a prior, e.g. singleloc.spikes(F, strength)",
             "singleloc.Run": "singleloc.load_run(folder)"}


def _expects(hint: Any, optional: bool) -> str:
    """What ``hint`` asks for, in words (``None`` left out where it only marks an ``optional`` argument)."""
    from jaxtyping import AbstractArray

    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    words: list[str] = []
    for arg in typing.get_args(hint) if union else (hint,):
        if arg is type(None) and optional:
            continue
        if typing.get_origin(arg) is typing.Annotated:
            word = arg.__metadata__[0]
        elif isinstance(arg, type) and issubclass(arg, AbstractArray):
            dims = arg.dim_str.replace(",", " ").split()
            kind = arg.__name__.split("[")[0].lower()
            word = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} array" + ("" if dims == ["..."] else
                                                                     f" of shape ({', '.join(dims)}{',' * (len(dims) == 1)})")
        elif typing.get_origin(arg) in (Mapping, dict):
            word = "a mapping"
        elif typing.get_origin(arg) in (Sequence, list) or (typing.get_origin(arg) is tuple and arg.__args__[-1] is Ellipsis):
            item = arg.__args__[0]
            word = (f"a {'tuple' if typing.get_origin(arg) is tuple else 'sequence'} of "
                    f"{_PLURALS.get(item) or _expects(item, False).removeprefix('a ') + ' items'}")
        elif arg in _WORDS:
            word = _WORDS[arg]
        elif typing.get_origin(arg) is Callable:
            word = "a function"
        elif getattr(arg, "__module__", "") == "jax" and arg.__name__.endswith("Array"):
            word = "a JAX array"
        elif isinstance(arg, type):
            word = f"a {'singleloc.' * arg.__module__.startswith('singleloc')}{arg.__name__}"
        else:
            word = repr(arg).replace("typing.", "").replace("collections.abc.", "")
        words += [word] * (word not in words)
    return " or ".join(words)


def _got(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"{type(value).__name__} of dtype {value.dtype} and shape {tuple(shape)}"
    return f"{type(value).__name__} {_short(value)}"


@functools.cache
def beartype_conf():
    """The check's configuration: an integer where a float is expected, NumPy's scalars as Python's."""
    from beartype import BeartypeConf, BeartypeHintOverrides

    return BeartypeConf(hint_overrides=BeartypeHintOverrides({float: float | int | np.floating | np.integer,
                                                              int: int | np.integer}))


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
    """What to pass instead of a name or a dict given where an object is expected."""
    if not isinstance(value, (str, Path, Mapping)):
        return ""
    fix = next((fix.format(_short(value)) for kind, fix in _REMEDIES.items() if kind in expects), None)
    if fix is None and isinstance(value, Mapping) and expects.startswith("a singleloc.") and " " not in expects[2:]:
        fix = f"{expects[2:]}(**{_short(value)})"
    return f"; pass {fix}" if fix else ""


class _Public(dict):
    """The names a module imports for its type checker only (``TYPE_CHECKING``), read from :mod:`singleloc`."""

    def __missing__(self, name: str) -> Any:
        try:
            return getattr(sys.modules["singleloc"], name)  # the package itself (always imported), no import arrow upwards
        except AttributeError:
            raise KeyError(name) from None


def beyond_the_door(stacklevel: int) -> int:
    """``stacklevel`` for :func:`warnings.warn` (counted from the function that calls it) with one more level for
    each frame of :func:`checked`'s wrapper it passes: a warning meant for the caller of a public function names the
    caller's line, not the door's."""
    frame, level, step = sys._getframe(1), stacklevel, 1
    while frame is not None and step < level:
        frame, step = frame.f_back, step + 1
        if frame is not None and frame.f_code is _DOOR:
            level += 1
    return level


def checked(fn):
    """``fn`` checking its arguments against its annotations (module docstring); the annotations are read at
    the first call (the names they use are then all defined)."""
    signature, where = inspect.signature(fn), fn.__qualname__.removesuffix(".__init__")

    @functools.cache
    def hints() -> tuple[dict, frozenset]:
        kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        own = {name: hint for name, hint in typing.get_type_hints(fn, localns=_Public(), include_extras=True).items()
               if name in signature.parameters and signature.parameters[name].kind not in kinds}
        return own, frozenset(name for name, p in signature.parameters.items() if p.default is None)

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


@functools.cache
def _field_hints(kind: type) -> dict:
    return typing.get_type_hints(kind, localns=_Public(), include_extras=True)


def check_fields(record: Any) -> None:
    """``TypeError`` naming the record's class and the first field (of a dataclass or an ``eqx.Module``) whose
    value its annotation refuses: the check of a record's ``__check_init__`` or ``__post_init__``."""
    kind = type(record)
    _check(kind.__name__, {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}, _field_hints(kind),
           frozenset(f.name for f in dataclasses.fields(record) if f.default is None))


def require_finite(where: str, **arrays: Any) -> None:
    """``ValueError`` naming the first of ``arrays`` (``None`` skipped) that holds NaN or infinite values
    (a traced array, whose values are not known, passes): a value no type states."""
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

"""Extension points a config file can reach: ``"package.module:function"`` references.

``model.activation`` and ``problem.prior`` take, besides the names the package registers, a reference
``"package.module:attribute"`` (a dotted attribute path after the colon) to a function in any importable module:

* ``model.activation = "mypkg.layers:sparsemax"``: a function ``scores (H, L) -> weights
  (H, L)``, equivariant under token permutations (as for :func:`~singleloc.register_activation`);
  an ``exponential_form`` attribute on it puts it on the exact route.
* ``problem.prior = "mypkg.priors:ring"``: a function ``problem -> Prior`` of the
  :class:`~singleloc.Problem` section (it reads ``F``, ``strength`` or any other key it needs)
  returning a :class:`~singleloc.Prior`.

The function is called through :func:`~singleloc.ground._user_code.guarded` and checked with values where it
enters (:mod:`~singleloc.ground._user_code`). The module is imported once per process where the config is used,
also on each Dask worker of a sweep (the config carries the string): it must be importable there.

Compiled programs. A referenced function is named by its reference in every process, so the programs built from
it are stored and reused like the package's own (:mod:`~singleloc.runtime._compilation`), keyed by a digest of the
module's source file (a change in a module it imports is not seen: clear the cache folder then).
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path
from typing import Any

#: ``reference -> (object, digest of its module's source file or None)`` of every reference imported.
_IMPORTED: dict[str, tuple[Any, str | None]] = {}
#: ``(reference, key) -> the object called through its guard`` (:func:`~singleloc.ground._user_code.guarded`,
#: which names the config key in its errors).
_GUARDED: dict[tuple[str, str], Any] = {}


def is_reference(name: Any) -> bool:
    """Whether ``name`` is a ``"package.module:attribute"`` reference (a string with a colon)."""
    return isinstance(name, str) and ":" in name


def import_reference(reference: str, key: str) -> Any:
    """The callable ``reference`` names, imported on first use; ``key`` (``"model.activation"``)
    names the config entry in the errors: a malformed reference, a module that cannot be
    imported (with the import's own error), a missing attribute, an object that is not callable."""
    if (reference, key) in _GUARDED:
        return _GUARDED[reference, key]
    if reference in _IMPORTED:
        return _guard(reference, key)
    module_name, _, path = reference.partition(":")
    if not module_name or not path or ":" in path:
        raise ValueError(f"{key}: {reference!r} is not a reference 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # ModuleNotFoundError, or anything the module raises while it runs
        raise ValueError(f"{key}: cannot import module {module_name!r} of {reference!r} ({type(err).__name__}: {err}); "
                         "it must be importable in every process that uses the config (installed or on PYTHONPATH)") from None
    obj: Any = module
    for part in path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{key}: module {module_name!r} has no attribute {path!r} (from {reference!r})") from None
    if not callable(obj):
        raise ValueError(f"{key}: {reference!r} is not callable (got {type(obj).__name__})")
    _IMPORTED[reference] = (obj, _file_digest(module))
    return _guard(reference, key)


def _guard(reference: str, key: str) -> Any:
    from ._user_code import guarded

    return _GUARDED.setdefault((reference, key), guarded(_IMPORTED[reference][0], reference, key))


def stable_names() -> dict[str, str]:
    """``repr`` -> a name valid in every process (the reference and its module's digest) of every
    imported reference, for the keys of stored programs."""
    digests = {reference: digest for reference, (_, digest) in _IMPORTED.items() if digest}
    return {repr(obj): f"{reference}@{digests[reference]}" for (reference, _), obj in _GUARDED.items() if reference in digests}


def _file_digest(module) -> str | None:
    """A digest of the module's source file; ``None`` without a readable one (the programs of
    such a reference are then not stored)."""
    source = getattr(module, "__file__", None)
    try:
        return hashlib.sha256(Path(source).read_bytes()).hexdigest()[:16] if source else None
    except OSError:
        return None

"""Compilation: programs that a later process reuses from disk, without tracing or compiling (docs/compilation.md).

A short theory run spends most of its time tracing the solve into a program (seconds: diffrax is large) and
compiling it (more seconds). Both can be skipped in a later process.

* Compiling. JAX keeps executables in a persistent cache (``jax_compilation_cache_dir``), keyed by the program's
  text. Host callbacks keep a program out of it (their keys hold process-specific pointers), and Equinox's runtime
  checks (``eqx.error_if``, inside diffrax) are host callbacks in their default mode ``EQX_ON_ERROR=raise``: the
  package's solves are traced inside :func:`checks_as_nan`, where they are a select that returns NaN (the solve's
  own checks then report the failure in one line), for their tracing only. A user who sets ``EQX_ON_ERROR`` is
  obeyed; programs with host callbacks (also diffrax's progress bar, when asked for) are compiled in every process.
  :func:`enable_compilation_cache` lowers JAX's floor of one second of compilation to zero.
* Tracing. :func:`exported_call` stores the traced program itself (``jax.export``, StableHLO) next to the
  executables, and a later process loads it instead of tracing. The file is keyed by everything the program is
  built from: the shapes and dtypes of the arrays, the structure and static values of the arguments, a digest of
  the package's source files, the versions of its dependencies, the backend, the JAX options that change tracing,
  and ``EQX_ON_ERROR``. A static value that cannot be named across processes (a function defined outside
  ``singleloc``, unless a config names it by reference, :mod:`~singleloc.ground._extensions`) disables the stored
  program for that call, as do host callbacks in the traced program, a missing ``flatbuffers`` and more than one
  local device (a batch split over the devices, :mod:`~singleloc.expectations._sharding`, is traced in every
  process; its executable still comes from the compilation cache).
* XLA's effort. On a CPU the theory's programs (the solve and its error statement: :func:`filter_jit`, and the
  stored solve) are compiled with :data:`CPU_OPTIONS`: XLA's loop emitters instead of its MLIR fusion emitters,
  which spent most of a solve's compilation setting up a pass pipeline for each of its many small fused kernels.
  Measured (``benchmarks/09_program_size.py``, section 2): the default problem's solve compiles in 0.7x the CPU time
  (0.57x the wall time) and runs as fast; its numbers moved by up to 6e-14 relative (another code generator rounds
  the same operations differently).
* Memory. Every executable holds memory-mapped sections of machine code, and Linux caps a process's mappings
  (``vm.max_map_count``, 65530 by default): a process that compiled the programs of about a hundred shapes (a long
  serial sweep) failed with "LLVM ERROR: Unable to allocate section memory". :func:`hold_programs` keeps the
  programs of at most :data:`MAX_HELD_SHAPES` shapes, then frees them all (``jax.clear_caches``); with the
  persistent cache on, a shape that comes back is loaded, not compiled again.

The cache is opt-in (it changes JAX's global configuration): the command line turns it on, a script calls
:func:`enable_compilation_cache`. Its folder is ``$SINGLELOC_CACHE_DIR`` if set (an empty value turns it off), else
``$XDG_CACHE_HOME/singleloc/jax`` (by default ``~/.cache/singleloc/jax``); it can be deleted at any time.

Faults. Each stored program carries a SHA-256 checksum of its bytes, checked before it is deserialised: a file that
fails the check or cannot be read back is removed with one warning, and the program is traced, compiled and stored
anew. A cache folder that cannot be created or written is not used (one warning names it and the variable it comes
from); a stored program that cannot be written (a full disk) is not stored, with one warning.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any

import equinox as eqx
import jax

from ..ground._extensions import stable_names

_PACKAGE = Path(__file__).parent.parent  # the package (this module is in singleloc/runtime)
_DEPENDENCIES = ("jax", "jaxlib", "equinox", "diffrax", "optimistix", "lineax")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_MAGIC = b"singleloc-program-1\n"  # a stored program's file: this, the SHA-256 of the serialised program, the program
_LOADED: dict[str, Callable] = {}  # digest -> the loaded program, jitted (one per process and key)

#: Most shapes whose compiled programs one process holds (:func:`hold_programs`). A theory shape
#: holds a few dozen executables; 16 shapes stay far below ``vm.max_map_count``.
MAX_HELD_SHAPES = 16
_HELD: set[Hashable] = set()  # the shapes whose programs this process holds since the last clear
_OWNED = [False]  # whether singleloc owns this process's JAX state (own_process)


@contextlib.contextmanager
def checks_as_nan():
    """Trace Equinox's runtime checks as a NaN select, not a host callback, within the block (module
    docstring): the mode Equinox reads when a check is traced, set for the block and restored after it,
    unless the process's ``EQX_ON_ERROR`` says otherwise (the user's choice)."""
    try:
        from equinox import _errors  # the module whose global the checks read when they are traced
    except ImportError:  # pragma: no cover - another equinox layout: its default mode stays
        _errors = None
    if "EQX_ON_ERROR" in os.environ or not hasattr(_errors, "EQX_ON_ERROR"):
        yield
        return
    before = _errors.EQX_ON_ERROR
    _errors.EQX_ON_ERROR = "nan"
    try:
        yield
    finally:
        _errors.EQX_ON_ERROR = before


def checks_mode() -> str:
    """The mode of Equinox's runtime checks in the package's programs (part of a stored program's key)."""
    return os.environ.get("EQX_ON_ERROR", "nan")


def own_process() -> None:
    """Declare that singleloc owns this process's JAX state (the command line, a Dask worker; not a Python
    caller's process): only an owned process has its compiled programs freed by :func:`hold_programs`."""
    _OWNED[0] = True


def process_owned() -> bool:
    """Whether :func:`own_process` was called in this process."""
    return _OWNED[0]


def hold_programs(shape: Hashable) -> None:
    """Note that the next computation compiles (or reuses) the programs of ``shape`` (a hashable name of the
    shapes and static values, e.g. :func:`compile_group`'s). Before a new shape beyond :data:`MAX_HELD_SHAPES`, every
    compiled program of this process is freed (module docstring, "Memory"); a freed one is made again when needed."""
    if shape not in _HELD and len(_HELD) >= MAX_HELD_SHAPES:
        jax.clear_caches()
        _HELD.clear()
    _HELD.add(shape)


#: XLA's options for the theory's solve programs on a CPU (module docstring, "XLA's effort").
CPU_OPTIONS = {"xla_cpu_use_fusion_emitters": False}


def compiler_options() -> dict | None:
    """:data:`CPU_OPTIONS` on the CPU backend; ``None`` (XLA's defaults) on another."""
    return dict(CPU_OPTIONS) if jax.default_backend() == "cpu" else None


def filter_jit(fn: Callable) -> Callable:
    """``eqx.filter_jit(fn)`` (the arrays among the arguments traced, every other leaf static) compiled with
    :func:`compiler_options`, as :func:`exported_call` compiles the stored program of ``fn``: the same numbers with
    the cache folder or without (called inside another program, as its part: the options are the outer program's).
    Named ``jit(fn.__name__)`` in JAX's compile events; ``.lower(*args)`` as a jit's."""

    def traced(static, dynamic):
        leaves, treedef = static
        return fn(*eqx.combine(dynamic, jax.tree.unflatten(treedef, leaves)))

    traced.__name__, traced.__qualname__ = fn.__name__, fn.__qualname__

    @functools.cache
    def jitted(options: tuple) -> Callable:
        return jax.jit(traced, static_argnums=0, compiler_options=dict(options) or None)

    def split(args):
        dynamic, static = eqx.partition(args, eqx.is_array)
        leaves, treedef = jax.tree.flatten(static)
        nested = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(dynamic))  # the outer program's options
        return jitted(() if nested else tuple(sorted((compiler_options() or {}).items()))), ((tuple(leaves), treedef), dynamic)

    @functools.wraps(fn)
    def call(*args):
        program, split_args = split(args)
        return program(*split_args)

    def lower(*args):
        program, split_args = split(args)
        return program.lower(*split_args)

    call.lower = lower
    return call


CACHE_ENV = "SINGLELOC_CACHE_DIR"


def cache_dir() -> Path | None:
    """The folder of the persistent compilation cache (``None``: turned off)."""
    if CACHE_ENV in os.environ:
        value = os.environ[CACHE_ENV].strip()
        return Path(value).expanduser() if value else None
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "singleloc" / "jax"


def _cache_source() -> str:
    """Where :func:`cache_dir` comes from, for messages."""
    if CACHE_ENV in os.environ:
        return CACHE_ENV
    return "XDG_CACHE_HOME" if os.environ.get("XDG_CACHE_HOME") else "the default ~/.cache"


def enable_compilation_cache(directory: str | Path | None = None) -> Path | None:
    """Turn on JAX's persistent compilation cache (and :func:`exported_call`'s stored
    programs) for this process and return its folder.

    Args:
        directory: the cache folder; default :func:`cache_dir`.

    A cache folder that JAX already uses (set by the caller, e.g. a test session) is kept.
    Returns ``None`` when the cache is turned off (``SINGLELOC_CACHE_DIR=""``).
    """
    if current := jax.config.jax_compilation_cache_dir:
        return Path(current)
    folder = Path(directory).expanduser() if directory is not None else cache_dir()
    if folder is None:
        return None
    try:  # the folder can be created and written into
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        source = "the directory argument" if directory is not None else _cache_source()
        warnings.warn(f"the compilation cache folder {str(folder)!r} (from {source}) cannot be used ({err.strerror or err}); "
                      f"programs are compiled in every run: set {CACHE_ENV} to a writable folder, or to an empty value to "
                      "turn the cache off", stacklevel=2)
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder


def _structure(args) -> str | None:
    """The structure and static values of ``args`` as a string that is the same in every process, or ``None`` if a
    static value has no such name: each function's ``repr`` replaced by ``module.name`` for the module-level
    functions of the imported singleloc modules (their code is covered by the source digest), and by
    ``reference@digest`` for a function a config names by reference (its module's source digest)."""
    names = stable_names()  # functions a config names by reference (singleloc.ground._extensions)
    for module_name, module in list(sys.modules.items()):
        if module_name == "singleloc" or module_name.startswith("singleloc."):
            names.update({repr(value): f"{module_name}.{attr}" for attr, value in vars(module).items()
                          if callable(value) and inspect.isfunction(value)})
    text = str(jax.tree.structure(args))
    for value, name in names.items():
        text = text.replace(value, name)
    return None if _ADDRESS.search(text) else text


def _environment() -> tuple:
    """What a stored program depends on besides its arguments (module docstring): the dependencies' versions, the
    backend, the JAX options that change tracing, the checks' mode and a digest of the package's source files."""
    versions = tuple(importlib.metadata.version(name) for name in _DEPENDENCIES)
    options = ("jax_enable_x64", "jax_default_matmul_precision", "jax_numpy_dtype_promotion", "jax_numpy_rank_promotion")
    source = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        source.update(str(path.relative_to(_PACKAGE)).encode() + path.read_bytes())
    return (versions, jax.default_backend(), tuple(str(getattr(jax.config, o)) for o in options), checks_mode(),
            source.hexdigest())


def exported_call(name: str, fn: Callable, *args, static: tuple = ()):
    """``fn(*args, *static)`` through a program stored in the cache folder (module docstring).

    ``fn`` (named ``name``, its code in the package) must be a pure function of the array
    leaves of ``args``; ``static`` holds its static Python arguments (numbers, flags). Without
    a cache folder, or when the program cannot be stored, this is ``fn(*args, *static)``.
    """
    folder, structure = jax.config.jax_compilation_cache_dir, _structure(args)
    with checks_as_nan():  # the package's checks traced as NaN, for this call only
        if not folder or structure is None or importlib.util.find_spec("flatbuffers") is None or jax.local_device_count() > 1:
            return fn(*args, *static)
        leaves, treedef = jax.tree.flatten(args)
        shapes = tuple((tuple(x.shape), str(x.dtype)) for x in leaves)
        digest = hashlib.sha256(repr((name, static, structure, shapes, _environment())).encode()).hexdigest()
        call = _LOADED.get(digest)
        if call is None:
            path = Path(folder) / "exported" / f"{name}-{digest[:32]}.bin"
            exported = _load(path)
            if exported is None:
                try:
                    exported = jax.export.export(jax.jit(lambda *x: fn(*jax.tree.unflatten(treedef, x), *static)))(*leaves)
                except NotImplementedError:  # host callbacks: jax.export refuses them (newer JAX) ...
                    return fn(*args, *static)
                if "callback" in exported.mlir_module():  # ... or exports them unserialisable (older JAX)
                    return fn(*args, *static)
                _store(path, exported.serialize())
            call = _LOADED[digest] = jax.jit(exported.call, compiler_options=compiler_options())
        return call(*leaves)


def _load(path: Path):
    """The program stored at ``path``, or ``None`` when there is none or it cannot be trusted (a checksum that does
    not match, or unreadable: one warning, the file removed; the caller compiles it again and stores it anew)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        warnings.warn(f"the stored program {str(path)!r} cannot be read ({err.strerror or err}); compiling it again",
                      stacklevel=3)
        return None
    head, body = data[:len(_MAGIC) + 32], data[len(_MAGIC) + 32:]
    problem = None if head == _MAGIC + hashlib.sha256(body).digest() else "its checksum does not match"
    if problem is None:
        try:
            return jax.export.deserialize(bytearray(body))
        except Exception as err:  # checksum good, yet unreadable (another serialisation): struct.error, flatbuffers' errors
            problem = f"{type(err).__name__}: {err}"
    warnings.warn(f"the stored program {str(path)!r} is damaged ({problem}); compiling it again and replacing it", stacklevel=3)
    with contextlib.suppress(OSError):
        path.unlink()
    return None


def _store(path: Path, data: bytes) -> None:
    """Write a program to ``path`` in one step, after :data:`_MAGIC` and the SHA-256 of ``data`` (checked by
    :func:`_load`); a folder or disk that refuses it leaves the program unstored, with one warning."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(_MAGIC + hashlib.sha256(data).digest() + data)
        partial.replace(path)
    except OSError as err:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        warnings.warn(f"the compiled program could not be stored in {str(path.parent)!r} (from {_cache_source()}: "
                      f"{err.strerror or err}); it is compiled again in the next run", stacklevel=3)


#: Keys that change only the values the compiled theory programs receive, not the programs:
#: theory points that differ in them alone have arrays of the same shapes (``sgd.tau_max``
#: changes the saved times, not their number), share their compilations (:func:`compile_group`)
#: and, batched, are solved together (:func:`~singleloc.sweeps._sweep_compute.compute_points`).
VALUE_KEYS = {"problem": ("strength",), "sgd": ("lr", "init_scale", "tau_max"), "simulation": ("seed", "D"),
              "theory": ("qmc_seed", "rtol", "atol")}

#: The kinds whose compiled programs depend on the arrays' shapes and static values only, not on
#: the :data:`VALUE_KEYS` (traced); the simulator's programs hold the configuration's values.
SHAPE_KINDS = ("prediction", "theory")


def compile_group(kind: str, config: Mapping[str, Mapping[str, Any]]) -> str:
    """The compiled programs a sweep point needs, as a hashable name: ``kind`` and ``config`` without
    :data:`VALUE_KEYS` for a kind in :data:`SHAPE_KINDS`, the whole ``config`` otherwise (a ``group`` for
    :func:`~singleloc.runtime._distributed.run_points`)."""
    drop = VALUE_KEYS if kind in SHAPE_KINDS else {}
    rest = {s: {k: v for k, v in sec.items() if k not in drop.get(s, ())} for s, sec in config.items()}
    return json.dumps([kind, rest], sort_keys=True)

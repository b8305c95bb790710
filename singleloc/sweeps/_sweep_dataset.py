"""A sweep as labelled arrays: ``DIR/sweep.nc``, an :class:`xarray.Dataset` written by ``singleloc sweep`` beside
``sweep.csv`` and read back by :func:`load_sweep`.

Dimensions.

* One per grid key, in the order of the grids, named by the key with its dot replaced by an
  underscore (``model.heads`` -> ``model_heads``, ``problem.F`` -> ``problem_F``), so that it is
  a Python name (``ds.sel(model_heads=2)``). Its coordinate holds the grid values (numbers, or
  strings; a list value such as ``problem.mean=[1,0]`` and a grid mixing kinds of values, as
  ``theory.points=auto,64``, hold their text: ``"[1, 0]"``, ``"auto"``, ``"64"``) and the
  attribute ``grid_key`` (``"model.heads"``).
* ``seed``: the ``simulation.seeds`` runs of a point (from the simulator's initial overlaps).
* ``step``: the index of a saved time. The points of a sweep are integrated to different
  horizons (``--horizon auto``: each to its predicted horizon, on a log grid of the same length),
  so time is not one coordinate of the sweep: ``tau`` is a coordinate over
  ``(grid..., step)``, ``tau[..., k]`` the ``k``-th saved time of that point. Once a point (or a
  set of points with one horizon) is selected, ``tau`` is one-dimensional and
  ``plot.line(x="tau")`` draws against it; over several points
  ``plot.line(x="tau", hue=GRID_DIM)`` draws each against its own times.
* ``sim_step`` (with ``--simulate``): the same for the simulation, whose saved times are the
  theory's rounded to whole SGD steps (duplicates removed, so there may be fewer): coordinate
  ``sim_tau`` over ``(grid..., sim_step)``.
* ``head``, ``other_head`` (``h``, ``h'`` of ``Q``) and ``direction`` (the spike directions ``f``
  of ``M``).

Variables. The theory's ``M (grid..., seed, step, head, direction)``, ``Q (grid..., seed, step, head, other_head)``, ``b
(grid..., seed, step, head)`` and ``risk (grid..., seed, step)`` (the limit risk), as in
:class:`~singleloc.TheoryResult`; with ``--simulate`` the simulation's ``sim_M``, ``sim_Q``, ``sim_b``, ``sim_risk``
(the empirical finite-D risk) and ``sim_risk_limit`` over ``sim_step``, as in :class:`~singleloc.SimulationResult`. The
values are those of the cache entries, unchanged. Per point, over the grid dimensions only: every column of
``sweep.csv`` other than the grid values, each with its ``description`` (:data:`COLUMNS`); ``heads_needed``, a summary
over the heads, is over the other grid dimensions only (no ``model_heads``). Attributes: ``config`` (the base
configuration as JSON), ``grids`` (``{key: [values]}`` as JSON) and ``singleloc_version``.

Integrity. HDF5 checks neither the data nor the metadata of a file (one flipped bit changes a value silently, or makes
the library fail or even loop), so the file ends with a trailer of :data:`TRAILER_SIZE` bytes after the HDF5 data,
``\nsingleloc-sweep-sha256:<hex>\n``, the SHA-256 of everything before it (HDF5 readers ignore bytes past the end of
their data). :func:`load_sweep` checks it before the file is parsed, and refuses a file without it (another netCDF or
HDF5 file, or one rewritten by another tool) or whose bytes no longer match it.

Padding. Points with fewer heads, directions, seeds or saved times than the largest of the sweep fill the leading part
of each axis and are padded with NaN (``tau`` too); a failed point's arrays are NaN throughout and its ``status`` says
what failed. Reductions such as ``.mean("seed")`` skip NaN, so the padding does not enter them.

NetCDF-4 (``h5netcdf``, floats compressed losslessly) rather than zarr: one self-describing file, replaced in one step
(:func:`singleloc.ground._atomic_files.atomic_write`) and readable by any netCDF or HDF5 tool.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr

from .._version import __version__
from ..analysis._head_classes import HEAD_CLASSES
from ..configuration._config import Config
from ..ground._atomic_files import atomic_write

if TYPE_CHECKING:
    from ._grid import Grid

#: The file of a sweep in its output folder.
SWEEP_FILE = "sweep.nc"

#: The engine xarray writes and reads the file with.
ENGINE = "h5netcdf"

#: The trailer that ends a sweep file: this prefix, the SHA-256 (hex) of the bytes before it, a newline.
TRAILER_PREFIX = b"\nsingleloc-sweep-sha256:"
TRAILER_SIZE = len(TRAILER_PREFIX) + 64 + 1

#: The attributes every sweep file holds.
ATTRS = ("config", "grids", "singleloc_version")

#: The dimensions of the arrays of a cache entry (the theory's; the simulation's use ``sim_step``).
ENTRY_DIMS = {"tau": ("step",), "M": ("seed", "step", "head", "direction"), "Q": ("seed", "step", "head", "other_head"),
              "b": ("seed", "step", "head"), "risk": ("seed", "step"), "risk_limit": ("seed", "step"),
              "v": ("seed", "step", "head")}

#: The variable prefix of each kind of entry.
PREFIX = {"theory": "", "simulation": "sim_"}

#: The ``description`` attribute of each array variable (a ``sim_`` variable without its own: that of its theory twin).
DESCRIPTIONS = {"tau": "saved times of the point (NaN past its last)", "M": "overlaps M[h, f] of head h with spike direction f",
                "Q": "overlaps Q[h, h'] of the heads", "b": "bias b[h] of head h", "risk": "limit risk of the theory",
                "v": "trained head weight v[h] of a_l = sum_h v_h A_hl (model.head_weights = 'trained'; NaN for the average)",
                "sim_risk": "empirical finite-D risk of the simulation", "sim_risk_limit": "limit risk of the simulated weights"}


#: What every column of ``sweep.csv`` holds (the ``description`` attribute of its variable in
#: ``sweep.nc``; a ``sim_`` column is its theory twin's for the simulation); docs/commands/sweep.md
#: lists the same. Times are in ``tau = t/D``; risks are limit risks (``D -> infinity``).
COLUMNS = {
    "activation": "model.activation of the point", "heads": "model.heads (H) of the point",
    "F": "problem.F, the number of spikes", "status": "ok; not yet (predicted escape at tau = X): some seed has not "
    "escaped by the horizon; or what failed",
    "horizon": "tau the point was integrated to", "lambda": "predicted escape rate of the unspecialized plateau "
    "(linearisation along the head-symmetric flow)", "tau_plateau": "predicted time the symmetric flow reaches its plateau",
    "predicted_escape": "tau_plateau + log(D) / (2 lambda): predicted escape from the plateau (inf: none predicted)",
    "final_risk": "risk at the last saved time, mean over seeds", "escaped": "fraction of seeds with a head in a learned "
    "class (aligned, leaning, combination) at the last saved time",
    "escape_time": "halfway time of the risk's drop from the last plateau before first_learned (NaN: no plateau found)",
    "first_learned": "first saved time from which some head stays in a learned class: the measured escape, the "
    "quantity predicted_escape predicts", "first_specialization": "first saved time at which some head is aligned "
    "with a spike", **{f"n_{c}": f"heads classified {c} at the last saved time, mean over seeds" for c in HEAD_CLASSES},
    "leaning_angle_spike": "mean angle of the leaning heads to their spike (degrees)",
    "leaning_angle_mean": "mean angle of the leaning heads to the mean direction (degrees)",
    "n_directions": "spike directions with a specialized head", "shared_profiles": "pairs of heads with the same spike "
    "profile", "settled": "fraction of seeds settled at the horizon: over its last 20% the risk moved at most 1e-3 "
    "relative and no head changed class (docs/phases.md)", "risk_change": "largest relative change of a seed's risk over "
    "the last 20% of the horizon", "bayes_risk": "Bayes risk of the point's problem (the best any estimator can do)",
    "bayes_risk_error": "error of bayes_risk (exact route, taken wherever it exists whatever theory.route: against a "
    "finer rule; else standard error over scramblings)",
    "final_risk_error": "stated error of final_risk: the exact route's risk_error or the standard error over "
    "theory.replicates scramblings, the larger (NaN: not stated, the rule route with one replicate)",
    "gap_to_bayes": "final_risk - bayes_risk", "gap_to_bayes_error": "error of gap_to_bayes: final_risk_error and "
    "bayes_risk_error in quadrature", "heads_needed": "fewest model.heads of the sweep, for this activation, F "
    "and other grid values, whose gap_to_bayes is at most gap_tol (NaN: none)",
    "heads_needed_low": "heads_needed with every gap_to_bayes lowered by its error (differs from heads_needed_high: "
    "the count is within error)", "heads_needed_high": "heads_needed with every gap_to_bayes raised by its error",
    "gap_tol": "the largest gap_to_bayes that counts as reaching the Bayes risk (singleloc sweep --gap)",
    "route": "the theory's quadrature route: exact, rule or montecarlo",
    "gram_route": "the lr^2 Gram term's route: exact, sobol or montecarlo",
    "risk_error": "stated error of the risk (largest at start and end): against a finer rule (exact route), or against "
    "independent scramblings (rule, Monte Carlo)",
    "exact_drift_error": "exact route: relative error of the O(lr) drift against a finer rule (NaN: below 1e-5, "
    "not computed)", "gram_error": "relative error of the lr^2 Gram term", "drift_error": "rule and Monte Carlo routes: "
    "estimated relative drift error (largest at start and end, against independent scramblings)",
    "points": "Sobol points of the rule "
    "(exact route: of the Gram term)", "key": "cache key of the point's theory entry",
}


def describe_column(name: str) -> str:
    """The description of a column of ``sweep.csv`` (:data:`COLUMNS`; a ``sim_`` column's is its
    theory twin's, for the simulation; a grid key's says so)."""
    if name in COLUMNS:
        return COLUMNS[name]
    if name.startswith("sim_") and name[4:] in COLUMNS:
        return f"simulation: {COLUMNS[name[4:]]}" + (" (of its limit risk)" if "risk" in name else "")
    return "grid value" if "." in name else ""


#: Columns that do not vary over ``model.heads`` (a summary over the heads): in ``sweep.nc`` over the
#: other grid dimensions only.
OVER_HEADS = ("heads_needed", "heads_needed_low", "heads_needed_high")


def _coordinate(values: Sequence[Any]) -> np.ndarray:
    """Grid values as a coordinate: numbers, booleans or strings as they are; otherwise their text."""
    kinds = {str if isinstance(v, str) else bool if isinstance(v, bool) else float if isinstance(v, (int, float)) else None
             for v in values}
    if len(kinds) == 1 and None not in kinds:
        return np.asarray(values)
    return np.array([v if isinstance(v, str) else json.dumps(v) for v in values])


def _padded(arrays: Sequence[np.ndarray | None], grid_shape: tuple[int, ...], index: Sequence[tuple[int, ...]],
            shape: tuple[int, ...]) -> np.ndarray:
    """The arrays of the points stacked over the grid, each in the leading part of ``shape``, NaN elsewhere."""
    present = [a for a in arrays if a is not None]
    out = np.full(grid_shape + shape, np.nan, dtype=np.result_type(*present) if present else np.float64)
    for i, a in zip(index, arrays):
        if a is not None:
            out[i][tuple(slice(0, n) for n in a.shape)] = a
    return out


def sweep_dataset(base: Config, grids: Sequence[Grid], rows: Sequence[Mapping[str, Any]],
                  entries: Sequence[Mapping[str, Mapping[str, np.ndarray]]]) -> xr.Dataset:
    """The Dataset of a sweep (module docstring): ``grids`` its grids, ``rows`` the rows of
    ``sweep.csv`` (one per point, any order), ``entries[i]`` the cache entries of the point of
    ``rows[i]`` (kind -> arrays; a failed kind is absent)."""
    dims = [g.name.replace(".", "_") for g in grids]  # the dimension of a grid key (module docstring)
    grid_shape = tuple(len(g.values) for g in grids)
    index = [tuple(g.values.index(r[g.name]) for g in grids) for r in rows]
    if sorted(index) != sorted(np.ndindex(grid_shape)):
        raise ValueError(f"the rows do not cover the grid {', '.join(g.name for g in grids)} once each")
    kinds = ["theory"] + (["simulation"] if "sim_final_risk" in rows[0] else [])
    present = [e[k] for e in entries for k in kinds if k in e]
    sizes = {"seed": max((a["M"].shape[0] for a in present), default=0), "head": max(r["heads"] for r in rows),
             "direction": max(r["F"] for r in rows)}
    sizes["other_head"] = sizes["head"]
    data_vars, coords = {}, {}
    for kind in kinds:
        prefix = PREFIX[kind]
        step = prefix + "step"
        sizes[step] = max((e[kind]["tau"].shape[0] for e in entries if kind in e), default=0)
        for name, entry_dims in ENTRY_DIMS.items():
            if name == "risk_limit" and kind == "theory":
                continue
            if name == "v" and not any(kind in e and "v" in e[kind] for e in entries):
                continue  # no point trains its head weights
            vdims = tuple(step if d == "step" else d for d in entry_dims)
            array = _padded([e[kind].get(name) if kind in e else None for e in entries], grid_shape, index,
                            tuple(sizes[d] for d in vdims))
            attrs = {"description": DESCRIPTIONS.get(prefix + name) or DESCRIPTIONS[name]}
            (coords if name == "tau" else data_vars)[prefix + name] = xr.Variable((*dims, *vdims), array, attrs)
    grid_names = {g.name for g in grids}
    for column in rows[0]:
        if column not in grid_names:
            keep = [k for k, g in enumerate(grids) if not (column in OVER_HEADS and g.name == "model.heads")]
            values = np.empty(tuple(grid_shape[k] for k in keep), dtype=np.asarray([r[column] for r in rows]).dtype)
            for i, r in zip(index, rows):
                values[tuple(i[k] for k in keep)] = r[column]
            data_vars[column] = xr.Variable([dims[k] for k in keep], values, {"description": describe_column(column)})
    for d, g in zip(dims, grids):
        coords[d] = xr.Variable((d,), _coordinate(g.values), {"grid_key": g.name})
    coords.update({d: np.arange(n) for d, n in sizes.items()})
    return xr.Dataset(data_vars, coords, {"config": json.dumps(base.to_dict(), sort_keys=True),
                                          "grids": json.dumps({g.name: list(g.values) for g in grids}),
                                          "singleloc_version": __version__})


def _trailer(data: bytes) -> bytes:
    return TRAILER_PREFIX + hashlib.sha256(data).hexdigest().encode() + b"\n"


def _write_with_trailer(ds: xr.Dataset, encoding: dict, fh) -> None:
    # HDF5 writes into memory and the file gets the finished bytes: a full disk is one OSError of a plain
    # write (HDF5 writing to the file failed in 170 lines of tracebacks and a segmentation fault)
    buffer = io.BytesIO()
    ds.to_netcdf(buffer, engine=ENGINE, encoding=encoding)
    data = buffer.getvalue()
    fh.write(data)
    fh.write(_trailer(data))


def write_sweep(out: str | Path, base: Config, grids: Sequence[Grid], rows: Sequence[Mapping[str, Any]],
                entries: Sequence[Mapping[str, Mapping[str, np.ndarray]]]) -> Path:
    """Write :func:`sweep_dataset` to ``OUT/sweep.nc`` atomically; returns its path."""
    ds = sweep_dataset(base, grids, rows, entries)
    encoding = {name: {"zlib": True} for name, v in ds.variables.items() if v.dtype.kind == "f"}
    return atomic_write(Path(out) / SWEEP_FILE, lambda fh: _write_with_trailer(ds, encoding, fh))


def load_sweep(directory: str | Path) -> xr.Dataset:
    """The Dataset of the sweep whose output folder is ``directory`` (``DIR/sweep.nc``, module docstring),
    loaded into memory. Raises ``FileNotFoundError`` when the folder holds no sweep file and ``ValueError``
    when the file is not readable, not a sweep of singleloc (no trailer) or damaged (its bytes differ from
    its trailer's digest), each in one line naming the path."""
    path = Path(directory) / SWEEP_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no sweep file {path}: {str(directory)!r} is not the output folder of singleloc sweep "
                                "(or it was written before sweeps wrote sweep.nc)")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ValueError(f"{path} cannot be read ({err.strerror or err})") from None
    body, trailer = data[:-TRAILER_SIZE], data[-TRAILER_SIZE:]
    if len(data) < TRAILER_SIZE or not trailer.startswith(TRAILER_PREFIX):
        if not data.startswith(b"\x89HDF\r\n\x1a\n"):
            raise ValueError(f"{path} is not a readable netCDF file (no HDF5 signature)")
        raise ValueError(f"{path} is not a sweep written by singleloc sweep (no singleloc trailer at its end: a truncated "
                         "sweep, another netCDF or HDF5 file, one rewritten by another tool, or a sweep written before sweeps "
                         "carried one): run the sweep again (its cache makes that quick)")
    if trailer != _trailer(body):
        raise ValueError(f"{path} is damaged: its bytes do not match the SHA-256 of its trailer (a changed or missing byte); "
                         "run the sweep again (its cache makes that quick)")
    message = None
    with _quiet_finalisers():
        try:
            with xr.open_dataset(io.BytesIO(body), engine=ENGINE) as ds:  # the bytes just checked
                ds = ds.load()
        except Exception as err:  # h5py and xarray raise OSError, ValueError, KeyError, TypeError... on a damaged file
            message = f"{path} is not a readable netCDF file ({type(err).__name__}: {' '.join(str(err).split())})"
            del err
            gc.collect()
    if message is not None:
        raise ValueError(message)
    if not all(key in ds.attrs for key in ATTRS):
        raise ValueError(f"{path} is not a sweep written by singleloc sweep (no {', '.join(ATTRS)} attributes)")
    return ds


@contextlib.contextmanager
def _quiet_finalisers():
    """Within the block, the "Exception ignored" tracebacks of finalisers are dropped: a failed
    open leaves half-opened file objects whose finaliser fails (h5netcdf's ``File.close`` of a
    file it never finished opening), which would print a traceback beside the one-line error."""
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: None
    try:
        yield
    finally:
        sys.unraisablehook = hook

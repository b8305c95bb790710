"""The sweep as labelled arrays: ``DIR/sweep.nc`` round-tripped against the cache entries and ``sweep.csv``."""

from __future__ import annotations

import itertools
import json
import math

import matplotlib
import numpy as np
import pytest
from _tiny import canned_theory, tiny
from helpers import fake_bayes, fake_prediction, read_csv

from singleloc import load_config, load_sweep
from singleloc._version import __version__
from singleloc.io._run_folders import load_npz
from singleloc.sweeps import _sweep, _sweep_compute, _sweep_entries
from singleloc.sweeps._grid import grid_points, parse_grid
from singleloc.sweeps._sweep_dataset import ENTRY_DIMS, SWEEP_FILE, sweep_dataset

matplotlib.use("Agg")

#: ``%.6g`` in the CSV: a relative rounding error of at most half a unit in the sixth digit.
CSV_RTOL = 5e-6


def _expected(entry: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``entry`` in the leading part of ``shape``, NaN elsewhere (the padding of the Dataset)."""
    out = np.full(shape, np.nan, dtype=entry.dtype)
    out[tuple(slice(0, n) for n in entry.shape)] = entry
    return out


def test_sweep_file_round_trips_the_cache_and_the_csv(tmp_path, monkeypatch):
    """Heads = 1, 2 and two horizons (four tau grids), one point whose theory and simulation fail, canned theories
    (a TheoryResult of each point's shapes, as the solve returns it) and a stand-in simulation in float32
    on fewer saved times: every array of the file equals its cache entry, every summary its CSV cell.
    Its subject is the files: no solve runs (each point's shape would compile its own)."""

    def failing(config, kind):
        if config.model.heads == 2 and config.sgd.tau_max == 1.0:
            raise FloatingPointError(f"the {kind} left the valid set at tau = 0.5; details")

    def simulation(config):
        failing(config, "simulation")
        S, H, F = config.simulation.seeds, config.model.heads, config.problem.F
        tau = np.unique(np.round(config.sgd.save_times()))
        ramp = np.linspace(0.1, 1.0, tau.size * H * F).reshape(tau.size, H, F)
        M = np.stack([ramp * (s + 1) for s in range(S)]).astype(np.float32)
        risk = np.tile(np.linspace(0.8, 0.3, tau.size), (S, 1)).astype(np.float32)
        return {"tau": tau, "M": M, "Q": M @ np.swapaxes(M, -1, -2) + np.eye(H, dtype=np.float32),
                "b": np.zeros((S, tau.size, H), np.float32), "risk": risk, "risk_limit": risk - np.float32(0.01)}

    def theory(config):
        failing(config, "theory")
        return _sweep_compute._theory_arrays(canned_theory(config, starts=config.simulation.seeds))

    monkeypatch.setattr(_sweep_compute, "compute_prediction", fake_prediction)
    monkeypatch.setattr(_sweep_compute, "compute_simulation", simulation)
    monkeypatch.setattr(_sweep_compute, "compute_theory", theory)
    monkeypatch.setattr(_sweep_compute, "compute_theories", lambda configs: [theory(c) for c in configs])
    monkeypatch.setattr(_sweep_compute, "compute_bayes", fake_bayes)
    monkeypatch.setattr(_sweep, "classifying_weights", lambda setup, M, Q, b: np.ones(np.shape(b)))  # softmax's exactly
    base = tiny("problem.F=2", "theory.points=16", "sgd.n_save=5", "simulation.D=1000", "simulation.test_samples=4096")
    grids = [parse_grid("model.heads=1,2"), parse_grid("sgd.tau_max=1.0,2.0")]
    out = tmp_path / "out"
    rows, stats = _sweep.sweep(base, grids, out, horizon="config", simulate=True, progress=False, figures=False,
                               batch=False)  # the failing point alone
    assert stats.failed == 1
    assert sorted(p.name for p in out.iterdir()) == ["cache", "sweep.csv", SWEEP_FILE]  # no temporary file left

    ds = load_sweep(out)
    assert ds.model_heads.values.tolist() == [1, 2] and ds.sgd_tau_max.values.tolist() == [1.0, 2.0]
    assert ds.model_heads.attrs["grid_key"] == "model.heads" and ds.sgd_tau_max.attrs["grid_key"] == "sgd.tau_max"
    assert json.loads(ds.attrs["config"]) == base.to_dict() and ds.attrs["singleloc_version"] == __version__
    assert json.loads(ds.attrs["grids"]) == {"model.heads": [1, 2], "sgd.tau_max": [1.0, 2.0]}
    assert (ds.sizes["seed"], ds.sizes["head"], ds.sizes["other_head"], ds.sizes["direction"]) == (2, 2, 2, 2)
    assert ds.sizes["sim_step"] < ds.sizes["step"] == 5
    assert ds.sim_risk.attrs["description"].startswith("empirical") and ds.risk.attrs["description"].startswith("limit")

    table = read_csv(out / "sweep.csv")
    cache = out / "cache"
    for row, csv_row, (values, config) in zip(rows, table, grid_points(base, grids)):
        point = ds.sel(model_heads=values["model.heads"], sgd_tau_max=values["sgd.tau_max"])
        failed = values == {"model.heads": 2, "sgd.tau_max": 1.0}
        assert row["key"] == _sweep_entries.cache_key(config, "theory")  # the run's, failed or not
        for kind, prefix in (("theory", ""), ("simulation", "sim_")):
            path = cache / f"{kind}-{_sweep_entries.cache_key(config, kind)}.npz"
            assert path.is_file() != failed
            entry = load_npz(path) if path.is_file() else None
            for name, dims in ENTRY_DIMS.items():
                if name == "risk_limit" and kind == "theory":
                    continue
                if name == "v":  # no point trains its head weights: no such variable
                    assert prefix + name not in ds
                    continue
                got = point[prefix + name]
                assert got.dims == tuple(prefix + d if d == "step" else d for d in dims)
                if entry is None:
                    assert np.isnan(got.values).all()
                else:
                    assert got.dtype == entry[name].dtype
                    np.testing.assert_array_equal(got.values, _expected(entry[name], got.shape))  # exact, NaN padding
        assert point.tau.size == ds.sizes["step"] and (failed or point.tau.values[-1] == values["sgd.tau_max"])
        for column, value in row.items():
            if column in values:
                continue
            got = point[column].item()
            assert got == value or (math.isnan(got) and math.isnan(value)), column
            cell = csv_row[column]
            if isinstance(value, float):
                assert float(cell) == pytest.approx(value, rel=CSV_RTOL, nan_ok=True), column
            else:
                assert cell == str(value), column
        assert (point.status.item() == "theory failed: the theory left the valid set at tau = 0.5; simulation failed: the "
                "simulation left the valid set at tau = 0.5") == failed

    # the example of docs/commands/sweep.md: one regime against its own times
    line = ds.risk.sel(model_heads=2, sgd_tau_max=2.0).mean("seed").plot.line(x="tau", xscale="log")
    assert np.array_equal(line[0].get_xdata(), ds.tau.sel(model_heads=2, sgd_tau_max=2.0).values)
    matplotlib.pyplot.close("all")


def test_padding_text_coordinates_and_a_failed_prediction():
    """Points with F = 1 and 2 under a list-valued grid: M padded over ``direction``; a point whose
    prediction failed has no entries, NaN arrays and its status."""
    grids = [parse_grid("problem.mean=[1.0],[1.0, 0.0]"), parse_grid("problem.F=1,2")]
    base = load_config("default")
    rows, entries = [], []
    # the points' values only (problem.mean with the spikes prior is refused as a config: its mean is not read)
    for values in (dict(zip(("problem.mean", "problem.F"), combo)) for combo in itertools.product(*(g.values for g in grids))):
        F = values["problem.F"]
        failed = F == 2 and values["problem.mean"] == [1.0, 0.0]
        rows.append({**values, "heads": 2, "F": F, "status": "prediction failed: X" if failed else "ok",
                     "final_risk": math.nan if failed else 0.1 * F})
        M = np.arange(3 * 2 * F, dtype=float).reshape(1, 3, 2, F)
        entries.append({} if failed else {"theory": {"tau": np.array([0.0, 1.0, 2.0]), "M": M, "Q": np.zeros((1, 3, 2, 2)),
                                                     "b": np.zeros((1, 3, 2)), "risk": np.ones((1, 3))}})
    ds = sweep_dataset(base, grids, rows[::-1], entries[::-1])  # any order of the points
    assert ds.problem_mean.values.tolist() == ["[1.0]", "[1.0, 0.0]"]
    assert ds.M.dims == ("problem_mean", "problem_F", "seed", "step", "head", "direction")
    assert ds.M.shape == (2, 2, 1, 3, 2, 2)
    one = ds.M.sel(problem_mean="[1.0]", problem_F=1).values
    np.testing.assert_array_equal(one, _expected(entries[0]["theory"]["M"], one.shape))
    bad = ds.sel(problem_mean="[1.0, 0.0]", problem_F=2)
    assert np.isnan(bad.M.values).all() and np.isnan(bad.tau.values).all() and bad.status.item() == "prediction failed: X"
    assert ds.final_risk.values.tolist()[0] == [0.1, 0.2] and ds.F.values.tolist() == [[1, 2], [1, 2]]
    with pytest.raises(ValueError, match="do not cover the grid"):
        sweep_dataset(base, grids, rows[:3], entries[:3])


def test_load_sweep_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no sweep file {tmp_path / SWEEP_FILE}"):
        load_sweep(tmp_path)
    (tmp_path / SWEEP_FILE).write_bytes(b"not a netCDF file")
    with pytest.raises(ValueError, match=f"{tmp_path / SWEEP_FILE} is not a readable netCDF file"):
        load_sweep(tmp_path)


def _small_sweep(out):
    """A sweep file written as `singleloc sweep` writes it (from stand-in rows and entries; no ODE)."""
    from singleloc.sweeps._sweep_dataset import write_sweep

    grids = [parse_grid("model.heads=1,2")]
    base = load_config("default")
    rows = [{"model.heads": h, "heads": h, "F": 2, "status": "ok", "escaped": h == 2, "final_risk": 0.1 * h} for h in (1, 2)]
    entries = [{"theory": {"tau": np.array([0.0, 1.0]), "M": np.full((1, 2, h, 2), 0.5), "Q": np.tile(np.eye(h), (1, 2, 1, 1)),
                           "b": np.zeros((1, 2, h)), "risk": np.ones((1, 2))}} for h in (1, 2)]
    return write_sweep(out, base, grids, rows, entries)


def test_load_sweep_refuses_foreign_and_damaged_files(tmp_path):
    """Issue 21 item 10: load_sweep returned foreign netCDF files as sweeps, one flipped bit changed ``heads``
    from 1 to 0 without error, and damaged metadata raised h5py's KeyError."""
    import h5py
    import xarray as xr

    path = _small_sweep(tmp_path)
    good = load_sweep(tmp_path)
    assert good.heads.values.tolist() == [1, 2] and good.escaped.values.tolist() == [False, True]
    original = path.read_bytes()
    # a foreign netCDF file, and one that looks like a sweep without the digest
    xr.Dataset({"heads": ("x", np.arange(2))}, attrs={"config": "{}"}).to_netcdf(path, engine="h5netcdf")
    with pytest.raises(ValueError, match=f"{path} is not a sweep written by singleloc sweep"):
        load_sweep(tmp_path)
    # one flipped bit in the heads column: 1 -> 0
    path.write_bytes(original)
    with h5py.File(path, "r") as f:
        offset = f["heads"].id.get_offset()
    data = bytearray(original)
    assert data[offset] == 1
    data[offset] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"{path} is damaged: its bytes do not match the SHA-256 of its trailer"):
        load_sweep(tmp_path)
    # damaged metadata: an attribute removed, or a changed value in one
    for edit in (lambda f: f.attrs.__delitem__("grids"), lambda f: f.attrs.__setitem__("config", "{}")):
        path.write_bytes(original)
        with h5py.File(path, "r+") as f:
            edit(f)
        with pytest.raises(ValueError, match=f"{path} (is not a sweep written by|is damaged)"):
            load_sweep(tmp_path)
    # truncated, or one flipped bit anywhere (in some places of the HDF5 structure it made h5py loop forever):
    # refused before HDF5 parses the file
    path.write_bytes(original[: len(original) // 2])
    with pytest.raises(ValueError, match=f"{path} is not a sweep written by singleloc sweep .*a truncated sweep"):
        load_sweep(tmp_path)
    for offset in (1899, 0, len(original) - 1):
        data = bytearray(original)
        data[offset] ^= 0x10
        path.write_bytes(bytes(data))
        with pytest.raises(ValueError, match=f"{path} (is damaged|is not a readable netCDF file|is not a sweep written)"):
            load_sweep(tmp_path)

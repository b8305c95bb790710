"""The benchmarks' shared ``--save`` helper (``benchmarks/_common.py``): valid JSON, written atomically.

The benchmarks themselves are not run here (they take minutes); only the helper they all use.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def common():
    spec = importlib.util.spec_from_file_location("benchmarks_common", ROOT / "benchmarks" / "_common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_write_json_round_trip(common, tmp_path):
    path = tmp_path / "new" / "folder" / "r.json"
    data = {"rate": np.float64(3.5), "n": np.int64(4), "rows": (1, 2.0), "table": np.arange(3), "bad": float("nan"),
            "where": tmp_path}
    assert common.write_json(path, data) == path
    assert json.loads(path.read_text()) == {"rate": 3.5, "n": 4, "rows": [1, 2.0], "table": [0, 1, 2], "bad": None,
                                            "where": str(tmp_path)}
    assert os.listdir(path.parent) == ["r.json"]  # no temporary file left


def test_unserialisable_value_leaves_the_old_file(common, tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"old": 1}\n')
    with pytest.raises(TypeError):
        common.write_json(path, {"a": 1, "b": object()})
    assert path.read_text() == '{"old": 1}\n'
    assert os.listdir(tmp_path) == ["r.json"]


class _FullDisk:
    """A file that takes half of what is written to it, then fails as a full disk does."""

    def __init__(self, fh):
        self.fh = fh

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()

    def write(self, data):
        self.fh.write(data[: len(data) // 2])
        self.fh.flush()
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("fails", ["write", "replace"])
def test_failing_write_leaves_no_partial_file(common, tmp_path, monkeypatch, fails):
    """A write that fails half-way (a full disk) or at the final rename leaves neither the new file
    nor a temporary one, and an existing file as it was."""
    if fails == "write":
        fdopen = os.fdopen
        monkeypatch.setattr(os, "fdopen", lambda *args, **kwargs: _FullDisk(fdopen(*args, **kwargs)))
    else:
        def replace(*args, **kwargs):
            raise OSError(errno.EXDEV, "rename failed")

        monkeypatch.setattr(os, "replace", replace)
    fresh = tmp_path / "fresh.json"
    with pytest.raises(OSError):
        common.write_json(fresh, {"x": list(range(1000))})
    assert not fresh.exists()
    assert os.listdir(tmp_path) == []
    old = tmp_path / "old.json"
    old.write_text('{"old": 1}\n')
    with pytest.raises(OSError):
        common.write_json(old, {"x": list(range(1000))})
    assert old.read_text() == '{"old": 1}\n'
    assert os.listdir(tmp_path) == ["old.json"]


def test_save_writes_the_record(common, tmp_path, monkeypatch, capsys):
    parser = common.add_save_option(argparse.ArgumentParser())
    parser.add_argument("--seconds", type=float, default=1.0)
    assert common.save(parser.parse_args([]), "benchmarks/99_x.py", {"a": 1}) is None  # no --save: nothing written
    assert os.listdir(tmp_path) == []
    path = tmp_path / "r.json"
    monkeypatch.setattr(common.sys, "argv", ["benchmarks/99_x.py", "--seconds", "2", "--save", str(path)])
    args = parser.parse_args()
    assert common.save(args, "benchmarks/99_x.py", {"rate": np.float64(2.5)}) == path
    assert str(path) in capsys.readouterr().out
    saved = json.loads(path.read_text())
    assert saved["benchmark"] == "99_x"
    assert saved["results"] == {"rate": 2.5}
    assert saved["options"] == {"seconds": 2.0}  # --save itself is not an option of the measurement
    assert saved["command"].startswith("python benchmarks/99_x.py --seconds 2 --save ")
    assert saved["date"][:2] == "20" and saved["date"].endswith("+00:00")
    machine = saved["machine"]
    for key in ("platform", "cpu_count", "jax", "device_kind", "backend", "python"):
        assert machine[key], key
    assert machine["cpu_count"] == os.cpu_count()

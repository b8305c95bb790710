"""The benchmarks' shared ``--save`` helper (``benchmarks/_common.py``): valid JSON, written atomically.

The benchmarks themselves are not run here (they take minutes); only the helper they all use.
"""

from __future__ import annotations

import argparse
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
    assert path.stat().st_mode & 0o777 == 0o644


def test_unserialisable_value_leaves_the_old_file(common, tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"old": 1}\n')
    with pytest.raises(TypeError):
        common.write_json(path, {"a": 1, "b": object()})
    assert path.read_text() == '{"old": 1}\n'
    assert os.listdir(tmp_path) == ["r.json"]


@pytest.mark.parametrize("fails", ["fsync", "replace"])
def test_failing_write_leaves_no_partial_file(common, tmp_path, monkeypatch, fails):
    """A write that fails after the text reached the disk (fsync, the final rename) leaves neither
    the new file nor a temporary one, and an existing file as it was."""
    def boom(*args, **kwargs):
        raise OSError(f"{fails} failed")

    monkeypatch.setattr(common.os, fails, boom)
    fresh = tmp_path / "fresh.json"
    with pytest.raises(OSError, match=fails):
        common.write_json(fresh, {"x": list(range(1000))})
    assert not fresh.exists()
    assert os.listdir(tmp_path) == []
    old = tmp_path / "old.json"
    old.write_text('{"old": 1}\n')
    with pytest.raises(OSError, match=fails):
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

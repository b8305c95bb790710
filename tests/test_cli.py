"""The command line layer: start-up without the numerical libraries, one-line errors, ``--out``,
and run folders read back by :func:`singleloc._io.load_run`."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import singleloc
from singleloc import load_config
from singleloc._commands import COMMANDS
from singleloc._io import load_run, save_config, save_npz
from singleloc.cli import build_parser, main

HEAVY = ("jax", "diffrax", "equinox", "scipy", "matplotlib", "tqdm")
COMMAND_NAMES = [c.__name__.rsplit(".", 1)[-1] for c in COMMANDS]


def modules_after(argv: list[str]) -> list[str]:
    """The heavy modules loaded by ``python -m singleloc ARGV`` (run in a fresh interpreter)."""
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['singleloc', *{argv!r}]\n"
        "try:\n    runpy.run_module('singleloc', run_name='__main__')\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        f"print('loaded:', *(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    return out.strip().splitlines()[-1].split()[1:]


@pytest.mark.parametrize("argv", [["--help"], ["--version"], *[[c, "--help"] for c in COMMAND_NAMES]])
def test_help_imports_no_numerical_library(argv):
    assert modules_after(argv) == []


def test_version_is_the_installed_distribution(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"singleloc {version('singleloc')}" == f"singleloc {singleloc.__version__}"


@pytest.mark.parametrize("argv, words", [
    (["nope"], "invalid choice: 'nope'"),
    (["simulate", "default"], "the following arguments are required: --out"),
    (["prune", "x", "--order", "biggest"], "argument --order: invalid choice: 'biggest'"),
    (["prune", "x", "--source", "both"], "argument --source: invalid choice"),
    (["prune", "x", "--draws", "0"], "argument --draws: expected an integer >= 1, got '0'"),
    (["bayes", "default", "--replicates", "1"], "argument --replicates: expected an integer >= 2"),
    (["diagnose", "a.npy", "--max-rows", "-1"], "argument --max-rows: expected an integer >= 0"),
])
def test_usage_errors_are_one_line(capsys, argv, words):
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith("singleloc") and ": error: " in lines[0]
    assert words in lines[0] and "--help" in lines[0]


WRITERS = {"simulate": ["default"], "integrate": ["default"], "compare": ["default"],
           "sweep": ["default", "--grid", "model.heads=1"], "diagnose": ["a.npy"], "prune": ["run"]}


def test_every_command_that_writes_takes_out():
    parsers = build_parser()._subparsers._group_actions[0].choices
    takes_out = {name for name, p in parsers.items() if any(a.dest == "out" for a in p._actions)}
    assert takes_out == set(WRITERS)


@pytest.mark.parametrize("command", sorted(WRITERS))
@pytest.mark.parametrize("bad, words", [("", "expected a folder, got an empty name"), ("FILE", "exists and is not a folder")])
def test_out_is_checked_before_anything_runs(tmp_path, capsys, command, bad, words):
    (tmp_path / "file").write_text("x")
    out = str(tmp_path / "file") if bad == "FILE" else bad
    assert main([command, *WRITERS[command], "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"singleloc {command}: error: argument --out: " in err and words in err


def test_prune_orders_match_the_library():
    from singleloc._commands import prune

    assert prune.ORDERS == singleloc.PRUNING_ORDERS


# --------------------------------------------------------------------------- run folders


@pytest.fixture
def run_dir(tmp_path):
    config = load_config("default", ["model.heads=3"])
    save_config(tmp_path, config)
    save_npz(tmp_path / "theory.npz", {"tau": np.arange(3.0), "M": np.ones((3, 3, 2))})
    return tmp_path, config


def test_load_run_reads_config_and_present_files(run_dir):
    path, config = run_dir
    run = load_run(path)
    assert run.config == config and list(run.data) == ["theory"]
    np.testing.assert_array_equal(run.data["theory"]["M"], np.ones((3, 3, 2)))
    save_npz(path / "simulation.npz", {"tau": np.arange(3.0)})
    assert list(load_run(path).data) == ["theory", "simulation"]
    assert list(load_run(path, ("simulation",)).data) == ["simulation"]


@pytest.mark.parametrize("damage, error, words", [
    (lambda p: p / "missing", FileNotFoundError, "is not a folder"),
    (lambda p: (p / "config.json").unlink() or p, FileNotFoundError, "config.json not found"),
    (lambda p: (p / "config.json").write_text("{") and p, ValueError, "is not valid JSON"),
    (lambda p: (p / "config.json").write_text("[1, 2]") and p, ValueError, "got a JSON list"),
    (lambda p: (p / "config.json").write_text(json.dumps({"model": {"heads": 0}})) and p, ValueError, "model.heads"),
    (lambda p: (p / "theory.npz").unlink() or p, FileNotFoundError, "no theory.npz or simulation.npz"),
    (lambda p: (p / "theory.npz").write_bytes(b"PK\x03\x04 truncated") and p, ValueError, "theory.npz is not a readable .npz"),
])
def test_load_run_errors_name_the_file(run_dir, damage, error, words):
    path = damage(run_dir[0])
    with pytest.raises(error, match=words):
        load_run(path)

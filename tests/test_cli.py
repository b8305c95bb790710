"""The command line layer: start-up without the numerical libraries, one-line usage errors and
``--out`` checked before anything runs (run folders and failures: ``test_io.py``,
``test_robustness.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import singleloc
from singleloc._commands import COMMANDS
from singleloc.cli import build_parser, main

HEAVY = ("jax", "diffrax", "equinox", "scipy", "matplotlib", "tqdm")
COMMAND_NAMES = [c.__name__.rsplit(".", 1)[-1] for c in COMMANDS]


def heavy_modules_after_each(argvs: list[list[str]]) -> dict[str, list[str]]:
    """The heavy modules loaded after each ``python -m singleloc ARGV`` of ``argvs``, run one after
    the other in one fresh interpreter (a module loaded by one stays loaded: the first ARGV that
    loads it is the one that shows it)."""
    code = (
        "import json, runpy, sys\n"
        "loaded = {}\n"
        f"for argv in {argvs!r}:\n"
        "    sys.argv = ['singleloc', *argv]\n"
        "    try:\n        runpy.run_module('singleloc', run_name='__main__')\n"
        "    except SystemExit as e:\n        assert e.code == 0, (argv, e.code)\n"
        f"    loaded[' '.join(argv)] = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_help_imports_no_numerical_library():
    """``--help``, ``--version`` and every command's ``--help`` (one interpreter for all of them)."""
    argvs = [["--help"], ["--version"], *[[c, "--help"] for c in COMMAND_NAMES]]
    loaded = heavy_modules_after_each(argvs)
    assert list(loaded) == [" ".join(a) for a in argvs]
    assert all(modules == [] for modules in loaded.values()), loaded


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
    (["prune", "x", "--draws", "0"], "argument --draws: must be >= 1, got 0"),
    (["bayes", "default", "--replicates", "1"], "argument --replicates: must be >= 2, got 1"),
    (["diagnose", "a.npy", "--max-rows", "-1"], "argument --max-rows: must be >= 0, got -1"),
    (["sweep", "default", "--workers", "two"], "argument --workers: must be an integer, got 'two'"),
])
def test_usage_errors_are_one_line(capsys, argv, words):
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith("singleloc") and ": error: " in lines[0]
    assert words in lines[0] and "--help" in lines[0]


WRITERS = {"simulate": ["default"], "integrate": ["default"], "compare": ["default"],
           "sweep": ["default", "--grid", "model.heads=1"], "diagnose": ["a.npy"], "prune": ["run"], "attention": ["t.txt"],
           "plot": ["run"]}


def test_every_command_that_writes_takes_out():
    parsers = build_parser()._subparsers._group_actions[0].choices
    takes_out = {name for name, p in parsers.items() if any(a.dest == "out" for a in p._actions)}
    assert takes_out == set(WRITERS)


RUN_WRITERS = {"simulate", "integrate", "compare", "prune"}  # --out is a run folder, replaced as a whole


@pytest.mark.parametrize("command", sorted(WRITERS))
@pytest.mark.parametrize("bad, words", [
    ("", "expected a folder, got an empty name"),
    ("TMP/file", "is a regular file, not a folder"),
    ("TMP/file/sub", "is a regular file, not a folder"),
    ("/dev/null", "is a character device, not a folder"),
    ("/sys/singleloc-test", "cannot create files in '/sys'"),
    ("TMP/mine", "it holds notes.txt, which is not part of a singleloc run"),  # run folders only
])
def test_out_is_checked_before_anything_runs(tmp_path, capsys, command, bad, words):
    """Checked while parsing: no JAX, no computation (a few milliseconds)."""
    if bad == "TMP/mine" and command not in RUN_WRITERS:
        pytest.skip("plain output folders may hold other files")
    if bad.startswith("/sys") and not Path("/sys").is_dir():
        pytest.skip("needs /sys")
    (tmp_path / "file").write_text("x")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    assert main([command, *WRITERS[command], "--out", bad.replace("TMP", str(tmp_path))]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"singleloc {command}: error: argument --out: " in err and words in err


def test_debug_is_accepted_before_and_after_the_command():
    parser = build_parser()
    assert parser.parse_args(["--debug", "simulate", "default", "--out", "x"]).debug is True
    assert parser.parse_args(["simulate", "default", "--out", "x", "--debug"]).debug is True
    assert parser.parse_args(["simulate", "default", "--out", "x"]).debug is False


def test_prune_orders_are_the_library_ones():
    choices = {a.dest: a.choices for a in build_parser()._subparsers._group_actions[0].choices["prune"]._actions}
    assert tuple(choices["order"]) == singleloc.PRUNING_ORDERS

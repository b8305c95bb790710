"""Files and run folders: atomic files with the user's permissions, run folders written as one
unit stamped with the config hash, replaced whole (a failure or ``kill -9`` leaves the previous
run intact), and read back only when their files belong together."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _tiny import tiny

from singleloc import Config
from singleloc.configuration._config import config_hash
from singleloc.ground._atomic_files import check_output_folder, check_run_folder, write_folder
from singleloc.io._run_folders import add_to_run, load_run, npz_stamp, save_npz, save_run

CONFIG = tiny("model.heads=3", "problem.F=2")  # the shapes of the messages below
T = 3


def theory_arrays(config=CONFIG, value=1.0):
    H, F = config.model.heads, config.problem.F
    return {"tau": np.arange(T, dtype=float), "M": np.full((T, H, F), value), "Q": np.full((T, H, H), value),
            "b": np.zeros((T, H)), "risk": np.full(T, value)}


def simulation_arrays(config=CONFIG, seeds=2):
    H, F = config.model.heads, config.problem.F
    return {"tau": np.arange(T, dtype=float), "M": np.ones((seeds, T, H, F)), "Q": np.ones((seeds, T, H, H)),
            "b": np.zeros((seeds, T, H)), "risk": np.ones((seeds, T)), "risk_limit": np.ones((seeds, T))}


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name != folder.name)


@pytest.fixture
def run_dir(tmp_path):
    folder = tmp_path / "run"
    save_run(folder, CONFIG, {"theory.npz": theory_arrays()})
    return folder


# ----------------------------------------------------------------------------- the unit


def test_every_file_carries_the_config_hash(run_dir):
    stamp = config_hash(CONFIG)
    assert len(stamp) == 16 and stamp != config_hash(CONFIG.replace(model={"heads": 2}))
    stored = json.loads((run_dir / "config.json").read_text())
    assert stored["config_hash"] == stamp and "singleloc_version" in stored
    assert npz_stamp(run_dir / "theory.npz") == stamp
    with np.load(run_dir / "theory.npz") as d:  # the hash is the zip comment: the arrays are unchanged
        assert sorted(d.files) == sorted(theory_arrays())
    assert Config.from_dict(stored) == CONFIG  # config.json reads back as it is
    run = load_run(run_dir)
    assert run.config == CONFIG and run.config_hash == stamp and list(run.data) == ["theory"]
    np.testing.assert_array_equal(run.data["theory"]["M"], theory_arrays()["M"])


def test_a_new_run_replaces_the_folder_as_a_whole(run_dir):
    other = CONFIG.replace(problem={"L": 8})
    save_run(run_dir, other, {"simulation.npz": simulation_arrays(other)})
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.json", "simulation.npz"]  # no stale theory.npz
    assert load_run(run_dir).config == other
    assert siblings(run_dir) == []  # no temporary folder left


def test_a_run_never_replaces_a_folder_of_the_users_files(tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="notes.txt, which is not part of a singleloc run"):
        save_run(mine, CONFIG, {"theory.npz": theory_arrays()})
    monkeypatch.chdir(mine)
    with pytest.raises(ValueError, match="is or contains the current folder"):
        save_run(".", CONFIG, {"theory.npz": theory_arrays()})
    assert sorted(os.listdir(mine)) == ["notes.txt"] and siblings(mine) == []


def test_a_symbolic_link_to_a_run_keeps_pointing_to_the_new_run(run_dir, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(run_dir)
    save_run(link, CONFIG.replace(problem={"L": 8}), {"theory.npz": theory_arrays()})
    assert link.is_symlink() and load_run(link).config.problem.L == 8 == load_run(run_dir).config.problem.L


def test_add_to_run_keeps_the_run_and_stamps_the_new_files(run_dir):
    before = snapshot(run_dir)
    run = load_run(run_dir)
    add_to_run(run, {"prune.npz": {"n_removed": np.arange(3)}})
    after = snapshot(run_dir)
    assert {k: after[k] for k in before} == before and set(after) == {*before, "prune.npz"}
    assert npz_stamp(run_dir / "prune.npz") == run.config_hash


@pytest.mark.parametrize("damage, error, words", [
    (lambda p: p / "missing", FileNotFoundError, "is not a folder"),
    (lambda p: (p / "config.json").unlink() or p, FileNotFoundError, "config.json not found"),
    (lambda p: (p / "config.json").write_text("{") and p, ValueError, "is not valid JSON"),
    (lambda p: (p / "config.json").write_text("[1, 2]") and p, ValueError, "got a JSON list"),
    (lambda p: (p / "config.json").write_text(json.dumps({"model": {"heads": 0}})) and p, ValueError, "model.heads"),
    (lambda p: (p / "theory.npz").unlink() or p, FileNotFoundError, "no theory.npz or simulation.npz"),
    (lambda p: (p / "theory.npz").write_bytes(b"PK\x03\x04 truncated") and p, ValueError, "theory.npz is not a readable .npz"),
    (lambda p: (p / "theory.npz").write_bytes((p / "theory.npz").read_bytes()[:200]) and p, ValueError, "not a readable"),
])
def test_load_run_errors_name_the_file(run_dir, damage, error, words):
    with pytest.raises(error, match=words):
        load_run(damage(run_dir))


def test_load_run_refuses_files_of_another_run(run_dir, tmp_path):
    """The defect of issue 11: theory.npz of an L = 4 run beside the config of an L = 8 run."""
    other = tmp_path / "other"
    save_run(other, CONFIG.replace(problem={"L": 8}), {"simulation.npz": simulation_arrays()})
    (other / "theory.npz").write_bytes((run_dir / "theory.npz").read_bytes())
    with pytest.raises(ValueError, match=r"theory.npz was made by another config .* mixes files of different runs"):
        load_run(other)


def test_load_run_refuses_an_edited_config(run_dir):
    stored = json.loads((run_dir / "config.json").read_text())
    stored["problem"]["L"] = 8
    (run_dir / "config.json").write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="edited after the run"):
        load_run(run_dir)


def test_load_run_refuses_unstamped_files(run_dir):
    save_npz(run_dir / "theory.npz", theory_arrays())  # written without the hash
    with pytest.raises(ValueError, match="carries no config hash"):
        load_run(run_dir)
    stored = json.loads((run_dir / "config.json").read_text())
    del stored["config_hash"]
    (run_dir / "config.json").write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="config.json carries no config hash"):
        load_run(run_dir)


@pytest.mark.parametrize("key, value, words", [
    ("M", None, "has no array 'M'"),
    ("M", np.ones((T, 2, 2)), r"M has shape \(3, 2, 2\), expected \(T, 3, 2\)"),
    ("risk", np.ones(T + 1), r"risk has shape \(4,\), expected \(T\)"),
])
def test_load_run_refuses_incomplete_or_misshapen_arrays(tmp_path, key, value, words):
    arrays = theory_arrays()
    if value is None:
        del arrays[key]
    else:
        arrays[key] = value
    save_run(tmp_path / "run", CONFIG, {"theory.npz": arrays})
    with pytest.raises(ValueError, match=words):
        load_run(tmp_path / "run")


# ----------------------------------------------------------------------------- failures leave the old run


def test_a_full_disk_leaves_the_previous_run_intact(run_dir, monkeypatch):
    before = snapshot(run_dir)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(np, "savez", full)
    with pytest.raises(OSError, match=f"No space left on device; '{run_dir}' is unchanged") as err:
        save_run(run_dir, CONFIG.replace(problem={"L": 8}), {"theory.npz": theory_arrays()})
    assert err.value.errno == errno.ENOSPC
    assert snapshot(run_dir) == before and siblings(run_dir) == []


def test_ctrl_c_while_writing_leaves_the_previous_run_intact(run_dir):
    before = snapshot(run_dir)

    def interrupted(folder):
        (folder / "config.json").write_text("{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_folder(run_dir, interrupted)
    assert snapshot(run_dir) == before and siblings(run_dir) == []


KILLED_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from singleloc.ground._atomic_files import write_folder

    def fill(folder):
        (folder / "config.json").write_text("new")
        Path(sys.argv[2]).write_text("writing")  # tell the parent that the new run is half-written
        time.sleep(60)

    write_folder(sys.argv[1], fill)
""")


def test_kill_9_while_writing_leaves_the_previous_run_intact(run_dir, tmp_path):
    """A real process killed with SIGKILL in the middle of writing a run: the previous run is
    untouched, and the orphaned half-written folder is removed by the next write."""
    before = snapshot(run_dir)
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(run_dir), str(marker)])
    try:
        for _ in range(600):
            if marker.exists() or proc.poll() is not None:
                break
            subprocess.run(["sleep", "0.05"])
        assert marker.exists(), "the writer did not start"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        proc.kill()
    assert snapshot(run_dir) == before
    assert [n for n in siblings(run_dir) if n != "marker"] != []  # the orphan of the killed process
    save_run(run_dir, CONFIG, {"theory.npz": theory_arrays(value=2.0)})
    assert [n for n in siblings(run_dir) if n != "marker"] == []
    np.testing.assert_array_equal(load_run(run_dir).data["theory"]["M"], theory_arrays(value=2.0)["M"])


# ----------------------------------------------------------------------------- permissions and places


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_files_and_run_folders_respect_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        folder = save_run(tmp_path / "run", CONFIG, {"theory.npz": theory_arrays()})
        plain = save_npz(tmp_path / "plain" / "a.npz", {"x": np.ones(2)})
    finally:
        os.umask(old)
    assert (folder.stat().st_mode & 0o777) == 0o777 & ~umask
    for path in (*folder.iterdir(), plain):
        assert (path.stat().st_mode & 0o777) == 0o666 & ~umask, path


def test_check_run_folder(tmp_path, run_dir, monkeypatch):
    assert check_run_folder(tmp_path / "new") is False
    assert check_run_folder(run_dir) is True
    (tmp_path / "empty").mkdir()
    assert check_run_folder(tmp_path / "empty") is False
    (run_dir / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="it holds notes.txt, which is not part of a singleloc run"):
        check_run_folder(run_dir)
    (tmp_path / "file").write_text("x")
    for bad, words in (("", "empty name"), (str(tmp_path / "file"), "is a regular file, not a folder"),
                       (str(tmp_path / "file" / "sub"), "is a regular file, not a folder")):
        with pytest.raises((ValueError, OSError), match=words):
            check_run_folder(bad)
    monkeypatch.chdir(tmp_path / "empty")
    for here in (".", str(tmp_path)):
        with pytest.raises(ValueError, match="is or contains the current folder"):
            check_run_folder(here)


@pytest.mark.skipif(not Path("/sys").is_dir(), reason="needs a read-only /sys")
def test_unwritable_places_are_refused_before_any_work():
    for check in (check_run_folder, check_output_folder):
        with pytest.raises(OSError, match="cannot create files in '/sys'"):
            check("/sys/singleloc-test/out")

"""Compiled programs reused across processes: the cache folder, the stored (exported) solve,
and a fresh process that neither traces nor compiles the solve again."""

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import singleloc as sl
from singleloc.runtime import _compilation


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SINGLELOC_CACHE_DIR", str(tmp_path / "c"))
    assert _compilation.cache_dir() == tmp_path / "c"
    monkeypatch.setenv("SINGLELOC_CACHE_DIR", "")
    assert _compilation.cache_dir() is None
    monkeypatch.delenv("SINGLELOC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert _compilation.cache_dir() == tmp_path / "x" / "singleloc" / "jax"


def test_a_cache_folder_in_use_is_kept():
    """The test session set its own folder (conftest): enabling keeps it."""
    folder = jax.config.jax_compilation_cache_dir
    assert folder and sl.enable_compilation_cache() == _compilation.Path(folder)


def test_the_checks_are_nan_only_while_the_package_traces(monkeypatch):
    """No process-wide knob: ``import singleloc`` sets no environment variable, and the NaN mode of
    Equinox's checks holds inside :func:`checks_as_nan` only (restored after it, also after an error);
    a user's ``EQX_ON_ERROR`` is obeyed."""
    from equinox import _errors

    assert "EQX_ON_ERROR" not in os.environ  # the test session sets none, and neither does the package
    before = _errors.EQX_ON_ERROR
    with _compilation.checks_as_nan():
        assert _errors.EQX_ON_ERROR == "nan"
    assert _errors.EQX_ON_ERROR == before
    with pytest.raises(ZeroDivisionError), _compilation.checks_as_nan():
        raise ZeroDivisionError
    assert _errors.EQX_ON_ERROR == before and _compilation.checks_mode() == "nan"
    monkeypatch.setenv("EQX_ON_ERROR", "raise")
    with _compilation.checks_as_nan():
        assert _errors.EQX_ON_ERROR == before  # the user's choice stands
    assert _compilation.checks_mode() == "raise"


def test_static_values_outside_the_package_have_no_stable_name():
    cfg = sl.load_config("default", ["theory.points=64"])
    ode = sl.OrderParameterODE.from_setup(sl.build(cfg))
    assert "singleloc.model._activations.softmax" in _compilation._structure((ode,))
    sl.register_activation("test_half_softmax", lambda s: jax.nn.softmax(s, axis=-1) / 2, overwrite=True)
    user = sl.OrderParameterODE.from_setup(sl.build(cfg.replace(model={"activation": "test_half_softmax"})))
    assert _compilation._structure((user,)) is None


def test_integrate_stores_and_reloads_its_program(monkeypatch, tiny_theory):
    """The session's solve of the canonical tiny problem stored its program; a process that has not
    loaded it (as a new one) reads it from the file, and solves the same numbers."""
    from _tiny import tiny

    pytest.importorskip("flatbuffers")
    cfg = tiny()
    first = tiny_theory  # sl.integrate(cfg), the session's
    stored = list((_compilation.Path(jax.config.jax_compilation_cache_dir) / "exported").glob("integrate-*.bin"))
    assert stored
    monkeypatch.setattr(_compilation, "_LOADED", {})  # as in a new process: read from the file
    second = sl.integrate(cfg)
    np.testing.assert_array_equal(first.risk, second.risk)
    np.testing.assert_array_equal(first.M, second.M)


def test_a_damaged_stored_program_is_removed_and_compiled_again(monkeypatch, tiny_theory):
    """Bytes flipped in the middle of the session's stored tiny solve: the checksum catches it before
    deserialising (no StableHLO traceback), one warning names the file, and the solve is traced again,
    gives the same numbers and stores a good file in its place."""
    import warnings

    from _tiny import tiny

    pytest.importorskip("flatbuffers")
    cfg = tiny()
    read, load = [], _compilation._load

    class Found(Exception):
        pass

    def note(path):  # the file's path, noted where the solve would read it; the solve itself is the session's
        read.append(path)
        raise Found

    monkeypatch.setattr(_compilation, "_LOADED", {})  # as in a new process: read from the file
    monkeypatch.setattr(_compilation, "_load", note)
    with pytest.raises(Found):
        sl.integrate(cfg)
    monkeypatch.setattr(_compilation, "_load", load)
    (path,) = read
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    path.write_bytes(bytes(data))
    monkeypatch.setattr(_compilation, "_LOADED", {})  # as in a new process: read from the file
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second = sl.integrate(cfg)
    damaged = [str(w.message) for w in caught if "damaged" in str(w.message)]
    assert len(damaged) == 1 and str(path) in damaged[0] and "\n" not in damaged[0], damaged
    np.testing.assert_array_equal(tiny_theory.risk, second.risk)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _compilation._load(path) is not None  # stored anew, and it passes the check


@pytest.mark.slow
def test_a_fresh_process_does_not_trace_the_solve_again(tmp_path):
    pytest.importorskip("flatbuffers")
    script = textwrap.dedent("""
        import jax
        import singleloc as sl
        from singleloc.theory import _ode
        traced = []
        solve = _ode._solve
        _ode._solve = lambda *a: traced.append(1) or solve(*a)
        jax.config.update("jax_enable_x64", True)
        sl.enable_compilation_cache()
        cfg = sl.load_config("default", ["sgd.tau_max=2", "sgd.n_save=3", "theory.points=64"])
        r = sl.integrate(cfg)
        print(len(traced), repr(float(r.risk[0, -1])))
    """)
    env = {**os.environ, "SINGLELOC_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout.split()
            for _ in range(2)]
    assert runs[0][0] == "1" and runs[1][0] == "0" and runs[0][1] == runs[1][1], runs


@pytest.mark.slow
def test_equinox_imported_first_still_integrates(tmp_path):
    """A script that imports diffrax before singleloc: equinox's own mode stays ``raise`` for the
    process, and the package's solve is still traced with its checks as NaN (no host callback), so
    that its program is stored."""
    script = textwrap.dedent("""
        import diffrax, jax
        import singleloc as sl
        jax.config.update("jax_enable_x64", True)
        sl.enable_compilation_cache()
        cfg = sl.load_config("default", ["theory.points=64", "sgd.tau_max=1", "sgd.n_save=3", "simulation.seeds=1"])
        r = sl.integrate(cfg, sl.initial_conditions(cfg), progress=False)
        import equinox._config
        print(equinox._config.EQX_ON_ERROR, float(r.risk[0, -1]))
    """)
    env = {**os.environ, "SINGLELOC_CACHE_DIR": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    env.pop("EQX_ON_ERROR", None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    mode, risk = out.stdout.split()
    assert mode == "raise" and 0 < float(risk) < 1
    assert list((tmp_path / "exported").glob("integrate-*.bin"))  # stored: no host callback in it


def test_programs_of_more_shapes_than_the_bound_are_freed(monkeypatch):
    monkeypatch.setattr(_compilation, "MAX_HELD_SHAPES", 2)
    monkeypatch.setattr(_compilation, "_HELD", set())
    f = jax.jit(lambda x: 2 * x + 1)
    f(1.0)
    for shape in ("a", "b", "a", "b"):  # two shapes: within the bound, nothing freed
        _compilation.hold_programs(shape)
    assert f._cache_size() == 1
    _compilation.hold_programs("c")  # a third: every program freed, then "c" held
    assert f._cache_size() == 0 and _compilation._HELD == {"c"}
    assert float(f(1.0)) == 3.0  # compiled again when needed


def test_the_solve_programs_are_compiled_with_the_cpu_options(monkeypatch, tiny_theory):
    """``filter_jit`` (the theory's solves) and the stored solve are compiled with ``compiler_options()``: an option
    XLA does not know fails them at the top level; inside another program the options are that program's (none)."""
    from _tiny import tiny

    def double(x, n):
        return x * n

    program, x = _compilation.filter_jit(double), jax.numpy.arange(3.0)
    np.testing.assert_array_equal(program(x, 2), 2 * x)
    assert "jit_double" in program.lower(x, 2).as_text()  # named as the function, as compile events follow it
    monkeypatch.setattr(_compilation, "compiler_options", lambda: {"xla_no_such_option": True})
    with pytest.raises(Exception, match="xla_no_such_option"):
        program(x, 3)
    np.testing.assert_array_equal(jax.jit(lambda y: program(y, 3))(x), 3 * x)
    pytest.importorskip("flatbuffers")
    monkeypatch.setattr(_compilation, "_LOADED", {})  # as in a new process: the session's stored tiny solve, read
    with pytest.raises(Exception, match="xla_no_such_option"):
        sl.integrate(tiny())

"""Extension points from a config file: ``model.activation`` and ``problem.prior`` as
``"package.module:function"`` references (singleloc.ground._extensions), in this process, on the
command line, in stored programs and on Dask workers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import singleloc as sl
from singleloc.preflight._build import build
from singleloc.runtime import _compilation
from singleloc.theory._theory import OrderParameterODE

MODULE = """
import jax
import singleloc as sl

def double_softmax(scores):
    return jax.nn.softmax(2.0 * scores, axis=-1)

def wrong_shape(scores):
    return scores.sum(axis=-1)

def ring(problem):
    return sl.spikes(problem.F, 2.0 * problem.strength)

def not_a_prior(problem):
    return 3

constant = 1.0
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A user's module ``user_ext_<id>`` on ``sys.path`` (its name is unique per test, so that
    every test imports its own file)."""
    name = f"user_ext_{os.getpid()}_{abs(hash(tmp_path)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    yield name
    sys.modules.pop(name, None)


def test_a_referenced_activation_is_the_users_function(user_module, rng):
    fn = sl.get_activation(f"{user_module}:double_softmax")
    s = rng.standard_normal((3, 5))
    e = np.exp(2.0 * s)
    np.testing.assert_allclose(np.asarray(fn(jnp.asarray(s))), e / e.sum(axis=1, keepdims=True), rtol=1e-12)
    cfg = sl.load_config("default", [f"model.activation={user_module}:double_softmax"])
    assert cfg.model.activation == f"{user_module}:double_softmax"


def test_a_referenced_activation_and_prior_drive_the_theory(user_module, rng):
    """Identity: softmax(2 s) on keys (M, Q, b) is softmax on the keys (2M, 4Q, 2b); the risk of
    the user's activation on the user's prior (spikes of twice the strength) equals it."""
    jax.config.update("jax_enable_x64", True)
    cfg = sl.load_config("default", [f"model.activation={user_module}:double_softmax", f"problem.prior={user_module}:ring",
                                     "theory.route=rule"])
    prior = cfg.problem.build_prior()
    np.testing.assert_allclose(prior.atoms_array(), sl.spikes(2, 5.0).atoms_array())
    M = jnp.array([[0.6, 0.2], [0.1, 0.5]])
    Q = M @ M.T + 0.3 * jnp.eye(2)
    b = jnp.zeros(2)
    mine = sl.population_risk(prior, 4, f"{user_module}:double_softmax", M, Q, b, route="rule", replicates=2)
    ref = sl.population_risk(prior, 4, "softmax", 2 * M, 4 * Q, 2 * b, route="rule", replicates=2)
    np.testing.assert_allclose(mine.value, ref.value, rtol=1e-10)


@pytest.mark.parametrize("reference, message", [
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("{m}:missing", "has no attribute 'missing'"),
    ("{m}:constant", "is not callable"),
    ("{m}:wrong_shape", "same shape"),
    (":f", "is not a reference"),
])
def test_bad_activation_references_name_the_key(user_module, reference, message):
    with pytest.raises(ValueError, match="model.activation") as err:
        sl.load_config("default", [f"model.activation={reference.format(m=user_module)}"])
    assert message in str(err.value)


def test_a_prior_reference_must_return_a_prior(user_module):
    with pytest.raises(ValueError, match="problem.prior.*must return a singleloc.Prior"):
        sl.load_config("default", [f"problem.prior={user_module}:not_a_prior"])
    with pytest.raises(ValueError, match="problem.prior.*cannot import"):
        sl.load_config("default", ["problem.prior=no_such_module_xyz:ring"])


def test_a_referenced_activation_has_a_name_for_stored_programs(user_module):
    """Programs built from a referenced function are keyed by the reference and its file's
    digest, the same in every process; a script's own function has no such name."""
    cfg = sl.load_config("default", [f"model.activation={user_module}:double_softmax", "theory.route=rule"])
    structure = _compilation._structure(OrderParameterODE.from_setup(build(cfg)))
    assert structure is not None and f"{user_module}:double_softmax@" in structure

    def local(scores):
        return jax.nn.softmax(scores, axis=-1)

    sl.register_activation("test_local_activation", local, overwrite=True)
    cfg = sl.load_config("default", ["model.activation=test_local_activation", "theory.route=rule"])
    assert _compilation._structure(OrderParameterODE.from_setup(build(cfg))) is None


@pytest.mark.slow
def test_the_command_line_takes_a_referenced_activation(user_module, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "singleloc", "integrate", "default", "--set", f"model.activation={user_module}:double_softmax",
           "--set", "sgd.tau_max=1", "--set", "sgd.n_save=3", "--set", "theory.points=256", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "theory.npz").is_file()


@pytest.mark.slow
def test_dask_workers_import_a_referenced_activation(user_module, tmp_path):
    """A sweep on two worker processes: each imports the user's module from the config's string."""
    script = textwrap.dedent(f"""
        import jax
        jax.config.update("jax_enable_x64", True)
        import singleloc as sl
        if __name__ == "__main__":
            base = sl.load_config("default", ["model.activation={user_module}:double_softmax", "sgd.tau_max=1",
                                              "sgd.n_save=3", "theory.points=256", "simulation.seeds=1"])
            rows, stats = sl.sweep(base, [sl.parse_grid("model.heads=1,2")], r"{tmp_path / 'sweep'}", workers=2)
            assert stats.failed == 0 and len(rows) == 2, (stats, rows)
            print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]

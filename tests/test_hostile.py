"""Trustworthy under hostile use (issue 54): a clean Ctrl-C, user code that cannot corrupt a run,
cache entries that prove what they hold, numbers refused in the range of the type they reach,
and a public API that checks its arguments at the door. Each test reproduces an item of the
issue (it failed on the code the issue was filed against) and asserts the one line a user sees."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys

import numpy as np
import pytest
from _tiny import cli_sets
from helpers import interrupt, one_line

from singleloc import load_config
from singleloc.cli import main
from singleloc.configuration._config import Config
from singleloc.io._run_folders import load_npz, save_npz
from singleloc.preflight._build import build
from singleloc.sweeps import _sweep_cache, _sweep_entries

#: A command line that solves in seconds (issue 54's ``S``): the default preset's problem (the messages below name
#: its L = 4 and F = 2) on the rule, one seed at D = 200.
TINY = cli_sets("problem.L=4", "problem.F=2", "simulation.D=200", "simulation.seeds=1", "simulation.test_samples=4096",
                rule=True)


# ----------------------------------------------------------------------------- 1. Ctrl-C

#: A ``singleloc`` process (``main()`` as the console script calls it) whose garbage collector runs a
#: Python callback most of the time, as JAX's ``_xla_gc_callback`` runs during a trace: a Ctrl-C then
#: lands inside the callback, where Python cannot raise it ("Exception ignored in ..."). ``WORK``
#: replaces the command's computation with a loop of collections (or, empty, the command runs).
_GC_STRESS = """
import gc, sys, time
import singleloc.theory._ode
from singleloc.cli import main

STRESSED = [not WORK]  # with WORK, the collections are slow from the loop on (the imports before it stay fast)

def callback(phase, info):
    start = time.perf_counter()
    while STRESSED[0] and time.perf_counter() - start < SECONDS:
        pass

def collecting(*args, **kwargs):
    STRESSED[0] = True
    print("compiling", file=sys.stderr, flush=True)
    while True:
        gc.collect()

gc.callbacks.append(callback)
if WORK:
    singleloc.theory._ode.integrate_setup = collecting
sys.argv = ["singleloc", *sys.argv[1:]]
sys.exit(main())
"""


def _interrupt(tmp_path, args, *, seconds: float, work: bool, wait_for: str | None, delay: float, limit: float = 20.0):
    """Run the stressed ``singleloc ARGS`` (SIGINT at its default, as in a terminal), send SIGINT once its
    stderr shows ``wait_for`` and ``delay`` seconds more; return (exit code, seconds to the end, stderr)."""
    script = tmp_path / "stressed.py"
    script.write_text(_GC_STRESS.replace("SECONDS", repr(seconds)).replace("WORK", repr(work)))
    env = {**os.environ, "SINGLELOC_CACHE_DIR": ""}  # no stored programs: the command compiles
    return interrupt([str(script), *args], tmp_path, wait_for, delay, limit, env)


def _assert_clean_interrupt(code, seconds, err, command, within):
    assert code == 130 and seconds < within, (code, seconds, err)
    assert err.strip().splitlines()[-1] == f"singleloc {command}: interrupted", err
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_ctrl_c_inside_a_garbage_collection_callback_is_one_line_within_a_second(tmp_path):
    """Issue 54 item 1: the interrupt raised inside JAX's gc callback was printed as ``Exception ignored
    in: <function _xla_gc_callback>`` with its traceback, and the process ended only after the watcher's
    10 s. The callback here takes 0.2 s of every collection, so the signal lands in it."""
    code, seconds, err = _interrupt(tmp_path, ["integrate", "default", "--no-progress", "--out", "out"], seconds=0.2,
                                    work=True, wait_for="compiling", delay=0.5)
    _assert_clean_interrupt(code, seconds, err, "integrate", within=2.5)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("command, args, delay", [
    ("integrate", ["default", "--out", "out"], 6.0),
    ("compare", ["default", "--out", "out"], 8.0),
    ("bayes", ["default"], 6.0),
    ("simulate", ["default", "--out", "out"], 6.0),
    ("sweep", ["default", "--grid", "model.heads=1,2", "--out", "out"], 8.0),
    ("sweep", ["default", "--grid", "model.heads=1,2", "--workers", "2", "--force", "--out", "out"], 14.0),
])
def test_ctrl_c_while_a_real_command_compiles_is_one_line(tmp_path, command, args, delay):
    """Every command, interrupted while it traces and compiles (no stored programs), with a collector
    callback of 0.1 s that the signal lands in: one line, exit 130, at once; with a local Dask cluster, once
    the cluster is closed (its workers, busy compiling, logged a traceback for every failed heartbeat)."""
    sizes = [a for a in TINY if a != "--no-progress"] if command != "bayes" else ["--set", "theory.points=1024"]
    code, seconds, err = _interrupt(tmp_path, [command, *args, *sizes, "--no-progress"], seconds=0.1, work=False,
                                    wait_for=None, delay=delay)
    _assert_clean_interrupt(code, seconds, err, command, within=8.0 if "--workers" in args else 2.5)


# ----------------------------------------------------------------------------- 6. cache entries prove what they hold


def _fake_compute(calls):
    """A theory entry whose risk is the config's number of heads (so a row shows whose result it holds)."""

    def compute(config, kind):
        calls.append(config.model.heads)
        H = config.model.heads
        return {"tau": np.arange(3.0), "M": np.zeros((1, 3, H, 2)), "Q": np.ones((1, 3, H, H)), "b": np.zeros((1, 3, H)),
                "risk": np.full((1, 3), float(H))}

    return compute


def test_a_cache_entry_copied_over_another_points_entry_is_recomputed(tmp_path, monkeypatch):
    """Issue 54 item 6: the ``heads = 1`` entry copied over the ``heads = 2`` entry was used silently
    ("2 from the cache", the heads = 2 row reporting the heads = 1 result): entries were trusted by
    file name. Now each records the key of its configuration and every read verifies it."""
    calls = []
    monkeypatch.setattr(_sweep_cache, "compute", _fake_compute(calls))
    monkeypatch.setattr(_sweep_cache, "compute_points", lambda kind, *configs: [
        _fake_compute(calls)(Config.from_dict(c), kind) for c in configs])
    one, two = (load_config("default", ["theory.route=rule", f"model.heads={h}"]) for h in (1, 2))
    _sweep_cache.cached_run(one, "theory", tmp_path)
    _sweep_cache.cached_run(two, "theory", tmp_path)
    path_one, path_two = (_sweep_entries._entry_path(tmp_path, c, "theory") for c in (one, two))
    shutil.copyfile(path_one, path_two)
    with pytest.warns(UserWarning, match=f"cache entry {path_two} holds the result of another configuration"):
        done, errors = _sweep_cache.fill_cache([(one, "theory"), (two, "theory")], tmp_path, progress=False)
    assert done == {path_two.name} and not errors and calls == [1, 2, 2]  # the cheap check of fill_cache finds it
    assert _sweep_cache.cached_run(two, "theory", tmp_path)["risk"][0, 0] == 2.0 and len(calls) == 3
    shutil.copyfile(path_one, path_two)  # the full read (after fill_cache) finds it too
    with pytest.warns(UserWarning, match="holds the result of another configuration"):
        assert _sweep_cache.cached_run(two, "theory", tmp_path)["risk"][0, 0] == 2.0
    save_npz(path_two, load_npz(path_one))  # an entry that records nothing (an earlier layout, a hand-made file)
    with pytest.warns(UserWarning, match="records the key of none"):
        assert _sweep_cache.cached_run(two, "theory", tmp_path)["risk"][0, 0] == 2.0
    assert calls == [1, 2, 2, 2, 2]


@pytest.mark.slow
def test_the_issues_swapped_sweep_entry_is_recomputed_through_the_command_line(tmp_path, capsys):
    """The issue's case end to end: a finished ``--grid model.heads=1,2`` sweep, the heads = 1 theory
    entry copied over the heads = 2 one, the sweep run again on that cache."""
    args = ["sweep", "default", *TINY, "--grid", "model.heads=1,2", "--horizon", "config", "--out", str(tmp_path / "o")]
    assert main(args) == 0
    first = (tmp_path / "o" / "sweep.csv").read_text()
    capsys.readouterr()
    one, two = (load_config("default", [a for a in TINY if "=" in a] + [f"model.heads={h}", "sgd.tau_max=2"]) for h in (1, 2))
    paths = [_sweep_entries._entry_path(tmp_path / "o" / "cache", c, "theory") for c in (one, two)]
    assert all(p.is_file() for p in paths)
    shutil.copyfile(*paths)
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "holds the result of another configuration" in captured.err, captured.err
    assert "(1 computed, 1 from the cache)" in captured.out + captured.err, captured
    assert (tmp_path / "o" / "sweep.csv").read_text() == first


# ----------------------------------------------------------------------------- 2-5. user code where it enters

USER_MODULE = """
import jax
import jax.numpy as jnp
import numpy as np
import singleloc as sl

def position_weighted(scores):  # softmax weighted by the position index: not token-permutation equivariant
    e = jnp.exp(scores) * jnp.arange(1, scores.shape[-1] + 1, dtype=scores.dtype)
    return e / e.sum(-1, keepdims=True)

def nan_weights(scores):
    return jnp.full_like(scores, jnp.nan)

def nan_gradient(scores):  # finite weights, a gradient 0 * inf
    return jax.nn.softmax(scores, axis=-1) + 0.0 * jnp.sqrt(jnp.abs(scores) - jnp.abs(scores))

def raising(scores):
    raise RuntimeError("boom")

def numpy_only(scores):
    e = np.exp(np.asarray(scores))
    return e / e.sum(-1, keepdims=True)

def double_precision(scores):
    return jax.nn.softmax(scores.astype(jnp.float64), axis=-1)

def lying(scores):  # declares softmax, computes softmax(2 s)
    return jax.nn.softmax(2.0 * scores, axis=-1)
lying.exponential_form = lambda L: (1.0, 0.0, False)

def honest(scores):
    return jax.nn.softmax(2.0 * scores, axis=-1)
honest.exponential_form = lambda L: (2.0, 0.0, False)

def short_only(scores):  # passes the probe (L = 5), raises on longer sequences
    if scores.shape[-1] > 6:
        raise IndexError("too long")
    return jax.nn.softmax(scores, axis=-1)

def raising_prior(problem):
    raise RuntimeError("prior boom")

def nan_prior(problem):
    return sl.Prior([[float("nan")] * problem.F], [1.0], [[0.0] * problem.F] * problem.F)

def huge_prior(problem):
    return sl.spikes(problem.F, 1e200)
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A user's module ``hostile_<id>`` on ``sys.path`` (a unique name per test: each imports its own file)."""
    name = f"hostile_{os.getpid()}_{abs(hash(tmp_path)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


@pytest.mark.parametrize("function, words", [
    ("position_weighted", "is not equivariant under a permutation of the tokens: act(s P) and act(s) P differ by"),
    ("nan_weights", "returns non-finite weights on random scores of shape (3, 5) and scale 1 (15 of 15 entries, e.g. nan)"),
    ("nan_gradient", "has a non-finite gradient on random scores"),
    ("raising", "raised RuntimeError: boom"),
    ("numpy_only", "raised TracerArrayConversionError"),
    ("double_precision", "must return weights of the scores' dtype (the simulation runs in float32); float32 scores gave "
                         "float64 weights"),
    ("lying", "is not the normalised exponential it declares (exponential_form at L = 5: scale 1, offset 0, joint False"),
])
def test_a_user_activation_is_probed_with_values_where_it_enters(user_module, tmp_path, capsys, function, words):
    """Issue 54 items 2 and 3: a non-equivariant activation was accepted silently (the theory's numbers
    were wrong), one returning NaN made ``integrate`` run on for minutes. Refused at once, in one line."""
    args = ["integrate", "default", *TINY, "--set", f"model.activation={user_module}:{function}", "--out", str(tmp_path / "o")]
    assert main(args) == 2
    line = one_line(capsys, "integrate")
    assert line.startswith(f"singleloc integrate: error: model.activation: '{user_module}:{function}' ") and words in line, line


def test_the_probe_takes_the_packages_own_activations_and_an_honest_form(user_module):
    import jax.numpy as jnp

    import singleloc as sl
    from singleloc.ground._user_code import check_activation

    for name in ("softmax", "softmax1", "bsoftmax", "ssmax"):
        check_activation(sl.get_activation(name), name)
    check_activation(sl.scalable_softmax(0.3), "scalable_softmax(0.3)")
    fn = sl.get_activation(f"{user_module}:honest")
    assert float(fn(jnp.zeros((1, 2)))[0, 0]) == 0.5
    with pytest.raises(ValueError, match="'test_hostile_position' is not equivariant"):
        sl.register_activation("test_hostile_position", sys.modules[user_module].position_weighted)
    assert "test_hostile_position" not in sl.activation_names()


@pytest.mark.parametrize("function, words", [
    ("raising_prior", "raised RuntimeError: prior boom"),
    ("nan_prior", "raised ValueError: prior custom: atoms must be finite"),
    ("huge_prior", "returned a prior whose mean or covariance overflows float64 (atoms up to 1e+200)"),
])
def test_a_user_prior_that_raises_or_overflows_is_one_line(user_module, capsys, function, words):
    """Issue 54 item 4: ``bayes default --set problem.prior=mymod:raiseprior`` gave a 35-line traceback, exit 1."""
    assert main(["bayes", "default", "--set", f"problem.prior={user_module}:{function}"]) == 2
    line = one_line(capsys, "bayes")
    assert line.startswith(f"singleloc bayes: error: problem.prior: '{user_module}:{function}' ") and words in line, line


def test_an_activation_that_raises_only_in_the_run_is_one_line(user_module, tmp_path, capsys):
    """The probe passes (L = 5); the run's trace at L = 8 raises inside JAX: still one line naming the function."""
    assert main(["integrate", "default", *TINY, "--set", f"model.activation={user_module}:short_only", "--set", "problem.L=8",
                 "--out", str(tmp_path / "o")]) == 2
    assert one_line(capsys, "integrate") == \
        f"singleloc integrate: error: model.activation: '{user_module}:short_only' raised IndexError: too long"


@pytest.mark.parametrize("s", [1e300, 1e3 * (1 + 1e-15), True, None])
def test_scalable_softmax_refuses_a_scale_beyond_what_it_can_compute(s):
    """Issue 54 item 5: ``sl.scalable_softmax(1e300)`` passed its check and failed 29 lines deep in JAX."""
    import singleloc as sl

    with pytest.raises((TypeError, ValueError),  # None: at the door (a TypeError)
                       match=r"^scalable_softmax: s must be a number( in \(0, 1000\], got .*; e.g. s = 1|, got NoneType None$)"):
        sl.scalable_softmax(s)
    assert sl.scalable_softmax(1e3).exponential_form(4).scale == pytest.approx(1e3 * np.log(4))


# ----------------------------------------------------------------------------- 8. numbers in the range of their type


@pytest.mark.parametrize("command, sets, words", [
    ("integrate", ["sgd.batch=1e300"], "sgd.batch: must be <= 2147483647, got 1e+300; e.g. sgd.batch = 1"),
    ("integrate", ["theory.qmc_seed=18446744073709551616"],
     "theory.qmc_seed: must be <= 4294967295, got 18446744073709551616; e.g. theory.qmc_seed = 0"),
    ("integrate", ["theory.replicates=1e6"], "sgd.n_save = 3 x theory.replicates = 1000000 saved times per ODE start, more "
                                             "than the 16384"),
    ("integrate", ["theory.rtol=2.22e-16"], "theory.rtol: must be >= 2.220446049250313e-16 (the relative spacing of float64 "
                                            "numbers), got 2.22e-16; e.g. theory.rtol = 1e-12"),
    ("simulate", ["problem.strength=1e300"], "problem.strength: 1e+300 is out of range: its square must be a float64 number, "
                                             "so |problem.strength| <= 1.34e+154; e.g. problem.strength = 2.5"),
    ("simulate", ["problem.strength=1e30"], "problem.strength: 1e+30 is out of range for the simulation, which runs in float32: "
                                            "its square must be a float32 number, so |problem.strength| <= 1.84e+19"),
    ("simulate", ["sgd.schedule=warmup", "sgd.warmup_tau=1e-300"], "sgd.warmup_tau: 1e-300 is out of range for the "
                                                                   "simulation, which runs in float32"),
    ("integrate", ["theory.route=exact", "theory.gram_points=1073741824"],
     "for the exact route's Gram rule (theory.gram_points = 1073741824 x problem.L = 4"),
])
def test_the_issues_messages_name_the_key_and_a_possible_value(tmp_path, capsys, monkeypatch, command, sets, words):
    """Issue 54 item 8: JAX's overflow message, "Python int too large to convert to C long", "lower sgd.n_save to at
    most 0", "must be >= 2.22e-16, got 2.22e-16", ``problem.strength = 1e300`` blamed on ``sgd.lr``, ``theory.gram_points``
    blamed on ``theory.points``."""
    monkeypatch.setenv("SINGLELOC_MEMORY_LIMIT", "8G")
    args = [command, "default", *TINY, *(a for s in sets for a in ("--set", s)), "--out", str(tmp_path / "o")]
    assert main(args) == 2
    line = one_line(capsys, command)
    assert words in line, line
    assert "e.g. " in line and "at most 0" not in line, line
    if "replicates" in sets[0]:
        assert line.endswith("e.g. theory.replicates = 5461"), line  # 3 x 5461 = 16383 saved times fit
    if "gram_points" in sets[-1]:
        value = int(line.split("e.g. theory.gram_points = ")[1].split(",")[0])
        assert 16 <= value < 1073741824 and not value & (value - 1)


def test_starts_of_different_counts_say_so():
    """Issue 54 item 8: "Q0 must have shape (2, 2) ..., got (2, 2)" for three M0 and two Q0."""
    import singleloc as sl

    cfg = load_config("default", [a for a in TINY if "=" in a])
    M0, Q0, b0 = np.zeros((3, 2, 2)), np.tile(np.eye(2), (2, 1, 1)), np.zeros((3, 2))
    with pytest.raises(ValueError, match=r"^Q0 holds 2 start\(s\) but M0 holds 3: give every part of y0 the same leading "
                                         r"number of starts, e.g. Q0 of shape \(3, 2, 2\)$"):
        sl.integrate(cfg, (M0, Q0, b0))


def _numeric_keys():
    from singleloc.configuration._config import SECTIONS

    for section, spec in SECTIONS.items():
        for field in dataclasses.fields(spec):
            default = spec().__getattribute__(field.name) if field.name != "prior" else None
            if isinstance(default, (int, float)) and not isinstance(default, bool):
                yield f"{section}.{field.name}"


HOSTILE_NUMBERS = ["1e300", "-1e300", "1e-320", "1180591620717411303424", "-1", "0", "0.5", "nan", "inf", "'x'", "true"]


@pytest.mark.parametrize("key", list(_numeric_keys()))
def test_every_numeric_key_refuses_in_one_line_naming_it_with_a_value_that_passes(key):
    """The class of item 8: for every numeric key and hostile value, either the config loads (and then the
    value is in the range of float64 and int64) or the refusal names the key and suggests ``key = VALUE``, and
    that suggestion loads."""
    for value in HOSTILE_NUMBERS:
        try:
            cfg = load_config("default", [f"{key}={value}"])
        except ValueError as err:
            message = str(err)
            assert message.startswith(f"{key}: ") or message.startswith(f"{key} "), message
            remedy = message.split("; e.g. ", 1)[-1]
            assert "; e.g. " in message and f"{key} = " in remedy, message
            suggested = remedy.split(f"{key} = ")[1].split(" ")[0].rstrip(",;)")
            load_config("default", [f"{key}={suggested}"])  # the suggestion is possible
        else:
            section, name = key.split(".")
            loaded = getattr(getattr(cfg, section), name)
            assert isinstance(loaded, (int, float)) and np.isfinite(loaded)
            assert abs(loaded) < (2**63 if isinstance(loaded, int) else np.finfo(np.float64).max)


@pytest.mark.parametrize("key, value, words", [
    ("problem.strength", 1e25, "its square must be a float32 number"),
    ("sgd.lr", 1e39, "it must be a float32 number"),
    ("sgd.init_scale", 1e20, "its square must be a float32 number"),
    ("sgd.schedule_tau", 1e-40, "it must be a float32 normal number"),
    ("sgd.weight_decay", 1e39, "it must be a float32 number"),
])
def test_what_a_simulation_holds_in_float32_is_checked_before_it_runs(key, value, words):
    from singleloc.preflight import _resources

    cfg = load_config("default", [f"{key}={value!r}"])
    _resources.check_run(build(cfg), theory_starts=1)  # the theory runs in float64: fine
    with pytest.raises(ValueError, match=rf"^{key}: .* is out of range for the simulation, which runs in float32: {words}.*"
                                         rf"; e.g. {key} = "):
        _resources.check_run(build(cfg, theory=False), simulation=True)


# ----------------------------------------------------------------------------- 7. combinations a run would drop


def test_the_exact_gram_term_on_the_rule_route_is_refused(tmp_path, capsys):
    """Issue 54 item 7: ``--set theory.gram=exact --set theory.route=rule`` was dropped silently (the run
    recorded the Sobol Gram term)."""
    assert main(["integrate", "default", *TINY, "--set", "theory.gram=exact", "--out", str(tmp_path / "o")]) == 2
    assert one_line(capsys, "integrate") == (
        "singleloc integrate: error: theory.gram = 'exact' applies to the exact route's Gram term, but theory.route = "
        "'rule', whose Gram term is on its own Sobol rule (theory.points); e.g. theory.gram = 'auto', or theory.route = "
        "'exact' for a normalised-exponential activation")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("sets, words", [
    (["theory.route=rule", "theory.gram_points=1024"], "theory.gram_points = 1024 applies to the exact route's Gram term"),
    (["theory.route=auto", "model.activation=bsoftmax", "model.heads=6", "theory.gram=exact"],
     "but model.activation = 'bsoftmax' takes the rule route here"),
    (["sgd.gradient_flow=true", "theory.gram=sobol"], "theory.gram = 'sobol' has no effect with sgd.gradient_flow = true"),
    # issue 62: the Monte Carlo Gram term on the rule route was dropped; refusals name the route chosen
    (["theory.route=rule", "theory.gram=montecarlo"], "theory.gram = 'montecarlo' applies to the exact route's Gram term, "
                                                      "but theory.route = 'rule', whose Gram term is on its own Sobol rule"),
    (["theory.route=montecarlo", "theory.gram=exact"], "but theory.route = 'montecarlo', whose Gram term is by its own "
                                                       "Monte Carlo draws"),
    (["theory.route=montecarlo", "theory.gram=sobol"], "but theory.route = 'montecarlo'"),
    (["sgd.bias_decay=0.1"], "sgd.bias_decay = 0.1 penalises biases that do not learn (model.train_bias = false); "
                             "e.g. model.train_bias = true"),
    (["problem.support=[[1, 0], [0, 1]]"], "problem.support applies to problem.prior = 'discrete' only"),
    (["problem.prior=discrete", "problem.mean=[1, 0]"], "problem.mean applies to problem.prior = 'gaussian' only"),
])
def test_keys_a_run_would_silently_drop_are_refused(sets, words):
    """Refused when the config loads, or (a key the chosen route has no use for) when its run is built."""
    with pytest.raises(ValueError, match=re.escape(words)):
        build(load_config("default", sets))


@pytest.mark.parametrize("sets", [
    ["theory.route=rule", "theory.gram=sobol"],  # the rule route's Gram term is on the Sobol rule: what was asked
    ["theory.route=montecarlo", "theory.gram=montecarlo"],
    ["theory.route=exact", "theory.gram=exact", "theory.gram_points=1024"],
    ["model.train_bias=true", "sgd.bias_decay=0.1"],
    ["problem.prior=discrete", "problem.support=[[1, 0], [0, 1]]", "problem.probs=[0.5, 0.5]"],
    ["problem.prior=gaussian", "problem.mean=[1, 0]", "problem.cov=2.0"],
])
def test_consistent_combinations_load(sets):
    build(load_config("default", sets))


# ----------------------------------------------------------------------------- 9. the Python API checks its arguments


def test_the_issues_api_calls_raise_the_documented_exception_in_one_clear_message():
    """Issue 54 item 9: ``from_setup('default')`` -> AttributeError, ``integrate(cfg, "abc")`` -> a 23-line traceback,
    ``load_config("default", "model.heads=3")`` read the string character by character."""
    import singleloc as sl

    with pytest.raises(TypeError, match=r"^OrderParameterODE.from_setup: setup must be a singleloc.Setup, got str 'default'$"):
        sl.OrderParameterODE.from_setup("default")
    cfg = load_config("default", [a for a in TINY if "=" in a])
    with pytest.raises(TypeError, match=r"^integrate: y0 must be the starts \(M0, Q0, b0\) .* got str 'abc'$"):
        sl.integrate(cfg, "abc")
    with pytest.raises(TypeError, match=r"^integrate: y0 must be the starts \(M0, Q0, b0\) .* got tuple \(array"):
        sl.integrate(cfg, (np.zeros((2, 2)), "Q", np.zeros(2)))
    with pytest.raises(TypeError, match=r"^load_config: overrides must be a list of 'section.key=value' strings, got str "
                                        r"'model.heads=3'; e.g. \['model.heads=3'\]$"):
        sl.load_config("default", "model.heads=3")


def _config_functions():
    """Every public function (or constructor) whose first parameter is a config."""
    import inspect

    import singleloc as sl

    for name in sl.__all__:
        obj = getattr(sl, name)
        if not callable(obj) or inspect.isclass(obj):
            continue
        try:
            params = list(inspect.signature(obj).parameters)
        except (TypeError, ValueError):
            continue
        if params and params[0] in ("config", "base"):
            others = sum(p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD
                         for p in list(inspect.signature(obj).parameters.values())[1:])
            yield name, lambda config, fn=obj, n=others: fn(config, *[None] * n)


@pytest.mark.parametrize("name, fn", list(_config_functions()), ids=lambda v: v if isinstance(v, str) else "")
def test_a_preset_name_where_a_config_is_expected_is_a_type_error(name, fn):
    """The class of item 9: every public function taking a config refuses a preset name at the door."""
    with pytest.raises(TypeError, match=r"(config|base) must be a singleloc.Config( or a \S+)?, got str 'default'; pass "
                                        r"singleloc.load_config\('default'\)"):
        fn("default")


def _string_calls():
    import singleloc as sl

    cfg = load_config("default", ["theory.route=rule", "theory.points=64"])
    prior, M, Q, b = sl.spikes(2, 2.5), np.zeros((2, 2)), np.eye(2), np.zeros(2)
    ode = lambda: sl.OrderParameterODE.from_setup(sl.build(cfg))  # noqa: E731
    return {
        "choose_points": (lambda: sl.choose_points(sl.build(cfg), "abc"), "choose_points: y0 must be the starts"),
        "resolve_points": (lambda: sl.resolve_points(sl.build(cfg.replace(theory={"points": "auto"})), "abc"),
                           "resolve_points: y0"),
        "choose_points config": (lambda: sl.choose_points(cfg, None),  # a configuration where its objects are taken
                                 r"choose_points: setup must be a singleloc.Setup, got Config .*; "
                                 r"pass singleloc.build\(config\)$"),
        "keep_heads": (lambda: sl.keep_heads("M", Q, b, [0]),
                       r"^keep_heads: M must be a real array of shape \(H, F\), got str 'M'$"),
        "population_risk array": (lambda: sl.population_risk(prior, 4, "softmax", M, "Q", b), "population_risk: Q must be"),
        "population_risk prior": (lambda: sl.population_risk("spikes", 4, "softmax", M, Q, b),
                                  r"population_risk: prior must be a singleloc.Prior, got str 'spikes'; pass a prior, "
                                  r"e.g. singleloc.spikes"),
        "bayes_risk": (lambda: sl.bayes_risk("spikes", 4), "bayes_risk: prior must be a singleloc.Prior"),
        "bayes_point": (lambda: sl.bayes_point("binary"), "bayes_point: prior must be a singleloc.Prior"),
        "LocalFields.make": (lambda: sl.LocalFields.make(4, 2, "spikes", 64), "LocalFields.make: prior must be"),
        "linearize": (lambda: sl.linearize(ode(), M, Q, "b"),
                      r"^linearize: b must be a real array of shape \(H,\), got str 'b'$"),
        "linearize ode": (lambda: sl.linearize("ode", M, Q, b), "linearize: ode must be a singleloc.OrderParameterODE"),
        "attention_mass": (lambda: sl.attention_mass(ode(), "M", Q, b), "attention_mass: M must be"),
        "prune_theory": (lambda: sl.prune_theory(cfg, "M", Q, b), "prune_theory: M must be"),
        "prune_run": (lambda: sl.prune_run("run"), r"prune_run: run must be a singleloc.Run, got str 'run'"),
        "analyze": (lambda: sl.analyze("tau", M, Q, b), "analyze: tau must be"),
        "classify_heads": (lambda: sl.classify_heads(M, {"Q": 1}),
                           r"^classify_heads: Q must be a real array of shape \(\*S, H, H\), got dict"),
        "plateaus": (lambda: sl.plateaus([0.0, 1.0], "risk"), "plateaus: risk must be"),
        "escape_times": (lambda: sl.escape_times("tau", [1.0]), "escape_times: tau must be"),
        "r_orth": (lambda: sl.r_orth("M", Q), "r_orth: M must be"),
        "psd_sqrt": (lambda: sl.psd_sqrt("abc"), "psd_sqrt: A must be"),
        "token_weights": (lambda: sl.token_weights("softmax", M),
                          "^token_weights: activation must be a function, got str 'softmax'$"),
        "unspecialized_point": (lambda: sl.unspecialized_point("ode", 2, 2), "unspecialized_point: ode must be"),
        "parse_grid": (lambda: sl.parse_grid(3), "^parse_grid: text must be a string, got int 3$"),
        "load_config source": (lambda: sl.load_config(3),
                               "^load_config: source must be a string or a path or a mapping, got int 3$"),
        "load_config entry": (lambda: sl.load_config("default", [3]),
                              r"^load_config: overrides must be a sequence of strings, got list \[3\]$"),
        # issue 62: an internal AttributeError naming no argument, or accepted silently
        "Config": (lambda: sl.Config("abc"), r"^Config: problem must be a singleloc.Problem, got str 'abc'$"),
        "Config dict": (lambda: sl.Config(model={"heads": 3}), r"Config: model must be a singleloc.Model, got dict"),
        "choose_route": (lambda: sl.choose_route("abc", sl.Model(), sl.Theory()), "choose_route: problem must be a "
                                                                                  "singleloc.Problem, got str 'abc'"),
        "bayes_route": (lambda: sl.bayes_route("abc"), "bayes_route: prior must be a singleloc.Prior, got str 'abc'"),
        "escape_rate": (lambda: sl.escape_rate("abc"), "escape_rate: lin must be a singleloc.Linearization, got str"),
        "add_to_run": (lambda: sl.add_to_run("abc", {}), "add_to_run: run must be a singleloc.Run, got str 'abc'"),
        "overlaps": (lambda: sl.overlaps("abc", M), r"^overlaps: K must be a real array of shape \(H, D\), got str 'abc'$"),
        "prune": (lambda: sl.prune("abc", 2), "prune: evaluate must be a function"),
        "prune heads": (lambda: sl.prune(lambda kept: (0.0, 0.0), "abc"), "prune: heads must be an integer, got str"),
        "MiniBatch": (lambda: sl.MiniBatch("abc"), "^MiniBatch: size must be an integer, got str 'abc'$"),
        "OnlineSGD": (lambda: sl.OnlineSGD(lr="abc"), "^OnlineSGD: lr must be a number or a JAX array, got str 'abc'$"),
        "OnlineSGD flag": (lambda: sl.OnlineSGD(0.5, "yes"), "^OnlineSGD: train_bias must be True or False"),
        "GradientFlow": (lambda: sl.GradientFlow(None), "^GradientFlow: lr must be a number or a JAX array, got NoneType"),
        "WeightDecay": (lambda: sl.WeightDecay("abc"), "^WeightDecay: weight_decay must be a number, got str 'abc'$"),
        "LearningRateSchedule": (lambda: sl.LearningRateSchedule("step", "abc"),
                                 "^LearningRateSchedule: tau must be a number, got str 'abc'$"),
    }


@pytest.mark.parametrize("case", list(_string_calls()))
def test_a_string_where_an_array_or_object_is_expected_is_a_type_error(case):
    call, words = _string_calls()[case]
    with pytest.raises(TypeError, match=words):
        call()


@pytest.mark.parametrize("call, words", [
    (lambda sl: sl.classify_heads(np.full((2, 1), np.nan), np.eye(2)), r"^classify_heads: M holds 2 NaN or infinite value"),
    (lambda sl: sl.config_hash({"a": 1}), r"^config_hash: config must be a singleloc.Config or its to_dict\(\)"),
    (lambda sl: sl.OnlineSGD(-0.5), r"^OnlineSGD: lr: must be > 0, got -0.5"),
    (lambda sl: sl.MiniBatch(0), r"^MiniBatch: size: must be >= 1"),
    (lambda sl: sl.LearningRateSchedule("steps"), r"^LearningRateSchedule: kind must be one of constant, step"),
    (lambda sl: sl.LearningRateSchedule("step", 10.0, 2.0), r"^LearningRateSchedule: factor must lie in \[0, 1\], got 2.0"),
    (lambda sl: sl.WeightDecay(0.1, -1.0), r"^WeightDecay: bias_decay: must be >= 0"),
])
def test_a_value_out_of_its_range_is_a_value_error_naming_function_and_argument(call, words):
    """Issue 62: 12 public callables accepted such values silently (classes for NaN overlaps, a hash of a dict
    that is no config, a learning rate < 0)."""
    import singleloc as sl

    with pytest.raises(ValueError, match=words):
        call(sl)


def test_a_named_activation_has_its_exponential_form():
    """``exponential_form("softmax", 4)`` returned None (no attribute on a string): "no exact route", silently."""
    import singleloc as sl

    assert sl.exponential_form("softmax", 4) == sl.exponential_form(sl.softmax, 4) == (1.0, 0.0, False)
    assert sl.exact_rule("softmax", 4, 2, sl.spikes(2, 2.5)) is not None


# ----------------------------------------------------------------------------- 10. long contexts, "auto", temperatures


@pytest.mark.exact_route
def test_bayes_at_a_million_tokens_is_not_refused_by_its_check(capsys, monkeypatch):
    """Issue 54 item 10: ``bayes --set problem.L=1000000`` was refused by its Sobol cross-check, although the
    exact route takes any L. The risks are stubbed (the real run: the slow test below): only the exact route's
    risk is asked for, the rule's check is not."""
    import singleloc.bayes._bayes
    from singleloc.bayes._population_risk import RiskEstimate

    routes = []
    stub = lambda *a, route, **k: routes.append(route) or RiskEstimate(0.5, 0.0, (), 0)  # noqa: E731
    monkeypatch.setattr(singleloc.bayes._bayes, "bayes_risk", stub)
    assert main(["bayes", "default", "--set", "problem.L=1000000"]) == 0
    captured = capsys.readouterr()
    assert routes == ["exact"] and captured.err == "", captured
    assert captured.out.splitlines()[-1] == (
        "no independent check: its Sobol rule cannot be built here: the theory's quadrature integrates over problem.L * "
        "problem.F = 2000000 Gaussian dimensions, more than the 21201 of SciPy's Sobol sequence")


@pytest.mark.slow
@pytest.mark.exact_route
def test_bayes_at_a_million_tokens_runs_on_the_exact_route_and_says_it_has_no_check(capsys):
    """The real run: a risk in (0, 1) (the Bayes risk of one spike among L tokens is not known in closed form at
    finite strength), and why it is unchecked, in the JSON and on stderr."""
    assert main(["bayes", "default", "--set", "problem.L=1000000", "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["route"] == "exact" and out["check"] is None and 0 < out["bayes_risk"]["value"] < 1
    assert "2000000 Gaussian dimensions, more than the 21201 of SciPy's Sobol sequence" in out["unchecked"]
    assert "singleloc bayes: warning: no independent check of the exact route" in captured.err


def test_the_memory_check_runs_for_automatic_points(monkeypatch):
    """Issue 54 item 10: with ``theory.points = "auto"`` the memory check was skipped."""
    from singleloc.preflight import _resources

    monkeypatch.setenv("SINGLELOC_MEMORY_LIMIT", "8.2G")  # 8.8 GB, the run about 9 (7.9 of them the rule's nodes)
    cfg = load_config("default", ["theory.route=rule", "theory.points=auto", "problem.L=1000", "model.heads=8"])
    with pytest.raises(MemoryError, match=r"for the theory's quadrature \(theory.points = 8192 at least, 'auto' x problem.L = "
                                          r"1000 x model.heads = 8, 1 start\(s\)\).*; e.g. sgd.n_save = (\d+),") as err:
        _resources.check_run(build(cfg), theory_starts=1)
    fits = int(re.search(r"e.g. sgd.n_save = (\d+),", str(err.value)).group(1))
    _resources.check_run(build(cfg.replace(sgd={"n_save": fits})), theory_starts=1)  # the suggestion fits
    monkeypatch.setenv("SINGLELOC_MEMORY_LIMIT", "2G")  # no saved times or points fit: fewer heads or tokens
    with pytest.raises(MemoryError, match=r"; e.g. (model.heads|problem.L) = \d+, or set SINGLELOC_MEMORY_LIMIT"):
        _resources.check_run(build(cfg), theory_starts=1)
    wide = load_config("default", ["theory.route=rule", "theory.points=auto", "problem.L=100000"])
    with pytest.raises(ValueError, match="200000 Gaussian dimensions, more than the 21201 of SciPy's Sobol sequence; e.g. "
                                         "problem.L = 10600"):
        _resources.check_run(build(wide), theory_starts=1)


@pytest.mark.parametrize("args, words", [
    (["--temperature", "1e-300"], "temperatures: must lie in [1e-100, 1e+100]"),
    (["--epsilon", "1e300"], "epsilons: must lie in [1e-100, 1e+100]"),
])
def test_diagnose_refuses_a_temperature_beyond_what_it_can_draw(tmp_path, capsys, args, words):
    """Issue 54 item 10: ``diagnose --temperature 1e-300`` failed with "cannot convert float infinity to integer"."""
    attn = tmp_path / "attn.npy"
    np.save(attn, np.full((2, 4, 4), 0.25))
    assert main(["diagnose", str(attn), *args, "--out", str(tmp_path / "o")]) == 2
    line = one_line(capsys, "diagnose")
    assert words in line and "; e.g. 1e" in line, line


# ----------------------------------------------------------------------------- the hostile pass: what it found


def test_a_reference_used_under_two_keys_names_the_key_it_is_used_as(user_module, capsys):
    """An activation named as a prior (after its use as an activation in the same process) was blamed on
    ``model.activation``: one guard per reference and key."""
    import singleloc as sl

    sl.get_activation(f"{user_module}:honest")
    assert main(["bayes", "default", "--set", f"problem.prior={user_module}:honest"]) == 2
    assert one_line(capsys, "bayes").startswith(f"singleloc bayes: error: problem.prior: '{user_module}:honest' raised ")


@pytest.mark.parametrize("args, words", [
    (["bayes", "default", "--replicates", "1000000000000"], "argument --replicates: must be <= 1024, got 1000000000000; "
                                                            "e.g. 1024"),
    (["bayes", "default", "--set", "theory.points=auto"], "the Bayes risk's Sobol rules need a number of points: e.g. "
                                                          "theory.points = 4096"),
    (["simulate", "default", *TINY, "--set", "sgd.batch=1000000"], "fewer than two distinct saved steps; e.g. sgd.batch = 200"),
    (["diagnose", "ATTN", "--seed", "99999999999999999999999"], "(the largest 64-bit integer), got 99999999999999999999999; "
                                                                "e.g. 0"),
    (["prune", "RUN", "--order", "random", "--draws", "1000000000"], "argument --draws: must be <= 10000, got 1000000000; "
                                                                       "e.g. 10000"),
    (["diagnose", "ATTN", "--top-n", "3", "2"], "top_n must be an increasing sequence of at least 1 value(s), got [3, 2]; "
                                                "e.g. [2, 3]"),
])
def test_what_the_hostile_pass_found_is_one_line_with_a_possible_value(tmp_path, capsys, args, words):
    """``bayes --replicates 1e12`` and ``prune --draws 1e9`` ran silently for ever, ``bayes`` with ``theory.points =
    "auto"`` skipped its check instead of asking for points, and these refusals suggested nothing or an impossible
    value."""
    attn = tmp_path / "attn.npy"
    np.save(attn, np.full((2, 4, 4), 0.25))
    args = [str(attn) if a == "ATTN" else str(tmp_path) if a == "RUN" else a for a in args]
    out = ["--out", str(tmp_path / "o")] if args[0] in ("simulate", "diagnose") else []
    assert main([*args, *out]) == 2
    assert words in one_line(capsys, args[0])


def test_a_bayes_rule_beyond_memory_suggests_the_points_that_fit(monkeypatch):
    import singleloc as sl
    from singleloc.bayes._bayes import check_bayes

    monkeypatch.setenv("SINGLELOC_MEMORY_LIMIT", "1G")
    with pytest.raises(MemoryError, match=r"the quadrature \(theory.points = 65536\)\).*; e.g. theory.points = \d+,") as err:
        check_bayes(sl.flipped(6, 2.5), 4, 65536)  # the Bayes point's check: 12 heads
    check_bayes(sl.flipped(6, 2.5), 4, int(re.search(r"theory.points = (\d+),", str(err.value)).group(1)))  # it fits


# ----------------------------------------------------------------------------- issue 62: messages that name the key


def test_automatic_points_go_through_the_memory_check_of_each_count_they_try(monkeypatch):
    """Issue 62: ``theory.points = "auto"`` doubled its points past what the memory check refuses when the
    same count is given explicitly; now every count it tries passes that check first."""
    import singleloc as sl
    from singleloc.preflight import _resources
    from singleloc.theory import _accuracy

    cfg = load_config("default", ["theory.route=rule", "theory.points=auto", "problem.L=64", "model.heads=4"])
    first = _resources.auto_points(cfg.problem.L, cfg.model.heads, cfg.problem.build_prior())
    parts = lambda n: _resources._memory_parts(build(cfg.replace(theory={"points": n})), False, 1)
    need = {n: _resources.OVERHEAD + sum(parts(n).values()) for n in (first, 2 * first)}
    monkeypatch.setenv("SINGLELOC_MEMORY_LIMIT", str(int((need[first] + need[2 * first]) / 2)))  # the first fits, not twice
    with pytest.raises(MemoryError) as explicit:
        _resources.check_run(build(cfg.replace(theory={"points": 2 * first})), theory_starts=1)
    tried = []
    monkeypatch.setattr(_accuracy, "drift_error", lambda config, y0, n, R: tried.append(n) or 1.0)  # never accurate enough
    with pytest.raises(MemoryError, match=rf"^theory.points = 'auto' would try {2 * first} points \(at {first} points its "
                                          r"estimated relative drift error is 1\), and the run needs") as auto:
        sl.choose_points(build(cfg), sl.initial_conditions(cfg, 1))
    assert tried == [first] and str(auto.value).endswith(str(explicit.value))


def test_a_divergence_with_momentum_names_momentum():
    """Issue 62: ``sgd.momentum = 0.999999`` diverged with "lower sgd.lr"; the rate is lr / (1 - momentum)."""
    from _tiny import tiny

    import singleloc as sl

    with pytest.raises(FloatingPointError, match=r"lower sgd.momentum \(now 0.999999: the rate lr / \(1 - momentum\) = "
                                                 r"5e\+05\) or sgd.lr \(now 0.5\)"):
        sl.integrate(tiny("sgd.momentum=0.999999", rule=True))


@pytest.mark.parametrize("horizon", ["1e-300", "1e-9", "1e300", "2e7"])
def test_a_horizon_out_of_reach_is_refused_up_front_naming_it(horizon, tmp_path, capsys):
    """Issue 62: ``--horizon 1e-300`` was blamed on stiffness 160 s later, a huge one named sgd.tau_max."""
    assert main(["integrate", "default", *TINY, "--horizon", horizon, "--out", str(tmp_path / "o")]) == 2
    line = one_line(capsys, "integrate")
    assert "argument --horizon: must lie in [0.001, 1e+07]" in line and "tau_max" not in line, line


@pytest.mark.slow
def test_ctrl_c_while_a_sweep_starts_its_workers_is_one_line(tmp_path):
    """Issue 62: Ctrl-C while ``sweep --workers 2`` started its workers printed a multiprocessing traceback and
    "leaked semaphore objects" after "interrupted" (or hung 10 s): the workers started are killed, the
    semaphores released before the process ends."""
    pytest.importorskip("distributed")
    args = ["-m", "singleloc", "sweep", "default", *TINY, "--set", "problem.L=3", "--grid", "model.heads=1,2",
            "--workers", "2", "--out", "o"]
    env = {**os.environ, "SINGLELOC_PROGRESS": "lines"}  # the phase lines, which the suite turns off
    code, seconds, err = interrupt(args, tmp_path, wait_for="escape predictions and Bayes risks", delay=1.5, env=env)
    assert code == 130 and seconds < 3.0, (code, seconds, err)
    assert err.strip().splitlines()[-1] == "singleloc sweep: interrupted" and "Traceback" not in err and "leaked" not in err

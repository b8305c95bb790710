"""The public API's arguments checked at the door (issue 62 item 4, :mod:`singleloc.ground._arguments`): every
public callable answers an argument of the wrong type or shape with one ``TypeError`` (or ``ValueError``) line
naming the function, the argument and what it expects, before anything is traced or compiled; a new public name
is either checked here or exempted with its reason."""

from __future__ import annotations

import inspect
import pickle

import jax
import numpy as np
import pytest

import singleloc as sl
from singleloc.configuration._config import load_config
from singleloc.preflight._build import build

#: Public names that check nothing at the door, and why.
EXEMPT = {
    **dict.fromkeys(("FD_EPSILONS", "HEAD_CLASSES", "PRUNING_ORDERS"), "a value, not a callable"),
    **dict.fromkeys(sorted(sl.UNCHECKED), "an activation: a value the package calls in its traced code (not wrapped)"),
    "Activation": "a type (the signature of an activation)",
    **dict.fromkeys(("UniformHeads", "TrainedHeads"), "a head weighting: a record without arguments"),
    **dict.fromkeys(("AbstractExpectation", "AbstractGramTerm", "AbstractHeadWeighting", "AbstractSGDRule", "AbstractVariant"),
                    "an abstract base: its concrete classes are checked"),
    **dict.fromkeys(("OrderParameters", "WeightedOrderParameters", "LayerParameters", "GradientMoments"),
                    "a NamedTuple built in the traced code; a start given to a function is checked there (Starts)"),
    **dict.fromkeys(("LaplaceExpectation", "LaplaceGram", "LaplaceRule", "MonteCarloExpectation", "SobolExpectation",
                     "SobolGram", "ExponentialForm", "RouteChoice", "Setup"),
                    "built by the package from a config (build, OrderParameterODE.from_setup, choose_route, exponential_form)"),
    **dict.fromkeys(("AttentionDiagnosis", "CriticalTopN", "EscapePrediction", "FixedPoint", "HeadClasses", "Linearization",
                     "PhaseAnalysis", "Plateau", "PointsChoice", "PruningResult", "RiskEstimate", "SDEResult",
                     "SimulationResult", "SweepStats", "TheoryResult", "TopN", "Trajectory", "VanishingAttention", "Run"),
                    "a result the package returns (or load_run reads), not built by hand"),
    **dict.fromkeys(("Problem", "Model", "SGD", "Simulation", "Theory", "Prior"),
                    "a specification: its own validation names the key (ValueError, tested in test_config and test_hostile)"),
}


class Wrong:
    """A value no annotation accepts."""

    def __repr__(self) -> str:
        return "Wrong()"


def _functions() -> list[str]:
    return [name for name in sl.__all__ if inspect.isfunction(getattr(sl, name)) and name not in EXEMPT]


#: Records (classes) that check their arguments: a call with a wrong one and the argument it names.
RECORDS = {
    "Config": (lambda: sl.Config(model={"heads": 3}), "model"),
    "OnlineSGD": (lambda: sl.OnlineSGD("abc"), "lr"),
    "GradientFlow": (lambda: sl.GradientFlow(0.5, train_bias="yes"), "train_bias"),
    "MiniBatch": (lambda: sl.MiniBatch("4"), "size"),
    "Momentum": (lambda: sl.Momentum(None), "beta"),
    "WeightDecay": (lambda: sl.WeightDecay([0.1]), "weight_decay"),
    "LearningRateSchedule": (lambda: sl.LearningRateSchedule(3), "kind"),
    "Grid": (lambda: sl.Grid("model", "heads", "1,2"), "values"),
    "OrderParameterODE": (lambda: sl.OrderParameterODE.from_setup({"model": {"heads": 2}}), "setup"),
    "LocalFields": (lambda: sl.LocalFields.make(4, 2, np.zeros(2), 64), "prior"),
    "TheoryRisk": (lambda: sl.TheoryRisk(build(load_config("default")), np.zeros((2, 2)), np.eye(2), "b"), "b"),
    "WeightsRisk": (lambda: sl.WeightsRisk(build(load_config("default")), np.zeros((2, 8)), np.zeros(2), np.zeros((2, 7))),
                    "kstar"),
}


def test_every_public_name_is_checked_or_exempted_with_a_reason():
    """A new public name fails here until it is a checked function (every argument annotated), a record of
    :data:`RECORDS` or an entry of :data:`EXEMPT`."""
    unchecked = []
    for name in sl.__all__:
        obj = getattr(sl, name)
        if name in EXEMPT:
            assert name not in RECORDS and not hasattr(obj, "__wrapped__"), f"{name} is checked and exempted"
        elif inspect.isclass(obj):
            unchecked += [name] * (name not in RECORDS)
        elif not hasattr(obj, "__wrapped__"):
            unchecked.append(name)
    assert not unchecked, f"public names neither checked nor in EXEMPT: {unchecked}"


#: Arguments of checked functions left without an annotation, and why.
UNANNOTATED = {
    ("bayes_point", "dtype"): "anything NumPy reads as a dtype",
    ("integrate_sde", "D"): "a number or one per path, checked with the config's D",
    ("integrate_sde", "ts"): "checked as integrate's",
    ("prune_run", "run"): "a Run: the run folders stand a floor above the pruning (checked by hand, named with the remedy)",
    ("save_figure", "fig"): "a matplotlib figure (matplotlib is imported by the figures only)",
    ("warn_if_risk_rose", "simulation"): "a result of this package",
    ("warn_if_risk_rose", "theory"): "a result of this package",
}


@pytest.mark.parametrize("name", _functions())
def test_a_wrong_first_argument_is_one_line_naming_the_function_and_the_argument(name, programs):
    """Every argument of every checked function is annotated (or in :data:`UNANNOTATED`), and a value no
    annotation takes, given for all of them, is refused naming the first, before anything is traced."""
    fn = getattr(sl, name)
    params = [p for p in inspect.signature(fn).parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    hints = fn.__wrapped__.__annotations__
    assert not [p.name for p in params if p.name not in hints and (name, p.name) not in UNANNOTATED]
    if not params:
        return
    first = next(p.name for p in params if p.name in hints)
    with pytest.raises(TypeError) as err:
        fn(**{p.name: Wrong() for p in params})
    message = str(err.value)
    assert message.startswith(f"{name}: {first} must be ") and message.endswith("got Wrong Wrong()"), message
    assert "\n" not in message
    assert programs == []


def _checked_callables():
    """``(name, function)`` of every checked public function and checked method of a public class (unwrapped)."""
    for name in sl.__all__:
        obj = getattr(sl, name)
        if hasattr(obj, "__wrapped__") and not inspect.isclass(obj):
            yield name, obj.__wrapped__
        for method in ("from_setup", "from_specs", "make", "__init__") if inspect.isclass(obj) else ():
            if hasattr(vars(obj).get(method), "__wrapped__") or hasattr(getattr(vars(obj).get(method), "__func__", None),
                                                                         "__wrapped__"):
                yield f"{name}.{method}", inspect.unwrap(getattr(obj, method))


def test_every_default_passes_its_annotation_or_is_none_for_data_a_call_needs():
    """A default the check would refuse is a mistake in the annotation, except ``None`` where the signature puts data
    after optional keywords (``prune_theory(config=None, M=None, ...)``), which the check names as missing."""
    import typing

    from beartype.door import is_bearable

    from singleloc.ground._arguments import _Public, beartype_conf

    names, wrong = [], []
    for name, fn in _checked_callables():
        names.append(name)
        hints = typing.get_type_hints(fn, localns=_Public(), include_extras=True)
        for p in inspect.signature(fn).parameters.values():
            if p.name in hints and p.default is not p.empty and p.default is not None:
                wrong += [f"{name}({p.name}={p.default!r})"] * (not is_bearable(p.default, hints[p.name], conf=beartype_conf()))
    assert {"integrate", "TheoryRisk.__init__", "OrderParameterODE.from_setup", "LocalFields.make"} <= set(names)
    assert not wrong


def _calls():
    M, Q, b = np.zeros((2, 3)), np.eye(2), np.zeros(2)
    cfg = load_config("default")
    prior = sl.spikes(3, 2.5)
    return {  # the issue's callables with wrong types, None, dicts and shapes that disagree
        "Config": (lambda: sl.Config("abc"), "Config: problem must be a singleloc.Problem, got str 'abc'"),
        "choose_route": (lambda: sl.choose_route(cfg.problem, "abc", cfg.theory),
                         "choose_route: model must be a singleloc.Model"),
        "bayes_route": (lambda: sl.bayes_route({"atoms": 1}), "bayes_route: prior must be a singleloc.Prior, got dict"),
        "add_to_run": (lambda: sl.add_to_run(None, {}), "add_to_run: run must be a singleloc.Run, got NoneType None"),
        "overlaps D": (lambda: sl.overlaps(np.ones((2, 5)), np.ones((1, 4))),
                       r"overlaps: kstar must be a real array of shape \(F, D\), got ndarray of dtype float64 and "
                       r"shape \(1, 4\)"),
        "overlaps complex": (lambda: sl.overlaps(np.ones((2, 5), complex), np.ones((1, 5))), "overlaps: K must be a real array"),
        "prune": (lambda: sl.prune("abc", 2), "prune: evaluate must be a function, got str 'abc'"),
        "config_hash": (lambda: sl.config_hash(["a"]), "config_hash: config must be a singleloc.Config or a mapping"),
        "integrate y0 shapes": (lambda: sl.integrate(cfg, (M, np.eye(3), b)), "integrate: y0 must be the starts"),
        "integrate ts": (lambda: sl.integrate(cfg, ts="0:1"), "integrate: ts must be a real array of shape \\(T,\\)"),
        "classify_heads Q": (lambda: sl.classify_heads(M, np.eye(3)),
                             r"classify_heads: Q must be a real array of shape \(\*S, H, H\)"),
        "classify_heads mean": (lambda: sl.classify_heads(M, Q, mean=np.zeros(2)),
                                r"classify_heads: mean must be a real array of shape \(F,\)"),
        "population_risk b": (lambda: sl.population_risk(prior, 4, "softmax", M, Q, np.zeros(3)), "population_risk: b must be"),
        "population_risk L": (lambda: sl.population_risk(prior, "4", "softmax", M, Q, b),
                              "population_risk: L must be an integer"),
        "bayes_risk points": (lambda: sl.bayes_risk(prior, 4, points=None),
                              "bayes_risk: points must be an integer, got NoneType"),
        "keep_heads kept": (lambda: sl.keep_heads(M, Q, b, "01"),
                            r"keep_heads: kept must be a sequence of integers or an integer array of shape \(K,\), got str '01'"),
        "r_orth": (lambda: sl.r_orth(M, np.eye(3)), r"r_orth: Q must be a real array of shape \(H, H\)"),
        "psd_sqrt": (lambda: sl.psd_sqrt(np.zeros((2, 3))), r"psd_sqrt: A must be a real array of shape \(\*S, N, N\)"),
        "initial_conditions": (lambda: sl.initial_conditions(cfg, "2"), "initial_conditions: seeds must be an integer"),
        "simulate": (lambda: sl.simulate(cfg, progress="yes"), "simulate: progress must be True or False"),
        "sweep": (lambda: sl.sweep(cfg, "model.heads=1,2"), "sweep: grids must be a sequence of singleloc.Grid items"),
        "save_run": (lambda: sl.save_run(3, cfg, {}), "save_run: directory must be a string or a path, got int 3"),
        "load_run": (lambda: sl.load_run(None), "load_run: directory must be a string or a path, got NoneType"),
        "removable_heads": (lambda: sl.removable_heads("abc"), "removable_heads: risk must be"),
        "select_top_n": (lambda: sl.select_top_n(np.ones(4), "2"), "select_top_n: n must be an integer, got str '2'"),
        "register_activation": (lambda: sl.register_activation("mine", "softmax"), "register_activation: fn must be a function"),
        "escape_horizon": (lambda: sl.escape_horizon("10"), "escape_horizon: predicted must be a number, got str"),
        "set_progress": (lambda: sl.set_progress(True), "set_progress: mode must be a string, got bool True"),
    }


@pytest.mark.parametrize("case", list(_calls()))
def test_the_issues_wrong_types_are_one_line_naming_function_and_argument(case, programs):
    call, words = _calls()[case]
    with pytest.raises(TypeError, match="^" + words) as err:
        call()
    assert "\n" not in str(err.value)
    assert programs == []


@pytest.mark.parametrize("name", list(RECORDS))
def test_a_record_refuses_a_wrong_field_naming_the_class_and_the_field(name, programs):
    call, argument = RECORDS[name]
    with pytest.raises(TypeError, match=f"^{name}(.make)?(.from_setup)?: {argument} must be ") as err:
        call()
    assert "\n" not in str(err.value)
    assert programs == []


def test_values_a_type_cannot_state_are_still_refused():
    """Ranges and finite values stay with the callee (ValueError naming the function and the argument)."""
    with pytest.raises(ValueError, match=r"^classify_heads: M holds 2 NaN"):
        sl.classify_heads(np.full((2, 1), np.nan), np.eye(2))
    with pytest.raises(ValueError, match=r"^prune: heads: must be >= 1"):
        sl.prune(lambda kept: (0.0, 0.0), 0)
    with pytest.raises(ValueError, match=r"^config_hash: config must be a singleloc.Config or its to_dict\(\)"):
        sl.config_hash({"a": 1})


def test_the_check_passes_numpy_jax_and_traced_arrays_and_the_package_skips_it():
    """Right arguments reach the function unchanged (NumPy, JAX, a tracer: a jaxpr is made, nothing compiled);
    the package's own calls go to the private function."""
    from singleloc.theory import _theory

    M, Q = np.array([[0.5, 0.1], [0.0, 0.2]]), np.array([[1.0, 0.1], [0.1, 1.0]])
    np.testing.assert_array_equal(sl.r_orth(M, Q), Q - M @ M.T)
    np.testing.assert_array_equal(sl.r_orth(jax.numpy.asarray(M), Q), Q - M @ M.T)
    assert "sub" in str(jax.make_jaxpr(sl.r_orth)(M, Q))
    assert sl.r_orth.__wrapped__ is _theory.r_orth and sl.r_orth is not _theory.r_orth
    assert pickle.loads(pickle.dumps(sl.r_orth)) is sl.r_orth  # by reference, as singleloc.r_orth (a process pool's)
    assert sl.removable_heads([0.2, 0.2, 0.3], 0.01) == sl.removable_heads(np.array([0.2, 0.2, 0.3]), 0.01) == 1


def test_values_that_gave_a_silent_wrong_answer_are_refused():
    """Issue 62 item 6 (a hostile pass): heads out of range or repeated gave another sub-layer (index 5 of two heads
    kept head 1), a NaN risk or a negative tol a count, NaN order parameters a NaN risk, and the exact route in
    float32 a NaN Bayes risk; each is now one line naming the argument (or JAX's float64 mode)."""
    M, Q, b = np.ones((2, 2)), np.eye(2), np.zeros(2)
    for kept in ([0, 0], [5], [-1]):
        with pytest.raises(ValueError, match=r"^keep_heads: kept must be distinct heads in 0..1, got"):
            sl.keep_heads(M, Q, b, kept)
    for risk, tol, words in (([0.1, np.nan, 0.2], 0.01, "risk holds 1 NaN or infinite value"),
                             ([0.1, 0.2], -1.0, "tol: must be >= 0"), ([0.1, 0.2], np.nan, "tol: must be finite")):
        with pytest.raises(ValueError, match=rf"^removable_heads: {words}"):
            sl.removable_heads(risk, tol)
    with pytest.raises(ValueError, match=r"^population_risk: M holds 2 NaN or infinite value\(s\)"):
        sl.population_risk(sl.spikes(2, 1.0), 4, "softmax", np.full((1, 2), np.nan), np.eye(1), np.zeros(1))
    x64 = jax.config.jax_enable_x64
    try:  # refused before anything is built or compiled
        jax.config.update("jax_enable_x64", False)
        with pytest.raises(RuntimeError, match=r"^population_risk on the exact route needs JAX's float64 mode"):
            sl.bayes_risk(sl.spikes(2, 1.0), 4)
    finally:
        jax.config.update("jax_enable_x64", x64)


_NAN = float("nan")


@pytest.mark.parametrize("call, words", [
    (lambda: sl.escape_horizon(10.0, multiple=_NAN), "escape_horizon: multiple: must be finite"),
    (lambda: sl.escape_horizon(10.0, cap=float("inf")), "escape_horizon: cap: must be finite"),
    (lambda: sl.escape_horizon(_NAN, fallback=-1.0), "escape_horizon: fallback: must be > 0"),
    (lambda: sl.escape_horizon(-5.0), "escape_horizon: predicted must be >= 0"),
    (lambda: sl.halfway_time([0.0, 1.0, 2.0], [1.0, _NAN, 0.0], 0.0, 1.0, 0.0), "halfway_time: risk holds 1 NaN"),
    (lambda: sl.halfway_time([0.0, 1.0], [1.0, 0.0], 0.0, _NAN, 0.0), "halfway_time: r_from holds 1 NaN"),
    (lambda: sl.plateaus([1.0, 2.0, 3.0, 4.0], [1.0, _NAN, 0.0, 0.0]), "plateaus: risk holds 1 NaN"),
    (lambda: sl.plateaus([1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 0.0, 0.0], plateau_tol=-1.0), "plateaus: plateau_tol: must be > 0"),
    (lambda: sl.plateaus([1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 0.0, 0.0], prominence=_NAN), "plateaus: prominence: must be finite"),
    (lambda: sl.initial_overlaps(0, 0, 2, 2, 10, _NAN), "initial_overlaps: init_scale: must be finite"),
    (lambda: sl.seed_keys(-1, 0), "seed_keys: seed: must be >= 0"),
    (lambda: sl.seed_keys(2**70, 0), "seed_keys: seed: must be <= 4294967295"),
    (lambda: sl.seed_keys(0, 2**40), "seed_keys: index: must be <= 4294967295"),  # JAX kept its low 32 bits: seed 0's keys
    (lambda: sl.spikes(10**12, 1.0), r"problem.F: 1000000000000 is too large: the prior's F x F float64"),
])
def test_bad_values_are_one_value_error_naming_function_and_argument(call, words, programs):
    """Issue 62 (a hostile pass): each gave a silent answer (the fallback horizon, NaN overlaps, another seed's
    keys) or an error naming no argument (NumPy's "array is too big", "cannot convert float NaN to integer")."""
    with pytest.raises(ValueError, match="^" + words) as err:
        call()
    assert "\n" not in str(err.value)
    assert programs == []

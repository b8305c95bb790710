"""Run configurations: presets, the documented defaults, --set overrides, and validation
errors that name the offending ``section.key``."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import singleloc
from singleloc import Config, load_config, preset_names
from singleloc.cli import main
from singleloc.configuration._config import parse_override


def test_presets_exist_and_load():
    names = preset_names()
    for name in ("default", "softmax1", "bsoftmax"):
        assert name in names
        cfg = load_config(name)
        assert isinstance(cfg, Config)
    assert load_config("default").model.activation == "softmax"
    assert load_config("softmax1").model.activation == "softmax1"
    assert load_config("bsoftmax").model.activation == "bsoftmax"
    assert load_config("softmax1").model.train_bias is True
    assert load_config("bsoftmax").model.train_bias is True


def _check_documented_defaults(cfg: Config, activation="softmax", train_bias=False):
    pb, m, sgd, sim = cfg.problem, cfg.model, cfg.sgd, cfg.simulation
    assert (pb.L, pb.F, pb.prior, pb.strength) == (4, 2, "spikes", 2.5)
    assert (m.heads, m.activation, m.train_bias, m.bias_init) == (2, activation, train_bias, 0.0)
    assert (sgd.lr, sgd.init_scale, sgd.tau_max, sgd.n_save, sgd.spacing) == (0.5, 0.5, 30.0, 61, "linear")
    assert (sim.D, sim.seeds, sim.seed, sim.test_samples) == (1000, 4, 0, 4096)


def test_default_preset_values():
    _check_documented_defaults(load_config("default"))


def test_builtin_defaults_equal_default_preset():
    _check_documented_defaults(Config())
    _check_documented_defaults(load_config(None))
    assert load_config(None) == load_config("default")


def test_other_presets_differ_only_in_activation_and_bias():
    _check_documented_defaults(load_config("softmax1"), "softmax1", True)
    _check_documented_defaults(load_config("bsoftmax"), "bsoftmax", True)


def test_prior_built_from_default():
    prior = load_config("default").problem.build_prior()
    np.testing.assert_allclose(prior.mean(), [1.25, 1.25])


def test_save_times():
    sgd = load_config("default").sgd
    np.testing.assert_allclose(sgd.save_times(), np.arange(61) * 0.5)
    log = load_config("default", ["sgd.spacing=log", "sgd.n_save=4", "sgd.tau_max=10"]).sgd.save_times()
    np.testing.assert_allclose(log, [0.0, 0.01, np.sqrt(0.01 * 10), 10.0], rtol=1e-12)


# -- overrides ----------------------------------------------------------------------------


def test_override_types():
    cfg = load_config(
        "default",
        [
            "model.heads=4",  # int
            "sgd.lr=0.25",  # float
            "sgd.tau_max=3",  # int where a float is expected
            "model.train_bias=true",  # bool
            "model.activation=softmax1",  # bare word -> string
            'problem.prior="binary"',  # quoted string
            "problem.p=0.3",
            "problem.F=3",
            "simulation.D=128",
        ],
    )
    assert cfg.model.heads == 4 and isinstance(cfg.model.heads, int)
    assert cfg.sgd.lr == 0.25
    assert cfg.sgd.tau_max == 3.0 and isinstance(cfg.sgd.tau_max, float)
    assert cfg.model.train_bias is True
    assert cfg.model.activation == "softmax1"
    assert cfg.problem.prior == "binary" and cfg.problem.p == 0.3 and cfg.problem.F == 3
    assert cfg.simulation.D == 128
    np.testing.assert_allclose(cfg.problem.build_prior().mean(), [0.75, 0.75, 0.75])


def test_override_lists():
    cfg = load_config(
        None,
        ["problem.prior=discrete", "problem.support=[[1.0, 0.0], [0.0, 2.0], [1, 1]]", "problem.probs=[0.5, 0.25, 0.25]"],
    )
    prior = cfg.problem.build_prior()
    np.testing.assert_allclose(prior.atoms_array(), [[1, 0], [0, 2], [1, 1]])
    np.testing.assert_allclose(prior.mean(), [0.75, 0.75])
    cfg = load_config(None, ["problem.prior=gaussian", "problem.mean=[1, -1]", "problem.cov=[[2.0, 0.5], [0.5, 1.0]]"])
    np.testing.assert_allclose(cfg.problem.build_prior().cov(), [[2.0, 0.5], [0.5, 1.0]])


def test_parse_override():
    assert parse_override("model.heads=3") == ("model", "heads", 3)
    assert parse_override("sgd.lr = 1e-2") == ("sgd", "lr", 0.01)
    assert parse_override("model.train_bias=false") == ("model", "train_bias", False)
    assert parse_override("problem.probs=[0.5, 0.5]") == ("problem", "probs", [0.5, 0.5])
    assert parse_override("model.activation=bsoftmax") == ("model", "activation", "bsoftmax")


def test_later_override_wins_and_replace():
    cfg = load_config("default", ["model.heads=3", "model.heads=5"])
    assert cfg.model.heads == 5
    cfg2 = cfg.replace(model={"heads": 1}, sgd={"lr": 0.1})
    assert cfg2.model.heads == 1 and cfg2.sgd.lr == 0.1 and cfg.model.heads == 5


def test_toml_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[model]\nheads = 3\nactivation = "bsoftmax"\n[simulation]\nD = 200\n')
    cfg = load_config(path, ["simulation.seeds=2"])
    assert cfg.model.heads == 3 and cfg.model.activation == "bsoftmax"
    assert cfg.simulation.D == 200 and cfg.simulation.seeds == 2
    assert cfg.sgd.lr == 0.5  # untouched keys keep the defaults
    assert load_config(str(path)) == load_config(path)


def test_to_dict_roundtrip():
    cfg = load_config("bsoftmax", ["problem.prior=gaussian", "problem.cov=[[1.0, 0.2], [0.2, 0.5]]"])
    assert Config.from_dict(cfg.to_dict()) == cfg


# -- bad configs ------------------------------------------------------------------------

BAD_OVERRIDES = [
    ("model.activation=relu6", "model.activation"),
    ("problem.L=-2", "problem.L"),
    ("problem.L=1", "problem.L"),
    ("problem.F=0", "problem.F"),
    ("model.heads=0", "model.heads"),
    ("model.heads=2.5", "model.heads"),
    ("model.heads=two", "model.heads"),
    ("model.train_bias=1", "model.train_bias"),
    ("model.bias_init=inf", "model.bias_init"),
    ("sgd.lr=0", "sgd.lr"),
    ("sgd.lr=-0.1", "sgd.lr"),
    ("sgd.lr=nan", "sgd.lr"),
    ("sgd.init_scale=-1", "sgd.init_scale"),
    ("sgd.tau_max=0", "sgd.tau_max"),
    ("sgd.n_save=1", "sgd.n_save"),
    ("sgd.spacing=cubic", "sgd.spacing"),
    ("simulation.D=-5", "simulation.D"),
    ("simulation.seeds=0", "simulation.seeds"),
    ("simulation.seed=-1", "simulation.seed"),
    ("simulation.test_samples=0", "simulation.test_samples"),
    ("problem.strength=-2.5", "problem.strength"),
    ("problem.prior=laplace", "problem.prior"),
    ("theory.points=1000", "theory.points"),
    ("theory.gram_points=1000", "theory.gram_points"),
    ("theory.gram_points=8", "theory.gram_points"),
    ("theory.gram_points=many", "theory.gram_points"),
    ("theory.axes=eigen", "theory.axes"),
    ("theory.rtol=0", "theory.rtol"),
    ("sgd.speed=3", "sgd.speed"),  # unknown key
]


@pytest.mark.parametrize("override, name", BAD_OVERRIDES, ids=[o for o, _ in BAD_OVERRIDES])
def test_bad_override_names_parameter(override, name):
    with pytest.raises(ValueError) as err:
        load_config("default", [override])
    assert name in str(err.value)


BAD_PROBLEMS = [
    (["problem.prior=gaussian", "problem.cov=[[1.0, 2.0], [2.0, 1.0]]"], "problem.cov"),  # not PSD
    (["problem.prior=gaussian", "problem.cov=-1.0"], "problem.cov"),
    (["problem.prior=discrete", "problem.support=[[1.0, 0.0], [0.0, 1.0]]", "problem.probs=[0.5, 0.6]"], "problem.probs"),
    (["problem.prior=discrete", "problem.support=[[1.0, 0.0], [0.0, 1.0]]", "problem.probs=[1.5, -0.5]"], "problem.probs"),
    (["problem.prior=binary", "problem.p=1.5"], "problem.p"),
    (["problem.prior=binary", "problem.p=0"], "problem.p"),
    (["problem.prior=discrete", "problem.support=[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]"], "problem.F"),  # F = 2 != 3
    (["problem.prior=gaussian", "problem.mean=[0.0, 0.0, 0.0]"], "problem.F"),
]


@pytest.mark.parametrize("overrides, name", BAD_PROBLEMS, ids=[" ".join(o[1:]) for o, _ in BAD_PROBLEMS])
def test_bad_prior_config_names_parameter(overrides, name):
    with pytest.raises(ValueError) as err:
        load_config("default", overrides)
    assert name in str(err.value)


def test_unknown_section():
    with pytest.raises(ValueError, match="optimizer"):
        load_config("default", ["optimizer.lr=0.1"])
    with pytest.raises(ValueError, match="optimizer"):
        load_config({"optimizer": {"lr": 0.1}})


def test_unknown_key_in_dict():
    with pytest.raises(ValueError, match=r"model\.depth"):
        load_config({"model": {"depth": 2}})


def test_malformed_override():
    for text in ("heads=3", "model.heads", "modelheads3"):
        with pytest.raises(ValueError, match="section.key=value"):
            load_config("default", [text])


def test_bad_toml_file(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[model\nheads = = 3\n")
    with pytest.raises(ValueError, match="broken.toml"):
        load_config(path)


def test_a_toml_file_with_a_byte_order_mark_is_read(tmp_path):
    """Issue 62: a file saved with a UTF-8 byte-order mark (Windows editors) was "not valid TOML"."""
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf[model]\nheads = 3\n")
    assert load_config(path).model.heads == 3


def test_bad_value_in_toml_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[sgd]\nlr = -1.0\n")
    with pytest.raises(ValueError, match=r"sgd\.lr"):
        load_config(path)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="nothere.toml"):
        load_config(tmp_path / "nothere.toml")
    with pytest.raises(ValueError, match="no_such_preset"):
        load_config("no_such_preset")


def test_spec_constructors_validate():
    with pytest.raises(ValueError, match=r"model\.heads"):
        singleloc.Model(heads=-1)
    with pytest.raises(ValueError, match=r"sgd\.lr"):
        singleloc.SGD(lr=float("nan"))
    with pytest.raises(ValueError, match=r"simulation\.D"):
        singleloc.Simulation(D=0)
    with pytest.raises(ValueError, match=r"problem\.F"):
        singleloc.Problem(F=3, prior=singleloc.spikes(2, 1.0))


# -- the CLI reports config errors in one line ----------------------------------------------


@pytest.mark.parametrize("override, name", [("model.heads=0", "model.heads"), ("sgd.spacing=cubic", "sgd.spacing")])
def test_cli_bad_set_is_one_line_error(override, name, tmp_path, capsys):
    rc = main(["simulate", "default", "--set", override, "--out", str(tmp_path / "out"), "--no-progress"])
    assert rc == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert name in lines[0]
    assert "Traceback" not in captured.err and "Traceback" not in captured.out
    assert not (tmp_path / "out").exists()


def test_cli_missing_config_is_one_line_error(tmp_path, capsys):
    rc = main(["simulate", str(tmp_path / "missing.toml"), "--out", str(tmp_path / "out")])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing.toml" in err


# -- malformed structure, bounds, and how CONFIG is resolved (issue 11) ----------------------


@pytest.mark.parametrize("text, words", [
    ("problem = 3\n", "config section [problem] must be a table of keys, got an integer 3"),
    ("[[problem]]\nL = 4\n", "config section [problem] must be a table of keys, got an array"),
    ("[problem]\nprior = [1, 2]\n", "problem.prior: must be a prior name"),
    ("[problem]\nprior = {foo = 1}\n", "problem.prior: a table must hold the keys atoms, noise_cov, probs"),
    ("[problem]\nprior = {atoms = 'x', probs = [1.0], noise_cov = [[0.0]]}\n", "problem.prior: "),
])
def test_malformed_structure_is_a_value_error_naming_the_key(tmp_path, text, words):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(words)):
        load_config(path)


@pytest.mark.parametrize("override, words", [
    ("problem.prior={foo=1}", "problem.prior: a table must hold the keys"),
    ("problem.prior=[1,2]", "problem.prior: must be a prior name"),
    ("problem.prior=3", "problem.prior: must be a prior name"),
    ("simulation.seed=4294967296", "simulation.seed: must be <= 4294967295"),
    ("simulation.seed=100000000000000000000000000000", "simulation.seed: must be <= 4294967295"),
    ("simulation.D=inf", "simulation.D: must be an integer"),
    ("problem.L=nan", "problem.L: must be an integer"),
    ("model.bias_init=1e300", "model.bias_init: must lie in [-1000, 1000]"),
    ("theory.rtol=1e-300", "theory.rtol: must be >= 2.220446049250313e-16"),
])
def test_bad_values_of_issue_11_name_the_key(override, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        load_config("default", [override])


def test_bounds_keep_the_values_at_their_edges():
    cfg = load_config("default", ["simulation.seed=4294967295", "model.bias_init=-1000", "theory.rtol=2.220446049250313e-16"])
    assert (cfg.simulation.seed, cfg.model.bias_init, cfg.theory.rtol) == (2**32 - 1, -1000.0, np.finfo(float).eps)


def test_a_preset_name_is_the_preset_whatever_the_working_folder_holds(tmp_path, monkeypatch):
    """`singleloc simulate default --out default` twice: the folder `default` does not hide the
    preset; ./default names the path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "default").mkdir()
    (tmp_path / "softmax1").write_text("[model]\nheads = 7\n")
    assert load_config("default") == Config()
    assert load_config("softmax1").model.activation == "softmax1"
    assert load_config("./softmax1").model.heads == 7
    with pytest.raises(ValueError, match=r"config file './default' is a folder; expected a TOML file or a preset name"):
        load_config("./default")


@pytest.mark.parametrize("make, words", [
    (lambda p: p.mkdir() or p, "is a folder; expected a TOML file or a preset name"),
    (lambda p: (p.write_bytes(bytes(range(256))), p)[1], "is not UTF-8 text (a binary file?); expected a TOML file"),
    (lambda p: Path("/dev/null"), "'/dev/null' is a character device; expected a TOML file"),
    (lambda p: p, "does not exist"),
])
def test_a_config_path_that_is_not_a_toml_file_says_what_it_is(tmp_path, make, words):
    path = make(tmp_path / "cfg.toml")
    with pytest.raises(ValueError, match=re.escape(words)) as err:
        load_config(path)
    assert str(path) in str(err.value)


def test_an_unknown_bare_name_lists_the_presets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    presets = r"\(bsoftmax, default, showcase, softmax1\)"
    with pytest.raises(ValueError, match=rf"'defualt' is neither a preset {presets} nor an existing file"):
        load_config("defualt")


@pytest.mark.parametrize("L, H, expected", [(4, 2, 16384), (128, 2, 16384), (256, 2, 8192), (1024, 2, 4096), (4096, 4, 4096)])
def test_auto_gram_points_fit_the_node_budget_and_never_go_below_points(L, H, expected):
    """``"auto"``: the largest power of two <= 16384 with points * L * H <= 2^22, at least theory.points."""
    th = load_config("default").theory
    assert th.gram_rule_points(L, H, 4096) == expected
    assert th.gram_rule_points(L, H, 32768) == max(expected, 32768)
    assert load_config("default", ["theory.route=exact", "theory.gram_points=256"]).theory.gram_rule_points(L, H, 4096) == 256

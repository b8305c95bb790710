"""Run configurations: TOML files, named presets and ``--set section.key=value`` overrides.

A config has the sections ``[problem]``, ``[model]``, ``[sgd]``, ``[simulation]`` and ``[theory]``; every key is
optional and takes the default of the matching specification (:class:`Problem`, :class:`Model`, :class:`SGD`,
:class:`Simulation`, :class:`Theory`). Presets are TOML files shipped in ``singleloc/presets``.

``CONFIG`` on the command line (and a string or path given to :func:`load_config`) is resolved as a shell resolves a
command: a name without a folder part that names a preset is the preset (even if a file or folder of that name exists in
the working folder; write ``./NAME`` for that file); anything else is a path, which must be a regular file holding UTF-8
TOML.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib

from ..ground._arguments import _short, check_fields
from ..ground._atomic_files import describe_path
from ..model._priors import Prior
from ._presets import preset_names
from ._specs import SGD, Model, Problem, Simulation, Theory

SECTIONS = {"problem": Problem, "model": Model, "sgd": SGD, "simulation": Simulation, "theory": Theory}

#: The keys ``config.json`` of a run adds beside the sections (see :mod:`singleloc.io._run_folders`);
#: :meth:`Config.from_dict` ignores them, so that ``config.json`` reads back as it is.
RUN_METADATA = ("singleloc_version", "config_hash")


@dataclasses.dataclass(frozen=True)
class Config:
    """A complete, validated run configuration."""

    problem: Problem = Problem()
    model: Model = Model()
    sgd: SGD = SGD()
    simulation: Simulation = Simulation()
    theory: Theory = Theory()

    def __post_init__(self):
        check_fields(self)
        check_combinations(self)  # keys a run would silently drop

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, Any]]) -> Config:
        """Build from nested ``{section: {key: value}}``; unknown sections or keys are errors
        (the :data:`RUN_METADATA` keys are ignored)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"config must be a table of sections, got {type(data).__name__}")
        unknown = set(data) - set(SECTIONS) - set(RUN_METADATA)
        if unknown:
            raise ValueError(f"unknown config section(s) {sorted(unknown)} (known: {', '.join(SECTIONS)})")
        return cls(**{name: spec(**_section_keys(name, data.get(name, {}))) for name, spec in SECTIONS.items()})

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain, JSON-serialisable ``{section: {key: value}}`` (a prior object becomes a table)."""
        # a Prior object becomes the table PRIOR_TABLE
        return {name: {k: v for k, v in dataclasses.asdict(getattr(self, name)).items() if v is not None}
                for name in SECTIONS}

    def replace(self, **sections: Mapping[str, Any]) -> Config:
        """A copy with some keys changed: ``cfg.replace(model={"heads": 4})``. Only the sections
        named are validated again (their ``__post_init__``); the others are the same objects."""
        parts = {}
        for name, values in sections.items():
            if name not in SECTIONS:
                raise ValueError(f"unknown config section {name!r} (known: {', '.join(SECTIONS)})")
            values = _section_keys(name, values)
            if name == "problem":  # a prior written as a table (config.json) becomes a Prior
                values = _restore_prior({"problem": dict(values)})["problem"]
            parts[name] = dataclasses.replace(getattr(self, name), **values)
        return dataclasses.replace(self, **parts)


def config_hash(config: Config | Mapping[str, Any]) -> str:
    """First 16 hex digits of the SHA-256 of the canonical JSON (sorted keys, no spaces) of
    ``config.to_dict()`` (or of the plain dict as stored in ``config.json``)."""
    if isinstance(config, Mapping) and (set(config) != set(SECTIONS) or not all(isinstance(v, Mapping) for v in config.values())):
        raise ValueError(f"config_hash: config must be a singleloc.Config or its to_dict() (the sections "
                         f"{', '.join(SECTIONS)}, each a table), got a {type(config).__name__} with the keys "
                         f"{sorted(map(str, config))}")
    data = config.to_dict() if isinstance(config, Config) else config
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _section_keys(name: str, values: Any) -> Mapping[str, Any]:
    """``values``, the keys given for section ``name``, checked: a table whose keys are fields
    of the section's specification (``ValueError`` naming them otherwise)."""
    if not isinstance(values, Mapping):
        raise ValueError(f"config section [{name}] must be a table of keys, got {_toml_kind(values)} {values!r}")
    fields = {f.name for f in dataclasses.fields(SECTIONS[name])}
    bad = set(values) - fields
    if bad:
        listed = ", ".join(f"{name}.{k}" for k in sorted(bad))
        raise ValueError(f"unknown key(s) {listed} (known: {', '.join(sorted(fields))})")
    return values


def gather_specs(where: str, config: Config | None = None, **specs: Any) -> Config:
    """The specifications a computation runs on, as one :class:`Config` (the bundle the internals pass on): either
    ``config`` (a TOML file's, a preset's) or the specification objects given by keyword (``problem=Problem(...)``,
    ``model=Model(...)``, ...; one not given takes its defaults), never both (``TypeError`` naming ``where``); their
    types are checked at the door (:mod:`~singleloc.ground._arguments`)."""
    if config is not None:
        given = sorted(name for name, spec in specs.items() if spec is not None)
        if given:
            raise TypeError(f"{where}: pass either a config or the specifications ({', '.join(given)}), not both; "
                            f"to change a section of a config: config.replace({given[0]}={{...}})")
        return config
    return Config(**{name: spec for name, spec in specs.items() if spec is not None})


def require_uniform_head_weights(model: Model, where: str) -> None:
    """``ValueError`` naming ``model.head_weights`` when the layer ``model`` is not the head average and
    ``where`` (a computation written for the head average: the SDE, the linearisation and the
    head-symmetric flow, pruning) does not take it."""
    if not model.weighting.head_average:
        raise ValueError(f"{where}: model.head_weights = {model.head_weights!r} is not supported here (it is written "
                         "for the head average a_l = (1/H) sum_h A_hl); integrate, simulate, compare and sweep (with a numeric "
                         "horizon) take trained head weights; set model.head_weights = 'uniform'")


def _toml_kind(value: Any) -> str:
    """``"an integer"``, ``"an array"``, ...: the TOML name of a value's type, for messages."""
    kinds = ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"), (Mapping, "a table"),
             (list, "an array"))
    return next((words for kind, words in kinds if isinstance(value, kind)), f"a {type(value).__name__}")


#: The keys of a prior written as a table (as :meth:`Config.to_dict` writes a :class:`Prior`).
PRIOR_TABLE = tuple(f.name for f in dataclasses.fields(Prior))


def _restore_prior(data: dict) -> dict:
    """Turn a ``problem.prior`` table (a :class:`Prior` as written in ``config.json``) back into a
    :class:`Prior`; a table with other keys or values is a ``ValueError`` naming the key."""
    problem = data.get("problem")
    prior = problem.get("prior") if isinstance(problem, Mapping) else None
    if isinstance(prior, Mapping):
        required = set(PRIOR_TABLE) - {"name"}
        if not required <= set(prior) <= set(PRIOR_TABLE):
            raise ValueError(f"problem.prior: a table must hold the keys {', '.join(sorted(required))} (and optionally name), "
                             f"got {', '.join(sorted(prior)) or 'none'}; or give a prior name")
        try:
            data["problem"] = {**problem, "prior": Prior(**prior)}
        except (TypeError, ValueError) as err:
            raise ValueError(f"problem.prior: {err}") from None
    return data


def _read_toml(source: str | Path) -> dict:
    path, name = Path(source), repr(str(source))
    if not path.exists():
        raise ValueError(f"config file {name} does not exist")
    if not path.is_file():
        raise ValueError(f"config file {name} is {describe_path(path)}; expected a TOML file or a preset name "
                         f"({', '.join(preset_names())})")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark at the start is no TOML
    except UnicodeDecodeError:
        raise ValueError(f"config file {name} is not UTF-8 text (a binary file?); expected a TOML file") from None
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"config file {name} is not valid TOML: {err}") from None


def parse_override(text: str) -> tuple[str, str, Any]:
    """``"section.key=value"`` -> ``(section, key, value)``; the value is read as TOML
    (``2``, ``0.5``, ``true``, ``[1, 2]``, ``"softmax"``), a bare word as a string."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ValueError(f"--set expects section.key=value, got {text!r}")
    lhs, raw = text.split("=", 1)
    section, key = (s.strip() for s in lhs.split(".", 1))
    if section not in SECTIONS:
        raise ValueError(f"--set {text!r}: unknown section {section!r} (known: {', '.join(SECTIONS)})")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return section, key, value


def load_config(source: str | Path | Mapping | None = None, overrides: Sequence[str] = ()) -> Config:
    """Read a config from a TOML path, a preset name, or a dict, then apply overrides.

    Args:
        source: the name of a preset (see :func:`preset_names`), a path to a TOML file (see
            the module docstring for how a string is resolved), a nested dict, or ``None`` for
            the defaults.
        overrides: strings ``"section.key=value"`` applied in order.

    Raises:
        ValueError: ``source`` is neither a preset nor an existing regular file, the file is not
            UTF-8 TOML, or a value is invalid (naming the key).
        TypeError: ``source`` or ``overrides`` of another type (one string of overrides, not a list).
    """
    if isinstance(overrides, (str, bytes)) or not isinstance(overrides, Sequence):
        raise TypeError(f"load_config: overrides must be a list of 'section.key=value' strings, got "
                        f"{type(overrides).__name__} {_short(overrides)}; e.g. [{_short(overrides)}]")
    if source is None:
        data: dict = {}
    elif isinstance(source, Mapping):
        data = dict(source)
    elif isinstance(source, str) and source in preset_names():
        data = tomllib.loads((resources.files("singleloc") / "presets" / f"{source}.toml").read_text())
    elif isinstance(source, str) and Path(source).name == source and Path(source).suffix != ".toml" and not Path(source).exists():
        raise ValueError(f"CONFIG {source!r} is neither a preset ({', '.join(preset_names())}) nor an existing file")
    else:
        data = _read_toml(source)
    for text in overrides:
        if not isinstance(text, str):
            raise TypeError(f"load_config: every override must be a string 'section.key=value', got {_short(text)}")
        section, key, value = parse_override(text)
        current = data.get(section, {})
        if not isinstance(current, Mapping):
            raise ValueError(f"--set {text!r}: config section [{section}] is {_toml_kind(current)}, not a table")
        data[section] = {**current, key: value}
    return Config.from_dict(_restore_prior(data))


#: The prior tables and the named prior that reads them.
PRIOR_TABLES = {"support": "discrete", "probs": "discrete", "mean": "gaussian", "cov": "gaussian"}


def check_combinations(config: Config) -> None:
    """``ValueError`` naming the keys of a combination that a run would silently drop, with a change that
    makes it consistent (a wrong result is worse than a refusal):

    * ``theory.gram`` other than ``"auto"`` or a number of ``theory.gram_points`` with
      ``sgd.gradient_flow``, which has no ``lr^2`` (Gram) term;
    * ``sgd.bias_decay`` without ``model.train_bias`` (a penalty on biases that do not learn);
    * ``problem.support`` or ``problem.probs`` with a prior other than ``"discrete"``, ``problem.mean``
      or ``problem.cov`` with a prior other than ``"gaussian"`` (a user's factory, ``"package.module:function"``,
      may read any key).

    Keys whose defaults are numbers (``problem.p``, ``theory.nodes``, ``sgd.schedule_tau``) cannot be told
    given from defaulted, and are not checked. A Gram key that the chosen route has no use for is refused
    when the route is chosen (:func:`~singleloc.preflight._build.check_gram`): a configuration chooses no route."""
    th, sgd, pb = config.theory, config.sgd, config.problem
    gram_points = th.gram_points != "auto"
    if sgd.gradient_flow and (th.gram != "auto" or gram_points):
        key = f"theory.gram = {th.gram!r}" if th.gram != "auto" else f"theory.gram_points = {th.gram_points}"
        raise ValueError(f"{key} has no effect with sgd.gradient_flow = true, which has no lr^2 (Gram) term; "
                         f"e.g. {'theory.gram' if th.gram != 'auto' else 'theory.gram_points'} = 'auto'")
    if sgd.bias_decay and not config.model.train_bias:
        raise ValueError(f"sgd.bias_decay = {sgd.bias_decay:g} penalises biases that do not learn (model.train_bias = false); "
                         "e.g. model.train_bias = true, or sgd.bias_decay = 0")
    if isinstance(pb.prior, str) and ":" not in pb.prior:
        for key, prior in PRIOR_TABLES.items():
            if getattr(pb, key) is not None and pb.prior != prior:
                raise ValueError(f"problem.{key} applies to problem.prior = '{prior}' only, and problem.prior = "
                                 f"{pb.prior!r}; e.g. problem.prior = '{prior}', or leave problem.{key} out")

"""Run configurations: TOML files, named presets and ``--set section.key=value`` overrides.

A config has the sections ``[problem]``, ``[model]``, ``[sgd]``, ``[simulation]`` and
``[theory]``; every key is optional and takes the default of the matching specification
(:class:`Problem`, :class:`Model`, :class:`SGD`, :class:`Simulation`, :class:`Theory`).
Presets are TOML files shipped in ``singleloc/presets``; ``CONFIG`` on the command line is a
path to a TOML file or a preset name.
"""

from __future__ import annotations

import dataclasses
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Sequence

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib

from ._presets import preset_names
from ._priors import Prior
from ._specs import SGD, Model, Problem, Simulation, Theory

SECTIONS = {"problem": Problem, "model": Model, "sgd": SGD, "simulation": Simulation, "theory": Theory}


@dataclasses.dataclass(frozen=True)
class Config:
    """A complete, validated run configuration."""

    problem: Problem = Problem()
    model: Model = Model()
    sgd: SGD = SGD()
    simulation: Simulation = Simulation()
    theory: Theory = Theory()

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, Any]]) -> "Config":
        """Build from nested ``{section: {key: value}}``; unknown sections or keys are errors."""
        if not isinstance(data, Mapping):
            raise ValueError(f"config must be a table of sections, got {type(data).__name__}")
        unknown = set(data) - set(SECTIONS)
        if unknown:
            raise ValueError(f"unknown config section(s) {sorted(unknown)} (known: {', '.join(SECTIONS)})")
        parts = {}
        for name, spec in SECTIONS.items():
            values = dict(data.get(name, {}))
            fields = {f.name for f in dataclasses.fields(spec)}
            bad = set(values) - fields
            if bad:
                raise ValueError(f"unknown key(s) {', '.join(f'{name}.{k}' for k in sorted(bad))} (known: {', '.join(sorted(fields))})")
            parts[name] = spec(**values)
        return cls(**parts)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain, JSON-serialisable ``{section: {key: value}}`` (a prior object becomes a table)."""
        out = {}
        for name in SECTIONS:
            sec = dataclasses.asdict(getattr(self, name))
            if isinstance(sec.get("prior"), dict):  # a Prior object
                sec["prior"] = {"atoms": sec["prior"]["atoms"], "probs": sec["prior"]["probs"], "noise_cov": sec["prior"]["noise_cov"], "name": sec["prior"]["name"]}
            out[name] = {k: v for k, v in sec.items() if v is not None}
        return out

    def replace(self, **sections: Mapping[str, Any]) -> "Config":
        """A copy with some keys changed: ``cfg.replace(model={"heads": 4})``."""
        data = self.to_dict()
        for name, values in sections.items():
            if name not in SECTIONS:
                raise ValueError(f"unknown config section {name!r} (known: {', '.join(SECTIONS)})")
            data.setdefault(name, {}).update(values)
        return Config.from_dict(_restore_prior(data))


def _restore_prior(data: dict) -> dict:
    prior = data.get("problem", {}).get("prior")
    if isinstance(prior, Mapping):
        data["problem"]["prior"] = Prior(**prior)
    return data


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
        source: path to a ``.toml`` file, the name of a preset (see :func:`preset_names`),
            a nested dict, or ``None`` for the defaults.
        overrides: strings ``"section.key=value"`` applied in order.
    """
    if source is None:
        data: dict = {}
    elif isinstance(source, Mapping):
        data = {k: dict(v) for k, v in source.items()}
    else:
        path = Path(source)
        if path.suffix == ".toml" or path.exists():
            if not path.is_file():
                raise ValueError(f"config file {str(path)!r} does not exist")
            try:
                data = tomllib.loads(path.read_text())
            except tomllib.TOMLDecodeError as err:
                raise ValueError(f"config file {str(path)!r} is not valid TOML: {err}") from None
        elif str(source) in preset_names():
            data = tomllib.loads((resources.files("singleloc") / "presets" / f"{source}.toml").read_text())
        else:
            raise ValueError(f"CONFIG {str(source)!r} is neither a TOML file nor a preset (presets: {', '.join(preset_names())})")
    for text in overrides:
        section, key, value = parse_override(text)
        data.setdefault(section, {})[key] = value
    return Config.from_dict(_restore_prior(data))

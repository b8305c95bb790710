"""The shipped presets: the TOML files in ``singleloc/presets``, named by their stem.

This module imports nothing numerical, so that the command line can list the presets in its
help without loading JAX (see :mod:`singleloc.cli`).
"""

from __future__ import annotations

from importlib import resources


def preset_names() -> tuple[str, ...]:
    """Names of the presets shipped with the package."""
    files = resources.files("singleloc") / "presets"
    return tuple(sorted(p.name[:-5] for p in files.iterdir() if p.name.endswith(".toml")))

"""The points of a sweep: grids ``section.key = v1, v2, ...`` and their Cartesian product.

``parse_grid("model.heads=1,2,4")`` reads one grid; :func:`grid_points` applies the product of several grids to a
base configuration and validates every point before anything runs.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from ..configuration._config import SECTIONS, Config, parse_override
from ..ground._arguments import check_fields


@dataclasses.dataclass(frozen=True)
class Grid:
    """One swept key: ``section.key`` and its values."""

    section: str
    key: str
    values: tuple

    __post_init__ = check_fields

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}"


def _split_top_level(text: str) -> list[str]:
    """Split at commas that are not inside brackets or quotes."""
    parts, depth, quote, cur = [], 0, None, []
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return parts


def parse_grid(text: str) -> Grid:
    """``"model.heads=1,2,4"`` -> :class:`Grid`. Each value is read as TOML (a bare word as a
    string); commas inside brackets belong to the value (``problem.mean=[1,0],[0,1]``)."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ValueError(f"--grid expects section.key=v1,v2,..., got {text!r}")
    lhs, rhs = text.split("=", 1)
    raw = [v.strip() for v in _split_top_level(rhs)]
    if not rhs.strip() or any(not v for v in raw):
        raise ValueError(f"--grid {text!r}: empty value in the list")
    values = tuple(parse_override(f"{lhs.strip()}={v}")[2] for v in raw)
    section, key, _ = parse_override(f"{lhs.strip()}={raw[0]}")
    fields = {f.name for f in dataclasses.fields(SECTIONS[section])}
    if key not in fields:
        raise ValueError(f"--grid {text!r}: unknown key {section}.{key} (known: {', '.join(sorted(fields))})")
    if len(set(map(repr, values))) != len(values):
        raise ValueError(f"--grid {text!r}: repeated value")
    return Grid(section, key, values)


def grid_points(base: Config, grids: Sequence[Grid]) -> list[tuple[dict[str, Any], Config]]:
    """The Cartesian product of the grids applied to ``base``: ``[(values, config), ...]``.
    Every point is validated before anything runs; an invalid one raises ``ValueError``."""
    names = [g.name for g in grids]
    if len(set(names)) != len(names):
        raise ValueError(f"--grid: a key is swept twice ({', '.join(names)})")
    points = []
    for combo in itertools.product(*(g.values for g in grids)):
        changes: dict[str, dict] = {}
        for g, v in zip(grids, combo):
            changes.setdefault(g.section, {})[g.key] = v
        try:
            cfg = base.replace(**changes)
        except ValueError as err:
            where = ", ".join(f"{n}={v}" for n, v in zip(names, combo))
            raise ValueError(f"grid point {where}: {err}") from None
        points.append((dict(zip(names, combo)), cfg))
    return points

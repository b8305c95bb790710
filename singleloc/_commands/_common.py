"""Arguments shared by the subcommands.

Only light modules are imported here (no JAX, SciPy or matplotlib), so that building the
parser, and ``--help``, stays fast; the commands import the library inside ``run``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .._presets import preset_names

CONFIG_HELP = (
    "a TOML config file or the name of a shipped preset ({presets}); sections [problem], "
    "[model], [sgd], [simulation], [theory], every key optional"
)


def int_at_least(minimum: int):
    """An argparse type: an integer ``>= minimum``."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = minimum - 1
        if n < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return n

    return parse


def output_folder(text: str) -> Path:
    """An argparse type: a folder to write into (created if missing), not an existing file."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder, got an empty name")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder")
    return path


def add_out_argument(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """``--out DIR``, the folder every file of the command goes to: required, or optional with
    ``default`` describing where the files go without it (the command then receives ``None``)."""
    where = "required" if default is None else f"default: {default}"
    parser.add_argument("--out", type=output_folder, required=default is None, default=None, metavar="DIR",
                        help=f"output folder, created if missing ({where})")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``CONFIG``, repeatable ``--set section.key=value`` and ``--no-progress``."""
    parser.add_argument("config", metavar="CONFIG", help=CONFIG_HELP.format(presets=", ".join(preset_names())))
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable), e.g. --set model.heads=4 --set sgd.lr=0.2",
    )
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="hide progress bars")


def config_from_args(args: argparse.Namespace):
    """The :class:`~singleloc.Config` of ``CONFIG`` and the ``--set`` overrides."""
    from .._config import load_config

    return load_config(args.config, args.overrides)


def describe(config) -> str:
    """``"softmax, H=2, L=4, F=2, gaussian prior"``: the config in a figure title."""
    pb, m = config.problem, config.model
    prior = pb.prior if isinstance(pb.prior, str) else pb.prior.name
    return f"{m.activation}, H={m.heads}, L={pb.L}, F={pb.F}, {prior} prior"

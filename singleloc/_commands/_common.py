"""Arguments shared by the subcommands that take a run configuration."""

from __future__ import annotations

import argparse

from .._config import Config, load_config, preset_names

CONFIG_HELP = (
    "a TOML config file or the name of a shipped preset ({presets}); sections [problem], "
    "[model], [sgd], [simulation], [theory], every key optional"
)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``CONFIG`` and repeatable ``--set section.key=value``."""
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


def config_from_args(args: argparse.Namespace) -> Config:
    return load_config(args.config, args.overrides)

"""The ``singleloc`` command line: one subcommand per module in ``singleloc._commands``."""

from __future__ import annotations

import argparse
import sys

from . import __version__
from ._commands import COMMANDS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="singleloc",
        description="Multi-head attention in the high-dimensional single-location model: "
        "order-parameter ODEs, finite-D SGD simulations, Bayes risk, pruning, diagnostics.",
    )
    parser.add_argument("--version", action="version", version=f"singleloc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; errors in the input are printed as one line, without a traceback."""
    args = build_parser().parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)  # the ODE runs in double precision; simulations stay in float32
    try:
        return int(args.func(args) or 0)
    except (ValueError, FloatingPointError, FileNotFoundError) as err:
        print(f"singleloc {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The ``singleloc`` command line: one subcommand per module in ``singleloc._commands``.

Start-up is kept short: building the parser imports no numerical library (each command imports
what it needs inside its ``run``), so ``singleloc --help`` does not load JAX. Errors in the
command line and expected failures of the input are turned into one line
``singleloc COMMAND: error: ...`` and exit code 2 in one place, :func:`main`.
"""

from __future__ import annotations

import argparse
import sys

from ._commands import COMMANDS
from ._version import __version__

#: Failures caused by the input (config, files, values): reported in one line, exit code 2.
EXPECTED_ERRORS = (ValueError, FloatingPointError, FileNotFoundError)


class UsageError(Exception):
    """An invalid command line, raised by the parser (instead of printing the usage and exiting)."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(self.prog, message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="singleloc",
        description="Multi-head attention in the high-dimensional single-location model: "
        "order-parameter ODEs, finite-D SGD simulations, Bayes risk, pruning, diagnostics.",
    )
    parser.add_argument("--version", action="version", version=f"singleloc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def _run(args: argparse.Namespace) -> int:
    import jax

    jax.config.update("jax_enable_x64", True)  # the ODE runs in double precision; simulations stay in float32
    return int(args.func(args) or 0)


def _fail(prog: str, message: str) -> int:
    message = " ".join(message.split())
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse ``argv``, run the command, return the exit code (2: an error in the
    command line or an expected failure of the input, printed as one line)."""
    try:
        args = build_parser().parse_args(argv)
    except UsageError as err:
        return _fail(err.prog, f"{err} (see {err.prog} --help)")
    try:
        return _run(args)
    except EXPECTED_ERRORS as err:
        return _fail(f"singleloc {args.command}", str(err))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

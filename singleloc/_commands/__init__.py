"""Subcommands of the CLI. Each module defines ``register(subparsers)``, which adds its parser
(with light imports only) and sets ``func`` to its ``run(args)``; add a module here to add a
command."""

from . import attention, bayes, compare, diagnose, integrate, plot, prune, simulate, sweep

COMMANDS = (simulate, integrate, compare, plot, bayes, diagnose, attention, prune, sweep)

"""Subcommands of the CLI. Each module defines ``register(subparsers)``, which adds its parser
and sets ``func`` to the function that runs it; add a module here to add a command."""

from . import compare, integrate, simulate
from . import bayes

COMMANDS = (simulate, integrate, compare,)
COMMANDS += (bayes,)
from . import diagnose
COMMANDS += (diagnose,)
from . import prune
COMMANDS += (prune,)
from . import sweep
COMMANDS += (sweep,)

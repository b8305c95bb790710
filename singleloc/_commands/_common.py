"""Arguments shared by the subcommands, and what every run command does before it computes
(checks of its config, cost and output folder).

Only light modules are imported here (no JAX, SciPy or matplotlib), so that building the
parser, and ``--help``, stays fast; the commands import the library inside ``run``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..configuration._presets import preset_names
from ..ground._atomic_files import BESIDE_FLAG, check_output_folder, check_run_folder
from ..ground._validation import integer

CONFIG_HELP = (
    "the name of a shipped preset ({presets}) or a TOML config file (write ./NAME for a file named like a preset); "
    "sections [problem], [model], [sgd], [simulation], [theory], every key optional"
)


def int_at_least(minimum: int, maximum: int | None = None):
    """An argparse type: an integer ``>= minimum`` (and ``<= maximum``), checked by
    :func:`singleloc.ground._validation.integer` (argparse names the argument: ``"argument --draws: must be
    >= 1, got 0"``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = text  # not an integer: refused by integer(), which quotes it
        try:
            return integer("N", value, minimum, maximum)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix("N: ")) from None

    return parse


def output_folder(text: str) -> Path:
    """An argparse type: a folder to write files into (created if missing), checked before
    anything runs (see :func:`singleloc.ground._atomic_files.check_output_folder`)."""
    try:
        check_output_folder(text)
    except (OSError, ValueError) as err:
        raise argparse.ArgumentTypeError(err.strerror if isinstance(err, OSError) and err.strerror else str(err)) from None
    return Path(text)


def run_folder(text: str) -> Path:
    """An argparse type: the folder of a run, new or holding a previous run that the new one
    replaces as a whole; checked before anything runs (see :func:`singleloc.ground._atomic_files.check_run_folder`)."""
    try:
        check_run_folder(text)
    except (OSError, ValueError) as err:
        raise argparse.ArgumentTypeError(err.strerror if isinstance(err, OSError) and err.strerror else str(err)) from None
    return Path(text)


OUT_HELP = {
    False: "output folder, created if missing",
    True: "run folder, created if missing; a folder holding a previous run is replaced as a whole once the new run "
          "completes (a failure or Ctrl-C leaves it as it was); a folder holding other files is refused",
}


def add_out_argument(parser: argparse.ArgumentParser, default: str | None = None, run: bool = False) -> None:
    """``--out DIR``, the folder every file of the command goes to: required, or optional with
    ``default`` describing where the files go without it (the command then receives ``None``).
    ``run``: the files form a run folder (:func:`run_folder`), else plain files (:func:`output_folder`)."""
    where = "required" if default is None else f"default: {default}"
    parser.add_argument("--out", type=run_folder if run else output_folder, required=default is None, default=None,
                        metavar="DIR", help=f"{OUT_HELP[run]} ({where})")


def add_beside_argument(parser: argparse.ArgumentParser) -> None:
    """``--beside-run``: write into an ``--out`` folder that holds another run
    (:func:`~singleloc.ground._atomic_files.check_other_run`)."""
    parser.add_argument(BESIDE_FLAG, dest="beside_run", action="store_true",
                        help="write into an --out folder that holds another run (integrate, simulate, compare, plot), beside "
                        "its files; without it such a folder is refused, and a file of the other run is never replaced")


FORCE_HELP = ("run even when the estimate says the run is huge: an estimated time above {hours:g} h, or (sweep) more "
              "--workers than CPUs; what cannot be represented or does not fit in memory is still refused")


#: An estimated run time above which a command refuses to start without ``--force``.
LONG_RUN_SECONDS = 4 * 3600.0

#: An estimated run time above which a command says what the run will cost before it starts.
ANNOUNCE_SECONDS = 60.0


#: ``sweep``: an estimated time of one point above which the sweep refuses to start without ``--yes``.
POINT_SECONDS = 3600.0


def reporting_for(args: argparse.Namespace):
    """What the command says while it runs (:func:`singleloc.runtime._progress.reporting`): its lines start
    with ``singleloc COMMAND:``; a live status line on a terminal, one line per phase with
    ``--no-progress`` or when stderr is not a terminal (``SINGLELOC_PROGRESS=lines`` or ``off``
    too); a run estimated above :data:`LONG_RUN_SECONDS` is refused without ``--force``, a sweep
    point above :data:`POINT_SECONDS` without ``--yes``; the measured times are written to the timings file."""
    import os

    from ..runtime._progress import MODE_ENV, reporting

    chosen = os.environ.get(MODE_ENV, "").strip().lower()
    live = getattr(args, "progress", True) and sys.stderr.isatty() and chosen in ("", "auto", "live")
    mode = chosen if chosen in ("lines", "off") else "live" if live else "lines"
    return reporting(mode=mode, prefix=f"singleloc {args.command}", record=True,  # limits only where a flag lifts them
                     run_limit=LONG_RUN_SECONDS if getattr(args, "force", True) is False else None,
                     point_limit=POINT_SECONDS if getattr(args, "yes", True) is False else None)


def add_force_argument(parser: argparse.ArgumentParser) -> None:
    """``--force``: let a deliberate huge run pass the cost checks (:func:`check_cost`)."""
    parser.add_argument("--force", action="store_true", help=FORCE_HELP.format(hours=LONG_RUN_SECONDS / 3600))


def check_cost(command: str, cost, force: bool, note: bool = True) -> None:
    """Say on stderr what a run will cost (:class:`singleloc.preflight._costs.Cost`) when its estimated
    time exceeds :data:`ANNOUNCE_SECONDS` (and ``note``: a simulation says its measured estimate
    itself once compiled), and refuse it (``ValueError``) above :data:`LONG_RUN_SECONDS` unless ``force``."""
    if cost.seconds > LONG_RUN_SECONDS and not force:
        raise ValueError(f"{cost.describe()}: more than the {LONG_RUN_SECONDS / 3600:g} h a run may take without --force; "
                         f"lower {cost.keys}, or pass --force to run it anyway")
    if note and cost.seconds > ANNOUNCE_SECONDS:
        print(f"singleloc {command}: note: {cost.describe()}", file=sys.stderr)


PROGRESS_HELP = ("no live status line or progress bar: one line per phase (compiling, solving, ...) with its time, as when "
                 "stderr is not a terminal")


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
    parser.add_argument("--no-progress", dest="progress", action="store_false", help=PROGRESS_HELP)


def config_from_args(args: argparse.Namespace):
    """The :class:`~singleloc.Config` of ``CONFIG`` and the ``--set`` overrides."""
    from ..configuration._config import load_config

    return load_config(args.config, args.overrides)


def describe(config) -> str:
    """``"softmax, H=2, L=4, F=2, gaussian prior"``: the config in a figure title."""
    pb, m = config.problem, config.model
    prior = pb.prior if isinstance(pb.prior, str) else pb.prior.name
    return f"{m.activation}, H={m.heads}, L={pb.L}, F={pb.F}, {prior} prior"


def prepare_run(args: argparse.Namespace, *, simulation: bool = False, theory: str | None = None):
    """The config of a run command, checked before anything is computed: its dimension,
    quadrature and memory (:func:`singleloc.preflight._resources.check_run`) for a simulation and/or the
    theory from ``"one"`` start or one per seed (``"seeds"``; ``None``: not here, e.g. where ``integrate`` checks it as it
    starts), what a simulation will cost
    (:func:`check_cost`: a huge one is refused), and a note when ``--out`` holds a run that the new one will replace.
    (The warnings about a run's results, :mod:`singleloc.preflight._run_checks`, come from the library.)"""
    from ..preflight._resources import check_run
    from ..simulation._simulation_estimate import simulation_cost

    config = config_from_args(args)
    starts = {None: 0, "one": 1, "seeds": config.simulation.seeds}[theory]
    if simulation or starts:
        check_run(config, simulation=simulation, theory_starts=starts)
    if simulation:  # refused when huge; its estimate is said once it is measured (singleloc.preflight._estimates)
        check_cost(args.command, simulation_cost(config), args.force, note=False)
    note_replaced(args.command, args.out)
    return config


def note_replaced(command: str, out: Path) -> None:
    """Say on stderr, before a run starts, that the run folder ``out`` holds a run that the new
    one replaces (:func:`run_folder` has checked that it holds nothing else)."""
    if out.is_dir() and any(out.iterdir()):
        print(f"singleloc {command}: note: {str(out)!r} holds a run; it is replaced when this one completes", file=sys.stderr)

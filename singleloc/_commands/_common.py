"""Arguments shared by the subcommands, and what every run command does before it computes
(checks of its config, cost and output folder).

Only light modules are imported here (no JAX, SciPy or matplotlib), so that building the
parser, and ``--help``, stays fast; the commands import the library inside ``run``.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

from .._version import __version__
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
    """Say on stderr what a run will cost (:class:`singleloc.preflight._resources.Cost`) when its estimated
    time exceeds :data:`ANNOUNCE_SECONDS` (and ``note``: a simulation says its measured estimate
    itself once compiled), and refuse it (``ValueError``) above :data:`LONG_RUN_SECONDS` unless ``force``."""
    if cost.seconds > LONG_RUN_SECONDS and not force:
        raise ValueError(f"{cost.describe()}: more than the {LONG_RUN_SECONDS / 3600:g} h a run may take without --force; "
                         f"lower {cost.keys}, or pass --force to run it anyway")
    if note and cost.seconds > ANNOUNCE_SECONDS:
        print(f"singleloc {command}: note: {cost.describe()}", file=sys.stderr)


PROGRESS_HELP = ("no live status line or progress bar: one line per phase (compiling, solving, ...) with its time, as when "
                 "stderr is not a terminal")


CONTINUE_HELP = ("in place of CONFIG: continue the stored run in RUN_DIR (written by this command) to --horizon TAU with "
                 "its configuration, from its state at its last saved time; the run written to --out holds the stored "
                 "trajectory followed by sgd.n_save - 1 new saved times up to TAU (on the config's spacing), so the solve "
                 "has the stored run's shapes and reuses its compiled program; --out may be RUN_DIR itself, which is then "
                 "replaced as a whole once the continued run completes")


def add_config_arguments(parser: argparse.ArgumentParser, resume: bool = False) -> None:
    """``CONFIG``, repeatable ``--set section.key=value`` and ``--no-progress``; with ``resume``,
    ``--continue RUN_DIR`` in place of ``CONFIG`` (:func:`continued_run`)."""
    parser.add_argument("config", metavar="CONFIG", nargs="?" if resume else None,
                        help=CONFIG_HELP.format(presets=", ".join(preset_names())))
    if resume:
        parser.add_argument("--continue", dest="resume", type=Path, metavar="RUN_DIR", help=CONTINUE_HELP)
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


def continued_run(args: argparse.Namespace, files: tuple[str, ...]):
    """The run of ``--continue RUN_DIR`` (:func:`~singleloc.io._run_folders.load_run`, holding the data ``files``),
    its config to the horizon ``--horizon TAU``, the stored run's last saved time ``t0`` and the new saved times
    after it (``sgd.n_save - 1`` of them up to ``TAU``, linear or geometric as ``sgd.spacing``): the solve from ``t0``
    has ``sgd.n_save`` saved times, the stored run's shapes. ``None`` without ``--continue``; ``ValueError``
    naming the option for ``CONFIG`` or ``--set`` given too, a horizon not beyond ``t0``, or a folder that is not
    such a run."""
    import numpy as np

    from ..io._run_folders import load_run

    if args.resume is None:
        if args.config is None:
            raise ValueError("give CONFIG, or --continue RUN_DIR to continue a stored run")
        return None
    if args.config is not None or args.overrides:
        raise ValueError(f"--continue: a continued run keeps the configuration of {str(args.resume)!r}; "
                         f"give --continue RUN_DIR without {'CONFIG' if args.config is not None else '--set'}")
    try:
        run = load_run(args.resume)
    except (OSError, ValueError) as err:
        raise ValueError(f"--continue: {err}") from None
    written = json.loads((args.resume / "config.json").read_text()).get("singleloc_version")
    if written != __version__:  # (the stored part and its continuation made by two versions)
        print(f"singleloc {args.command}: note: {str(args.resume)!r} was written by singleloc {written}, this is "
              f"{__version__}: its continuation is computed by this version", file=sys.stderr)
    missing = [f for f in files if f not in run.data and f not in run.extra]
    if missing:
        raise ValueError(f"--continue: {str(args.resume)!r} holds no {missing[0]}.npz: not a run of `singleloc {args.command}`")
    t0 = float(run.data["theory"]["tau"][-1]) if "theory" in run.data else float(run.extra["theory_seeds"]["tau"][-1])
    if not isinstance(args.horizon, float) or args.horizon <= t0:
        got = f", got {args.horizon:g}" if isinstance(args.horizon, float) else ""
        raise ValueError(f"--horizon: --continue needs a horizon TAU beyond the stored run's last saved time tau = {t0:g}{got}")
    sgd = run.config.sgd
    grid = np.linspace if sgd.spacing == "linear" else np.geomspace
    config = run.config.replace(sgd={"tau_max": args.horizon})
    return types.SimpleNamespace(run=run, config=config, t0=t0, ts=grid(t0, args.horizon, sgd.n_save)[1:])


def joined(old, new):
    """The :class:`~singleloc.TheoryResult` ``old`` followed by ``new`` (its continuation, from ``old``'s last
    saved time on): the trajectories concatenated along the saved times; the statement of the quadrature is
    ``new``'s with each stated error the larger of the two."""
    import dataclasses

    import numpy as np

    cat = lambda a, b: None if a is None or b is None else np.concatenate([a, b], axis=1)  # noqa: E731
    errors = {k: float(np.fmax(getattr(old, k), getattr(new, k)))
              for k in ("risk_error", "exact_drift_error", "gram_error", "drift_error")}
    return dataclasses.replace(new, tau=np.concatenate([old.tau, new.tau]), **errors,
                               **{k: cat(getattr(old, k), getattr(new, k)) for k in ("M", "Q", "b", "risk", "risk_se", "v")})


def describe(config) -> str:
    """``"softmax, H=2, L=4, F=2, gaussian prior"``: the config in a figure title."""
    pb, m = config.problem, config.model
    prior = pb.prior if isinstance(pb.prior, str) else pb.prior.name
    return f"{m.activation}, H={m.heads}, L={pb.L}, F={pb.F}, {prior} prior"


def prepare_run(args: argparse.Namespace, *, simulation: bool = False, theory: str | None = None, continued=None):
    """The objects of a run command's config (:func:`singleloc.preflight._build.build`, its route decided unless it
    only simulates; ``.config``: the config), checked before anything is computed: its dimension,
    quadrature and memory (:func:`singleloc.preflight._resources.check_run`) for a simulation and/or the
    theory from ``"one"`` start or one per seed (``"seeds"``; ``None``: not here, e.g. where ``integrate`` checks it as it
    starts), what a simulation will cost
    (:func:`check_cost`: a huge one is refused), and a note when ``--out`` holds a run that the new one will replace.
    (The warnings about a run's results, :mod:`singleloc.preflight._run_checks`, come from the library.) ``continued``:
    the run of ``--continue`` (:func:`continued_run`), whose config is taken instead of ``CONFIG``."""
    from ..preflight._build import build
    from ..preflight._resources import check_run
    from ..simulation._simulation_estimate import simulation_cost

    config = config_from_args(args) if continued is None else continued.config
    starts = {None: 0, "one": 1, "seeds": config.simulation.seeds}[theory]
    setup = build(config, theory=bool(starts) or not simulation)  # the route decided once for the command
    if simulation or starts:
        check_run(setup, simulation=simulation, theory_starts=starts)
    if simulation:  # refused when huge; its estimate is said once it is measured (singleloc.preflight._estimates)
        check_cost(args.command, simulation_cost(setup), args.force, note=False)
    note_replaced(args.command, args.out)
    return setup


def note_replaced(command: str, out: Path) -> None:
    """Say on stderr, before a run starts, that the run folder ``out`` holds a run that the new
    one replaces (:func:`run_folder` has checked that it holds nothing else)."""
    if out.is_dir() and any(out.iterdir()):
        print(f"singleloc {command}: note: {str(out)!r} holds a run; it is replaced when this one completes", file=sys.stderr)

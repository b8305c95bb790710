"""The ``singleloc`` command line: one subcommand per module in ``singleloc._commands``.

Start-up is kept short: building the parser imports no numerical library (each command imports
what it needs inside its ``run``), so ``singleloc --help`` does not load JAX.

Errors. Every expected failure ends in one line ``singleloc COMMAND: error: CAUSE`` on stderr
and exit code 2, in one place, :func:`main`: an invalid command line, an invalid config or
value (``ValueError``), a file that cannot be read or written (``OSError``: missing, damaged,
no permission, disk full), a run that cannot fit in memory (``MemoryError``, including JAX's
``RESOURCE_EXHAUSTED``), dynamics that leave the valid set (``FloatingPointError``). Ctrl-C
ends in ``singleloc COMMAND: interrupted`` and exit code 130; a run folder being written is
then left as it was. ``--debug`` (or ``SINGLELOC_DEBUG=1``) prints the traceback before the
line. Warnings of the library (a surprise that is not an error) are printed as one line
``singleloc COMMAND: warning: ...``.
"""

from __future__ import annotations

import _thread
import argparse
import os
import signal
import sys
import threading
import time
import traceback
import warnings

from ._commands import COMMANDS
from ._version import __version__

#: Failures caused by the input (config, files, values, sizes): reported in one line, exit code 2.
EXPECTED_ERRORS = (ValueError, FloatingPointError, OverflowError, OSError, MemoryError)

#: Exit code after Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED = 130

DEBUG_ENV = "SINGLELOC_DEBUG"


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
    debug = dict(action="store_true", help=f"print the traceback of an error (or set {DEBUG_ENV}=1)")
    parser.add_argument("--debug", **debug)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(sub)
    for p in sub.choices.values():  # also after the command; SUPPRESS keeps the value given before it
        p.add_argument("--debug", **debug, default=argparse.SUPPRESS)
    return parser


def _run(args: argparse.Namespace) -> int:
    import jax

    from ._commands._common import reporting_for
    from .runtime._compilation import enable_compilation_cache, own_process

    own_process()  # the command line owns this process: its JAX settings and compiled programs
    jax.config.update("jax_enable_x64", True)  # the ODE runs in double precision; simulations stay in float32
    enable_compilation_cache()  # compiled programs are kept for the next run (singleloc.runtime._compilation)
    with reporting_for(args):  # phases and estimates on stderr (singleloc.runtime._progress)
        return int(args.func(args) or 0)


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {_one_line(message)}", file=sys.stderr)
    return 2


def _cause(err: BaseException) -> str:
    """The message of an expected failure, without Python's decorations."""
    if isinstance(err, OSError) and err.strerror:
        return f"{err.strerror}: {err.filename!r}" if err.filename else err.strerror
    if isinstance(err, MemoryError):  # NumPy's "Unable to allocate ...", or the estimate of singleloc.preflight._resources
        return str(err) or "out of memory"
    if isinstance(err, RuntimeError):  # JAX's RESOURCE_EXHAUSTED: the first line says what did not fit
        return f"out of memory on the device: {str(err).splitlines()[0]}; lower the sizes of the run"
    return str(err) or type(err).__name__


def _show_warning(prog: str):
    def show(message, category, filename, lineno, file=None, line=None):
        print(f"{prog}: warning: {_one_line(str(message))}", file=sys.stderr)

    return show


#: Seconds the main thread has to take a Ctrl-C (raise ``KeyboardInterrupt``) before the
#: process ends without it: a thread inside XLA (compiling or solving) sees no signal until it
#: returns, which took minutes (issue 21 item 6).
INTERRUPT_GRACE = 1.0


#: Seconds the unwinding of a taken Ctrl-C may last while a Dask cluster is open (closing it ends its
#: worker processes); without one the unwinding (removing temporary files) gets :data:`INTERRUPT_GRACE`.
UNWIND_MAX = 10.0


def _end(code: int) -> None:
    """End the process now, with ``code``, after flushing what it printed: the computations
    that XLA still runs in its threads would otherwise keep the interpreter's exit waiting."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    util = sys.modules.get("multiprocessing.util")  # a Dask cluster's semaphores: released, as a normal exit does
    if util is not None:  # (else the resource tracker warns of "leaked semaphore objects" after the line)
        util._run_finalizers(0)
    os._exit(code)


def _unwind_seconds() -> float:
    """How long the watcher lets a taken Ctrl-C unwind: :data:`UNWIND_MAX` while a Dask cluster of
    this process is open (:func:`singleloc.runtime._distributed.clusters_open`), else :data:`INTERRUPT_GRACE`."""
    distributed = sys.modules.get("singleloc.runtime._distributed")  # not imported: no cluster
    return UNWIND_MAX if distributed is not None and distributed.clusters_open() else INTERRUPT_GRACE


class _Interrupts:
    """The state of Ctrl-C in the command-line process: ``taken`` once the main thread has raised
    ``KeyboardInterrupt``; ``swallowed`` when a callback swallowed it (for the watcher to raise it
    again), ``again`` while it is raised again."""

    def __init__(self):
        self.taken = threading.Event()
        self.swallowed = threading.Event()
        self.again = False


def _watch_interrupts(prog: str) -> _Interrupts | None:
    """In the command-line process: a thread that wakes up on Ctrl-C (through the signal's
    wake-up file, written by the C-level handler even while the main thread is inside XLA) and,
    if the main thread has not taken the interrupt within :data:`INTERRUPT_GRACE` seconds (or has
    not unwound within :func:`_unwind_seconds` after taking it), prints the one line and ends the
    process with 130.

    An interrupt raised inside a callback that Python runs on its own (JAX's garbage-collection
    callback ``_xla_gc_callback``, a ``__del__``) cannot propagate: Python would print it as
    ``Exception ignored in ...`` and go on (issue 54 item 1). :func:`sys.unraisablehook` takes
    such a ``KeyboardInterrupt`` silently and the thread raises it again in the main thread
    (``_thread.interrupt_main``), at its next step out of the callback.

    Returns the state (``None`` where Ctrl-C is ignored, e.g. a background job, or off the main thread)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not \
            signal.default_int_handler:
        return None
    state = _Interrupts()
    read, write = os.pipe()
    os.set_blocking(write, False)

    def on_interrupt(signum, frame):
        if state.taken.is_set() and not state.again:  # a second Ctrl-C while the first one unwinds: end now
            print(f"{prog}: interrupted", file=sys.stderr)
            _end(INTERRUPTED)
        state.again = False
        state.taken.set()
        raise KeyboardInterrupt

    previous_hook = sys.unraisablehook

    def unraisable(hook_args) -> None:
        if isinstance(hook_args.exc_value, KeyboardInterrupt):
            state.again = True
            state.swallowed.set()
            return
        previous_hook(hook_args)

    def watch() -> None:
        while True:
            try:
                data = os.read(read, 64)
            except OSError:
                return
            if signal.SIGINT in data:
                break
        if state.taken.wait(INTERRUPT_GRACE):  # taken: the work unwinds (a cluster closes...), for a while at most
            end = time.monotonic() + _unwind_seconds()
            while (left := end - time.monotonic()) > 0:
                if state.swallowed.wait(left):
                    state.swallowed.clear()
                    _thread.interrupt_main()
        print(f"{prog}: interrupted", file=sys.stderr)
        _end(INTERRUPTED)

    try:
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:
        return None
    signal.signal(signal.SIGINT, on_interrupt)
    sys.unraisablehook = unraisable
    threading.Thread(target=watch, name="singleloc-interrupt", daemon=True).start()
    return state


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse ``argv``, run the command, return the exit code (2: an error in the
    command line or an expected failure, printed as one line; 130: interrupted).

    Called without ``argv`` (the ``singleloc`` command, ``python -m singleloc``), Ctrl-C ends the
    process within :data:`INTERRUPT_GRACE` seconds whatever runs (:func:`_watch_interrupts`),
    and after the ``interrupted`` line the process exits at once."""
    console = argv is None
    try:
        args = build_parser().parse_args(argv)
    except UsageError as err:
        return _fail(err.prog, f"{err} (see {err.prog} --help)")
    prog = f"singleloc {args.command}"
    debug = args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    interrupts = _watch_interrupts(prog) if console else None
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning(prog)
        try:
            return _run(args)
        except BaseException as err:
            # after Ctrl-C whatever the interrupt became on its way out (a library may wrap it) is the interrupt
            if isinstance(err, KeyboardInterrupt) or (interrupts is not None and interrupts.taken.is_set()):
                return _interrupted(prog, debug, console)
            if not isinstance(err, (*EXPECTED_ERRORS, RuntimeError)) or (
                    isinstance(err, RuntimeError) and "RESOURCE_EXHAUSTED" not in str(err)):
                raise
            if debug:
                traceback.print_exc()
            return _fail(prog, _cause(err))


def _interrupted(prog: str, debug: bool, console: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"{prog}: interrupted", file=sys.stderr)
    if console:  # the work is unwound (temporary files removed); XLA's threads would keep the exit waiting
        _end(INTERRUPTED)
    return INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

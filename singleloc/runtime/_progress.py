"""What a long computation says on stderr while it runs: its phases, their estimates and their times.

A computation that can take more than a few seconds runs inside a :class:`Phase` (compiling,
loading a stored program, solving, evaluating risks, writing) or a bar
(:class:`~singleloc.runtime._progress_bar.Bar`: a count of SGD steps or sweep points). How they are shown depends on the *mode*:

* ``"live"`` (stderr is a terminal): one status line, rewritten every half second by a
  heartbeat thread (XLA releases the GIL while it compiles and runs, so the thread ticks
  through a compilation), with the elapsed time against the estimate; a phase that took a
  second or more leaves one line with its time when it ends. A bar is tqdm's, refreshed by the
  same thread, with the phase inside it (a sweep point compiling) in its postfix.
* ``"lines"`` (``--no-progress``, or stderr not a terminal: logs): one line when a phase starts,
  one when it ends with its time, and one when it is still running after 1, 2, 4 and 8 minutes,
  then every 10 minutes; a phase marked ``quiet`` (usually short: building rules, writing) says
  nothing unless it lasts :data:`QUIET_AFTER` seconds. Inside a bar the phases are quiet and
  the bar's lines name them.
* ``"off"``: nothing.

On a terminal that reports no width (0 columns: some containers and CI pseudo-terminals) a bar
says its lines instead of tqdm's bar, which would draw nothing there
(:func:`terminal_width`); the live line takes 100 columns.

The mode is, in this order: the one :func:`reporting` or :func:`set_progress` gave, the
environment variable ``SINGLELOC_PROGRESS`` (``auto``, ``live``, ``lines``, ``off``), else
``"auto"``: ``"live"`` when stderr is a terminal and ``"lines"`` otherwise, but ``"off"`` under
pytest and on a Dask worker (whose output would interleave with the client's). The command line
sets ``"live"`` on a terminal and ``"lines"`` with ``--no-progress`` or when stderr is not one,
and its lines start with ``singleloc COMMAND:`` (:func:`reporting`'s ``prefix``).

A compiled program's phase can follow JAX's own compilation events (``follow_compiles``): its
time is split into compiling (tracing, lowering and XLA's compilation, or loading from the
persistent cache) and running, and it moves to its next stage (``"solving ..."``) when XLA has
compiled it. No host callback is added to any program, so that what is shown never keeps a
program out of the persistent compilation cache (:mod:`singleloc.runtime._compilation`).

Limits. :func:`reporting` can set ``run_limit`` and ``point_limit`` (seconds): :func:`announce`
then refuses, in one line (``ValueError``), a computation (or a sweep point) whose estimate exceeds
it; the command line sets 4 hours a run unless ``--force`` and, for ``sweep``, an hour a point unless
``--yes``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
from collections.abc import Iterator, Sequence

from . import _timings
from ._timings import Estimate, duration

MODE_ENV = "SINGLELOC_PROGRESS"
MODES = ("auto", "live", "lines", "off")

#: Seconds between two refreshes of the live line.
TICK = 0.5
#: A quiet phase says nothing in ``"lines"`` mode unless it lasts this long (seconds).
QUIET_AFTER = 3.0
#: A finished phase leaves its line in ``"live"`` mode when it took at least this long.
SHOW_AFTER = 1.0
#: A "still running" line past this many times its stage's estimate says why it may be slow
#: (:class:`Phase`'s ``overrun``).
OVERRUN = 10.0

#: ``"lines"`` mode: a phase still running after these seconds says so; then every ``STILL[-1]``.
STILL = (60.0, 120.0, 240.0, 480.0, 600.0)


@dataclasses.dataclass(frozen=True)
class Settings:
    """How a process reports: ``mode`` (``None``: from the environment), the ``prefix`` of its
    lines, and the limits of :func:`announce` (``None``: none)."""

    mode: str | None = None
    prefix: str = "singleloc"
    run_limit: float | None = None
    point_limit: float | None = None


_SETTINGS = [Settings()]


def _check_mode(mode: str, where: str) -> str:
    if mode not in MODES:
        raise ValueError(f"{where} = {mode!r}: expected one of {', '.join(MODES)}")
    return mode


def set_progress(mode: str = "auto") -> None:
    """Say what long computations of this process print on stderr: ``"live"`` (a status line
    on a terminal), ``"lines"`` (a line per phase, for logs), ``"off"``, or ``"auto"`` (the
    default: live on a terminal, lines otherwise, off under pytest; ``SINGLELOC_PROGRESS``
    overrides it). Phases are compiling, loading, solving and evaluating, with their estimated
    and measured times (docs/commands/progress.md)."""
    _SETTINGS[0] = dataclasses.replace(_SETTINGS[0], mode=None if mode == "auto" else _check_mode(mode, "mode"))


@contextlib.contextmanager
def reporting(**changes) -> Iterator[Settings]:
    """Within the block, :class:`Settings` changed by ``changes`` (``mode``, ``prefix``, limits)."""
    if changes.get("mode") is not None:
        _check_mode(changes["mode"], "mode")
    _SETTINGS.append(dataclasses.replace(_SETTINGS[-1], **changes))
    try:
        yield _SETTINGS[-1]
    finally:
        _SETTINGS.pop()


def settings() -> Settings:
    return _SETTINGS[-1]


def on_dask_worker() -> bool:
    """Whether this runs as a task on a Dask worker (Dask is not imported for it: a process
    that has not imported ``distributed`` is no worker)."""
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return False
    try:
        distributed.get_worker()
    except ValueError:
        return False
    return True


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def terminal_width(stream=None) -> int:
    """The columns of the terminal ``stream`` (default stderr) is, ``COLUMNS`` where set; 0 where it
    reports no width (not a terminal, or one that says 0 columns: a bar drawn there shows nothing)."""
    stream = sys.stderr if stream is None else stream
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 0


def mode() -> str:
    """The mode now (module docstring)."""
    chosen = settings().mode or os.environ.get(MODE_ENV, "").strip().lower() or "auto"
    if chosen not in MODES:
        chosen = "auto"  # a bad value in the environment does not stop a computation
    if chosen == "auto":
        if "PYTEST_CURRENT_TEST" in os.environ or on_dask_worker():
            return "off"
        chosen = "live" if _is_terminal(sys.stderr) else "lines"
    return chosen


# ----------------------------------------------------------------------------- output


class _Screen:
    """What is on stderr now: whether a live line is drawn, the active phases and bars (a stack),
    and the heartbeat thread that redraws them."""

    def __init__(self):
        self.lock = threading.RLock()
        self.stack: list[_Active] = []
        self.drawn = False
        self.wake = threading.Condition(self.lock)
        self.thread: threading.Thread | None = None

    def clear(self) -> None:
        if self.drawn:
            sys.stderr.write("\r\x1b[K")
            self.drawn = False

    def line(self, text: str) -> None:
        """A whole line, above a live line or a bar."""
        with self.lock:
            bar = next((a for a in reversed(self.stack) if getattr(a, "tqdm", None) is not None), None)
            if bar is not None:
                bar.tqdm.write(text, file=sys.stderr)
                return
            self.clear()
            print(text, file=sys.stderr, flush=True)

    def draw(self, text: str, tail: str = "") -> None:
        """The live line: ``text`` cut to the terminal's width, keeping ``tail`` (the times) whole."""
        width = max(20, (terminal_width() or 100) - 1) - len(tail)  # no width reported: 100 columns
        text = text if len(text) <= width else text[:max(width - 3, 0)] + "..."
        sys.stderr.write("\r" + text + tail + "\x1b[K")
        sys.stderr.flush()
        self.drawn = True

    def push(self, active: _Active) -> None:
        with self.lock:
            self.stack.append(active)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._beat, name="singleloc-progress", daemon=True)
                self.thread.start()
            self.wake.notify_all()

    def pop(self, active: _Active) -> None:
        with self.lock:
            if active in self.stack:
                self.stack.remove(active)

    def _beat(self) -> None:
        with self.lock:
            while self.stack:
                now = _timings.clock()
                with contextlib.suppress(Exception):  # a closed stream at exit: nothing to say
                    for active in list(self.stack):
                        active.tick(now)
                    top = self.stack[-1] if self.stack else None
                    if isinstance(top, Phase) and top.mode == "live" and not top.inside_bar and top.draw:
                        self.draw(*top.status(now))
                self.wake.wait(TICK)
            self.thread = None


_SCREEN = _Screen()


def say(text: str) -> None:
    """One line ``PREFIX: text`` on stderr (nothing in mode ``"off"``)."""
    if mode() != "off":
        _SCREEN.line(f"{settings().prefix}: {text}")


def announce(what: str, estimate: Estimate, remedy: str = "", *, limit: str = "run") -> None:
    """Say ``what: about X (basis)`` before a computation starts, and refuse it (``ValueError``,
    one line, with ``remedy``: what would make it cheaper) when the estimate exceeds the limit of
    :func:`reporting` (``limit``: ``"run"``, or ``"point"`` for one point of a sweep)."""
    s = settings()
    bound, flag, who = (s.run_limit, "--force", "a run") if limit == "run" else (s.point_limit, "--yes", "a sweep point")
    if bound is not None and estimate.seconds > bound:
        hours = f"{bound / 3600:g} h" if bound >= 3600 else duration(bound)
        raise ValueError(f"{what}: {estimate.describe()}: more than the {hours} {who} may take without {flag}; "
                         f"{remedy + ', or ' if remedy else ''}pass {flag} to run it anyway")
    if not _inside_bar():
        say(f"{what}: {estimate.describe()}")


def _inside_bar() -> bool:
    return any(a.counts for a in _SCREEN.stack)


# ----------------------------------------------------------------------------- phases


class _Active:
    """Something running that the screen shows (a phase or a bar)."""

    mode = "off"
    counts = False  # a bar (singleloc.runtime._progress_bar.Bar): the phases inside it are shown by it
    inside_bar = False
    start = 0.0
    _next_still = 0
    watched = True  # on the heartbeat's stack (singleloc.runtime._progress_bar.Bar: watched=False)

    def _enter(self) -> None:
        self.mode = mode()
        self.inside_bar = _inside_bar()
        self.start = _timings.clock()
        if self.mode != "off" and self.watched:
            _SCREEN.push(self)

    def _leave(self) -> None:
        _SCREEN.pop(self)

    @property
    def elapsed(self) -> float:
        return _timings.clock() - self.start

    def still_due(self, now: float) -> bool:
        """``"lines"`` mode: whether a "still running" line is due (module docstring)."""
        k = self._next_still
        due = STILL[k] if k < len(STILL) else STILL[-1] * (k - len(STILL) + 2)
        if now - self.start < due:
            return False
        self._next_still += 1
        return True

    def status(self, now: float) -> tuple[str, str]:  # pragma: no cover - overridden
        raise NotImplementedError

    def tick(self, now: float) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class Phase(_Active):
    """A phase of a computation, used as a context manager: ``with Phase([("compiling the
    solve (...)", "compiled the solve"), ("solving to tau = 300", "solved")], [55.0, 10.0]) as
    phase:`` (module docstring). ``stages``: ``(doing, done)`` texts (or one pair), moved through
    by :meth:`advance`, or by the end of XLA's compilation of a program named in ``follow_compiles``
    (JAX's ``fun_name``, e.g. ``"jit(call)"``: :func:`_listen_to_compiles`); ``estimates``:
    the expected seconds of each stage (0: none); ``quiet``: a phase expected to be short;
    ``draw=False``: no live line (another bar draws, e.g. diffrax's); ``overrun``: what a "still"
    line adds once a stage has run past ``OVERRUN`` times its estimate (why it may be slow). After the block:
    :attr:`seconds` of each stage reached,
    :attr:`compile_seconds` (JAX's tracing, lowering and compilation inside it) and
    :attr:`cache_hits` / :attr:`cache_misses` of the persistent compilation cache."""

    def __init__(self, stages: Sequence[tuple[str, str]] | tuple[str, str], estimates: Sequence[float] = (), *,
                 quiet: bool = False, follow_compiles: Sequence[str] = (), draw: bool = True, overrun: str = ""):
        self.stages = [stages] if isinstance(stages[0], str) else list(stages)
        self.overrun = overrun
        self.estimates = list(estimates)
        self.quiet, self.follow, self.draw = quiet, follow_compiles, draw
        self.stage = 0
        self.seconds: list[float] = []
        self.compile_seconds = 0.0
        self.cache_hits = self.cache_misses = 0
        self._said = False
        self._stage_start = 0.0

    def __enter__(self) -> Phase:
        self._enter()
        self._stage_start = self.start
        if "jax" in sys.modules:  # also in mode "off": the records of singleloc.runtime._timings are measured whatever is shown
            _listen_to_compiles()
        _PHASES.append(self)
        if self.mode == "lines" and not self.quiet and not self.inside_bar:
            self._say_start()
        return self

    def _expected(self) -> str:
        est = self.estimates[self.stage] if self.stage < len(self.estimates) else 0.0
        return f", about {duration(est)}" if est > 0 else ""

    def _say_start(self) -> None:
        self._said = True
        _SCREEN.line(f"{settings().prefix}: {self.stages[self.stage][0]}{self._expected()} ...")

    def advance(self) -> None:
        """Move to the next stage (``"lines"``: one line, the end of this one and the start of the next)."""
        if self.stage + 1 >= len(self.stages):
            return
        now = _timings.clock()
        self.seconds.append(now - self._stage_start)
        done = f"{self.stages[self.stage][1]} in {duration(self.seconds[-1])}"
        self.stage += 1
        self._stage_start = now
        self._next_still = 0
        if self.mode == "lines" and not self.inside_bar and (self._said or not self.quiet):
            self._said = True
            _SCREEN.line(f"{settings().prefix}: {done}; {self.stages[self.stage][0]}{self._expected()} ...")
        elif self.mode == "live" and not self.inside_bar and self.seconds[-1] >= SHOW_AFTER:
            _SCREEN.line(f"{settings().prefix}: {done}")

    def __exit__(self, kind, err, tb) -> None:
        self.seconds.append(_timings.clock() - self._stage_start)
        _PHASES.remove(self)
        self._leave()
        if kind is not None or self.mode == "off" or self.inside_bar:
            if self.mode == "live" and not self.inside_bar:
                with _SCREEN.lock:
                    _SCREEN.clear()
            return
        if self.follow and self.stage == 0 and len(self.stages) > 1:
            self.stage = len(self.stages) - 1  # its program did not compile after all (this process held it): it only ran
        text = f"{settings().prefix}: {self.stages[self.stage][1]} in {duration(self.seconds[-1])}"
        with _SCREEN.lock:
            if self.mode == "live":
                _SCREEN.clear()
                if self.seconds[-1] >= SHOW_AFTER or not self.quiet:
                    _SCREEN.line(text)
            elif self._said or not self.quiet:
                _SCREEN.line(text)

    def status(self, now: float) -> tuple[str, str]:
        """The live line: what it does, and the elapsed time against the estimate."""
        est = self.estimates[self.stage] if self.stage < len(self.estimates) else 0.0
        of = f" of about {duration(est)}" if est > 0 else ""
        return f"{settings().prefix}: {self.stages[self.stage][0]}", f": {duration(now - self._stage_start)}{of}"

    def tick(self, now: float) -> None:
        if self.mode != "lines" or self.inside_bar:
            return
        if self.quiet and not self._said and now - self.start >= QUIET_AFTER:
            self._say_start()
        elif (self._said or not self.quiet) and self.still_due(now):
            est = self.estimates[self.stage] if self.stage < len(self.estimates) else 0.0
            took = now - self._stage_start
            of = f" (about {duration(est)} estimated)" if est > 0 else ""
            if est > 0 and took > OVERRUN * est and self.overrun:
                of += f": {took / est:.0f} times its estimate; {self.overrun}"
            _SCREEN.line(f"{settings().prefix}: still {self.stages[self.stage][0]}: {duration(took)}{of}")

    def _compiled(self, event: str, seconds: float, name: str) -> None:
        """A compilation event of JAX inside this phase (:func:`_listen_to_compiles`)."""
        self.compile_seconds += seconds
        if event.endswith("backend_compile_duration") and name in self.follow:
            self.advance()


# ----------------------------------------------------------------------------- JAX's compilation events


_LISTENING = [False]


def _listen_to_compiles() -> None:
    """Register (once per process) the listeners of JAX's compilation events, which hand them
    to the innermost phase that follows them."""
    if _LISTENING[0]:
        return
    import jax

    def on_duration(event: str, seconds: float, **kwargs) -> None:
        if event.startswith("/jax/core/compile/") and (phase := _following()) is not None:
            phase._compiled(event, seconds, str(kwargs.get("fun_name", "")))

    def on_event(event: str, **kwargs) -> None:
        if (phase := _following()) is not None:
            if event == "/jax/compilation_cache/cache_hits":
                phase.cache_hits += 1
            elif event == "/jax/compilation_cache/cache_misses":
                phase.cache_misses += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    _LISTENING[0] = True


_PHASES: list[Phase] = []  # the phases running now, innermost last (whatever the mode)


def _following() -> Phase | None:
    """The innermost running phase: it receives JAX's compilation events."""
    return _PHASES[-1] if _PHASES else None

"""What a long computation says on stderr while it runs: its estimate, its phases and counts, and their times
(docs/commands/progress.md).

A :class:`Phase` (stages in turn) or a :class:`Bar` (a count): mode ``"live"`` redraws one status line by a heartbeat
thread (XLA releases the GIL), mode ``"lines"`` says a line per stage and when still running, inside a bar the bar
speaks. The mode is :func:`reporting`'s or :func:`set_progress`'s, else ``SINGLELOC_PROGRESS``, else live on a
terminal, lines otherwise, off on a Dask worker. A phase follows JAX's compilation events (``follow_compiles``): no host
callback keeps a program out of the persistent cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence

MODE_ENV = "SINGLELOC_PROGRESS"
MODES = ("auto", "live", "lines", "off")
TICK = 0.5  # seconds between two redraws of the live line
QUIET_AFTER = 3.0  # a quiet phase's lines start after this many seconds
SHOW_AFTER = 1.0  # "live": a finished phase leaves its line when it took this long
OVERRUN = 10.0  # a "still" line past this many times its estimate says why it may be slow
STILL = (60.0, 120.0, 240.0, 480.0, 600.0)  # "lines": a phase still running says so after these seconds, then every 600 s

#: The clock of every measurement (seconds; tests replace it).
clock = time.perf_counter


def duration(seconds: float) -> str:
    """``"0.4 s"``, ``"40 s"``, ``"12 min"``, ``"6.4 h"``, ``"3.1 days"``, ``"an unknown time"`` (NaN, infinite)."""
    if not math.isfinite(seconds):
        return "an unknown time"
    if seconds < 90:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.2g} min"
    return f"{seconds / 3600:.2g} h" if seconds < 72 * 3600 else f"{seconds / 86400:.2g} days"


@dataclasses.dataclass(frozen=True)
class Estimate:
    """What a computation is expected to take: ``seconds`` in all, its ``basis`` (what the number comes from) and its
    ``parts`` (``(what, seconds)``)."""

    seconds: float
    basis: str
    parts: tuple[tuple[str, float], ...] = ()

    def describe(self) -> str:
        """``"about 70 s (compiling about 60 s, solving about 10 s; measured on this CPU for this shape family)"``
        (the parts above 5 % of the whole, when there are two or more)."""
        shown = [f"{what} about {duration(s)}" for what, s in self.parts if s > 0.05 * self.seconds]
        inside = "; ".join(filter(None, (", ".join(shown) if len(shown) > 1 else "", self.basis)))
        return f"about {duration(self.seconds)}" + (f" ({inside})" if inside else "")


@dataclasses.dataclass(frozen=True)
class Settings:
    """How a process reports (module docstring; ``mode=None``: from the environment): the lines' ``prefix``, the limits
    above which :func:`announce` refuses an estimate, and whether measured times are written to the timings file
    (``record``: the commands set it, :mod:`singleloc.preflight._estimates`)."""

    mode: str | None = None
    prefix: str = "singleloc"
    run_limit: float | None = None
    point_limit: float | None = None
    record: bool = False


_SETTINGS = [Settings()]


def set_progress(mode: str = "auto") -> None:
    """Say what long computations of this process print on stderr: ``"live"`` (a status line on a
    terminal), ``"lines"`` (a line per phase, for logs), ``"off"``, or ``"auto"`` (the default: live on a
    terminal, lines otherwise; ``SINGLELOC_PROGRESS`` overrides it) (docs/commands/progress.md)."""
    with reporting(mode=None if mode == "auto" else mode) as chosen:
        _SETTINGS[0] = dataclasses.replace(_SETTINGS[0], mode=chosen.mode)


@contextlib.contextmanager
def reporting(**changes) -> Iterator[Settings]:
    """Within the block, :class:`Settings` changed by ``changes`` (``mode``, ``prefix``, limits, ``record``)."""
    if changes.get("mode") not in (None, *MODES):
        raise ValueError(f"mode = {changes['mode']!r}: expected one of {', '.join(MODES)}")
    _SETTINGS.append(dataclasses.replace(_SETTINGS[-1], **changes))
    try:
        yield _SETTINGS[-1]
    finally:
        _SETTINGS.pop()


def settings() -> Settings:
    return _SETTINGS[-1]


def on_dask_worker() -> bool:
    """Whether this runs as a task on a Dask worker (a process that has not imported ``distributed`` is none)."""
    distributed = sys.modules.get("distributed")
    try:
        return distributed is not None and distributed.get_worker() is not None
    except ValueError:
        return False


def terminal_width() -> int:
    """The columns of stderr's terminal (``COLUMNS`` where set); 0 where it reports none, or is none."""
    try:
        return int(os.environ.get("COLUMNS") or os.get_terminal_size(sys.stderr.fileno()).columns)
    except (AttributeError, ValueError, OSError):
        return 0


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def mode() -> str:
    """The mode now (module docstring); a bad value in the environment counts as ``"auto"``."""
    chosen = settings().mode or os.environ.get(MODE_ENV, "").strip().lower()
    if chosen in MODES[1:]:
        return chosen
    return "off" if on_dask_worker() else "live" if getattr(sys.stderr, "isatty", lambda: False)() else "lines"


class _Screen:
    """What is on stderr: whether a live line is drawn, the running phases (innermost last), and the heartbeat thread
    that redraws the live line and says the "still running" lines."""

    def __init__(self):
        self.lock = threading.RLock()
        self.wake = threading.Condition(self.lock)
        self.stack: list[Phase] = []
        self.drawn, self.thread = False, None

    def clear(self) -> None:
        sys.stderr.write("\r\x1b[K" if self.drawn else "")
        self.drawn = False

    def line(self, text: str) -> None:
        """A whole line ``PREFIX: text``, above the live line."""
        with self.lock:
            self.clear()
            print(f"{settings().prefix}: {text}", file=sys.stderr, flush=True)

    def draw(self, text: str, tail: str) -> None:
        """The live line: ``text`` cut to the terminal's width, ``tail`` (the times) whole."""
        width = max(20, (terminal_width() or 100) - 1) - len(tail)
        with self.lock:
            sys.stderr.write("\r" + (text if len(text) <= width else text[:max(width - 3, 0)] + "...") + tail + "\x1b[K")
            sys.stderr.flush()
            self.drawn = True

    def innermost(self, inside_bar: bool = False) -> Phase | None:
        """The innermost phase (``inside_bar``: of those running inside a bar, which the bar names)."""
        return next((a for a in reversed(self.stack) if a.inside_bar or not inside_bar), None)

    def push(self, active: Phase) -> None:
        with self.lock:
            self.stack.append(active)
            if active.mode != "off" and (self.thread is None or not self.thread.is_alive()):
                self.thread = threading.Thread(target=self._beat, name="singleloc-progress", daemon=True)
                self.thread.start()
            self.wake.notify_all()

    def _beat(self) -> None:
        with self.lock:
            while self.stack:
                now, shown = clock(), [a for a in self.stack if a.mode != "off"]
                with contextlib.suppress(Exception):  # a closed stream at exit: nothing to say
                    for active in shown:
                        active.tick(now)
                    top = next((a for a in reversed(shown) if not a.inside_bar), None)
                    if top is not None and top.mode == "live" and top.draw:
                        self.draw(*top.status(now))
                self.wake.wait(TICK)
            self.thread = None


_SCREEN = _Screen()


def say(text: str) -> None:
    """One line ``PREFIX: text`` on stderr (nothing in mode ``"off"``)."""
    if mode() != "off":
        _SCREEN.line(text)


def announce(what: str, estimate: Estimate, remedy: str = "", *, limit: str = "run") -> None:
    """Say ``what: about X (basis)`` before a computation starts; refuse it (``ValueError``, one line with ``remedy``,
    what would make it cheaper) above :func:`reporting`'s limit (``limit``: ``"run"``, or ``"point"`` for a sweep point)."""
    s = settings()
    bound, flag, who = (s.run_limit, "--force", "a run") if limit == "run" else (s.point_limit, "--yes", "a sweep point")
    if bound is not None and estimate.seconds > bound:
        hours = f"{bound / 3600:g} h" if bound >= 3600 else duration(bound)
        raise ValueError(f"{what}: {estimate.describe()}: more than the {hours} {who} may take without {flag}; "
                         f"{remedy + ', or ' if remedy else ''}pass {flag} to run it anyway")
    if not _in_bar():
        say(f"{what}: {estimate.describe()}")


def _in_bar() -> bool:
    """Whether a bar is shown now (it speaks for what runs inside it)."""
    return any(isinstance(a, Bar) and a.mode != "off" for a in _SCREEN.stack)


class Phase:
    """A phase of a computation, a context manager: ``with Phase([("compiling the solve", "compiled the solve"),
    ("solving to tau = 300", "solved")], [55.0, 10.0]) as phase:``. ``stages``: ``(doing, done)`` texts (or one pair),
    moved through by :meth:`advance` or by the end of XLA's compilation of a program named in ``follow_compiles``
    (``"jit(call)"``); ``estimates``: each stage's expected seconds (0: none); ``quiet``: expected to be short;
    ``said``: its start was just said (:func:`announce`); ``live=False``: lines, not the live line; ``draw=False``: no
    live line (another bar draws); ``overrun``: why a stage far past its estimate may be slow. After the block:
    :attr:`seconds` of each stage reached, and :attr:`cache_misses` of the persistent compilation cache."""

    total = None  # a count: Bar

    def __init__(self, stages, estimates: Sequence[float] = (), *, quiet: bool = False, said: bool = False,
                 follow_compiles: Sequence[str] = (), live: bool = True, draw: bool = True, overrun: str = ""):
        self.stages = [stages] if isinstance(stages[0], str) else list(stages)
        self.estimates = [*estimates, *[0.0] * (len(self.stages) - len(estimates))]
        self.quiet, self.said, self.follow = quiet, said, follow_compiles
        self.live, self.draw, self.overrun = live, draw, overrun
        self.stage, self.seconds, self.cache_misses, self.still, self.mode, self.inside_bar = 0, [], 0, 0, "off", False

    def _speaks(self) -> bool:
        return self.mode == "lines" and not self.inside_bar and (self.said or not self.quiet)

    def _start_line(self, before: str = "") -> None:
        self.said = True
        _SCREEN.line(f"{before}{self.stages[self.stage][0]}{self._about(', ')} ...")

    def _about(self, before: str) -> str:
        return f"{before}about {duration(self.estimates[self.stage])}" if self.estimates[self.stage] else ""

    def __enter__(self) -> Phase:
        self.mode, self.start, self.inside_bar = mode(), clock(), _in_bar()
        self.since = self.start
        if self.mode == "live" and (not self.live or self.total is not None and terminal_width() <= 0):
            self.mode = "lines"  # a bar on a terminal that reports no width: lines (issue 61 item 4)
        if self.total is not None and self.total <= 0:  # nothing to count (a sweep's points all cached)
            self.mode = "off"
        _SCREEN.push(self)  # also in mode "off": JAX's compilation events go to the innermost phase
        if "jax" in sys.modules:
            _listen_to_compiles()
        if self.mode == "lines" and not (self.inside_bar or self.quiet or self.said):
            self._start_line()
        return self

    def advance(self) -> None:
        """Move to the next stage (``"lines"``: one line, the end of this one and the start of the next)."""
        if self.stage + 1 >= len(self.stages):
            return
        now = clock()
        self.seconds.append(now - self.since)
        done = f"{self.stages[self.stage][1]} in {duration(self.seconds[-1])}"
        self.stage, self.since, self.still = self.stage + 1, now, 0
        if self._speaks():
            self._start_line(f"{done}; ")
        elif self.mode == "live" and not self.inside_bar and self.seconds[-1] >= SHOW_AFTER:
            _SCREEN.line(done)

    def __exit__(self, kind, err, tb) -> None:
        self.seconds.append(clock() - self.since)
        if self.follow and self.stage == 0 and len(self.stages) > 1:
            self.stage = len(self.stages) - 1  # its program did not compile (this process held it): it only ran
        with _SCREEN.lock:
            _SCREEN.stack.remove(self)
            if self.mode == "live" and not self.inside_bar:
                _SCREEN.clear()
            shown = self.seconds[-1] >= SHOW_AFTER or not self.quiet if self.mode == "live" else self._speaks()
            done = self.stages[self.stage][1] if self.total is None else self.stages[0][1].format(n=self.n)
            if kind is None and shown and not self.inside_bar:
                _SCREEN.line(f"{done} in {duration(self.seconds[-1])}")

    def status(self, now: float) -> tuple[str, str]:
        """The live line: what it does, and the elapsed time against the estimate."""
        return f"{settings().prefix}: {self.stages[self.stage][0]}", f": {duration(now - self.since)}{self._about(' of ')}"

    def _still_due(self, now: float) -> bool:
        """``"lines"``: whether a "still running" line is due (module docstring)."""
        due = STILL[self.still] if self.still < len(STILL) else STILL[-1] * (self.still - 3)
        if self._speaks() and now - self.since >= due:
            self.still += 1
            return True
        return False

    def tick(self, now: float) -> None:
        if self.mode == "lines" and not self.inside_bar and self.quiet and not self.said and now - self.start >= QUIET_AFTER:
            self._start_line()
        elif self._still_due(now):
            est, took = self.estimates[self.stage], now - self.since
            slow = f": {took / est:.0f} times its estimate; {self.overrun}" if self.overrun and took > OVERRUN * est > 0 else ""
            _SCREEN.line(f"still {self.stages[self.stage][0]}: {duration(took)}"
                         + (f" (about {duration(est)} estimated){slow}" if est else ""))


class Bar(Phase):
    """A count of ``total`` ``unit``\\ s: a :class:`Phase` of one stage, :meth:`update`\\ d as they are done.
    ``estimate``: the whole's; ``costs`` (:meth:`plan`, :meth:`update`): each item's expected seconds, so that the time
    left is the estimate of what remains at the pace measured so far, not the mean of the first items. ``each``: in
    ``"lines"`` a line per item, else "still" lines; ``done``: the closing line (``{n}``: the count); ``announced``: the
    estimate was just said. :attr:`marks`: the clock at every update."""

    def __init__(self, total: int, desc: str, unit: str, *, estimate: Estimate | None = None, each: bool = False,
                 done: str | None = None, announced: bool = False, **kwargs):
        units = unit if total == 1 else unit + "s"
        super().__init__((f"{desc}: {total} {units}", done or f"{desc}: {{n}} {units}"),
                         [estimate.seconds if estimate else 0.0], said=announced, **kwargs)
        self.total, self.desc, self.units, self.each = int(total), desc, units, each
        self.n, self.cost_done, self.cost_total, self.marks = 0, 0.0, 0.0, []

    def plan(self, costs: Sequence[float]) -> None:
        """The expected seconds of every item to come."""
        self.cost_total = float(sum(costs))
        self.estimates[0] = self.estimates[0] or self.cost_total

    def left(self, now: float) -> float:
        """Seconds left: the expected cost of what remains times the pace so far (measured seconds per expected second,
        up to the last item done), less the time since that item; without costs, the time per item times those left."""
        if self.cost_total > 0:
            last = self.marks[-1] if self.marks else self.start
            pace = (last - self.start) / self.cost_done if self.cost_done > 0 and last > self.start else 1.0
            return max(0.0, max(0.0, self.cost_total - self.cost_done) * pace - (now - last))
        if self.n > 0:
            return (now - self.start) / self.n * (self.total - self.n)
        return max(0.0, self.estimates[0] - (now - self.start)) if self.estimates[0] else math.nan

    def update(self, n: int = 1, cost: float | None = None) -> None:
        now = clock()
        self.marks.append(now)
        self.n, self.cost_done = self.n + n, self.cost_done + (cost or 0.0)
        if self.mode == "live" and not self.inside_bar:
            _SCREEN.draw(*self.status(now))
        elif self.n < self.total and self.each and self._speaks():
            _SCREEN.line(self._counted(now))  # (the last: the closing line)

    def _counted(self, now: float) -> str:
        left, inner = self.left(now), _SCREEN.innermost(inside_bar=True)
        rest = "" if self.n >= self.total or math.isnan(left) else (
            f", about {duration(left)} left" if left > 0 else ", longer than estimated")
        return (f"{self.desc}: {self.n}/{self.total} {self.units} after {duration(now - self.start)}{rest}"
                + (f" (now {inner.stages[inner.stage][0]})" if inner is not None else ""))

    def status(self, now: float) -> tuple[str, str]:
        """The live bar: 20 columns, the count, the time left and the phase inside it."""
        filled = round(20 * self.n / max(self.total, 1))
        return f"{settings().prefix}: |{'#' * filled}{' ' * (20 - filled)}| {self._counted(now)}", ""

    def tick(self, now: float) -> None:
        if self._still_due(now):
            _SCREEN.line(self._counted(now))


_LISTENING = []
#: The programs this process has made since it listens (:func:`_listen_to_compiles`): ``"seconds"`` tracing, lowering,
#: compiling or reading them from the persistent cache; ``"misses"``, how many the persistent cache did not hold (XLA
#: compiled them: every program, loaded or not, reports a ``backend_compile_duration``).
PROGRAMS_MADE = {"seconds": 0.0, "misses": 0}
_MAKING = ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration", "backend_compile_duration", "cache_retrieval_time_sec")


def _listen_to_compiles() -> None:
    """Register (once per process) the listeners of JAX's compilation events: the innermost phase's, and
    :data:`PROGRAMS_MADE`."""
    if _LISTENING:
        return
    import jax

    def on_duration(event: str, seconds: float, fun_name: str = "", **kwargs) -> None:
        PROGRAMS_MADE["seconds"] += seconds if event.endswith(_MAKING) else 0.0
        if event == "/jax/core/compile/backend_compile_duration":
            if (p := _SCREEN.innermost()) and fun_name in p.follow:
                p.advance()

    def on_event(event: str, **kwargs) -> None:
        if event == "/jax/compilation_cache/cache_misses":
            PROGRAMS_MADE["misses"] += 1
            if p := _SCREEN.innermost():
                p.cache_misses += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    _LISTENING.append(True)

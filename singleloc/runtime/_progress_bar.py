"""A count of things done (SGD steps, sweep points, pruned layers) shown as :mod:`singleloc.runtime._progress`
shows phases: tqdm's bar on a terminal, refreshed by the heartbeat with the phase inside it (a sweep
point compiling) in its postfix; without one, a line at the start, at the end with its time, and per
item (``each``) or while it runs; and a time left made of the items' estimates (:meth:`Bar.left`)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence

from . import _timings
from ._progress import _SCREEN, Phase, _Active, settings, terminal_width
from ._timings import Estimate, duration


def _plural(n: int, unit: str) -> str:
    return unit if n == 1 else unit + "s"


class Bar(_Active):
    """A count of ``total`` ``unit``\\ s (SGD steps, sweep points), used as a context manager and
    :meth:`update`\\ d as they are done. ``estimate``: the expected seconds of the whole; ``costs``
    given to :meth:`update` (the expected seconds of what was just done) make the time left the
    estimate of what remains, scaled by the measured pace so far, rather than tqdm's average of
    the first items (a sweep's first points say little about its last). ``each``: in ``"lines"``
    mode, one line per update (sweep points), else only the heartbeat's lines. ``live=False``
    (a caller's ``progress=False``): no live bar, its lines instead. ``watched=False``: a bar that
    the caller may leave unclosed (an error inside its loop): not on the heartbeat's stack, so it
    speaks only when updated (its "still running" lines too). ``announced``: the estimate was
    just said (:func:`announce`), so ``"lines"`` mode has no start line. :attr:`marks`: the clock
    at every update."""

    def __init__(self, total: int, desc: str, unit: str, *, estimate: Estimate | float | None = None, each: bool = False,
                 done: str | None = None, unit_scale: bool = False, live: bool = True, watched: bool = True,
                 announced: bool = False):
        self.total, self.desc, self.unit, self.each, self.live = int(total), desc, unit, each, live
        self.watched, self.announced = watched, announced
        self.marks: list[float] = []  # the clock at every update
        self.expected = estimate.seconds if isinstance(estimate, Estimate) else (float(estimate) if estimate else 0.0)
        self.done_text = done or f"{desc}: {{n}} {_plural(total, unit)}"
        self.unit_scale = unit_scale
        self.n = 0
        self.cost_done = 0.0
        self.cost_total = 0.0
        self.tqdm = None
        self.counts = True

    def __enter__(self) -> Bar:
        self._enter()
        if self.total <= 0:  # nothing to count (a sweep whose points are all cached): nothing to say
            self._leave()
            self.mode = "off"
        if self.mode == "live" and (not self.live or terminal_width() <= 0):  # no live bar asked for (progress=False),
            self.mode = "lines"  # or a terminal that reports no width, where tqdm draws nothing: its lines
        if self.inside_bar:  # a bar inside a bar (a simulation inside a sweep): the outer one speaks
            pass
        elif self.mode == "live":
            from tqdm.auto import tqdm

            self.tqdm = tqdm(total=self.total, desc=f"{settings().prefix}: {self.desc}", unit=self.unit, leave=False,
                             file=sys.stderr, dynamic_ncols=True, unit_scale=self.unit_scale)
            self.plan([self.cost_total])
        elif self.mode == "lines" and not self.announced:
            of = f", about {duration(self.expected)}" if self.expected > 0 else ""
            _SCREEN.line(f"{settings().prefix}: {self.desc}: {self.total} {_plural(self.total, self.unit)}{of} ...")
        return self

    def plan(self, costs: Sequence[float]) -> None:
        """The expected seconds of every item to come (their sum is the time left at the start)."""
        self.cost_total = float(sum(costs))
        self.expected = self.expected or self.cost_total
        if self.tqdm is not None and self.cost_total > 0:  # the time left is ours (postfix), not tqdm's pace of the first items
            self.tqdm.bar_format = "{l_bar}{bar}| {n_fmt}/{total_fmt} {unit}s [{elapsed}{postfix}]"

    def left(self, now: float) -> float:
        """Seconds left: the expected cost of what remains times the pace so far (measured seconds
        per expected second, up to the last item done), less the time since that item; without
        costs, the elapsed time per item times the items left."""
        elapsed = now - self.start
        if self.cost_total > 0:
            last = self.marks[-1] if self.marks else self.start
            pace = (last - self.start) / self.cost_done if self.cost_done > 0 and last > self.start else 1.0
            return max(0.0, max(0.0, self.cost_total - self.cost_done) * pace - (now - last))
        if self.n > 0:
            return elapsed / self.n * (self.total - self.n)
        return max(0.0, self.expected - elapsed) if self.expected else float("nan")

    def update(self, n: int = 1, cost: float | None = None) -> None:
        self.marks.append(_timings.clock())
        self.n += n
        self.cost_done += cost or 0.0
        if self.tqdm is not None:
            with _SCREEN.lock:
                self.tqdm.set_postfix_str(self._postfix(_timings.clock()), refresh=False)
                self.tqdm.update(n)
        elif self.mode == "lines" and not self.inside_bar:
            now = _timings.clock()
            if self.n < self.total and (self.each or (not self.watched and self.still_due(now))):  # the last: close()
                _SCREEN.line(f"{settings().prefix}: {self._counted(now)}")

    def _counted(self, now: float) -> str:
        left = self.left(now)
        rest = "" if self.n >= self.total or left != left else f", about {duration(left)} left" if left > 0 else \
            ", longer than estimated"
        return f"{self.desc}: {self.n}/{self.total} {_plural(self.total, self.unit)} after {duration(now - self.start)}{rest}"

    def _postfix(self, now: float) -> str:
        inner = next((a for a in reversed(_SCREEN.stack) if isinstance(a, Phase) and a.inside_bar), None)
        parts = []
        if self.cost_total > 0 and self.n < self.total:
            parts.append(f"about {duration(self.left(now))} left")
        if inner is not None:
            parts.append(f"{inner.stages[inner.stage][0]} {duration(now - inner._stage_start)}")
        return "; ".join(parts)

    def close(self) -> None:
        self._leave()
        if self.tqdm is not None:
            self.tqdm.close()
            self.tqdm = None
        elif self.mode == "lines" and not self.inside_bar:
            _SCREEN.line(f"{settings().prefix}: {self.done_text.format(n=self.n)} in {duration(self.elapsed)}")

    def __exit__(self, kind, err, tb) -> None:
        if kind is None:
            self.close()
            return
        self._leave()
        if self.tqdm is not None:
            self.tqdm.close()
            self.tqdm = None

    def status(self, now: float) -> tuple[str, str]:
        return self._counted(now), ""

    def tick(self, now: float) -> None:
        if self.tqdm is not None:
            with contextlib.suppress(Exception):
                self.tqdm.set_postfix_str(self._postfix(now), refresh=False)
                self.tqdm.refresh()
        elif self.mode == "lines" and not self.inside_bar and self.still_due(now):
            inner = next((a for a in reversed(_SCREEN.stack) if isinstance(a, Phase) and a.inside_bar), None)
            now_doing = f" (now {inner.stages[inner.stage][0]})" if inner is not None else ""
            _SCREEN.line(f"{settings().prefix}: {self._counted(now)}{now_doing}")

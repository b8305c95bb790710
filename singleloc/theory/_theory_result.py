"""The result of an ODE solve (:func:`~singleloc.integrate`): trajectories, their risks and the
stated errors of the quadrature, and the run folder they are written to."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..configuration._config import Config
from ..expectations._routes import route_class
from ..preflight._build import Setup, build
from ._trajectory import Trajectory

#: The fields of a :class:`TheoryResult` that state its quadrature (route and errors), as a sweep's
#: cache entries and CSV columns carry them (:meth:`TheoryResult.statement`).
STATEMENT_FIELDS = ("route", "gram_route", "risk_error", "exact_drift_error", "gram_error", "drift_error", "points")


@dataclasses.dataclass(frozen=True)
class TheoryResult(Trajectory):
    """ODE trajectories of ``S`` initial conditions at ``T`` saved times (a :class:`~singleloc.Trajectory`).

    ``tau`` (T,), ``M`` (S, T, H, F), ``Q`` (S, T, H, H), ``b`` (S, T, H), ``risk`` (S, T): the means over the
    ``replicates`` rules; ``risk_se`` (S, T): the standard error of ``risk`` (NaN for one replicate);
    ``drift_error``: the estimated relative drift error at the start and the end, worst start (from independent
    scramblings: :func:`~singleloc.expectations._expectation.solve_report`; NaN on the exact route); ``points``: the
    Sobol points per rule (the choice, for ``theory.points = "auto"``); ``route``: ``"exact"``, ``"rule"`` or
    ``"montecarlo"`` (``2 points`` draws); ``risk_error``: on the exact route the largest difference of the risk at
    the start and the end to a finer exact rule, on the others the larger standard error of the risk there;
    ``gram_error``: on the exact route the estimated relative error of the ``lr^2`` (Gram) term at the start and
    the end; ``gram_route``: how that term was computed, ``"exact"`` (``theory.gram``), ``"montecarlo"`` or
    ``"sobol"``; ``exact_drift_error``: on the exact route the largest relative difference of the ``O(lr)`` drift
    to the finer exact rule at the start and the end (:meth:`~singleloc.OrderParameterODE.exact_drift_error`),
    NaN where ``risk_error`` is below 1e-9 (it is then under about 1e-5); ``axes``: the rule route's field layout
    (``theory.axes``); ``v`` (S, T, H): the trained head weights (``model.head_weights = "trained"``; else ``None``).
    ``theory.npz`` stores the first trajectory with the leading ``S`` axis dropped.
    """

    risk_se: np.ndarray | None = None  # None: no estimate (NaN of the shape of risk)
    drift_error: float = float("nan")
    points: int = 0  # the Sobol rule's points (on the exact route: the Gram term's); 0: not known
    replicates: int = 1
    route: str = "rule"
    risk_error: float = float("nan")
    gram_error: float = float("nan")
    exact_drift_error: float = float("nan")
    v: np.ndarray | None = None  # (S, T, H): trained head weights; None for the head average
    gram_route: str = "sobol"  # the lr^2 Gram term's: "exact" (exact route, theory.gram), "sobol" or "montecarlo"
    axes: str = "heads"  # the rule route's field layout (theory.axes): "heads" or "principal" (rank-aware)

    def __post_init__(self):
        if self.risk_se is None:
            object.__setattr__(self, "risk_se", np.full(np.shape(self.risk), np.nan))

    def statement(self) -> dict[str, np.ndarray]:
        """The route and stated errors (:data:`STATEMENT_FIELDS`) as 0-d arrays."""
        return {k: np.asarray(getattr(self, k)) for k in STATEMENT_FIELDS}

    def arrays(self, index: int = 0) -> dict[str, np.ndarray]:
        return {"tau": self.tau, "M": self.M[index], "Q": self.Q[index], "b": self.b[index], "risk": self.risk[index],
                "risk_se": self.risk_se[index], "replicates": np.asarray(self.replicates), **self.statement(),
                **({} if self.v is None else {"v": self.v[index]})}

    def quadrature(self) -> str:
        """One line on the rule: points, replicates and the error estimates (for printing)."""
        parts = [route_class(self.route).describe(self)]
        if np.isfinite(self.drift_error):
            parts.append(f"estimated relative drift error {self.drift_error:.1e} (the largest at the start and the end)")
        if self.replicates > 1:
            parts.append(f"largest standard error of the risk {np.max(self.risk_se):.1e}")
        return "quadrature: " + "; ".join(parts)

    def resolved(self, run: Config | Setup) -> Config | Setup:
        """``run`` as this result ran: ``theory.points = "auto"`` replaced by the number of points used, and for a
        Setup whose solve changed route (the exact route's fields outgrew its rule:
        :func:`~singleloc.theory._ode.integrate_setup`) the route used, built in place of the one decided."""
        if isinstance(run, Setup) and run.route is not None and run.route.route != self.route:
            return build(run.config.replace(theory={"route": self.route, "points": self.points}))
        return run if run.theory.points != "auto" else run.replace(theory={"points": self.points})


def theory_from_arrays(one: dict[str, np.ndarray] | None, seeds: dict[str, np.ndarray] | None = None) -> TheoryResult:
    """A :class:`TheoryResult` from the arrays of a run folder: ``one``, those of ``theory.npz``
    (:meth:`TheoryResult.arrays`: one trajectory, its route and stated errors), and ``seeds``, those of ``compare``'s
    ``theory_seeds.npz`` (every seed's trajectories, with a leading axis), which give the trajectories when present.
    Fields a file does not hold (an older run) keep their defaults."""
    trajectories = seeds if seeds is not None else {k: (v[None] if k not in ("tau", "replicates") else v)
                                                    for k, v in one.items() if np.ndim(v) > 0}
    statement = {} if one is None else {k: one[k].item() for k in (*STATEMENT_FIELDS, "replicates") if k in one}
    return TheoryResult(tau=trajectories["tau"], M=trajectories["M"], Q=trajectories["Q"], b=trajectories["b"],
                        risk=trajectories["risk"], risk_se=trajectories.get("risk_se"), v=trajectories.get("v"), **statement)

"""Linear stability along the head-symmetric subspace of the ODE (docs/model.md section 5).

Coordinates. The drift :meth:`OrderParameterODE.drift` is linearised over the flattened state ``v = (M, upper triangle
of Q, b)`` of :func:`singleloc.theory._theory.flatten_state` (``b`` only when the biases train); its Jacobian is
:func:`singleloc.analysis._drift_jacobian.drift_jacobian` (autodiff, or central differences where ``Q`` has repeated
eigenvalues).

The symmetric subspace. States invariant under permutations of the heads, ``M_h = m`` for every head, ``R_orth = r_d I +
r_o 1 1^T`` and ``b_h = b_0``, are written ``x = [m (F), r_d, r_o, b_0]`` (``r_o`` absent when ``H = 1``;
:func:`symmetric_state`). The subspace is invariant under the flow (the quadrature rule is permutation-equivariant) and
contains the unspecialized fixed point (:func:`~singleloc.unspecialized_point`, found by integrating the restricted
flow: :func:`symmetric_flow` with a constant step, :func:`symmetric_path` with an adaptive one; diffrax).

Escape. The eigenvectors of the Jacobian at the fixed point that break the head symmetry carry the escape, and the
largest real part among them is the escape rate ``lambda`` (:func:`escape_rate`). The log D law: the escape direction
starts at amplitude ``O(D^{-1/2})`` (the random initial overlaps) and grows like ``exp(lambda tau)``, so it reaches
``O(1)`` at ``tau_esc = tau_0 + (1 / (2 lambda)) log D`` (:func:`predicted_escape_slope`, :func:`linear_escape_time`).
The prediction for a configuration, with its integration horizon
(:func:`singleloc.analysis._predictions.predicted_escape`), carries the start's symmetry-breaking part
(:func:`start_variances`) by the Jacobians along the symmetric flow from ``tau = 0`` (:func:`tangent_escape`).
"""

from __future__ import annotations

import dataclasses
import functools

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
from jaxtyping import ArrayLike, Real

from ..runtime._compilation import checks_as_nan
from ..runtime._numerics import TINY, first_crossing
from ..runtime._progress import Phase
from ..theory._ode import invalid_state
from ..theory._step_budget import MIN_STEP, UNRESOLVED, StepBudget, UnresolvedFields, step_budget, stop_code, stop_reason
from ..theory._theory import OrderParameterODE, OrderParameters, flatten_state, unflatten_state
from ._drift_jacobian import drift_jacobian

# -- the symmetric subspace and its flow ----------------------------------------------------


def symmetric_state(x, H: int, F: int):
    """Head-symmetric state from ``x = [m (F), r_d, r_o, b_0]``: ``M_h = m``,
    ``Q = M M^T + r_d I + r_o 1 1^T``, ``b_h = b_0`` (``r_o`` is absent when ``H = 1``)."""
    m = x[:F]
    rd = x[F]
    ro = x[F + 1] if H > 1 else 0.0
    b0 = x[-1]
    M = jnp.broadcast_to(m, (H, F))
    Q = M @ M.T + rd * jnp.eye(H) + ro * jnp.ones((H, H))
    return M, Q, b0 * jnp.ones(H)


def symmetric_start(H: int, F: int, init_scale: float, bias_init: float) -> np.ndarray:
    """``x`` of the ``D -> infinity`` limit of a random start: ``M = 0``, ``R_orth = init_scale^2 I``,
    ``b = bias_init``."""
    return np.asarray([0.0] * F + [init_scale**2] + ([0.0] if H > 1 else []) + [bias_init])


def _diagonal_means(A, H: int):
    """``(d, o)``: the mean of the diagonal of the (H, H) array ``A`` and the mean of its
    off-diagonal entries (``o = 0`` when ``H = 1``), so that the head-symmetric part of ``A`` is
    ``(d - o) I + o 1 1^T``. NumPy, or JAX (traceable)."""
    trace = A.trace()
    return trace / H, ((A.sum() - trace) / (H * (H - 1)) if H > 1 else 0.0)


def symmetric_drift(ode: OrderParameterODE, x, H: int, F: int):
    """The drift restricted to the symmetric subspace, in the coordinates ``x``."""
    M, Q, b = symmetric_state(x, H, F)
    dM, dQ, db = ode.drift(M, Q, b)
    dia, off = _diagonal_means(dQ - dM @ M.T - M @ dM.T, H)
    return jnp.concatenate([dM.mean(0), jnp.stack([dia - off, off] if H > 1 else [dia]), jnp.stack([db.mean()])])


def _symmetric_risk(ode: OrderParameterODE, x, H: int, F: int):
    return ode.risk(*symmetric_state(x, H, F))


@eqx.filter_jit
def _symmetric_solve(ode: OrderParameterODE, x0: jax.Array, ts: jax.Array, dt0: jax.Array | None,
                     controller: diffrax.AbstractStepSizeController, H: int, F: int, max_steps: int):
    """The restricted flow saved at ``ts``, its risks and why it stopped (:func:`~singleloc.theory._step_budget.stop_code`):
    the solve's own events (an invalid state; fields its route's rule does not resolve)."""
    term = diffrax.ODETerm(lambda t, x, args: symmetric_drift(ode, x, H, F))
    events = (lambda t, x, args, **kw: invalid_state(t, OrderParameters(*symmetric_state(x, H, F)), args),
              lambda t, x, args, **kw: ~ode.expectation.resolves(*symmetric_state(x, H, F)))
    sol = diffrax.diffeqsolve(term, diffrax.Tsit5(), ts[0], ts[-1], dt0, x0, saveat=diffrax.SaveAt(ts=ts),
                              stepsize_controller=controller, event=diffrax.Event(events), max_steps=max_steps, throw=False)
    # the risks one at a time: vmapped over the saved times they asked for 48.5 GB at H = 8, L = 64 on 4096 points
    return sol.ys, jax.lax.map(lambda x: _symmetric_risk(ode, x, H, F), sol.ys), stop_code(sol)


def symmetric_flow(ode: OrderParameterODE, x0, H: int, F: int, tau_max: float, dt: float = 0.1, n_save: int = 101):
    """Integrate the restricted flow from ``x0``; returns ``(tau, x, risk)`` at about ``n_save`` equally spaced times.

    Tsit5 (diffrax) with the constant step ``h = tau_max / ceil(tau_max / dt)`` (at most ``dt``); the states are saved
    every ``per = max(n_steps // (n_save - 1), 1)`` steps, so the last saved time is ``tau_max`` rounded down to a
    multiple of ``per * h``.
    """
    n_steps = max(int(np.ceil(tau_max / dt)), 1)
    h = tau_max / n_steps
    per = max(n_steps // (n_save - 1), 1)
    taus = np.arange(n_steps // per + 1) * per * h
    x0 = jnp.asarray(x0, dtype=jnp.result_type(float))
    with checks_as_nan():
        xs, risk, _ = _symmetric_solve(ode, x0, jnp.asarray(taus, x0.dtype), jnp.asarray(h, x0.dtype),
                                       diffrax.ConstantStepSize(), H, F, n_steps + 16)
    return taus, np.asarray(xs), np.asarray(risk)


def symmetric_path(ode: OrderParameterODE, x0, H: int, F: int, ts, *, rtol: float = 1e-6, atol: float = 1e-8,
                   max_steps: int = 100_000) -> tuple[np.ndarray, np.ndarray, FloatingPointError | None]:
    """The restricted flow from ``x0`` saved at the times ``ts`` (increasing, ``ts[0]`` the start): ``(x, risk, stop)``.
    Tsit5 with diffrax's PID step-size controller (``rtol``, ``atol``), for long flows along a creeping plateau, where a
    constant step wastes thousands of steps (52 adaptive steps reach tau = 1000 at the default problem with the theory's
    default tolerances, 113 with ``rtol = 1e-8``, ``atol = 1e-10``, for a risk 7e-7 apart; the escape prediction passes
    the run's ``theory.rtol``, ``theory.atol``). It stops as a solve does (:mod:`~singleloc.theory._step_budget`): steps
    below ``MIN_STEP``, more than ``STEP_MARGIN`` times the steps expected at its rate, an invalid state, or fields its
    route's rule no longer resolves (at ``sgd.lr = 1e4`` on the default problem the exact route's flow went on for
    100000 steps of ``1e-7`` before). ``x`` and ``risk`` at the saved times it reached (the first ``len(risk)`` of
    ``ts``); ``stop``: ``None`` where it reached ``ts[-1]``, else why not (an
    :class:`~singleloc.theory._step_budget.UnresolvedFields` for the fields)."""
    x0 = jnp.asarray(x0, dtype=jnp.result_type(float))
    budget = step_budget(ode.sgd, ts, max_steps)
    controller = StepBudget(diffrax.PIDController(rtol=rtol, atol=atol, dtmin=MIN_STEP, force_dtmin=False),
                            jnp.asarray(budget, jnp.int32))
    with checks_as_nan():
        xs, risk, code = _symmetric_solve(ode, x0, jnp.asarray(ts, x0.dtype), None, controller, H, F, max_steps)
    xs, risk, code = np.asarray(xs), np.asarray(risk), int(code)
    n = int(np.argmin(np.isfinite(risk))) if not np.all(np.isfinite(risk)) else len(risk)
    when = (f"tau = {float(ts[n - 1]):.3g}..{float(ts[n]):.3g}" if 0 < n < len(risk) else
            f"its {'start' if n == 0 else 'end'}, tau = {float(ts[min(n, len(risk) - 1)]):.3g}")
    stop = f"the head-symmetric flow stopped near {when}: "
    if code == UNRESOLVED:
        return xs[:n], risk[:n], UnresolvedFields(stop + "its token fields grew wider than its route's rule resolves within "
                                                  f"its stated accuracy (a standard deviation of "
                                                  f"{float(ode.expectation.rule.widest):.3g})")
    return xs[:n], risk[:n], FloatingPointError(stop + stop_reason(code, budget)) if code or n < len(risk) else None


# -- eigen-decomposition and the escape modes -----------------------------------------------


@dataclasses.dataclass(frozen=True)
class Linearization:
    """The drift linearised at a state: ``jacobian`` (n, n) over ``flatten_state`` coordinates,
    its ``eigenvalues`` (n,) sorted by decreasing real part, the matching ``eigenvectors``
    (n, n) (columns), ``asymmetry`` (n,) the fraction of each eigenvector outside the
    head-symmetric subspace, and the ``method`` used (``"autodiff"`` or ``"finite-difference"``)."""

    jacobian: np.ndarray
    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    asymmetry: np.ndarray
    method: str
    H: int
    F: int
    train_bias: bool

    def mode_M(self, i: int) -> np.ndarray:
        """The ``M`` block (H, F) of eigenvector ``i`` (real part, unit max-norm)."""
        v = np.real(self.eigenvectors[: self.H * self.F, i]).reshape(self.H, self.F)
        return v / max(np.abs(v).max(), TINY)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _unflatten_columns(V: jax.Array, H: int, F: int) -> OrderParameters:
    """:func:`~singleloc.theory._theory.unflatten_state` of every column of ``V`` (stacked; ``b`` of
    length 0 where the biases are frozen)."""
    return jax.vmap(lambda v: unflatten_state(v, H, F, jnp.zeros(0, v.dtype)))(V.T)


def _symmetric_projection(M: np.ndarray, Q: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the state, its head-symmetric projection), each flattened with the full ``Q``."""
    H = M.shape[0]
    Ms = np.broadcast_to(M.mean(0), M.shape)
    dia, off = _diagonal_means(Q, H)
    Qs = (dia - off) * np.eye(H) + off * np.ones((H, H))
    bs = np.full_like(b, b.mean()) if len(b) else b
    return np.concatenate([M.ravel(), Q.ravel(), b]), np.concatenate([Ms.ravel(), Qs.ravel(), bs])


def linearize(ode: OrderParameterODE, M: Real[ArrayLike, "H F"], Q: Real[ArrayLike, "H H"], b: Real[ArrayLike, " H"], *,
              method: str = "auto", count: str = "") -> Linearization:
    """Eigen-decomposition of the drift's Jacobian at ``(M, Q, b)`` (:class:`Linearization`).
    ``count``: where this one stands in a series (``"3 of at most 16"``), said in its phase lines."""
    M, Q, b = np.asarray(M, float), np.asarray(Q, float), np.asarray(b, float)
    H, F = M.shape
    where = f", {count}" if count else ""
    with Phase((f"linearizing the drift of {H} heads ({ode.expectation.route} route{where})", f"linearized the drift{where}"),
               quiet=True):
        J, used = drift_jacobian(ode, M, Q, b, method=method)
    w, V = np.linalg.eig(J)
    order = np.argsort(-w.real, kind="stable")
    w, V = w[order], V[:, order]
    real, imag = ([np.asarray(a) for a in _unflatten_columns(jnp.asarray(part), H, F)] for part in (np.real(V), np.imag(V)))
    asym = []
    for i in range(len(w)):
        full_r, sym_r = _symmetric_projection(*(a[i] for a in real))
        full_i, sym_i = _symmetric_projection(*(a[i] for a in imag))
        num = np.linalg.norm(full_r - sym_r) ** 2 + np.linalg.norm(full_i - sym_i) ** 2
        den = np.linalg.norm(full_r) ** 2 + np.linalg.norm(full_i) ** 2
        asym.append(np.sqrt(num / den) if den > 0 else 0.0)
    return Linearization(J, w, V, np.asarray(asym), used, H, F, bool(ode.train_bias))


def _orthogonal_fractions(Ms: np.ndarray, mean) -> np.ndarray:
    """For each ``M`` block (n, H, F) of a unit vector, the fraction of it orthogonal to the mean
    direction ``E[theta]`` in R^F (1 when ``mean`` is None or zero; 0 for a block below 1e-12)."""
    if mean is None or np.linalg.norm(mean) < 1e-12:
        return np.ones(len(Ms))
    mu = np.asarray(mean, float) / np.linalg.norm(mean)
    P = np.eye(Ms.shape[-1]) - np.outer(mu, mu)
    tot = np.linalg.norm(Ms, axis=(1, 2))
    return np.where(tot > 1e-12, np.linalg.norm(Ms @ P, axis=(1, 2)) / np.maximum(tot, TINY), 0.0)


def _escape_candidates(lin: Linearization, mean, min_asymmetry: float, min_orthogonal: float) -> np.ndarray:
    """Mask of the modes that break the head symmetry and whose ``M`` block points away from the mean direction."""
    Ms = lin.eigenvectors[: lin.H * lin.F].T.reshape(-1, lin.H, lin.F)
    return (lin.asymmetry > min_asymmetry) & (_orthogonal_fractions(Ms, mean) > min_orthogonal)


def escape_mode(lin: Linearization, *, mean: Real[ArrayLike, " F"] | None = None, min_asymmetry: float = 0.5,
                min_orthogonal: float = 0.5) -> int:
    """Index of the eigenpair that :func:`escape_rate` selects (-1 if none)."""
    sel = _escape_candidates(lin, mean, min_asymmetry, min_orthogonal)
    return int(np.flatnonzero(sel)[np.argmax(lin.eigenvalues.real[sel])]) if np.any(sel) else -1


def escape_rate(lin: Linearization, *, mean: Real[ArrayLike, " F"] | None = None, min_asymmetry: float = 0.5,
                min_orthogonal: float = 0.5) -> float:
    """The escape rate ``lambda``: the largest real part among the eigenvalues whose eigenvector breaks the head
    symmetry (asymmetry fraction above ``min_asymmetry``) and, when the prior's ``mean`` is given, whose ``M`` block
    points mostly away from the mean direction (fraction above ``min_orthogonal``): a mode along which the heads leave
    the unspecialized profile. Modes that only split the heads' norms along the mean direction are left out. NaN when no
    mode qualifies."""
    k = escape_mode(lin, mean=mean, min_asymmetry=min_asymmetry, min_orthogonal=min_orthogonal)
    return float(lin.eigenvalues[k].real) if k >= 0 else float("nan")


def escape_subspace(lin: Linearization, *, mean: Real[ArrayLike, " F"] | None = None, rtol: float = 0.02,
                    min_asymmetry: float = 0.5,
                    min_orthogonal: float = 0.5) -> np.ndarray:
    """Orthonormal basis (n, H*F) of the ``M`` blocks of the escape modes: every selected
    mode (as in :func:`escape_rate`) whose rate is within ``rtol`` of the escape rate. With a
    symmetric prior the escape is degenerate (one mode per equivalent latent direction)."""
    lam = escape_rate(lin, mean=mean, min_asymmetry=min_asymmetry, min_orthogonal=min_orthogonal)
    if not np.isfinite(lam):
        return np.zeros((0, lin.H * lin.F))
    sel = _escape_candidates(lin, mean, min_asymmetry, min_orthogonal) & (lin.eigenvalues.real >= lam - rtol * abs(lam))
    V = lin.eigenvectors[: lin.H * lin.F, sel]
    B = np.concatenate([V.real, V.imag], axis=1)
    u, sv, _ = np.linalg.svd(B, full_matrices=False)
    return u[:, sv > 1e-8 * sv.max()].T


def subspace_amplitude(basis: Real[ArrayLike, "n N"], M: Real[ArrayLike, "*S H F"]) -> np.ndarray:
    """Norm of the projection of overlaps ``M`` (..., H, F) on an :func:`escape_subspace`."""
    M = np.asarray(M, float)
    return np.linalg.norm(M.reshape(M.shape[:-2] + (-1,)) @ basis.T, axis=-1)


def unstable_modes(lin: Linearization, *, tol: float = 1e-6, min_asymmetry: float = 0.0) -> list[dict]:
    """Unstable eigenpairs (``Re lambda > tol``), decreasing: ``rate``, ``asymmetry``, the ``M`` block of the
    eigenvector (H, F) and ``direction``, the spike ``f`` its ``M`` block loads most on (largest column norm)."""
    out = []
    for i, lam in enumerate(lin.eigenvalues):
        if lam.real > tol and lin.asymmetry[i] >= min_asymmetry:
            Mi = lin.mode_M(i)
            out.append({"rate": float(lam.real), "imag": float(lam.imag), "asymmetry": float(lin.asymmetry[i]), "M": Mi,
                        "direction": int(np.argmax(np.linalg.norm(Mi, axis=0)))})
    return out


# -- escape times ---------------------------------------------------------------------------


def predicted_escape_slope(rate: float) -> float:
    """``d tau_esc / d log D = 1 / (2 lambda)``: the amplitude ``D^{-1/2} exp(lambda tau)`` of
    the escape direction reaches a fixed size when ``lambda tau = (1/2) log D + const``."""
    return 1.0 / (2.0 * rate)


def linear_escape_time(path_tau: Real[ArrayLike, " T"], path_rate: Real[ArrayLike, " T"], amplitude: Real[ArrayLike, "..."],
                       threshold: float = 0.1, *, extrapolate: bool = False) -> np.ndarray:
    """First time at which ``amplitude * exp(int_{tau_0}^tau rate)`` reaches ``threshold`` (``tau_0 = path_tau[0]``):
    the escape of the linearised dynamics along a plateau whose escape rate ``path_rate`` (at ``path_tau``, e.g. from
    :func:`escape_rate_along`) drifts (adiabatic approximation). The integral is the trapezoid rule on the path,
    interpolated linearly within the step where it crosses; the rate may change sign. ``tau_0`` if the amplitude starts
    at the threshold. Not reached within the path: NaN, or with ``extrapolate`` the rate is held at its last value
    beyond the path (``inf`` if that value is not positive)."""
    t, lam = np.asarray(path_tau, float), np.asarray(path_rate, float)
    growth = np.concatenate([[0.0], np.cumsum(0.5 * (lam[1:] + lam[:-1]) * np.diff(t))])
    need = np.log(threshold / np.asarray(amplitude, float))
    out = np.full(np.shape(need), np.nan)
    for idx, g in np.ndenumerate(need):
        if (growth >= g).any():
            out[idx] = first_crossing(t, growth, g)
        elif extrapolate:
            out[idx] = t[-1] + (g - growth[-1]) / lam[-1] if lam[-1] > 0 else np.inf
    return out


def antisymmetric_basis(H: int, F: int, train_bias: bool) -> np.ndarray:
    """Orthonormal basis (n, k) of the perturbations antisymmetric between heads 1 and 2, over :func:`flatten_state`
    coordinates: ``M_1 = -M_2 = e_f`` (F of them), ``Q_11 = -Q_22``, ``Q_1g = -Q_2g`` for each head ``g >= 3`` and ``b_1
    = -b_2`` (when the biases train); ``k = F + H - 1 (+1)`` against ``n = H F + H (H + 1) / 2 (+H)``. At a
    head-symmetric state the Jacobian commutes with the head permutations, so it maps this subspace (the -1 eigenspace
    of the swap of heads 1 and 2) into itself, and every irreducible component of the permutations but the trivial one
    meets it: the eigenvalues of the Jacobian restricted to it are those of the symmetry-breaking modes (every mode but
    the head-symmetric ones)."""
    if H < 2:
        return np.zeros((H * F + H * (H + 1) // 2 + (H if train_bias else 0), 0))
    units = []
    for f in range(F):
        M = np.zeros((H, F))
        M[0, f], M[1, f] = 1.0, -1.0
        units.append((M, np.zeros((H, H)), np.zeros(H)))
    for g in [None, *range(2, H)]:  # Q_11 - Q_22, then Q_1g - Q_2g
        Q = np.zeros((H, H))
        if g is None:
            Q[0, 0], Q[1, 1] = 1.0, -1.0
        else:
            Q[0, g] = Q[g, 0] = 1.0
            Q[1, g] = Q[g, 1] = -1.0
        units.append((np.zeros((H, F)), Q, np.zeros(H)))
    if train_bias:
        units.append((np.zeros((H, F)), np.zeros((H, H)), np.asarray([1.0, -1.0] + [0.0] * (H - 2))))
    U = np.stack([np.asarray(flatten_state(jnp.asarray(M), jnp.asarray(Q), jnp.asarray(b), train_bias)) for M, Q, b in units],
                 axis=1)
    return U / np.linalg.norm(U, axis=0)


def symmetric_jacobian(ode: OrderParameterODE, x, H: int, F: int, *, method: str = "auto", count: str = "") -> np.ndarray:
    """``U^T J U`` (k, k): the Jacobian of the drift at the symmetric state ``x`` restricted to the perturbations
    antisymmetric between heads 1 and 2 (``U``: :func:`antisymmetric_basis`), from ``J U``
    (:func:`~singleloc.analysis._drift_jacobian.drift_jacobian` along ``k`` directions instead of ``n``); ``count`` as
    :func:`linearize`'s. (0, 0) when ``H = 1``."""
    M, Q, b = (np.asarray(a) for a in symmetric_state(jnp.asarray(x), H, F))
    U = antisymmetric_basis(H, F, bool(ode.train_bias))
    if U.shape[1] == 0:
        return np.zeros((0, 0))
    where = f", {count}" if count else ""
    with Phase((f"linearizing the drift of {H} heads along its {U.shape[1]} head-1-2-antisymmetric directions "
                f"({ode.expectation.route} route{where})", f"linearized the drift{where}"), quiet=True):
        JU, _ = drift_jacobian(ode, M, Q, b, method=method, basis=U)
    return U.T @ np.asarray(JU)


def symmetric_escape_rate(ode: OrderParameterODE, x, H: int, F: int, *, mean=None, method: str = "auto",
                          count: str = "", min_orthogonal: float = 0.5, jacobian: np.ndarray | None = None) -> float:
    """Escape rate (:func:`escape_rate`) of the linearisation at the symmetric state ``x`` (``count`` as
    :func:`linearize`'s), from the Jacobian restricted to the perturbations antisymmetric between heads 1 and 2
    (:func:`symmetric_jacobian`, or ``jacobian`` where it is at hand). Its eigenvalues are the symmetry-breaking ones of
    the full Jacobian, whose eigenvectors break the symmetry entirely (asymmetry 1, above any ``min_asymmetry < 1``);
    the mean filter reads the ``M`` block ``u (e_1 - e_2)`` of the eigenvector ``U w`` as :func:`escape_rate` reads the
    full one's, ``u c`` with ``c`` orthogonal to ``1`` (the same fraction ``|P u| / |u|``). NaN when no mode qualifies
    (``H = 1``).

    Where a quadrature is not symmetric in the heads (the Sobol rule; the exact route's Gram term), the full Jacobian
    commutes with the permutations only to that quadrature's error, and the two rates differ by about as much: ``U^T J
    U`` drops the part of ``J`` that anticommutes with the swap (with two heads it is exactly the swap-averaged
    Jacobian's rate)."""
    A = symmetric_jacobian(ode, x, H, F, method=method, count=count) if jacobian is None else jacobian
    if A.size == 0:
        return float("nan")
    w, W = np.linalg.eig(A)
    V = antisymmetric_basis(H, F, bool(ode.train_bias)) @ W
    Ms = V[: H * F].T.reshape(-1, H, F)
    sel = _orthogonal_fractions(Ms, mean) > min_orthogonal
    return float(w.real[sel].max()) if sel.any() else float("nan")


def start_variances(H: int, F: int, init_scale: float, D: int, train_bias: bool) -> np.ndarray:
    """The variances of a random start's coordinates along the columns of :func:`antisymmetric_basis`: keys
    ``k_h ~ N(0, init_scale^2 I_D)`` give ``M_hf ~ N(0, s^2 / D)`` (``s = init_scale``; the ``M`` columns),
    ``(Q_11 - Q_22) / sqrt 2`` of variance ``2 s^4 / D`` and ``(Q_1g - Q_2g) / sqrt 2`` of variance ``s^4 / D``
    (independent entries of ``K K^T / D``); the biases start equal (0)."""
    return np.asarray([init_scale**2 / D] * F + [2 * init_scale**4 / D] + [init_scale**4 / D] * (H - 2)
                      + [0.0] * train_bias)


def tangent_escape(path_tau, jacobians, variances, H: int, F: int, *, mean=None, threshold: float = 1.0
                   ) -> tuple[float, np.ndarray]:
    """``(tau_esc, amplitude)``: the escape of the symmetry-breaking part of a random start under the flow
    linearised along the head-symmetric path (the tangent-linear model). On ``[tau_i, tau_i+1]`` the perturbation
    ``delta`` (coordinates of :func:`antisymmetric_basis`) follows ``d delta / d tau = A delta`` with ``A`` the mean of
    the two ends' :func:`symmetric_jacobian` (``Phi`` the product of their exponentials), from the covariance
    ``diag(variances)`` (:func:`start_variances`). ``amplitude`` at ``path_tau``: the root mean square of
    ``|(M - mean_h M) P|_F``, ``P`` the projection of R^F orthogonal to the prior's ``mean`` (the identity without
    one): ``H - 1`` independent copies of the antisymmetric pair (the head permutations act on ``M - mean_h M`` as
    ``H - 1`` copies of their standard representation, which the Jacobian cannot mix with the others), so
    ``amplitude^2 = (H - 1) sum_f (P Phi_M C Phi_M^T P)_ff`` (``Phi_M``: the ``M`` rows of ``Phi``). ``tau_esc``: the
    first time it reaches ``threshold`` (log-linear within a step); beyond the path, growth at the largest real part
    of the last Jacobian's eigenvalues (``inf`` if it is not positive). Unlike
    ``exp(int lambda)`` from a plateau time, it counts the growth and the decay on the way to the plateau and the
    turning of the growing direction (docs/phases.md, "When the heads leave the plateau")."""
    t, A = np.asarray(path_tau, float), np.asarray(jacobians, float)
    P = np.eye(F)
    if mean is not None and np.linalg.norm(mean) > 1e-12:
        mu = np.asarray(mean, float) / np.linalg.norm(mean)
        P = P - np.outer(mu, mu)
    Phi, sd = np.eye(A.shape[1]), np.sqrt(np.asarray(variances, float))
    amplitude = []
    for i in range(len(t)):
        if i:
            Phi = scipy.linalg.expm(0.5 * (A[i] + A[i - 1]) * (t[i] - t[i - 1])) @ Phi
        amplitude.append(np.sqrt((H - 1) * np.sum((P @ Phi[:F] * sd) ** 2)))
    amplitude = np.asarray(amplitude)
    log_a, log_t = np.log(np.maximum(amplitude, TINY)), np.log(threshold)
    if (amplitude >= threshold).any():
        return float(first_crossing(t, log_a, log_t)), amplitude
    top = np.linalg.eigvals(A[-1]).real.max() if len(t) else -np.inf
    return (float(t[-1] + (log_t - log_a[-1]) / top) if top > 0 and amplitude[-1] > 0 else np.inf), amplitude


def escape_rate_along(ode: OrderParameterODE, tau: Real[ArrayLike, " T"], xs: Real[ArrayLike, "T N"], H: int, F: int, *,
                      mean: Real[ArrayLike, " F"] | None = None, method: str = "auto") -> np.ndarray:
    """Escape rate (:func:`escape_rate`) of the linearisation at each symmetric state ``xs`` (from :func:`symmetric_flow`;
    ``tau`` their times, unused): the instantaneous growth rate of the symmetry-breaking direction along a plateau."""
    return np.asarray([symmetric_escape_rate(ode, x, H, F, mean=mean, method=method, count=f"{k + 1} of {len(xs)}")
                       for k, x in enumerate(xs)])

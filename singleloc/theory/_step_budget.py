"""The step budget of a solve: every solve stops, whatever its learning rate; and why a solve stopped.

A learning rate far past stability makes the order-parameter ODE stiff while its state stays valid: at
``sgd.lr = 1e4`` on the default problem the adaptive steps are ``1e-7`` to ``2e-7`` in ``tau`` (a solve to
``tau = 300`` takes about ``1e9`` steps, hours), and diffrax's ``max_steps`` bounds nothing a user can wait for.

:class:`StepBudget` wraps the step-size controller and counts the steps. With ``n`` steps taken and the solve at
``t`` of its span ``[t_0, t_1]``, it stops the solve (diffrax's ``max_steps_reached``) once

    ``n >= min(WARMUP, B)``  and  ``n (t_1 - t_0) > B (t - t_0)``,

that is when, at its pace so far, the solve would take more than ``B`` steps; at ``n = B`` the second condition
holds unless the solve is done, so ``B`` also caps the steps. ``B`` (the ``budget``, a value the compiled program
receives, so every learning rate shares one program) is :data:`STEP_MARGIN` times the steps a solve at its rate is
expected to take (:func:`~singleloc.runtime._numerics.expected_steps`), at most ``max_steps``. A solve that
follows its expected pace within the margin never meets it; a solve at ``lr = 1e4`` stops after :data:`WARMUP`
steps, having covered a millionth of its span.
"""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax.numpy as jnp

from ..runtime._numerics import Q_RUNAWAY, expected_steps

#: Steps after which the pace is judged (before them a stiff start, whose first steps the controller grows
#: from ``dt0``, is not a pace).
WARMUP = 256

#: The budget's margin over the expected steps.
STEP_MARGIN = 8.0


def step_budget(rule, ts, max_steps: int) -> int:
    """The budget ``B`` of a solve of the SGD ``rule`` over the saved times ``ts`` (module docstring): :data:`STEP_MARGIN`
    times the steps expected at its rate at the start, with its head weighting, at most ``max_steps``."""
    expected = expected_steps(float(rule.rate(float(ts[0]))), float(ts[-1] - ts[0]), not rule.weighting.head_average)
    return int(min(max_steps, STEP_MARGIN * expected))


#: Smallest step the adaptive solver may take, in ``tau``: below it the solve stops as diverged (diffrax's
#: ``dtmin``, not forced). At ``lr = 1e3``, which the solve follows (724 steps), none was below 5e-6; at the
#: learning rates that train none below 1e-4.
MIN_STEP = 1e-7

#: Why a solve stopped, by the index the solve's program returns (:func:`stop_code`; diffrax's results, any other
#: its own index ``len(STOPS)``): it reached its last saved time, the terminating event fired, its steps fell below
#: ``MIN_STEP``, or it ran out of steps.
STOPS = (diffrax.RESULTS.successful, diffrax.RESULTS.event_occurred, diffrax.RESULTS.dt_min_reached,
         diffrax.RESULTS.max_steps_reached)
#: The code of a solve stopped by its second event: its route's rule no longer resolves the fields of its state
#: (:meth:`~singleloc.expectations._expectation.AbstractExpectation.resolves`).
UNRESOLVED = len(STOPS) + 1


class UnresolvedFields(FloatingPointError):
    """A solve stopped where its route's rule no longer resolves the token fields (:data:`UNRESOLVED`):
    :func:`~singleloc.integrate` then solves again on the Sobol rule when the route was ``"auto"``'s choice, and
    raises this when ``theory.route = "exact"`` was asked for."""

    @classmethod
    def at(cls, when: str, start: int, widest: float, nodes: int) -> UnresolvedFields:
        """The error of a solve stopped near ``when`` (start ``start``) by fields wider than ``widest``, the width
        its rule of ``theory.nodes = nodes`` resolves."""
        return cls(f"the exact route stopped near {when} (start {start}): the token fields grew wider than its rule resolves "
                   f"within its stated accuracy (a standard deviation alpha sqrt((Q + M Sigma M^T)_hh) of {widest:.3g} at "
                   f"theory.nodes = {nodes}, in proportion to it); set theory.route = 'rule' (or 'auto', which continues there "
                   "by itself) or raise theory.nodes")


def stop_code(sol) -> jnp.ndarray:
    """The index of why the diffrax solution ``sol`` stopped (:data:`STOPS`, :data:`UNRESOLVED`), its events
    ``(invalid state, unresolved fields)``."""
    code = jnp.select([sol.result == stop for stop in STOPS], list(range(len(STOPS))), len(STOPS))
    return jnp.where((sol.result == diffrax.RESULTS.event_occurred) & sol.event_mask[1], UNRESOLVED, code)


def stop_reason(code: int, budget: int) -> str:
    """Why a solve that returned ``code`` (:func:`stop_code`) stopped before its last saved time, ``budget`` its steps."""
    return {0: "the risk along it was not finite",
            1: (f"the state left the set of valid overlaps (non-finite values, runaway keys with max |Q| > {Q_RUNAWAY:g}, "
                "or R_orth = Q - M M^T not PSD)"),
            2: f"its steps fell below {MIN_STEP:g} in tau (the ODE became too stiff to follow: a diverging solve)",
            3: (f"at its pace it would have taken more than {budget} steps, {STEP_MARGIN:g} times what a solve at this rate "
                "is expected to take (or max_steps): the ODE became stiff (a learning rate past stability)")
            }.get(code, "the solver failed")


class StepBudget(diffrax.AbstractAdaptiveStepSizeController):
    """``controller`` (diffrax's PID controller) that stops the solve when it would take more than ``budget``
    steps at its pace so far (module docstring)."""

    controller: diffrax.PIDController
    budget: jnp.ndarray  # the largest number of steps, a value of the compiled program

    @property
    def rtol(self):
        return self.controller.rtol

    @property
    def atol(self):
        return self.controller.atol

    @property
    def norm(self):
        return self.controller.norm

    def wrap(self, direction):
        return eqx.tree_at(lambda c: c.controller, self, self.controller.wrap(direction))

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        t, inner = self.controller.init(terms, t0, t1, y0, dt0, args, func, error_order)
        return t, (inner, jnp.zeros((), jnp.int32), jnp.asarray(t0), jnp.asarray(t1) - t0)

    def adapt_step_size(self, t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state):
        inner, steps, start, span = controller_state
        keep, t, t_next, jump, inner, result = self.controller.adapt_step_size(
            t0, t1, y0, y1_candidate, args, y_error, error_order, inner)
        steps = steps + 1
        budget = self.budget.astype(span.dtype)
        slow = (steps >= jnp.minimum(WARMUP, budget)) & (steps * span > budget * (t - start))
        result = diffrax.RESULTS.where(slow, diffrax.RESULTS.max_steps_reached, result)
        return keep, t, t_next, jump, (inner, steps, start, span), result

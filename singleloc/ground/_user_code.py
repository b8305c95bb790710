"""User code where it enters: the activations and priors that a config names by reference
(``"package.module:function"``, :mod:`~singleloc.ground._extensions`) or that are registered
(:func:`~singleloc.register_activation`), checked with values before any computation uses them.

Exceptions. A referenced function is called through :func:`guarded`: whatever it raises (here, while JAX
traces it, on a Dask worker) becomes a :class:`UserCodeError` naming it (its ``__cause__`` the original).

Activations (:func:`check_activation`). The theory assumes a map ``scores (H, L) -> weights (H, L)`` that is
equivariant under permutations of the tokens (it fixes the relevant token at position 0), finite, and
differentiable by JAX (its drift is the gradient of the loss). A probe checks exactly that on random scores of
shape :data:`PROBE_SHAPE` at the scales :data:`PROBE_SCALES`, under ``jax.jit`` (a function JAX cannot trace fails
here, not in the middle of a run): the weights' shape and, for float32 scores, their dtype (the simulation runs in
float32); finite weights and a finite gradient; ``act(s P) = act(s) P`` for a permutation ``P`` of the tokens, to
the rounding of the probe's precision (:data:`EQUIVARIANCE_ULPS`); and, where the function declares its
normalised-exponential form (``exponential_form``, which puts it on the exact route), that the form is valid and
that the function is that form. One line names the function and what failed.

Priors (:func:`~singleloc.model._priors.check_prior`). A factory ``problem -> Prior`` returns a :class:`~singleloc.Prior`,
which validates itself (finite atoms, probabilities, a PSD covariance); the probe adds that its
mean and covariance are finite in float64 (atoms of 1e200 are finite, their squares are not).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

#: Scores of the activation probe: ``(H, L)`` with distinct, odd sizes (a function that mixes up the
#: axes fails), and the scales of the random scores (about the scores of a run, and ten times them).
PROBE_SHAPE = (3, 5)
PROBE_SCALES = (1.0, 10.0)
#: A token permutation of the probe (no token stays in place).
PROBE_PERMUTATION = (2, 4, 0, 1, 3)
#: Tolerance of the equivariance and exponential-form checks, in units of the probe dtype's epsilon
#: times the largest weight: far above the rounding of a permuted sum, far below a position's effect
#: (softmax weighted by the position index is off by tens of percent).
EQUIVARIANCE_ULPS = 1000


class UserCodeError(ValueError):
    """A user's function raised, or gave values the package cannot use: one line naming the
    function and what failed (a ``ValueError``: the command line prints it, exit code 2)."""


def _first_line(err: BaseException) -> str:
    """``"TypeError: its message"``, the message's first sentence when it is long (JAX's run on)."""
    text = " ".join(str(err).split())
    if len(text) > 160 and ". " in text[:300]:
        text = text[:text.index(". ") + 1]
    return f"{type(err).__name__}: {text[:300]}" if text else type(err).__name__


def guarded(fn: Callable, reference: str, key: str) -> Callable:
    """``fn`` (a user's function, named ``reference`` by the config key ``key``) such that an exception it raises
    is a :class:`UserCodeError` naming it; attributes (``exponential_form``) are kept."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserCodeError:
            raise
        except Exception as err:
            raise UserCodeError(f"{key}: {reference!r} raised {_first_line(err)}") from err

    return call


def check_activation(fn: Callable, name: str, key: str = "model.activation") -> None:
    """The probe of an activation (module docstring); :class:`UserCodeError` naming ``name`` (the
    reference or registered name, for the config entry ``key``) and what failed."""
    import jax
    import jax.numpy as jnp

    what = f"{key}: {name!r}"
    fn = guarded(fn, name, key)
    H, L = PROBE_SHAPE
    f32 = jax.eval_shape(fn, jax.ShapeDtypeStruct((H, L), jnp.float32))
    if getattr(f32, "shape", None) != (H, L):
        raise UserCodeError(f"{what} must map scores (H, L) to weights of the same shape; scores {(H, L)} gave "
                            f"{getattr(f32, 'shape', type(f32).__name__)}")
    if f32.dtype != jnp.float32:
        raise UserCodeError(f"{what} must return weights of the scores' dtype (the simulation runs in float32); "
                            f"float32 scores gave {f32.dtype} weights")
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    rng = np.random.default_rng(0)
    scores = jnp.asarray(np.stack([s * rng.standard_normal((H, L)) for s in PROBE_SCALES]), dtype)
    cotangent = jnp.asarray(rng.standard_normal((H, L)), dtype)
    perm = np.asarray(PROBE_PERMUTATION)

    def probe(s):
        weights, vjp = jax.vjp(fn, s)
        return weights, fn(s[:, perm]), vjp(cotangent)[0]

    weights, permuted, gradient = (np.asarray(x) for x in jax.jit(jax.vmap(probe))(scores))
    for i, scale in enumerate(PROBE_SCALES):
        at = f"on random scores of shape {(H, L)} and scale {scale:g}"
        if not np.all(np.isfinite(weights[i])):
            raise UserCodeError(f"{what} returns non-finite weights {at} ({_bad(weights[i])}); it must be finite for "
                                "finite scores")
        if not np.all(np.isfinite(gradient[i])):
            raise UserCodeError(f"{what} has a non-finite gradient {at} ({_bad(gradient[i])}); the theory's drift "
                                "differentiates it")
        tol = EQUIVARIANCE_ULPS * float(jnp.finfo(dtype).eps) * max(1.0, float(np.max(np.abs(weights[i]))))
        gap = float(np.max(np.abs(permuted[i] - weights[i][:, perm])))
        if gap > tol:
            raise UserCodeError(f"{what} is not equivariant under a permutation of the tokens: act(s P) and act(s) P "
                                f"differ by {gap:.3g} {at}; the theory assumes it is (it fixes the relevant token at "
                                "position 0), so its numbers would be wrong for this function")
    _check_form(fn, what, np.asarray(scores), weights, dtype)


def _bad(x: np.ndarray) -> str:
    return f"{int(np.sum(~np.isfinite(x)))} of {x.size} entries, e.g. {x[~np.isfinite(x)][0]}"


def _check_form(fn: Callable, what: str, scores: np.ndarray, weights: np.ndarray, dtype) -> None:
    """A declared ``exponential_form`` is valid and is the function (module docstring)."""
    import jax.numpy as jnp

    declared = getattr(fn, "exponential_form", None)
    if declared is None:
        return
    H, L = PROBE_SHAPE
    try:
        scale, offset, joint = declared(L)
    except Exception as err:
        raise UserCodeError(f"{what}: its exponential_form(L) must return (scale, offset, joint); at L = {L} it "
                            f"raised {_first_line(err)}") from err
    if not (isinstance(scale, (int, float, np.number)) and math.isfinite(scale) and scale > 0):
        raise UserCodeError(f"{what}: its exponential_form at L = {L} has scale {scale!r}; it must be a finite number > 0")
    if not (isinstance(offset, (int, float, np.number)) and math.isfinite(offset) and offset >= 0):
        raise UserCodeError(f"{what}: its exponential_form at L = {L} has offset {offset!r}; it must be a finite number >= 0")
    if not isinstance(joint, (bool, np.bool_)):
        raise UserCodeError(f"{what}: its exponential_form at L = {L} has joint = {joint!r}; it must be True or False")
    x = float(scale) * scores.astype(np.float64)
    if joint:  # the head average u_l / (offset + sum u), u_l = sum_h exp(x_hl)
        m = np.max(x, axis=(-2, -1), keepdims=True)
        u = np.sum(np.exp(x - m), axis=-2)
        expected = u / (offset * np.exp(-m[..., 0]) + np.sum(u, axis=-1, keepdims=True))
        actual = np.mean(weights, axis=-2)
    else:
        m = np.max(x, axis=-1, keepdims=True)
        e = np.exp(x - m)
        expected = e / (offset * np.exp(-m) + np.sum(e, axis=-1, keepdims=True))
        actual = weights
    tol = EQUIVARIANCE_ULPS * float(jnp.finfo(dtype).eps) * max(1.0, float(np.max(np.abs(weights))))
    gap = float(np.max(np.abs(actual - expected)))
    if gap > tol:
        form_text = "(1/H) sum_h A_hl = u_l / (offset + sum_l' u_l'), u_l = sum_h exp(scale s_hl)" if joint else \
            "A_hl = exp(scale s_hl) / (offset + sum_l' exp(scale s_hl'))"
        raise UserCodeError(f"{what} is not the normalised exponential it declares (exponential_form at L = {L}: scale "
                            f"{scale:g}, offset {offset:g}, joint {joint}, i.e. {form_text}): they differ by {gap:.3g} on "
                            "random scores; the exact route would compute the declared form, not the function")

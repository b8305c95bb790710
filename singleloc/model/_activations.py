"""Attention activations: maps from scores ``s`` of shape ``(H, L)`` to head weights ``A``.

Conventions (docs/model.md section 2). Scores ``s_hl = <k_h, x_l>/sqrt(D) + b_h``; the layer
aggregates the heads uniformly, ``a_l = (1/H) sum_h A_hl``.

* ``softmax``:  ``A_hl = exp(s_hl) / sum_l' exp(s_hl')``;
* ``softmax1``: ``A_hl = exp(s_hl) / (1 + sum_l' exp(s_hl'))``, a head may switch off;
* ``bsoftmax``: ``A_hl = H exp(s_hl) / sum_{h',l'} exp(s_h'l')``, one distribution over
  all heads and tokens, so that ``a`` is a probability vector;
* ``ssmax`` (scalable softmax, docs/model.md section 8): ``A_hl = softmax_l(log(L) s_hl)``, the
  length-aware normaliser; :func:`scalable_softmax` makes it with other scales.

Every activation is written in max-subtracted form: finite for scores up to any finite
magnitude, and a score of ``-inf`` gives a weight of exactly zero.

An activation is any JAX function ``scores (H, L) -> weights (H, L)`` that is equivariant under permutations of the
tokens (the theory engine fixes the relevant token at position 0 and relies on this). Register your own with
:func:`register_activation`, or name it in a config as ``model.activation = "package.module:function"`` (imported
where the config is used, Dask workers included: :mod:`~singleloc.ground._extensions`); the simulator, the
population risk and the ODE (whose drift is obtained by autodiff) then handle it with no further code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..ground._extensions import import_reference, is_reference

Activation = Callable[[jax.Array], jax.Array]


class ExponentialForm(NamedTuple):
    """How a normalised-exponential activation is built from ``x_hl = scale * s_hl``.

    ``joint = False``: ``A_hl = exp(x_hl) / (offset + sum_l' exp(x_hl'))`` per head; ``joint = True``:
    ``(1/H) sum_h A_hl = u_l / (offset + sum_l' u_l')``, ``u_l = sum_h exp(x_hl)``. An activation declares it as
    the attribute ``exponential_form``, a function of the sequence length ``L`` returning this tuple; the theory
    then uses the exact route (:mod:`~singleloc.expectations._laplace`) for it.
    """

    scale: float
    offset: float
    joint: bool


def exponential_form(activation: Activation | str, L: int) -> ExponentialForm | None:
    """The normalised-exponential form an activation (a function, or a name for :func:`get_activation`)
    declares at length ``L``, or ``None``."""
    if isinstance(activation, str):  # a name would have no attribute: None, "no exact route", silently
        activation = get_activation(activation)
    form = getattr(activation, "exponential_form", None)
    return None if form is None else ExponentialForm(*form(int(L)))

_REGISTRY: dict[str, Activation] = {}
#: References ("package.module:function") whose probe (:func:`~singleloc.ground._user_code.check_activation`)
#: has passed in this process.
_CHECKED: set[str] = set()


def softmax(scores: jax.Array) -> jax.Array:
    """Per-head softmax over tokens: each row of the result sums to one."""
    return jax.nn.softmax(scores, axis=-1)


def softmax1(scores: jax.Array) -> jax.Array:
    """Softmax with an extra zero logit ("softmax-1"): rows sum to less than one.

    ``exp(s_hl) / (1 + sum_l' exp(s_hl'))``, evaluated with the shift
    ``m_h = max(0, max_l s_hl)`` so that neither the numerator nor the denominator overflows.
    """
    m = jax.lax.stop_gradient(jnp.maximum(jnp.max(scores, axis=-1, keepdims=True), 0.0))
    e = jnp.exp(scores - m)
    return e / (jnp.exp(-m) + jnp.sum(e, axis=-1, keepdims=True))


def bsoftmax(scores: jax.Array) -> jax.Array:
    """Bayes-softmax: one softmax over all heads and tokens, scaled by ``H``.

    The head-average ``a_l = (1/H) sum_h A_hl`` is then a probability vector over tokens.
    """
    h = scores.shape[-2]
    flat = jax.nn.softmax(scores.reshape(*scores.shape[:-2], -1), axis=-1)
    return h * flat.reshape(scores.shape)


def register_activation(name: str, fn: Activation, *, overwrite: bool = False) -> None:
    """Make ``fn`` available under ``name`` (in configs: ``model.activation = name``).

    ``fn`` maps scores of shape ``(H, L)`` to weights of the same shape and must be equivariant under token
    permutations; it is probed here with random scores (:func:`~singleloc.ground._user_code.check_activation`:
    shape, finite weights and gradient, equivariance, a declared ``exponential_form``), and a ``ValueError`` names
    what failed. Re-registering an existing name needs ``overwrite=True``.
    """
    if not name:
        raise ValueError("register_activation: name must be a non-empty string")
    if name in _REGISTRY and not overwrite and _REGISTRY[name] is not fn:
        raise ValueError(f"activation {name!r} is already registered (pass overwrite=True to replace it)")
    if _REGISTRY.get(name) is not fn:
        from ..ground._user_code import check_activation

        check_activation(fn, name, key="activation")
    _REGISTRY[name] = fn


def get_activation(name: str) -> Activation:
    """The activation registered under ``name``, or the function a reference ``"package.module:function"`` names
    (imported on first use, :mod:`~singleloc.ground._extensions`, and probed once per process,
    :func:`~singleloc.ground._user_code.check_activation`). A clear error lists the known names."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if is_reference(name):
        fn = import_reference(name, "model.activation")
        if name not in _CHECKED:  # once per process: every config that names it asks again
            from ..ground._user_code import check_activation

            check_activation(fn, name)
            _CHECKED.add(name)
        return fn
    known = ", ".join(sorted(_REGISTRY))
    raise ValueError(f"model.activation: unknown activation {name!r} (known: {known}, or a reference "
                     "'package.module:function')")


def activation_names() -> tuple[str, ...]:
    """Names of all registered activations."""
    return tuple(sorted(_REGISTRY))


#: Largest scale of :func:`scalable_softmax`: ``s log(2) 0.03 >= 20`` above it, so the weights are the
#: argmax's (the runner-up below ``2e-9`` of the winner) for every score gap above 0.03 at any ``L``.
SSMAX_SCALE_MAX = 1e3


def scalable_softmax(s: float = 1.0) -> Activation:
    """Scalable softmax (SSMax) with a fixed scale ``s``: ``A_hl = softmax_l(s log(L) s_hl)``.

    A length-aware normaliser (docs/model.md section 8): multiplying the scores by ``s log L`` lets a score margin
    of order one keep a weight of order one as ``L`` grows, where plain softmax's weights are squeezed into
    ``[exp(-2a)/L, exp(2a)/L]``. ``L`` is the number of tokens, ``scores.shape[-1]``. It equals softmax at
    ``L = exp(1/s)`` (``L = e`` for the default ``s = 1``, the registered ``"ssmax"``); to match softmax at a
    reference length ``L0`` use ``s = 1/log(L0)`` and register the result under a name of your own. For ``L = 1``
    the single weight is 1. Stable for any finite scores; ``-inf`` gives weight 0.
    """
    if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, float, np.integer, np.floating)) or not (
            math.isfinite(s) and 0 < s <= SSMAX_SCALE_MAX):
        raise ValueError(f"scalable_softmax: s must be a number in (0, {SSMAX_SCALE_MAX:g}], got {s!r} (above it the weights "
                         "are the argmax's for every score gap above 0.03 at any L, and the exact route's rule, "
                         "theory.nodes x s log L nodes, outgrows memory); e.g. s = 1, or 1 / log(L0) to match softmax at L0")
    scale = float(s)

    def ssmax(scores: jax.Array) -> jax.Array:
        n = scores.shape[-1]
        return jnp.ones_like(scores) if n == 1 else jax.nn.softmax((scale * math.log(n)) * scores, axis=-1)

    ssmax.__doc__ = f"Scalable softmax ``softmax_l({scale:g} log(L) s_hl)`` (see :func:`scalable_softmax`)."
    ssmax.exponential_form = lambda L: ExponentialForm(scale * math.log(L) if L > 1 else 1.0, 0.0, False)
    return ssmax


#: The registered ``"ssmax"``: :func:`scalable_softmax` with ``s = 1``.
ssmax = scalable_softmax(1.0)


softmax.exponential_form = lambda L: ExponentialForm(1.0, 0.0, False)
softmax1.exponential_form = lambda L: ExponentialForm(1.0, 1.0, False)
bsoftmax.exponential_form = lambda L: ExponentialForm(1.0, 0.0, True)

_REGISTRY.update(softmax=softmax, softmax1=softmax1, bsoftmax=bsoftmax, ssmax=ssmax)  # the package's own: not probed

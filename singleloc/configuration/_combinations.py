"""Combinations of keys that a run would silently drop, refused when a :class:`~singleloc.Config` is
built (issue 54 item 7): a wrong result is worse than a refusal, and a key the run ignores makes a
result that is not the one asked for (``theory.gram = "exact"`` with ``theory.route = "rule"`` ran
with the Sobol rule's Gram term and recorded it).

* ``theory.gram`` other than ``"auto"`` or a number of ``theory.gram_points`` with
  ``sgd.gradient_flow``, which has no ``lr^2`` (Gram) term;
* ``sgd.bias_decay`` without ``model.train_bias`` (a penalty on biases that do not learn);
* ``problem.support`` or ``problem.probs`` with a prior other than ``"discrete"``, ``problem.mean``
  or ``problem.cov`` with a prior other than ``"gaussian"`` (a user's factory, ``"package.module:function"``,
  may read any key).

Keys whose defaults are numbers (``problem.p``, ``theory.nodes``, ``sgd.schedule_tau``) cannot be told
given from defaulted, and are not checked. A Gram key that the chosen route has no use for is refused
when the route is chosen (:func:`~singleloc.theory._build.build`): the configuration does not choose routes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._config import Config

#: The prior tables and the named prior that reads them.
PRIOR_TABLES = {"support": "discrete", "probs": "discrete", "mean": "gaussian", "cov": "gaussian"}


def check_combinations(config: Config) -> None:
    """``ValueError`` naming the keys of a combination ``config`` would silently drop (module docstring),
    with a change that makes it consistent."""
    th, sgd, pb = config.theory, config.sgd, config.problem
    gram_points = th.gram_points != "auto"
    if sgd.gradient_flow and (th.gram != "auto" or gram_points):
        key = f"theory.gram = {th.gram!r}" if th.gram != "auto" else f"theory.gram_points = {th.gram_points}"
        raise ValueError(f"{key} has no effect with sgd.gradient_flow = true, which has no lr^2 (Gram) term; "
                         f"e.g. {'theory.gram' if th.gram != 'auto' else 'theory.gram_points'} = 'auto'")
    if sgd.bias_decay and not config.model.train_bias:
        raise ValueError(f"sgd.bias_decay = {sgd.bias_decay:g} penalises biases that do not learn (model.train_bias = false); "
                         "e.g. model.train_bias = true, or sgd.bias_decay = 0")
    if isinstance(pb.prior, str) and ":" not in pb.prior:
        for key, prior in PRIOR_TABLES.items():
            if getattr(pb, key) is not None and pb.prior != prior:
                raise ValueError(f"problem.{key} applies to problem.prior = '{prior}' only, and problem.prior = "
                                 f"{pb.prior!r}; e.g. problem.prior = '{prior}', or leave problem.{key} out")

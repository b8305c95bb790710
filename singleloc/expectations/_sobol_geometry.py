"""The geometry of a Sobol rule over the local fields: its dimensions and how many nodes it evaluates at once.

The rule of :class:`~singleloc.LocalFields` integrates over :func:`quadrature_dimension` Gaussian coordinates and
sums its nodes in batches of :func:`node_batch`. Here, beside nothing numerical, so that the rule, the checks before
a run (:mod:`~singleloc.preflight._resources`) and the memory estimates read one definition.
"""

from __future__ import annotations

from ..model._priors import Prior

#: The largest Sobol dimension: the rows of Joe and Kuo's direction numbers (SciPy's table, as ``qmc.Sobol``'s limit);
#: the rule route's limit (the exact route's ``lr^2`` rule goes on with pseudo-random coordinates).
SOBOL_MAX_DIM = 21201

#: Most nodes the quadrature evaluates at once, and most numbers (nodes x fields) in one batch.
NODE_BATCH = 8192
BATCH_NUMBERS = 2**22


def node_batch(L: int, heads: int) -> int:
    """Nodes the quadrature evaluates at once (:meth:`~singleloc.LocalFields.make`'s default ``batch_size``):
    ``NODE_BATCH``, fewer over more than 512 fields (``L * heads``), so that a batch's integrand holds about
    ``BATCH_NUMBERS`` numbers per field kind at any ``L``; the batches are summed in turn (the result is the same)."""
    return max(16, min(NODE_BATCH, BATCH_NUMBERS // max(L * heads, 1)))


def factor_rows(heads: int, principal: bool = False) -> int:
    """Rows of the factor ``S`` of a local-field rule's fields ``g_l = w_l S``, the normals per token:
    ``heads``, or ``2 heads`` on the rank-aware layout (``principal``:
    :func:`~singleloc.runtime._numerics.rank_aware_factor_and_pinv`)."""
    return 2 * heads if principal else heads


def quadrature_dimension(L: int, heads: int, prior: Prior, principal: bool = False) -> int:
    """Gaussian dimensions of the local-field rule: ``L`` times its :func:`factor_rows` (+ ``F`` for a
    Gaussian part) (:meth:`~singleloc.LocalFields.make`)."""
    return L * factor_rows(heads, principal) + (0 if prior.is_discrete else prior.F)

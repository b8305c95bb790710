"""Every local device: a batch, or one solve's quadrature nodes, split over ``jax.devices()``.

The theory's solves and the simulator are batches of independent trajectories along a leading axis (initial conditions,
seeds, sweep points). With more than one local device (GPUs, or CPU devices from
``XLA_FLAGS=--xla_force_host_platform_device_count=N``), :func:`shard_batch` places the arguments on a one-dimensional
:class:`~jax.sharding.Mesh` of all of them (axis ``"devices"``) with :class:`~jax.sharding.NamedSharding`, and the
jitted programs run each device's share there (XLA's SPMD partitioner follows the arguments' shardings). What is split:

* **The batch**, when it has at least as many members as there are devices (or when there is
  no quadrature rule to split, the simulator): its leading axis is split (padded with copies of its last member,
  which :func:`unpad` drops), every other argument is on every device. Each trajectory is computed as on one
  device (to float rounding).
* **The quadrature nodes**, when the batch is smaller than the device count: one large solve
  (typically one start with many points, where the drift's expectation over the local fields
  is the work). Every expectation route among the arguments splits its own nodes
  (:meth:`~singleloc.expectations._expectation.AbstractExpectation.shard`: each
  :class:`~singleloc.LocalFields` in one block of base points per device, :meth:`~singleloc.LocalFields.split`);
  everything else, the batch included, is on every device. The sum over the blocks becomes an all-reduce of
  the few moments (``O(H^2 + H F)`` numbers per drift evaluation) inserted by the partitioner.

No two-dimensional mesh (batch x nodes): the batches met here are either large (each trajectory on one device needs no
communication and keeps its own adaptive steps) or a single large solve. On one device nothing is moved, split or
padded: the programs and their numbers are those of an unsharded run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ._expectation import AbstractExpectation

_AXIS = "devices"


def _put(x, mesh: Mesh, axis: int | None = None):
    """``x`` split over the mesh along ``axis`` (negative: counted from the end), or on every
    device for ``axis=None``."""
    x = jnp.asarray(x)
    spec = [None] * x.ndim
    if axis is not None:
        spec[axis] = _AXIS
    return jax.device_put(x, NamedSharding(mesh, PartitionSpec(*spec)))


def shard_batch(batched, shared=()):
    """``(batched, shared, n)`` placed on the local devices (module docstring): the batch (the leaves of
    ``batched``, a leading axis of length ``n``) split, or the routes' nodes; unchanged on one device."""
    leaves = jax.tree.leaves(batched)
    n = int(leaves[0].shape[0])
    devices = jax.local_devices()
    if len(devices) == 1:
        return batched, shared, n
    mesh = Mesh(np.array(devices), (_AXIS,))
    is_route = lambda x: isinstance(x, AbstractExpectation)
    routes = [x for x in jax.tree.leaves((batched, shared), is_leaf=is_route) if is_route(x)] if n < len(devices) else []
    split = {id(x): x.shard(mesh, _put) for x in routes}  # each route splits its own nodes (None: it has none)
    if any(x is not None for x in split.values()):
        place = lambda x: (split[id(x)] or jax.tree.map(lambda y: _put(y, mesh), x)) if is_route(x) else _put(x, mesh)
        return jax.tree.map(place, batched, is_leaf=is_route), jax.tree.map(place, shared, is_leaf=is_route), n
    pad = -n % len(devices)

    def split(x):
        x = jnp.asarray(x)
        if pad:
            x = jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)])
        return _put(x, mesh, 0)

    return jax.tree.map(split, batched), jax.tree.map(lambda x: _put(x, mesh), shared), n


def unpad(tree, n: int):
    """The first ``n`` entries of every leaf's leading axis (the padding of :func:`shard_batch` dropped)."""
    return jax.tree.map(lambda x: x[:n], tree)

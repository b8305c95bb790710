"""Every local device: a batch axis split over ``jax.devices()``.

The theory's solves and the simulator are batches of independent trajectories along a leading
axis (initial conditions, seeds, sweep points). With more than one local device (GPUs, or CPU
devices from ``XLA_FLAGS=--xla_force_host_platform_device_count=N``), :func:`shard_batch` places
that axis on a one-dimensional :class:`~jax.sharding.Mesh` of all of them
(:class:`~jax.sharding.NamedSharding`, axis name ``"batch"``) and the arguments without a batch
axis on every device; the jitted programs then run each device's share of the batch there
(XLA's SPMD partitioner follows the arguments' shardings). A batch that does not divide the
number of devices is padded with copies of its last element, which :func:`unpad` drops from
the results. Each trajectory is computed as on one device (to float rounding: kernels may
differ with the share's size).

On one device nothing is moved or padded: the programs and their numbers are those of an
unsharded run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def device_count() -> int:
    """The number of local devices a batch is split over."""
    return jax.local_device_count()


def shard_batch(batched, shared=()):
    """``(batched, shared, n)``: the leaves of ``batched`` with their leading axis (all of length
    ``n``) padded to a multiple of the device count and split over the devices, and the leaves of
    ``shared`` on every device. Unchanged on one device."""
    leaves = jax.tree.leaves(batched)
    n = int(leaves[0].shape[0])
    devices = jax.local_devices()
    if len(devices) == 1:
        return batched, shared, n
    mesh = Mesh(np.array(devices), ("batch",))
    pad = -n % len(devices)

    def split(x):
        x = jnp.asarray(x)
        if pad:
            x = jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)])
        return jax.device_put(x, NamedSharding(mesh, PartitionSpec("batch")))

    everywhere = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(split, batched), jax.tree.map(lambda x: jax.device_put(jnp.asarray(x), everywhere), shared), n


def unpad(tree, n: int):
    """The first ``n`` entries of every leaf's leading axis (the padding of :func:`shard_batch` dropped)."""
    return jax.tree.map(lambda x: x[:n], tree)

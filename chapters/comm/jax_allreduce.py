"""All-reduce timed with JAX: ``lax.psum`` inside ``jax.shard_map`` over a mesh of devices.

Imported by the chapter's JAX notebook (one process: the devices are XLA devices, simulated
CPU devices without GPUs).  ``time_allreduce(devices, n_bytes)`` returns the call that
all-reduces one n-byte float32 buffer per device once and waits for the result.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec


@functools.cache
def compiled_psum(devices: tuple):
    mesh = Mesh(np.array(devices), ("d",))
    spec = PartitionSpec("d")
    fn = jax.jit(jax.shard_map(lambda b: lax.psum(b, "d"), mesh=mesh, in_specs=spec,
                               out_specs=spec))
    return fn, NamedSharding(mesh, spec)


# the collective: psum of an n-byte float32 buffer on each device, compiled once per mesh
def time_allreduce(devices, n_bytes: int):
    fn, sharding = compiled_psum(tuple(devices))
    buf = jax.device_put(jnp.zeros((len(devices), n_bytes // 4), jnp.float32), sharding)
    return lambda: fn(buf).block_until_ready()


def check_sum(devices) -> bool:
    """Device i contributes i + 1; every device must end with 1 + 2 + ... + k."""
    fn, sharding = compiled_psum(tuple(devices))
    k = len(devices)
    x = jax.device_put(jnp.arange(1.0, k + 1)[:, None] * jnp.ones((k, 5)), sharding)
    return bool((np.asarray(fn(x)) == k * (k + 1) / 2).all())

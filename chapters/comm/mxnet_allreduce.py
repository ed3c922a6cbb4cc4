"""All-reduce timed with MXNet: a KVStore ``pushpull`` over the devices' contexts.

Imported by the chapter's MXNet notebook (one process: the devices are contexts, ``cpu(i)``
without GPUs).  ``time_allreduce(devices, n_bytes)`` returns the call that all-reduces one
n-byte float32 buffer per device once and waits for the result.
"""
from __future__ import annotations

import mxnet as mx
from mxnet import nd


def kvstore(devices, n_bytes: int, kind: str = "device"):
    """A KVStore holding key 0 with the shape of an n-byte float32 buffer."""
    kv = mx.kv.create(kind)
    kv.init(0, nd.zeros((n_bytes // 4,), ctx=devices[0]))
    return kv


# the collective: push every device's buffer, pull their sum back into every buffer
def time_allreduce(devices, n_bytes: int, kind: str = "device"):
    kv = kvstore(devices, n_bytes, kind)
    bufs = [nd.zeros((n_bytes // 4,), ctx=d) for d in devices]

    def call():
        kv.pushpull(0, bufs, out=bufs)
        nd.waitall()                 # MXNet's engine is asynchronous: wait for the result
    return call


def check_sum(devices) -> bool:
    """Device i contributes i + 1; every device must end with 1 + 2 + ... + k."""
    k = len(devices)
    kv = kvstore(devices, 20)
    bufs = [nd.full((5,), i + 1, ctx=d) for i, d in enumerate(devices)]
    kv.pushpull(0, bufs, out=bufs)
    return all((b.asnumpy() == k * (k + 1) / 2).all() for b in bufs)

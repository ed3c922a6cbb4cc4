"""The framework-neutral half of hand-written all-reduce: who sends what to whom, and how much.

Each framework's notebook moves the actual tensors; the schedule and the byte accounting
live here once.

Naive all-reduce (the seed's): every device sends its buffer to device 0, device 0 sums and
sends the result back.  Device 0 receives (k-1)*N and sends (k-1)*N: 2(k-1)*N bytes go
through it, while the other devices move N each way.

Ring all-reduce: the buffer is cut into k chunks; devices form a ring i -> i+1 (mod k).
*Reduce-scatter* (k-1 steps): at step s device i sends chunk (i-s) mod k to device i+1,
which adds it into its own copy; afterwards device i holds the full sum of chunk (i+1) mod k.
*All-gather* (k-1 steps): at step s device i sends chunk (i+1-s) mod k to device i+1, which
overwrites its copy.  Every device sends 2(k-1) chunks of N/k: 2(k-1)/k * N bytes, nearly
independent of k, and the load is the same on every link.
"""
from __future__ import annotations

from dataclasses import dataclass

from .utils import shard_slices

__all__ = ["Transfer", "ring_schedule", "naive_schedule", "traffic", "chunk_slices"]


@dataclass(frozen=True)
class Transfer:
    """One message: ``src`` sends ``chunk`` (None: the whole buffer) to ``dst``.

    ``op`` is ``'add'`` (the receiver accumulates) or ``'copy'`` (the receiver overwrites).
    """
    phase: str
    step: int
    src: int
    dst: int
    chunk: int | None
    op: str


def chunk_slices(n: int, k: int) -> list[slice]:
    """The k chunks of a flat buffer of n elements (sizes differ by at most one)."""
    return shard_slices(n, k)


def ring_schedule(k: int) -> list[list[Transfer]]:
    """The ring all-reduce as 2(k-1) steps; the transfers of one step can run concurrently
    (no device reads a chunk that is written in the same step)."""
    if k < 1:
        raise ValueError(f"need at least one device, got {k}")
    steps = []
    for s in range(k - 1):
        steps.append([Transfer("reduce-scatter", s, i, (i + 1) % k, (i - s) % k, "add")
                      for i in range(k)])
    for s in range(k - 1):
        steps.append([Transfer("all-gather", s, i, (i + 1) % k, (i + 1 - s) % k, "copy")
                      for i in range(k)])
    return steps


def naive_schedule(k: int) -> list[list[Transfer]]:
    """The seed's all-reduce: reduce everything onto device 0, then broadcast from it."""
    reduce = [Transfer("reduce", i - 1, i, 0, None, "add") for i in range(1, k)]
    bcast = [Transfer("broadcast", i - 1, 0, i, None, "copy") for i in range(1, k)]
    return [[t] for t in reduce] + [[t] for t in bcast]


def traffic(schedule: list[list[Transfer]], n: int, k: int, itemsize: int = 4) -> dict:
    """Bytes sent and received by each device when all-reducing n elements of ``itemsize``.

    Returns ``{'sent': [...], 'received': [...]}``, one entry per device.
    """
    sizes = [s.stop - s.start for s in chunk_slices(n, k)] if n >= k else None
    sent, received = [0] * k, [0] * k
    for step in schedule:
        for t in step:
            count = n if t.chunk is None else sizes[t.chunk]
            sent[t.src] += count * itemsize
            received[t.dst] += count * itemsize
    return {"sent": sent, "received": received}

"""Timing a collective: repeated calls, interleaved variants, page faults, and the sweep over
message sizes and device counts."""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Iterable

import numpy as np


def message_sizes(smallest: int = 8, largest: int = 32 << 20, per_decade: int = 2) -> list[int]:
    """Sizes in bytes from ``smallest`` to ``largest``, log-spaced, multiples of 8 bytes."""
    if not 0 < smallest <= largest:
        raise ValueError("need 0 < smallest <= largest")
    count = max(2, int(round(math.log10(largest / smallest) * per_decade)) + 1)
    sizes = sorted({max(8, int(round(x / 8)) * 8)
                    for x in np.geomspace(smallest, largest, count)})
    return sizes


def summarize(times: list[float]) -> dict:
    """Median and spread of repeated timings (seconds)."""
    if not times:
        raise ValueError("no timings")
    q = np.percentile(times, [25, 75]) if len(times) > 1 else (times[0], times[0])
    return {"median": statistics.median(times), "p25": float(q[0]), "p75": float(q[1]),
            "min": min(times), "max": max(times), "repeats": len(times)}


def time_call(fn: Callable[[], object], sync: Callable[[object], object] = lambda r: r,
              warmup: int = 3, repeats: int = 10,
              before: Callable[[], object] | None = None) -> list[float]:
    """Seconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones.

    ``sync`` receives ``fn``'s result and must block until the work is done (an asynchronous
    framework returns before its device finishes: ``block_until_ready``, ``nd.waitall``,
    ``torch.cuda.synchronize``).  ``before`` runs untimed before every call (a barrier, so
    that every rank enters the collective together).
    """
    for _ in range(warmup):
        sync(fn())
    out = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        sync(fn())
        out.append(time.perf_counter() - t0)
    return out


def time_interleaved(calls: dict[str, Callable[[], object]],
                     sync: Callable[[object], object] = lambda r: r, warmup: int = 1,
                     repeats: int = 10, before: Callable[[], object] | None = None
                     ) -> dict[str, list[float]]:
    """Seconds of ``repeats`` calls of every function in ``calls``, taken in rounds: one call
    of each per round, each round starting one variant later than the one before (round r
    runs the variants from the r-th on, then the first ones).  A slow stretch of the machine
    then hits every variant alike, and so does whatever costs the first call of a round.
    ``warmup`` untimed rounds first; ``sync`` and ``before`` as in :func:`time_call`."""
    names = list(calls)
    for _ in range(warmup):
        for fn in calls.values():
            sync(fn())
    out = {name: [] for name in calls}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = calls[name]
            if before is not None:
                before()
            t0 = time.perf_counter()
            sync(fn())
            out[name].append(time.perf_counter() - t0)
    return out


def page_faults() -> int | None:
    """Minor page faults of this process so far (every thread; Linux and macOS), or None
    where the ``resource`` module is missing.  A minor fault is the first touch of a page the
    process has just been given: fresh memory costs one per page (4 KiB) on first write."""
    try:
        import resource
    except ImportError:                         # pragma: no cover (Windows)
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_and_faults(fn: Callable[[], object], sync: Callable[[object], object] = lambda r: r,
                    warmup: int = 1, repeats: int = 3) -> tuple[float, int | None]:
    """Median seconds of ``repeats`` calls of ``fn`` (after ``warmup``), and the median number
    of minor page faults per call (:func:`page_faults`; None where unknown)."""
    for _ in range(warmup):
        sync(fn())
    times, faults = [], []
    for _ in range(repeats):
        f0 = page_faults()
        t0 = time.perf_counter()
        sync(fn())
        times.append(time.perf_counter() - t0)
        f1 = page_faults()
        if f0 is not None and f1 is not None:
            faults.append(f1 - f0)
    return statistics.median(times), (int(statistics.median(faults)) if faults else None)


# ------------------------------------------------------------------------------------------
# The sweep: one timed collective over message sizes x device counts
# ------------------------------------------------------------------------------------------

def device_counts(k: int) -> list[int]:
    """The device counts a notebook with k devices sweeps: 2, 4, 8 where <= k, and k itself;
    none for k = 1 (nothing to all-reduce)."""
    if k < 1:
        raise ValueError(f"need at least one device, got k={k}")
    if k == 1:
        return []
    return sorted({c for c in (2, 4, 8) if c <= k} | {k})


def sweep(make_call: Callable[[int, int], Callable[[], object]], counts: Iterable[int],
          sizes: Iterable[int], *, warmup: int = 3, repeats: int = 10,
          sync: Callable[[object], object] = lambda r: r,
          before: Callable[[], object] | None = None,
          combine: Callable[[list[float]], list[float]] | None = None) -> list[dict]:
    """Time a collective for every device count and message size.

    ``make_call(k, n_bytes)`` prepares the buffers and returns a function of no arguments that
    runs the collective once; it is timed by :func:`time_call` (``warmup``, ``repeats``,
    ``sync``, ``before``).  ``combine`` may replace the list of timings, e.g. by the slowest
    rank's time of every repeat.  Returns one row per (k, n_bytes): ``{"k", "bytes",
    "median", "p25", "p75", "min", "max", "repeats"}``.
    """
    rows = []
    for k in counts:
        for n in sizes:
            call = make_call(k, n)
            times = time_call(call, sync, warmup, repeats, before)
            if combine is not None:
                times = list(combine(times))
            rows.append({"k": int(k), "bytes": int(n), **summarize(times)})
    return rows

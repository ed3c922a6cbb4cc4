"""What communication costs: all-reduce timed, and the alpha-beta model fitted to the times.

Framework-neutral half of the communication chapter (the frameworks only supply the
collective to time).  The model: sending a message of n bytes over one link takes
``alpha + n * beta`` (alpha: the latency of one message, beta: seconds per byte, 1/bandwidth).
An all-reduce scheme on k devices sends its messages in steps; the steps run one after
another and the messages of one step run at the same time on different links, so

    t(n, k) = a(k) * alpha + b(k) * n * beta

with a(k) the number of sequential steps and b(k) the bytes on the busiest link per byte of
the buffer:

    ring   a = 2(k-1)            b = 2(k-1)/k    (reduce-scatter + all-gather of n/k chunks)
    naive  a = 2(k-1)            b = 2(k-1)      (device 0 receives k-1 buffers, sends k-1)
    tree   a = 2 ceil(log2 k)    b = 2 ceil(log2 k)  (reduce up a binary tree, broadcast down;
                                                     whole buffers, no pipelining)

``fit`` estimates alpha and beta from measured (k, n, seconds) by least squares on the
*relative* error (the times span orders of magnitude, and every point should count);
``crossover`` solves t_s1(n) = t_s2(n) for n; ``bus_bandwidth`` is nccl-tests' busbw.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

__all__ = ["SCHEMES", "coefficients", "model_time", "Fit", "fit", "crossover",
           "algorithm_bandwidth", "bus_bandwidth", "summarize", "time_call", "message_sizes"]

SCHEMES = ("ring", "naive", "tree")


def coefficients(scheme: str, k: int) -> tuple[float, float]:
    """``(a(k), b(k))`` of ``scheme`` on ``k`` devices (see the module docstring)."""
    if k < 1:
        raise ValueError(f"need at least one device, got k={k}")
    if scheme == "ring":
        return 2.0 * (k - 1), 2.0 * (k - 1) / k
    if scheme == "naive":
        return 2.0 * (k - 1), 2.0 * (k - 1)
    if scheme == "tree":
        d = math.ceil(math.log2(k)) if k > 1 else 0
        return 2.0 * d, 2.0 * d
    raise ValueError(f"unknown scheme {scheme!r}; one of {SCHEMES}")


def model_time(scheme: str, n_bytes, k: int, alpha: float, beta: float):
    """The model's all-reduce time in seconds (``n_bytes`` may be an array)."""
    a, b = coefficients(scheme, k)
    return a * alpha + b * np.asarray(n_bytes, dtype=float) * beta


@dataclass(frozen=True)
class Fit:
    """A fitted alpha-beta model and how well it reproduces the measurements."""
    scheme: str
    alpha: float            # seconds per message
    beta: float             # seconds per byte
    median_rel_error: float
    max_rel_error: float
    points: int

    @property
    def bandwidth(self) -> float:
        """1 / beta, bytes per second."""
        return 1.0 / self.beta if self.beta > 0 else math.inf

    def predict(self, n_bytes, k: int):
        return model_time(self.scheme, n_bytes, k, self.alpha, self.beta)


def fit(samples: Iterable[tuple[int, float, float]], scheme: str = "ring") -> Fit:
    """Least-squares alpha and beta from ``(k, n_bytes, seconds)`` samples (k >= 2).

    Minimises the sum of squared relative errors ``(model - t) / t`` with alpha, beta >= 0
    (a negative fitted value is clipped to 0 and the other refitted alone).
    """
    rows = [(k, float(n), float(t)) for k, n, t in samples if k >= 2]
    if len(rows) < 2:
        raise ValueError("need at least two measurements with k >= 2 to fit alpha and beta")
    if any(t <= 0 for _, _, t in rows):
        raise ValueError("every measured time must be > 0")
    A = np.array([coefficients(scheme, k) for k, _, _ in rows])
    A[:, 1] *= [n for _, n, _ in rows]
    t = np.array([t for _, _, t in rows])
    W = A / t[:, None]                        # relative-error weighting
    (alpha, beta), *_ = np.linalg.lstsq(W, np.ones(len(t)), rcond=None)
    if alpha < 0 or beta < 0:                 # refit the other parameter alone
        col = 1 if alpha < 0 else 0
        x = float(W[:, col] @ np.ones(len(t)) / (W[:, col] @ W[:, col]))
        alpha, beta = (0.0, x) if col == 1 else (x, 0.0)
    rel = np.abs(A @ np.array([alpha, beta]) - t) / t
    return Fit(scheme, float(alpha), float(beta), float(np.median(rel)), float(rel.max()),
               len(rows))


def crossover(s1: str, s2: str, k: int, alpha: float, beta: float) -> float | None:
    """The message size in bytes where ``s1`` and ``s2`` take equal time on k devices, or
    None when one is never slower than the other (equal slopes, or the crossing at n <= 0)."""
    a1, b1 = coefficients(s1, k)
    a2, b2 = coefficients(s2, k)
    if b1 == b2 or beta == 0:
        return None
    n = (a2 - a1) * alpha / ((b1 - b2) * beta)
    return float(n) if n > 0 else None


def algorithm_bandwidth(n_bytes: float, seconds: float) -> float:
    """nccl-tests' algbw: the buffer size over the time, bytes per second."""
    return n_bytes / seconds


def bus_bandwidth(algbw: float, k: int) -> float:
    """nccl-tests' busbw for all-reduce: ``algbw * 2(k-1)/k``, comparable with a link's speed
    whatever k is (the bytes a ring puts on each link, per second)."""
    return algbw * 2.0 * (k - 1) / k


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
              warmup: int = 3, repeats: int = 10) -> list[float]:
    """Seconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones.

    ``sync`` receives ``fn``'s result and must block until the work is done (an asynchronous
    framework returns before its device finishes: ``block_until_ready``, ``nd.waitall``,
    ``torch.cuda.synchronize``).
    """
    for _ in range(warmup):
        sync(fn())
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sync(fn())
        out.append(time.perf_counter() - t0)
    return out

"""The alpha-beta model of an all-reduce, and its fit to measured times.

Sending a message of n bytes over one link takes ``alpha + n * beta`` (alpha: the latency of
one message, beta: seconds per byte, 1/bandwidth).  An all-reduce scheme on k devices sends its
messages in steps; the steps run one after another and the messages of one step run at the
same time on different links, so::

    t(n, k) = a(k) * alpha + b(k) * n * beta

with a(k) the number of sequential steps and b(k) the bytes on the busiest link per byte of
the buffer::

    ring          a = 2(k-1)            b = 2(k-1)/k    (reduce-scatter + all-gather of n/k chunks)
    naive         a = 2(k-1)            b = 2(k-1)      (device 0 receives k-1 buffers, sends k-1)
    tree          a = 2 ceil(log2 k)    b = 2 ceil(log2 k)  (binomial tree, reduce up, broadcast
                                                        down; whole buffers, no pipelining)
    rabenseifner  a = 2 log2 k          b = 2(k-1)/k    (recursive halving reduce-scatter +
                                                        recursive doubling all-gather; k = 2^d)

``fit`` estimates alpha and beta from measured (k, n, seconds) by least squares on the
*relative* error (the times span orders of magnitude, and every point should count);
``crossover`` solves t_s1(n) = t_s2(n) for n; ``bus_bandwidth`` is nccl-tests' busbw.
``collective_coefficients`` gives a(k) and b(k) of the ring's reduce-scatter and all-gather too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np


SCHEMES = ("ring", "naive", "tree", "rabenseifner")


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
    if scheme == "rabenseifner":
        if k & (k - 1):
            raise ValueError(f"recursive halving-doubling (rabenseifner) needs a power of two "
                             f"devices, got k={k}")
        d = k.bit_length() - 1
        return 2.0 * d, 2.0 * (k - 1) / k
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


# Schemes that put the fewest possible bytes on every link (2(k-1)/k n each): for them, and
# only for them, busbw compares with a link's bandwidth.
BANDWIDTH_OPTIMAL = ("ring", "rabenseifner")


def bandwidths(n_bytes: float, seconds: float, k: int, scheme: str) -> dict:
    """algbw always; busbw only for a bandwidth-optimal ``scheme`` (ring, rabenseifner), else
    None: busbw's factor 2(k-1)/k is the bytes such a scheme puts on each link, and a
    reduce-to-one-device scheme (naive, tree) puts more on its busiest link."""
    algbw = algorithm_bandwidth(n_bytes, seconds)
    return {"algbw": algbw,
            "busbw": bus_bandwidth(algbw, k) if scheme in BANDWIDTH_OPTIMAL else None}


def moved_bytes(scheme: str, k: int, n_bytes: float) -> float:
    """Bytes sent in total, summed over all devices, by one all-reduce of ``n_bytes``: 2(k-1)n
    for every scheme here (each element needs k-1 additions and k-1 copies, nccl-tests'
    PERFORMANCE.md).  The schemes differ in how they spread it over links, not in the total."""
    coefficients(scheme, k)                      # validates scheme and k
    return 2.0 * (k - 1) * n_bytes


def per_byte_moved(f: "Fit", k: int) -> float:
    """Seconds per byte sent in total (all devices together) that a fit implies on k devices:
    ``b(k) * beta / (2(k-1))``.  Where the links do not run in parallel (one memory system),
    every scheme should show the same value; a larger one means more work per byte."""
    a, b = coefficients(f.scheme, k)
    return b * f.beta / (2.0 * (k - 1)) if k > 1 else 0.0


def fit_rows(rows: Iterable[dict], scheme: str = "ring") -> Fit:
    """:func:`fit` on the medians of :func:`.sweep`'s rows (all device counts at once)."""
    return fit([(r["k"], r["bytes"], r["median"]) for r in rows], scheme)


def fit_per_k(rows: Iterable[dict], scheme: str = "ring") -> dict[int, Fit]:
    """One :func:`fit_rows` per device count: the model's form in n tested for each k alone,
    without asking one alpha and one beta to follow how k changes the cost as well."""
    rows = list(rows)
    return {k: fit_rows([r for r in rows if r["k"] == k], scheme)
            for k in sorted({r["k"] for r in rows}) if k >= 2}


def regime_size(scheme: str, k: int, alpha: float, beta: float) -> float | None:
    """The message size where the latency term a(k)*alpha equals the bandwidth term
    b(k)*n*beta: below it latency dominates, above it bandwidth.  None for k = 1."""
    a, b = coefficients(scheme, k)
    if a == 0 or b == 0 or beta == 0:
        return None
    return a * alpha / (b * beta)


# The collectives the book prices, each as NCCL's ring runs it on a buffer of n bytes (n: the
# whole, unsharded buffer; a reduce-scatter leaves n/k on each device, an all-gather starts from
# n/k on each).  Steps and bytes on each link per byte of n:
COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather")


def collective_coefficients(op: str, k: int) -> tuple[float, float]:
    """``(a, b)`` of the ring ``op`` on k devices: all-reduce ``(2(k-1), 2(k-1)/k)``,
    reduce-scatter and all-gather ``(k-1, (k-1)/k)`` each (an all-reduce is one of each)."""
    if k < 1:
        raise ValueError(f"need at least one device, got k={k}")
    if op == "all-reduce":
        return coefficients("ring", k)
    if op in ("reduce-scatter", "all-gather"):
        return float(k - 1), (k - 1) / k
    raise ValueError(f"unknown collective {op!r}; one of {COLLECTIVES}")


def collective_model_time(op: str, n_bytes, k: int, alpha: float, beta: float):
    """The alpha-beta time of the ring ``op``: ``a*alpha + b*n*beta``, e.g. with a fitted
    alpha and beta; reduce-scatter and all-gather ``(k-1)*alpha + (k-1)/k*n*beta`` each."""
    a, b = collective_coefficients(op, k)
    return a * alpha + b * np.asarray(n_bytes, dtype=float) * beta

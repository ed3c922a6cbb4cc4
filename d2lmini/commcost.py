"""What communication costs: all-reduce timed, and the alpha-beta model fitted to the times.

Framework-neutral half of the communication chapter (the frameworks only supply the
collective to time).  The model: sending a message of n bytes over one link takes
``alpha + n * beta`` (alpha: the latency of one message, beta: seconds per byte, 1/bandwidth).
An all-reduce scheme on k devices sends its messages in steps; the steps run one after
another and the messages of one step run at the same time on different links, so

    t(n, k) = a(k) * alpha + b(k) * n * beta

with a(k) the number of sequential steps and b(k) the bytes on the busiest link per byte of
the buffer:

    ring          a = 2(k-1)            b = 2(k-1)/k    (reduce-scatter + all-gather of n/k chunks)
    naive         a = 2(k-1)            b = 2(k-1)      (device 0 receives k-1 buffers, sends k-1)
    tree          a = 2 ceil(log2 k)    b = 2 ceil(log2 k)  (binomial tree, reduce up, broadcast
                                                        down; whole buffers, no pipelining)
    rabenseifner  a = 2 log2 k          b = 2(k-1)/k    (recursive halving reduce-scatter +
                                                        recursive doubling all-gather; k = 2^d)

``fit`` estimates alpha and beta from measured (k, n, seconds) by least squares on the
*relative* error (the times span orders of magnitude, and every point should count);
``crossover`` solves t_s1(n) = t_s2(n) for n; ``bus_bandwidth`` is nccl-tests' busbw.

For GPUs, ``collective_time`` prices NCCL's ring collectives (all-reduce, reduce-scatter,
all-gather) with published link bandwidths (``LINKS``) and NCCL's own latency table
(``NCCL_BASE_LATENCY_US``, ``NCCL_HW_LATENCY_US``: src/graph/tuning.cc); ``predict_step``
combines it with one GPU's step measured at several batches on an H200 (``load_step_shape``
fits ``T(B) = T0 + B t`` to the step benchmark's records; ``resnet18_step_times`` gives those
shapes and the H100 record scaled linearly, as predicted before), with or without overlap
(the last bucket stays exposed); every GPU pays ``T0`` (Amdahl's law), and ``critical_batch``
gives the per-GPU batch below which a step is communication-bound.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

__all__ = ["SCHEMES", "coefficients", "model_time", "Fit", "fit", "crossover",
           "algorithm_bandwidth", "bus_bandwidth", "bandwidths", "summarize", "time_call",
           "time_interleaved", "page_faults", "time_and_faults", "message_sizes", "device_counts", "sweep", "fit_rows",
           "fit_per_k", "regime_size", "moved_bytes", "per_byte_moved", "sig", "fmt_bytes",
           "fmt_seconds", "COLLECTIVES", "collective_coefficients", "collective_model_time",
           "PROTOCOLS", "NCCL_VERSION_READ", "NCCL_SOURCE", "NCCL_BASE_LATENCY_US",
           "NCCL_HW_LATENCY_US", "NCCL_RING_EFFICIENCY", "NCCL_LL_MAX_BW", "nccl_latency", "collective_time",
           "nccl_protocol", "nccl_choice", "tree_bandwidth", "nodes_of", "ALGORITHMS",
           "NCCL_TREE_CORRECTION", "NCCL_RING_PLATEAU", "Link", "LINKS", "Gpu", "GPUS",
           "LENET_SHAPES", "gradient_bytes", "lenet_flops", "resnet18_flops", "compute_time",
           "DDP_BUCKET_BYTES", "DDP_FIRST_BUCKET_BYTES", "layer_buckets", "resnet18_layer_costs",
           "bucket_sizes", "predict_step", "bucket_timeline", "plot_overlap_timeline", "best_speedup", "critical_batch",
           "plot_roofline", "hidden_fraction", "clearly_greater", "overlap_verdict",
           "overlap_report", "record", "report", "plot_fits",
           "ASSUMED_UTILIZATION", "table", "NODE_GPUS", "MIN_PER_GPU_BATCH", "device_limit",
           "BENCHMARKS", "H100_RUN", "H100_RESNET18", "H100_MODEL", "BenchmarkRecordError",
           "MeasuredStep", "load_step", "StepTime", "resnet18_step_times", "step_table",
           "H200_RUN", "H200_SHAPES", "LINEAR_LABEL", "load_step_shape",
           "speedup_rows", "speedup_table", "plot_speedups"]

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


def sig(x: float, digits: int = 2) -> str:
    """``x`` rounded to ``digits`` significant figures, without an exponent: 737.4 -> '740',
    0.4812 -> '0.48', 12345 -> '12,000'."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    r = round(x, digits - 1 - math.floor(math.log10(abs(x))))
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(r))))
    return f"{r:,.{decimals}f}"


def fmt_bytes(n: float, digits: int = 2) -> str:
    """A size in bytes with SI prefixes to ``digits`` significant figures: '720 kB', '1.4 MB'."""
    n = float(sig(n, digits).replace(",", "")) if n else 0.0       # round first, then the unit
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{sig(n / scale, digits)} {unit}"
    return f"{sig(n, digits)} B"


def fmt_seconds(t: float, digits: int = 2) -> str:
    """A time to ``digits`` significant figures: '740 us', '1.3 ms', '2.5 s'."""
    t = float(sig(t, digits).replace(",", "")) if t else 0.0       # round first, then the unit
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if abs(t) >= scale:
            return f"{sig(t / scale, digits)} {unit}"
    return f"{sig(t / 1e-6, digits)} us"


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


def fit_rows(rows: Iterable[dict], scheme: str = "ring") -> Fit:
    """:func:`fit` on the medians of :func:`sweep`'s rows (all device counts at once)."""
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


# ------------------------------------------------------------------------------------------
# Published hardware figures, and the predictions made from them
# ------------------------------------------------------------------------------------------

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


# ------------------------------------------------------------------------------------------
# NCCL's own cost model (src/graph/tuning.cc), read in NCCL 2.28.9 -- the NCCL of the PyTorch
# 2.11 that measured the H100 step -- where the defaults are the struct
# ncclTunerConstantsDefaults, fields .baseLatencies[algorithm][protocol] and
# .hwLatencies[NVLINK|PCI|NET][algorithm][protocol], in microseconds (the ring's rows are the
# same in NCCL 2.21.5, where they are the arrays baseLat and hwLat, and in 2.30.7).  NCCL prices
# a collective as  latency + bytes / bandwidth,  with the latency of a ring on one node
#     baseLatencies[Ring][p] + nsteps * hwLatencies[NVLINK or PCI][Ring][p]
# (nsteps = 2(k-1) for all-reduce, k-1 for reduce-scatter and all-gather), and across nodes with
# one GPU each ("ppn == 1: latencies are fully exposed, use the Tree network latency")
#     baseLatencies[Ring][p] + nsteps * hwLatencies[NET][Tree][p]
# plus the network's own latency, which NCCL's InfiniBand transport reports as 0 ("Not set").
# The protocol's bandwidth: LL moves 4 bytes of data per 8 (busBw * .5, and at most
# .llMaxBws[row][N1 | N2 | N4], the row by GPU generation on one node, by CPU vendor across
# nodes), LL128 120 of 128 (busBw * 0.92), Simple all of it.  The tree (all-reduce only) is
# priced too, with baseLatencies[Tree], a chain of hwLatencies[..][Tree] hops inside a node and
# log2(nodes) levels across, half its bus bandwidth and treeCorrectionFactor; the faster of
# ring and tree is kept, as NCCL picks.  Left out: the per-channel caps (perChMax*Bws times
# the number of channels), NVLS and CollNet, and the measured bandwidth of each channel (we
# take the datasheet's link speed).
# ------------------------------------------------------------------------------------------
PROTOCOLS = ("LL", "LL128", "Simple")
NCCL_VERSION_READ = "2.28.9"
NCCL_SOURCE = (f"NCCL {NCCL_VERSION_READ}, src/graph/tuning.cc: ncclTunerConstantsDefaults "
               ".baseLatencies and .hwLatencies (us)")
NCCL_BASE_LATENCY_US = {                     # .baseLatencies, per protocol LL, LL128, Simple
    "tree": (6.8, 14.0, 8.4),
    "ring": (6.6, 14.0, 8.4),
}
NCCL_HW_LATENCY_US = {                       # .hwLatencies, per protocol LL, LL128, Simple
    "NVLINK": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)},
    "PCI": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7)},
    "NET": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)},
}
NCCL_RING_EFFICIENCY = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}   # tuning.cc, "model refinements"
# The tree's refinements for all-reduce (tuning.cc): 0.92 of the bus bandwidth, LL a further
# 1/3.8 (capped by llMaxBws), LL128 7/9 in one node and 120/128 across nodes; the algorithm
# bandwidth is half the bus bandwidth (every byte goes up the tree and down again).
NCCL_TREE_EFFICIENCY = 0.92
NCCL_TREE_LL_FACTOR = 1 / 3.8
NCCL_TREE_LL128_FACTOR = {"one node": 7 / 9, "nodes": 120 / 128}
# ncclTopoGetAlgoTime: the tree's bandwidth corrected per message size, 64 B << i for
# i = 0..22 (treeCorrectionFactor), and a multi-node Simple ring all-reduce's latency times 1.4
# on sm80 and later GPUs ("plateau effect of ring") once a rank's share of a channel is 64 B.
NCCL_TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
           1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
              .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9),
}
NCCL_RING_PLATEAU = 1.4
ALGORITHMS = ("ring", "tree")
NCCL_LL_MAX_BW = {                           # .llMaxBws rows, GB/s, for N1, N2, N4 (nodes)
    "Ampere": (87.7, 22.5, 19.0), "Hopper": (141.0, 45.0, 35.0), "Intel CPU": (39.0, 39.0, 20.4),
}


@dataclass(frozen=True)
class Link:
    """A link between GPUs: its bandwidth per direction per GPU (bytes/s) from its source, and
    the row of NCCL's latency table it uses (``hw``: NVLINK, PCI, or NET for a ring with one GPU
    per node)."""
    name: str
    bandwidth: float
    source: str
    hw: str = "NVLINK"
    domain: int | None = None       # the most GPUs one such link joins (None: no such limit)
    ll_max_bw: str | None = None    # the row of NCCL_LL_MAX_BW that caps LL (None: no cap)

    def __post_init__(self):
        if self.hw not in NCCL_HW_LATENCY_US:
            raise ValueError(f"hw must be one of {tuple(NCCL_HW_LATENCY_US)}, got {self.hw!r}")
        if self.ll_max_bw is not None and self.ll_max_bw not in NCCL_LL_MAX_BW:
            raise ValueError(f"ll_max_bw must be one of {tuple(NCCL_LL_MAX_BW)} or None")

    @property
    def beta(self) -> float:
        return 1.0 / self.bandwidth

    def hop_latency(self, protocol: str) -> float:
        """Seconds NCCL adds per ring step on this link (its hwLatencies entry)."""
        column = "tree" if self.hw == "NET" else "ring"   # one GPU per node: the NET tree column
        return NCCL_HW_LATENCY_US[self.hw][column][PROTOCOLS.index(protocol)] * 1e-6

    @property
    def latency_source(self) -> str:
        column = "Tree (one GPU per node)" if self.hw == "NET" else "Ring"
        return (f"{NCCL_SOURCE}: baseLatencies[Ring] + steps x hwLatencies[{self.hw}]"
                f"[{column}]")

    @property
    def protocols(self) -> tuple[str, ...]:
        """The protocols NCCL enables on this link by default: LL128 only where the GPUs of a
        node talk over NVLink (tuning.cc: ``pEnable &= (graphs[a]->typeIntra <= PATH_NVB)``),
        so not between GPUs that share only PCIe."""
        return ("LL", "Simple") if self.hw == "PCI" else PROTOCOLS

    def protocol_bandwidth(self, protocol: str, k: int) -> float:
        """Bytes/s NCCL's model gives the ring with ``protocol`` over this link on k GPUs (one
        per node over the network): the link's bandwidth times the protocol's efficiency, LL
        capped by llMaxBws."""
        bw = self.bandwidth * NCCL_RING_EFFICIENCY[protocol]
        if protocol == "LL" and self.ll_max_bw is not None:
            nodes = k if self.hw == "NET" else 1
            bw = min(bw, NCCL_LL_MAX_BW[self.ll_max_bw][min(nodes - 1, 2)] * 1e9)
        return bw


def nodes_of(k: int, link: Link) -> int:
    """How many nodes k GPUs on ``link`` span: one GPU per node over the network (NET), one
    node over NVLink or PCIe."""
    return k if link.hw == "NET" else 1


def _log2i(n: int) -> int:
    return int(math.floor(math.log2(n))) if n >= 1 else -1


def nccl_latency(op: str, k: int, link: Link, protocol: str, algorithm: str = "ring") -> float:
    """NCCL's latency term of ``op`` on k GPUs over ``link`` with ``protocol`` (seconds); 0 for
    k = 1.  The ring: the base latency plus one hop latency per step.  The tree (all-reduce
    only): the base latency plus ``2 ((k/nodes - 1) intra + log2(nodes) inter)`` -- a chain
    inside a node, a binary tree across nodes (tuning.cc)."""
    if k == 1:
        return 0.0
    i = PROTOCOLS.index(protocol)
    if algorithm == "ring":
        a, _ = collective_coefficients(op, k)
        return NCCL_BASE_LATENCY_US["ring"][i] * 1e-6 + a * link.hop_latency(protocol)
    if algorithm != "tree" or op != "all-reduce":
        raise ValueError(f"NCCL's tree runs all-reduce only; got {algorithm!r} for {op!r}")
    nodes = nodes_of(k, link)
    intra = NCCL_HW_LATENCY_US["PCI" if link.hw == "PCI" else "NVLINK"]["tree"][i]
    inter = NCCL_HW_LATENCY_US["NET"]["tree"][i]                 # one GPU per node: the tree's
    return (NCCL_BASE_LATENCY_US["tree"][i]
            + 2 * ((k // nodes - 1) * intra + _log2i(nodes) * inter)) * 1e-6


def tree_bandwidth(link: Link, protocol: str, k: int) -> float:
    """Algorithm bytes/s of NCCL's tree all-reduce over ``link`` with ``protocol`` (before the
    per-size correction): the refinements of :data:`NCCL_TREE_EFFICIENCY` and the factors
    below it, halved (every byte goes up and down the tree)."""
    bus = link.bandwidth * NCCL_TREE_EFFICIENCY
    nodes = nodes_of(k, link)
    if protocol == "LL":
        bus *= NCCL_TREE_LL_FACTOR
        if link.ll_max_bw is not None:
            bus = min(bus, NCCL_LL_MAX_BW[link.ll_max_bw][min(nodes - 1, 2)] * 1e9)
    elif protocol == "LL128":
        bus *= NCCL_TREE_LL128_FACTOR["one node" if nodes == 1 else "nodes"]
    return 0.5 * bus


def _tree_correction(protocol: str, n: np.ndarray) -> np.ndarray:
    out = np.ones(n.shape)
    for j, size in np.ndenumerate(n):
        log_size = _log2i(int(size) >> 6)
        if 0 <= log_size < len(NCCL_TREE_CORRECTION[protocol]):
            out[j] = NCCL_TREE_CORRECTION[protocol][log_size]
    return out


def _algo_times(op: str, n_bytes, k: int, link: Link) -> dict:
    """``{(algorithm, protocol): seconds}`` of NCCL's model for every algorithm and protocol
    the link enables (the tree for all-reduce only); ``n_bytes`` may be an array."""
    _, b = collective_coefficients(op, k)
    n = np.asarray(n_bytes, dtype=float)
    out = {}
    for p in link.protocols:
        lat = np.full(n.shape, nccl_latency(op, k, link, p))
        if op == "all-reduce" and p == "Simple" and nodes_of(k, link) > 1:
            lat = np.where(n / k >= 64, lat * NCCL_RING_PLATEAU, lat)      # one channel assumed
        out["ring", p] = lat + b * n / link.protocol_bandwidth(p, k)
        if op == "all-reduce":
            out["tree", p] = (nccl_latency(op, k, link, p, "tree")
                              + n / (tree_bandwidth(link, p, k) * _tree_correction(p, n)))
    return out


def collective_time(op: str, n_bytes, k: int, link: Link, protocol: str | None = None,
                    algorithm: str | None = None):
    """Predicted seconds of NCCL's ``op`` ("all-reduce", "reduce-scatter", "all-gather") of a
    buffer of ``n_bytes`` (the whole buffer) on k GPUs over ``link``, by NCCL's own model
    (tuning.cc): the ring -- :func:`nccl_latency` plus ``b(k) * n`` over the protocol's
    bandwidth (:meth:`Link.protocol_bandwidth`) -- and, for all-reduce, the tree
    (:func:`tree_bandwidth`, corrected per size).  ``protocol``/``algorithm`` None: the
    fastest the link enables, as NCCL picks by its predicted time.  0 on one GPU.
    ``n_bytes`` may be an array.  For this machine's fitted alpha and beta instead of NCCL's
    figures, see :func:`collective_model_time`."""
    if k == 1:
        return 0.0 * np.asarray(n_bytes, dtype=float) if np.ndim(n_bytes) else 0.0
    if protocol is not None and protocol not in link.protocols:
        raise ValueError(f"NCCL does not enable {protocol} on {link.name} (it enables "
                         f"{', '.join(link.protocols)})")
    times = {key: t for key, t in _algo_times(op, n_bytes, k, link).items()
             if (protocol is None or key[1] == protocol)
             and (algorithm is None or key[0] == algorithm)}
    if not times:
        raise ValueError(f"NCCL's model has no {algorithm} {op}")
    out = np.min(np.stack(list(times.values())), axis=0)
    return out if np.ndim(out) else float(out)


def nccl_choice(op: str, n_bytes: float, k: int, link: Link) -> tuple[str, str]:
    """The (algorithm, protocol) NCCL's model finds fastest for this collective."""
    if k == 1:
        return "none", "none"
    times = _algo_times(op, float(n_bytes), k, link)
    return min(times, key=lambda key: float(times[key]))


def nccl_protocol(op: str, n_bytes: float, k: int, link: Link) -> str:
    """The protocol of :func:`nccl_choice` ("none" for k = 1)."""
    return nccl_choice(op, n_bytes, k, link)[1]


def _pcie_x16(gigatransfers: float) -> float:
    """Bytes/s per direction of a PCIe x16 link with 128b/130b encoding (PCIe 3.0 and later)."""
    return gigatransfers * 1e9 * 16 * 128 / 130 / 8


# NVLink joins the GPUs of one server (an HGX board: 8 SXM GPUs on NVSwitch), and so does
# PCIe; beyond 8 GPUs the ring crosses the network.
NODE_GPUS = 8

LINKS: dict[str, Link] = {
    "NVLink 4 (H100 SXM)": Link(
        "NVLink 4 (H100 SXM)", 900e9 / 2,
        "NVIDIA H100 Tensor Core GPU datasheet: NVLink 900 GB/s per GPU (both directions)",
        "NVLINK", NODE_GPUS, "Hopper"),
    "NVLink 3 (A100 SXM)": Link(
        "NVLink 3 (A100 SXM)", 600e9 / 2,
        "NVIDIA A100 Tensor Core GPU datasheet: NVLink 600 GB/s per GPU (both directions)",
        "NVLINK", NODE_GPUS, "Ampere"),
    "PCIe 5.0 x16": Link(
        "PCIe 5.0 x16", _pcie_x16(32),
        "PCI-SIG, PCI Express Base Specification 5.0: 32 GT/s per lane, 128b/130b encoding",
        "PCI", NODE_GPUS),
    "PCIe 4.0 x16": Link(
        "PCIe 4.0 x16", _pcie_x16(16),
        "PCI-SIG, PCI Express Base Specification 4.0: 16 GT/s per lane, 128b/130b encoding",
        "PCI", NODE_GPUS),
    "InfiniBand NDR": Link(
        "InfiniBand NDR", 400e9 / 8,
        "NVIDIA ConnectX-7 product brief: 400 Gb/s NDR InfiniBand per port",
        "NET", None, "Intel CPU"),
    "InfiniBand HDR": Link(
        "InfiniBand HDR", 200e9 / 8,
        "NVIDIA ConnectX-6 product brief: 200 Gb/s HDR InfiniBand per port",
        "NET", None, "Intel CPU"),
}


@dataclass(frozen=True)
class Gpu:
    name: str
    fp32_flops: float          # peak dense FP32, FLOP/s
    source: str


GPUS: dict[str, Gpu] = {
    "H100 SXM": Gpu("H100 SXM", 67e12, "NVIDIA H100 Tensor Core GPU datasheet: FP32 67 TFLOPS"),
    "A100 SXM": Gpu("A100 SXM", 19.5e12, "NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5 TFLOPS"),
}

# The from-scratch chapter's LeNet: W1, b1, W2, b2, W3, b3, W4, b4 (its init_params shapes).
from .models import LENET_SHAPES  # noqa: E402  (re-exported: the chapter's notebooks use cc.LENET_SHAPES)


def gradient_bytes(shapes: Iterable[tuple[int, ...]], itemsize: int = 4) -> int:
    """Bytes of one gradient per parameter array of these shapes (float32: 4 bytes)."""
    return int(sum(math.prod(s) for s in shapes)) * itemsize


def _conv(cin: int, cout: int, ksize: int, out_hw: int) -> float:
    return 2.0 * cin * cout * ksize * ksize * out_hw * out_hw    # multiply + add


def lenet_flops() -> float:
    """Forward FLOPs of the scratch chapter's LeNet for one 28x28 image (convolutions and
    dense layers; pooling and activations are negligible)."""
    return (_conv(1, 20, 3, 26) + _conv(20, 50, 5, 9) + 2.0 * 800 * 128 + 2.0 * 128 * 10)


def resnet18_flops(width: int = 64, hw: int = 28, num_classes: int = 10) -> float:
    """Forward FLOPs of the book's ResNet-18 variant (3x3 stem, no max-pooling) for one
    ``hw`` x ``hw`` image: the convolutions and the dense layer."""
    w, total, cin, size = width, _conv(1, width, 3, hw), width, hw
    for s, c in enumerate((w, 2 * w, 4 * w, 8 * w), start=1):
        for b in range(2):
            if b == 0 and s > 1:
                size = (size - 1) // 2 + 1                      # stride 2, padding 1
                total += _conv(cin, c, 1, size)                 # the 1x1 shortcut
            total += _conv(cin, c, 3, size) + _conv(c, c, 3, size)
            cin = c
    return total + 2.0 * 8 * w * num_classes



def resnet18_layer_costs(width: int = 64, hw: int = 28, num_classes: int = 10,
                         in_channels: int = 1) -> list[dict]:
    """The book's ResNet-18 layer by layer, in forward order: ``{"name", "grad_bytes" (float32
    gradients of its trainable tensors, a BatchNorm's with the convolution before it),
    "flops" (forward, one image)}``, from ``d2lmini.models.resnet18_spec``.  The FLOPs add up
    to :func:`resnet18_flops`; the last stage holds most of the bytes and little of the work."""
    from .models import resnet18_spec
    trainable: dict[str, int] = {}
    for name, shape in resnet18_spec(num_classes, in_channels, width):
        if name.endswith(("running_mean", "running_var")):
            continue
        layer = name.rsplit(".", 1)[0].replace(".bn", ".conv").replace("stem.conv", "stem.conv")
        trainable[layer] = trainable.get(layer, 0) + 4 * math.prod(shape)
    w, size, cin = width, hw, width
    flops = {"stem.conv": _conv(in_channels, width, 3, hw)}
    for s, c in enumerate((w, 2 * w, 4 * w, 8 * w), start=1):
        for b in range(2):
            p = f"stage{s}.{b}"
            if b == 0 and s > 1:
                size = (size - 1) // 2 + 1
                flops[f"{p}.conv3"] = _conv(cin, c, 1, size)
            flops[f"{p}.conv1"], flops[f"{p}.conv2"] = _conv(cin, c, 3, size), _conv(c, c, 3, size)
            cin = c
    flops["fc"] = 2.0 * 8 * w * num_classes
    if set(flops) != set(trainable):
        raise AssertionError(f"layers differ: {sorted(set(flops) ^ set(trainable))}")
    return [{"name": n, "grad_bytes": trainable[n], "flops": flops[n]} for n in trainable]


# Small convolutional models reach a fraction of a GPU's peak FP32 rate.  This fraction was the
# chapter's assumption before a GPU measured the step (an assumption, not a datasheet figure);
# the predictions now use the measured step (MeasuredStep) and show this one for comparison.
ASSUMED_UTILIZATION = 0.4


def compute_time(forward_flops: float, batch: int, gpu: Gpu, utilization: float) -> float:
    """Seconds for one training step (forward + backward = 3x the forward FLOPs) of ``batch``
    images on ``gpu`` running at ``utilization`` of its peak FP32 rate."""
    return 3.0 * forward_flops * batch / (gpu.fp32_flops * utilization)


# PyTorch DDP's default bucket: bucket_cap_mb=25 (MiB).  Paddle's DataParallel also
# defaults to comm_buffer_size=25 (MB).
DDP_BUCKET_BYTES = 25 * 2**20
# After its first iteration DDP rebuilds its buckets in the order backward produced the
# gradients, the first of them capped at 1 MiB (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES).
DDP_FIRST_BUCKET_BYTES = 2**20


def layer_buckets(layers: list[dict], bucket_bytes: float = DDP_BUCKET_BYTES,
                  first_bucket_bytes: float = DDP_FIRST_BUCKET_BYTES) -> list[list[int]]:
    """DDP's buckets for ``layers`` (forward order, ``grad_bytes`` each): whole layers in
    backward order, a bucket closed once it holds its cap (the first one's
    ``first_bucket_bytes``); each bucket a list of layer indices."""
    out, cur, held = [], [], 0.0
    for i in reversed(range(len(layers))):
        cur.append(i)
        held += layers[i]["grad_bytes"]
        if held >= (first_bucket_bytes if not out else bucket_bytes):
            out.append(cur)
            cur, held = [], 0.0
    if cur:
        out.append(cur)
    return out


def bucket_sizes(n_bytes: float, bucket_bytes: float) -> list[float]:
    """The buckets a gradient of ``n_bytes`` travels in, in the order they fill up during
    backward: full buckets of ``bucket_bytes``, the remainder last (it holds the first layers,
    whose gradients backward computes last)."""
    if n_bytes <= 0:
        return []
    full = max(0, math.ceil(n_bytes / bucket_bytes) - 1)
    return [float(bucket_bytes)] * full + [n_bytes - full * bucket_bytes]


def _shares(compute, k: int) -> tuple[float, float]:
    """(one device's step on the whole global batch, one of k devices' step on its share):
    a :class:`StepTime` answers from its measured shape (``at``), a number of seconds splits
    linearly (``compute / k``)."""
    if isinstance(compute, StepTime):
        return compute.seconds, compute.at(compute.batch / k)
    return compute, compute / k


def predict_step(compute_s, n_bytes: float, k: int, link: Link, *,
                 overlap: bool, bucket_bytes: float = DDP_BUCKET_BYTES,
                 backward_share: float = 2 / 3, protocol: str | None = None,
                 layers: list[dict] | None = None) -> dict:
    """The model's prediction for one step of data-parallel training with a fixed global batch.

    One device computes the step in ``compute_s``; k devices compute their share of the batch
    each and all-reduce ``n_bytes`` of gradients (:func:`collective_time` over ``link``).  The
    share's time: a :class:`StepTime` gives it from the step's measured shape ``T0 + B t``
    (its fixed part ``T0`` paid by every device: Amdahl's law); a number of seconds is split
    linearly, ``compute_s / k`` (the older assumption, optimistic for small shares).

    - ``overlap=False``: one all-reduce after backward, ``step = share + t(n)``.
    - ``overlap=True``: buckets all-reduced one after another on one communication stream,
      each as soon as backward has produced its gradients and the previous bucket's
      all-reduce is done (:func:`bucket_timeline`: at an even rate in bytes over the backward
      pass, ``backward_share`` of the compute, or by ``layers``' FLOPs in DDP's buckets).  Nothing hides behind the forward pass, and the last
      bucket's all-reduce cannot start before backward ends: at least ``t(last bucket)`` stays
      exposed, and with one bucket (``bucket_bytes >= n_bytes``) nothing hides at all.

    Returns ``{"compute_s", "comm_s" (one all-reduce of all n bytes), "exposed_s" (the step's
    time beyond compute), "step_s", "speedup" (over one device), "protocol", "buckets"}``.
    """
    whole, per_device = _shares(compute_s, k)
    comm = collective_time("all-reduce", n_bytes, k, link, protocol)
    buckets = [n_bytes]
    if k == 1:
        step = per_device
    elif not overlap:
        step = per_device + comm
    else:
        timeline = bucket_timeline(compute_s, n_bytes, k, link, bucket_bytes=bucket_bytes,
                                   backward_share=backward_share, protocol=protocol,
                                   layers=layers)
        buckets = timeline
        step = max(per_device, timeline[-1]["end"])
    return {"compute_s": per_device, "comm_s": comm, "exposed_s": step - per_device,
            "step_s": step, "speedup": whole / step,
            "protocol": nccl_protocol("all-reduce", n_bytes, k, link) if protocol is None else protocol,
            "buckets": len(buckets)}


def bucket_timeline(compute_s, n_bytes: float, k: int, link: Link, *,
                    bucket_bytes: float = DDP_BUCKET_BYTES, backward_share: float = 2 / 3,
                    protocol: str | None = None, layers: list[dict] | None = None) -> list[dict]:
    """When each bucket's all-reduce runs in :func:`predict_step`'s overlapped step (seconds
    from the start of the step, one device's share of the compute, as there): one dict
    per bucket, in the order backward fills them, with ``bytes``, ``ready`` (backward has
    produced its gradients), ``start`` (ready, and the one communication stream free) and
    ``end``; plus ``forward_s`` and ``backward_s`` in every dict.

    ``layers`` None: gradients appear at an even rate in bytes over the backward pass, in
    buckets of ``bucket_bytes`` (:func:`bucket_sizes`).  ``layers`` (forward order, with
    ``grad_bytes`` and ``flops``, e.g. :func:`resnet18_layer_costs`): DDP's buckets of whole
    layers (:func:`layer_buckets`: the first one 1 MiB with DDP's default cap), each ready when
    backward has passed its earliest layer, backward's time spent in proportion to each
    layer's FLOPs."""
    per_device = _shares(compute_s, k)[1]
    forward, backward = per_device * (1 - backward_share), per_device * backward_share
    if layers is None:
        sizes = bucket_sizes(n_bytes, bucket_bytes)
        filled, readies = 0.0, []
        for size in sizes:
            filled += size
            readies.append(forward + backward * filled / n_bytes)
    else:
        total = sum(l["grad_bytes"] for l in layers)
        if not math.isclose(total, n_bytes, rel_tol=1e-9):
            raise ValueError(f"the layers hold {total:.0f} gradient bytes, not {n_bytes:.0f}")
        work = sum(l["flops"] for l in layers)
        done_at, spent = {}, 0.0                     # backward visits the last layer first
        for i in reversed(range(len(layers))):
            spent += layers[i]["flops"]
            done_at[i] = forward + backward * spent / work
        first = DDP_FIRST_BUCKET_BYTES if bucket_bytes == DDP_BUCKET_BYTES else bucket_bytes
        groups = layer_buckets(layers, bucket_bytes, first)
        sizes = [float(sum(layers[i]["grad_bytes"] for i in g)) for g in groups]
        readies = [max(done_at[i] for i in g) for g in groups]
    out, free = [], 0.0                          # when the one communication stream is free
    for size, ready in zip(sizes, readies):
        start = max(ready, free)
        free = start + collective_time("all-reduce", size, k, link, protocol)
        out.append({"bytes": size, "ready": ready, "start": start, "end": free,
                    "forward_s": forward, "backward_s": backward})
    return out


def plot_overlap_timeline(compute_s, n_bytes: float, k: int, link: Link, *,
                          bucket_sizes_bytes=(DDP_BUCKET_BYTES,), title: str = "", ax=None,
                          layers: list[dict] | None = None):
    """One step of :func:`predict_step` drawn as lanes: the compute (forward, backward) and,
    for each bucket size, the all-reduces of its buckets on one communication stream, with
    the time they add beyond the compute marked.  Predictions, labelled as such.  Returns
    the axes."""
    import matplotlib.pyplot as plt
    lanes = len(bucket_sizes_bytes) + 1
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.6 + 0.55 * lanes))
    scale = 1e3                                     # milliseconds
    timelines = [bucket_timeline(compute_s, n_bytes, k, link, bucket_bytes=bb, layers=layers)
                 for bb in bucket_sizes_bytes]
    fwd, bwd = timelines[0][0]["forward_s"], timelines[0][0]["backward_s"]
    y0 = lanes - 1
    ax.broken_barh([(0, fwd * scale)], (y0 - 0.35, 0.7), color="#9ecae1")
    ax.broken_barh([(fwd * scale, bwd * scale)], (y0 - 0.35, 0.7), color="#3182bd")
    ax.text(fwd * scale / 2, y0, "forward", ha="center", va="center", fontsize=8)
    ax.text((fwd + bwd / 2) * scale, y0, "backward", ha="center", va="center", fontsize=8,
            color="white")
    labels = ["compute"]
    end_compute = (fwd + bwd) * scale
    for lane, (bb, tl) in enumerate(zip(bucket_sizes_bytes, timelines)):
        y = lanes - 2 - lane
        ax.broken_barh([(b["start"] * scale, (b["end"] - b["start"]) * scale) for b in tl],
                       (y - 0.35, 0.7), facecolors=["#fd8d3c", "#e6550d"] * len(tl),
                       edgecolor="white", linewidth=0.5)
        exposed = max(0.0, tl[-1]["end"] * scale - end_compute)
        if exposed > 0:
            ax.annotate(f"+{fmt_seconds(exposed / scale)}", (tl[-1]["end"] * scale, y),
                        xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
        labels.append(f"all-reduce, {len(tl)} bucket{'s' if len(tl) > 1 else ''} of "
                      f"{'up to ' if layers and len(tl) > 1 else ''}"
                      f"{min(bb, n_bytes) / 2**20:.3g} MiB")
    ax.axvline(end_compute, color="k", linestyle=":", linewidth=1)
    ax.set_yticks(range(lanes))
    ax.set_yticklabels(labels[::-1], fontsize=8)
    ax.set_xlabel("ms from the start of the step (prediction)")
    ax.set_title(title or f"one step on {k} GPUs over {link.name} (prediction)", fontsize=9)
    ax.set_xlim(0, None)
    return ax


# A GPU given only a few images is mostly idle, and the step time stops shrinking with its share
# of the batch; the predictions do not split a batch finer than this (an assumption).
MIN_PER_GPU_BATCH = 32


def device_limit(global_batch: int, link: Link, min_per_gpu: int = MIN_PER_GPU_BATCH) -> int:
    """The most GPUs a prediction may use: at least ``min_per_gpu`` images each, and no more
    GPUs than the link joins (``link.domain``).  At least 1."""
    if global_batch < 1 or min_per_gpu < 1:
        raise ValueError("need a global batch and a per-GPU batch of at least 1")
    k = global_batch // min_per_gpu
    if link.domain is not None:
        k = min(k, link.domain)
    return max(1, k)


def best_speedup(compute_s, n_bytes: float, link: Link, *, overlap: bool, max_k: int,
                 **kw) -> tuple[int, float]:
    """The largest speed-up the model allows over k = 1..max_k devices, and the k reaching it:
    compute shrinks as 1/k while the all-reduce does not (its latency term even grows).
    ``max_k`` is the caller's bound (see :func:`device_limit`): the model itself would divide
    a batch among more GPUs than it has images, over one link however many GPUs it joins.
    Further keywords go to :func:`predict_step`."""
    best = max(range(1, max_k + 1),
               key=lambda k: predict_step(compute_s, n_bytes, k, link, overlap=overlap,
                                          **kw)["speedup"])
    return best, predict_step(compute_s, n_bytes, best, link, overlap=overlap, **kw)["speedup"]


def critical_batch(step, n_bytes: float, k: int, link: Link) -> float:
    """The per-GPU batch at which one GPU's compute takes as long as the gradient all-reduce on
    k GPUs.  Below it a step without overlap spends more time communicating than computing
    (communication-bound); above it, compute-bound.  0 for k = 1.

    ``step``: a :class:`StepTime` (its measured shape ``T0 + B t``: ``(t_allreduce - T0) / t``,
    and 0 when the fixed part alone outlasts the all-reduce -- such a step is never
    communication-bound, whatever its batch), or seconds per image (linear: ``t_allreduce /
    seconds_per_image``)."""
    c = collective_time("all-reduce", n_bytes, k, link)
    if isinstance(step, StepTime):
        if step.fit is None:
            step = step.seconds / step.batch
        else:
            t0, t = step.fit.t0, step.fit.per_example
            if c <= t0:
                return 0.0
            return (c - t0) / t if t > 0 else math.inf
    if step <= 0:
        raise ValueError("need a positive time per image")
    return c / step


def plot_roofline(steps: dict[str, "StepTime"], n_bytes: float,
                  links: Iterable[Link], *, k: int = NODE_GPUS, global_batch: int = 256,
                  weak_batch: int = MIN_PER_GPU_BATCH, max_k: int = 64,
                  title: str = ""):
    """Two panels made from the measured step times (``steps``: each its time at a batch and,
    where measured, its shape ``T0 + B t``) and the links.  Left: one GPU's compute per step
    against its per-GPU batch (rising curves; a fixed part keeps them from falling below
    ``T0``), the all-reduce of ``n_bytes`` on k GPUs over each link (flat lines), and where they
    cross (:func:`critical_batch`; a step whose fixed part outlasts the all-reduce never does).
    Right: predicted speed-up against k without overlap, strong scaling (``global_batch`` split
    over k, up to :func:`device_limit`) and weak scaling (``weak_batch`` images per GPU, global
    batch growing with k; up to the link's domain or ``max_k``), for the first step time.
    Returns the matplotlib figure."""
    import dataclasses
    import matplotlib.pyplot as plt
    links = list(links)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10.5, 3.8))
    b = np.geomspace(1, 2048, 100)
    for j, (label, s) in enumerate(steps.items()):
        ax.plot(b, [s.at(x) * 1e3 for x in b], "-", color=f"C{j}", lw=1.5,
                label=f"compute, {label}")
    for i, link in enumerate(links):
        c = collective_time("all-reduce", n_bytes, k, link)
        ax.axhline(c * 1e3, color="0.3", ls=(0, (1 + 2 * i, 2)), lw=1,
                   label=f"all-reduce, {k} GPUs, {link.name}")
        for j, s in enumerate(steps.values()):
            bc = critical_batch(s, n_bytes, k, link)
            if 0 < bc < math.inf:
                ax.plot([bc], [c * 1e3], "o", color=f"C{j}", ms=4)
    ax.axvline(global_batch / k, color="lightgray", lw=3, zorder=0,
               label=f"{global_batch} images on {k} GPUs")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("images per GPU")
    ax.set_ylabel("time per step (ms)")
    ax.set_title("left of a dot: communication-bound; right: compute-bound", fontsize=9)
    ax.legend(fontsize=6, loc="upper left")
    first = next(iter(steps.values()))
    whole = dataclasses.replace(first, seconds=first.at(global_batch), batch=global_batch)
    one = first.at(weak_batch)                     # one GPU's step on its weak-scaling share
    for i, link in enumerate(links):
        strong_k = np.arange(1, device_limit(global_batch, link) + 1)
        strong = [predict_step(whole, n_bytes, int(j), link, overlap=False)["speedup"]
                  for j in strong_k]
        weak_k = np.arange(1, (link.domain or max_k) + 1)
        weak = [j * one / (one + (collective_time("all-reduce", n_bytes, int(j), link)
                                  if j > 1 else 0.0)) for j in weak_k]
        ax2.plot(strong_k, strong, "-o", color=f"C{i + 2}", ms=3, lw=1.2,
                 label=f"strong ({global_batch} in all), {link.name}")
        ax2.plot(weak_k, weak, ":", color=f"C{i + 2}", lw=1.5,
                 label=f"weak ({weak_batch} per GPU), {link.name}")
    ks = np.arange(1, max_k + 1)
    ax2.plot(ks, ks, "-", color="lightgray", lw=3, zorder=0, label="ideal (k)")
    from matplotlib.ticker import FuncFormatter
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log", base=2)
    for axis in (ax2.xaxis, ax2.yaxis):
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax2.set_xlabel("GPUs k")
    ax2.set_ylabel("predicted speed-up (throughput)")
    ax2.set_title(f"strong and weak scaling, {next(iter(steps))}", fontsize=9)
    ax2.legend(fontsize=6, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------
# Measured: one GPU's training step, read from the book's benchmark records
# ------------------------------------------------------------------------------------------

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

# The book's first GPU run (benchmarks/h100-2026-11-25/README.md): PyTorch's concise step of
# ResNet-18 width 64 (28x28 images), global batch 256, on one H100.  The records do not say
# which numerics ran; the README does: TF32 allowed (D2LMINI_TF32=1 then; PyTorch's default for
# convolutions, and JAX's GPU default is TF32-like) and exact numerics (TF32 off).
H100_RUN = BENCHMARKS / "h100-2026-11-25"
H100_RESNET18 = {"measured, TF32 on (default)": H100_RUN / "bench-torch-w64-tf32.json",
                 "measured, TF32 off (exact)": H100_RUN / "bench-torch-w64.json"}
H100_MODEL = "ResNet-18, width 64"


class BenchmarkRecordError(ValueError):
    """A benchmark record that cannot be read, or holds no usable measurement."""


@dataclass(frozen=True)
class MeasuredStep:
    """One GPU's measured training step, from a benchmark record (``load_step``)."""
    model: str
    framework: str
    gpu: str
    batch: int              # the global batch the step was measured with
    step_s: float           # median seconds per step
    date: str
    version: str            # the framework's version
    path: str

    @property
    def source(self) -> str:
        return (f"measured: {Path(self.path).parent.name}/{Path(self.path).name}, {self.gpu}, "
                f"{self.framework} {self.version}, {self.date[:10]}")

    def compute_time(self, batch: int) -> float:
        """Seconds for one step of ``batch`` images on this GPU.  **Assumes** the time per image
        measured at ``self.batch`` holds at every batch (linear scaling): optimistic for a batch
        well below the measured one, where the GPU is less busy."""
        if batch < 1:
            raise ValueError(f"need a batch of at least 1 image, got {batch}")
        return self.step_s * batch / self.batch


def load_step(path, *, model: str = H100_MODEL, framework: str = "torch", devices: int = 1,
              impl: str | None = None) -> MeasuredStep:
    """The measured one-GPU step of ``model`` in the benchmark record at ``path`` (a file of
    ``tools/benchmark.py``: ``results`` with ``step_s_median``, ``batch_size``, ``device_kind``;
    ``hardware``, ``versions``, ``date``).  Raises ``FileNotFoundError`` for a missing file and
    :class:`BenchmarkRecordError` for one that is not valid JSON, lacks a field, holds no such
    result, or measured stand-ins instead of a GPU."""
    import json
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"benchmark record {path} not found (the GPU run's records are "
                                f"in {BENCHMARKS}; see its README)")
    try:
        rec = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BenchmarkRecordError(f"benchmark record {path} is not valid JSON: {e}") from None
    try:
        gpus, versions, date = rec["hardware"]["gpus"], rec["versions"], rec["date"]
        found = [r for r in rec["results"]
                 if r["framework"] == framework and r["model"] == model
                 and r["devices"] == devices and (impl is None or r["impl"] == impl)]
    except (KeyError, TypeError) as e:
        raise BenchmarkRecordError(f"benchmark record {path} lacks the field {e}") from None
    if len(found) != 1:
        held = sorted({(r.get("framework"), r.get("model"), r.get("devices"), r.get("impl"))
                       for r in rec["results"] if isinstance(r, dict)})
        raise BenchmarkRecordError(
            f"benchmark record {path}: {len(found)} results for {framework}, {model!r}, "
            f"{devices} device(s){f', {impl}' if impl else ''} (need exactly 1); it holds {held}")
    r = found[0]
    if r.get("device_kind") != "gpu" or not gpus:
        raise BenchmarkRecordError(f"benchmark record {path}: the step ran on "
                                   f"{r.get('device_kind')!r}, not on a GPU")
    try:
        step_s, batch = float(r["step_s_median"]), int(r["batch_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise BenchmarkRecordError(f"benchmark record {path}: no usable step time ({e})") from None
    if not (step_s > 0 and batch > 0 and math.isfinite(step_s)):
        raise BenchmarkRecordError(f"benchmark record {path}: step time {step_s} s at batch "
                                   f"{batch} is not a measurement")
    return MeasuredStep(model, framework, gpus[0], batch, step_s, str(date),
                        str(versions.get(framework, "?")), str(path))


# The second H200 loan (benchmarks/h200-2026-11-27/README.md): the step benchmark timed the
# concise chapter's fast recipe at per-GPU batches 32, 128 and 256 on device arrays
# (tools/step_bench.py -> steps.json), and a probe the same way with CUDA graphs
# (probe-cudagraphs.jsonl).  Each gives the step's shape, T(B) = T0 + B t.
H200_RUN = BENCHMARKS / "h200-2026-11-27"
H200_SHAPES = {      # label: (file, framework, rung or probe variant)
    "measured, H200, PyTorch eager": ("steps.json", "torch", "defaults"),
    "measured, H200, JAX": ("steps.json", "jax", "defaults"),
    "measured, H200, PyTorch, CUDA graphs + bf16": (
        "probe-cudagraphs.jsonl", "torch", "compile reduce-overhead cl+bench fusedSGD bf16"),
}
LINEAR_LABEL = "measured, H100, PyTorch, linear in the batch"


@dataclass(frozen=True)
class StepTime:
    """One GPU's step time at a batch, where it comes from, and -- where it was measured at
    several batches -- its shape ``fit`` (:class:`d2lmini.steptime.StepFit`, ``T0 + B t``)."""
    label: str
    seconds: float          # one GPU's step on ``batch`` images
    source: str
    forward_flops: float    # per image, to turn the time into a rate
    batch: int = 256
    fit: object = None

    @property
    def measured(self) -> bool:
        return self.source.startswith("measured")

    def at(self, batch: float) -> float:
        """One GPU's step on ``batch`` images: the measured shape where there is one, else the
        time per image at ``self.batch`` times ``batch`` (linear, optimistic for small ones)."""
        if batch <= 0:
            raise ValueError(f"need a positive batch, got {batch}")
        return self.fit(batch) if self.fit is not None else self.seconds * batch / self.batch

    @property
    def fixed_s(self) -> float:
        """``T0``: the part of every step that does not shrink with the batch (0 if linear)."""
        return self.fit.t0 if self.fit is not None else 0.0

    def rate(self, batch: int) -> float:
        """The FLOP/s this step time means (forward + backward = 3x the forward FLOPs)."""
        return 3.0 * self.forward_flops * batch / self.at(batch)


def load_step_shape(path, framework: str, rung: str):
    """The fitted ``T0 + B t`` (:class:`d2lmini.steptime.StepFit`) of one framework's step in
    a record of the step benchmark (``steps.json``: its records with the span "step on device
    arrays") or of a probe (``.jsonl``: one line per variant and batch, ``ms``), and a source
    line.  Raises ``FileNotFoundError`` or :class:`BenchmarkRecordError` (fewer than two
    batches, a record off the GPU)."""
    import json
    from .steptime import STEP, fit_step_time
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"step record {path} not found (see {BENCHMARKS}/*/README.md)")
    try:
        if path.suffix == ".jsonl":
            lines = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
            pts = {int(r["batch"]): r["ms"] / 1e3 for r in lines
                   if r.get("fw") == framework and r.get("variant") == rung and "ms" in r}
            version = next((r.get("version") for r in lines if r.get("fw") == framework), "?")
            where, date = "NVIDIA H200", path.parent.name[-10:]
        else:
            rec = json.loads(path.read_text())
            rs = [r for r in rec["records"] if r["framework"] == framework and r["rung"] == rung
                  and r["span"] == STEP]
            if any(not r["on_gpu"] for r in rs):
                raise BenchmarkRecordError(f"step record {path}: {framework} {rung!r} ran off the GPU")
            pts = {int(r["batch"]): r["ms_median"] / 1e3 for r in rs}
            version = rec["versions"].get(framework, "?")
            where, date = rec["hardware"]["gpus"][0], rec["date"][:10]
    except (json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
        raise BenchmarkRecordError(f"step record {path} is not readable ({type(e).__name__}: "
                                   f"{e})") from None
    if len(pts) < 2:
        raise BenchmarkRecordError(f"step record {path}: {framework} {rung!r} measured at "
                                   f"{sorted(pts)} -- a shape needs two batches or more")
    fit = fit_step_time(list(pts), list(pts.values()))
    return fit, (f"measured: {path.parent.name}/{path.name}, {where}, {framework} {version}, "
                 f"{date}, batches {', '.join(map(str, sorted(pts)))} (the line within "
                 f"{fit.max_rel_error:.0%})")


def resnet18_step_times(batch: int) -> dict[str, StepTime]:
    """One GPU's step of the ResNet-18 width 64, at ``batch`` images: the three shapes measured
    on one H200 (``H200_SHAPES``: PyTorch eager first, the primary prediction; JAX; PyTorch's
    fast path), and the H100 record scaled linearly from its one batch, as the chapter predicted
    before the shape was measured (TF32 on, PyTorch's default)."""
    flops = resnet18_flops(width=64)
    out = {}
    for label, (name, framework, rung) in H200_SHAPES.items():
        fit, source = load_step_shape(H200_RUN / name, framework, rung)
        out[label] = StepTime(label, fit(batch), source, flops, batch, fit)
    m = load_step(H100_RESNET18["measured, TF32 on (default)"])
    out[LINEAR_LABEL] = StepTime(LINEAR_LABEL, m.compute_time(batch), m.source, flops, batch)
    return out


def step_table(steps: dict[str, StepTime], batch: int, k: int = NODE_GPUS) -> str:
    """A Markdown table: each one-GPU step at ``batch`` and at ``batch / k``, its fixed part
    ``T0``, the rate at ``batch``, and its source."""
    lines = [f"| one GPU | batch {batch} | batch {batch // k} | fixed part $T_0$ | rate at "
             f"{batch} | from |", "|---|---|---|---|---|---|"]
    for s in steps.values():
        lines.append(f"| {s.label.removeprefix('measured, ')} | {s.at(batch) * 1e3:.2f} ms | "
                     f"{s.at(batch / k) * 1e3:.2f} ms | "
                     f"{f'{s.fixed_s * 1e3:.2f} ms' if s.fit is not None else '0 (assumed)'} | "
                     f"{s.rate(batch) / 1e12:.0f} TFLOP/s | {s.source.removeprefix('measured: ')} |")
    return "\n".join(lines)


def speedup_rows(steps: dict[str, StepTime], n_bytes: float, links: Iterable[Link],
                 k: int, layers: list[dict] | None = None) -> list[dict]:
    """:func:`predict_step` on k GPUs for every step time and link, after backward and
    overlapped (by ``layers``, if given): ``{"step", "link", "after", "overlapped"}``."""
    return [{"step": s.label, "link": link.name,
             "after": predict_step(s, n_bytes, k, link, overlap=False),
             "overlapped": predict_step(s, n_bytes, k, link, overlap=True, layers=layers)}
            for s in steps.values() for link in links]


def speedup_table(rows: list[dict], k: int) -> str:
    """A Markdown table of :func:`speedup_rows`: step per GPU, all-reduce (and the protocol
    NCCL's model picks), what overlap leaves exposed, speed-ups (2 significant figures)."""
    lines = [f"| one-GPU step | link | k={k}: compute per GPU | all-reduce | exposed, overlapped "
             "| speed-up, after backward | speed-up, overlapped |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        a, o = r["after"], r["overlapped"]
        lines.append(f"| {r['step'].removeprefix('measured, ')} | {r['link']} | {fmt_seconds(a['compute_s'])} | "
                     f"{fmt_seconds(a['comm_s'])} ({a['protocol']}) | {fmt_seconds(o['exposed_s'])} | "
                     f"{sig(a['speedup'])}x | {sig(o['speedup'])}x |")
    return "\n".join(lines)


def plot_speedups(steps: dict[str, StepTime], n_bytes: float, links: Iterable[Link],
                  global_batch: int, title: str = "", layers: list[dict] | None = None):
    """Predicted speed-up against k, one panel per link, k up to :func:`device_limit`: one
    colour per step time, solid after backward, thin dotted overlapped, grey the ideal k.
    Returns the matplotlib figure (shown as a PNG)."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    links = list(links)
    fig, axes = plt.subplots(1, len(links), figsize=(3.6 * len(links), 3.4), squeeze=False,
                             sharey=True)
    for ax, link in zip(axes[0], links):
        ks = np.arange(1, device_limit(global_batch, link) + 1)
        ax.plot(ks, ks, "-", color="lightgray", lw=3)
        for j, s in enumerate(steps.values()):
            for overlap, style, lw in ((False, "-o", 1.2), (True, ":", 1.0)):
                sp = [predict_step(s, n_bytes, int(i), link, overlap=overlap,
                                   layers=layers)["speedup"]
                      for i in ks]
                ax.plot(ks, sp, style, color=f"C{j}", lw=lw, ms=3)
        ax.set_xlabel("GPUs k")
        ax.set_title(link.name, fontsize=9)
    axes[0][0].set_ylabel("predicted speed-up")
    handles = ([Line2D([], [], color=f"C{j}", marker="o", ms=3, label=s.label)
                for j, s in enumerate(steps.values())]
               + [Line2D([], [], color="k", label="after backward"),
                  Line2D([], [], color="k", ls=":", label="overlapped"),
                  Line2D([], [], color="lightgray", lw=3, label="ideal (k)")])
    axes[0][0].legend(handles=handles, fontsize=6.5, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def hidden_fraction(t_overlapped: float, t_after: float, t_compute: float) -> float:
    """How much of the communication hides behind computation: the time saved by overlapping,
    over the communication time that all-reduce-after-backward exposes (clipped to [0, 1]).
    A formula on three times; :func:`overlap_verdict` says whether the measurement shows one."""
    exposed = t_after - t_compute
    if exposed <= 0:
        return 0.0
    return float(min(1.0, max(0.0, (t_after - t_overlapped) / exposed)))


def clearly_greater(a: Iterable[float], b: Iterable[float]) -> bool:
    """Whether the repeats ``a`` are slower than ``b`` beyond their spread: the lower quartile
    of ``a`` above the upper quartile of ``b`` (their interquartile ranges do not overlap)."""
    a, b = list(a), list(b)
    return float(np.percentile(a, 25)) > float(np.percentile(b, 75))


def overlap_verdict(overlapped: Iterable[float], after: Iterable[float],
                    compute: Iterable[float], *, can_overlap: bool = True
                    ) -> tuple[float | None, str]:
    """What repeated step times show about overlap: ``(hidden share or None, verdict)``.

    An effect counts only when it exceeds the measured spread (:func:`clearly_greater`):
    all-reduce after backward must be clearly slower than compute alone (else nothing to hide
    was measured), and a variant clearly faster than after-backward hides
    :func:`hidden_fraction` of it (all of it when it is not clearly slower than compute
    alone).  A variant that cannot overlap by construction (``can_overlap=False``: one bucket
    whose all-reduce starts after backward) is a control: a difference there is a difference
    of code paths, not hidden communication.  Otherwise: "within noise"."""
    o, a, c = list(overlapped), list(after), list(compute)
    med = statistics.median
    if clearly_greater(c, o):
        return None, "faster than compute alone beyond the spread: a different code path, not overlap"
    if clearly_greater(o, a):
        return 0.0, "slower than all-reduce after backward, beyond the spread"
    if not clearly_greater(a, c):
        return None, "within noise (after backward is not measurably slower than compute alone)"
    if not clearly_greater(a, o):
        return 0.0, "hides nothing measurable (within noise of after backward)"
    if not can_overlap:
        return None, "faster than after backward, but cannot overlap: a code-path difference"
    if not clearly_greater(o, c):
        return 1.0, "hides all of it (within noise of compute alone)"
    return hidden_fraction(med(o), med(a), med(c)), \
        f"hides about {sig(100 * hidden_fraction(med(o), med(a), med(c)), 1)}% of it"


def overlap_report(times: dict[str, list[float]], compute: str, after: str,
                   overlapped: dict[str, bool]) -> list[str]:
    """One line per variant: median and interquartile range of its repeats (ms, 2 significant
    figures) and, for each variant in ``overlapped`` (name -> whether it can overlap),
    :func:`overlap_verdict` against ``after`` and ``compute``."""
    width = max(len(n) for n in times)
    lines = []
    for name, t in times.items():
        q = np.percentile(t, [25, 75])
        line = (f"  {name:<{width}}  {sig(statistics.median(t) * 1e3):>6} ms "
                f"[{sig(q[0] * 1e3)}-{sig(q[1] * 1e3)}]")
        if name in overlapped:
            line += "  " + overlap_verdict(t, times[after], times[compute],
                                           can_overlap=overlapped[name])[1]
        lines.append(line)
    return lines


# ------------------------------------------------------------------------------------------
# Results file and the printed summary
# ------------------------------------------------------------------------------------------

def _fit_dict(f: Fit) -> dict:
    return {"scheme": f.scheme, "alpha": f.alpha, "beta": f.beta,
            "median_rel_error": f.median_rel_error, "max_rel_error": f.max_rel_error,
            "points": f.points}


def record(path, *, framework: str, api: str, devices: int, profile: str,
           fits: dict[str, Fit], rows: dict[str, list[dict]],
           per_k: dict[str, dict[int, Fit]] | None = None, **extra) -> dict | None:
    """Record a framework's sweep and fits in the chapter's results file (with hardware and
    versions, via :func:`d2lmini.results.record_result`); nothing under the smoke profile.
    ``fits``: one fit over all device counts per measurement; ``per_k``: the fits per device
    count (:func:`fit_per_k`), stored as ``fits_per_k[name][str(k)]``."""
    if profile == "smoke":
        return None
    from .results import record_result
    if per_k is not None:
        extra["fits_per_k"] = {name: {str(k): _fit_dict(f) for k, f in fk.items()}
                               for name, fk in per_k.items()}
    return record_result(
        path, chapter="comm", framework=framework, api=api, devices=devices, profile=profile,
        batch_size=0, fits={name: _fit_dict(f) for name, f in fits.items()}, rows=rows, **extra)


def report(name: str, f: Fit) -> str:
    """One line: the fitted alpha and beta, the bandwidth and the fit error, each to two
    significant figures (the fits are not more precise than that)."""
    return (f"{name:<28} alpha {fmt_seconds(f.alpha):>7}, beta {sig(f.beta * 1e9):>5} ns/B "
            f"({sig(f.bandwidth / 1e9)} GB/s); fit error: median {sig(100 * f.median_rel_error)}%, "
            f"max {sig(100 * f.max_rel_error)}% ({f.points} points)")


def table(rows: list[dict]) -> str:
    """A Markdown table of sweep rows: k, size, median and spread in microseconds."""
    lines = ["| k | bytes | median (us) | p25-p75 (us) | min-max (us) |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['k']} | {r['bytes']:,} | {r['median'] * 1e6:,.0f} | "
                     f"{r['p25'] * 1e6:,.0f}-{r['p75'] * 1e6:,.0f} | "
                     f"{r['min'] * 1e6:,.0f}-{r['max'] * 1e6:,.0f} |")
    return "\n".join(lines)


def plot_fits(measured: dict[str, list[dict]], fits: dict[str, Fit | dict[int, Fit]],
              title: str = ""):
    """All-reduce time against message size, log-log, one panel per measurement: the measured
    medians (points, with the p25-p75 spread), the fitted model (lines; a ``Fit`` for all k, or
    ``{k: Fit}`` per device count, e.g. :func:`fit_per_k`), and the two regimes: a diamond on
    each line at n_1/2 (:func:`regime_size`), latency-bound to its left, bandwidth-bound to its
    right.  Returns the matplotlib figure (shown as a PNG)."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    names = list(measured)
    fig, axes = plt.subplots(1, len(names), figsize=(3.7 * len(names), 3.4), squeeze=False,
                             sharey=True)
    for ax, name in zip(axes[0], names):
        rows, fk = measured[name], fits[name]
        halves = []
        for j, k in enumerate(sorted({r["k"] for r in rows})):
            f = fk[k] if isinstance(fk, dict) else fk
            rk = [r for r in rows if r["k"] == k]
            n = np.array([r["bytes"] for r in rk], dtype=float)
            med = np.array([r["median"] for r in rk])
            err = [med - [r["p25"] for r in rk], [r["p75"] for r in rk] - med]
            ax.errorbar(n, med, yerr=err, fmt="o", ms=3, color=f"C{j}", label=f"k = {k}")
            grid = np.geomspace(n.min(), n.max(), 60)
            ax.plot(grid, f.predict(grid, k), "-", color=f"C{j}", lw=1)
            half = regime_size(f.scheme, k, f.alpha, f.beta)
            if half is not None and n.min() <= half <= n.max():
                ax.plot([half], [float(f.predict(half, k))], "D", mfc="white", mec=f"C{j}",
                        ms=6, mew=1.5)
                halves.append(half)
        ax.set_xscale("log")
        ax.set_yscale("log")
        lowest = min(min(r["median"], r["p25"]) for r in rows)
        if lowest > 0:                     # room below the points for the regime labels
            ax.set_ylim(bottom=min(ax.get_ylim()[0], lowest / 6))
        if halves:                         # shade the latency-bound side of the median n_1/2
            lo, hi = ax.get_xlim()
            mid = float(np.median(halves))
            f = math.log(mid / lo) / math.log(hi / lo)
            ax.axvspan(lo, mid, color="0.5", alpha=0.07, lw=0)
            ax.set_xlim(lo, hi)
            ax.text(f / 2, 0.03, "latency-bound", transform=ax.transAxes, ha="center",
                    fontsize=7, color="0.3")
            right = (1 + f) / 2 if 1 - f > 0.3 else 0.99
            ax.text(right, 0.03, "bandwidth-bound", transform=ax.transAxes,
                    ha="center" if 1 - f > 0.3 else "right", fontsize=7, color="0.3")
        ax.set_xlabel("message size (bytes)")
        ax.set_title(f"{name} ({(fk[min(fk)] if isinstance(fk, dict) else fk).scheme} model)",
                     fontsize=9)
    axes[0][0].set_ylabel("all-reduce time (s)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles.append(Line2D([], [], marker="D", ls="", mfc="white", mec="k", ms=5))
    labels.append("n1/2: latency term = bandwidth term")
    axes[0][0].legend(handles, labels, fontsize=6.5, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------
# What a launched rank of the chapter's worker scripts does (torch and Paddle alike)
# ------------------------------------------------------------------------------------------

def add_worker_arguments(parser) -> None:
    """The command line every launched all-reduce worker shares (``*_allreduce.py``)."""
    parser.add_argument("--out", required=True, help="directory for rank 0's result.json")
    parser.add_argument("--sizes", default="", help="comma-separated message sizes in bytes")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--overlap", action="store_true", help="also time training steps")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)


def rank_sweep(args, *, rank: int, k: int, time_allreduce, check_sum, slowest, barrier,
               overlap=None) -> dict:
    """One launched rank's work: check one all-reduce, :func:`sweep` ``time_allreduce(n)``
    over ``args.sizes`` (a ``barrier`` before each call, the ``slowest`` rank's time of each
    repeat), optionally ``overlap(batch, width, steps)``; rank 0 writes
    ``args.out/result.json``.  Returns the result."""
    import json
    from pathlib import Path
    sizes = [int(s) for s in args.sizes.split(",") if s]
    result = {"k": k, "sum_ok": check_sum()}
    result["rows"] = sweep(lambda j, n: time_allreduce(n), [k], sizes, warmup=args.warmup,
                           repeats=args.repeats, before=barrier, combine=slowest)
    if args.overlap and overlap is not None:
        result["overlap"] = overlap(args.batch, args.width, args.steps)
    if rank == 0:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "result.json").write_text(json.dumps(result))
    barrier()
    return result

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
           "algorithm_bandwidth", "bus_bandwidth", "summarize", "time_call", "message_sizes",
           "device_counts", "sweep", "fit_rows", "regime_size", "Link", "LINKS", "Gpu", "GPUS",
           "LENET_SHAPES", "gradient_bytes", "lenet_flops", "resnet18_flops", "compute_time",
           "predict_step", "best_speedup", "hidden_fraction", "record", "report", "plot_fits",
           "ASSUMED_UTILIZATION", "table"]

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
    """:func:`fit` on the medians of :func:`sweep`'s rows."""
    return fit([(r["k"], r["bytes"], r["median"]) for r in rows], scheme)


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

@dataclass(frozen=True)
class Link:
    """A link between GPUs: bandwidth per direction per GPU (bytes/s) from its source, and
    the per-message latency the predictions assume."""
    name: str
    bandwidth: float
    source: str
    latency: float
    latency_source: str

    @property
    def beta(self) -> float:
        return 1.0 / self.bandwidth


def _pcie_x16(gigatransfers: float) -> float:
    """Bytes/s per direction of a PCIe x16 link with 128b/130b encoding (PCIe 3.0 and later)."""
    return gigatransfers * 1e9 * 16 * 128 / 130 / 8


# Latency is not a datasheet figure: one step of NCCL's ring costs a few microseconds of
# kernel launch and synchronisation.  The predictions assume this value and say so.
ASSUMED_LATENCY = 5e-6
_LAT = "assumption: about 5 us per ring step (NCCL kernel launch and flag synchronisation)"
_LAT_IB = ("assumption: about 5 us per ring step; the adapter's own latency is below 1 us "
           "(NVIDIA ConnectX-6/-7 product briefs), the software step dominates")

LINKS: dict[str, Link] = {
    "NVLink 4 (H100 SXM)": Link(
        "NVLink 4 (H100 SXM)", 900e9 / 2,
        "NVIDIA H100 Tensor Core GPU datasheet: NVLink 900 GB/s per GPU (both directions)",
        ASSUMED_LATENCY, _LAT),
    "NVLink 3 (A100 SXM)": Link(
        "NVLink 3 (A100 SXM)", 600e9 / 2,
        "NVIDIA A100 Tensor Core GPU datasheet: NVLink 600 GB/s per GPU (both directions)",
        ASSUMED_LATENCY, _LAT),
    "PCIe 5.0 x16": Link(
        "PCIe 5.0 x16", _pcie_x16(32),
        "PCI-SIG, PCI Express Base Specification 5.0: 32 GT/s per lane, 128b/130b encoding",
        ASSUMED_LATENCY, _LAT),
    "PCIe 4.0 x16": Link(
        "PCIe 4.0 x16", _pcie_x16(16),
        "PCI-SIG, PCI Express Base Specification 4.0: 16 GT/s per lane, 128b/130b encoding",
        ASSUMED_LATENCY, _LAT),
    "InfiniBand NDR": Link(
        "InfiniBand NDR", 400e9 / 8,
        "NVIDIA ConnectX-7 product brief: 400 Gb/s NDR InfiniBand per port",
        ASSUMED_LATENCY, _LAT_IB),
    "InfiniBand HDR": Link(
        "InfiniBand HDR", 200e9 / 8,
        "NVIDIA ConnectX-6 product brief: 200 Gb/s HDR InfiniBand per port",
        ASSUMED_LATENCY, _LAT_IB),
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


# Small convolutional models reach a fraction of a GPU's peak FP32 rate; the predictions
# assume this fraction (an assumption, not a datasheet figure, and stated wherever used).
ASSUMED_UTILIZATION = 0.4


def compute_time(forward_flops: float, batch: int, gpu: Gpu, utilization: float) -> float:
    """Seconds for one training step (forward + backward = 3x the forward FLOPs) of ``batch``
    images on ``gpu`` running at ``utilization`` of its peak FP32 rate."""
    return 3.0 * forward_flops * batch / (gpu.fp32_flops * utilization)


def predict_step(compute_s: float, n_bytes: float, k: int, link: Link, *,
                 overlap: bool, scheme: str = "ring", backward_share: float = 2 / 3) -> dict:
    """The model's prediction for one step of data-parallel training with a fixed global batch.

    One device computes the step in ``compute_s``; k devices compute ``compute_s / k`` each
    and all-reduce ``n_bytes`` of gradients with the link's alpha and beta.  Without overlap
    the all-reduce follows the backward pass; with overlap it can hide behind the backward
    pass (``backward_share`` of the compute), never behind the forward pass.
    Returns ``{"compute_s", "comm_s", "step_s", "speedup"}`` (speed-up over one device).
    """
    per_device = compute_s / k
    comm = float(model_time(scheme, n_bytes, k, link.latency, link.beta))
    if overlap:
        step = per_device * (1 - backward_share) + max(per_device * backward_share, comm)
    else:
        step = per_device + comm
    return {"compute_s": per_device, "comm_s": comm, "step_s": step,
            "speedup": compute_s / step}


def best_speedup(compute_s: float, n_bytes: float, link: Link, *, overlap: bool,
                 scheme: str = "ring", max_k: int = 1024) -> tuple[int, float]:
    """The largest speed-up the model allows over k = 1..max_k devices, and the k reaching it:
    compute shrinks as 1/k while the all-reduce does not (its latency term even grows)."""
    best = max(range(1, max_k + 1),
               key=lambda k: predict_step(compute_s, n_bytes, k, link, overlap=overlap,
                                          scheme=scheme)["speedup"])
    return best, predict_step(compute_s, n_bytes, best, link, overlap=overlap,
                              scheme=scheme)["speedup"]


def hidden_fraction(t_overlapped: float, t_after: float, t_compute: float) -> float:
    """How much of the communication hides behind computation: the time saved by overlapping,
    over the communication time that all-reduce-after-backward exposes (clipped to [0, 1])."""
    exposed = t_after - t_compute
    if exposed <= 0:
        return 0.0
    return float(min(1.0, max(0.0, (t_after - t_overlapped) / exposed)))


# ------------------------------------------------------------------------------------------
# Results file and the printed summary
# ------------------------------------------------------------------------------------------

def record(path, *, framework: str, api: str, devices: int, profile: str,
           fits: dict[str, Fit], rows: dict[str, list[dict]], **extra) -> dict | None:
    """Record a framework's sweep and fits in the chapter's results file (with hardware and
    versions, via :func:`d2lmini.results.record_result`); nothing under the smoke profile."""
    if profile == "smoke":
        return None
    from .results import record_result
    return record_result(
        path, chapter="comm", framework=framework, api=api, devices=devices, profile=profile,
        batch_size=0,
        fits={name: {"scheme": f.scheme, "alpha": f.alpha, "beta": f.beta,
                     "median_rel_error": f.median_rel_error, "max_rel_error": f.max_rel_error,
                     "points": f.points} for name, f in fits.items()},
        rows=rows, **extra)


def report(name: str, f: Fit) -> str:
    """One line: the fitted alpha and beta, the bandwidth and the fit error."""
    return (f"{name:<28} alpha = {f.alpha * 1e6:8.2f} us   beta = {f.beta * 1e9:7.4f} ns/B "
            f"({f.bandwidth / 1e9:6.2f} GB/s)   fit error: median {f.median_rel_error:5.1%}, "
            f"max {f.max_rel_error:6.1%} ({f.points} points)")


def table(rows: list[dict]) -> str:
    """A Markdown table of sweep rows: k, size, median and spread in microseconds."""
    lines = ["| k | bytes | median (us) | p25-p75 (us) | min-max (us) |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['k']} | {r['bytes']:,} | {r['median'] * 1e6:.1f} | "
                     f"{r['p25'] * 1e6:.1f}-{r['p75'] * 1e6:.1f} | "
                     f"{r['min'] * 1e6:.1f}-{r['max'] * 1e6:.1f} |")
    return "\n".join(lines)


def plot_fits(measured: dict[str, list[dict]], fits: dict[str, Fit], title: str = ""):
    """Measured medians (points, with the p25-p75 spread) and the fitted model (lines), one
    panel per measurement, log-log; returns the matplotlib figure (shown as a PNG)."""
    import matplotlib.pyplot as plt
    names = list(measured)
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.2), squeeze=False,
                             sharey=True)
    for ax, name in zip(axes[0], names):
        rows, f = measured[name], fits[name]
        for j, k in enumerate(sorted({r["k"] for r in rows})):
            rk = [r for r in rows if r["k"] == k]
            n = np.array([r["bytes"] for r in rk], dtype=float)
            med = np.array([r["median"] for r in rk])
            err = [med - [r["p25"] for r in rk], [r["p75"] for r in rk] - med]
            ax.errorbar(n, med, yerr=err, fmt="o", ms=3, color=f"C{j}", label=f"k = {k}")
            grid = np.geomspace(n.min(), n.max(), 50)
            ax.plot(grid, f.predict(grid, k), "-", color=f"C{j}", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_title(f"{name} ({f.scheme} model)", fontsize=9)
    axes[0][0].set_ylabel("all-reduce time (s)")
    axes[0][0].legend(fontsize=7)
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

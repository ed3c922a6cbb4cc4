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

For GPUs, ``predict_step`` combines the model with published link figures (``LINKS``) and one
GPU's step time measured on an H100 (``load_step`` reads the benchmark record,
``resnet18_step_times`` gives TF32 on, TF32 off and the earlier FLOP-based assumption).
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
           "algorithm_bandwidth", "bus_bandwidth", "summarize", "time_call", "message_sizes",
           "device_counts", "sweep", "fit_rows", "regime_size", "Link", "LINKS", "Gpu", "GPUS",
           "LENET_SHAPES", "gradient_bytes", "lenet_flops", "resnet18_flops", "compute_time",
           "predict_step", "best_speedup", "hidden_fraction", "record", "report", "plot_fits",
           "ASSUMED_UTILIZATION", "table", "NODE_GPUS", "MIN_PER_GPU_BATCH", "device_limit",
           "BENCHMARKS", "H100_RUN", "H100_RESNET18", "H100_MODEL", "BenchmarkRecordError",
           "MeasuredStep", "load_step", "StepTime", "resnet18_step_times", "step_table",
           "speedup_rows", "speedup_table", "plot_speedups"]

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
    domain: int | None = None       # the most GPUs one such link joins (None: no such limit)

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

# NVLink joins the GPUs of one server (an HGX board: 8 SXM GPUs on NVSwitch), and so does
# PCIe; beyond 8 GPUs the ring crosses the network.
NODE_GPUS = 8

LINKS: dict[str, Link] = {
    "NVLink 4 (H100 SXM)": Link(
        "NVLink 4 (H100 SXM)", 900e9 / 2,
        "NVIDIA H100 Tensor Core GPU datasheet: NVLink 900 GB/s per GPU (both directions)",
        ASSUMED_LATENCY, _LAT, NODE_GPUS),
    "NVLink 3 (A100 SXM)": Link(
        "NVLink 3 (A100 SXM)", 600e9 / 2,
        "NVIDIA A100 Tensor Core GPU datasheet: NVLink 600 GB/s per GPU (both directions)",
        ASSUMED_LATENCY, _LAT, NODE_GPUS),
    "PCIe 5.0 x16": Link(
        "PCIe 5.0 x16", _pcie_x16(32),
        "PCI-SIG, PCI Express Base Specification 5.0: 32 GT/s per lane, 128b/130b encoding",
        ASSUMED_LATENCY, _LAT, NODE_GPUS),
    "PCIe 4.0 x16": Link(
        "PCIe 4.0 x16", _pcie_x16(16),
        "PCI-SIG, PCI Express Base Specification 4.0: 16 GT/s per lane, 128b/130b encoding",
        ASSUMED_LATENCY, _LAT, NODE_GPUS),
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


# Small convolutional models reach a fraction of a GPU's peak FP32 rate.  This fraction was the
# chapter's assumption before a GPU measured the step (an assumption, not a datasheet figure);
# the predictions now use the measured step (MeasuredStep) and show this one for comparison.
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


def best_speedup(compute_s: float, n_bytes: float, link: Link, *, overlap: bool, max_k: int,
                 scheme: str = "ring") -> tuple[int, float]:
    """The largest speed-up the model allows over k = 1..max_k devices, and the k reaching it:
    compute shrinks as 1/k while the all-reduce does not (its latency term even grows).
    ``max_k`` is the caller's bound (see :func:`device_limit`): the model itself would divide
    a batch among more GPUs than it has images, over one link however many GPUs it joins."""
    best = max(range(1, max_k + 1),
               key=lambda k: predict_step(compute_s, n_bytes, k, link, overlap=overlap,
                                          scheme=scheme)["speedup"])
    return best, predict_step(compute_s, n_bytes, best, link, overlap=overlap,
                              scheme=scheme)["speedup"]


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


@dataclass(frozen=True)
class StepTime:
    """One GPU's step time at a batch, and where it comes from (measured or assumed)."""
    label: str
    seconds: float
    source: str
    forward_flops: float    # per image, to turn the time into a rate

    @property
    def measured(self) -> bool:
        return self.label.startswith("measured")

    def rate(self, batch: int) -> float:
        """The FLOP/s this step time means (forward + backward = 3x the forward FLOPs)."""
        return 3.0 * self.forward_flops * batch / self.seconds


def resnet18_step_times(batch: int, gpu: Gpu = GPUS["H100 SXM"]) -> dict[str, StepTime]:
    """One GPU's step of the ResNet-18 width 64 at ``batch``: measured on one H100 with TF32 on
    (the frameworks' GPU default: first, the primary prediction) and off, both scaled linearly
    from the measured batch (:meth:`MeasuredStep.compute_time`), and the FLOP-based assumption
    the chapter used before the measurement."""
    flops = resnet18_flops(width=64)
    out = {}
    for label, path in H100_RESNET18.items():
        m = load_step(path)
        out[label] = StepTime(label, m.compute_time(batch), m.source, flops)
    label = "assumed before the measurement"
    out[label] = StepTime(label, compute_time(flops, batch, gpu, ASSUMED_UTILIZATION),
                          f"assumed: {ASSUMED_UTILIZATION:.0%} of the {gpu.name}'s "
                          f"{gpu.fp32_flops / 1e12:g} TFLOPS FP32 ({gpu.source.split(':')[0]})",
                          flops)
    return out


def step_table(steps: dict[str, StepTime], batch: int) -> str:
    """A Markdown table: each one-GPU step time, the rate it means, and its source."""
    lines = [f"| one GPU, batch {batch} | step | rate ({3 * next(iter(steps.values())).forward_flops / 1e9:.2f} "
             "GFLOP per image) | from |", "|---|---|---|---|"]
    for s in steps.values():
        lines.append(f"| {s.label} | {s.seconds * 1e3:.1f} ms | {s.rate(batch) / 1e12:.1f} TFLOP/s "
                     f"| {s.source} |")
    return "\n".join(lines)


def speedup_rows(steps: dict[str, StepTime], n_bytes: float, links: Iterable[Link],
                 k: int) -> list[dict]:
    """:func:`predict_step` on k GPUs for every step time and link, after backward and
    overlapped: ``{"step", "link", "after", "overlapped"}`` (the predictions' dicts)."""
    return [{"step": s.label, "link": link.name,
             "after": predict_step(s.seconds, n_bytes, k, link, overlap=False),
             "overlapped": predict_step(s.seconds, n_bytes, k, link, overlap=True)}
            for s in steps.values() for link in links]


def speedup_table(rows: list[dict], k: int) -> str:
    """A Markdown table of :func:`speedup_rows`: step per GPU, all-reduce, speed-ups."""
    lines = [f"| one-GPU step | link | k={k}: compute per GPU | all-reduce | speed-up, after "
             "backward | speed-up, overlapped |", "|---|---|---|---|---|---|"]
    for r in rows:
        a, o = r["after"], r["overlapped"]
        lines.append(f"| {r['step']} | {r['link']} | {a['compute_s'] * 1e3:.2f} ms | "
                     f"{a['comm_s'] * 1e3:.2f} ms | {a['speedup']:.1f}x | {o['speedup']:.1f}x |")
    return "\n".join(lines)


def plot_speedups(steps: dict[str, StepTime], n_bytes: float, links: Iterable[Link],
                  global_batch: int, title: str = ""):
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
                sp = [predict_step(s.seconds, n_bytes, int(i), link, overlap=overlap)["speedup"]
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

"""What makes a benchmark record believable -- framework-neutral, used by ``tools/benchmark.py``.

A time per step is only a result if (1) it says where the work ran and (2) the work could have
been done in that time there.  The book's first GPU run showed both failing at once: JAX's
ResNet-18 step was recorded as 1.7 ms on "gpu", i.e. 350 TFLOP/s on a card whose float32 matrix
product peaks at 51.6 (414.6 with TF32); its arrays lived on the CPU and the clock was read
before the work was done.  So every record carries:

* ``arrays_on`` -- one device name per replica (or rank), read from the arrays after the timed
  steps, in the framework's own spelling (``cuda:0``, ``gpu:0``, ``cpu(1)``, ``Place(cpu)``), and
  ``device_kind`` derived from it by :func:`device_kind`, never from the list of devices the
  benchmark asked for (which is kept as ``devices_requested`` and compared with
  :func:`placement_mismatch`);
* ``flops_per_step`` (with ``flops_source``), ``peak_flops`` (a float32 matrix product timed on
  the same devices in the same run, with the framework's default precision) and the rates
  :func:`rate_fields` derives; :func:`check_rate` refuses a record whose fastest repeat implies
  more than the peak (:class:`ImpossibleRate`).

The analytic counts (:func:`lenet_train_flops`, :func:`resnet18_train_flops`) count what
``torch.utils.flop_counter.FlopCounterMode`` counts for one training step -- convolutions and
dense layers, 2 FLOP per multiply-add, forward, gradient of the weights and gradient of the
input (none for the first layer, whose input needs no gradient) -- so that MXNet and Paddle,
which have no FLOP counter, are checked with the same number PyTorch counts for the same
architecture (``tests/test_benchmark.py`` compares them).  On the CPU the ceiling is the
faster of the framework's matrix product and NumPy's (:func:`cpu_ceiling`).  Nothing here
imports a deep-learning framework.
"""
from __future__ import annotations

import math
import re
import time
from collections import Counter
from typing import Callable, Sequence

__all__ = ["ImpossibleRate", "parse_device", "device_kind", "placement_mismatch",
           "conv_out", "lenet_train_flops", "resnet18_train_flops", "best_rate",
           "numpy_matmul_rate", "cpu_ceiling",
           "rate_fields", "check_rate", "rate_status", "RATE_FIELDS", "PRE_CHECK"]

#: The fields :func:`rate_fields` adds to a record (and that older records lack).
RATE_FIELDS = ("flops_per_step", "peak_flops", "achieved_flops", "achieved_flops_best")
#: How a record without them is labelled: it was written before the benchmark checked rates.
PRE_CHECK = "recorded before the rate check"


class ImpossibleRate(ValueError):
    """A step time that implies more FLOP/s than the devices' measured peak."""


# ------------------------------------------------------------------ where the arrays live
def parse_device(name: str) -> tuple[str, int | None]:
    """``("gpu", i)`` or ``("cpu", i)`` for a device name in any framework's spelling:
    PyTorch ``cuda:0`` / ``cpu``, JAX ``gpu:0`` / ``cpu:1``, MXNet ``gpu(0)`` / ``cpu(1)``, Paddle
    ``Place(gpu:0)`` / ``Place(cpu)``.  The index is None when the name has none."""
    n = str(name).strip().lower()
    if "cuda" in n or "gpu" in n:
        kind = "gpu"
    elif "cpu" in n:
        kind = "cpu"
    else:
        raise ValueError(f"not a CPU or GPU device name: {name!r}")
    m = re.search(r"(\d+)\D*$", n)
    return kind, int(m.group(1)) if m else None


def device_kind(arrays_on: Sequence[str], host_gpus: int = 0) -> str:
    """What the replicas' devices were, from ``arrays_on`` (one name per replica or rank):

    ``gpu``            one distinct GPU per replica;
    ``gpu-stand-ins``  GPUs, some holding several replicas (fewer GPUs than replicas);
    ``cpu``            one replica, on the CPU;
    ``simulated-cpu``  several replicas on the CPU of a machine without GPUs;
    ``cpu-stand-ins``  several replicas on the CPU of a machine that has ``host_gpus`` GPUs
                       (JAX's mesh cannot repeat a GPU; MXNet has no kernels for Hopper);
    ``mixed``          replicas on GPUs and on the CPU, or one replica spread over several
                       devices (a name joined with ``+``).
    """
    if not arrays_on:
        raise ValueError("arrays_on is empty: no replica was found")
    if any("+" in str(n) for n in arrays_on):
        return "mixed"
    parsed = [parse_device(n) for n in arrays_on]
    kinds = {k for k, _ in parsed}
    if kinds == {"gpu"}:
        return "gpu" if len(set(parsed)) == len(parsed) else "gpu-stand-ins"
    if kinds == {"cpu"}:
        if len(parsed) == 1:
            return "cpu"
        return "cpu-stand-ins" if host_gpus else "simulated-cpu"
    return "mixed"


def placement_mismatch(requested: Sequence[str], arrays_on: Sequence[str]) -> str | None:
    """None when the replicas live on the devices the benchmark asked for (as a multiset, in
    any spelling), else a sentence saying where they are instead."""
    def norm(names):
        out = []
        for n in names:
            kind, i = parse_device(n) if "+" not in str(n) else ("mixed", str(n))
            out.append((kind, 0 if kind == "cpu" and i is None else i))
        return Counter(out)
    if norm(requested) == norm(arrays_on):
        return None
    return (f"the arrays lived on {list(arrays_on)}, not on the requested {list(requested)}: "
            f"the timed code did not run where the benchmark put it")


# ------------------------------------------------------------------ FLOP per training step
def conv_out(size: int, kernel: int, stride: int = 1, pad: int = 0) -> int:
    """Spatial size after a convolution."""
    return (size + 2 * pad - kernel) // stride + 1


def _train(layers: list[tuple[int, bool]]) -> int:
    """Training FLOP from ``(forward FLOP, input needs a gradient)`` per layer: forward, the
    weights' gradient, and the input's gradient where it is needed."""
    return sum(f * (3 if needs_input_grad else 2) for f, needs_input_grad in layers)


def lenet_train_flops(batch: int, size: int = 28) -> int:
    """FLOP of one training step of the from-scratch chapter's LeNet on ``batch`` images
    (``d2lmini.models.LENET_SHAPES``: 3x3 conv to 20 channels, 2x2 average pooling, 5x5 conv to
    50, pooling, dense 800 -> 128 -> 10).  Pooling, activations, the loss and the update are
    not counted (as in torch's FlopCounterMode)."""
    h1 = conv_out(size, 3)                       # 26
    p1 = h1 // 2                                 # 13
    h2 = conv_out(p1, 5)                         # 9
    p2 = h2 // 2                                 # 4
    if 50 * p2 * p2 != 800:
        raise ValueError(f"LeNet needs 28x28 inputs (got {size})")
    return _train([(2 * batch * 20 * h1 * h1 * 1 * 9, False),
                   (2 * batch * 50 * h2 * h2 * 20 * 25, True),
                   (2 * batch * 800 * 128, True),
                   (2 * batch * 128 * 10, True)])


def resnet18_train_flops(batch: int, width: int, in_channels: int = 1,
                         num_classes: int = 10, size: int = 28) -> int:
    """FLOP of one training step of the book's ResNet-18 variant (``d2lmini.models.
    resnet18_spec``: 3x3 stem, no max-pooling, stages of width, 2, 4, 8 x width channels, the
    first block of stages 2-4 with stride 2 and a 1x1 shortcut) on ``batch`` images."""
    w, layers = width, []

    def conv(cin, cout, k, hw_out, first=False):
        layers.append((2 * batch * cout * hw_out * hw_out * cin * k * k, not first))

    conv(in_channels, w, 3, size, first=True)                 # stem, padding 1
    cin, hw = w, size
    for s, c in enumerate((w, 2 * w, 4 * w, 8 * w)):
        stride = 1 if s == 0 else 2
        out = conv_out(hw, 3, stride, 1)
        conv(cin, c, 3, out)                                  # block 0: conv1
        conv(c, c, 3, out)                                    #          conv2
        if s > 0:
            conv(cin, c, 1, conv_out(hw, 1, stride))          #          1x1 shortcut
        conv(c, c, 3, out)                                    # block 1: conv1
        conv(c, c, 3, out)                                    #          conv2
        cin, hw = c, out
    layers.append((2 * batch * 8 * w * num_classes, True))    # dense, after global pooling
    return _train(layers)


# ------------------------------------------------------------------ the ceiling
def best_rate(run: Callable[[], None], flops_per_call: float, *, calls: int = 1,
              windows: int = 5, warmup: int = 1,
              clock: Callable[[], float] = time.perf_counter) -> float:
    """FLOP/s of the fastest of ``windows`` timed windows of ``calls`` calls of ``run``, after
    ``warmup`` untimed calls.  ``run`` must return only when its work is done (it blocks on
    its result): the number is the ceiling a training step is checked against."""
    for _ in range(warmup):
        run()
    best = math.inf
    for _ in range(windows):
        t0 = clock()
        for _ in range(calls):
            run()
        best = min(best, (clock() - t0) / calls)
    if not best > 0:
        raise ValueError(f"the peak measurement took no time ({best} s): it did not block")
    return flops_per_call / best


def numpy_matmul_rate(n: int = 2048, windows: int = 3) -> float:
    """FLOP/s of NumPy's float32 ``n x n`` matrix product (its BLAS, all cores): a second
    ceiling for the CPU.  A framework's own CPU matmul may use fewer threads than its
    convolutions (Paddle's CPU build: about a third of NumPy's rate on 2 cores), and would
    then understate what the processor can do."""
    import numpy as np
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    return best_rate(lambda: a @ a, 2.0 * n ** 3, windows=windows)


def cpu_ceiling(framework_rate: float, framework_how: str, n: int = 2048) -> tuple[float, str]:
    """The CPU's ceiling: the faster of the framework's matrix product and NumPy's."""
    np_rate = numpy_matmul_rate(n)
    how = (f"{framework_how}: {framework_rate / 1e9:.3g} GFLOP/s; NumPy float32 matmul "
           f"{n}x{n}: {np_rate / 1e9:.3g} GFLOP/s; the faster is the CPU's ceiling")
    return max(framework_rate, np_rate), how


# ------------------------------------------------------------------ the check
def rate_fields(flops_per_step: float, step_times: Sequence[float], peak_flops: float) -> dict:
    """The rate fields of a record: ``achieved_flops`` (at the median step time) and
    ``achieved_flops_best`` (at the fastest repeat), with ``flops_per_step`` and ``peak_flops``
    as given.  Raises ValueError when a count or a time is missing or not positive."""
    if not flops_per_step or flops_per_step <= 0:
        raise ValueError(f"no FLOP count for this step ({flops_per_step!r})")
    if not peak_flops or peak_flops <= 0:
        raise ValueError(f"no peak measured ({peak_flops!r})")
    if not step_times or min(step_times) <= 0:
        raise ValueError(f"step times must be positive, got {list(step_times)}")
    ts = sorted(step_times)
    median = ts[len(ts) // 2] if len(ts) % 2 else 0.5 * (ts[len(ts) // 2 - 1] + ts[len(ts) // 2])
    return {"flops_per_step": float(flops_per_step), "peak_flops": float(peak_flops),
            "achieved_flops": flops_per_step / median,
            "achieved_flops_best": flops_per_step / ts[0]}


def check_rate(rec: dict) -> dict:
    """``rec`` unchanged (with ``rate_check: "passed"``) when even its fastest repeat stays
    within the peak; :class:`ImpossibleRate` with a message saying why it cannot be true
    otherwise.  ``rec`` needs the fields of :func:`rate_fields`."""
    missing = [f for f in RATE_FIELDS if rec.get(f) is None]
    if missing:
        raise ValueError(f"record without {', '.join(missing)}: the rate cannot be checked")
    best, peak = rec["achieved_flops_best"], rec["peak_flops"]
    if best > peak:
        where = ", ".join(map(str, rec.get("arrays_on") or [])) or "its devices"
        step = rec["flops_per_step"] / best
        raise ImpossibleRate(
            f"impossible rate: {rec['flops_per_step']:.3g} FLOP per step in {1e3 * step:.3g} ms "
            f"(the fastest repeat) is {best / 1e12:.3g} TFLOP/s, above the peak "
            f"{peak / 1e12:.3g} TFLOP/s measured on {where} in the same run "
            f"(x{best / peak:.1f}): the clock was read before the work was done, or the work "
            f"ran elsewhere than recorded. Not recorded as a result.")
    rec["rate_check"] = "passed"
    return rec


def rate_status(rec: dict) -> str:
    """``passed`` for a checked record, :data:`PRE_CHECK` for one written before the benchmark
    counted FLOP (older results files: they are shown, labelled, never given made-up fields)."""
    if all(rec.get(f) is not None for f in RATE_FIELDS):
        return rec.get("rate_check") or ("passed" if rec["achieved_flops_best"]
                                         <= rec["peak_flops"] else "refused")
    return PRE_CHECK

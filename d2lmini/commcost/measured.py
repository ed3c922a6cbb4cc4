"""One GPU's training step as measured: the book's benchmark records (``BENCHMARKS``), read
into a ``MeasuredStep`` (one batch) or a ``StepTime`` with its shape ``T(B) = T0 + B t``."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..locations import records
from .cards import runs_of
from .nccl import NODE_GPUS
from .workload import resnet18_flops


BENCHMARKS = records()          # the book's benchmarks/, from any install (d2lmini.locations)

# The book's first GPU run (benchmarks/h100-2026-11-25/README.md): PyTorch's concise step of
# ResNet-18 width 64 (28x28 images), global batch 256, on one H100.  The records do not say
# which numerics ran; the README does: TF32 allowed (D2LMINI_TF32=1 then; PyTorch's default for
# convolutions, and JAX's GPU default is TF32-like) and exact numerics (TF32 off).
H100_RUN = runs_of("H100 SXM")
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
H200_RUN = runs_of("H200 SXM")
H200_SHAPES = {      # label: (file, framework, rung or probe variant)
    "measured, H200, PyTorch eager": ("steps.json", "torch", "defaults"),
    "measured, H200, JAX": ("steps.json", "jax", "defaults"),
    "measured, H200, PyTorch, CUDA graphs + bf16": (
        "probe-cudagraphs.jsonl", "torch", "compile reduce-overhead cl+bench fusedSGD bf16"),
}
LINEAR_LABEL = "measured, H100, PyTorch, linear in the batch"
#: The GPU's own line under the eager step, which the host's kernel launches hide: the same
#: probe with CUDA graphs (no launch per kernel; TF32, channels-last, cuDNN benchmark), 2.86 ms
#: at 32 images and 6.06 at 256, about 14 us an image against the eager records' 3.
H200_GPU_LINES = {"measured, H200, PyTorch eager": (
    "probe-cudagraphs.jsonl", "torch", "compile reduce-overhead (CUDA graphs) cl+bench fusedSGD")}


@dataclass(frozen=True)
class StepTime:
    """One GPU's step time at a batch, where it comes from, and -- where it was measured at
    several batches -- its shape ``fit`` (``d2lmini.steptime.StepFit``, ``T0 + B t``) and,
    where one was measured, the GPU's own line under it (``gpu``, a ``StepFit`` too)."""
    label: str
    seconds: float          # one GPU's step on ``batch`` images
    source: str
    forward_flops: float    # per image, to turn the time into a rate
    batch: int = 256
    fit: object = None
    gpu: object = None

    @property
    def measured(self) -> bool:
        return self.source.startswith("measured")

    def at(self, batch: float) -> float:
        """One GPU's step on ``batch`` images.  Measured at several batches: the record itself
        at a measured batch, straight lines between neighbouring records (JAX's step is a floor
        then growth, which one line through all of them misses by 9 % at 32 images), and beyond
        them the longer of the host's floor and the GPU's line, ``max(T_host, T_gpu(B))``: a step
        whose kernels the host launches one by one takes at least the launches (``T_host``, its
        fastest record) and at least the GPU's work (``gpu`` where it was measured -- the same
        step with CUDA graphs -- else the line through the last two records, the growth).  A
        line ``T0 + B t`` through a launch-bound step's records would read the launches as a
        serial part and their slope, inside the noise, as the GPU's cost (:meth:`measured_at`
        says which batches the records answer).  Else the time per image at ``self.batch`` times
        ``batch`` (linear, optimistic for small ones)."""
        if batch <= 0:
            raise ValueError(f"need a positive batch, got {batch}")
        if self.fit is None:
            return self.seconds * batch / self.batch
        xs, ys = zip(*sorted(self.fit.points))
        if xs[0] <= batch <= xs[-1]:
            return float(np.interp(batch, xs, ys))
        if self.gpu is not None:
            gpu = float(self.gpu(batch))
        else:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            gpu = ys[-1] + slope * (batch - xs[-1])
        return max(min(ys) if batch < xs[0] else ys[-1], gpu)

    def measured_at(self, batch: float) -> bool:
        """Whether :meth:`at` answers from the records (at or between measured batches) rather
        than from a line drawn beyond them."""
        return self.fit is not None and (min(b for b, _ in self.fit.points) <= batch
                                         <= max(b for b, _ in self.fit.points))

    @property
    def fixed_s(self) -> float:
        """The step's floor: its fastest record, below which no smaller share of the batch takes
        it (``T_host`` of a launch-bound step; 0 if linear)."""
        return min(t for _, t in self.fit.points) if self.fit is not None else 0.0

    def rate(self, batch: int) -> float:
        """The FLOP/s this step time means (forward + backward = 3x the forward FLOPs)."""
        return 3.0 * self.forward_flops * batch / self.at(batch)


def load_step_shape(path, framework: str, rung: str):
    """The fitted ``T0 + B t`` (``d2lmini.steptime.StepFit``) of one framework's step in
    a record of the step benchmark (``steps.json``: its records with the span "step on device
    arrays") or of a probe (``.jsonl``: one line per variant and batch, ``ms``), and a source
    line.  Raises ``FileNotFoundError`` or :class:`BenchmarkRecordError` (fewer than two
    batches, a record off the GPU)."""
    import json
    from ..steptime import STEP, fit_step_time
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
                 f"{date}, batches {', '.join(map(str, sorted(pts)))} "
                 + ("(two points: the line passes through both)" if len(pts) == 2 else
                    f"(the line within {fit.max_rel_error:.1%})"))


def resnet18_step_times(batch: int) -> dict[str, StepTime]:
    """One GPU's step of the ResNet-18 width 64, at ``batch`` images: the three shapes measured
    on one H200 (``H200_SHAPES``: PyTorch eager first, the primary prediction, with its GPU line
    ``H200_GPU_LINES``; JAX; PyTorch's fast path), and the H100 record scaled linearly from its one batch, as the chapter predicted
    before the shape was measured (TF32 on, PyTorch's default)."""
    flops = resnet18_flops(width=64)
    out = {}
    for label, (name, framework, rung) in H200_SHAPES.items():
        fit, source = load_step_shape(H200_RUN / name, framework, rung)
        gpu = None
        if label in H200_GPU_LINES:
            gname, gfw, grung = H200_GPU_LINES[label]
            gpu, gsource = load_step_shape(H200_RUN / gname, gfw, grung)
            source += f"; beyond them, its GPU line: {gname} (CUDA graphs)"
        step = StepTime(label, fit(batch), source, flops, batch, fit, gpu)
        out[label] = dataclasses.replace(step, seconds=step.at(batch))
    m = load_step(H100_RESNET18["measured, TF32 on (default)"])
    out[LINEAR_LABEL] = StepTime(LINEAR_LABEL, m.compute_time(batch), m.source, flops, batch)
    return out


def step_table(steps: dict[str, StepTime], batch: int, k: int = NODE_GPUS) -> str:
    """A Markdown table: each one-GPU step at ``batch`` and at ``batch / k``, its floor (the
    fastest record), the rate at ``batch``, and its source."""
    lines = [f"| one GPU | batch {batch} | batch {batch // k} | floor | rate at "
             f"{batch} | from |", "|---|---|---|---|---|---|"]
    for s in steps.values():
        lines.append(f"| {s.label.removeprefix('measured, ')} | {s.at(batch) * 1e3:.2f} ms | "
                     f"{s.at(batch / k) * 1e3:.2f} ms | "
                     f"{f'{s.fixed_s * 1e3:.2f} ms' if s.fit is not None else '0 (assumed)'} | "
                     f"{s.rate(batch) / 1e12:.0f} TFLOP/s | {s.source.removeprefix('measured: ')} |")
    return "\n".join(lines)

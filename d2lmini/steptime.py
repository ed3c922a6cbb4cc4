"""One definition of a training step's time, the same in every framework -- framework-neutral.

The book compares frameworks and predicts multi-GPU speed-ups from one GPU's step, so the
step must be the same span everywhere.  Two records of 2026-11-26 on one H200 were not: the
PyTorch number (17.4 ms) came from launched DDP epochs with the data loading inside the timed
window, the JAX one (6.1 ms) from jitted steps on arrays already on the GPU.  Here:

* **the step** (:func:`time_steps`, span :data:`STEP`): the batch is already on the device;
  forward, backward and update; the clock is read after the step's outputs have been waited
  for (``wait``: the framework's blocking call);
* **the epoch** (:func:`time_epoch`, span :data:`EPOCH`): the same step fed by the input
  pipeline -- the host's batches, their transfer to the device -- timed over a whole pass,
  and reported per step so the two can be set side by side.  Never mixed in one record.

:func:`fit_step_time` fits ``T(B) = T0 + B * t`` to the step times at several per-device
batches: ``T0`` is the part of a step that does not shrink with the batch (kernel launches,
the optimizer's per-tensor work, Python), which no extra GPU can shrink; the communication
chapter's predictions build on it (Amdahl's law: :func:`predicted_speedup`).  :func:`mfu`
states a rate against the peak measured for the same numerics.  Nothing here imports a
deep-learning framework; ``tools/step_bench.py`` drives the frameworks.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Iterable, Sequence

from .frameworks import KEYS as FRAMEWORKS, TITLES as NAMES

__all__ = ["STEP", "EPOCH", "StepTiming", "time_steps", "time_epoch", "StepFit",
           "fit_step_time", "mfu", "predicted_speedup", "plot_step_fits", "ladder",
           "step_shape", "ladder_table", "plot_ladder", "same_accuracy", "PROBE_RUNGS", "gpu_ladders", "gpu_ladder_table", "plot_gpu_ladders"]

STEP = "step on device arrays"
EPOCH = "epoch with input pipeline"


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """Seconds per step of each timed window, and what was timed (``span``)."""
    span: str
    seconds: tuple            # per step, one value per window
    steps: int                # steps per window
    warmup_s: float           # the untimed warm-up (compilation, autotuning, allocation)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def best(self) -> float:
        return min(self.seconds)

    def as_record(self) -> dict:
        return {"span": self.span, "ms_median": 1e3 * self.median, "ms_min": 1e3 * self.best,
                "ms_max": 1e3 * max(self.seconds), "windows": len(self.seconds),
                "steps_per_window": self.steps, "warmup_s": self.warmup_s}


def _check(warmup: int, repeats: int, steps: int) -> None:
    if warmup < 1 or repeats < 1 or steps < 1:
        raise ValueError(f"warmup, repeats and steps must be >= 1, got {warmup}, {repeats}, "
                         f"{steps}: a timing without warm-up includes compilation")


def time_steps(step: Callable[[], object], wait: Callable[[object], None], *, warmup: int = 3,
               repeats: int = 3, steps: int = 10,
               clock: Callable[[], float] = time.perf_counter) -> StepTiming:
    """Time ``step()`` -- one training step on a batch already on the device -- over
    ``repeats`` windows of ``steps`` steps after ``warmup`` untimed steps.

    ``wait(out)`` must block until the work that produced ``out`` (the value ``step`` returns)
    is done; it is called before each window's clock starts and before it stops, so a window
    holds exactly its steps.  Nothing else runs inside a window: no data loading, no
    host transfer, no logging."""
    _check(warmup, repeats, steps)
    t0 = clock()
    out = None
    for _ in range(warmup):
        out = step()
    wait(out)
    warm = clock() - t0
    seconds = []
    for _ in range(repeats):
        start = clock()
        for _ in range(steps):
            out = step()
        wait(out)
        seconds.append((clock() - start) / steps)
    if min(seconds) <= 0:
        raise ValueError(f"a window took no time ({seconds}): the clock is broken")
    return StepTiming(STEP, tuple(seconds), steps, warm)


def time_epoch(batches: Callable[[], Iterable], to_device: Callable, step_on: Callable,
               wait: Callable[[object], None], *, repeats: int = 2, warmup_steps: int = 2,
               clock: Callable[[], float] = time.perf_counter) -> StepTiming:
    """Time whole passes of the input pipeline feeding the step, per step.

    ``batches()`` starts a pass (an iterable of host batches: loading, shuffling, collating
    happen as it is iterated), ``to_device(batch)`` moves one to the device and ``step_on(
    device_batch)`` runs the step on it.  The first ``warmup_steps`` steps of a first, untimed
    pass warm up; then each of ``repeats`` passes is timed from its first batch to the wait
    on its last step's output."""
    if repeats < 1 or warmup_steps < 1:
        raise ValueError("repeats and warmup_steps must be >= 1")
    t0 = clock()
    out = None
    for i, b in enumerate(batches()):
        if i == warmup_steps:
            break
        out = step_on(to_device(b))
    wait(out)
    warm = clock() - t0
    seconds, n = [], 0
    for _ in range(repeats):
        start, n = clock(), 0
        for b in batches():
            out = step_on(to_device(b))
            n += 1
        wait(out)
        if n == 0:
            raise ValueError("the input pipeline yielded no batch")
        seconds.append((clock() - start) / n)
    return StepTiming(EPOCH, tuple(seconds), n, warm)


# ------------------------------------------------------------------ the step's shape
@dataclasses.dataclass(frozen=True)
class StepFit:
    """``T(B) = t0 + B * per_example`` in seconds, fitted by least squares to ``points``
    (per-device batch, seconds per step); ``max_rel_error``: the worst relative residual."""
    t0: float
    per_example: float
    points: tuple
    max_rel_error: float

    def __call__(self, batch: float) -> float:
        return self.t0 + batch * self.per_example

    @property
    def fixed_share(self) -> float:
        """The part of the largest measured batch's step that does not shrink with it."""
        b = max(p[0] for p in self.points)
        return self.t0 / self(b)

    def as_record(self) -> dict:
        return {"t0_ms": 1e3 * self.t0, "per_example_us": 1e6 * self.per_example,
                "max_rel_error": self.max_rel_error, "fixed_share": self.fixed_share,
                "points": [[b, 1e3 * s] for b, s in self.points]}


def fit_step_time(batches: Sequence[float], seconds: Sequence[float]) -> StepFit:
    """Least-squares line through (batch, seconds per step); at least two distinct batches.

    A negative intercept (the step grows faster than linearly: caches, another kernel at the
    larger batch) is clipped to 0 and the slope refitted through the origin: a fixed cost
    below zero means nothing.  A negative slope (a larger batch timed faster: the timing's
    noise exceeds what the extra work costs) is clipped to 0, a flat line at the mean."""
    pts = sorted(zip(map(float, batches), map(float, seconds)))
    if len(pts) < 2 or len({b for b, _ in pts}) < 2:
        raise ValueError(f"a line needs at least two distinct batch sizes, got {pts}")
    if any(s <= 0 or b <= 0 for b, s in pts):
        raise ValueError(f"batches and times must be positive, got {pts}")
    n = len(pts)
    mb = sum(b for b, _ in pts) / n
    ms = sum(s for _, s in pts) / n
    slope = (sum((b - mb) * (s - ms) for b, s in pts) / sum((b - mb) ** 2 for b, _ in pts))
    t0 = ms - slope * mb
    if slope < 0:
        t0, slope = ms, 0.0
    elif t0 < 0:
        t0, slope = 0.0, sum(b * s for b, s in pts) / sum(b * b for b, _ in pts)
    worst = max(abs(t0 + slope * b - s) / s for b, s in pts)
    return StepFit(t0, slope, tuple(pts), worst)


def mfu(flop_per_step: float, seconds_per_step: float, peak_flops: float) -> float:
    """Model FLOP utilisation: achieved FLOP/s over the peak measured for the same numerics."""
    if flop_per_step <= 0 or seconds_per_step <= 0 or peak_flops <= 0:
        raise ValueError("FLOP, time and peak must be positive")
    return flop_per_step / seconds_per_step / peak_flops


def predicted_speedup(fit: StepFit, global_batch: int, k: int,
                      comm_seconds: float = 0.0, overlap: float = 0.0) -> float:
    """Speed-up of k devices over one at a fixed global batch: ``T(G) / (T(G/k) + exposed
    communication)``, with the step's fixed part ``T0`` paid by every device (Amdahl's law:
    it is the serial fraction no extra device shrinks) and ``overlap`` (0..1) of the
    communication hidden behind the backward pass."""
    if k < 1 or global_batch < k:
        raise ValueError(f"need 1 <= k <= global batch, got k={k}, batch={global_batch}")
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap must be within [0, 1], got {overlap}")
    exposed = 0.0 if k == 1 else comm_seconds * (1 - overlap)
    return fit(global_batch) / (fit(global_batch / k) + exposed)


def plot_step_fits(fits: dict, title: str = "", ax=None):
    """ms per step against the per-device batch: the measured points and each fitted line
    ``T0 + B t`` (labelled with its T0), one colour per entry of ``fits`` (name -> StepFit)."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.8))
    top = max(b for f in fits.values() for b, _ in f.points)
    for name, f in fits.items():
        bs = [b for b, _ in f.points]
        line = ax.plot([0, top], [1e3 * f(0), 1e3 * f(top)], "-", lw=1)[0]
        ax.plot(bs, [1e3 * s for _, s in f.points], "o", color=line.get_color(),
                label=f"{name}: T0 = {1e3 * f.t0:.2g} ms")
    ax.set_xlim(0, top * 1.05)
    ax.set_ylim(0, None)
    ax.set_xlabel("batch per device")
    ax.set_ylabel("ms per step")
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax




# ------------------------------------------------------------------ a notebook's fast path
def ladder(build: Callable, rungs: Sequence, wait: Callable, batch: int, *, warmup: int,
           repeats: int, steps: int) -> list[dict]:
    """Time each rung ``(name, knobs)`` of a fast-path ladder at one batch.

    ``build(knobs, batch)`` returns a step on a batch already on the device (a fresh model
    for every rung, so that no rung inherits another's compiled or autotuned state)."""
    out = []
    for name, knobs in rungs:
        t = time_steps(build(knobs, batch), wait, warmup=warmup, repeats=repeats, steps=steps)
        out.append({"rung": name, "knobs": tuple(knobs), "batch": batch, **t.as_record()})
    base = out[0]["ms_median"] if out else None
    for r in out:
        r["speedup"] = base / r["ms_median"]
    return out


def step_shape(build: Callable, rungs: Sequence, wait: Callable, batches: Sequence[int], *,
               warmup: int, repeats: int, steps: int) -> dict:
    """``{rung name: StepFit}``: each rung timed at every batch of ``batches``, and the line
    ``T0 + B t`` through its times."""
    fits = {}
    for name, knobs in rungs:
        secs = [time_steps(build(knobs, b), wait, warmup=warmup, repeats=repeats,
                           steps=steps).median for b in batches]
        fits[name] = fit_step_time(batches, secs)
    return fits


def ladder_table(records: Sequence[dict], where: str) -> str:
    """The ladder as a Markdown table: rung, ms per step (median, range), speed-up."""
    rows = [f"| setting ({where}) | ms per step | range | speed-up |", "|---|---:|---:|---:|"]
    for r in records:
        rows.append(f"| {r['rung']} | {r['ms_median']:.3g} | {r['ms_min']:.3g} to "
                    f"{r['ms_max']:.3g} | {r['speedup']:.2f}x |")
    return "\n".join(rows)


def plot_ladder(records: Sequence[dict], where: str, ax=None):
    """Horizontal bars: ms per step of each rung (median, with the windows' range), the
    defaults on top; the title says where the arrays lived."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 0.5 * len(records) + 1.2))
    names = [r["rung"] for r in records][::-1]
    med = [r["ms_median"] for r in records][::-1]
    err = [[m - r["ms_min"] for m, r in zip(med, records[::-1])],
           [r["ms_max"] - m for m, r in zip(med, records[::-1])]]
    ax.barh(names, med, xerr=err, color="tab:blue", alpha=0.8, capsize=3)
    ax.set_xlabel("ms per training step (lower is faster)")
    ax.set_title(f"The fast path, one setting at a time ({where})")
    ax.grid(axis="x", alpha=0.3)
    return ax


def same_accuracy(fast: Sequence[float], base: Sequence[float], tol: float | None = None) -> dict:
    """Whether runs with the fast path reach the float32 runs' accuracy: the gap between the
    means is at most the seeds' spread (the larger of the two settings' max - min) or ``tol``,
    whichever is larger.  ``tol`` None: the fast-path settings' own (``settings("fastpath")``,
    which allow for 16-bit rounding and, in the quick settings, for runs near chance)."""
    if not fast or not base:
        raise ValueError("need at least one run of each setting")
    if tol is None:
        from .config import settings
        tol = settings("fastpath").acc_tol
    gap = abs(statistics.mean(fast) - statistics.mean(base))
    spread = max(max(fast) - min(fast), max(base) - min(base))
    return {"gap": gap, "spread": spread, "bound": max(spread, tol),
            "ok": gap <= max(spread, tol)}


# ------------------------------------------------------------------ a GPU run's stored ladders
# The CUDA-graphs probe of benchmarks/h200-2026-11-27 (probe_cudagraphs.py): the same step
# definition as the benchmark, run after it on the same card; its variants as ladder rungs.
PROBE_RUNGS = {
    "compile reduce-overhead (CUDA graphs) cl+bench fusedSGD":
        ("+ torch.compile (CUDA graphs), fused SGD", ""),
    "compile reduce-overhead cl+bench fusedSGD bf16": ("+ bf16 autocast", "bf16"),
}


def gpu_ladders(run_dir, batch: int = 256) -> list[dict]:
    """Every framework's fast-path ladder at ``batch`` from one GPU run's stored files: the
    step benchmark's records (``steps.json``, span "step on device arrays") and, where the run
    has one, the CUDA-graphs probe (``probe-cudagraphs.jsonl``) after PyTorch's benchmark
    rungs that do not compile.  Each row: framework, rung, ms (median, min, max), TFLOP/s, MFU
    against the peak the benchmark measured for its numerics, and ``timed_by``."""
    import json
    from pathlib import Path
    run_dir = Path(run_dir)
    rec = json.loads((run_dir / "steps.json").read_text())
    peaks = {p["framework"]: p["peak_flops"] for p in rec["peaks"]}
    rows = [dict(r, timed_by="benchmark") for r in rec["records"]
            if r["span"] == STEP and r["batch"] == batch]
    probe = run_dir / "probe-cudagraphs.jsonl"
    if probe.is_file():
        from .bench import resnet18_train_flops
        rows = [r for r in rows if not (r["framework"] == "torch" and "compile" in r["knobs"])]
        for r in rows:            # the benchmark's ladder put bf16 before compiling: an aside
            if r["framework"] == "torch" and "bf16" in r["knobs"]:
                r["rung"] = "(bf16 autocast, eager: off the ladder)"
        width = rec["settings"]["width"]
        for line in probe.read_text().splitlines():
            p = json.loads(line)
            if p.get("variant") not in PROBE_RUNGS or p.get("batch") != batch:
                continue
            rung, numerics = PROBE_RUNGS[p["variant"]]
            flop = resnet18_train_flops(batch, width)
            peak = peaks[p["fw"]]["bf16" if numerics else "tf32"]
            rows.append({"framework": p["fw"], "rung": rung, "batch": batch, "width": width,
                         "ms_median": p["ms"], "ms_min": min(p["reps"]),
                         "ms_max": max(p["reps"]), "tflops": flop / p["ms"] * 1e3 / 1e12,
                         "mfu": mfu(flop, p["ms"] / 1e3, peak), "peak_of": numerics or "tf32",
                         "timed_by": "probe, after the benchmark"})
    order = {fw: i for i, fw in enumerate(FRAMEWORKS)}
    rows.sort(key=lambda r: order.get(r["framework"], 9))       # stable: ladder order kept
    for fw in {r["framework"] for r in rows}:
        mine = [r for r in rows if r["framework"] == fw]
        for r in mine:
            r["speedup"] = mine[0]["ms_median"] / r["ms_median"]
    return rows




def gpu_ladder_table(rows: Sequence[dict]) -> str:
    """:func:`gpu_ladders` as a Markdown table."""
    out = ["| framework | setting | ms per step | TFLOP/s | MFU | timed by |",
           "|---|---|---:|---:|---:|---|"]
    for r in rows:
        out.append(f"| {NAMES.get(r['framework'], r['framework'])} | {r['rung']} | "
                   f"{r['ms_median']:.2f} | {r['tflops']:.0f} | {r['mfu']:.0%} | {r['timed_by']} |")
    return "\n".join(out)


def plot_gpu_ladders(rows: Sequence[dict], title: str = "", ax=None):
    """Horizontal bars, one group per framework: ms per step of each rung (the windows'
    range as error bars), its MFU written beside it; a probe's rungs hatched."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(8.5, 0.38 * len(rows) + 1.3))
    labels = [f"{NAMES.get(r['framework'], r['framework'])}: {r['rung']}" for r in rows][::-1]
    rs = rows[::-1]
    med = [r["ms_median"] for r in rs]
    err = [[r["ms_median"] - r["ms_min"] for r in rs], [r["ms_max"] - r["ms_median"] for r in rs]]
    colors = [f"C{FRAMEWORKS.index(r['framework'])}" for r in rs]
    bars = ax.barh(labels, med, xerr=err, color=colors, alpha=0.85, capsize=2)
    for bar, r in zip(bars, rs):
        if r["timed_by"] != "benchmark":
            bar.set_hatch("//")
        ax.annotate(f"  MFU {r['mfu']:.0%}", (r["ms_max"], bar.get_y() + bar.get_height() / 2),
                    va="center", fontsize=7)
    ax.set_xlabel("ms per training step, the batch on the GPU (lower is faster); hatched: probe")
    ax.set_title(title or "The fast path on one GPU, one setting at a time", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlim(0, max(r["ms_max"] for r in rows) * 1.25)
    return ax

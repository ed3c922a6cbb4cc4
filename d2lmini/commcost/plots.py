"""The chapter's figures: the fitted model against the measured times, one predicted step's
timeline, the roofline of compute against the all-reduce, and predicted speed-ups."""
from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from .alphabeta import Fit, regime_size
from .formatting import fmt_seconds
from .measured import StepTime
from .nccl import NODE_GPUS, Link, collective_time
from .predict import (DDP_BUCKET_BYTES, MIN_PER_GPU_BATCH, bucket_timeline, critical_batch,
                      device_limit, predict_step)


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
        inside = np.array([s.measured_at(x) for x in b])       # solid where measured, dashed
        t = np.array([s.at(x) * 1e3 for x in b])               # where a line is drawn beyond
        ax.plot(b, np.where(inside, t, np.nan), "-", color=f"C{j}", lw=1.5,
                label=f"compute, {label}" if inside.any() else None)
        ax.plot(b, np.where(inside, np.nan, t), "--", color=f"C{j}", lw=1,
                label=None if inside.any() else f"compute, {label} (scaled)")
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


def scaling_speedups(step: "StepTime", n_bytes: float, link: Link, ks, *, global_batch: int,
                     weak_batch: int) -> dict[str, list[float]]:
    """Predicted speed-ups on k GPUs of ``link`` (no overlap) from one GPU's measured ``step``:
    ``"strong"``, ``global_batch`` split over k (up to :func:`device_limit`; NaN beyond), and
    ``"weak"``, ``weak_batch`` images per GPU and the global batch growing with k."""
    import dataclasses
    whole = dataclasses.replace(step, seconds=step.at(global_batch), batch=global_batch)
    one = step.at(weak_batch)
    limit = device_limit(global_batch, link)
    strong = [predict_step(whole, n_bytes, int(j), link, overlap=False)["speedup"]
              if j <= limit else math.nan for j in ks]
    weak = [j * one / (one + (collective_time("all-reduce", n_bytes, int(j), link)
                              if j > 1 else 0.0)) for j in ks]
    return {"strong": strong, "weak": weak}


def plot_scaling(steps: dict[str, StepTime], n_bytes: float, link: Link, *,
                 global_batch: int = 256, weak_batch: int = MIN_PER_GPU_BATCH, title: str = ""):
    """The chapter's takeaway in one figure: predicted speed-up against k GPUs of ``link``
    (no overlap) for each measured one-GPU step, strong scaling (``global_batch`` split over k,
    solid) and weak scaling (``weak_batch`` per GPU, dotted), against the ideal k.  Returns
    the matplotlib figure."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter
    ks = np.arange(1, (link.domain or NODE_GPUS) + 1)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(ks, ks, "-", color="lightgray", lw=3, zorder=0, label="ideal: k")
    for j, (label, s) in enumerate(steps.items()):
        sp = scaling_speedups(s, n_bytes, link, ks, global_batch=global_batch,
                              weak_batch=weak_batch)
        name = label.removeprefix("measured, ")
        ax.plot(ks, sp["strong"], "-o", color=f"C{j}", ms=3, lw=1.3,
                label=f"strong ({global_batch} in all), {name}")
        ax.plot(ks, sp["weak"], ":", color=f"C{j}", lw=1.6,
                label=f"weak ({weak_batch} per GPU), {name}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylim(0.85, 4 * ks[-1])                      # room for the legend above the lines
    ax.set_xlabel(f"GPUs k ({link.name})")
    ax.set_ylabel("predicted speed-up")
    ax.legend(fontsize=6.5, loc="upper left")
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


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

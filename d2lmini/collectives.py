"""The framework-neutral half of hand-written all-reduce: who sends what to whom, and how much.

Each framework's notebook moves the actual tensors; the schedule and the byte accounting
live here once.

Naive all-reduce (the seed's): every device sends its buffer to device 0, device 0 sums and
sends the result back.  Device 0 receives (k-1)*N and sends (k-1)*N: 2(k-1)*N bytes go
through it, while the other devices move N each way.

Ring all-reduce: the buffer is cut into k chunks; devices form a ring i -> i+1 (mod k).
*Reduce-scatter* (k-1 steps): at step s device i sends chunk (i-s) mod k to device i+1,
which adds it into its own copy; afterwards device i holds the full sum of chunk (i+1) mod k.
*All-gather* (k-1 steps): at step s device i sends chunk (i+1-s) mod k to device i+1, which
overwrites its copy.  Every device sends 2(k-1) chunks of N/k: 2(k-1)/k * N bytes, nearly
independent of k, and the load is the same on every link.
"""
from __future__ import annotations

from dataclasses import dataclass

from .utils import shard_slices

__all__ = ["Transfer", "ring_schedule", "naive_schedule", "traffic", "chunk_slices", "plot_schedule",
           "plot_schedules"]


@dataclass(frozen=True)
class Transfer:
    """One message: ``src`` sends ``chunk`` (None: the whole buffer) to ``dst``.

    ``op`` is ``'add'`` (the receiver accumulates) or ``'copy'`` (the receiver overwrites).
    """
    phase: str
    step: int
    src: int
    dst: int
    chunk: int | None
    op: str


def chunk_slices(n: int, k: int) -> list[slice]:
    """The k chunks of a flat buffer of n elements (sizes differ by at most one)."""
    return shard_slices(n, k)


def ring_schedule(k: int) -> list[list[Transfer]]:
    """The ring all-reduce as 2(k-1) steps; the transfers of one step can run concurrently
    (no device reads a chunk that is written in the same step)."""
    if k < 1:
        raise ValueError(f"need at least one device, got {k}")
    steps = []
    for s in range(k - 1):
        steps.append([Transfer("reduce-scatter", s, i, (i + 1) % k, (i - s) % k, "add")
                      for i in range(k)])
    for s in range(k - 1):
        steps.append([Transfer("all-gather", s, i, (i + 1) % k, (i + 1 - s) % k, "copy")
                      for i in range(k)])
    return steps


def naive_schedule(k: int) -> list[list[Transfer]]:
    """The seed's all-reduce: reduce everything onto device 0, then broadcast from it."""
    reduce = [Transfer("reduce", i - 1, i, 0, None, "add") for i in range(1, k)]
    bcast = [Transfer("broadcast", i - 1, 0, i, None, "copy") for i in range(1, k)]
    return [[t] for t in reduce] + [[t] for t in bcast]


def traffic(schedule: list[list[Transfer]], n: int, k: int, itemsize: int = 4) -> dict:
    """Bytes sent and received by each device when all-reducing n elements of ``itemsize``.

    Returns ``{'sent': [...], 'received': [...]}``, one entry per device.
    """
    sizes = [s.stop - s.start for s in chunk_slices(n, k)] if n >= k else None
    sent, received = [0] * k, [0] * k
    for step in schedule:
        for t in step:
            count = n if t.chunk is None else sizes[t.chunk]
            sent[t.src] += count * itemsize
            received[t.dst] += count * itemsize
    return {"sent": sent, "received": received}


def plot_schedule(schedule: list[list[Transfer]], k: int, ax=None, title: str = ""):
    """A schedule as a space-time diagram: devices top to bottom, steps left to right, one
    arrow per message from its sender at step s to its receiver at step s + 1, as thick as
    the message (a whole buffer, or a chunk of 1/k), labelled with its chunk; blue adds into
    the receiver's copy, green overwrites it.  Returns the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    if ax is None:
        _, ax = plt.subplots(figsize=(1 + 0.55 * len(schedule), 0.5 + 0.5 * k))
    colors = {"add": "#3182bd", "copy": "#31a354"}
    for s, step in enumerate(schedule):
        for t in step:
            whole = t.chunk is None
            ax.annotate("", xy=(s + 1, t.dst), xytext=(s, t.src),
                        arrowprops=dict(arrowstyle="-|>", color=colors[t.op],
                                        lw=4.0 if whole else max(0.8, 4.0 / k),
                                        shrinkA=4, shrinkB=4, alpha=0.85))
            if not whole:
                ax.text(s + 0.5, (t.src + t.dst) / 2 if abs(t.dst - t.src) == 1 else t.src + 0.25,
                        str(t.chunk), fontsize=7, ha="center", va="center",
                        bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none"))
    for i in range(k):
        ax.plot(range(len(schedule) + 1), [i] * (len(schedule) + 1), "o", color="0.6", ms=3)
    ax.set_yticks(range(k))
    ax.set_yticklabels([f"device {i}" for i in range(k)], fontsize=8)
    ax.set_ylim(k - 0.5, -0.5)
    ax.set_xticks(range(len(schedule) + 1))
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(title, fontsize=9)
    ax.legend(handles=[Line2D([], [], color=c, lw=2, label=lbl) for lbl, c in
                       (("adds into the receiver's copy", colors["add"]),
                        ("overwrites it", colors["copy"]))],
              fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2, frameon=False)
    return ax


def plot_schedules(k: int = 4):
    """The naive and the ring all-reduce of k devices side by side (:func:`plot_schedule`),
    with the bytes each device sends and receives for a buffer of k * 1000 elements."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(12, 1.2 + 0.5 * k),
                             gridspec_kw={"width_ratios": [1, 1, 0.7]})
    plot_schedule(naive_schedule(k), k, axes[0], f"naive: {2 * (k - 1)} steps, whole buffers")
    plot_schedule(ring_schedule(k), k, axes[1],
                  f"ring: {2 * (k - 1)} steps, k messages of 1/k each")
    n = 1000 * k
    for off, (name, sched) in zip((-0.2, 0.2), (("naive", naive_schedule(k)), ("ring", ring_schedule(k)))):
        t = traffic(sched, n, k, 4)
        total = [a + b for a, b in zip(t["sent"], t["received"])]
        axes[2].barh([i + off for i in range(k)], [x / (4 * n) for x in total], height=0.4, label=name)
    axes[2].set_ylim(k - 0.5, -0.5)
    axes[2].set_yticks(range(k))
    axes[2].set_yticklabels([f"device {i}" for i in range(k)], fontsize=8)
    axes[2].set_xlabel("bytes sent + received / buffer size", fontsize=8)
    axes[2].legend(fontsize=7)
    axes[2].set_title("traffic per device", fontsize=9)
    fig.tight_layout()
    return fig

"""When a data-parallel step is compute-bound, as a number: the roofline of data parallelism.

Computing a step's share of B examples takes ``B F / C`` on a GPU of peak rate C (F: FLOPs per
example, a training step's three times the forward pass); communicating takes ``b(k) n / W``
for a collective that puts ``b(k) n`` bytes on each GPU's link of bandwidth W (the ring's
all-reduce ``2(k-1)/k n``).  Two thresholds follow:

* **compute equals communication**: ``B F / (b(k) n) = C / W`` with the whole step's FLOPs
  (3 forward passes): below it, a step without overlap spends longer communicating than
  computing;
* **DDP hides its all-reduce**: the all-reduce can overlap only the backward pass (2 forward
  passes' FLOPs), so hiding it needs ``2/3 B F / (b(k) n) > C / W``: 1.5 times the first
  batch.  This is the JAX scaling book's condition for pure data parallelism (*How to
  Parallelize a Transformer for Training*: the backward pass's FLOPs against the gradient's
  all-reduce, ``B/X > C/W`` tokens per chip for a transformer, about 2,200 on an H100 inside
  a node at its bfloat16 peak).

``roofline_batch`` is ``B* = C t_comm / F`` for the FLOPs it is given: ``3 F`` for the first,
``2 F`` for the second.  W is a link's bandwidth, or for a ring across nodes of several GPUs
(:class:`.AcrossNodes`) a GPU's share of the node's cards, not one card's.  With
``latency=True`` the byte term is NCCL's whole modelled time (:func:`.collective_time`,
:func:`.cluster_time`), as for a layer's all-gather, which is mostly latency.  Under FSDP each
layer's all-gather must hide behind that layer's forward pass (prefetching):
``layer_batches``.  These are ideal thresholds at the datasheet's peak; the measured step's
(:func:`.critical_batch`, from ``T0 + B t``) is lower -- a step that reaches a fraction u of
the peak needs about u times the batch, and a fixed part T0 lowers it further -- because its
compute is slow, not because its communication is fast.
"""
from __future__ import annotations

import math

import numpy as np

from .alphabeta import collective_coefficients
from .formatting import sig
from .hierarchy import AcrossNodes, cluster_time
from .nccl import Link, collective_time
from .predict import critical_batch


def gpus_of(link, k: int) -> int:
    """The GPUs a collective over ``link`` spans: k, or an :class:`.AcrossNodes`' own."""
    return link.gpus if isinstance(link, AcrossNodes) else k


def comm_seconds(op: str, n_bytes: float, k: int, link: Link | AcrossNodes,
                 latency: bool = False) -> float:
    """The time of ``op`` on ``n_bytes`` over k GPUs (an :class:`.AcrossNodes` brings its own
    k): its bandwidth term ``b(k) n / W`` (the roofline's), or with ``latency`` NCCL's whole
    model (:func:`.collective_time`, :func:`.cluster_time`)."""
    k = gpus_of(link, k)
    if latency:
        if isinstance(link, AcrossNodes):
            return float(cluster_time(op, n_bytes, link.nodes, link.cluster))
        return float(collective_time(op, n_bytes, k, link))
    return collective_coefficients(op, k)[1] * n_bytes / link.bandwidth


def roofline_batch(flop_per_example: float, n_bytes: float, k: int, link: Link | AcrossNodes,
                   peak_flops: float, *, op: str = "all-reduce", latency: bool = False) -> float:
    """The per-GPU batch ``B*`` above which computing ``B`` examples of ``flop_per_example``
    FLOPs at ``peak_flops`` takes longer than ``op`` on ``n_bytes`` over k GPUs on ``link``:
    ``peak * t_comm / flop_per_example``.  With the bandwidth term, ``B* = (C / W) / (F /
    (b(k) n))``: the card's FLOPs per link byte over the FLOPs per byte per example.  Pass the
    whole step's FLOPs (3 forward passes) for "compute equals communication", the backward
    pass's (2) for "DDP hides its all-reduce".  0 for k = 1.

    The JAX scaling book's data-parallel condition for a transformer of P weights (2P forward
    FLOPs per token, so 4P in the backward pass; a bfloat16 gradient of 2P bytes), on 8 H100s
    over NVLink: C/W, about 2,200, times (k-1)/k:

    >>> from d2lmini import commcost as cc
    >>> h100, nvlink = cc.GPUS["H100 SXM"], cc.LINKS["NVLink 4 (H100 SXM)"]
    >>> round(h100.peak("bf16") / nvlink.bandwidth)          # C / W, FLOPs per byte of link
    2199
    >>> P = 1.5e9
    >>> round(cc.roofline_batch(2 * 2 * P, 2 * P, 8, nvlink, h100.peak("bf16")))   # tokens a GPU
    1924
    """
    if flop_per_example <= 0 or peak_flops <= 0:
        raise ValueError("need positive FLOPs per example and a positive peak rate")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k is the number of GPUs: a positive integer, got {k!r}")
    return peak_flops * comm_seconds(op, n_bytes, k, link, latency) / flop_per_example


def layer_batches(layers: list[dict], k: int, link: Link, peak_flops: float, *,
                  latency: bool = True) -> list[dict]:
    """FSDP with one unit per layer, prefetching: the per-GPU batch above which each layer's
    forward pass at ``peak_flops`` lasts as long as the all-gather of its parameters
    (``grad_bytes``: its parameters are as many bytes as its gradient) on k GPUs.  In the
    backward pass a layer computes twice its forward FLOPs and gathers and reduce-scatters as
    many bytes each, so the same batch hides them there.  ``layers``: dicts with ``name``,
    ``grad_bytes``, ``flops`` (forward, one example), e.g. :func:`.resnet18_layer_costs`.
    Returns ``[{"name", "bytes", "flops", "batch"}]``."""
    return [{"name": l["name"], "bytes": l["grad_bytes"], "flops": l["flops"],
             "batch": roofline_batch(l["flops"], l["grad_bytes"], k, link, peak_flops,
                                     op="all-gather", latency=latency)}
            for l in layers]


def link_label(link) -> str:
    """A link as the thresholds name it: a network card alone is a GPU's whole link only with
    one GPU per node, and says so."""
    if isinstance(link, Link) and link.hw == "NET":
        return f"{link.name}, one GPU a node"
    return link.name


def threshold_rows(models: dict, links, gpu, k: int, numerics=("tf32", "bf16")) -> list[dict]:
    """One row per model and link: at each of ``gpu``'s peaks the batch where compute equals
    the all-reduce (``row[num]``: the whole step's FLOPs; ``"<num>, latency"`` with NCCL's
    latency) and the batch above which DDP hides it behind the backward pass (``"<num>,
    hides"``: the backward pass's FLOPs, 1.5 times the first), the measured step's
    :func:`.critical_batch` where a model has one, and FSDP's per-layer all-gather thresholds
    (with NCCL's latency) at the last peak.  ``links``: :class:`.Link` s over k GPUs, or
    :class:`.AcrossNodes` (its own GPUs).  ``models``: ``{name: {"flops" (forward, one
    example), "bytes" (gradient), "unit" ("images", "tokens"), "layers" (optional),
    "steps" (optional ``{label: StepTime}``)}}``."""
    out = []
    for name, m in models.items():
        for link in links:
            kk = gpus_of(link, k)
            row = {"model": name, "unit": m["unit"], "link": link_label(link), "k": kk,
                   "bytes": m["bytes"], "flop_per_example": 3.0 * m["flops"]}
            for num in numerics:
                peak = gpu.peak(num)
                row[num] = roofline_batch(3.0 * m["flops"], m["bytes"], kk, link, peak)
                row[f"{num}, hides"] = roofline_batch(2.0 * m["flops"], m["bytes"], kk, link, peak)
                row[f"{num}, latency"] = roofline_batch(3.0 * m["flops"], m["bytes"], kk, link,
                                                        peak, latency=True)
            row["measured"] = ({label: critical_batch(s, m["bytes"], kk, link)
                                for label, s in (m.get("steps") or {}).items()}
                               if isinstance(link, Link) else {})
            if m.get("layers") and isinstance(link, Link):
                per = layer_batches(m["layers"], k, link, gpu.peak(numerics[-1]))
                row["layers"] = per
                row["layer_median"] = float(np.median([p["batch"] for p in per]))
                row["layer_max"] = max(per, key=lambda p: p["batch"])
            out.append(row)
    return out


def _count(x: float) -> str:
    return "never" if x == 0 else ("--" if not math.isfinite(x) else sig(x))


def threshold_table(rows: list[dict], numerics=("tf32", "bf16")) -> str:
    """A Markdown table of :func:`threshold_rows`, per GPU: the batch where compute equals the
    all-reduce at each peak, the batch above which DDP hides it behind backward (last peak),
    the measured step's, and FSDP's per-layer median."""
    last = numerics[-1].upper()
    lines = ["| model | link | GPUs | " + " | ".join(f"compute = all-reduce, {n.upper()}"
                                                    for n in numerics)
             + f" | DDP hides it, {last} | measured step | FSDP by layer, median ({last}) |",
             "|---|---|---:|" + "---:|" * (len(numerics) + 3)]
    for r in rows:
        measured = "; ".join(f"{_count(v)} ({label.removeprefix('measured, ')})"
                             for label, v in r["measured"].items()) or "--"
        lines.append(f"| {r['model']} ({r['unit']}) | {r['link']} | {r['k']} | "
                     + " | ".join(_count(r[n]) for n in numerics)
                     + f" | {_count(r[numerics[-1] + ', hides'])} | {measured} | "
                     + f"{_count(r['layer_median']) if 'layers' in r else '--'} |")
    return "\n".join(lines)


def plot_compute_bound(models: dict, links, gpu, k: int, numerics=("tf32", "bf16"),
                       title: str = ""):
    """One panel per model: one GPU's compute per step at each peak against its batch (rising
    lines; the measured step's ``T0 + B t`` where the model has one, dotted), the all-reduce
    of the gradient on k GPUs over each link (its bandwidth term, flat lines), and where they
    cross (the roofline ``B*``, marked and labelled).  A last panel, if a model has
    ``layers``: FSDP's per-layer thresholds over each link.  Returns the matplotlib figure."""
    import matplotlib.pyplot as plt
    links = list(links)
    layered = [(n, m) for n, m in models.items() if m.get("layers")]
    panels = len(models) + (1 if layered else 0)
    fig, axes = plt.subplots(1, panels, figsize=(4.1 * panels, 3.7), squeeze=False)
    for ax, (name, m) in zip(axes[0], models.items()):
        f = 3.0 * m["flops"]
        lo, hi = m.get("range", (1, 1e5))
        b = np.geomspace(lo, hi, 120)
        for j, num in enumerate(numerics):
            ax.plot(b, b * f / gpu.peak(num) * 1e3, "-", color=f"C{j}", lw=1.5,
                    label=f"compute at {num.upper()} peak")
        for j, (label, s) in enumerate((m.get("steps") or {}).items()):
            ax.plot(b, [s.at(x) * 1e3 for x in b], ":", color=f"C{len(numerics) + j}", lw=1.5,
                    label=f"compute, {label.removeprefix('measured, ')}")
        for i, link in enumerate(links):
            c = comm_seconds("all-reduce", m["bytes"], k, link)
            ax.axhline(c * 1e3, color="0.3", ls=(0, (1 + 3 * i, 2)), lw=1,
                       label=f"all-reduce, {k} GPUs, {link.name}")
            for j, num in enumerate(numerics):
                bs = roofline_batch(f, m["bytes"], k, link, gpu.peak(num))
                ax.plot([bs], [c * 1e3], "o", color=f"C{j}", ms=5)
                ax.annotate(sig(bs), (bs, c * 1e3), xytext=(3, 4 - 12 * j),
                            textcoords="offset points", fontsize=7, color=f"C{j}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_xlabel(f"{m['unit']} per GPU")
        ax.set_title(f"{name}: compute-bound right of a dot", fontsize=9)
        bottom, top = ax.get_ylim()
        ax.set_ylim(bottom, top * 300)                # room for the legend above the lines
        ax.legend(fontsize=6, loc="upper left")
    axes[0][0].set_ylabel("time per step (ms)")
    if layered:
        ax = axes[0][-1]
        name, m = layered[0]
        for i, link in enumerate(links):
            per = layer_batches(m["layers"], k, link, gpu.peak(numerics[-1]))
            ax.plot(range(len(per)), [p["batch"] for p in per], "o-", ms=3, lw=1,
                    color=f"C{i + 4}", label=f"a layer's all-gather, {link.name}")
            ax.axhline(roofline_batch(3.0 * m["flops"], m["bytes"], k, link,
                                      gpu.peak(numerics[-1])),
                       color=f"C{i + 4}", ls="--", lw=1, label=f"the step's all-reduce, {link.name}")
        ax.set_yscale("log")
        ax.set_xticks(range(len(per)))
        ax.set_xticklabels([p["name"].replace(".conv", ".c").replace("stage", "s")
                            for p in per], rotation=90, fontsize=5.5)
        ax.set_ylabel(f"{m['unit']} per GPU to hide it ({numerics[-1].upper()} peak)")
        ax.set_title(f"FSDP by layer, {name}, with NCCL's latency", fontsize=9)
        ax.legend(fontsize=6, loc="upper center")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig

"""Predicted data-parallel steps on GPUs: one GPU's step (a ``StepTime`` or seconds) shared
by k GPUs plus NCCL's all-reduce of the gradients, after backward or overlapped in DDP's
buckets (``bucket_timeline``); every GPU pays the step's fixed part ``T0`` (Amdahl's law), and
``critical_batch`` gives the per-GPU batch below which a step is communication-bound."""
from __future__ import annotations

import math
from typing import Iterable

from .formatting import fmt_seconds, sig
from .measured import StepTime
from .alphabeta import algorithm_bandwidth, bus_bandwidth
from .nccl import LINKS, Link, collective_time, nccl_protocol


# PyTorch DDP's default bucket: bucket_cap_mb=25 (MiB).  Paddle's DataParallel also
# defaults to comm_buffer_size=25 (MiB).
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
    a :class:`.StepTime` answers from its measured shape (``at``), a number of seconds splits
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
    each and all-reduce ``n_bytes`` of gradients (:func:`.collective_time` over ``link``).  The
    share's time: a :class:`.StepTime` gives it from the step's measured shape ``T0 + B t``
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
    buckets of ``bucket_bytes`` (:func:`.bucket_sizes`).  ``layers`` (forward order, with
    ``grad_bytes`` and ``flops``, e.g. :func:`.resnet18_layer_costs`): DDP's buckets of whole
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

    ``step``: a :class:`.StepTime` measured at several batches (the batch where its
    :meth:`~.StepTime.at` reaches the all-reduce; 0 when even a batch of one image outlasts it
    -- such a step, launch-bound, is never communication-bound, whatever its batch), or
    seconds per image (linear: ``t_allreduce / seconds_per_image``)."""
    c = collective_time("all-reduce", n_bytes, k, link)
    if isinstance(step, StepTime):
        if step.fit is None:
            step = step.seconds / step.batch
        else:
            lo, hi = 1e-6, 1.0
            if step.at(lo) >= c:
                return 0.0
            while step.at(hi) < c:             # at() grows without bound beyond the records
                lo, hi = hi, hi * 2
                if hi > 1e12:
                    return math.inf
            for _ in range(200):               # bisection: at() is continuous and monotone
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if step.at(mid) < c else (lo, mid)
            return hi
    if step <= 0:
        raise ValueError("need a positive time per image")
    return c / step


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


def allreduce_table(grad_bytes: dict[str, float], links: dict[str, Link] = LINKS,
                    counts: tuple[int, ...] = (2, 4, 8)) -> str:
    """NCCL's all-reduce of each model's gradient (``{model: bytes}``) on every link and device
    count (:func:`.collective_time`: the link's published bandwidth, NCCL's latencies, the
    fastest protocol), with the protocol and the bus bandwidth at the largest count."""
    k = counts[-1]
    lines = ["| model | link | " + " | ".join(f"k={j}" for j in counts)
             + f" | protocol at k={k} | busbw at k={k} |", "|---" * (len(counts) + 4) + "|"]
    for model, n in grad_bytes.items():
        for name, link in links.items():
            t = [collective_time("all-reduce", n, j, link) for j in counts]
            lines.append(f"| {model} | {name} | " + " | ".join(fmt_seconds(x) for x in t)
                         + f" | {nccl_protocol('all-reduce', n, k, link)} | "
                         + f"{sig(bus_bandwidth(algorithm_bandwidth(n, t[-1]), k) / 1e9)} GB/s |")
    return "\n".join(lines)

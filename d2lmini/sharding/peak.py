"""The peak of a step.  What a device holds *between* steps is not what decides whether a
model fits: the peak *during* a step is.  ``peak_bytes`` accounts for it, moment by moment, for
the step the notebooks write (section "Peak Memory: By Model and By Layer"): replicated,
ZeRO-1/2/3 by whole model (the whole parameter vector and a whole gradient buffer exist during
the step), ZeRO-2 by layer (bucketed, one bucket per layer: each layer's gradient
reduce-scattered as soon as it is computed, as DeepSpeed's ZeRO-2 and FSDP's SHARD_GRAD_OP do
during the backward pass) and ZeRO-3 by layer (one layer gathered at a time, its gradient
reduce-scattered as soon as it is computed).
"""
from __future__ import annotations

import math
import sys

from .state import FP32_ADAM, PARTS, SHARDED_PARTS, Precision, shard_sizes, state_bytes


#: the schemes whose peak the notebooks measure: the four stages of ``train_step``, sharding one
#: flat buffer of the whole model (the first four), then the two that work layer by layer, each
#: layer's buffer sharded on its own: ZeRO-2 by layer (bucketed ZeRO-2, one bucket per layer:
#: DeepSpeed's ZeRO-2, FSDP's SHARD_GRAD_OP) and ZeRO-3 by layer (FSDP's full sharding with one
#: unit per layer, as its documentation recommends: ``fully_shard`` makes a unit of each module
#: it is applied to, no more)
SCHEMES = ("replicated", "ZeRO-1", "ZeRO-2", "ZeRO-3", "ZeRO-2 by layer", "ZeRO-3 by layer")


def scheme_stage(scheme: str) -> tuple[int, bool]:
    """``(stage, by_layer)`` of a scheme of :data:`SCHEMES`: which parts it shards
    (``SHARDED_PARTS``), and whether it works on each layer's buffer (by layer) or on one
    flat buffer of the whole model."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    by_layer = scheme.endswith(" by layer")
    return SCHEMES.index(scheme.removesuffix(" by layer")), by_layer

#: the peak-memory section's model: an MLP on Fashion-MNIST's 784 pixels, seven hidden layers of
#: 256 (598,282 parameters in eight layers, the largest 200,960): deep enough that one layer is a
#: small part of the model, small enough that 8 simulated devices step it in a second on a CPU
MLP_WIDTHS = (784, 256, 256, 256, 256, 256, 256, 256, 10)


def layer_sizes(widths=MLP_WIDTHS) -> list[int]:
    """Parameters of each dense layer of an MLP: its weight (d_in, d_out) and bias (d_out)."""
    return [a * b + b for a, b in zip(widths[:-1], widths[1:])]


def mlp_init(widths=MLP_WIDTHS, seed: int = 0) -> list:
    """The MLP's weights W_l ~ N(0, 2/d_in) (He), biases zero, float32, in the order
    W1, b1, W2, b2, ...: the same arrays in every framework."""
    import numpy as np
    rng = np.random.default_rng(seed)
    out = []
    for a, b in zip(widths[:-1], widths[1:]):
        out += [rng.normal(0, math.sqrt(2 / a), (a, b)).astype(np.float32),
                np.zeros(b, np.float32)]
    return out


class _Timeline:
    """Live bytes of one device, by kind; a moment is recorded at every allocation."""

    def __init__(self):
        self.live: dict[str, tuple[str, int]] = {}
        self.moments: list[tuple[str, dict[str, int]]] = []

    def alloc(self, name: str, kind: str, nbytes: int, moment: str | None = None,
              record: bool = True):
        if name in self.live:
            raise ValueError(f"{name} is already alive")
        self.live[name] = (kind, int(nbytes))
        if not record:                  # made by the same operation as the next allocation
            return
        parts = {}
        for k_, b in self.live.values():
            parts[k_] = parts.get(k_, 0) + b
        self.moments.append((moment or name, parts))

    def free(self, *names: str):
        for name in names:
            del self.live[name]


def peak_timeline(k: int, scheme: str, rows: int, widths=MLP_WIDTHS, device: int = 0,
                  precision: Precision = FP32_ADAM, act_itemsize: int = 4,
                  prefetch: int = 1, gather_itemsize: int | None = None,
                  sync: bool = True) -> list[tuple[str, dict[str, int]]]:
    """The bytes device ``device`` of k holds at every moment of one training step of an MLP
    (``widths``; ReLU between layers) on ``rows`` examples, when the step allocates an array:
    ``[(moment, {'state': .., 'params': .., 'grads': .., 'activations': ..}), ...]``.

    The step (the notebooks' ``peak_step``), on top of the **state** kept between steps
    (``state_bytes``: parameters, gradients, Adam's m and v, whole or this device's chunk;
    whole-model schemes cut one flat buffer of all n parameters, the schemes by layer cut each
    layer's buffer):

    - forward: the device's examples (rows x d_0), then each layer's output (rows x d_l), kept
      for the backward pass.  ZeRO-3 by whole model first gathers all n parameters (**params**)
      and keeps them to the end of the backward pass; ZeRO-3 by layer gathers layer l (with
      ``prefetch``, layer l+1 before computing l, as FSDP does) and frees it after computing l;
      ZeRO-2 by layer gathers nothing (its state holds every layer whole);
    - the loss gradient dz (rows x d_L), which replaces the logits;
    - backward, last layer first: one operation makes the layer's weight and bias gradients
      (one flat array, **grads**) and the gradient of its input, which replaces dz; then the
      input is freed.  By whole model the layer's gradient is copied into a whole gradient
      (replicated, ZeRO-1: the state's; ZeRO-2, -3: a whole buffer allocated for the backward
      pass, reduce-scattered after it, their chunk copied into the state) and dropped.  By
      layer, the layer's gradient is its own buffer -- ZeRO-2's bucket -- reduce-scattered as
      soon as the layer is done, its chunk copied into the state, and freed; ZeRO-3 by layer
      also gathers each layer again (prefetching l-1) and frees it after its backward;
    - Adam updates the device's part in place (ZeRO-1 and -2 then all-gather the parameters
      into the buffers they were updated in).

    So ZeRO-2 by layer peaks at about b_p n + (b_g + b_o) n / k + b_g max_l n_l + activations:
    the whole parameters, its shards, and one bucket; by whole model the bucket is the whole
    gradient, b_g n.  Collectives run in place; their messages in flight, the temporaries
    inside one operation (x @ W before + b, Adam's) and the labels are not counted.

    FSDP's knobs (section "FSDP's Knobs"):

    - ``prefetch``: how many layers ZeRO-3 by layer gathers ahead of the one it computes, in
      each pass (0: each layer just before it runs; 1: the next one, as FSDP does by default;
      True and False are 1 and 0);
    - ``gather_itemsize``: bytes of a gathered parameter (FSDP's ``param_dtype``; default the
      state's ``precision.params``): bfloat16 layers gathered from float32 shards, say;
    - ``sync=False``: a micro-batch of gradient accumulation without gradient sync (FSDP's
      ``set_requires_gradient_sync(False)``, DDP's ``no_sync``): the schemes that shard the
      gradients (stage 2, 3) keep a whole gradient (b_g n, **grads**) from the earlier
      micro-batches through the step, add each layer's gradient to it and reduce-scatter
      nothing."""
    stage, by_layer = scheme_stage(scheme)
    sizes, L = layer_sizes(widths), len(widths) - 1
    n = sum(sizes)
    if k < 1 or n < k:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= device < k:
        raise ValueError(f"device {device} of {k}")
    depth = int(prefetch)
    if depth < 0:
        raise ValueError(f"prefetch must be >= 0, got {prefetch}")
    bp, bg, ba = precision.params, precision.grads, act_itemsize
    bgather = bp if gather_itemsize is None else gather_itemsize
    kept = not sync and stage >= 2                   # a whole gradient across micro-batches
    t = _Timeline()
    act = lambda d: rows * d * ba
    gathers = by_layer and stage == 3                # layer by layer, when it is needed
    if by_layer:                                     # each layer's buffer cut on its own
        t.alloc("state", "state", sum(
            (shard_sizes(s, k)[device] if part in SHARDED_PARTS[stage] else s) * precision.of(part)
            for s in sizes for part in PARTS), "start")
    else:
        t.alloc("state", "state", state_bytes(n, k, stage, precision)[device]["total"], "start")
        if stage == 3:
            t.alloc("params", "params", n * bgather, "gather all parameters")
    if kept:
        t.alloc("kept", "grads", n * bg, "start: the gradient kept from earlier micro-batches")
    gather = lambda l: t.alloc(f"layer{l}", "params", sizes[l] * bgather, f"gather layer {l + 1}")
    t.alloc("x0", "activations", act(widths[0]), "forward: the examples")
    if gathers:
        for j in range(min(depth, L)):               # the first `depth` layers, ahead
            gather(j)
    for l in range(L):
        if gathers:
            if not depth:
                gather(l)
            elif l + depth < L:
                gather(l + depth)
        t.alloc(f"x{l + 1}", "activations", act(widths[l + 1]), f"forward: layer {l + 1}")
        if gathers:
            t.free(f"layer{l}")
    t.free(f"x{L}")                                  # the logits, replaced by dz
    t.alloc("dz", "activations", act(widths[L]), "loss gradient")
    if stage >= 2 and not by_layer and not kept:
        t.alloc("grads", "grads", n * bg, "backward: a whole gradient buffer")
    if gathers:
        for j in range(min(depth, L)):
            gather(L - 1 - j)
    for l in reversed(range(L)):
        if gathers:
            if not depth:
                gather(l)
            elif l - depth >= 0:
                gather(l - depth)
        t.free("dz")                                 # replaced by the input's gradient
        if by_layer:                                 # made with it: the layer's gradient
            t.alloc(f"g{l}", "grads", sizes[l] * bg, f"backward: layer {l + 1}", record=l == 0)
        if l > 0:
            t.alloc("dz", "activations", act(widths[l]), f"backward: layer {l + 1} input gradient")
        t.free(f"x{l}")
        if gathers:
            t.free(f"layer{l}")
        if by_layer:
            t.free(f"g{l}")
    return t.moments


def peak_parts(k: int, scheme: str, rows: int, widths=MLP_WIDTHS, device: int = 0,
               **kw) -> tuple[str, dict[str, int]]:
    """The moment of ``peak_timeline`` with the most bytes (the first such), and its parts."""
    moments = peak_timeline(k, scheme, rows, widths, device, **kw)
    return max(moments, key=lambda m: sum(m[1].values()))


def peak_bytes(k: int, scheme: str, rows, widths=MLP_WIDTHS, **kw) -> list[int]:
    """Peak bytes of each of k devices during one step (``peak_timeline``); ``rows`` is the
    examples per device, one number or one per device."""
    rows = [rows] * k if isinstance(rows, int) else list(rows)
    if len(rows) != k:
        raise ValueError(f"{len(rows)} row counts for {k} devices")
    return [sum(peak_parts(k, scheme, r, widths, i, **kw)[1].values())
            for i, r in enumerate(rows)]


def peak_rows(measure, counts, rows: int, schemes=SCHEMES, widths=MLP_WIDTHS) -> list[dict]:
    """Measure and compare: ``measure(j, scheme)`` returns the peak bytes of each of j devices.
    One row per (j, scheme): the largest device's ``measured`` and ``formula`` peaks, the
    per-device lists, and the formula's moment and parts of the peak."""
    out = []
    for j in counts:
        for scheme in schemes:
            measured = [int(b) for b in measure(j, scheme)]
            if len(measured) != j:
                raise ValueError(f"measure({j}, {scheme!r}) returned {len(measured)} devices")
            formula = peak_bytes(j, scheme, rows, widths)
            moment, parts = peak_parts(j, scheme, rows, widths,
                                       device=max(range(j), key=formula.__getitem__))
            out.append({"devices": j, "scheme": scheme, "measured": max(measured),
                        "formula": max(formula), "per_device": measured,
                        "formula_per_device": formula, "moment": moment, "parts": parts})
    return out


def peak_table(rows: list[dict], unit: int = 1 << 20) -> str:
    """The rows of ``peak_rows`` as a text table, MiB by default (the largest device)."""
    head = (f"{'devices':>7}  {'scheme':<15}  {'measured':>8}  {'formula':>8}  {'state':>6}"
            f"  {'params':>6}  {'grads':>6}  {'acts':>6}  peak moment")
    lines = [head, "-" * len(head)]
    for r in rows:
        p = r["parts"]
        lines.append(f"{r['devices']:>7}  {r['scheme']:<15}  {r['measured'] / unit:>8.2f}  "
                     f"{r['formula'] / unit:>8.2f}  {p.get('state', 0) / unit:>6.2f}  "
                     f"{p.get('params', 0) / unit:>6.2f}  {p.get('grads', 0) / unit:>6.2f}  "
                     f"{p.get('activations', 0) / unit:>6.2f}  {r['moment']}")
    return "\n".join(lines)


def peak_ok(rows: list[dict], tolerance: int = 0) -> bool:
    """Every device's measured peak equals the formula's within ``tolerance`` bytes."""
    return all(abs(m - f) <= tolerance for r in rows
               for m, f in zip(r["per_device"], r["formula_per_device"]))


def peak_rss_bytes() -> int:
    """This process's peak resident memory (the operating system's count), in bytes."""
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def max_abs_diff(a, b) -> float:
    """Largest absolute difference between two lists of arrays (anything ``numpy.asarray``
    takes), as a float; raises on a length or shape mismatch."""
    import numpy as np
    if len(a) != len(b):
        raise ValueError(f"{len(a)} arrays vs {len(b)}")
    worst = 0.0
    for x, y in zip(a, b):
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        if x.shape != y.shape:
            raise ValueError(f"shape {x.shape} vs {y.shape}")
        if x.size:
            worst = max(worst, float(np.max(np.abs(x - y))))
    return worst if math.isfinite(worst) else float("inf")



"""The framework-neutral half of sharded data parallelism (ZeRO stages 1-3, FSDP): which device
keeps which part of the training state, how many bytes that is, and what the collectives move.

Plain data parallelism (stage 0) keeps on each of k devices the whole training state of a model
with n parameters: parameters, gradients and optimizer state.  ZeRO (Rajbhandari et al., 2020)
cuts the flat buffer of each part into k chunks (``chunk_slices``: sizes differ by at most one)
and device i keeps only chunk i of

    stage 1  the optimizer state               (ZeRO-1, "os")
    stage 2  the optimizer state and gradients (ZeRO-2, "os+g")
    stage 3  all three                         (ZeRO-3, "p+g+os"; FSDP's full sharding)

A step then reduce-scatters the gradients (device i receives the sum of chunk i), updates its
chunk of the parameters with its chunk of the optimizer state, and all-gathers the parameters.
Reduce-scatter plus all-gather is exactly the ring all-reduce's two halves, so stages 1 and 2
move the same bytes as plain data parallelism; stage 3 gathers the parameters again before the
backward pass (they were dropped after the forward pass): 1.5 times the bytes.

The notebooks measure the bytes each device holds and compare them with ``state_bytes``.

What a device holds *between* steps is not what decides whether a model fits: the peak *during*
a step is.  ``peak_bytes`` accounts for it, moment by moment, for the step the notebooks write
(section "Peak Memory: By Model and By Layer"): replicated, ZeRO-1/2/3 by whole model (the whole
parameter vector and a whole gradient buffer exist during the step), ZeRO-2 by layer (bucketed,
one bucket per layer: each layer's gradient reduce-scattered as soon as it is computed, as
DeepSpeed's ZeRO-2 and FSDP's SHARD_GRAD_OP do during the backward pass) and ZeRO-3 by layer
(one layer gathered at a time, its gradient reduce-scattered as soon as it is computed).
"""
from __future__ import annotations

import dataclasses
import math
import sys

from .collectives import Transfer, chunk_slices, traffic

__all__ = ["STAGES", "STAGE_NAMES", "SHARDED_PARTS", "PARTS", "Precision", "FP32_ADAM",
           "MIXED_ADAM", "reduce_scatter_schedule", "all_gather_schedule", "shard_sizes",
           "state_bytes", "bytes_per_parameter", "step_traffic", "memory_rows", "memory_table",
           "memory_ok", "row_shard_elements", "peak_rss_bytes", "max_abs_diff", "ALLCLOSE_ATOL",
           "SCHEMES", "scheme_stage", "MLP_WIDTHS", "mlp_init", "layer_sizes", "peak_timeline",
           "peak_bytes", "peak_parts", "peak_rows", "peak_table", "peak_ok", "RECOMPUTE_SEGMENTS", "RECOMPUTE_ROWS",
           "activation_timeline", "activation_peak", "recompute_flops", "activation_rows",
           "activation_table", "plot_activations", "step_collectives", "step_comm_time",
           "stage_time_rows", "stage_time_table", "gpt2_units", "BF16_GRAD_TOL", "mlp_units",
           "fsdp_collective_bytes", "gathered_elements", "prefetch_bytes", "kept_grad_bytes", "init_peak_bytes",
           "fsdp_init_peak_bytes",
           "layer_moments", "knob_formula_rows", "knob_table", "plot_layer_bytes"]

STAGES = (0, 1, 2, 3)
STAGE_NAMES = {0: "replicated", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
PARTS = ("params", "grads", "optimizer")
#: the parts of the training state that stage s shards over the devices
SHARDED_PARTS = {0: (), 1: ("optimizer",), 2: ("optimizer", "grads"),
                 3: ("optimizer", "grads", "params")}

#: tolerance of the proofs "sharded == replicated" (float32 Adam after a few steps)
ALLCLOSE_ATOL = 1e-6


@dataclasses.dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each part of the training state."""
    name: str
    params: int
    grads: int
    optimizer: int

    def of(self, part: str) -> int:
        return getattr(self, part)


#: this chapter's own setting: float32 parameters and gradients, Adam's m and v in float32
FP32_ADAM = Precision("float32 Adam", params=4, grads=4, optimizer=8)
#: the ZeRO paper's setting: 16-bit parameters and gradients; float32 master copy, m and v
#: (K = 12) -- the well-known 2 + 2 + 12 = 16 bytes per parameter
MIXED_ADAM = Precision("mixed-precision Adam", params=2, grads=2, optimizer=12)


def reduce_scatter_schedule(k: int) -> list[list[Transfer]]:
    """The ring's reduce-scatter, arranged so that device i ends with the full sum of chunk i
    (the chunk it owns): k-1 steps; at step s device i sends chunk (i-1-s) mod k to i+1."""
    if k < 1:
        raise ValueError(f"need at least one device, got {k}")
    return [[Transfer("reduce-scatter", s, i, (i + 1) % k, (i - 1 - s) % k, "add")
             for i in range(k)] for s in range(k - 1)]


def all_gather_schedule(k: int) -> list[list[Transfer]]:
    """The ring's all-gather from owners: device i starts with chunk i; k-1 steps; at step s
    device i sends chunk (i-s) mod k to i+1, which overwrites its copy."""
    if k < 1:
        raise ValueError(f"need at least one device, got {k}")
    return [[Transfer("all-gather", s, i, (i + 1) % k, (i - s) % k, "copy")
             for i in range(k)] for s in range(k - 1)]


def shard_sizes(n: int, k: int) -> list[int]:
    """Elements of chunk i of a flat buffer of n elements, for each device i."""
    return [s.stop - s.start for s in chunk_slices(n, k)]


def state_bytes(n: int, k: int, stage: int, precision: Precision = FP32_ADAM) -> list[dict]:
    """Bytes of parameters, gradients and optimizer state each of k devices keeps between steps
    at ``stage``, when the n parameters are sharded as one flat buffer (``chunk_slices``).
    One dict per device: ``{'params', 'grads', 'optimizer', 'total'}``."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage}")
    if k < 1 or n < k:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    out = []
    for size in shard_sizes(n, k):
        row = {part: (size if part in SHARDED_PARTS[stage] else n) * precision.of(part)
               for part in PARTS}
        row["total"] = sum(row[p] for p in PARTS)
        out.append(row)
    return out


def bytes_per_parameter(k: int, stage: int, precision: Precision = FP32_ADAM) -> float:
    """The ZeRO paper's formula: bytes of training state per parameter on each device, e.g.
    2 + 2 + 12/k for ZeRO-1 with mixed-precision Adam, (2 + 2 + 12)/k for ZeRO-3."""
    return sum(precision.of(p) / (k if p in SHARDED_PARTS[stage] else 1) for p in PARTS)


def step_traffic(n: int, k: int, stage: int, itemsize: int = 4,
                 regather: bool = True) -> dict[str, list[int]]:
    """Bytes each device sends in one training step, per collective, with the ring schedules:
    stage 0 all-reduces the gradients (reduce-scatter then all-gather: in total the bytes of
    ``ring_schedule``; per device within two elements of it, as the chunks go to their owners); stages 1 and 2 reduce-scatter them and all-gather the
    updated parameters; stage 3 all-gathers the parameters before the forward pass, again
    before the backward pass (``regather``; False: they are kept from the forward pass) and
    reduce-scatters the gradients.  ``{collective: [bytes per device], ..., 'total': [...]}``."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage}")
    rs = traffic(reduce_scatter_schedule(k), n, k, itemsize)["sent"]
    ag = traffic(all_gather_schedule(k), n, k, itemsize)["sent"]
    if stage == 0:   # the all-reduce as its two halves (the ring's totals, chunks by owner)
        out = {"all-reduce": [a + b for a, b in zip(rs, ag)]}
    elif stage in (1, 2):
        out = {"reduce-scatter": rs, "all-gather": ag}
    else:
        out = {"all-gather (forward)": ag}
        if regather:
            out["all-gather (backward)"] = ag
        out["reduce-scatter"] = rs
    out["total"] = [sum(v[i] for v in out.values()) for i in range(k)]
    return out


def table_counts(k: int) -> list[int]:
    """The device counts a notebook's memory tables measure: 1, then the communication
    chapter's sweep (2, 4, 8 up to k, and k itself; ``commcost.device_counts``). Every count
    from 1 to 8 is measured where the notebook runs with that k (``make sweep``)."""
    from .commcost import device_counts
    return [1] + device_counts(k)


def memory_rows(measure, n: int, counts, stages=STAGES,
                precision: Precision = FP32_ADAM) -> list[dict]:
    """Measure and compare: ``measure(j, stage)`` returns, for j devices, one dict per device
    of the bytes it holds (``{'params', 'grads', 'optimizer'}``).  One row per (j, stage) with
    the largest device's measured bytes, the per-device lists (``measured``) and the replicated
    bytes divided by j for the sharded parts (``replicated_over_k``, per part and in total)."""
    rows = []
    for j in counts:
        for stage in stages:
            measured = measure(j, stage)
            if len(measured) != j:
                raise ValueError(f"measure({j}, {stage}) returned {len(measured)} devices")
            row = {"devices": j, "stage": STAGE_NAMES[stage], "level": stage,
                   "measured": [{p: int(m[p]) for p in PARTS} for m in measured]}
            for part in PARTS:
                row[part] = max(m[part] for m in row["measured"])
                row[f"{part}_over_k"] = n * precision.of(part) / (
                    j if part in SHARDED_PARTS[stage] else 1)
            row["total"] = max(sum(m[p] for p in PARTS) for m in row["measured"])
            row["replicated_over_k"] = sum(row[f"{p}_over_k"] for p in PARTS)
            rows.append(row)
    return rows


def memory_ok(rows: list[dict], precision: Precision = FP32_ADAM,
              slack_elements: float = 1) -> bool:
    """Every device holds, of each unsharded part, exactly the replicated bytes and, of each
    sharded part, the replicated bytes divided by k within ``slack_elements`` parameters' worth
    of bytes.  One element is the hand-written ZeRO's bound (chunks of n/k rounded up or
    down); a framework that shards each tensor along its first axis needs one row per tensor."""
    for r in rows:
        for m in r["measured"]:
            for part in PARTS:
                bound = slack_elements * precision.of(part) if part in SHARDED_PARTS[r["level"]] else 0
                if abs(m[part] - r[f"{part}_over_k"]) > bound:
                    return False
    return True


def row_shard_elements(shapes, k: int) -> int:
    """The most elements any one of k ranks holds when every tensor is cut along its first
    axis into chunks of ceil(d0/k) rows (FSDP2's ``Shard(0)``, ``torch.chunk``): the last
    ranks may hold fewer rows, or none."""
    return sum(math.ceil(s[0] / k) * math.prod(s[1:]) for s in shapes)


def memory_table(rows: list[dict], unit: int = 1024) -> str:
    """The rows of ``memory_rows`` as a text table, KiB by default (the largest device)."""
    head = (f"{'devices':>7}  {'stage':<10}  {'params':>9}  {'grads':>9}  {'optimizer':>9}"
            f"  {'total':>9}  {'formula':>12}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['devices']:>7}  {r['stage']:<10}  {r['params'] / unit:>9.1f}  "
                     f"{r['grads'] / unit:>9.1f}  {r['optimizer'] / unit:>9.1f}  "
                     f"{r['total'] / unit:>9.1f}  {r['replicated_over_k'] / unit:>12.1f}")
    return "\n".join(lines)


# --- the peak of a step -------------------------------------------------------------------------

#: the schemes whose peak the notebooks measure: the four stages of ``train_step``, sharding one
#: flat buffer of the whole model (the first four), then the two that work layer by layer, each
#: layer's buffer sharded on its own: ZeRO-2 by layer (bucketed ZeRO-2, one bucket per layer:
#: DeepSpeed's ZeRO-2, FSDP's SHARD_GRAD_OP) and ZeRO-3 by layer (FSDP's full sharding with one
#: unit per layer, as its documentation recommends: ``fully_shard`` makes a unit of each module
#: it is applied to, no more)
SCHEMES = ("replicated", "ZeRO-1", "ZeRO-2", "ZeRO-3", "ZeRO-2 by layer", "ZeRO-3 by layer")


def scheme_stage(scheme: str) -> tuple[int, bool]:
    """``(stage, by_layer)`` of a scheme of :data:`SCHEMES`: which parts it shards
    (:data:`SHARDED_PARTS`), and whether it works on each layer's buffer (by layer) or on one
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


# ------------------------------------------------------------------ activations and recomputation
#: the segment lengths the notebooks measure: 0 keeps every layer's input (no recomputation);
#: s >= 1 keeps the input of every s-th layer (0, s, 2s, ...) and recomputes the others
RECOMPUTE_SEGMENTS = (0, 1, 2, 3, 4, 8)
#: examples per device in the recomputation section: enough that activations outweigh one layer
RECOMPUTE_ROWS = 256


def _kept(l: int, segment: int) -> bool:
    return segment == 0 or l % segment == 0


def activation_timeline(rows: int, segment: int = 0, widths=MLP_WIDTHS,
                        itemsize: int = 4) -> list[tuple[str, dict[str, int]]]:
    """The activation bytes one device holds at every moment of one forward and backward pass
    of an MLP (``widths``; ReLU between layers) on ``rows`` examples, with recomputation
    (activation checkpointing) by segments of ``segment`` layers (0: none).

    - forward: the examples x_0, then each layer's output x_{l+1}; a layer's input x_l is
      freed once x_{l+1} exists unless it is a checkpoint (segment 0: every input is kept;
      else the inputs of layers 0, s, 2s, ...); the logits are replaced by the loss gradient dz;
    - backward, segment by segment from the last: the segment's inputs that were not kept
      are recomputed from its checkpoint, in order (one more forward of those layers); then,
      last layer first, dz is replaced by the gradient of the layer's input, and the input
      is freed.

    The same moments as :func:`peak_timeline`'s replicated step (activations only); the
    parameter gradients go into the state's buffer and are not counted here."""
    L = len(widths) - 1
    if segment < 0 or rows < 1:
        raise ValueError(f"need segment >= 0 and rows >= 1, got {segment}, {rows}")
    s = segment or L
    t, act = _Timeline(), (lambda d: rows * d * itemsize)
    t.alloc("x0", "activations", act(widths[0]), "forward: the examples")
    for l in range(L):
        t.alloc(f"x{l + 1}", "activations", act(widths[l + 1]), f"forward: layer {l + 1}")
        if not _kept(l, segment):
            t.free(f"x{l}")
    t.free(f"x{L}")
    t.alloc("dz", "activations", act(widths[L]), "loss gradient")
    for a in reversed(range(0, L, s)):
        b = min(a + s, L)
        for l in range(a, b - 1):
            if not _kept(l + 1, segment):
                t.alloc(f"x{l + 1}", "activations", act(widths[l + 1]),
                        f"backward: recompute layer {l + 1}")
        for l in reversed(range(a, b)):
            t.free("dz")
            if l > 0:
                t.alloc("dz", "activations", act(widths[l]),
                        f"backward: layer {l + 1} input gradient")
            t.free(f"x{l}")
    return t.moments


def activation_peak(rows: int, segment: int = 0, widths=MLP_WIDTHS, itemsize: int = 4) -> int:
    """Peak activation bytes of :func:`activation_timeline`."""
    return max(sum(p.values()) for _, p in activation_timeline(rows, segment, widths, itemsize))


def recompute_flops(rows: int, segment: int = 0, widths=MLP_WIDTHS) -> dict:
    """Matrix-product FLOPs of one step of the MLP (forward, backward: weight gradients and,
    above the first layer, input gradients) and the extra forward FLOPs that recomputation by
    ``segment`` adds; biases, ReLU and softmax are left out."""
    L = len(widths) - 1
    mm = [2 * rows * a * b for a, b in zip(widths[:-1], widths[1:])]
    step = sum(mm) + sum(mm) + sum(mm[1:])
    extra = sum(mm[l] for l in range(L - 1) if not _kept(l + 1, segment))
    return {"step": step, "extra": extra, "extra_fraction": extra / step}


def activation_rows(measure, segments=RECOMPUTE_SEGMENTS, rows: int = RECOMPUTE_ROWS,
                    widths=MLP_WIDTHS) -> list[dict]:
    """Measure and compare: ``measure(segment)`` returns the peak activation bytes of one
    device.  One row per segment: measured, formula, the kept inputs, the extra compute."""
    L, out = len(widths) - 1, []
    for s in segments:
        flops = recompute_flops(rows, s, widths)
        out.append({"segment": s, "measured": int(measure(s)),
                    "formula": activation_peak(rows, s, widths),
                    "kept": sum(_kept(l, s) for l in range(L)),
                    "extra_fraction": flops["extra_fraction"]})
    return out


def activation_table(rows: list[dict], unit: int = 1 << 20) -> str:
    """The rows of :func:`activation_rows` as a text table (MiB by default)."""
    head = (f"{'segment':>7}  {'inputs kept':>11}  {'measured':>8}  {'formula':>8}  "
            f"{'vs none':>7}  {'extra compute':>13}")
    none = next((r["measured"] for r in rows if r["segment"] == 0), None)
    lines = [head, "-" * len(head)]
    for r in rows:
        rel = f"{r['measured'] / none:7.2f}" if none else f"{'':>7}"
        lines.append(f"{r['segment'] or 'none':>7}  {r['kept']:>11}  {r['measured'] / unit:>8.2f}  "
                     f"{r['formula'] / unit:>8.2f}  {rel}  {100 * r['extra_fraction']:>12.0f}%")
    return "\n".join(lines)


def plot_activations(rows: list[dict], depths=(8, 32, 128), width: int = 256,
                     batch: int = RECOMPUTE_ROWS, ax=None):
    """Peak activation memory against extra compute, one point per segment length: the
    measured rows (markers) and the formula for deeper MLPs of the same width (lines), each
    relative to keeping every input.  Returns the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.5))
    none = next(r["measured"] for r in rows if r["segment"] == 0)
    for depth in depths:
        widths = (MLP_WIDTHS[0],) + (width,) * (depth - 1) + (MLP_WIDTHS[-1],)
        segs = sorted({s for s in range(1, depth + 1) if depth % s == 0 or s == round(math.sqrt(depth))})
        base = activation_peak(batch, 0, widths)
        pts = [(100 * recompute_flops(batch, s, widths)["extra_fraction"],
                activation_peak(batch, s, widths) / base) for s in [0] + segs]
        xs, ys = zip(*sorted(pts))
        ax.plot(xs, ys, "-", alpha=0.6, label=f"formula, {depth} layers")
    xs = [100 * r["extra_fraction"] for r in rows]
    ys = [r["measured"] / none for r in rows]
    ax.plot(xs, ys, "ko", label="measured, this notebook's MLP")
    for r, x, y in zip(rows, xs, ys):
        ax.annotate(f"s={r['segment']}" if r["segment"] else "none", (x, y),
                    textcoords="offset points", fontsize=8,
                    xytext=(4, -11) if r["segment"] == 1 else (4, 4))
    ax.set_xlabel("extra compute: recomputed forward, % of the step's FLOPs")
    ax.set_ylabel("peak activations / without recomputation")
    ax.set_ylim(0, 1.1)
    ax.legend(fontsize=8)
    return ax


# ------------------------------------------------------------------ the stages in time
def step_collectives(sizes, stage_or_scheme, itemsize: int = 4) -> list[tuple[str, int]]:
    """The collectives one training step issues, ``[(op, bytes of the whole buffer), ...]``,
    for a model whose sharding units (layers) have ``sizes`` parameters: replicated, one
    all-reduce of the gradient; ZeRO-1 and -2, a reduce-scatter of the gradient and an
    all-gather of the updated parameters; ZeRO-3 by whole model (gathered once per step), an
    all-gather and a reduce-scatter; ZeRO-2 by layer, a reduce-scatter per layer (its bucket,
    during the backward pass) and an all-gather per layer after the update; ZeRO-3 by layer,
    per layer two all-gathers (forward and backward) and one reduce-scatter.  By whole model,
    one collective per buffer."""
    scheme = STAGE_NAMES.get(stage_or_scheme, stage_or_scheme)
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {stage_or_scheme!r}")
    n = sum(sizes) * itemsize
    if scheme == "replicated":
        return [("all-reduce", n)]
    if scheme in ("ZeRO-1", "ZeRO-2"):
        return [("reduce-scatter", n), ("all-gather", n)]
    if scheme == "ZeRO-3":
        return [("all-gather", n), ("reduce-scatter", n)]
    if scheme == "ZeRO-2 by layer":
        return ([("reduce-scatter", s * itemsize) for s in reversed(sizes)]
                + [("all-gather", s * itemsize) for s in sizes])
    return [(op, s * itemsize) for s in sizes
            for op in ("all-gather", "all-gather", "reduce-scatter")]


def step_comm_time(sizes, k: int, scheme, link, itemsize: int = 4) -> float:
    """Predicted seconds of the collectives of one step (:func:`step_collectives`) on k GPUs
    over ``link``, each with NCCL's latency and bandwidth model
    (:func:`d2lmini.commcost.collective_time`), run one after another (no overlap)."""
    from .commcost import collective_time
    return float(sum(collective_time(op, b, k, link) for op, b in
                     step_collectives(sizes, scheme, itemsize)))


def stage_time_rows(models: dict, k: int, links, itemsize: int = 4) -> list[dict]:
    """One row per (model, link, scheme): the bytes each device sends in a step (ring) and
    the predicted collective time, and both relative to replicated.  ``models``:
    ``{name: layer sizes}`` (each of ``itemsize`` bytes) or ``{name: (layer sizes, itemsize)}``;
    ``links``: :class:`d2lmini.commcost.Link` objects."""
    from .commcost import collective_coefficients
    out = []
    for name, model in models.items():
        sizes, size = (model if isinstance(model, tuple) and len(model) == 2
                       and isinstance(model[0], (list, tuple)) else (model, itemsize))
        for link in links:
            base = step_comm_time(sizes, k, "replicated", link, size)
            for scheme in SCHEMES:
                t = step_comm_time(sizes, k, scheme, link, size)
                sent = sum(collective_coefficients(op, k)[1] * b     # bytes per device, ring
                           for op, b in step_collectives(sizes, scheme, size))
                out.append({"model": name, "parameters": sum(sizes), "layers": len(sizes),
                            "link": link.name, "scheme": scheme, "sent": sent, "seconds": t,
                            "vs_replicated": t / base if base else float("nan")})
    return out


def stage_time_table(rows: list[dict]) -> str:
    """The rows of :func:`stage_time_rows` as a Markdown table: one row per model and link,
    one column per scheme, the predicted time and its ratio to replicated."""
    from .commcost import fmt_seconds
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    lines = ["| model | link | " + " | ".join(schemes) + " |",
             "|---|---|" + "---:|" * len(schemes)]
    for key in dict.fromkeys((r["model"], r["link"]) for r in rows):
        cells = {r["scheme"]: r for r in rows if (r["model"], r["link"]) == key}
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(
            f"{fmt_seconds(cells[s]['seconds'])} ({cells[s]['vs_replicated']:.2f}x)" for s in schemes) + " |")
    return "\n".join(lines)


def gpt2_units(layers: int = 48, width: int = 1600, vocab: int = 50257,
               context: int = 1024) -> list[int]:
    """Parameters of GPT-2's FSDP units, one per transformer block plus the root (Radford et al.
    2019; defaults: GPT-2 XL, 1,557,611,200 parameters): the root holds the token and position
    embeddings (the output layer shares the token embedding) and the final LayerNorm; a block
    holds 12 width^2 weights (attention's qkv and output, the MLP's two matrices), their biases
    (9 width) and two LayerNorms (4 width)."""
    root = (vocab + context) * width + 2 * width
    return [root] + [12 * width * width + 13 * width] * layers


# ------------------------------------------------------------------ FSDP's knobs
#: bound of the gradient difference that computing the peak section's MLP in bfloat16 (FSDP's
#: ``param_dtype``) makes, relative to the largest float32 entry: 3 % to 11 % measured on batches
#: of 8 to 64 Fashion-MNIST images (eight layers, each in 8 significant bits, forward and back);
#: the bound leaves more than twice that
BF16_GRAD_TOL = 0.25


def mlp_units(widths=MLP_WIDTHS) -> list[list[tuple[int, ...]]]:
    """The MLP's FSDP units, one per layer, as the shapes of its tensors in PyTorch's layout:
    ``nn.Linear`` keeps its weight as (d_out, d_in), so FSDP2's ``Shard(0)`` cuts output rows."""
    return [[(b, a), (b,)] for a, b in zip(widths[:-1], widths[1:])]


def fsdp_collective_bytes(units, k: int, param_itemsize: int = 4,
                          reduce_itemsize: int | None = None, regather: bool = True) -> dict:
    """Bytes one rank hands FSDP's collectives in one training step when every unit (a list of
    tensor shapes) is sharded along its first axis (``row_shard_elements``: ceil(d0/k) rows per
    rank, padded): an all-gather per unit gets the rank's shards in ``param_itemsize`` bytes
    (FSDP's ``param_dtype``) before the forward pass and, resharded after it (``regather``),
    again before the backward pass; a reduce-scatter per unit gets the unit's whole padded
    gradient, k shards, in ``reduce_itemsize`` bytes (``reduce_dtype``; None: the
    ``param_itemsize``).  One rank (k = 1) calls no collective.
    ``{'all-gather': bytes, 'reduce-scatter': bytes}``."""
    if k < 1:
        raise ValueError(f"need k >= 1, got {k}")
    if k == 1:
        return {"all-gather": 0, "reduce-scatter": 0}
    shard = sum(row_shard_elements(u, k) for u in units)
    b_r = param_itemsize if reduce_itemsize is None else reduce_itemsize
    return {"all-gather": shard * param_itemsize * (2 if regather else 1),
            "reduce-scatter": k * shard * b_r}


def gathered_elements(units, k: int) -> list[int]:
    """Elements of each unit as FSDP gathers it on k ranks: k padded shards of
    ``row_shard_elements`` each (ceil(d0/k) rows of every tensor), so the gathered unit is the
    whole unit plus the padding of its last rows; one rank gathers nothing and uses the unit."""
    return [k * row_shard_elements(u, k) if k > 1 else sum(math.prod(s) for s in u) for u in units]


def prefetch_bytes(sizes, depth: int, itemsize: int = 4, backward: bool = False) -> list[int]:
    """For each layer l, the bytes of the layers gathered *ahead* while l computes, when each
    layer prefetches the next ``depth`` layers of its pass: l+1, ..., l+depth in the forward
    pass, l-1, ..., l-depth in the backward pass (those that exist); ``sizes``: parameters per
    layer, each gathered in ``itemsize`` bytes.  Prefetching one layer more adds that layer."""
    if depth < 0:
        raise ValueError(f"depth must be >= 0, got {depth}")
    L = len(sizes)
    ahead = (lambda l: range(max(l - depth, 0), l)) if backward else (
        lambda l: range(l + 1, min(l + 1 + depth, L)))
    return [itemsize * sum(sizes[j] for j in ahead(l)) for l in range(L)]


def kept_grad_bytes(units, k: int, itemsize: int = 4, sync: bool = True) -> int:
    """Gradient bytes one rank keeps between the micro-batches of an accumulated step: with the
    gradients synced (reduce-scattered) after every micro-batch, its shards (``row_shard_elements``
    of every unit); without (FSDP's ``set_requires_gradient_sync(False)``), every unit's whole
    gradient until the last micro-batch."""
    if sync:
        return itemsize * sum(row_shard_elements(u, k) for u in units)
    return itemsize * sum(math.prod(s) for u in units for s in u)


def init_peak_bytes(sizes, shards, itemsize: int = 4, deferred: bool = False) -> int:
    """Peak parameter bytes of one rank while a model is built and sharded unit by unit, in
    order: ``sizes`` are the units' parameters, ``shards`` the rank's part of each (as
    allocated, padding included).  Built whole first (eager), unit u is replaced by its shard
    while the units after it are still whole: the peak is max_u (sum_{j>=u} n_j + sum_{j<=u}
    s_j), the whole model and the first shard when shards are smaller than their units.
    Built on the meta device (``deferred``), no unit holds memory until the shards are
    allocated: sum_u s_u."""
    sizes, shards = list(sizes), list(shards)
    if len(sizes) != len(shards):
        raise ValueError(f"{len(sizes)} units but {len(shards)} shards")
    if deferred:
        return itemsize * sum(shards)
    return itemsize * max(sum(sizes[u:]) + sum(shards[:u + 1]) for u in range(len(sizes)))


def fsdp_init_peak_bytes(units, k: int, rank: int = 0, itemsize: int = 4,
                         deferred: bool = False) -> int:
    """:func:`init_peak_bytes` for FSDP2's row sharding, on rank ``rank`` of k: each tensor's
    shard is allocated padded to ceil(d0/k) rows (``row_shard_elements``).  Eager: the whole
    model, then unit by unit its padded shards while the later units are still whole.
    Deferred (``to_empty`` after ``fully_shard`` on the meta device): unit by unit, each tensor
    is allocated with the rank's own rows; a *short* one (fewer rows than ceil(d0/k): the last
    ranks when k does not divide d0) is then copied into a padded buffer, and for that moment
    both exist."""
    if not 0 <= rank < k:
        raise ValueError(f"rank {rank} of {k}")
    padded = lambda s: math.ceil(s[0] / k) * math.prod(s[1:])
    own = lambda s: max(0, min(math.ceil(s[0] / k), s[0] - rank * math.ceil(s[0] / k))) * math.prod(s[1:])
    if not deferred:
        return init_peak_bytes([sum(math.prod(s) for s in u) for u in units],
                               [row_shard_elements(u, k) for u in units], itemsize)
    done, peak = 0, 0
    for u in units:
        live = done + sum(own(s) for s in u)         # the unit's tensors, the rank's rows
        peak = max(peak, live)
        for s in u:
            if own(s) != padded(s):                  # copied into its padded buffer
                peak = max(peak, live + padded(s))
                live += padded(s) - own(s)
        done = live
    return itemsize * peak


def layer_moments(k: int, scheme: str, rows: int, widths=MLP_WIDTHS, device: int = 0,
                  **kw) -> dict[str, list[int]]:
    """The bytes of :func:`peak_timeline` while each layer computes: in the forward pass when
    its output is made, in the backward pass at its last moment (its input's gradient; the
    first layer's weight gradient).  ``{'forward': [per layer], 'backward': [per layer]}``."""
    L = len(widths) - 1
    at = {}
    for name, parts in peak_timeline(k, scheme, rows, widths, device, **kw):
        at[name] = sum(parts.values())               # the last moment of that name
    fw = [at[f"forward: layer {l + 1}"] for l in range(L)]
    bw = [at[f"backward: layer {l + 1} input gradient"] if l else at["backward: layer 1"]
          for l in range(L)]
    return {"forward": fw, "backward": bw}


def knob_formula_rows(k: int, rows: int, widths=MLP_WIDTHS, device: int = 0) -> list[dict]:
    """What each of FSDP's knobs changes in the formula's ZeRO-3 by layer on the MLP
    (``peak_bytes``, k devices, ``rows`` examples per device, float32 Adam): the peak of a step
    by default (float32 layers gathered one layer ahead, gradients reduce-scattered every
    micro-batch) and with the knob, and the peak of building the model whole or deferred
    (``init_peak_bytes``, each layer's flat buffer cut in k chunks).  One dict per knob:
    ``{'knob', 'what', 'default', 'knob_on'}`` (bytes of the largest device)."""
    peak = lambda **kw: max(peak_bytes(k, "ZeRO-3 by layer", rows, widths, **kw))
    sizes = layer_sizes(widths)
    shards = [max(shard_sizes(s, k)) for s in sizes]
    base = peak()
    return [
        {"knob": "param_dtype=bfloat16", "what": "peak of a step: layers gathered in 2 bytes",
         "default": base, "knob_on": peak(gather_itemsize=2)},
        {"knob": "no prefetch", "what": "peak of a step: each layer gathered just before it runs",
         "default": base, "knob_on": peak(prefetch=0)},
        {"knob": "prefetch 2 layers", "what": "peak of a step: two layers gathered ahead",
         "default": base, "knob_on": peak(prefetch=2)},
        {"knob": "no gradient sync", "what": "peak of a micro-batch: whole gradient kept",
         "default": base, "knob_on": peak(sync=False)},
        {"knob": "meta-device init", "what": "peak of building the model: shards only",
         "default": init_peak_bytes(sizes, shards), "knob_on": init_peak_bytes(sizes, shards, deferred=True)},
    ]


def knob_table(rows: list[dict], unit: int = 1024) -> str:
    """Rows of knobs as a Markdown table (KiB by default): ``{'knob', 'what', 'default',
    'knob_on'}`` and, where measured, ``'formula_default'``, ``'formula_on'`` (the formula
    beside the measurement)."""
    measured = any("formula_on" in r for r in rows)
    head = ["knob", "what", "default", "with the knob"] + (["formula"] if measured else [])
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    fmt = lambda b: f"{b / unit:,.1f}"
    for r in rows:
        cells = [f"`{r['knob']}`", r["what"], fmt(r["default"]), fmt(r["knob_on"])]
        if measured:
            cells.append(f"{fmt(r['formula_default'])} → {fmt(r['formula_on'])}"
                         if "formula_on" in r else "--")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_layer_bytes(series: dict, unit: int = 1 << 20, ylabel: str | None = None, ax=None):
    """Bytes while each layer computes, forward (layers 1..L) then backward (L..1), one line
    per setting: ``series`` is ``{label: {'forward': [...], 'backward': [...]}}`` (one value
    per layer, first layer first).  Returns the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    L = None
    for label, s in series.items():
        L = len(s["forward"])
        ys = list(s["forward"]) + list(reversed(s["backward"]))
        ax.plot(range(2 * L), [y / unit for y in ys], "o-", ms=3, label=label)
    ax.set_xticks(range(2 * L), [str(l + 1) for l in range(L)] + [str(l) for l in range(L, 0, -1)],
                  fontsize=8)
    ax.axvline(L - 0.5, color="gray", lw=0.8, ls=":")
    ax.set_xlabel("layer computing: forward pass | backward pass")
    ax.set_ylabel(ylabel or ("MiB" if unit == 1 << 20 else "bytes"))
    ax.legend(fontsize=8)
    return ax

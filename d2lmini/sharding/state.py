"""The training state between steps: which device keeps which part of it at ZeRO stage 0-3, how
many bytes that is, and what the collectives of one step move.

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
"""
from __future__ import annotations

import dataclasses
import math

from ..collectives import Transfer, chunk_slices, traffic
from ..commcost.timing import device_counts


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


def zero_stage(stage) -> int:
    """A ZeRO stage as a number: 0-3, or its name ("ZeRO-2", "zero2", "replicated", "DDP");
    anything else is refused, naming what is accepted."""
    if isinstance(stage, str):
        key = stage.strip().lower().replace("-", "").replace("_", "").replace(" ", "")
        names = {"replicated": 0, "ddp": 0, "zero0": 0, "zero1": 1, "zero2": 2, "zero3": 3,
                 "fsdp": 3}
        if key in names:
            return names[key]
    elif isinstance(stage, int) and not isinstance(stage, bool) and stage in STAGES:
        return stage
    raise ValueError(f"unknown ZeRO stage {stage!r}: give 0, 1, 2 or 3, or 'ZeRO-1', 'ZeRO-2', "
                     f"'ZeRO-3' ('replicated' or 'DDP' for 0, 'FSDP' for 3)")


def bytes_per_parameter(k: int, stage, precision: Precision = FP32_ADAM) -> float:
    """The ZeRO paper's formula: bytes of training state (parameters, gradients, optimizer
    state; no activations) per parameter on each of k devices at ``stage`` (0-3 or
    "ZeRO-1"...), e.g. 2 + 2 + 12/k for ZeRO-1 with mixed-precision Adam, (2 + 2 + 12)/k for
    ZeRO-3.  The ZeRO paper's Figure 1 (7.5 B parameters, 64 GPUs, mixed-precision Adam: 120,
    31.4, 16.6 and 1.9 GB per GPU):

    >>> from d2lmini.sharding import MIXED_ADAM, bytes_per_parameter
    >>> [round(7.5e9 * bytes_per_parameter(64, s, MIXED_ADAM) / 1e9, 1) for s in range(4)]
    [120.0, 31.4, 16.6, 1.9]
    >>> bytes_per_parameter(8, "ZeRO-2", MIXED_ADAM) == 2 + (2 + 12) / 8
    True
    """
    stage = zero_stage(stage)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k is the number of devices the state is sharded over: a positive "
                         f"integer, got {k!r}")
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



def whole_tensor_shares(shapes, k: int) -> list[int]:
    """Elements each of k devices keeps when the state is sharded by *whole tensors*, as
    PyTorch's ``ZeroRedundancyOptimizer`` does: each tensor, in order, goes to the device that
    holds the fewest elements so far (ties: the lowest index).  Against the flat buffer's
    ``n/k``, the largest share is at least the largest tensor (LeNet's ``W3``: 102,400 of
    129,068 elements)."""
    import math
    held = [0] * k
    for shape in shapes:
        i = held.index(min(held))
        held[i] += math.prod(shape)
    return held

"""FSDP's knobs: what ``param_dtype``, prefetching, skipping the gradient sync and building
the model on the meta device change in the bytes a rank holds and hands the collectives,
with FSDP2's row sharding (``Shard(0)``)."""
from __future__ import annotations

import math

from .peak import MLP_WIDTHS, layer_sizes, peak_bytes, peak_timeline
from .state import row_shard_elements, shard_sizes

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

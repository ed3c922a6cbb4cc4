"""The chapter's formulas as the neutral page shows them (``chapters/sharded/model.ipynb``):
text tables and a figure of what the other modules compute, with no measurement beside them.
The labs set the same formulas beside what they measure (:mod:`d2lmini.sharding.lab`)."""
from __future__ import annotations

from .activations import RECOMPUTE_ROWS, RECOMPUTE_SEGMENTS, activation_peak, recompute_flops
from .peak import MLP_WIDTHS, SCHEMES, peak_bytes, peak_parts
from .state import STAGE_NAMES, STAGES, bytes_per_parameter, step_traffic

MIB = 1 << 20


def per_parameter_table(columns) -> str:
    """Bytes per parameter each device keeps at every stage (:func:`.bytes_per_parameter`),
    one column per ``(k, precision)`` of ``columns``."""
    head = f"{'bytes per parameter':<20}" + "".join(f"{f'{p.name}, k = {j}':>30}"
                                                  for j, p in columns)
    return "\n".join([head] + [f"{STAGE_NAMES[s]:<20}" + "".join(
        f"{bytes_per_parameter(j, s, p):>30g}" for j, p in columns) for s in STAGES])


def traffic_table(n: int, k: int, itemsize: int = 4) -> str:
    """Bytes the busiest device sends in one step (:func:`.step_traffic`) for an ``n``-element
    gradient on k devices, every stage (stage 3 gathering once, then again for the backward
    pass), and each relative to replicated training."""
    replicated = sum(step_traffic(n, k, 0, itemsize)["total"])
    lines = []
    for s, regather in [(0, False), (1, False), (2, False), (3, False), (3, True)]:
        t = step_traffic(n, k, s, itemsize, regather=regather)["total"]
        label = STAGE_NAMES[s] + (", gathering again for backward" if regather
                                  else ", gathering once" if s == 3 else "")
        lines.append(f"{label:<40}{max(t):>12,} bytes from the busiest device, "
                     f"{sum(t) / replicated:.2f} x replicated")
    return "\n".join(lines)


def peak_formula_table(counts, rows: int, widths=MLP_WIDTHS) -> str:
    """The formula's peak of one step (:func:`.peak_bytes`, MiB on the device that holds the
    most) for every scheme and each device count of ``counts``, with the worst moment and its
    parts at the last count (:func:`.peak_parts`)."""
    last = counts[-1]
    lines = [f"{'MiB at the peak':<16}" + "".join(f"{f'k = {j}':>8}" for j in counts)
             + f"   k = {last}: the worst moment, its parts in MiB"]
    for scheme in SCHEMES:
        moment, parts = peak_parts(last, scheme, rows, widths)
        lines.append(f"{scheme:<16}" + "".join(f"{max(peak_bytes(j, scheme, rows, widths)) / MIB:>8.2f}"
                                               for j in counts)
                     + f"   {moment}: " + ", ".join(f"{p} {b / MIB:.2f}" for p, b in parts.items()))
    return "\n".join(lines)


def plot_peak_formula(ks, rows: int, widths=MLP_WIDTHS, ax=None):
    """The formula's peak of every scheme against the device count ``ks`` (log scale), with a
    replica's float32 parameters and gradients dotted.  Returns the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    n = sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))
    for scheme in SCHEMES:
        ax.plot(ks, [max(peak_bytes(j, scheme, rows, widths)) / MIB for j in ks], "o-", ms=3,
                label=scheme)
    ax.axhline(8 * n / MIB, color="gray", ls=":", lw=0.8)
    ax.set(xscale="log", xlabel="devices", ylabel="peak MiB per device (formula)", ylim=(0, None))
    ax.set_xticks(list(ks), [str(j) for j in ks])
    ax.legend(fontsize=8)
    return ax


def recompute_table(rows: int = RECOMPUTE_ROWS, segments=RECOMPUTE_SEGMENTS,
                    widths=MLP_WIDTHS) -> str:
    """Peak activations of the MLP on one device with checkpoints every ``segment`` layers
    (:func:`.activation_peak`, MiB and relative to none) and the extra compute
    (:func:`.recompute_flops`)."""
    none = activation_peak(rows, 0, widths)
    lines = [f"{'segment':>7}  {'MiB':>5}  {'vs none':>7}  {'extra compute':>13}"]
    for s in segments:
        act = activation_peak(rows, s, widths)
        extra = recompute_flops(rows, s, widths)["extra_fraction"]
        lines.append(f"{s or 'none':>7}  {act / MIB:>5.2f}  {act / none:>7.2f}  {extra:>13.0%}")
    return "\n".join(lines)

"""Whether measured step times show communication hidden behind computation: an effect
counts only beyond the spread of the repeats."""
from __future__ import annotations

import statistics
from typing import Iterable

import numpy as np

from .formatting import sig


def hidden_fraction(t_overlapped: float, t_after: float, t_compute: float) -> float:
    """How much of the communication hides behind computation: the time saved by overlapping,
    over the communication time that all-reduce-after-backward exposes (clipped to [0, 1]).
    A formula on three times; :func:`overlap_verdict` says whether the measurement shows one."""
    exposed = t_after - t_compute
    if exposed <= 0:
        return 0.0
    return float(min(1.0, max(0.0, (t_after - t_overlapped) / exposed)))


def clearly_greater(a: Iterable[float], b: Iterable[float]) -> bool:
    """Whether the repeats ``a`` are slower than ``b`` beyond their spread: the lower quartile
    of ``a`` above the upper quartile of ``b`` (their interquartile ranges do not overlap)."""
    a, b = list(a), list(b)
    return float(np.percentile(a, 25)) > float(np.percentile(b, 75))


def overlap_verdict(overlapped: Iterable[float], after: Iterable[float],
                    compute: Iterable[float], *, can_overlap: bool = True
                    ) -> tuple[float | None, str]:
    """What repeated step times show about overlap: ``(hidden share or None, verdict)``.

    An effect counts only when it exceeds the measured spread (:func:`clearly_greater`):
    all-reduce after backward must be clearly slower than compute alone (else nothing to hide
    was measured), and a variant clearly faster than after-backward hides
    :func:`hidden_fraction` of it (all of it when it is not clearly slower than compute
    alone).  A variant that cannot overlap by construction (``can_overlap=False``: one bucket
    whose all-reduce starts after backward) is a control: a difference there is a difference
    of code paths, not hidden communication.  Otherwise: "within noise"."""
    o, a, c = list(overlapped), list(after), list(compute)
    med = statistics.median
    if clearly_greater(c, o):
        return None, "faster than compute alone beyond the spread: a different code path, not overlap"
    if clearly_greater(o, a):
        return 0.0, "slower than all-reduce after backward, beyond the spread"
    if not clearly_greater(a, c):
        return None, "within noise (after backward is not measurably slower than compute alone)"
    if not clearly_greater(a, o):
        return 0.0, "hides nothing measurable (within noise of after backward)"
    if not can_overlap:
        return None, "faster than after backward, but cannot overlap: a code-path difference"
    if not clearly_greater(o, c):
        return 1.0, "hides all of it (within noise of compute alone)"
    return hidden_fraction(med(o), med(a), med(c)), \
        f"hides about {sig(100 * hidden_fraction(med(o), med(a), med(c)), 1)}% of it"


def overlap_report(times: dict[str, list[float]], compute: str, after: str,
                   overlapped: dict[str, bool]) -> list[str]:
    """One line per variant: median and interquartile range of its repeats (ms, 2 significant
    figures) and, for each variant in ``overlapped`` (name -> whether it can overlap),
    :func:`overlap_verdict` against ``after`` and ``compute``."""
    width = max(len(n) for n in times)
    lines = []
    for name, t in times.items():
        q = np.percentile(t, [25, 75])
        line = (f"  {name:<{width}}  {sig(statistics.median(t) * 1e3):>6} ms "
                f"[{sig(q[0] * 1e3)}-{sig(q[1] * 1e3)}]")
        if name in overlapped:
            line += "  " + overlap_verdict(t, times[after], times[compute],
                                           can_overlap=overlapped[name])[1]
        lines.append(line)
    return lines

"""A sweep and its fits written to the chapter's results file, and printed: one line per fit,
a Markdown table of the timings."""
from __future__ import annotations

from .alphabeta import Fit
from .formatting import fmt_seconds, sig


def _fit_dict(f: Fit) -> dict:
    return {"scheme": f.scheme, "alpha": f.alpha, "beta": f.beta,
            "median_rel_error": f.median_rel_error, "max_rel_error": f.max_rel_error,
            "points": f.points}


def record(path, *, framework: str, api: str, devices: int, profile: str,
           fits: dict[str, Fit], rows: dict[str, list[dict]],
           per_k: dict[str, dict[int, Fit]] | None = None, **extra) -> dict | None:
    """Record a framework's sweep and fits in the chapter's results file (with hardware and
    versions, via :func:`d2lmini.results.record_result`); nothing under the smoke profile.
    ``fits``: one fit over all device counts per measurement; ``per_k``: the fits per device
    count (:func:`fit_per_k`), stored as ``fits_per_k[name][str(k)]``."""
    if profile == "smoke":
        return None
    from ..results import record_result
    if per_k is not None:
        extra["fits_per_k"] = {name: {str(k): _fit_dict(f) for k, f in fk.items()}
                               for name, fk in per_k.items()}
    return record_result(
        path, chapter="comm", framework=framework, api=api, devices=devices, profile=profile,
        batch_size=0, fits={name: _fit_dict(f) for name, f in fits.items()}, rows=rows, **extra)


def report(name: str, f: Fit) -> str:
    """One line: the fitted alpha and beta, the bandwidth and the fit error, each to two
    significant figures (the fits are not more precise than that)."""
    return (f"{name:<28} alpha {fmt_seconds(f.alpha):>7}, beta {sig(f.beta * 1e9):>5} ns/B "
            f"({sig(f.bandwidth / 1e9)} GB/s); fit error: median {sig(100 * f.median_rel_error)}%, "
            f"max {sig(100 * f.max_rel_error)}% ({f.points} points)")


def table(rows: list[dict]) -> str:
    """A Markdown table of sweep rows: k, size, median and spread in microseconds."""
    lines = ["| k | bytes | median (us) | p25-p75 (us) | min-max (us) |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['k']} | {r['bytes']:,} | {r['median'] * 1e6:,.0f} | "
                     f"{r['p25'] * 1e6:,.0f}-{r['p75'] * 1e6:,.0f} | "
                     f"{r['min'] * 1e6:,.0f}-{r['max'] * 1e6:,.0f} |")
    return "\n".join(lines)

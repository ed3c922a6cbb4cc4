"""What a framework's communication lab does with its measurements, written once.

Each of the chapter's four labs (``chapters/comm/<framework>.ipynb``) times its framework's
all-reduce and the from-scratch chapter's two; what follows is the same for every framework
and lives here: the alpha-beta fits (per device count and over all of them), their report,
figure and check, the regimes and the cross-over, the cost of the scratch all-reduces per
operation and per byte, and the record the results page and the chapter's neutral page read.
"""
from __future__ import annotations

import dataclasses

from .alphabeta import (bandwidths, coefficients, crossover, fit_per_k, fit_rows,
                        model_time, moved_bytes, regime_size)
from .formatting import fmt_bytes, fmt_seconds, sig
from .records import record, report

#: A fit per device count must keep the model's form: alpha, beta >= 0, and a median and a
#: largest relative error |model - measured| / measured of at most these.  They catch a broken
#: measurement (a missing sync, a wrong byte count), not a mediocre fit: chosen after many runs
#: of all four labs on a busy 2-core machine, with margin.
FIT_BOUND = {"median": 1.0, "max": 4.0}
#: The scheme each framework's lab fits its own all-reduce with (``fit_lab``'s first entry):
#: gloo's and XLA's are rings (or close relatives) on one machine; MXNet's KVStore('device')
#: reduces on one device, as the naive scheme does.  ``tools.benchmark --comm`` fits with it.
FRAMEWORK_SCHEME = {"torch": "ring", "jax": "ring", "paddle": "ring", "mxnet": "naive"}


@dataclasses.dataclass
class LabFits:
    """One lab's measurements, ``{name: rows}`` (the framework's all-reduce first), each
    fitted with its scheme: ``fits[name]`` over all device counts, ``per_k[name][k]``."""
    rows: dict
    schemes: dict
    fits: dict
    per_k: dict

    @property
    def framework(self) -> str:
        """The name of the framework's own all-reduce (the first measurement)."""
        return next(iter(self.rows))

    def report(self) -> str:
        """One line per fit (:func:`report`), per device count and over all of them."""
        lines = []
        for name, f in self.fits.items():
            lines.append(f"{name} ({f.scheme} model)")
            lines += [report(f"  k = {j}", fj) for j, fj in self.per_k[name].items()]
            lines.append(report("  all k, one fit", f))
        return "\n".join(lines)

    def plot(self, title: str):
        """The measured times and the fits per device count (:func:`plot_fits`)."""
        from .plots import plot_fits
        return plot_fits(self.rows, self.per_k, title=title)

    def within_bounds(self, bounds: dict = FIT_BOUND) -> bool:
        """Every fit per device count keeps the model's form (:data:`FIT_BOUND`)."""
        return all(f.alpha >= 0 and f.beta >= 0 and f.alpha + f.beta > 0
                   and f.median_rel_error <= bounds["median"] and f.max_rel_error <= bounds["max"]
                   for fk in self.per_k.values() for f in fk.values())

    def regimes(self) -> str:
        """Per fit and device count: below which size latency dominates (n_1/2), above which
        the ring beats a binomial tree (the model's, the tree is not measured); and the
        largest message's bandwidths in nccl-tests' two figures, algbw and busbw."""
        lines = []
        for name, fk in self.per_k.items():
            for j, f in fk.items():
                n_half = regime_size(f.scheme, j, f.alpha, f.beta)
                n_star = crossover("ring", "tree", j, f.alpha, f.beta)
                lines.append(f"{name:<28} k={j}: "
                             + (f"latency-bound below about {fmt_bytes(n_half)}"
                                if n_half is not None else "no bandwidth term (beta fitted as 0)")
                             + "; ring beats a tree "
                             + (f"above about {fmt_bytes(n_star)}" if n_star else "at every size"))
        name, scheme = self.framework, self.schemes[self.framework]
        big = max(self.rows[name], key=lambda r: (r["k"], r["bytes"]))
        bw = bandwidths(big["bytes"], big["median"], big["k"], scheme)
        lines.append(f"{name}, {fmt_bytes(big['bytes'])} on k={big['k']}: algbw "
                     f"{sig(bw['algbw'] / 1e9)} GB/s, "
                     + (f"busbw {sig(bw['busbw'] / 1e9)} GB/s" if bw["busbw"] is not None else
                        f"no busbw (fitted as the {scheme} scheme; busbw assumes the ring's "
                        f"bytes per link)"))
        return "\n".join(lines)

    def record(self, path, *, framework: str, devices: int, profile: str | None = None,
               **extra):
        """The sweep and its fits in the chapter's results file (:func:`record`; nothing under
        the smoke profile), the framework's own fit under ``"framework"``.  ``profile``: the
        name of the settings in force unless given (the page need not name them)."""
        if profile is None:
            from ..config import get_profile
            profile = get_profile().name
        return record(path, framework=framework, api=self.framework, devices=devices,
                      profile=profile, fits={("framework" if name == self.framework else name): f
                                             for name, f in self.fits.items()},
                      rows=self.rows, per_k=self.per_k, **extra)


def fit_lab(measured: dict) -> LabFits | None:
    """``measured``: ``{name: (rows, scheme)}``, the framework's own all-reduce first, then the
    scratch ones; None where nothing was measured (k = 1)."""
    if not any(rows for rows, _ in measured.values()):
        return None
    rows = {name: r for name, (r, _) in measured.items()}
    schemes = {name: s for name, (_, s) in measured.items()}
    return LabFits(rows, schemes, {n: fit_rows(r, schemes[n]) for n, r in rows.items()},
                   {n: fit_per_k(r, schemes[n]) for n, r in rows.items()})


def check_regimes(per_k: dict) -> None:
    """The sizes :meth:`LabFits.regimes` prints are where the model says they are: at n_1/2
    the latency term equals the bandwidth term, at n* the ring's time the tree's."""
    for fk in per_k.values():
        for j, f in fk.items():
            n_half = regime_size(f.scheme, j, f.alpha, f.beta)
            a, b = coefficients(f.scheme, j)
            if n_half is None:                   # a fit may put all the time in alpha
                assert f.beta == 0
                continue
            assert abs(a * f.alpha - b * n_half * f.beta) <= 1e-9 * a * f.alpha
            n_star = crossover("ring", "tree", j, f.alpha, f.beta)
            if n_star:
                ring, tree = (float(model_time(s, n_star, j, f.alpha, f.beta))
                              for s in ("ring", "tree"))
                assert abs(ring - tree) <= 1e-9 * tree


def scratch_costs(scratch_rows: dict, time_scratch, reduces: dict, counts, sizes) -> str:
    """Where the from-scratch all-reduces' time goes, per device count: the bytes both send
    (counted from their schedules), the cost per operation at the smallest size (the ring's
    2k(k-1) messages against the naive scheme's 2(k-1) whole-buffer operations), and at the
    largest the time per byte moved and the page faults of one all-reduce.  ``reduces``:
    ``{"ring": ring_allreduce, "naive": allreduce}``; ``time_scratch(reduce, j, n)`` returns
    the call that all-reduces j buffers of n bytes once and waits for it."""
    from ..collectives import naive_schedule, ring_schedule, traffic
    from .timing import time_and_faults
    if not counts:
        return "k = 1: nothing is sent, nothing to compare."
    n, small = sizes[-1], sizes[0]
    out = []
    for j in counts:
        sent = {s: sum(traffic(schedule(j), n // 4, j)["sent"])
                for s, schedule in (("ring", ring_schedule), ("naive", naive_schedule))}
        assert sent["ring"] == sent["naive"] == moved_bytes("ring", j, n)
        ops = {"ring": 2 * j * (j - 1), "naive": 2 * (j - 1)}
        t_small = {s: next(r["median"] for r in scratch_rows[s]
                           if r["k"] == j and r["bytes"] == small) for s in ops}
        big = {s: time_and_faults(time_scratch(reduces[s], j, n)) for s in ("ring", "naive")}
        out.append(f"k={j}: both send {fmt_bytes(sent['ring'])} in total for {fmt_bytes(n)}\n"
                   f"     at {small} B: " + ", ".join(
                       f"{s} {fmt_seconds(t_small[s] / ops[s])} for each of {ops[s]} operations"
                       for s in ops) + "\n"
                   f"     at {fmt_bytes(n)}: " + ", ".join(
                       f"{s} {fmt_seconds(t)} ({sig(t / sent[s] * 1e9)} ns per byte moved, "
                       f"{faults:,} page faults)" for s, (t, faults) in big.items()))
    return "\n\n".join(out)

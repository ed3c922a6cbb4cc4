"""What a framework's sharding lab does with its measurements, written once.

Each of the chapter's four labs (``chapters/sharded/<framework>.ipynb``) writes the ZeRO stages,
the instrumented step and its measurements in its framework's arrays; what follows is the same
for every framework and lives here: the proof's verdict, the bytes a step sends against the
formula, the memory tables measured for 1, 2, 4, ... and k devices, the peak's table, figure and
verdict, and the two precisions' accuracies.  The formulas themselves are the chapter's neutral
page's (``chapters/sharded/model.ipynb``).  Each function takes the lab's own measurement (a
function of the device count and the stage or scheme, or its results), so a lab cell is one
call.
"""
from __future__ import annotations

from .peak import SCHEMES, peak_ok, peak_rows, peak_table
from .state import (ALLCLOSE_ATOL, FP32_ADAM, MIXED_ADAM, STAGE_NAMES, STAGES, Precision,
                    memory_rows, memory_table, step_traffic, table_counts)


def proof_report(diffs: dict, atol: float = ALLCLOSE_ATOL) -> str:
    """The proof's verdict: ``diffs`` holds the largest difference of the all-reduced gradient
    from one device's (``'1 device'``) and of each stage's parameters, m and v from replicated
    training (``'ZeRO-1'``, ...), each held to ``atol``."""
    lines = ["all-reduced gradient on k devices == 1 device on the whole batch: "
             f"{diffs['1 device'] <= atol}"]
    lines += [f"{STAGE_NAMES[s]} == replicated (parameters, m and v on every device): "
              f"{diffs[STAGE_NAMES[s]] <= atol}" for s in (1, 2, 3)]
    return "\n".join(lines)


def traffic_report(step_sent, n: int, k: int) -> str:
    """What each step sends, against :func:`.step_traffic`: ``step_sent(stage)`` runs one step
    of ``stage`` on k devices (an ``n``-element buffer) and returns the bytes each device sent.
    The stage 3 measured gathers once per step (``regather=False``)."""
    sent = {s: list(step_sent(s)) for s in STAGES}
    formula = {s: step_traffic(n, k, s, regather=False)["total"] for s in STAGES}
    total = {s: sum(b) for s, b in sent.items()}
    regather = sum(step_traffic(n, k, 3, regather=True)["total"])
    return "\n".join([
        "bytes sent by each device, every stage, == the formula: "
        f"{all(sent[s] == formula[s] for s in STAGES)}",
        "ZeRO-1 == ZeRO-2 == ZeRO-3 (gathering once per step) == replicated, in bytes: "
        f"{total[1] == total[2] == total[3] == total[0]}",
        f"ZeRO-3 gathering again before backward: 1.5 x replicated: {2 * regather == 3 * total[0]}"])


def show_memory(measure, n: int, k: int, precision: Precision = FP32_ADAM) -> list[dict]:
    """Measure the state between steps for 1, 2, 4, ... and k devices (:func:`.table_counts`),
    every stage, beside the formula (:func:`.memory_rows`; ``measure(j, stage)`` returns each of
    j devices' bytes by part), print the table of the device that holds the most (KiB), and
    return the rows."""
    rows = memory_rows(measure, n, table_counts(k), precision=precision)
    print(f"KiB on the device that holds the most, {precision.name}:")
    print(memory_table(rows))
    return rows


def show_peak(measure, k: int, rows: int) -> list[dict]:
    """Measure the peak of one step on the MLP for 1, 2, 4, ... and k devices and every scheme,
    beside the formula (:func:`.peak_rows`; ``measure(j, scheme)`` returns each of j devices'
    peak bytes, with ``rows`` examples per device), print the table (MiB) and return the rows."""
    peak = peak_rows(measure, table_counts(k), rows)
    print("MiB on the device that holds the most, at its worst moment (measured, and the formula):")
    print(peak_table(peak))
    return peak


def plot_peaks(peak: list[dict], k: int):
    """The measured peaks of :func:`.show_peak`, one line per scheme against the device count."""
    import d2lmini
    animator = d2lmini.Animator(xlabel="devices", ylabel="peak MiB per device (measured)",
                                legend=list(SCHEMES), xlim=(1, max(k, 2)), ylim=(0, None))
    for j in sorted({r["devices"] for r in peak}):
        animator.add(j, [r["measured"] / 2**20 for r in peak if r["devices"] == j])
    return animator


def peak_report(peak: list[dict], n: int) -> str:
    """The peak's verdicts: measured == formula to the byte; ZeRO-3 by layer below replicated,
    and ZeRO-2 by layer below ZeRO-2 by whole model, each by the formula's margin; by whole
    model, no stage below a replica's float32 parameters and gradients (``8 n`` bytes for an
    ``n``-parameter model)."""
    by = {(r["devices"], r["scheme"]): r for r in peak}
    counts = sorted({r["devices"] for r in peak})

    def margin(j, key, hi="replicated", lo="ZeRO-3 by layer"):
        return by[j, hi][key] - by[j, lo][key]
    zero2 = dict(hi="ZeRO-2", lo="ZeRO-2 by layer")
    return "\n".join([
        "measured peak == formula, every device and scheme, up to k devices (to the byte): "
        f"{peak_ok(peak)}",
        "ZeRO-3 by layer is below replicated by the formula's margin (k >= 2): "
        f"{all(margin(j, 'measured') == margin(j, 'formula') for j in counts) and all(margin(j, 'measured') > 0 for j in counts if j > 1)}",
        "ZeRO-2 by layer is below ZeRO-2 by whole model by the formula's margin: "
        f"{all(margin(j, 'measured', **zero2) == margin(j, 'formula', **zero2) > 0 for j in counts)}",
        "by whole model, no stage's peak drops below a replica's parameters and gradients: "
        f"{all(by[j, s]['measured'] >= 8 * n for j in counts for s in SCHEMES[:4])}"])


def train_precisions(train) -> dict:
    """``train(precision)`` for float32 and mixed-precision Adam (each returns a test
    accuracy); prints and returns ``{precision name: accuracy}``."""
    accuracy = {p.name: train(p) for p in (FP32_ADAM, MIXED_ADAM)}
    print("test accuracy after ZeRO-3 training:", accuracy)
    return accuracy


def accuracies_ok(accuracy: dict, profile) -> bool:
    """Both precisions above ``profile.min_test_acc`` and within ``profile.max_acc_gap`` of
    each other (``profile``: the profile's ``sharded`` settings)."""
    a32, a16 = accuracy[FP32_ADAM.name], accuracy[MIXED_ADAM.name]
    return min(a32, a16) > profile.min_test_acc and abs(a32 - a16) <= profile.max_acc_gap

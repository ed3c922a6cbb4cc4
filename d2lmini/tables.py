"""The Measured Results page's tables: records in, Markdown out.

The comparison chapter reads the files the book's commands wrote (the benchmark's
``benchmarks/results.json``, each chapter's ``results.json``, the rounding study, the original
tutorials' published numbers, the communication fits) and shows them as tables; the pages show
one call each, the formatting lives here.  Every function returns a Markdown table (a string)
for ``display(Markdown(...))``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable, Sequence

from .frameworks import KEYS as FRAMEWORKS, TITLES as NAMES   # the book's order: PyTorch first
IMPL_NAMES = {"seed": "naive", "ring": "ring", "concise": "concise"}   # 'seed' in the files


def markdown(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A Markdown table: one header row, then one row per sequence of cells (``str()`` each)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _ms(r: dict) -> str:
    return (f"{1e3 * r['step_s_median']:.0f} "
            f"[{1e3 * r['step_s_min']:.0f}–{1e3 * r['step_s_max']:.0f}]")


def step_times(rows: dict, impls: Sequence[str], devices: Sequence[int],
               frameworks: Sequence[str] = FRAMEWORKS) -> str:
    """The benchmark's records ``{(framework, impl, k): record}``: ms per step on each device
    count (median [fastest–slowest]) and t(k)/t(1), one row per implementation and framework."""
    header = (["framework", "implementation"] + [f"{k} dev., ms" for k in devices]
              + [f"t({k})/t(1)" for k in devices[1:]])
    body = []
    for i in impls:
        for f in frameworks:
            rs = [rows[f, i, k] for k in devices]
            body.append([NAMES[f], f"{IMPL_NAMES[i]} ({rs[0]['model']})"] + [_ms(r) for r in rs]
                        + [f"{r['overhead_vs_1']:.2f}" for r in rs[1:]])
    return markdown(header, body)


def improvements(rows: dict, devices: Sequence[int], frameworks: Sequence[str] = FRAMEWORKS) -> str:
    """Naive against ring all-reduce (the same LeNet step) and the concise ResNet's rate, at
    every device count above 1."""
    body = []
    for f in frameworks:
        for k in devices[1:]:
            s, r, c = rows[f, "seed", k], rows[f, "ring", k], rows[f, "concise", k]
            body.append([NAMES[f], k, f"{1e3 * s['step_s_median']:.1f}",
                         f"{1e3 * r['step_s_median']:.1f}",
                         f"{r['step_s_median'] / s['step_s_median']:.2f}",
                         f"{c['samples_per_s']:.0f}"])
    return markdown(["framework", "devices", "naive ms/step", "ring ms/step", "ring / naive",
                     "concise samples/s (ResNet)"], body)


def chapter_records(root: Path, chapter: str, profile: str = "cpu") -> list[dict]:
    """A chapter's ``results.json`` records of one profile, in the book's order (framework,
    API, devices, batch)."""
    recs = json.loads((Path(root) / "chapters" / chapter / "results.json").read_text())
    recs = [r for r in recs if r["profile"] == profile]
    return sorted(recs, key=lambda r: (FRAMEWORKS.index(r["framework"]), r["api"],
                                       r["devices"], r["batch_size"]))


def chapter_runs(root: Path, chapter: str, profile: str = "cpu") -> str:
    """A chapter's own training runs: s/epoch and test accuracy of every record."""
    return markdown(["framework", "API", "devices", "batch", "epochs", "s/epoch", "test acc"],
                    [[NAMES[r["framework"]], r["api"], r["devices"], r["batch_size"],
                      r.get("epochs", ""), f"{r['s_per_epoch']:.1f}", f"{r['test_acc']:.3f}"]
                     for r in chapter_records(root, chapter, profile)])


def dates(records: Iterable[dict]) -> str:
    """When ``records`` were measured: one date, or the first and the last."""
    days = sorted({r["date"][:10] for r in records})
    return days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"


def rounding_label(framework: str, threads: int) -> str:
    return NAMES[framework] + (f", {threads} thread{'s' if threads > 1 else ''}"
                               if framework == "torch" else "")


def loss_trajectories(runs: dict, shown: Sequence[int]) -> str:
    """``runs`` ``{(framework, threads): losses}``: the loss at the steps ``shown``."""
    return markdown(["run"] + [f"loss, step {s}" for s in shown],
                    [[rounding_label(fw, th)] + [f"{l[s]:.4f}" for s in shown]
                     for (fw, th), l in runs.items()])


def published(tutorials: Sequence[dict]) -> str:
    """The original tutorials' published runs (``original_results.json``), as printed: a
    line per tutorial (its hardware and model), then a table of its runs."""
    parts = []
    for t in tutorials:
        parts.append(f"**{t['tutorial']}**: {t['hardware']}; {t['model']}\n")
        parts.append(markdown(["framework", "API", "devices", "batch", "lr", "s/epoch",
                               "test acc", "remark"],
                              [[NAMES[r["framework"]], r.get("api", "from scratch"), r["devices"],
                                r["batch_size"], r.get("lr", ""), r["s_per_epoch"], r["test_acc"],
                                r.get("remark", "")] for r in t["runs"]]) + "\n")
    return "\n".join(parts)


def _hardware(hw: dict) -> str:
    gpus = ", " + ", ".join(hw["gpus"]) if hw["gpus"] else ""
    return f"{hw['cpu']} ({hw['cpu_cores']} cores){gpus}"


def comm_fits(records: Sequence[dict]) -> str:
    """The communication chapter's alpha-beta fits, one row per record and measurement; the
    machines and dates they were measured on, once, below the table."""
    body = []
    for r in records:
        for name, f in r["fits"].items():
            body.append([NAMES[r["framework"]], r["api"] if name == "framework" else name,
                         f["scheme"], r["devices"], f"{f['alpha'] * 1e6:.1f}",
                         f"{f['beta'] * 1e9:.3f}", f"{1e-9 / f['beta']:.2f}",
                         f"{f['median_rel_error']:.0%} / {f['max_rel_error']:.0%}"])
    where = sorted({_hardware(r["hardware"]) for r in records})
    return (markdown(["framework", "measurement", "scheme", "k", "alpha (us)", "beta (ns/B)",
                      "1/beta (GB/s)", "fit error, median / max"], body)
            + f"\n\nMeasured on {'; '.join(where)}, {dates(records)}." if records else "")


def comm_records(root: Path) -> list[dict]:
    """The communication chapter's records (``chapters/comm/results.json``) of its full runs
    (the regression tests' short runs left out), in the book's order."""
    path = Path(root) / "chapters" / "comm" / "results.json"
    recs = [r for r in (json.loads(path.read_text()) if path.is_file() else [])
            if r["profile"] != "smoke"]
    return sorted(recs, key=lambda r: (FRAMEWORKS.index(r["framework"]), r["devices"]))


# ---------------------------------------------------------------- the overviews' results
#: A proof line of a chapter's notebooks: k devices against one, and what it printed.
_PROOF_LINE = re.compile(r"^(?!.*per-device BatchNorm)(?=.*k-device)(?=.*1-device).*: (True|False)$")


def _cell(r: dict | None) -> str:
    return f"{r['test_acc']:.3f} ({r['s_per_epoch']:.1f} s)" if r else "--"


def overview_runs(root: Path, chapter: str, profile: str = "cpu") -> tuple[list[list], list[dict]]:
    """One row per framework of a chapter's stored runs (``results.json``): the run on one
    device, the run on k devices with the same global batch, and with twice the batch; each
    as test accuracy (seconds per epoch).  Where a framework has several k-device tools, the
    one also run with the larger batch stands for it.  Returns the rows and the records."""
    recs = chapter_records(root, chapter, profile)
    rows, used = [], []
    for fw in FRAMEWORKS:
        mine = [r for r in recs if r["framework"] == fw]
        one = next((r for r in mine if r["devices"] == 1), None)
        if one is None:
            continue
        many = [r for r in mine if r["devices"] > 1]
        big = next((r for r in many if r["batch_size"] == 2 * one["batch_size"]), None)
        same = [r for r in many if r["batch_size"] == one["batch_size"]
                and r.get("epochs") == one.get("epochs")]
        same = next((r for r in same if big is None or r["api"] == big["api"]),
                    same[0] if same else None)
        rows.append([NAMES[fw], _cell(one), _cell(same), _cell(big),
                     (same or big or one)["api"]])
        used += [r for r in (one, same, big) if r]
    return rows, used


def overview_proofs(root: Path, chapter: str) -> list[tuple[str, str]]:
    """``(framework title, line)``: the first proof line (k devices against one device) each
    of the chapter's framework notebooks printed in its stored outputs."""
    from .frameworks import FRAMEWORKS as FWS
    out = []
    for f in FWS:
        nb = json.loads((Path(root) / "chapters" / chapter / f"{f.notebook}.ipynb").read_text())
        lines = [line.strip() for c in nb["cells"] if c["cell_type"] == "code"
                 and "claim:exact" in c.get("metadata", {}).get("tags", [])
                 for o in c.get("outputs", []) for line in "".join(o.get("text", "")).splitlines()]
        first = next((line for line in lines if _PROOF_LINE.match(line)), None)
        if first:
            out.append((f.title, first))
    return out


def overview_results(root: Path, chapter: str, profile: str = "cpu") -> str:
    """The results an overview opens its chapter with (``tools/overview_figures.py`` writes
    it next to the page, which includes it): the stored runs, one device against k, where and
    when they ran, and the line each notebook's proof printed."""
    rows, used = overview_runs(root, chapter, profile)
    if not used:
        return ""
    k = max(r["devices"] for r in used)
    hw = sorted({_hardware(r["hardware"]) for r in used})
    epochs = sorted({r.get("epochs") for r in used if r.get("epochs")})
    header = ["framework", "1 device", f"{k} devices", f"{k} devices, 2x batch", f"{k}-device tool"]
    if len({r[-1] for r in rows}) == 1:          # one tool (the chapter's own code): no column
        header, rows = header[:-1], [r[:-1] for r in rows]
    table = markdown(header, rows)
    batch = sorted({r["batch_size"] for r in used})[0]
    proofs = "\n".join(f"- {title}: `{' '.join(line.split())}`"
                       for title, line in overview_proofs(root, chapter))
    return (f"Test accuracy after {', '.join(map(str, epochs))} epochs (seconds per epoch) of "
            f"the notebooks' stored runs, global batch {batch}: {'; '.join(hw)}, "
            f"{dates(used)}. The {k} devices are simulated and share the CPU's cores, so they "
            "show that k devices compute what one does, not a speed-up (speed: the Measured "
            "Results page).\n\n"
            + table + "\n\nWhat each notebook's proof printed:\n\n" + proofs + "\n")


# ---------------------------------------------------------------- the GPT's step
def gpt_steps(bench: dict) -> str:
    """The GPT benchmark's records (``tools/gpt_bench.py``'s file): one row per framework and
    numerics -- ms per step, tokens/s, MFU, peak memory where reported -- then what did not
    run and why, and the shape, machine and date once, below."""
    s = bench["settings"]
    body = [[NAMES[r["framework"]], r["numerics"], f"{r['ms_median']:.1f}",
             f"{r['tokens_per_s']:,.0f}", f"{r['mfu']:.1%}",
             f"{r['peak_memory_bytes'] / 2**30:.2f}" if r.get("peak_memory_bytes") else "--"]
            for r in sorted(bench["records"], key=lambda r: FRAMEWORKS.index(r["framework"]))]
    left = [f"{NAMES[f['framework']]} {f.get('numerics', '')}: {f.get('error') or f.get('reason')}"
            for f in bench["failures"]]
    gpus = ", ".join(bench["hardware"]["gpus"]) or "no GPU"
    return (markdown(["framework", "numerics", "ms/step", "tokens/s", "MFU", "peak GiB"], body)
            + f"\n\nOne step of {s['batch']} x {s['context']} tokens, {s['layers']} layers of width "
            f"{s['width']}, vocabulary {s['vocab']:,}; {bench['hardware']['cpu']} "
            f"({bench['hardware']['cpu_cores']} cores), {gpus}, {bench['date'][:10]}."
            + ("\n\nNot run: " + "; ".join(left) + "." if left else ""))


def gpt_records(root: Path) -> list[dict]:
    """The GPT benchmark's stored files (``benchmarks/*/gpt.json``), those measured on GPUs
    first, then the newest first."""
    found = [json.loads(p.read_text()) for p in sorted((Path(root) / "benchmarks").glob("*/gpt.json"))]
    found.sort(key=lambda b: b["date"], reverse=True)
    return sorted(found, key=lambda b: not b["hardware"]["gpus"])     # stable: newest first

"""``tools.gpu_run``'s report: ``gpu-report.md`` from the run's record (``gpu-report.json``)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from tools import manifest

FRAMEWORKS = manifest.KEYS


def first_failure(r: dict) -> str:
    if r["status"] == "passed":
        return ""
    f = (r.get("failing_cells") or [{}])[0]
    return r.get("error") or f.get("summary") or f.get("cell") or "?"


def render_md(rep: dict) -> str:
    m = rep["machine"]
    gpus = m["gpus"]
    L = ["# GPU run report", ""]
    if rep["gpu_used"]:
        L.append(f"**GPU used: yes** -- {len(gpus)} x {gpus[0]['name']} (compute capability "
                 f"{gpus[0]['compute_capability']}, driver {gpus[0]['driver_version']}); "
                 f"frameworks on the GPU: "
                 f"{', '.join(fw for fw, on in rep['frameworks_gpu'].items() if on)}.")
    elif gpus:
        L.append(f"**GPU used: NO.** This machine has {len(gpus)} GPU(s) ({gpus[0]['name']}), "
                 f"but no framework that ran sees one (CPU builds): every number below is the "
                 f"CPU's.")
    else:
        L.append("**GPU used: NO.** No NVIDIA GPU on this machine (run with --allow-cpu): this "
                 "run tests the pipeline only and says nothing about GPUs.")
    L += ["", f"- overall: **{rep['status']}** ({rep['summary']})",
          f"- date: {rep['date']}, {rep['seconds']:.0f} s in all",
          f"- profile `{rep['settings']['profile']}`, D2LMINI_NUM_DEVICES="
          f"{rep['settings']['num_devices'] or 'unset (every GPU; 2 simulated without GPUs)'}, "
          f"notebook runner `{rep['settings']['mode']}`, per-notebook timeout "
          f"{rep['settings']['timeout']:g} s",
          f"- CPU: {m['cpu']} ({m['cpu_cores']} cores); Python {m['python']} "
          f"(`{m['python_executable']}`)",
          f"- data: {'ok' if rep['data']['ok'] else 'MISSING'} -- "
          f"{rep['data']['message'].splitlines()[-1] if rep['data']['message'] else ''}",
          *[f"- **warning**: {w}" for w in rep.get("warnings", [])], "",
          "## Frameworks", "",
          "| framework | importable | version | CUDA | cuDNN | GPUs seen | devices |",
          "|---|---|---|---|---|---|---|"]
    for fw in FRAMEWORKS:
        f = m["frameworks"][fw]
        p = f.get("probe") or {}
        if not f["importable"]:
            L.append(f"| {fw} | no (missing {', '.join(f['missing'])}) | | | | | |")
            continue
        if "error" in p:
            L.append(f"| {fw} | yes | probe failed: {p['error']} | | | | |")
            continue
        L.append(f"| {fw} | yes{'' if fw in rep['frameworks'] else ' (not run)'} | "
                 f"{p.get('version', '')} | {p.get('cuda') or ''} | {p.get('cudnn') or ''} | "
                 f"{p.get('gpus', '')} | {', '.join(p.get('devices', []))[:120]} |")
    if m.get("doctor") is None:
        L += ["", "(no doctor in this checkout: `python -m d2lmini doctor` skipped)"]
    elif "error" in m["doctor"]:
        L += ["", f"doctor: {m['doctor']['error']}"]
    else:
        probs = m["doctor"].get("problems") or []
        L += ["", f"doctor: {'no problems' if not probs else f'{len(probs)} problem(s)'}"]
        L += [f"- {p.get('framework')}: {p.get('problem')}" for p in probs]
    L += ["", "## Notebooks", "", "| notebook | status | seconds | cells | first failure |",
          "|---|---|---|---|---|"]
    for r in rep["notebooks"]:
        c = r.get("cells", {})
        cells = (f"{c.get('passed', 0)} passed, {c.get('failed', 0) + c.get('errors', 0)} failed"
                 if r.get("mode") == "nbval" else f"{c.get('ran', 0)}/{c.get('total')} ran")
        first = first_failure(r).replace("|", "\\|").replace("\n", " ")[:200]
        L.append(f"| {r['notebook']} | {r['status']} | {r.get('seconds', '')} | {cells} "
                 f"| {first} |")
    for r in rep["notebooks"]:
        if r["status"] == "passed":
            continue
        L += ["", f"### {r['notebook']}: {r['status']}", ""]
        for f in r.get("failing_cells") or []:
            L += [f"- {f.get('summary') or f.get('cell')}", "", "```",
                  (f.get("traceback") or f.get("message") or "").strip()[-1500:], "```"]
        if not r.get("failing_cells"):
            L += [r.get("error") or "", "", "```", (r.get("log_tail") or "").strip()[-1500:],
                  "```"]
    b = rep["benchmark"]
    L += ["", "## Benchmark", "", f"status: **{b['status']}**"
          + (f" -- {b['error']}" if b.get("error") else "")]
    if b.get("results_file"):
        L += [f"results: `{b['results_file']}`", "",
              "| framework | impl | devices | device kind | ms/step | samples/s | t(k)/t(1) |",
              "|---|---|---|---|---|---|---|"]
        for r in b.get("records", []):
            ov = r["overhead_vs_1"]
            L.append(f"| {r['framework']} | {r['impl']} | {r['devices']} | {r['device_kind']} | "
                     f"{1e3 * r['step_s_median']:.1f} | {r['samples_per_s']:.0f} | "
                     f"{'' if ov is None else f'{ov:.2f}'} |")
        for f in b.get("failures", []):
            L.append(f"- FAILED {f['framework']}/{f['impl']}/{f['devices']}: {f['error']}")
    return "\n".join(L) + "\n"


def write_report(rep: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("gpu-report.json", json.dumps(rep, indent=1, default=str) + "\n"),
                       ("gpu-report.md", render_md(rep))):
        tmp = out_dir / (name + ".part")
        tmp.write_text(text)
        os.replace(tmp, out_dir / name)


def summarise(rep: dict) -> None:
    nbs = rep["notebooks"]
    bad = [r for r in nbs if r["status"] != "passed"]
    bench_bad = rep["benchmark"]["status"] not in ("passed", "skipped", "pending")
    rep["summary"] = (f"{len(nbs) - len(bad)}/{len(nbs)} notebooks passed; benchmark "
                      f"{rep['benchmark']['status']}")
    rep["status"] = "failed" if bad or bench_bad else "passed"

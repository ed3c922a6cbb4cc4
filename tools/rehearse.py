"""Rehearse a profile's training on this machine before a GPU sees it.

    python -m tools.rehearse chapters/scratch/pytorch.ipynb        # the gpu profile, k = 1
    make rehearse NB="chapters/scratch/pytorch.ipynb chapters/sharded/jax.ipynb"

A profile's hyper-parameters and thresholds must come from a run of those settings, never
from a guess: the gpu profile's from-scratch thresholds had never run anywhere and failed on
the first GPU that ran them (0.645 against 0.7, 2026-11-27).  This tool runs a notebook top to
bottom under a profile (default ``gpu``) with ``D2LMINI_NUM_DEVICES=1`` -- what a reader with
one GPU gets -- on whatever this machine has (the CPU here), in a private copy of the
checkout, and then reads the trained runs' accuracies out of the kernel, even when a check
failed.  It writes ``benchmarks/rehearsal/<chapter>-<notebook>.json``: the settings, the
runs, the thresholds, how far each run cleared them, the machine and the versions.

``tests/test_rehearsal.py`` holds the profile to those files: every rehearsed run setting
must equal the profile's current one, and every run must clear the profile's current
threshold by :data:`MARGIN` (a gap between runs: :data:`GAP_MARGIN`).  Thresholds are set from
the runs, so changing one needs no new rehearsal; changing a run setting does.  Notebooks whose gpu-profile training does not fit in an hour on 2 CPU
cores say in the manifest (``Chapter.not_rehearsed``) why their thresholds are safe.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

from tools import manifest

ROOT = manifest.ROOT

OUT_DIR = ROOT / "benchmarks" / "rehearsal"

#: How far (test accuracy, absolute) every rehearsed run must clear its threshold.  Two runs of
#: the same settings on other hardware differ in rounding and so in their trajectory: the
#: from-scratch runs of four frameworks at the cpu profile's settings spread by up to 0.04
#: (0.71 to 0.75 for the larger batch, chapters/scratch/results.json).
MARGIN = 0.05

#: How far below its ``max_acc_gap`` the gap between two rehearsed runs (float32 and bfloat16
#: training) must stay: two runs that differ only in rounding differ by up to ~0.01 (seeds).
GAP_MARGIN = 0.02
#: The fields of a profile section that are thresholds, set from the runs, not run settings.
THRESHOLDS = ("min_test_acc", "max_acc_gap", "expected_val_loss")

#: What each rehearsed page's runs are (``Chapter.rehearsal`` in the manifest), read from the
#: kernel once the notebook has run: the profile section whose settings they use, the
#: expression that gives the runs, and the thresholds they must clear.  Pages the gpu profile
#: trains but no rehearsal covers say why in ``Chapter.not_rehearsed``.


def harvest_of(nb: Path) -> dict:
    """What the rehearsal of ``nb`` harvests (its chapter's manifest entry); stops with the
    reason where none is defined."""
    chapter, key = manifest.page_key(nb)
    if key not in chapter.rehearsal:
        why = chapter.not_rehearsed.get(key, "")
        raise SystemExit(f"{nb}: no rehearsal is defined for it (tools/manifest.py, the "
                         f"{chapter.name} chapter's rehearsal){': ' + why if why else ''}")
    return chapter.rehearsal[key]


def harvest_code(spec: dict) -> str:
    thresholds = ", ".join(f"{k!r}: {v}" for k, v in spec["thresholds"].items())
    return ("import dataclasses as _dc, json as _json\nimport d2lmini as _d2l\n"
            "P = _d2l.get_profile()   # the settings in force (the notebook reads d2lmini.settings)\n"
            f"print('REHEARSAL ' + _json.dumps({{'runs': {spec['runs']}, "
            f"'thresholds': {{{thresholds}}}, "
            f"'settings': _dc.asdict(P.{spec['section']}), 'profile': P.name}}))")


def execute(nb_path: Path, code_after: str, timeout: int) -> tuple[dict | None, str | None, float]:
    """Run every cell of ``nb_path`` in a fresh kernel, stop at the first error, then run
    ``code_after`` in the same kernel; return its ``REHEARSAL`` JSON, the error, the seconds."""
    from tools.notebooks import execute_in_kernel
    _, seconds, error, probe = execute_in_kernel(nb_path, timeout, after=code_after)
    data = None
    for out in probe.outputs:
        for line in out.get("text", "").splitlines():
            if line.startswith("REHEARSAL "):
                data = json.loads(line[len("REHEARSAL "):])
    if error and error.startswith("after the cells: "):
        error = "reading the runs: " + error[len("after the cells: "):]
    return data, error, seconds


#: A loss target (``expected_val_loss``, the GPT chapter's) is the rehearsed run's validation
#: loss rounded to this many nats: the profile states what its settings reach.
LOSS_ROUNDING = 0.01


def verdict(data: dict) -> dict:
    """How far each run clears the thresholds (negative: it failed).  A loss target is met
    when every run's validation loss is within :data:`LOSS_ROUNDING` of it."""
    t = data["thresholds"]
    if "expected_val_loss" in t:
        losses = [r["val_loss"] for r in data["runs"]]
        target = t["expected_val_loss"]
        return {"highest_val_loss": max(losses),
                "clearance": None if target is None else
                round(LOSS_ROUNDING - max(abs(v - target) for v in losses), 4)}
    accs = [r["test_acc"] for r in data["runs"]]
    out = {"lowest_test_acc": min(accs), "clearance": round(min(accs) - t["min_test_acc"], 4)}
    if "max_acc_gap" in t:
        gap = max(accs) - min(accs)
        out["acc_gap"] = round(gap, 4)
        out["gap_clearance"] = round(t["max_acc_gap"] - gap, 4)
    return out


def rehearse(nb: Path, profile: str, devices: int, timeout: int) -> dict:
    from d2lmini.hardware import cpu_model, nvidia_gpus, package_versions
    from tools.gpu_run import snapshot
    harvest = harvest_of(nb)
    os.environ.update(D2LMINI_PROFILE=profile, D2LMINI_NUM_DEVICES=str(devices),
                      PYTHONUNBUFFERED="1")
    with tempfile.TemporaryDirectory(prefix="d2l_rehearse_") as tmp:
        copy = snapshot(ROOT, Path(tmp))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(copy)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        data, error, seconds = execute(copy / nb.resolve().relative_to(ROOT),
                                       harvest_code(harvest), timeout)
    if data is None:
        raise SystemExit(f"{nb}: the runs could not be read ({error})")
    return {
        "notebook": str(nb.resolve().relative_to(ROOT)),
        "profile": data["profile"], "num_devices": devices,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": {k: v for k, v in data["settings"].items() if k not in THRESHOLDS},
        "thresholds_at_the_run": data["thresholds"], "margin": MARGIN, "gap_margin": GAP_MARGIN,
        "runs": data["runs"], **verdict(data),
        "notebook_status": "passed" if error is None else f"failed: {error}",
        "seconds": round(seconds, 1),
        "machine": {"cpu": cpu_model(), "cpu_cores": os.cpu_count(),
                    "gpus": [g.name for g in nvidia_gpus()],
                    "python": sys.version.split()[0]},
        "versions": {k: v for k, v in package_versions().items() if v},
    }


def out_path(nb: Path) -> Path:
    nb = nb.resolve()
    return OUT_DIR / f"{nb.parent.name}-{nb.stem}.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--profile", default="gpu")
    ap.add_argument("--devices", type=int, default=1,
                    help="D2LMINI_NUM_DEVICES of the run (default 1: a one-GPU reader)")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    args = ap.parse_args(argv)
    rc = 0
    for nb in args.notebooks:
        rec = rehearse(nb, args.profile, args.devices, args.timeout)
        path = out_path(nb)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rec, indent=1) + "\n")
        if "highest_val_loss" in rec:          # a loss target: the profile states the run's loss
            ok = rec["clearance"] is not None and rec["clearance"] >= 0
            rc |= not ok
            print(f"{rec['notebook']}: {rec['notebook_status']}, validation loss "
                  f"{rec['highest_val_loss']:.4f} (the {args.profile} settings' expected_val_loss: "
                  f"{rec['thresholds_at_the_run']['expected_val_loss']}), {rec['seconds']:.0f} s "
                  f"-> {path.relative_to(ROOT)}", flush=True)
            continue
        ok = rec["clearance"] >= MARGIN and rec.get("gap_clearance", GAP_MARGIN) >= GAP_MARGIN
        rc |= not ok
        print(f"{rec['notebook']}: {rec['notebook_status']}, lowest accuracy "
              f"{rec['lowest_test_acc']:.4f} (threshold {rec['thresholds_at_the_run']['min_test_acc']}, "
              f"clearance {rec['clearance']:+.4f}, margin {MARGIN}), {rec['seconds']:.0f} s "
              f"-> {path.relative_to(ROOT)}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())

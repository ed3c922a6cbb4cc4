"""Machine-readable records of what a notebook or the benchmark measured.

Every record states the hardware and versions it was measured on, so a number is never
read without its context.  Records are kept in a JSON file (a list of records); a new record
replaces an older one with the same key (framework, api, chapter, devices, profile,
batch_size).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from pathlib import Path

__all__ = ["hardware_info", "versions", "record_result", "load_results", "START_DIR",
           "resolve"]

# The directory the process started in -- a notebook's kernel starts in the notebook's folder.
# Relative results paths are taken from here, not from whatever the working directory is when
# a run ends: a long notebook may outlive its working directory (seen on a GPU server whose
# checkout was replaced while the kernel ran: open('results.json.lock') then fails).
START_DIR = Path(os.getcwd())

KEY = ("chapter", "framework", "api", "devices", "profile", "batch_size")


def hardware_info() -> dict:
    from .hardware import cpu_model, nvidia_gpus
    return {"cpu": cpu_model(), "cpu_cores": os.cpu_count(),
            "gpus": [g.name for g in nvidia_gpus()],
            "machine": platform.machine(), "python": platform.python_version()}


def versions(*packages: str) -> dict:
    """Installed versions of ``packages`` (default: the frameworks, CPU and GPU builds)."""
    from .hardware import package_versions
    return package_versions(*packages)


def resolve(path) -> Path:
    """``path`` made absolute against :data:`START_DIR`, with a clear error if that folder is
    gone."""
    p = Path(path)
    if p.is_absolute():
        return p
    if not START_DIR.is_dir():
        raise FileNotFoundError(
            f"cannot write {path}: the folder this process started in, {START_DIR}, does not "
            f"exist any more. If it is a notebook's folder, the checkout was moved or replaced "
            f"while the kernel ran: restart the kernel from the notebook's folder and run the "
            f"notebook again.")
    return START_DIR / p


def record_result(path, *, chapter: str, framework: str, api: str, devices: int,
                  profile: str, batch_size: int, **measured) -> dict:
    """Add (or replace) one record in the JSON list at ``path`` and return it.

    ``measured`` holds the numbers, e.g. ``s_per_epoch``, ``samples_per_s``, ``test_acc``.
    """
    rec = {"chapter": chapter, "framework": framework, "api": api, "devices": int(devices),
           "profile": profile, "batch_size": int(batch_size), **measured,
           "hardware": hardware_info(), "versions": versions(),
           "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    import fcntl
    p = resolve(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p.with_suffix(p.suffix + ".lock"), "w") as lock:  # notebooks may run at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        records = load_results(p)
        records = [r for r in records if tuple(r.get(k) for k in KEY) != tuple(rec[k] for k in KEY)]
        records.append(rec)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, p)
    return rec


def load_results(path) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        return []
    data = json.loads(p.read_text())
    if not isinstance(data, list):
        raise ValueError(f"{p}: expected a JSON list of records")
    return data


def check_scratch_runs(runs: list[dict], framework: str, results_file: str = "results.json") -> None:
    """The from-scratch chapter's training runs (each with ``devices``, ``batch_size``, ``lr``,
    ``test_acc``, ``s_per_epoch``): every one learned -- test accuracy above the settings'
    ``min_test_acc`` -- and was timed; then, except under the quick test settings (the
    regression tests must not rewrite the stored results), recorded in ``results_file``."""
    from .config import get_profile
    P = get_profile()
    for r in runs:
        if not (r["test_acc"] > P.scratch.min_test_acc and r["s_per_epoch"] > 0):
            raise AssertionError(f"a run did not learn (min_test_acc {P.scratch.min_test_acc} "
                                 f"of the {P.name} settings) or was not timed: {r}")
    if P.name != "smoke":
        for r in runs:
            record_result(results_file, chapter="scratch", framework=framework, api="scratch",
                          devices=r["devices"], profile=P.name, batch_size=r["batch_size"],
                          s_per_epoch=r["s_per_epoch"], test_acc=r["test_acc"], lr=r["lr"],
                          epochs=P.scratch.epochs)

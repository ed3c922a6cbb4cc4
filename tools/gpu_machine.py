"""What ``tools.gpu_run`` reports of the machine: its GPUs, the frameworks importable here and
what each reports of itself (the doctor's probe), the doctor's report, the data."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from tools import manifest
from tools.gpu_env import hw   # d2lmini/hardware.py, loaded once as a file: standard library only

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = manifest.KEYS
MODULES = {f.key: f.needs for f in manifest.FRAMEWORKS}
PROBE_TIMEOUT = 240


def host_gpus() -> tuple[list[dict], str]:
    """The NVIDIA GPUs this process may use, and where that came from."""
    return [{"index": g.index, "name": g.name,
             "compute_capability": "%d.%d" % tuple(g.compute_capability),
             "memory_mib": g.memory_mib, "driver_version": g.driver_version}
            for g in hw.nvidia_gpus()], "d2lmini.hardware.nvidia_gpus"


def detect_frameworks() -> dict:
    """For each framework: importable (all its modules found, nothing imported) and what is
    missing."""
    out = {}
    for fw in FRAMEWORKS:
        missing = []
        for m in MODULES[fw]:
            try:
                if importlib.util.find_spec(m) is None:
                    missing.append(m)
            except (ImportError, ValueError):
                missing.append(m)
        out[fw] = {"importable": not missing, "missing": missing}
    return out


def dist_versions() -> dict:
    return hw.package_versions(*hw.FRAMEWORK_PACKAGES, "matplotlib", "pytest", "nbval",
                               "ipykernel", "nbformat", "jupyter_client")


def probe(fw: str, env: dict) -> dict:
    """Import ``fw`` in a subprocess and describe it (version, CUDA, devices): the doctor's
    probe (``d2lmini.doctor.run_probe``), the book's one, with the devices as text."""
    from d2lmini.doctor import run_probe
    r = run_probe(fw, PROBE_TIMEOUT, env=env)
    if "error" not in r:
        r["devices"] = [f"{d['id']} {d['name']}" if d["name"] != d["id"] else d["id"]
                        for d in r.get("devices", [])]
    return r


def doctor(frameworks: list[str], env: dict) -> dict | None:
    """``python -m d2lmini doctor --json`` for ``frameworks`` (under the run's profile and
    device count); None where this checkout has no doctor."""
    if not (ROOT / "d2lmini" / "doctor.py").is_file():
        return None
    cmd = [sys.executable, "-m", "d2lmini", "doctor", "--json"]
    for fw in frameworks:
        cmd += ["-f", fw]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT + 60,
                           env=env, cwd=ROOT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"error": "the doctor did not finish in time"}
    try:
        return json.loads(p.stdout[p.stdout.index("{"):])
    except ValueError:
        return {"error": f"the doctor printed no JSON (exit status {p.returncode})",
                "log_tail": (p.stderr or p.stdout)[-1500:]}


def check_data(env: dict) -> dict:
    """Whether Fashion-MNIST is present and verified (never downloads)."""
    try:
        p = subprocess.run([sys.executable, "-m", "d2lmini", "data", "--no-download"],
                           capture_output=True, text=True, timeout=PROBE_TIMEOUT, env=env,
                           cwd=ROOT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"ok": False, "message": "checking the data did not finish in time"}
    text = (p.stdout + p.stderr).strip()
    return {"ok": p.returncode == 0, "message": text.splitlines()[-1] if p.returncode == 0
            else text[-1500:]}

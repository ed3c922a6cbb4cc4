"""Run the book's notebooks and the benchmark on a GPU server that has no network; write a report.

    python -m tools.gpu_run                       # every framework importable here, smoke profile
    make gpu-run PY=python3                       # the same with another interpreter
    python -m tools.gpu_run --frameworks torch,jax --chapters devices,scratch --profile gpu
    python -m tools.gpu_run --out-dir /tmp/out --skip-benchmark
    python -m tools.gpu_run --allow-cpu --frameworks torch --chapters devices --skip-benchmark

Made for a machine whose interpreter already holds the frameworks' GPU builds (in whatever
versions: the pins of requirements*.txt are not checked) and nothing can be installed from the
network.  d2lmini need not be installed: the repository root is put on ``PYTHONPATH`` of every
process this tool starts.  Fashion-MNIST must be there already (``D2LMINI_DATA``, the cache or
Debian's package; see the README).

1. **Frameworks**: which of torch, jax (with flax and optax), paddle and mxnet can be imported
   by this interpreter (found without importing them); ``--frameworks`` restricts, and a
   framework it names that is missing is an error.
2. **Machine**: the NVIDIA GPUs (``nvidia-smi``: name, compute capability, memory, driver), the
   CPU, each framework's version, CUDA / cuDNN versions and the devices it sees (each imported
   in a subprocess of its own, with a timeout), and ``python -m d2lmini doctor --json`` where
   the doctor exists.
3. **Notebooks** ``chapters/<chapter>/<framework>.ipynb`` (``--chapters``: devices, scratch,
   concise, comm, sharded) under ``--profile`` (default ``smoke``; ``D2LMINI_PROFILE``), with
   ``D2LMINI_NUM_DEVICES=--devices`` when given (else as inherited: unset means every GPU).
   With pytest, nbval and ipykernel importable, each notebook is checked by nbval exactly as
   the test suite does (``python -m pytest NOTEBOOK`` with the project's pytest options): the
   cells that passed and failed, and the failing cells' messages.  Without them (a server with
   no Jupyter), each notebook's code cells are executed in order in a fresh interpreter, from
   the notebook's own folder, outputs discarded: whether every cell ran, and the first error.
   ``--mode`` forces one of the two.  Every notebook runs in a process of its own with a
   timeout (``--timeout``); one that fails or hangs never stops the others.  The notebooks
   are only read, never written.
4. **Benchmark**: ``tools/benchmark.py --frameworks ... --devices 1,2,...`` (powers of two up to
   the GPU count, or ``--devices``, and that count itself; at least 1 and 2) writing
   ``results-gpu.json`` into ``--out-dir``; ``--benchmark-args`` adds to (or overrides) its
   options, ``--skip-benchmark`` skips it.  More devices than GPUs are the backends' stand-ins
   (a GPU repeated; CPU devices for JAX), which the results file marks in ``device_kind``.
   PyTorch's concise implementation runs under ``python -m torch.distributed.run`` (torchrun,
   part of torch) with this interpreter, so nothing else is needed.
5. **Report**: ``gpu-report.json`` and ``gpu-report.md`` in ``--out-dir`` (default
   ``benchmarks/``), rewritten after every notebook, so a run cut short still leaves one.

Without an NVIDIA GPU the tool refuses to run unless ``--allow-cpu`` is given (to test this
pipeline); the report says plainly whether a GPU was used.  Exit status: 0 when every notebook
and the benchmark passed, 1 when one failed (after writing the report), 2 when it refused to
start.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tools import manifest
from tools.gpu_env import hw   # d2lmini/hardware.py, loaded once as a file: standard library only

ROOT = Path(__file__).resolve().parents[1]
# Where the notebooks and the benchmark run from: a private copy of the checkout (see
# snapshot()), or ROOT itself with --in-place.
RUN_ROOT = ROOT
# Not copied into the snapshot: environments, builds, carried wheels and data, caches.
SNAPSHOT_IGNORE = (".git", ".venv", ".venv-*", "_build", ".gpu-carry", ".whl", "__pycache__",
                   ".ipynb_checkpoints", ".pytest_cache")
FRAMEWORKS = manifest.KEYS                                # the book's order
NOTEBOOK = {f.key: f.notebook for f in manifest.FRAMEWORKS}
MODULES = {f.key: f.needs for f in manifest.FRAMEWORKS}
ALIASES = manifest.ALIASES
CHAPTERS = manifest.gpu_run_chapters()                   # the chapters with framework notebooks
PROFILES = ("smoke", "cpu", "gpu")
NOTEBOOK_TIMEOUT = {"smoke": 900, "cpu": 2400, "gpu": 5400}   # seconds, per notebook
PROBE_TIMEOUT = 240
TAIL = 4000                                               # characters of a log kept


# ---------------------------------------------------------------- the machine -------------
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


# What each framework reports about itself; printed as one JSON line by a subprocess.
PROBE = {
    "torch": """
import torch
r = {"version": torch.__version__, "cuda": torch.version.cuda,
     "cuda_available": torch.cuda.is_available(), "gpus": torch.cuda.device_count()}
try:
    r["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
except Exception as e:
    r["cudnn"] = None
try:
    r["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if r["gpus"] else None
except Exception:
    r["nccl"] = None
r["devices"] = [f"cuda:{i} {torch.cuda.get_device_name(i)} (sm_%d%d)"
                % torch.cuda.get_device_capability(i) for i in range(r["gpus"])] or ["cpu"]
""",
    "jax": """
import jax, jaxlib, flax, optax
r = {"version": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__,
     "optax": optax.__version__, "backend": jax.default_backend()}
try:
    gpus = jax.devices("gpu")
except RuntimeError:
    gpus = []
r["gpus"] = len(gpus)
r["devices"] = [f"{d} {d.device_kind}" for d in (gpus or jax.devices())]
try:
    from jax._src.lib import cuda_versions
    if cuda_versions is not None:
        r["cuda"] = str(cuda_versions.cuda_runtime_get_version())
        r["cudnn"] = str(cuda_versions.cudnn_get_version())
except Exception:
    pass
""",
    "paddle": """
import logging
import paddle
r = {"version": paddle.__version__, "compiled_with_cuda": paddle.is_compiled_with_cuda()}
try:
    r["cuda"] = paddle.version.cuda()
    r["cudnn"] = paddle.version.cudnn()
except Exception:
    pass
r["gpus"] = paddle.device.cuda.device_count() if r["compiled_with_cuda"] else 0
r["devices"] = ([f"gpu:{i} {paddle.device.cuda.get_device_name(i)}" for i in range(r["gpus"])]
                or ["cpu"])
""",
    "mxnet": """
import d2lmini._mxnet_compat  # NumPy 2 names MXNet 1.9.1 still reads
import mxnet as mx
r = {"version": mx.__version__, "gpus": mx.context.num_gpus()}
try:
    f = mx.runtime.Features()
    r["cuda"], r["cudnn"] = f.is_enabled("CUDA"), f.is_enabled("CUDNN")
except Exception:
    pass
r["devices"] = [f"gpu({i})" for i in range(r["gpus"])] or ["cpu(0)"]
""",
}
PROBE_TAIL = '\nimport json\nprint("GPU-RUN-PROBE " + json.dumps(r, default=str), flush=True)\n'


def run_env(profile: str | None = None, devices: int | None = None) -> dict:
    """The environment of every process this tool starts: the repository on PYTHONPATH (d2lmini
    need not be installed), JAX not preallocating the GPUs, and the run's profile/devices."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(RUN_ROOT)] + [p for p in env.get("PYTHONPATH", "")
                                                           .split(os.pathsep) if p])
    if env.get("D2LMINI_DATA"):            # the notebooks run elsewhere: an absolute path
        env["D2LMINI_DATA"] = str(Path(env["D2LMINI_DATA"]).resolve())
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env["PYTHONUNBUFFERED"] = "1"
    if profile:
        env["D2LMINI_PROFILE"] = profile
    if devices is not None:
        env["D2LMINI_NUM_DEVICES"] = str(devices)
    return env


def probe(fw: str) -> dict:
    """Import ``fw`` in a subprocess and describe it (version, CUDA, devices)."""
    try:
        p = subprocess.run([sys.executable, "-c", PROBE[fw] + PROBE_TAIL], capture_output=True,
                           text=True, timeout=PROBE_TIMEOUT, env=run_env(), cwd=ROOT,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"error": f"importing {fw} did not finish within {PROBE_TIMEOUT} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("GPU-RUN-PROBE "):
            return json.loads(line[len("GPU-RUN-PROBE "):])
    return {"error": f"importing {fw} failed (exit status {p.returncode})",
            "log_tail": (p.stderr or p.stdout)[-1500:]}


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


def check_data() -> dict:
    """Whether Fashion-MNIST is present and verified (never downloads)."""
    try:
        p = subprocess.run([sys.executable, "-m", "d2lmini", "data", "--no-download"],
                           capture_output=True, text=True, timeout=PROBE_TIMEOUT, env=run_env(),
                           cwd=ROOT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"ok": False, "message": "checking the data did not finish in time"}
    text = (p.stdout + p.stderr).strip()
    return {"ok": p.returncode == 0, "message": text.splitlines()[-1] if p.returncode == 0
            else text[-1500:]}


# ---------------------------------------------------------------- running notebooks -------
def snapshot(root: Path, parent: Path) -> Path:
    """A private copy of the checkout ``root`` under ``parent``, for the notebooks to run in.

    A run can outlive the checkout it started from: on the first GPU server run the checkout
    was re-sent (replaced) while a long notebook ran in the background, its kernel's working
    directory vanished, and every later cell that wrote a file or spawned a process failed
    (``FileNotFoundError: 'results.json.lock'``; ``mp.spawn`` raising ``FileNotFoundError``).
    A copy nobody else touches cannot be pulled away.  The report still goes to ``--out-dir``.
    """
    copy = parent / root.name
    shutil.copytree(root, copy, symlinks=True, ignore=shutil.ignore_patterns(*SNAPSHOT_IGNORE))
    return copy


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def run_with_timeout(cmd, timeout: float, env: dict, cwd) -> tuple[int | None, str, float]:
    """Run ``cmd`` (its own session); on timeout kill it and everything it started (the
    Jupyter kernel and launched ranks start sessions of their own).  Returns (exit status or
    None on timeout, combined output, seconds)."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile(mode="w+") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        if rc is None:                 # list the tree first: killing a parent orphans it
            for pid in [p.pid] + _descendants(p.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            p.wait()
        log.seek(0)
        return rc, log.read(), time.monotonic() - t0


def nbval_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("pytest", "nbval", "ipykernel"))


ANSI = re.compile(r"(\x1b|#x1B)\[[0-9;]*[A-Za-z]")


def failure_summary(text: str) -> str:
    """One line of an nbval failure: what went wrong, and the exception if there is one."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    what = next((l for l in lines if re.match(r"Cell \d+: ", l)), lines[0] if lines else "")
    exc = [l for l in lines
           if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*:", l)]
    return (what + (f" -- {exc[-1]}" if exc else ""))[:400]


def run_nbval(nb: Path, timeout: float, env: dict) -> dict:
    """``pytest NOTEBOOK`` with the project's options (pyproject.toml: --nbval
    --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg), one process."""
    with tempfile.TemporaryDirectory(prefix="gpu-run-") as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-c", str(RUN_ROOT / "pyproject.toml"),
               "--rootdir", str(RUN_ROOT), "-q", "-rf", f"--junitxml={xml}", str(nb)]
        rc, log, seconds = run_with_timeout(cmd, timeout, env, RUN_ROOT)
        res = {"mode": "nbval", "command": " ".join(shlex.quote(c) for c in cmd),
               "seconds": round(seconds, 1), "returncode": rc}
        cells = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
        failing, times = [], []
        if xml.is_file():
            for case in ET.parse(xml).getroot().iter("testcase"):
                times.append((float(case.get("time") or 0), case.get("name")))
                bad = [c for c in case if c.tag in ("failure", "error")]
                if any(c.tag == "skipped" for c in case):
                    cells["skipped"] += 1
                elif bad:
                    cells["failed" if bad[0].tag == "failure" else "errors"] += 1
                    text = ANSI.sub("", bad[0].text or bad[0].get("message") or "").strip()
                    failing.append({"cell": case.get("name"), "summary": failure_summary(text),
                                    "message": text[-3000:]})
                else:
                    cells["passed"] += 1
        res.update(cells=cells, failing_cells=failing,      # where a notebook's time goes
                   slowest_cells=[{"cell": n, "seconds": round(t, 1)}
                                  for t, n in sorted(times, reverse=True)[:8]])
    if rc is None:
        res.update(status="timeout", error=f"did not finish within {timeout:g} s (killed)")
    elif rc == 0 and cells["passed"] > 0 and not failing:
        res["status"] = "passed"
    else:
        res["status"] = "failed"
        if not failing:
            res["error"] = f"pytest exit status {rc}: " + (log.strip().splitlines() or ["?"])[-1]
    if res["status"] != "passed":
        res["log_tail"] = log[-TAIL:]
    return res


def run_exec(nb: Path, timeout: float, env: dict) -> dict:
    """The notebook's code cells executed in a fresh interpreter (see :func:`exec_worker`)."""
    with tempfile.TemporaryDirectory(prefix="gpu-run-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "tools.gpu_run", "--exec-notebook", str(nb),
               "--exec-result", str(out)]
        env = dict(env, MPLBACKEND="Agg")
        rc, log, seconds = run_with_timeout(cmd, timeout, env, nb.parent)
        got = json.loads(out.read_text()) if out.is_file() else {}
    res = {"mode": "exec", "command": " ".join(shlex.quote(c) for c in cmd),
           "seconds": round(seconds, 1), "returncode": rc,
           "cells": {"total": got.get("cells_total"), "ran": got.get("cells_ran", 0),
                     "skipped": got.get("cells_skipped", 0)},
           "failing_cells": [got["error"]] if got.get("error") else []}
    if rc is None:
        res.update(status="timeout", error=f"did not finish within {timeout:g} s (killed) "
                   f"after {res['cells']['ran']} of {res['cells']['total']} code cells")
    elif rc == 0 and got.get("ok"):
        res["status"] = "passed"
    else:
        res["status"] = "failed"
        err = got.get("error")
        res["error"] = (f"{err['cell']}: {err['type']}: {err['message']}"[:600] if err
                        else f"exit status {rc} before the cells ran")
    if res["status"] != "passed":
        res["log_tail"] = log[-TAIL:]
    return res


# nbval's comment markers (and cell tags) that change what running a cell means
MARKERS = {"NBVAL_SKIP": "nbval-skip", "NBVAL_RAISES_EXCEPTION": "raises-exception"}


def exec_worker(nb: Path, result: Path) -> int:
    """Execute ``nb``'s code cells in order as a Jupyter kernel would (``__main__`` namespace,
    cwd = the notebook's folder), skipping ``# NBVAL_SKIP`` cells as nbval does; cell output is
    discarded.  Writes the progress to ``result`` after every cell; stops at the first error."""
    cells = json.loads(nb.read_text())["cells"]
    code = [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "code"]
    state = {"cells_total": len(code), "cells_ran": 0, "cells_skipped": 0, "ok": False,
             "error": None}

    def save():
        result.write_text(json.dumps(state, indent=1))
    save()
    os.chdir(nb.parent)
    main = types.ModuleType("__main__")        # the kernel's user namespace is __main__
    sys.modules["__main__"] = main
    sys.argv = [str(nb)]
    sink = io.StringIO()
    for n, (i, src) in enumerate(code):         # "Cell n" as nbval names them (from 0)
        tags = set(cells[i].get("metadata", {}).get("tags", []))
        tags |= {MARKERS[m] for m in (l.strip().lstrip("#").strip() for l in src.splitlines()
                                      if l.strip().startswith("#")) if m in MARKERS}
        if "nbval-skip" in tags:
            state["cells_skipped"] += 1
            continue
        sink.seek(0)
        sink.truncate()
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                exec(compile(src, f"<{nb.name} cell {n}>", "exec"), main.__dict__)
        except BaseException as e:  # noqa: BLE001 -- SystemExit in a cell is an error too
            if "raises-exception" in tags and isinstance(e, Exception):
                state["cells_ran"] += 1
                save()
                continue
            tb = traceback.format_exc()
            state["error"] = {"cell": f"Cell {n}", "index": i, "type": type(e).__name__,
                              "summary": f"Cell {n}: {type(e).__name__}: {str(e)[:300]}",
                              "message": str(e)[:2000], "source": src[:600],
                              "traceback": tb[-3000:], "output_tail": sink.getvalue()[-1500:]}
            save()
            return 1
        state["cells_ran"] += 1
        save()
    state["ok"] = True
    save()
    return 0


# ---------------------------------------------------------------- benchmark ---------------
def bench_devices(upper: int) -> list[int]:
    """1, 2, 4, ... up to ``upper``, and ``upper`` itself; at least 1 and 2."""
    ks, k = {1, 2}, 1
    while k <= upper:
        ks.add(k)
        k *= 2
    ks.add(max(upper, 1))
    return sorted(ks)


def run_benchmark(frameworks: list[str], devices: list[int], out: Path, extra: list[str],
                  timeout: float, env: dict) -> dict:
    cmd = [sys.executable, "-m", "tools.benchmark", "--frameworks",
           ",".join(frameworks), "--devices", ",".join(map(str, devices)), "--out", str(out)]
    cmd += extra                                   # argparse: the last occurrence wins
    if out.exists():
        out.unlink()                               # never report an older file as this run's
    rc, log, seconds = run_with_timeout(cmd, timeout, env, RUN_ROOT)
    res = {"command": " ".join(shlex.quote(c) for c in cmd), "seconds": round(seconds, 1),
           "returncode": rc, "results_file": str(out) if out.is_file() else None}
    if out.is_file():
        data = json.loads(out.read_text())
        res["records"] = [{k: r.get(k) for k in ("framework", "impl", "devices", "device_kind",
                                                 "step_s_median", "samples_per_s",
                                                 "overhead_vs_1")} for r in data["results"]]
        res["failures"] = data["failures"]
    if rc is None:
        res.update(status="timeout", error=f"did not finish within {timeout:g} s (killed)")
    elif rc == 0:
        res["status"] = "passed"
    else:
        res["status"] = "failed"
        res["error"] = (f"{len(res.get('failures', []))} run(s) failed" if res.get("failures")
                        else f"exit status {rc}: " + (log.strip().splitlines() or ["?"])[-1])
    res["log_tail"] = log[-TAIL:]
    return res


# ---------------------------------------------------------------- report ------------------
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


# ---------------------------------------------------------------- main --------------------
def parse_list(text: str, allowed, aliases=None) -> list[str]:
    names = []
    for part in text.split(","):
        p = part.strip().lower()
        if not p:
            continue
        p = (aliases or {}).get(p, p)
        if p not in allowed:
            raise ValueError(f"unknown name {part.strip()!r}; choose from {', '.join(allowed)}")
        names.append(p)
    return list(dict.fromkeys(names))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="Run the notebooks and the benchmark on a GPU server without network, "
                    "and write a report.")
    ap.add_argument("--frameworks", help="comma list of torch, jax, paddle, mxnet "
                    "(default: every one importable here)")
    ap.add_argument("--chapters", default=",".join(CHAPTERS),
                    help="comma list of " + ", ".join(CHAPTERS) + " (default: all of them, the "
                         "chapters with framework notebooks in tools/manifest.py)")
    ap.add_argument("--profile", default="smoke", choices=PROFILES,
                    help="D2LMINI_PROFILE for the notebooks (default: smoke)")
    ap.add_argument("--devices", type=int, metavar="K",
                    help="D2LMINI_NUM_DEVICES for the notebooks (default: as inherited; "
                         "unset means every GPU)")
    ap.add_argument("--mode", default="auto", choices=("auto", "nbval", "exec"),
                    help="nbval (pytest + nbval + ipykernel), exec (code cells in a fresh "
                         "interpreter, outputs discarded), or auto: nbval where importable")
    ap.add_argument("--timeout", type=float, help="seconds per notebook (default by profile: "
                    + ", ".join(f"{k} {v}" for k, v in NOTEBOOK_TIMEOUT.items()) + ")")
    ap.add_argument("--skip-benchmark", action="store_true")
    ap.add_argument("--benchmark-args", default="",
                    help="more options for tools/benchmark.py, one string, e.g. \"--impls "
                         "concise --repeats 3\" (they override this tool's; a single option "
                         "as --benchmark-args=--update)")
    ap.add_argument("--benchmark-timeout", type=float, default=4 * 3600,
                    help="seconds for the whole benchmark (default 4 h)")
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks"),
                    help="where gpu-report.json, gpu-report.md and results-gpu.json go "
                         "(default: benchmarks/)")
    ap.add_argument("--in-place", action="store_true",
                    help="run the notebooks in this checkout instead of a private copy of it "
                         "(a copy survives the checkout being replaced during a long run)")
    ap.add_argument("--allow-cpu", action="store_true",
                    help="run without an NVIDIA GPU (to test this pipeline); the report says so")
    ap.add_argument("--notebooks", nargs="+", help=argparse.SUPPRESS)     # tests: these instead
    ap.add_argument("--exec-notebook", help=argparse.SUPPRESS)            # worker side
    ap.add_argument("--exec-result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.exec_notebook:
        return exec_worker(Path(args.exec_notebook).resolve(), Path(args.exec_result).resolve())

    t_start = time.monotonic()
    gpus, gpu_source = host_gpus()
    if not gpus and not args.allow_cpu:
        print("gpu_run: no NVIDIA GPU found (nvidia-smi reports none"
              + (f", CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r}"
                 if "CUDA_VISIBLE_DEVICES" in os.environ else "")
              + "). This tool runs the book on a GPU server; refusing to run on the CPU. "
              "Pass --allow-cpu to run anyway (a test of the pipeline: the report will say "
              "that no GPU was used).", file=sys.stderr)
        return 2
    if args.devices is not None and args.devices < 1:
        ap.error("--devices must be a positive integer")

    found = detect_frameworks()
    if args.frameworks:
        try:
            wanted = parse_list(args.frameworks, FRAMEWORKS, ALIASES)
        except ValueError as e:
            ap.error(f"--frameworks: {e}")
        missing = [fw for fw in wanted if not found[fw]["importable"]]
        if missing:
            print("gpu_run: not importable by " + sys.executable + ": " + "; ".join(
                f"{fw} (missing {', '.join(found[fw]['missing'])})" for fw in missing),
                file=sys.stderr)
            return 2
        frameworks = [fw for fw in FRAMEWORKS if fw in wanted]
    else:
        frameworks = [fw for fw in FRAMEWORKS if found[fw]["importable"]]
    try:
        chapters = parse_list(args.chapters, CHAPTERS)
    except ValueError as e:
        ap.error(f"--chapters: {e}")
    if args.notebooks:
        notebooks = [Path(p).resolve() for p in args.notebooks]
    else:
        notebooks = [ROOT / "chapters" / ch / f"{NOTEBOOK[fw]}.ipynb"
                     for fw in frameworks for ch in chapters]
    if not notebooks:
        print(f"gpu_run: none of {', '.join(FRAMEWORKS)} can be imported by {sys.executable} "
              "(jax also needs flax and optax); nothing to run.", file=sys.stderr)
        return 2
    mode = args.mode if args.mode != "auto" else ("nbval" if nbval_available() else "exec")
    if mode == "nbval" and not nbval_available():
        print("gpu_run: --mode nbval needs pytest, nbval and ipykernel in this interpreter",
              file=sys.stderr)
        return 2
    timeout = args.timeout or NOTEBOOK_TIMEOUT[args.profile]
    out_dir = Path(args.out_dir).resolve()
    global RUN_ROOT
    snap_parent = None
    if not args.in_place:
        snap_parent = Path(tempfile.mkdtemp(prefix="d2l-gpu-run-"))
        RUN_ROOT = snapshot(ROOT, snap_parent)
        notebooks = [RUN_ROOT / nb.relative_to(ROOT) if nb.is_relative_to(ROOT) else nb
                     for nb in notebooks]
    try:
        return _run(args, gpus, gpu_source, found, frameworks, chapters, notebooks, mode,
                    timeout, out_dir, t_start, argv)
    finally:
        if snap_parent is not None:
            shutil.rmtree(snap_parent, ignore_errors=True)


def _run(args, gpus, gpu_source, found, frameworks, chapters, notebooks, mode, timeout,
         out_dir, t_start, argv) -> int:
    """The run itself (machine, notebooks, benchmark, report), from RUN_ROOT."""
    print(f"gpu_run: {len(gpus)} GPU(s){' (--allow-cpu)' if not gpus else ''}; frameworks "
          f"{', '.join(frameworks) or '-'}; {len(notebooks)} notebook(s) via {mode}; profile "
          f"{args.profile}; report in {out_dir}", flush=True)

    env = run_env(args.profile, args.devices)
    # the machine: framework probes, the doctor and the data check, side by side
    with ThreadPoolExecutor(max_workers=len(frameworks) + 2) as pool:
        probes = {fw: pool.submit(probe, fw) for fw in frameworks}
        doc = pool.submit(doctor, frameworks, env)
        data = pool.submit(check_data)
        machine = {
            "gpus": gpus, "gpu_source": gpu_source,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "cpu": hw.cpu_model(), "cpu_cores": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(), "python_executable": sys.executable,
            "packages": dist_versions(),
            "frameworks": {fw: dict(found[fw], probe=probes[fw].result() if fw in probes
                                    else None) for fw in FRAMEWORKS},
            "doctor": doc.result()}
        data = data.result()
    seen = {fw: (machine["frameworks"][fw]["probe"] or {}).get("gpus") or 0 for fw in frameworks}
    for fw in frameworks:
        p = machine["frameworks"][fw]["probe"]
        print(f"  {fw}: " + (p["error"] if "error" in p else
                             f"{p.get('version')}, {seen[fw]} GPU(s) seen"), flush=True)

    warnings = [f"{fw} sees no GPU although this machine has {len(gpus)}: a CPU build "
                f"(or a failed import); its notebooks ran on the CPU" for fw in frameworks
                if gpus and not seen[fw]]
    if not data["ok"]:
        warnings.append("Fashion-MNIST not found or not verified: " + data["message"][-300:])
    for w in warnings:
        print("gpu_run: WARNING: " + w, flush=True)
    upper = args.devices or len(gpus)
    rep = {"tool": "tools.gpu_run", "argv": sys.argv[1:] if argv is None else list(argv),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "gpu_used": bool(gpus) and any(seen.values()),
           "allow_cpu": args.allow_cpu, "frameworks": frameworks,
           "frameworks_gpu": {fw: seen[fw] > 0 for fw in frameworks},
           "settings": {"profile": args.profile, "chapters": chapters, "mode": mode,
                        "ran_in": "a private copy of the checkout" if RUN_ROOT != ROOT
                        else "the checkout itself (--in-place)",
                        "num_devices": env.get("D2LMINI_NUM_DEVICES"), "timeout": timeout},
           "warnings": warnings, "machine": machine, "data": data, "notebooks": [],
           "benchmark": {"status": "skipped" if args.skip_benchmark else "pending"},
           "seconds": 0.0, "status": "running"}
    summarise(rep)
    rep["status"] = "running"
    write_report(rep, out_dir)

    runner = run_nbval if mode == "nbval" else run_exec
    for nb in notebooks:
        name = str(nb.relative_to(RUN_ROOT)) if nb.is_relative_to(RUN_ROOT) else str(nb)
        fw = {v: k for k, v in NOTEBOOK.items()}.get(nb.stem)
        print(f"{name} ...", end=" ", flush=True)
        try:
            res = runner(nb, timeout, env)
        except Exception as e:  # noqa: BLE001 -- the runner itself broke: report, go on
            res = {"mode": mode, "status": "error", "error": f"{type(e).__name__}: {e}",
                   "log_tail": traceback.format_exc()[-TAIL:]}
        res = {"notebook": name, "framework": fw, "chapter": nb.parent.name, **res}
        rep["notebooks"].append(res)
        print(f"{res['status']} ({res.get('seconds', '?')} s)"
              + (f": {first_failure(res)}" if res["status"] != "passed" else ""), flush=True)
        rep["seconds"] = round(time.monotonic() - t_start, 1)
        summarise(rep)
        rep["status"] = "running"
        write_report(rep, out_dir)

    if not args.skip_benchmark:
        ks = bench_devices(upper)
        print(f"benchmark: {', '.join(frameworks)} on {ks} devices ...", flush=True)
        # the benchmark sets D2LMINI_NUM_DEVICES per run itself
        benv = run_env()
        benv.pop("D2LMINI_NUM_DEVICES", None)
        rep["benchmark"] = run_benchmark(frameworks, ks, out_dir / "results-gpu.json",
                                         shlex.split(args.benchmark_args),
                                         args.benchmark_timeout, benv)
        print(f"benchmark: {rep['benchmark']['status']}"
              + (f" ({rep['benchmark']['error']})" if rep["benchmark"].get("error") else ""),
              flush=True)
    rep["seconds"] = round(time.monotonic() - t_start, 1)
    summarise(rep)
    write_report(rep, out_dir)
    print(f"gpu_run: {rep['status']} -- {rep['summary']}; GPU used: "
          f"{'yes' if rep['gpu_used'] else 'NO'}; report: {out_dir / 'gpu-report.md'}")
    return 0 if rep["status"] == "passed" else 1


if __name__ == "__main__":
    raise SystemExit(main())

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
ALIASES = manifest.ALIASES
CHAPTERS = manifest.gpu_run_chapters()                   # the chapters with framework notebooks
PROFILES = ("smoke", "cpu", "gpu")
NOTEBOOK_TIMEOUT = {"smoke": 900, "cpu": 2400, "gpu": 5400}   # seconds, per notebook
TAIL = 4000                                               # characters of a log kept


from tools.gpu_machine import (check_data, detect_frameworks,  # noqa: E402
                               dist_versions, doctor, host_gpus, probe)
from tools.gpu_report import first_failure, render_md, summarise, write_report  # noqa: E402,F401


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
def exec_worker(nb: Path, result: Path) -> int:
    """Execute ``nb``'s code cells in order as a Jupyter kernel would (``__main__`` namespace,
    cwd = the notebook's folder: ``tools.notebooks.run_cells``), skipping ``nbval-skip`` cells
    as nbval does; cell output is discarded.  Writes the progress to ``result`` after every
    cell; stops at the first error."""
    from tools.notebooks import code_cells, read, run_cells
    book = read(nb)
    every, cells = code_cells(book), code_cells(book, skip=("nbval-skip",))
    state = {"cells_total": len(every), "cells_ran": 0, "cells_skipped": len(every) - len(cells),
             "ok": False, "error": None}

    def save():
        result.write_text(json.dumps(state, indent=1))
    save()
    main = types.ModuleType("__main__")        # the kernel's user namespace is __main__
    sys.modules["__main__"] = main
    sys.argv = [str(nb)]
    sink = io.StringIO()
    for n, i, src, tags, e in run_cells(nb, main.__dict__, cells, sink):   # "Cell n" as nbval
        if e is not None and not ("raises-exception" in tags and isinstance(e, Exception)):
            state["error"] = {"cell": f"Cell {n}", "index": i, "type": type(e).__name__,
                              "summary": f"Cell {n}: {type(e).__name__}: {str(e)[:300]}",
                              "message": str(e)[:2000], "source": src[:600],
                              "traceback": "".join(traceback.format_exception(e))[-3000:],
                              "output_tail": sink.getvalue()[-1500:]}
            save()
            return 1
        state["cells_ran"] += 1
        save()
        sink.seek(0)
        sink.truncate()
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
        notebooks = [ROOT / "chapters" / ch / f"{stem}.ipynb"      # each lab, then its in-depth pages
                     for fw in frameworks for ch in chapters
                     for stem in (NOTEBOOK[fw], *manifest.chapter(ch).lab_page_stems(NOTEBOOK[fw]))]
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
        probes = {fw: pool.submit(probe, fw, run_env()) for fw in frameworks}
        doc = pool.submit(doctor, frameworks, env)
        data = pool.submit(check_data, run_env())
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
        fw = {v: k for k, v in NOTEBOOK.items()}.get(nb.stem.split("-")[0])
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

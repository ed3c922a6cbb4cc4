"""What each framework sees on this machine, and what to fix (python -m d2lmini doctor).

For each of the four frameworks the doctor reports whether it is installed (found without
importing it), and -- imported in a subprocess of this interpreter, all four in parallel, each
with a timeout, so that a slow, hanging or crashing import is reported and not inherited --
its version, whether it is a CPU or a GPU build, the devices it sees, the CUDA / cuDNN / NCCL
versions it reports, and how many devices of which kind the lessons will use.  It compares
that with the NVIDIA GPUs of the host (``nvidia-smi``, :mod:`d2lmini.hardware`):

* the host has GPUs but an installed framework sees none (a CPU build: its notebooks would
  fall back to the CPU) -- a problem, with the command that installs the GPU build;
* MXNet on a GPU it has no kernels for (compute capability >= 9.0) -- a problem; its notebooks
  use CPU contexts and print a note;
* an import that fails, crashes or hangs -- a problem;
* a framework that is not installed -- reported, a problem only if ``--require`` names it.

Exit status 0 without problems, 1 with.  ``--json`` prints the same as one JSON object.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import traceback
import warnings
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata

from .frameworks import FRAMEWORKS as _FWS, KEYS as FRAMEWORKS   # the book's order
from .hardware import (GPU_BUILDS, GpuInfo, canonical_framework, gpu_build_fix,
                       gpu_builds_installed, mxnet_unsupported_gpu, nvidia_gpus)

MODULES = {f.key: f.module for f in _FWS}
DISTRIBUTIONS = {f.key: f.distribution for f in _FWS}
# How hardware.gpu_builds_installed() entries of each framework begin.
_GPU_DIST = {f.key: f.gpu_distribution for f in _FWS}
MARKER = "D2LMINI-DOCTOR-PROBE:"
DEFAULT_TIMEOUT = 180.0


# --- in the subprocess: import one framework and describe it ----------------------------------

def _dist_version(pattern: str):
    """(name, version) of the first installed distribution whose name matches ``pattern``."""
    rx = re.compile(pattern)
    for d in metadata.distributions():
        name = (d.metadata["Name"] or "").lower().replace("_", "-")
        if rx.fullmatch(name):
            return name, d.version
    return None, None


def _cudnn_str(v) -> str | None:
    """cuDNN's version integer as text: 90100 -> 9.1.0 (cuDNN 9), 8902 -> 8.9.2 (cuDNN 8)."""
    if not v:
        return None
    v = int(v)
    if v >= 10000:
        return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return f"{v // 1000}.{v % 1000 // 100}.{v % 100}"


def _probe_torch() -> dict:
    import torch
    r = {"version": torch.__version__, "cuda": torch.version.cuda}
    hip = getattr(torch.version, "hip", None)
    r["build"] = f"CUDA {torch.version.cuda}" if torch.version.cuda else \
        (f"ROCm {hip}" if hip else "CPU")
    n = torch.cuda.device_count() if (torch.version.cuda or hip) else 0
    r["gpus"] = n
    r["devices"] = [{"id": f"cuda:{i}", "kind": "gpu",
                     "name": f"{torch.cuda.get_device_name(i)} (compute capability "
                             f"{'.'.join(map(str, torch.cuda.get_device_capability(i)))})"}
                    for i in range(n)] + [{"id": "cpu", "kind": "cpu", "name": "cpu"}]
    r["cudnn"] = _cudnn_str(torch.backends.cudnn.version()) if torch.version.cuda else None
    r["nccl"] = None
    if torch.version.cuda:
        try:
            r["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 -- not built with NCCL
            pass
    return r


def _probe_jax() -> dict:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jaxlib
    r = {"version": f"{jax.__version__}", "jaxlib": jaxlib.__version__}
    plugin, plugin_version = _dist_version(r"jax-(cuda|rocm)\d*-plugin")
    r["build"] = f"{plugin} {plugin_version}" if plugin else "CPU"
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as e:
        gpus = []
        if plugin:
            r["notes"] = [f"jax.devices('gpu'): {e}"]
    r["gpus"] = len(gpus)
    r["devices"] = [{"id": f"gpu:{d.id}", "kind": "gpu", "name": d.device_kind} for d in gpus]
    r["devices"] += [{"id": f"cpu:{d.id}", "kind": "cpu", "name": str(d)}
                     for d in jax.devices("cpu")]
    r["cuda"] = r["cudnn"] = r["nccl"] = None
    if plugin and gpus:
        try:  # what jax.print_environment_info() would read, without nvidia-smi's table
            from jax._src.lib import cuda_versions
            if cuda_versions is not None:
                v = cuda_versions.cuda_runtime_get_version()
                r["cuda"] = f"{v // 1000}.{v % 1000 // 10}"
                r["cudnn"] = _cudnn_str(cuda_versions.cudnn_get_version())
        except Exception:  # noqa: BLE001 -- private API; the versions are a courtesy
            pass
        nccl = _dist_version(r"nvidia-nccl-cu\d+")[1]
        r["nccl"] = f"{nccl} (pip)" if nccl else None
    return r


def _probe_paddle() -> dict:
    import logging
    warnings.filterwarnings("ignore", message="No ccache found")
    level = logging.getLogger().level
    import paddle
    logging.getLogger().setLevel(level)
    compiled = paddle.device.is_compiled_with_cuda()

    def version_of(name):
        f = getattr(paddle.version, name, None)
        v = f() if callable(f) else None
        return None if v in (None, "False", "0", "") else str(v)

    r = {"version": paddle.__version__, "cuda": version_of("cuda"),
         "cudnn": version_of("cudnn"), "nccl": version_of("nccl")}
    r["build"] = f"CUDA {r['cuda']}" if compiled else "CPU"
    n = paddle.device.cuda.device_count() if compiled else 0
    r["gpus"] = n
    r["devices"] = [{"id": f"gpu:{i}", "kind": "gpu",
                     "name": f"{paddle.device.cuda.get_device_name(i)} (compute capability "
                             f"{'.'.join(map(str, paddle.device.cuda.get_device_capability(i)))})"}
                    for i in range(n)] + [{"id": "cpu", "kind": "cpu", "name": "CPUPlace"}]
    return r


def _probe_mxnet() -> dict:
    import d2lmini._mxnet_compat as c
    c.install()
    import mxnet as mx
    feats = mx.runtime.Features()
    cuda = feats.is_enabled("CUDA")
    dist = _dist_version(DISTRIBUTIONS["mxnet"])[0] or "mxnet"
    m = re.fullmatch(r"mxnet-cu(\d+)(\d)", dist)
    r = {"version": mx.__version__, "cuda": (f"{m.group(1)}.{m.group(2)}" if m else "yes")
         if cuda else None,
         "cudnn": "yes" if feats.is_enabled("CUDNN") else None,
         "nccl": "yes" if feats.is_enabled("NCCL") else None}
    r["build"] = f"CUDA {r['cuda']} ({dist})" if cuda else "CPU"
    n = mx.context.num_gpus() if cuda else 0
    r["gpus"] = n
    r["devices"] = [{"id": f"gpu({i})", "kind": "gpu", "name": f"mx.gpu({i})"} for i in range(n)]
    r["devices"] += [{"id": "cpu(i)", "kind": "cpu", "name": "mx.cpu(i), any i"}]
    return r


_PROBES = {"torch": _probe_torch, "jax": _probe_jax, "paddle": _probe_paddle,
           "mxnet": _probe_mxnet}


def probe_main(framework: str) -> int:
    """Run in the subprocess: print one line ``MARKER {json}``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            r = _PROBES[framework]()
        except BaseException as e:  # noqa: BLE001 -- any failure is the report
            where = traceback.extract_tb(e.__traceback__)[-1]
            r = {"error": f"{type(e).__name__}: {e}",
                 "traceback": f"raised at {where.filename}:{where.lineno}"}
    notes = r.setdefault("notes", [])
    for w in caught:
        text = str(w.message).strip().splitlines()[0] if str(w.message).strip() else ""
        if text and issubclass(w.category, UserWarning) and text not in notes \
                and "ccache" not in text:
            notes.append(text[:300])
    print(MARKER + json.dumps(r), flush=True)
    return 0


# --- in the parent ----------------------------------------------------------------------------

@dataclasses.dataclass
class Report:
    framework: str
    installed: bool = False
    distribution: str | None = None
    version: str | None = None
    build: str | None = None
    gpus: int = 0
    devices: list = dataclasses.field(default_factory=list)
    cuda: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    gpu_supported: bool | None = None   # MXNet only: kernels for every host GPU
    lessons: str | None = None          # what try_all_gpus() will give the notebooks
    error: str | None = None
    notes: list = dataclasses.field(default_factory=list)
    status: str = "ok"                  # ok | problem | not installed


def installed(framework: str) -> tuple[bool, str | None, str | None]:
    """(importable, distribution, version) without importing the framework."""
    try:
        found = importlib.util.find_spec(MODULES[framework]) is not None
    except (ImportError, ValueError):
        found = False
    name, version = _dist_version(DISTRIBUTIONS[framework])
    return found, name, version


def run_probe(framework: str, timeout: float, env: dict | None = None) -> dict:
    """What ``framework`` reports about itself (version, build, CUDA/cuDNN/NCCL, GPUs, devices),
    imported in a subprocess of its own (environment ``env``, default this one's) so that a
    crash or a hang is a report, not ours: the book's one framework probe (``tools.gpu_run``
    uses it too)."""
    env = dict(os.environ if env is None else env)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    cmd = [sys.executable, "-m", "d2lmini.doctor", "--probe", framework]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"error": f"importing {framework} did not finish within {timeout:g} s "
                         f"(hung; killed)"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    if p.returncode < 0:
        try:
            how = f"killed by {signal.Signals(-p.returncode).name}"
        except ValueError:
            how = f"killed by signal {-p.returncode}"
    else:
        how = f"exit status {p.returncode}"
    tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-6:])
    return {"error": f"the process importing {framework} crashed ({how})",
            "traceback": tail}


def _lessons(framework: str, gpus: int, unsupported: str | None) -> str | None:
    """What the backend's try_all_gpus() will return, from d2lmini.config's plan."""
    try:
        from . import config
        plan_devices = config.plan_devices
    except (ImportError, AttributeError):
        return None
    kwargs = {"stand_in": "cpu"} if framework == "jax" else {}
    if unsupported:
        kwargs["unsupported"] = unsupported
    try:
        p = plan_devices(framework, gpus, **kwargs)
    except getattr(config, "GPUBuildMissing", RuntimeError):
        return "stops (GPUBuildMissing)"
    except Exception as e:  # noqa: BLE001
        return f"? ({type(e).__name__}: {e})"
    return f"{p.count} {p.kind.upper()}" + (" (stand-ins)" if p.stand_ins else "")


def _gpu_text(g: GpuInfo) -> str:
    return (f"GPU {g.index}: {g.name}, compute capability {g.compute_capability[0]}."
            f"{g.compute_capability[1]}, {g.memory_mib} MiB, driver {g.driver_version}")


def diagnose(frameworks, require=(), timeout: float = DEFAULT_TIMEOUT) -> dict:
    """Probe ``frameworks`` and return the whole report (what ``--json`` prints)."""
    from .config import get_profile
    host = nvidia_gpus()
    problems: list[dict] = []

    def problem(fw, text, fix):
        problems.append({"framework": fw, "problem": text, "fix": fix})

    profile = None
    try:
        profile = get_profile().name
    except ValueError as e:
        problem("d2lmini", str(e), "set D2LMINI_PROFILE to smoke, cpu or gpu, or unset it")
    raw_k = os.environ.get("D2LMINI_NUM_DEVICES")
    try:
        from .config import num_simulated_devices
        num_simulated_devices()
    except ValueError as e:
        problem("d2lmini", str(e), "set D2LMINI_NUM_DEVICES to an integer from 1 to 8 (or to the "
                "number of GPUs), or unset it")

    reports = {fw: Report(fw) for fw in frameworks}
    todo = []
    for fw, r in reports.items():
        r.installed, r.distribution, r.version = installed(fw)
        if r.installed:
            todo.append(fw)
        else:
            r.status = "not installed"
    with ThreadPoolExecutor(max(1, len(todo))) as ex:
        probed = dict(zip(todo, ex.map(lambda f: run_probe(f, timeout), todo)))

    gpu_dists = gpu_builds_installed()
    for fw, r in reports.items():
        gpu_build = any(d.startswith(_GPU_DIST[fw]) for d in gpu_dists)
        fix_install = gpu_build_fix(fw) if host or gpu_build else \
            "make venv (the CPU venv .venv holds all four frameworks)"
        if not r.installed:
            if fw in require:
                r.status = "problem"
                problem(fw, f"{fw} is not installed (required by --require)", fix_install)
            continue
        p = probed[fw]
        r.notes = list(p.get("notes") or [])
        if "error" in p:
            r.error = p["error"]
            r.status = "problem"
            detail = f" ({p['traceback'].rstrip()})" if p.get("traceback") else ""
            lib = re.search(r"(lib[\w.+-]+\.so[\d.]*)", r.error)
            if lib and gpu_build:
                fix = (f"the GPU build of {fw} ({r.distribution}) needs "
                       f"{GPU_BUILDS[fw].needs}: {lib.group(1)} is not on the library path; "
                       f"install it, or add its directory to LD_LIBRARY_PATH")
            else:
                fix = f"reinstall it: {fix_install}"
            problem(fw, f"importing {fw} failed: {r.error}{detail}", fix)
            continue
        r.version = p.get("version", r.version)
        r.build, r.gpus, r.devices = p.get("build"), int(p.get("gpus") or 0), p.get("devices", [])
        r.cuda, r.cudnn, r.nccl = p.get("cuda"), p.get("cudnn"), p.get("nccl")

        unsupported = None
        if fw == "mxnet" and host:
            bad = mxnet_unsupported_gpu(host)
            r.gpu_supported = bad is None
            if bad:
                unsupported = bad[1]
        # d2lmini.mxnet uses CPU contexts on such a GPU whatever the build (the GPU build
        # would not run there either), so the plan is asked with the reason in both cases.
        r.lessons = _lessons(fw, r.gpus, unsupported)

        stops = (r.lessons or "").startswith("stops")
        if unsupported:
            r.status = "problem"
            cc = "%d.%d" % bad[0].compute_capability
            problem(fw, f"MXNet is not supported on this GPU (compute capability {cc}). "
                        f"{unsupported} The MXNet notebooks use CPU contexts here and print a "
                        f"note saying so.",
                    f"none on compute capability {cc} (no MXNet build has kernels for it): "
                    f"run the MXNet notebooks on CPU contexts (D2LMINI_PROFILE=cpu), on a GPU "
                    f"of compute capability 5.0-8.9 (make gpu-venv FW=mxnet there), or use "
                    f"another framework on this GPU.")
        elif host and r.gpus == 0:
            r.status = "problem"
            where = f"{len(host)} ({host[0].name})"
            then = (" -- under the gpu profile in force they stop instead (GPUBuildMissing)"
                    if stops else f" (the lessons would use: {r.lessons})" if r.lessons else "")
            if r.build == "CPU":
                problem(fw, f"{fw} {r.version} is a CPU build: it sees no GPU although this "
                            f"machine has {where}, so its notebooks would fall back to the "
                            f"CPU{then}.",
                        gpu_build_fix(fw))
            else:
                b = GPU_BUILDS[fw]
                problem(fw, f"{fw} {r.version} is a GPU build ({r.build}) but sees no GPU "
                            f"although this machine has {where} (driver "
                            f"{host[0].driver_version}); its notebooks would fall back to the "
                            f"CPU. See its notes: a driver too old for the build, or a "
                            f"LD_LIBRARY_PATH that hides the pip CUDA libraries.",
                        f"this build needs {b.needs}; update the driver or reinstall: "
                        f"{gpu_build_fix(fw)}")
        elif r.gpus and host and r.gpus < len(host):
            r.notes.append(f"sees {r.gpus} of the host's {len(host)} GPUs")
        elif r.gpus and not host:
            r.notes.append("sees GPUs that nvidia-smi does not report (no nvidia-smi?)")

    smi = shutil.which("nvidia-smi")
    return {
        "python": sys.executable,
        "python_version": ".".join(map(str, sys.version_info[:3])),
        "host": {"gpus": [dataclasses.asdict(g) for g in host], "nvidia_smi": smi,
                 "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")},
        "profile": profile,
        "num_devices": raw_k,
        "frameworks": {fw: dataclasses.asdict(r) for fw, r in reports.items()},
        "problems": problems,
        "ok": not problems,
    }


def _cell(v, width):
    v = "-" if v in (None, "") else str(v)
    return (v if len(v) <= width else v[:width - 1] + "~").ljust(width)


def render(report: dict) -> str:
    out = [f"d2lmini doctor -- {report['python']} (Python {report['python_version']})"]
    host = report["host"]
    if host["gpus"]:
        out.append(f"host GPUs : {len(host['gpus'])}")
        out += [f"  {_gpu_text(GpuInfo(**{**g, 'compute_capability': tuple(g['compute_capability'])}))}"
                for g in host["gpus"]]
    else:
        cvd = host["cuda_visible_devices"]
        why = ("hidden by CUDA_VISIBLE_DEVICES" if cvd is not None and cvd.strip() in ("", "-1")
               else "no nvidia-smi on PATH" if not host["nvidia_smi"]
               else "nvidia-smi reports none")
        out.append(f"host GPUs : none ({why})")
    out.append(f"profile   : {report['profile'] or '?'} (D2LMINI_PROFILE="
               f"{os.environ.get('D2LMINI_PROFILE', 'unset')})")
    k = report["num_devices"]
    out.append(f"devices   : D2LMINI_NUM_DEVICES={k if k is not None else 'unset'} "
               f"({'the lessons use that many devices' if k else 'every GPU, or 2 simulated CPU devices'})")
    out.append("")
    cols = [("framework", 9), ("version", 12), ("build", 22), ("sees", 16), ("CUDA", 6),
            ("cuDNN", 7), ("NCCL", 12), ("lessons use", 23), ("status", 13)]
    out.append(" ".join(_cell(c, w) for c, w in cols).rstrip())
    for fw, r in report["frameworks"].items():
        if r["installed"] and not r["error"]:
            sees = f"{r['gpus']} GPU" + ("s" if r["gpus"] != 1 else "") if r["gpus"] else "CPU only"
        else:
            sees = None
        vals = [fw, r["version"] if r["installed"] else None, r["build"], sees, r["cuda"],
                r["cudnn"], r["nccl"], r["lessons"], r["status"]]
        out.append(" ".join(_cell(v, w) for v, (_, w) in zip(vals, cols)).rstrip())
    details = []
    for fw, r in report["frameworks"].items():
        devs = ", ".join(f"{d['id']} {d['name']}" if d["name"] != d["id"] else d["id"]
                         for d in r["devices"])
        if devs:
            details.append(f"  {fw}: {devs}")
        details += [f"  {fw}: note: {n}" for n in r["notes"]]
    if details:
        out += ["", "devices and notes:"] + details
    out.append("")
    if report["problems"]:
        n = len(report["problems"])
        out.append(f"{n} problem{'s' if n > 1 else ''}:")
        for i, p in enumerate(report["problems"], 1):
            lines = p["problem"].splitlines()
            out.append(f" {i}. {p['framework']}: {lines[0]}")
            out += [f"      {l}" for l in lines[1:]]
            out.append(f"    fix: {p['fix']}")
    else:
        out.append("no problems.")
    return "\n".join(out)


def _frameworks(values) -> list[str]:
    names = []
    for v in values or []:
        for part in v.split(","):
            if part.strip():
                try:
                    names.append(canonical_framework(part))
                except ValueError as e:
                    raise argparse.ArgumentTypeError(str(e)) from None
    return list(dict.fromkeys(names))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--json-file", metavar="PATH",
                   help="also write the report as JSON to PATH (the printed report as asked)")
    p.add_argument("-f", "--framework", action="append", metavar="FW",
                   help="only this framework (torch, jax, paddle, mxnet); repeatable")
    p.add_argument("--require", action="append", metavar="FW[,FW]", default=[],
                   help="a framework that must be installed (else a problem)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"seconds for one framework's import (default {DEFAULT_TIMEOUT:g})")


def run(args) -> int:
    try:
        only, require = _frameworks(args.framework), _frameworks(args.require)
    except argparse.ArgumentTypeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    frameworks = [fw for fw in FRAMEWORKS if not only or fw in only or fw in require]
    report = diagnose(frameworks, require=set(require), timeout=args.timeout)
    print(json.dumps(report, indent=1) if args.json else render(report))
    if args.json_file:
        with open(args.json_file, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    return 0 if report["ok"] else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m d2lmini doctor", description=__doc__.split("\n")[0])
    add_arguments(p)
    p.add_argument("--probe", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.probe:
        return probe_main(args.probe)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())

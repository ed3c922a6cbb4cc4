"""GPU environments: check that they resolve, and keep the CPU venv free of GPU builds.

    python -m tools.gpu_env check [--json FILE] [FRAMEWORK ...]   # make gpu-check
    python -m tools.gpu_env cpu-venv-ok VENV                        # guard of make venv

``check`` runs, for each framework, exactly the pip steps of ``make gpu-venv FW=...`` (taken
from ``d2lmini/hardware.py``, ``GPU_BUILDS``) as ``pip install --dry-run --ignore-installed
--report``: nothing is installed or changed, pip only resolves (and reads the wheels'
metadata).  It prints the versions that would be installed: the framework, its CUDA, cuDNN
and NCCL packages, numpy.  Paddle's GPU build is only on Paddle's own index: when that index
cannot be reached, Paddle is reported "not checked" and does not fail the check.  Exit 1 when
a framework's environment does not resolve, or pulls in another framework.

``cpu-venv-ok VENV`` runs in the CPU venv's interpreter and exits 3 (with an error that says
what to do) when that environment holds a GPU build, which ``make venv`` would replace.

Only the standard library and ``d2lmini/hardware.py`` (loaded as a file, so that this works
before d2lmini is installed) are used.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import venv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_hardware():
    spec = importlib.util.spec_from_file_location("_d2lmini_hardware",
                                                  ROOT / "d2lmini" / "hardware.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # dataclasses look the module up while building
    spec.loader.exec_module(mod)
    return mod


hw = load_hardware()

# What the summary shows of an environment (everything else is counted).
KEY = re.compile(r"^(torch|triton|jax|jaxlib|jax-cuda\d+-(plugin|pjrt)|paddlepaddle(-gpu)?|"
                 r"mxnet(-cu\d+)?|numpy|flax|optax|cuda-toolkit|nvidia-cudnn.*|nvidia-nccl.*|"
                 r"nvidia-cuda-runtime.*)$")
# Distributions that mean "this framework": an environment must hold its own only.
FRAMEWORK_DISTS = {"torch": re.compile(r"^torch$"),
                   "jax": re.compile(r"^(jax|jaxlib|jax-cuda\d+-(plugin|pjrt))$"),
                   "paddle": re.compile(r"^paddlepaddle(-gpu)?$"),
                   "mxnet": re.compile(r"^mxnet(-cu\d+)?$")}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pip_python() -> str:
    """An interpreter whose pip can do ``--dry-run --report`` (pip >= 22.2) and reads wheel
    metadata without downloading wheels (pip >= 23): this one, else a temporary venv."""
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True,
                             text=True, timeout=60)
        m = re.match(r"pip (\d+)\.", out.stdout)
        if out.returncode == 0 and m and int(m.group(1)) >= 23:
            return sys.executable
    except (OSError, subprocess.SubprocessError):
        pass
    tmp = Path(tempfile.mkdtemp(prefix="d2l-gpu-check-"))
    venv.create(tmp, with_pip=True)
    py = str(tmp / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    return py


def reachable(url: str, timeout: float = 15.0) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status < 400, f"HTTP {r.status}"
    except urllib.error.HTTPError as e:      # the server answered: reachable
        return e.code < 500, f"HTTP {e.code}"
    except (OSError, ValueError) as e:
        return False, str(getattr(e, "reason", e))


def dry_run(py: str, args: tuple[str, ...]) -> tuple[bool, list[dict], str]:
    """``pip install --dry-run --ignore-installed --report`` of ``args``: (ok, install, log)."""
    with tempfile.TemporaryDirectory() as d:
        report = Path(d) / "report.json"
        cmd = [py, "-m", "pip", "install", "--disable-pip-version-check", "--dry-run",
               "--ignore-installed", "--quiet", "--report", str(report), *args]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        log = "\n".join(l for l in (p.stdout + p.stderr).splitlines()
                        if not l.startswith("WARNING: Location"))
        if p.returncode != 0 or not report.exists():
            return False, [], log
        return True, json.loads(report.read_text())["install"], log


def check(framework: str, py: str) -> dict:
    b = hw.GPU_BUILDS[framework]
    res = {"framework": framework, "venv": b.venv, "status": "resolves", "steps": [],
           "key": {}, "packages": 0, "problems": []}
    if framework == "paddle":
        ok, why = reachable(hw.PADDLE_INDEX + "paddlepaddle-gpu/")
        if not ok:
            res["status"] = "not checked: Paddle's index unreachable"
            res["problems"].append(f"{hw.PADDLE_INDEX}: {why}")
            return res
    for step in b.pip_steps:
        ok, install, log = dry_run(py, step)
        res["steps"].append({"pip install": " ".join(step), "ok": ok,
                             "packages": len(install)})
        if not ok:
            res["status"] = "does not resolve"
            res["problems"].append(f"pip install {' '.join(step)}:\n{log[-3000:]}")
            return res
        for item in install:
            name, version = norm(item["metadata"]["name"]), item["metadata"]["version"]
            res["packages"] += 1
            if KEY.match(name):
                res["key"][name] = version
            for other, pattern in FRAMEWORK_DISTS.items():
                if other != framework and pattern.match(name):
                    res["problems"].append(f"pulls in another framework: {name} {version}")
    if res["problems"]:
        res["status"] = "resolves, but " + "; ".join(res["problems"])
    return res


def cmd_check(args) -> int:
    frameworks = [hw.canonical_framework(f) for f in args.frameworks] or list(hw.GPU_BUILDS)
    py = pip_python()
    print(f"Resolving the GPU environments with pip --dry-run --ignore-installed "
          f"(nothing is installed; pip: {py})", flush=True)
    with ThreadPoolExecutor(len(frameworks)) as ex:
        results = list(ex.map(lambda f: check(f, py), frameworks))
    failed = False
    for r in results:
        print(f"\n{r['framework']} ({r['venv']}): {r['status'].splitlines()[0]}")
        if r["key"]:
            print(f"  {r['packages']} packages, among them:")
            for name in sorted(r["key"]):
                print(f"    {name}=={r['key'][name]}")
        if r["status"] == "does not resolve":
            print("  " + "\n  ".join(r["problems"][-1].splitlines()[-15:]))
        elif r["status"].startswith("not checked"):
            print(f"  ({r['problems'][0]}; run make gpu-check where it is reachable)")
        failed |= r["status"] != "resolves" and not r["status"].startswith("not checked")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    print("\ngpu-check: " + ("FAILED" if failed else "ok"))
    return 1 if failed else 0


def cmd_cpu_venv_ok(args) -> int:
    builds = hw.gpu_builds_installed()
    if not builds:
        return 0
    v = args.venv
    print(f"error: {v} holds GPU builds ({', '.join(builds)}); `make venv` would replace them "
          f"by the CPU builds of requirements.txt. GPU builds live in their own venvs: make "
          f"gpu-venv FW=<torch|jax|paddle|mxnet> (docs/setup.md, 'GPU servers in detail'). "
          f"To keep this "
          f"environment, move it away (e.g. mv {v} {v}-gpu-old) or give make another one "
          f"(make VENV=...); make then creates the CPU venv anew.", file=sys.stderr)
    return 3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools/gpu_env.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="resolve every GPU environment (pip --dry-run)")
    c.add_argument("frameworks", nargs="*", help="torch jax paddle mxnet (default: all)")
    c.add_argument("--json", help="also write the results to this file")
    g = sub.add_parser("cpu-venv-ok", help="exit 3 if this interpreter's venv holds GPU builds")
    g.add_argument("venv", nargs="?", default=sys.prefix)
    args = p.parse_args(argv)
    return cmd_check(args) if args.cmd == "check" else cmd_cpu_venv_ok(args)


if __name__ == "__main__":
    raise SystemExit(main())

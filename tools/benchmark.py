"""Time data-parallel training steps per framework, implementation and device count.

    .venv/bin/python -m tools.benchmark                       # everything; writes benchmarks/results.json
    .venv/bin/python -m tools.benchmark --frameworks jax --devices 1,2 --repeats 3

What is timed is the code the book shows: a worker process executes a chapter notebook's own
code cells, except its long training runs (under the smoke profile, so that part is quick),
and then times the functions those cells defined, with ``D2LMINI_NUM_DEVICES`` set to the device
count (on a GPU machine the real GPUs are used instead).

``--comm`` instead times each framework's own all-reduce over message sizes and device counts
with the communication chapter's ``d2lmini.commcost.sweep`` and fits the alpha-beta model
(``benchmarks/comm.json``).

Implementations (``--impls``):
  seed      the from-scratch chapter's ``train_step`` with its naive ``allreduce``: per-batch
            host-to-device copies and the sum on device 0 -- the seed tutorial's loop
  ring      the same ``train_step`` with the chapter's hand-written ``ring_allreduce``
  concise   the concise chapter's own tool on its ResNet-18 variant (``--width``):
            MXNet ``gluon.Trainer`` over the context list and JAX ``jit`` + ``NamedSharding``
            (in the worker process, timed per step like the above); PyTorch DDP launched by
            ``torchrun`` and ``paddle.DataParallel`` launched by ``paddle.distributed.launch``
            (k processes, also for k = 1): the ranks run the script's own ``train`` through
            this file (``--bench-rank``) -- one warm-up epoch, then ``--repeats`` epochs of
            ``--concise-steps`` steps, the input pipeline inside (``epoch_step_times``,
            labelled ``epoch_span``) -- and then time the script's ``train_step`` on a batch
            already on their device with ``d2lmini.steptime.time_steps`` (``step_times``),
            the same span as the in-process records; and add where their parameters lived.

Every record says what its timed step holds (``span``): the step on a batch already on the
devices (the concise implementations), or the step with its own split of the host batch onto
the devices (the from-scratch ``train_step`` and MXNet's concise one, which split the batch
themselves: the chapters' code as shown).

For every (framework, implementation, devices): ``--warmup`` untimed steps (compilation,
allocation), then ``--repeats`` timed runs of ``--steps`` steps each on the same global batch
size; the results file records the median and spread (min, max) of the per-step time,
samples/s, and the overhead ratio t(k devices) / t(1 device).  It also records the hardware
(CPU model and cores, or GPU names) and the package versions.

A record is a result only if it is possible (``d2lmini.bench``):

* **Where**: k = 1 asks for the backend's ``try_gpu()`` (the GPU when there is one); k >= 2
  for its first k devices (more than the GPUs: stand-ins).  After the timed steps the devices
  of the arrays themselves are read -- the parameters of every replica, the state of JAX's
  mesh, every rank's model -- and recorded as ``arrays_on``, with ``device_kind`` derived from
  them (``gpu``, ``gpu-stand-ins``, ``cpu``, ``simulated-cpu``, ``cpu-stand-ins``).  Arrays
  elsewhere than requested make the run a failure.
* **Waited for**: every timed window ends by blocking on the step's outputs (JAX:
  ``jax.block_until_ready`` of the returned state; PyTorch: ``torch.cuda.synchronize`` of the
  parameters' GPUs; MXNet: ``nd.waitall``; Paddle: ``paddle.device.synchronize``); the
  launched scripts synchronize before reading their clocks.
* **Possible**: FLOP per step are counted (XLA's cost analysis for JAX, torch's
  ``FlopCounterMode`` for PyTorch, the analytic count of ``d2lmini.bench`` -- equal to torch's
  for the same architecture -- for MXNet and Paddle), a float32 matrix product is timed on the
  same devices right after the steps (the ceiling, with the framework's default precision:
  TF32 where the framework allows it by default; on the CPU the faster of the framework's and
  NumPy's), and a record whose fastest repeat implies more FLOP/s than that ceiling becomes a
  failure, not a result.

Numerics: the notebooks' cells (their proofs and checks included) run inside the backend's
``exact_numerics()``, as under the tests; the timed steps run outside it, with the frameworks'
defaults (``settings.numerics``: ``framework defaults``, or ``exact`` under
``D2LMINI_EXACT=1``; MXNet on a GPU host is always exact, and its records say so).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tools.bench_adapters import *  # noqa: F401,F403 -- the worker side, one import away
from tools.bench_worker import *  # noqa: F401,F403
from tools.bench_worker import (ROOT, NOTEBOOK, STOP, exec_notebook, rank_main,  # noqa: F401
                                timing_numerics, worker)

# ---------------------------------------------------------------- driver side ------------
def host_gpu_count() -> int:
    """The NVIDIA GPUs this process may use (``nvidia-smi``; no framework imported)."""
    try:
        from d2lmini.hardware import nvidia_gpus
    except ImportError:
        return 0
    return len(nvidia_gpus())


def run_worker(fw, impl, k, args) -> dict:
    cmd = [sys.executable, "-m", "tools.benchmark", "--worker", "--framework", fw, "--impl", impl,
           "--devices", str(k), "--batch", str(args.batch), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--repeats", str(args.repeats),
           "--concise-steps", str(args.concise_steps), "--width", str(args.width),
           "--timeout", str(args.timeout)]
    # Without GPUs the chapters' setup cells get max(k, 2) simulated devices (they expect two)
    # and k of them are used.  With GPUs every GPU is offered (at least k) and the first k are
    # used.  k = 1 asks for try_gpu() whatever the setup cells plan (bench_devices); more
    # devices than GPUs give the backends' stand-ins.
    gpus = host_gpu_count()
    n = max(k, gpus) if gpus else max(k, 2)
    env = dict(os.environ, D2LMINI_NUM_DEVICES=str(n), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    folder = ROOT / "chapters" / ("scratch" if impl in ("seed", "ring") else "concise")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout,
                       cwd=folder)
    lines = [l for l in r.stdout.splitlines() if l.startswith("BENCH-JSON ")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"{fw}/{impl}/{k} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return json.loads(lines[-1][len("BENCH-JSON "):])


def summarise(rec: dict) -> dict:
    """Median and spread of the step times, and the rates they imply (``d2lmini.bench``)."""
    from d2lmini import bench
    t = rec.pop("step_times")
    med = statistics.median(t)
    rec.update(step_s_median=med, step_s_min=min(t), step_s_max=max(t), repeats=len(t),
               samples_per_s=rec["batch_size"] / med)
    rec.update(bench.rate_fields(rec["flops_per_step"], t, rec["peak_flops"]))
    return rec


def refusal(rec: dict) -> str | None:
    """Why ``rec`` is not a result (arrays elsewhere than requested, an impossible rate), or
    None: then it carries ``rate_check: passed``."""
    from d2lmini import bench
    wrong = bench.placement_mismatch(rec["devices_requested"], rec["arrays_on"])
    if wrong:
        return wrong
    try:
        bench.check_rate(rec)
    except ValueError as e:          # ImpossibleRate, or fields missing
        return str(e)
    return None


# ---------------------------------------------------------------- comm mode --------------
COMM_DIR = ROOT / "chapters" / "comm"


def comm_sweep(fw: str, counts: list[int], sizes: list[int], warmup: int,
               repeats: int) -> tuple[list[dict], str]:
    """The communication chapter's own ``measure_allreduce`` (the notebook's setup cells and
    its cell tagged ``step:measure_allreduce``), run with the benchmark's warm-up and repeats:
    in this process for JAX and MXNet, launched gloo ranks for PyTorch and Paddle.  Returns
    the sweep's rows and the scheme the notebook fits them with."""
    path = COMM_DIR / f"{NOTEBOOK[fw]}.ipynb"
    ns = exec_notebook(path)                          # the setup: imports, devices, profile
    cells = json.loads(path.read_text())["cells"]
    step = [c for c in cells if "step:measure_allreduce" in c["metadata"].get("tags", [])]
    exec(compile("".join(step[0]["source"]), path.name, "exec"), ns)
    P = ns["P"]
    ns["P"] = dataclasses.replace(P, comm=dataclasses.replace(P.comm, warmup=warmup,
                                                                 repeats=repeats))
    rows, sums_ok = ns["measure_allreduce"](counts, sizes)
    if not all(sums_ok):
        raise RuntimeError(f"{fw}: an all-reduce returned a wrong sum")
    from d2lmini.commcost import FRAMEWORK_SCHEME
    return rows, FRAMEWORK_SCHEME[fw]


def comm_main(args) -> int:
    """``--comm``: every framework's all-reduce over sizes and device counts, fitted with the
    alpha-beta model; one worker process per framework (JAX fixes its device count at start)."""
    from d2lmini import commcost as cc
    from d2lmini.results import hardware_info, versions
    counts = sorted({int(c) for c in args.devices.split(",") if int(c) > 1})
    sizes = cc.message_sizes(max(32, 4 * max(counts)), args.comm_largest, 3)
    if args.worker:
        rows, scheme = comm_sweep(args.framework, counts, sizes, args.warmup, args.repeats)
        print("BENCH-JSON " + json.dumps({"rows": rows, "scheme": scheme}), flush=True)
        return 0
    records, failures = [], []
    for fw in args.frameworks.split(","):
        cmd = [sys.executable, "-m", "tools.benchmark", "--comm", "--worker", "--framework", fw,
               "--devices", args.devices, "--warmup", str(args.warmup), "--repeats",
               str(args.repeats), "--comm-largest", str(args.comm_largest)]
        env = dict(os.environ, D2LMINI_NUM_DEVICES=str(max(counts)), PYTHONPATH=str(ROOT))
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(COMM_DIR),
                              timeout=args.timeout)
        line = next((l for l in proc.stdout.splitlines() if l.startswith("BENCH-JSON ")), None)
        if proc.returncode or line is None:
            failures.append({"framework": fw, "error": (proc.stderr or proc.stdout).strip()[-300:]})
            print(f"{fw:7s} comm: FAILED", flush=True)
            continue
        result = json.loads(line[len("BENCH-JSON "):])
        rows, scheme = result["rows"], result["scheme"]
        f = cc.fit_rows(rows, scheme)
        print(cc.report(f"{fw} ({scheme})", f), flush=True)
        records.append({"framework": fw, "scheme": f.scheme, "alpha": f.alpha, "beta": f.beta,
                        "median_rel_error": f.median_rel_error, "max_rel_error": f.max_rel_error,
                        "rows": rows})
    out = {"settings": {"devices": counts, "sizes": sizes, "warmup": args.warmup,
                        "repeats": args.repeats},
           "hardware": hardware_info(), "versions": versions(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "results": records, "failures": failures}
    path = Path(args.out if args.out != str(ROOT / "benchmarks" / "results.json")
                else ROOT / "benchmarks" / "comm.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    return 1 if failures else 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--bench-rank" in argv:          # a launched rank of the concise PyTorch/Paddle runs
        return rank_main(argv)
    ap = argparse.ArgumentParser(description="Benchmark data-parallel training steps.")
    ap.add_argument("--frameworks", default="mxnet,torch,jax,paddle")
    ap.add_argument("--impls", default="seed,ring,concise")
    ap.add_argument("--devices", default="1,2,4")
    ap.add_argument("--batch", type=int, default=256, help="global batch size")
    ap.add_argument("--steps", type=int, default=10, help="steps per timed repeat")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--concise-steps", type=int, default=4,
                    help="steps per timed repeat of the concise (ResNet-18) implementation")
    ap.add_argument("--width", type=int, default=16, help="ResNet-18 width (concise)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per worker")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results.json"))
    ap.add_argument("--update", action="store_true",
                    help="keep the records of --out that this run does not re-measure "
                         "(same settings required), e.g. to redo one failed combination")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--framework", help=argparse.SUPPRESS)
    ap.add_argument("--impl", help=argparse.SUPPRESS)
    ap.add_argument("--comm", action="store_true",
                    help="time each framework's all-reduce over message sizes and --devices "
                         "(> 1) and fit the alpha-beta model (chapters/comm); writes "
                         "benchmarks/comm.json unless --out is given")
    ap.add_argument("--comm-largest", type=int, default=32 << 20,
                    help="largest message in bytes for --comm")
    args = ap.parse_args(argv)
    if args.comm:
        return comm_main(args)
    if args.worker:
        args.devices = int(args.devices)
        print("BENCH-JSON " + json.dumps(worker(args)), flush=True)
        return 0

    from d2lmini.results import hardware_info, versions
    settings = {k: getattr(args, k) for k in ("batch", "steps", "warmup", "repeats",
                                              "concise_steps", "width")}
    settings["numerics"] = timing_numerics()
    records, failures = [], []
    for fw in args.frameworks.split(","):
        for impl in args.impls.split(","):
            base = None
            for k in map(int, args.devices.split(",")):
                try:
                    rec = summarise(run_worker(fw, impl, k, args))
                except (RuntimeError, subprocess.TimeoutExpired, KeyError, ValueError) as e:
                    failures.append({"framework": fw, "impl": impl, "devices": k,
                                     "error": (str(e).strip().splitlines() or [repr(e)])[-1][:300]})
                    print(f"{fw:7s} {impl:8s} k={k}: FAILED ({failures[-1]['error']})", flush=True)
                    continue
                why = refusal(rec)
                if why:
                    failures.append({"framework": fw, "impl": impl, "devices": k,
                                     "error": why, "refused": rec})
                    print(f"{fw:7s} {impl:8s} k={k}: REFUSED ({why})", flush=True)
                    continue
                if rec["devices"] == 1:
                    base = rec["step_s_median"]
                rec["overhead_vs_1"] = rec["step_s_median"] / base if base else None
                records.append(rec)
                print(f"{fw:7s} {impl:8s} k={k}: {1e3 * rec['step_s_median']:8.1f} ms/step "
                      f"[{1e3 * rec['step_s_min']:.1f}, {1e3 * rec['step_s_max']:.1f}]  "
                      f"{rec['samples_per_s']:8.0f} samples/s  overhead "
                      + (f"x{rec['overhead_vs_1']:.2f}" if rec["overhead_vs_1"] else "n/a")
                      + f"  on {rec['device_kind']} {rec['arrays_on']}: "
                      f"{rec['achieved_flops'] / 1e9:.3g} GFLOP/s (peak "
                      f"{rec['peak_flops'] / 1e9:.3g})", flush=True)
    if args.update and Path(args.out).is_file():
        old = json.loads(Path(args.out).read_text())
        if old["settings"] != settings or old["hardware"] != hardware_info():
            raise SystemExit(f"--update: {args.out} was made with other settings or hardware")
        key = lambda r: (r["framework"], r["impl"], r["devices"])
        redone = {key(r) for r in records + failures}
        records = [r for r in old["results"] if key(r) not in redone] + records
        failures = [r for r in old["failures"] if key(r) not in redone] + failures
        base = {(r["framework"], r["impl"]): r["step_s_median"] for r in records
                if r["devices"] == 1}
        for r in records:
            b = base.get((r["framework"], r["impl"]))
            r["overhead_vs_1"] = r["step_s_median"] / b if b else None
        order = {f: i for i, f in enumerate(NOTEBOOK)}
        records.sort(key=lambda r: (order[r["framework"]], r["impl"], r["devices"]))
    out = {"settings": settings,
           "hardware": hardware_info(), "versions": versions(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "results": records, "failures": failures}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Time data-parallel training steps per framework, implementation and device count.

    .venv/bin/python tools/benchmark.py                       # everything; writes benchmarks/results.json
    .venv/bin/python tools/benchmark.py --frameworks jax --devices 1,2 --repeats 3

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
            (k processes, also for k = 1), timed by the chapter's training script itself:
            one warm-up epoch, then ``--repeats`` epochs of ``--concise-steps`` steps each.

For every (framework, implementation, devices): ``--warmup`` untimed steps (compilation,
allocation), then ``--repeats`` timed runs of ``--steps`` steps each on the same global batch
size; the results file records the median and spread (min, max) of the per-step time,
samples/s, and the overhead ratio t(k devices) / t(1 device).  It also records the hardware
(CPU model and cores, or GPU names) and the package versions.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = {"mxnet": "mxnet", "torch": "pytorch", "jax": "jax", "paddle": "paddle"}
SCRATCH_SKIP = ("## Training",)   # the notebook's own long runs


# ---------------------------------------------------------------- worker side -----------
def exec_notebook(path: Path, skip: tuple[str, ...] = (), stop: str | None = None) -> dict:
    """Execute a notebook's code cells in order, from the notebook's own directory, skipping
    the sections whose ``## `` heading is in ``skip`` (e.g. the long training runs) and
    everything from the heading ``stop`` on; return the namespace.  Output is swallowed."""
    nb = json.loads(path.read_text())
    ns: dict = {"__name__": "__notebook__"}
    sink, skipping = io.StringIO(), False
    os.chdir(path.parent)
    sys.path.insert(0, str(path.parent))
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            heading = next((l.strip() for l in src.splitlines() if l.startswith("## ")), None)
            if heading is not None and heading == stop:
                break
            if heading is not None:
                skipping = heading in skip
        elif cell["cell_type"] == "code" and not skipping:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                exec(compile(src, path.name, "exec"), ns)
    return ns


def device_kind(devices) -> str:
    """``gpu`` (distinct GPUs), ``gpu-stand-ins`` (a GPU repeated: fewer GPUs than devices)
    or ``simulated-cpu`` -- read from the devices themselves, since a backend with GPUs may
    still hand out CPU stand-ins (JAX, when more devices are asked for than there are GPUs)."""
    names = [str(d).lower() for d in devices]
    if names and all("cuda" in n or "gpu" in n for n in names):
        return "gpu" if len(set(names)) == len(names) else "gpu-stand-ins"
    return "simulated-cpu"


def scratch_step(ns: dict, impl: str, devices, lr: float):
    """One training step of the from-scratch chapter, with the naive or the ring all-reduce."""
    train_step, init_params, get_params = ns["train_step"], ns["init_params"], ns["get_params"]
    reduce = ns["allreduce"] if impl == "seed" else ns["ring_allreduce"]
    state = {"params": [get_params(init_params(0), d) for d in devices]}

    def step(X, y):
        out = train_step(X, y, state["params"], devices, lr, reduce=reduce)
        if out is not None:          # JAX returns the new replicas; the others update in place
            state["params"] = out
    return step


def worker(args) -> dict:
    os.environ["D2LMINI_PROFILE"] = "smoke"   # the notebook prefix: small data, quick
    import numpy as np
    import d2lmini
    fw = args.framework
    d2l = __import__(f"d2lmini.{fw}", fromlist=["x"])
    devices = d2l.get_devices(args.devices)
    data = d2lmini.load_fashion_mnist(train_samples=args.batch * 4, test_samples=10)
    batches = [(data.X_train[i * args.batch:(i + 1) * args.batch],
                data.y_train[i * args.batch:(i + 1) * args.batch]) for i in range(4)]
    result = {"framework": fw, "impl": args.impl, "devices": len(devices),
              "device_kind": device_kind(devices),
              "batch_size": args.batch}
    if args.impl in ("seed", "ring"):
        ns = exec_notebook(ROOT / "chapters" / "scratch" / f"{NOTEBOOK[fw]}.ipynb",
                           skip=SCRATCH_SKIP)
        step = scratch_step(ns, args.impl, devices, lr=0.1)
        result["model"] = "LeNet"
    else:
        result.update(model=f"ResNet-18, width {args.width}", api=CONCISE_API[fw])
        if fw in LAUNCHED:
            return dict(result, step_times=LAUNCHED[fw](devices, args))
        step = CONCISE_STEP[fw](devices, args)
        args.steps = args.concise_steps
    i = 0

    def run(n):
        nonlocal i
        for _ in range(n):
            step(*batches[i % len(batches)])
            i += 1
        d2l.synchronize(devices)

    run(args.warmup)
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        run(args.steps)
        times.append((time.perf_counter() - t0) / args.steps)
    return dict(result, step_times=times)


def concise_notebook(fw: str, stop: str) -> dict:
    return exec_notebook(ROOT / "chapters" / "concise" / f"{NOTEBOOK[fw]}.ipynb", stop=stop)


def mxnet_concise_step(devices, args):
    """The chapter's ``train_step``: ``split_and_load``-style shards, ``gluon.Trainer``."""
    ns = concise_notebook("mxnet", stop="## The Proof: k Devices Equal One Device")
    from mxnet import gluon
    net = ns["replicate"](ns["init_checkpoint"](args.width), devices, args.width)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": CONCISE_LR},
                            kvstore="device")
    return lambda X, y: ns["train_step"](net, trainer, X, y, devices)


def jax_concise_step(devices, args):
    """The chapter's jitted ``train_step`` on a ``Mesh``: replicated state, sharded batch."""
    ns = concise_notebook("jax", stop="## The Proof: k Devices Equal One Device")
    import jax
    import jax.numpy as jnp
    d2l = ns["d2l"]
    ns["net"] = net = d2l.resnet18(num_classes=10, width=args.width)   # train_step's global
    variables = jax.jit(net.init)(jax.random.key(0, impl="rbg"), jnp.zeros((1, 1, 28, 28)))
    mesh = ns["make_mesh"](len(devices))
    state = {"s": ns["replicate"](ns["init_state"](variables, CONCISE_LR), mesh)}

    def step(X, y):
        state["s"], _ = ns["train_step"](state["s"], *ns["shard"](X, y, mesh))
    return step


def launched_epoch_times(launch_and_read, devices, args) -> list[float]:
    """Per-step times from the epoch times the ranks record; epoch 1 is the warm-up."""
    per_rank_epochs = launch_and_read(len(devices), 1 + args.repeats,
                                      args.batch * args.concise_steps)
    slowest = [max(e) for e in zip(*per_rank_epochs)]           # the slowest rank, per epoch
    return [t / args.concise_steps for t in slowest[1:]]


def torch_launched(devices, args):
    """``ddp_train.py`` under ``torchrun`` (the chapter's ``run_script``)."""
    import tempfile
    ns = concise_notebook("torch", stop="## Splitting and Sampling the Data")

    def go(k, epochs, samples):
        out = tempfile.mkdtemp(prefix="bench-torch-")
        ns["run_script"](k, "torchrun", [
            "--epochs", epochs, "--batch-size", args.batch, "--lr", CONCISE_LR,
            "--width", args.width, "--train-samples", samples, "--test-samples", 64,
            "--bn-batches", 0, "--predict", 1, "--out", out], timeout=args.timeout)
        return [r["epoch_s"] for r in ns["launch"].read_rank_results(out, k)]
    return launched_epoch_times(go, devices, args)


def paddle_launched(devices, args):
    """``paddle_train.py`` under ``paddle.distributed.launch`` (the chapter's ``launch_cmd``)."""
    import tempfile
    ns = concise_notebook("paddle", stop="## Splitting and Sampling the Data")

    def go(k, epochs, samples):
        out = tempfile.mkdtemp(prefix="bench-paddle-")
        cmd, _ = ns["launch_cmd"](k, out, "--epochs", str(epochs), "--batch_size",
                                  str(args.batch), "--lr", str(CONCISE_LR), "--width",
                                  str(args.width), "--train_samples", str(samples),
                                  "--test_samples", "64")
        ns["d2l"].run_launch(cmd, log_dir=os.path.join(out, "logs"), timeout=args.timeout)
        return [r["epoch_seconds"] for r in ns["launch"].read_rank_results(out, k)]
    return launched_epoch_times(go, devices, args)


CONCISE_LR = 0.05
CONCISE_API = {"mxnet": "gluon.Trainer, kvstore='device'", "jax": "jit + NamedSharding",
               "torch": "DistributedDataParallel, torchrun",
               "paddle": "paddle.DataParallel, paddle.distributed.launch"}
CONCISE_STEP = {"mxnet": mxnet_concise_step, "jax": jax_concise_step}
LAUNCHED = {"torch": torch_launched, "paddle": paddle_launched}


# ---------------------------------------------------------------- driver side ------------
def host_gpu_count() -> int:
    """The NVIDIA GPUs this process may use (``nvidia-smi``; no framework imported)."""
    try:
        from d2lmini.hardware import nvidia_gpus
    except ImportError:
        return 0
    return len(nvidia_gpus())


def run_worker(fw, impl, k, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--framework", fw, "--impl", impl,
           "--devices", str(k), "--batch", str(args.batch), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--repeats", str(args.repeats),
           "--concise-steps", str(args.concise_steps), "--width", str(args.width),
           "--timeout", str(args.timeout)]
    # Without GPUs the chapters' setup cells get max(k, 2) simulated devices (they expect two)
    # and k of them are used.  With GPUs every GPU is offered (at least k) and the first k are
    # used: max(k, 2) on a one-GPU machine would put JAX, whose meshes cannot repeat a device,
    # on CPU stand-ins even for k = 1.  More devices than GPUs give the backends' stand-ins.
    gpus = host_gpu_count()
    n = max(k, gpus) if gpus else max(k, 2)
    env = dict(os.environ, D2LMINI_NUM_DEVICES=str(n), PYTHONUNBUFFERED="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    lines = [l for l in r.stdout.splitlines() if l.startswith("BENCH-JSON ")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"{fw}/{impl}/{k} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return json.loads(lines[-1][len("BENCH-JSON "):])


def summarise(rec: dict) -> dict:
    t = rec.pop("step_times")
    med = statistics.median(t)
    rec.update(step_s_median=med, step_s_min=min(t), step_s_max=max(t), repeats=len(t),
               samples_per_s=rec["batch_size"] / med)
    return rec


# ---------------------------------------------------------------- comm mode --------------
COMM_DIR = ROOT / "chapters" / "comm"


def comm_sweep(fw: str, counts: list[int], sizes: list[int], warmup: int,
               repeats: int) -> tuple[list[dict], str]:
    """The communication chapter's own ``measure_allreduce`` (the notebook's setup cells and
    its cell tagged ``step:measure_allreduce``), run with the benchmark's warm-up and repeats:
    in this process for JAX and MXNet, launched gloo ranks for PyTorch and Paddle.  Returns
    the sweep's rows and the scheme the notebook fits them with."""
    import dataclasses
    path = COMM_DIR / f"{NOTEBOOK[fw]}.ipynb"
    ns = exec_notebook(path, stop="## The Model We Fit")           # imports, devices, profile
    cells = json.loads(path.read_text())["cells"]
    step = [c for c in cells if "step:measure_allreduce" in c["metadata"].get("tags", [])]
    exec(compile("".join(step[0]["source"]), path.name, "exec"), ns)
    P = ns["P"]
    ns["P"] = dataclasses.replace(P, comm=dataclasses.replace(P.comm, warmup=warmup,
                                                                 repeats=repeats))
    rows, sums_ok = ns["measure_allreduce"](counts, sizes)
    if not all(sums_ok):
        raise RuntimeError(f"{fw}: an all-reduce returned a wrong sum")
    return rows, ns["FRAMEWORK_SCHEME"]


def comm_main(args) -> int:
    """``--comm``: every framework's all-reduce over sizes and device counts, fitted with the
    alpha-beta model; one worker process per framework (JAX fixes its device count at start)."""
    sys.path.insert(0, str(ROOT))
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
        cmd = [sys.executable, __file__, "--comm", "--worker", "--framework", fw,
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

    sys.path.insert(0, str(ROOT))
    from d2lmini.results import hardware_info, versions
    settings = {k: getattr(args, k) for k in ("batch", "steps", "warmup", "repeats",
                                              "concise_steps", "width")}
    records, failures = [], []
    for fw in args.frameworks.split(","):
        for impl in args.impls.split(","):
            base = None
            for k in map(int, args.devices.split(",")):
                try:
                    rec = summarise(run_worker(fw, impl, k, args))
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    failures.append({"framework": fw, "impl": impl, "devices": k,
                                     "error": str(e).splitlines()[-1][:300]})
                    print(f"{fw:7s} {impl:8s} k={k}: FAILED ({failures[-1]['error']})", flush=True)
                    continue
                if rec["devices"] == 1:
                    base = rec["step_s_median"]
                rec["overhead_vs_1"] = rec["step_s_median"] / base if base else None
                records.append(rec)
                print(f"{fw:7s} {impl:8s} k={k}: {1e3 * rec['step_s_median']:8.1f} ms/step "
                      f"[{1e3 * rec['step_s_min']:.1f}, {1e3 * rec['step_s_max']:.1f}]  "
                      f"{rec['samples_per_s']:8.0f} samples/s  overhead "
                      + (f"x{rec['overhead_vs_1']:.2f}" if rec["overhead_vs_1"] else "n/a"),
                      flush=True)
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

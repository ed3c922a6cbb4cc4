"""Time the training step the same way in every framework: its fast-path ladder and its shape.

    python -m tools.step_bench                          # a GPU machine: every framework it has
    python -m tools.step_bench --allow-cpu --quick      # this machine: small sizes, labelled CPU
    make gpu-bench                                      # the same, on a GPU, into benchmarks/

What is timed is one definition of a step (``d2lmini.steptime``): the batch already on the
device; forward, backward and update by the concise chapter's fast recipe
(``chapters/concise/recipe/<fw>_fast.py``: ``make_train_step``); the clock read after waiting
for the step's outputs.  Separately, and labelled, the same step fed by the input pipeline
(host batches from ``d2lmini.BatchIterator``, moved to the device), per step.  For every
framework that imports, in a process of its own:

* the card's peaks, measured in the same run: a matrix product in float32 with TF32 allowed
  (``tf32``; on the CPU plain float32) and in bfloat16 (``bf16``);
* the **ladder** at one batch: the recipe's ``LADDER``, each rung one more setting;
* the **shape**: the first and last rung at several per-device batches, and the fitted
  ``T(B) = T0 + B * t`` (``d2lmini.steptime.fit_step_time``);
* the **epoch** span of the first rung.

Every record carries FLOP per step (``d2lmini.bench.resnet18_train_flops``, the count torch's
FlopCounter gives), TFLOP/s, MFU against the peak of its numerics, where its arrays lived, and
is refused when its fastest window implies more than that peak.  Results: one JSON file with
the hardware, the versions and the date (``--out``, default ``benchmarks/steps.json``).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from d2lmini.frameworks import FRAMEWORKS as ALL, KEYS

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "chapters" / "concise" / "recipe"
FRAMEWORKS = KEYS                                 # the book's order
RECIPE = {f.key: f"{f.notebook}_fast.py" for f in ALL}
MARK = "STEPBENCH "


def load_recipe(fw: str):
    path = RECIPES / RECIPE[fw]
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(f"{fw}_fast", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------ per framework (worker)
class Torch:
    numerics = {"": "float32 (TF32 convolutions: PyTorch's default on GPUs)", "bf16": "bf16 autocast"}

    def __init__(self, recipe, allow_cpu):
        import torch
        from d2lmini import torch as d2l
        self.torch, self.d2l, self.recipe = torch, d2l, recipe
        self.device = d2l.try_gpu()
        self.on_gpu = self.device.type == "cuda"
        if not self.on_gpu:
            self.numerics = {"": "float32", "bf16": "bf16 autocast"}
            torch.set_num_threads(os.cpu_count() or 1)

    def wait(self, out):
        if self.on_gpu:
            self.torch.cuda.synchronize(self.device)

    def peaks(self, n):
        torch = self.torch
        a32 = torch.randn(n, n, device=self.device)
        a16 = a32.to(torch.bfloat16)
        from d2lmini.bench import best_rate, numpy_matmul_rate
        with self.d2l.allow_tf32("matmul"):     # TF32 allowed for the float32 peak
            tf32 = best_rate(lambda: (a32 @ a32, self.wait(None)), 2.0 * n ** 3)
        bf16 = best_rate(lambda: (a16 @ a16, self.wait(None)), 2.0 * n ** 3)
        if not self.on_gpu:                      # the CPU's ceiling: also NumPy's BLAS
            tf32 = max(tf32, numpy_matmul_rate(n))
            bf16 = max(bf16, tf32)
        return {"tf32": tf32, "bf16": bf16}

    def step(self, width, batch, knobs):
        torch, d2l = self.torch, self.d2l
        import d2lmini
        net = d2l.canonical_init(d2l.resnet18(10, 1, width=width),
                                 d2lmini.resnet18_init(width=width, seed=0))
        model = self.recipe.prepare(net, self.device, knobs)
        opt = self.recipe.make_optimizer(model, 0.01, self.device, knobs)
        step = self.recipe.make_train_step(model, torch.nn.CrossEntropyLoss(), opt,
                                           self.device, knobs)
        g = torch.Generator().manual_seed(0)
        X = torch.rand(batch, 1, 28, 28, generator=g).to(self.device)
        y = torch.randint(0, 10, (batch,), generator=g).to(self.device)
        model.train()
        where = sorted({str(p.device) for p in model.parameters()})
        return (lambda: step(X, y)), where, (lambda b: step(*b)), \
            (lambda b: (torch.from_numpy(b[0]).to(self.device, non_blocking=True),
                        torch.from_numpy(b[1]).to(self.device, non_blocking=True)))


class Jax:
    numerics = {"": "float32 (TF32-like matrix products: JAX's default on GPUs)",
                "bf16": "bf16 compute, float32 parameters"}

    def __init__(self, recipe, allow_cpu):
        import jax
        from d2lmini import jax as d2l
        self.jax, self.d2l, self.recipe = jax, d2l, recipe
        self.device = d2l.try_gpu()
        self.on_gpu = self.device.platform == "gpu"
        if not self.on_gpu:
            self.numerics = {"": "float32", "bf16": "bf16 compute, float32 parameters"}

    def wait(self, out):
        self.jax.block_until_ready(out)

    def peaks(self, n):
        jax, jnp = self.jax, self.jax.numpy
        from d2lmini.bench import best_rate, numpy_matmul_rate
        a32 = jax.device_put(jnp.ones((n, n), jnp.float32), self.device)
        a16 = a32.astype(jnp.bfloat16)
        mm = jax.jit(lambda a: a @ a)
        tf32 = best_rate(lambda: mm(a32).block_until_ready(), 2.0 * n ** 3)
        bf16 = best_rate(lambda: mm(a16).block_until_ready(), 2.0 * n ** 3)
        if not self.on_gpu:
            tf32 = max(tf32, numpy_matmul_rate(n))
            bf16 = max(bf16, tf32)
        return {"tf32": tf32, "bf16": bf16}

    def step(self, width, batch, knobs):
        jax, d2l = self.jax, self.d2l
        import d2lmini
        import numpy as np
        import optax
        net = self.recipe.model(width, knobs)
        variables = d2l.canonical_init(d2l.resnet18(10, 1, width=width),
                                       d2lmini.resnet18_init(width=width, seed=0))
        tx = optax.sgd(0.01)
        holder = {"state": jax.device_put({**variables, "opt_state": tx.init(variables["params"])},
                                          self.device)}
        train_step = self.recipe.make_train_step(net, tx, knobs)
        rng = np.random.default_rng(0)
        X = jax.device_put(rng.random((batch, 1, 28, 28), dtype=np.float32), self.device)
        y = jax.device_put(rng.integers(0, 10, batch).astype(np.int32), self.device)

        def run(b):
            holder["state"], loss = train_step(holder["state"], *b)
            return holder["state"], loss
        where = sorted({str(d) for leaf in jax.tree.leaves(holder["state"]) for d in leaf.devices()})
        return (lambda: run((X, y))), where, run, \
            (lambda b: jax.device_put((b[0], b[1].astype(np.int32)), self.device))


class Paddle:
    numerics = {"": "float32 (TF32 as Paddle's defaults allow it on GPUs)",
                "bf16": "bf16 AMP (auto_cast O1; with o2: bf16 parameters, float32 master "
                        "weights)"}

    def __init__(self, recipe, allow_cpu):
        import paddle
        from d2lmini import paddle as d2l
        self.paddle, self.d2l, self.recipe = paddle, d2l, recipe
        self.device = d2l.try_gpu()
        paddle.set_device(self.device)
        self.on_gpu = isinstance(self.device, paddle.CUDAPlace)
        if self.on_gpu:                          # what this process allows, read, not assumed
            core = paddle.base.core
            on = {True: "on", False: "off"}
            self.numerics = dict(self.numerics, **{"": (
                f"float32 (TF32 in cuBLAS {on[bool(core.get_cublas_switch())]}, in cuDNN "
                f"{on[bool(core.get_cudnn_switch())]})")})
        else:
            self.numerics = {"": "float32", "bf16": self.numerics["bf16"]}

    def wait(self, out):
        self.d2l.synchronize([self.device])      # CPU work is synchronous

    def peaks(self, n):
        paddle = self.paddle
        from d2lmini.bench import best_rate, numpy_matmul_rate
        a32 = paddle.randn([n, n], dtype="float32")

        def mm(a):
            return lambda: (paddle.matmul(a, a), self.wait(None))
        if self.on_gpu:
            old = self.d2l._tf32(True, True)     # TF32 allowed for the float32 peak
            try:
                tf32 = best_rate(mm(a32), 2.0 * n ** 3)
            finally:
                self.d2l._tf32(*old)
            bf16 = best_rate(mm(a32.astype("bfloat16")), 2.0 * n ** 3)
        else:
            # The CPU's ceiling: also NumPy's BLAS.  Paddle's CPU build has no bfloat16 matmul
            # kernel (matmul's kernel for (CPU, bfloat16) "is not registered"), and nothing runs
            # in bfloat16 on it: its bf16 ceiling is its float32 one.
            tf32 = max(best_rate(mm(a32), 2.0 * n ** 3), numpy_matmul_rate(n))
            bf16 = tf32
        return {"tf32": tf32, "bf16": bf16}

    def step(self, width, batch, knobs):
        paddle, d2l = self.paddle, self.d2l
        import d2lmini
        import numpy as np
        net = d2l.canonical_init(self.recipe.resnet18(width, knobs),
                                 d2lmini.resnet18_init(width=width, seed=0))
        opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=net.parameters())
        model, opt = self.recipe.prepare(net, opt, knobs)   # refuses knobs it cannot run here
        step = self.recipe.make_train_step(model, paddle.nn.CrossEntropyLoss(), opt, knobs)
        rng = np.random.default_rng(0)
        X = paddle.to_tensor(rng.random((batch, 1, 28, 28), dtype=np.float32), place=self.device)
        y = paddle.to_tensor(rng.integers(0, 10, batch), place=self.device)
        model.train()
        where = sorted({str(p.place) for p in model.parameters()})
        return (lambda: step(X, y)), where, (lambda b: step(*b)), \
            (lambda b: (paddle.to_tensor(b[0], place=self.device),
                        paddle.to_tensor(b[1], place=self.device)))


class Mxnet:
    """MXNet 1.9.1 (recipe/mxnet_fast.py).  Its GPU build has no kernels for Hopper or newer
    GPUs, where ``d2l.try_gpu()`` gives the CPU: there it is timed only with --allow-cpu.
    AMP (``amp.init``) rewrites MXNet's operators for the whole process; every rung puts the
    ones it needs in place (``recipe.amp_operators``), so a float32 rung after an AMP one
    stays float32."""
    numerics = {"": "float32", "bf16": "bf16 AMP (oneDNN), float32 parameters"}

    def __init__(self, recipe, allow_cpu):
        from d2lmini import mxnet as d2l         # before mxnet: the NumPy 2 shim
        import mxnet as mx
        self.mx, self.d2l, self.recipe = mx, d2l, recipe
        self.device = d2l.try_gpu()
        self.on_gpu = self.device.device_type == "gpu"
        if self.on_gpu:                          # d2lmini.mxnet sets it on GPU hosts, if unset
            tf32 = "off" if os.environ.get("NVIDIA_TF32_OVERRIDE") == "0" else "allowed"
            self.numerics = {"": f"float32 (TF32 {tf32}: NVIDIA_TF32_OVERRIDE)",
                             "bf16": self.numerics["bf16"]}

    def wait(self, out):
        # All queued work: the loss is ready before the backward pass and the update are done.
        self.mx.nd.waitall()

    def peaks(self, n):
        nd = self.mx.nd
        from d2lmini.bench import best_rate, numpy_matmul_rate
        a32 = nd.random.normal(shape=(n, n), ctx=self.device)
        tf32 = best_rate(lambda: nd.dot(a32, a32).wait_to_read(), 2.0 * n ** 3)
        if self.on_gpu:   # no bfloat16 in MXNet's GPU kernels: the 16-bit peak is float16's
            a16 = a32.astype("float16")
            bf16 = best_rate(lambda: nd.dot(a16, a16).wait_to_read(), 2.0 * n ** 3)
        else:             # nd.dot has no bfloat16; oneDNN's FullyConnected (AMP's) has
            from mxnet.contrib.amp.amp import bfloat16
            a16 = nd.amp_cast(a32, dtype=bfloat16)
            bf16 = best_rate(lambda: nd.FullyConnected(a16, a16, no_bias=True, num_hidden=n)
                             .wait_to_read(), 2.0 * n ** 3)
            tf32 = max(tf32, numpy_matmul_rate(n))   # the CPU's ceiling: also NumPy's BLAS
            bf16 = max(bf16, tf32)
        return {"tf32": tf32, "bf16": bf16}

    def step(self, width, batch, knobs):
        d2l, recipe, nd = self.d2l, self.recipe, self.mx.nd
        import d2lmini
        import numpy as np
        from mxnet import gluon
        from mxnet.contrib import amp
        dtype = recipe.amp_dtype(knobs, self.device)   # refuses what the device cannot run
        if dtype:
            recipe.init_amp(dtype)                 # before the net is built
        recipe.amp_operators(dtype is not None)
        net = d2l.canonical_init(d2l.resnet18(10, 1, width=width),
                                 d2lmini.resnet18_init(width=width, seed=0))
        net = recipe.prepare(net, self.device, knobs)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
        if dtype == "float16":
            amp.init_trainer(trainer)
        step = recipe.make_train_step(net, trainer, knobs)
        rng = np.random.default_rng(0)
        X = nd.array(rng.random((batch, 1, 28, 28), dtype=np.float32), ctx=self.device)
        y = nd.array(rng.integers(0, 10, batch), ctx=self.device)
        where = sorted({str(c) for p in net.collect_params().values() for c in p.list_ctx()})
        return (lambda: step(X, y)), where, (lambda b: step(*b)), \
            (lambda b: (nd.array(b[0], ctx=self.device), nd.array(b[1], ctx=self.device)))


ADAPTERS = {"torch": Torch, "jax": Jax, "paddle": Paddle, "mxnet": Mxnet}


def worker(fw: str, args) -> None:
    """Run one framework's measurements; print one JSON line per record."""
    import numpy as np
    import d2lmini
    from d2lmini import bench, steptime

    def emit(**rec):
        print(MARK + json.dumps(rec), flush=True)

    recipe = load_recipe(fw)
    if recipe is None or fw not in ADAPTERS:
        emit(kind="skipped", framework=fw, reason=f"no fast-path recipe for {fw} yet "
             f"(chapters/concise/recipe/{RECIPE[fw]})")
        return
    a = ADAPTERS[fw](recipe, args.allow_cpu)
    if not a.on_gpu and not args.allow_cpu:
        emit(kind="skipped", framework=fw, reason=f"{fw} sees no GPU (pass --allow-cpu to time "
             f"the CPU)")
        return
    peaks = a.peaks(args.peak_n)
    emit(kind="peaks", framework=fw, on_gpu=a.on_gpu, peak_flops=peaks, n=args.peak_n)
    skip = set(args.skip)
    ladder = [(name, knobs) for name, knobs in recipe.LADDER if not skip & set(knobs)]

    def measure(rung, knobs, batch, span="step"):
        flop = bench.resnet18_train_flops(batch, args.width)
        numerics = "bf16" if "bf16" in knobs else ""
        peak = peaks["bf16" if numerics else "tf32"]
        try:
            run, where, step_on, to_device = a.step(args.width, batch, knobs)
            if span == "step":
                t = steptime.time_steps(run, a.wait, warmup=args.warmup, repeats=args.repeats,
                                        steps=args.steps)
            else:
                rng = np.random.default_rng(1)
                n = batch * args.epoch_steps
                Xh = rng.random((n, 1, 28, 28), dtype=np.float32)
                yh = rng.integers(0, 10, n)
                t = steptime.time_epoch(
                    lambda: d2lmini.BatchIterator(Xh, yh, batch, shuffle=True, seed=0,
                                                  drop_last=True),
                    to_device, step_on, a.wait, repeats=args.repeats)
        except Exception as e:  # noqa: BLE001 -- one rung's failure is a record, not the end
            emit(kind="failure", framework=fw, rung=rung, batch=batch, span=span,
                 error=f"{type(e).__name__}: {e}"[:500])
            return
        rec = dict(kind="record", framework=fw, rung=rung, knobs=list(knobs), batch=batch,
                   width=args.width, numerics=a.numerics[numerics], arrays_on=where,
                   on_gpu=a.on_gpu, **t.as_record())
        rates = bench.rate_fields(flop, t.seconds, peak)
        rec.update(rates, peak_of=numerics or "tf32",
                   tflops=rates["achieved_flops"] / 1e12,
                   mfu=steptime.mfu(flop, t.median, peak))
        try:
            bench.check_rate(rec)
        except bench.ImpossibleRate as e:
            emit(kind="failure", framework=fw, rung=rung, batch=batch, span=span, error=str(e))
            return
        emit(**rec)

    for rung, knobs in ladder:                                   # the ladder
        measure(rung, knobs, args.ladder_batch)
    for rung, knobs in (ladder[0], ladder[-1]):                  # the shape
        for b in args.batches:
            if b != args.ladder_batch:
                measure(rung, knobs, b)
    measure(ladder[0][0], ladder[0][1], args.ladder_batch, span="epoch")


# ------------------------------------------------------------------ the driver
def fits_of(records: list[dict]) -> list[dict]:
    """``T0 + B t`` per (framework, rung) over the step records at several batches."""
    from d2lmini import steptime
    out = []
    groups: dict = {}
    for r in records:
        if r.get("kind") == "record" and r["span"] == steptime.STEP:
            groups.setdefault((r["framework"], r["rung"]), []).append(r)
    for (fw, rung), rs in groups.items():
        if len({r["batch"] for r in rs}) < 2:
            continue
        fit = steptime.fit_step_time([r["batch"] for r in rs], [r["ms_median"] / 1e3 for r in rs])
        out.append({"framework": fw, "rung": rung, "width": rs[0]["width"], **fit.as_record()})
    return out


def run_framework(fw: str, argv: list[str], timeout: float, module: str = "tools.step_bench",
                  mark: str = MARK) -> list[dict]:
    """Run ``python -m <module> --worker <fw> <argv>`` on one device, in a process of its own,
    and return the records it printed (lines starting with ``mark``), with a failure record
    when it timed out or exited non-zero.  The GPT benchmark (``tools.gpt_bench``) uses it too."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env["D2LMINI_NUM_DEVICES"] = "1"
    try:
        p = subprocess.run([sys.executable, "-m", module, "--worker", fw, *argv],
                           capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return [json.loads(l[len(mark):]) for l in out.splitlines() if l.startswith(mark)] + [
            {"kind": "failure", "framework": fw, "error": f"timed out after {timeout:.0f} s"}]
    recs = [json.loads(l[len(mark):]) for l in p.stdout.splitlines() if l.startswith(mark)]
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["?"]
        recs.append({"kind": "failure", "framework": fw, "error": f"exit {p.returncode}: {tail[0][:400]}"})
    return recs


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--ladder-batch", type=int, default=256)
    ap.add_argument("--batches", default="32,64,128,256")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--epoch-steps", type=int, default=40, help="steps in a timed epoch")
    ap.add_argument("--peak-n", type=int, default=8192, help="matrix size of the peaks")
    ap.add_argument("--skip", default="", help="knobs to leave out, e.g. compile")
    ap.add_argument("--allow-cpu", action="store_true", help="time the CPU when there is no GPU")
    ap.add_argument("--quick", action="store_true",
                    help="small sizes (width 8, batches 8,16, 2 steps): the CPU, the tests")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per framework")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "steps.json")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.width, args.ladder_batch, args.batches = 8, 16, "8,16"
        args.warmup, args.repeats, args.steps, args.epoch_steps, args.peak_n = 1, 2, 2, 3, 512
    args.batches = [int(b) for b in str(args.batches).split(",") if b]
    args.skip = [s for s in str(args.skip).split(",") if s]
    args.frameworks = [f for f in str(args.frameworks).split(",") if f]
    bad = set(args.frameworks) - set(FRAMEWORKS)
    if bad:
        ap.error(f"unknown frameworks {sorted(bad)}; choose from {', '.join(FRAMEWORKS)}")
    return args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if args.worker:
        worker(args.worker, args)
        return 0
    from d2lmini.hardware import cpu_model, nvidia_gpus, package_versions
    passed = ["--width", str(args.width), "--ladder-batch", str(args.ladder_batch),
              "--batches", ",".join(map(str, args.batches)), "--warmup", str(args.warmup),
              "--repeats", str(args.repeats), "--steps", str(args.steps),
              "--epoch-steps", str(args.epoch_steps), "--peak-n", str(args.peak_n),
              "--skip", ",".join(args.skip)] + (["--allow-cpu"] if args.allow_cpu else [])
    t0 = time.perf_counter()
    records = []
    for fw in args.frameworks:
        recs = run_framework(fw, passed, args.timeout)
        records += recs
        for r in recs:
            if r["kind"] == "record":
                print(f"{fw:6s} {r['rung']:22s} B={r['batch']:<4d} {r['span'][:5]} "
                      f"{r['ms_median']:8.2f} ms  {r['tflops']:7.2f} TFLOP/s  MFU {r['mfu']:.1%}",
                      flush=True)
            elif r["kind"] in ("failure", "skipped"):
                print(f"{fw:6s} {r['kind']}: {r.get('error') or r.get('reason')}", flush=True)
    gpus = [g.name for g in nvidia_gpus()]
    result = {
        "tool": "tools/step_bench.py", "argv": argv,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hardware": {"gpus": gpus, "cpu": cpu_model(), "cpu_cores": os.cpu_count()},
        "versions": {k: v for k, v in package_versions().items() if v},
        "settings": {k: getattr(args, k) for k in ("width", "ladder_batch", "batches", "warmup",
                                                   "repeats", "steps", "epoch_steps", "skip")},
        "records": [r for r in records if r["kind"] == "record"],
        "peaks": [r for r in records if r["kind"] == "peaks"],
        "fits": fits_of(records),
        "failures": [r for r in records if r["kind"] in ("failure", "skipped")],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(result['records'])} records, {len(result['fits'])} fits, "
          f"{len(result['failures'])} failures/skips in {result['seconds']} s -> {args.out}")
    return 0 if result["records"] and not [f for f in result["failures"]
                                           if f["kind"] == "failure"] else 1


if __name__ == "__main__":
    sys.exit(main())

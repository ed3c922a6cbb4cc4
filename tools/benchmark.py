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
import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from d2lmini.frameworks import FRAMEWORKS

ROOT = Path(__file__).resolve().parents[1]
# What a record's timed step holds (d2lmini.steptime): the concise implementations' step on a
# batch already on the devices; the from-scratch train_step (and MXNet's concise one), which
# split the host batch onto the devices themselves, with that split; launched ranks also
# report the per-step time of their epochs, input pipeline inside, in fields of their own.
STEP_SPAN = "step on device arrays"
SPLIT_SPAN = "step with its split of the host batch onto the devices"
EPOCH_SPAN = "epoch with input pipeline"
BENCH_SCRIPT = Path(__file__).resolve()
CONCISE_DIR = ROOT / "chapters" / "concise"
NOTEBOOK = {f.key: f.notebook for f in FRAMEWORKS}      # d2lmini.frameworks
SCRATCH_SKIP = ("## Training",)   # the notebook's own long runs
CONCISE_SKIP = ("## The Recipe",)  # the recipe's own training run: not what is timed
PROOF = "## The Proof: k Devices Equal One Device"
MATMUL_N = {"gpu": 8192, "cpu": 2048}   # the ceiling's matrix size (n x n times n x n)
ANALYTIC = ("analytic (d2lmini.bench.{}: convolutions and dense layers, forward and "
            "backward, counted as torch's FlopCounterMode counts them)")


# ---------------------------------------------------------------- worker side -----------
def exec_notebook(path: Path, skip: tuple[str, ...] = (), stop: str | None = None) -> dict:
    """Execute a notebook's code cells in order, from the notebook's own directory, skipping
    the sections whose ``## `` heading is in ``skip`` (e.g. the long training runs) and
    everything from the heading ``stop`` on; return the namespace.  Output is swallowed.
    The process runs in the notebook's folder (:func:`run_worker`: ``python -m`` puts it first
    on the path, as a kernel does), so the notebook's own modules import."""
    nb = json.loads(path.read_text())
    ns: dict = {"__name__": "__notebook__"}
    sink, skipping = io.StringIO(), False
    os.chdir(path.parent)
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


@contextlib.contextmanager
def proof_numerics(d2l):
    """The notebooks' cells -- their proofs and checks -- run inside the backend's
    ``exact_numerics()``, as under the tests.  What a notebook sets globally for itself is
    undone afterwards (the JAX scratch notebook sets ``jax_default_matmul_precision``;
    PyTorch's flags come back with the block), so the timed steps run with the defaults."""
    saved = None
    if d2l.FRAMEWORK == "jax":
        import jax
        saved = (jax.config.jax_default_matmul_precision,)
    try:
        with d2l.exact_numerics():
            yield
    finally:
        if saved is not None:
            jax.config.update("jax_default_matmul_precision", saved[0])


def timing_numerics(fw: str | None = None) -> str:
    """What the timed steps computed with: the frameworks' defaults (TF32 convolutions in
    PyTorch, TF32-like matrix products in JAX on GPUs), or exact (``D2LMINI_EXACT=1``)."""
    from d2lmini.config import exact_everywhere
    from d2lmini.hardware import nvidia_gpus
    if exact_everywhere():
        return "exact"
    if fw == "mxnet" and nvidia_gpus():
        return "exact (MXNet on a GPU host: for the whole process, see d2lmini.mxnet)"
    return "framework defaults"


def bench_devices(d2l, k: int) -> list:
    """The devices a k-device run asks for.  k = 1: the backend's ``try_gpu()`` -- the GPU
    when there is one, whatever a notebook's setup cell plans for its own lesson (the concise
    chapter asks for two devices, which one GPU gives as stand-ins: CPU devices in JAX).
    k >= 2: the backend's first k devices (GPUs, or its stand-ins when there are fewer)."""
    return [d2l.try_gpu()] if k == 1 else d2l.get_devices(k)


def _leaves(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _leaves(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _leaves(v)
    elif tree is not None:
        yield tree


class Adapter:
    """What the timing loop needs from a framework: the name of a device, where an array
    lives, how to wait for the work behind some arrays, and how fast a float32 matrix product
    runs on given devices (the ceiling)."""

    def leaves(self, tree) -> list:
        return list(_leaves(tree))

    def arrays_on(self, replicas) -> list[str]:
        """One name per replica: the device all its arrays live on (names joined with ``+``
        when one replica is spread over several devices)."""
        out = []
        for rep in replicas:
            names = sorted({n for x in self.leaves(rep) for n in self.where(x)})
            if not names:
                raise RuntimeError("a replica without arrays: nothing to read the device from")
            out.append("+".join(names))
        return out

    def distinct(self, names) -> list[str]:
        return list(dict.fromkeys(n for name in names for n in str(name).split("+")))


class TorchAdapter(Adapter):
    def __init__(self):
        import torch
        self.torch = torch

    def name(self, device) -> str:
        return str(device)

    def where(self, x) -> list[str]:
        return [str(x.device)]

    def block(self, tree) -> None:
        for d in {x.device for x in self.leaves(tree)}:
            if d.type == "cuda":
                self.torch.cuda.synchronize(d)

    def peak(self, names) -> tuple[float, str]:
        from d2lmini import bench, torch as d2l
        torch = self.torch
        devs = [torch.device(n) for n in self.distinct(names)]
        gpu = devs[0].type == "cuda"
        n = MATMUL_N["gpu" if gpu else "cpu"]
        g = torch.Generator().manual_seed(0)
        mats = [torch.randn(n, n, generator=g).to(d) for d in devs]
        # PyTorch's defaults: TF32 for cuDNN convolutions, full float32 for matrix products.
        # The model's FLOP are convolutions, so its ceiling is the product under their setting.
        tf32 = gpu and (d2l.tf32_allowed("matmul") or d2l.tf32_allowed("conv"))

        def run():
            for a in mats:
                a @ a
            self.block(mats)
        with d2l.allow_tf32("matmul", tf32):
            rate = bench.best_rate(run, 2 * n ** 3 * len(mats), calls=10 if gpu else 1)
        prec = ("no TF32 on the CPU" if not gpu else "TF32 allowed, as PyTorch allows it for "
                "convolutions by default" if tf32 else "full float32 (TF32 off)")
        how = f"torch float32 matmul {n}x{n} on {', '.join(map(str, devs))} ({prec})"
        return (rate, how) if gpu else bench.cpu_ceiling(rate, how, n)


class JaxAdapter(Adapter):
    def __init__(self):
        import jax
        self.jax = jax

    def name(self, device) -> str:
        return f"{device.platform}:{device.id}"

    def where(self, x) -> list[str]:
        return sorted(self.name(d) for d in x.devices())

    def leaves(self, tree) -> list:
        return self.jax.tree.leaves(tree)

    def block(self, tree) -> None:
        self.jax.block_until_ready(tree)

    def device_replicas(self, tree) -> list[list]:
        """The copies each device holds of a (replicated) state: its shards, grouped by
        device -- one replica per device of the mesh."""
        per: dict = {}
        for x in self.leaves(tree):
            for s in x.addressable_shards:
                per.setdefault(self.name(s.device), []).append(s.data)
        return [per[n] for n in sorted(per)]

    def devices_by_name(self) -> dict:
        out = {}
        for platform in ("cpu", "gpu"):
            try:
                out.update({self.name(d): d for d in self.jax.devices(platform)})
            except RuntimeError:
                pass
        return out

    def peak(self, names) -> tuple[float, str]:
        import numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec
        from d2lmini import bench
        jax = self.jax
        known = self.devices_by_name()
        devs = [known[n] for n in self.distinct(names)]
        gpu = devs[0].platform != "cpu"
        n = MATMUL_N["gpu" if gpu else "cpu"]
        # one n x n matrix per device, all multiplied at once (the devices run together)
        sharding = NamedSharding(Mesh(np.array(devs), ("d",)), PartitionSpec("d"))
        a = jax.device_put(np.random.default_rng(0).standard_normal((len(devs), n, n),
                                                                   dtype=np.float32), sharding)
        mm = jax.jit(lambda a: a @ a)
        rate = bench.best_rate(lambda: jax.block_until_ready(mm(a)), 2 * n ** 3 * len(devs),
                               calls=10 if gpu else 1)
        prec = jax.config.jax_default_matmul_precision or "default"
        how = (f"jax float32 matmul {n}x{n} on each of {', '.join(map(str, devs))} "
               f"(precision {prec}" + (", TF32-like on GPUs)" if gpu and prec == "default"
                                       else ")"))
        return (rate, how) if gpu else bench.cpu_ceiling(rate, how, n)


class MxnetAdapter(Adapter):
    def __init__(self):
        import mxnet as mx
        self.mx = mx

    def name(self, ctx) -> str:
        return str(ctx)

    def where(self, x) -> list[str]:
        return [str(x.context)]

    def block(self, tree) -> None:
        self.mx.nd.waitall()

    def peak(self, names) -> tuple[float, str]:
        from d2lmini import bench
        mx = self.mx
        ctxs = []
        for n in self.distinct(names):
            kind, i = bench.parse_device(n)
            ctxs.append(mx.gpu(i or 0) if kind == "gpu" else mx.cpu(i or 0))
        gpu = ctxs[0].device_type == "gpu"
        n = MATMUL_N["gpu" if gpu else "cpu"]
        mats = [mx.nd.random.normal(shape=(n, n), ctx=c) for c in ctxs]

        def run():
            for a in mats:
                mx.nd.dot(a, a)
            mx.nd.waitall()
        rate = bench.best_rate(run, 2 * n ** 3 * len(mats), calls=10 if gpu else 1)
        how = f"mxnet float32 nd.dot {n}x{n} on {', '.join(map(str, ctxs))}"
        return (rate, how) if gpu else bench.cpu_ceiling(rate, how, n)


class PaddleAdapter(Adapter):
    def __init__(self):
        import paddle
        self.paddle = paddle

    def name(self, place) -> str:
        return str(place)

    def where(self, x) -> list[str]:
        return [str(x.place)]

    def block(self, tree) -> None:
        from d2lmini import bench
        gpus = set()
        for x in self.leaves(tree):
            kind, i = bench.parse_device(str(x.place))
            if kind == "gpu":
                gpus.add(i or 0)
        for i in sorted(gpus):
            self.paddle.device.synchronize(f"gpu:{i}")

    def peak(self, names) -> tuple[float, str]:
        import numpy as np
        from d2lmini import bench
        paddle = self.paddle
        places = []
        for n in self.distinct(names):
            kind, i = bench.parse_device(n)
            places.append(paddle.CUDAPlace(i or 0) if kind == "gpu" else paddle.CPUPlace())
        gpu = isinstance(places[0], paddle.CUDAPlace)
        n = MATMUL_N["gpu" if gpu else "cpu"]
        a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
        mats = [paddle.to_tensor(a, place=p) for p in places]

        def run():
            for m in mats:
                paddle.matmul(m, m)
            self.block(mats)
        rate = bench.best_rate(run, 2 * n ** 3 * len(mats), calls=10 if gpu else 1)
        how = f"paddle float32 matmul {n}x{n} on {', '.join(map(str, places))}"
        return (rate, how) if gpu else bench.cpu_ceiling(rate, how, n)


ADAPTERS = {"torch": TorchAdapter, "jax": JaxAdapter, "mxnet": MxnetAdapter,
            "paddle": PaddleAdapter}


def placement(adapter: Adapter, replicas, requested: list[str], host_gpus: int) -> dict:
    """The record's placement fields, read from the arrays of ``replicas`` (one tree per
    replica): ``arrays_on`` and the ``device_kind`` derived from it; ``devices_requested`` is
    kept beside them, never used for the label."""
    from d2lmini import bench
    arrays_on = adapter.arrays_on(replicas)
    return {"devices_requested": list(requested), "arrays_on": arrays_on,
            "device_kind": bench.device_kind(arrays_on, host_gpus)}


@dataclasses.dataclass
class Case:
    """One implementation, ready to time."""
    step: Callable        # one training step on a batch, as ``place`` returned it
    state: Callable       # -> the arrays the steps produce (blocked on before the clock is read)
    replicas: Callable    # -> one tree of arrays per replica (where they live is recorded)
    flops: Callable       # (X, y) -> (FLOP of one step on that global batch, how counted)
    place: Callable = lambda X, y: (X, y)   # a host batch -> the step's input, done untimed
    span: str = ""        # what a timed step holds (d2lmini.steptime.STEP, or SPLIT_SPAN)


def torch_counted(fn) -> int:
    """FLOP that torch's FlopCounterMode counts while ``fn()`` runs."""
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def xla_flops(jitted, *args, static: tuple = ()) -> int:
    """XLA's cost analysis of ``jitted`` compiled for arguments shaped like ``args`` (after
    the ``static`` ones) on one device: a sharded program would report one device's share."""
    import jax
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)
    cost = jitted.lower(*static, *abstract).compile().cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0]
    flops = float(cost["flops"])
    if not flops > 0:
        raise ValueError(f"XLA's cost analysis gave {flops} FLOP")
    return int(flops)


#: a framework's count below this share of the analytic one has left work out: XLA's cost
#: analysis of a program compiled for a GPU does not count the convolutions, which run as cuDNN
#: library calls (one H200, JAX 0.11.2: 2.6e9 FLOP for a ResNet-18 step of 7.0e11)
COUNT_FLOOR = 0.5


def counted(count, fallback: int, how: str, fallback_how: str) -> tuple[int, str]:
    """The framework's own count, or the analytic one (saying why) if that fails or counts
    less than ``COUNT_FLOOR`` times the analytic one."""
    try:
        n = count()
        if n < COUNT_FLOOR * fallback:
            raise ValueError(f"it counts {n:.3g} FLOP, under {COUNT_FLOOR:g} x the analytic "
                             f"{fallback:.3g} (library calls, such as cuDNN convolutions on a "
                             f"GPU, are not counted)")
        return n, how
    except Exception as e:  # noqa: BLE001 -- any failure of the counter: say so, use ours
        return fallback, f"{fallback_how}; the framework's count failed: {type(e).__name__}: {e}"[:300]


def scratch_case(ns: dict, fw: str, impl: str, devices, lr: float) -> Case:
    """One training step of the from-scratch chapter, with the naive or the ring all-reduce."""
    from d2lmini import bench
    train_step, init_params, get_params = ns["train_step"], ns["init_params"], ns["get_params"]
    reduce = ns["allreduce"] if impl == "seed" else ns["ring_allreduce"]
    state = {"params": [get_params(init_params(0), d) for d in devices]}

    def step(X, y):
        out = train_step(X, y, state["params"], devices, lr, reduce=reduce)
        if out is not None:          # JAX returns the new replicas; the others update in place
            state["params"] = out

    def flops(X, y):
        analytic = bench.lenet_train_flops(len(y))
        how = ANALYTIC.format("lenet_train_flops")
        if fw == "torch":
            return counted(lambda: torch_counted(lambda: step(X, y)), analytic,
                           "torch FlopCounterMode: one step, every replica", how)
        if fw == "jax" and hasattr(ns.get("grad_sum"), "lower"):
            import numpy as np
            p0 = state["params"][0]
            return counted(lambda: xla_flops(ns["grad_sum"], p0, np.asarray(X),
                                             np.asarray(y, np.int32)), analytic,
                           "XLA cost analysis: grad_sum on the global batch (the all-reduce "
                           "and the update not counted)", how)
        return analytic, how
    return Case(step, lambda: state["params"], lambda: state["params"], flops, span=SPLIT_SPAN)


def concise_notebook(fw: str, stop: str) -> dict:
    return exec_notebook(ROOT / "chapters" / "concise" / f"{NOTEBOOK[fw]}.ipynb",
                         skip=CONCISE_SKIP, stop=stop)


def mxnet_concise_case(devices, args, adapter) -> Case:
    """The chapter's ``train_step``: ``split_and_load``-style shards, ``gluon.Trainer``."""
    from d2lmini import bench
    ns = concise_notebook("mxnet", stop=PROOF)
    from mxnet import gluon
    net = ns["replicate"](ns["init_checkpoint"](args.width), devices, args.width)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": CONCISE_LR},
                            kvstore="device")
    params = list(net.collect_params().values())
    return Case(lambda X, y: ns["train_step"](net, trainer, X, y, devices),
                lambda: [p.list_data() for p in params],
                lambda: [list(r) for r in zip(*(p.list_data() for p in params))],
                lambda X, y: (bench.resnet18_train_flops(len(y), args.width),
                              ANALYTIC.format("resnet18_train_flops")), span=SPLIT_SPAN)


def jax_concise_case(devices, args, adapter) -> Case:
    """The chapter's jitted ``train_step`` on a ``Mesh`` of the benchmark's devices (not the
    notebook's: for k = 1 that is the GPU): replicated state, sharded batch."""
    from d2lmini import bench
    ns = concise_notebook("jax", stop=PROOF)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh
    d2l = ns["d2l"]
    ns["net"] = net = d2l.resnet18(num_classes=10, width=args.width)   # train_step's global
    variables = jax.jit(net.init)(jax.random.key(0, impl="rbg"), jnp.zeros((1, 1, 28, 28)))
    mesh = Mesh(np.array(devices), ("data",))
    state = {"s": ns["replicate"](ns["init_state"](variables, CONCISE_LR), mesh)}
    train_step = ns["train_step"]
    # train_step(state, X, y) with the notebook's global net, or train_step(net, state, X, y)
    # with net a static argument
    static = (net,) if next(iter(inspect.signature(train_step).parameters)) == "net" else ()

    def step(Xs, ys):                           # the batch already sharded on the mesh
        state["s"], _ = train_step(*static, state["s"], Xs, ys)

    def flops(X, y):
        return counted(lambda: xla_flops(train_step, state["s"], np.asarray(X),
                                         np.asarray(y, np.int32), static=static),
                       bench.resnet18_train_flops(len(y), args.width),
                       "XLA cost analysis of train_step on the global batch",
                       ANALYTIC.format("resnet18_train_flops"))
    return Case(step, lambda: state["s"], lambda: adapter.device_replicas(state["s"]), flops,
                place=lambda X, y: ns["shard"](X, y, mesh), span=STEP_SPAN)


def launched_times(ranks: list[dict], key: str, args) -> tuple[list[float], list[float], list[str]]:
    """The ranks' in-step times (``step_s``: each rank timed its DDP step on a batch already
    on its device, ``d2lmini.steptime.time_steps``; the slowest rank counts per window), the
    per-step times of the epochs they trained (epoch 1 is the warm-up; the input pipeline
    inside: labelled, never mixed with the former), and where each rank's parameters lived."""
    steps = [max(w) for w in zip(*(r["step_s"] for r in ranks))]
    slowest = [max(e) for e in zip(*(r[key] for r in ranks))]
    arrays_on = ["+".join(r["arrays_on"]) for r in ranks]
    return steps, [t / args.concise_steps for t in slowest[1:]], arrays_on


def bench_env(args) -> dict:
    """What a launched rank's in-step timing reads (``rank_step_times``)."""
    return {"D2LMINI_BENCH_WARMUP": str(args.warmup), "D2LMINI_BENCH_REPEATS": str(args.repeats),
            "D2LMINI_BENCH_STEPS": str(args.concise_steps)}


def rank_step_times(step, wait) -> list[float]:
    """In a launched rank: ``step()`` timed by ``d2lmini.steptime.time_steps`` with the
    counts the driver passed (every rank runs the same number of steps: they all-reduce)."""
    from d2lmini import steptime
    e = os.environ
    t = steptime.time_steps(step, wait, warmup=int(e.get("D2LMINI_BENCH_WARMUP", 2)),
                            repeats=int(e.get("D2LMINI_BENCH_REPEATS", 3)),
                            steps=int(e.get("D2LMINI_BENCH_STEPS", 5)))
    return list(t.seconds)


def torch_launched(devices, args):
    """``ddp_train.py``'s ``train`` under ``torchrun`` (the chapter's ``run_script``), through
    this file's ``--bench-rank torch``."""
    import tempfile
    ns = concise_notebook("torch", stop="## Splitting and Sampling the Data")
    k = len(devices)
    out = tempfile.mkdtemp(prefix="bench-torch-")
    ns["run_script"](k, "torchrun", [
        "--bench-rank", "torch",
        "--epochs", 1 + args.repeats, "--batch-size", args.batch, "--lr", CONCISE_LR,
        "--width", args.width, "--train-samples", args.batch * args.concise_steps,
        "--test-samples", 64, "--bn-batches", 0, "--predict", 1, "--out", out],
        env=bench_env(args), timeout=args.timeout, script=BENCH_SCRIPT)
    return launched_times(ns["launch"].read_rank_results(out, k), "epoch_s", args)


def paddle_launched(devices, args):
    """``paddle_train.py``'s ``train`` under ``paddle.distributed.launch`` (the chapter's
    ``launch_cmd``), through this file's ``--bench-rank paddle``."""
    import tempfile
    ns = concise_notebook("paddle", stop="## Splitting and Sampling the Data")
    k = len(devices)
    out = tempfile.mkdtemp(prefix="bench-paddle-")
    cmd, _ = ns["launch_cmd"](k, out, "--bench-rank", "paddle", "--epochs",
                              str(1 + args.repeats), "--batch_size", str(args.batch), "--lr",
                              str(CONCISE_LR), "--width", str(args.width), "--train_samples",
                              str(args.batch * args.concise_steps), "--test_samples", "64",
                              script=str(BENCH_SCRIPT))
    ns["d2l"].run_launch(cmd, log_dir=os.path.join(out, "logs"), timeout=args.timeout,
                         env={**ns["d2l"].rank_env(k), **bench_env(args)})
    return launched_times(ns["launch"].read_rank_results(out, k), "epoch_seconds", args)


def torch_resnet_flops(batch: int, width: int) -> tuple[int, str]:
    """torch's FlopCounterMode over one training step of ``d2l.resnet18`` (the model
    ``ddp_train.py`` trains) on the global batch, on the meta device (nothing computed)."""
    from d2lmini import bench

    def count():
        import torch
        from d2lmini import torch as d2l
        net = d2l.resnet18(num_classes=10, width=width).to("meta")
        X = torch.zeros(batch, 1, 28, 28, device="meta")
        y = torch.zeros(batch, dtype=torch.long, device="meta")
        return torch_counted(lambda: torch.nn.functional.cross_entropy(net(X), y).backward())
    return counted(count, bench.resnet18_train_flops(batch, width),
                   "torch FlopCounterMode: one step of d2l.resnet18 on the global batch",
                   ANALYTIC.format("resnet18_train_flops"))


def paddle_resnet_flops(batch: int, width: int) -> tuple[int, str]:
    from d2lmini import bench
    return bench.resnet18_train_flops(batch, width), ANALYTIC.format("resnet18_train_flops")


CONCISE_LR = 0.05
CONCISE_API = {"mxnet": "gluon.Trainer, kvstore='device'", "jax": "jit + NamedSharding",
               "torch": "DistributedDataParallel, torchrun",
               "paddle": "paddle.DataParallel, paddle.distributed.launch"}
CONCISE_CASE = {"mxnet": mxnet_concise_case, "jax": jax_concise_case}
LAUNCHED = {"torch": (torch_launched, torch_resnet_flops),
            "paddle": (paddle_launched, paddle_resnet_flops)}


def time_case(case: Case, adapter: Adapter, batches, warmup: int, repeats: int,
              steps: int) -> list[float]:
    """Seconds per step of ``repeats`` windows of ``steps`` steps, after ``warmup`` steps;
    every window ends by blocking on the arrays the steps produced."""
    i = 0
    placed = [case.place(X, y) for X, y in batches]    # untimed: on the devices beforehand

    def run(n):
        nonlocal i
        for _ in range(n):
            case.step(*placed[i % len(placed)])
            i += 1
        adapter.block(case.state())   # the work is done before the clock is read

    run(warmup)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(steps)
        times.append((time.perf_counter() - t0) / steps)
    return times


def worker(args) -> dict:
    os.environ["D2LMINI_PROFILE"] = "smoke"   # the notebook prefix: small data, quick
    import d2lmini
    fw = args.framework
    d2l = importlib.import_module(f"d2lmini.{fw}")
    adapter = ADAPTERS[fw]()
    devices = bench_devices(d2l, args.devices)
    requested = [adapter.name(d) for d in devices]
    data = d2lmini.load_fashion_mnist(train_samples=args.batch * 4, test_samples=10)
    batches = [(data.X_train[i * args.batch:(i + 1) * args.batch],
                data.y_train[i * args.batch:(i + 1) * args.batch]) for i in range(4)]
    result = {"framework": fw, "impl": args.impl, "devices": len(devices),
              "batch_size": args.batch}
    if args.impl in ("seed", "ring"):
        with proof_numerics(d2l):
            ns = exec_notebook(ROOT / "chapters" / "scratch" / f"{NOTEBOOK[fw]}.ipynb",
                               skip=SCRATCH_SKIP)
            case = scratch_case(ns, fw, args.impl, devices, lr=0.1)
        result["model"] = "LeNet"
        steps = args.steps
    else:
        result.update(model=f"ResNet-18, width {args.width}", api=CONCISE_API[fw])
        if fw in LAUNCHED:
            launch, count = LAUNCHED[fw]
            with proof_numerics(d2l):
                times, epoch_times, arrays_on = launch(devices, args)
            flops, how = count(args.batch, args.width)
            result.update(span=STEP_SPAN, epoch_step_times=epoch_times, epoch_span=EPOCH_SPAN)
            return finish(result, adapter, times, arrays_on, requested, flops, how, fw)
        with proof_numerics(d2l):
            case = CONCISE_CASE[fw](devices, args, adapter)
        steps = args.concise_steps
    result["span"] = case.span
    times = time_case(case, adapter, batches, args.warmup, args.repeats, steps)
    arrays_on = adapter.arrays_on(case.replicas())     # read from the arrays, after the steps
    flops, how = case.flops(*batches[0])
    return finish(result, adapter, times, arrays_on, requested, flops, how, fw)


def finish(result, adapter, times, arrays_on, requested, flops, how, fw) -> dict:
    """The worker's record: placement read from the arrays, FLOP per step, and the ceiling
    measured now, on the devices the arrays were on."""
    from d2lmini import bench
    from d2lmini.hardware import nvidia_gpus
    peak, peak_how = adapter.peak(arrays_on)
    return dict(result, devices_requested=list(requested), arrays_on=arrays_on,
                device_kind=bench.device_kind(arrays_on, len(nvidia_gpus())),
                numerics=timing_numerics(fw), flops_per_step=flops, flops_source=how,
                peak_flops=peak, peak_how=peak_how, step_times=times)


# ---------------------------------------------------------------- launched ranks ---------
def load_module(path: Path):
    name = path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def torch_rank(argv: list[str]) -> None:
    """One rank of ``ddp_train.py``: its own ``main`` and ``train``, and the devices of its
    model's parameters (``p.device``) added to the rank's results file."""
    ddp_train = load_module(CONCISE_DIR / "ddp_train.py")
    models, DDP = [], ddp_train.DDP

    def capture(module, *a, **kw):
        models.append(DDP(module, *a, **kw))
        return models[-1]
    ddp_train.DDP = capture

    def work(args, device):
        import torch
        result = ddp_train.train(args, device)
        model = models[-1]
        result["arrays_on"] = sorted({str(p.device) for p in model.module.parameters()})
        # the in-step time: this rank's share of a batch already on its device
        g = torch.Generator().manual_seed(int(os.environ.get("RANK", 0)))
        n = args.batch_size // int(os.environ.get("WORLD_SIZE", 1))
        X = torch.rand(n, 1, 28, 28, generator=g).to(device)
        y = torch.randint(0, 10, (n,), generator=g).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
        loss_fn = torch.nn.CrossEntropyLoss()
        model.train()
        wait = ((lambda out: torch.cuda.synchronize(device)) if device.type == "cuda"
                else (lambda out: None))         # CPU operations return when done
        result["step_s"] = rank_step_times(
            lambda: ddp_train.train_step(model, loss_fn, opt, X, y), wait)
        return result
    ddp_train.main(argv, work=work)


def paddle_rank(argv: list[str]) -> None:
    """One rank of ``paddle_train.py``: its own ``main`` and ``train``, and the places of its
    model's parameters added to the rank's results file."""
    paddle_train = load_module(CONCISE_DIR / "paddle_train.py")
    nets, models, replicate = [], [], paddle_train.replicate

    def capture(net):
        nets.append(net)
        models.append(replicate(net))
        return models[-1]
    paddle_train.replicate = capture

    def work(args):
        import numpy as np
        import paddle
        import paddle.distributed as dist
        paddle_train.train(args)
        rank = dist.get_rank()
        log = json.loads((Path(args.out) / f"rank{rank}.json").read_text())
        log["arrays_on"] = sorted({str(p.place) for p in nets[-1].parameters()})
        # the in-step time: this rank's share of a batch already on its device
        rng = np.random.default_rng(rank)
        n = args.batch_size // dist.get_world_size()
        X = paddle.to_tensor(rng.random((n, 1, 28, 28), dtype=np.float32))
        y = paddle.to_tensor(rng.integers(0, 10, n))
        model = models[-1]
        opt = paddle.optimizer.SGD(learning_rate=args.lr, parameters=model.parameters())
        model.train()
        log["step_s"] = rank_step_times(
            lambda: paddle_train.train_step(model, paddle.nn.CrossEntropyLoss(), opt, X, y),
            lambda out: paddle_train.d2l.synchronize([nets[-1].parameters()[0].place]))
        paddle_train.write_json(args.out, rank, log)
    paddle_train.main(argv, work=work)


def rank_main(argv: list[str]) -> int:
    i = argv.index("--bench-rank")
    fw, rest = argv[i + 1], argv[:i] + argv[i + 2:]
    {"torch": torch_rank, "paddle": paddle_rank}[fw](rest)
    return 0


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

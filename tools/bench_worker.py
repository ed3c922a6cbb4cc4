"""A benchmark worker (``tools.benchmark --worker``) and the launched ranks it starts
(``--bench-rank``): a chapter notebook's own cells, chosen by tag, then its step timed on the
devices.  See ``tools.benchmark`` for what is timed and how records are kept."""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import sys
import time
from pathlib import Path

from d2lmini.frameworks import FRAMEWORKS
from d2lmini.steptime import EPOCH, STEP
from tools.notebooks import code_cells, read, run_cells
from tools.bench_adapters import (ADAPTERS, Adapter, Case, bench_devices, counted,  # noqa: F401
                                  placement, torch_counted, xla_flops)

ROOT = Path(__file__).resolve().parents[1]
# What a record's timed step holds (d2lmini.steptime): the concise implementations' step on a
# batch already on the devices; the from-scratch train_step (and MXNet's concise one), which
# split the host batch onto the devices themselves, with that split; launched ranks also
# report the per-step time of their epochs, input pipeline inside, in fields of their own.
STEP_SPAN = STEP                        # d2lmini.steptime's spans, the one definition
SPLIT_SPAN = "step with its split of the host batch onto the devices"
EPOCH_SPAN = EPOCH
BENCH_SCRIPT = ROOT / "tools" / "benchmark.py"   # what the launchers run, --bench-rank
CONCISE_DIR = ROOT / "chapters" / "concise"
NOTEBOOK = {f.key: f.notebook for f in FRAMEWORKS}      # d2lmini.frameworks
# The cells a worker leaves out, by tag: the notebooks' own training runs (the from-scratch
# chapter's, the concise chapter's recipe run), and everything from the cell tagged STOP on
# (the concise chapter's proof and what follows; the communication labs' measurements).
SKIP, STOP = "bench:skip", "bench:stop"
LAUNCHED_STOP = "bench:launched-stop"   # the launched ranks need the concise setup cells only
ANALYTIC = ("analytic (d2lmini.bench.{}: convolutions and dense layers, forward and "
            "backward, counted as torch's FlopCounterMode counts them)")



def exec_notebook(path: Path, stop: str = "bench:stop") -> dict:
    """Execute a notebook's code cells in this process, from the notebook's own directory, as
    far as the cell tagged ``stop`` (:data:`STOP`, or :data:`LAUNCHED_STOP`) and without the
    cells tagged :data:`SKIP` (the long training runs); return the namespace.  Output is
    swallowed; a cell's error is raised.  The process runs in the notebook's folder
    (``run_worker``: ``python -m`` puts it first on the path, as a kernel does), so the
    notebook's own modules import.  Cells are chosen by tag, never by heading text."""
    ns: dict = {"__name__": "__notebook__"}
    for *_, error in run_cells(path, ns, code_cells(read(path), stop=stop, skip=(SKIP,))):
        if error is not None:
            raise error
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


def concise_notebook(fw: str, stop: str = STOP) -> dict:
    return exec_notebook(ROOT / "chapters" / "concise" / f"{NOTEBOOK[fw]}.ipynb", stop)


def mxnet_concise_case(devices, args, adapter) -> Case:
    """The chapter's ``train_step``: ``split_and_load``-style shards, ``gluon.Trainer``."""
    from d2lmini import bench
    ns = concise_notebook("mxnet")
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
    ns = concise_notebook("jax")
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
    ns = concise_notebook("torch", stop=LAUNCHED_STOP)
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
    ns = concise_notebook("paddle", stop=LAUNCHED_STOP)
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
            ns = exec_notebook(ROOT / "chapters" / "scratch" / f"{NOTEBOOK[fw]}.ipynb")
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

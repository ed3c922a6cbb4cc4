"""The benchmark's view of each framework (``tools.benchmark``): where a step's arrays live
(``Adapter.name``, ``placement``), how to wait for its work and time it, its peak rate, and how
many FLOPs a step does (the framework's own count where it has one, else
``d2lmini.bench``'s analytic one).  Runs in a benchmark worker."""
from __future__ import annotations

import dataclasses
from typing import Callable

MATMUL_N = {"gpu": 8192, "cpu": 2048}   # the ceiling's matrix size (n x n times n x n)


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

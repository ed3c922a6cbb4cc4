"""Paddle's own sharded data parallelism, one process per device, against plain DataParallel.

    python paddle_sharded.py --nprocs K --port PORT --out DIR [--steps S --device-batch B
                             --lr LR --accum A]

Started with ``paddle.distributed.spawn`` (the CPU build's ranks use gloo).  Every rank builds
the from-scratch chapter's LeNet (as a ``paddle.nn.Layer`` with the shared weights,
``d2lmini.lenet_init``) and trains it with Adam for S steps on the same fixed batches:

- ``dp``: ``paddle.DataParallel``, everything replicated (the reference);
- ``os``, ``os_g``, ``p_g_os``: ``paddle.distributed.sharding.group_sharded_parallel`` at its
  three levels (ZeRO-1, -2, -3).  A level that fails records its error instead of a result.

It also tries the auto-parallel API (``dist.shard_optimizer`` with ``dist.ShardingStage1``).
Then ``DataParallel``'s ``no_sync`` accumulation of A micro-batches is compared with the whole
batch (the gradients).  Each rank writes ``DIR/rank<r>.json``: per run the largest difference of
the parameters from ``dp`` (or the error), the bytes of parameters and Adam state it holds, and
its peak resident memory.
"""
from __future__ import annotations

import argparse
import json
import os
import traceback
from pathlib import Path

import numpy as np

import d2lmini
from d2lmini import paddle as d2l  # noqa: F401 -- imported for its effect: paddle first, its warning filtered
from d2lmini import sharding as sh
import paddle
import paddle.distributed as dist
import paddle.nn.functional as F

LEVELS = ("os", "os_g", "p_g_os", "shard_optimizer")


class LeNet(paddle.nn.Layer):
    """The from-scratch chapter's LeNet with its parameters W1, b1, ..., W4, b4."""

    def __init__(self):
        super().__init__()
        self.names = ["W1", "b1", "W2", "b2", "W3", "b3", "W4", "b4"]
        for name, a in zip(self.names, d2lmini.lenet_init(0)):
            p = self.create_parameter(list(a.shape), dtype="float32")
            p.set_value(a)
            setattr(self, name, p)

    def forward(self, X):
        W1, b1, W2, b2, W3, b3, W4, b4 = (getattr(self, n) for n in self.names)
        H = F.avg_pool2d(F.relu(F.conv2d(X, W1, b1)), kernel_size=2, stride=2)
        H = F.avg_pool2d(F.relu(F.conv2d(H, W2, b2)), kernel_size=2, stride=2)
        H = F.relu(H.flatten(start_axis=1) @ W3 + b3)
        return H @ W4 + b4


def nbytes(t) -> int:
    return int(t.size) * t.element_size() if t is not None else 0


def train(level, batches, args, world, rank):
    net = LeNet()
    optimizer = paddle.optimizer.Adam(learning_rate=args.lr, parameters=net.parameters())
    if level == "dp":
        model = paddle.DataParallel(net) if world > 1 else net
    elif level == "shard_optimizer":               # the auto-parallel API (Paddle 3)
        mesh = dist.ProcessMesh(list(range(world)), dim_names=["dp"])
        optimizer = paddle.optimizer.AdamW(learning_rate=args.lr, parameters=net.parameters(),
                                           weight_decay=0.0)   # = Adam; it takes AdamW or SGD
        optimizer = dist.shard_optimizer(optimizer, dist.ShardingStage1("dp", mesh))
        model = net
    else:
        from paddle.distributed.sharding import group_sharded_parallel
        model, optimizer, _ = group_sharded_parallel(net, optimizer, level=level)
    for X, y in batches:
        part = d2lmini.shard_slices(len(y), world)[rank]
        X_i, y_i = paddle.to_tensor(X[part]), paddle.to_tensor(y[part])
        loss = F.cross_entropy(model(X_i), y_i, reduction="sum") * world / len(y)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
    params = [p.numpy() for p in net.parameters()]
    state = [v for v in optimizer.state_dict().values() if hasattr(v, "numpy")]
    held = {"params": sum(nbytes(p) for p in net.parameters()),
            "optimizer": sum(nbytes(v) for v in state if int(v.size) > 1)}
    return params, held


def accumulation(batches, args, world, rank) -> float:
    """DataParallel: A micro-batches with no_sync for all but the last; against the whole
    batch at once.  The largest difference of the (all-reduced) gradients."""
    X, y = batches[0]
    part = d2lmini.shard_slices(len(y), world)[rank]
    X, y = X[part], y[part]
    results = []
    for micro in (1, args.accum):
        net = LeNet()
        model = paddle.DataParallel(net) if world > 1 else net
        pieces = d2lmini.shard_slices(len(y), micro)
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            sync = model.no_sync() if (world > 1 and not last) else _nothing()
            with sync:
                loss = F.cross_entropy(model(paddle.to_tensor(X[piece])),
                                       paddle.to_tensor(y[piece]), reduction="sum")
                (loss * world / len(batches[0][1])).backward()
        results.append([p.grad.numpy() for p in net.parameters()])
    return sh.max_abs_diff(results[0], results[1])


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def worker(args):
    world = dist.get_world_size()
    if world > 1:
        dist.init_parallel_env()
    rank = dist.get_rank()
    paddle.set_device("cpu")
    data = d2lmini.load_fashion_mnist(args.steps * args.device_batch * world, 100)
    n = args.device_batch * world
    batches = [(data.X_train[s * n:(s + 1) * n], data.y_train[s * n:(s + 1) * n].astype(np.int64))
               for s in range(args.steps)]
    ref, ref_held = train("dp", batches, args, world, rank)
    result = {"rank": rank, "world": world, "runs": {"dp": {"params_diff": 0.0, "held": ref_held}}}
    for level in LEVELS:
        try:
            params, held = train(level, batches, args, world, rank)
            result["runs"][level] = {"params_diff": sh.max_abs_diff(params, ref), "held": held}
        except Exception as e:  # noqa: BLE001  -- the notebook shows what failed and why
            last = [line for line in traceback.format_exception_only(type(e), e) if line.strip()]
            result["runs"][level] = {"error": last[-1].strip()[:400]}
    result["accumulation_diff"] = accumulation(batches, args, world, rank)
    result["peak_rss"] = sh.peak_rss_bytes()
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(result))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--port", type=int, required=True, help="rendezvous port")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device-batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--accum", type=int, default=4)
    args = p.parse_args(argv)
    os.environ["PADDLE_MASTER"] = f"127.0.0.1:{args.port}"
    os.environ.setdefault("OMP_NUM_THREADS", "1")   # k processes share the machine's cores
    if args.nprocs == 1:
        worker(args)
    else:
        dist.spawn(worker, args=(args,), nprocs=args.nprocs)


if __name__ == "__main__":
    main()

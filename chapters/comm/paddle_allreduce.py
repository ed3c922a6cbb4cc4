"""All-reduce timed with Paddle's collective API over gloo, one process per device.

    python paddle_allreduce.py --nprocs K --port PORT --out DIR --sizes 8,64,... [--overlap]

Started with ``paddle.distributed.spawn`` (the CPU build's ranks use gloo).  Every rank joins
the process group, checks one all-reduce, then times ``dist.all_reduce`` on float32 buffers of
every size with d2lmini.commcost.sweep: a barrier before each call (untimed), the slowest
rank's time counts.  With ``--overlap`` the ranks also time training steps of the book's
ResNet-18 with ``paddle.DataParallel``'s buckets and with an all-reduce after backward.
Rank 0 writes ``DIR/result.json``.
"""
from __future__ import annotations

import argparse
import os

import d2lmini
from d2lmini import commcost as cc
from d2lmini import paddle as d2l   # imports paddle first (and filters its import warning)
import paddle
import paddle.distributed as dist
from paddle import nn


# the collective one rank runs: all-reduce (sum) of an n-byte float32 buffer, in place
def time_allreduce(n_bytes: int):
    buf = paddle.zeros([n_bytes // 4], dtype="float32")
    return lambda: dist.all_reduce(buf, op=dist.ReduceOp.SUM)


def slowest(times: list[float]) -> list[float]:
    """Every repeat's time on the slowest rank (a collective ends when its last rank does)."""
    t = paddle.to_tensor(times, dtype="float64")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.numpy().tolist()


def check_sum() -> bool:
    x = paddle.full([5], float(dist.get_rank() + 1))
    dist.all_reduce(x)
    k = dist.get_world_size()
    return bool((x.numpy() == k * (k + 1) / 2).all())


# ----------------------------------------------------------------- overlap and bucketing
def make_step(model, params, X, y, after=None):
    """One training step: forward, backward, ``after`` (e.g. an all-reduce of the gradients),
    SGD update."""
    opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=params)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        loss_fn(model(X), y).backward()
        if after is not None:
            after()
        opt.step()
        opt.clear_grad()
    return step


def allreduce_after_backward(params):
    """All gradients in one flat buffer, all-reduced once backward has finished."""
    @paddle.no_grad()
    def run():
        grads = [p.grad for p in params]
        flat = paddle.concat([g.reshape([-1]) for g in grads])
        dist.all_reduce(flat)
        flat = flat / dist.get_world_size()
        offset = 0
        for g in grads:
            n = int(g.size)
            paddle.assign(flat[offset:offset + n].reshape(g.shape), output=g)
            offset += n
    return run


def overlap(batch: int, width: int, steps: int) -> dict:
    """Step times of one model with five ways of communicating its gradients, ``steps``
    repeats each, taken in interleaved rounds (one step of every variant per round, a barrier
    before each), every repeat the slowest rank's time."""
    paddle.seed(0)
    world = dist.get_world_size()
    X = paddle.randn([max(1, batch // world), 1, 28, 28])
    y = paddle.randint(0, 10, [X.shape[0]])

    def net():
        n = d2l.resnet18(num_classes=10, width=width)
        d2l.canonical_init(n, d2lmini.resnet18_init(width=width, seed=0))
        return n
    plain, plain_after = net(), net()
    params = [p for p in plain.parameters() if p.trainable]
    params_after = [p for p in plain_after.parameters() if p.trainable]
    grad_bytes = sum(int(p.size) * 4 for p in params)
    out = {"grad_bytes": grad_bytes, "per_rank_batch": int(X.shape[0]), "width": width}
    calls = {"compute only": make_step(plain, params, X, y),
             "all-reduce after backward": make_step(plain_after, params_after, X, y,
                                                    after=allreduce_after_backward(params_after))}
    model_mb = grad_bytes / 2**20
    # the last bucket (the first layers' gradients, ready last) is 1 MB by default; the huge
    # variant makes it huge too, so that it is one bucket, all-reduced after backward
    huge = int(10 * model_mb) + 100
    for name, cap, last in (("DataParallel, small buckets", max(1, round(model_mb / 8)), 1),
                            ("DataParallel, default buckets (25 MiB)", 25, 1),
                            ("DataParallel, one huge bucket", huge, huge)):
        dp = paddle.DataParallel(net(), comm_buffer_size=cap, last_comm_buffer_size=last)
        calls[name] = make_step(dp, dp.parameters(), X, y)
    times = cc.time_interleaved(calls, warmup=1, repeats=steps, before=dist.barrier)
    out.update({name: slowest(t) for name, t in times.items()})
    return out


def worker(args):
    paddle.set_device("cpu")
    paddle.set_num_threads(1) if hasattr(paddle, "set_num_threads") else None
    dist.init_parallel_env()            # gloo for CPU ranks; TCP rendezvous at PADDLE_MASTER
    cc.rank_sweep(args, rank=dist.get_rank(), k=dist.get_world_size(),
                  time_allreduce=time_allreduce, check_sum=check_sum, slowest=slowest,
                  barrier=dist.barrier, overlap=overlap)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cc.add_worker_arguments(p)
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--port", type=int, required=True, help="rendezvous port")
    args = p.parse_args()
    os.environ["PADDLE_MASTER"] = f"127.0.0.1:{args.port}"
    os.environ.setdefault("OMP_NUM_THREADS", "1")   # k processes share the machine's cores
    dist.spawn(worker, args=(args,), nprocs=args.nprocs)


if __name__ == "__main__":
    main()

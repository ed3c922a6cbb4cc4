"""All-reduce timed with torch.distributed over gloo, one process per device.

    python -m torch.distributed.run --standalone --nproc_per_node K pytorch_allreduce.py \
        --out DIR --sizes 8,64,... [--overlap]

Every rank joins the process group, checks one all-reduce, then times ``dist.all_reduce`` on
float32 buffers of every size with d2lmini.commcost.sweep: a barrier before each call (untimed),
the slowest rank's time counts.  With ``--overlap`` the ranks also time training steps of the
book's ResNet-18 with DDP's bucketed all-reduce and with an all-reduce after backward.
Rank 0 writes ``DIR/result.json``.
"""
from __future__ import annotations

import argparse
import datetime

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import d2lmini
from d2lmini import commcost as cc
from d2lmini import torch as d2l


# the collective one rank runs: all-reduce (sum) of an n-byte float32 buffer, in place
def time_allreduce(n_bytes: int):
    buf = torch.zeros(n_bytes // 4)
    return lambda: dist.all_reduce(buf, op=dist.ReduceOp.SUM)


def slowest(times: list[float]) -> list[float]:
    """Every repeat's time on the slowest rank (a collective ends when its last rank does)."""
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def check_sum() -> bool:
    x = torch.full((5,), float(dist.get_rank() + 1))
    dist.all_reduce(x)
    k = dist.get_world_size()
    return bool((x == k * (k + 1) / 2).all())


# ----------------------------------------------------------------- overlap and bucketing
def make_step(model, X, y, after=None):
    """One training step: zero the gradients, forward, backward, ``after`` (e.g. an all-reduce
    of the gradients), SGD update."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=False)
        loss_fn(model(X), y).backward()
        if after is not None:
            after()
        opt.step()
    return step


def allreduce_after_backward(params):
    """All gradients in one flat buffer, all-reduced once backward has finished."""
    def run():
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    return run


def overlap(batch: int, width: int, steps: int) -> dict:
    """Step times of one model with six ways of communicating its gradients, ``steps`` repeats
    each, taken in interleaved rounds (one step of every variant per round, a barrier before
    each), every repeat the slowest rank's time."""
    torch.manual_seed(0)
    world = dist.get_world_size()
    X = torch.randn(max(1, batch // world), 1, 28, 28)
    y = torch.randint(0, 10, (len(X),))

    def net():
        n = d2l.resnet18(num_classes=10, width=width)
        d2l.canonical_init(n, d2lmini.resnet18_init(width=width, seed=0))
        return n
    grad_bytes = sum(p.numel() * 4 for p in net().parameters())
    out = {"grad_bytes": grad_bytes, "per_rank_batch": len(X), "width": width, "steps": steps}
    plain, plain_after = net(), net()
    calls = {"compute only": make_step(plain, X, y),
             "all-reduce after backward": make_step(
                 plain_after, X, y, after=allreduce_after_backward(list(plain_after.parameters())))}
    model_mb = grad_bytes / 2**20
    for name, cap in (("DDP, small buckets", model_mb / 8), ("DDP, default buckets (25 MiB)", 25),
                      ("DDP, one huge bucket", 10 * model_mb + 100)):
        calls[name] = make_step(DDP(net(), bucket_cap_mb=cap), X, y)
        out[name + " bucket_cap_mb"] = cap
    quiet = DDP(net())
    quiet_step = make_step(quiet, X, y)

    def no_sync_step():
        with quiet.no_sync():                 # DDP without its hooks: no communication at all
            quiet_step()
    calls["DDP no_sync (no communication)"] = no_sync_step
    times = cc.time_interleaved(calls, warmup=1, repeats=steps, before=dist.barrier)
    out.update({name: slowest(t) for name, t in times.items()})
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cc.add_worker_arguments(p)
    p.add_argument("--timeout", type=float, default=120)
    args = p.parse_args()
    torch.set_num_threads(1)                  # k processes share the machine's cores
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    cc.rank_sweep(args, rank=dist.get_rank(), k=dist.get_world_size(),
                  time_allreduce=time_allreduce, check_sum=check_sum, slowest=slowest,
                  barrier=dist.barrier, overlap=overlap)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

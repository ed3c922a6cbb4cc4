"""Data-parallel training of the ResNet-18 variant with DistributedDataParallel (DDP).

One process ("rank") per device.  The same file is launched in two ways:

    python -m torch.distributed.run --nproc_per_node 2 --master_port PORT ddp_train.py --out DIR
    python ddp_train.py --launcher spawn --nprocs 2 --master-port PORT --out DIR

Backend: ``nccl`` with one GPU per rank when the node has enough GPUs, else ``gloo`` (ranks
sharing GPUs, or on the CPU).  Hyper-parameters default to the profile's (``--profile`` or
``$D2LMINI_PROFILE``, ``P.concise``); arguments override them, so one file serves the smoke,
cpu and gpu profiles.

Every rank writes ``DIR/rank{r}.json`` (losses, accuracies, epoch times, a checksum of its
parameters); rank 0 also writes ``DIR/checkpoint.pt`` (CPU tensors, no device baked in) and
the predictions of the trained model on the first test images; all ranks together write the
same model as a distributed checkpoint, ``DIR/dcp`` (``torch.distributed.checkpoint``).
The model starts from the book's shared initial weights (``d2lmini.resnet18_init``), and is
evaluated by the book's BatchNorm rule (``d2l.recalibrate_batchnorm``).

What is not the lesson -- the notebook's BatchNorm proof and the tests' fault injection --
is in ``ddp_checks.py``, which runs this file's ranks with other work.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import d2lmini
from d2lmini import torch as d2l


# ------------------------------------------------------------------------ process group
def setup(timeout_s: float) -> torch.device:
    """Join the process group described by the environment (RANK, WORLD_SIZE, MASTER_*)."""
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= local_world:               # one GPU per rank: NCCL
        device, backend = torch.device("cuda", local_rank), "nccl"
    elif gpus > 0:                        # ranks share GPUs: NCCL refuses that, gloo does not
        device, backend = torch.device("cuda", local_rank % gpus), "gloo"
    else:                                 # no GPU: every rank computes on the CPU
        device, backend = torch.device("cpu"), "gloo"
    if device.type == "cuda":
        torch.accelerator.set_device_index(device.index)   # before NCCL touches a GPU
    # A crashed peer closes its connections and gloo raises at once; the timeout covers a
    # peer that is alive but never joins the collective: the others raise after it (NCCL
    # aborts its communicator) instead of waiting forever.
    dist.init_process_group(backend, init_method="env://",
                            timeout=datetime.timedelta(seconds=timeout_s))
    return device


def cross_rank_batchnorm(net: nn.Module, device: torch.device) -> nn.Module:
    """BatchNorm over the batch of all ranks: PyTorch's SyncBatchNorm on GPUs; on the CPU,
    where SyncBatchNorm refuses to run, the all-reduce version of d2lmini.torch."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(net)
    return d2l.convert_allreduce_batchnorm(net)


def checksum(tensors) -> str:
    """SHA-256 of the bytes of the tensors: equal iff every element is bit-identical."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


# ------------------------------------------------------------------------ evaluation
@torch.no_grad()
def evaluate(net: nn.Module, X, y, device, batch_size: int = 256) -> float:
    """Test accuracy with the test set split across all ranks, exactly once each.

    Rank r evaluates the contiguous shard r (sizes differ by at most one: no padding, no
    duplicates, unlike DistributedSampler); one all-reduce sums the counts.  ``net`` is the
    bare module (``model.module``): the DDP wrapper's forward may broadcast buffers, a
    collective that evaluation does not need.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    shard = d2lmini.shard_slices(len(y), world)[rank]
    net.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)  # correct, seen
    for Xb, yb in d2lmini.BatchIterator(X[shard], y[shard], batch_size):
        Xb, yb = torch.from_numpy(Xb).to(device), torch.from_numpy(yb).to(device)
        counts[0] += (net(Xb).argmax(dim=1) == yb).sum()
        counts[1] += len(yb)
    dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    return float(counts[0] / counts[1])


# ------------------------------------------------------------------------ training
def train_step(model, loss_fn, optimizer, X, y):
    """One SGD step on this rank's shard (X, y); returns its mean loss and the predictions."""
    optimizer.zero_grad(set_to_none=True)
    y_hat = model(X)
    loss = loss_fn(y_hat, y)
    loss.backward()                           # gradients averaged over the ranks here
    optimizer.step()                          # identical update on every rank
    return loss, y_hat


def train(args, device: torch.device) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    data = d2lmini.load_fashion_mnist(args.train_samples or None, args.test_samples or None)
    train_set = TensorDataset(torch.from_numpy(data.X_train), torch.from_numpy(data.y_train))
    # Each rank draws a disjoint 1/world of every epoch's permutation (the same permutation
    # on every rank: it is seeded by seed + epoch, hence set_epoch below).
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed)
    per_rank = args.batch_size // world
    if per_rank < 1:
        raise ValueError(f"global batch {args.batch_size} < {world} ranks")
    # In-memory tensors: the main process loads them (workers would only add copies between
    # processes); page-locked host memory lets .to(device, non_blocking=True) overlap the copy.
    loader = DataLoader(train_set, batch_size=per_rank, sampler=sampler,
                        pin_memory=device.type == "cuda")

    net = d2l.resnet18(num_classes=10, width=args.width)  # the book's shared initial weights
    d2l.canonical_init(net, d2lmini.resnet18_init(width=args.width, seed=args.seed))
    if args.bn == "sync":
        net = cross_rank_batchnorm(net, device)
    net = net.to(device)
    # DDP broadcasts rank 0's parameters and buffers now, and all-reduces (averages) the
    # gradients bucket by bucket during backward().
    model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()           # mean over the rank's shard

    log = {k: [] for k in ("epoch_s", "train_loss", "train_acc", "test_acc",
                           "epoch_param_sha256")}
    calibration = d2lmini.calibration_batches(data.X_train, data.y_train, args.batch_size,
                                              args.bn_batches) if args.bn_batches else []
    timer, step = d2lmini.Timer(), 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)              # else every epoch repeats epoch 0's order
        model.train()
        sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, correct
        samples = 0                           # counted on the host: nothing to copy per step
        d2l.synchronize([device])
        timer.start()
        for X, y in loader:
            X, y = X.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss, y_hat = train_step(model, loss_fn, optimizer, X, y)
            with torch.no_grad():
                sums += torch.stack([loss.double() * len(y),
                                     (y_hat.argmax(dim=1) == y).sum().double()])
            samples += len(y)
            step += 1
        d2l.synchronize([device])
        log["epoch_s"].append(timer.stop())
        totals = torch.cat([sums, torch.tensor([float(samples)], dtype=torch.float64,
                                               device=device)])   # loss sum, correct, n
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        log["train_loss"].append(float(totals[0] / totals[2]))
        log["train_acc"].append(float(totals[1] / totals[2]))
        log["epoch_param_sha256"].append(checksum(model.module.parameters()))
        trained_buffers = checksum(model.module.buffers())
        # The book's evaluation rule: BatchNorm statistics of the final weights, re-estimated
        # on the same whole batches on every rank (so every rank holds the same model).
        d2l.recalibrate_batchnorm(model.module, calibration, device)
        # Evaluation is a check (the notebook compares it with a reloaded checkpoint on the
        # CPU), so it runs exact: without TF32 a GPU's logits match the CPU's to float32.
        with d2l.exact_numerics():
            log["test_acc"].append(evaluate(model.module, data.X_test, data.y_test, device))
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {log['train_loss'][-1]:.3f}, train acc "
                  f"{log['train_acc'][-1]:.3f}, test acc {log['test_acc'][-1]:.3f}, "
                  f"{log['epoch_s'][-1]:.1f} s", flush=True)

    result = dict(log, steps=step, samples_per_epoch=int(totals[2]),
                  trained_buffer_sha256=trained_buffers,
                  per_rank_batch=per_rank, global_batch=per_rank * world,
                  param_sha256=checksum(model.module.parameters()),
                  buffer_sha256=checksum(model.module.buffers()))
    # The current API, the one sharded models need: every rank takes part and writes what it
    # owns (a replicated tensor once); the files load at any number of processes.
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=Path(args.out) / "dcp")
    if rank == 0:
        # One checkpoint, from rank 0 (all ranks hold the same parameters), as CPU tensors
        # of the bare module: no "module." prefix, no device ids baked in.
        state = {k: v.detach().cpu() for k, v in model.module.state_dict().items()}
        torch.save({"state_dict": state, "width": args.width, "num_classes": 10},
                   Path(args.out) / "checkpoint.pt")
        with torch.no_grad(), d2l.exact_numerics():
            model.module.eval()
            X0 = torch.from_numpy(data.X_test[:args.predict]).to(device)
            logits = model.module(X0).cpu()
        result["logits"] = logits.tolist()
        result["predictions"] = logits.argmax(dim=1).tolist()
    return result


# ------------------------------------------------------------------------ entry points
def run_rank(args, work=None) -> None:
    """The work of one rank (``train``, unless ``work`` says otherwise: ddp_checks.py);
    RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT are set."""
    device = setup(args.timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        result = (work or train)(args, device)
        result.update(rank=rank, world_size=world, backend=dist.get_backend(),
                      device_type=device.type, launcher=args.launcher,
                      threads=torch.get_num_threads(),
                      omp_num_threads=os.environ.get("OMP_NUM_THREADS"))
        path = Path(args.out) / f"rank{rank}.json"
        path.write_text(json.dumps(result))
    except BaseException:
        # A launcher reports the first process to exit, which may be a peer failing on the
        # closed connection: every rank prints its own error, so the log always holds it.
        print(f"rank {rank}: {traceback.format_exc()}", file=sys.stderr, flush=True)
        # Then it leaves at once. Letting Python unwind would free DDP's reducer and its
        # gloo group, whose teardown can wait for a peer still inside a collective, up to
        # the collective timeout; the closed connections are how the peers learn of it.
        sys.stdout.flush()
        os._exit(1)
    dist.destroy_process_group()


def spawn_worker(local_rank: int, nprocs: int, args, work=None) -> None:
    """Entry point of a process started by torch.multiprocessing.spawn (defined at the top
    level of a file, so that the fresh interpreter of each rank can import it)."""
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank),
                      WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs))
    run_rank(args, work)


def parse_args(argv=None, parser=None):
    p = parser or argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--profile", default=None, help="smoke | cpu | gpu (default: "
                   "$D2LMINI_PROFILE, else by hardware); supplies the defaults below")
    p.add_argument("--epochs", type=int)
    p.add_argument("--batch-size", type=int, help="global batch (split over the ranks)")
    p.add_argument("--lr", type=float)
    p.add_argument("--width", type=int, help="channels of ResNet-18's first stage")
    p.add_argument("--train-samples", type=int, help="0: all 60,000")
    p.add_argument("--test-samples", type=int, help="0: all 10,000")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bn", choices=["local", "sync"], default="local",
                   help="per-rank BatchNorm statistics, or cross-rank (SyncBatchNorm)")
    p.add_argument("--bn-batches", type=int, default=5, help="whole batches to re-estimate "
                   "the BatchNorm statistics on before each evaluation (0: keep them)")
    p.add_argument("--predict", type=int, default=64, help="rank 0 saves the predictions "
                   "of the trained model on this many test images")
    p.add_argument("--out", required=True, help="directory for rank{r}.json, checkpoint.pt")
    p.add_argument("--timeout", type=float, default=120.0, help="collective timeout (s)")
    p.add_argument("--launcher", choices=["torchrun", "spawn"], default="torchrun",
                   help="torchrun: the environment comes from torchrun; spawn: start "
                   "--nprocs ranks here with torch.multiprocessing.spawn")
    p.add_argument("--nprocs", type=int, default=2, help="ranks to spawn (spawn only)")
    p.add_argument("--master-port", type=int, default=29500, help="(spawn only)")
    args = p.parse_args(argv)
    hp = d2lmini.get_profile(args.profile).concise
    for name in ("epochs", "batch_size", "lr", "width", "train_samples", "test_samples"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(hp, name))
    return args


@record  # under torchrun: a rank's traceback goes into the launcher's error summary
def main(argv=None, args=None, work=None) -> None:
    args = args or parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.launcher == "torchrun":
        if "RANK" not in os.environ:
            sys.exit(f"{Path(sys.argv[0]).name}: RANK is not set; start it with torchrun "
                     "(python -m torch.distributed.run ...) or with --launcher spawn")
        run_rank(args, work)
        return
    # torch.multiprocessing.spawn: this process only starts the ranks and waits for them.
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(args.master_port)
    if args.nprocs > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # what torchrun does
    # join=True: if a rank fails, spawn terminates the others and re-raises its error here.
    mp.spawn(spawn_worker, args=(args.nprocs, args, work), nprocs=args.nprocs, join=True)


if __name__ == "__main__":
    main()

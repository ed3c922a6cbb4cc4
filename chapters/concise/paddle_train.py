"""Data-parallel training of the ResNet-18 variant on Fashion-MNIST with PaddlePaddle.

One process ("rank") per device; every rank holds a full replica of the model, trains on its
own part of every global batch, and ``paddle.DataParallel`` all-reduces the gradients.  The
collective backend is chosen by Paddle: NCCL when the ranks own GPUs, gloo on CPUs.

Three ways to run it (the chapter's notebook uses all three):

    # one process per device, started by Paddle's launcher on this node (it picks the
    # rendezvous port; several nodes add --master IP:PORT --nnodes N, GPUs --devices 0,1,...)
    python -m paddle.distributed.launch --nnodes 1 --nproc_per_node 2 --log_dir LOGS \\
        paddle_train.py --out DIR [options]
    # the same, started from this file by paddle.distributed.spawn
    python paddle_train.py --launcher spawn --nprocs 2 --port PORT --out DIR [options]
    # one process, one device, no collective at all
    python paddle_train.py --out DIR [options]

Every rank writes ``DIR/rank{r}.json``: its per-step losses, epoch times, the test accuracy
and SHA-256 checksums of its parameters.  ``--save PATH`` makes rank 0 write a
device-independent checkpoint; ``--save_dist DIR`` makes all ranks write a distributed one
(``paddle.distributed.save_state_dict``), which loads at any number of ranks.  Hyper-parameters default to the d2lmini profile
(``D2LMINI_PROFILE``).  The model starts from the book's shared initial weights
(``d2lmini.resnet18_init``) and is evaluated by the book's BatchNorm rule
(``d2l.recalibrate_batchnorm``).  What is not the lesson -- the chapter's "k devices == 1
device" proof and the tests' fault injection -- is in ``paddle_checks.py``, which runs this
file's ranks with other work.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import traceback

import numpy as np

import d2lmini
from d2lmini import paddle as d2l   # imports paddle first (and filters its import warning)
import paddle
import paddle.distributed as dist
from paddle import nn


def parse_args(argv=None, parser=None):
    P = d2lmini.get_profile().concise
    p = parser or argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for rank{r}.json")
    p.add_argument("--data", default=None,
                   help=".npz with X_train, y_train, X_test, y_test (default: load Fashion-"
                        "MNIST with --train_samples/--test_samples)")
    p.add_argument("--train_samples", type=int, default=P.train_samples or 0, help="0: all")
    p.add_argument("--test_samples", type=int, default=P.test_samples or 0, help="0: all")
    p.add_argument("--epochs", type=int, default=P.epochs)
    p.add_argument("--batch_size", type=int, default=P.batch_size,
                   help="GLOBAL batch size; each rank gets batch_size / world_size")
    p.add_argument("--lr", type=float, default=P.lr)
    p.add_argument("--width", type=int, default=P.width)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sync_bn", action="store_true", help="cross-device BatchNorm")
    p.add_argument("--save", default=None, help="rank 0 saves a checkpoint to this path")
    p.add_argument("--save_dist", default=None,
                   help="all ranks save a distributed checkpoint into this directory")
    p.add_argument("--bn_batches", type=int, default=5, help="whole batches to re-estimate "
                   "BatchNorm's statistics on before each evaluation (0: keep them)")
    p.add_argument("--launcher", choices=["none", "spawn"], default="none",
                   help="spawn: start --nprocs ranks with paddle.distributed.spawn")
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--port", type=int, default=None, help="rendezvous port for spawn")
    return p.parse_args(argv)


# --- Devices and replication --------------------------------------------------------------

def setup():
    """Join the process group (when there is more than one rank); pick this rank's device."""
    if dist.get_world_size() > 1:       # read from the environment the launcher set
        dist.init_parallel_env()        # NCCL for GPUs, gloo for CPUs; TCP rendezvous
    if d2l.num_gpus():
        paddle.set_device(f"gpu:{dist.ParallelEnv().device_id}")
    else:
        paddle.set_device("cpu")
    return dist.get_rank(), dist.get_world_size()


def replicate(net):
    """With several ranks, wrap the model so that backward() also averages the gradients.

    Wrapping broadcasts rank 0's parameters to all ranks, so the replicas start identical
    even if the ranks initialized them differently."""
    return paddle.DataParallel(net) if dist.get_world_size() > 1 else net


# --- Splitting and sampling ---------------------------------------------------------------

class ArrayDataset(paddle.io.Dataset):
    def __init__(self, X, y):
        self.X, self.y = X, y

    def __getitem__(self, i):
        return self.X[i], self.y[i]

    def __len__(self):
        return len(self.y)


def make_train_loader(X, y, batch_size, rank, world_size):
    """Rank r's part of every global batch of ``batch_size`` samples."""
    if batch_size % world_size:
        raise ValueError(f"the global batch size {batch_size} is not divisible by the "
                         f"number of ranks {world_size}")
    dataset = ArrayDataset(X, y)
    sampler = paddle.io.DistributedBatchSampler(
        dataset, batch_size=batch_size // world_size,      # the PER-RANK batch size
        num_replicas=world_size, rank=rank, shuffle=True)
    return sampler, paddle.io.DataLoader(dataset, batch_sampler=sampler)


# --- The training step --------------------------------------------------------------------

def train_step(model, loss_fn, optimizer, X, y):
    """One data-parallel step on this rank's shard (X, y).

    The loss is the mean over the shard.  In backward(), DataParallel all-reduces the
    gradients (in buckets, while backpropagation is still running) and divides them by the
    number of ranks: with equal shards that is the gradient of the mean loss over the
    global batch, so every replica applies the same update."""
    y_hat = model(X)
    loss = loss_fn(y_hat, y)
    loss.backward()
    optimizer.step()
    optimizer.clear_grad()
    correct = (y_hat.argmax(axis=1) == y).astype("float32").sum()
    return loss.detach(), correct       # on the device: no float(), the host does not wait


def trainable(net):
    return [(n, p) for n, p in net.named_parameters() if p.trainable]


def running_stats(net):
    """BatchNorm's running means and variances.  In Paddle they are *non-trainable
    parameters* (``net.buffers()`` is empty); DataParallel does not keep them in sync."""
    return [(n, p) for n, p in net.named_parameters() if not p.trainable]


def checksum(named_tensors):
    """SHA-256 of named tensors: a bit-exact comparison across ranks and runs."""
    h = hashlib.sha256()
    for name, t in sorted(named_tensors, key=lambda nt: nt[0]):
        h.update(name.encode())
        h.update(np.ascontiguousarray(t.numpy()).tobytes())
    return h.hexdigest()


# --- Evaluation ---------------------------------------------------------------------------

@paddle.no_grad()
def evaluate(net, X, y, rank, world_size, batch_size=256):
    """Test accuracy over ALL ranks: rank r scores its contiguous shard of the test set
    (no image twice, none left out), then the counts are summed with an all-reduce."""
    net.eval()
    part = d2lmini.shard_slices(len(y), world_size)[rank]
    Xr, yr = X[part], y[part]
    correct = sum(d2l.accuracy(net(paddle.to_tensor(Xr[i:i + batch_size])),
                               paddle.to_tensor(yr[i:i + batch_size]))
                  for i in range(0, len(yr), batch_size))
    counts = paddle.to_tensor([correct, float(len(yr))], dtype="float64")
    if world_size > 1:
        dist.all_reduce(counts)
    net.train()
    return float(counts[0] / counts[1])


# --- Checkpoints --------------------------------------------------------------------------

def save_checkpoint(net, path):
    """Plain NumPy arrays: no device, no process group, no DataParallel wrapper."""
    paddle.save({name: t.numpy() for name, t in net.state_dict().items()}, path)


def save_distributed(net, path):
    """Every rank calls it (a collective).  Each tensor is written once, by one of the ranks
    that hold it, into that rank's file; ``path/0.metadata`` records which file holds which
    piece of which tensor, so ``dist.load_state_dict`` can load it at any number of ranks."""
    dist.save_state_dict(net.state_dict(), path)


# --- The whole run ------------------------------------------------------------------------

def load_data(args):
    if args.data:                   # the arrays the notebook already loaded and verified
        with np.load(args.data) as z:
            return d2lmini.FashionMNIST(z["X_train"], z["y_train"], z["X_test"],
                                        z["y_test"], source=args.data)
    return d2lmini.load_fashion_mnist(args.train_samples or None, args.test_samples or None)


def train(args):
    rank, world_size = setup()
    data = load_data(args)
    net = d2l.resnet18(num_classes=10, width=args.width, sync_bn=args.sync_bn)
    d2l.canonical_init(net, d2lmini.resnet18_init(width=args.width, seed=args.seed))
    model = replicate(net)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = paddle.optimizer.SGD(learning_rate=args.lr, parameters=model.parameters())
    sampler, loader = make_train_loader(data.X_train, data.y_train, args.batch_size,
                                        rank, world_size)
    env = ("PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_MASTER",
           "PADDLE_DISTRI_BACKEND", "OMP_NUM_THREADS")
    log = {"rank": rank, "world_size": world_size, "batch_size": args.batch_size,
           "lr": args.lr, "epochs": args.epochs, "train_samples": len(data.y_train),
           "env": {k: os.environ.get(k) for k in env},
           "steps": [],                 # [epoch, loss sum, correct, shard size] per step
           "epoch_seconds": [], "test_acc": [],
           "params_sha256": [], "running_stats_sha256": [], "recalibrated_sha256": []}
    calibration = d2lmini.calibration_batches(data.X_train, data.y_train, args.batch_size,
                                              args.bn_batches) if args.bn_batches else []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)        # the same permutation on every rank, new each epoch
        model.train()
        timer = d2lmini.Timer()
        timer.start()
        steps, sizes = [], []
        for X, y in loader:
            steps.append(paddle.stack(train_step(model, loss_fn, optimizer, X, y)))
            sizes.append(len(y))
        d2l.synchronize()
        log["epoch_seconds"].append(timer.stop())
        for (loss, correct), n in zip(paddle.stack(steps).numpy().tolist(), sizes):
            log["steps"].append([epoch, loss * n, correct, n])   # one copy, after the epoch
        log["params_sha256"].append(checksum(trainable(net)))
        log["running_stats_sha256"].append(checksum(running_stats(net)))
        # The book's evaluation rule: BatchNorm statistics of the final weights, re-estimated
        # on the same whole batches on every rank (so every rank holds the same model).
        d2l.recalibrate_batchnorm(net, calibration)
        log["recalibrated_sha256"].append(checksum(running_stats(net)))
        log["test_acc"].append(evaluate(net, data.X_test, data.y_test, rank, world_size))
    if args.save and rank == 0:
        save_checkpoint(net, args.save)
        net.eval()
        with paddle.no_grad():          # reference predictions for the notebook
            logits = net(paddle.to_tensor(data.X_test[:64])).numpy()
        np.save(os.path.splitext(args.save)[0] + "_logits.npy", logits)
    if args.save_dist:
        save_distributed(net, args.save_dist)
    write_json(args.out, rank, log)


def write_json(out, rank, obj):
    tmp = os.path.join(out, f".rank{rank}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, os.path.join(out, f"rank{rank}.json"))     # never a half-written file


def worker(args, work=None):
    """What every rank runs (``train``, unless ``work`` says otherwise: paddle_checks.py).
    A failing rank prints its own traceback, tagged with its rank, before it dies (spawn
    would otherwise report only the first process it saw exit)."""
    try:
        (work or train)(args)
    except BaseException:
        print(f"[rank {os.environ.get('PADDLE_TRAINER_ID', '0')}] failed:", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        raise


def main(argv=None, args=None, work=None):
    args = args or parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.launcher == "spawn":
        if args.port is not None:       # where rank 0 serves the rendezvous (TCP store)
            os.environ["PADDLE_MASTER"] = f"127.0.0.1:{args.port}"
        # spawn pickles `worker` by reference: each child imports it from this file.
        dist.spawn(worker, args=(args, work), nprocs=args.nprocs)
    else:
        worker(args, work)


if __name__ == "__main__":
    main()

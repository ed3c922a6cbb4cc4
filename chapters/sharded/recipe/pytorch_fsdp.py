"""The sharded chapter's recipe in PyTorch: pytorch_dp.py with FSDP2 instead of DDP.  ResNet-18
on Fashion-MNIST with plain SGD, from d2lmini's canonical initial weights, on k processes; each
rank keeps 1/k of the parameters, gradients and optimizer state (``fully_shard``, ZeRO-3), and a
DCP checkpoint is saved after every epoch and resumed from.  Copied alone, it needs PyTorch and
NumPy only: PyTorch's initial weights (seeded), the data files in --data.

    torchrun --nproc_per_node k pytorch_fsdp.py [--epochs N ...] [--checkpoint DIR]
"""
import argparse
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

try:                                      # the book's package: settings, data, initial weights
    import d2lmini
except ImportError:                       # this file copied alone: see its end
    d2lmini = None
if d2lmini:
    from d2lmini import recipe
    from d2lmini import torch as d2l


def train_step(model, loss_fn, optimizer, X, y):
    """One SGD step on the batch (X, y); returns its mean loss (on the device)."""
    optimizer.zero_grad()
    loss = loss_fn(model(X), y)           # each block gathers its parameters, then frees them
    loss.backward()                       # gathers them again; reduce-scatters (averages) grads
    optimizer.step()                      # each rank updates its own 1/k of every parameter
    return loss.detach()                  # no .item(): the host does not wait for every step


@torch.no_grad()
def evaluate(net, X, y, device, batch_size=256):
    """Accuracy of rank 0's replica on the whole test set, in inference mode: every rank
    evaluates a contiguous shard and one all-reduce sums the counts.  Every rank runs the same
    number of forward passes: each one all-gathers the blocks, with every rank taking part."""
    for b in net.buffers():               # BatchNorm's running statistics: rank 0's, on all
        dist.broadcast(b, src=0)
    net.eval()
    k, rank = dist.get_world_size(), dist.get_rank()
    batches = range(0, -(-len(y) // k), batch_size)                 # the longest shard's
    X, y = np.array_split(X, k)[rank], np.array_split(y, k)[rank]   # contiguous, even shards
    counts = torch.zeros(2, dtype=torch.int64, device=device)      # correct, seen
    for i in batches:
        y_hat = net(torch.from_numpy(X[i:i + batch_size]).to(device))
        counts[0] += (y_hat.argmax(1) == torch.from_numpy(y[i:i + batch_size]).to(device)).sum()
        counts[1] += len(y[i:i + batch_size])
    dist.all_reduce(counts)
    return counts[0].item() / counts[1].item()


def save(model, optimizer, epoch, path):
    """A DCP checkpoint of the epoch: every rank writes its shards, none gathers the model."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state, "epoch": epoch},
             checkpoint_id=path)


def load(model, optimizer, path):
    """Loads a checkpoint of :func:`save` into the sharded model and optimizer (any k: DCP
    reshards); returns the epoch it was saved after."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state, "epoch": -1}
    dcp.load(state, checkpoint_id=path)   # in place, each rank reading its own shards
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
    return state["epoch"]


def parse_args():
    """The recipe's command line, and the sharded one's own options."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--checkpoint", default=None, help="save to DIR/epoch_<n> after every epoch "
                   "and resume from the last one there")
    p.add_argument("--momentum", type=float, default=0.0, help="SGD's (its state is sharded too)")
    p.add_argument("--param-dtype", choices=["float32", "bfloat16"], default=None,
                   help="the dtype blocks are gathered and compute in (default: bfloat16 on "
                   "GPUs, float32 on the CPU)")
    own, rest = p.parse_known_args()
    return argparse.Namespace(**vars(recipe.parse_args(rest)), **vars(own))


def main():
    args = parse_args()
    data = recipe.load_data(args)
    rank, k = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])  # set by torchrun
    gpus = d2l.num_gpus()                 # fewer GPUs than ranks: they share them, with gloo
    device = (torch.device("cuda", int(os.environ["LOCAL_RANK"]) % gpus) if gpus
              else torch.device("cpu"))
    nccl = gpus >= int(os.environ["LOCAL_WORLD_SIZE"])             # a GPU for every rank
    if gpus:
        torch.accelerator.set_device_index(device.index)           # before NCCL touches a GPU
    dist.init_process_group("nccl" if nccl else "gloo", device_id=device if nccl else None)
    if args.batch_size % k:
        raise ValueError(f"the global batch size {args.batch_size} is not divisible by k = {k}")
    batch_size = args.batch_size // k     # each of the k devices gets 1/k of the global batch
    torch.manual_seed(args.seed)          # the same model on every rank: fully_shard keeps
    net = d2l.resnet18(10, 1, width=args.width)   # each rank's slice of its own (DDP broadcasts)
    if d2lmini:                           # the same initial weights in every framework
        d2l.canonical_init(net, d2lmini.resnet18_init(width=args.width, seed=args.seed))
    total = sum(p.numel() * p.element_size() for p in net.parameters())
    mesh = init_device_mesh(device.type, (k,))       # the k ranks, one dimension: pure sharding
    # Mixed precision: each unit is gathered in param_dtype from its float32 shards (the master
    # copy) and computes in it; its gradient is reduce-scattered in reduce_dtype.  reduce_dtype
    # is explicit: left None it follows param_dtype, and bfloat16 would reduce-scatter the
    # gradients in bfloat16.  bfloat16 is the default on GPUs (unconfirmed on GPU by this book);
    # float32 on the CPU, where PyTorch emulates bfloat16, many times slower without AVX-512.
    param_dtype = args.param_dtype or ("bfloat16" if gpus else "float32")
    mp = MixedPrecisionPolicy(param_dtype=getattr(torch, param_dtype), reduce_dtype=torch.float32)
    # BatchNorm computes in float32, as its running statistics are: each a unit of its own.
    if param_dtype != "float32":
        for bn in [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]:
            fully_shard(bn, mesh=mesh, mp_policy=MixedPrecisionPolicy(cast_forward_inputs=False))
    for block in [m for m in net.modules() if isinstance(m, d2l.Residual)]:
        fully_shard(block, mesh=mesh, mp_policy=mp)  # a unit: gathered when it runs, then freed
    model = fully_shard(net.to(device), mesh=mesh, mp_policy=mp)    # the root: the rest
    held = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    print(f"rank {rank} holds {held} of the {total} parameter bytes", flush=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr,     # after sharding: its state
                                momentum=args.momentum)             # is sharded like them
    loss_fn = nn.CrossEntropyLoss()
    start_epoch = 0
    if args.checkpoint and os.path.isdir(args.checkpoint):          # resume from the last epoch
        saved = sorted((int(d.split("_")[1]), d) for d in os.listdir(args.checkpoint)
                       if d.startswith("epoch_"))
        if saved:
            start_epoch = load(model, optimizer, os.path.join(args.checkpoint, saved[-1][1]))
    train_set = TensorDataset(torch.from_numpy(data.X_train), torch.from_numpy(data.y_train))
    sampler = DistributedSampler(train_set, num_replicas=k, rank=rank, seed=args.seed)
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler,
                        pin_memory=device.type == "cuda")
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)          # a new order each epoch, the same on all ranks
        model.train()
        start, losses = time.perf_counter(), []
        for X, y in loader:
            losses.append(train_step(model, loss_fn, optimizer, X.to(device, non_blocking=True),
                                     y.to(device, non_blocking=True)))
        loss = torch.stack(losses).mean()
        dist.all_reduce(loss)             # the sum of the k ranks' mean losses
        loss = loss.item() / k            # one wait, for the last step
        seconds = time.perf_counter() - start
        test_acc = evaluate(net, data.X_test, data.y_test, device)    # every rank, its shard
        if args.checkpoint:               # after evaluate, which gave every rank rank 0's
            # BatchNorm statistics: DCP saves a replicated tensor once, from any one rank
            save(model, optimizer, epoch + 1, os.path.join(args.checkpoint, f"epoch_{epoch + 1}"))
        if rank == 0:
            recipe.report(args, epoch, loss, test_acc, devices=k,
                          framework=d2l.FRAMEWORK, seconds=seconds)
    dist.destroy_process_group()


# -- This file copied alone, without the book's package d2lmini: what it takes from d2lmini. ---
if d2lmini is None:
    import argparse
    import gzip
    from types import SimpleNamespace

    def _parse_args(argv=None):
        """The command line; by default, 10 epochs on all of Fashion-MNIST."""
        p = argparse.ArgumentParser(description=__doc__)
        p.add_argument("--data", default=os.environ.get("D2LMINI_DATA", "fashion-mnist"),
                       help="the directory of the four Fashion-MNIST files (.gz)")
        for name, default in dict(epochs=10, batch_size=256, lr=0.1, width=64,
                                  train_samples=60000, test_samples=10000, seed=0).items():
            p.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
        return p.parse_args(argv)

    def load_data(args):
        """The first --train-samples and --test-samples of Fashion-MNIST, read from the
        upstream files in --data: images NCHW float32 in [0, 1], labels int64."""
        def read(name, n):
            path = os.path.join(args.data, name)
            if not os.path.isfile(path):
                raise SystemExit(f"{path} is missing: download the four files of https://"
                                 "github.com/zalandoresearch/fashion-mnist into a directory "
                                 "and pass it as --data")
            with gzip.open(path) as f:           # IDX: a header of 16 (images) or 8 bytes
                raw = np.frombuffer(f.read(), np.uint8)
            if "images" in name:
                return raw[16:].reshape(-1, 1, 28, 28)[:n].astype(np.float32) / 255
            return raw[8:][:n].astype(np.int64)
        n, m = args.train_samples, args.test_samples
        return SimpleNamespace(X_train=read("train-images-idx3-ubyte.gz", n),
                               y_train=read("train-labels-idx1-ubyte.gz", n),
                               X_test=read("t10k-images-idx3-ubyte.gz", m),
                               y_test=read("t10k-labels-idx1-ubyte.gz", m))

    def report(args, epoch, loss, test_acc, devices, framework, seconds):
        print(f"epoch {epoch + 1}: loss {loss:.3f}, test accuracy {test_acc:.3f} "
              f"({devices} device{'s' if devices != 1 else ''}, {seconds:.1f} s)", flush=True)

    recipe = SimpleNamespace(parse_args=_parse_args, load_data=load_data, report=report)

    class Residual(nn.Module):
        """Two 3x3 convolutions and the shortcut (a 1x1 convolution where the block strides)."""
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout))
            self.shortcut = nn.Conv2d(cin, cout, 1, stride) if stride > 1 else nn.Identity()

        def forward(self, X):
            return torch.relu(self.body(X) + self.shortcut(X))

    def resnet18(num_classes, in_channels, width):
        """ResNet-18 for 28x28 images (a 3x3 stem, no max-pooling), PyTorch's initial weights."""
        c = [width] + [width * 2 ** (i // 2) for i in range(8)]   # the stem's, the 8 blocks'
        return nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            *[Residual(cin, cout, 2 if cout > cin else 1) for cin, cout in zip(c, c[1:])],
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * width, num_classes))

    d2l = SimpleNamespace(
        FRAMEWORK="torch", resnet18=resnet18, Residual=Residual, num_gpus=torch.cuda.device_count,
        try_gpu=lambda: torch.device("cuda:0" if torch.cuda.is_available() else "cpu"))


if __name__ == "__main__":
    main()

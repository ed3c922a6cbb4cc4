"""The concise chapter's recipe in PyTorch: ResNet-18 on Fashion-MNIST with plain SGD, from
d2lmini's canonical initial weights, on k processes with DistributedDataParallel.

    torchrun --nproc_per_node k pytorch_dp.py [--epochs N ...]    # a GPU per process, or the CPU
"""
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import d2lmini
from d2lmini import recipe
from d2lmini import torch as d2l


def train_step(model, loss_fn, optimizer, X, y):
    """One SGD step on the batch (X, y); returns its mean loss (on the device)."""
    optimizer.zero_grad()
    loss = loss_fn(model(X), y)
    loss.backward()                       # DDP all-reduces (averages) the gradients here
    optimizer.step()
    return loss.detach()                  # no .item(): the host does not wait for every step


@torch.no_grad()
def evaluate(net, X, y, device, batch_size=256):
    """Accuracy of rank 0's replica on the whole test set, in inference mode: every rank
    evaluates a contiguous shard and one all-reduce sums the counts, so that no rank waits in
    a collective while another evaluates alone (a wait longer than NCCL's timeout ends the job)."""
    for b in net.buffers():               # BatchNorm's running statistics: rank 0's, on all
        dist.broadcast(b, src=0)
    net.eval()
    shard = d2lmini.shard_slices(len(y), dist.get_world_size())[dist.get_rank()]
    X, y = X[shard], y[shard]
    counts = torch.zeros(2, dtype=torch.int64, device=device)      # correct, seen
    for i in range(0, len(y), batch_size):
        y_hat = net(torch.from_numpy(X[i:i + batch_size]).to(device))
        counts[0] += (y_hat.argmax(1) == torch.from_numpy(y[i:i + batch_size]).to(device)).sum()
        counts[1] += len(y[i:i + batch_size])
    dist.all_reduce(counts)
    return counts[0].item() / counts[1].item()


def main():
    args = recipe.parse_args()
    data = recipe.load_data(args)
    rank, k = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])  # set by torchrun
    gpus = d2l.num_gpus()                 # fewer GPUs than ranks: they share them, with gloo
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % gpus) if gpus else "cpu"
    nccl = gpus >= int(os.environ["LOCAL_WORLD_SIZE"])             # a GPU for every rank
    if gpus:
        torch.accelerator.set_device_index(device.index)           # before NCCL touches a GPU
    dist.init_process_group("nccl" if nccl else "gloo", device_id=device if nccl else None)
    if args.batch_size % k:
        raise ValueError(f"the global batch size {args.batch_size} is not divisible by k = {k}")
    batch_size = args.batch_size // k     # each of the k devices gets 1/k of the global batch
    net = d2l.resnet18(10, 1, width=args.width)
    d2l.canonical_init(net, d2lmini.resnet18_init(width=args.width, seed=args.seed))
    model = DDP(net.to(device), device_ids=[device] if gpus else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    train_set = TensorDataset(torch.from_numpy(data.X_train), torch.from_numpy(data.y_train))
    sampler = DistributedSampler(train_set, num_replicas=k, rank=rank, seed=args.seed)
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)          # a new order each epoch, seeded, the same on all ranks
        model.train()
        start, losses = time.perf_counter(), []
        for X, y in loader:
            losses.append(train_step(model, loss_fn, optimizer, X.to(device), y.to(device)))
        loss = torch.stack(losses).mean()
        dist.all_reduce(loss)             # the sum of the k ranks' mean losses
        loss = loss.item() / k            # one wait, for the last step
        seconds = time.perf_counter() - start
        test_acc = evaluate(net, data.X_test, data.y_test, device)    # every rank, its shard
        if rank == 0:
            recipe.report(args, epoch, loss, test_acc, devices=k,
                          framework=d2l.FRAMEWORK, seconds=seconds)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

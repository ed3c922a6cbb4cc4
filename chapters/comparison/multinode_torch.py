"""Two nodes on one machine with torchrun: one launcher per node, static rendezvous.

    torchrun --nnodes 2 --node_rank 0 --nproc_per_node 1 --master_addr 127.0.0.1 \
             --master_port PORT multinode_torch.py --out DIR       # "node" 0
    torchrun --nnodes 2 --node_rank 1 --nproc_per_node 1 --master_addr 127.0.0.1 \
             --master_port PORT multinode_torch.py --out DIR       # "node" 1

torchrun gives every process RANK, LOCAL_RANK and WORLD_SIZE; ``init_process_group``
rendezvous at MASTER_ADDR:MASTER_PORT (node 0 hosts the store).  The model is softmax
regression (``nn.Linear``) wrapped in DistributedDataParallel, so the result can be checked
exactly against full-batch gradient descent in NumPy on one process.  Each rank writes
``rank{r}.json`` into ``--out``.

Under Slurm (``slurm/torch.sbatch``) srun starts the ranks and the script maps Slurm's
numbers to these variables.  ``--checkpoint FILE`` saves the parameters after every step
(rank 0) and resumes from them: a job that Slurm requeues goes on where it stopped.
"""
import argparse
import datetime
import json
import os


def train_step(ddp, opt, X, y):
    """One SGD step of the DDP model on this rank's slice (X, y)."""
    from torch import nn
    opt.zero_grad()
    # DDP averages gradients over ranks; equal shards make that the global mean.
    nn.functional.cross_entropy(ddp(X), y).backward()
    opt.step()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=96, help="global batch size")
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--timeout", type=int, default=60, help="collective timeout in seconds")
    ap.add_argument("--checkpoint", help="a file (on storage every node sees) to save the "
                    "parameters to after each step and to resume from")
    args = ap.parse_args(argv)

    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn

    import d2lmini
    from d2lmini.reference import softmax_regression_gd

    cuda = torch.cuda.is_available()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    dist.init_process_group("nccl" if cuda else "gloo",
                            timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} must be divisible by the world size {world}")

    data = d2lmini.load_fashion_mnist(train_samples=args.steps * args.batch, test_samples=10)
    X = torch.as_tensor(data.X_train.reshape(len(data.y_train), -1))
    y = torch.as_tensor(data.y_train)

    net = nn.Linear(X.shape[1], 10).to(device)
    with torch.no_grad():
        net.weight.zero_()
        net.bias.zero_()
    ddp = nn.parallel.DistributedDataParallel(net, device_ids=[local_rank] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)   # plain SGD: no state but the weights
    start = 0
    if args.checkpoint and os.path.exists(args.checkpoint):   # a restarted job: resume
        saved = torch.load(args.checkpoint)
        net.load_state_dict(saved["model"])
        start = saved["steps_done"]
        print(f"rank {rank}: resuming from {args.checkpoint} after step {start}", flush=True)
    per_rank = args.batch // world
    for s in range(start, args.steps):
        lo = s * args.batch + rank * per_rank                  # this rank's slice only
        train_step(ddp, opt, X[lo:lo + per_rank].to(device), y[lo:lo + per_rank].to(device))
        if args.checkpoint and rank == 0:                      # every rank holds the same weights
            tmp = args.checkpoint + ".tmp"
            torch.save({"model": net.state_dict(), "steps_done": s + 1}, tmp)
            os.replace(tmp, args.checkpoint)                   # never a half-written file

    W = net.weight.detach().cpu().numpy().T
    b = net.bias.detach().cpu().numpy()
    W_ref, b_ref = softmax_regression_gd(data.X_train, data.y_train, args.steps, args.batch, args.lr)
    result = {"rank": rank, "world_size": world, "resumed_after_step": start,
              "checksum": float(np.abs(W).sum() + np.abs(b).sum()),
              "max_abs_diff_vs_one_process": float(max(np.abs(W - W_ref).max(), np.abs(b - b_ref).max()))}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

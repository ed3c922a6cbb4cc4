"""The sharded chapter's recipe in PaddlePaddle: paddle_dp.py with the training state sharded.
ResNet-18 from the shared initial weights, plain SGD, on k processes, one device each.  Copied
alone, it needs Paddle and NumPy only: Paddle's initial weights, the data files in --data.

    python -m paddle.distributed.launch --nproc_per_node K paddle_fsdp.py [--level L ...]

--level chooses what each rank keeps 1/k of (default: p_g_os on GPUs, os on the CPU):

* ``p_g_os`` (ZeRO-3) and ``os_g`` (ZeRO-2): ``paddle.distributed.sharding.group_sharded_parallel``
  at that level.  Paddle 3.3.1's CPU build refuses both, at its first line: "group_sharded_parallel
  only support gpu, xpu and custom_device now" (and so do the classes behind it, and the newer
  ``paddle.distributed.fsdp.fully_shard``).  Unconfirmed on GPU by this book.
* ``os`` (ZeRO-1): the optimizer state, with fleet's sharding optimizer (``sharding_degree`` k):
  each parameter's state and update live on one rank, which broadcasts the updated parameter.
  It runs on the CPU (gloo).  (group_sharded_parallel's own level ``os`` runs ``os_g``.)
"""
import argparse
import os
import time

import numpy as np

try:                                      # the book's package: settings, data, initial weights
    import d2lmini
except ImportError:                       # this file copied alone: see its end
    d2lmini = None
if d2lmini:
    from d2lmini import paddle as d2l, recipe   # imports paddle first (and quiets its warnings)
import paddle
import paddle.distributed as dist
from paddle import nn
from paddle.distributed import fleet


def train_step(model, loss_fn, optimizer, X, y):
    """One SGD step on the batch (X, y); returns its mean loss (on the device)."""
    loss = loss_fn(model(X), y)
    loss.backward()                                      # DataParallel averages the gradients
    optimizer.step()
    optimizer.clear_grad()
    return loss.detach()                  # no float(): the host does not wait for every step


@paddle.no_grad()
def evaluate(net, X, y, batch_size=256):
    """Accuracy of rank 0's replica on the whole test set, in inference mode: rank 0's
    BatchNorm statistics go to every rank, each rank evaluates a contiguous shard, and one
    all-reduce sums the counts, so that no rank waits in a collective while another evaluates
    alone (gloo gives up after 30 s)."""
    k, rank = dist.get_world_size(), dist.get_rank()
    if k > 1:                             # running statistics: parameters that take no gradient
        for p in net.parameters():
            if p.stop_gradient:
                dist.broadcast(p, src=0)
    net.eval()
    X, y = np.array_split(X, k)[rank], np.array_split(y, k)[rank]   # contiguous, even shards
    correct = sum(d2l.accuracy(net(paddle.to_tensor(X[i:i + batch_size])),
                               paddle.to_tensor(y[i:i + batch_size]))
                  for i in range(0, len(y), batch_size))
    net.train()
    counts = paddle.to_tensor([int(correct), len(y)], dtype="int64")   # correct, seen
    if k > 1:
        dist.all_reduce(counts)
    return int(counts[0]) / int(counts[1])


def init(level):
    """The process group; for ``os``, fleet's, with all k ranks sharding (no other parallelism)."""
    if level != "os":
        return dist.init_parallel_env()                  # gloo on CPUs, NCCL on GPUs
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1,
                               "sharding_degree": int(os.environ["PADDLE_TRAINERS_NUM"])}
    fleet.init(is_collective=True, strategy=strategy)


def shard(net, optimizer, level):
    """The model and optimizer, each rank keeping 1/k of what ``level`` names; the model's
    parameters are rank 0's on every rank."""
    if level == "os":
        return fleet.distributed_model(net), fleet.distributed_optimizer(optimizer)
    from paddle.distributed.sharding import group_sharded_parallel
    model, optimizer, _ = group_sharded_parallel(net, optimizer, level=level)
    return model, optimizer


def parse_args():
    """The recipe's command line, and the sharded one's own options."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--level", choices=["os", "os_g", "p_g_os"], default=None,
                   help="what is sharded (default: p_g_os on GPUs, os on the CPU)")
    p.add_argument("--momentum", type=float, default=0.0, help="SGD's (its state is sharded too)")
    own, rest = p.parse_known_args()
    gpus = paddle.device.cuda.device_count()
    if own.level in ("os_g", "p_g_os") and not gpus:
        p.error(f"--level {own.level} needs GPUs: Paddle's group_sharded_parallel stops on the "
                "CPU ('only support gpu, xpu and custom_device'); use --level os")
    own.level = own.level or ("p_g_os" if gpus else "os")
    return argparse.Namespace(**vars(recipe.parse_args(rest)), **vars(own))


def main():
    args = parse_args()
    init(args.level)
    rank, k = dist.get_rank(), dist.get_world_size()     # set by the launcher
    paddle.set_device(d2l.try_gpu(int(os.environ["PADDLE_LOCAL_RANK"])))  # this rank's GPU, or CPU
    if args.batch_size % k:
        raise ValueError(f"the global batch size {args.batch_size} is not divisible by k = {k}")
    data = recipe.load_data(args)
    net = d2l.resnet18(10, 1, width=args.width)
    if d2lmini:                           # the same initial weights in every framework
        d2l.canonical_init(net, d2lmini.resnet18_init(width=args.width, seed=args.seed))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = paddle.optimizer.Momentum(learning_rate=args.lr, momentum=args.momentum,
                                          parameters=net.parameters())    # SGD at momentum 0
    model, optimizer = shard(net, optimizer, args.level)
    # Each of the k devices gets batch_size // k samples of every global batch.
    sampler = paddle.io.DistributedBatchSampler(
        range(len(data.y_train)), batch_size=args.batch_size // k, shuffle=True)
    for epoch in range(args.epochs):
        sampler.set_epoch(args.seed + epoch)             # this epoch's order, on every rank
        start = time.perf_counter()
        losses = [train_step(model, loss_fn, optimizer, paddle.to_tensor(data.X_train[idx]),
                             paddle.to_tensor(data.y_train[idx])) for idx in sampler]
        loss = paddle.stack(losses).mean() / k
        if k > 1:                                        # (one process has no process group)
            dist.all_reduce(loss)                        # the mean over all the ranks' shards
        loss = float(loss)                               # one wait, for the last step
        seconds = time.perf_counter() - start
        if epoch == 0:                                   # the state exists after a step
            held = sum(v.numel() * v.element_size() for v in optimizer.state_dict().values()
                       if isinstance(v, paddle.Tensor))
            total = sum(p.numel() * p.element_size() for p in net.parameters() if p.trainable)
            print(f"rank {rank} holds {int(held)} optimizer-state bytes (level {args.level}); "
                  f"the parameters are {int(total)} bytes", flush=True)
        test_acc = evaluate(net, data.X_test, data.y_test)  # every rank, its shard
        if rank == 0:
            recipe.report(args, epoch, loss, test_acc, devices=k, framework=d2l.FRAMEWORK,
                          seconds=seconds)


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

    class Residual(nn.Layer):
        """Two 3x3 convolutions and the shortcut (a 1x1 convolution where the block strides)."""
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2D(cin, cout, 3, stride, padding=1), nn.BatchNorm2D(cout), nn.ReLU(),
                nn.Conv2D(cout, cout, 3, padding=1), nn.BatchNorm2D(cout))
            self.shortcut = nn.Conv2D(cin, cout, 1, stride) if stride > 1 else nn.Identity()

        def forward(self, X):
            return nn.functional.relu(self.body(X) + self.shortcut(X))

    def resnet18(num_classes, in_channels, width):
        """ResNet-18 for 28x28 images (a 3x3 stem, no max-pooling), Paddle's initial weights."""
        c = [width] + [width * 2 ** (i // 2) for i in range(8)]   # the stem's, the 8 blocks'
        return nn.Sequential(
            nn.Conv2D(in_channels, width, 3, padding=1), nn.BatchNorm2D(width), nn.ReLU(),
            *[Residual(cin, cout, 2 if cout > cin else 1) for cin, cout in zip(c, c[1:])],
            nn.AdaptiveAvgPool2D(1), nn.Flatten(), nn.Linear(8 * width, num_classes))

    d2l = SimpleNamespace(
        FRAMEWORK="paddle", resnet18=resnet18,
        try_gpu=lambda i=0: f"gpu:{i}" if paddle.device.cuda.device_count() > i else "cpu",
        accuracy=lambda y_hat, y: float((y_hat.argmax(axis=1) == y).astype("float32").sum()))


if __name__ == "__main__":
    main()

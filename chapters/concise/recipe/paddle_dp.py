"""The concise chapter's recipe in PaddlePaddle on k processes, one device each (a GPU, else
the CPU), with paddle.DataParallel: ResNet-18 from the shared initial weights, plain SGD.

    python -m paddle.distributed.launch --nproc_per_node K paddle_dp.py [--epochs E ...]
"""
import os
import time

import d2lmini
from d2lmini import paddle as d2l, recipe   # imports paddle first (and quiets its warnings)
import paddle
import paddle.distributed as dist
from paddle import nn


def train_step(model, loss_fn, optimizer, X, y):
    """One SGD step on the batch (X, y); returns its mean loss (on the device)."""
    loss = loss_fn(model(X), y)
    loss.backward()                                      # DataParallel averages the gradients
    optimizer.step()
    optimizer.clear_grad()
    return loss.detach()                  # no float(): the host does not wait for every step


@paddle.no_grad()
def evaluate(net, X, y, batch_size=256):
    """Accuracy on the whole test set in inference mode (BatchNorm's running statistics)."""
    net.eval()
    correct = sum(d2l.accuracy(net(paddle.to_tensor(X[i:i + batch_size])),
                               paddle.to_tensor(y[i:i + batch_size]))
                  for i in range(0, len(y), batch_size))
    net.train()
    return correct / len(y)


def main():
    args = recipe.parse_args()
    dist.init_parallel_env()                             # gloo on CPUs, NCCL on GPUs
    rank, k = dist.get_rank(), dist.get_world_size()     # set by the launcher
    paddle.set_device(d2l.try_gpu(int(os.environ["PADDLE_LOCAL_RANK"])))  # this rank's GPU, or CPU
    if args.batch_size % k:
        raise ValueError(f"the global batch size {args.batch_size} is not divisible by k = {k}")
    data = recipe.load_data(args)
    net = d2l.resnet18(10, 1, width=args.width)
    d2l.canonical_init(net, d2lmini.resnet18_init(width=args.width, seed=args.seed))
    model = paddle.DataParallel(net)                     # broadcasts rank 0's parameters
    loss_fn = nn.CrossEntropyLoss()
    optimizer = paddle.optimizer.SGD(learning_rate=args.lr, parameters=model.parameters())
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
        # Every rank evaluates its own replica: a rank left waiting for rank 0 in a gloo
        # collective would fail after 30 s.
        test_acc = evaluate(net, data.X_test, data.y_test)
        if rank == 0:
            recipe.report(args, epoch, loss, test_acc, devices=k, framework=d2l.FRAMEWORK,
                          seconds=seconds)


if __name__ == "__main__":
    main()

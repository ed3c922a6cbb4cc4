"""Two nodes on one machine with Paddle's launcher: one launcher per node.

    python -m paddle.distributed.launch --nnodes 2 --rank 0 --nproc_per_node 1 \
           --master 127.0.0.1:PORT multinode_paddle.py --out DIR       # "node" 0
    python -m paddle.distributed.launch --nnodes 2 --rank 1 --nproc_per_node 1 \
           --master 127.0.0.1:PORT multinode_paddle.py --out DIR       # "node" 1

The launchers meet at the master (node 0 hosts it) and give every process its rank;
``init_parallel_env`` builds the collective group (gloo on CPU, NCCL on GPUs).  The model
is softmax regression (``nn.Linear``) wrapped in ``paddle.DataParallel``, so the result can
be checked exactly against full-batch gradient descent in NumPy on one process.  Each rank
writes ``rank{r}.json`` into ``--out``.
"""
import argparse
import json
import os


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=96, help="global batch size")
    ap.add_argument("--lr", type=float, default=0.5)
    args = ap.parse_args(argv)

    import numpy as np

    import d2lmini
    import d2lmini.paddle  # noqa: F401  -- imports paddle, undoing its logging side effect
    from d2lmini.reference import softmax_regression_gd
    import paddle
    import paddle.distributed as dist
    from paddle import nn

    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} must be divisible by the world size {world}")

    data = d2lmini.load_fashion_mnist(train_samples=args.steps * args.batch, test_samples=10)
    X = data.X_train.reshape(len(data.y_train), -1)
    y = data.y_train

    net = nn.Linear(X.shape[1], 10,  # Paddle stores the weight as (in, out)
                    weight_attr=nn.initializer.Constant(0.0), bias_attr=nn.initializer.Constant(0.0))
    model = paddle.DataParallel(net)
    opt = paddle.optimizer.SGD(learning_rate=args.lr, parameters=model.parameters())
    per_rank = args.batch // world
    for s in range(args.steps):
        lo = s * args.batch + rank * per_rank                  # this rank's slice only
        Xb, yb = paddle.to_tensor(X[lo:lo + per_rank]), paddle.to_tensor(y[lo:lo + per_rank])
        # DataParallel averages gradients over ranks; equal shards make that the global mean.
        nn.functional.cross_entropy(model(Xb), yb).backward()
        opt.step()
        opt.clear_grad()

    W, b = net.weight.numpy(), net.bias.numpy()
    W_ref, b_ref = softmax_regression_gd(X, y, args.steps, args.batch, args.lr)
    result = {"rank": rank, "world_size": world,
              "checksum": float(np.abs(W).sum() + np.abs(b).sum()),
              "max_abs_diff_vs_one_process": float(max(np.abs(W - W_ref).max(), np.abs(b - b_ref).max()))}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

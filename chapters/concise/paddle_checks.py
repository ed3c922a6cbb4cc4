"""Checks of paddle_train.py that are not the lesson, run on the same ranks with other work.

    python -m paddle.distributed.launch ... paddle_checks.py --proof DIR --out OUT [options]
    D2LMINI_FAIL_RANK=1 D2LMINI_FAIL_STEP=1 python -m paddle.distributed.launch ... \
        paddle_checks.py --out OUT [options]

``--proof DIR``: the chapter's "k devices == 1 device" experiment -- the same initial
weights (DIR/init.pdparams), a few SGD steps on fixed global batches (DIR/batches.npz), each
rank on its contiguous shard, with per-device and with cross-device BatchNorm.  Without
``--proof`` it trains exactly as paddle_train.py, with fault injection for the tests:
``D2LMINI_FAIL_RANK=r D2LMINI_FAIL_STEP=s`` make rank r raise at its training step s
(``d2lmini.launch.maybe_fail``).  The
launcher, ``--launcher spawn`` and one process work as for paddle_train.py.
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import paddle_train  # noqa: E402  (the lesson's script, next to this file)

import d2lmini  # noqa: E402
from d2lmini import launch  # noqa: E402
from d2lmini import paddle as d2l  # noqa: E402
import paddle  # noqa: E402
from paddle import nn  # noqa: E402


@d2l.exact_numerics()          # no TF32, deterministic kernels on GPUs: for the proof only
def proof(args):
    """The same initial weights, a few SGD steps on fixed global batches, each rank on its
    contiguous shard: once with per-device BatchNorm, once with cross-device BatchNorm.
    In float64, so that float32 rounding cannot make equal computations drift apart."""
    rank, world_size = paddle_train.setup()
    paddle.set_default_dtype("float64")
    batches = np.load(os.path.join(args.proof, "batches.npz"))
    init = paddle.load(os.path.join(args.proof, "init.pdparams"))
    result = {"rank": rank, "world_size": world_size}
    for mode in ("per_device", "cross_device"):
        net = d2l.resnet18(num_classes=10, width=args.width,
                           sync_bn=(mode == "cross_device"))
        net.set_state_dict(init)
        model = paddle_train.replicate(net)
        optimizer = paddle.optimizer.SGD(learning_rate=args.lr, parameters=model.parameters())
        model.train()
        for X, y in zip(batches["X"], batches["y"]):
            part = d2lmini.shard_slices(len(y), world_size)[rank]
            paddle_train.train_step(model, nn.CrossEntropyLoss(), optimizer,
                       paddle.to_tensor(X[part]), paddle.to_tensor(y[part]))
        np.savez(os.path.join(args.out, f"proof_{mode}_rank{rank}.npz"),
                 **{name: p.numpy() for name, p in paddle_train.trainable(net)})
        result[mode] = paddle_train.checksum(paddle_train.trainable(net))
    paddle_train.write_json(args.out, rank, result)


# At import, so that ranks started by spawn (which re-import this file) inject too.
launch.install_fault_injection(paddle_train, paddle.distributed.get_rank)


def main(argv=None):
    launch.checks_main(paddle_train, proof, __doc__.split("\n")[0],
                       "directory with init.pdparams, batches.npz", argv)


if __name__ == "__main__":
    main()

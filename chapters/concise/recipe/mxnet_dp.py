"""The concise chapter's recipe in MXNet Gluon on k devices (one process): ResNet-18 on
Fashion-MNIST.  The devices: d2l.try_all_gpus() (how many: D2LMINI_NUM_DEVICES).  Copied
alone, it needs MXNet and NumPy only: Gluon's ResNet-18 with MXNet's initial weights, the data
files in --data.

    D2LMINI_NUM_DEVICES=2 python mxnet_dp.py [--epochs E --batch-size B --lr LR ...]
"""
import os
import time

import numpy as np

try:                                        # the book's package: settings, data, initial weights
    import d2lmini
except ImportError:                         # this file copied alone: see its end
    d2lmini = None
if d2lmini:
    from d2lmini import BatchIterator, recipe
    from d2lmini import mxnet as d2l        # before mxnet: installs the NumPy 2 shim
import mxnet as mx
from mxnet import autograd, gluon, nd

loss = gluon.loss.SoftmaxCrossEntropyLoss()    # one loss per sample


def train_step(net, trainer, X, y, devices):
    """One SGD step on the batch (X, y); returns its mean loss (on the first device)."""
    X_shards = gluon.utils.split_and_load(X, devices)   # one shard per device
    y_shards = gluon.utils.split_and_load(y, devices)
    with autograd.record():                    # records the graph; BatchNorm in training mode
        ls = [loss(net(Xs), ys) for Xs, ys in zip(X_shards, y_shards)]   # each on its device
    autograd.backward(ls)                      # each replica: the gradient of its shard's SUM
    trainer.step(len(y))                       # the update divides it by len(y)
    return nd.add_n(*(l.sum().as_in_context(devices[0]) for l in ls)) / len(y)  # no asscalar()


def evaluate(net, data, devices):
    """Test accuracy of device 0's replica: its BatchNorm statistics go to every replica, and
    every test batch is split over the devices like a training batch.  Outside
    autograd.record(), BatchNorm uses its running statistics."""
    for p in net.collect_params().values():
        if p.grad_req == 'null':               # running statistics: device 0's, everywhere
            p.set_data(p.data(devices[0]))
    correct = []
    for X, y in BatchIterator(data.X_test, data.y_test, 256):
        n = min(len(y), len(devices))          # a last batch smaller than k: fewer devices
        for Xs, ys in zip(gluon.utils.split_and_load(X, devices[:n], even_split=False),
                          gluon.utils.split_and_load(y, devices[:n], even_split=False)):
            correct.append((net(Xs).argmax(axis=1) == ys.astype('float32')).sum()
                           .as_in_context(devices[0]))
    return nd.add_n(*correct).asscalar() / len(data.y_test)      # one wait, at the end


def main():
    args = recipe.parse_args()
    data = recipe.load_data(args)
    devices = d2l.try_all_gpus()
    k = len(devices)
    if args.batch_size % k:                    # each of the k devices gets batch_size // k
        raise SystemExit(f"--batch-size {args.batch_size} is not divisible by {k} devices")
    net = d2l.resnet18(10, 1, width=args.width)
    if d2lmini:                                # the same initial weights in every framework
        d2l.canonical_init(net, d2lmini.resnet18_init(width=args.width, seed=args.seed))
    net.collect_params().reset_ctx(devices)    # one replica of every parameter per device
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': args.lr},
                            kvstore='device')  # sums the replicas' gradients at every step
    batches = BatchIterator(data.X_train, data.y_train, args.batch_size,
                            shuffle=True, seed=args.seed, drop_last=True)
    for epoch in range(args.epochs):           # a new order every epoch
        start = time.time()
        losses = [train_step(net, trainer, X, y, devices) for X, y in batches]
        loss = nd.concat(*losses, dim=0).mean().asscalar()   # one wait, for the last step
        seconds = time.time() - start
        recipe.report(args, epoch, loss, evaluate(net, data, devices),
                      devices=k, framework=d2l.FRAMEWORK, seconds=seconds)


# -- This file copied alone, without the book's package d2lmini: what it takes from d2lmini. ---
if d2lmini is None:
    import argparse
    import gzip
    from types import SimpleNamespace

    from mxnet.gluon.model_zoo import vision

    def parse_args():
        """The command line; by default, 10 epochs on all of Fashion-MNIST."""
        p = argparse.ArgumentParser(description=__doc__)
        p.add_argument("--data", default=os.environ.get("D2LMINI_DATA", "fashion-mnist"),
                       help="the directory of the four Fashion-MNIST files (.gz)")
        for name, default in dict(epochs=10, batch_size=256, lr=0.1, width=64,
                                  train_samples=60000, test_samples=10000, seed=0).items():
            p.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
        return p.parse_args()

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

    recipe = SimpleNamespace(parse_args=parse_args, load_data=load_data, report=report)

    class BatchIterator:
        """Minibatches of (X, y); shuffled: a new order at every pass, drawn from `seed`."""
        def __init__(self, X, y, batch_size, shuffle=False, seed=0, drop_last=False):
            self.X, self.y, self.batch_size, self.drop_last = X, y, batch_size, drop_last
            self.rng = np.random.default_rng(seed) if shuffle else None

        def __iter__(self):
            n, b = len(self.y), self.batch_size
            order = self.rng.permutation(n) if self.rng else np.arange(n)
            for i in range(0, n - b + 1 if self.drop_last else n, b):
                yield self.X[order[i:i + b]], self.y[order[i:i + b]]

    def resnet18(num_classes, in_channels, width):
        """Gluon's ResNet-18 for small images (a 3x3 stem, no max-pooling), with MXNet's initial
        weights; Gluon infers in_channels from the images."""
        net = vision.ResNetV1(vision.BasicBlockV1, [2, 2, 2, 2],
                              [width, width, 2 * width, 4 * width, 8 * width],
                              classes=num_classes, thumbnail=True)
        net.initialize()
        return net

    def try_all_gpus():
        """Every GPU, else D2LMINI_NUM_DEVICES (default 2) CPU contexts, distinct to MXNet."""
        n = mx.context.num_gpus()
        k = int(os.environ.get("D2LMINI_NUM_DEVICES", 2))
        return [mx.gpu(i) for i in range(n)] if n else [mx.cpu(i) for i in range(k)]

    d2l = SimpleNamespace(
        FRAMEWORK="mxnet", resnet18=resnet18, try_all_gpus=try_all_gpus,
        try_gpu=lambda: try_all_gpus()[0],
        accuracy=lambda y_hat, y: float((y_hat.argmax(axis=1).astype(y.dtype) == y).sum()
                                        .asscalar()))


if __name__ == "__main__":
    main()

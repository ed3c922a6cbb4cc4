"""The concise chapter's recipe in JAX, on k devices driven by one process (jit on a Mesh):
ResNet-18 on Fashion-MNIST with plain SGD, from d2lmini's canonical initial weights.  Copied
alone, it needs JAX, Flax, Optax and NumPy only: Flax's initial weights, the data files in --data,
every GPU (or XLA_FLAGS=--xla_force_host_platform_device_count=k CPU devices).

    D2LMINI_NUM_DEVICES=k python jax_dp.py [--epochs N --batch-size B ...]   # k GPUs, or CPUs
"""
import os
import time
from functools import partial

try:                                      # the book's package: settings, data, initial weights
    import d2lmini
except ImportError:                       # this file copied alone: see its end
    d2lmini = None
if d2lmini:
    from d2lmini import BatchIterator, recipe
    from d2lmini import jax as d2l        # before JAX starts: it sets the device count

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


@partial(jax.jit, static_argnums=(0, 1), donate_argnums=2)  # sharded batch: XLA adds all-reduces
def train_step(net, tx, state, X, y):
    """One SGD step on the batch (X, y); returns the new state and the batch's mean loss."""
    def loss_fn(params):
        logits, updates = net.apply({'params': params, 'batch_stats': state['batch_stats']},
                                    X, train=True, mutable=['batch_stats'])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss, updates['batch_stats']
    (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state['params'])
    updates, opt_state = tx.update(grads, state['opt_state'])
    return {'params': optax.apply_updates(state['params'], updates),
            'batch_stats': batch_stats, 'opt_state': opt_state}, loss


@partial(jax.jit, static_argnums=0)
def count_correct(net, variables, X, y, valid):
    """How many of the batch's valid rows the model classifies right, in inference mode
    (BatchNorm's running statistics)."""
    y_hat = net.apply(variables, X, train=False).argmax(1)
    return ((y_hat == y) & valid).sum()


def evaluate(net, state, X, y, sharded, batch_size=256):
    """Accuracy on the whole test set (X, y), every batch split over the k devices like a
    training batch (the last one padded to a multiple of k, the padding not counted)."""
    k = sharded.mesh.size
    variables = {'params': state['params'], 'batch_stats': state['batch_stats']}
    correct = 0
    for i in range(0, len(y), batch_size):
        Xb, yb = X[i:i + batch_size], y[i:i + batch_size].astype(np.int32)
        pad = -len(yb) % k
        valid = np.arange(len(yb) + pad) < len(yb)
        Xb = np.concatenate([Xb, np.zeros((pad, *Xb.shape[1:]), Xb.dtype)])
        yb = np.concatenate([yb, np.zeros(pad, yb.dtype)])
        # int() waits for each batch: independent programs with collectives left in flight
        # together can deadlock XLA's CPU devices in their all-reduces
        correct += int(count_correct(net, variables, *jax.device_put((Xb, yb, valid), sharded)))
    return correct / len(y)


def main():
    args = recipe.parse_args()
    data = recipe.load_data(args)
    devices = d2l.try_all_gpus()             # D2LMINI_NUM_DEVICES GPUs, or simulated CPUs
    k = len(devices)
    mesh = Mesh(np.array(devices), ('data',))
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P('data'))
    if args.batch_size % k:
        raise ValueError(f"the global batch size {args.batch_size} is not divisible by k = {k}")
    net = d2l.resnet18(10, 1, width=args.width)
    if d2lmini:                           # the same initial weights in every framework
        variables = d2l.canonical_init(net, d2lmini.resnet18_init(width=args.width, seed=args.seed))
    else:
        variables = net.init(jax.random.key(args.seed), data.X_train[:1])
    tx = optax.sgd(args.lr)
    state = jax.device_put({**variables, 'opt_state': tx.init(variables['params'])}, replicated)
    train_iter = BatchIterator(data.X_train, data.y_train.astype(np.int32), args.batch_size,
                               shuffle=True, seed=args.seed,
                               drop_last=True)           # a new order each epoch, seeded
    for epoch in range(args.epochs):
        start, losses = time.perf_counter(), []
        for X, y in train_iter:              # each of the k devices gets 1/k of the global batch
            state, loss = train_step(net, tx, state, *jax.device_put((X, y), sharded))
            losses.append(loss)
        loss = np.mean(jax.device_get(losses))   # waits for the last step
        seconds = time.perf_counter() - start
        test_acc = evaluate(net, state, data.X_test, data.y_test, sharded)
        recipe.report(args, epoch, float(loss), test_acc, devices=k,
                      framework=d2l.FRAMEWORK, seconds=seconds)


# -- This file copied alone, without the book's package d2lmini: what it takes from d2lmini. ---
if d2lmini is None:
    import argparse
    import gzip
    from types import SimpleNamespace

    import jax.numpy as jnp
    from flax import linen as nn

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

    class Residual(nn.Module):
        """Two 3x3 convolutions and the shortcut (a 1x1 convolution where the block strides)."""
        channels: int
        strides: int = 1

        @nn.compact
        def __call__(self, X, train):
            bn = lambda: nn.BatchNorm(use_running_average=not train, momentum=0.9)
            s = (self.strides, self.strides)
            Y = nn.relu(bn()(nn.Conv(self.channels, (3, 3), s, padding=1)(X)))
            Y = bn()(nn.Conv(self.channels, (3, 3), padding=1)(Y))
            if self.strides > 1:
                X = nn.Conv(self.channels, (1, 1), s)(X)
            return nn.relu(Y + X)

    class ResNet18(nn.Module):
        """ResNet-18 for 28x28 images (a 3x3 stem, no max-pooling); NCHW images in."""
        num_classes: int
        in_channels: int                                 # (Flax infers it from the images)
        width: int

        @nn.compact
        def __call__(self, X, train=False):
            X = jnp.transpose(X, (0, 2, 3, 1))          # NCHW -> NHWC, Flax's layout
            X = nn.Conv(self.width, (3, 3), padding=1)(X)
            X = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(X))
            for i in range(8):                           # 4 stages of 2 blocks
                X = Residual(self.width * 2 ** (i // 2), 2 if i in (2, 4, 6) else 1)(X, train)
            return nn.Dense(self.num_classes)(X.mean(axis=(1, 2)))

    d2l = SimpleNamespace(FRAMEWORK="jax", resnet18=ResNet18, try_gpu=lambda: jax.devices()[0],
                          try_all_gpus=jax.devices)      # every GPU, else every CPU device


if __name__ == "__main__":
    main()

"""The concise chapter's recipe in JAX on one device, with the fast path: jax_one.py plus
the settings a practitioner turns on for a GPU.

    python jax_fast.py [--epochs N ...] [--knobs donate,bf16]

* ``donate``: ``jax.jit(..., donate_argnums=0)``: the step may write the new state into the
  old state's buffers (the caller must not use the old state again), instead of holding two
  copies of parameters and optimizer state;
* ``bf16``: every layer computes in bfloat16 (Flax's ``dtype``) while the parameters, the
  gradients' update and the optimizer stay in float32 (``param_dtype``, the default): mixed
  precision with float32 master weights.  The loss is computed in float32.  On a CPU without
  AVX-512, XLA computes bfloat16 through conversions to float32, slower than float32: the
  recipe leaves it out there (:func:`check_knobs`).

Copied alone, it needs JAX, Flax, Optax and NumPy only: Flax's initial weights, the data files in
--data.
"""
import os
import time

try:                                      # the book's package: settings, data, initial weights
    import d2lmini
except ImportError:                       # this file copied alone: see its end
    d2lmini = None
if d2lmini:
    from d2lmini import BatchIterator, recipe
    from d2lmini import jax as d2l        # before JAX starts: it sets the device count
    from d2lmini.hardware import cpu_bf16_gap

import jax
import jax.numpy as jnp
import numpy as np
import optax

KNOBS = ("donate", "bf16")
# The ladder the benchmark measures: each rung adds one setting to the one before.
LADDER = [("defaults", ()), ("+ buffer donation", ("donate",)),
          ("+ bf16 compute", ("donate", "bf16"))]


def check_knobs(knobs, device):
    """Refuses, by name and with the reason, a knob that does not pay on `device`: bfloat16 on
    a CPU without AVX-512."""
    gap = "bf16" in knobs and device.platform == "cpu" and cpu_bf16_gap()
    if gap:
        raise RuntimeError(f"knob bf16 does not pay on this CPU: {gap}; XLA would compute it "
                           "through conversions to float32, slower than float32")


def default_knobs(device):
    """The knobs ``--knobs`` defaults to on `device`: all that :func:`check_knobs` accepts."""
    return recipe.accepted_knobs(check_knobs, KNOBS, device)


def model(width, knobs=()):
    """ResNet-18 computing in bfloat16 (knob bf16) or float32; parameters in float32."""
    return d2l.resnet18(10, 1, width=width, dtype=jnp.bfloat16 if "bf16" in knobs else None)


def make_train_step(net, tx, knobs=()):
    """One SGD step on a batch already on the device: (state, X, y) -> (new state, loss)."""
    def train_step(state, X, y):
        def loss_fn(params):
            logits, updates = net.apply({'params': params, 'batch_stats': state['batch_stats']},
                                        X, train=True, mutable=['batch_stats'])
            logits = logits.astype(jnp.float32)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, updates['batch_stats']
        (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state['params'])
        updates, opt_state = tx.update(grads, state['opt_state'])
        return {'params': optax.apply_updates(state['params'], updates),
                'batch_stats': batch_stats, 'opt_state': opt_state}, loss
    return jax.jit(train_step, donate_argnums=(0,) if "donate" in knobs else ())


def evaluate(net, state, X, y, device, batch_size=256):
    """Accuracy on the whole test set (X, y), in inference mode, on `device`, in float32."""
    variables = {'params': state['params'], 'batch_stats': state['batch_stats']}
    predict = jax.jit(lambda v, X: net.apply(v, X, train=False).argmax(1))
    correct = 0
    for i in range(0, len(y), batch_size):     # train=False: BatchNorm's running statistics
        correct += int((np.asarray(predict(variables, jax.device_put(X[i:i + batch_size],
                                                                     device)))
                        == y[i:i + batch_size]).sum())
    return correct / len(y)


def main(argv=None):
    device = d2l.try_gpu()
    args = recipe.parse_args(argv, knobs=KNOBS, default_knobs=default_knobs(device))
    knobs = args.knobs                                    # --knobs: default all that pay here
    check_knobs(knobs, device)
    data = recipe.load_data(args)
    net = model(args.width, knobs)
    if d2lmini:                           # the same initial weights in every framework
        variables = d2l.canonical_init(d2l.resnet18(10, 1, width=args.width),
                                       d2lmini.resnet18_init(width=args.width, seed=args.seed))
    else:
        variables = d2l.resnet18(10, 1, width=args.width).init(jax.random.key(args.seed),
                                                               data.X_train[:1])
    tx = optax.sgd(args.lr)
    state = jax.device_put({**variables, 'opt_state': tx.init(variables['params'])}, device)
    train_step = make_train_step(net, tx, knobs)
    train_iter = BatchIterator(data.X_train, data.y_train.astype(np.int32),
                               args.batch_size, shuffle=True, seed=args.seed, drop_last=True)
    for epoch in range(args.epochs):
        start, losses = time.perf_counter(), []
        for X, y in train_iter:
            state, loss = train_step(state, *jax.device_put((X, y), device))
            losses.append(loss)
        loss = float(jnp.stack(losses).mean())        # one wait, at the end of the epoch
        seconds = time.perf_counter() - start
        test_acc = evaluate(d2l.resnet18(10, 1, width=args.width),   # float32, same parameters
                            state, data.X_test, data.y_test, device)
        recipe.report(args, epoch, loss, test_acc, devices=1,
                      framework=d2l.FRAMEWORK, seconds=seconds)


# -- This file copied alone, without the book's package d2lmini: what it takes from d2lmini. ---
if d2lmini is None:
    import argparse
    import gzip
    from types import SimpleNamespace

    import jax.numpy as jnp
    from flax import linen as nn

    def parse_args(argv=None, knobs=(), default_knobs=None):
        """The command line; by default, 10 epochs on all of Fashion-MNIST and the knobs
        `default_knobs` (else all of `knobs`; --knobs a,b chooses among them)."""
        p = argparse.ArgumentParser(description=__doc__,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--data", default=os.environ.get("D2LMINI_DATA", "fashion-mnist"),
                       help="the directory of the four Fashion-MNIST files (.gz)")
        for name, default in dict(epochs=10, batch_size=256, lr=0.1, width=64,
                                  train_samples=60000, test_samples=10000, seed=0).items():
            p.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
        p.add_argument("--knobs", default=",".join(knobs if default_knobs is None
                                                   else default_knobs),
                       help=f"comma-separated, from: {', '.join(knobs)}")
        args = p.parse_args(argv)
        args.knobs = tuple(k for k in args.knobs.split(",") if k)
        if set(args.knobs) - set(knobs):
            p.error(f"unknown knobs {sorted(set(args.knobs) - set(knobs))}; "
                    f"choose from {', '.join(knobs)}")
        return args

    def accepted_knobs(check_knobs, knobs, device):
        """The knobs `check_knobs` accepts on `device`, one by one: the default --knobs."""
        def accepted(knob):
            try:
                check_knobs((knob,), device)
            except RuntimeError:
                return False
            return True
        return tuple(k for k in knobs if accepted(k))

    def cpu_bf16_gap():
        """Why this CPU has no bfloat16 kernels (d2lmini reads its instruction sets)."""
        return None

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

    recipe = SimpleNamespace(parse_args=parse_args, load_data=load_data, report=report,
                             accepted_knobs=accepted_knobs)

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
        dtype: object = None                             # the layers' compute dtype

        @nn.compact
        def __call__(self, X, train):
            bn = lambda: nn.BatchNorm(use_running_average=not train, momentum=0.9,
                                      dtype=self.dtype)
            s = (self.strides, self.strides)
            Y = nn.relu(bn()(nn.Conv(self.channels, (3, 3), s, padding=1, dtype=self.dtype)(X)))
            Y = bn()(nn.Conv(self.channels, (3, 3), padding=1, dtype=self.dtype)(Y))
            if self.strides > 1:
                X = nn.Conv(self.channels, (1, 1), s, dtype=self.dtype)(X)
            return nn.relu(Y + X)

    class ResNet18(nn.Module):
        """ResNet-18 for 28x28 images (a 3x3 stem, no max-pooling); NCHW images in.  `dtype`:
        the dtype every layer computes in, the parameters float32 (Flax's param_dtype)."""
        num_classes: int
        in_channels: int                                 # (Flax infers it from the images)
        width: int
        dtype: object = None

        @nn.compact
        def __call__(self, X, train=False):
            X = jnp.transpose(X, (0, 2, 3, 1))          # NCHW -> NHWC, Flax's layout
            X = nn.Conv(self.width, (3, 3), padding=1, dtype=self.dtype)(X)
            X = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9,
                                     dtype=self.dtype)(X))
            for i in range(8):                           # 4 stages of 2 blocks
                X = Residual(self.width * 2 ** (i // 2), 2 if i in (2, 4, 6) else 1,
                             self.dtype)(X, train)
            return nn.Dense(self.num_classes, dtype=self.dtype)(X.mean(axis=(1, 2)))

    d2l = SimpleNamespace(FRAMEWORK="jax", resnet18=ResNet18, try_gpu=lambda: jax.devices()[0],
                          try_all_gpus=jax.devices)      # every GPU, else every CPU device


if __name__ == "__main__":
    main()

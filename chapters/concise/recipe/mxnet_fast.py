"""The concise chapter's recipe in MXNet Gluon on one device, with the fast path: mxnet_one.py
plus the settings a practitioner turns on for a GPU (and the CPU's counterpart).

    python mxnet_fast.py [--epochs E ...] [--knobs hybridize,fp16 | hybridize,bf16]

MXNet 1.9.1 is the last release (the project is retired to the Apache Attic).  Its GPU build
(``mxnet-cu112``) ships machine code for compute capability 5.0-8.6 only and no PTX (read from
the wheel's ``libmxnet.so``; this book has never run MXNet on a GPU, so what this script does
on one is unconfirmed on GPU): on a Hopper (H100, H200) or newer GPU ``d2l.try_gpu()`` gives
the CPU, and a GPU-only knob is refused there as on any CPU.  On a CPU, ``bf16`` needs
oneDNN's bfloat16 kernels, which need AVX-512: on an AVX2 CPU it is refused (a probe).

* ``hybridize``: ``net.hybridize(static_alloc=True, static_shape=True)``: the first call traces
  the Python layers into a static graph (a CachedOp) that later steps run without calling them
  -- one dispatch per forward and backward instead of one per operator -- and, with static
  allocation and shapes, its memory is planned and allocated once, not at every step;
* ``fp16``: MXNet's automatic mixed precision (``mxnet.contrib.amp``) to float16.
  ``amp.init("float16")``, before the net is built, replaces MXNet's operator functions, for
  the whole process, by ones that cast: convolutions and matrix products compute in float16
  (tensor cores), BatchNorm, ReLU and pooling in the type they are given, softmax, sums and
  means in float32; the parameters and the update stay float32.  The loss is computed in
  float32.  float16's narrow range needs dynamic loss scaling:
  ``amp.init_trainer(trainer)`` and ``amp.scale_loss`` multiply the loss by a large factor
  before backward, and ``trainer.step`` checks the gradients for inf/NaN, skipping the update
  and halving the factor if it finds any -- a check the host reads, so with this knob every
  step waits for the device.  GPUs only: MXNet 1.9.1 has no float16 matrix products on the CPU
  (its convolutions stop with "FP16 gemm on cpu not implemented!"), and the recipe refuses it;
* ``bf16``: the same AMP to bfloat16 (``amp.init("bfloat16")``), which has float32's exponent
  range: no loss scaling.  In MXNet 1.9.1 these kernels are oneDNN's, on the CPU only (the
  type switches its GPU code is compiled with have no bfloat16 case: mshadow/base.h), and the
  recipe refuses it on a GPU.

amp.init cannot be undone and rewrites the operators for every later net of the process: this
script keeps both versions of the functions, so that ``evaluate`` runs in float32 and the step
benchmark can time a float32 rung after an AMP one.  Not a knob: cuDNN's autotuning (PyTorch's
``cudnn.benchmark``), read by MXNet from ``MXNET_CUDNN_AUTOTUNE_DEFAULT`` at start; d2lmini.mxnet
turns it off on GPU hosts (exact numerics) unless that variable is set before the run.
"""
import contextlib
import functools
import os
import time

import numpy as np

try:                                      # the book's package: settings, data, initial weights
    import d2lmini
except ImportError:                       # this file copied alone: see its end
    d2lmini = None
if d2lmini:
    from d2lmini import BatchIterator, recipe
    from d2lmini import mxnet as d2l        # before mxnet: installs the NumPy 2 shim
    from d2lmini.hardware import cpu_bf16_gap
import mxnet as mx
from mxnet import autograd, gluon, nd
from mxnet.contrib import amp

KNOBS = ("hybridize", "fp16", "bf16")
# The ladder the benchmark measures: each rung adds one setting to the one before.  Its AMP is
# bf16: what MXNet runs where this project can run it (the CPU: no kernels for Hopper), and the
# 16-bit type tools/step_bench.py keys its peaks and numerics to.  fp16 is a knob for GPUs.
LADDER = [("defaults", ()), ("+ hybridize", ("hybridize",)),
          ("+ bf16 AMP", ("hybridize", "bf16"))]

loss = gluon.loss.SoftmaxCrossEntropyLoss()    # one loss per sample
_AMP = {"dtype": None, "on": False, "float32": {}, "amp": {}}   # amp.init's type, its operators


def amp_dtype(knobs, device):
    """AMP's 16-bit type for `knobs` on `device` (None: float32); refuses, by name and with the
    reason, a knob that MXNet 1.9.1 cannot run on `device`."""
    if "fp16" in knobs and "bf16" in knobs:
        raise ValueError("knobs fp16 and bf16 exclude each other: MXNet's AMP has one 16-bit "
                         "type per process")
    if "fp16" in knobs and device.device_type == "cpu":
        why = d2l.unsupported_gpu()            # a GPU MXNet has no kernels for, if any
        raise RuntimeError("knob fp16 cannot run on the CPU: MXNet 1.9.1 has no float16 matrix "
                           "products there (its convolutions stop with 'FP16 gemm on cpu not "
                           "implemented!'); on the CPU use bf16" + (f". {why}" if why else ""))
    if "bf16" in knobs and device.device_type != "cpu":
        raise RuntimeError("knob bf16 cannot run on a GPU: MXNet 1.9.1's bfloat16 kernels are "
                           "oneDNN's, on the CPU only (its GPU code has no bfloat16 case); on a "
                           "GPU use fp16")
    if "bf16" in knobs and not mx.runtime.Features().is_enabled("MKLDNN"):
        raise RuntimeError("knob bf16 needs MXNet's oneDNN (MKLDNN) build; this one has none")
    if "bf16" in knobs and not _bf16_convolution_runs():
        raise RuntimeError("knob bf16 cannot run on this CPU: oneDNN has no bfloat16 "
                           f"convolution here ({cpu_bf16_gap() or 'its probe failed'})")
    return "float16" if "fp16" in knobs else "bfloat16" if "bf16" in knobs else None


def default_knobs(device):
    """The knobs ``--knobs`` defaults to on `device`: hybridize, and the device's AMP (fp16 on a
    GPU, bf16 on the CPU) where :func:`amp_dtype` accepts it."""
    amp16 = "fp16" if device.device_type == "gpu" else "bf16"
    return ("hybridize",) + recipe.accepted_knobs(amp_dtype, (amp16,), device)


@functools.lru_cache(maxsize=None)
def _bf16_convolution_runs():
    """Whether oneDNN runs a bfloat16 convolution on this CPU (it needs AVX-512: on an AVX2
    CPU MXNet stops with 'could not create a primitive descriptor iterator').  A tiny one,
    with MXNet's own float32 operators, before amp.init."""
    bf16 = amp.amp.bfloat16
    x = nd.amp_cast(nd.ones((1, 1, 3, 3)), dtype=bf16)
    try:
        y = nd.Convolution(x, nd.amp_cast(nd.ones((1, 1, 3, 3)), dtype=bf16), no_bias=True,
                           kernel=(3, 3), num_filter=1)
        return nd.amp_cast(y, dtype="float32").asscalar() == 9
    except mx.base.MXNetError:
        return False


def _operators():
    """The functions of MXNet's operator modules (what amp.init replaces), by (module, name)."""
    mods = [m for pkg in (mx.nd, mx.sym) for m in [pkg, pkg.op, pkg._internal] +
            [getattr(pkg, p[1:-1]) for p in mx.base._OP_NAME_PREFIX_LIST]]
    return {(m, name): f for m in mods for name, f in vars(m).items() if callable(f)}


def init_amp(dtype):
    """``amp.init(dtype)``, once per process, before the net is built; keeps both versions of
    the operators it replaces (see :func:`amp_operators`)."""
    if _AMP["dtype"] not in (None, dtype) or (_AMP["dtype"] is None and amp.amp._amp_initialized):
        raise RuntimeError(f"MXNet's AMP was initialised before in this process (to "
                           f"{_AMP['dtype'] or 'a type this script did not choose'}); amp.init "
                           f"cannot change it to {dtype}")
    if _AMP["dtype"] is None:
        before = _operators()
        amp.init(dtype)
        after = _operators()
        _AMP["amp"] = {k: f for k, f in after.items() if before.get(k) is not f}
        _AMP["float32"] = {k: before[k] for k in _AMP["amp"] if k in before}
        _AMP["dtype"] = dtype
    amp_operators(True)


def amp_operators(on):
    """Put AMP's operator functions in place (True) or MXNet's own float32 ones (False)."""
    for (module, name), f in _AMP["amp" if on else "float32"].items():
        setattr(module, name, f)
    _AMP["on"] = on


@contextlib.contextmanager
def float32_operators():
    """A block that runs MXNet's own float32 operators, also after amp.init."""
    was = _AMP["on"]
    amp_operators(False)
    try:
        yield
    finally:
        amp_operators(was)


def prepare(net, device, knobs=()):
    """The model on `device`, set up for the chosen knobs (AMP: init_amp, before the net)."""
    net.collect_params().reset_ctx(device)     # the parameters move to the device
    if "hybridize" in knobs:                   # a static graph, traced at the first call
        net.hybridize(static_alloc=True, static_shape=True)
    return net


def make_train_step(net, trainer, knobs=()):
    """One SGD step on a batch (X, y) already on the device; returns its mean loss, on the
    device (no asscalar(): the host does not wait for the step -- with fp16, AMP's overflow
    check in trainer.step does)."""
    def train_step(X, y):
        with autograd.record():                # records the graph; BatchNorm in training mode
            l = loss(net(X).astype("float32", copy=False), y)   # AMP or not: in float32
            if "fp16" in knobs:                # float16: backward from the loss times a scale
                with amp.scale_loss(l, trainer) as scaled:
                    scaled.backward()
        if "fp16" not in knobs:
            l.backward()                       # the gradient of the SUM of the losses
        trainer.step(len(y))                   # the update divides it by len(y)
        return l.mean()
    return train_step


def evaluate(net, data, device, knobs=()):
    """Test accuracy of the model on `device`, in float32 (MXNet's own operators; after AMP
    without the hybridized graph, which holds AMP's casts); outside autograd.record(),
    BatchNorm uses its running statistics."""
    amp_graph = "hybridize" in knobs and ("fp16" in knobs or "bf16" in knobs)
    if amp_graph:
        net.hybridize(active=False)            # the layers, not the graph traced under AMP
    correct = 0
    with float32_operators():
        for X, y in BatchIterator(data.X_test, data.y_test, 256):
            correct += d2l.accuracy(net(nd.array(X, ctx=device)), nd.array(y, ctx=device))
    if amp_graph:
        prepare(net, device, knobs)            # traced again, under AMP, at the next step
    return correct / len(data.y_test)


def main(argv=None):
    device = d2l.try_gpu()
    args = recipe.parse_args(argv, knobs=KNOBS, default_knobs=default_knobs(device))
    knobs = args.knobs
    dtype = amp_dtype(knobs, device)           # refuses a knob the device cannot run
    data = recipe.load_data(args)
    if dtype:
        init_amp(dtype)                        # before the net is built
    net = d2l.resnet18(10, 1, width=args.width)
    if d2lmini:                           # the same initial weights in every framework
        d2l.canonical_init(net, d2lmini.resnet18_init(width=args.width, seed=args.seed))
    net = prepare(net, device, knobs)
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': args.lr})
    if dtype == "float16":
        amp.init_trainer(trainer)              # dynamic loss scaling
    train_step = make_train_step(net, trainer, knobs)
    batches = BatchIterator(data.X_train, data.y_train, args.batch_size,
                            shuffle=True, seed=args.seed, drop_last=True)
    for epoch in range(args.epochs):           # a new order every epoch
        start = time.time()
        losses = [train_step(nd.array(X, ctx=device), nd.array(y, ctx=device))
                  for X, y in batches]
        loss_mean = nd.concat(*losses, dim=0).mean().asscalar()   # one wait, at the end
        seconds = time.time() - start
        recipe.report(args, epoch, loss_mean, evaluate(net, data, device, knobs),
                      devices=1, framework=d2l.FRAMEWORK, seconds=seconds)


# -- This file copied alone, without the book's package d2lmini: what it takes from d2lmini. ---
if d2lmini is None:
    import argparse
    import gzip
    from types import SimpleNamespace

    from mxnet.gluon.model_zoo import vision

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
        try_gpu=lambda: try_all_gpus()[0], unsupported_gpu=lambda: None,
        accuracy=lambda y_hat, y: float((y_hat.argmax(axis=1).astype(y.dtype) == y).sum()
                                        .asscalar()))


if __name__ == "__main__":
    main()

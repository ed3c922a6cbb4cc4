"""The concise chapter's recipe in PaddlePaddle on one device, with the fast path: paddle_one.py
plus the settings a practitioner turns on for a GPU.

    python paddle_fast.py [--epochs E ...] [--knobs bf16,o2,nhwc,cudnn_search,to_static,cinn]

* ``bf16``: ``paddle.amp.auto_cast(level="O1", dtype="bfloat16")``: the operators on Paddle's
  white list (convolutions, matrix products) compute in bfloat16 on the tensor cores, the
  rest and the weights stay in float32.  bfloat16 rather than float16: it has float32's
  exponent range, so small gradients do not underflow and no loss scaling is needed (float16
  would need ``paddle.amp.GradScaler``: a scaled loss, an unscale and an inf/NaN check every
  step); the GPUs that have bfloat16 run it as fast as float16;
* ``o2`` (with ``bf16``): level O2, "pure" bfloat16: ``paddle.amp.decorate(...,
  master_weight=True)`` stores the parameters in bfloat16 (BatchNorm's stay in float32) and
  the optimizer updates float32 master copies of them, so every layer computes in bfloat16
  with no casts of the weights at each step and half the weight traffic;
* ``nhwc``: every layer in channels-last layout (``d2l.resnet18(data_format="NHWC")``, the
  same parameters), the layout of cuDNN's tensor-core convolutions: in NCHW, cuDNN transposes
  around every bfloat16 or float16 convolution (in float32 the layout matters far less);
* ``cudnn_search``: ``FLAGS_cudnn_exhaustive_search``: cuDNN times every convolution
  algorithm once per input shape and keeps the fastest (among those whose workspace fits
  ``FLAGS_conv_workspace_size_limit``), instead of taking its heuristic's choice;
* ``to_static``: ``paddle.jit.to_static(full_graph=True, backend=None)``: the forward's
  Python source is translated (its syntax tree: full_graph=True; the default, full_graph=False,
  translates bytecode and falls back to Python where it cannot) once into a static graph,
  which Paddle's executor runs with its backward, with no Python between the operators and
  the graph passes applied.  ``backend=None`` on purpose: to_static's default backend is
  CINN, used wherever the build has it;
* ``cinn`` (with ``to_static``): the same graph compiled by CINN, Paddle's compiler
  (``backend="CINN"``), which fuses the elementwise work around the convolutions (BatchNorm,
  ReLU, the additions, the casts) into fewer kernels.

None of these settings has been timed on a GPU by this book (no Paddle GPU run exists):
unconfirmed on GPU.

The loss is computed in float32, and the accuracy in float32.  A knob that cannot run where
the script runs is refused with its reason (:func:`check_knobs`): Paddle would only warn and
go on without it (``auto_cast`` and ``decorate`` on a CPU, or on a GPU without bfloat16,
train in float32), and a float32 run would pass for a bfloat16 one.  Paddle's CPU build runs
``nhwc`` and ``to_static``; the others need a GPU (and ``cinn`` a build with CINN).
"""
import copy
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
from paddle import nn

KNOBS = ("bf16", "o2", "nhwc", "cudnn_search", "to_static", "cinn")
# The ladder the benchmark measures: each rung adds one setting to the one before.
LADDER = [("defaults", ()), ("+ to_static", ("to_static",)),
          ("+ NHWC", ("to_static", "nhwc")),
          ("+ bf16 AMP (O1)", ("to_static", "nhwc", "bf16")),
          ("+ AMP O2 (bf16 weights)", ("to_static", "nhwc", "bf16", "o2")),
          ("+ cuDNN exhaustive search", ("to_static", "nhwc", "bf16", "o2", "cudnn_search")),
          ("+ CINN", ("to_static", "nhwc", "bf16", "o2", "cudnn_search", "cinn"))]


def check_knobs(knobs=()):
    """Refuse the knobs: unknown, or without the knob they build on (ValueError), or unable
    to run on the current device (``paddle.get_device()``) with this build (RuntimeError,
    naming every such knob and why)."""
    if set(knobs) - set(KNOBS):
        raise ValueError(f"unknown knobs {sorted(set(knobs) - set(KNOBS))}; choose from {KNOBS}")
    for knob, needs in (("o2", "bf16"), ("cinn", "to_static")):
        if knob in knobs and needs not in knobs:
            raise ValueError(f"knob {knob!r} builds on knob {needs!r}: add it")
    device = paddle.get_device()
    on_gpu = device.startswith("gpu")
    why = {}
    if {"bf16", "o2"} & set(knobs):
        if not on_gpu:
            why["bf16"] = ("Paddle runs AMP only on GPUs: on a CPU auto_cast and decorate warn "
                           "'amp_guard can only be enabled on CUDAPlace, XPUPlace, and "
                           "CustomPlace ... so it makes no effect' and train in float32")
        else:
            major, minor = paddle.device.cuda.get_device_capability()
            cuda = paddle.version.cuda()
            if major < 8 or cuda in (None, "False") or int(cuda.split(".")[0]) < 11:
                why["bf16"] = (f"Paddle's bfloat16 AMP needs compute capability >= 8.0 and CUDA "
                               f">= 11 (here {major}.{minor}, CUDA {cuda}), else it trains in "
                               f"float32")
        if "bf16" in why and "o2" in knobs:
            why["o2"] = "as 'bf16'"
    if "cudnn_search" in knobs and not (on_gpu and paddle.is_compiled_with_cuda()):
        why["cudnn_search"] = (
            "FLAGS_cudnn_exhaustive_search picks among cuDNN's convolution algorithms, on a GPU"
            + ("; Paddle's CPU build has no such flag" if not paddle.is_compiled_with_cuda()
               else ""))
    if "cinn" in knobs:
        if not paddle.is_compiled_with_cinn():
            why["cinn"] = "this Paddle build has no CINN (paddle.is_compiled_with_cinn())"
        elif not on_gpu:
            why["cinn"] = "Paddle's to_static uses CINN on GPUs only"
        elif os.environ.get("ENABLE_CINN_IN_DY2ST", "1").lower() in (
                "n", "no", "f", "false", "off", "0"):
            why["cinn"] = "the environment variable ENABLE_CINN_IN_DY2ST switches it off"
    if why:
        raise RuntimeError(f"cannot run on {device}: "
                           + "; ".join(f"knob {k!r}: {v}" for k, v in why.items()))


def resnet18(width, knobs=()):
    """``d2l.resnet18`` in the knobs' layout (NHWC with knob nhwc): the same parameters."""
    return d2l.resnet18(10, 1, width=width, data_format="NHWC" if "nhwc" in knobs else "NCHW")


def to_layout(X, knobs=()):
    """The batch (NCHW, as loaded) in the net's layout."""
    return X.transpose([0, 2, 3, 1]) if "nhwc" in knobs else X


def prepare(model, optimizer, knobs=()):
    """The model and its optimizer set up for the chosen knobs (those that cannot run on the
    current device are refused: :func:`check_knobs`)."""
    check_knobs(knobs)
    if paddle.is_compiled_with_cuda():          # a flag of the CUDA build only
        paddle.set_flags({"FLAGS_cudnn_exhaustive_search": "cudnn_search" in knobs})
    if "o2" in knobs:               # bf16 parameters; the optimizer keeps float32 master copies
        model, optimizer = paddle.amp.decorate(models=model, optimizers=optimizer, level="O2",
                                               dtype="bfloat16", master_weight=True)
    if "to_static" in knobs:
        model = paddle.jit.to_static(model, full_graph=True,
                                     backend="CINN" if "cinn" in knobs else None)
    return model, optimizer


def make_train_step(model, loss_fn, optimizer, knobs=()):
    """One SGD step on a batch (X, y) already on the device; returns its mean loss (on the
    device)."""
    level = "O2" if "o2" in knobs else "O1"

    def train_step(X, y):
        with paddle.amp.auto_cast(enable="bf16" in knobs, level=level, dtype="bfloat16"):
            logits = model(to_layout(X, knobs))
        loss = loss_fn(logits.astype("float32"), y)     # the loss in float32
        loss.backward()
        optimizer.step()
        optimizer.clear_grad(set_to_zero=False)         # free the gradients, no zero-filling
        return loss.detach()                # no float(): the host never waits for a step
    return train_step


@paddle.no_grad()
def evaluate(net, X, y, knobs=(), batch_size=256, optimizer=None):
    """Accuracy on the whole test set in inference mode (BatchNorm's running statistics), in
    float32 (outside auto_cast).  Under O2 the net's weights are bfloat16, rounded from the
    optimizer's float32 master copies: the accuracy is that of a float32 copy of the net
    holding the master copies (those `optimizer` keeps, by parameter name)."""
    if "o2" in knobs:
        masters = getattr(optimizer, "_master_weights", {})
        net_32 = copy.deepcopy(net).to(dtype="float32")
        for p, p_32 in zip(net.parameters(), net_32.parameters()):
            if p.name in masters:
                p_32.set_value(masters[p.name])
        net = net_32
    net.eval()
    correct = sum(d2l.accuracy(net(to_layout(paddle.to_tensor(X[i:i + batch_size]), knobs)),
                               paddle.to_tensor(y[i:i + batch_size]))
                  for i in range(0, len(y), batch_size))
    net.train()
    return correct / len(y)


def main(argv=None):
    args = recipe.parse_args(argv, knobs=KNOBS)           # --knobs: default all of them
    knobs = args.knobs
    rank, k = 0, 1                                       # one process, one device
    paddle.set_device(d2l.try_gpu())                     # GPU 0, else the CPU
    try:
        check_knobs(knobs)
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"paddle_fast.py: {e}")
    if args.batch_size % k:
        raise ValueError(f"the global batch size {args.batch_size} is not divisible by k = {k}")
    data = recipe.load_data(args)
    net = resnet18(args.width, knobs)
    if d2lmini:                           # the same initial weights in every framework
        d2l.canonical_init(net, d2lmini.resnet18_init(width=args.width, seed=args.seed))
    model = net
    loss_fn = nn.CrossEntropyLoss()
    optimizer = paddle.optimizer.SGD(learning_rate=args.lr, parameters=model.parameters())
    model, optimizer = prepare(model, optimizer, knobs)
    train_step = make_train_step(model, loss_fn, optimizer, knobs)
    # Each of the k devices gets batch_size // k samples of every global batch; whole batches
    # only, so that the traced graph and cuDNN's search see one shape.
    sampler = paddle.io.BatchSampler(
        range(len(data.y_train)), batch_size=args.batch_size // k, shuffle=True, drop_last=True)
    for epoch in range(args.epochs):
        np.random.seed(args.seed + epoch)                # this epoch's order (drawn by NumPy)
        start = time.perf_counter()
        losses = [train_step(paddle.to_tensor(data.X_train[idx]),
                             paddle.to_tensor(data.y_train[idx])) for idx in sampler]
        loss = float(paddle.stack(losses).mean())        # one wait, at the end of the epoch
        seconds = time.perf_counter() - start
        test_acc = evaluate(net, data.X_test, data.y_test, knobs, optimizer=optimizer)
        if rank == 0:
            recipe.report(args, epoch, loss, test_acc, devices=k, framework=d2l.FRAMEWORK,
                          seconds=seconds)


# -- This file copied alone, without the book's package d2lmini: what it takes from d2lmini. ---
if d2lmini is None:
    import argparse
    import gzip
    from types import SimpleNamespace

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

    class Residual(nn.Layer):
        """Two 3x3 convolutions and the shortcut (a 1x1 convolution where the block strides)."""
        def __init__(self, cin, cout, stride, f):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2D(cin, cout, 3, stride, padding=1, data_format=f),
                nn.BatchNorm2D(cout, data_format=f), nn.ReLU(),
                nn.Conv2D(cout, cout, 3, padding=1, data_format=f),
                nn.BatchNorm2D(cout, data_format=f))
            self.shortcut = (nn.Conv2D(cin, cout, 1, stride, data_format=f) if stride > 1
                             else nn.Identity())

        def forward(self, X):
            return nn.functional.relu(self.body(X) + self.shortcut(X))

    def _resnet18(num_classes, in_channels, width, data_format="NCHW"):
        """ResNet-18 for 28x28 images (a 3x3 stem, no max-pooling), Paddle's initial weights;
        every layer in `data_format` (the same parameters in both)."""
        c, f = [width] + [width * 2 ** (i // 2) for i in range(8)], data_format
        return nn.Sequential(
            nn.Conv2D(in_channels, width, 3, padding=1, data_format=f),
            nn.BatchNorm2D(width, data_format=f), nn.ReLU(),
            *[Residual(cin, cout, 2 if cout > cin else 1, f) for cin, cout in zip(c, c[1:])],
            nn.AdaptiveAvgPool2D(1, data_format=f), nn.Flatten(), nn.Linear(8 * width, num_classes))

    d2l = SimpleNamespace(
        FRAMEWORK="paddle", resnet18=_resnet18,
        try_gpu=lambda i=0: f"gpu:{i}" if paddle.device.cuda.device_count() > i else "cpu",
        accuracy=lambda y_hat, y: float((y_hat.argmax(axis=1) == y).astype("float32").sum()))


if __name__ == "__main__":
    main()

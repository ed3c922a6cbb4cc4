"""The concise chapter's recipe in PyTorch on one device, with the fast path: pytorch_one.py
plus the settings a practitioner turns on for a GPU.

    python pytorch_fast.py [--epochs N ...] [--knobs channels_last,benchmark,bf16,compile]

* ``channels_last``: tensors in NHWC, the layout of the GPU's tensor-core convolutions (with
  NCHW, PyTorch's default, cuDNN transposes around every bfloat16 or float16 convolution; in
  float32 with TF32 it gains little: 11.55 -> 10.51 ms a step on one H200,
  benchmarks/h200-2026-11-27);
* ``benchmark``: ``torch.backends.cudnn.benchmark``: time the convolution algorithms once per
  input shape and keep the fastest;
* ``compile``: ``torch.compile`` the model, fusing the elementwise work around the
  convolutions (BatchNorm, ReLU, the additions) into fewer kernels, and on a GPU replaying
  forward and backward as CUDA graphs (``mode="reduce-overhead"``): one launch instead of
  hundreds, which is what a small model's eager step waits for; the update then runs as one
  fused kernel (``SGD(fused=True)``);
* ``bf16``: ``torch.autocast`` to bfloat16 -- matrix products and convolutions in 16 bits on
  the tensor cores, the weights and the optimizer in float32 (no loss scaling needed).  Eager,
  its casts are more kernels to launch: it pays once the launches are gone (``compile``).
  On a CPU without AVX-512, PyTorch emulates bfloat16 many times slower than float32: the
  recipe leaves it out there (:func:`check_knobs`).

Copied alone, it needs PyTorch and NumPy only: PyTorch's initial weights, the data files in --data.
"""
import os
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

try:                                      # the book's package: settings, data, initial weights
    import d2lmini
except ImportError:                       # this file copied alone: see its end
    d2lmini = None
if d2lmini:
    from d2lmini import recipe
    from d2lmini import torch as d2l
    from d2lmini.hardware import cpu_bf16_gap

KNOBS = ("channels_last", "benchmark", "compile", "bf16")
# The ladder the benchmark measures: each rung adds one setting to the one before.
LADDER = [("defaults", ()), ("channels_last", ("channels_last",)),
          ("+ cudnn.benchmark", ("channels_last", "benchmark")),
          ("+ torch.compile", ("channels_last", "benchmark", "compile")),
          ("+ bf16 autocast", ("channels_last", "benchmark", "compile", "bf16"))]


def check_knobs(knobs, device):
    """Refuses, by name and with the reason, a knob that does not pay on `device`: bfloat16 on
    a CPU whose oneDNN has no bfloat16 kernels (below AVX-512), where PyTorch emulates it
    5-12x slower than float32."""
    if ("bf16" in knobs and device.type == "cpu"
            and not torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        raise RuntimeError("knob bf16 does not pay on this CPU: "
                           f"{cpu_bf16_gap() or 'oneDNN has no bfloat16 kernels here'}; "
                           "PyTorch would emulate it, 5-12x slower than float32")


def default_knobs(device):
    """The knobs ``--knobs`` defaults to on `device`: all that :func:`check_knobs` accepts."""
    return recipe.accepted_knobs(check_knobs, KNOBS, device)


def prepare(net, device, knobs=()):
    """The model on `device`, set up for the chosen knobs."""
    torch.backends.cudnn.benchmark = "benchmark" in knobs
    net = net.to(device)
    if "channels_last" in knobs:
        net = net.to(memory_format=torch.channels_last)
    if "compile" not in knobs:
        return net
    torch.compiler.reset()        # a fresh start: no earlier model's code counts to its limit
    # CUDA graphs exist on GPUs only; on the CPU the compiled model fuses, nothing more
    return torch.compile(net, mode="reduce-overhead" if device.type == "cuda" else None)


def make_optimizer(model, lr, device, knobs=()):
    """SGD; with ``compile`` on a GPU, the update of every tensor in one fused kernel."""
    fused = "compile" in knobs and device.type == "cuda"
    return torch.optim.SGD(model.parameters(), lr=lr, fused=fused or None)


def make_train_step(model, loss_fn, optimizer, device, knobs=()):
    """One SGD step on a batch already on `device`; returns the loss (on the device)."""
    layout = torch.channels_last if "channels_last" in knobs else torch.contiguous_format
    graphs = "compile" in knobs

    def train_step(X, y):
        if graphs:                            # a new step: the graphs' outputs may be reused
            torch.compiler.cudagraph_mark_step_begin()
        X = X.contiguous(memory_format=layout)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled="bf16" in knobs):
            loss = loss_fn(model(X), y)       # autocast: the loss is computed in float32
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()                  # no .item(): the host never waits for a step
    return train_step


@torch.no_grad()
def evaluate(net, X, y, device, batch_size=256):
    """Accuracy on the whole test set (X, y), in inference mode, in float32."""
    net.eval()                            # BatchNorm: the running statistics
    correct = torch.zeros((), dtype=torch.int64, device=device)
    for i in range(0, len(y), batch_size):
        y_hat = net(torch.from_numpy(X[i:i + batch_size]).to(device))
        correct += (y_hat.argmax(1) == torch.from_numpy(y[i:i + batch_size]).to(device)).sum()
    return correct.item() / len(y)


def main(argv=None):
    device = d2l.try_gpu()
    args = recipe.parse_args(argv, knobs=KNOBS, default_knobs=default_knobs(device))
    knobs = args.knobs                                    # --knobs: default all that pay here
    check_knobs(knobs, device)
    data = recipe.load_data(args)
    net = d2l.resnet18(10, 1, width=args.width)
    if d2lmini:                           # the same initial weights in every framework
        d2l.canonical_init(net, d2lmini.resnet18_init(width=args.width, seed=args.seed))
    model = prepare(net, device, knobs)
    optimizer = make_optimizer(model, args.lr, device, knobs)
    train_step = make_train_step(model, nn.CrossEntropyLoss(), optimizer, device, knobs)
    train_set = TensorDataset(torch.from_numpy(data.X_train), torch.from_numpy(data.y_train))
    sampler = RandomSampler(train_set, generator=torch.Generator())
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler,
                        pin_memory=device.type == "cuda")   # page-locked: copies run async
    for epoch in range(args.epochs):
        sampler.generator.manual_seed(args.seed + epoch)  # a new order each epoch, seeded
        model.train()
        start, losses = time.perf_counter(), []
        for X, y in loader:
            losses.append(train_step(X.to(device, non_blocking=True),
                                     y.to(device, non_blocking=True)))
        loss = torch.stack(losses).mean().item()      # one wait, at the end of the epoch
        seconds = time.perf_counter() - start
        test_acc = evaluate(net, data.X_test, data.y_test, device)
        recipe.report(args, epoch, loss, test_acc, devices=1,
                      framework=d2l.FRAMEWORK, seconds=seconds)


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

    class Residual(nn.Module):
        """Two 3x3 convolutions and the shortcut (a 1x1 convolution where the block strides)."""
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout))
            self.shortcut = nn.Conv2d(cin, cout, 1, stride) if stride > 1 else nn.Identity()

        def forward(self, X):
            return torch.relu(self.body(X) + self.shortcut(X))

    def resnet18(num_classes, in_channels, width):
        """ResNet-18 for 28x28 images (a 3x3 stem, no max-pooling), PyTorch's initial weights."""
        c = [width] + [width * 2 ** (i // 2) for i in range(8)]   # the stem's, the 8 blocks'
        return nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            *[Residual(cin, cout, 2 if cout > cin else 1) for cin, cout in zip(c, c[1:])],
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * width, num_classes))

    d2l = SimpleNamespace(
        FRAMEWORK="torch", resnet18=resnet18, num_gpus=torch.cuda.device_count,
        try_gpu=lambda: torch.device("cuda:0" if torch.cuda.is_available() else "cpu"))


if __name__ == "__main__":
    main()

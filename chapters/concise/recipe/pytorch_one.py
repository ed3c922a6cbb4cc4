"""The concise chapter's recipe in PyTorch: ResNet-18 on Fashion-MNIST with plain SGD, from
d2lmini's canonical initial weights, on one device (a GPU if there is one).  Copied alone, it
needs PyTorch and NumPy only: PyTorch's initial weights, the data files in --data.

    python pytorch_one.py [--epochs N --batch-size B ...]    # defaults: the profile's
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


def train_step(model, loss_fn, optimizer, X, y):
    """One SGD step on the batch (X, y); returns its mean loss (on the device)."""
    optimizer.zero_grad()
    loss = loss_fn(model(X), y)
    loss.backward()
    optimizer.step()
    return loss.detach()                  # no .item(): the host does not wait for every step


@torch.no_grad()
def evaluate(net, X, y, device, batch_size=256):
    """Accuracy on the whole test set (X, y), in inference mode."""
    net.eval()                            # BatchNorm: the running statistics
    correct = 0
    for i in range(0, len(y), batch_size):
        y_hat = net(torch.from_numpy(X[i:i + batch_size]).to(device))
        correct += (y_hat.argmax(1).cpu() == torch.from_numpy(y[i:i + batch_size])).sum()
    return correct.item() / len(y)


def main():
    args = recipe.parse_args()
    data = recipe.load_data(args)
    device, k = d2l.try_gpu(), 1
    if args.batch_size % k:
        raise ValueError(f"the global batch size {args.batch_size} is not divisible by k = {k}")
    batch_size = args.batch_size // k     # each of the k devices gets 1/k of the global batch
    net = d2l.resnet18(10, 1, width=args.width)
    if d2lmini:                           # the same initial weights in every framework
        d2l.canonical_init(net, d2lmini.resnet18_init(width=args.width, seed=args.seed))
    model = net.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    train_set = TensorDataset(torch.from_numpy(data.X_train), torch.from_numpy(data.y_train))
    sampler = RandomSampler(train_set, generator=torch.Generator())
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler,
                        pin_memory=device.type == "cuda")
    for epoch in range(args.epochs):
        sampler.generator.manual_seed(args.seed + epoch)  # a new order each epoch, seeded
        model.train()
        start, losses = time.perf_counter(), []
        for X, y in loader:
            losses.append(train_step(model, loss_fn, optimizer, X.to(device, non_blocking=True),
                                     y.to(device, non_blocking=True)))
        loss = torch.stack(losses).mean().item()          # one wait, for the last step
        seconds = time.perf_counter() - start
        test_acc = evaluate(net, data.X_test, data.y_test, device)
        recipe.report(args, epoch, loss, test_acc, devices=k,
                      framework=d2l.FRAMEWORK, seconds=seconds)


# -- This file copied alone, without the book's package d2lmini: what it takes from d2lmini. ---
if d2lmini is None:
    import argparse
    import gzip
    from types import SimpleNamespace

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

"""PyTorch backend of d2lmini.

Devices: ``cuda:i`` when there are GPUs.  Without CUDA, PyTorch has a single CPU device, so
``try_all_gpus()`` returns ``D2LMINI_NUM_DEVICES`` *stand-ins*: the same
``torch.device('cpu')`` repeated.  Code written against the list (one parameter copy and
one shard per entry) runs unchanged on GPUs; on the CPU the copies are separate tensors in
the same memory.  Real multi-process data parallelism on the CPU uses
``torch.distributed`` with the gloo backend (concise chapter).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .config import num_simulated_devices
from .utils import Accumulator, check_device_count, shard_slices

FRAMEWORK = "torch"
SIMULATED_NOTE = ("PyTorch has one CPU device: the simulated devices are stand-ins, "
                  "torch.device('cpu') repeated; each holds its own tensors.")


def num_gpus() -> int:
    return torch.cuda.device_count()


def try_gpu(i: int = 0) -> torch.device:
    """GPU ``i`` if it exists, else the CPU."""
    return torch.device(f"cuda:{i}") if num_gpus() > i else torch.device("cpu")


def try_all_gpus() -> list[torch.device]:
    """All GPUs, or ``D2LMINI_NUM_DEVICES`` CPU stand-ins; never empty."""
    n = num_gpus()
    if n:
        return [torch.device(f"cuda:{i}") for i in range(n)]
    return [torch.device("cpu")] * num_simulated_devices()


def get_devices(k: int) -> list[torch.device]:
    """The first ``k`` devices of :func:`try_all_gpus`, with a clear error if there are fewer."""
    return check_device_count(k, try_all_gpus(), "Set D2LMINI_NUM_DEVICES to simulate more "
                              "CPU devices.")


def synchronize(devices=None) -> None:
    """Wait for queued GPU work (CPU work is synchronous)."""
    for d in set(devices or try_all_gpus()):
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def to_numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def split_batch(X, y, devices):
    """Split ``X`` and ``y`` along the batch axis into ``len(devices)`` shards, one per device."""
    if len(X) != len(y):
        raise ValueError(f"X has {len(X)} samples but y has {len(y)}")
    slices = shard_slices(len(y), len(devices))
    X, y = torch.as_tensor(X), torch.as_tensor(y)
    return ([X[s].to(d, non_blocking=True) for s, d in zip(slices, devices)],
            [y[s].to(d, non_blocking=True) for s, d in zip(slices, devices)])


def accuracy(y_hat, y) -> float:
    """Number of correct predictions."""
    return float((y_hat.argmax(dim=1) == y).sum())


@torch.no_grad()
def evaluate_accuracy(net, data_iter, devices) -> float:
    """Accuracy over ``data_iter`` with every batch split across ``devices``.

    ``net`` is a callable applied to each shard, or a list of callables, one per device.
    """
    nets = net if isinstance(net, (list, tuple)) else [net] * len(devices)
    for f in nets:
        if isinstance(f, nn.Module):
            f.eval()
    metric = Accumulator(2)
    for X, y in data_iter:
        X_shards, y_shards = split_batch(X, y, devices)
        metric.add(sum(accuracy(f(Xs), ys) for f, Xs, ys in zip(nets, X_shards, y_shards)),
                   len(y))
    return metric[0] / metric[1]


class Residual(nn.Module):
    """The residual block of ResNet (two 3x3 convolutions, optional 1x1 shortcut)."""

    def __init__(self, in_channels, channels, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv3 = nn.Conv2d(in_channels, channels, 1, stride=strides) if use_1x1conv else None
        self.bn1, self.bn2 = nn.BatchNorm2d(channels), nn.BatchNorm2d(channels)

    def forward(self, X):
        Y = torch.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3 is not None:
            X = self.conv3(X)
        return torch.relu(Y + X)


def resnet18(num_classes: int = 10, in_channels: int = 1, width: int = 64) -> nn.Module:
    """The seeds' ResNet-18 variant for 28x28 inputs: a 3x3 stem, no max-pooling.

    ``width`` is the channel count of the first stage (64 in the seed); the stages have
    width, 2*width, 4*width, 8*width channels.
    """
    def stage(cin, cout, first):
        return nn.Sequential(Residual(cin, cout, use_1x1conv=not first, strides=1 if first else 2),
                             Residual(cout, cout))

    w = width
    return nn.Sequential(
        nn.Conv2d(in_channels, w, kernel_size=3, stride=1, padding=1), nn.BatchNorm2d(w), nn.ReLU(),
        stage(w, w, True), stage(w, 2 * w, False), stage(2 * w, 4 * w, False),
        stage(4 * w, 8 * w, False),
        nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(8 * w, num_classes))

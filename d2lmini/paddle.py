"""PaddlePaddle backend of d2lmini.

Devices: ``CUDAPlace(i)`` when Paddle sees GPUs.  ``CPUPlace()`` takes no index -- Paddle
has one CPU place -- so without GPUs ``try_all_gpus()`` returns ``D2LMINI_NUM_DEVICES``
*stand-ins*: ``CPUPlace()`` repeated; each entry holds its own tensors in the same memory.
Real multi-process data parallelism on the CPU uses ``paddle.distributed`` with the gloo
backend (concise chapter).

``import paddle`` sets the root logger to INFO (which makes other libraries, JAX among them,
print timestamped INFO lines); this module puts the previous level back.
"""
from __future__ import annotations

import logging
import warnings

# Paddle warns at import that the ccache compiler cache is missing; it only matters for
# building C++ extensions, which this book never does.
warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)
_root_level = logging.getLogger().level
import paddle  # noqa: E402

logging.getLogger().setLevel(_root_level)

import numpy as np  # noqa: E402
from paddle import nn  # noqa: E402

from .config import num_simulated_devices  # noqa: E402
from .utils import check_device_count, evaluate_accuracy_with, shard_slices  # noqa: E402

FRAMEWORK = "paddle"
SIMULATED_NOTE = ("Paddle has one CPU place (CPUPlace takes no index): the simulated devices "
                  "are stand-ins, CPUPlace() repeated; each holds its own tensors.")


def num_gpus() -> int:
    if not paddle.device.is_compiled_with_cuda():
        return 0
    return paddle.device.cuda.device_count()


def try_gpu(i: int = 0):
    """GPU ``i`` if it exists, else the CPU."""
    return paddle.CUDAPlace(i) if num_gpus() > i else paddle.CPUPlace()


def try_all_gpus() -> list:
    """All GPUs, or ``D2LMINI_NUM_DEVICES`` CPU stand-ins; never empty."""
    n = num_gpus()
    if n:
        return [paddle.CUDAPlace(i) for i in range(n)]
    return [paddle.CPUPlace() for _ in range(num_simulated_devices())]


def get_devices(k: int) -> list:
    """The first ``k`` devices of :func:`try_all_gpus`, with a clear error if there are fewer."""
    return check_device_count(k, try_all_gpus(), "Set D2LMINI_NUM_DEVICES to simulate more "
                              "CPU devices.")


def synchronize(devices=None) -> None:
    """Wait for queued GPU work (CPU work is synchronous)."""
    if num_gpus():
        paddle.device.synchronize()


def to_numpy(x) -> np.ndarray:
    return x.numpy() if isinstance(x, paddle.Tensor) else np.asarray(x)


def split_batch(X, y, devices):
    """Split ``X`` and ``y`` along the batch axis into ``len(devices)`` shards, one per device."""
    if len(X) != len(y):
        raise ValueError(f"X has {len(X)} samples but y has {len(y)}")
    slices = shard_slices(len(y), len(devices))
    X, y = to_numpy(X), to_numpy(y)
    return ([paddle.to_tensor(X[s], place=d) for s, d in zip(slices, devices)],
            [paddle.to_tensor(y[s], place=d) for s, d in zip(slices, devices)])


def accuracy(y_hat, y) -> float:
    """Number of correct predictions."""
    return float((y_hat.argmax(axis=1) == y).astype("float32").sum())


@paddle.no_grad()
def evaluate_accuracy(net, data_iter, devices) -> float:
    """Accuracy over ``data_iter`` with every batch split across ``devices``.

    ``net`` is a callable applied to each shard, or a list of callables, one per device;
    a last batch smaller than the device count uses fewer devices.
    """
    for f in (net if isinstance(net, (list, tuple)) else [net]):
        if isinstance(f, nn.Layer):
            f.eval()
    return evaluate_accuracy_with(split_batch, accuracy, net, data_iter, devices)


class Residual(nn.Layer):
    """The residual block of ResNet (two 3x3 convolutions, optional 1x1 shortcut)."""

    def __init__(self, in_channels, channels, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = nn.Conv2D(in_channels, channels, 3, padding=1, stride=strides)
        self.conv2 = nn.Conv2D(channels, channels, 3, padding=1)
        self.conv3 = nn.Conv2D(in_channels, channels, 1, stride=strides) if use_1x1conv else None
        self.bn1, self.bn2 = nn.BatchNorm2D(channels), nn.BatchNorm2D(channels)

    def forward(self, X):
        Y = nn.functional.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3 is not None:
            X = self.conv3(X)
        return nn.functional.relu(Y + X)


def resnet18(num_classes: int = 10, in_channels: int = 1, width: int = 64) -> nn.Layer:
    """The seeds' ResNet-18 variant for 28x28 inputs: a 3x3 stem, no max-pooling.

    ``width`` is the channel count of the first stage (64 in the seed); the stages have
    width, 2*width, 4*width, 8*width channels.
    """
    def stage(cin, cout, first):
        return nn.Sequential(Residual(cin, cout, use_1x1conv=not first, strides=1 if first else 2),
                             Residual(cout, cout))

    w = width
    return nn.Sequential(
        nn.Conv2D(in_channels, w, kernel_size=3, stride=1, padding=1), nn.BatchNorm2D(w), nn.ReLU(),
        stage(w, w, True), stage(w, 2 * w, False), stage(2 * w, 4 * w, False),
        stage(4 * w, 8 * w, False),
        nn.AdaptiveAvgPool2D((1, 1)), nn.Flatten(), nn.Linear(8 * w, num_classes))

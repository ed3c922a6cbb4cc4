"""PyTorch backend of d2lmini.

Devices: ``cuda:i`` when there are GPUs (``D2LMINI_NUM_DEVICES`` of them; more than exist are
stand-ins, the GPUs repeated -- see :func:`d2lmini.config.plan_devices`).  Without CUDA,
PyTorch has a single CPU device, so ``try_all_gpus()`` returns ``D2LMINI_NUM_DEVICES``
*stand-ins*: the same ``torch.device('cpu')`` repeated.  Code written against the list (one
parameter copy and one shard per entry) runs unchanged on GPUs; on the CPU the copies are
separate tensors in the same memory.  Real multi-process data parallelism on the CPU uses
``torch.distributed`` with the gloo backend (concise chapter).
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch import nn

from .config import device_plan, exact_everywhere
from .utils import check_device_count, evaluate_accuracy_with, shard_slices
import d2lmini  # the saved all-reduces at the end of this module use its schedules

FRAMEWORK = "torch"

# PyTorch's flags that make GPU results depend on more than the maths: TF32 (its default for
# cuDNN convolutions on Ampere and newer; matrix products default to full float32) and
# autotuned, non-deterministic cuDNN kernels.  The values exact_numerics() sets.  TF32 is set
# with the current API, ``fp32_precision = "ieee"`` (torch >= 2.9), where it exists: PyTorch
# raises on a read of the legacy ``allow_tf32`` flags once a program has set the new ones, so
# the legacy flags would break a reader's program that uses the new API.  _TF32_FLAGS: the
# switch of each operation; _TF32_VALUES: its values for TF32 off and on.
if hasattr(torch.backends.cudnn, "conv"):
    _TF32_FLAGS = {"matmul": (torch.backends.cuda.matmul, "fp32_precision"),
                   "conv": (torch.backends.cudnn.conv, "fp32_precision"),
                   "rnn": (torch.backends.cudnn.rnn, "fp32_precision")}
    _TF32_VALUES = ("ieee", "tf32")
else:                                                         # legacy: torch < 2.9
    _TF32_FLAGS = {"matmul": (torch.backends.cuda.matmul, "allow_tf32"),
                   "conv": (torch.backends.cudnn, "allow_tf32")}
    _TF32_VALUES = (False, True)
_TF32_OFF = {flag: _TF32_VALUES[False] for flag in _TF32_FLAGS.values()}
_EXACT = {**_TF32_OFF,
          (torch.backends.cudnn, "deterministic"): True,
          (torch.backends.cudnn, "benchmark"): False}


def _set_flags(values: dict) -> dict:
    old = {key: getattr(*key) for key in values}
    for (obj, name), value in values.items():
        setattr(obj, name, value)
    return old


@contextlib.contextmanager
def _flags(values: dict):
    """Within the block, the flags ``values`` sets; their values before it come back after."""
    old = _set_flags(values)
    try:
        yield
    finally:
        _set_flags(old)


def exact_numerics():
    """Within the block, full float32 on GPUs (no TF32) and deterministic cuDNN kernels, so
    that proofs hold to float32 (or float64) precision and repeated runs are bit-identical;
    PyTorch's own settings come back afterwards.  Training and timing run outside such blocks,
    with PyTorch's defaults (``D2LMINI_EXACT=1`` makes the whole process exact).  No effect on
    the CPU."""
    return _flags(_EXACT)


def tf32_allowed(op: str = "matmul") -> bool:
    """Whether float32 ``op`` (``"matmul"``: matrix products; ``"conv"``: cuDNN convolutions)
    may use TF32 on GPUs now, read with the API :func:`exact_numerics` sets (PyTorch's getter
    resolves a ``"none"`` to the level above; ``"none"`` at the top is full float32)."""
    return getattr(*_TF32_FLAGS[op]) == _TF32_VALUES[True]


def allow_tf32(op: str = "matmul", allow: bool = True):
    """Within the block, float32 ``op`` (as in :func:`tf32_allowed`) may use TF32 on GPUs
    (``allow``) or not; PyTorch's own setting comes back afterwards.  Set with the API
    :func:`exact_numerics` uses, so it does not raise in a program that has set the current one.
    No effect on the CPU."""
    return _flags({_TF32_FLAGS[op]: _TF32_VALUES[bool(allow)]})


if exact_everywhere():
    _set_flags(_EXACT)
SIMULATED_NOTE = ("PyTorch has one CPU device: the simulated devices are "
                  "torch.device('cpu') repeated; each holds its own tensors.")


def num_gpus() -> int:
    return torch.cuda.device_count()


def try_gpu(i: int = 0) -> torch.device:
    """GPU ``i`` if it exists, else the CPU."""
    return torch.device(f"cuda:{i}") if num_gpus() > i else torch.device("cpu")


def plan(at_least: int = 1):
    """How many devices of which kind the notebooks use (decided once; see
    :func:`d2lmini.config.plan_devices`)."""
    return device_plan(FRAMEWORK, num_gpus, at_least)


def try_all_gpus(at_least: int = 1) -> list[torch.device]:
    """The lesson's devices: the GPUs (``D2LMINI_NUM_DEVICES`` of them, repeated as stand-ins
    if there are fewer), or ``D2LMINI_NUM_DEVICES`` CPU stand-ins; never empty.
    ``at_least``: the fewest devices the lesson needs; fewer real ones give stand-ins."""
    p = plan(at_least)
    if p.kind == "gpu":
        return [torch.device(f"cuda:{i}") for i in p.gpu_ids()]
    return [torch.device("cpu")] * p.count


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

    ``net`` is a callable applied to each shard, or a list of callables, one per device;
    a last batch smaller than the device count uses fewer devices.
    """
    for f in (net if isinstance(net, (list, tuple)) else [net]):
        if isinstance(f, nn.Module):
            f.eval()
    return evaluate_accuracy_with(split_batch, accuracy, net, data_iter, devices)


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



def _canonical_modules(net: nn.Module) -> dict[str, nn.Module]:
    """The layers of ``resnet18``'s net under their canonical names (d2lmini.models)."""
    from .models import resnet18_layers
    return resnet18_layers(net[0], net[1], [net[2 + s] for s in range(1, 5)], net[9])


def canonical_init(net: nn.Module, arrays: dict) -> nn.Module:
    """Load ``d2lmini.resnet18_init``'s draw into ``resnet18``'s ``net`` (in place; returned).

    PyTorch's layouts are the canonical ones, so every tensor is copied as it is; BatchNorm's
    gamma/beta are ``weight``/``bias`` and its running statistics are buffers.
    """
    used = set()
    with torch.no_grad():
        for prefix, mod in _canonical_modules(net).items():
            rename = {"weight": "gamma", "bias": "beta"} if isinstance(mod, nn.BatchNorm2d) else {}
            tensors = dict(mod.named_parameters(recurse=False))
            tensors.update({n: b for n, b in mod.named_buffers(recurse=False)
                            if n in ("running_mean", "running_var")})
            for name, t in tensors.items():
                key = f"{prefix}.{rename.get(name, name)}"
                if key not in arrays:
                    raise ValueError(f"canonical_init: no array {key!r} for the net's {prefix}.{name}")
                a = torch.as_tensor(arrays[key])
                if tuple(a.shape) != tuple(t.shape):
                    raise ValueError(f"canonical_init: {key} has shape {tuple(a.shape)}, "
                                     f"the net's tensor {tuple(t.shape)} (another width?)")
                t.copy_(a.to(t.dtype))
                used.add(key)
    from .models import check_all_used
    check_all_used(arrays, used)
    return net

# --------------------------------------------------------------------------------------------
# Cross-process BatchNorm that also runs on the CPU (gloo).
#
# nn.SyncBatchNorm is PyTorch's tool, but in torch 2.13 it refuses CPU inputs inside an
# initialized process group (ValueError) and its kernels (torch.batch_norm_stats, ...) have
# no CPU implementation.  The class below computes the statistics of the *global* batch with
# two all-reduces; autograd differentiates through them because the all-reduce's backward is
# again an all-reduce.  On GPUs use nn.SyncBatchNorm.convert_sync_batchnorm instead.
# --------------------------------------------------------------------------------------------

class _AllReduceSum(torch.autograd.Function):
    """Sum a tensor over the ranks of ``group``; the gradient is summed over the ranks too.

    Every rank receives S = sum_r x_r, and every rank's loss depends on S, so the gradient
    with respect to x_r is the sum over ranks of dLoss_r'/dS: an all-reduce again.
    """

    @staticmethod
    def forward(ctx, x, group):
        import torch.distributed as dist
        ctx.group = group
        x = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        import torch.distributed as dist
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None


class AllReduceBatchNorm2d(nn.BatchNorm2d):
    """``BatchNorm2d`` whose training-mode statistics are those of the batch of *all* ranks.

    Outside a process group (or with one rank, or in eval mode) it is exactly
    ``nn.BatchNorm2d``.  In training mode every rank all-reduces the per-channel sum and
    count (-> global mean), then the sum of squared deviations (-> global biased variance),
    normalizes its own shard with them and updates the running statistics as ``BatchNorm2d``
    does on the full batch (unbiased variance, ``momentum``).  Shards may differ in size.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self.process_group = process_group

    def _world_size(self) -> int:
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            return 1
        return dist.get_world_size(self.process_group)

    def forward(self, x):
        if not self.training or self._world_size() == 1:
            return super().forward(x)
        self._check_input_dim(x)
        C, dims = x.shape[1], [0, 2, 3]
        shape = (1, C, 1, 1)
        local = torch.cat([x.sum(dims), x.new_full((1,), x.numel() // C)])
        total = _AllReduceSum.apply(local, self.process_group)
        n, mean = total[C], total[:C] / total[C]
        xc = x - mean.view(shape)
        var = _AllReduceSum.apply((xc * xc).sum(dims), self.process_group) / n
        y = xc * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                     else self.momentum)
                self.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
                self.running_var.mul_(1 - m).add_(var.detach() * n / (n - 1), alpha=m)
        return y


def convert_allreduce_batchnorm(module: nn.Module, process_group=None) -> nn.Module:
    """Replace every ``nn.BatchNorm2d`` in ``module`` by an :class:`AllReduceBatchNorm2d`
    carrying the same parameters and running statistics (like
    ``nn.SyncBatchNorm.convert_sync_batchnorm``, but usable on the CPU)."""
    if isinstance(module, nn.BatchNorm2d) and not isinstance(module, AllReduceBatchNorm2d):
        tensors = list(module.parameters()) + list(module.buffers())
        like = {"device": tensors[0].device, "dtype": tensors[0].dtype} if tensors else {}
        new = AllReduceBatchNorm2d(module.num_features, module.eps, module.momentum,
                                   module.affine, module.track_running_stats, process_group,
                                   **like)
        with torch.no_grad():
            if module.affine:
                new.weight.copy_(module.weight)
                new.bias.copy_(module.bias)
            if module.track_running_stats:
                new.running_mean.copy_(module.running_mean)
                new.running_var.copy_(module.running_var)
                new.num_batches_tracked.copy_(module.num_batches_tracked)
        new.train(module.training)
        return new
    for name, child in module.named_children():
        module.add_module(name, convert_allreduce_batchnorm(child, process_group))
    return module


@torch.no_grad()
def recalibrate_batchnorm(net: nn.Module, batches, device=None) -> int:
    """Re-estimate the running statistics of every BatchNorm layer with the current weights.

    During training the running statistics are an exponential average (``momentum``) of the
    statistics of past batches, computed with past weights; after a few steps they describe a
    network that no longer exists.  This resets them, runs ``batches`` (pairs ``(X, y)``;
    ``y`` is ignored) forward in training mode without gradients, and keeps the plain average
    of their batch statistics ("precise BatchNorm").  Returns the number of batches used.
    Cross-process BatchNorm layers (``nn.SyncBatchNorm``, :class:`AllReduceBatchNorm2d`)
    recalibrate on the batches of all ranks, so every rank must pass the same number.
    """
    bns = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    momenta, was_training = [m.momentum for m in bns], net.training
    for m in bns:
        m.reset_running_stats()
        m.momentum = None                 # cumulative average instead of exponential
    net.train()
    count = 0
    for X, _ in batches:
        net(torch.as_tensor(X).to(device) if device is not None else torch.as_tensor(X))
        count += 1
    for m, momentum in zip(bns, momenta):
        m.momentum = momentum
    net.train(was_training)
    return count


# ------------------------------------------------- the from-scratch chapter's all-reduces
# Saved as chapters/scratch/pytorch.ipynb writes them (its cells tagged step:allreduce and
# step:ring_allreduce), for the chapters that use them again; tests/test_written_once.py
# holds the two copies to the same text.
def allreduce(data):
    for i in range(1, len(data)):
        data[0].add_(data[i].to(data[0].device))   # reduce: sum into device 0's buffer
    for i in range(1, len(data)):
        data[i].copy_(data[0])                       # broadcast: overwrite every other buffer


def ring_allreduce(data):
    k = len(data)
    flat = [x.view(-1) for x in data]          # views: writes go into the caller's tensors
    chunks = d2lmini.chunk_slices(flat[0].numel(), k)
    sent = [0] * k                             # bytes sent by each device
    for step in d2lmini.ring_schedule(k):
        # all transfers of a step run concurrently: take every message first ...
        messages = [(t, flat[t.src][chunks[t.chunk]].to(flat[t.dst].device, copy=True))
                    for t in step]
        for t, msg in messages:                # ... then deliver them
            target = flat[t.dst][chunks[t.chunk]]
            if t.op == 'add':
                target.add_(msg)               # reduce-scatter: accumulate
            else:
                target.copy_(msg)              # all-gather: overwrite
            sent[t.src] += msg.numel() * msg.element_size()
    return sent

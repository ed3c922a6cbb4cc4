"""MXNet backend of d2lmini (classic ``mx.nd`` / Gluon API).

Devices: ``mx.gpu(i)`` when there are GPUs (``D2LMINI_NUM_DEVICES`` of them, repeated as
stand-ins if there are fewer), else ``mx.cpu(0) .. mx.cpu(N-1)``: MXNet treats CPU contexts
with different ids as distinct devices (separate buffers, explicit copies), so the simulation
is real device placement, only on the same processor.

The last MXNet release (1.9.1, ``mxnet-cu112``) has kernels for compute capabilities 5.x-8.x
only: on a Hopper (H100, H200) or newer GPU its first operator would fail with "no kernel image
is available".  There the backend uses CPU contexts and says so (see :func:`plan`).
"""
from __future__ import annotations

import contextlib
import os

from . import _mxnet_compat
from .config import exact_everywhere, host_has_gpu

if exact_everywhere() or host_has_gpu():
    # MXNet reads these once per process, so its numerics cannot be scoped to a block: on a GPU
    # host it always runs exact (no cuDNN autotuning, which picks kernels by timing and prints
    # "Running performance tests ..." to stderr; deterministic kernels; no TF32 through
    # NVIDIA_TF32_OVERRIDE, read by cuDNN/cuBLAS when they start).  See exact_numerics().
    os.environ.setdefault("MXNET_CUDNN_AUTOTUNE_DEFAULT", "0")
    os.environ.setdefault("MXNET_ENFORCE_DETERMINISM", "1")
    os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")
_mxnet_compat.install()

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, nd  # noqa: E402
from mxnet.gluon import nn  # noqa: E402

from .config import device_plan  # noqa: E402
from .hardware import mxnet_unsupported_gpu  # noqa: E402
from .utils import check_device_count, evaluate_accuracy_with, shard_slices  # noqa: E402
import d2lmini  # noqa: E402  (the saved all-reduces at the end use its schedules)

FRAMEWORK = "mxnet"


@contextlib.contextmanager
def exact_numerics():
    """The block every backend wraps its proofs in.  MXNet reads its numerics settings once
    per process (environment variables, before its first GPU operation), so on a GPU host this
    backend makes the whole process exact when it is imported (no TF32, no autotuning,
    deterministic kernels) and this block changes nothing; on the CPU there is nothing to
    change."""
    yield
SIMULATED_NOTE = ("MXNet CPU contexts cpu(0), cpu(1), ... are distinct devices: arrays on "
                  "them are separate buffers and must be copied explicitly.")


def num_gpus() -> int:
    return mx.context.num_gpus()


def try_gpu(i: int = 0):
    """GPU ``i`` if it exists (and MXNet has kernels for it), else the CPU."""
    return mx.gpu(i) if num_gpus() > i and plan().kind == "gpu" else mx.cpu()


def unsupported_gpu() -> str | None:
    """Why MXNet cannot run on this machine's GPUs, or None (no GPU, or every GPU has kernels
    in MXNet's GPU build).  Asked whatever build is installed: on a Hopper GPU the CPU build is
    not an error to fix -- the GPU build would not run there either."""
    found = mxnet_unsupported_gpu()
    return found[1] if found else None


def plan(at_least: int = 1):
    """How many devices of which kind the notebooks use (decided once; see
    :func:`d2lmini.config.plan_devices`)."""
    return device_plan(FRAMEWORK, num_gpus, at_least, unsupported=unsupported_gpu())


def try_all_gpus(at_least: int = 1) -> list:
    """The lesson's devices: the GPUs (``D2LMINI_NUM_DEVICES`` of them, repeated as stand-ins
    if there are fewer), or ``D2LMINI_NUM_DEVICES`` CPU contexts; never empty.
    ``at_least``: the fewest devices the lesson needs; fewer real ones give stand-ins."""
    p = plan(at_least)
    if p.kind == "gpu":
        return [mx.gpu(i) for i in p.gpu_ids()]
    return [mx.cpu(i) for i in range(p.count)]


def get_devices(k: int) -> list:
    """The first ``k`` devices of :func:`try_all_gpus`, with a clear error if there are fewer."""
    return check_device_count(k, try_all_gpus(), "Set D2LMINI_NUM_DEVICES to simulate more "
                              "CPU devices (before importing d2lmini.mxnet).")


def synchronize(devices=None) -> None:
    """Wait for all queued work (MXNet runs asynchronously)."""
    nd.waitall()


def to_numpy(x) -> np.ndarray:
    return x.asnumpy() if isinstance(x, nd.NDArray) else np.asarray(x)


def split_batch(X, y, devices):
    """Split ``X`` and ``y`` along the batch axis into ``len(devices)`` shards, one per device."""
    if len(X) != len(y):
        raise ValueError(f"X has {len(X)} samples but y has {len(y)}")
    slices = shard_slices(len(y), len(devices))
    X, y = to_numpy(X), to_numpy(y)
    return ([nd.array(X[s], ctx=d, dtype=X.dtype) for s, d in zip(slices, devices)],
            [nd.array(y[s], ctx=d, dtype=y.dtype) for s, d in zip(slices, devices)])


def accuracy(y_hat, y) -> float:
    """Number of correct predictions."""
    return float((y_hat.argmax(axis=1).astype(y.dtype) == y).sum().asscalar())


def evaluate_accuracy(net, data_iter, devices) -> float:
    """Accuracy over ``data_iter`` with every batch split across ``devices``.

    ``net`` is a callable applied to each shard, or a list of callables, one per device;
    a last batch smaller than the device count uses fewer devices.
    """
    return evaluate_accuracy_with(split_batch, accuracy, net, data_iter, devices)


def batch_norm(sync_bn_devices: int | None = None):
    """A BatchNorm layer: per-device ``nn.BatchNorm``, or cross-device when asked.

    ``sync_bn_devices=n`` gives ``gluon.contrib.nn.SyncBatchNorm(num_devices=n)``: in training
    mode the n replicas exchange their per-channel moments at every forward and backward, so
    all n shards are normalized with the statistics of the whole batch.  Every training-mode
    forward must then run on exactly n shards (a barrier waits for all n), and the shards
    should be equal in size (the n moments are averaged with equal weights).  The layer has
    the same parameters as ``nn.BatchNorm`` (gamma, beta, running_mean, running_var), so a
    checkpoint of either loads into the other.  Its operator is float32 only.

    Meant for GPUs.  On CPU contexts (MXNet 1.9.1) a single layer computes the right numbers,
    but a network of them deadlocks in the engine: all CPU contexts share one small pool of
    temporary-space resources (``MXNET_CPU_TEMP_COPY``), so an operator of one shard can be
    queued behind an operator of another shard that waits at the barrier.  See the concise
    chapter's MXNet notebook; run such a model only in a subprocess with a timeout.
    """
    if sync_bn_devices is None:
        return nn.BatchNorm()
    from mxnet.gluon.contrib.nn import SyncBatchNorm
    if int(sync_bn_devices) < 1:
        raise ValueError(f"sync_bn_devices must be >= 1, got {sync_bn_devices}")
    return SyncBatchNorm(num_devices=int(sync_bn_devices))


def recalibrate_batchnorm(net, batches, ctx=None) -> int:
    """Re-estimate every BatchNorm's running statistics with the current weights.

    Sets them to the plain average of the batch statistics over ``batches`` (pairs
    ``(X, y)`` of NumPy arrays, whole batches; ``d2lmini.calibration_batches``), computed on
    the replica on ``ctx`` (default: the first context of the parameters), then copies them
    to every replica.  The same rule in every backend (the book's evaluation rule).  Gluon
    updates the running statistics in a training-mode forward; momentum ``i / (i + 1)`` at
    batch ``i`` turns its exponential average into the plain one.  Returns the batch count.

    A hybridized ``net`` runs imperatively here, and is hybridized again afterwards, with its
    traced graph kept: the graph holds the momentum it was traced with, while an imperative
    ``nn.BatchNorm`` passes its ``_kwargs`` (the momentum set here) to the operator at every
    call.
    """
    from mxnet import autograd
    layers, hybridized = [], []
    net.apply(lambda b: layers.append(b) if isinstance(b, nn.BatchNorm) else None)
    net.apply(lambda b: hybridized.append(b) if getattr(b, "_active", False) else None)
    if ctx is None:
        ctx = next(iter(net.collect_params().values())).list_ctx()[0]
    momenta = [bn._kwargs["momentum"] for bn in layers]
    count = 0
    for b in hybridized:
        b._active = False                              # imperative for the calibration
    try:
        for i, (X, _) in enumerate(batches):
            for bn in layers:
                bn._kwargs["momentum"] = i / (i + 1)   # running value = mean of batches so far
            with autograd.record():                    # training mode: batch statistics
                out = net(nd.array(X, ctx=ctx))
            out.backward()                             # (the gradients are not used)
            count += 1
    finally:
        for bn, m in zip(layers, momenta):
            bn._kwargs["momentum"] = m
        for b in hybridized:
            b._active = True                           # the traced graph is used again
    for bn in layers:
        for stat in (bn.running_mean, bn.running_var):
            stat.set_data(stat.data(ctx))              # the same values on every replica
    return count


class Residual(nn.HybridBlock):
    """The residual block of ResNet (two 3x3 convolutions, optional 1x1 shortcut)."""

    def __init__(self, channels, use_1x1conv=False, strides=1, sync_bn_devices=None, **kwargs):
        super().__init__(**kwargs)
        self.conv1 = nn.Conv2D(channels, 3, padding=1, strides=strides)
        self.conv2 = nn.Conv2D(channels, 3, padding=1)
        self.conv3 = nn.Conv2D(channels, 1, strides=strides) if use_1x1conv else None
        self.bn1, self.bn2 = batch_norm(sync_bn_devices), batch_norm(sync_bn_devices)

    def hybrid_forward(self, F, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3 is not None:
            X = self.conv3(X)
        return F.relu(Y + X)


def resnet18(num_classes: int = 10, in_channels: int = 1, width: int = 64,
             sync_bn_devices: int | None = None):
    """The seeds' ResNet-18 variant for 28x28 inputs: a 3x3 stem, no max-pooling.

    ``width`` is the channel count of the first stage (64 in the seed); the stages have
    width, 2*width, 4*width, 8*width channels.  ``in_channels`` is inferred by Gluon.
    ``sync_bn_devices=n`` replaces every BatchNorm by a cross-device
    ``SyncBatchNorm(num_devices=n)`` (see :func:`batch_norm`); the default keeps Gluon's
    per-device ``nn.BatchNorm``.
    """
    def stage(channels, first):
        blk = nn.HybridSequential()
        blk.add(Residual(channels, use_1x1conv=not first, strides=1 if first else 2,
                         sync_bn_devices=sync_bn_devices),
                Residual(channels, sync_bn_devices=sync_bn_devices))
        return blk

    net = nn.HybridSequential()
    net.add(nn.Conv2D(width, kernel_size=3, strides=1, padding=1), batch_norm(sync_bn_devices),
            nn.Activation("relu"))
    net.add(stage(width, True), stage(2 * width, False), stage(4 * width, False),
            stage(8 * width, False))
    net.add(nn.GlobalAvgPool2D(), nn.Dense(num_classes))
    return net



# ------------------------------------------------- cross-device BatchNorm, written in Gluon
def batch_norm_over_shards(bn, shards):
    """Training-mode BatchNorm ``bn`` on k shards with the statistics of their union.

    The concise MXNet lab's proof (k devices == 1 device) uses it where Gluon's
    ``SyncBatchNorm`` deadlocks, on CPU contexts: each shard's per-channel sums are copied to
    one device, added, and the mean copied back (then the same for the variance). Autograd
    records the copies, so the backward pass returns every shard's share of the statistics'
    gradient to its device. The layer's own parameters and float32 constants are used."""
    home = shards[0].context
    count = sum(Xs.size // Xs.shape[1] for Xs in shards)           # samples x positions
    per_channel = lambda t: t.reshape((1, -1, 1, 1))  # noqa: E731
    total = lambda parts: nd.add_n(*[p.as_in_context(home) for p in parts])  # noqa: E731
    mean = total([Xs.sum(axis=(0, 2, 3)) for Xs in shards]) / count
    centered = [Xs - per_channel(mean.as_in_context(Xs.context)) for Xs in shards]
    var = total([(C * C).sum(axis=(0, 2, 3)) for C in centered]) / count   # biased, like BatchNorm
    eps = float(np.float32(bn._kwargs['eps']))            # the operator's float32 constants
    momentum = float(np.float32(bn._kwargs['momentum']))
    outputs = []
    for C in centered:
        ctx = C.context
        scale = bn.gamma.data(ctx) / nd.sqrt(var.as_in_context(ctx) + eps)
        outputs.append(C * per_channel(scale) + per_channel(bn.beta.data(ctx)))
    with autograd.pause():                                 # running statistics: no gradient
        for ctx in {Xs.context for Xs in shards}:
            for stat, batch_value in ((bn.running_mean, mean), (bn.running_var, var)):
                r = stat.data(ctx)
                r[:] = momentum * r + (1 - momentum) * batch_value.as_in_context(ctx)
    return outputs


def forward_over_shards(block, shards):
    """``block`` applied to k shards in lock-step, one layer at a time, with cross-device
    BatchNorm (:func:`batch_norm_over_shards`) at every BatchNorm layer."""
    if isinstance(block, nn.BatchNorm):
        return batch_norm_over_shards(block, shards)
    if isinstance(block, nn.HybridSequential):
        for child in block:
            shards = forward_over_shards(child, shards)
        return shards
    if isinstance(block, Residual):                       # mirrors Residual.hybrid_forward
        Y = [nd.relu(Ys) for Ys in batch_norm_over_shards(block.bn1, [block.conv1(Xs) for Xs in shards])]
        Y = batch_norm_over_shards(block.bn2, [block.conv2(Ys) for Ys in Y])
        if block.conv3 is not None:
            shards = [block.conv3(Xs) for Xs in shards]
        return [nd.relu(Ys + Xs) for Ys, Xs in zip(Y, shards)]
    return [block(Xs) for Xs in shards]                    # layers without batch statistics

def _canonical_blocks(net) -> dict:
    """The layers of ``resnet18``'s net under their canonical names (d2lmini.models)."""
    from .models import resnet18_layers
    return resnet18_layers(net[0], net[1], [net[2 + s] for s in range(1, 5)], net[8])


def canonical_init(net, arrays: dict):
    """Load ``d2lmini.resnet18_init``'s draw into ``resnet18``'s ``net`` (in place; returned).

    Gluon's layouts are the canonical ones (convolution ``(out, in, kh, kw)``, dense
    ``(out, in)``) and its BatchNorm has ``gamma``, ``beta``, ``running_mean`` and
    ``running_var``, so only the names are mapped.  The arrays also fix the shapes that
    deferred initialization would infer: a fresh net is initialized on the current context
    (``cpu(0)``; move it with ``net.collect_params().reset_ctx(devices)``), a net initialized
    on a list of contexts keeps them, and its parameters are usable at once.
    """
    used, targets = set(), []
    for prefix, block in _canonical_blocks(net).items():
        for pname, p in block.params.items():
            name = pname[len(block.prefix):] if pname.startswith(block.prefix) else pname
            key = f"{prefix}.{name}"
            if key not in arrays:
                raise ValueError(f"canonical_init: no array {key!r} for the net's {p.name}")
            a = arrays[key]
            if len(a.shape) != len(p.shape) or any(s not in (0, -1, t) for s, t in
                                                    zip(p.shape, a.shape)):
                raise ValueError(f"canonical_init: {key} has shape {tuple(a.shape)}, the "
                                 f"net's {p.name} {tuple(p.shape)} (another width?)")
            used.add(key)
            targets.append((p, a))
    from .models import check_all_used
    check_all_used(arrays, used)
    mapped = {id(p) for p, _ in targets}
    unset = [p.name for p in net.collect_params().values() if id(p) not in mapped]
    if unset:
        raise ValueError(f"canonical_init: parameters of the net with no canonical name: {unset[:5]}")
    for p, a in targets:
        p.shape = a.shape                    # fills in the sizes deferred initialization lacks
        try:
            p.list_ctx()
        except RuntimeError:                 # never initialized: now, on the current context
            p.initialize()
        p.set_data(nd.array(a, dtype=p.dtype))
        p._finish_deferred_init()            # a deferred parameter takes the data at once
    return net


# ------------------------------------------------- the from-scratch chapter's all-reduces
# Saved as chapters/scratch/mxnet.ipynb writes them (its cells tagged step:allreduce and
# step:ring_allreduce), for the chapters that use them again; tests/test_written_once.py
# holds the two copies to the same text.
def allreduce(data):
    # sum onto data[0]'s device, then broadcast back; every array is overwritten IN PLACE
    for i in range(1, len(data)):
        data[0][:] += data[i].copyto(data[0].context)
    for i in range(1, len(data)):
        data[0].copyto(data[i])


def ring_allreduce(data):
    # sum the arrays in `data` (one per device) with the ring algorithm, IN PLACE;
    # returns the number of bytes each device sent
    k = len(data)
    flat = [x.reshape((-1,)) for x in data]             # views of the caller's buffers
    chunks = d2lmini.chunk_slices(flat[0].size, k)
    sent = [0] * k
    for step in d2lmini.ring_schedule(k):
        messages = [(t, flat[t.src][chunks[t.chunk]].copyto(data[t.dst].context))
                    for t in step]                      # every src sends one chunk to dst
        for t, msg in messages:
            sent[t.src] += msg.size * np.dtype(msg.dtype).itemsize
            target = flat[t.dst][chunks[t.chunk]]       # a view into dst's buffer
            if t.op == 'add':                           # reduce-scatter: accumulate
                target += msg
            else:                                       # all-gather: overwrite
                msg.copyto(target)
    return sent

"""PaddlePaddle backend of d2lmini.

Devices: ``CUDAPlace(i)`` when Paddle sees GPUs (``D2LMINI_NUM_DEVICES`` of them, repeated as
stand-ins if there are fewer).  ``CPUPlace()`` takes no index -- Paddle
has one CPU place -- so without GPUs ``try_all_gpus()`` returns ``D2LMINI_NUM_DEVICES``
*stand-ins*: ``CPUPlace()`` repeated; each entry holds its own tensors in the same memory.
Real multi-process data parallelism on the CPU uses ``paddle.distributed`` with the gloo
backend (concise chapter), which also uses :class:`AllReduceBatchNorm2D` (cross-device
BatchNorm on CPUs, where ``nn.SyncBatchNorm`` has no kernel) and :func:`run_launch`
(``paddle.distributed.launch`` with every rank's log in the error).

``import paddle`` sets the root logger to INFO (which makes other libraries, JAX among them,
print timestamped INFO lines); this module puts the previous level back.
"""
from __future__ import annotations

import contextlib
import logging
import warnings

# Paddle warns at import that the ccache compiler cache is missing; it only matters for
# building C++ extensions, which this book never does.
warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)
# BatchNorm layers warn at every training-mode call that they "always track global mean and
# variance" (a note about an old API change, not about this code).
warnings.filterwarnings("ignore", message="When training, we now always track global mean",
                        category=UserWarning)
_root_level = logging.getLogger().level
import paddle  # noqa: E402

logging.getLogger().setLevel(_root_level)

import numpy as np  # noqa: E402
from paddle import nn  # noqa: E402

from .config import device_plan, exact_everywhere  # noqa: E402
from .utils import check_device_count, evaluate_accuracy_with, shard_slices  # noqa: E402
import d2lmini  # noqa: E402  (the saved all-reduces at the end use its schedules)

FRAMEWORK = "paddle"

# Paddle's GPU settings that make results depend on more than the maths (GPU builds only):
# TF32 in cuBLAS and cuDNN (on by default for cuDNN on Ampere and newer; switched per process
# by paddle.base.core's cublas/cudnn "switch") and non-deterministic cuDNN kernels.
_EXACT = {"FLAGS_cudnn_deterministic": True}

# How often rank 0's key-value server for the gloo (CPU) start-up looks whether it may stop.
KV_SERVER_POLL_S = 0.05


def _start_kv_server(port, http_server_d, size):
    """Paddle's ``paddle.distributed.parallel._start_kv_server``, polling every
    :data:`KV_SERVER_POLL_S` seconds instead of every 3.

    On CPUs (gloo), ``init_parallel_env`` on rank 0 serves a key-value store from a child
    process, whose loop sleeps 3 s between looks at its stop flag, and joins that process
    before it returns: every CPU launch of Paddle ranks waited up to 3 s, doing nothing (on
    average about 1.5 s).  The same loop, only a shorter sleep; GPUs (NCCL) never start it.
    (Importing Paddle's ``http_server`` opens ``http.log`` in the working directory.)"""
    import time

    from paddle.distributed.fleet.utils.http_server import KVServer

    http_server = KVServer(int(port), size=size)
    http_server.start()
    while http_server_d.get("running", False) or not http_server.should_stop():
        time.sleep(KV_SERVER_POLL_S)
    http_server.stop()


def _poll_kv_server_often() -> bool:
    """Put :func:`_start_kv_server` in Paddle's place where Paddle's has the same signature
    (checked for Paddle 3.3.1); return whether it did."""
    import inspect

    from paddle.distributed import parallel
    original = getattr(parallel, "_start_kv_server", None)
    if original is _start_kv_server:
        return True
    if original is None or list(inspect.signature(original).parameters) != [
            "port", "http_server_d", "size"]:
        return False
    parallel._start_kv_server = _start_kv_server
    return True


_poll_kv_server_often()


def _gpu_flags(values: dict) -> dict:
    """Set those of ``values`` this build has; return their previous values."""
    old = {}
    for name, value in values.items():
        try:
            old[name] = paddle.get_flags([name])[name]
        except ValueError:       # not a flag of this build (the CPU build has none of them)
            continue
        paddle.set_flags({name: value})
    return old


def _tf32(cublas: bool, cudnn: bool) -> tuple:
    """Switch TF32 in cuBLAS and cuDNN; return the previous switches."""
    core = paddle.base.core
    old = core.get_cublas_switch(), core.get_cudnn_switch()
    core.set_cublas_switch(cublas)
    core.set_cudnn_switch(cudnn)
    return old


@contextlib.contextmanager
def exact_numerics():
    """Within the block, no TF32 in cuBLAS/cuDNN and deterministic cuDNN kernels on GPUs;
    Paddle's own settings come back afterwards (``D2LMINI_EXACT=1`` makes the whole process
    exact).  No effect on the CPU."""
    if not paddle.device.is_compiled_with_cuda():
        yield
        return
    old_flags, old_tf32 = _gpu_flags(_EXACT), _tf32(False, False)
    try:
        yield
    finally:
        _tf32(*old_tf32)
        _gpu_flags(old_flags)


if exact_everywhere() and paddle.device.is_compiled_with_cuda():
    _gpu_flags(_EXACT)
    _tf32(False, False)
SIMULATED_NOTE = ("Paddle has one CPU place (CPUPlace takes no index): the simulated devices "
                  "are CPUPlace() repeated; each holds its own tensors.")


def num_gpus() -> int:
    if not paddle.device.is_compiled_with_cuda():
        return 0
    return paddle.device.cuda.device_count()


def try_gpu(i: int = 0):
    """GPU ``i`` if it exists, else the CPU."""
    return paddle.CUDAPlace(i) if num_gpus() > i else paddle.CPUPlace()


def plan(at_least: int = 1):
    """How many devices of which kind the notebooks use (decided once; see
    :func:`d2lmini.config.plan_devices`)."""
    return device_plan(FRAMEWORK, num_gpus, at_least)


def try_all_gpus(at_least: int = 1) -> list:
    """The lesson's devices: the GPUs (``D2LMINI_NUM_DEVICES`` of them, repeated as stand-ins
    if there are fewer), or ``D2LMINI_NUM_DEVICES`` CPU stand-ins; never empty.
    ``at_least``: the fewest devices the lesson needs; fewer real ones give stand-ins."""
    p = plan(at_least)
    if p.kind == "gpu":
        return [paddle.CUDAPlace(i) for i in p.gpu_ids()]
    return [paddle.CPUPlace() for _ in range(p.count)]


def get_devices(k: int) -> list:
    """The first ``k`` devices of :func:`try_all_gpus`, with a clear error if there are fewer."""
    return check_device_count(k, try_all_gpus(), "Set D2LMINI_NUM_DEVICES to simulate more "
                              "CPU devices.")


def synchronize(devices=None) -> None:
    """Wait for the queued work of every GPU in ``devices`` (default: all the lesson's).

    ``paddle.device.synchronize()`` waits for the *current* device only; a multi-GPU timing
    must wait for each.  CPU work is synchronous."""
    if not num_gpus():
        return
    ids = sorted({d.get_device_id() for d in (devices or try_all_gpus())
                  if isinstance(d, paddle.CUDAPlace)})
    for i in ids:
        paddle.device.synchronize(f"gpu:{i}")


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
    """The residual block of ResNet (two 3x3 convolutions, optional 1x1 shortcut).
    ``data_format``: the layout of its inputs and outputs, ``"NCHW"`` or ``"NHWC"``; the
    parameters are the same either way (Paddle keeps convolution weights as
    ``(out, in, kh, kw)`` in both)."""

    def __init__(self, in_channels, channels, use_1x1conv=False, strides=1,
                 data_format="NCHW"):
        super().__init__()
        f = data_format
        self.conv1 = nn.Conv2D(in_channels, channels, 3, padding=1, stride=strides, data_format=f)
        self.conv2 = nn.Conv2D(channels, channels, 3, padding=1, data_format=f)
        self.conv3 = (nn.Conv2D(in_channels, channels, 1, stride=strides, data_format=f)
                      if use_1x1conv else None)
        self.bn1 = nn.BatchNorm2D(channels, data_format=f)
        self.bn2 = nn.BatchNorm2D(channels, data_format=f)

    def forward(self, X):
        Y = nn.functional.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3 is not None:
            X = self.conv3(X)
        return nn.functional.relu(Y + X)


def resnet18(num_classes: int = 10, in_channels: int = 1, width: int = 64,
             sync_bn: bool = False, data_format: str = "NCHW") -> nn.Layer:
    """The seeds' ResNet-18 variant for 28x28 inputs: a 3x3 stem, no max-pooling.

    ``width`` is the channel count of the first stage (64 in the seed); the stages have
    width, 2*width, 4*width, 8*width channels.  ``sync_bn=True`` gives cross-device
    BatchNorm (see :func:`sync_batchnorm`); the parameter names do not change.
    ``data_format="NHWC"`` makes every layer take and give channels-last tensors (the input
    is then ``(N, 28, 28, in_channels)``): the layout GPU convolution kernels prefer in
    reduced precision.  Parameter names and shapes are those of ``"NCHW"``, so
    :func:`canonical_init` loads the same draw.
    """
    if data_format not in ("NCHW", "NHWC"):
        raise ValueError(f"data_format must be 'NCHW' or 'NHWC', got {data_format!r}")
    f = data_format

    def stage(cin, cout, first):
        return nn.Sequential(Residual(cin, cout, use_1x1conv=not first, strides=1 if first else 2,
                                      data_format=f),
                             Residual(cout, cout, data_format=f))

    w = width
    net = nn.Sequential(
        nn.Conv2D(in_channels, w, kernel_size=3, stride=1, padding=1, data_format=f),
        nn.BatchNorm2D(w, data_format=f), nn.ReLU(),
        stage(w, w, True), stage(w, 2 * w, False), stage(2 * w, 4 * w, False),
        stage(4 * w, 8 * w, False),
        nn.AdaptiveAvgPool2D((1, 1), data_format=f), nn.Flatten(), nn.Linear(8 * w, num_classes))
    return sync_batchnorm(net) if sync_bn else net


def _canonical_layers(net: nn.Layer) -> dict[str, nn.Layer]:
    """The layers of ``resnet18``'s net under their canonical names (d2lmini.models)."""
    from .models import resnet18_layers
    return resnet18_layers(net[0], net[1], [net[2 + s] for s in range(1, 5)], net[9])


def canonical_init(net: nn.Layer, arrays: dict) -> nn.Layer:
    """Load ``d2lmini.resnet18_init``'s draw into ``resnet18``'s ``net`` (in place; returned).

    Convolution weights have the canonical layout ``(out, in, kh, kw)``; ``Linear``'s weight
    is ``(in, out)``, the transpose of the canonical one.  BatchNorm's gamma/beta are
    ``weight``/``bias``, and its running statistics are the non-trainable parameters
    ``_mean``/``_variance``.  Every canonical array must be used once and every parameter set.
    """
    bn_names = {"weight": "gamma", "bias": "beta", "_mean": "running_mean",
                "_variance": "running_var"}
    used, done = set(), set()
    with paddle.no_grad():
        for prefix, layer in _canonical_layers(net).items():
            is_bn = prefix.rsplit(".", 1)[-1].startswith("bn")
            for name, p in layer.named_parameters(include_sublayers=False):
                key = f"{prefix}.{bn_names[name] if is_bn else name}"
                if key not in arrays:
                    raise ValueError(f"canonical_init: no array {key!r} for the net's "
                                     f"{prefix}.{name}")
                a = np.asarray(arrays[key])
                if prefix == "fc" and name == "weight":
                    a = a.T                                 # (out, in) -> Paddle's (in, out)
                if tuple(a.shape) != tuple(p.shape):
                    raise ValueError(f"canonical_init: {key} has shape {tuple(a.shape)} (in "
                                     f"Paddle's layout), the net's tensor {tuple(p.shape)} "
                                     f"(another width?)")
                if key in used:
                    raise ValueError(f"canonical_init: {key} would be used twice")
                p.set_value(paddle.to_tensor(np.ascontiguousarray(a), dtype=p.dtype))
                used.add(key)
                done.add(id(p))
    from .models import check_all_used
    check_all_used(arrays, used)
    unset = [n for n, p in net.named_parameters() if id(p) not in done]
    if unset:
        raise ValueError(f"canonical_init: parameters of the net with no array: {unset[:5]}")
    return net


# --------------------------------------------------------------------------------------------
# Cross-device BatchNorm that runs on the CPU.
# Paddle's tool is nn.SyncBatchNorm (convert_sync_batchnorm), but in Paddle 3.3.1 its kernel
# ``sync_batch_norm`` has no CPU implementation: on a CPU it fails with "The kernel
# `sync_batch_norm` is not registered".  The layer below computes the statistics of the
# *global* batch with two all-reduces; autograd differentiates through them because the
# all-reduce's backward is again an all-reduce.  On GPUs use nn.SyncBatchNorm instead.
# --------------------------------------------------------------------------------------------

@paddle.no_grad()
def recalibrate_batchnorm(net: nn.Layer, batches) -> int:
    """Re-estimate every BatchNorm's running statistics with the current weights.

    Sets them to the plain average of the batch statistics over ``batches`` (pairs
    ``(X, y)`` of NumPy arrays, whole batches; ``d2lmini.calibration_batches``) on this
    process's device: the same rule in every backend (the book's evaluation rule).  Paddle
    updates ``running = momentum * running + (1 - momentum) * batch``; momentum
    ``i / (i + 1)`` at batch ``i`` makes that the plain average.  Every rank that passes the
    same batches gets the same statistics (cross-rank layers are used as plain BatchNorm
    here: the batches are whole).  Returns the number of batches used.
    """
    layers = [m for m in net.sublayers(include_self=True) if isinstance(m, nn.BatchNorm2D)]
    momenta, was_training = [m._momentum for m in layers], net.training
    net.train()
    count = 0
    try:
        for i, (X, _) in enumerate(batches):
            for m in layers:
                m._momentum = i / (i + 1)
            _plain_forward(net, paddle.to_tensor(X))
            count += 1
    finally:
        for m, mom in zip(layers, momenta):
            m._momentum = mom
        net.train() if was_training else net.eval()
    return count


def _plain_forward(net, X):
    """``net(X)`` with cross-rank BatchNorm layers computing on this rank's data alone."""
    global _LOCAL_ONLY
    _LOCAL_ONLY, saved = True, _LOCAL_ONLY
    try:
        return net(X)
    finally:
        _LOCAL_ONLY = saved


_LOCAL_ONLY = False


def _world_size() -> int:
    import paddle.distributed as dist
    return dist.get_world_size() if dist.is_initialized() else 1


class _AllReduceSum(paddle.autograd.PyLayer):
    """Sum a tensor over all ranks; its gradient is summed over all ranks too.

    Every rank receives S = sum_r x_r and every rank's loss depends on S, so the gradient of
    the total loss with respect to x_r is the sum over ranks of dLoss_r'/dS: an all-reduce.
    """

    @staticmethod
    def forward(ctx, x):
        import paddle.distributed as dist
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        return x

    @staticmethod
    def backward(ctx, grad):
        import paddle.distributed as dist
        grad = grad.clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad


class AllReduceBatchNorm2D(nn.BatchNorm2D):
    """``BatchNorm2D`` whose training-mode statistics are those of the batch of *all* ranks.

    Outside an initialized process group (one process), or in eval mode, it is exactly
    ``nn.BatchNorm2D``.  In training mode every rank all-reduces the per-channel sums and the
    element count (-> global mean), then the per-channel sums of squared deviations
    (-> global biased variance), normalizes its own shard with them and updates the running
    statistics as ``BatchNorm2D`` does on the full batch (Paddle's convention:
    ``running = momentum * running + (1 - momentum) * batch``, biased variance).  Its
    parameters (running statistics included) have the names of ``BatchNorm2D``'s, so state
    dicts are interchangeable.  Shards may differ in size.
    """

    def forward(self, x):
        if not self.training or _world_size() == 1 or _LOCAL_ONLY:
            return super().forward(x)
        N, C, H, W = x.shape
        axes, shape = [0, 2, 3], [1, C, 1, 1]
        # Statistics in float64: in our measurements Paddle's float32 sum over the N*H*W
        # elements of a channel was off by up to ~1e-4 (relative), far more than the error of
        # BatchNorm2D's own kernel, which accumulates more carefully.
        x64 = x.astype("float64")
        count = paddle.full([1], N * H * W, dtype="float64")
        total = _AllReduceSum.apply(paddle.concat([x64.sum(axis=axes), count]))
        n = total[C]
        mean = total[:C] / n
        xc = x64 - mean.reshape(shape)
        var = _AllReduceSum.apply((xc * xc).sum(axis=axes)) / n
        y = (xc * paddle.rsqrt(var + self._epsilon).reshape(shape)).astype(x.dtype)
        mean, var = mean.astype(x.dtype), var.astype(x.dtype)
        if self.weight is not None:
            y = y * self.weight.reshape(shape) + self.bias.reshape(shape)
        with paddle.no_grad():
            m = self._momentum
            self._mean.set_value(m * self._mean + (1 - m) * mean.detach())
            self._variance.set_value(m * self._variance + (1 - m) * var.detach())
        return y


def convert_allreduce_batchnorm(layer: nn.Layer) -> nn.Layer:
    """Replace every ``nn.BatchNorm2D`` in ``layer`` by an :class:`AllReduceBatchNorm2D`
    holding the same parameters and running statistics (what
    ``nn.SyncBatchNorm.convert_sync_batchnorm`` does, but usable on the CPU)."""
    if isinstance(layer, nn.BatchNorm2D) and not isinstance(layer, AllReduceBatchNorm2D):
        if layer._data_format != "NCHW":
            raise ValueError(f"AllReduceBatchNorm2D computes on NCHW tensors; this BatchNorm2D "
                             f"has data_format={layer._data_format!r}")
        new = AllReduceBatchNorm2D(layer._num_features, momentum=layer._momentum,
                                   epsilon=layer._epsilon)
        new.set_state_dict(layer.state_dict())
        new.train() if layer.training else new.eval()
        return new
    for name, child in layer.named_children():
        setattr(layer, name, convert_allreduce_batchnorm(child))
    return layer


def sync_batchnorm(layer: nn.Layer) -> nn.Layer:
    """Cross-device BatchNorm for ``layer``: ``nn.SyncBatchNorm`` where Paddle has its kernel
    (CUDA), :class:`AllReduceBatchNorm2D` on the CPU."""
    if num_gpus():
        return nn.SyncBatchNorm.convert_sync_batchnorm(layer)
    return convert_allreduce_batchnorm(layer)


def rank_env(nprocs: int) -> dict[str, str]:
    """Extra environment for ``nprocs`` ranks launched by ``paddle.distributed.launch`` or
    ``spawn``: ``{}`` when every rank gets a GPU of its own, or when Paddle sees no GPU (the
    CPU build: gloo ranks on the CPU).

    Paddle gives every rank a GPU of its own and cannot share one (the launcher fails with
    an IndexError, spawn with "visible devices(1) < nprocs"), and a GPU build cannot be told
    to launch CPU ranks instead: the launcher takes *any* ``CUDA_VISIBLE_DEVICES``, even an
    empty one, as a list of GPUs.  So with a GPU build and fewer GPUs than ranks this raises a
    ``RuntimeError`` that says what to do, rather than failing inside the launcher.
    """
    n = num_gpus()
    if n == 0 or n >= nprocs:
        return {}
    raise RuntimeError(
        f"{nprocs} Paddle ranks need {nprocs} GPUs, but Paddle sees {n}: Paddle cannot put two "
        f"ranks on one GPU, and its launcher cannot be sent to the CPU with a GPU build. Run "
        f"this notebook on a machine with >= {nprocs} GPUs, or with the CPU build (the "
        f"project's .venv; on a GPU host also set D2LMINI_PROFILE=cpu), whose ranks use gloo.")


# --------------------------------------------------------------------------------------------
# Launching with ``python -m paddle.distributed.launch``
# --------------------------------------------------------------------------------------------

def worker_logs(log_dir) -> dict[str, str]:
    """The log of every rank started by ``paddle.distributed.launch --log_dir log_dir``
    (files ``workerlog.0``, ``workerlog.1``, ...), by file name; {} if there are none."""
    from pathlib import Path
    d = Path(log_dir)
    def rank(p):
        return int(p.suffix[1:]) if p.suffix[1:].isdigit() else -1
    return {p.name: p.read_text(errors="replace") for p in sorted(d.glob("workerlog.*"), key=rank)}


def run_launch(cmd: list[str], *, log_dir, timeout: float | None = None, env: dict | None = None,
               cwd: str | None = None, tail: int = 30):
    """:func:`d2lmini.launch.run` for a ``paddle.distributed.launch`` command.

    The launcher's own output shows the tail of only the *first* rank it saw fail, and that
    may be a rank that merely lost its peer.  On failure the :class:`LaunchError` raised here
    also carries the last ``tail`` lines of every rank's log from ``log_dir``, so the rank
    that raised first is always visible.  ``timeout`` None: ``launch.default_timeout()``.
    """
    from .launch import LaunchError, run
    try:
        return run(cmd, timeout=timeout, env=env, cwd=cwd)
    except LaunchError as e:
        logs = worker_logs(log_dir)
        parts = [f"----- {name}: last {tail} lines -----\n"
                 + "\n".join(text.splitlines()[-tail:]) for name, text in logs.items()]
        extra = "\n".join(parts) if parts else f"(no worker logs in {log_dir})"
        full = e.log + "".join(f"\n===== {name} =====\n{text}" for name, text in logs.items())
        raise LaunchError(f"{e}\n{extra}", full, e.returncode) from None


# ------------------------------------------------- the from-scratch chapter's all-reduces
# Saved as chapters/scratch/paddle.ipynb writes them (its cells tagged step:allreduce and
# step:ring_allreduce), for the chapters that use them again; tests/test_written_once.py
# holds the two copies to the same text.
@paddle.no_grad()
def allreduce(data):
    # sum onto data[0]'s device, then broadcast back; every tensor is overwritten IN PLACE
    for i in range(1, len(data)):
        data[0].add_(data[i].to(data[0].place))
    for i in range(1, len(data)):
        paddle.assign(data[0].to(data[i].place), output=data[i])


@paddle.no_grad()
def ring_allreduce(data):
    # sum the tensors in `data` (one per device) with the ring algorithm, IN PLACE;
    # returns the bytes each device sent
    k = len(data)
    flat = [t.reshape([-1]).clone() for t in data]       # each device's working buffer
    chunks = d2lmini.chunk_slices(int(flat[0].size), k)
    sent = [0] * k
    for step in d2lmini.ring_schedule(k):
        for t in step:                                   # concurrent on real hardware
            c = chunks[t.chunk]
            msg = flat[t.src][c].to(data[t.dst].place)   # src sends one chunk to dst
            sent[t.src] += int(msg.size) * msg.element_size()
            if t.op == 'add':                            # reduce-scatter: accumulate
                flat[t.dst][c] = flat[t.dst][c] + msg
            else:                                        # all-gather: overwrite
                flat[t.dst][c] = msg
    for t, f in zip(data, flat):
        paddle.assign(f.reshape(t.shape), output=t)      # write back IN PLACE
    return sent

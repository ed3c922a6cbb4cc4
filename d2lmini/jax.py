"""JAX backend of d2lmini.

Devices: the GPUs when JAX sees any (``D2LMINI_NUM_DEVICES`` of them).  Otherwise -- or when
more devices are requested than there are GPUs, since a JAX mesh cannot hold one device
twice -- the host CPU is split into ``D2LMINI_NUM_DEVICES`` real XLA host devices
(``jax_num_cpu_devices``); they are distinct devices to JAX (``device_put``, ``pmap``,
``shard_map`` and sharded ``jit`` treat them as such), sharing the processor's cores.

Importing this module sets that count, which only works before JAX initialises its
backends -- import ``d2lmini.jax`` before running any JAX operation.  It also stops JAX from
preallocating 75 % of every GPU (``XLA_PYTHON_CLIENT_PREALLOCATE=false``), so that several
notebooks and their launched processes can share a GPU.  Proofs run inside
:func:`exact_numerics` (full float32 matrix products on GPUs); everything else keeps JAX's
defaults (see :func:`d2lmini.config.exact_everywhere`).
"""
from __future__ import annotations

import contextlib
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from .config import device_plan, exact_everywhere, num_simulated_devices  # noqa: E402
from .hardware import nvidia_gpus  # noqa: E402
from .utils import check_device_count, evaluate_accuracy_with, shard_slices  # noqa: E402
import d2lmini  # noqa: E402  (the saved all-reduces at the end use its schedules)

FRAMEWORK = "jax"
SIMULATED_NOTE = ("JAX splits the host CPU into N XLA devices (jax_num_cpu_devices): "
                  "distinct devices to JAX, sharing the same cores.")

# At least 2: lessons that need two devices use CPU stand-ins when there are fewer.
_WANTED = max(num_simulated_devices(), 2)
try:
    jax.config.update("jax_num_cpu_devices", _WANTED)
except RuntimeError:  # backends already initialised: checked in try_all_gpus()
    pass


def share_compiled_programs_across_cpu_devices() -> bool:
    """Let JAX's persistent compilation cache serve a program compiled for one CPU device to
    every other CPU device, and to processes that split the host into another number of
    devices.  Returns whether the cache key is device-neutral now.

    JAX compiles a program once per device it runs on (a jitted step called on device 3 is
    compiled for device 3), and its persistent cache (``JAX_COMPILATION_CACHE_DIR``, which the
    test harness sets) keys each program on the CPU by its device assignment and by the
    topology of all the host's devices -- on GPUs it already leaves the assignment out, since
    the compiled code does not depend on it: the devices are given when the executable is
    loaded.  So with 8 simulated CPU devices every per-device program of the from-scratch
    lessons was compiled 8 times, and a notebook's one-device programs again at k = 1, 2 and
    8.  This keys a CPU program by the program, its compile options without the device
    assignment, and the kind and number of its own devices; the executable is loaded for the
    devices of the call, which ``tests/test_backends.py`` checks (results right, and on the
    right devices).  A speed-up only: nothing changes when the cache is off, for GPU programs,
    or when this JAX's private cache-key functions do not look as expected."""
    import inspect
    try:
        from jax._src import cache_key
        options, accelerators = (cache_key._hash_serialized_compile_options,
                                 cache_key._hash_accelerator_config)
        by_kind = cache_key._hash_devices
    except (ImportError, AttributeError):
        return False
    if getattr(options, "device_neutral", False):
        return True
    if ("strip_device_assignment" not in inspect.signature(options).parameters
            or list(inspect.signature(accelerators).parameters) != ["hash_obj", "accelerators"]):
        return False

    def options_without_assignment(hash_obj, compile_options, strip_device_assignment=False):
        return options(hash_obj, compile_options, strip_device_assignment=True)

    def cpu_devices_by_kind(hash_obj, devices):
        if all(d.platform == "cpu" for d in devices.flat):
            return by_kind(hash_obj, devices)      # kind of each of the program's devices
        return accelerators(hash_obj, devices)

    options_without_assignment.device_neutral = True
    cache_key._hash_serialized_compile_options = options_without_assignment
    cache_key._hash_accelerator_config = cpu_devices_by_kind
    return True


#: Seconds a simulated CPU device waits for the others in a collective before XLA aborts the
#: process (its default, 40 s, ended an 8-device run on a 2-core machine under load,
#: 2026-11-29): simulated devices share the cores, so one may be descheduled that long.
CPU_COLLECTIVE_TIMEOUT_S = 900

if not nvidia_gpus():
    share_compiled_programs_across_cpu_devices()
    # Simulated CPU devices: every dispatch waits for its result.  With JAX's asynchronous CPU
    # dispatch, independent programs with collectives can be in flight together and the
    # devices deadlock in their all-reduce rendezvous (jax-ml/jax#25861; seen here at 8
    # devices in concise/jax's training loop and its recipe's evaluation, 2026-11-29).
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    if "xla_cpu_collective_call_terminate_timeout" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + f" --xla_cpu_collective_call_terminate_timeout_seconds={CPU_COLLECTIVE_TIMEOUT_S}"
        ).strip()

if exact_everywhere():
    # D2LMINI_EXACT=1: full float32 matrix products and deterministic GPU reductions for the
    # whole process (XLA reads its flags once, when the backend starts).
    jax.config.update("jax_default_matmul_precision", "highest")
    if nvidia_gpus() and "xla_gpu_deterministic_ops" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_gpu_deterministic_ops=true").strip()


@contextlib.contextmanager
def exact_numerics():
    """Within the block, full float32 matrix products and convolutions on GPUs (JAX's default
    there is TF32-like, ``precision=DEFAULT``), so that proofs hold to float32 (or float64)
    precision; the setting is part of jit's cache key, so a function traced outside the block
    is traced again inside it.  Training and timing run outside, with JAX's defaults
    (``D2LMINI_EXACT=1`` makes the whole process exact, deterministic reductions included).
    No effect on the CPU."""
    with jax.default_matmul_precision("highest"):
        yield


def num_gpus() -> int:
    try:
        return len(jax.devices("gpu"))
    except RuntimeError:
        return 0


def try_gpu(i: int = 0):
    """GPU ``i`` if it exists, else the first CPU device.

    The device of one-device work, also where :func:`try_all_gpus` gives CPU stand-ins (fewer
    GPUs than the lesson's k): only the k-device work belongs on those."""
    return jax.devices("gpu")[i] if num_gpus() > i else jax.devices("cpu")[0]


def gpus_hidden() -> str | None:
    """``"JAX_PLATFORMS='cpu'"`` (the setting) when it keeps JAX off the GPUs, else None."""
    platforms = (os.environ["JAX_PLATFORMS"] if "JAX_PLATFORMS" in os.environ
                 else jax.config.jax_platforms or "")
    names = {p.strip().lower() for p in platforms.split(",") if p.strip()}
    if names and not names & {"cuda", "gpu", "rocm"}:
        return f"JAX_PLATFORMS={platforms!r}"
    return None


def plan(at_least: int = 1):
    """How many devices of which kind the notebooks use (decided once; see
    :func:`d2lmini.config.plan_devices`)."""
    return device_plan(FRAMEWORK, num_gpus, at_least, stand_in="cpu", hidden=gpus_hidden())


def try_all_gpus(at_least: int = 1) -> list:
    """The lesson's devices: ``D2LMINI_NUM_DEVICES`` GPUs (all of them by default), or that
    many simulated CPU devices when there are fewer GPUs or none; never empty.
    ``at_least``: the fewest devices the lesson needs; fewer real ones give stand-ins."""
    p = plan(at_least)
    if p.kind == "gpu":
        return list(jax.devices("gpu"))[:p.count]
    cpus = jax.devices("cpu")
    if len(cpus) < p.count:
        raise RuntimeError(
            f"JAX has {len(cpus)} CPU device(s) but this notebook uses {p.count}: JAX was "
            f"initialised before d2lmini.jax was imported. Restart the kernel and import "
            f"d2lmini.jax before any JAX operation (or set XLA_FLAGS="
            f"--xla_force_host_platform_device_count={p.count} before starting Python).")
    return list(cpus[:p.count])


def get_devices(k: int) -> list:
    """The first ``k`` devices of :func:`try_all_gpus`, with a clear error if there are fewer."""
    return check_device_count(k, try_all_gpus(), "Set D2LMINI_NUM_DEVICES to simulate more "
                              "CPU devices (before importing d2lmini.jax).")


def synchronize(devices=None) -> None:
    """Wait for all dispatched work (JAX runs asynchronously) on the platforms of ``devices``
    (default: the CPU and, if there are any, the GPUs).  ``jax.live_arrays()`` alone sees only
    the default backend's arrays -- the GPU's on a GPU host, where CPU stand-ins would then
    not be waited for."""
    platforms = ({d.platform for d in devices} if devices
                 else {"cpu"} | ({"gpu"} if num_gpus() else set()))
    for platform in sorted(platforms):
        for a in jax.live_arrays(platform):
            a.block_until_ready()


def to_numpy(x) -> np.ndarray:
    return np.asarray(x)


def split_batch(X, y, devices):
    """Split ``X`` and ``y`` along the batch axis into ``len(devices)`` shards, one per device."""
    if len(X) != len(y):
        raise ValueError(f"X has {len(X)} samples but y has {len(y)}")
    slices = shard_slices(len(y), len(devices))
    X, y = np.asarray(X), np.asarray(y)
    if y.dtype == np.int64:  # JAX defaults to 32-bit integers
        y = y.astype(np.int32)
    return ([jax.device_put(X[s], d) for s, d in zip(slices, devices)],
            [jax.device_put(y[s], d) for s, d in zip(slices, devices)])


def accuracy(y_hat, y) -> float:
    """Number of correct predictions."""
    return float((jnp.argmax(y_hat, axis=1) == y).sum())


def evaluate_accuracy(net, data_iter, devices) -> float:
    """Accuracy over ``data_iter`` with every batch split across ``devices``.

    ``net`` is a callable applied to each shard, or a list of callables, one per device;
    a last batch smaller than the device count uses fewer devices.
    """
    return evaluate_accuracy_with(split_batch, accuracy, net, data_iter, devices)


def _flax():
    from flax import linen as nn
    return nn


def resnet18(num_classes: int = 10, in_channels: int = 1, width: int = 64,
             bn_axis_name: str | None = None, dtype=None):
    """The seeds' ResNet-18 variant for 28x28 inputs (Flax linen): 3x3 stem, no max-pooling.

    Takes NCHW input like the other backends (transposed to NHWC inside).  Call it with
    ``train=True`` and ``mutable=['batch_stats']`` to train.  ``bn_axis_name`` makes
    BatchNorm average its statistics over that mapped axis (cross-device BatchNorm).
    ``in_channels`` is inferred by Flax.  ``dtype`` (e.g. ``jnp.bfloat16``): the dtype every
    layer computes in, with the parameters kept in float32 (Flax's ``param_dtype``): mixed
    precision with float32 master weights; the same parameters as the float32 net.
    """
    nn = _flax()

    class Residual(nn.Module):
        channels: int
        use_1x1conv: bool = False
        strides: int = 1

        @nn.compact
        def __call__(self, X, train: bool):
            bn = lambda: nn.BatchNorm(use_running_average=not train, momentum=0.9,
                                      axis_name=bn_axis_name, dtype=dtype)
            s = (self.strides, self.strides)
            Y = nn.relu(bn()(nn.Conv(self.channels, (3, 3), s, padding=1, dtype=dtype)(X)))
            Y = bn()(nn.Conv(self.channels, (3, 3), padding=1, dtype=dtype)(Y))
            if self.use_1x1conv:
                X = nn.Conv(self.channels, (1, 1), s, dtype=dtype)(X)
            return nn.relu(Y + X)

    class ResNet18(nn.Module):
        num_classes: int = 10
        width: int = 64

        @nn.compact
        def __call__(self, X, train: bool = False):
            X = jnp.transpose(X, (0, 2, 3, 1))  # NCHW -> NHWC
            if dtype is not None:
                X = X.astype(dtype)
            w = self.width
            X = nn.Conv(w, (3, 3), padding=1, dtype=dtype)(X)
            X = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9,
                                     axis_name=bn_axis_name, dtype=dtype)(X))
            for i, c in enumerate((w, 2 * w, 4 * w, 8 * w)):
                X = Residual(c, use_1x1conv=i > 0, strides=1 if i == 0 else 2)(X, train)
                X = Residual(c)(X, train)
            X = X.mean(axis=(1, 2))
            return nn.Dense(self.num_classes, dtype=dtype)(X)

    return ResNet18(num_classes=num_classes, width=width)


def recalibrate_batchnorm(net, variables: dict, batches, momentum: float = 0.9) -> dict:
    """``variables`` with every BatchNorm's running statistics re-estimated.

    The new ``batch_stats`` are the plain average of the batch statistics of the current
    weights over ``batches`` (pairs ``(X, y)`` of NumPy arrays, whole batches;
    ``d2lmini.calibration_batches``): the same rule in every backend (the book's evaluation
    rule).  Flax's training-mode update is ``momentum * old + (1 - momentum) * batch``; from
    zero running statistics it returns ``(1 - momentum) * batch``, which gives each batch's
    statistics.  ``momentum`` must be the layers' (0.9 in ``resnet18``).  The result lives
    where ``variables`` lives (replicated variables stay replicated).
    """
    zeros = jax.tree.map(jnp.zeros_like, variables["batch_stats"])

    @jax.jit
    def stats(params, X):
        _, upd = net.apply({"params": params, "batch_stats": zeros}, X, train=True,
                           mutable=["batch_stats"])
        return jax.tree.map(lambda s: s / (1.0 - momentum), upd["batch_stats"])

    total, count = None, 0
    for X, _ in batches:
        s = stats(variables["params"], jnp.asarray(X))
        total = s if total is None else jax.tree.map(jnp.add, total, s)
        count += 1
    if count == 0:
        raise ValueError("recalibrate_batchnorm: no batches")
    avg = jax.tree.map(lambda t, old: (t / count).astype(old.dtype), total,
                       variables["batch_stats"])
    return {**variables, "batch_stats": avg}


# Flax names a module's submodules by creation order (Conv_0, BatchNorm_0, ...).  In a
# Residual block they are created in the order conv1, bn1, conv2, bn2, conv3 (the shortcut).
_BLOCK_ROLES = {"Conv_0": "conv1", "BatchNorm_0": "bn1", "Conv_1": "conv2",
                "BatchNorm_1": "bn2", "Conv_2": "conv3"}
# Flax's tensor names -> the canonical ones (d2lmini.models).
_LEAF_NAMES = {"BatchNorm": {"scale": "gamma", "bias": "beta", "mean": "running_mean",
                             "var": "running_var"},
               "Conv": {"kernel": "weight", "bias": "bias"},
               "Dense": {"kernel": "weight", "bias": "bias"}}


def _canonical_module(path: tuple) -> str | None:
    """The canonical name (d2lmini.models) of ``resnet18``'s submodule at Flax ``path``."""
    top = {("Conv_0",): "stem.conv", ("BatchNorm_0",): "stem.bn", ("Dense_0",): "fc"}
    if path in top:
        return top[path]
    if len(path) == 2 and path[0].startswith("Residual_") and path[1] in _BLOCK_ROLES:
        r = int(path[0].split("_")[1])         # blocks 0..7: stage r // 2 + 1, block r % 2
        return f"stage{r // 2 + 1}.{r % 2}.{_BLOCK_ROLES[path[1]]}"
    return None


def _to_flax_layout(module: str, leaf: str, a: np.ndarray) -> np.ndarray:
    """Canonical (PyTorch) layout -> Flax's: conv OIHW -> HWIO, dense (out, in) -> (in, out)."""
    if leaf == "kernel" and module.startswith("Conv"):
        return a.transpose(2, 3, 1, 0)
    if leaf == "kernel" and module.startswith("Dense"):
        return a.T
    return a


def canonical_init(net, arrays: dict) -> dict:
    """The variables ``{'params': ..., 'batch_stats': ...}`` of ``resnet18``'s ``net`` from
    ``d2lmini.resnet18_init``'s draw ``arrays``, for ``net.apply``.

    Names are mapped by role, layouts converted (conv kernels HWIO, dense kernels
    (in, out)); BatchNorm's gamma/beta are ``scale``/``bias`` and its running statistics
    ``batch_stats`` ``mean``/``var``.  Raises ``ValueError`` unless every array is used once
    and every variable of the net is set.
    """
    from flax import traverse_util
    if "stem.conv.weight" not in arrays:
        raise ValueError("canonical_init: no array 'stem.conv.weight' (not resnet18_init's draw?)")
    in_channels = arrays["stem.conv.weight"].shape[1]
    template = jax.eval_shape(net.init, jax.random.key(0),                 # shapes only
                              jax.ShapeDtypeStruct((1, in_channels, 28, 28), jnp.float32))
    flat, used = {}, set()
    for path, want in traverse_util.flatten_dict(template).items():
        module_path, leaf = path[1:-1], path[-1]          # path[0]: the collection
        prefix = _canonical_module(module_path)
        kind = module_path[-1].split("_")[0] if module_path else ""
        name = _LEAF_NAMES.get(kind, {}).get(leaf)
        if prefix is None or name is None:
            raise ValueError(f"canonical_init: the net's {'/'.join(path)} has no canonical "
                             f"name (not d2l.resnet18?)")
        key = f"{prefix}.{name}"
        if key not in arrays or key in used:
            what = "no array" if key not in arrays else "a second use of"
            raise ValueError(f"canonical_init: {what} {key!r} for the net's {'/'.join(path)}")
        a = _to_flax_layout(module_path[-1], leaf, np.asarray(arrays[key]))
        if a.shape != want.shape:
            raise ValueError(f"canonical_init: {key} gives shape {a.shape}, the net's "
                             f"{'/'.join(path)} has {want.shape} (another width?)")
        flat[path] = jnp.asarray(a, want.dtype)
        used.add(key)
    from .models import check_all_used
    check_all_used(arrays, used)
    return traverse_util.unflatten_dict(flat)


# ------------------------------------------------- the from-scratch chapter's all-reduces
# Saved as chapters/scratch/jax.ipynb writes them (its cells tagged step:allreduce and
# step:ring_allreduce), for the chapters that use them again; tests/test_written_once.py
# holds the two copies to the same text.
def allreduce(data):
    # sum onto data[0]'s device, then broadcast back; returns the NEW per-device arrays
    total = data[0]
    for x in data[1:]:
        total = total + jax.device_put(x, data[0].device)    # copy to device 0 and add there
    return [total] + [jax.device_put(total, x.device) for x in data[1:]]   # copy back


def ring_allreduce(data, sent=None):
    # sum the arrays in `data` (one per device) with the ring algorithm;
    # returns the NEW per-device arrays; adds the bytes each device sends to `sent`
    k, shape = len(data), data[0].shape
    devs = [x.device for x in data]
    bufs = [x.reshape(-1) for x in data]                    # each device's flat buffer
    chunks = d2lmini.chunk_slices(bufs[0].size, k)
    for step in d2lmini.ring_schedule(k):
        # src sends one chunk to dst: a copy between devices; all read the pre-step buffers
        msgs = [(t, jax.device_put(bufs[t.src][chunks[t.chunk]], devs[t.dst])) for t in step]
        for t, msg in msgs:
            if sent is not None:
                sent[t.src] += msg.size * msg.dtype.itemsize
            if t.op == 'add':                               # reduce-scatter: accumulate
                bufs[t.dst] = bufs[t.dst].at[chunks[t.chunk]].add(msg)
            else:                                           # all-gather: overwrite
                bufs[t.dst] = bufs[t.dst].at[chunks[t.chunk]].set(msg)
    return [b.reshape(shape) for b in bufs]

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
import time

import d2lmini
from d2lmini import mxnet as d2l            # before mxnet: installs the NumPy 2 shim
from d2lmini import recipe
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
        for X, y in d2lmini.BatchIterator(data.X_test, data.y_test, 256):
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
    d2l.canonical_init(net, d2lmini.resnet18_init(width=args.width, seed=args.seed))
    net = prepare(net, device, knobs)
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': args.lr})
    if dtype == "float16":
        amp.init_trainer(trainer)              # dynamic loss scaling
    train_step = make_train_step(net, trainer, knobs)
    batches = d2lmini.BatchIterator(data.X_train, data.y_train, args.batch_size,
                                    shuffle=True, seed=args.seed, drop_last=True)
    for epoch in range(args.epochs):           # a new order every epoch
        start = time.time()
        losses = [train_step(nd.array(X, ctx=device), nd.array(y, ctx=device))
                  for X, y in batches]
        loss_mean = nd.concat(*losses, dim=0).mean().asscalar()   # one wait, at the end
        seconds = time.time() - start
        recipe.report(args, epoch, loss_mean, evaluate(net, data, device, knobs),
                      devices=1, framework=d2l.FRAMEWORK, seconds=seconds)


if __name__ == "__main__":
    main()

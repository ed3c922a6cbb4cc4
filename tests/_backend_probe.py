"""Exercise one d2lmini backend in a fresh process and print what was observed as JSON.

Run by tests/test_backends.py as ``python tests/_backend_probe.py FRAMEWORK``: each framework
gets its own interpreter, so JAX's device count and import-order effects are real.
"""
import json
import logging
import sys
import traceback

import numpy as np


def error_of(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - we report the type and message
        return {"type": type(e).__name__, "message": str(e)}
    return None


def main(fw: str) -> dict:
    out = {}
    logging.getLogger().setLevel(logging.WARNING)
    import d2lmini
    from d2lmini.frameworks import FRAMEWORKS
    out["core_imports_no_framework"] = not any(f.module in sys.modules for f in FRAMEWORKS)
    d2l = __import__(f"d2lmini.{fw}", fromlist=["x"])
    out["root_logger_level"] = logging.getLogger().level
    devices = d2l.try_all_gpus()
    out["num_devices"] = len(devices)
    out["device_reprs"] = [str(d) for d in devices]
    out["num_gpus"] = d2l.num_gpus()
    out["try_gpu_0"] = str(d2l.try_gpu(0))
    out["get_devices_too_many"] = error_of(lambda: d2l.get_devices(len(devices) + 1))
    out["get_devices_1"] = len(d2l.get_devices(1))
    out["at_least_2"] = [str(d) for d in d2l.try_all_gpus(at_least=2)]

    # split_batch on every batch size from k to 2k+1 (even and uneven)
    k = len(devices)
    splits = {}
    for n in range(k, 2 * k + 2):
        X = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        y = np.arange(n, dtype=np.int64)
        Xs, ys = d2l.split_batch(X, y, devices)
        splits[n] = {
            "sizes": [int(d2l.to_numpy(a).shape[0]) for a in Xs],
            "X_roundtrip": bool(np.array_equal(np.concatenate([d2l.to_numpy(a) for a in Xs]), X)),
            "y_roundtrip": bool(np.array_equal(np.concatenate([d2l.to_numpy(a) for a in ys]), y)),
        }
    out["splits"] = splits
    out["placement"] = placement(fw, d2l, devices)
    out["split_too_small"] = error_of(lambda: d2l.split_batch(np.zeros((k - 1, 3)), np.zeros(k - 1), devices))
    out["split_mismatch"] = error_of(lambda: d2l.split_batch(np.zeros((4, 3)), np.zeros(5), devices))

    # accuracy and evaluate_accuracy with a fixed "network": predicts class = round(x[0]) % 10
    X = np.zeros((23, 1), dtype=np.float32)
    X[:, 0] = np.arange(23) % 10
    y = (np.arange(23) % 10).astype(np.int64)
    y[::4] = (y[::4] + 1) % 10  # every 4th label is wrong: 6 of 23
    onehot = lambda Xs: onehot_net(fw, Xs)
    out["evaluate_accuracy"] = d2l.evaluate_accuracy(
        onehot, d2lmini.BatchIterator(X, y, batch_size=7), devices)
    out["evaluate_accuracy_list"] = d2l.evaluate_accuracy(
        [onehot] * k, d2lmini.BatchIterator(X, y, batch_size=7), devices)

    # the from-scratch chapter's all-reduces, saved in the backend: device i starts at i + 1
    out["saved_allreduces"] = saved_allreduces(fw, d2l, devices)

    # the shared ResNet-18 variant: output shape and parameter count grow with width
    out["resnet18_shape"] = resnet_forward_shape(fw, d2l)
    d2l.synchronize(devices)
    return out


def placement(fw, d2l, devices):
    """Whether each shard lives on its device (where the framework can tell)."""
    X = np.ones((len(devices) * 2, 2), dtype=np.float32)
    Xs, _ = d2l.split_batch(X, np.zeros(len(X)), devices)
    if fw == "mxnet":
        return [str(a.context) == str(d) for a, d in zip(Xs, devices)]
    if fw == "torch":
        return [a.device == d for a, d in zip(Xs, devices)]
    if fw == "jax":
        return [a.devices() == {d} for a, d in zip(Xs, devices)]
    if fw == "paddle":
        return [str(a.place) == str(d) for a, d in zip(Xs, devices)]


def saved_allreduces(fw, d2l, devices):
    """What each device holds after ``d2l.allreduce`` and ``d2l.ring_allreduce`` of 7 numbers
    (JAX's return new arrays; the others write into the caller's)."""
    out = {}
    for name in ("allreduce", "ring_allreduce"):
        data = [on_device(fw, np.full(7, i + 1.0, dtype=np.float32), d) for i, d in enumerate(devices)]
        result = getattr(d2l, name)(data)
        out[name] = [d2l_to_numpy(a).tolist() for a in (result if fw == "jax" else data)]
    return out


def on_device(fw, x, device):
    """The NumPy array ``x`` as framework ``fw``'s array on ``device``."""
    if fw == "mxnet":
        from mxnet import nd
        return nd.array(x, ctx=device)
    if fw == "torch":
        import torch
        return torch.as_tensor(x, device=device)
    if fw == "jax":
        import jax
        return jax.device_put(x, device)
    if fw == "paddle":
        import paddle
        return paddle.to_tensor(x, place=device)


def onehot_net(fw, Xs):
    cls = np.rint(d2l_to_numpy(Xs)[:, 0]).astype(np.int64) % 10
    logits = np.eye(10, dtype=np.float32)[cls]
    where = {"mxnet": lambda: Xs.context, "torch": lambda: Xs.device,
             "jax": lambda: list(Xs.devices())[0], "paddle": lambda: Xs.place}[fw]()
    return on_device(fw, logits, where)


def d2l_to_numpy(x):
    for attr in ("asnumpy", "numpy"):
        if hasattr(x, attr) and not isinstance(x, np.ndarray):
            try:
                return np.asarray(getattr(x, attr)())
            except TypeError:
                pass
    return np.asarray(x)


def resnet_forward_shape(fw, d2l):
    X = np.random.default_rng(0).random((3, 1, 28, 28), dtype=np.float32)
    if fw == "mxnet":
        from mxnet import init, nd
        net = d2l.resnet18(10, width=4)
        net.initialize(init.Normal(0.01))
        return list(net(nd.array(X)).shape)
    if fw == "torch":
        import torch
        return list(d2l.resnet18(10, width=4)(torch.as_tensor(X)).shape)
    if fw == "jax":
        import jax
        net = d2l.resnet18(10, width=4)
        variables = net.init(jax.random.PRNGKey(0), X)
        return list(net.apply(variables, X).shape)
    if fw == "paddle":
        import paddle
        return list(d2l.resnet18(10, width=4)(paddle.to_tensor(X)).shape)


if __name__ == "__main__":
    try:
        print("PROBE-JSON " + json.dumps(main(sys.argv[1])))
    except Exception:
        traceback.print_exc()
        sys.exit(1)

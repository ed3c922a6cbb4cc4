"""d2lmini.jax.resnet18 as the concise chapter uses it: NCHW input and cross-device BatchNorm.

``bn_axis_name`` must make BatchNorm inside ``shard_map`` normalise with the statistics of the
*global* batch (the same numbers as the plain model on the whole batch), and without it every
device must use its own shard's statistics.  Forward passes only, on a narrow model in
float64 (so that equality is exact up to rounding), on two simulated devices.
"""
import os

os.environ.setdefault("D2LMINI_NUM_DEVICES", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

d2l = pytest.importorskip("d2lmini.jax")
jax = pytest.importorskip("jax")
from jax.sharding import Mesh, PartitionSpec as PS  # noqa: E402

WIDTH, BATCH = 4, 8


@pytest.fixture(scope="module")
def setup():
    try:
        devices = d2l.try_all_gpus()
    except RuntimeError as e:      # JAX was initialised earlier in this process
        pytest.skip(str(e))
    if len(devices) < 2:
        pytest.skip("needs at least two devices")
    devices = devices[:2]
    mesh = Mesh(np.array(devices), ("data",))
    X = np.random.default_rng(0).random((BATCH, 1, 28, 28))
    net = d2l.resnet18(num_classes=10, width=WIDTH)
    with jax.enable_x64(True):
        variables = jax.jit(net.init)(jax.random.key(0, impl="rbg"), X[:1])
        logits_ref, stats_ref = jax.jit(lambda v, X: _forward(net, v, X))(variables, X)
    return mesh, X, variables, logits_ref, stats_ref


def _forward(net, variables, X):
    logits, updates = net.apply(variables, X, train=True, mutable=["batch_stats"])
    return logits, updates["batch_stats"]


def _sharded_forward(net, variables, X, mesh, stats_spec):
    """Logits gathered along the batch; statistics replicated (PS()) or per device."""
    f = jax.shard_map(lambda v, X: _forward(net, v, X), mesh=mesh,
                      in_specs=(PS(), PS("data")), out_specs=(PS("data"), stats_spec))
    return jax.jit(f)(variables, X)


def test_nchw_input_and_logits_shape(setup):
    _, X, variables, _, _ = setup
    net = d2l.resnet18(num_classes=10, width=WIDTH)
    out = jax.eval_shape(net.apply, variables, X.astype(np.float32))
    assert out.shape == (BATCH, 10)


def test_bn_axis_name_gives_global_batch_statistics(setup):
    mesh, X, variables, logits_ref, stats_ref = setup
    with jax.enable_x64(True):
        synced = d2l.resnet18(num_classes=10, width=WIDTH, bn_axis_name="data")
        logits, stats = _sharded_forward(synced, variables, X, mesh, PS())
        for a, b in zip(jax.tree.leaves(stats), jax.tree.leaves(stats_ref)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(np.asarray(logits), np.asarray(logits_ref),
                                   rtol=1e-10, atol=1e-12)


def test_without_axis_name_each_device_uses_its_own_statistics(setup):
    mesh, X, variables, logits_ref, _ = setup
    with jax.enable_x64(True):
        plain = d2l.resnet18(num_classes=10, width=WIDTH)
        # Per-device statistics differ between devices, so they come back per device.
        logits, stats = _sharded_forward(plain, variables, X, mesh, PS("data"))
        assert not np.allclose(np.asarray(logits), np.asarray(logits_ref), atol=1e-6)
        mean = np.asarray(stats["BatchNorm_0"]["mean"]).reshape(2, -1)
        assert not np.allclose(mean[0], mean[1])

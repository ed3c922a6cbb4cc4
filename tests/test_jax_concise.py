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


# --- the notebook's own helpers (chapters/concise/jax.ipynb), taken from its cells ----------
import ast  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

NOTEBOOK = Path(__file__).resolve().parents[1] / "chapters" / "concise" / "jax.ipynb"


def _notebook_functions(names, namespace):
    """Define the notebook's functions ``names`` (their ``def`` blocks only, decorators
    included) in ``namespace``, which supplies what they refer to."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    wanted = [node for node in ast.parse(source).body
              if isinstance(node, ast.FunctionDef) and node.name in names]
    assert {node.name for node in wanted} == set(names), "a function left the notebook"
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(NOTEBOOK), "exec"), namespace)
    return namespace


def test_shard_rejects_an_indivisible_batch_itself_and_says_what_to_do(setup, capsys):
    """NamedSharding needs k equal blocks.  JAX's own error (IndivisibleError) changes with the
    version -- JAX 0.11 also prints a source location to stdout, which broke the notebook's
    checked output -- so ``shard`` checks first, with a message that says what to do."""
    mesh = setup[0]
    asked = []
    fake_jax = type("FakeJax", (), {"device_put": staticmethod(
        lambda *a, **kw: asked.append(a) or jax.device_put(*a, **kw))})
    ns = _notebook_functions(["shard"], {"np": np, "jax": fake_jax, "NamedSharding":
                                         jax.sharding.NamedSharding, "PS": PS})
    X = np.zeros((2 * 4 + 1, 1, 28, 28), np.float32)
    capsys.readouterr()
    with pytest.raises(ValueError, match="round the batch down to a multiple of 2.*pad"):
        ns["shard"](X, np.zeros(len(X), np.int64), mesh)
    assert asked == [] and capsys.readouterr().out == ""      # JAX was not asked
    Xs, ys = ns["shard"](X[:8], np.zeros(8, np.int64), mesh)
    assert Xs.shape == (8, 1, 28, 28) and ys.dtype == np.int32 and len(asked) == 2


def test_pmap_step_runs_on_the_mesh_devices_when_the_default_backend_is_one_gpu(setup,
                                                                              monkeypatch):
    """On a one-GPU host the notebook's k devices are CPU stand-ins while ``jax.devices()``
    (the default backend) is the one GPU.  ``pmap`` without ``devices=`` builds its mesh from
    ``jax.devices()[:k]`` -- one device -- and its per-device squeeze fails ("cannot select an
    axis to squeeze out ... shape=(2, 8)", seen on an H100 with JAX 0.11.2; the code is the
    same in 0.10.2: jax/_src/pmap.py, _get_mesh_devices).  Faked here by making the default
    backend report one device; the notebook's ``make_pmap_step`` must pass the mesh's devices."""
    from jax._src import pmap as pmap_impl, xla_bridge as xb
    if not hasattr(pmap_impl, "_get_mesh_devices") or not hasattr(xb, "devices"):
        pytest.skip("JAX's pmap internals changed: the fake one-GPU backend needs updating")
    mesh = setup[0]
    default = xb.devices
    monkeypatch.setattr(xb, "devices",
                        lambda backend=None: default(backend) if backend else default()[:1])
    pmap_impl._get_mesh_devices.cache_clear()
    try:
        per_device = lambda net: (lambda state, X: (state + jax.lax.psum(X.sum(), "data"),
                                                    X * 2))
        ns = _notebook_functions(["make_pmap_step", "stack_replicas"],
                                 {"jax": jax, "np": np, "per_device_step": per_device,
                                  "NamedSharding": jax.sharding.NamedSharding, "PS": PS})
        state = ns["stack_replicas"](np.float32(1.0), mesh)             # pmap's layout: (2,)
        X = jax.device_put(np.arange(16, dtype=np.float32).reshape(2, 8),
                           jax.sharding.NamedSharding(mesh, PS("data")))
        with pytest.raises(ValueError, match="squeeze"):              # the fake reproduces it
            jax.pmap(per_device(None), axis_name="data")(state, X)
        new_state, Y = ns["make_pmap_step"](None, mesh)(state, X)
        np.testing.assert_array_equal(np.asarray(new_state), [121.0, 121.0])
        np.testing.assert_array_equal(np.asarray(Y), 2 * np.asarray(X))
        assert {s.device for s in Y.addressable_shards} == set(mesh.devices.flat)
    finally:
        pmap_impl._get_mesh_devices.cache_clear()

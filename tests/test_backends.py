"""The four backends behave the same: devices, split_batch (even, uneven, too small),
accuracy over devices, the shared ResNet-18, and each framework's import-time arrangements.

Each framework runs in its own interpreter (tests/_backend_probe.py), once per simulated
device count, so JAX's device count is set the way a notebook sets it.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from d2lmini.frameworks import KEYS
from helpers import one_gpu_smi, path_with

pytestmark = pytest.mark.slow   # every backend in 8 fresh interpreters (about 40 s)

FRAMEWORKS = list(KEYS)
PROBE = Path(__file__).with_name("_backend_probe.py")


def probe(fw, num_devices, extra_env=None):
    env = dict(os.environ, D2LMINI_NUM_DEVICES=str(num_devices), CUDA_VISIBLE_DEVICES="")
    if fw == "jax":   # nothing here is timed: XLA without LLVM's optimisations compiles the
        # probe's ResNet-18 in 4 s instead of 20 s on 2 cores, and computes the same shapes
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
    env.update(extra_env or {})
    r = subprocess.run([sys.executable, str(PROBE), fw], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("PROBE-JSON ")]
    assert line, r.stdout + r.stderr
    return json.loads(line[-1][len("PROBE-JSON "):])


@pytest.fixture(scope="module", params=[(fw, k) for fw in FRAMEWORKS for k in (1, 3)],
                ids=lambda p: f"{p[0]}-{p[1]}dev")
def observed(request):
    fw, k = request.param
    return fw, k, probe(fw, k)


def test_core_import_pulls_in_no_framework(observed):
    assert observed[2]["core_imports_no_framework"]


def test_devices_are_the_simulated_count(observed):
    fw, k, o = observed
    assert o["num_gpus"] == 0
    assert o["num_devices"] == k
    assert o["get_devices_1"] == 1
    if fw in ("mxnet", "jax"):  # real distinct CPU devices
        assert len(set(o["device_reprs"])) == k
    else:  # documented stand-ins: the one CPU device repeated
        assert len(set(o["device_reprs"])) == 1


def test_a_lesson_that_needs_two_devices_gets_stand_ins(observed):
    fw, k, o = observed
    assert len(o["at_least_2"]) == max(k, 2)
    if fw in ("mxnet", "jax"):  # still distinct simulated devices
        assert len(set(o["at_least_2"])) == max(k, 2)


H100 = "0, NVIDIA H100 80GB HBM3, 9.0, 81559, 580.65"
A100 = "0, NVIDIA A100-SXM4-80GB, 8.0, 81920, 580.65"


def run_on_fake_gpu_host(tmp_path, fw, gpu_line, profile):
    """What ``d2l.try_all_gpus()`` of this (CPU) build does on a host whose nvidia-smi
    reports ``gpu_line``: its stdout, with "DEVICES ..." or "ERROR <type> <message>"."""
    one_gpu_smi(tmp_path, gpu_line)
    code = (f"from d2lmini import {fw} as d2l\n"
            "try:\n    print('DEVICES', d2l.try_all_gpus())\n"
            "except Exception as e:\n    print('ERROR', type(e).__name__, e)\n")
    env = dict(os.environ, PATH=path_with(tmp_path), D2LMINI_NUM_DEVICES="2",
               D2LMINI_PROFILE=profile)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env).stdout


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_cpu_build_on_a_gpu_host(tmp_path, fw):
    """A GPU host (a fake nvidia-smi; an A100, which MXNet's GPU build supports) and this CPU
    build: the gpu profile stops with the package to install; another profile runs on the
    CPU and says so."""
    out = run_on_fake_gpu_host(tmp_path, fw, A100, "gpu")
    assert "ERROR GPUBuildMissing" in out and "CPU build" in out and "Install" in out, out
    out = run_on_fake_gpu_host(tmp_path, fw, A100, "smoke")
    assert "NOTE:" in out and "CPU build" in out and "DEVICES" in out, out


def test_mxnet_on_hopper_uses_cpu_contexts(tmp_path):
    """No MXNet build has kernels for compute capability 9.0: installing the GPU build would
    not help, so even the gpu profile runs on CPU contexts, with a note saying why."""
    out = run_on_fake_gpu_host(tmp_path, "mxnet", H100, "gpu")
    assert "no kernels for compute capability 9.0" in out, out
    assert "DEVICES [cpu(0), cpu(1)]" in out, out


def test_asking_for_more_devices_than_exist_says_what_to_do(observed):
    fw, k, o = observed
    err = o["get_devices_too_many"]
    assert err["type"] == "ValueError"
    assert f"asked for {k + 1} devices but only {k} exist" in err["message"]
    assert "D2LMINI_NUM_DEVICES" in err["message"]


def test_split_batch_even_and_uneven(observed):
    fw, k, o = observed
    for n, s in o["splits"].items():
        n = int(n)
        assert sum(s["sizes"]) == n and len(s["sizes"]) == k
        assert max(s["sizes"]) - min(s["sizes"]) <= 1
        assert s["sizes"] == sorted(s["sizes"], reverse=True)  # the extra samples go first
        assert s["X_roundtrip"] and s["y_roundtrip"]
    assert all(o["placement"])


def test_split_batch_rejects_bad_batches(observed):
    fw, k, o = observed
    if k > 1:
        err = o["split_too_small"]
        assert err["type"] == "ValueError" and "at least one sample" in err["message"]
    assert o["split_mismatch"]["type"] == "ValueError"


def test_evaluate_accuracy_splits_and_counts(observed):
    # 23 samples, every 4th label wrong -> 6 wrong, 17 right; batches of 7 (uneven splits)
    o = observed[2]
    assert o["evaluate_accuracy"] == pytest.approx(17 / 23)
    assert o["evaluate_accuracy_list"] == pytest.approx(17 / 23)


def test_the_saved_all_reduces_give_every_device_the_sum(observed):
    # k = 1 and 3 devices holding 1, 2, ...: every device ends with 1 + 2 + ... + k (exact)
    fw, k, o = observed
    total = k * (k + 1) / 2
    for name, held in o["saved_allreduces"].items():
        assert held == [[total] * 7] * k, (fw, name, held)


def test_resnet18_variant_forward(observed):
    assert observed[2]["resnet18_shape"] == [3, 10]


def test_paddle_import_keeps_root_logger_level():
    o = probe("paddle", 2)
    assert o["root_logger_level"] == 30  # WARNING, as set before the import


def test_jax_initialised_too_early_gives_a_clear_error(tmp_path):
    script = tmp_path / "early.py"
    script.write_text(
        "import jax, jax.numpy as jnp\n"
        "jnp.ones(1).block_until_ready()  # initialises JAX with 1 CPU device\n"
        "from d2lmini import jax as d2l\n"
        "try:\n"
        "    d2l.try_all_gpus()\n"
        "except RuntimeError as e:\n"
        "    print('ERROR:', e)\n")
    env = dict(os.environ, D2LMINI_NUM_DEVICES="3", CUDA_VISIBLE_DEVICES="")
    env.pop("XLA_FLAGS", None)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                       timeout=120)
    assert "ERROR:" in r.stdout, r.stdout + r.stderr
    assert "import d2lmini.jax before any JAX operation" in r.stdout


def test_mxnet_runs_under_numpy2():
    import numpy as np
    assert int(np.__version__.split(".")[0]) >= 2
    code = ("from d2lmini import mxnet as d2l\nfrom mxnet import nd, autograd\n"
            "x = nd.array([1.0, 2.0, 3.0], ctx=d2l.try_all_gpus()[-1]); x.attach_grad()\n"
            "with autograd.record():\n    y = (x * x).sum()\ny.backward()\n"
            "print(x.grad.asnumpy().tolist())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, D2LMINI_NUM_DEVICES="2"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[2.0, 4.0, 6.0]"


def test_invalid_device_count_is_rejected():
    r = subprocess.run([sys.executable, "-c", "from d2lmini import torch as d2l; d2l.try_all_gpus()"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, D2LMINI_NUM_DEVICES="zero"))
    assert r.returncode != 0
    assert "D2LMINI_NUM_DEVICES must be a positive integer" in r.stderr


_CACHE_SCRIPT = """
import sys
import numpy as np
if sys.argv[1] == "d2lmini":
    from d2lmini import jax as d2l           # sets 8 CPU devices, keys the cache device-neutrally
    devices = d2l.try_all_gpus()
else:                                        # the control: JAX as it comes
    import jax
    jax.config.update("jax_num_cpu_devices", int(sys.argv[2]))
    devices = jax.devices()
import jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(1) if event == "/jax/compilation_cache/cache_hits" else None)
f = jax.jit(lambda x: jnp.sin(x) * 2 + x.sum())
x = np.arange(6.0, dtype=np.float32)
want = np.sin(x) * 2 + x.sum()
for d in devices:                            # the same program on each device
    y = f(jax.device_put(x, d))
    assert y.devices() == {d} and np.allclose(np.asarray(y), want), (d, y)
per_device = len(hits)
for pair in (devices[:2], devices[-2:]):     # one collective program on two device pairs
    mesh = Mesh(np.array(pair), ("d",))
    s = jax.jit(lambda v: v.sum(), out_shardings=NamedSharding(mesh, P()))(
        jax.device_put(np.arange(8.0, dtype=np.float32), NamedSharding(mesh, P("d"))))
    assert {sh.device for sh in s.addressable_shards} == set(pair) and float(s) == 28.0
print("HITS", per_device, len(hits) - per_device)
"""


@pytest.mark.parametrize("how", ["d2lmini", "plain"])
def test_jax_cache_serves_one_cpu_devices_program_to_the_others(tmp_path, how):
    """With 8 simulated CPU devices, d2lmini.jax makes JAX's persistent cache hand the program
    compiled for the first device to the other seven (and a collective compiled for devices
    0-1 to devices 6-7), with results right and on the right devices; a process with 2
    devices then finds all of them compiled.  Plain JAX compiles each again (the control:
    this is what the change buys)."""
    script = tmp_path / "cache.py"
    script.write_text(_CACHE_SCRIPT)
    hits = []
    for k in (8, 2):
        env = dict(os.environ, D2LMINI_NUM_DEVICES=str(k), CUDA_VISIBLE_DEVICES="",
                   JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"),
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
        env.pop("XLA_FLAGS", None)
        r = subprocess.run([sys.executable, str(script), how, str(k)], capture_output=True,
                           text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        hits.append(tuple(map(int, r.stdout.split("HITS")[1].split())))
    # k = 2, where both pairs are devices 0-1: d2lmini finds every program compiled by the
    # 8-device run; plain JAX only finds its own first pair's program again (same devices)
    assert hits == ([(7, 1), (2, 2)] if how == "d2lmini" else [(0, 0), (0, 1)]), hits

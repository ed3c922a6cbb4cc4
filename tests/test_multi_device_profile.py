"""d2lmini.config.multi_device_profile: the sizes of a lesson's k-device work.

On a host with fewer GPUs than k the k devices are stand-ins: the GPUs repeated (PyTorch),
or, since JAX meshes cannot hold one device twice, simulated CPU devices (``plan_devices(..., stand_in="cpu")``).  Under the gpu profile their
work would take an hour on the CPU (seen on an H100: the concise JAX notebook trained the
width-64 ResNet-18 on CPU stand-ins for over 15 minutes), so it takes the cpu profile's sizes,
while one-device runs keep the gpu profile and the GPU.  The GPU hosts are faked (``host``
fixture: what nvidia-smi would report); the framework's GPU count is an argument.
"""
import pytest

import d2lmini
from d2lmini import config

rule = config.multi_device_profile


def test_cpu_stand_ins_for_a_one_gpu_host_take_the_cpu_profiles_sizes(host):
    host(1, profile="gpu")                                  # k unset: the lesson asks for 2
    plan = d2lmini.plan_devices("jax", 1, at_least=2, stand_in="cpu")
    assert (plan.kind, plan.count, plan.cpu_stand_ins) == ("cpu", 2, True)
    k_profile = rule(plan)
    assert k_profile is d2lmini.PROFILES["cpu"]
    gpu = d2lmini.PROFILES["gpu"].concise
    assert k_profile.concise.width < gpu.width and k_profile.concise.train_samples
    assert rule(plan, d2lmini.PROFILES["gpu"]) is d2lmini.PROFILES["cpu"]
    for k in (2, 3, 8):
        host(1, profile="gpu", requested=k)
        assert rule(d2lmini.plan_devices("jax", 1, at_least=2, stand_in="cpu")).name == "cpu"
    host(4, profile="gpu", requested=8)                     # 4 GPUs, 8 devices wanted
    assert rule(d2lmini.plan_devices("jax", 4, stand_in="cpu")).name == "cpu"


def test_the_lighter_profiles_are_kept_on_stand_ins(host):
    for name in ("smoke", "cpu"):
        host(1, profile=name, requested=8)
        plan = d2lmini.plan_devices("jax", 1, stand_in="cpu")
        assert plan.cpu_stand_ins and rule(plan).name == name


def test_repeated_gpus_take_the_cpu_profiles_sizes(host):
    """GPUs repeated as stand-ins (PyTorch on a one-GPU host): every rank on the same GPU, the
    all-reduce through host memory; concise/pytorch took 385 s of the gpu profile's 658 s on
    one H200.  The k-device work takes the cpu profile's sizes there, on the GPU."""
    host(1, profile="gpu")
    plan = d2lmini.plan_devices("torch", 1, at_least=2)
    assert (plan.kind, plan.count, plan.gpus, plan.stand_ins) == ("gpu", 2, 1, True)
    assert rule(plan).name == "cpu"
    host(4, profile="gpu", requested=8)
    assert rule(d2lmini.plan_devices("torch", 4)).name == "cpu"
    for name in ("smoke", "cpu"):
        host(1, profile=name)
        assert rule(d2lmini.plan_devices("torch", 1, at_least=2)).name == name


def test_every_other_plan_keeps_the_profile(host):
    host(2, profile="gpu")                     # one GPU per device: the gpu profile
    assert rule(d2lmini.plan_devices("torch", 2, at_least=2)).name == "gpu"
    host(8, profile="gpu")                                  # enough GPUs
    plan = d2lmini.plan_devices("jax", 8, at_least=2, stand_in="cpu")
    assert plan.kind == "gpu" and not plan.cpu_stand_ins and rule(plan).name == "gpu"
    host(2, profile="gpu", requested=2)
    assert rule(d2lmini.plan_devices("jax", 2, at_least=2, stand_in="cpu")).name == "gpu"
    host(0, profile="gpu")                     # no GPU at all: the gpu profile was asked for
    plan = d2lmini.plan_devices("jax", 0, at_least=2, stand_in="cpu")
    assert not plan.cpu_stand_ins and rule(plan).name == "gpu"
    host(1, profile="gpu", requested=2)        # no kernels for the GPU: nothing runs on it
    plan = d2lmini.plan_devices("mxnet", 1, unsupported="MXNet has no kernels for 9.0.")
    assert not plan.cpu_stand_ins and rule(plan).name == "gpu"
    host(1, profile="smoke")                   # a CPU build on a GPU host (smoke: a note)
    assert not d2lmini.plan_devices("jax", 0, stand_in="cpu").cpu_stand_ins


def test_the_backend_plan_of_a_one_gpu_host(host, capsys):
    """What ``d2l.plan()`` of d2lmini.jax decides (``device_plan(..., stand_in="cpu")``) on a
    one-GPU host, and the profile the concise notebook then gives its k-device work."""
    host(1, profile="gpu")
    config.reset_device_plans()
    try:
        plan = config.device_plan("jax", lambda: 1, at_least=2, stand_in="cpu")
        assert plan.cpu_stand_ins and "simulated CPU devices" in capsys.readouterr().out
        assert rule(plan, d2lmini.get_profile()).name == "cpu"
        assert config.device_plan("jax", lambda: 1) is plan     # decided once
    finally:
        config.reset_device_plans()


def test_plans_compare_as_before():
    """The new field has a default: plans built without it are the plans of before."""
    assert config.DevicePlan("gpu", 2, 2, False, None).cpu_stand_ins is False
    with pytest.raises(Exception):
        config.DevicePlan("cpu", 2, 0, True, None).cpu_stand_ins = True   # frozen

"""tools/benchmark.py and d2lmini.bench: a record says where its arrays lived, its timing waits
for the work, and a time the devices cannot have achieved is refused, not recorded.

The numbers of the book's first GPU run (one H100) are the test cases: XLA counted 5.95e11 FLOP
for a JAX ResNet-18 step (width 64, batch 256) that the old benchmark timed at 1.7 ms; the
card's float32 matmul peaked at 51.6 TFLOP/s; PyTorch's same step took 39.0 ms."""
import json
import os
import subprocess
import sys
import time

import pytest

from d2lmini import bench
from helpers import ROOT

H100_FP32_PEAK = 51.6e12
XLA_FLOPS_W64 = 5.95e11


def load_benchmark():
    from tools import benchmark
    return benchmark


def worker_record(flops, times, peak, arrays_on=("gpu:0",), requested=("gpu:0",)):
    """What a worker returns, before the driver summarises and checks it."""
    return {"framework": "jax", "impl": "concise", "devices": len(arrays_on), "batch_size": 256,
            "devices_requested": list(requested), "arrays_on": list(arrays_on),
            "device_kind": bench.device_kind(list(arrays_on), 1), "flops_per_step": flops,
            "peak_flops": peak, "step_times": list(times)}


# ------------------------------------------------------------------ the rate check
def test_impossible_time_is_refused():
    rec = bench.rate_fields(XLA_FLOPS_W64, [1.7e-3] * 5, H100_FP32_PEAK)
    assert rec["achieved_flops"] == pytest.approx(3.5e14, rel=0.01)     # 350 TFLOP/s
    with pytest.raises(bench.ImpossibleRate, match="impossible rate.*above the peak 51.6 TFLOP/s"):
        bench.check_rate(rec)


def test_driver_refuses_an_impossible_record():
    b = load_benchmark()
    rec = b.summarise(worker_record(XLA_FLOPS_W64, [1.6e-3, 1.7e-3, 2.0e-3], H100_FP32_PEAK))
    why = b.refusal(rec)
    assert why and "impossible rate" in why and "rate_check" not in rec


def test_plausible_time_passes():
    flops = bench.resnet18_train_flops(256, 64)         # PyTorch's count of the same step
    b = load_benchmark()
    rec = b.summarise(worker_record(flops, [0.0390, 0.0384, 0.0404], H100_FP32_PEAK))
    assert b.refusal(rec) is None and rec["rate_check"] == "passed"
    assert rec["achieved_flops"] == pytest.approx(flops / 0.0390)
    assert rec["achieved_flops"] <= rec["achieved_flops_best"] <= H100_FP32_PEAK
    assert bench.rate_status(rec) == "passed"


def test_the_fastest_repeat_is_checked():
    # a plausible median does not hide one impossible repeat
    rec = bench.rate_fields(XLA_FLOPS_W64, [0.03, 0.03, 1e-3], H100_FP32_PEAK)
    assert rec["achieved_flops"] < H100_FP32_PEAK
    with pytest.raises(bench.ImpossibleRate):
        bench.check_rate(rec)


def test_a_record_without_count_or_peak_cannot_pass():
    with pytest.raises(ValueError):
        bench.rate_fields(None, [0.01], H100_FP32_PEAK)
    with pytest.raises(ValueError):
        bench.rate_fields(1e9, [0.01], 0)
    with pytest.raises(ValueError):
        bench.check_rate({"arrays_on": ["cpu"]})
    old = {"framework": "torch", "step_s_median": 0.05}     # a record of an older results file
    assert bench.rate_status(old) == bench.PRE_CHECK == "recorded before the rate check"


def test_best_rate_times_the_blocking_call():
    clock = iter(range(100)).__next__                       # every call of the clock: +1 s
    calls = []
    rate = bench.best_rate(lambda: calls.append(1), 10.0, calls=2, windows=3, warmup=1,
                           clock=clock)
    assert len(calls) == 1 + 3 * 2 and rate == 10.0 / 0.5


# ------------------------------------------------------------------ FLOP counts
def test_analytic_counts_equal_torch_flop_counter():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    from d2lmini import torch as d2l
    from d2lmini.models import lenet_init
    b = load_benchmark()
    for width, batch in ((4, 12), (16, 256), (64, 256)):
        net = d2l.resnet18(width=width).to("meta")
        X = torch.zeros(batch, 1, 28, 28, device="meta")
        y = torch.zeros(batch, dtype=torch.long, device="meta")
        counted = b.torch_counted(lambda: F.cross_entropy(net(X), y).backward())
        assert counted == bench.resnet18_train_flops(batch, width)
    assert bench.resnet18_train_flops(256, 64) / 256 == pytest.approx(2.73e9, rel=0.01)

    params = [torch.from_numpy(a).requires_grad_() for a in lenet_init(0)]

    def lenet(X):          # the from-scratch chapter's LeNet
        W1, b1, W2, b2, W3, b3, W4, b4 = params
        h = F.avg_pool2d(F.relu(F.conv2d(X, W1, b1)), kernel_size=2, stride=2)
        h = F.avg_pool2d(F.relu(F.conv2d(h, W2, b2)), kernel_size=2, stride=2)
        return F.relu(h.flatten(start_dim=1) @ W3 + b3) @ W4 + b4
    X, y = torch.zeros(7, 1, 28, 28), torch.zeros(7, dtype=torch.long)
    counted = b.torch_counted(lambda: F.cross_entropy(lenet(X), y, reduction="sum").backward())
    assert counted == bench.lenet_train_flops(7)


# ------------------------------------------------------------------ where the arrays live
@pytest.mark.parametrize("arrays_on, host_gpus, kind", [
    (["cuda:0"], 1, "gpu"),
    (["gpu:0", "gpu:1"], 2, "gpu"),
    (["cuda:0", "cuda:0"], 1, "gpu-stand-ins"),
    (["gpu(0)", "gpu(1)", "gpu(0)"], 2, "gpu-stand-ins"),
    (["cpu:0"], 1, "cpu"),
    (["cpu"], 0, "cpu"),
    (["cpu:0", "cpu:1"], 0, "simulated-cpu"),
    (["Place(cpu)", "Place(cpu)"], 0, "simulated-cpu"),
    (["cpu:0", "cpu:1"], 1, "cpu-stand-ins"),
    (["cpu(0)", "cpu(1)"], 1, "cpu-stand-ins"),
    (["Place(gpu:0)", "cpu"], 1, "mixed"),
    (["cpu:0+gpu:0"], 1, "mixed"),
])
def test_device_kind(arrays_on, host_gpus, kind):
    assert bench.device_kind(arrays_on, host_gpus) == kind


def test_placement_mismatch():
    assert bench.placement_mismatch(["cuda:0", "cuda:0"], ["cuda:0", "cuda:0"]) is None
    assert bench.placement_mismatch(["cpu", "cpu"], ["cpu", "cpu"]) is None
    assert bench.placement_mismatch(["Place(cpu)"], ["cpu:0"]) is None       # any spelling
    wrong = bench.placement_mismatch(["gpu:0"], ["cpu:0"])
    assert wrong and "not on the requested" in wrong
    assert bench.placement_mismatch(["cuda:0", "cuda:1"], ["cuda:0", "cuda:0"])


def test_k1_asks_for_try_gpu_whatever_the_lesson_plans():
    b = load_benchmark()

    class FakeBackend:           # a one-GPU machine whose lesson plan gives two CPU stand-ins
        def try_gpu(self):
            return "gpu:0"

        def get_devices(self, k):
            return ["cpu:0", "cpu:1"][:k]
    assert b.bench_devices(FakeBackend(), 1) == ["gpu:0"]
    assert b.bench_devices(FakeBackend(), 2) == ["cpu:0", "cpu:1"]


def test_jax_label_comes_from_the_arrays():
    """A tiny JAX array put on a CPU device is labelled cpu even when the benchmark asked for
    a GPU; a state replicated on two CPU devices of a GPU host is cpu-stand-ins."""
    pytest.importorskip("jax")
    code = """
import json
from d2lmini import jax as d2l          # first: two CPU devices
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tools import benchmark as b
a = b.JaxAdapter()
cpu = jax.devices('cpu')
x = jax.device_put(jnp.ones(3), cpu[0])
one = b.placement(a, [[x]], ['gpu:0'], host_gpus=1)
mesh = Mesh(np.array(cpu[:2]), ('data',))
state = jax.device_put({'w': jnp.ones(3), 'b': jnp.zeros(2)}, NamedSharding(mesh, PartitionSpec()))
two = b.placement(a, a.device_replicas(state), ['cpu:0', 'cpu:1'], host_gpus=1)
a.block(state)
before = jax.config.jax_default_matmul_precision
with b.proof_numerics(d2l):                   # a notebook that sets 'highest' for itself
    jax.config.update('jax_default_matmul_precision', 'highest')
restored = jax.config.jax_default_matmul_precision == before
print('RESULT ' + json.dumps([one, two, restored]))
"""
    env = dict(os.environ, D2LMINI_NUM_DEVICES="2", CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=180, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    one, two, restored = json.loads(next(l for l in r.stdout.splitlines()
                                         if l.startswith("RESULT "))[7:])
    assert restored          # the timed steps run with JAX's defaults again
    assert one == {"devices_requested": ["gpu:0"], "arrays_on": ["cpu:0"], "device_kind": "cpu"}
    assert bench.placement_mismatch(one["devices_requested"], one["arrays_on"])
    assert two["arrays_on"] == ["cpu:0", "cpu:1"] and two["device_kind"] == "cpu-stand-ins"
    assert bench.placement_mismatch(two["devices_requested"], two["arrays_on"]) is None


def test_torch_label_and_peak_on_the_cpu(monkeypatch):
    torch = pytest.importorskip("torch")
    b = load_benchmark()
    monkeypatch.setitem(b.MATMUL_N, "cpu", 256)
    a = b.TorchAdapter()
    replicas = [[torch.zeros(2), torch.ones(3)], [torch.zeros(2), torch.ones(3)]]
    arrays_on = a.arrays_on(replicas)
    assert arrays_on == ["cpu", "cpu"] and bench.device_kind(arrays_on, 0) == "simulated-cpu"
    peak, how = a.peak(arrays_on)
    assert peak > 0 and "256x256 on cpu" in how and "NumPy" in how


# ------------------------------------------------------------------ the timing loop
def test_timing_waits_for_the_work():
    """Steps that only enqueue work (as JAX and CUDA do) are timed with the work: every window
    ends by blocking on the arrays the steps produced."""
    b = load_benchmark()
    pending = []

    class Async(b.Adapter):
        def block(self, tree):
            time.sleep(0.05 * len(pending))           # the queued work
            pending.clear()

    case = b.Case(step=lambda X, y: pending.append(1), state=lambda: [], replicas=lambda: [],
                  flops=None)
    times = b.time_case(case, Async(), [(None, None)], warmup=1, repeats=2, steps=2)
    assert len(times) == 2 and min(times) >= 0.05 * 0.9


def test_placing_the_batch_is_not_timed():
    """The concise step is timed on a batch already on the devices: ``Case.place`` runs before
    the clock starts (a slow placement would otherwise show in every step)."""
    b = load_benchmark()
    case = b.Case(step=lambda X, y: None, state=lambda: [], replicas=lambda: [], flops=None,
                  place=lambda X, y: (time.sleep(0.05), (X, y))[1], span=b.STEP_SPAN)

    class Sync(b.Adapter):
        def block(self, tree):
            pass
    times = b.time_case(case, Sync(), [(1, 2), (3, 4)], warmup=1, repeats=2, steps=2)
    assert max(times) < 0.01


def test_launched_ranks_report_the_step_and_the_epoch_apart():
    """Launched DDP/Paddle ranks time their step on a device batch (``step_s``) and train
    epochs with their input pipeline (``epoch_s``): the record's step times are the former,
    the slowest rank per window; the epoch's per-step times go to a field of their own."""
    b = load_benchmark()

    class Args:
        concise_steps = 4
    ranks = [{"step_s": [0.010, 0.012], "epoch_s": [9.0, 0.2, 0.24], "arrays_on": ["cuda:0"]},
             {"step_s": [0.011, 0.011], "epoch_s": [9.1, 0.22, 0.2], "arrays_on": ["cuda:1"]}]
    steps, epochs, on = b.launched_times(ranks, "epoch_s", Args)
    assert steps == [0.011, 0.012]                          # slowest rank, window by window
    assert epochs == pytest.approx([0.055, 0.06])           # epoch 1 (warm-up) dropped
    assert on == ["cuda:0", "cuda:1"]
    assert b.STEP_SPAN == "step on device arrays" and b.EPOCH_SPAN != b.STEP_SPAN


def test_cpu_ceiling_is_the_faster_of_framework_and_numpy(monkeypatch):
    monkeypatch.setattr(bench, "numpy_matmul_rate", lambda n=2048, windows=3: 30e9)
    assert bench.cpu_ceiling(11e9, "paddle matmul")[0] == 30e9      # a slow framework matmul
    assert bench.cpu_ceiling(90e9, "torch matmul")[0] == 90e9
    assert "NumPy" in bench.cpu_ceiling(11e9, "paddle matmul")[1]


def test_numerics_of_the_timing_are_recorded(monkeypatch):
    b = load_benchmark()
    monkeypatch.delenv("D2LMINI_EXACT", raising=False)
    assert b.timing_numerics("torch") == "framework defaults"
    monkeypatch.setenv("D2LMINI_EXACT", "1")
    assert b.timing_numerics("jax") == "exact"


def test_a_count_that_leaves_the_convolutions_out_falls_back_to_the_analytic_one():
    """One H200 (JAX 0.11.2): XLA's cost analysis of the GPU-compiled ResNet-18 step gave
    2.6e9 FLOP, the convolutions (cuDNN calls) left out; the analytic count is 7.0e11."""
    b = load_benchmark()
    analytic = bench.resnet18_train_flops(256, 64)
    n, how = b.counted(lambda: 2_635_369_728, analytic, "XLA", "analytic")
    assert n == analytic and how.startswith("analytic") and "not counted" in how
    n, how = b.counted(lambda: int(XLA_FLOPS_W64), analytic, "XLA", "analytic")   # the CPU's count
    assert (n, how) == (int(XLA_FLOPS_W64), "XLA")


def test_the_notebook_cells_are_chosen_by_tag_not_by_heading(tmp_path):
    """A worker runs a notebook's cells up to the one tagged as its stop, without the ones
    tagged bench:skip, whatever the headings say; and the book's notebooks carry the tags."""
    b = load_benchmark()
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["## Training\n"]},
             {"cell_type": "code", "metadata": {}, "source": ["ran = ['setup']\n"]},
             {"cell_type": "code", "metadata": {"tags": [b.SKIP]}, "source": ["ran.append('skip')\n"]},
             {"cell_type": "code", "metadata": {}, "source": ["ran.append('kept')\n"]},
             {"cell_type": "code", "metadata": {"tags": [b.LAUNCHED_STOP]}, "source": ["ran.append('x')\n"]},
             {"cell_type": "code", "metadata": {"tags": [b.STOP]}, "source": ["ran.append('proof')\n"]},
             {"cell_type": "code", "metadata": {}, "source": ["ran.append('after')\n"]}]
    nb = tmp_path / "nb.ipynb"
    nb.write_text(json.dumps({"cells": cells}))
    cwd = os.getcwd()
    try:
        assert b.exec_notebook(nb)["ran"] == ["setup", "kept", "x"]
        assert b.exec_notebook(nb, b.LAUNCHED_STOP)["ran"] == ["setup", "kept"]
    finally:
        os.chdir(cwd)
    for fw in b.NOTEBOOK.values():
        def tagged(chapter, tag):
            nb = json.loads((ROOT / "chapters" / chapter / f"{fw}.ipynb").read_text())
            return [c for c in nb["cells"] if tag in c.get("metadata", {}).get("tags", [])]
        assert tagged("scratch", b.SKIP) and not tagged("scratch", b.STOP)
        assert tagged("concise", b.SKIP) and len(tagged("concise", b.STOP)) == 1
        assert len(tagged("comm", b.STOP)) == 1
        assert any("train(" in "".join(c["source"]) for c in tagged("scratch", b.SKIP)), fw
    for fw in ("pytorch", "paddle"):          # the launched ranks' notebooks
        nb = json.loads((ROOT / "chapters" / "concise" / f"{fw}.ipynb").read_text())
        assert sum(b.LAUNCHED_STOP in c.get("metadata", {}).get("tags", []) for c in nb["cells"]) == 1


def test_the_comm_benchmark_fits_each_framework_as_its_lab_does():
    """benchmark --comm fits a framework's all-reduce with the scheme its communication lab
    fits it with (the first entry of the lab's cc.fit_lab call)."""
    import re
    from d2lmini.commcost import FRAMEWORK_SCHEME
    b = load_benchmark()
    assert set(FRAMEWORK_SCHEME) == set(b.NOTEBOOK)
    for fw, stem in b.NOTEBOOK.items():
        cells = json.loads((ROOT / "chapters" / "comm" / f"{stem}.ipynb").read_text())["cells"]
        src = next("".join(c["source"]) for c in cells if "cc.fit_lab(" in "".join(c["source"]))
        first = re.search(r"cc\.fit_lab\(\{[^:]+:\s*\(\w+,\s*'(\w+)'\)", src)
        assert first and first.group(1) == FRAMEWORK_SCHEME[fw], (fw, src[:200])

"""What broke on the first GPU server run, reproduced without a GPU.

* The devices notebooks' count check compared the device list with the GPU count, which is
  wrong when D2LMINI_NUM_DEVICES asks for more devices than the host has GPUs (stand-ins):
  the check is run here, from the notebooks' own cell, on a faked one-GPU host.
* ``record_result`` from a notebook whose working directory was replaced while the kernel ran
  (a checkout re-sent under a running kernel): relative results paths are taken from the
  folder the process started in.
* The second run (one H200, gpu profile): concise/jax's wrong-import-order demonstration (now
  on jax-in-depth)
  launched a child with ``JAX_PLATFORMS=cpu`` only; on the GPU host that child stopped with
  "the installed jax is a CPU build" (the gpu profile's refusal to fall back) instead of the
  lesson's message.  Run here from the notebook's own cell, on a faked GPU host (a fake
  ``nvidia-smi`` on PATH, which the child inherits).
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from d2lmini import config
from d2lmini.frameworks import FRAMEWORKS as ALL
from helpers import ROOT, fake_nvidia_smi, path_with

pytestmark = pytest.mark.gpu   # the GPU code paths on a faked GPU host

FRAMEWORKS = {f.notebook: f.key for f in ALL}              # notebook -> backend


def count_cell(notebook: str) -> str:
    cells = json.loads((ROOT / "chapters" / "devices" / f"{notebook}.ipynb").read_text())["cells"]
    src = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    return next(s for s in src if "one entry per device" in s)


class FakeBackend:
    """A backend on a host with ``gpus`` GPUs, planning its devices by d2lmini's rule."""
    def __init__(self, framework, gpus):
        self.framework, self.gpus = framework, gpus
        stand_in = "cpu" if framework == "jax" else "repeat"
        self._plan = config.plan_devices(framework, gpus, stand_in=stand_in)

    def plan(self, at_least=1):
        return self._plan

    def num_gpus(self):
        return self.gpus

    def try_all_gpus(self):
        return [f"dev{i}" for i in range(self._plan.count)]

    def get_devices(self, k):
        from d2lmini.utils import check_device_count
        return check_device_count(k, self.try_all_gpus(), "Set D2LMINI_NUM_DEVICES to ...")


@pytest.mark.parametrize("notebook", sorted(FRAMEWORKS))
@pytest.mark.parametrize("gpus,requested", [(1, None), (1, 1), (1, 2), (1, 8), (8, None),
                                            (8, 3), (0, None), (0, 5)])
def test_devices_count_check_holds_on_gpu_hosts(notebook, gpus, requested, host, capsys):
    import d2lmini
    host(gpus, requested=requested)
    d2l = FakeBackend(FRAMEWORKS[notebook], gpus)
    exec(count_cell(notebook), {"d2l": d2l, "d2lmini": d2lmini, "devices": d2l.try_all_gpus()})
    assert "one entry per device: True" in capsys.readouterr().out


def test_results_land_where_the_notebook_started_after_its_folder_is_replaced(tmp_path):
    nbdir = tmp_path / "chapters" / "concise"
    nbdir.mkdir(parents=True)
    script = textwrap.dedent(f"""
        import os, shutil, sys
        import d2lmini                                   # the kernel starts in the notebook's folder
        from d2lmini.results import record_result, load_results
        old = {str(nbdir)!r}
        # the checkout is re-sent while the kernel runs: the folder is replaced by a new one
        shutil.move(old, old + '.old'); os.makedirs(old); shutil.rmtree(old + '.old')
        record_result('results.json', chapter='concise', framework='torch', api='DDP',
                      devices=1, profile='gpu', batch_size=256, test_acc=0.9)
        print(len(load_results(os.path.join(old, 'results.json'))))
        shutil.rmtree(old)                               # gone for good: a clear error
        try:
            record_result('results.json', chapter='concise', framework='torch', api='DDP',
                          devices=1, profile='gpu', batch_size=256, test_acc=0.9)
        except FileNotFoundError as e:
            print('ERROR', e)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", script], cwd=nbdir, capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "1"
    assert lines[1].startswith("ERROR") and "restart the kernel" in lines[1]


def test_jax_synchronize_waits_on_every_platform_in_use(monkeypatch):
    # the H100 benchmark read its clock while a JAX state on CPU stand-ins was still being
    # computed: jax.live_arrays() without a platform lists only the default backend's (GPU)
    # arrays, so synchronize() never waited for the CPU's
    d2l = pytest.importorskip("d2lmini.jax")
    asked = []
    monkeypatch.setattr(d2l.jax, "live_arrays", lambda platform=None: asked.append(platform) or [])
    monkeypatch.setattr(d2l, "num_gpus", lambda: 1)             # a GPU host
    d2l.synchronize()
    assert sorted(asked) == ["cpu", "gpu"]
    asked.clear()
    d2l.synchronize(d2l.jax.devices("cpu")[:1])                # CPU stand-ins: the CPU's
    assert asked == ["cpu"]


def fake_gpu_host(tmp_path, name="NVIDIA H200"):
    """PATH with an ``nvidia-smi`` that reports one GPU, for this process's children."""
    return path_with(fake_nvidia_smi(tmp_path / "fake-bin",
                                     'case "$*" in\n'
                                     f'  *--query-gpu*) echo "0, {name}, 9.0, 143771, 580.159.04";;\n'
                                     f'  *) echo "GPU 0: {name} (UUID: GPU-0)";;\n'
                                     "esac"))


def notebook_cell(path: str, marker: str) -> str:
    cells = json.loads((ROOT / path).read_text())["cells"]
    return next("".join(c["source"]) for c in cells
                if c["cell_type"] == "code" and marker in "".join(c["source"]))


@pytest.mark.parametrize("k", [1, 2])
def test_jax_wrong_import_order_demo_on_a_gpu_host(tmp_path, k):
    """The cell as the notebook has it, under the gpu profile on a one-GPU host: the child
    must fail with the lesson's message, not with the gpu profile's refusal."""
    cell = notebook_cell("chapters/concise/jax-in-depth.ipynb", "Restart the kernel")
    code = f"import d2lmini, d2lmini.launch\nk = {k}\n" + cell
    env = dict(os.environ, PATH=fake_gpu_host(tmp_path), D2LMINI_PROFILE="gpu")
    env.pop("D2LMINI_NUM_DEVICES", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=env, cwd=ROOT / "chapters" / "concise")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "fails with a clear message: True", r.stdout + r.stderr[-2000:]


def test_jax_platforms_cpu_on_a_gpu_host_is_named_not_called_a_cpu_build(host, monkeypatch):
    host(1, profile="gpu")
    with pytest.raises(config.GPUBuildMissing,
                       match=r"JAX_PLATFORMS='cpu' hides .* unset JAX_PLATFORMS") as e:
        config.plan_devices("jax", 0, stand_in="cpu", hidden="JAX_PLATFORMS='cpu'")
    assert "CPU build" not in str(e.value)
    host(1, profile="smoke", requested=3)
    p = config.plan_devices("jax", 0, stand_in="cpu", hidden="JAX_PLATFORMS='cpu'")
    assert (p.kind, p.count) == ("cpu", 3) and "JAX_PLATFORMS" in p.note


@pytest.mark.parametrize("value,hidden", [("cpu", True), ("CPU", True), ("cuda,cpu", False),
                                          ("gpu", False), ("", False)])
def test_jax_gpus_hidden_reads_jax_platforms(monkeypatch, value, hidden):
    from d2lmini import jax as d2l
    monkeypatch.setenv("JAX_PLATFORMS", value)
    assert (d2l.gpus_hidden() is not None) == hidden

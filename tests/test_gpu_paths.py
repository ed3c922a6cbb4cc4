"""What broke on the first GPU server run, reproduced without a GPU.

* The devices notebooks' count check compared the device list with the GPU count, which is
  wrong when D2LMINI_NUM_DEVICES asks for more devices than the host has GPUs (stand-ins):
  the check is run here, from the notebooks' own cell, on a faked one-GPU host.
* ``record_result`` from a notebook whose working directory was replaced while the kernel ran
  (a checkout re-sent under a running kernel): relative results paths are taken from the
  folder the process started in.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from d2lmini import config

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = {"mxnet": "mxnet", "pytorch": "torch", "jax": "jax", "paddle": "paddle"}


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

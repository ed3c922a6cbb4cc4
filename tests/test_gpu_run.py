"""tools.gpu_run, the offline GPU run, tested on the CPU (--allow-cpu): one small notebook,
no benchmark.  CUDA_VISIBLE_DEVICES is emptied so that these tests mean the same on a GPU host."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

pytestmark = [pytest.mark.gpu, pytest.mark.slow]   # the GPU run pipeline, on the CPU; notebooks through tools.gpu_run

DEVICES_NB = ROOT / "chapters" / "devices" / "pytorch.ipynb"


def gpu_run(*args, timeout=300):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "tools.gpu_run", *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)


def report(out: Path) -> dict:
    return json.loads((out / "gpu-report.json").read_text())


def code_notebook(path: Path, *sources: str) -> Path:
    cells = [{"cell_type": "code", "execution_count": None, "id": f"cell{i}", "metadata": {},
              "outputs": [], "source": s} for i, s in enumerate(sources)]
    path.write_text(json.dumps({"cells": cells, "metadata": {"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_refuses_without_gpu(tmp_path):
    r = gpu_run("--frameworks", "torch", "--chapters", "devices", "--skip-benchmark",
                "--out-dir", tmp_path, timeout=60)
    assert r.returncode != 0
    assert "no NVIDIA GPU" in r.stderr and "--allow-cpu" in r.stderr, r.stderr
    assert not (tmp_path / "gpu-report.json").exists()


@pytest.mark.skipif(__import__("importlib").util.find_spec("torch") is None,
                    reason="needs torch")
def test_cpu_run_writes_report(tmp_path):
    before = DEVICES_NB.read_bytes()
    r = gpu_run("--allow-cpu", "--frameworks", "torch", "--chapters", "devices",
                "--skip-benchmark", "--out-dir", tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = report(tmp_path)
    assert rep["frameworks"] == ["torch"]
    assert rep["machine"]["frameworks"]["torch"]["importable"]
    assert rep["machine"]["frameworks"]["torch"]["probe"]["version"]
    assert rep["gpu_used"] is False and rep["allow_cpu"] is True
    assert rep["machine"]["gpus"] == []
    [nb] = rep["notebooks"]
    assert nb["notebook"] == "chapters/devices/pytorch.ipynb" and nb["framework"] == "torch"
    assert nb["status"] == "passed" and nb["seconds"] > 0
    if nb["mode"] == "nbval":
        assert nb["cells"]["passed"] > 0 and nb["cells"]["failed"] == 0
    assert rep["benchmark"]["status"] == "skipped" and rep["status"] == "passed"
    md = (tmp_path / "gpu-report.md").read_text()
    assert "GPU used: NO" in md and "chapters/devices/pytorch.ipynb | passed" in md
    assert not (tmp_path / "results-gpu.json").exists()
    assert DEVICES_NB.read_bytes() == before          # the notebook is never written


@pytest.mark.parametrize("mode", ["nbval", "exec"])
def test_failing_notebook_is_reported_and_the_rest_run(tmp_path, mode):
    if mode == "nbval":
        pytest.importorskip("nbval")
        # a copy of a chapter notebook with one failing cell appended
        nb = json.loads(DEVICES_NB.read_text())
        n_code = sum(c["cell_type"] == "code" for c in nb["cells"])
        nb["cells"].append({"cell_type": "code", "execution_count": None, "id": "deliberate",
                            "metadata": {}, "outputs": [],
                            "source": "raise RuntimeError('deliberate failure')"})
        failing = tmp_path / "pytorch.ipynb"
        failing.write_text(json.dumps(nb))
    else:
        n_code = 1
        failing = code_notebook(tmp_path / "broken.ipynb", "x = 1",
                                "raise RuntimeError('deliberate failure')", "y = 2")
    fine = code_notebook(tmp_path / "fine.ipynb", "x = 41 + 1", "assert x == 42")
    out = tmp_path / "out"
    r = gpu_run("--allow-cpu", "--frameworks", "torch", "--skip-benchmark", "--mode", mode,
                "--out-dir", out, "--notebooks", failing, fine)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    rep = report(out)
    bad, good = rep["notebooks"]
    assert rep["status"] == "failed" and rep["summary"].startswith("1/2 notebooks passed")
    assert bad["status"] == "failed" and good["status"] == "passed"
    [cell] = bad["failing_cells"]
    assert cell["cell"] == f"Cell {n_code}"              # nbval's numbering, from 0
    assert "RuntimeError: deliberate failure" in cell["summary"]
    if mode == "nbval":
        assert bad["cells"]["passed"] == n_code and bad["cells"]["failed"] == 1
    else:
        assert bad["cells"] == {"total": 3, "ran": 1, "skipped": 0}
    md = (out / "gpu-report.md").read_text()
    assert "deliberate failure" in md and "overall: **failed**" in md


def test_notebooks_run_from_a_private_copy(tmp_path):
    # a notebook of the checkout runs in a copy: its working directory is not the checkout's
    # folder, so a checkout replaced during a long run cannot pull the folder from under it
    probe = ROOT / "chapters" / "devices" / "_gpu_run_probe.ipynb"
    seen = tmp_path / "cwd.txt"
    code_notebook(probe, f"import os; open({str(seen)!r}, 'w').write(os.getcwd())")
    try:
        r = gpu_run("--allow-cpu", "--frameworks", "torch", "--skip-benchmark", "--mode", "exec",
                    "--out-dir", tmp_path / "out", "--notebooks", probe)
    finally:
        probe.unlink()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    cwd = Path(seen.read_text())
    assert cwd.name == "devices" and cwd != probe.parent and not cwd.exists()  # copy, removed
    assert report(tmp_path / "out")["notebooks"][0]["notebook"] == \
        "chapters/devices/_gpu_run_probe.ipynb"

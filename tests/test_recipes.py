"""The concise chapter's recipe scripts (chapters/concise/recipe/): in every framework the
one-device script and the data-parallel one are the same program -- on one device the
data-parallel script computes exactly what the one-device script computes -- and the
data-parallel script refuses a global batch its devices cannot split.  The fast-path script
with no knob turned on is the one-device script too."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "chapters" / "concise" / "recipe"
FRAMEWORKS = ["mxnet", "pytorch", "jax", "paddle"]
ARGS = ["--epochs", "2", "--batch-size", "32", "--train-samples", "128", "--test-samples", "64",
        "--width", "4"]


def command(fw, script, k):
    py = sys.executable
    if script.endswith("_dp.py") and fw == "pytorch":
        return [py, "-m", "torch.distributed.run", "--nproc_per_node", str(k),
                "--master_port", str(_port()), str(RECIPE / script)]
    if script.endswith("_dp.py") and fw == "paddle":
        return [py, "-m", "paddle.distributed.launch", "--nproc_per_node", str(k),
                "--log_dir", "logs", "--start_port", str(_port()), str(RECIPE / script)]
    return [py, str(RECIPE / script)]


def _port():
    from d2lmini import launch
    return launch.free_port()


def run(fw, script, k, tmp_path, extra=()):
    out = tmp_path / f"{script}.json"
    env = dict(os.environ, D2LMINI_PROFILE="smoke", D2LMINI_NUM_DEVICES=str(k),
               OMP_NUM_THREADS="1")
    r = subprocess.run(command(fw, script, k) + ARGS + list(extra) + ["--out", str(out)],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=600)
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*")) \
        if (tmp_path / "logs").is_dir() else ""
    return r, out, r.stdout + r.stderr + logs


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_the_data_parallel_script_on_one_device_is_the_one_device_script(fw, tmp_path):
    r1, out1, log1 = run(fw, f"{fw}_one.py", 1, tmp_path)
    assert r1.returncode == 0, log1[-3000:]
    rk, outk, logk = run(fw, f"{fw}_dp.py", 1, tmp_path)
    assert rk.returncode == 0, logk[-3000:]
    one, dp = json.loads(out1.read_text()), json.loads(outk.read_text())
    assert len(one["loss"]) == len(dp["loss"]) == 2 and one["devices"] == dp["devices"] == 1
    # the same weights, batches and arithmetic: the same losses (to float32 printing) and
    # the same test accuracy
    assert dp["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-6), (one, dp)
    assert dp["test_acc"] == one["test_acc"]
    assert "epoch 2: loss" in log1


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_an_uneven_global_batch_is_refused(fw, tmp_path):
    r, out, log = run(fw, f"{fw}_dp.py", 3, tmp_path, extra=["--batch-size", "32"])
    assert r.returncode != 0
    assert "not divisible" in log
    assert not out.exists()


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_the_fast_script_without_knobs_is_the_one_device_script(fw, tmp_path):
    """``<fw>_fast.py --knobs ''`` computes what ``<fw>_one.py`` computes: the fast path adds
    settings, nothing else (the diff the chapter shows is the whole difference)."""
    r1, out1, log1 = run(fw, f"{fw}_one.py", 1, tmp_path)
    assert r1.returncode == 0, log1[-3000:]
    rf, outf, logf = run(fw, f"{fw}_fast.py", 1, tmp_path, extra=["--knobs="])
    assert rf.returncode == 0, logf[-3000:]
    one, fast = json.loads(out1.read_text()), json.loads(outf.read_text())
    assert fast["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-6), (one, fast)
    assert fast["test_acc"] == one["test_acc"]


def test_a_knob_the_recipe_does_not_know_is_refused(tmp_path):
    r, out, log = run("jax", "jax_fast.py", 1, tmp_path, extra=["--knobs=donate,turbo"])
    assert r.returncode != 0 and "unknown knobs ['turbo']" in log and "donate, bf16" in log

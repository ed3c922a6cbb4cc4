"""The four frameworks start from the same weights: each backend's ``canonical_init`` loads
d2lmini.resnet18_init's draw (canonical layout) into its own ResNet-18, and the four networks
then compute the same logits on the same batch, in inference and in training mode (BatchNorm
with batch statistics).  Each framework runs in its own process (tests/_canonical_probe.py)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import d2lmini

from d2lmini.frameworks import KEYS as FRAMEWORKS
from helpers import ROOT


@pytest.fixture(scope="module")
def logits(tmp_path_factory):
    """``logits(fw)``: that framework's {'infer', 'train'} logits, each computed once."""
    d = tmp_path_factory.mktemp("canonical")
    env = dict(os.environ, JAX_PLATFORMS="cpu", D2LMINI_NUM_DEVICES="1")   # CPU arithmetic
    cache = {}

    def get(fw):
        if fw not in cache:
            r = subprocess.run([sys.executable, str(ROOT / "tests" / "_canonical_probe.py"), fw,
                                str(d / f"{fw}.npz")], capture_output=True, text=True, env=env,
                               timeout=300, cwd=str(ROOT))
            assert r.returncode == 0, f"{fw}: {r.stderr[-3000:]}"
            cache[fw] = dict(np.load(d / f"{fw}.npz"))
        return cache[fw]
    return get


def test_the_draw_is_framework_neutral_and_reproducible():
    a = d2lmini.resnet18_init(width=4, seed=0)
    b = d2lmini.resnet18_init(width=4, seed=0)
    c = d2lmini.resnet18_init(width=4, seed=1)
    assert list(a) == [n for n, _ in d2lmini.resnet18_spec(width=4)]
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert not np.array_equal(a["stem.conv.weight"], c["stem.conv.weight"])
    assert all(a[n].shape == s and a[n].dtype == np.float32 for n, s in d2lmini.resnet18_spec(width=4))


@pytest.mark.parametrize("fw", [f for f in FRAMEWORKS if f != "torch"])
@pytest.mark.parametrize("mode", ["infer", "train"])
def test_every_framework_computes_the_same_logits_from_the_same_draw(logits, fw, mode):
    ref, got = logits("torch")[mode], logits(fw)[mode]
    assert got.shape == ref.shape == (6, 10)
    assert np.isfinite(got).all()
    # float32 convolutions summed in different orders: agreement to ~1e-5 of the logits' scale
    scale = np.abs(ref).max()
    assert np.abs(got - ref).max() <= 1e-4 * scale + 1e-5, (fw, mode, np.abs(got - ref).max(), scale)
    # the batch makes a difference: not six copies of one row
    assert np.ptp(ref, axis=0).max() > 1e-3


@pytest.mark.parametrize("fw", [f for f in FRAMEWORKS if f != "jax"])
def test_every_framework_recalibrates_batchnorm_the_same_way(logits, fw):
    """The book's evaluation rule (d2l.recalibrate_batchnorm on d2lmini.calibration_batches)
    gives the same inference-mode network in every framework.  PyTorch keeps the *unbiased*
    running variance (n / (n - 1) times the batch's), the other three the biased one: with
    the probe's 32-image batches the smallest layers normalise over 32 * 4 * 4 values, so
    PyTorch's logits differ by up to ~(1/512) of their scale; the other three agree to
    float32 rounding."""
    ref, got = logits("jax")["recal"], logits(fw)["recal"]
    scale = np.abs(ref).max()
    tol = 5e-3 * scale if fw == "torch" else 1e-4 * scale + 1e-5
    assert np.abs(got - ref).max() <= tol, (fw, np.abs(got - ref).max(), scale)
    # recalibration changed the network (fresh statistics are not the initial 0 / 1)
    assert np.abs(ref - logits("jax")["infer"]).max() > 1e-2 * scale

"""The figures the chapter overviews open with (Markdown pages run no code) are what d2lmini
and the stored records draw today (tools/overview_figures.py), and the takeaway written under
the communication chapter's is what its numbers say."""
import math

import pytest

from helpers import ROOT
from tools import overview_figures as figures


@pytest.mark.parametrize("path", sorted(figures.FIGURES), ids=lambda p: p.name)
def test_an_overview_figure_is_what_the_code_draws_today(path):
    assert path.is_file(), f"{path.relative_to(ROOT)} missing: run tools/overview_figures.py"
    assert path.read_bytes() == figures.svg(figures.FIGURES[path]), \
        f"{path.relative_to(ROOT)} is out of date: run tools/overview_figures.py"
    page = path.parent / "index.md"
    assert f"]({path.name})" in page.read_text(), f"{page.relative_to(ROOT)} does not show it"


def test_the_drawing_is_deterministic():
    assert figures.svg(figures.comm_scaling) == figures.svg(figures.comm_scaling)


def test_the_communication_takeaway_is_what_the_predictions_say():
    """comm/index.md: strong scaling of 256 images "less than 2x" on 8 GPUs for every
    measured step, weak scaling at 32 per GPU "nearly 8x"; a linear step (T0 = 0) would
    promise several times more."""
    from d2lmini import commcost as cc
    text = (ROOT / "chapters" / "comm" / "index.md").read_text()
    assert "predict less than 2×" in text and "8 GPUs give nearly\n8×" in text
    n = sum(l["grad_bytes"] for l in cc.resnet18_layer_costs())
    nv = cc.LINKS["NVLink 4 (H100 SXM)"]
    for label, s in cc.resnet18_step_times(256).items():
        sp = cc.scaling_speedups(s, n, nv, [1, 8], global_batch=256, weak_batch=32)
        assert sp["strong"][0] == pytest.approx(1) and sp["weak"][0] == pytest.approx(1)
        if s.fit is None:                      # the linear H100 step: T0 = 0
            assert sp["strong"][1] > 6
            continue
        assert 1 < sp["strong"][1] < 2 and 7 < sp["weak"][1] < 8 and not math.isnan(sp["weak"][1])

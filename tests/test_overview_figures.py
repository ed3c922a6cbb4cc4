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


@pytest.mark.parametrize("path", sorted(figures.RESULTS), ids=lambda p: p.parent.name)
def test_an_overview_states_its_chapters_results_from_the_records(path):
    """Each Data Parallelism overview includes the results its chapter's stored runs and
    proofs give today: one device against k, accuracy and time, and the proofs' lines."""
    want = figures.RESULTS[path]()
    assert b"| PyTorch |" in want and b": True`" in want, want.decode()
    assert path.is_file() and path.read_bytes() == want, \
        f"{path.relative_to(ROOT)} is out of date: run python -m tools.overview_figures"
    page = (path.parent / "index.md").read_text()
    assert f"```{{include}} {path.name}\n```" in page, \
        f"{path.parent.name}/index.md does not include {path.name}"


def test_the_gpt_takeaway_is_what_the_formulas_say():
    """gpt/index.md: GPT-2 small at the benchmark's 16 x 1,024 tokens per GPU, one step's
    memory lever after lever (d2lmini.gpt.figures.memory_levers), as the takeaway states it."""
    from d2lmini.config import get_profile
    from d2lmini.gpt import GPT2_SMALL, figures
    batch = get_profile("gpu").gpt.bench_batch
    levers = list(figures.memory_levers(GPT2_SMALL, batch).values())
    gib = lambda b: f"{b / figures.GIB:.1f}"
    first, last = levers[0], levers[-1]
    said = (f"Train GPT-2 small on {batch} sequences of {GPT2_SMALL.context:,} tokens per GPU and "
            f"its\ntraining state, {gib(first['state'])} GiB, is the small part of a step: in "
            f"float32 with eager attention the\nactivations take {gib(first['activations'])} GiB "
            f"and the logits with their gradient {gib(first['logits'])} GiB, "
            f"{gib(first['total'])} GiB in all. Fused\nattention, 16-bit activations, "
            f"recomputation and a loss computed in pieces bring the step to\n"
            f"{gib(last['total'])} GiB. ZeRO shards only the {gib(first['state'])} GiB.")
    text = (ROOT / "chapters" / "gpt" / "index.md").read_text()
    assert said in text, said
    assert all(b["total"] < a["total"] for a, b in zip(levers, levers[1:]))
    assert first["state"] < first["logits"] < first["activations"]

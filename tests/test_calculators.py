"""d2lmini's cost and memory functions used as calculators: they reproduce published figures
(the worked examples in their docstrings run here as doctests), and refuse impossible inputs
with an error that says what to give."""
import doctest
import importlib

import pytest

from d2lmini import commcost as cc
from d2lmini import sharding as sh

#: modules whose docstrings carry worked examples from published sources
WORKED = ("d2lmini.sharding.state",        # the ZeRO paper's Figure 1
          "d2lmini.sharding.activations",  # Korthikanti et al.'s transformer activations
          "d2lmini.commcost.roofline",     # the JAX scaling book's data-parallel threshold
          "d2lmini.gpt.cost")              # GPT-2 small's parameters, logits; ZeRO's Figure 1


@pytest.mark.parametrize("name", WORKED)
def test_the_worked_examples_reproduce_the_published_figures(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 2 and result.failed == 0, result


@pytest.mark.parametrize("stage, number", [(0, 0), (3, 3), ("ZeRO-2", 2), ("zero_1", 1),
                                           ("DDP", 0), ("FSDP", 3), ("replicated", 0)])
def test_a_stage_is_a_number_or_its_name(stage, number):
    assert sh.zero_stage(stage) == number
    assert sh.bytes_per_parameter(4, stage) == sh.bytes_per_parameter(4, number)


@pytest.mark.parametrize("stage", [4, -1, "ZeRO-4", "stage two", 1.0, True, None])
def test_an_unknown_stage_is_refused_naming_the_stages(stage):
    with pytest.raises(ValueError, match="give 0, 1, 2 or 3, or 'ZeRO-1'"):
        sh.bytes_per_parameter(8, stage)


@pytest.mark.parametrize("k", [0, -2, 2.5, True])
def test_a_device_count_must_be_a_positive_integer(k):
    with pytest.raises(ValueError, match="positive integer"):
        sh.bytes_per_parameter(k, 3)
    with pytest.raises(ValueError, match="positive integer"):
        cc.roofline_batch(1e9, 1e8, k, cc.LINKS["NVLink 4 (H100 SXM)"], 1e15)


def test_transformer_activations_follow_korthikanti_and_refuse_nonsense():
    act = sh.transformer_activation_bytes
    s, b, h, a = 1024, 4, 1600, 25                      # GPT-2 XL's shape, batch 4
    sbh = s * b * h
    assert act(s, b, h, a) == sbh * (34 + 5 * a * s / h)
    assert act(s, b, h, a, layers=48) == 48 * act(s, b, h, a)
    assert act(s, b, h, a, recompute="selective") == 34 * sbh < act(s, b, h, a)
    assert act(s, b, h, a, recompute="full") == 2 * sbh
    with pytest.raises(ValueError, match="recompute must be one of"):
        act(s, b, h, a, recompute="some")
    with pytest.raises(ValueError, match="not divisible by 7 heads"):
        act(s, b, h, 7)
    with pytest.raises(ValueError, match="seq must be a positive integer"):
        act(0, b, h, a)


def test_a_ring_across_nodes_gets_the_nodes_cards_not_one():
    nodes = cc.AcrossNodes(cc.H100_CLUSTER, nodes=2)
    assert nodes.gpus == 16 and nodes.bandwidth == 8 * cc.LINKS["InfiniBand NDR"].bandwidth
    gpu = cc.GPUS["H100 SXM"]
    one_card = cc.roofline_batch(1e9, 1e8, 16, cc.LINKS["InfiniBand NDR"], gpu.peak("bf16"))
    assert cc.roofline_batch(1e9, 1e8, 16, nodes, gpu.peak("bf16")) == pytest.approx(one_card / 8)
    assert cc.comm_seconds("all-reduce", 1e8, 8, nodes, latency=True) == \
        cc.cluster_time("all-reduce", 1e8, 2, cc.H100_CLUSTER)
    with pytest.raises(ValueError, match="2 or more nodes"):
        cc.AcrossNodes(cc.H100_CLUSTER, nodes=1)


def test_the_api_page_example_runs_and_every_documented_module_is_a_calculator_module():
    """The code on the API page runs as printed, and the page documents the modules whose
    worked examples run above."""
    import re
    from pathlib import Path
    page = (Path(__file__).resolve().parents[1] / "api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert blocks, "api.md shows no Python example"
    for block in blocks:
        exec(compile(block, "api.md", "exec"), {})
    documented = set(re.findall(r"\.\. automodule:: (\S+)", page))
    assert set(WORKED) <= documented, sorted(set(WORKED) - documented)


def test_a_card_is_one_entry_of_the_catalogue(monkeypatch):
    """The chapters name a card by its key and take the rest from its record: peaks, link,
    server, network card, memory, the folder of its measured runs.  A new card is one entry."""
    h100, h200 = cc.card("H100 SXM"), cc.card("H200 SXM")
    assert h200.gpu.peak("bf16") == h100.gpu.peak("bf16") == 989.4e12     # the same chip
    assert h200.hbm_bytes_per_s > h100.hbm_bytes_per_s and h200.link == h100.link
    assert cc.H100_CLUSTER == cc.cluster_of("H100 SXM")
    assert cc.H200_RUN == cc.runs_of("H200 SXM") and cc.H200_RUN.is_dir()
    with pytest.raises(KeyError, match="one Card entry"):
        cc.card("B200")
    with pytest.raises(FileNotFoundError, match="make gpu-bench"):
        cc.runs_of("A100 SXM")
    new = cc.Card("X1", cc.Gpu("X1", 1e14, "test", 2e14, 4e14), cc.LINKS["PCIe 5.0 x16"],
                  cc.LINKS["InfiniBand HDR"], 1e12, 4e10, node_gpus=4)
    monkeypatch.setitem(cc.CARDS, "X1", new)
    servers = cc.cluster_of("X1")
    assert servers.gpus_per_node == servers.nics_per_node == 4 and servers.intra.name == "PCIe 5.0 x16"
    assert cc.cluster_time("all-reduce", 1e9, 2, servers) > cc.cluster_time("all-reduce", 1e9, 2)
    with pytest.raises(ValueError, match="NET link"):
        cc.Card("X2", new.gpu, new.link, cc.LINKS["PCIe 4.0 x16"], 1e12, 4e10)

"""d2lmini.gpt.cost: the GPT's parameters, activations, logits, training state and MFU in closed
form, held to published figures (the docstrings' worked examples run here as doctests) and to
the model's own definition (the parameter spec, the FLOPs per token, the sharding formulas)."""
import dataclasses
import doctest

import numpy as np
import pytest

from d2lmini import sharding as sh
from d2lmini.gpt import GPT2_SMALL, GPTConfig, cost, flops_per_token, gpt_spec, param_count

SMALL = GPTConfig(vocab=81, context=64, layers=4, width=128, heads=4)
GPT3 = GPTConfig(vocab=50304, context=2048, layers=96, width=12288, heads=96)


def test_the_worked_examples_reproduce_the_published_figures():
    result = doctest.testmod(cost, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 15 and result.failed == 0, result


@pytest.mark.parametrize("cfg", [SMALL, GPT2_SMALL, GPT3])
def test_the_breakdown_sums_the_spec_by_part(cfg):
    parts = {"token embedding": 0, "position embedding": 0, "attention": 0, "MLP": 0,
             "LayerNorm": 0}
    for name, shape in gpt_spec(cfg):
        part = ("token embedding" if name == "wte" else "position embedding" if name == "wpe"
                else "attention" if ".attn." in name else "MLP" if ".mlp." in name
                else "LayerNorm")
        parts[part] += int(np.prod(shape))
    got = cost.param_breakdown(cfg)
    assert {k: v for k, v in got.items() if k != "total"} == parts
    assert got["total"] == param_count(cfg) == sum(parts.values())


def test_gpt2_small_as_published():
    # 124,475,904 with nanoGPT's padded vocabulary and the 1,024 position embeddings
    # (d2lmini/config.py); nanoGPT's printed count leaves the position embedding out.
    assert cost.param_breakdown(GPT2_SMALL)["total"] == 124_475_904
    assert param_count(GPT2_SMALL, position=False) == 124_475_904 - 1024 * 768
    # its float32 logits at batch 16 x 1,024: 3,296,722,944 bytes, 6.14 GiB with the gradient
    assert cost.logits_bytes(GPT2_SMALL, 16, with_grad=False) == 3_296_722_944
    assert round(cost.logits_bytes(GPT2_SMALL, 16) / 2**30, 2) == 6.14
    assert cost.logits_bytes(GPT2_SMALL, 16, itemsize=2) * 2 == cost.logits_bytes(GPT2_SMALL, 16)


@pytest.mark.parametrize("chunks", [1, 2, 3, 7, 16, 1000])
def test_chunked_logits_hold_the_largest_piece(chunks):
    positions = 3 * SMALL.context
    piece = max(len(p) for p in np.array_split(np.arange(positions), chunks))
    assert cost.logits_bytes(SMALL, 3, chunks=chunks) == 2 * piece * SMALL.vocab * 4


def test_korthikanti_example_and_this_models_terms():
    s, h, a = 2048, 12288, 96
    assert [cost.korthikanti_bytes(GPT3, 1, r) / (s * h) for r in sh.TRANSFORMER_RECOMPUTE] \
        == [114.0, 34.0, 2.0]
    assert cost.korthikanti_bytes(GPT3, 3) == sh.transformer_activation_bytes(s, 3, h, a)
    for cfg, b in ((GPT3, 1), (SMALL, 5), (GPT2_SMALL, 16)):
        s, h, a = cfg.context, cfg.width, cfg.heads
        eager = cost.block_activation_elements(cfg, b)
        # 16-bit without dropout: Korthikanti's bytes less the masks (2 sbh + a s^2 b) and the
        # dropped-out probabilities (2 a s^2 b) are twice the eager elements, statistics aside
        no_dropout = cost.korthikanti_bytes(cfg, b) - 2 * s * b * h - 3 * a * s * s * b
        assert no_dropout == 2 * (eager["total"] - 4 * s * b)
        assert sum(v for k, v in eager.items() if k != "total") == eager["total"]


@pytest.mark.parametrize("cfg", [SMALL, GPT2_SMALL])
def test_fused_and_recomputed_blocks_keep_less(cfg):
    b = 2
    eager = cost.block_activation_elements(cfg, b)
    fused = cost.block_activation_elements(cfg, b, attention="fused")
    full = cost.block_activation_elements(cfg, b, recompute=True)
    s, h, a = cfg.context, cfg.width, cfg.heads
    assert eager["total"] - fused["total"] == a * s * s * b - s * b * h - a * s * b
    assert "softmax output" in eager and "softmax output" not in fused
    assert fused["log-sum-exp"] == a * s * b
    assert full == {"block input": s * b * h, "total": s * b * h}
    # linear in the batch; the eager softmax grows with the context's square
    assert cost.block_activation_elements(cfg, 2 * b)["total"] == 2 * eager["total"]
    longer = dataclasses.replace(cfg, context=2 * s)
    assert (cost.block_activation_elements(longer, b)["softmax output"]
            == 4 * eager["softmax output"])


def test_state_bytes_are_the_sharding_formula_of_the_parameter_count():
    n = param_count(GPT2_SMALL)
    for k in (1, 3, 8):
        for stage in sh.STAGES:
            for prec in (sh.FP32_ADAM, sh.MIXED_ADAM):
                assert cost.state_bytes(GPT2_SMALL, k, stage, prec) == sh.state_bytes(n, k, stage, prec)
    assert cost.state_bytes(GPT2_SMALL, 8, "ZeRO-3") == cost.state_bytes(GPT2_SMALL, 8, 3)
    # the ZeRO paper's figure 1: 7.5 B parameters, 64 GPUs, 2 + 2 + 12 bytes
    assert [round(sh.state_bytes(7_500_000_000, 64, s, sh.MIXED_ADAM)[0]["total"] / 1e9, 1)
            for s in range(4)] == [120.0, 31.4, 16.6, 1.9]
    assert cost.grad_bytes(GPT2_SMALL) == 4 * n == cost.state_bytes(GPT2_SMALL, 1, 0)[0]["grads"]


def test_mfu_is_palms_model_flops_over_the_peak():
    # PaLM (Chowdhery et al. 2022), appendix B: 6 N + 12 L H Q T per token; N without the
    # position embedding as nanoGPT's estimate_mfu
    L, H, Q, T = 12, 12, 64, 1024
    n = param_count(GPT2_SMALL, position=False)
    assert flops_per_token(GPT2_SMALL) == 6 * n + 12 * L * H * Q * T
    assert cost.mfu(1e5, GPT2_SMALL, 1e15) == pytest.approx(1e5 * (6 * n + 12 * L * H * Q * T) / 1e15)
    assert cost.mfu(1e5, GPT2_SMALL, 1e15, context=256) < cost.mfu(1e5, GPT2_SMALL, 1e15)


@pytest.mark.parametrize("call", [
    lambda: cost.block_activation_elements(SMALL, 0),
    lambda: cost.block_activation_elements(SMALL, 2, attention="flash"),
    lambda: cost.logits_bytes(SMALL, 2, chunks=0),
    lambda: cost.korthikanti_bytes(SMALL, 2, "some"),
    lambda: cost.state_bytes(SMALL, 2, "ZeRO-4"),
    lambda: cost.mfu(1.0, SMALL, 0.0)])
def test_impossible_inputs_are_refused(call):
    with pytest.raises(ValueError):
        call()

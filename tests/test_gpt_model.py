"""The GPT of d2lmini.gpt: one specification, four implementations, the same numbers.

Each framework runs in its own process (tests/_gpt_probe.py), in float64, on a tiny model
(2 blocks, width 16, 4 heads, context 8, 13 tokens), from the same canonical arrays: its logits
must equal the NumPy reference of d2lmini.gpt.spec, and the losses of three plain-SGD steps
must equal PyTorch's.

Tolerance, float64: ``LOGIT_TOL = 1e-9`` absolute on logits of order 1 (and on losses).  The
frameworks sum in different orders and compute LayerNorm's variance differently.  Seen
(2026-11-29): PyTorch and JAX within 2e-15 of the reference; Paddle and MXNet 7.9e-11 from the
canonical draw (LayerNorm over the embeddings' small spread) and 3.6e-12 from the perturbed one;
losses after the SGD steps within 7.4e-12 of PyTorch's.  Any float32 arithmetic inside shows as
1e-8 or more (JAX's ``dot_product_attention``, whose softmax is float32, was 2.6e-7 off;
MXNet's ``LeakyReLU(act_type="gelu")`` 1e-7): 1e-9 tells the two apart.
"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from d2lmini.frameworks import KEYS

import d2lmini
from d2lmini import gpt

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = list(KEYS)                       # d2lmini.frameworks, the book's order
LOGIT_TOL = 1e-9
CFG = gpt.GPTConfig(vocab=13, context=8, layers=2, width=16, heads=4)
STEPS, LR, BATCH = 3, 0.5, 3


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The canonical draw, a perturbed copy (biases and LayerNorms away from 0 and 1, so that a
    transposed or misplaced one shows), the batches, and the NumPy reference's answers."""
    canonical = gpt.gpt_init(CFG, seed=0)
    rng = np.random.default_rng(7)
    perturbed = {n: a + 0.3 * rng.standard_normal(a.shape) for n, a in canonical.items()}
    x = rng.integers(0, CFG.vocab, (BATCH, CFG.context))
    tokens = rng.integers(0, CFG.vocab, 1000)
    batches = [gpt.sample_windows(tokens, BATCH, CFG.context, seed=3, step=s) for s in range(STEPS)]
    d = tmp_path_factory.mktemp("gpt")
    arrays = {f"canonical/{n}": a for n, a in canonical.items()}
    arrays.update({f"perturbed/{n}": a for n, a in perturbed.items()})
    np.savez(d / "in.npz", cfg=np.array([CFG.vocab, CFG.context, CFG.layers, CFG.width, CFG.heads]),
             names=np.array(list(canonical)), x=x, x_short=x[:, :5],
             xs=np.stack([b[0] for b in batches]), ys=np.stack([b[1] for b in batches]),
             lr=LR, **arrays)
    ref = {"canonical": gpt.reference_logits(canonical, CFG, x),
           "perturbed": gpt.reference_logits(perturbed, CFG, x),
           "short": gpt.reference_logits(perturbed, CFG, x[:, :5])}
    return d, ref


@pytest.fixture(scope="module")
def run(inputs):
    """``run(fw)``: that framework's probe results, computed once."""
    d, _ = inputs
    env = dict(os.environ, JAX_PLATFORMS="cpu", D2LMINI_NUM_DEVICES="1")
    cache = {}

    def get(fw):
        if fw not in cache:
            r = subprocess.run([sys.executable, str(ROOT / "tests" / "_gpt_probe.py"), fw,
                                str(d / "in.npz"), str(d / f"{fw}.npz")], capture_output=True,
                               text=True, env=env, timeout=300, cwd=str(ROOT))
            assert r.returncode == 0, f"{fw}: {r.stderr[-3000:]}"
            cache[fw] = dict(np.load(d / f"{fw}.npz"))
        return cache[fw]
    return get


def test_the_spec_counts_what_the_draw_holds():
    arrays = gpt.gpt_init(CFG, seed=0)
    assert list(arrays) == [n for n, _ in gpt.gpt_spec(CFG)]
    assert sum(a.size for a in arrays.values()) == gpt.param_count(CFG)
    assert gpt.param_count(CFG) - gpt.param_count(CFG, position=False) == arrays["wpe"].size
    assert all(a.dtype == np.float64 for a in arrays.values())
    again, other = gpt.gpt_init(CFG, seed=0), gpt.gpt_init(CFG, seed=1)
    assert all(np.array_equal(arrays[n], again[n]) for n in arrays)
    assert not np.array_equal(arrays["wte"], other["wte"])
    # the residual projections are drawn smaller, by 1 / sqrt(2 layers)
    ratio = arrays["h.0.mlp.proj.weight"].std() / arrays["h.0.mlp.fc.weight"].std()
    assert abs(ratio - 1 / np.sqrt(2 * CFG.layers)) < 0.1


def test_flops_per_token_is_six_n_plus_attention():
    n = gpt.param_count(CFG, position=False)
    attention = 12 * CFG.layers * CFG.context * CFG.width
    assert gpt.flops_per_token(CFG) == 6 * n + attention
    assert gpt.flops_per_token(CFG, training=False) * 3 == gpt.flops_per_token(CFG)
    assert (gpt.flops_per_token(CFG, context=2 * CFG.context) - gpt.flops_per_token(CFG)
            == attention)


def test_the_profiles_sizes():
    """The sizes the chapter promises: ~0.1 M, ~0.8 M, ~10.6 M (nanoGPT's count, without the
    position embedding and biases) and GPT-2 small's 124 M."""
    count = {name: gpt.param_count(gpt.profile_config(p)) for name, p in d2lmini.PROFILES.items()}
    assert 0.08e6 < count["smoke"] < 0.15e6 and 0.7e6 < count["cpu"] < 0.9e6
    assert 10.5e6 < count["gpu"] < 11e6
    bench = gpt.profile_config(d2lmini.PROFILES["gpu"], bench=True)
    assert bench == gpt.GPT2_SMALL and 124e6 < gpt.param_count(bench) < 125e6
    assert all(gpt.profile_config(p).vocab == len(gpt.CORPUS_CHARS)
               for p in d2lmini.PROFILES.values())
    assert d2lmini.PROFILES["cpu"].gpt.batch_size == 12


@pytest.mark.parametrize("bad, match", [
    (dict(heads=3), "heads=3 does not divide width=16"),
    (dict(layers=0), "layers must be a positive integer"),
])
def test_bad_shapes_are_refused(bad, match):
    fields = dict(vocab=13, context=8, layers=2, width=16, heads=4) | bad
    with pytest.raises(ValueError, match=match):
        gpt.GPTConfig(**fields)


def test_too_long_a_sequence_is_refused():
    with pytest.raises(ValueError, match="sequences of 9 tokens, but the model's context is 8"):
        gpt.reference_logits(gpt.gpt_init(CFG), CFG, np.zeros((1, 9), np.int64))


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_every_framework_computes_the_reference_logits(inputs, run, fw):
    _, ref = inputs
    got = run(fw)
    for key in ("canonical", "perturbed", "short"):
        assert got[key].shape == ref[key].shape and got[key].dtype == np.float64
        assert np.abs(got[key] - ref[key]).max() <= LOGIT_TOL, (fw, key)
    if fw == "paddle":
        assert np.abs(got["perturbed_fused"] - ref["perturbed"]).max() <= LOGIT_TOL
    # the tests' inputs tell models apart: not all positions alike, the perturbation matters
    assert np.ptp(ref["perturbed"], axis=1).max() > 0.1
    assert np.abs(ref["perturbed"] - ref["canonical"]).max() > 0.1
    # causal: the first 5 positions do not depend on the tokens after them
    assert np.abs(ref["short"] - ref["perturbed"][:, :5]).max() <= LOGIT_TOL


@pytest.mark.parametrize("fw", [f for f in FRAMEWORKS if f != "torch"])
def test_every_framework_takes_the_same_sgd_steps(run, fw):
    ref, got = run("torch"), run(fw)
    assert got["losses"].shape == (STEPS,)
    assert np.abs(got["losses"] - ref["losses"]).max() <= LOGIT_TOL, (fw, got["losses"])
    assert np.abs(got["after"] - ref["after"]).max() <= LOGIT_TOL
    # the steps did something: the weights after them give other logits
    assert np.abs(ref["after"] - ref["canonical"]).max() > 1e-3


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_every_framework_refuses_bad_input_clearly(run, fw):
    errors = [str(e) for e in run(fw)["errors"]]
    assert len(errors) == 2, errors
    assert "sequences of 9 tokens, but the model's context is 8" in errors[0]
    assert "wte should be an array of shape (13, 16)" in errors[1]

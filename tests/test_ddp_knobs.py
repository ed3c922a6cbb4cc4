"""DDP's knobs, as chapters/concise/ddp_checks.py measures them for the concise chapter's page
"DDP's Knobs, Measured" (ddp-knobs.ipynb): one 2-process torchrun job on the CPU (gloo), a
ResNet-18 of width 16 (its 2,807,720 bytes of gradients are more than DDP's 1 MiB first
bucket), four SGD steps per setting.

What must hold whatever the machine's speed:

1. ``bucket_cap_mb``: the buckets partition the gradient; one bucket in the first step, then
   rebuilt; the default caps the first bucket at 1 MiB and an explicit 25 does not; a smaller
   cap gives more buckets, none past its cap by more than one parameter, one all-reduce each;
2. ``gradient_as_bucket_view``: every ``.grad`` lies inside a bucket the communication hook
   was handed with it, none without it;
3. a parameter without a gradient: without a flag the next step raises and the first has left
   the replicas apart; ``find_unused_parameters`` adds an all-reduce of one int per parameter
   and never rebuilds the buckets; ``static_graph`` does neither; both train;
4. ``bf16_compress_hook``: bfloat16 on the wire, half the bytes of float32, and gradients
   within bfloat16's rounding of the float32 all-reduce's.
"""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import d2lmini  # noqa: E402
from d2lmini import launch  # noqa: E402
from d2lmini import torch as d2l  # noqa: E402

pytestmark = pytest.mark.launches   # launches DDP ranks

SCRIPT = Path(__file__).resolve().parents[1] / "chapters" / "concise" / "ddp_checks.py"
WIDTH, BATCH, STEPS, RANKS = 16, 8, 4, 2
MiB = 2 ** 20


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("knobs")
    data = d2lmini.load_fashion_mnist(2 * BATCH, 16)
    init = d2l.canonical_init(d2l.resnet18(num_classes=10, width=WIDTH),
                              d2lmini.resnet18_init(width=WIDTH, seed=0)).state_dict()
    X = torch.from_numpy(data.X_train[:2 * BATCH]).reshape(2, BATCH, 1, 28, 28)
    y = torch.from_numpy(data.y_train[:2 * BATCH]).reshape(2, BATCH)
    torch.save(dict(check="knobs", state_dict=init, X=X, y=y, width=WIDTH, steps=STEPS, lr=0.05),
               out / "knobs.pt")
    cmd = [launch.python(), "-m", "torch.distributed.run", "--nproc_per_node", str(RANKS),
           "--master_port", str(launch.free_port()), "--max-restarts", "0", str(SCRIPT),
           "--proof", str(out / "knobs.pt"), "--out", str(out)]
    # gloo on the CPU even on a GPU host: the sizes below are the CPU's (and the hook check)
    launch.run(cmd, timeout=300, env={"CUDA_VISIBLE_DEVICES": ""}, cwd=str(SCRIPT.parent))
    return launch.read_rank_results(out, RANKS)


def all_reduces(res, dtypes=("float", "c10::BFloat16")):
    return [c for c in res["collectives"] if c["op"] == "all_reduce" and c["dtype"] in dtypes]


def test_bucket_cap_mb_sets_the_buckets(ranks):
    r0 = ranks[0]
    n = r0["param_bytes"]
    assert n == 2_807_720                              # width 16: 701,930 float32 parameters
    largest = 8 * WIDTH * 8 * WIDTH * 3 * 3 * 4        # a 3x3 convolution of the last stage
    count = {}
    for cap in (None, 25, 1, 0.25):
        res = r0[f"bucket_cap_mb={cap}"]
        assert sum(res["bucket_bytes"]) == n and res["first_step_buckets"] == 1 and res["rebuilt"]
        # one all-reduce per bucket in the profiled (last) step, of exactly that bucket
        assert sorted(4 * c["numel"] for c in all_reduces(res)) == sorted(res["bucket_bytes"])
        # a bucket closes once it reaches its cap: past it by one parameter at most (the
        # default's first bucket is capped at 1 MiB, the others at 25 MiB)
        caps = [MiB, 25 * MiB] if cap is None else [cap * MiB]
        assert all(b <= caps[min(i, len(caps) - 1)] + largest
                   for i, b in enumerate(res["bucket_bytes"]))
        count[cap] = len(res["bucket_bytes"])
    assert count[25] == 1 < count[None] == 2 < count[1] < count[0.25]


def test_gradient_as_bucket_view_puts_grad_in_the_bucket(ranks):
    for r in ranks:
        copy, view = r["gradient_as_bucket_view=False"], r["gradient_as_bucket_view=True"]
        for res in (copy, view):
            assert res["hook_bucket_bytes"] == res["bucket_bytes"]   # the hook saw DDP's buckets
            assert res["grad_bytes"] == r["param_bytes"]
        assert view["grad_bytes_in_buckets"] == view["grad_bytes"]
        assert copy["grad_bytes_in_buckets"] == 0
    assert ranks[0]["gradient_as_bucket_view=True"]["param_sha256"] == \
        ranks[0]["gradient_as_bucket_view=False"]["param_sha256"]    # the same updates


def test_a_parameter_without_gradient_needs_a_flag(ranks):
    no_flag = [r["unused head, no flag"] for r in ranks]
    assert all(res["error"].startswith("RuntimeError: Expected to have finished reduction "
                                       "in the prior iteration") for res in no_flag)
    assert len({res["param_sha256"] for res in no_flag}) == RANKS    # step 1: never all-reduced
    head_bytes = (8 * WIDTH * 10 + 10) * 4
    n_params = len(list(d2l.resnet18(width=WIDTH).parameters())) + 2
    for flag in ("find_unused_parameters", "static_graph"):
        runs = [r[f"unused head, {flag}=True"] for r in ranks]
        assert len({res["param_sha256"] for res in runs}) == 1       # identical replicas
        for res in runs:
            assert res["unused_grad_is_none"] and res["unused_parameter_bytes"] == head_bytes
            # the unused head's zeros are all-reduced with the rest
            assert 4 * sum(c["numel"] for c in all_reduces(res)) == ranks[0]["param_bytes"] + head_bytes
    fu, sg = ranks[0]["unused head, find_unused_parameters=True"], \
        ranks[0]["unused head, static_graph=True"]
    assert [c["numel"] for c in fu["collectives"] if c["dtype"] == "int"] == [n_params]
    assert not fu["rebuilt"] and fu["first_step_buckets"] == len(fu["bucket_bytes"]) == 2
    assert not [c for c in sg["collectives"] if c["dtype"] == "int"] and sg["rebuilt"]


def test_bf16_compress_hook_halves_the_bytes_within_bfloat16_rounding(ranks):
    for r in ranks:
        f32, bf16 = all_reduces(r["comm float32"]), all_reduces(r["comm bf16"])
        assert {c["dtype"] for c in f32} == {"float"} and {c["dtype"] for c in bf16} == {"c10::BFloat16"}
        assert 2 * sum(c["bytes"] for c in bf16) == sum(c["bytes"] for c in f32) == r["param_bytes"]
        bound = (RANKS + 1) / (1 - (RANKS + 1) * 2 ** -8)   # units of 2^-8 * mean_r |g_r|
        assert 0 < r["bf16"]["max_diff_in_u_mean_abs"] <= bound
        assert r["bf16"]["zero_where_all_zero"] and r["bf16"]["relative_l2"] < 2 ** -6
    err = ranks[0]["bf16_register_error"]
    if torch.version.cuda is None and torch.version.hip is None:   # a CPU build refuses it
        assert err.startswith("TypeError") and "NCCL" in err

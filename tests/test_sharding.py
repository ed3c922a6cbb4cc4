"""d2lmini.sharding: the ZeRO schedules, byte accounting and the memory check."""
import math

import numpy as np
import pytest

import d2lmini
from d2lmini import sharding as sh
from d2lmini.collectives import chunk_slices, ring_schedule, traffic

N = sum(math.prod(s) for s in d2lmini.LENET_SHAPES)


def run(schedule, bufs, k):
    chunks = chunk_slices(bufs[0].size, k)
    for step in schedule:
        msgs = [(t, bufs[t.src][chunks[t.chunk]].copy()) for t in step]
        for t, m in msgs:
            if t.op == "add":
                bufs[t.dst][chunks[t.chunk]] += m
            else:
                bufs[t.dst][chunks[t.chunk]] = m
    return bufs


@pytest.mark.parametrize("k", range(1, 9))
def test_reduce_scatter_leaves_owner_with_the_sum(k):
    rng = np.random.default_rng(k)
    n = 3 * k + 2
    data = [rng.integers(-9, 9, n).astype(np.int64) for _ in range(k)]
    total = sum(data)
    out = run(sh.reduce_scatter_schedule(k), [d.copy() for d in data], k)
    for i, c in enumerate(chunk_slices(n, k)):
        assert np.array_equal(out[i][c], total[c])


@pytest.mark.parametrize("k", range(1, 9))
def test_all_gather_from_owners(k):
    n = 2 * k + 1
    full = np.arange(n)
    bufs = [np.full(n, -1) for _ in range(k)]
    for i, c in enumerate(chunk_slices(n, k)):
        bufs[i][c] = full[c]
    for b in run(sh.all_gather_schedule(k), bufs, k):
        assert np.array_equal(b, full)


@pytest.mark.parametrize("k", range(1, 9))
def test_reduce_scatter_plus_all_gather_moves_one_all_reduce(k):
    rs = traffic(sh.reduce_scatter_schedule(k), N, k)["sent"]
    ag = traffic(sh.all_gather_schedule(k), N, k)["sent"]
    ar = traffic(ring_schedule(k), N, k)["sent"]
    assert sum(rs) + sum(ag) == sum(ar)
    assert all(abs(a + b - c) <= 2 * 4 for a, b, c in zip(rs, ag, ar))  # chunks differ by 1 element
    t0, t1, t2 = (sh.step_traffic(N, k, s)["total"] for s in (0, 1, 2))
    assert sum(t1) == sum(t2) == sum(t0)
    t3 = sh.step_traffic(N, k, 3)
    assert sum(t3["total"]) == sum(rs) + 2 * sum(ag)
    assert sum(sh.step_traffic(N, k, 3, regather=False)["total"]) == sum(t0)


def test_state_bytes_and_the_paper_formula():
    for k in range(1, 9):
        for stage in sh.STAGES:
            rows = sh.state_bytes(N, k, stage)
            per_param = sh.bytes_per_parameter(k, stage)
            assert sum(r["total"] for r in rows) == pytest.approx(per_param * N * k)
            assert max(r["total"] for r in rows) - min(r["total"] for r in rows) <= 16
    assert sh.bytes_per_parameter(1, 0, sh.MIXED_ADAM) == 16
    assert sh.bytes_per_parameter(8, 1, sh.MIXED_ADAM) == 2 + 2 + 12 / 8
    assert sh.bytes_per_parameter(8, 2, sh.MIXED_ADAM) == 2 + 14 / 8
    assert sh.bytes_per_parameter(8, 3, sh.MIXED_ADAM) == 16 / 8
    with pytest.raises(ValueError):
        sh.state_bytes(N, 2, 4)
    with pytest.raises(ValueError):
        sh.state_bytes(3, 4, 1)


def test_memory_ok_accepts_exact_chunks_and_catches_replicas():
    exact = lambda j, st: [{p: r[p] for p in sh.PARTS} for r in sh.state_bytes(N, j, st)]
    rows = sh.memory_rows(exact, N, range(1, 9))
    assert sh.memory_ok(rows)
    assert "ZeRO-3" in sh.memory_table(rows)
    # a "ZeRO-1" that still keeps the whole optimizer state on every device
    wrong = lambda j, st: [{p: r[p] for p in sh.PARTS} for r in sh.state_bytes(N, j, 0)]
    assert not sh.memory_ok(sh.memory_rows(wrong, N, [2], stages=(1,)))
    # padding beyond the slack is caught, within it accepted
    padded = lambda j, st: [dict(m, optimizer=m["optimizer"] + 8 * 20) for m in exact(j, st)]
    assert not sh.memory_ok(sh.memory_rows(padded, N, [3], stages=(1,)))
    assert sh.memory_ok(sh.memory_rows(padded, N, [3], stages=(1,)), slack_elements=21)
    with pytest.raises(ValueError):
        sh.memory_rows(lambda j, st: exact(1, st), N, [2])


def test_max_abs_diff_and_peak_rss():
    a = [np.zeros((2, 3)), np.ones(4)]
    b = [np.zeros((2, 3)), np.ones(4) + 0.5]
    assert sh.max_abs_diff(a, b) == 0.5
    with pytest.raises(ValueError):
        sh.max_abs_diff(a, b[:1])
    with pytest.raises(ValueError):
        sh.max_abs_diff([np.zeros(2)], [np.zeros(3)])
    assert sh.peak_rss_bytes() > 10 << 20


def test_lenet_init_is_the_scratch_draw():
    arrays = d2lmini.lenet_init(0)
    assert [a.shape for a in arrays] == d2lmini.LENET_SHAPES
    assert all(a.dtype == np.float32 for a in arrays)
    assert sum(a.size for a in arrays) == N == 129068
    rng = np.random.default_rng(0)
    assert np.array_equal(arrays[0], rng.normal(0, 0.01, (20, 1, 3, 3)).astype(np.float32))
    assert not arrays[1].any()


def test_row_shard_elements_bounds_dim0_sharding():
    import torch
    shapes = d2lmini.LENET_SHAPES
    for k in range(1, 9):
        held = [sum(c.numel() for t in (torch.zeros(s) for s in shapes)
                    for c in torch.chunk(t, k)[r:r + 1]) for r in range(k)]
        assert max(held) == sh.row_shard_elements(shapes, k)
        assert sum(held) == N
    assert sh.row_shard_elements(shapes, 1) == N


# --- the peak of a step ----------------------------------------------------------------------

SIZES = sh.layer_sizes()
N_MLP = sum(SIZES)


def test_mlp_init_and_layer_sizes():
    arrays = sh.mlp_init()
    widths = sh.MLP_WIDTHS
    assert [a.shape for a in arrays[::2]] == list(zip(widths[:-1], widths[1:]))
    assert [a.shape for a in arrays[1::2]] == [(d,) for d in widths[1:]]
    assert all(a.dtype == np.float32 for a in arrays) and not any(b.any() for b in arrays[1::2])
    assert [a.size + b.size for a, b in zip(arrays[::2], arrays[1::2])] == SIZES
    assert N_MLP == 598282
    assert np.array_equal(sh.mlp_init(seed=1)[0], sh.mlp_init(seed=1)[0])
    assert abs(arrays[0].std() - math.sqrt(2 / 784)) < 1e-3


@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_peak_without_activations_is_the_closed_form(k):
    """rows = 0: no activations; the peak is the state plus what the scheme gathers/allocates."""
    for i in range(k):
        c = sh.shard_sizes(N_MLP, k)[i]
        peak = lambda scheme: sh.peak_bytes(k, scheme, 0)[i]
        assert peak("replicated") == 16 * N_MLP
        assert peak("ZeRO-1") == 8 * N_MLP + 8 * c
        assert peak("ZeRO-2") == 4 * N_MLP + 12 * c + 4 * N_MLP      # + a whole gradient buffer
        assert peak("ZeRO-3") == 16 * c + 4 * N_MLP + 4 * N_MLP      # + whole params and grads
        state = 16 * sum(sh.shard_sizes(s, k)[i] for s in SIZES)
        # backward at layer l: layer l gathered, layer l-1 prefetched, layer l's gradient buffer
        worst = max(4 * (SIZES[l] + (SIZES[l - 1] if l else 0)) + 4 * SIZES[l]
                    for l in range(len(SIZES)))
        assert peak("ZeRO-3 by layer") == state + worst
        no_prefetch = sh.peak_bytes(k, "ZeRO-3 by layer", 0, prefetch=False)[i]
        assert no_prefetch == state + 8 * max(SIZES)
        # bucketed ZeRO-2, a bucket per layer: whole parameters, its shards of each layer's
        # gradient and optimizer state, and one bucket (the largest layer's gradient)
        shards = 12 * sum(sh.shard_sizes(s, k)[i] for s in SIZES)
        assert peak("ZeRO-2 by layer") == 4 * N_MLP + shards + 4 * max(SIZES)


def test_bucketed_zero2_peak_is_the_closed_form_with_one_bucket():
    """b_p n + (b_g + b_o) n/k + b_g max_l n_l (+ activations): the bucket term is there, and
    it is one layer's gradient, not the whole gradient of ZeRO-2 by whole model."""
    widths = (6, 5, 4, 3)                          # layers of 35, 24 and 15 parameters
    sizes = sh.layer_sizes(widths)
    assert sizes == [35, 24, 15]
    n = sum(sizes)
    for k in (1, 2, 3, 5):
        for i in range(k):
            shards = sum(sh.shard_sizes(s, k)[i] for s in sizes)
            closed = 4 * n + 12 * shards + 4 * max(sizes)
            assert sh.peak_bytes(k, "ZeRO-2 by layer", 0, widths)[i] == closed
            assert sh.peak_bytes(k, "ZeRO-2 by layer", 0, widths)[i] != closed - 4 * max(sizes)
    for prec in (sh.FP32_ADAM, sh.MIXED_ADAM):      # b_p n + (b_g + b_o) n/k + b_g max_l n_l
        got = sh.peak_bytes(1, "ZeRO-2 by layer", 0, widths, precision=prec)[0]
        assert got == (prec.params + prec.grads + prec.optimizer) * n + prec.grads * max(sizes)
    # with activations: the peak is the first layer's backward, its gradient and input alive
    moment, parts = sh.peak_parts(8, "ZeRO-2 by layer", 32)
    assert moment == "backward: layer 1"
    assert parts == {"state": 4 * N_MLP + 12 * sum(sh.shard_sizes(s, 8)[0] for s in SIZES),
                     "grads": 4 * SIZES[0], "activations": 32 * sh.MLP_WIDTHS[0] * 4}
    # nothing is gathered: the parameters are whole in the state
    assert not any("gather" in m or p.get("params") for m, p in sh.peak_timeline(4, "ZeRO-2 by layer", 8))


def test_bucketed_zero2_against_the_other_schemes():
    for k in range(1, 9):
        peak = {s: max(sh.peak_bytes(k, s, 32)) for s in sh.SCHEMES}
        # by whole model the bucket is the whole gradient: 4 n instead of 4 max_l n_l
        assert peak["ZeRO-2 by layer"] < peak["ZeRO-2"]
        if k > 1:
            assert peak["ZeRO-2 by layer"] < min(peak["replicated"], peak["ZeRO-1"])
    # below a replica's parameters and gradients once 12 n/k and one bucket are under 4 n
    assert max(sh.peak_bytes(8, "ZeRO-2 by layer", 32)) < 8 * N_MLP
    assert max(sh.peak_bytes(4, "ZeRO-2 by layer", 32)) > 8 * N_MLP
    # without activations, the difference from ZeRO-2 by whole model is the buckets' (k = 1)
    assert sh.peak_bytes(1, "ZeRO-2", 0)[0] - sh.peak_bytes(1, "ZeRO-2 by layer", 0)[0] \
        == 4 * N_MLP - 4 * max(SIZES)


def test_scheme_stage():
    assert [sh.scheme_stage(s) for s in sh.SCHEMES] == [
        (0, False), (1, False), (2, False), (3, False), (2, True), (3, True)]
    assert sh.SCHEMES[:4] == tuple(sh.STAGE_NAMES.values())   # the whole-model schemes first
    with pytest.raises(ValueError):
        sh.scheme_stage("ZeRO-1 by layer")


def test_peak_adds_the_activations_of_the_worst_moment():
    rows = 32
    acts = rows * (sum(sh.MLP_WIDTHS) + max(sh.MLP_WIDTHS)) * 4   # all at once, and a gradient
    for k in (1, 2, 8):
        for scheme in sh.SCHEMES:
            with_acts, without = sh.peak_bytes(k, scheme, rows), sh.peak_bytes(k, scheme, 0)
            assert all(0 < a - b <= acts for a, b in zip(with_acts, without)), scheme
    # replicated: the peak is at the start of the backward pass, every layer's input alive
    moment, parts = sh.peak_parts(1, "replicated", rows)
    assert parts["activations"] == rows * 4 * (sum(sh.MLP_WIDTHS[:-1]) + sh.MLP_WIDTHS[-2])
    assert moment.startswith("backward")


def test_peak_by_layer_is_below_every_whole_model_scheme():
    for k in range(2, 9):
        peak = {s: max(sh.peak_bytes(k, s, 32)) for s in sh.SCHEMES}
        assert peak["ZeRO-3 by layer"] < min(peak[s] for s in sh.SCHEMES[:4])
        # sharding by whole model never holds less than a replica's parameters and gradients
        assert all(peak[s] > 8 * N_MLP for s in sh.SCHEMES[:4])
        assert peak["replicated"] == max(sh.peak_bytes(1, "replicated", 32))
    assert max(sh.peak_bytes(8, "ZeRO-3 by layer", 32)) < 8 * N_MLP
    # at k = 1 "by layer" only adds the gathered copies and the layer's gradient buffer
    assert sh.peak_bytes(1, "ZeRO-3 by layer", 32)[0] > sh.peak_bytes(1, "replicated", 32)[0]


def test_peak_uneven_rows_and_errors():
    even, uneven = sh.peak_bytes(3, "ZeRO-3 by layer", 10), sh.peak_bytes(3, "ZeRO-3 by layer", [11, 10, 9])
    assert uneven[0] > even[0] and uneven[2] < even[2]
    with pytest.raises(ValueError):
        sh.peak_bytes(2, "ZeRO-4", 8)
    with pytest.raises(ValueError):
        sh.peak_bytes(2, "replicated", [8])
    with pytest.raises(ValueError):
        sh.peak_timeline(2, "replicated", 8, device=2)
    with pytest.raises(ValueError):
        sh.peak_bytes(20, "replicated", 8, widths=(2, 1))


def test_peak_rows_and_check():
    exact = lambda j, s: sh.peak_bytes(j, s, 16)
    rows = sh.peak_rows(exact, range(1, 4), 16)
    assert len(rows) == 3 * len(sh.SCHEMES) and sh.peak_ok(rows)
    assert "ZeRO-3 by layer" in sh.peak_table(rows)
    leaky = lambda j, s: [b + 4 * SIZES[1] for b in exact(j, s)]   # a layer gradient kept too long
    assert not sh.peak_ok(sh.peak_rows(leaky, [2], 16))
    assert sh.peak_ok(sh.peak_rows(leaky, [2], 16), tolerance=4 * SIZES[1])
    with pytest.raises(ValueError):
        sh.peak_rows(lambda j, s: exact(1, s), [2], 16)


def test_table_counts_are_powers_of_two_and_k():
    assert sh.table_counts(1) == [1]
    assert sh.table_counts(2) == [1, 2]
    assert sh.table_counts(3) == [1, 2, 3]
    assert sh.table_counts(6) == [1, 2, 4, 6]
    assert sh.table_counts(8) == [1, 2, 4, 8]
    with pytest.raises(ValueError):
        sh.table_counts(0)


# ------------------------------------------------------------ activations and recomputation
SMALL = (4, 3, 3, 3, 2)          # 4 layers; with rows=1 and itemsize=1 an array's bytes = its width


def test_activation_peak_by_hand():
    # no recomputation: x0..x3 and the last layer's input gradient, 4+3+3+3 + 3
    assert sh.activation_peak(1, 0, SMALL, itemsize=1) == 16
    # segments of 2: x0 and x2 kept; the last segment's x3 recomputed: 4+3+3 + 3 (dz)
    assert sh.activation_peak(1, 2, SMALL, itemsize=1) == 13
    moments = [m for m, _ in sh.activation_timeline(1, 2, SMALL, itemsize=1)]
    assert moments.count("backward: recompute layer 3") == 1
    assert moments.count("backward: recompute layer 1") == 1


def test_no_recomputation_is_the_replicated_steps_activations():
    for rows in (1, 32, 256):
        _, parts = sh.peak_parts(1, "replicated", rows)
        assert sh.activation_peak(rows, 0) == parts["activations"]


def test_one_segment_or_one_layer_segments_save_nothing_and_the_middle_does():
    L = len(sh.MLP_WIDTHS) - 1
    none = sh.activation_peak(256, 0)
    assert sh.activation_peak(256, 1) == none == sh.activation_peak(256, L)
    assert sh.activation_peak(256, 3) < sh.activation_peak(256, 2) < none
    deep = (784,) + (256,) * 63 + (10,)
    assert sh.activation_peak(256, 8, deep) < 0.3 * sh.activation_peak(256, 0, deep)


def test_recompute_flops():
    f = sh.recompute_flops(1, 2, SMALL)
    assert f["step"] == 192 and f["extra"] == 24 + 18
    assert sh.recompute_flops(7, 0)["extra"] == sh.recompute_flops(7, 1)["extra"] == 0
    L = len(sh.MLP_WIDTHS) - 1
    full = sh.recompute_flops(3, L)            # one segment: every input but x0 recomputed
    fwd = [2 * 3 * a * b for a, b in zip(sh.MLP_WIDTHS[:-1], sh.MLP_WIDTHS[1:])]
    assert full["extra"] == sum(fwd[:-1])


def test_activation_rows_compare_measured_with_the_formula():
    rows = sh.activation_rows(lambda s: sh.activation_peak(64, s) + (1 if s == 2 else 0),
                              segments=(0, 2), rows=64)
    assert [r["measured"] - r["formula"] for r in rows] == [0, 1]
    assert rows[1]["kept"] == 4 and "none" in sh.activation_table(rows)
    with pytest.raises(ValueError):
        sh.activation_timeline(8, -1)


# ------------------------------------------------------------ the stages in time
def test_step_collectives_and_their_bytes():
    sizes = sh.layer_sizes()
    assert sh.step_collectives(sizes, 0) == [("all-reduce", 4 * sum(sizes))]
    assert [op for op, _ in sh.step_collectives(sizes, "ZeRO-2")] == ["reduce-scatter", "all-gather"]
    by_layer = sh.step_collectives(sizes, "ZeRO-3 by layer")
    assert len(by_layer) == 3 * len(sizes) and sum(b for _, b in by_layer) == 3 * 4 * sum(sizes)
    bucketed = sh.step_collectives(sizes, "ZeRO-2 by layer", itemsize=2)
    assert [op for op, _ in bucketed] == ["reduce-scatter"] * len(sizes) + ["all-gather"] * len(sizes)
    assert [b for _, b in bucketed[:len(sizes)]] == [2 * s for s in reversed(sizes)]
    assert sum(b for _, b in bucketed) == 2 * 2 * sum(sizes)
    with pytest.raises(ValueError):
        sh.step_collectives(sizes, "ZeRO-4")


def test_stage_times_by_layer_cost_more_than_one_and_a_half_all_reduces():
    from d2lmini import commcost as cc
    link = cc.LINKS["NVLink 4 (H100 SXM)"]
    sizes = sh.layer_sizes()
    assert sh.step_comm_time(sizes, 1, "ZeRO-3 by layer", link) == 0
    rows = sh.stage_time_rows({"mlp": sizes, "big": [30_000_000] * 48}, 8, [link])
    by = {(r["model"], r["scheme"]): r for r in rows}
    for m in ("mlp", "big"):
        assert by[m, "ZeRO-3 by layer"]["sent"] == pytest.approx(1.5 * by[m, "replicated"]["sent"])
        # 3 collectives per layer, each paying NCCL's latency: above the bytes' 1.5x
        assert by[m, "ZeRO-3 by layer"]["vs_replicated"] > 1.5
    assert by["mlp", "ZeRO-3 by layer"]["vs_replicated"] > by["big", "ZeRO-3 by layer"]["vs_replicated"]
    # bucketed ZeRO-2 sends the all-reduce's bytes, in two collectives per layer
    for m in ("mlp", "big"):
        assert by[m, "ZeRO-2 by layer"]["sent"] == pytest.approx(by[m, "replicated"]["sent"])
        assert 1 < by[m, "ZeRO-2 by layer"]["vs_replicated"] < by[m, "ZeRO-3 by layer"]["vs_replicated"]
    table = sh.stage_time_table(rows)
    assert "| big |" in table and table.count("\n") == 2 + 1 and "ZeRO-3 by layer |" in table
    assert "ZeRO-2 by layer |" in table


def test_gpt2_units_and_models_with_their_own_itemsize():
    from d2lmini import commcost as cc
    units = sh.gpt2_units()
    assert sum(units) == 1_557_611_200 and len(units) == 49     # GPT-2 XL: 1.56 B parameters
    assert units[0] == (50257 + 1024) * 1600 + 2 * 1600         # embeddings, final LayerNorm
    assert sum(sh.gpt2_units(12, 768)) == 124_439_808           # GPT-2 small
    link = cc.LINKS["NVLink 4 (H100 SXM)"]
    half = sh.stage_time_rows({"gpt": (units, 2)}, 8, [link])
    full = sh.stage_time_rows({"gpt": units}, 8, [link], itemsize=4)
    for h, f in zip(half, full):
        assert h["sent"] == pytest.approx(f["sent"] / 2) and h["seconds"] < f["seconds"]
    # the notebooks' row: by layer in bfloat16, below twice the all-reduce on both links
    rows = sh.stage_time_rows({"gpt": (units, 2)}, 8, [link, cc.LINKS["InfiniBand NDR"]])
    assert all(1.5 < r["vs_replicated"] < 2 for r in rows if r["scheme"] == "ZeRO-3 by layer")


# --- FSDP's knobs ---------------------------------------------------------------------------------
TINY = (3, 2, 1)          # two layers: 3*2+2 = 8 and 2*1+1 = 3 parameters


def test_peak_with_the_knobs_by_hand():
    # ZeRO-3 by layer on one device, one example: state 16 bytes x 11 parameters = 176; the
    # examples 12, layer 1's output 8, the loss gradient 4; gathered layers 32 and 12 bytes.
    # Prefetching one layer, the worst moment is layer 2's input gradient in the backward pass:
    # 176 + x0 12 + x1 8 + both layers gathered 44 + layer 2's gradient 12 + dz 8 = 260.
    peak = lambda **kw: sh.peak_bytes(1, "ZeRO-3 by layer", 1, TINY, **kw)[0]
    assert peak() == peak(prefetch=True) == peak(prefetch=1) == 260
    assert peak(prefetch=0) == peak(prefetch=False) == 252     # layer 1's gradient, one layer
    assert peak(prefetch=2) == 260                             # two layers: nothing more to fetch
    assert peak(gather_itemsize=2) == 260 - 22                 # the gathered layers in 2 bytes
    assert peak(sync=False) == 260 + 44                        # a whole float32 gradient kept
    assert sh.peak_parts(1, "ZeRO-3 by layer", 1, TINY, sync=False)[1]["grads"] == 44 + 12
    with pytest.raises(ValueError):
        peak(prefetch=-1)


def test_sync_off_keeps_a_whole_gradient_only_where_gradients_are_sharded():
    for scheme in ("replicated", "ZeRO-1", "ZeRO-2 by layer", "ZeRO-3 by layer"):
        on, off = (sh.peak_bytes(2, scheme, 4, sync=s)[0] for s in (True, False))
        n = sum(sh.layer_sizes())
        assert off - on == (4 * n if sh.scheme_stage(scheme)[0] >= 2 else 0), scheme
    # whole model: the backward pass's whole gradient buffer IS the kept one
    on, off = (sh.peak_bytes(2, "ZeRO-2", 4, sync=s)[0] for s in (True, False))
    assert off == on


def test_prefetch_bytes_by_hand():
    sizes = [5, 3, 2]
    assert sh.prefetch_bytes(sizes, 0) == [0, 0, 0]
    assert sh.prefetch_bytes(sizes, 1) == [12, 8, 0]
    assert sh.prefetch_bytes(sizes, 2) == [20, 8, 0]
    assert sh.prefetch_bytes(sizes, 1, backward=True) == [0, 20, 12]
    assert sh.prefetch_bytes(sizes, 2, itemsize=2, backward=True) == [0, 10, 16]
    with pytest.raises(ValueError):
        sh.prefetch_bytes(sizes, -1)


@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_one_more_layer_ahead_adds_that_layer_at_every_moment(k):
    sizes = sh.layer_sizes()
    one, two = (sh.layer_moments(k, "ZeRO-3 by layer", 32, prefetch=d) for d in (1, 2))
    for backward, key in ((False, "forward"), (True, "backward")):
        extra = [b - a for a, b in zip(sh.prefetch_bytes(sizes, 1, backward=backward),
                                       sh.prefetch_bytes(sizes, 2, backward=backward))]
        assert [b - a for a, b in zip(one[key], two[key])] == extra
    assert one["forward"][1] - sh.layer_moments(k, "ZeRO-3 by layer", 32, prefetch=0)["forward"][1] \
        == 4 * sizes[2]


def test_fsdp_collective_bytes_by_hand():
    unit = [[(3, 2), (3,)]]                  # ceil(3/2) = 2 rows: 2*2 + 2 = 6 elements per rank
    assert sh.fsdp_collective_bytes(unit, 2) == {"all-gather": 48, "reduce-scatter": 48}
    assert sh.fsdp_collective_bytes(unit, 2, 2, 4) == {"all-gather": 24, "reduce-scatter": 48}
    assert sh.fsdp_collective_bytes(unit, 2, 2) == {"all-gather": 24, "reduce-scatter": 24}
    assert sh.fsdp_collective_bytes(unit, 2, regather=False)["all-gather"] == 24
    assert sh.fsdp_collective_bytes(unit, 1) == {"all-gather": 0, "reduce-scatter": 0}
    # the MLP on 2 ranks, float32: each gathers its half twice and hands over the whole gradient
    n = sum(sh.layer_sizes())
    assert sh.fsdp_collective_bytes(sh.mlp_units(), 2) == {"all-gather": 4 * n, "reduce-scatter": 4 * n}


def test_gathered_units_carry_their_padding():
    unit = [(3, 2), (3,)]                    # 9 elements; ceil(3/2) = 2 rows: 2 padded shards of 6
    assert sh.gathered_elements([unit], 2) == [12]
    assert sh.gathered_elements([unit], 3) == [9] and sh.gathered_elements([unit], 1) == [9]
    assert sh.gathered_elements(sh.mlp_units(), 2) == sh.layer_sizes()      # 256 and 10 rows: even
    assert sh.gathered_elements(sh.mlp_units(), 3)[0] == 3 * (86 * 784 + 86)


def test_kept_gradients_and_deferred_init_by_hand():
    unit = [[(3, 2), (3,)]]
    assert sh.kept_grad_bytes(unit, 2) == 24 and sh.kept_grad_bytes(unit, 2, sync=False) == 36
    assert sh.kept_grad_bytes(unit, 1) == sh.kept_grad_bytes(unit, 1, sync=False) == 36
    # units of 8 and 3 parameters, shards of 4 and 2: whole model and the first shard (11 + 4)
    assert sh.init_peak_bytes([8, 3], [4, 2]) == 4 * 15
    assert sh.init_peak_bytes([8, 3], [4, 2], deferred=True) == 4 * 6
    assert sh.init_peak_bytes([8, 3], [8, 3]) == 4 * 19     # one rank: the copy of unit 1
    with pytest.raises(ValueError):
        sh.init_peak_bytes([8, 3], [4])
    assert sh.mlp_units()[0] == [(256, 784), (256,)]
    assert sum(math.prod(s) for u in sh.mlp_units() for s in u) == sum(sh.layer_sizes())


@pytest.mark.parametrize("k", [1, 2, 8])
def test_knob_formula_rows_and_table(k):
    rows = {r["knob"]: r for r in sh.knob_formula_rows(k, 32)}
    base = rows["param_dtype=bfloat16"]["default"]
    assert all(r["default"] == base for r in rows.values() if r["knob"] != "meta-device init")
    assert rows["param_dtype=bfloat16"]["knob_on"] < base
    assert rows["no prefetch"]["knob_on"] <= base <= rows["prefetch 2 layers"]["knob_on"]
    n = sum(sh.layer_sizes())
    assert rows["no gradient sync"]["knob_on"] - base == 4 * n
    init = rows["meta-device init"]
    assert init["knob_on"] == 4 * sum(max(sh.shard_sizes(s, k)) for s in sh.layer_sizes())
    assert init["default"] == 4 * (n + max(sh.shard_sizes(sh.layer_sizes()[0], k)))
    table = sh.knob_table(list(rows.values()))
    assert table.count("\n") == len(rows) + 1 and "formula" not in table.splitlines()[0]
    measured = [dict(rows["no prefetch"], formula_default=1024, formula_on=2048)]
    assert "1.0 → 2.0" in sh.knob_table(measured)


def test_plot_layer_bytes():
    import matplotlib
    matplotlib.use("Agg")
    moments = sh.layer_moments(2, "ZeRO-3 by layer", 32)
    ax = sh.plot_layer_bytes({"formula": moments})
    assert len(ax.lines[0].get_xdata()) == 2 * len(sh.layer_sizes())


def test_fsdp_init_peak_pads_a_short_shard_by_hand():
    unit = [[(3, 2), (3,)]]          # ceil(3/2) = 2 rows; rank 1 owns 1 row of each tensor
    assert sh.fsdp_init_peak_bytes(unit, 2, 0, deferred=True) == 4 * 6      # full rows: no copy
    # rank 1: its own rows (2 + 1 elements), then W's padded 4 beside them: 7; then b's
    assert sh.fsdp_init_peak_bytes(unit, 2, 1, deferred=True) == 4 * 7
    assert sh.fsdp_init_peak_bytes(unit, 2, 1) == sh.init_peak_bytes([9], [6]) == 4 * 15
    assert sh.fsdp_init_peak_bytes(sh.mlp_units(), 1, 0, deferred=True) == 4 * sum(sh.layer_sizes())
    # 8 ranks: 256 rows divide evenly and ranks 5-7 own none of the last layer's 10 rows
    assert all(sh.fsdp_init_peak_bytes(sh.mlp_units(), 8, r, deferred=True)
               == 4 * sum(sh.row_shard_elements(u, 8) for u in sh.mlp_units()) for r in range(8))
    with pytest.raises(ValueError):
        sh.fsdp_init_peak_bytes(unit, 2, 2)

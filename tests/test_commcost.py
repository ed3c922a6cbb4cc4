"""The alpha-beta model of all-reduce and its fit (d2lmini.commcost)."""
import json
from pathlib import Path
import math

import numpy as np
import pytest

from d2lmini import steptime

from d2lmini import commcost as cc


def test_coefficients_count_steps_and_bytes_of_each_scheme():
    assert cc.coefficients("ring", 4) == (6.0, 1.5)
    assert cc.coefficients("naive", 4) == (6.0, 6.0)
    assert cc.coefficients("tree", 8) == (6.0, 6.0)
    assert cc.coefficients("tree", 5) == (6.0, 6.0)      # ceil(log2 5) = 3
    assert cc.coefficients("rabenseifner", 8) == (6.0, 1.75)  # the ring's bytes, 2 log2 k steps
    with pytest.raises(ValueError, match="power of two"):
        cc.coefficients("rabenseifner", 6)
    for s in cc.SCHEMES:
        assert cc.coefficients(s, 1) == (0.0, 0.0)        # one device: nothing to send
    with pytest.raises(ValueError, match="unknown scheme"):
        cc.coefficients("star", 4)
    with pytest.raises(ValueError, match="at least one device"):
        cc.coefficients("ring", 0)


def test_ring_and_binomial_tree_take_equal_steps_up_to_three_devices():
    """For k = 2 and 3 the ring has no more steps than the binomial tree (4 and 4 at k = 3),
    and fewer bytes: it is never slower.  From k = 4 on it has more steps."""
    for k in (2, 3):
        (ar, br), (at, bt) = cc.coefficients("ring", k), cc.coefficients("tree", k)
        assert ar == at and br < bt
        assert cc.crossover("ring", "tree", k, 1e-5, 1e-9) is None
    assert cc.coefficients("ring", 3)[0] == cc.coefficients("tree", 3)[0] == 4
    for k in (4, 5, 8, 16):
        assert cc.coefficients("ring", k)[0] > cc.coefficients("tree", k)[0]


def test_rabenseifner_moves_the_rings_bytes_in_fewer_steps():
    """The byte term 2(k-1)/k n is the lower bound: recursive halving-doubling reaches it too,
    in 2 log2 k steps, so in this model it is never slower than the ring (for k = 2^d)."""
    for k in (2, 4, 8, 16, 64):
        (ar, br), (ah, bh) = cc.coefficients("ring", k), cc.coefficients("rabenseifner", k)
        assert bh == br and ah == 2 * math.log2(k) and ah <= ar
        assert cc.crossover("ring", "rabenseifner", k, 1e-5, 1e-9) is None     # same slope
        assert cc.model_time("rabenseifner", 1e6, k, 1e-5, 1e-9) <= cc.model_time("ring", 1e6, k, 1e-5, 1e-9)
    for s in cc.SCHEMES:                     # every scheme sends 2(k-1) n bytes in total
        assert cc.moved_bytes(s, 8, 100) == 1400


def test_the_ring_moves_what_the_schedule_says():
    """b(k) of the ring equals the byte count of d2lmini.ring_schedule on the busiest link."""
    import d2lmini
    for k in range(2, 9):
        n = 4 * 840                                         # bytes; 840 floats, divisible by k
        sent = d2lmini.traffic(d2lmini.ring_schedule(k), n // 4, k)["sent"]
        a, b = cc.coefficients("ring", k)
        assert a == len(d2lmini.ring_schedule(k))
        assert max(sent) == min(sent) == pytest.approx(b * n)
        naive = d2lmini.traffic(d2lmini.naive_schedule(k), n // 4, k)
        assert naive["sent"][0] + naive["received"][0] == pytest.approx(cc.coefficients("naive", k)[1] * n)


def test_fit_recovers_alpha_and_beta_from_noisy_times():
    rng = np.random.default_rng(0)
    alpha, beta = 20e-6, 1 / 5e9
    samples = []
    for k in (2, 4, 8):
        for n in cc.message_sizes(8, 64 << 20):
            t = cc.model_time("ring", n, k, alpha, beta) * (1 + 0.03 * rng.standard_normal())
            samples.append((k, n, float(t)))
    f = cc.fit(samples, "ring")
    assert f.alpha == pytest.approx(alpha, rel=0.05)
    assert f.beta == pytest.approx(beta, rel=0.05)
    assert f.median_rel_error < 0.05 and f.points == len(samples)
    assert float(f.predict(1 << 20, 4)) == pytest.approx(
        float(cc.model_time("ring", 1 << 20, 4, alpha, beta)), rel=0.05)


def test_fit_rejects_what_it_cannot_fit():
    with pytest.raises(ValueError, match="at least two"):
        cc.fit([(1, 8, 1e-6), (2, 8, 1e-6)])
    with pytest.raises(ValueError, match="> 0"):
        cc.fit([(2, 8, 0.0), (2, 16, 1e-6)])


def test_fit_of_pure_latency_clips_beta_at_zero():
    samples = [(k, n, 1e-4 * 2 * (k - 1)) for k in (2, 4) for n in (8, 1 << 20, 1 << 24)]
    f = cc.fit(samples, "ring")
    assert f.beta >= 0 and f.alpha == pytest.approx(1e-4, rel=1e-6)


def test_crossover_where_ring_starts_to_beat_tree():
    alpha, beta, k = 10e-6, 1e-10, 8
    n = cc.crossover("ring", "tree", k, alpha, beta)
    assert n is not None and n > 0
    t_ring, t_tree = (float(cc.model_time(s, n, k, alpha, beta)) for s in ("ring", "tree"))
    assert t_ring == pytest.approx(t_tree)
    assert cc.model_time("ring", 10 * n, k, alpha, beta) < cc.model_time("tree", 10 * n, k, alpha, beta)
    assert cc.crossover("ring", "naive", k, alpha, beta) is None   # same steps, fewer bytes


def test_bus_bandwidth_is_nccl_tests_relation():
    assert cc.bus_bandwidth(cc.algorithm_bandwidth(1e9, 0.5), 8) == pytest.approx(2e9 * 14 / 8)
    assert cc.bus_bandwidth(1.0, 1) == 0.0


def test_sizes_summaries_and_timing():
    s = cc.message_sizes(8, 1 << 20, per_decade=3)
    assert s[0] == 8 and s[-1] == 1 << 20 and all(x % 8 == 0 for x in s) and s == sorted(set(s))
    summary = cc.summarize([3.0, 1.0, 2.0, 10.0])
    assert summary["median"] == 2.5 and summary["min"] == 1.0 and summary["max"] == 10.0
    assert summary["p25"] <= summary["median"] <= summary["p75"]
    calls = []
    times = cc.time_call(lambda: calls.append(1), warmup=2, repeats=5)
    assert len(times) == 5 and len(calls) == 7 and all(t >= 0 for t in times)


def test_device_counts_sweep_2_4_8_up_to_k_and_k_itself():
    assert cc.device_counts(1) == []
    assert cc.device_counts(2) == [2]
    assert cc.device_counts(3) == [2, 3]
    assert cc.device_counts(5) == [2, 4, 5]
    assert cc.device_counts(8) == [2, 4, 8]
    assert cc.device_counts(12) == [2, 4, 8, 12]
    with pytest.raises(ValueError):
        cc.device_counts(0)


def test_sweep_times_every_count_and_size_and_fits_the_model():
    made, calls = [], []
    def make_call(k, n):
        made.append((k, n))
        return lambda: calls.append((k, n))
    rows = cc.sweep(make_call, [2, 4], [8, 64, 512], warmup=1, repeats=3,
                    combine=lambda ts: [t + 1.0 for t in ts])
    assert made == [(k, n) for k in (2, 4) for n in (8, 64, 512)]
    assert len(calls) == 6 * 4
    assert [(r["k"], r["bytes"]) for r in rows] == made
    assert all(r["repeats"] == 3 and r["median"] >= 1.0 for r in rows)   # combine applied
    # a sweep of exact model times is fitted exactly
    alpha, beta = 3e-5, 2e-9
    exact = [{"k": k, "bytes": n, "median": float(cc.model_time("naive", n, k, alpha, beta))}
             for k in (2, 4, 8) for n in cc.message_sizes(8, 1 << 24)]
    f = cc.fit_rows(exact, "naive")
    assert f.alpha == pytest.approx(alpha, rel=1e-6) and f.beta == pytest.approx(beta, rel=1e-6)
    assert f.max_rel_error < 1e-6


def test_regime_size_is_where_latency_equals_bandwidth_term():
    alpha, beta = 1e-5, 1e-9
    for s in cc.SCHEMES:
        n = cc.regime_size(s, 8, alpha, beta)
        a, b = cc.coefficients(s, 8)
        assert a * alpha == pytest.approx(b * n * beta)
    assert cc.regime_size("ring", 1, alpha, beta) is None


def test_links_carry_sources_and_pcie_is_computed_from_its_transfer_rate():
    for name, link in cc.LINKS.items():
        assert link.name == name and link.source and "tuning.cc" in link.latency_source
        assert cc.NCCL_VERSION_READ in link.latency_source
        assert link.bandwidth > 1e9 and link.beta == pytest.approx(1 / link.bandwidth)
    with pytest.raises(ValueError, match="hw must be"):
        cc.Link("x", 1e9, "made up", "USB")
    assert cc.LINKS["PCIe 5.0 x16"].bandwidth == pytest.approx(2 * cc.LINKS["PCIe 4.0 x16"].bandwidth)
    assert 31e9 < cc.LINKS["PCIe 4.0 x16"].bandwidth < 32e9
    assert cc.LINKS["NVLink 4 (H100 SXM)"].bandwidth > cc.LINKS["PCIe 5.0 x16"].bandwidth


def test_model_sizes_and_flops():
    import d2lmini
    assert cc.gradient_bytes(cc.LENET_SHAPES) == 4 * (180 + 20 + 25000 + 50 + 102400 + 128 + 1280 + 10)
    spec = [(n, s) for n, s in d2lmini.resnet18_spec(width=64)
            if not n.endswith(("running_mean", "running_var"))]
    assert 11e6 < cc.gradient_bytes(s for _, s in spec) / 4 < 11.3e6    # ResNet-18: ~11.2 M
    assert cc.lenet_flops() == pytest.approx(2 * (180 * 676 + 25000 * 81 + 102400 + 1280))
    # the width enters squared in every convolution but the stem
    assert 3.9 < cc.resnet18_flops(64) / cc.resnet18_flops(32) < 4.0
    gpu = cc.GPUS["H100 SXM"]
    assert cc.compute_time(1e9, 10, gpu, 0.5) == pytest.approx(3e10 / (gpu.fp32_flops * 0.5))


def test_nccl_latency_is_the_tuning_tables_base_plus_one_hop_per_step():
    """NCCL 2.28.9 src/graph/tuning.cc, ncclTunerConstantsDefaults: ring all-reduce on one node
    = baseLatencies[Ring][p] + 2(k-1) * hwLatencies[NVLINK][Ring][p] (us)."""
    nv, pcie, ib = (cc.LINKS[n] for n in ("NVLink 4 (H100 SXM)", "PCIe 5.0 x16", "InfiniBand NDR"))
    us = lambda t: t * 1e6
    assert us(cc.nccl_latency("all-reduce", 8, nv, "LL")) == pytest.approx(6.6 + 14 * 0.6)
    assert us(cc.nccl_latency("all-reduce", 8, nv, "LL128")) == pytest.approx(14.0 + 14 * 1.9)
    assert us(cc.nccl_latency("all-reduce", 8, nv, "Simple")) == pytest.approx(8.4 + 14 * 3.4)
    assert us(cc.nccl_latency("all-reduce", 8, pcie, "Simple")) == pytest.approx(8.4 + 14 * 5.7)
    # across nodes, one GPU each: the network row's Tree column ("latencies fully exposed")
    assert us(cc.nccl_latency("all-reduce", 4, ib, "Simple")) == pytest.approx(8.4 + 6 * 14.0)
    assert us(cc.nccl_latency("all-reduce", 4, ib, "LL")) == pytest.approx(6.6 + 6 * 5.0)
    # reduce-scatter and all-gather: k - 1 steps
    assert us(cc.nccl_latency("reduce-scatter", 8, nv, "LL")) == pytest.approx(6.6 + 7 * 0.6)
    assert cc.nccl_latency("all-reduce", 1, nv, "LL") == 0.0
    assert cc.NCCL_BASE_LATENCY_US["ring"] == (6.6, 14.0, 8.4)
    assert cc.NCCL_HW_LATENCY_US["NVLINK"]["ring"] == (0.6, 1.9, 3.4)


def test_collective_time_picks_the_fastest_protocol_by_size():
    nv = cc.LINKS["NVLink 4 (H100 SXM)"]
    small, big = 4096, 1 << 30
    assert cc.nccl_protocol("all-reduce", small, 8, nv) == "LL"            # latency-bound
    assert cc.nccl_protocol("all-reduce", big, 8, nv) == "Simple"          # bandwidth-bound
    for n in (small, 1 << 20, big):
        t = cc.collective_time("all-reduce", n, 8, nv)
        assert t == min(cc.collective_time("all-reduce", n, 8, nv, p) for p in cc.PROTOCOLS)
    # small messages: NCCL's base + hops, far below the old 5 us x 14 steps = 70 us
    assert cc.collective_time("all-reduce", small, 8, nv) < 20e-6
    # large messages: the ring's bytes over the link, latency negligible
    assert cc.collective_time("all-reduce", big, 8, nv) == pytest.approx(1.75 * big / nv.bandwidth, rel=0.02)
    # LL carries 4 data bytes in 8 and is capped by llMaxBws (Hopper, one node: 141 GB/s)
    assert nv.protocol_bandwidth("LL", 8) == 141e9 and nv.protocol_bandwidth("Simple", 8) == nv.bandwidth
    assert nv.protocol_bandwidth("LL128", 8) == pytest.approx(0.92 * nv.bandwidth)
    # PCIe-only nodes get no LL128 (tuning.cc enables it up to PATH_NVB)
    pcie = cc.LINKS["PCIe 4.0 x16"]
    assert pcie.protocols == ("LL", "Simple")
    assert all(cc.nccl_protocol("all-reduce", n, 8, pcie) != "LL128" for n in (64, 1 << 20, 1 << 28))
    with pytest.raises(ValueError, match="does not enable LL128"):
        cc.collective_time("all-reduce", 1 << 20, 8, pcie, "LL128")
    arr = cc.collective_time("all-gather", np.array([small, big]), 4, nv)
    assert arr.shape == (2,) and arr[0] < arr[1]
    assert cc.collective_time("all-reduce", big, 1, nv) == 0.0


def test_reduce_scatter_and_all_gather_make_an_all_reduce():
    """(k-1) alpha + (k-1)/k n beta each; together the all-reduce's 2(k-1) steps and bytes."""
    for k in (2, 3, 8):
        rs, ag, ar = (cc.collective_coefficients(op, k)
                      for op in ("reduce-scatter", "all-gather", "all-reduce"))
        assert cc.collective_coefficients("reduce-scatter", k) == (k - 1, (k - 1) / k)
        assert cc.collective_coefficients("all-gather", k) == (k - 1, (k - 1) / k)
        assert ar == (rs[0] + ag[0], rs[1] + ag[1])
        alpha, beta, n = 1e-5, 1e-9, 1e8
        assert cc.collective_model_time("reduce-scatter", n, k, alpha, beta) == pytest.approx(
            (k - 1) * alpha + (k - 1) / k * n * beta)
        assert cc.collective_model_time("all-reduce", n, k, alpha, beta) == pytest.approx(
            2 * cc.collective_model_time("all-gather", n, k, alpha, beta))
    nv = cc.LINKS["NVLink 4 (H100 SXM)"]
    n = 1 << 28
    both = sum(cc.collective_time(op, n, 8, nv, "Simple") for op in ("reduce-scatter", "all-gather"))
    base = cc.NCCL_BASE_LATENCY_US["ring"][2] * 1e-6
    assert both == pytest.approx(cc.collective_time("all-reduce", n, 8, nv, "Simple") + base)
    with pytest.raises(ValueError, match="unknown collective"):
        cc.collective_time("all-to-all", n, 8, nv)


def test_predicted_step_overlap_and_best_speedup():
    link = cc.Link("test", 1e9, "made up", "PCI")
    ar = lambda n, k: cc.collective_time("all-reduce", n, k, link)
    p1 = cc.predict_step(1.0, 1e6, 1, link, overlap=False)
    assert p1["comm_s"] == 0 and p1["speedup"] == pytest.approx(1.0)
    no = cc.predict_step(0.1, 1e8, 4, link, overlap=False)
    yes = cc.predict_step(0.1, 1e8, 4, link, overlap=True, bucket_bytes=1e7)
    assert no["comm_s"] == pytest.approx(ar(1e8, 4)) and no["buckets"] == 1
    assert no["step_s"] == pytest.approx(0.025 + no["comm_s"])
    assert yes["step_s"] < no["step_s"] and yes["speedup"] > no["speedup"] and yes["buckets"] == 10
    # the last bucket's all-reduce starts when backward ends: it is always exposed
    assert yes["exposed_s"] >= ar(1e7, 4) - 1e-15
    # communication much shorter than backward: only the (one) last bucket shows
    tiny = cc.predict_step(10.0, 8, 4, link, overlap=True)
    assert tiny["step_s"] == pytest.approx(2.5 + ar(8, 4))
    # one bucket as large as the gradient: overlap hides nothing
    one = cc.predict_step(0.1, 1e8, 4, link, overlap=True, bucket_bytes=1e9)
    assert one["step_s"] == pytest.approx(no["step_s"]) and one["buckets"] == 1
    assert cc.bucket_sizes(60, 25) == [25, 25, 10] and cc.bucket_sizes(50, 25) == [25, 25]
    assert cc.bucket_sizes(10, 25) == [10] and cc.bucket_sizes(0, 25) == []
    k, s = cc.best_speedup(1.0, 1e8, link, overlap=False, max_k=64)
    assert 2 <= k <= 64 and s == max(cc.predict_step(1.0, 1e8, j, link, overlap=False)["speedup"]
                                    for j in range(1, 65))
    assert 1 < s < 1.0 / (1e8 / 1e9)                 # never above compute / (n * beta)
    assert cc.best_speedup(0.01, 1e8, link, overlap=False, max_k=64) == (1, 1.0)


def test_critical_batch_is_where_compute_meets_the_all_reduce():
    nv = cc.LINKS["NVLink 4 (H100 SXM)"]
    per_image, n = 1e-4, 4e7
    b = cc.critical_batch(per_image, n, 8, nv)
    assert b * per_image == pytest.approx(cc.collective_time("all-reduce", n, 8, nv))
    # at that per-GPU batch, k GPUs spend as long communicating as computing (no overlap)
    p = cc.predict_step(8 * b * per_image, n, 8, nv, overlap=False)
    assert p["comm_s"] == pytest.approx(p["compute_s"]) and p["speedup"] == pytest.approx(4.0)
    assert cc.critical_batch(per_image, n, 1, nv) == 0.0
    with pytest.raises(ValueError):
        cc.critical_batch(0.0, n, 8, nv)
    # a slower link needs larger batches per GPU
    assert cc.critical_batch(per_image, n, 8, cc.LINKS["InfiniBand HDR"]) > b


def test_hidden_fraction():
    assert cc.hidden_fraction(1.0, 2.0, 1.0) == 1.0
    assert cc.hidden_fraction(1.5, 2.0, 1.0) == pytest.approx(0.5)
    assert cc.hidden_fraction(2.5, 2.0, 1.0) == 0.0
    assert cc.hidden_fraction(1.0, 1.0, 1.2) == 0.0


def test_overlap_is_reported_only_beyond_the_measured_spread():
    compute = [1.00, 1.02, 0.98, 1.01, 0.99]
    after = [2.00, 2.02, 1.98, 2.01, 1.99]
    half = [1.50, 1.52, 1.48, 1.51, 1.49]
    assert cc.clearly_greater(after, compute) and not cc.clearly_greater(compute, compute)
    share, text = cc.overlap_verdict(half, after, compute)
    assert share == pytest.approx(0.5) and "50%" in text
    assert cc.overlap_verdict([1.01, 1.0, 0.99, 1.02, 0.98], after, compute)[0] == 1.0
    assert cc.overlap_verdict(after, after, compute) == (0.0, "hides nothing measurable (within noise of after backward)")
    # noisy repeats: the medians differ, the spreads overlap -> no effect claimed
    noisy_c = [0.8, 1.4, 1.0, 1.9, 0.9]
    noisy_a = [1.1, 1.7, 0.9, 1.3, 2.0]
    share, text = cc.overlap_verdict([0.9, 1.2, 1.6, 1.0, 1.1], noisy_a, noisy_c)
    assert share is None and "within noise" in text
    # a control that cannot overlap: a saving there is a code path, not hidden communication
    share, text = cc.overlap_verdict(half, after, compute, can_overlap=False)
    assert share is None and "cannot overlap" in text
    # faster than compute alone beyond the spread: flagged, never "hides 100 %"
    share, text = cc.overlap_verdict([0.5, 0.51, 0.49, 0.5, 0.5], after, compute)
    assert share is None and "faster than compute alone" in text
    assert "slower than all-reduce after backward" in cc.overlap_verdict([3.0] * 5, after, compute)[1]
    lines = cc.overlap_report({"compute": compute, "after": after, "buckets": half},
                              "compute", "after", {"buckets": True})
    assert len(lines) == 3 and "hides about 50%" in lines[2] and "[" in lines[0]


def test_page_faults_count_the_first_touch_of_fresh_memory():
    t, faults = cc.time_and_faults(lambda: np.ones(1 << 24, dtype=np.uint8), warmup=1, repeats=3)
    assert t > 0 and faults is not None and faults >= 0
    reused = np.empty(1 << 24, dtype=np.uint8)
    t2, faults2 = cc.time_and_faults(lambda: reused.fill(1), warmup=1, repeats=3)
    assert faults2 <= faults                  # writing memory already touched: no new faults


def test_time_interleaved_takes_one_call_of_each_per_round_in_turns():
    order = []
    times = cc.time_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                                warmup=1, repeats=3, before=lambda: order.append("|"))
    assert order == ["a", "b"] + ["|", "a", "|", "b", "|", "b", "|", "a", "|", "a", "|", "b"]
    assert list(times) == ["a", "b"] and all(len(t) == 3 for t in times.values())


def test_fit_per_k_and_the_precision_of_what_is_printed():
    alpha, beta = 2e-5, 1e-9
    rows = [{"k": k, "bytes": n, "median": float(cc.model_time("ring", n, k, alpha * k, beta))}
            for k in (2, 4) for n in cc.message_sizes(8, 1 << 24)]
    per = cc.fit_per_k(rows, "ring")
    assert list(per) == [2, 4]
    assert per[4].alpha == pytest.approx(4 * alpha) and per[2].alpha == pytest.approx(2 * alpha)
    assert cc.fit_rows(rows, "ring").median_rel_error > per[4].median_rel_error
    assert cc.sig(737.4) == "740" and cc.sig(0.4812) == "0.48" and cc.sig(99.96) == "100"
    assert cc.sig(12345) == "12,000" and cc.sig(5.55, 1) == "6"
    assert cc.fmt_bytes(715_800) == "700 KiB" and cc.fmt_bytes(1_431_600) == "1.4 MiB"
    assert cc.fmt_bytes(2**25) == "32 MiB" and cc.fmt_bytes(3 * 2**30) == "3.0 GiB"
    assert cc.fmt_bytes(32) == "32 B" and cc.fmt_seconds(7.4e-4) == "740 us"
    assert cc.fmt_seconds(0.0131) == "13 ms" and cc.fmt_seconds(2.5) == "2.5 s"
    assert cc.fmt_seconds(0.0009996) == "1.0 ms" and cc.fmt_bytes(999_700) == "980 KiB"   # no "1,000 us"
    assert cc.fmt_bytes(1_048_000) == "1.0 MiB" and cc.fmt_bytes(0) == "0 B"       # no "1,000 KiB"


def test_busbw_only_for_bandwidth_optimal_schemes_and_per_byte_moved():
    assert cc.bandwidths(1e9, 0.5, 8, "ring")["busbw"] == pytest.approx(2e9 * 14 / 8)
    assert cc.bandwidths(1e9, 0.5, 8, "naive") == {"algbw": 2e9, "busbw": None}
    # one memory system: time follows the total 2(k-1) n, whatever the scheme
    ring = cc.Fit("ring", 0.0, 8e-9, 0, 0, 2)            # beta per byte on the busiest link
    naive = cc.Fit("naive", 0.0, 1e-9, 0, 0, 2)
    assert cc.per_byte_moved(ring, 8) == pytest.approx(cc.per_byte_moved(naive, 8))


def test_record_writes_fits_with_hardware_and_skips_smoke(tmp_path):
    f = cc.Fit("ring", 1e-5, 1e-9, 0.1, 0.3, 12)
    path = tmp_path / "results.json"
    assert cc.record(path, framework="torch", api="x", devices=2, profile="smoke",
                     fits={"ring": f}, rows={"ring": []}) is None
    assert not path.exists()
    cc.record(path, framework="torch", api="x", devices=2, profile="cpu", fits={"ring": f},
              rows={"ring": [{"k": 2}]})
    cc.record(path, framework="torch", api="x", devices=2, profile="cpu", fits={"ring": f},
              rows={"ring": [{"k": 2}]})
    import json
    recs = json.loads(path.read_text())
    assert len(recs) == 1 and recs[0]["chapter"] == "comm"
    assert recs[0]["fits"]["ring"]["alpha"] == 1e-5 and "hardware" in recs[0] and "versions" in recs[0]
    assert "alpha" in cc.report("ring", f) and "median 10%" in cc.report("ring", f)
    per = {"ring": {2: f, 4: f}}
    cc.record(path, framework="torch", api="x", devices=4, profile="cpu", fits={"ring": f},
              rows={"ring": [{"k": 2}]}, per_k=per)
    rec = [r for r in json.loads(path.read_text()) if r["devices"] == 4][0]
    assert rec["fits_per_k"]["ring"]["4"]["alpha"] == 1e-5


def test_time_call_runs_before_untimed_each_repeat():
    order = []
    cc.time_call(lambda: order.append("call"), warmup=1, repeats=2,
                 before=lambda: order.append("before"))
    assert order == ["call", "before", "call", "before", "call"]


# ------------------------------------------------------------------------------------------
# One GPU's measured step (the H100 run's benchmark records) and the predictions made from it
# ------------------------------------------------------------------------------------------

def _raw(path):
    import json
    return json.loads(path.read_text())


def test_the_h100_records_load_and_give_the_measured_median_at_their_batch():
    steps = {label: cc.load_step(path) for label, path in cc.H100_RESNET18.items()}
    assert list(steps) == ["measured, TF32 on (default)", "measured, TF32 off (exact)"]
    for label, m in steps.items():
        raw = _raw(cc.H100_RESNET18[label])
        (r,) = raw["results"]
        assert m.model == "ResNet-18, width 64" == cc.H100_MODEL and m.framework == "torch"
        assert m.gpu == raw["hardware"]["gpus"][0] == "NVIDIA H100 80GB HBM3"
        assert m.batch == r["batch_size"] == 256 and raw["settings"]["width"] == 64
        assert m.compute_time(256) == r["step_s_median"] == m.step_s
        assert m.date.startswith("2026-11-25") and m.version == raw["versions"]["torch"]
        assert "h100-2026-11-25/" in m.source and "measured" in m.source
    # TF32 (the default) roughly halves the step: 19.8 ms against 39.0 ms in the records
    on, off = (s.step_s for s in steps.values())
    assert 0.4 < on / off < 0.6


def test_measured_step_scales_linearly_with_the_batch():
    m = cc.load_step(cc.H100_RESNET18["measured, TF32 on (default)"])
    assert m.compute_time(128) == pytest.approx(m.step_s / 2)
    assert m.compute_time(32) == pytest.approx(m.step_s / 8)
    assert m.compute_time(512) == pytest.approx(2 * m.step_s)
    with pytest.raises(ValueError, match="at least 1 image"):
        m.compute_time(0)


def test_load_step_selects_one_result_and_refuses_stand_ins():
    lenet = cc.load_step(cc.H100_RUN / "bench-torch.json", model="LeNet", impl="seed")
    assert lenet.batch == 256 and lenet.step_s == pytest.approx(0.003926449099981255)
    with pytest.raises(cc.BenchmarkRecordError, match="2 results"):      # seed and ring
        cc.load_step(cc.H100_RUN / "bench-torch.json", model="LeNet")
    with pytest.raises(cc.BenchmarkRecordError, match="not on a GPU"):   # k = 2 on one GPU
        cc.load_step(cc.H100_RUN / "bench-torch.json", model="ResNet-18, width 16", devices=2)
    with pytest.raises(cc.BenchmarkRecordError, match="0 results.*it holds"):
        cc.load_step(cc.H100_RESNET18["measured, TF32 off (exact)"], framework="jax")


def test_load_step_errors_name_the_file_and_the_problem(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError, match="nope.json not found"):
        cc.load_step(missing)
    bad = tmp_path / "corrupt.json"
    bad.write_text('{"results": [')                                   # truncated
    with pytest.raises(cc.BenchmarkRecordError, match="corrupt.json is not valid JSON"):
        cc.load_step(bad)
    good = _raw(cc.H100_RESNET18["measured, TF32 off (exact)"])
    import copy
    import json
    no_hw = copy.deepcopy(good)
    del no_hw["hardware"]
    (tmp_path / "nohw.json").write_text(json.dumps(no_hw))
    with pytest.raises(cc.BenchmarkRecordError, match="lacks the field 'hardware'"):
        cc.load_step(tmp_path / "nohw.json")
    for value in (0.0, -1.0, "fast", None):
        broken = copy.deepcopy(good)
        broken["results"][0]["step_s_median"] = value
        (tmp_path / "broken.json").write_text(json.dumps(broken))
        with pytest.raises(cc.BenchmarkRecordError, match="step time"):
            cc.load_step(tmp_path / "broken.json")
    assert isinstance(cc.BenchmarkRecordError("x"), ValueError)


def test_resnet18_step_times_are_the_measured_shapes_then_the_linear_h100_record():
    steps = cc.resnet18_step_times(256)
    assert list(steps) == [*cc.H200_SHAPES, cc.LINEAR_LABEL]
    assert all(s.measured for s in steps.values())
    # each shape is the least-squares line through the benchmark's own records
    rec = _raw(cc.H200_RUN / "steps.json")
    for label, (name, fw, rung) in cc.H200_SHAPES.items():
        s = steps[label]
        if name == "steps.json":
            pts = {r["batch"]: r["ms_median"] / 1e3 for r in rec["records"]
                   if r["framework"] == fw and r["rung"] == rung and r["span"] == steptime.STEP}
        else:
            pts = {r["batch"]: r["ms"] / 1e3 for r in map(json.loads, (cc.H200_RUN / name).read_text().splitlines())
                   if r["variant"] == rung}
        assert len(pts) >= 2 and s.fit == steptime.fit_step_time(list(pts), list(pts.values()))
        # at a measured batch the record itself, between two the straight line joining them,
        # the fitted shape only beyond them (M3: JAX's fit misses its record at 32 by 9 %)
        assert all(s.at(b) == t and s.measured_at(b) for b, t in pts.items())
        lo, hi = sorted(pts)[:2]
        assert s.at((lo + hi) / 2) == pytest.approx((pts[lo] + pts[hi]) / 2)
        # beyond them the longer of the host's floor and the GPU's line (M2), never below the
        # records: for eager PyTorch the GPU line is the same step's CUDA-graphs probe
        hi = max(pts)
        gpu = s.gpu if s.gpu is not None else (lambda b, x=sorted(pts)[-2]: pts[hi] + (
            pts[hi] - pts[x]) / (hi - x) * (b - hi))
        assert s.at(8 * hi) == max(pts[hi], gpu(8 * hi)) and not s.measured_at(2 * hi)
        assert s.at(min(pts) / 4) == max(min(pts.values()), gpu(min(pts) / 4))
        assert s.seconds == s.at(256) == pts[256] and s.fixed_s == min(pts.values()) > 0
        assert s.at(32) > s.seconds / 8                    # the fixed part: not linear
        assert "h200-2026-11-27" in s.source
        # the fit's quality as it is: through two points a line says nothing of its shape
        assert ("passes through both" if len(pts) == 2 else "within") in s.source
    eager = steps["measured, H200, PyTorch eager"]
    assert 0.9 < eager.fit.fixed_share < 1.0                # launch-bound: README's 93 %
    # its own slope (about 3 us an image) lies inside the noise; the GPU's line is ~5x steeper,
    # so far beyond the records the step follows the GPU, not the eager line
    assert eager.gpu.per_example > 4 * eager.fit.per_example
    assert eager.at(4096) == pytest.approx(eager.gpu(4096)) and eager.at(4096) > 2 * eager.fit(4096)
    assert eager.at(512) == eager.at(256)                   # the launches still dominate
    assert eager.at(32) == _raw_ms(rec, "torch", "defaults", 32)
    jax = steps["measured, H200, JAX"]
    assert jax.at(32) == _raw_ms(rec, "jax", "defaults", 32) > 1.05 * jax.fit(32)
    lin = steps[cc.LINEAR_LABEL]
    assert lin.fit is None and lin.fixed_s == 0.0 and lin.at(32) == pytest.approx(lin.seconds / 8)
    assert lin.seconds == _raw(cc.H100_RESNET18["measured, TF32 on (default)"])["results"][0]["step_s_median"]
    # the rate a step time means: 3 x 0.91 GFLOP per image (torch's FlopCounter: 2.73 GFLOP)
    assert 3 * cc.resnet18_flops(64) == pytest.approx(2.73e9, rel=0.01)
    assert lin.rate(256) == pytest.approx(2.73e9 * 256 / lin.seconds, rel=0.01)
    half = cc.resnet18_step_times(128)
    assert all(half[l].seconds == pytest.approx(steps[l].at(128)) for l in steps)
    table = cc.step_table(steps, 256)
    assert table.count("\n") == 1 + len(steps) and "0 (assumed)" in table
    assert f"{eager.fixed_s * 1e3:.2f} ms" in table
    with pytest.raises(ValueError):
        eager.at(0)


def _raw_ms(rec, fw, rung, batch):
    return next(r["ms_median"] for r in rec["records"] if r["framework"] == fw
                and r["rung"] == rung and r["batch"] == batch and r["span"] == steptime.STEP) / 1e3


def test_load_step_shape_refuses_what_is_not_a_shape(tmp_path):
    with pytest.raises(FileNotFoundError):
        cc.load_step_shape(tmp_path / "none.json", "torch", "defaults")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(cc.BenchmarkRecordError, match="not readable"):
        cc.load_step_shape(tmp_path / "bad.json", "torch", "defaults")
    rec = _raw(cc.H200_RUN / "steps.json")
    one = dict(rec, records=[r for r in rec["records"] if r["batch"] == 256])
    (tmp_path / "one.json").write_text(json.dumps(one))
    with pytest.raises(cc.BenchmarkRecordError, match="two batches"):
        cc.load_step_shape(tmp_path / "one.json", "torch", "defaults")
    cpu = dict(rec, records=[dict(r, on_gpu=False) for r in rec["records"]])
    (tmp_path / "cpu.json").write_text(json.dumps(cpu))
    with pytest.raises(cc.BenchmarkRecordError, match="off the GPU"):
        cc.load_step_shape(tmp_path / "cpu.json", "torch", "defaults")


def test_the_fixed_part_caps_the_strong_scaling_speed_up():
    """Amdahl's law with T0 as the serial part: k GPUs at a fixed global batch never beat
    T(G) / T(G/k); the linear step's speed-up is above every measured shape's (issue #32)."""
    steps = cc.resnet18_step_times(256)
    nv = cc.LINKS["NVLink 4 (H100 SXM)"]
    for s in steps.values():
        for k in (2, 4, 8):
            p = cc.predict_step(s, 4.47e7, k, nv, overlap=False)
            assert p["compute_s"] == pytest.approx(s.at(256 / k))
            assert p["speedup"] < s.seconds / s.at(256 / k) <= k + 1e-9
    lin = cc.predict_step(steps[cc.LINEAR_LABEL], 4.47e7, 8, nv, overlap=False)["speedup"]
    assert lin > 5 and all(cc.predict_step(s, 4.47e7, 8, nv, overlap=False)["speedup"] < lin / 3
                           for l, s in steps.items() if l != cc.LINEAR_LABEL)
    # a number still splits linearly, as before
    assert cc.predict_step(0.02, 4.47e7, 8, nv, overlap=False)["compute_s"] == pytest.approx(0.0025)


def test_critical_batch_of_a_shape():
    nv, ib = cc.LINKS["NVLink 4 (H100 SXM)"], cc.LINKS["InfiniBand NDR"]
    fit = steptime.fit_step_time([32, 256], [0.001, 0.003])     # T0 = 0.714 ms, t = 8.9 us
    s = cc.StepTime("x", fit(256), "measured: test", 1.0, 256, fit)
    c = cc.collective_time("all-reduce", 4.47e7, 8, ib)
    assert c > fit.t0
    b = cc.critical_batch(s, 4.47e7, 8, ib)
    assert s.at(b) == pytest.approx(c)                          # compute meets the all-reduce
    # a fixed part longer than the all-reduce: never communication-bound
    slow = steptime.fit_step_time([32, 256], [0.0105, 0.0115])
    assert cc.critical_batch(cc.StepTime("y", slow(256), "measured: t", 1.0, 256, slow),
                             4.47e7, 8, nv) == 0.0
    lin = cc.StepTime("z", 0.0256, "measured: t", 1.0, 256)     # linear: as per image
    assert cc.critical_batch(lin, 4.47e7, 8, ib) == cc.critical_batch(1e-4, 4.47e7, 8, ib)


def test_device_limit_bounds_k_by_the_batch_and_the_links_domain():
    nv, ib = cc.LINKS["NVLink 4 (H100 SXM)"], cc.LINKS["InfiniBand NDR"]
    assert nv.domain == cc.NODE_GPUS == 8 and ib.domain is None
    assert cc.LINKS["PCIe 5.0 x16"].domain == 8
    assert cc.device_limit(256, nv) == 8                       # 256 / 32 = 8 = one node
    assert cc.device_limit(4096, nv) == 8                      # the node, not the batch
    assert cc.device_limit(4096, ib) == 4096 // cc.MIN_PER_GPU_BATCH
    assert cc.device_limit(64, ib) == 2 and cc.device_limit(8, ib) == 1
    assert cc.device_limit(256, nv, min_per_gpu=64) == 4
    with pytest.raises(ValueError):
        cc.device_limit(0, nv)
    with pytest.raises(TypeError):                              # the bound is the caller's
        cc.best_speedup(1.0, 1e8, nv, overlap=False)


def test_speedup_rows_table_and_plot():
    steps = cc.resnet18_step_times(256)
    links = [cc.LINKS["NVLink 4 (H100 SXM)"], cc.LINKS["InfiniBand NDR"]]
    rows = cc.speedup_rows(steps, 4e7, links, 8)
    assert len(rows) == len(steps) * len(links)
    for r in rows:
        s = steps[r["step"]]
        link = cc.LINKS[r["link"]]
        assert r["after"] == cc.predict_step(s, 4e7, 8, link, overlap=False)
        assert r["overlapped"]["speedup"] >= r["after"]["speedup"]
    assert cc.speedup_table(rows, 8).count("\n") == 1 + len(rows)
    import matplotlib
    matplotlib.use("Agg")
    fig = cc.plot_speedups(steps, 4e7, links, 256)
    assert len(fig.axes) == 2
    for ax, link in zip(fig.axes, links):
        xs = {x for line in ax.get_lines() for x in line.get_xdata()}
        assert max(xs) == cc.device_limit(256, link) and min(xs) == 1
        assert len(ax.get_lines()) == 1 + 2 * len(steps)
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_roofline_and_fit_figures():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = cc.resnet18_step_times(256)
    links = [cc.LINKS["NVLink 4 (H100 SXM)"], cc.LINKS["InfiniBand NDR"]]
    fig = cc.plot_roofline(steps, 4.47e7, links)
    left, right = fig.axes
    assert left.get_xscale() == "log" and right.get_xlabel() == "GPUs k"
    # a dot where compute meets the all-reduce; none for a step whose T0 outlasts it
    dots = [l for l in left.get_lines() if l.get_marker() == "o"]
    crossing = [(s, l) for s in steps.values() for l in links
                if 0 < cc.critical_batch(s, 4.47e7, 8, l) < float("inf")]
    assert len(dots) == len(crossing) >= 2
    xs = sorted(float(d.get_xdata()[0]) for d in dots)
    lin = steps[cc.LINEAR_LABEL]
    assert cc.critical_batch(lin, 4.47e7, 8, links[0]) in xs
    # the compute curves: each step solid over its measured batches (its records), dashed
    # where a line is drawn beyond them; flat near T0 for small batches
    curves = [l for l in left.get_lines() if l.get_label().startswith("compute")]
    assert len(curves) == len(steps)
    eager_step = steps["measured, H200, PyTorch eager"]
    solid, dashed = [l for l in left.get_lines() if l.get_color() == curves[0].get_color()][:2]
    assert solid.get_linestyle() == "-" and dashed.get_linestyle() == "--"
    xs_solid = solid.get_xdata()[~np.isnan(solid.get_ydata())]
    assert min(xs_solid) >= 32 and max(xs_solid) <= 256         # the measured batches only
    assert np.nanmin(dashed.get_ydata()) == pytest.approx(1e3 * eager_step.at(1))
    assert curves[-1].get_label().endswith("(scaled)")            # the linear H100 step
    plt.close(fig)
    rows = [{"k": k, "bytes": n, "median": float(cc.model_time("ring", n, k, 1e-4, 1e-9)),
             "p25": 0.0, "p75": 0.0} for k in (2, 4) for n in cc.message_sizes(8, 1 << 24)]
    for r in rows:
        r["p25"] = r["p75"] = r["median"]
    fig = cc.plot_fits({"m": rows}, {"m": cc.fit_per_k(rows, "ring")})
    diamonds = [l for l in fig.axes[0].get_lines() if l.get_marker() == "D"]
    assert len(diamonds) == 2                            # n_1/2 marked on both k's lines
    x = float(diamonds[0].get_xdata()[0])
    assert x == pytest.approx(cc.regime_size("ring", 2, 1e-4, 1e-9), rel=1e-6)
    plt.close(fig)


def test_bucket_timeline_is_the_overlapped_prediction():
    link = cc.LINKS["NVLink 4 (H100 SXM)"]
    for bb in (1 << 20, cc.DDP_BUCKET_BYTES, 1 << 40):
        tl = cc.bucket_timeline(0.02, 45e6, 8, link, bucket_bytes=bb)
        assert len(tl) == len(cc.bucket_sizes(45e6, bb))
        assert all(b["start"] >= b["ready"] and b["end"] > b["start"] for b in tl)
        assert all(a["end"] <= b["start"] for a, b in zip(tl, tl[1:]))      # one stream
        assert tl[-1]["ready"] == pytest.approx(0.02 / 8)                 # the last: at backward's end
        p = cc.predict_step(0.02, 45e6, 8, link, overlap=True, bucket_bytes=bb)
        assert p["step_s"] == pytest.approx(max(0.02 / 8, tl[-1]["end"]))


def test_plot_overlap_timeline_draws_one_lane_per_bucket_size():
    import matplotlib
    matplotlib.use("Agg")
    ax = cc.plot_overlap_timeline(0.02, 45e6, 8, cc.LINKS["PCIe 4.0 x16"],
                                  bucket_sizes_bytes=(1 << 20, 1 << 40))
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[-1] == "compute" and "43 buckets" in labels[1] and "1 bucket of" in labels[0]


def test_the_overviews_headline_is_the_models():
    """comm/index.md: the measured shapes give "little more than 1x" on 8 GPUs for 256 images;
    a linear step (T0 = 0) would promise "several times more" (7x)."""
    text = (Path(__file__).resolve().parents[1] / "chapters" / "comm" / "index.md").read_text()
    assert "little more than 1×" in text and "several times more" in text
    steps = cc.resnet18_step_times(256)
    nv = cc.LINKS["NVLink 4 (H100 SXM)"]
    sp = {l: cc.predict_step(s, 4.47e7, 8, nv, overlap=False)["speedup"] for l, s in steps.items()}
    assert round(sp.pop(cc.LINEAR_LABEL)) == 7
    assert all(1 <= v < 2 for v in sp.values())


def test_the_tree_is_priced_as_nccls_model_and_wins_small_all_reduces_across_many_nodes():
    us = lambda t: t * 1e6
    nv, ib = cc.LINKS["NVLink 4 (H100 SXM)"], cc.LINKS["InfiniBand NDR"]
    # one node: a chain of k - 1 hops up and down; across nodes (one GPU each): log2(nodes) levels
    assert us(cc.nccl_latency("all-reduce", 8, nv, "LL", "tree")) == pytest.approx(6.8 + 2 * 7 * 0.6)
    assert us(cc.nccl_latency("all-reduce", 64, ib, "Simple", "tree")) == pytest.approx(8.4 + 2 * 6 * 14.0)
    assert us(cc.nccl_latency("all-reduce", 64, ib, "Simple")) == pytest.approx(8.4 + 126 * 14.0)
    with pytest.raises(ValueError):
        cc.nccl_latency("all-gather", 8, nv, "LL", "tree")
    # the tree's algorithm bandwidth: half of 0.92 of the link's (Simple)
    assert cc.tree_bandwidth(ib, "Simple", 64) == pytest.approx(0.5 * 0.92 * ib.bandwidth)
    small = 2.5e5
    assert cc.nccl_choice("all-reduce", small, 64, ib)[0] == "tree"
    assert cc.collective_time("all-reduce", small, 64, ib) == pytest.approx(
        cc.collective_time("all-reduce", small, 64, ib, algorithm="tree"))
    assert cc.collective_time("all-reduce", small, 64, ib, algorithm="ring") > 3 * \
        cc.collective_time("all-reduce", small, 64, ib)
    # one node: the ring wins (as NCCL's model says for 8 GPUs on NVLink)
    assert cc.nccl_choice("all-reduce", 4.47e7, 8, nv)[0] == "ring"
    # the multi-node Simple ring's plateau: its latency times 1.4 there, not inside a node
    n = 1 << 20
    ring_simple = cc.collective_time("all-reduce", n, 8, ib, protocol="Simple", algorithm="ring")
    bw_part = 2 * 7 / 8 * n / ib.protocol_bandwidth("Simple", 8)
    assert ring_simple - bw_part == pytest.approx(1.4 * cc.nccl_latency("all-reduce", 8, ib, "Simple"))
    nv_simple = cc.collective_time("all-reduce", n, 8, nv, protocol="Simple", algorithm="ring")
    assert nv_simple - 2 * 7 / 8 * n / nv.protocol_bandwidth("Simple", 8) == pytest.approx(
        cc.nccl_latency("all-reduce", 8, nv, "Simple"))
    # reduce-scatter and all-gather: the ring only
    assert cc.nccl_choice("all-gather", small, 64, ib)[0] == "ring"


def test_resnet18_layers_hold_the_bytes_late_and_the_work_early():
    layers = cc.resnet18_layer_costs()
    assert sum(l["flops"] for l in layers) == pytest.approx(cc.resnet18_flops(64))
    from d2lmini.models import resnet18_spec
    trainable = sum(4 * math.prod(s) for n, s in resnet18_spec()
                    if not n.endswith(("running_mean", "running_var")))
    assert sum(l["grad_bytes"] for l in layers) == trainable
    last = [l for l in layers if l["name"].startswith("stage4")]
    share = lambda key, ls: sum(l[key] for l in ls) / sum(l[key] for l in layers)
    assert share("grad_bytes", last) > 0.7 and share("flops", last) < 0.3     # the 75 % / 25 %
    # DDP's buckets: whole layers in backward order, the first closed at 1 MiB, each once
    groups = cc.layer_buckets(layers)
    assert [i for g in groups for i in g] == list(reversed(range(len(layers))))
    assert layers[groups[0][0]]["name"] == "fc" and len(groups) == 3
    assert sum(layers[i]["grad_bytes"] for i in groups[0]) >= cc.DDP_FIRST_BUCKET_BYTES
    assert sum(layers[i]["grad_bytes"] for i in groups[0][:-1]) < cc.DDP_FIRST_BUCKET_BYTES


def test_bucket_timeline_by_layer_flops():
    layers = cc.resnet18_layer_costs()
    n = sum(l["grad_bytes"] for l in layers)
    pcie = cc.LINKS["PCIe 4.0 x16"]
    tl = cc.bucket_timeline(0.02, n, 8, pcie, layers=layers)
    ends = tl[0]["forward_s"] + tl[0]["backward_s"]
    assert [b["ready"] for b in tl] == sorted(b["ready"] for b in tl)
    assert tl[-1]["ready"] == pytest.approx(ends)                # the stem is backward's last
    assert tl[0]["ready"] < tl[0]["forward_s"] + 0.2 * tl[0]["backward_s"]   # most bytes early
    assert sum(b["bytes"] for b in tl) == n
    even = cc.predict_step(0.02, n, 8, pcie, overlap=True)
    by_layer = cc.predict_step(0.02, n, 8, pcie, overlap=True, layers=layers)
    assert 0 < by_layer["exposed_s"] < even["exposed_s"]         # early bytes hide more
    with pytest.raises(ValueError, match="gradient bytes"):
        cc.bucket_timeline(0.02, n + 4, 8, pcie, layers=layers)
    # one bucket of everything: nothing hides, whatever the layers
    one = cc.bucket_timeline(0.02, n, 8, pcie, bucket_bytes=n, layers=layers)
    assert len(one) == 1 and one[0]["ready"] == pytest.approx(ends)


# --- the roofline of data parallelism (commcost.roofline) ------------------------------------

def test_gpu_peaks_are_the_datasheets_dense_rates():
    h100 = cc.GPUS["H100 SXM"]
    assert h100.peak("bf16") == 989.4e12 and h100.peak("tf32") == 494.7e12    # the whitepaper's dense
    assert h100.peak("fp32") == 67e12
    with pytest.raises(ValueError, match="no 'fp8' peak"):
        h100.peak("fp8")


def test_roofline_batch_is_the_cards_flops_per_byte_over_the_steps():
    """Hand-worked: C = 1e15 FLOP/s over W = 100 GB/s is 1e4 FLOP per link byte; a step of 1e9
    FLOP per example sending 2 (8-1)/8 x 1e8 = 1.75e8 bytes does 5.71 FLOP per byte per example:
    compute-bound above 1e4 / 5.71 = 1750 examples per GPU."""
    link = cc.Link("test", 100e9, "hand-worked")
    assert cc.roofline_batch(1e9, 1e8, 8, link, 1e15) == pytest.approx(1750)
    assert cc.roofline_batch(1e9, 1e8, 1, link, 1e15) == 0          # one GPU sends nothing
    assert cc.roofline_batch(1e9, 1e8, 2, link, 1e15) == pytest.approx(1000)   # b(2) = 1
    # with NCCL's latency the threshold can only grow
    assert cc.roofline_batch(1e9, 1e8, 8, link, 1e15, latency=True) > 1750
    with pytest.raises(ValueError):
        cc.roofline_batch(0, 1e8, 8, link, 1e15)


def test_a_transformer_of_weights_only_needs_two_thirds_of_the_cards_ratio():
    """6 FLOP per parameter and token in a step, 2 bytes per bfloat16 gradient element: the
    roofline is (C/W) 2(k-1)/k x 2/6 tokens, whatever the parameter count."""
    nv, gpu = cc.LINKS["NVLink 4 (H100 SXM)"], cc.GPUS["H100 SXM"]
    ratio = gpu.peak("bf16") / nv.bandwidth                        # about 2,200 FLOP per byte
    for params in (1e6, 1.5e9):
        got = cc.roofline_batch(6 * params, 2 * params, 8, nv, gpu.peak("bf16"))
        assert got == pytest.approx(ratio * 1.75 / 3)


def test_gpt2_layer_costs_count_gpt2_xl():
    layers = cc.gpt2_layer_costs()
    assert len(layers) == 49 and layers[0]["name"] == "embedding"
    assert sum(l["grad_bytes"] for l in layers) == 2 * 1_557_611_200        # bfloat16
    assert layers[1]["flops"] == 2 * 12 * 1600**2 + 2 * 1024 * 1600       # Kaplan et al. 2020
    assert layers[0]["flops"] == 2 * 1600 * 50257                          # the tied output layer


def test_fsdp_layer_threshold_is_one_and_a_half_times_the_steps():
    """A layer's forward (F_l B) against its all-gather ((k-1)/k n_l): B_l = C (k-1)/k n_l /
    (F_l W).  The step's all-reduce against its compute (3 F B): 2(k-1)/k n / (3 F).  For
    layers of one FLOP-per-byte ratio the first is 1.5 times the second (bandwidth terms)."""
    link, peak, k = cc.LINKS["InfiniBand NDR"], 1e15, 8
    layers = [{"name": f"l{i}", "grad_bytes": 4e6 * (i + 1), "flops": 2e6 * (i + 1)} for i in range(3)]
    per = cc.layer_batches(layers, k, link, peak, latency=False)
    step = cc.roofline_batch(3 * sum(l["flops"] for l in layers),
                             sum(l["grad_bytes"] for l in layers), k, link, peak)
    for p in per:
        assert p["batch"] == pytest.approx(peak * 7 / 8 * 2 / link.bandwidth)   # bytes / FLOP = 2
        assert p["batch"] == pytest.approx(1.5 * step)
    # NCCL's latency weighs most on the smallest layer
    lat = cc.layer_batches(layers, k, link, peak)
    rise = [q["batch"] / p["batch"] for p, q in zip(per, lat)]
    assert rise[0] > rise[1] > rise[2] > 1


def test_measured_threshold_is_the_roofline_times_the_share_of_peak_reached():
    """A step linear in its batch that reaches the fraction u of the peak crosses the all-reduce
    at u times the roofline (both with NCCL's latency): critical_batch = t / (T/B), and
    roofline = C t / (3F), with 3F B / T = u C."""
    link, peak, f, n = cc.LINKS["NVLink 4 (H100 SXM)"], 494.5e12, 1e9, 45e6
    step = cc.StepTime("linear", 0.1, "hand-worked", f, batch=100)          # 3 TFLOP/s
    u = step.rate(100) / peak
    assert cc.critical_batch(step, n, 8, link) == pytest.approx(
        u * cc.roofline_batch(3 * f, n, 8, link, peak, latency=True))


def test_threshold_rows_and_table():
    gpu, nv = cc.GPUS["H100 SXM"], cc.LINKS["NVLink 4 (H100 SXM)"]
    layers = cc.resnet18_layer_costs()
    models = {"ResNet-18": {"flops": cc.resnet18_flops(64), "unit": "images", "layers": layers,
                            "bytes": sum(l["grad_bytes"] for l in layers)}}
    rows = cc.threshold_rows(models, [nv], gpu, 8)
    (r,) = rows
    assert r["bf16"] / r["tf32"] == pytest.approx(989.4 / 494.7)   # in proportion to the peak
    assert r["bf16, hides"] == pytest.approx(1.5 * r["bf16"])      # backward: 2 of 3 passes
    assert r["bf16, latency"] > r["bf16"]
    assert len(r["layers"]) == len(layers) and r["layer_max"]["name"] == "fc"
    table = cc.threshold_table(rows)
    assert table.count("\n") == 2 and "| ResNet-18 (images) | NVLink 4 (H100 SXM) |" in table


# --- nodes of GPUs and HSDP (commcost.hierarchy) ----------------------------------------------

def test_one_node_is_the_nodes_own_link():
    c, nv = cc.H100_CLUSTER, cc.LINKS["NVLink 4 (H100 SXM)"]
    for op in cc.COLLECTIVES:
        for n in (1e3, 1e6, 1e9):
            assert cc.cluster_time(op, n, 1, c) == cc.collective_time(op, n, 8, nv)


def test_one_gpu_per_node_is_the_network_links_model():
    """A cluster of one-GPU nodes prices every collective as collective_time over the network
    link with one GPU per node: the same steps, latencies, caps and tree."""
    ib = cc.LINKS["InfiniBand NDR"]
    single = cc.Cluster("one GPU a node", cc.LINKS["NVLink 4 (H100 SXM)"], ib, 1, 1)
    for op in cc.COLLECTIVES:
        for nodes in (2, 4, 16):
            for n in (256, 1e5, 3e7, 2e9):
                assert cc.cluster_time(op, n, nodes, single) == pytest.approx(
                    cc.collective_time(op, n, nodes, ib), rel=1e-12)


def test_flat_latency_counts_network_steps_as_nccl_does():
    """tuning.cc, more than one GPU a node: base + (nsteps - nInterSteps) max(intra, overhead)
    + nInterSteps inter, nInterSteps = nodes - 1 (all-gather), 2 (nodes - 1) (all-reduce);
    the network post overhead 1 us, 3 us for Simple.  Tree: base + 2 (7 intra + log2 nodes
    inter)."""
    c = cc.H100_CLUSTER
    us = lambda t: t * 1e6
    assert us(cc.cluster_latency("all-gather", 2, c, "Simple")) == pytest.approx(8.4 + 14 * 3.4 + 14.0)
    assert us(cc.cluster_latency("all-gather", 2, c, "LL")) == pytest.approx(6.6 + 14 * 1.0 + 2.7)
    assert us(cc.cluster_latency("all-reduce", 2, c, "LL128")) == pytest.approx(14.0 + 28 * 1.9 + 2 * 4.0)
    assert us(cc.cluster_latency("all-reduce", 16, c, "LL", "tree")) == pytest.approx(6.8 + 2 * (7 * 0.6 + 4 * 5.0))
    with pytest.raises(ValueError, match="all-reduce only"):
        cc.cluster_latency("all-gather", 2, c, "LL", "tree")


def test_flat_ring_gets_the_nodes_cards():
    """Every ring crosses a node's boundary once, on one card: 8 cards of 50 GB/s give a GPU's
    ring share 400 GB/s (below NVLink's 450); one card, 50 GB/s.  All-gather of 8 GB on 2
    nodes, Simple: 70 us + 15/16 x 8e9 / 400e9 = 18.82 ms."""
    c = cc.H100_CLUSTER
    assert c.flat_bandwidth() == 400e9
    one_nic = cc.Cluster("one card", c.intra, c.inter, 8, 1)
    assert one_nic.flat_bandwidth() == 50e9
    assert one_nic.across().bandwidth == 50e9 / 8                     # eight GPUs share it
    assert cc.cluster_time("all-gather", 8e9, 2, c, protocol="Simple") == pytest.approx(
        70.0e-6 + 15 / 16 * 8e9 / 400e9)
    assert cc.cluster_choice("all-gather", 8e9, 2, c) in {("ring", p) for p in cc.PROTOCOLS}
    with pytest.raises(ValueError, match="NET link"):
        cc.Cluster("bad", c.inter, c.inter)


def test_hierarchy_collectives_per_unit():
    units = [8e6, 4e6]
    assert cc.hierarchy_collectives(units, "DDP", 2) == [("flat", "all-reduce", 12e6)]   # one bucket
    big = cc.hierarchy_collectives([30 * 2**20, 30 * 2**20], "DDP", 2)          # 25 MiB buckets
    assert [n for _, _, n in big] == [25 * 2**20, 25 * 2**20, 10 * 2**20]
    fsdp = cc.hierarchy_collectives(units, "FSDP", 2)
    assert [op for _, op, _ in fsdp[:3]] == ["all-gather", "all-gather", "reduce-scatter"]
    assert len(cc.hierarchy_collectives(units, "FSDP", 2, regather=False)) == 4
    hsdp = cc.hierarchy_collectives(units, "HSDP", 2)
    assert hsdp[:4] == [("node", "all-gather", 8e6)] * 2 + [("node", "reduce-scatter", 8e6),
                                                              ("across", "all-reduce", 1e6)]
    with pytest.raises(ValueError, match="scheme"):
        cc.hierarchy_collectives(units, "ZeRO-3", 2)


def test_hsdp_bytes_per_card_hand_worked():
    """Four units of 8 MB (n = 32 MB) on 2 nodes of 8 (N = 16): a card sends per step
    DDP 2 (15/16) n / 8 = 7.5 MB, FSDP 3 (15/16) n / 8 = 11.25 MB, HSDP 2 (1/2) n / 8 = 4 MB."""
    units = [8e6] * 4
    got = {s: cc.hierarchy_step(units, s, 2)["nic_bytes"] for s in cc.HIERARCHY_SCHEMES}
    assert got == pytest.approx({"DDP": 7.5e6, "FSDP": 11.25e6, "HSDP": 4e6})
    assert all(cc.hierarchy_step(units, s, 1)["nic_bytes"] == 0 for s in cc.HIERARCHY_SCHEMES)


def test_hsdp_time_is_its_node_part_and_its_shards_all_reduce():
    """One unit of 8 GB on 2 nodes: HSDP's part across nodes is the all-reduce of 1 GB between
    2 GPUs over one card, Simple ring: (8.4 + 2 x 14) x 1.4 us + 2 (1/2) 1e9 / 50e9 s; its node
    part is FSDP's three collectives on one node; on one node HSDP is FSDP."""
    nv = cc.LINKS["NVLink 4 (H100 SXM)"]
    h = cc.hierarchy_step([8e9], "HSDP", 2)
    assert h["across_s"] == pytest.approx((8.4 + 2 * 14.0) * 1.4e-6 + 1e9 / 50e9)
    assert h["node_s"] == pytest.approx(2 * cc.collective_time("all-gather", 8e9, 8, nv)
                                        + cc.collective_time("reduce-scatter", 8e9, 8, nv))
    assert h["flat_s"] == 0 and h["seconds"] == h["node_s"] + h["across_s"]
    one = {s: cc.hierarchy_step([8e9, 1e6], s, 1) for s in cc.HIERARCHY_SCHEMES}
    assert one["HSDP"]["seconds"] == pytest.approx(one["FSDP"]["seconds"]) and one["HSDP"]["across_s"] == 0
    assert one["DDP"]["seconds"] == pytest.approx(sum(cc.collective_time("all-reduce", n, 8, nv)
                                                      for n in cc.bucket_sizes(8e9 + 1e6,
                                                                               25 * 2**20)))
    # the bandwidth terms alone, (k-1)/k n / W for each of the three in the node, without
    # NCCL's latencies and protocols
    assert h["bandwidth_s"] == pytest.approx(3 * 7 / 8 * 8e9 / nv.bandwidth + 1e9 / 50e9)
    assert h["latency_s"] == pytest.approx(h["seconds"] - h["bandwidth_s"]) and h["latency_s"] > 0


def test_hierarchy_rows_gpt2_xl():
    """GPT-2 XL's 49 units: flat FSDP's rings grow a step per GPU, HSDP's stay in the node; from
    16 nodes on HSDP is faster than flat FSDP, and DDP, one all-reduce a unit, fastest."""
    units = [l["grad_bytes"] for l in cc.gpt2_layer_costs()]
    rows = cc.hierarchy_rows(units, [1, 2, 16])
    by = {(r["nodes"], r["scheme"]): r for r in rows}
    assert by[1, "DDP"]["vs_ddp"] == 1 and by[16, "DDP"]["gpus"] == 128
    assert by[16, "HSDP"]["seconds"] < by[16, "FSDP"]["seconds"]
    assert all(by[n, "DDP"]["seconds"] < min(by[n, "FSDP"]["seconds"], by[n, "HSDP"]["seconds"])
               for n in (1, 2, 16))
    table = cc.hierarchy_table(rows)
    assert table.count("\n") == 4 and "| 16 (128) |" in table


def test_the_allreduce_table_prices_every_model_link_and_count_with_nccls_model():
    grads = {"small": 4096.0, "large": 44.7e6}
    rows = cc.allreduce_table(grads).splitlines()
    assert len(rows) == 2 + len(grads) * len(cc.LINKS)
    link_name, link = next(iter(cc.LINKS.items()))
    cells = [c.strip() for c in rows[2 + len(cc.LINKS)].split("|")[1:-1]]     # "large", 1st link
    assert cells[:2] == ["large", link_name]
    assert cells[4] == cc.fmt_seconds(cc.collective_time("all-reduce", 44.7e6, 8, link))
    assert cells[5] == cc.nccl_protocol("all-reduce", 44.7e6, 8, link)

"""The alpha-beta model of all-reduce and its fit (d2lmini.commcost)."""
import math

import numpy as np
import pytest

from d2lmini import commcost as cc


def test_coefficients_count_steps_and_bytes_of_each_scheme():
    assert cc.coefficients("ring", 4) == (6.0, 1.5)
    assert cc.coefficients("naive", 4) == (6.0, 6.0)
    assert cc.coefficients("tree", 8) == (6.0, 6.0)
    assert cc.coefficients("tree", 5) == (6.0, 6.0)      # ceil(log2 5) = 3
    for s in cc.SCHEMES:
        assert cc.coefficients(s, 1) == (0.0, 0.0)        # one device: nothing to send
    with pytest.raises(ValueError, match="unknown scheme"):
        cc.coefficients("star", 4)
    with pytest.raises(ValueError, match="at least one device"):
        cc.coefficients("ring", 0)


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
        assert link.name == name and link.source and link.latency_source
        assert link.bandwidth > 1e9 and link.beta == pytest.approx(1 / link.bandwidth)
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


def test_predicted_step_overlap_and_best_speedup():
    link = cc.Link("test", 1e9, "made up", 1e-5, "made up")
    p1 = cc.predict_step(1.0, 1e6, 1, link, overlap=False)
    assert p1["comm_s"] == 0 and p1["speedup"] == pytest.approx(1.0)
    no = cc.predict_step(0.1, 1e8, 4, link, overlap=False)
    yes = cc.predict_step(0.1, 1e8, 4, link, overlap=True)
    assert no["comm_s"] == pytest.approx(6e-5 + 1.5 * 1e8 / 1e9)
    assert no["step_s"] == pytest.approx(0.025 + no["comm_s"])
    assert yes["step_s"] < no["step_s"] and yes["speedup"] > no["speedup"]
    # communication much shorter than backward: overlap hides it completely
    tiny = cc.predict_step(10.0, 8, 4, link, overlap=True)
    assert tiny["step_s"] == pytest.approx(2.5)
    k, s = cc.best_speedup(1.0, 1e8, link, overlap=False, max_k=64)
    assert 2 <= k <= 64 and s == max(cc.predict_step(1.0, 1e8, j, link, overlap=False)["speedup"]
                                    for j in range(1, 65))
    assert 1 < s < 1.0 / (1e8 / 1e9)                 # never above compute / (n * beta)
    assert cc.best_speedup(0.01, 1e8, link, overlap=False, max_k=64) == (1, 1.0)


def test_hidden_fraction():
    assert cc.hidden_fraction(1.0, 2.0, 1.0) == 1.0
    assert cc.hidden_fraction(1.5, 2.0, 1.0) == pytest.approx(0.5)
    assert cc.hidden_fraction(2.5, 2.0, 1.0) == 0.0
    assert cc.hidden_fraction(1.0, 1.0, 1.2) == 0.0


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
    assert "alpha" in cc.report("ring", f) and "10.0%" in cc.report("ring", f)


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


def test_resnet18_step_times_measured_first_then_the_old_assumption():
    steps = cc.resnet18_step_times(256)
    labels = list(steps)
    assert labels == [*cc.H100_RESNET18, "assumed before the measurement"]
    for label, path in cc.H100_RESNET18.items():
        assert steps[label].measured and steps[label].seconds == _raw(path)["results"][0]["step_s_median"]
    old = steps["assumed before the measurement"]
    assert not old.measured and "assumed" in old.source and "40%" in old.source
    assert old.seconds == pytest.approx(cc.compute_time(cc.resnet18_flops(64), 256, cc.GPUS["H100 SXM"],
                                                        cc.ASSUMED_UTILIZATION))
    assert 0.026 < old.seconds < 0.0262                               # the chapter's 26 ms
    # the rate a step time means: 3 x 0.91 GFLOP per image (torch's FlopCounter: 2.73 GFLOP)
    assert 3 * cc.resnet18_flops(64) == pytest.approx(2.73e9, rel=0.01)
    assert old.rate(256) == pytest.approx(cc.GPUS["H100 SXM"].fp32_flops * cc.ASSUMED_UTILIZATION)
    half = cc.resnet18_step_times(128)
    assert all(half[l].seconds == pytest.approx(steps[l].seconds / 2) for l in labels)
    table = cc.step_table(steps, 256)
    assert table.count("\n") == 1 + len(steps) and "2.73 GFLOP" in table and "19.8 ms" in table


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
        s = steps[r["step"]].seconds
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

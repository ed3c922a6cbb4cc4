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

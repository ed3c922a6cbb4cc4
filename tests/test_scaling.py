"""d2lmini.scaling: the learning-rate rules and the warm-up of the batch-size page, and the
profile's sweep settings."""
import math

import pytest

import d2lmini
from d2lmini import scaling


@pytest.mark.parametrize("rule,expected", [("same", 0.05), ("linear", 0.8), ("sqrt", 0.2)])
def test_scaled_lr_follows_the_rule(rule, expected):
    assert scaling.scaled_lr(rule, 0.05, 64, 1024) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("rule", scaling.RULES)
def test_every_rule_keeps_the_base_rate_at_the_base_batch(rule):
    assert scaling.scaled_lr(rule, 0.1, 64, 64) == 0.1


def test_linear_rule_is_proportional_to_the_batch():
    lrs = [scaling.scaled_lr("linear", 0.1, 64, b) for b in (64, 128, 256, 512)]
    assert [round(b / a, 12) for a, b in zip(lrs, lrs[1:])] == [2.0, 2.0, 2.0]
    assert scaling.scaled_lr("linear", 0.1, 64, 32) == pytest.approx(0.05)    # smaller too


def test_sqrt_rule():
    assert scaling.scaled_lr("sqrt", 0.1, 64, 256) == pytest.approx(0.2)
    assert scaling.scaled_lr("sqrt", 0.1, 64, 128) == pytest.approx(0.1 * math.sqrt(2))


@pytest.mark.parametrize("kwargs,match", [
    (dict(rule="cubic"), "unknown scaling rule 'cubic'"),
    (dict(base_batch=0), "batch sizes must be >= 1"),
    (dict(batch=0), "batch sizes must be >= 1"),
    (dict(base_lr=0.0), "base_lr must be positive"),
])
def test_scaled_lr_rejects_bad_arguments(kwargs, match):
    args = dict(rule="linear", base_lr=0.1, base_batch=64, batch=256) | kwargs
    with pytest.raises(ValueError, match=match):
        scaling.scaled_lr(**args)


def test_schedule_without_warmup_is_constant():
    assert scaling.lr_schedule("linear", 0.1, 64, 256, 5) == [pytest.approx(0.4)] * 5
    assert scaling.lr_schedule("linear", 0.1, 64, 256, 0) == []


def test_warmup_starts_at_the_base_rate_and_rises_linearly_to_the_target():
    lrs = scaling.lr_schedule("linear", 0.1, 64, 512, num_steps=7, warmup_steps=4)
    assert lrs == pytest.approx([0.1, 0.275, 0.45, 0.625, 0.8, 0.8, 0.8])
    steps = [b - a for a, b in zip(lrs, lrs[1:5])]
    assert max(steps) - min(steps) < 1e-12                       # a constant increment
    assert all(a <= b for a, b in zip(lrs, lrs[1:]))              # never decreases


def test_warmup_longer_than_training_never_reaches_the_target():
    lrs = scaling.lr_schedule("linear", 0.1, 64, 256, num_steps=3, warmup_steps=10)
    assert lrs == pytest.approx([0.1, 0.13, 0.16])


def test_warmup_at_the_base_batch_changes_nothing():
    assert scaling.lr_schedule("linear", 0.1, 64, 64, 6, warmup_steps=3) == [0.1] * 6


def test_schedule_rejects_negative_counts():
    with pytest.raises(ValueError, match="must be >= 0"):
        scaling.lr_schedule("same", 0.1, 64, 64, -1)
    with pytest.raises(ValueError, match="must be >= 0"):
        scaling.lr_schedule("same", 0.1, 64, 64, 3, warmup_steps=-2)


def test_policies():
    names = [p.name for p in scaling.POLICIES]
    assert names == ["same lr", "linear", "linear + warm-up", "sqrt"]
    warm = scaling.POLICIES[2]
    assert warm.schedule(0.1, 64, 256, 4, 2) == pytest.approx([0.1, 0.25, 0.4, 0.4])
    assert scaling.POLICIES[1].schedule(0.1, 64, 256, 4, 2) == pytest.approx([0.4] * 4)


@pytest.mark.parametrize("name", sorted(d2lmini.PROFILES))
def test_every_profile_has_a_consistent_sweep(name):
    s = d2lmini.PROFILES[name].scaling
    assert s.batch_sizes[0] == s.base_batch and list(s.batch_sizes) == sorted(set(s.batch_sizes))
    assert all(b % s.base_batch == 0 for b in s.batch_sizes)      # k devices x base_batch each
    assert s.epochs >= 1 and s.base_lr > 0 and s.warmup_epochs > 0
    if s.train_samples is not None:                                # every batch whole
        assert s.train_samples % s.batch_sizes[-1] == 0


def _run(batch, policy, acc, diverged=False):
    return dict(batch=batch, policy=policy, test_acc=acc, diverged=diverged)


def test_verdicts_read_a_sweep():
    runs = [_run(64, p, 0.80) for p in ("same", "linear", "warm")]
    runs += [_run(256, "same", 0.70), _run(256, "linear", 0.79), _run(256, "warm", 0.78),
             _run(1024, "same", 0.50), _run(1024, "linear", 0.10, diverged=True),
             _run(1024, "warm", 0.781)]
    v = {x.policy: x for x in scaling.verdicts(runs, base_batch=64, tol=0.02)}
    assert list(v) == ["same", "linear", "warm"]
    assert (v["same"].held_up_to, v["same"].broke_at, v["same"].how) == (64, 256, "fell behind")
    assert (v["linear"].held_up_to, v["linear"].broke_at, v["linear"].how) == (256, 1024, "diverged")
    assert (v["warm"].held_up_to, v["warm"].broke_at, v["warm"].how) == (1024, None, None)
    assert v["warm"].acc_at_largest == 0.781


def test_a_policy_that_recovers_after_breaking_still_broke_first():
    runs = [_run(64, "p", 0.8), _run(128, "p", 0.6), _run(256, "p", 0.8)]
    (v,) = scaling.verdicts(runs, base_batch=64, tol=0.05)
    assert (v.held_up_to, v.broke_at, v.how) == (64, 128, "fell behind")


def test_a_diverged_run_never_holds_even_at_a_lucky_accuracy():
    runs = [_run(64, "p", 0.1), _run(128, "p", 0.1, diverged=True)]
    (v,) = scaling.verdicts(runs, base_batch=64, tol=0.05)
    assert (v.held_up_to, v.broke_at, v.how) == (64, 128, "diverged")


def test_verdicts_need_the_base_batch():
    with pytest.raises(ValueError, match="no run at the base batch 64"):
        scaling.verdicts([_run(128, "p", 0.5)], base_batch=64, tol=0.02)

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
    with pytest.raises(ValueError, match="must be >= 0"):
        scaling.lr_schedule("same", 0.1, 64, 64, 3, decay_steps=-1)
    with pytest.raises(ValueError, match="decay must be in"):
        scaling.lr_schedule("same", 0.1, 64, 64, 3, decay_steps=1, decay=0)


def test_the_step_decay_divides_the_last_steps_after_warm_up_and_target():
    lrs = scaling.lr_schedule("linear", 0.1, 64, 256, num_steps=6, warmup_steps=2, decay_steps=2)
    assert lrs == pytest.approx([0.1, 0.25, 0.4, 0.4, 0.04, 0.04])
    # a decay that reaches into the warm-up divides the warm-up's rate there
    lrs = scaling.lr_schedule("linear", 0.1, 64, 256, num_steps=3, warmup_steps=2,
                              decay_steps=2, decay=0.5)
    assert lrs == pytest.approx([0.1, 0.125, 0.2])
    assert scaling.POLICIES[0].schedule(0.1, 64, 256, 3, 1, decay_steps=1) == \
        pytest.approx([0.1, 0.1, 0.01])


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
    assert s.epochs >= 1 and s.base_lr > 0 and s.warmup_epochs > 0 and s.decay_epochs > 0
    assert s.warmup_epochs + s.decay_epochs <= s.epochs and s.seeds >= 2 and 0 <= s.momentum < 1
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


def test_summarize_groups_the_seeds_and_refuses_a_repeated_seed():
    runs = [dict(batch=64, policy="p", seed=s, test_acc=a, diverged=False)
            for s, a in ((1, 0.7), (0, 0.8), (2, 0.9))]
    runs.append(dict(batch=128, policy="p", seed=0, test_acc=0.1, diverged=True))
    t = scaling.summarize(runs)
    assert list(t) == [(64, "p"), (128, "p")]
    s = t[64, "p"]
    assert s.accs == (0.8, 0.7, 0.9) and s.diverged == 0            # in seed order
    assert (s.mean, s.low, s.high) == (pytest.approx(0.8), 0.7, 0.9)
    assert t[128, "p"].diverged == 1
    with pytest.raises(ValueError, match="seed .* repeats"):
        scaling.summarize(runs + [dict(runs[0])])


def test_verdicts_read_the_mean_of_the_seeds_and_any_divergence_breaks():
    def runs(batch, policy, accs, diverged=()):
        return [dict(batch=batch, policy=policy, seed=i, test_acc=a, diverged=i in diverged)
                for i, a in enumerate(accs)]
    sweep = (runs(64, "p", [0.80, 0.82]) + runs(64, "q", [0.80, 0.82])
             + runs(128, "p", [0.78, 0.82])            # mean 0.80 >= 0.81 - 0.02: held
             + runs(128, "q", [0.85, 0.85], diverged=(1,)))   # one seed diverged: broke
    v = {x.policy: x for x in scaling.verdicts(sweep, base_batch=64, tol=0.02)}
    assert (v["p"].held_up_to, v["p"].broke_at) == (128, None)
    assert v["p"].acc_at_largest == pytest.approx(0.80)
    assert (v["q"].held_up_to, v["q"].broke_at, v["q"].how) == (64, 128, "diverged")


def test_plot_gaps_draws_every_policy_with_the_seeds_range():
    import matplotlib
    matplotlib.use("Agg")
    pol = scaling.POLICIES[:2]
    sweep = [dict(batch=b, policy=p.name, seed=s, test_acc=0.8 - 0.1 * (b == 128) + 0.01 * s,
                  diverged=False) for b in (64, 128) for p in pol for s in range(3)]
    ax = scaling.plot_gaps(scaling.summarize(sweep), (64, 128), 64, policies=pol, title="t")
    bars = ax.containers                       # one errorbar container per policy
    assert [c.get_label() for c in bars] == [p.name for p in pol]
    assert list(bars[0].lines[0].get_ydata()) == pytest.approx([0.0, -10.0])  # points below B = 64
    segs = bars[0].lines[2][0].get_segments()  # the bar: lowest to highest seed, in points
    assert [seg[1][1] - seg[0][1] for seg in segs] == pytest.approx([2.0, 2.0])
    assert [t.get_text() for t in ax.get_legend().get_texts()][:1] == ["seeds at B = 64"]


def test_verdicts_need_the_base_batch():
    with pytest.raises(ValueError, match="no run at the base batch 64"):
        scaling.verdicts([_run(128, "p", 0.5)], base_batch=64, tol=0.02)


def _page_tables(S, summary, schedule):
    """The two tables as the batch-size page built them inline before they moved here."""
    lines = ['| B | k | steps per epoch | steps | warm-up steps | decay steps | peak lr: same | linear | sqrt |',
             '|---' * 9 + '|']
    for B in S.batch_sizes:
        spe = S.train_samples // B
        peaks = [max(schedule(B, p)) for p in scaling.POLICIES if p.name in ('same lr', 'linear', 'sqrt')]
        lines.append(f'| {B} | {B // S.base_batch} | {spe} | {S.epochs * spe} | '
                     f'{round(S.warmup_epochs * spe)} | {round(S.decay_epochs * spe)} | '
                     + ' | '.join(f'{lr:.4g}' for lr in peaks) + ' |')
    first = '\n'.join(lines)

    def cell(s):
        return (f'{s.mean:.3f} ({s.low:.3f}–{s.high:.3f})'
                + (f', {s.diverged} diverged' if s.diverged else ''))
    lines = ['| B | k | steps/epoch | ' + ' | '.join(p.name for p in scaling.POLICIES) + ' |',
             '|---' * (3 + len(scaling.POLICIES)) + '|']
    for B in S.batch_sizes:
        lines.append(f'| {B} | {B // S.base_batch} | {S.train_samples // B} | '
                     + ' | '.join(cell(summary[B, p.name]) for p in scaling.POLICIES) + ' |')
    return first, '\n'.join(lines)


@pytest.mark.parametrize("profile", ["smoke", "cpu", "gpu"])
def test_the_pages_tables_are_built_by_the_module_as_they_were_inline(profile):
    import random
    import d2lmini
    S = d2lmini.get_profile(profile).scaling

    def schedule(B, policy):
        spe = S.train_samples // B
        return policy.schedule(S.base_lr, S.base_batch, B, S.epochs * spe,
                               round(S.warmup_epochs * spe), round(S.decay_epochs * spe))
    rng = random.Random(0)
    runs = [dict(batch=B, policy=p.name, seed=s, test_acc=rng.random(), diverged=rng.random() < 0.2)
            for B in S.batch_sizes for p in scaling.POLICIES for s in range(3)]
    summary = scaling.summarize(runs)
    assert any(s.diverged for s in summary.values())          # both kinds of cell are built
    expected = _page_tables(S, summary, schedule)
    assert (scaling.schedule_table(S, schedule), scaling.summary_table(summary, S)) == expected
    assert scaling.summary_table(summary, S).count("\n") == len(S.batch_sizes) + 1

"""Learning rate against batch size: the scaling rules and the warm-up of the batch-size page.

Framework-neutral: plain Python numbers, no deep-learning framework.

A data-parallel step on ``k`` devices with ``b`` examples each is the one-device step on a
global batch of ``B = k * b`` (the from-scratch chapter proves it).  So adding devices changes
the batch size, and with it the question of the learning rate:

``same``    keep the base rate ``base_lr`` whatever the batch;
``linear``  ``base_lr * B / base_batch`` (Goyal et al., 2017, "Accurate, Large Minibatch SGD:
            Training ImageNet in 1 Hour", the *linear scaling rule*);
``sqrt``    ``base_lr * sqrt(B / base_batch)`` (keeps the variance of the update fixed).

A *gradual warm-up* (same paper) starts at ``base_lr`` and raises the rate by a constant
amount every step until it reaches the scaled rate after ``warmup_steps`` steps.  A *step
decay* (same paper, which divides the rate by 10 three times in 90 epochs) multiplies the rate
of the last ``decay_steps`` steps by ``decay``.

A sweep trains every (batch, policy) with several seeds; :func:`summarize` gives each the mean
and range of its test accuracy, and :func:`verdicts` reads the means.
"""
from __future__ import annotations

import dataclasses
import math

__all__ = ["RULES", "Policy", "POLICIES", "Summary", "Verdict", "scaled_lr", "lr_schedule",
           "summarize", "verdicts", "plot_gaps", "schedule_table", "summary_table",
           "hold_margin"]

RULES = ("same", "linear", "sqrt")


def scaled_lr(rule: str, base_lr: float, base_batch: int, batch: int) -> float:
    """The learning rate that ``rule`` gives a batch of ``batch`` examples, when
    ``base_lr`` is the rate of a batch of ``base_batch``."""
    if rule not in RULES:
        raise ValueError(f"unknown scaling rule {rule!r}; choose one of {', '.join(RULES)}")
    if base_batch < 1 or batch < 1:
        raise ValueError(f"batch sizes must be >= 1, got base_batch={base_batch}, batch={batch}")
    if not base_lr > 0:
        raise ValueError(f"base_lr must be positive, got {base_lr}")
    ratio = batch / base_batch
    return {"same": base_lr, "linear": base_lr * ratio, "sqrt": base_lr * math.sqrt(ratio)}[rule]


def lr_schedule(rule: str, base_lr: float, base_batch: int, batch: int, num_steps: int,
                warmup_steps: int = 0, decay_steps: int = 0, decay: float = 0.1) -> list[float]:
    """The learning rate of each of ``num_steps`` steps.

    Without warm-up every step uses ``target = scaled_lr(rule, base_lr, base_batch, batch)``.
    With ``warmup_steps = w > 0``, step ``t < w`` uses ``base_lr + (target - base_lr) * t / w``:
    the small-batch rate at step 0, a constant increment per step, the target from step ``w``
    on (Goyal et al.'s gradual warm-up).  The last ``decay_steps`` steps then run at ``decay``
    times that rate (their step decay).
    """
    if num_steps < 0 or warmup_steps < 0 or decay_steps < 0:
        raise ValueError(f"num_steps, warmup_steps and decay_steps must be >= 0, got "
                         f"{num_steps}, {warmup_steps}, {decay_steps}")
    if not 0 < decay <= 1:
        raise ValueError(f"decay must be in (0, 1], got {decay}")
    target = scaled_lr(rule, base_lr, base_batch, batch)
    lrs = [base_lr + (target - base_lr) * t / warmup_steps if t < warmup_steps else target
           for t in range(num_steps)]
    return [lr * decay if t >= num_steps - decay_steps else lr for t, lr in enumerate(lrs)]


@dataclasses.dataclass(frozen=True)
class Policy:
    """How a run picks its learning rate: a scaling rule, with or without warm-up."""
    name: str
    rule: str
    warmup: bool = False

    def schedule(self, base_lr: float, base_batch: int, batch: int, num_steps: int,
                 warmup_steps: int, decay_steps: int = 0, decay: float = 0.1) -> list[float]:
        return lr_schedule(self.rule, base_lr, base_batch, batch, num_steps,
                           warmup_steps if self.warmup else 0, decay_steps, decay)


# The four policies the batch-size page compares, in the order of its tables and plots.
POLICIES = (Policy("same lr", "same"), Policy("linear", "linear"),
            Policy("linear + warm-up", "linear", warmup=True), Policy("sqrt", "sqrt"))


@dataclasses.dataclass(frozen=True)
class Summary:
    """The runs of one (batch, policy) over its seeds."""
    batch: int
    policy: str
    accs: tuple                 # test accuracy of each seed's run, in seed order
    diverged: int               # how many of the runs diverged

    @property
    def mean(self) -> float:
        return sum(self.accs) / len(self.accs)

    @property
    def low(self) -> float:
        return min(self.accs)

    @property
    def high(self) -> float:
        return max(self.accs)


def summarize(runs: list[dict]) -> dict:
    """``{(batch, policy): Summary}`` over the seeds of ``runs`` (dicts with ``batch``,
    ``policy``, ``test_acc``, ``diverged`` and optionally ``seed``), in the order of first
    appearance.  Two runs of one (batch, policy) with the same seed are refused."""
    groups: dict = {}
    for r in runs:
        groups.setdefault((r["batch"], r["policy"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        seeds = [r.get("seed", 0) for r in rs]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"batch {key[0]}, policy {key[1]!r}: the seed {seeds} repeats")
        rs = sorted(rs, key=lambda r: r.get("seed", 0))
        out[key] = Summary(key[0], key[1], tuple(r["test_acc"] for r in rs),
                           sum(bool(r["diverged"]) for r in rs))
    return out


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What a sweep says about one policy (see :func:`verdicts`)."""
    policy: str
    held_up_to: int | None      # largest batch up to which every run held the base accuracy
    broke_at: int | None        # first batch that did not hold, or None
    how: str | None             # "diverged" (loss not finite) or "fell behind", or None
    acc_at_largest: float       # mean test accuracy at the largest batch


def verdicts(runs: list[dict], base_batch: int, tol: float) -> list[Verdict]:
    """Read a sweep: for each policy, up to which batch size it *held accuracy*.

    ``runs``: dicts with ``batch``, ``policy``, ``test_acc``, ``diverged`` (bool) and
    optionally ``seed``, one per (batch, policy, seed) and including the base batch.  A
    (batch, policy) holds accuracy when none of its runs diverged and its mean test accuracy
    over the seeds is at least the base batch's mean minus ``tol``.  A policy holds *up to*
    batch B when every batch from the base up to B held; the first batch that did not is
    where it broke.  Policies keep the order of their first run.
    """
    table = summarize(runs)
    base = [s for (b, _), s in table.items() if b == base_batch]
    if not base:
        raise ValueError(f"the sweep has no run at the base batch {base_batch}")
    reference = max(s.mean for s in base)
    policies = list(dict.fromkeys(p for _, p in table))
    out = []
    for name in policies:
        mine = sorted((s for (_, p), s in table.items() if p == name), key=lambda s: s.batch)
        held, broke, how = None, None, None
        for s in mine:
            ok = not s.diverged and s.mean >= reference - tol
            if not ok:
                broke, how = s.batch, "diverged" if s.diverged else "fell behind"
                break
            held = s.batch
        out.append(Verdict(name, held, broke, how, mine[-1].mean))
    return out


def plot_gaps(summary: dict, batch_sizes, base_batch: int, policies=POLICIES, ax=None,
              title=None):
    """The sweep as a figure: for every policy, the mean test accuracy over the seeds minus
    that of ``base_batch``, in points, against the global batch, with a bar from the lowest
    to the highest seed; a grey band spans the base batch's own seeds."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.6))
    base = summary[base_batch, policies[0].name]
    ax.axhspan(100 * (base.low - base.mean), 100 * (base.high - base.mean), color="0.88",
               label=f"seeds at B = {base_batch}")
    ax.axhline(0, color="0.5", lw=0.8)
    for i, (p, fmt) in enumerate(zip(policies, ("o-", "s--", "^-.", "D:", "v-", "x--"))):
        rows = [summary[b, p.name] for b in batch_sizes]
        shift = 1.035 ** (i - (len(policies) - 1) / 2)      # side by side on the log axis
        ax.errorbar([b * shift for b in batch_sizes], [100 * (s.mean - base.mean) for s in rows],
                    yerr=[[100 * (s.mean - s.low) for s in rows],
                          [100 * (s.high - s.mean) for s in rows]],
                    fmt=fmt, capsize=3, ms=4, label=p.name)
    ax.set_xscale("log")
    ax.set_xticks(list(batch_sizes), [str(b) for b in batch_sizes])
    ax.minorticks_off()
    ax.set_xlabel("global batch size B")
    ax.set_ylabel(f"test accuracy minus B = {base_batch}\n(points)")
    ax.grid(True, alpha=0.4)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def schedule_table(S, schedule) -> str:
    """The sweep's schedules as a Markdown table: for every global batch of ``S`` (the
    profile's ``scaling`` settings), the steps, the warm-up and decay steps and the peak
    learning rate of the three rules; ``schedule(batch, policy)`` gives a run's rates."""
    from .tables import markdown
    body = []
    for B in S.batch_sizes:
        spe = S.train_samples // B
        peaks = [max(schedule(B, p)) for p in POLICIES if p.name in ("same lr", "linear", "sqrt")]
        body.append([B, B // S.base_batch, spe, S.epochs * spe, round(S.warmup_epochs * spe),
                     round(S.decay_epochs * spe)] + [f"{lr:.4g}" for lr in peaks])
    return markdown(["B", "k", "steps per epoch", "steps", "warm-up steps", "decay steps",
                     "peak lr: same", "linear", "sqrt"], body)


def summary_table(summary: dict, S, policies=POLICIES) -> str:
    """:func:`summarize`'s result as a Markdown table: a row per global batch, a column per
    policy, the mean test accuracy of the seeds with the lowest and highest in brackets."""
    from .tables import markdown

    def cell(s: Summary) -> str:
        return (f"{s.mean:.3f} ({s.low:.3f}–{s.high:.3f})"
                + (f", {s.diverged} diverged" if s.diverged else ""))
    return markdown(["B", "k", "steps/epoch"] + [p.name for p in policies],
                    [[B, B // S.base_batch, S.train_samples // B]
                     + [cell(summary[B, p.name]) for p in policies] for B in S.batch_sizes])


def hold_margin(S) -> float:
    """The accuracy a larger batch may lose against the base batch and still *hold* it, in the
    sweep's settings ``S`` (``d2lmini.settings("scaling")``): two points, 0.02, in every setting.
    The batch-size page passes it to :func:`verdicts`."""
    return S.hold_tol

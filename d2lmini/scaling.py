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
amount every step until it reaches the scaled rate after ``warmup_steps`` steps.
"""
from __future__ import annotations

import dataclasses
import math

__all__ = ["RULES", "Policy", "POLICIES", "Verdict", "scaled_lr", "lr_schedule", "verdicts"]

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
                warmup_steps: int = 0) -> list[float]:
    """The learning rate of each of ``num_steps`` steps.

    Without warm-up every step uses ``scaled_lr(rule, base_lr, base_batch, batch)``.  With
    ``warmup_steps = w > 0``, step ``t < w`` uses ``base_lr + (target - base_lr) * t / w``:
    the small-batch rate at step 0, a constant increment per step, the target from step ``w``
    on (Goyal et al.'s gradual warm-up).
    """
    if num_steps < 0 or warmup_steps < 0:
        raise ValueError(f"num_steps and warmup_steps must be >= 0, got {num_steps}, "
                         f"{warmup_steps}")
    target = scaled_lr(rule, base_lr, base_batch, batch)
    return [base_lr + (target - base_lr) * t / warmup_steps if t < warmup_steps else target
            for t in range(num_steps)]


@dataclasses.dataclass(frozen=True)
class Policy:
    """How a run picks its learning rate: a scaling rule, with or without warm-up."""
    name: str
    rule: str
    warmup: bool = False

    def schedule(self, base_lr: float, base_batch: int, batch: int, num_steps: int,
                 warmup_steps: int) -> list[float]:
        return lr_schedule(self.rule, base_lr, base_batch, batch, num_steps,
                           warmup_steps if self.warmup else 0)


# The four policies the batch-size page compares, in the order of its tables and plots.
POLICIES = (Policy("same lr", "same"), Policy("linear", "linear"),
            Policy("linear + warm-up", "linear", warmup=True), Policy("sqrt", "sqrt"))


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What a sweep says about one policy (see :func:`verdicts`)."""
    policy: str
    held_up_to: int | None      # largest batch up to which every run held the base accuracy
    broke_at: int | None        # first batch that did not hold, or None
    how: str | None             # "diverged" (loss not finite) or "fell behind", or None
    acc_at_largest: float       # test accuracy at the largest batch


def verdicts(runs: list[dict], base_batch: int, tol: float) -> list[Verdict]:
    """Read a sweep: for each policy, up to which batch size it *held accuracy*.

    ``runs``: dicts with ``batch``, ``policy``, ``test_acc`` and ``diverged`` (bool), one per
    (batch, policy) and including the base batch.  A run holds accuracy when it did not
    diverge and its test accuracy is at least the base batch's minus ``tol``.  A policy
    holds *up to* batch B when every batch from the base up to B held; the first batch that
    did not is where it broke.  Policies keep the order of their first run.
    """
    base = [r for r in runs if r["batch"] == base_batch]
    if not base:
        raise ValueError(f"the sweep has no run at the base batch {base_batch}")
    reference = max(r["test_acc"] for r in base)
    policies = list(dict.fromkeys(r["policy"] for r in runs))
    out = []
    for name in policies:
        mine = sorted((r for r in runs if r["policy"] == name), key=lambda r: r["batch"])
        held, broke, how = None, None, None
        for r in mine:
            ok = not r["diverged"] and r["test_acc"] >= reference - tol
            if not ok:
                broke, how = r["batch"], "diverged" if r["diverged"] else "fell behind"
                break
            held = r["batch"]
        out.append(Verdict(name, held, broke, how, mine[-1]["test_acc"]))
    return out

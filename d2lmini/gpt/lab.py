"""What the GPT chapter's four labs share, written once (NumPy only).

Each lab (``chapters/gpt/<framework>.ipynb``) builds the model, the data-parallel step, the
training loop and its measurements in its framework's arrays; what is the same for every
framework lives here: the lesson's settings (so no lab cell reads the profile), the batches
in tokens, the proofs' verdict lines, the summary line of a run, and the loss targets.  The
formulas (parameters, FLOPs, activations, logits, ZeRO state) are :mod:`d2lmini.gpt.cost`'s,
shown on the chapter's neutral page (``chapters/gpt/model.ipynb``).

Add a function here (append, never rewrite) when a second lab would otherwise copy it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .corpus import AustenCorpus, WindowSampler, eval_windows, load_corpus
from .spec import GPTConfig, param_count

#: The proofs compare float64 gradients and parameters; sums in another order differ by a few
#: ulps of float64, far below this.
PROOF_ATOL = 1e-9


@dataclass(frozen=True)
class Lesson:
    """The GPT lab's settings: the model, the global batch, the run and its target."""
    cfg: GPTConfig
    batch_size: int              # sequences per global batch (split over the devices)
    steps: int                   # AdamW steps of the training run
    lr: float
    eval_sequences: int          # held-out windows the validation loss averages over
    expected_val_loss: float | None   # from a committed rehearsal (None: not rehearsed)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.cfg.context

    def __str__(self) -> str:
        c = self.cfg
        return (f"GPT: {c.layers} layers, width {c.width}, {c.heads} heads, context {c.context}, "
                f"{c.vocab} characters: {param_count(c):,} parameters\n"
                f"training: {self.steps:,} AdamW steps at lr {self.lr:g}, {self.batch_size} "
                f"sequences ({self.tokens_per_step:,} tokens) per step")


def lesson(profile=None) -> Lesson:
    """The settings the labs train with (the profile's ``gpt`` section, default
    :func:`d2lmini.get_profile`'s)."""
    from ..config import get_profile
    from . import profile_config
    p = profile or get_profile()
    hp = p.gpt
    return Lesson(cfg=profile_config(p), batch_size=hp.batch_size, steps=hp.steps, lr=hp.lr,
                  eval_sequences=max(8, 4 * hp.batch_size), expected_val_loss=hp.expected_val_loss)


def corpus_batches(lesson: Lesson, seed: int = 0) -> tuple[AustenCorpus, WindowSampler, tuple]:
    """The corpus, a reproducible sampler of training windows (``sampler(step)`` gives
    ``(x, y)`` of ``lesson.batch_size`` sequences, int64) and the held-out windows ``(xv, yv)``."""
    corpus = load_corpus()
    sampler = WindowSampler(corpus.train_ids, lesson.batch_size, lesson.cfg.context, seed=seed)
    held_out = eval_windows(corpus.val_ids, lesson.cfg.context, lesson.eval_sequences)
    return corpus, sampler, held_out


def token_shards(batch: int, context: int, k: int) -> list[int]:
    """Tokens on each of k devices when a batch of ``batch`` sequences is split by sequence
    (sizes differ by at most one sequence).  A batch smaller than k is refused: some device
    would have nothing to compute."""
    if batch < k:
        raise ValueError(f"a batch of {batch} sequences cannot be split over {k} devices: "
                         f"use at least {k} sequences per step, or fewer devices")
    q, r = divmod(batch, k)
    return [(q + (i < r)) * context for i in range(k)]


def proof_lines(diffs: dict, atol: float = PROOF_ATOL) -> str:
    """The verdicts of a lab's proofs: ``diffs`` maps a claim ("k-device gradients == 1-device
    gradients", ...) to the largest absolute difference measured (float64), each held to
    ``atol``."""
    return "\n".join(f"{claim}: {diff <= atol}" for claim, diff in diffs.items())


def run_summary(run: dict) -> str:
    """One line per run, the same in every lab: ``run`` holds ``steps``, ``train_loss``,
    ``val_loss``, ``devices``, ``seconds`` and ``tokens`` (tokens trained on)."""
    return (f"step {run['steps']}: train loss {run['train_loss']:.3f}, val loss "
            f"{run['val_loss']:.3f} nats/char ({run['devices']} devices, {run['seconds']:.0f} s, "
            f"{run['tokens'] / max(run['seconds'], 1e-9):,.0f} tokens/s on this machine)")


def uniform_loss(cfg: GPTConfig) -> float:
    """The loss of a model that knows nothing: ln(vocabulary), in nats."""
    return math.log(cfg.vocab)


def learned(run: dict, lesson: Lesson, margin: float = 0.15) -> bool:
    """Whether a run has learned what its settings promise: its validation loss below the
    uniform loss by a clear margin, and, where a rehearsal stated the expected loss, within
    ``margin`` nats above it."""
    if not np.isfinite(run["val_loss"]) or run["val_loss"] >= uniform_loss(lesson.cfg) - 0.3:
        return False
    return lesson.expected_val_loss is None or run["val_loss"] <= lesson.expected_val_loss + margin


#: AdamW steps of a lab's mixed-precision comparison: a bfloat16 run and its float32 twin from
#: the same weights on the same batches.  A few: PyTorch emulates bfloat16 on a CPU without
#: AVX-512 (5-12x slower than float32), and the first steps are where the loss moves most.
PRECISION_STEPS = 20

#: The largest difference, in nats per character, allowed between the losses of the bfloat16
#: run and its float32 twin at any of their :func:`precision_steps` steps.  bfloat16 keeps 8
#: bits of mantissa (a relative rounding of 2^-9); seen (PyTorch on the CPU, 2026-11-29):
#: 7e-4 with the quick regression settings, 1.8e-3 with the CPU settings' model (AVX2 and
#: AVX-512 alike), so 0.05 is a bound, not a fit; a float16 run without loss scaling, or a
#: model computing in the wrong dtype, is off by far more.
BF16_LOSS_TOL = 0.05


def precision_steps(lesson: Lesson) -> int:
    """AdamW steps of the mixed-precision comparison: :data:`PRECISION_STEPS`, or the run's
    ``lesson.steps`` if fewer."""
    return min(lesson.steps, PRECISION_STEPS)

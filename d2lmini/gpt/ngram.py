"""Character n-gram entropies: the reference numbers a character-level model's loss is read
against, in nats per character (the unit of the models' cross-entropy loss).

* :func:`ngram_entropy` -- the plug-in conditional entropy of one token sequence,
  H(X_n | X_1..X_{n-1}) estimated from that sequence's own n-gram counts.  In-sample: it is
  what an n-gram table fitted to *this very text* would score, a lower bound for such a model
  on unseen text (n = 1: the unigram entropy).
* :func:`ngram_cross_entropy` -- held out: an n-gram model fitted to ``train`` (interpolated
  absolute discounting, Ney et al. 1994, discount 0.75, down to a uniform distribution over
  the vocabulary) scored on ``test``.  This is the baseline a transformer trained on the
  training split should beat on the validation split.
"""
from __future__ import annotations

import numpy as np

__all__ = ["ngram_entropy", "ngram_cross_entropy", "entropy_table"]


def _codes(ids: np.ndarray, n: int, vocab: int) -> np.ndarray:
    """Each window of n consecutive ids as one integer (base ``vocab``)."""
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) < n:
        raise ValueError(f"{len(ids)} tokens hold no {n}-gram")
    m = len(ids) - n + 1
    code = np.zeros(m, np.int64)
    for j in range(n):
        code = code * vocab + ids[j:j + m]
    return code


def _check(ids, n: int, vocab: int | None) -> int:
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    vocab = int(np.max(ids)) + 1 if vocab is None else vocab
    if vocab ** n > 2 ** 40:
        raise ValueError(f"{vocab}^{n} n-grams are too many to count")
    return vocab


def ngram_entropy(ids, n: int, vocab: int | None = None) -> float:
    """Plug-in conditional entropy H(X_n | X_1..X_{n-1}) of the sequence ``ids`` in nats per
    token: ``-sum c(h, x) / N * ln(c(h, x) / c(h))`` over its n-grams (h, x), N of them.
    ``vocab`` defaults to ``max(ids) + 1``."""
    vocab = _check(ids, n, vocab)
    codes, counts = np.unique(_codes(ids, n, vocab), return_counts=True)
    c = counts.astype(np.float64)
    if n == 1:
        p = c / c.sum()
        return float(-(p * np.log(p)).sum())
    _, inverse = np.unique(codes // vocab, return_inverse=True)
    ctx = np.bincount(inverse, weights=c)                 # c(h) over the n-grams' contexts
    return float(-(c * np.log(c / ctx[inverse])).sum() / c.sum())


def ngram_cross_entropy(train, test, n: int, vocab: int | None = None,
                        discount: float = 0.75) -> float:
    """Mean ``-ln p(x | h)`` in nats per token over the n-grams of ``test`` under an n-gram
    model of ``train`` with interpolated absolute discounting:
    ``p_k(x | h) = max(c(h, x) - D, 0) / c(h) + D * t(h) / c(h) * p_{k-1}(x | h')``, where t(h)
    is the number of distinct tokens seen after h and h' drops h's oldest token; p_0 is
    uniform over ``vocab`` (default ``max(ids) + 1`` of both) and an unseen context falls back
    to p_{k-1}.  The first n - 1 tokens of ``test`` are context only."""
    vocab = _check(np.concatenate([np.asarray(train), np.asarray(test)]), n, vocab)
    if not 0 < discount < 1:
        raise ValueError(f"discount must lie in (0, 1), got {discount}")
    test_codes = _codes(test, n, vocab)
    p = np.full(len(test_codes), 1.0 / vocab)
    for k in range(1, n + 1):                             # orders 1..n, lowest first
        grams, counts = np.unique(_codes(train, k, vocab), return_counts=True)
        hist, inverse = np.unique(grams // vocab, return_inverse=True)
        total = np.bincount(inverse, weights=counts)
        types = np.bincount(inverse)
        q = test_codes % vocab ** k                       # the test's last k tokens
        i = np.clip(np.searchsorted(grams, q), 0, len(grams) - 1)
        c = np.where(grams[i] == q, counts[i], 0)
        j = np.clip(np.searchsorted(hist, q // vocab), 0, len(hist) - 1)
        seen = hist[j] == q // vocab
        mass = np.where(seen, total[j], 1.0)
        p = np.where(seen, (np.maximum(c - discount, 0) + discount * types[j] * p) / mass, p)
    return float(-np.log(p).mean())


def entropy_table(train, val, orders=(1, 2, 3), vocab: int | None = None) -> list[dict]:
    """``[{"n", "val_entropy", "heldout_cross_entropy"}, ...]`` in nats per character:
    :func:`ngram_entropy` of ``val`` and :func:`ngram_cross_entropy` of ``train`` -> ``val``."""
    return [{"n": n, "val_entropy": ngram_entropy(val, n, vocab),
             "heldout_cross_entropy": ngram_cross_entropy(train, val, n, vocab)}
            for n in orders]

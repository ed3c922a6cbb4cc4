"""Framework-free references that multi-process runs are checked against."""
from __future__ import annotations

import numpy as np

__all__ = ["softmax_regression_gd"]


def softmax_regression_gd(X: np.ndarray, y: np.ndarray, steps: int, batch: int, lr: float):
    """Minibatch gradient descent for softmax regression on ONE process, in NumPy.

    Batch ``s`` is ``X[s*batch:(s+1)*batch]``; the loss is the mean cross-entropy of the
    batch; weights start at zero.  Returns ``(W, b)`` as float32.  Data-parallel runs on any
    number of processes and devices must reproduce it up to float32 rounding.
    """
    X = np.asarray(X, np.float32).reshape(len(X), -1)
    W = np.zeros((X.shape[1], 10), np.float32)
    b = np.zeros(10, np.float32)
    for s in range(steps):
        Xb, yb = X[s * batch:(s + 1) * batch], np.asarray(y[s * batch:(s + 1) * batch])
        z = Xb @ W + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(yb)), yb] -= 1.0          # d(sum of cross-entropies)/dz
        W -= lr * (Xb.T @ p) / len(yb)
        b -= lr * p.sum(0) / len(yb)
    return W, b

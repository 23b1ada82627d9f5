"""Losses and metrics: log-softmax, softmax, softmax cross-entropy, MSE (on SymbolVars) and
accuracy (on computed values)."""

from __future__ import annotations

import numpy as np

import megbrain as mgb

__all__ = ["log_softmax", "softmax", "cross_entropy", "mse_loss", "accuracy"]


def log_softmax(logits, axis: int = 1):
    """``x - logsumexp(x)`` along ``axis``, stable for large logits.

    The row maximum is subtracted first; its gradient is blocked (``zero_grad``), which is
    exact because logsumexp's gradient does not depend on the shift.
    """
    m = mgb.opr.zero_grad(logits.max(axis=axis, keepdims=True))
    shifted = logits - m
    lse = mgb.opr.elem.log(mgb.opr.elem.exp(shifted).sum(axis=axis, keepdims=True))
    return shifted - lse


def softmax(logits, axis: int = 1):
    """``exp(log_softmax(logits))`` along ``axis``."""
    return mgb.opr.elem.exp(log_softmax(logits, axis))


def cross_entropy(logits, target):
    """Mean softmax cross-entropy of (N, K) ``logits``.

    Parameters
    ----------
    logits : SymbolVar
        Unnormalized (N, K) scores; any magnitude (computed through :func:`log_softmax`).
    target : SymbolVar
        (N, K) float targets (one-hot or soft labels), or (N,) integer class labels.
    """
    logp = log_softmax(logits, axis=1)
    if target.dtype.kind in "iu":
        return -mgb.opr.indexing_one_hot(logp, 1, target).mean()
    return -(logp * target).sum(axis=1).mean()


def mse_loss(pred, target):
    """Mean squared error over all elements."""
    d = pred - target
    return (d * d).mean()


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of rows whose argmax equals the label (on computed values)."""
    return float(np.mean(np.argmax(logits, axis=1) == np.asarray(labels)))

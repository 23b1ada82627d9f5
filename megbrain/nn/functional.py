"""Losses and metrics on SymbolVars."""

from __future__ import annotations

import numpy as np

import megbrain as mgb

__all__ = ["log_softmax", "softmax", "cross_entropy", "mse_loss", "accuracy"]


def log_softmax(logits, axis: int = 1):
    """``x - logsumexp(x)`` along ``axis``, stable for large logits."""
    m = mgb.opr.zero_grad(logits.max(axis=axis, keepdims=True))
    shifted = logits - m
    lse = mgb.opr.elem.log(mgb.opr.elem.exp(shifted).sum(axis=axis, keepdims=True))
    return shifted - lse


def softmax(logits, axis: int = 1):
    return mgb.opr.elem.exp(log_softmax(logits, axis))


def cross_entropy(logits, onehot):
    """Mean softmax cross-entropy of (N, K) logits against (N, K) one-hot targets."""
    return -(log_softmax(logits) * onehot).sum(axis=1).mean()


def mse_loss(pred, target):
    """Mean squared error."""
    d = pred - target
    return (d * d).mean()


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of rows whose argmax equals the label (on computed values)."""
    return float(np.mean(np.argmax(logits, axis=1) == np.asarray(labels)))

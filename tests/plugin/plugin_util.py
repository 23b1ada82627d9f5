"""Small graphs the plugin tests run."""

from __future__ import annotations

import numpy as np

import megbrain as mgb


def chain(g, n: int = 30, shape=(4,), name: str = "x"):
    """``x`` and a chain of ``n`` elementwise operators on it (ADD/MUL alternating)."""
    x = mgb.make_arg("cpu0", g, shape=shape, name=name)
    y = x
    for i in range(n):
        y = y * 1.0001 if i % 2 else y + 0.5
    return x, y


def core(func):
    """The graph-level executable of an API function."""
    return func._func


def seq_ids(func) -> set[int]:
    return {o.id for o in core(func).iter_opr_seq()}


def arange(n: int, dtype="float32"):
    return np.arange(n, dtype=dtype)

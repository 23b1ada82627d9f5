"""Binding hint: whether the filter a convolution is being bound to is constant.

An algorithm that rearranges its filter before computing (:mod:`.nchw8c` packs it in
blocks of 16 output channels) can do so once, at its step's first run, instead of on every
run, when the filter's values never change between runs. Only the operator knows that (its
filter var is an ImmutableTensor, or a parameter under the graph option
``graph_opt.weight_preprocess``), so it binds inside :func:`constant_filter`; an algorithm
reads :func:`filter_is_constant` while it is being bound (and HEURISTIC, choosing it), as
kernels read their workspace allocator (:mod:`workspace`).
"""

from __future__ import annotations

import contextlib
import threading

__all__ = ["constant_filter", "filter_is_constant"]

_state = threading.local()


@contextlib.contextmanager
def constant_filter(constant: bool = True):
    """Convolutions chosen and bound in this block (on this thread) may take their filter
    operand as constant: its values at the bound step's first run stay its values."""
    prev = getattr(_state, "constant", False)
    _state.constant = bool(constant)
    try:
        yield
    finally:
        _state.constant = prev


def filter_is_constant() -> bool:
    """Whether the convolution being chosen or bound has a constant filter
    (:func:`constant_filter`); False outside such a block."""
    return getattr(_state, "constant", False)

"""Workspaces: scratch buffers a kernel needs only while it runs.

Kernels allocate such buffers with :func:`empty` when they are bound. By default that is
an :func:`aligned` array; the executor binds inside :func:`allocating` twice: once with a
:class:`Recorder` to learn the workspace size (the operator's declaration to the memory
plan), then with a :class:`Carver` handing out pieces of the planned chunk. A workspace
buffer must be fully written on every run before it is read (its memory is shared with
other operators' vars between runs).
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

__all__ = ["empty", "aligned", "allocating", "Recorder", "Carver", "ALIGN"]

ALIGN = 64
_state = threading.local()


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def aligned(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array of ``shape`` whose first byte is ALIGN-aligned.

    For buffers a kernel keeps across runs (a constant filter packed once): ``np.empty``
    aligns large arrays to 16 bytes only, and every 64-byte vector load of such a buffer
    then spans two cache lines (ResNet50 batch 1: 2% of the time). The same over-allocation
    as ``device.memory.aligned_empty`` (the kernels sit below the device layer)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + ALIGN, np.uint8)
    skip = -raw.ctypes.data % ALIGN
    # (an empty slice would keep raw's address)
    return raw[skip : skip + n + 1][:n].view(dtype).reshape(shape)


def empty(shape, dtype) -> np.ndarray:
    """A scratch array for the kernel being bound (from the workspace when one is given)."""
    alloc = getattr(_state, "alloc", None)
    if alloc is None:
        return aligned(shape, dtype)
    return alloc(tuple(shape), np.dtype(dtype))


@contextlib.contextmanager
def allocating(alloc):
    """Route :func:`empty` calls made while binding to ``alloc(shape, dtype)``."""
    prev = getattr(_state, "alloc", None)
    _state.alloc = alloc
    try:
        yield alloc
    finally:
        _state.alloc = prev


class Recorder:
    """Counts the workspace bytes a binding asks for (handing out throwaway arrays)."""

    def __init__(self):
        self.nbytes = 0

    def __call__(self, shape, dtype) -> np.ndarray:
        arr = np.empty(shape, dtype)
        self.nbytes += _align(arr.nbytes)
        return arr


class Carver:
    """Hands out consecutive aligned pieces of one preallocated uint8 buffer."""

    def __init__(self, buf: np.ndarray):
        self.buf = buf
        self.offset = 0

    def __call__(self, shape, dtype) -> np.ndarray:
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self.offset + n > self.buf.nbytes:
            raise MemoryError(
                f"workspace of {self.buf.nbytes} bytes exhausted (asked {n} at {self.offset})"
            )
        arr = self.buf[self.offset : self.offset + n].view(dtype).reshape(shape)
        self.offset += _align(n)
        return arr

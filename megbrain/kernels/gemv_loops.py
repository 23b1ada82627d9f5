"""The compiled (Numba) loop of float32 matrix-vector products: ``y[j] = w[j] . x`` over a
range of rows ``j``, so that :mod:`megbrain.kernels.gemm` can split one product over the
kernel threads (a single-threaded BLAS ``sgemv`` streams the matrix on one core:
ResNet50's 1x2048 @ 2048x1000 classifier took 0.47 ms there, 0.24 in two halves here).

Each row's sum is 16 lane sums over ``k // 16 * 16`` products (lane ``l`` adding products
``l, l + 16, ...`` in order), added lane 0 to 15, then the remaining products in order:
a fixed order, so the result does not depend on how the rows are split.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import carray as _carray
from numba import types as t

from . import tiled_jit

__all__ = ["dot_rows"]

#: lane sums of a row (one AVX-512 vector, two AVX2 ones)
LANES = 16
stack_tile = carray = None  # bound by _compiled() first


def _dot_rows_py(x, w, y, lo, hi):
    # pragma: no cover - compiled
    k = x.size
    kv = k // LANES * LANES
    acc = carray(stack_tile(LANES, np.float32), LANES)  # noqa: F821 - the intrinsic
    for j in range(lo, hi):
        for lane in range(LANES):
            acc[lane] = np.float32(0.0)
        base = j * k
        for c in range(0, kv, LANES):
            for lane in range(LANES):
                acc[lane] += x[np.uintp(c + lane)] * w[np.uintp(base + c + lane)]
        s = np.float32(0.0)
        for lane in range(LANES):
            s += acc[lane]
        for c in range(kv, k):
            s += x[np.uintp(c)] * w[np.uintp(base + c)]
        y[np.uintp(j)] = s


@functools.cache
def _compiled():
    global stack_tile, carray


    stack_tile, carray = tiled_jit.stack_tile(), _carray
    fr = t.Array(t.float32, 1, "C", readonly=True)
    return tiled_jit.compile_tiled(_dot_rows_py, [t.void(fr, fr, t.float32[::1], t.int64,
                                                         t.int64)])  # fmt: skip


def dot_rows():
    """The compiled ``dot_rows(x, w, y, lo, hi)``: ``y[j] = sum_c w[j * k + c] x[c]`` for
    ``j`` in ``[lo, hi)``, ``k = x.size``; ``x`` and ``w`` read-only float32 1-d
    C-contiguous arrays (``w`` the flat rows of the matrix), ``y`` a writable float32 1-d
    C-contiguous one. GIL-free. Compiled on the first call of this function, which binding
    code makes (never a kernel thread: the pool's parts must not wait on the compiler)."""
    return _compiled()

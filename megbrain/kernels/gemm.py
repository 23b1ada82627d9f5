"""GEMMs as bound steps that run on megbrain's kernel threads, BLAS single-threaded.

(A float32 product by a constant matrix does not come here: :mod:`.blas` binds it to
:mod:`.packed_gemm`, which packs the matrix once.)

A product of at least :data:`SPLIT_MIN_FLOPS` is split into one part per kernel thread
(rows of ``out`` when it has more rows than columns, else columns), each part a BLAS call
with BLAS single-threaded (:func:`parallel.blas_single_threaded`); a smaller one is a single
single-threaded call. A float32 matrix-vector product (``out`` of one row or column) whose
matrix rows are contiguous runs :mod:`.gemv_loops` instead, its rows split over the kernel
threads in parts of at least :data:`GEMV_PART_MIN_MACS` weights (it is bound by memory
bandwidth per core, not by flops): two BLAS ``sgemv`` halves ran slower than the whole on one
thread (ResNet50's 1x2048 @ 2048x1000 classifier, 0.54 against 0.47 ms in the model), the
compiled halves in half the time (0.24 ms). Any other matrix-vector product is a single
single-threaded BLAS call. BLAS's own threads stay asleep: OpenBLAS's spin ~0.1 s after each
threaded call (on a core the next kernel needs), and waking them after an idle moment cost
~10 ms on the 2-core machines when their spin was shortened (``OPENBLAS_THREAD_TIMEOUT``
of 26 or less; NumPy's default 28 does not stall). The split is fixed for a thread count,
so results are reproducible from run to run. No product runs on BLAS's own threads: they
are not pinned, and the scheduler put OpenBLAS's spinning worker on its caller's core for
seconds at a time (an MLP's training steps at 26K samples/s in those stretches, 40-47K
outside them); the kernel threads are pinned off their caller's CPU (:mod:`.parallel`).

Measured on ResNet50's batch-1 layers (2 threads, idle): the 1x1 256->1024 convolution at
14x14 (a 1024x256 @ 256x196 product) 0.78 ms split against 1.0 ms threaded by OpenBLAS; the
3x3 128->128 at 28x28 (128x1152 @ 1152x784) 1.5 against 2.0 ms.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from . import gemv_loops, parallel
from .steps import Step, chain

__all__ = ["SPLIT_MIN_FLOPS", "matmul_step", "products_step"]

#: the fewest floating-point operations (2 m n k) worth splitting: ~30 us on one core
SPLIT_MIN_FLOPS = 1 << 21
#: the fewest rows (or columns) of ``out`` one part takes
MIN_PART = 16
#: the fewest multiply-adds (matrix elements) one part of a split matrix-vector product
#: takes: 512 KiB of float32 weights, 20-30 us streamed from memory on one core, where the
#: pool's hand-over costs a few. A matrix-vector product reads each weight once, so its
#: time is the matrix's bytes over one core's memory bandwidth, not its flops over
#: :data:`SPLIT_MIN_FLOPS` (MobileNetV3-Small's 576->1024 and 1024->1000 classifier layers,
#: 2.4 and 4.1 MB, ran on one core by that count)
GEMV_PART_MIN_MACS = 1 << 17
#: ``then(block, rows) -> Step``: an epilogue on one part's block of a product's output
Then = Callable[[np.ndarray, slice], Step]


def matmul_step(
    a: np.ndarray,
    b: np.ndarray,
    out: np.ndarray,
    then: Then | None = None,
) -> Step:
    """A step computing ``out = a @ b`` (2-d operands; ``out`` a writable (m, n) array, any
    strides NumPy's ``matmul(out=)`` accepts) on the kernel threads, BLAS single-threaded.

    Parameters
    ----------
    a, b : numpy.ndarray
        The (m, k) and (k, n) operands.
    out : numpy.ndarray
        The (m, n) result.
    then : Callable[[numpy.ndarray, slice], Step], optional
        Called at bind time with each part's block of ``out`` and the rows of ``out`` it
        spans (a ``slice(lo, hi)``); the step it returns runs right after the part's
        product, on the same thread (an epilogue on the block while it is in the core's
        cache).

    Returns
    -------
    Step
        A zero-argument callable computing ``out``.
    """
    m, k = a.shape
    n = b.shape[1]
    rows = _matrix_vector_step(a, b, out)
    if rows is not None:
        return _then(rows, then, out, slice(0, m))
    parts = 1
    if 2 * m * n * k >= SPLIT_MIN_FLOPS and min(m, n) > 1 and parallel.can_single_thread_blas():
        parts = parallel.num_threads()
    if m >= n:
        calls = [_then(functools.partial(np.matmul, a[lo:hi], b, out=out[lo:hi]), then,
                       out[lo:hi], slice(lo, hi))
                 for lo, hi in parallel.ranges(m, parts, MIN_PART)]  # fmt: skip
    else:
        calls = [_then(functools.partial(np.matmul, a, b[:, lo:hi], out=out[:, lo:hi]), then,
                       out[:, lo:hi], slice(0, m))
                 for lo, hi in parallel.ranges(n, parts, MIN_PART)]  # fmt: skip
    return parallel.concurrently_blas_single_threaded(calls)


def _matrix_vector_step(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Step | None:
    """``out = a @ b`` by :func:`gemv_loops.dot_rows` when it is a float32 matrix-vector
    product of a matrix with contiguous rows (``a`` a row and ``b`` the transpose of such a
    matrix, or ``b`` a column and ``a`` the matrix), else None."""
    m, k = a.shape
    n = b.shape[1]
    if not (a.dtype == b.dtype == out.dtype == np.float32 and out.flags.c_contiguous):
        return None
    if np.shares_memory(out, a) or np.shares_memory(out, b):  # the loop reads as it writes
        return None
    if m == 1 and b.T.flags.c_contiguous and a.flags.c_contiguous:
        x, rows = a[0], b.T
    elif n == 1 and a.flags.c_contiguous and b.T.flags.c_contiguous:
        x, rows = b[:, 0], a
    else:
        return None
    x, w = (v.view() for v in (x, rows.reshape(-1)))
    x.flags.writeable = w.flags.writeable = False  # the loop's read-only signature
    y = out.reshape(-1)
    fn = functools.partial(gemv_loops.dot_rows(), x, w, y)
    return parallel.split(fn, y.size, max(MIN_PART, -(-GEMV_PART_MIN_MACS // max(1, k))))


def _then(product: Step, then: Then | None, block: np.ndarray, rows: slice) -> Step:
    return product if then is None else chain([product, then(block, rows)])


def products_step(
    products: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    thens: list[Then] | None = None,
) -> Step:
    """A step computing independent products ``out = a @ b`` (2-d, as :func:`matmul_step`):
    at least :func:`parallel.num_threads` of them run one product per thread at a time
    (:func:`parallel.take_in_turn`, BLAS single-threaded), fewer split each product.
    ``thens`` (one per product, optional) are :func:`matmul_step`'s ``then``."""
    thens = thens or [None] * len(products)
    nt = parallel.num_threads() if parallel.can_single_thread_blas() else 1
    if len(products) >= nt > 1:
        items = [_then(functools.partial(np.matmul, a, b, out=out), t, out, slice(0, len(out)))
                 for (a, b, out), t in zip(products, thens)]  # fmt: skip
        return parallel.take_in_turn([items] * nt)
    return chain([matmul_step(a, b, out, then=t) for (a, b, out), t in zip(products, thens)])

"""The float32 product by a constant matrix (a Linear layer's weight, a classifier's):
the matrix packed once into blocks of 16 columns, the product run as register tiles
(:mod:`.gemm_loops`) on the kernel threads, the bias, activation, an elementwise tail
(GELU) and a scaled residual add (a ConvNeXt block's layer scale and shortcut) in the tiles'
write-out.

The tiling is POINTWISE_NCHW88's cost model (:func:`.conv.pointwise88.tiles_for`: a 1x1
convolution is this product with the positions as rows); the units (a band of row tiles by
a group of column blocks, groups fastest) are taken as they go
(:func:`.conv.nchw8c.units_as_they_go`). A matrix-vector product (one row) is one tile row
streaming the packed matrix, split over the threads by column groups. Every sum runs over
``k`` in order, whoever computes it: results do not depend on the thread count.
"""

from __future__ import annotations

import functools

import numpy as np

from . import gemm_loops as loops
from . import workspace
from .conv.common import threads
from .conv.loops.nchw8c import readonly_view
from .conv.nchw8c import filter_packed, units_as_they_go
from .conv.pointwise88 import PointwiseTiles, tiles_for
from .steps import Step, chain

__all__ = ["MIN_SPLIT_MACS", "TAIL_MODES", "bind_packed_matmul", "packed_tiles",
           "usable_packed_matmul", "usable_residual"]  # fmt: skip

#: the elementwise modes a tile's tail computes (:data:`.gemm_loops.TAIL_MODES`)
TAIL_MODES = frozenset(loops.TAIL_MODES)

_F32 = np.dtype(np.float32)
_NO_BIAS = readonly_view(np.zeros(1, _F32))
#: below these multiply-adds one thread runs the units
MIN_SPLIT_MACS = 1 << 18
#: column blocks of 16 a matrix-vector tile takes at most (independent accumulator chains,
#: one packed stream)
_GEMV_BLOCKS = 8


def _row_view(x: np.ndarray) -> np.ndarray | None:
    """The 2-d ``x`` (unit column stride, rows ascending) as a flat view from its first
    element to its last; None for other strides."""
    m, k = x.shape
    if k > 1 and x.strides[1] != x.itemsize or x.strides[0] % x.itemsize or x.strides[0] < 0:
        return None
    size = (m - 1) * (x.strides[0] // x.itemsize) + k
    return np.lib.stride_tricks.as_strided(x, (size,), (x.itemsize,), writeable=x.flags.writeable)


def _leading(x: np.ndarray) -> int:
    return x.strides[0] // x.itemsize if x.shape[0] > 1 else x.shape[1]


def usable_packed_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """Whether :func:`bind_packed_matmul` computes ``out = a @ b``: float32 operands, ``a``
    and ``out`` of unit column stride (any row stride), at least one row, column and ``k``,
    ``out`` writable and sharing no memory with ``a``."""
    m, k = a.shape
    return (
        a.dtype == b.dtype == out.dtype == _F32
        and min(m, k, b.shape[1]) > 0
        and out.flags.writeable
        and _row_view(a) is not None
        and _row_view(out) is not None
        and not np.shares_memory(a, out)
    )


def usable_residual(scale: np.ndarray, addend: np.ndarray, out: np.ndarray) -> bool:
    """Whether :func:`bind_packed_matmul` takes ``(scale, addend)`` as the residual of the
    product ``out``: a C-contiguous float32 vector of its columns and a float32 matrix of its
    shape, unit column stride, sharing no memory with ``out``."""
    return (
        scale.dtype == addend.dtype == _F32
        and scale.shape == out.shape[1:]
        and scale.flags.c_contiguous
        and addend.shape == out.shape
        and _row_view(addend) is not None
        and not np.shares_memory(addend, out)
    )


def packed_tiles(m: int, k: int, n: int, nthreads: int) -> PointwiseTiles:
    """The tiling of an ``(m, k) @ (k, n)`` product at ``nthreads`` threads: POINTWISE_NCHW88's
    (``m`` positions), ``r`` at most ``m``; one row takes up to :data:`_GEMV_BLOCKS` blocks a
    tile, in groups enough for every thread."""
    nblk = -(-n // loops.BLOCK)
    if m == 1:
        want = max(1, min(_GEMV_BLOCKS, nblk // (8 * nthreads)))
        b = max(d for d in range(1, want + 1) if nblk % d == 0)
        return PointwiseTiles(1, b, nblk // b, 1, 1)
    tl = tiles_for(1, m, k, n, nthreads)
    if tl.r > m:
        return PointwiseTiles(m, tl.b, tl.ng, 1, 1)
    return tl


def bind_packed_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray, constant: bool,
                       bias: np.ndarray | None = None, epi: int = 0,
                       tiles: PointwiseTiles | None = None, tail: tuple = (),
                       residual: tuple | None = None) -> Step:  # fmt: skip
    """Bind ``out = tail(act(a @ b + bias))``, then ``* scale + addend`` with a
    ``residual`` (:func:`usable_packed_matmul` must hold, and :func:`usable_residual` for it).

    Parameters
    ----------
    a, b : numpy.ndarray
        The (m, k) and (k, n) float32 operands (``b`` any strides).
    out : numpy.ndarray
        The (m, n) float32 result.
    constant : bool
        Whether ``b`` keeps its values from run to run: packed at the first run only (else
        at every run).
    bias : numpy.ndarray, optional
        n float32 values added to every row (C-contiguous), with epilogue bit 1 in ``epi``.
    epi : int
        Epilogue bits: 1 bias, then :func:`.conv.loops.pointwise88.activate`'s.
    tiles : PointwiseTiles, optional
        The tiling (default :func:`packed_tiles`'s).
    tail : tuple
        A JIT expression of one input applied last (:func:`.gemm_loops.emit_tail`; its modes
        those of :data:`.gemm_loops.TAIL_MODES`), ``()`` for none.
    residual : tuple, optional
        ``(scale, addend)``: n float32 values (C-contiguous) multiplying the tail's result and
        the (m, n) float32 matrix added after (unit column stride, any row stride).

    Returns
    -------
    Step
        A zero-argument callable computing ``out`` (allocating nothing).
    """
    m, k = a.shape
    n = b.shape[1]
    nthreads = 1 if m * k * n < MIN_SPLIT_MACS else threads()
    tl = tiles or packed_tiles(m, k, n, nthreads)
    per = tl.b * loops.BLOCK
    wp = (workspace.aligned if constant else workspace.empty)((tl.ng * k * per,), _F32)
    pack = loops.matrix_packer(b, wp, tl.b)
    nt = n - (tl.ng * tl.b - 1) * loops.BLOCK
    run = loops.compiled_units(tl.r, tl.b, nt, epi, tail, residual is not None)
    scale, res = (_NO_BIAS, _NO_BIAS) if residual is None else residual
    geom = np.array([m, k, _leading(a), _leading(out), tl.ng, tl.nb, tl.tpb,
                     0 if residual is None else _leading(res)], np.int64)  # fmt: skip
    ap, outf, wr = readonly_view(_row_view(a)), _row_view(out), readonly_view(wp)
    bf = _NO_BIAS if bias is None else readonly_view(bias)
    sf = readonly_view(scale)
    rf = readonly_view(res if residual is None else _row_view(res))

    def bind_part(counter: np.ndarray, me: int) -> Step:
        return functools.partial(run, ap, wr, outf, bf, sf, rf, geom, counter, me)

    step = units_as_they_go(tl.ng * tl.nb, bind_part, nthreads)
    return filter_packed(pack, chain([step]), constant)

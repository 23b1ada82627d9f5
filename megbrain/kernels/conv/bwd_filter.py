"""Backward filter of 2-d convolutions as cache-blocked im2col + GEMM (IM2COL_GEMM_BLOCKED).

:func:`bind_blocked` computes the filter gradient ``dW (OC, K) = sum over the output
positions of diff (OC, P) @ cols^T (P, K)`` (``K = C * FH * FW``) block by block: the ``N * OH``
output rows of the batch are cut into blocks of about :data:`BLOCK_POSITIONS` positions
(whole samples when a sample is smaller, rows of one sample otherwise, so that batch 1 blocks
too), a compiled im2col writes a block's ``(K, P)`` columns into a buffer of at most
:data:`BLOCK_BYTES`, and one GEMM per group ``diff_block (OCg, P) @ cols^T (P, Kg)``, still in
the core's cache, adds it into a running sum. A block inside one sample reads ``diff`` in place
(a row-strided matrix); a block of several samples first copies their ``diff`` planes side by
side. A dense gradient over at most :data:`BAND_MAX_POSITIONS` positions in the whole batch
(deep layers' small planes, whose gradient is larger than a block's columns) runs in bands of
column rows instead (:meth:`_Blocked.bands`): each band's GEMM reduces over the whole batch
into its own columns of the gradient, with no partial sums.

The :func:`parallel.num_threads` threads each run whole block pipelines with BLAS
single-threaded (:func:`parallel.blas_single_threaded`), one fork/join per call: with at least
as many blocks as threads, each thread takes an even share of consecutive blocks into its own
partial sum, and the partial sums are added at the end in thread order; with fewer blocks
(one small sample), each thread takes its share of the ``K`` column rows of every block
(disjoint columns of ``dW``). Either way every sum runs in an order fixed at bind time, so a
given thread count always gives the same bits (reproducible). Measured under load (8-9 on the
2-core machines), OpenBLAS's own two threads over the blocks' GEMMs spent 4-10x longer,
synchronising on every GEMM.

Compared with IM2COL_GEMM_DIFF_NHWC of :mod:`.bwd_filter` (the columns of a whole batch chunk
built by NumPy's strided copy, 58 MB for 8x64x56x56 3x3, then one GEMM), the columns of a
block stay in cache between the im2col and the GEMM and the copy is compiled (see
:data:`BLOCK_POSITIONS` for the measurements).

The products are :func:`.sgemm.product_step`'s: megbrain's own float32 GEMM on AVX-512,
which reads the columns in place (their rows written a little more than a row apart where a
row is a multiple of 4 KB, :func:`_row_stride`) where a group has at least
:data:`SGEMM_MIN_CHANNELS` output channels, NumPy's matmul elsewhere. Against NumPy's
(OpenBLAS, which packs the columns again), ResNet-18's batch-32 3x3 filter gradients took
11-12 % less time in all, one thread and two (interleaved best of 7, load 8-9: 346 -> 305
and 310 -> 274 ms over one of each layer), the 32x32 and 16x16 layers up to 20 %.

float16 and bfloat16 compute in float32; operands that are not C-contiguous in the compute
dtype are copied into workspace buffers first. Every buffer is allocated at bind time
(:func:`workspace.empty`, so that the executor places it in the memory plan) and fully
written on every run before it is read. The im2col is :func:`im2col_loops.im2col` (Numba,
compiled on first use), over whole samples or over output rows of one sample.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from .. import parallel, sgemm, tiled_jit, workspace
from ..steps import Step, chain
from .common import (
    _contiguous,
    _Conv,
    _flipped,
    _geometry,
    _is_pointwise,
    _split_gemms,
    bind_doc,
    checked,
    compute_dtype,
)
from .loops import im2col as im2col_loops
from .registry import ConvAlgorithm, always, register

__all__ = [
    "BAND_BYTES",
    "BAND_MAX_POSITIONS",
    "BLOCK_BYTES",
    "BLOCK_CACHE_BYTES",
    "BLOCK_POSITIONS",
    "POINTWISE_MAX_PRODUCT_BYTES",
    "POINTWISE_MIN_POSITIONS",
    "POINTWISE_SUM_MAX_POSITIONS",
    "TRANSPOSED_MIN_POSITIONS",
    "bind_blocked",
    "bind_pointwise_batched",
    "bind_pointwise_sum",
    "preferred_blocked",
    "preferred_pointwise_batched",
    "preferred_pointwise_sum",
    "usable_blocked",
    "usable_pointwise_batched",
    "usable_pointwise_sum",
]

#: output positions per block of IM2COL_GEMM_BLOCKED (whole output rows; whole samples when
#: a sample has fewer). Measured on one core (CPU time), 8x64x56x56 3x3: 1024 positions
#: 34.8 ms, 256 (one output row) 56.5 ms, unblocked NHWC 40.0 ms; a (64, 1024) @ (1024, 576)
#: GEMM ran at 73-82 GFLOP/s, the (64, 25088) @ (25088, 576) one at 67
BLOCK_POSITIONS = 1024
#: the most bytes of one block's columns and diff copy (a block has at least one output row)
BLOCK_BYTES = 4 << 20
#: blocks grow past :data:`BLOCK_POSITIONS` while their bytes stay under this (short reductions,
#: e.g. one input channel: measured on one core, 128x1x28x28 3x3 3.1 ms with 4096-position
#: blocks vs 3.8 with 1024)
BLOCK_CACHE_BYTES = 512 << 10
#: blocks of at least this many positions run ``cols (K, P) @ diff^T (P, OC)``, shorter ones
#: ``diff (OC, P) @ cols^T (P, K)``: measured on one core, the first was 3-6% faster from 1024
#: positions on, the second 1.4x faster for 1x256x14x14 3x3 (196) and 3x for 1x512x7x7 (49)
TRANSPOSED_MIN_POSITIONS = 512
#: HEURISTIC takes POINTWISE_BATCHED_GEMM for a pointwise gradient over planes of at least
#: this many positions: measured on MobileNetV2's batch-32 layers (2 threads, under load),
#: 16x96 at 32x32 1.0 against IM2COL_GEMM_BLOCKED's 9.7 ms, 96x24 2.6 against 7.3, 24x144
#: 2.5 against 5.3, 32x192 at 16x16 0.7 against 2.3; at 8x8 and 4x4 its short products and
#: the sum over the samples' products lost (160x960 at 4x4 3.2 against 1.0)
POINTWISE_MIN_POSITIONS = 256
#: ... and while the samples' products (N x OC x ICg float32) take at most this many bytes
POINTWISE_MAX_PRODUCT_BYTES = 8 << 20
#: HEURISTIC takes POINTWISE_SGEMM_SUM for a pointwise gradient over planes of at most this
#: many positions (see :func:`bind_pointwise_sum` for the measurements)
POINTWISE_SUM_MAX_POSITIONS = 256
#: a dense (one group) gradient over at most this many output positions (the whole batch)
#: runs in bands of column rows instead of blocks of positions: each band's GEMM reduces over
#: the whole batch into its own columns of the gradient, where blocks of positions would each
#: add a partial gradient as large as their columns (512x512 at 4x4, batch 32: 9.4 MB a block)
BAND_MAX_POSITIONS = 1024
#: the bytes of one band's columns (``rows * N * OH * OW``), kept within the core's cache
BAND_BYTES = 1 << 20
_F32 = np.dtype(np.float32)
#: a gradient of fewer multiply-adds (x2) than this runs on one thread
_MIN_THREAD_FLOPS = 4_000_000
#: the fewest output channels (of a group) whose products take megbrain's GEMM
#: (:func:`.sgemm.product_step`); fewer take NumPy's matmul: a 6x64 tile over 16 channels
#: by 9 taps (a small CNN's first layer) ran 6-9x slower than OpenBLAS, 32 by 144 up to 3.7x
#: (one thread, blocks of 1024 positions), while 64 channels and more gained 7-21%
SGEMM_MIN_CHANNELS = 64


# ---- shared binding helpers ----------------------------------------------------------------
def _product(a: np.ndarray, b: np.ndarray, out: np.ndarray, channels: int) -> Step:
    """``out = a @ b`` for a filter gradient of ``channels`` output channels (per group)."""
    if channels >= SGEMM_MIN_CHANNELS:
        return sgemm.product_step(a, b, out)
    return functools.partial(np.matmul, a, b, out=out)


def _float_dtype(a: np.ndarray) -> bool:
    try:
        compute_dtype(a.dtype)
    except ValueError:
        return False
    return True


def _store(res: np.ndarray, grad: np.ndarray, flip: bool) -> Step:
    """The step copying the (G, OCg, ICg, FH, FW) result into ``grad`` (flipped spatially for
    CONVOLUTION mode)."""
    view = res[..., ::-1, ::-1] if flip else res
    return functools.partial(np.copyto, grad, view, "unsafe")


def _checked(name: str, src, diff, grad, stride, pad, dilate, usable: Callable, why: str):
    geo = _Conv("ConvolutionBackwardFilter", src.shape, grad.shape, diff.shape, stride, pad,
                dilate)  # fmt: skip
    if not usable(src, diff, grad, stride, pad, dilate):
        raise ValueError(
            f"ConvolutionBackwardFilter ({name}): needs {why}; got src {tuple(src.shape)} "
            f"{src.dtype}, diff {tuple(diff.shape)}, grad {tuple(grad.shape)}, "
            f"stride={tuple(stride)}, pad={tuple(pad)}, dilate={tuple(dilate)}"
        )
    return geo, compute_dtype(src.dtype)


# ---- IM2COL_GEMM_BLOCKED -------------------------------------------------------------------
def usable_blocked(src, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """Whether :func:`bind_blocked` accepts the gradient: 2-d, floating point, pad >= 0."""
    return src.ndim == 4 and _float_dtype(src) and all(p >= 0 for p in pad)


def preferred_blocked(src, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """HEURISTIC's rule: wherever usable (it matched or beat IM2COL_GEMM_DIFF_NHWC on every
    measured shape, see :data:`BLOCK_POSITIONS`)."""
    return usable_blocked(src, diff, grad, stride, pad, dilate, flip)


def _blocks(n: int, oh: int, ow: int, per_row_bytes: int, parts: int = 1) -> list[tuple]:
    """The [g0, g1) blocks of the ``n * oh`` output rows: whole samples when a sample fits a
    block (:data:`BLOCK_POSITIONS` positions, more while the block's bytes stay under
    :data:`BLOCK_CACHE_BYTES`, never over :data:`BLOCK_BYTES`), else rows of one sample; as
    many blocks as a multiple of ``parts`` allows (so that ``parts`` threads get even shares),
    each about as large as the limits allow."""
    per_row = max(1, per_row_bytes)
    rows = max(-(-BLOCK_POSITIONS // max(1, ow)), BLOCK_CACHE_BYTES // per_row)
    rows = max(1, min(rows, BLOCK_BYTES // per_row))
    if rows >= oh:  # whole samples, ``k`` a block
        count = max(-(-n // max(1, rows // oh)), min(parts, n))
        if count >= parts:
            count = -(-count // parts) * parts
        k = -(-n // count)
        return [(a, min(n * oh, a + k * oh)) for a in range(0, n * oh, k * oh)]
    per_sample = -(-oh // rows)
    if n * per_sample >= parts:
        while (n * per_sample) % parts and per_sample < oh:
            per_sample += 1
    rows = -(-oh // per_sample)
    return [
        (s * oh + i, s * oh + min(oh, i + rows)) for s in range(n) for i in range(0, oh, rows)
    ]


@bind_doc("backward_filter")
def bind_blocked(src: np.ndarray, diff: np.ndarray, grad: np.ndarray, stride: Sequence[int],
                 pad: Sequence[int], dilate: Sequence[int], flip: bool = False,
                 ) -> Callable[[], None]:  # fmt: skip
    """Bind the gradient of a 2-d convolution w.r.t. its filter as IM2COL_GEMM_BLOCKED
    (:func:`usable_blocked`); any strides."""
    geo, dt = _checked("IM2COL_GEMM_BLOCKED", src, diff, grad, stride, pad, dilate,
                       usable_blocked, "a 2-d floating-point convolution, pad >= 0")  # fmt: skip
    steps: list[Step] = []
    res = workspace.empty(grad.shape, dt)  # (G, OCg, ICg, FH, FW), summed over the blocks
    oh, ow = geo.oshape
    if geo.n * oh * ow == 0 or res.size == 0:
        steps.append(functools.partial(np.copyto, res, 0))
        steps.append(_store(res, grad, flip))
        return chain(steps)
    b = _Blocked(geo, dt, _contiguous(src, dt, steps), _contiguous(diff, dt, steps))
    nt = parallel.num_threads() if parallel.can_single_thread_blas() else 1
    if 2 * b.oc * b.ktot * geo.n * oh * ow < _MIN_THREAD_FLOPS:
        nt = 1
    if geo.g == 1 and geo.n * oh * ow <= BAND_MAX_POSITIONS:
        steps += b.bands(res.reshape(b.oc, b.ktot), nt)
        steps.append(_store(res, grad, flip))
        return chain(steps)
    blocks = _blocks(geo.n, oh, ow, (b.ktot + b.oc) * ow * dt.itemsize, nt)
    width = max(g1 - g0 for g0, g1 in blocks) * ow
    resm = res.reshape(geo.g, geo.ocg, geo.k)
    trans = min(g1 - g0 for g0, g1 in blocks) * ow >= TRANSPOSED_MIN_POSITIONS
    total = workspace.empty((geo.g, geo.k, geo.ocg), dt) if trans else resm
    calls = []
    if len(blocks) >= nt:  # each thread its blocks, all rows, into its own partial sum
        whole = [(gi, 0, geo.k) for gi in range(geo.g)]
        parts = parallel.ranges(len(blocks), nt)
        sums = [total] + [workspace.empty(total.shape, dt) for _ in parts[1:]]
        for (lo, hi), acc in zip(parts, sums):
            cols = workspace.empty((b.ktot * (width + 16 if trans else width),), dt)
            calls.append(b.thread(blocks[lo:hi], whole, cols, acc, width, trans))
        sums = sums[1:]
    else:  # few blocks: each thread its column rows of every block (disjoint gradient columns)
        for r0, r1 in parallel.ranges(geo.k, nt):
            rowset = [(gi, r0, r1) for gi in range(geo.g)]
            # a column buffer per thread: a block's (K, ncol) view of a shared one puts a
            # thread's rows at offsets that depend on the block's width, so a thread a block
            # ahead overwrote another's columns (blocks of unequal widths)
            cols = workspace.empty((b.ktot * (width + 16 if trans else width),), dt)
            calls.append(b.thread(blocks, rowset, cols, total, width, trans))
        sums = []
    steps.append(parallel.concurrently_blas_single_threaded(calls))
    for acc in sums:  # the threads' partial sums, in a fixed order
        steps.append(functools.partial(np.add, total, acc, out=total))
    if trans:
        steps.append(functools.partial(np.copyto, resm, total.swapaxes(1, 2)))
    steps.append(_store(res, grad, flip))
    return chain(steps)


def _row_stride(ncol: int, trans: bool) -> int:
    """The row stride (items) of a block's columns: one row, but a multiple of 1024 items
    (4 KB of float32) one row of 16 items longer when ``trans``, so that sgemm's tiles read
    the rows in place (:func:`.sgemm.product_step`: rows that many bytes apart share the
    caches' sets, and are packed first)."""
    return ncol + 16 if trans and ncol % 1024 == 0 else ncol


class _Blocked:
    """The operands of one IM2COL_GEMM_BLOCKED binding, and the steps of one thread."""

    def __init__(self, geo: _Conv, dt: np.dtype, x: np.ndarray, dy: np.ndarray):
        self.geo, self.dt, self.x = geo, dt, x
        self.ktot, self.oc = geo.g * geo.k, geo.g * geo.ocg
        oh, ow = geo.oshape
        self.dyf = dy.reshape(geo.n, self.oc, oh * ow)
        self.geom = (geo.stride, geo.pad, geo.dilate, geo.fshape)

    def bands(self, res: np.ndarray, nt: int) -> list[Step]:
        """The steps of the band form (one group): ``diff`` copied batch-inner into an
        ``(OC, N * OH * OW)`` matrix (its channels split over the threads), then bands of
        about :data:`BAND_BYTES` of column rows over the whole batch, a multiple of ``nt``
        of them, each thread its consecutive bands: the band's im2col and one GEMM
        ``diff (OC, P) @ cols^T (P, rows)`` writing its columns of ``res`` (OC, K)."""
        geo, dt, oc, n = self.geo, self.dt, self.oc, self.geo.n
        oh, ow = geo.oshape
        pos = n * oh * ow
        if n == 1:
            dm = self.dyf[0]
            steps: list[Step] = []
        else:
            dbuf = workspace.empty((oc, n, oh * ow), dt)
            copies = [functools.partial(np.copyto, dbuf[c0:c1], self.dyf[:, c0:c1].swapaxes(0, 1))
                      for c0, c1 in parallel.ranges(oc, nt)]  # fmt: skip
            steps = [parallel.concurrently(copies)]
            dm = dbuf.reshape(oc, pos)
        rows = max(1, BAND_BYTES // (pos * dt.itemsize))
        count = -(-self.ktot // rows)
        count = -(-count // nt) * nt
        bands = parallel.ranges(self.ktot, count)
        calls = []
        for lo, hi in parallel.ranges(len(bands), nt):
            width = max(r1 - r0 for r0, r1 in bands[lo:hi])
            colbuf = workspace.empty((width * pos,), dt)
            work: list[Step] = []
            for r0, r1 in bands[lo:hi]:
                cols = colbuf[: (r1 - r0) * pos].reshape(r1 - r0, pos)
                work.append(functools.partial(im2col_loops.im2col, self.x, cols, 0, n,
                                              *self.geom, r0, r1, None, r0))  # fmt: skip
                work.append(_product(dm, cols.T, res[:, r0:r1], oc))
            calls.append(chain(work))
        return steps + [parallel.concurrently_blas_single_threaded(calls)]

    def thread(self, blocks, rowset, colbuf, acc, width, trans) -> Step:
        """The step of one thread: per block, the im2col of the column rows ``rowset``
        ((group, first, end) within each group), the diff rows of the block (in place inside
        one sample, else copied side by side), and one GEMM per group into ``acc`` (the
        first block) or a partial buffer added to it: ``acc`` is (G, OCg, Kg), or (G, Kg, OCg)
        when ``trans`` (``cols @ diff^T``)."""
        geo, dt, oc = self.geo, self.dt, self.oc
        g, ocg, kg = geo.g, geo.ocg, geo.k
        oh, ow = geo.oshape
        ll = oh * ow
        several = any((g1 - 1) // oh != g0 // oh for g0, g1 in blocks)
        dbuf = workspace.empty((oc * width,), dt) if several else None
        part = workspace.empty(acc.shape, dt) if len(blocks) > 1 else None
        rows = [(gi * kg + r0, gi * kg + r1) for gi, r0, r1 in rowset if r1 > r0]
        if len(rows) == g and all(r1 - r0 == kg for r0, r1 in rows):
            rows = [(0, self.ktot)]  # every row: one im2col call
        steps: list[Step] = []
        for u, (g0, g1) in enumerate(blocks):
            ncol = (g1 - g0) * ow
            ld = _row_stride(ncol, trans)
            cols = colbuf[: self.ktot * ld].reshape(self.ktot, ld)[:, :ncol]
            flat = colbuf[: self.ktot * ld] if ld != ncol else None  # rows ld apart
            n0 = g0 // oh
            if (g1 - 1) // oh == n0:  # output rows of one sample
                span = dict(out_rows=(g0 - n0 * oh, g1 - n0 * oh))
                n1 = n0 + 1
            else:  # whole samples
                span, n1 = {}, g1 // oh
            for r0, r1 in rows:
                into = dict(row_stride=ld) if flat is not None else {}
                steps.append(functools.partial(im2col_loops.im2col, self.x,
                                               cols if flat is None else flat, n0, n1,
                                               *self.geom, r0, r1, **span, **into))  # fmt: skip
            if (g1 - 1) // oh == n0:  # inside one sample: diff's rows in place
                i0 = g0 - n0 * oh
                dm = self.dyf[n0, :, i0 * ow : (i0 + g1 - g0) * ow]
            else:  # whole samples: their diff planes side by side
                k = (g1 - g0) // oh
                dbv = dbuf[: oc * ncol].reshape(oc, k, ll)
                planes = self.dyf[n0 : n0 + k].swapaxes(0, 1)
                steps.append(functools.partial(np.copyto, dbv, planes))
                dm = dbv.reshape(oc, ncol)
            dst = acc if u == 0 else part
            for gi, r0, r1 in rowset:
                if r1 <= r0:
                    continue
                dmg = dm[gi * ocg : (gi + 1) * ocg]
                colg = cols[gi * kg + r0 : gi * kg + r1]
                sl = (gi, slice(r0, r1)) if trans else (gi, slice(None), slice(r0, r1))
                if trans:  # the columns read in place by sgemm's tiles (no packing)
                    steps.append(_product(colg, dmg.T, dst[sl], ocg))
                else:
                    steps.append(_product(dmg, colg.T, dst[sl], ocg))
                if u:
                    steps.append(functools.partial(np.add, acc[sl], part[sl], out=acc[sl]))
        return chain(steps)


# ---- IM2COL_GEMM_DIFF_NHWC and IM2COL_GEMM_DIFF_ROWS: whole batch chunks, any dims ------
def _bwd_filter_common(src, diff, grad, stride, pad, dilate):
    geo = _geometry("backward_filter", src, diff, grad, stride, pad, dilate)
    return geo, compute_dtype(src.dtype)


def bwd_filter_diff_nhwc(src, diff, grad, stride, pad, dilate, flip=False) -> Callable[[], None]:
    """Backward filter IM2COL_GEMM_DIFF_NHWC: per batch chunk, the transposed gradient
    (G, K, OCg) = columns (G, K, k * L) @ channel-last diff (G, k * L, OCg), the batch summed
    inside the GEMM."""
    geo, dt = _bwd_filter_common(src, diff, grad, stride, pad, dilate)
    steps: list[Step] = []
    g, ocg = geo.g, geo.ocg
    res = np.empty((g, geo.k, ocg), dt)  # the transposed gradient, summed over the chunks
    chunks = geo.im2col(src, dt, steps)
    if not chunks:  # an empty batch
        steps.append(functools.partial(np.copyto, res, 0))
    nb = max((b - a for a, b, _, _ in chunks), default=0)
    # diff channel-last, ``(k, *O, G, OCg)``: each group's (k * L, OCg) matrix is row-major
    dflat = workspace.empty((nb * geo.l * g * ocg,), dt)
    part = np.empty_like(res) if len(chunks) > 1 else None
    for i, (a, b, colm, fill) in enumerate(chunks):
        k = b - a
        steps.append(fill)
        dbuf = dflat[: k * geo.l * g * ocg].reshape(k, *geo.oshape, g * ocg)
        steps.append(functools.partial(np.copyto, dbuf, np.moveaxis(diff[a:b], 1, -1), "unsafe"))
        dm = dbuf.reshape(k * geo.l, g, ocg).swapaxes(0, 1)  # (G, k * L, OCg)
        if i == 0:
            steps += _split_gemms(colm, dm, res)
        else:
            steps += _split_gemms(colm, dm, part)
            steps.append(functools.partial(np.add, res, part, res))
    view = res.swapaxes(1, 2).reshape(grad.shape)  # ``(G, OCg, ICg, *F)``, a copy-free view
    steps.append(functools.partial(np.copyto, grad, _flipped(view, geo.nsp) if flip else view,
                                   "unsafe"))  # fmt: skip
    return chain(steps)


def bwd_filter_diff_rows(src, diff, grad, stride, pad, dilate, flip=False) -> Callable[[], None]:
    """Backward filter IM2COL_GEMM_DIFF_ROWS: per batch chunk, the gradient (G, OCg, K) =
    batch-inner diff (G, OCg, k * L) @ columns^T (G, k * L, K). Measured on 2 cores it ran
    4-5x slower than IM2COL_GEMM_DIFF_NHWC for a few dozen channels (OpenBLAS's threads
    synchronise once per block of the long reduction); a PROFILE candidate, never the
    heuristic's."""
    geo, dt = _bwd_filter_common(src, diff, grad, stride, pad, dilate)
    steps: list[Step] = []
    res = np.empty((geo.g, geo.ocg, geo.k), dt)  # summed over the chunks
    nb, _ = geo.chunks(dt)
    chunks = geo.im2col(src, dt, steps)
    if not chunks:
        steps.append(functools.partial(np.copyto, res, 0))
    diff_matrix = geo.batch_inner_matrix(diff, max(nb, 1), dt, steps)
    part = np.empty_like(res) if len(chunks) > 1 else None
    for i, (a, b, colm, fill) in enumerate(chunks):
        steps.append(fill)
        dm = diff_matrix(a, b)  # (G, OCg, k * L)
        cols_t = colm.transpose(0, 2, 1)  # (G, k * L, K), column-major matrices
        if i == 0:
            steps += _split_gemms(dm, cols_t, res)
        else:
            steps += _split_gemms(dm, cols_t, part)
            steps.append(functools.partial(np.add, res, part, res))
    view = res.reshape(grad.shape)
    steps.append(functools.partial(np.copyto, grad, _flipped(view, geo.nsp) if flip else view,
                                   "unsafe"))  # fmt: skip
    return chain(steps)


# ---- POINTWISE_BATCHED_GEMM ----------------------------------------------------------------
def usable_pointwise_batched(src, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """Whether :func:`bind_pointwise_batched` accepts the gradient: 2-d pointwise (1x1,
    stride 1, no padding), float32 or float64 (all three alike), ``src`` and ``diff``
    C-contiguous."""
    return (
        src.ndim == 4
        and src.dtype == diff.dtype == grad.dtype
        and src.dtype in (_F32, np.dtype(np.float64))
        and _is_pointwise(grad.shape[3:], stride, pad)
        and src.flags.c_contiguous
        and diff.flags.c_contiguous
    )


def preferred_pointwise_batched(src, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """HEURISTIC's rule: usable, planes of at least :data:`POINTWISE_MIN_POSITIONS` positions
    and per-sample products of at most :data:`POINTWISE_MAX_PRODUCT_BYTES` in all."""
    return (
        usable_pointwise_batched(src, diff, grad, stride, pad, dilate)
        and src.shape[2] * src.shape[3] >= POINTWISE_MIN_POSITIONS
        and src.shape[0] * grad[..., 0, 0].nbytes <= POINTWISE_MAX_PRODUCT_BYTES
    )


@bind_doc("backward_filter")
def bind_pointwise_batched(src: np.ndarray, diff: np.ndarray, grad: np.ndarray,
                           stride: Sequence[int], pad: Sequence[int], dilate: Sequence[int],
                           flip: bool = False) -> Callable[[], None]:  # fmt: skip
    """Bind the filter gradient of a pointwise convolution (:func:`usable_pointwise_batched`)
    as batched ``np.matmul`` of the samples' ``diff[n] (OCg, P) @ src[n]^T (P, ICg)`` per
    group (the source read in place, transposed by its strides) into a workspace buffer, the
    samples split over the threads, then one sum over the samples in their order
    (reproducible): no im2col, no copy of ``diff``."""
    needs = "a float32 or float64 pointwise convolution of C-contiguous operands"
    geo = checked("backward_filter", "POINTWISE_BATCHED_GEMM", needs, usable_pointwise_batched,
                  src, diff, grad, stride, pad, dilate, flip)  # fmt: skip
    n, g, ocg, icg = geo.n, geo.g, geo.ocg, geo.icg
    x = src.reshape(n, g, icg, geo.l).swapaxes(2, 3)
    d = diff.reshape(n, g, ocg, geo.l)
    prod = workspace.empty((n, g, ocg, icg), src.dtype)
    res = grad.reshape(g, ocg, icg) if grad.flags.c_contiguous else workspace.empty(
        (g, ocg, icg), src.dtype)
    # each thread the products of its samples, BLAS single-threaded: OpenBLAS's own threads
    # synchronising on each small product ran 10-100x slower under load
    nt = parallel.num_threads() if parallel.can_single_thread_blas() else 1
    calls = [functools.partial(np.matmul, d[a:b], x[a:b], out=prod[a:b])
             for a, b in parallel.ranges(n, nt)]  # fmt: skip
    steps: list[Step] = [parallel.concurrently_blas_single_threaded(calls),
                         functools.partial(np.add.reduce, prod, axis=0, out=res)]
    if not grad.flags.c_contiguous:
        steps.append(functools.partial(np.copyto, grad, res.reshape(grad.shape)))
    return chain(steps)


# ---- POINTWISE_SGEMM_SUM -------------------------------------------------------------------
def usable_pointwise_sum(src, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """Whether :func:`bind_pointwise_sum` accepts the gradient: a dense (one group) float32
    pointwise convolution of C-contiguous operands, on a compiler targeting AVX-512 with
    :data:`.sgemm.ENABLED` set."""
    return (
        sgemm.ENABLED
        and tiled_jit.vector_width() == 16
        and usable_pointwise_batched(src, diff, grad, stride, pad, dilate)
        and src.dtype == _F32
        and grad.ndim == 5
        and grad.shape[0] == 1  # one group: (1, OC, C, 1, 1)
    )


def preferred_pointwise_sum(src, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """HEURISTIC's rule: usable, planes of at most :data:`POINTWISE_SUM_MAX_POSITIONS` and
    at least as many input channels as output channels (the gradient's rows are the
    products' rows, its columns their 64-wide panels: the projecting layers of an inverted
    residual; an expanding layer's few columns fill their panels badly, 160 -> 960 at 4x4
    took 18 ms against IM2COL_GEMM_BLOCKED's 2.2)."""
    return (usable_pointwise_sum(src, diff, grad, stride, pad, dilate)
            and src.shape[2] * src.shape[3] <= POINTWISE_SUM_MAX_POSITIONS
            and src.shape[1] >= diff.shape[1])  # fmt: skip


@bind_doc("backward_filter")
def bind_pointwise_sum(src: np.ndarray, diff: np.ndarray, grad: np.ndarray,
                       stride: Sequence[int], pad: Sequence[int], dilate: Sequence[int],
                       flip: bool = False) -> Callable[[], None]:  # fmt: skip
    """Bind the filter gradient of a dense pointwise convolution
    (:func:`usable_pointwise_sum`) as one sum of the samples' products,
    ``grad (OC, C) = sum over n of diff[n] (OC, L) @ src[n]^T (L, C)``, by
    :func:`.sgemm.bind_sgemm_sum`: both operands read in place (no columns, no copy of
    ``diff``), no per-sample products (POINTWISE_BATCHED_GEMM's buffer and its sum), the
    threads on disjoint columns of the gradient, each summing the samples in order.
    Measured on MobileNetV2's batch-32 projecting layers (``C -> OC``, interleaved best of 8,
    one thread, load 6-7), ms, against IM2COL_GEMM_BLOCKED (HEURISTIC's choice before) and
    POINTWISE_BATCHED_GEMM: 576 -> 96 at 8x8 2.8 / 10.5 / 8.0, 384 -> 64 at 8x8 1.1 / 1.4 /
    10, 192 -> 32 at 16x16 1.7 / 1.8 / 15, 960 -> 160 at 4x4 1.8-1.9 / 2.4 / 12."""
    needs = ("a dense float32 pointwise convolution of C-contiguous operands on AVX-512 "
             "(sgemm.ENABLED)")  # fmt: skip
    geo = checked("backward_filter", "POINTWISE_SGEMM_SUM", needs, usable_pointwise_sum,
                  src, diff, grad, stride, pad, dilate, flip)  # fmt: skip
    oc, c = geo.ocg, geo.icg
    a = diff.reshape(geo.n, oc, geo.l)
    b = src.reshape(geo.n, c, geo.l).swapaxes(1, 2)
    if grad.flags.c_contiguous and grad.flags.writeable:
        return sgemm.bind_sgemm_sum(a, b, grad.reshape(oc, c))
    res = workspace.empty((oc, c), _F32)
    return chain([sgemm.bind_sgemm_sum(a, b, res),
                  functools.partial(np.copyto, grad, res.reshape(grad.shape))])  # fmt: skip


register(ConvAlgorithm("IM2COL_GEMM_DIFF_NHWC", "backward_filter", bwd_filter_diff_nhwc, always,
                       priority=10))  # fmt: skip
register(ConvAlgorithm("IM2COL_GEMM_DIFF_ROWS", "backward_filter", bwd_filter_diff_rows, always))
register(ConvAlgorithm(
    "IM2COL_GEMM_BLOCKED", "backward_filter", bind_blocked, usable_blocked,
    priority=20, heuristic=preferred_blocked,
))  # fmt: skip
register(ConvAlgorithm(
    "POINTWISE_BATCHED_GEMM", "backward_filter", bind_pointwise_batched, usable_pointwise_batched,
    priority=30, heuristic=preferred_pointwise_batched,
))  # fmt: skip
register(ConvAlgorithm(
    "POINTWISE_SGEMM_SUM", "backward_filter", bind_pointwise_sum, usable_pointwise_sum,
    priority=40, heuristic=preferred_pointwise_sum,
))  # fmt: skip

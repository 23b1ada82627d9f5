"""Forward convolution as im2col + GEMM: IM2COL_GEMM (one GEMM per batch chunk),
IM2COL_GEMM_PER_SAMPLE (one GEMM per sample, short reductions) and CONV1X1_GEMM (a pointwise
convolution read in place).

The windows of a chunk of samples are copied once into a column buffer in the batch-inner
layout ``(C, *F, k, *O)``, so that one 2-d matmul per group, ``res[g] = W[g] @ col[g]`` with
``col[g]`` of shape ``(K, k * L)``, covers every sample; a copy puts the ``(OC, k, *O)`` result
into the ``(k, OC, *O)`` output (a one-sample chunk's GEMM writes the output itself). 2-d
float32/float64 columns are filled by the compiled loops of :mod:`.loops.im2col` straight from
the source (padding written as zeros by the loop), in chunks of at most
:data:`.common.CACHE_CHUNK_BYTES` (more for a larger filter matrix,
:meth:`.common._Conv.pipeline_chunk_bytes`), so that the GEMM reads the columns from the
cache the loop just wrote them to; with at least as many samples as kernel threads, each
thread runs its own im2col + GEMM pipeline over its part of the batch, BLAS single-threaded
(:func:`parallel.blas_single_threaded`), one fork/join per call; the pipelines' products run
in megbrain's GEMM (:mod:`..sgemm`, :data:`SGEMM`) where it is built, and a single piece of
work (one chunk) runs its im2col and its product each split over the threads. Other
convolutions (1-d, 3-d) read the source through a strided window view (``as_strided``) of a
zero-padded copy, one NumPy copy per chunk.

Measured on the 2-core machines (OpenBLAS, 2 threads): one GEMM per chunk beat per-sample
GEMMs threaded by OpenBLAS (the 8x64x56x56 3x3 forward went from 0.3x to about 0.9x
PyTorch); NumPy's stacked (1, M, K) @ (1, K, N) matmul ran 3-4x slower than the 2-d call on
the same operands. Under load, OpenBLAS's threads synchronising (and spinning) on every small
chunk's GEMM cost far more than the GEMMs (128x16x14x14 3x3 forward: 76 ms of CPU time
against 7 ms for the per-thread pipelines, PyTorch 9 ms).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from .. import gemm, sgemm, workspace
from ..parallel import split
from ..steps import Step, chain
from . import common
from . import epilogue as conv_epilogue
from .common import (
    _blasable,
    _chunk_pipelines,
    _contiguous,
    _Conv,
    _gemms,
    _geometry,
    _reshaped,
    _split_gemms,
    _swap01,
    compute_dtype,
)
from .loops import im2col as im2col_loops
from .registry import ConvAlgorithm, always, register

__all__ = ["PER_SAMPLE_MAX_K", "SGEMM"]

_partial = functools.partial
#: a forward convolution whose reduction (ICg * prod(F)) is at most this long runs one GEMM per
#: sample: measured on 2 cores, (16, 9) @ (9, 784) x 128 took 2 ms, the single
#: (16, 9) @ (9, 100352) GEMM 46 ms (OpenBLAS threads it); from K = 144 on, the single GEMM wins
PER_SAMPLE_MAX_K = 32
#: whether IM2COL_GEMM's per-thread pipelines run their products in :mod:`..sgemm`
SGEMM = True


def _pipeline_gemms(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> list[Step]:
    """A pipeline's products ``out[g] = a[g] @ b[g]`` on the calling thread:
    :func:`sgemm.group_products` while :data:`SGEMM` is set, else :func:`_gemms`."""
    return sgemm.group_products(a, b, out) if SGEMM else _gemms(a, b, out)


def _per_sample_out(geo: _Conv, out: np.ndarray, dt) -> np.ndarray | None:
    """``out`` as (N, G, OCg, L) when each sample's matrices are BLAS results, else None."""
    if out.dtype != dt:
        return None
    outm = _reshaped(out, (geo.n, geo.g, geo.ocg, geo.l))
    if outm is None or not outm.flags.writeable or (geo.n and not _blasable(outm[0])):
        return None
    return outm


def fwd_im2col_gemm(src, filt, out, stride, pad, dilate, flip=False) -> Callable[[], None]:
    """Forward IM2COL_GEMM: per batch chunk, the columns, one GEMM per group, then a copy of
    the ``(OC, k, *O)`` result into the output (a one-sample chunk's GEMM writes into the
    output itself).

    A 2-d convolution of several cache-sized chunks runs them on the kernel threads
    (:func:`_chunk_pipelines`); a single chunk's compiled im2col and its GEMM are each split
    over the threads (:func:`gemm.matmul_step`)."""
    geo = _geometry("forward", src, filt, out, stride, pad, dilate)
    dt = compute_dtype(src.dtype)
    steps: list[Step] = []
    wm = geo.filter_matrix(filt, flip, dt, steps)
    oc = geo.g * geo.ocg
    outm = _per_sample_out(geo, out, dt)

    def chunk_steps(a: int, b: int, colm: np.ndarray, res: np.ndarray | None,
                    gemms=_gemms) -> list[Step]:  # fmt: skip
        if b - a == 1 and outm is not None:
            return gemms(wm, colm, outm[a])
        res = res[: oc * (b - a) * geo.l]
        resv = _swap01(res.reshape(oc, b - a, *geo.oshape))
        return gemms(wm, colm, res.reshape(geo.g, geo.ocg, -1)) + [
            _partial(np.copyto, out[a:b], resv, "unsafe")
        ]

    def result_buffer(nb: int) -> np.ndarray | None:
        # the GEMM result ``(OC, k, *O)`` of a chunk, unless every chunk writes ``out``
        return workspace.empty((oc * nb * geo.l,), dt) if nb > 1 or outm is None else None

    rows = geo.c * math.prod(geo.fshape)
    units, width = _forward_units(geo, dt)
    if geo.compiled_loops(dt) and units and (len(units) > 1 or SGEMM):
        x = _contiguous(src, dt, steps)
        geom = (geo.stride, geo.pad, geo.dilate, geo.fshape)
        oh, ow = geo.oshape

        def slot():  # one thread's buffers: its columns and GEMM result
            res = workspace.empty((oc * width,), dt) if width > geo.l or outm is None else None
            return workspace.empty((rows * width,), dt), res

        def pipeline(buffers, a: int, b: int, i0: int, i1: int, whole: bool = True
                     ) -> list[Step]:  # fmt: skip
            cols = buffers[0][: rows * (b - a) * (i1 - i0) * ow].reshape(rows, -1)
            colm = cols.reshape(geo.g, geo.k, -1)
            if whole:
                fill = _partial(im2col_loops.im2col, x, cols, a, b, *geom, 0, rows, (i0, i1))
                gemms = _pipeline_gemms
            else:  # the only piece: its im2col and its GEMMs each split over the threads
                part = _partial(_im2col_rows, x, cols, a, b, geom, (i0, i1))
                per_row = max(1, (b - a) * (i1 - i0) * ow)
                fill = split(part, rows, -(-common.SPLIT_MIN_ELEMS // per_row))
                gemms = _partial(sgemm.group_products, split=True)
            if (i0, i1) == (0, oh):
                return [fill] + chunk_steps(a, b, colm, buffers[1], gemms)
            if outm is not None:  # a block of output rows of one sample, a view of ``out``
                return [fill] + gemms(wm, colm, outm[a][:, :, i0 * ow : i1 * ow])
            res = buffers[1][: oc * (i1 - i0) * ow]
            back = _partial(np.copyto, out[a, :, i0:i1], res.reshape(oc, i1 - i0, ow), "unsafe")
            return [fill] + gemms(wm, colm, res.reshape(geo.g, geo.ocg, -1)) + [back]

        if len(units) > 1:
            steps.append(_chunk_pipelines(units, slot, pipeline))
        else:
            steps += pipeline(slot(), *units[0], whole=False)
        return chain(steps)
    limit = common.CACHE_CHUNK_BYTES if geo.compiled_loops(dt) else None
    chunks = geo.im2col(src, dt, steps, limit)
    res = result_buffer(max((b - a for a, b, _, _ in chunks), default=0))
    for a, b, colm, fill in chunks:
        steps.append(fill)
        steps += chunk_steps(a, b, colm, res, _split_gemms)
    return chain(steps)


def _im2col_rows(x, cols, a: int, b: int, geom: tuple, out_rows: tuple, r0: int, r1: int
                 ) -> None:  # fmt: skip
    """The compiled im2col of column rows ``[r0, r1)`` (a part of a split fill)."""
    im2col_loops.im2col(x, cols, a, b, *geom, r0, r1, out_rows)


def _forward_units(geo: _Conv, dt) -> tuple[list[tuple[int, int, int, int]], int]:
    """The pieces ``(begin, end, row0, row1)`` (samples, output rows) a 2-d forward
    convolution's pipelines take, each of at most :meth:`_Conv.pipeline_chunk_bytes` of columns,
    and the most output positions one holds: whole samples in batch chunks, or, where one sample's
    columns are larger and the filter matrix is at most half the piece (it is re-read for
    each), blocks of output rows of one sample. Measured under load (wall, 2 threads) on
    ResNet50's batch-1 layers: 64x56x56 (7 MB of columns, a 147 KB filter) 11-12 ms in row
    blocks against 23-28 ms as one GEMM threaded by OpenBLAS; 128x28x28 (a 590 KB filter)
    lost in row blocks, 8-16 ms against 3.5-5."""
    rows = geo.c * math.prod(geo.fshape)
    nb, chunks = geo.chunks(dt, geo.pipeline_chunk_bytes(dt))
    oh = geo.oshape[0] if geo.nsp == 2 else 1
    per_row = rows * (geo.l // max(1, oh)) * dt.itemsize
    filt_bytes = geo.ocg * geo.k * dt.itemsize
    cache = common.CACHE_CHUNK_BYTES
    if geo.nsp != 2 or per_row * oh <= cache or 2 * filt_bytes > cache:
        return [(a, b, 0, oh) for a, b in chunks], nb * geo.l
    rb = max(1, min(oh, cache // max(1, per_row)))
    units = [(n, n + 1, i, min(oh, i + rb)) for n in range(geo.n) for i in range(0, oh, rb)]
    return units, rb * (geo.l // oh)



def fwd_per_sample_usable(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """Whether each sample's output is a writable BLAS result view of ``out``."""
    geo = _geometry("forward", src, filt, out, stride, pad, dilate)
    return _per_sample_out(geo, out, compute_dtype(src.dtype)) is not None


def fwd_per_sample_preferred(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """The heuristic: per-sample GEMMs for reductions of at most :data:`PER_SAMPLE_MAX_K`."""
    return _geometry("forward", src, filt, out, stride, pad, dilate).k <= PER_SAMPLE_MAX_K


def fwd_per_sample_gemm(src, filt, out, stride, pad, dilate, flip=False) -> Callable[[], None]:
    """Forward IM2COL_GEMM_PER_SAMPLE: the batch-inner columns, one GEMM per sample straight
    into the output (no result copy); 2-d chunks run on the kernel threads'
    :func:`_chunk_pipelines` (each per-sample GEMM joined by OpenBLAS's threads took 97 ms
    for 128x16x14x14 3x3 under load, 30x the pipelines)."""
    geo = _geometry("forward", src, filt, out, stride, pad, dilate)
    dt = compute_dtype(src.dtype)
    outm = _per_sample_out(geo, out, dt)
    if outm is None:
        raise ValueError(
            f"Convolution: output {out.shape} {out.dtype} (strides {out.strides}) is not a "
            "per-sample GEMM result"
        )
    steps: list[Step] = []
    wm = geo.filter_matrix(filt, flip, dt, steps)

    def gemms(a: int, b: int, colm: np.ndarray, group_gemms=_gemms) -> list[Step]:
        per = [group_gemms(wm, colm[:, :, i * geo.l : (i + 1) * geo.l], outm[a + i])
               for i in range(b - a)]  # fmt: skip
        return [s for sample in per for s in sample]

    rows = geo.c * math.prod(geo.fshape)
    nb, chunks = geo.chunks(dt, common.CACHE_CHUNK_BYTES)
    if geo.compiled_loops(dt) and len(chunks) > 1:
        x = _contiguous(src, dt, steps)
        geom = (geo.stride, geo.pad, geo.dilate, geo.fshape)

        def slot():  # one thread's columns
            return workspace.empty((rows * nb * geo.l,), dt)

        def pipeline(cflat, a: int, b: int) -> list[Step]:
            cols = cflat[: rows * (b - a) * geo.l].reshape(rows, -1)
            fill = _partial(im2col_loops.im2col, x, cols, a, b, *geom, 0, rows)
            return [fill] + gemms(a, b, cols.reshape(geo.g, geo.k, -1))

        steps.append(_chunk_pipelines(chunks, slot, pipeline))
        return chain(steps)
    limit = common.CACHE_CHUNK_BYTES if geo.compiled_loops(dt) else None
    for a, b, colm, fill in geo.im2col(src, dt, steps, limit):
        steps.append(fill)
        steps += gemms(a, b, colm, _split_gemms)
    return chain(steps)


def _pointwise_src(geo: _Conv, src: np.ndarray, dt) -> np.ndarray | None:
    """``src`` as (N, G, ICg, L) when each sample's matrices are BLAS operands as they are
    (a pointwise convolution's columns are its source), else None."""
    if not geo.pointwise or src.dtype != dt:
        return None
    srcm = _reshaped(src, (geo.n, geo.g, geo.icg, geo.l))
    if srcm is None or (geo.n and not _blasable(srcm[0])):
        return None
    return srcm


def fwd_1x1_usable(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """Whether the convolution is pointwise (1x1 filter, stride 1, no padding) and each
    sample's source and output are BLAS matrices as they are."""
    geo = _geometry("forward", src, filt, out, stride, pad, dilate)
    dt = compute_dtype(src.dtype)
    return _pointwise_src(geo, src, dt) is not None and _per_sample_out(geo, out, dt) is not None


def fwd_1x1_gemm(
    src, filt, out, stride, pad, dilate, flip=False, epilogue=None
) -> Callable[[], None]:
    """Forward CONV1X1_GEMM: a pointwise convolution is ``W @ x[n]`` for each sample, its
    source and output read and written in place (no columns, no result copy). The
    per-sample, per-group products run as :func:`gemm.products_step` does: at least one per
    thread, one product per thread at a time; fewer, each split over the threads. Measured
    at batch 1 (2 threads): ResNet50's 1x1 layers took 0.28-1.3 ms against 1.0-4.6 ms
    through IM2COL_GEMM's copies of the source. An ``epilogue``
    (:class:`.epilogue.Epilogue`) is applied to each part right after its product."""
    geo = _geometry("forward", src, filt, out, stride, pad, dilate)
    dt = compute_dtype(src.dtype)
    srcm, outm = _pointwise_src(geo, src, dt), _per_sample_out(geo, out, dt)
    if srcm is None or outm is None:
        raise ValueError(
            f"Convolution: CONV1X1_GEMM needs a pointwise convolution of BLAS matrices; got "
            f"src {src.shape} {src.dtype}, filter {filt.shape}, out {out.shape} {out.dtype}"
        )
    steps: list[Step] = []
    wm = geo.filter_matrix(filt, flip, dt, steps)
    pairs = [(i, g) for i in range(geo.n) for g in range(geo.g)]
    thens = None
    if epilogue is not None:  # act(out + bias) on each part while it is in cache
        thens = [conv_epilogue.rows_then(epilogue, g * geo.ocg) for _, g in pairs]
    steps.append(gemm.products_step([(wm[g], srcm[i, g], outm[i, g]) for i, g in pairs], thens))
    return chain(steps)


register(ConvAlgorithm(
    "IM2COL_GEMM_PER_SAMPLE", "forward", fwd_per_sample_gemm, fwd_per_sample_usable,
    priority=10, heuristic=fwd_per_sample_preferred,
))  # fmt: skip
register(ConvAlgorithm("IM2COL_GEMM", "forward", fwd_im2col_gemm, always))
register(ConvAlgorithm(
    "CONV1X1_GEMM", "forward", fwd_1x1_gemm, fwd_1x1_usable, priority=30, epilogue=True
))  # fmt: skip

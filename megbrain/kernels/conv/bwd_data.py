"""Backward data of a convolution through GEMMs: AS_FORWARD_CONV (a stride-1 gradient with a
"same" padding is the forward convolution of ``diff`` with the transposed, flipped filter) and
GEMM_COL2IM (the transposed GEMM ``W^T @ diff`` followed by col2im, compiled and pipelined per
thread, chunk by chunk, as the forward pass, for 2-d gradients, else one strided add per
filter offset).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from .. import parallel, sgemm, workspace
from ..parallel import split
from ..steps import Step, chain
from . import tapwise
from .common import (
    SPLIT_MIN_ELEMS,
    _chunk_pipelines,
    _Conv,
    _geometry,
    _interior,
    _offset_slices,
    _split_gemms,
    _swap01,
    compute_dtype,
)
from .loops import im2col as im2col_loops
from .registry import ConvAlgorithm, always, register
from .registry import bind as bind_chosen

__all__ = ["AS_FORWARD_MAX_GROWTH", "BAND_BYTES", "BAND_MAX_POSITIONS", "COL2IM_MAX_SAMPLE_BYTES"]

_partial = functools.partial

#: HEURISTIC takes GEMM_COL2IM's compiled pipelines over AS_FORWARD_CONV for a 2-d gradient
#: whose one sample's columns take at most this many bytes. Measured on one core (CPU time,
#: under load; PyTorch in brackets): 128x16x14x14 3x3 5.9 vs 16 ms (6.7), 64x20x12x12 5x5
#: 4.0 vs 19 (7.3), ResNet50's batch-1 7x7 7.2 vs 12.4 (7.2), 14x14 4.6 vs 6.2 (4.8), 28x28
#: 4.5 vs 4.7 (3.9, 3.6 MB of columns); at 56x56 (7.2 MB) the forward route won, 4.5 vs 5.5
COL2IM_MAX_SAMPLE_BYTES = 2 << 20
#: HEURISTIC runs a pointwise gradient (1x1, stride 1, no padding) as a forward convolution,
#: over col2im, when that forward sums at most this many channels (OCg): the forward 1x1
#: kernels beat the transposed GEMM on MobileNetV2's batch-32 layers (2 threads, interleaved:
#: 16x96 at 32x32 1.2 against 6.2 ms, 96x576 at 8x8 1.7 against 6.3, 144x24 at 32x32 2.4
#: against 3.4), not from 960 summed channels on 4x4 planes (160x960 1.7 against 1.3, 320x1280
#: 8.0 against 3.2)
AS_FORWARD_POINTWISE_MAX_CHANNELS = 768
#: GEMM_COL2IM of a dense 2-d gradient over at most this many output positions (the whole
#: batch) runs in bands of input channels (:func:`_col2im_bands`): each band's GEMM covers the
#: whole batch and its col2im reads the columns from the cache, where batch chunks wrote
#: columns larger than the cache and each re-read the whole filter matrix
BAND_MAX_POSITIONS = 1024
#: the bytes of one band's columns
BAND_BYTES = 1 << 20
#: backward data runs as a forward convolution when the gradient has at most this many times
#: the positions of ``diff`` (that GEMM has prod(S) columns, col2im's has prod(O))
AS_FORWARD_MAX_GROWTH = 1.25


def _as_forward_pad(geo: _Conv) -> tuple | None:
    """The padding ``dilate (F - 1) - pad`` making backward data a stride-1 forward convolution
    of ``diff`` with the transposed, flipped filter; None unless every stride is 1 and
    ``pad <= dilate (F - 1)``."""
    if any(s != 1 for s in geo.stride):
        return None
    tpad = tuple(d * (f - 1) - p for d, f, p in zip(geo.dilate, geo.fshape, geo.pad))
    return tpad if all(p >= 0 for p in tpad) else None


def _as_forward(geo: _Conv) -> tuple | None:
    """The heuristic's choice: :func:`_as_forward_pad` where the gradient is not much larger
    than ``diff`` (a "same" padding, :data:`AS_FORWARD_MAX_GROWTH`), else None."""
    if math.prod(geo.sshape) > AS_FORWARD_MAX_GROWTH * geo.l:
        return None
    return _as_forward_pad(geo)


def bwd_data_as_forward_usable(filt, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """Whether backward data is a stride-1 forward convolution (:func:`_as_forward_pad`)."""
    geo = _geometry("backward_data", filt, diff, grad, stride, pad, dilate)
    return _as_forward_pad(geo) is not None


def bwd_data_as_forward_preferred(filt, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """The heuristic: as a forward convolution for a "same" padding (:func:`_as_forward`),
    unless GEMM_COL2IM runs compiled with one sample's columns of at most
    :data:`COL2IM_MAX_SAMPLE_BYTES`; always for a depthwise gradient (one channel per group:
    the channel-wise forward kernels, where col2im runs one GEMM per channel) and for a
    pointwise one summing at most :data:`AS_FORWARD_POINTWISE_MAX_CHANNELS` channels."""
    geo = _geometry("backward_data", filt, diff, grad, stride, pad, dilate)
    if geo.g > 1 and geo.icg == geo.ocg == 1 or (
        geo.pointwise and geo.ocg <= AS_FORWARD_POINTWISE_MAX_CHANNELS
    ):
        return _as_forward_pad(geo) is not None
    tpad = _as_forward(geo)
    if tpad is not None and _tapwise_forward(filt, diff, grad, stride, tpad, dilate, flip):
        return True
    dt = compute_dtype(diff.dtype)
    per_sample = geo.c * math.prod(geo.fshape) * geo.l * dt.itemsize
    if geo.compiled_loops(dt) and per_sample <= COL2IM_MAX_SAMPLE_BYTES:
        return False
    return tpad is not None


def _tapwise_forward(filt, diff, grad, stride, tpad, dilate, flip) -> bool:
    """Whether the forward route would run TAPWISE_SGEMM: no products over the padding,
    where col2im's GEMM computes every tap of every position (ResNet-18's batch-32 3x3
    gradients, one thread, CPU: 256x8x8 30.5 -> 24.6 ms, 512x4x4 25.8 -> 19.8)."""
    args = (diff, filt.swapaxes(1, 2), grad, stride, tpad, dilate, not flip)
    return tapwise.usable_tapwise(*args) and tapwise.tapwise_preferred(*args)


def bwd_data_as_forward(filt, diff, grad, stride, pad, dilate, flip=False) -> Callable[[], None]:
    """Backward data AS_FORWARD_CONV: the forward convolution of ``diff`` padded by
    ``dilate (F - 1) - pad`` with the filter transposed (input and output channels swapped)
    and flipped; the forward algorithm is the HEURISTIC_REPRODUCIBLE one."""
    geo = _geometry("backward_data", filt, diff, grad, stride, pad, dilate)
    tpad = _as_forward_pad(geo)
    if tpad is None:
        raise ValueError(
            f"ConvolutionBackwardData: stride {geo.stride} / pad {geo.pad} is not a stride-1 "
            "forward convolution"
        )
    wt = filt.swapaxes(1, 2)
    return bind_chosen(
        "forward", diff, wt, grad, stride, tpad, dilate, not flip,
        strategy="HEURISTIC_REPRODUCIBLE",
    )  # fmt: skip


def bwd_data_gemm_col2im(filt, diff, grad, stride, pad, dilate, flip=False) -> Callable[[], None]:
    """Backward data GEMM_COL2IM: one GEMM ``W^T @ diff`` per batch chunk gives the columns,
    which col2im adds into a padded gradient (one strided add per filter offset)."""
    geo = _geometry("backward_data", filt, diff, grad, stride, pad, dilate)
    dt = compute_dtype(diff.dtype)
    steps: list[Step] = []
    wmt = geo.filter_matrix(filt, flip, dt, steps).transpose(0, 2, 1)  # (G, K, OCg)
    if geo.compiled_loops(dt):
        return _col2im_pipelines(geo, wmt, diff, grad, dt, steps)
    nb, chunks = geo.chunks(dt)
    diff_matrix = geo.batch_inner_matrix(diff, nb, dt, steps)
    # col2im into a padded gradient in the batch-inner layout ``(C, k, *Spad)``
    spad = tuple(s + 2 * p for s, p in zip(geo.sshape, geo.pad))
    tflat = workspace.empty((geo.c * nb * math.prod(spad),), dt)  # zeroed on every run below
    cflat = workspace.empty((geo.c * math.prod(geo.fshape) * nb * geo.l,), dt)
    offsets = list(_offset_slices(geo.fshape, geo.oshape, geo.stride, geo.dilate))
    for a, b in chunks:
        k = b - a
        dm = diff_matrix(a, b)
        dcol = cflat[: cflat.size // nb * k].reshape(geo.batch_inner(k))
        target = tflat[: tflat.size // nb * k].reshape(geo.c, k, *spad)
        steps += _split_gemms(wmt, dm, dcol.reshape(geo.g, geo.k, k * geo.l))
        steps.append(_partial(np.copyto, target, 0))
        for f, idx in offsets:
            t = target[idx]
            steps.append(_partial(np.add, t, dcol[(slice(None), *f)], t))
        inner = _swap01(_interior(target, geo.pad, geo.sshape))
        steps.append(_partial(np.copyto, grad[a:b], inner, "unsafe"))
    return chain(steps)


def _col2im_pipelines(geo: _Conv, wmt, diff, grad, dt, steps: list) -> Callable[[], None]:
    """GEMM_COL2IM of a 2-d gradient: per batch chunk of at most
    :meth:`.common._Conv.pipeline_chunk_bytes` of columns, the batch-inner copy of ``diff``,
    the GEMM ``W^T @ diff`` into the columns and the compiled :func:`im2col_loops.col2im`
    adding them into the gradient while they are in the cache; several chunks run on the
    kernel threads (:func:`_chunk_pipelines`), a single one with its col2im split over the
    channels; a dense gradient over few positions runs in bands of channels instead
    (:func:`_col2im_bands`)."""
    post: list[Step] = []
    target = grad
    if grad.dtype != dt or not grad.flags.c_contiguous or not grad.flags.writeable:
        target = workspace.empty(grad.shape, dt)
        post.append(_partial(np.copyto, grad, target, "unsafe"))
    rows = geo.c * math.prod(geo.fshape)
    geom = (geo.stride, geo.pad, geo.dilate, geo.fshape)
    if geo.g == 1 and 0 < geo.n * geo.l <= BAND_MAX_POSITIONS:
        return chain(steps + _col2im_bands(geo, wmt[0], diff, target, dt, geom) + post)
    nb, chunks = geo.chunks(dt, geo.pipeline_chunk_bytes(dt))

    def slot():  # one thread's buffers: the batch-inner diff and the columns
        copies: list[Step] = []
        cflat = workspace.empty((rows * nb * geo.l,), dt)
        return geo.batch_inner_matrix(diff, nb, dt, copies), copies, cflat

    def pipeline(buffers, a: int, b: int, whole: bool = True) -> list[Step]:
        diff_matrix, copies, cflat = buffers
        dm = diff_matrix(a, b)  # appends the copy of diff[a:b] to ``copies``
        cols = cflat[: rows * (b - a) * geo.l].reshape(rows, -1)
        back = _partial(im2col_loops.col2im, cols, target, a, b, *geom)
        min_channels = -(-SPLIT_MIN_ELEMS // max(1, math.prod(geo.sshape) * (b - a)))
        add = _partial(back, 0, geo.c) if whole else split(back, geo.c, min_channels)
        gemms = sgemm.group_products(wmt, dm, cols.reshape(geo.g, geo.k, -1), not whole)
        return [copies.pop()] + gemms + [add]

    if len(chunks) > 1:
        run = _chunk_pipelines(chunks, slot, pipeline)
    else:  # one chunk (or none): its GEMM and its col2im each split over the threads
        buffers = slot()
        run = chain([s for a, b in chunks for s in pipeline(buffers, a, b, whole=False)])
    return chain(steps + [run] + post)


def _col2im_bands(geo: _Conv, wt, diff, target, dt, geom) -> list[Step]:
    """GEMM_COL2IM of a dense 2-d gradient over few positions (:data:`BAND_MAX_POSITIONS`):
    ``diff`` copied batch-inner into an ``(OC, N * L)`` matrix (its channels split over the
    threads), then bands of input channels, about :data:`BAND_BYTES` of columns each and a
    multiple of the thread count of them, each thread its consecutive bands: the GEMM
    ``W^T[band] (rows, OC) @ diff (OC, N * L)`` and the col2im of the band's channels over
    the whole batch while its columns are in the cache. ``wt`` is the (K, OC) transposed
    filter matrix."""
    n, oc, pos = geo.n, geo.ocg, geo.n * geo.l
    nt = parallel.num_threads() if parallel.can_single_thread_blas() else 1
    dbuf = workspace.empty((oc, n, *geo.oshape), dt)
    copies = [_partial(np.copyto, dbuf[c0:c1], _swap01(diff[:, c0:c1]), "unsafe")
              for c0, c1 in parallel.ranges(oc, nt)]  # fmt: skip
    dm = dbuf.reshape(oc, pos)
    per_channel = math.prod(geo.fshape)
    width = max(1, BAND_BYTES // (per_channel * pos * dt.itemsize))
    count = -(-geo.c // width)
    bands = parallel.ranges(geo.c, -(-count // nt) * nt)
    calls = []
    for lo, hi in parallel.ranges(len(bands), nt):
        most = max(c1 - c0 for c0, c1 in bands[lo:hi])
        colbuf = workspace.empty((most * per_channel * pos,), dt)
        work: list[Step] = []
        for c0, c1 in bands[lo:hi]:
            r0, r1 = c0 * per_channel, c1 * per_channel
            cols = colbuf[: (r1 - r0) * pos].reshape(r1 - r0, pos)
            work.append(sgemm.product_step(wt[r0:r1], dm, cols))
            work.append(_partial(im2col_loops.col2im, cols, target, 0, n, *geom, c0, c1, r0))
        calls.append(chain(work))
    return [parallel.concurrently(copies), parallel.concurrently_blas_single_threaded(calls)]


register(ConvAlgorithm(
    "AS_FORWARD_CONV", "backward_data", bwd_data_as_forward, bwd_data_as_forward_usable,
    priority=10, heuristic=bwd_data_as_forward_preferred,
))  # fmt: skip
register(ConvAlgorithm("GEMM_COL2IM", "backward_data", bwd_data_gemm_col2im, always))

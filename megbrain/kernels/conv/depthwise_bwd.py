"""Backward passes of depthwise 2-d convolutions (one input and one output channel per group):
DIRECT_DEPTHWISE for the data gradient and for the filter gradient, float32, any stride,
padding and dilation.

im2col + GEMM runs them as one GEMM per channel, each a 1-row product: in MobileNetV2's
training step at batch 32 the Python cost of those hundreds of tiny GEMMs made the depthwise
layers' backward passes half of the step (a 576-channel 3x3 filter gradient on 8x8 planes took
25 ms for 10.6 M multiply-adds). Here compiled loops (:mod:`.loops.depthwise_bwd`) run each
channel's planes, the diff first spread where its outputs read the zero-padded source plane so
that each tap is one vectorized pass over the plane at any stride: the filter gradient as
float32 sums over spans of the plane (the planes of a few samples stacked when they are
small), each span's sum added in float64; the data gradient as the spread diff, times each
tap, added into a zero-padded plane. The channels are split over :func:`.common.threads`
Python threads, each with its scratch from
:func:`workspace.empty`; nothing is allocated when the bound callable runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from .. import parallel, workspace
from ..steps import chain
from .common import bind_doc, checked, threads
from .loops import depthwise_bwd as loops
from .registry import ConvAlgorithm, register

__all__ = [
    "bind_depthwise_data_grad",
    "bind_depthwise_filter_grad",
    "preferred_data_grad",
    "preferred_filter_grad",
    "usable_depthwise_bwd",
]

#: the channels are split over threads only when each thread gets at least this many
_MIN_SPLIT_CHANNELS = 4
_F32 = np.dtype(np.float32)
#: the filter gradient stacks the padded planes of this many positions' worth of samples
#: (at least one), so that a tap's pass is long on small planes (16 KB a plane: L1)
_CHUNK_POSITIONS = 4096


def usable_depthwise_bwd(a, b, out, stride, pad, dilate, flip=False) -> bool:
    """Whether the DIRECT_DEPTHWISE backward passes accept the operands (in either kind's
    order): 2-d, float32, C-contiguous, one input and one output channel per group (the
    grouped filter is ``(C, 1, 1, FH, FW)``), non-negative padding."""
    arrays = (a, b, out)
    filt = next((x for x in arrays if x.ndim == 5), None)
    return (
        filt is not None
        and filt.shape[1] == filt.shape[2] == 1
        and all(x.dtype == _F32 and x.flags.c_contiguous for x in arrays)
        and all(x.ndim == 4 for x in arrays if x is not filt)
        and all(p >= 0 for p in pad)
    )


def _split(geo, make: Callable[[int, int, int], Callable[[], None]]) -> Callable[[], None]:
    """One call per thread over its range of channels; ``make(part, c0, c1)``."""
    parts = parallel.ranges(geo.c, threads(), _MIN_SPLIT_CHANNELS)
    return parallel.concurrently([make(i, c0, c1) for i, (c0, c1) in enumerate(parts)])


@bind_doc("backward_filter")
def bind_depthwise_filter_grad(src: np.ndarray, diff: np.ndarray, grad: np.ndarray,
                               stride: Sequence[int], pad: Sequence[int], dilate: Sequence[int],
                               flip: bool = False) -> Callable[[], None]:  # fmt: skip
    """Bind the filter gradient of a depthwise convolution (:func:`usable_depthwise_bwd`)."""
    geo = checked("backward_filter", "DIRECT_DEPTHWISE", "a float32 depthwise convolution",
                  usable_depthwise_bwd, src, diff, grad, stride, pad, dilate, flip)  # fmt: skip
    if geo.c == 0:
        return chain([])
    if geo.n == 0 or 0 in geo.oshape:
        return functools.partial(grad.fill, 0)
    taps = grad.shape[3] * grad.shape[4]
    hp, wp = loops.plane_shape(geo.oshape, geo.fshape, geo.stride, geo.dilate)
    parts = parallel.ranges(geo.c, threads(), _MIN_SPLIT_CHANNELS)
    k = max(1, min(geo.n, _CHUNK_POSITIONS // (hp * wp)))
    planes = workspace.empty((len(parts), 2, k * hp, wp), _F32)
    acc = workspace.empty((len(parts), max(c1 - c0 for c0, c1 in parts) * taps), np.float64)
    return _split(geo, lambda i, c0, c1: functools.partial(
        loops.filter_grad, src, diff, grad, planes[i, 0], planes[i, 1], acc[i],
        geo.stride, geo.pad, geo.dilate, flip, c0, c1))  # fmt: skip


@bind_doc("backward_data")
def bind_depthwise_data_grad(filt: np.ndarray, diff: np.ndarray, grad: np.ndarray,
                             stride: Sequence[int], pad: Sequence[int], dilate: Sequence[int],
                             flip: bool = False) -> Callable[[], None]:  # fmt: skip
    """Bind the data gradient of a depthwise convolution (:func:`usable_depthwise_bwd`)."""
    geo = checked("backward_data", "DIRECT_DEPTHWISE", "a float32 depthwise convolution",
                  usable_depthwise_bwd, filt, diff, grad, stride, pad, dilate, flip)  # fmt: skip
    if geo.c == 0 or geo.n == 0:
        return chain([])
    if 0 in geo.oshape:
        return functools.partial(grad.fill, 0)
    hp, wp = loops.plane_shape(geo.oshape, geo.fshape, geo.stride, geo.dilate)
    n_parts = len(parallel.ranges(geo.c, threads(), _MIN_SPLIT_CHANNELS))
    planes = workspace.empty((n_parts, 2, hp, wp), _F32)
    return _split(geo, lambda i, c0, c1: functools.partial(
        loops.data_grad, filt, diff, grad, planes[i, 0], planes[i, 1], geo.stride, geo.pad,
        geo.dilate, flip, c0, c1))  # fmt: skip


def preferred_data_grad(filt, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """HEURISTIC's rule for the data gradient: usable, at a stride other than 1 (at stride 1
    AS_FORWARD_CONV runs it as the forward depthwise kernel, faster: 1.3 against 2.6 ms on
    32x384x8x8; at stride 2, 15 against GEMM_COL2IM's 33 ms on 32x144x32x32, 3.7 against 27
    on 32x576x8x8)."""
    return usable_depthwise_bwd(filt, diff, grad, stride, pad, dilate) and tuple(stride) != (1, 1)


def preferred_filter_grad(src, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """HEURISTIC's rule for the filter gradient: wherever usable (one pass per tap over the
    whole plane, the diff spread at strides other than 1: 17 against IM2COL_GEMM_BLOCKED's
    42 ms on 32x144x32x32, 4 against 13 on 32x384x8x8; at stride 2, 4.2 against 9-14 on
    32x576x8x8, CPU time under load)."""
    return usable_depthwise_bwd(src, diff, grad, stride, pad, dilate)


for _kind, _bind, _preferred in (
    ("backward_data", bind_depthwise_data_grad, preferred_data_grad),
    ("backward_filter", bind_depthwise_filter_grad, preferred_filter_grad),
):
    register(ConvAlgorithm("DIRECT_DEPTHWISE", _kind, _bind, usable_depthwise_bwd, priority=25,
                           heuristic=_preferred))  # fmt: skip

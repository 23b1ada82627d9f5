"""Direct channel-wise (depthwise) NCHW convolution (CHANNELWISE_NCHW): one input and one
output channel per group, 2-d, float32, any filter size, stride, padding and dilation, any
channel count, the ConvBias epilogue (bias, ReLU, H_SWISH, ReLU6, SiLU) applied as each output
row is written.

ShuffleNet's depthwise layers (58, 116, 232 channels: not a multiple of 8, so they stay in
NCHW) are 3x3, padding 1, stride 1 or 2: those (without a SiLU tail) a compiled loop
(:func:`.loops.channelwise.rows3_nchw`) computes straight from the source, a column of a
vector of outputs down the plane at a time, each tap a masked load (the padding's lanes read
nothing), a stride-2 tap two loads whose even lanes are kept; no copy of the plane. Other
layers: each (sample, channel) plane is split into its zero-padded stride phases, as
DIRECT_GROUPED does (every tap a contiguous read at any stride), then a compiled loop
(:func:`.loops.channelwise.channelwise_nchw`) sums every tap of a tile of 64 positions (four
AVX-512 vectors) in registers. Either sums in filter order, per filter row then the rows
(reproducible). The planes are split over :func:`.common.threads` Python threads, each with
its scratch from :func:`workspace.empty`; nothing is allocated when the bound callable runs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np

from .. import parallel, workspace
from ..steps import chain
from .common import _flipped, bind_doc, checked, threads
from .epilogue import Epilogue, epilogue_operands
from .loops import channelwise as loops
from .nchw8c import units_as_they_go
from .pointwise import _flat, _planes_contiguous, filter_matrix
from .registry import ConvAlgorithm, register

__all__ = [
    "MAX_TAPS",
    "bind_channelwise_forward",
    "preferred_channelwise_forward",
    "usable_channelwise_forward",
]

#: the most filter taps accepted: each output is one float32 running sum over them
MAX_TAPS = 49
#: the planes are split over threads only when each thread gets at least this many
_MIN_SPLIT_PLANES = 4
#: the 3x3 loop runs on one thread below this many multiply-adds (about 20 us of work: waking
#: a second thread cost more than it saved on ShuffleNet's 7x7 and 14x14 planes)
_MIN_SPLIT_MACS = 1 << 18
#: the 3x3 loop's units (taken as they go) hold at most this many planes, and each thread
#: gets at least this many units where there are enough planes
_UNIT_PLANES, _UNITS_PER_THREAD = 8, 8
_F32 = np.dtype(np.float32)


def usable_channelwise_forward(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """Whether :func:`bind_channelwise_forward` accepts the convolution: 2-d, float32, one
    input and one output channel per group, at most :data:`MAX_TAPS` filter taps,
    non-negative padding, each plane of the source and output contiguous."""
    return (
        src.ndim == 4
        and src.dtype == filt.dtype == out.dtype == _F32
        and filt.shape[1] == filt.shape[2] == 1
        and math.prod(filt.shape[3:]) <= MAX_TAPS
        and all(p >= 0 for p in pad)
        and _planes_contiguous(src)
        and _planes_contiguous(out)
    )


def preferred_channelwise_forward(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """HEURISTIC's rule: wherever usable."""
    return usable_channelwise_forward(src, filt, out, stride, pad, dilate, flip)


def _rows3(geo, epi: int) -> bool:
    """Whether the convolution is a 3x3 one, padding 1, stride 1 or 2 both ways, no dilation
    and no SiLU tail: the loop reading the source in place (:func:`.loops.channelwise.
    rows3_nchw`) computes it."""
    return (
        tuple(geo.fshape) == (3, 3)
        and tuple(geo.pad) == (1, 1)
        and tuple(geo.dilate) == (1, 1)
        and geo.stride[0] == geo.stride[1] in (1, 2)
        and not epi & ~loops.ROWS3_BITS
    )


@bind_doc("forward", epilogue=True)
def bind_channelwise_forward(src: np.ndarray, filt: np.ndarray, out: np.ndarray,
                             stride: Sequence[int], pad: Sequence[int], dilate: Sequence[int],
                             flip: bool = False, epilogue: Epilogue | None = None
                             ) -> Callable[[], None]:  # fmt: skip
    """Bind the depthwise convolution ``out = conv(src, filt)`` as a direct one: 2-d,
    float32, one channel per group, at most :data:`MAX_TAPS` taps
    (:func:`usable_channelwise_forward`); any strides, padding and dilation."""
    needs = f"a 2-d float32 depthwise convolution of at most {MAX_TAPS} taps"
    geo = checked("forward", "CHANNELWISE_NCHW", needs, usable_channelwise_forward, src, filt,
                  out, stride, pad, dilate, flip)  # fmt: skip
    oh, ow = geo.oshape
    planes = geo.n * geo.g
    if planes == 0 or oh <= 0 or ow <= 0:
        return chain([])
    steps = []
    taps = math.prod(geo.fshape)
    w = filter_matrix(_flipped(filt, 2) if flip else filt, (geo.g, taps), steps)
    bias, epi = epilogue_operands(epilogue, steps)
    it = src.itemsize
    x, y = _flat(src, False), _flat(out, True)
    if _rows3(geo, epi):
        macs = planes * oh * ow * 9
        nthreads = 1 if macs < _MIN_SPLIT_MACS else max(
            1, min(threads(), planes // max(1, _MIN_SPLIT_PLANES)))
        per = max(1, min(_UNIT_PLANES, planes // (_UNITS_PER_THREAD * nthreads)))
        dims = np.array([geo.c, *geo.sshape, oh, ow, geo.stride[0], src.strides[0] // it,
                         src.strides[1] // it, out.strides[0] // it, out.strides[1] // it,
                         per, planes], np.int64)  # fmt: skip

        def bind_part(counter: np.ndarray, me: int):
            return loops.rows3_nchw(x, w, y, bias, dims, epi, counter, me)

        steps.append(units_as_they_go(-(-planes // per), bind_part, nthreads))
        return chain(steps)
    (sh, sw), (dh, dw) = geo.stride, geo.dilate
    hq, wq, size = loops.scratch_size(geo.oshape, geo.fshape, geo.stride, geo.dilate)
    fh, fw = geo.fshape
    offs = np.array([(((a * dh) % sh) * sw + (b * dw) % sw) * hq * wq
                     + (a * dh) // sh * wq + (b * dw) // sw
                     for a in range(fh) for b in range(fw)], np.int64)  # fmt: skip
    dims = np.array([geo.c, *geo.sshape, oh, ow, sh, sw, *geo.pad, hq, wq,
                     src.strides[0] // it, src.strides[1] // it,
                     out.strides[0] // it, out.strides[1] // it, fw], np.int64)  # fmt: skip
    parts = parallel.ranges(planes, threads(), _MIN_SPLIT_PLANES)
    scratch = workspace.empty((len(parts), size), _F32)
    calls = [functools.partial(loops.channelwise_nchw, x, w, y, scratch[i], bias,
                               offs, dims,
                               epi, p0, p1)
             for i, (p0, p1) in enumerate(parts)]  # fmt: skip
    steps.append(parallel.concurrently(calls))
    return chain(steps)


register(ConvAlgorithm(
    "CHANNELWISE_NCHW", "forward", bind_channelwise_forward, usable_channelwise_forward,
    priority=23, heuristic=preferred_channelwise_forward, epilogue=True, hswish=True,
    relu6=True, silu=True,
))  # fmt: skip

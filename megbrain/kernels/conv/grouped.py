"""Direct grouped convolution for few input channels per group (depthwise convolutions):
2-d, float32, any stride, padding and dilation, ``ICg * FH * FW <= MAX_K``, with ConvBias's
bias and ReLU applied as each row is written (an epilogue).

MobileNet, EfficientNet, MnasNet, ShuffleNet and ConvNeXt run depthwise 3x3, 5x5 and 7x7
convolutions at strides 1 and 2. im2col + GEMM runs one GEMM per group there, each a
1-row product of a 9 to 49 long reduction: the Python cost of a few hundred tiny GEMMs
dominates (a 576-channel 3x3/s2 depthwise layer on a 14x14 plane took 5.8 ms for 0.25 M
multiply-adds). Here a compiled loop (:func:`.loops.grouped.grouped_conv2d`) computes each
(sample, channel) plane in a fixed order (reproducible): it splits the channel's source into
its zero-padded stride phases, so that every filter tap is one contiguous, vectorized pass
over the whole output plane, at any stride. The planes are split over
:func:`.common.threads` Python threads, each with its scratch from :func:`workspace.empty`;
nothing is allocated when the bound callable runs. CHANNELWISE_NCHW (:mod:`.channelwise`,
its taps summed in registers) comes first for the depthwise convolutions of one output per
channel and contiguous planes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np

from .. import parallel, workspace
from ..steps import chain
from . import direct
from .common import bind_doc, checked, threads
from .epilogue import Epilogue
from .loops import grouped as loops
from .registry import ConvAlgorithm, register

__all__ = ["MAX_K", "bind_grouped_forward", "preferred_grouped_forward", "usable_grouped_forward"]

#: the longest reduction (ICg * FH * FW) accepted: each output is a float32 sum over it (a
#: two-level one: per filter row, then the rows); a longer one belongs to a GEMM
MAX_K = 256
#: HEURISTIC takes it for depthwise convolutions (one input channel per group) with a filter
#: of at most this many taps (ConvNeXt's 7x7)
PREFERRED_MAX_TAPS = 49
#: the planes are split over threads only when each thread gets at least this many
_MIN_SPLIT_PLANES = 8
_F32 = np.dtype(np.float32)
_NO_BIAS = np.zeros(1, _F32)


def usable_grouped_forward(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """Whether :func:`bind_grouped_forward` accepts the convolution: 2-d, float32 operands,
    ``ICg * FH * FW <= MAX_K``, non-negative padding."""
    return (
        src.ndim == 4
        and src.dtype == filt.dtype == out.dtype == _F32
        and math.prod(filt.shape[2:]) <= MAX_K
        and all(p >= 0 for p in pad)
    )


def preferred_grouped_forward(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """HEURISTIC's rule: usable, one input channel per group, at most
    :data:`PREFERRED_MAX_TAPS` filter taps, and a stride other than 1 or more taps than the
    stride-1 DIRECT convolution takes (:data:`.direct.PREFERRED_MAX_K`; it reads the padded
    source in place and stays faster there: 0.6 against 1.1 ms on 32x112x112 3x3)."""
    return usable_grouped_forward(src, filt, out, stride, pad, dilate, flip) and (
        filt.shape[2] == 1
        and math.prod(filt.shape[3:]) <= PREFERRED_MAX_TAPS
        and (tuple(stride) != (1, 1) or math.prod(filt.shape[3:]) > direct.PREFERRED_MAX_K)
    )


@bind_doc("forward", epilogue=True)
def bind_grouped_forward(src: np.ndarray, filt: np.ndarray, out: np.ndarray,
                         stride: Sequence[int], pad: Sequence[int], dilate: Sequence[int],
                         flip: bool = False, epilogue: Epilogue | None = None
                         ) -> Callable[[], None]:  # fmt: skip
    """Bind the grouped convolution ``out = conv(src, filt)`` as a direct one: 2-d, float32,
    ``ICg * FH * FW <= MAX_K`` (:func:`usable_grouped_forward`); any strides, padding and
    dilation."""
    needs = f"a 2-d float32 convolution with ICg*FH*FW <= {MAX_K}"
    geo = checked("forward", "DIRECT_GROUPED", needs, usable_grouped_forward, src, filt, out,
                  stride, pad, dilate, flip)  # fmt: skip
    oh, ow = geo.oshape
    planes = geo.n * geo.g * geo.ocg
    if planes == 0 or oh <= 0 or ow <= 0:
        return chain([])
    if epilogue is None:
        bias, act = _NO_BIAS, 0
    else:
        bias, act = epilogue.bias, 2 if epilogue.relu else 1
    hq, wq, size = loops.scratch_size(geo.oshape, geo.fshape, geo.stride, geo.dilate)
    parts = parallel.ranges(planes, threads(), _MIN_SPLIT_PLANES)
    scratch = workspace.empty((len(parts), size), _F32)
    calls = [functools.partial(loops.grouped_conv2d, src, filt, out, scratch[i], bias, act,
                               geo.stride, geo.pad, geo.dilate, hq, wq, flip, p0, p1)
             for i, (p0, p1) in enumerate(parts)]  # fmt: skip
    return parallel.concurrently(calls)


register(ConvAlgorithm(
    "DIRECT_GROUPED", "forward", bind_grouped_forward, usable_grouped_forward,
    priority=22, heuristic=preferred_grouped_forward, epilogue=True,
))  # fmt: skip

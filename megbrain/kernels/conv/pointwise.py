"""Direct NCHW pointwise convolution (DIRECT_POINTWISE): 1x1 filter, stride 1, no padding,
float32, any channel count, the ConvBias epilogue (bias, ReLU, H_SWISH, ReLU6) applied as the
output is written.

ShuffleNet's 1x1 layers (58, 116, 232 channels: not a multiple of 8, so they stay in NCHW)
and every NCHW model's short-reduction 1x1 layers went through CONV1X1_GEMM, one BLAS GEMM
per sample whose packing of a short reduction (24 to 232 input channels) cost as much as its
arithmetic. Here a compiled loop (:func:`.loops.pointwise.pointwise_nchw`) keeps a tile of a
few output channels by 16-32 positions in registers over the whole reduction, each step one
broadcast filter value times a vector of the source read in place (each plane of positions
contiguous, any sample and channel strides); the positions are split over
:func:`.common.threads` Python threads. Sums run in input-channel order (reproducible).
Nothing is allocated when the bound callable runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import parallel, workspace
from ..steps import chain
from .common import _is_pointwise, _reshaped, bind_doc, checked, threads
from .epilogue import Epilogue, epilogue_operands
from .loops import pointwise as loops
from .loops.nchw8c import readonly_view
from .registry import ConvAlgorithm, register

__all__ = [
    "MAX_K",
    "PREFERRED_MAX_K",
    "bind_pointwise_forward",
    "filter_matrix",
    "preferred_pointwise_forward",
    "usable_pointwise_forward",
]

#: the longest reduction (input channels per group) accepted: each output is one float32
#: running sum over it
MAX_K = 1024
#: HEURISTIC takes it over CONV1X1_GEMM up to this many input channels per group
PREFERRED_MAX_K = 256
#: the position blocks are split over threads only when each thread gets at least this many
_MIN_SPLIT_BLOCKS = 2
_F32 = np.dtype(np.float32)


def _planes_contiguous(a: np.ndarray) -> bool:
    """Whether each (sample, channel) plane of the 4-d ``a`` is C-contiguous, the sample and
    channel strides non-negative multiples of the item size (an empty ``a``: trivially)."""
    it = a.itemsize
    h, w = a.shape[2:]
    return a.size == 0 or (
        (w == 1 or a.strides[3] == it)
        and (h == 1 or a.strides[2] == w * it)
        and all(s >= 0 and s % it == 0 for s in a.strides[:2])
    )


def usable_pointwise_forward(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """Whether :func:`bind_pointwise_forward` accepts the convolution: 2-d pointwise (1x1,
    stride 1, no padding), float32, ``1 <= ICg <= MAX_K``, at least one vector of positions
    (:func:`.tiled_jit.vector_width`), each plane of the source and output contiguous."""
    return (
        src.ndim == 4
        and src.dtype == filt.dtype == out.dtype == _F32
        and _is_pointwise(filt.shape[3:], stride, pad)
        and 1 <= filt.shape[2] <= MAX_K
        and out.shape[2] * out.shape[3] >= loops.block_positions() // loops.VECS
        and _planes_contiguous(src)
        and _planes_contiguous(out)
    )


def preferred_pointwise_forward(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """HEURISTIC's rule: usable and ``ICg <= PREFERRED_MAX_K``."""
    return usable_pointwise_forward(src, filt, out, stride, pad, dilate, flip) and (
        filt.shape[2] <= PREFERRED_MAX_K
    )


def filter_matrix(filt: np.ndarray, shape: tuple, steps: list) -> np.ndarray:
    """``filt`` as a read-only C-contiguous float32 array of ``shape``: a view where it is
    one, else a workspace copy that a step appended to ``steps`` refreshes at every run."""
    w = _reshaped(filt, shape)
    if w is None or not w.flags.c_contiguous:
        w = workspace.empty(shape, _F32)
        steps.append(functools.partial(np.copyto, w.reshape(filt.shape), filt))
    return readonly_view(w)


def _flat(a: np.ndarray, writeable: bool) -> np.ndarray:
    """A 1-d view of ``a``'s memory from its first element to its last (non-negative
    strides)."""
    span = 1 + sum((n - 1) * s for n, s in zip(a.shape, a.strides)) // a.itemsize
    return as_strided(a, (span,), (a.itemsize,), writeable=writeable)


@bind_doc("forward", epilogue=True)
def bind_pointwise_forward(src: np.ndarray, filt: np.ndarray, out: np.ndarray,
                           stride: Sequence[int], pad: Sequence[int], dilate: Sequence[int],
                           flip: bool = False, epilogue: Epilogue | None = None
                           ) -> Callable[[], None]:  # fmt: skip
    """Bind the grouped pointwise convolution ``out = conv(src, filt)`` as a direct one:
    2-d, 1x1, stride 1, no padding, float32, ``ICg <= MAX_K``, each plane contiguous
    (:func:`usable_pointwise_forward`)."""
    needs = f"a 2-d float32 pointwise convolution with ICg <= {MAX_K} and contiguous planes"
    geo = checked("forward", "DIRECT_POINTWISE", needs, usable_pointwise_forward, src, filt, out,
                  stride, pad, dilate, flip)  # fmt: skip
    if geo.n == 0 or geo.g * geo.ocg == 0:
        return chain([])
    steps = []
    w = filter_matrix(filt, (geo.g * geo.ocg, geo.icg), steps)
    bias, epi = epilogue_operands(epilogue, steps)
    it = src.itemsize
    npos = loops.block_positions()
    if geo.l < npos:
        npos //= loops.VECS
    blocks = -(-geo.l // npos)
    dims = np.array([geo.n, geo.g, geo.ocg, geo.icg, geo.l, blocks,
                     src.strides[0] // it, src.strides[1] // it,
                     out.strides[0] // it, out.strides[1] // it], np.int64)  # fmt: skip
    x, y = _flat(src, False), _flat(out, True)
    wf = w.reshape(-1)
    parts = parallel.ranges(geo.n * blocks, threads(), _MIN_SPLIT_BLOCKS)
    calls = [functools.partial(loops.pointwise_nchw, x, wf, y, bias, dims, epi, u0, u1)
             for u0, u1 in parts]  # fmt: skip
    steps.append(parallel.concurrently(calls))
    return chain(steps)


register(ConvAlgorithm(
    "DIRECT_POINTWISE", "forward", bind_pointwise_forward, usable_pointwise_forward,
    priority=31, heuristic=preferred_pointwise_forward, epilogue=True, hswish=True, relu6=True,
))  # fmt: skip

"""Direct 2-d convolution for short reductions (first layers on 1- or 3-channel images):
stride 1, any padding, dilation and group count, ``ICg * FH * FW <= MAX_K``.

With a reduction of 9 or 25 products (a 3x3 or 5x5 filter on one channel), im2col + GEMM
copies the input 9 or 25 times for a GEMM too thin to keep BLAS busy. Here each (sample,
output channel) plane is accumulated by a compiled loop (:func:`.loops.direct.direct_conv2d`)
straight from a zero-padded copy of the source: one contiguous, vectorized pass over the
plane per (input channel, three offsets of a filter row), in a fixed order (reproducible).
The planes are split over :func:`.common.threads` Python threads.

The padded source is a private buffer whose border is written once (its interior is
refreshed on every run); the accumulators and the float32 copies of float16/bfloat16
operands come from :func:`workspace.empty`; nothing is allocated when the bound callable
runs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np

from .. import parallel, workspace
from ..steps import Step, chain
from .common import _padded, bind_doc, checked, compute_dtype, threads
from .loops import direct as direct_loops
from .registry import ConvAlgorithm, register

__all__ = [
    "MAX_K",
    "PREFERRED_MAX_K",
    "bind_direct_backward_data",
    "bind_direct_forward",
    "preferred_direct_backward_data",
    "preferred_direct_forward",
    "usable_direct_backward_data",
    "usable_direct_forward",
]

#: the longest reduction (ICg * FH * FW) the direct convolution accepts: each output is one
#: float32 running sum over it
MAX_K = 1600
#: HEURISTIC takes the direct convolution for one input channel per group and a reduction of
#: at most this length. Measured (one thread, CPU time) against im2col's per-sample GEMMs:
#: 128x1x28x28 3x3 (K = 9) 1.6 vs 2.8 ms, 64x1x28x28 5x5 (K = 25) 1.6 vs 2.0 ms; it also won
#: for 64x2x28x28 3x3 (1.6 vs 2.9), 32x3x32x32 3x3 (1.9 vs 3.2) and 64x8x14x14 3x3 (K = 72,
#: 1.7 vs 2.3), which HEURISTIC leaves to im2col for now (PROFILE finds them)
PREFERRED_MAX_K = 25
#: the planes are split over threads only when each thread gets at least this many
#: (sample, channel) planes (each thread's call costs a few microseconds)
_MIN_SPLIT_PLANES = 8


def usable_direct_forward(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """Whether :func:`bind_direct_forward` accepts the convolution: 2-d, stride 1,
    floating point, ``ICg * FH * FW <= MAX_K``."""
    try:
        compute_dtype(src.dtype)
    except ValueError:
        return False
    return (
        src.ndim == 4
        and tuple(stride) == (1, 1)
        and math.prod(filt.shape[2:]) <= MAX_K
        and all(p >= 0 for p in pad)
    )


def preferred_direct_forward(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """HEURISTIC's rule: usable, ``ICg == 1`` and ``FH * FW <= PREFERRED_MAX_K``."""
    return usable_direct_forward(src, filt, out, stride, pad, dilate, flip) and (
        filt.shape[2] == 1 and math.prod(filt.shape[2:]) <= PREFERRED_MAX_K
    )


@bind_doc("forward")
def bind_direct_forward(src: np.ndarray, filt: np.ndarray, out: np.ndarray, stride: Sequence[int],
                        pad: Sequence[int], dilate: Sequence[int], flip: bool = False
                        ) -> Callable[[], None]:  # fmt: skip
    """Bind the grouped convolution ``out = conv(src, filt)`` as a direct convolution: 2-d,
    stride 1, ``ICg * FH * FW <= MAX_K`` (:func:`usable_direct_forward`); any strides."""
    needs = f"a 2-d convolution with stride 1 and ICg*FH*FW <= {MAX_K}"
    geo = checked("forward", "direct", needs, usable_direct_forward, src, filt, out, stride, pad,
                  dilate, flip)  # fmt: skip
    dt = compute_dtype(src.dtype)
    steps: list[Step] = []
    post: list[Step] = []
    xp = _padded(src, geo.pad, dt, 0, steps)
    if not xp.flags.c_contiguous:
        xp = workspace.empty(src.shape, dt)
        steps.append(functools.partial(np.copyto, xp, src, "unsafe"))
    w = filt
    if filt.dtype != dt:
        w = workspace.empty(filt.shape, dt)
        steps.append(functools.partial(np.copyto, w, filt, "unsafe"))
    y = out
    if out.dtype != dt:
        y = workspace.empty(out.shape, dt)
        post.append(functools.partial(np.copyto, out, y, "unsafe"))
    oh, ow = geo.oshape
    planes = geo.n * geo.g * geo.ocg
    if planes == 0 or oh <= 0 or ow <= 0:
        return chain(steps + post)
    parts = parallel.ranges(planes, threads(), _MIN_SPLIT_PLANES)
    acc = workspace.empty((len(parts), 2 * ((oh - 1) * xp.shape[3] + ow)), dt)
    calls = [_plane_step(xp, w, y, acc[i], geo.dilate, flip, p0, p1)
             for i, (p0, p1) in enumerate(parts)]  # fmt: skip
    steps.append(parallel.concurrently(calls))
    return chain(steps + post)


def _plane_step(xp, w, y, acc, dilate, flip, p0, p1) -> Step:
    def step() -> None:
        direct_loops.direct_conv2d(xp, w, y, acc, dilate, flip, p0, p1)

    return step


def _transposed_pad(filt, pad, dilate) -> tuple:
    return tuple(d * (f - 1) - p for f, p, d in zip(filt.shape[3:], pad, dilate))


def usable_direct_backward_data(filt, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """Whether :func:`bind_direct_backward_data` accepts the gradient: 2-d, stride 1,
    ``pad <= dilate (F - 1)``, floating point, ``OCg * FH * FW <= MAX_K``."""
    return (
        grad.ndim == 4
        and usable_direct_forward(diff, filt.swapaxes(1, 2), grad, stride, (0, 0), dilate)
        and all(p >= 0 for p in _transposed_pad(filt, pad, dilate))
    )


def preferred_direct_backward_data(filt, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """HEURISTIC's rule: usable, as :func:`preferred_direct_forward` for the forward
    convolution of ``diff`` it runs, not for a depthwise gradient (one channel per group):
    AS_FORWARD_CONV runs that one with the channel-wise forward kernels, faster (32x144x32x32:
    7.9 against 13.9 ms; 32x192x16x16: 1.8 against 8.4)."""
    if filt.shape[0] > 1 and filt.shape[1] == filt.shape[2] == 1:
        return False
    return usable_direct_backward_data(filt, diff, grad, stride, pad, dilate, flip) and (
        preferred_direct_forward(diff, filt.swapaxes(1, 2), grad, stride,
                                 _transposed_pad(filt, pad, dilate), dilate)  # fmt: skip
    )


@bind_doc("backward_data")
def bind_direct_backward_data(
    filt: np.ndarray, diff: np.ndarray, grad: np.ndarray, stride: Sequence[int],
    pad: Sequence[int], dilate: Sequence[int], flip: bool = False,
) -> Callable[[], None]:  # fmt: skip
    """Bind the gradient of a stride-1 convolution w.r.t. its input as the direct forward
    convolution of ``diff``, padded by ``dilate (F - 1) - pad``, with the transposed,
    flipped filter (:func:`usable_direct_backward_data`: 2-d, ``pad <= dilate (F - 1)``)."""
    needs = f"a 2-d gradient with stride 1, pad <= dilate*(F-1) and OCg*FH*FW <= {MAX_K}"
    checked("backward_data", "direct", needs, usable_direct_backward_data, filt, diff, grad,
            stride, pad, dilate, flip)  # fmt: skip
    tpad = _transposed_pad(filt, pad, dilate)
    return bind_direct_forward(diff, filt.swapaxes(1, 2), grad, stride, tpad, dilate, not flip)


register(ConvAlgorithm(
    "DIRECT", "forward", bind_direct_forward, usable_direct_forward,
    priority=20, heuristic=preferred_direct_forward,
))  # fmt: skip
register(ConvAlgorithm(
    "DIRECT", "backward_data", bind_direct_backward_data, usable_direct_backward_data,
    priority=20, heuristic=preferred_direct_backward_data,
))  # fmt: skip

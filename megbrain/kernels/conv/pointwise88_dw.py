"""DEPTHWISE_POINTWISE_NCHW88: a channel-wise NCHW88 convolution and the dense 1x1 stride-1
convolution that alone reads it (a mobile net's block: depthwise, then projection), as one
kernel (:mod:`.loops.pointwise88_dw`).

A unit (a sample's band of output rows) computes the depthwise rows of every channel into
its thread's scratch (CHANNELWISE_NCHW88's tiles and epilogue), then POINTWISE_NCHW88's
register tiles over those positions with the 1x1 epilogue (bias, ``z``, activation) into
the output. The intermediate never leaves the core's cache, and a block costs one operator
and one hand-off to the kernel threads instead of two: on MnasNet's 7x7 and 14x14 planes a
split costs about as much as a third of a layer. Threads take the units as they go
(:func:`.nchw8c.units_as_they_go`); the results equal the two kernels' bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import workspace
from ..steps import Step, chain
from ..tiled_jit import vector_width
from . import channelwise88 as dw88
from . import pointwise88 as pw88
from .common import threads
from .constant_operands import filter_is_constant
from .epilogue import Epilogue, epilogue_operands
from .loops import channelwise88 as dw_loops
from .loops import pointwise88 as pw_loops
from .loops import pointwise88_dw as loops
from .loops.nchw8c import readonly_view
from .nchw8c import filter_packed, units_as_they_go

__all__ = ["ALGORITHM", "MIN_SPLIT_MACS", "bind_depthwise_pointwise88", "usable"]

#: the algorithm's name, as ``chosen_algorithm`` reports it
ALGORITHM = "DEPTHWISE_POINTWISE_NCHW88"
_F32 = np.dtype(np.float32)
_EMPTY = readonly_view(np.zeros(1, _F32))
#: below these multiply-adds (both layers') one thread runs the units
MIN_SPLIT_MACS = 1 << 20
#: the bits of a depthwise epilogue this kernel applies (bias, ReLU, H_SWISH, ReLU6, SiLU)
_DW_BITS = 1 | 4 | 8 | 16 | 32


def usable(src: np.ndarray, dw_filt: np.ndarray, pw_filt: np.ndarray, out: np.ndarray) -> bool:
    """Whether :func:`bind_depthwise_pointwise88` computes the pair: float32 operands, a
    channel-wise ``(C/8, 1, 1, FH, FW, 8)`` filter, a dense ``(OC/8, C/8, 1, 1, 8, 8)``
    one, a writable C-contiguous output."""
    return (
        src.dtype == dw_filt.dtype == pw_filt.dtype == out.dtype == _F32
        and src.ndim == 5
        and dw_filt.ndim == 6
        and dw_filt.shape[1:3] == (1, 1)
        and pw_filt.ndim == 6
        and pw_filt.shape[2:4] == (1, 1)
        and pw_filt.shape[1] == dw_filt.shape[0] == src.shape[1]
        and out.flags.c_contiguous
        and out.flags.writeable
    )


def _rows(oh: int, ow: int, nthreads: int) -> int:
    """Output rows a unit takes: a small plane's (at most 16 rows) in one band a thread
    (each unit reads the whole 1x1 filter: a 7x7 plane in units of one row read it 7
    times, units of 4 rows twice, for the same busiest thread's 4 rows), a larger one's in
    bands of about 64 positions (the scratch in L1/L2)."""
    if oh <= 16:
        return -(-oh // nthreads)
    return max(1, min(oh, 64 // max(1, ow)))


def bind_depthwise_pointwise88(
    src: np.ndarray, dw_filt: np.ndarray, stride, pad, dilate, dw_epilogue: Epilogue | None,
    pw_filt: np.ndarray, out: np.ndarray, epilogue: Epilogue | None = None,
    z: np.ndarray | None = None, flip: bool = False,
) -> Step:  # fmt: skip
    """Bind ``out = act(conv1x1(dwact(dwconv(src) + dwbias)) + bias + z)``
    (:func:`usable` must hold).

    Parameters
    ----------
    src : numpy.ndarray
        ``(N, C/8, H, W, 8)`` float32 (any strides).
    dw_filt : numpy.ndarray
        ``(C/8, 1, 1, FH, FW, 8)`` float32, the channel-wise filter.
    stride, pad, dilate : sequence of int
        The depthwise convolution's, two values each; ``pad`` non-negative.
    dw_epilogue : Epilogue, optional
        The depthwise bias (C values) and activation (ReLU, H_SWISH, ReLU6, SiLU).
    pw_filt : numpy.ndarray
        ``(OC/8, C/8, 1, 1, 8, 8)`` float32, the 1x1 filter.
    out : numpy.ndarray
        ``(N, OC/8, OH, OW, 8)`` float32, C-contiguous.
    epilogue : Epilogue, optional
        The 1x1 convolution's bias (OC values) and activation.
    z : numpy.ndarray, optional
        An array of the output's shape added after the 1x1 bias; it may be ``out``.
    flip : bool
        CONVOLUTION mode for the depthwise filter (flipped spatially).

    Returns
    -------
    Step
        The callable computing ``out``.
    """
    (n, cbn, h, w, _), (_, ocb8, oh, ow, _) = src.shape, out.shape
    fh, fw = dw_filt.shape[3:5]
    k, oc = cbn * pw_loops.CB, ocb8 * pw_loops.CB
    steps: list[Step] = []
    x = dw88._readonly(dw88._contiguous(src, steps))
    zf = _EMPTY if z is None else dw88._readonly(dw88._contiguous(z, steps))
    constant = filter_is_constant()
    alloc = workspace.aligned if constant else workspace.empty
    # the depthwise filter, packed as CHANNELWISE_NCHW88 packs it
    wd = alloc((cbn * fh * fw * dw_loops.CB,), _F32)
    taps = dw_filt[:, 0, 0, ::-1, ::-1] if flip else dw_filt[:, 0, 0]
    pairs = cbn > 1 and vector_width() == 16
    bd, epid = epilogue_operands(dw_epilogue, steps)
    bp, epi = epilogue_operands(epilogue, steps)
    if epid & ~_DW_BITS or epi & ~(1 | sum(pw_loops.ACTIVATIONS)):
        raise ValueError("DEPTHWISE_POINTWISE_NCHW88 does not apply these epilogue bits")
    epi |= 2 if z is not None else 0
    macs = n * oh * ow * (cbn * pw_loops.CB) * (fh * fw + oc)
    nthreads = 1 if macs < MIN_SPLIT_MACS else threads()
    rows = _rows(oh, ow, nthreads)
    bands = -(-oh // rows)
    tl = pw88.tiles_for(1, rows * ow, k, oc, 1)
    wp = alloc((tl.ng * k * tl.b * pw_loops.BLOCK,), _F32)
    pack_p = pw_loops.filter_packer(pw_filt, wp, tl.b)
    pack_d = functools.partial(dw88._pack_filter, wd, taps, pairs)
    units = n * bands
    nthreads = max(1, min(units, nthreads))
    scr = cbn * rows * ow * dw_loops.CB + pw_loops.BLOCK  # per thread, a vector's slack
    scratch = workspace.empty((nthreads * scr,), _F32)  # written before read, every run
    half = int(oc % pw_loops.BLOCK != 0)
    dims = np.array([n, cbn, h, w, oh, ow, fh, fw, rows, bands, pairs, tl.ng, half, ocb8, scr],
                    np.int64)  # fmt: skip
    conv = np.array([*stride, *pad, *dilate], np.int64)
    zero = dw_loops.zeros(h * w * dw_loops.CB + dw_loops.CB if pairs else dw_loops.CB)
    run = loops.compiled_units(dw_loops.kernel_key(fw, stride[1], dilate[1]), tl.r, tl.b, epi)
    outf, wdr, wpr = out.reshape(-1), readonly_view(wd), readonly_view(wp)

    def bind_part(counter: np.ndarray, me: int) -> Step:
        return functools.partial(run, x, wdr, bd, zero, wpr, outf, zf, bp, scratch, dims, conv,
                                 epid, counter, me)  # fmt: skip

    steps.append(units_as_they_go(units, bind_part, nthreads))
    return filter_packed(chain([pack_d, pack_p]), chain(steps), constant)

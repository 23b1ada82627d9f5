"""The hybrid NCHW88 convolution (a network's first layer): an NCHW source ``(N, IC, H, W)`` of
at most 8 channels, filter ``(OC/8, FH, FW, IC, 8)``, output ``(N, OC/8, OH, OW, 8)``,
float32, any filter size, stride, padding and dilation, with ConvBias's bias, residual ``z``
and ReLU or H_SWISH applied on the way.

Every network's stem (3 input channels, 3x3 or 7x7 stride 2) ran as an NCHW convolution
followed by a relayout of its output into NCHW88: as long again as the convolution for the
mobile nets' 3x3 stems. Here the compiled loop (:func:`.loops.hybrid88.hybrid88`) writes the
blocked output directly: units of a sample and a band of output rows, each packing the
source rows it reads into phase planes of one channel (its thread's scratch) and running
register tiles of one output row's positions by 16 output channels
(:func:`megbrain.kernels.tiled_jit.fma_tile`). :func:`.common.threads` Python threads take
the units in turn; nothing is allocated when the bound callable runs, and every output sums
input channels, filter rows and filter columns in that order whatever the split.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import parallel, workspace
from ..steps import Step, chain
from .common import _contiguous, threads
from .constant_operands import filter_is_constant
from .epilogue import Epilogue, epilogue_operands
from .loops import hybrid88 as loops
from .loops.nchw8c import readonly_view
from .nchw8c import filter_packed

__all__ = ["ALGORITHM", "bind_hybrid88", "usable_hybrid88"]

#: the algorithm's name, as ``chosen_algorithm`` reports it
ALGORITHM = "DIRECT_NCHW_NCHW88"
#: a sample's output rows are cut into bands until there are this many units per thread
_UNITS_PER_THREAD = 4
#: below these multiply-adds one thread runs the units (waking the second costs more)
_MIN_SPLIT_MACS = 1 << 20
_F32 = np.dtype(np.float32)
_EMPTY = np.zeros(1, _F32)
_EMPTY.flags.writeable = False


def usable_hybrid88(src: np.ndarray, filt: np.ndarray, out: np.ndarray, pad) -> bool:
    """Whether :func:`bind_hybrid88` computes the convolution: float32 operands, an NCHW
    source (4-d) and a hybrid filter (5-d), non-negative padding."""
    return (
        src.dtype == filt.dtype == out.dtype == _F32
        and src.ndim == 4
        and filt.ndim == 5
        and all(p >= 0 for p in pad)
    )


def _packer(filt: np.ndarray, wp: np.ndarray, flip: bool) -> Step:
    """The step writing ``filt`` (OC/8, FH, FW, IC, 8) into ``wp`` as the loop reads it:
    blocks of 16 output channels (IC, FH, FW, 16), then the last 8 (IC, FH, FW, 8)."""
    oc8, fh, fw, ic, _ = filt.shape
    k = oc8 // 2
    f = filt[:, ::-1, ::-1] if flip else filt
    whole = wp[: k * 16 * ic * fh * fw].reshape(k, ic, fh, fw, 2, loops.CB)
    copies = [(whole, f[: 2 * k].reshape(k, 2, fh, fw, ic, loops.CB).transpose(0, 4, 2, 3, 1, 5))]
    if oc8 % 2:
        last = wp[k * 16 * ic * fh * fw :].reshape(ic, fh, fw, loops.CB)
        copies.append((last, f[2 * k].transpose(2, 0, 1, 3)))
    return chain([functools.partial(np.copyto, dst, src) for dst, src in copies])


def bind_hybrid88(src: np.ndarray, filt: np.ndarray, out: np.ndarray, stride, pad, dilate,
                  flip: bool = False, epilogue: Epilogue | None = None,
                  z: np.ndarray | None = None) -> Step:  # fmt: skip
    """Bind ``out = act(conv(src, filt) + bias + z)`` for a hybrid NCHW88 convolution.

    Parameters
    ----------
    src : numpy.ndarray
        ``(N, IC, H, W)`` float32, ``IC <= 8`` (any strides).
    filt : numpy.ndarray
        ``(OC/8, FH, FW, IC, 8)`` float32.
    out : numpy.ndarray
        ``(N, OC/8, OH, OW, 8)`` float32, the shape the geometry gives (checked by the
        caller, :func:`.nchw88.bind_nchw88_forward`).
    stride, pad, dilate : sequence of int
        Two values each; ``pad`` non-negative.
    flip : bool
        CONVOLUTION mode (the filter flipped spatially).
    epilogue : Epilogue, optional
        The per-channel bias (OC values) and ReLU or H_SWISH.
    z : numpy.ndarray, optional
        An array of the output's shape added after the bias, before the activation.

    Returns
    -------
    Step
        The callable computing ``out``.
    """
    n, ic, h, w = src.shape
    oc8, fh, fw = filt.shape[:3]
    oh, ow = out.shape[2:4]
    steps: list[Step] = []
    x = readonly_view(_contiguous(src, _F32, steps).reshape(-1))
    zf = _EMPTY if z is None else readonly_view(_contiguous(z, _F32, steps).reshape(-1))
    y = out if out.flags.c_contiguous and out.flags.writeable else workspace.empty(out.shape, _F32)
    constant = filter_is_constant()
    wp = (workspace.aligned if constant else workspace.empty)((filt.size,), _F32)
    bias, epi = epilogue_operands(epilogue, steps)
    if z is not None:
        epi |= 2
    macs = out.size * ic * fh * fw
    t = threads() if macs >= _MIN_SPLIT_MACS else 1
    bands = max(1, min(oh, -(-_UNITS_PER_THREAD * t // n))) if t > 1 else 1
    rows = -(-oh // bands)
    bands = -(-oh // rows)
    hq, wq = loops.band_planes(rows, w, (fh, fw), stride, pad, dilate)
    taps = loops.tap_offsets(hq, wq, (fh, fw), stride, dilate)
    dims = np.array([n, ic, h, w, oc8, oh, ow, rows, bands, hq, wq], np.int64)
    conv = np.array([stride[0], stride[1], pad[0], pad[1]], np.int64)
    units = n * bands
    t = min(t, units)
    xp = workspace.empty((t, loops.scratch_size(ic, hq, wq, stride)), _F32)
    yf, wr = y.reshape(-1), readonly_view(wp)
    # units taken in turn: a thread the OS holds back (the pool's, woken for a network's
    # first operator on a loaded machine) delays the unit it has, not half of them
    steps.append(parallel.take_in_turn([
        [functools.partial(loops.hybrid88, x, wr, yf, zf, bias, xp[k], taps, dims, conv, epi,
                           u, u + 1) for u in range(units)]
        for k in range(t)
    ]))  # fmt: skip
    if y is not out:
        steps.append(functools.partial(np.copyto, out, y))
    return filter_packed(_packer(filt, wp, flip), chain(steps), constant)

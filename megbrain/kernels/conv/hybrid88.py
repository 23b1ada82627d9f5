"""The hybrid NCHW88 convolution (a network's first layer): an NCHW source ``(N, IC, H, W)`` of
at most 8 channels, filter ``(OC/8, FH, FW, IC, 8)``, output ``(N, OC/8, OH, OW, 8)``,
float32, any filter size, stride, padding and dilation, with ConvBias's bias, residual ``z``
and ReLU, H_SWISH or ReLU6 applied on the way.

Every network's stem (3 input channels, 3x3 or 7x7 stride 2) ran as an NCHW convolution
followed by a relayout of its output into NCHW88: as long again as the convolution for the
mobile nets' 3x3 stems. Here the compiled loop (:mod:`.loops.hybrid88`) writes the blocked
output directly: units of a sample and a band of output rows, each running register tiles
of ``R`` positions of an output row by ``B`` blocks of 16 output channels that read the
source in place (a zero-padded copy of a tile's window only where it leaves the source),
their whole reduction (input channels, filter rows, filter columns, in that order) and
epilogue in registers. ``R`` and ``B`` come per layer from a cost model of the tile (as
POINTWISE_NCHW88's: fused multiply-adds, loads, an accumulator chain's latency, the
positions a row's last tile repeats, the output channels' padding, the threads' balance).
Threads take the units as they go (:func:`.nchw8c.units_as_they_go`); nothing is allocated
when the bound callable runs.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from .. import workspace
from ..steps import Step, chain
from ..tiled_jit import vector_width
from .common import _contiguous, threads
from .constant_operands import filter_is_constant
from .epilogue import Epilogue, epilogue_operands
from .loops import hybrid88 as loops
from .loops.nchw8c import readonly_view
from .nchw8c import filter_packed, units_as_they_go

__all__ = ["ALGORITHM", "StemTiles", "bind_hybrid88", "tiles_for", "usable_hybrid88"]

#: the algorithm's name, as ``chosen_algorithm`` reports it
ALGORITHM = "DIRECT_NCHW_NCHW88"
#: a sample's output rows are cut into bands until there are this many units per thread
_UNITS_PER_THREAD = 4
#: below these multiply-adds one thread runs the units (waking the second costs more)
_MIN_SPLIT_MACS = 1 << 20
#: the tile lengths (positions) to choose from: a few compiled variants, not one per width
_POSITIONS = (1, 2, 4, 6, 8, 12, 16, 24)
#: cycles a tile spends around its reduction, per accumulator vector and in all
_EPI_CYCLES, _TILE_CYCLES = 3, 20
_F32 = np.dtype(np.float32)
_EMPTY = readonly_view(np.zeros(1, _F32))


class StemTiles(NamedTuple):
    """A layer's tiling: ``r`` positions by ``b`` blocks of 16 output channels, ``ng``
    groups of ``b`` blocks."""

    r: int
    b: int
    ng: int


def tiles_for(ow: int, k: int, oc: int) -> StemTiles:
    """The tiling of output rows ``ow`` positions long, a reduction of ``k`` (input
    channels times filter taps) and ``oc`` output channels, by the cost model (the
    module's docstring)."""
    v = 16 // vector_width()  # registers per 16-lane vector
    budget = 24 if v == 1 else 6  # accumulators of 16 lanes: of 32 zmm, or 16 ymm registers
    nblk = -(-oc // loops.BLOCK)
    best = None
    for b in (b for b in range(1, min(4, nblk) + 1) if nblk % b == 0):
        for r in (r for r in _POSITIONS if r * b <= budget and (r <= ow or r == 1)):
            per_step = max(r * b * v / 2, (r + b * v) / 2, 4)
            tile = per_step * k + _EPI_CYCLES * r * b * v + _TILE_CYCLES
            cost = tile * (nblk // b) * -(-ow // r)
            if best is None or cost < best[0]:
                best = (cost, StemTiles(r, b, nblk // b))
    return best[1]


def usable_hybrid88(src: np.ndarray, filt: np.ndarray, out: np.ndarray, pad) -> bool:
    """Whether :func:`bind_hybrid88` computes the convolution: float32 operands, an NCHW
    source (4-d) and a hybrid filter (5-d), non-negative padding."""
    return (
        src.dtype == filt.dtype == out.dtype == _F32
        and src.ndim == 4
        and filt.ndim == 5
        and all(p >= 0 for p in pad)
    )


def _packer(filt: np.ndarray, wp: np.ndarray, tl: StemTiles, flip: bool) -> Step:
    """The step writing ``filt`` (OC/8, FH, FW, IC, 8) into ``wp`` as the loop reads it:
    ``(NG, IC, FH, FW, B, 16)``, the output channels padded with zeros to ``NG B 16``."""
    oc8, fh, fw, ic, _ = filt.shape
    f = filt[:, ::-1, ::-1] if flip else filt
    per = 2 * tl.b  # blocks of 8 output channels per group
    dst = wp.reshape(tl.ng, ic, fh, fw, per, loops.CB)
    copies = []
    for g in range(tl.ng):
        o0, o1 = g * per, min(oc8, (g + 1) * per)
        copies.append(functools.partial(np.copyto, dst[g, :, :, :, : o1 - o0],
                                        f[o0:o1].transpose(3, 1, 2, 0, 4)))  # fmt: skip
    pad = dst[tl.ng - 1, :, :, :, oc8 - (tl.ng - 1) * per :]
    if pad.size:
        copies.append(functools.partial(pad.fill, 0))
    return chain(copies)


def bind_hybrid88(src: np.ndarray, filt: np.ndarray, out: np.ndarray, stride, pad, dilate,
                  flip: bool = False, epilogue: Epilogue | None = None,
                  z: np.ndarray | None = None, tiles: StemTiles | None = None) -> Step:  # fmt: skip
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
        The per-channel bias (OC values), ReLU or H_SWISH, and the ReLU6 tail.
    z : numpy.ndarray, optional
        An array of the output's shape added after the bias, before the activation.
    tiles : StemTiles, optional
        The tiling (default :func:`tiles_for`'s).

    Returns
    -------
    Step
        The callable computing ``out``.

    Raises
    ------
    ValueError
        For an epilogue this kernel does not apply (the SiLU tail).
    """
    n, ic, h, w = src.shape
    oc8, fh, fw = filt.shape[:3]
    oh, ow = out.shape[2:4]
    steps: list[Step] = []
    x = readonly_view(_contiguous(src, _F32, steps).reshape(-1))
    zf = _EMPTY if z is None else readonly_view(_contiguous(z, _F32, steps).reshape(-1))
    y = out if out.flags.c_contiguous and out.flags.writeable else workspace.empty(out.shape, _F32)
    bias, epi = epilogue_operands(epilogue, steps)
    unapplied = epi & ~(1 | sum(loops.ACTIVATIONS))
    if unapplied:  # never a silent wrong answer: the caller runs such a tail after the kernel
        raise ValueError(f"DIRECT_NCHW_NCHW88 does not apply epilogue bits {unapplied}")
    if z is not None:
        epi |= 2
    tl = tiles or tiles_for(ow, ic * fh * fw, oc8 * loops.CB)
    constant = filter_is_constant()
    wp = (workspace.aligned if constant else workspace.empty)(
        (tl.ng * ic * fh * fw * tl.b * loops.BLOCK,), _F32)  # fmt: skip
    macs = out.size * ic * fh * fw
    nt = threads() if macs >= _MIN_SPLIT_MACS else 1
    bands = max(1, min(oh, -(-_UNITS_PER_THREAD * nt // n))) if nt > 1 else 1
    rows = -(-oh // bands)
    bands = -(-oh // rows)
    pitch = loops.scratch_pitch(ow, fw, stride[1], dilate[1])
    taps = loops.tap_offsets(w, pitch, (fh, fw), dilate)
    size = ic * fh * pitch
    nt = min(nt, n * bands)
    dims = np.array([n, ic, h, w, oc8, oh, ow, rows, bands, tl.ng, oc8 % 2, stride[0], stride[1],
                     pad[0], pad[1], dilate[0], dilate[1], fh, fw, pitch, size],
                    np.int64)  # fmt: skip
    scratch = workspace.empty((nt * size,), _F32)
    scr = readonly_view(scratch)
    run = loops.compiled_units(tl.r, tl.b, stride[1])
    yf, wr = y.reshape(-1), readonly_view(wp)

    def bind_part(counter: np.ndarray, me: int) -> Step:
        return functools.partial(run, x, wr, yf, zf, bias, scratch, scr, taps, dims, epi,
                                 counter, me)  # fmt: skip

    # units taken as they go: a thread the OS holds back (the pool's, woken for a network's
    # first operator on a loaded machine) delays the unit it has, not half of them
    steps.append(units_as_they_go(n * bands, bind_part, nt))
    if y is not out:
        steps.append(functools.partial(np.copyto, out, y))
    return filter_packed(_packer(filt, wp, tl, flip), chain(steps), constant)

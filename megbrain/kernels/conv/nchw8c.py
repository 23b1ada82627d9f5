"""Direct 2-d convolution on channel-blocked (NCHW8c) copies, register-tiled: forward,
float32, any stride, padding and dilation (each reach up to :data:`MAX_PAD`) and group
count, with ``OCg`` a multiple of 16; a source whose channels per group are not a multiple
of 8 is copied into planes of one channel instead (:func:`block_channels`).

Per run the source is copied into zero-padded planes of 8 channels per position, one per
stride phase (:func:`.loops.nchw8c.pack_input`, about the size of the source), and each
tile of 12 (AVX-512) or 6 (AVX2) output positions by sixteen output channels sums its whole
reduction in registers (:func:`megbrain.kernels.tiled_jit.fma_tile`), reading the input
and the packed filter in place: no column matrix (im2col copies the source ``FH * FW``
times) and no GEMM packing. The filter,
packed in blocks of 16 output channels, is packed once, at the first run, when the operator
says it is constant (:mod:`.constant_operands`: an ImmutableTensor, or a parameter under
``graph_opt.weight_preprocess``; the packed copy is then private memory of the bound step,
the size of the filter), else on every run into the workspace.

Measured on 2 cores (AVX2, the batch-1 3x3 layers of ResNet50, filter packed): 64->64 at
56x56 2.0 ms (im2col + GEMM 2.1-2.8), 128->128 at 28x28 1.9 (2.5), 256->256 at 14x14 1.9-2.1
(2.1-2.4), 512->512 at 7x7 2.3-2.8 (2.5-3.1). Pointwise convolutions stay with CONV1X1_GEMM
(OpenBLAS on the source itself was 1.1-1.6x faster than packing it), strided ones with
im2col (:func:`preferred_nchw8c_forward`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from .. import parallel, workspace
from ..steps import Step, chain
from ..tiled_jit import vector_width
from .common import SPLIT_MIN_ELEMS, bind_doc, checked
from .constant_operands import filter_is_constant
from .epilogue import Epilogue, epilogue_operands
from .loops import nchw8c as loops
from .registry import ConvAlgorithm, register

__all__ = [
    "MAX_PAD",
    "ROW_POSITIONS",
    "PlaneGeometry",
    "bind_nchw8c_forward",
    "filter_packed",
    "plane_geometry",
    "preferred_nchw8c_forward",
    "units_as_they_go",
    "usable_nchw8c_forward",
    "wide_units",
]

#: the largest padding, and dilated filter reach ``(F - 1) * dilate``, accepted (the packed
#: planes are followed by :data:`.loops.nchw8c.SLACK` positions that the last tiles of a
#: sample may read)
MAX_PAD = 32
#: output positions (whole rows) a work unit covers at least: its tiles reuse the unit's
#: block of the packed filter from the core's cache
ROW_POSITIONS = 96
_F32 = np.dtype(np.float32)


class PlaneGeometry(NamedTuple):
    """The packed planes of a source: ``hq x wq`` positions per phase plane, the column
    offset of the source in a plane row, the shift of a tile's first read and the plane
    offsets (positions) of the filter taps, row-major."""

    hq: int
    wq: int
    col_off: int
    shift: int
    taps: np.ndarray


def plane_geometry(sshape, oshape, stride, pad, dilate, fshape) -> PlaneGeometry:
    """The phase planes a source of spatial shape ``sshape`` is packed into (see
    :mod:`.loops.nchw8c`): with stride 1 one plane whose rows' gap holds the left and
    right padding; with stride ``s``, ``SH x SW`` phases, tap ``(a, b)`` reading phase
    ``(a DH % SH, b DW % SW)`` at stride 1."""
    (h, w), (_, ow) = sshape, oshape
    (sh, sw), (pt, pl), (dh, dw) = stride, pad, dilate
    fh, fw = fshape
    if (sh, sw) == (1, 1):
        hq, wq = h + 2 * pt, max(w + pl, ow)
        col_off = wq - w
        shift = col_off - pl
    else:
        hq, wq = -(-(h + 2 * pt) // sh), -(-(w + 2 * pl) // sw)
        col_off, shift = pl, 0
    phase = hq * wq
    taps = np.array([((a * dh % sh) * sw + b * dw % sw) * phase + a * dh // sh * wq
                     + b * dw // sw for a in range(fh) for b in range(fw)], np.int64)  # fmt: skip
    return PlaneGeometry(hq, wq, col_off, shift, taps)


def units_as_they_go(units: int, bind_part: Callable[[np.ndarray, int], Step],
                     max_threads: int | None = None) -> Step:  # fmt: skip
    """A step running ``bind_part(counter, me)`` for ``me`` in ``0 .. T - 1`` on ``T`` (up
    to :func:`parallel.num_threads`, and to ``max_threads``) threads at once, one bound part
    per thread, each with its own buffers. Units ``0 .. units - 1`` are cut into ``T``
    contiguous ranges, and ``counter`` (int64, reset every run) holds each range's next unit
    and end: part ``me`` takes the units of its range one at a time by atomic increments,
    then what is left of the others'. A thread the OS holds back delays only the unit it has
    (a fixed split waited for its slowest part), and each thread keeps to the same part of
    the output from one layer to the next, so that it reads mostly what it wrote itself (the
    units are band-major, the rows of a layer's output that feed the same rows of the next)."""
    threads = max(1, min(units, parallel.num_threads(), max_threads or units))
    bounds = np.array(parallel.ranges(units, threads), np.int64).reshape(-1)
    counter = bounds.copy()
    run = parallel.concurrently([bind_part(counter, me) for me in range(threads)])

    def step() -> None:
        counter[:] = bounds
        run()

    return step


def wide_units(ocb: int) -> bool:
    """Whether the direct convolutions' units (and tiles) take 32 output channels, two of
    the ``ocb`` blocks of 16 of a group: where the compiler targets AVX-512 (a tile is then
    24 vectors: each input value loaded feeds two multiply-adds, and a unit's source rows
    are read from the core's L2 cache half as often) and ``ocb`` is even. On the 2-core
    AVX-512 machines, ResNet50 at batch 1 ran in 33.6 ms against 38-39 ms with units of 16
    channels in DIRECT_NCHW88 (the pointwise 64->256 at 56x56 with the residual alone: 0.71
    against 0.80 ms), and its 7x7 stem (DIRECT_NCHW8C) in 1.20 ms against 1.34."""
    return ocb % 2 == 0 and vector_width() == 16


def filter_packed(pack_filter: Step, run: Step, constant: bool) -> Step:
    """``run`` after ``pack_filter``: on every run, or, for a constant filter, only before
    the first one."""
    if not constant:
        return chain([pack_filter, run])
    state = {"packed": False}

    def run_constant() -> None:
        if not state["packed"]:
            pack_filter()
            state["packed"] = True
        run()

    return run_constant


def block_channels(icg: int) -> int:
    """The input channels of a packed block: 8, or 1 (planes of one channel) for a source of
    ``icg`` channels per group that is not a multiple of 8 (a network's RGB input)."""
    return loops.CB if icg % loops.CB == 0 else 1


def usable_nchw8c_forward(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """Whether :func:`bind_nchw8c_forward` accepts the convolution: 2-d, float32 operands,
    padding and dilated filter reach in ``[0, MAX_PAD]``, ``OCg % 16 == 0``, at least one
    sample and output position, and a C-contiguous, writable output (any ``ICg``: blocks of 8
    channels, or of one, :func:`block_channels`)."""
    return (
        src.ndim == 4
        and filt.ndim == 5
        and src.dtype == filt.dtype == out.dtype == _F32
        and all(s >= 1 for s in stride)
        and all(0 <= p <= MAX_PAD for p in pad)
        and all((f - 1) * d <= MAX_PAD for f, d in zip(filt.shape[3:], dilate))
        and filt.shape[1] % loops.OB == 0
        and filt.shape[1] > 0
        and filt.shape[2] > 0
        and src.shape[0] > 0
        and out.size > 0
        and out.flags.c_contiguous
        and out.flags.writeable
    )


def preferred_nchw8c_forward(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """HEURISTIC's rule: usable, the filter constant (:func:`filter_is_constant`), so that
    its packing is done once, a filter of more than one tap, and stride 1 or a source of
    fewer than 8 channels per group (a network's first layer).

    With a filter changing every run (training), im2col + GEMM stays the default. Strided
    and 1x1 convolutions ran no faster than im2col + OpenBLAS (ResNet50's batch-1 layers, 2
    threads: 3x3 stride 2 2.9/2.6/3.6 ms against 2.8/2.6/3.2, 1x1 stride 2 2.9/2.8 against
    2.2/2.8: a stride-2 unit's four phase planes overflow the core's cache, and a 1x1 tile
    has too short a reduction for its transposing write), but for a first layer, whose
    im2col copies the source 49 times (ResNet50's 7x7 stride-2 3->64 at 224x224: 3.9 ms
    against 4.5)."""
    return (
        filter_is_constant()
        and (tuple(stride) == (1, 1) or block_channels(filt.shape[2]) == 1)
        and math.prod(filt.shape[3:]) > 1
        and usable_nchw8c_forward(src, filt, out, stride, pad, dilate)
    )


@bind_doc("forward", epilogue=True)
def bind_nchw8c_forward(src: np.ndarray, filt: np.ndarray, out: np.ndarray, stride: Sequence[int],
                        pad: Sequence[int], dilate: Sequence[int], flip: bool = False,
                        epilogue: Epilogue | None = None
                        ) -> Callable[[], None]:  # fmt: skip
    """Bind the grouped convolution ``out = conv(src, filt)`` as the direct NCHW8c one:
    float32 operands, a C-contiguous output (:func:`usable_nchw8c_forward`). For a constant
    filter the step reads the filter's values at its first call only."""
    needs = (f"float32 operands, pad and dilated filter reach <= {MAX_PAD}, OCg % {loops.OB} == "
             "0 and a C-contiguous output")  # fmt: skip
    geo = checked("forward", "DIRECT_NCHW8C", needs, usable_nchw8c_forward, src, filt, out,
                  stride, pad, dilate, flip)  # fmt: skip
    oh, ow = geo.oshape
    (sh, sw), pt = geo.stride, geo.pad[0]
    fh, fw = geo.fshape
    hq, wq, col_off, shift, taps = plane_geometry(geo.sshape, geo.oshape, geo.stride, geo.pad,
                                                  geo.dilate, geo.fshape)  # fmt: skip
    bs = block_channels(geo.icg)
    cstride = sh * sw * hq * wq * bs
    sample = geo.c // bs * cstride + loops.SLACK * bs
    xp = workspace.empty((geo.n * sample,), _F32)
    packed_size = geo.g * geo.ocg * geo.icg * fh * fw
    constant = filter_is_constant()
    # a constant filter's packed copy must outlive the run: private memory, not workspace
    wp = (workspace.aligned if constant else workspace.empty)((packed_size,), _F32)
    rows = max(1, min(oh, -(-ROW_POSITIONS // wq)))
    ocb = geo.ocg // loops.OB
    wide = wide_units(ocb)
    width = loops.OB * (2 if wide else 1)
    units = geo.n * geo.g * (geo.ocg // width) * -(-oh // rows)
    geom = np.array([geo.g, ocb, geo.icg // bs, wq, oh, ow, rows,
                     cstride, sample, shift, bs, wide], np.int64)  # fmt: skip
    outf = out.reshape(-1)
    pack_in = parallel.split(  # phase planes: a strided stem's 3 channels make 12
        functools.partial(loops.pack_input, loops.readonly_view(src), xp, geo.stride, pt,
                          col_off, hq, wq, bs=bs),  # fmt: skip
        geo.n * geo.c // bs * sh * sw,
        max(1, SPLIT_MIN_ELEMS // (hq * wq * bs)),
    )
    steps = [pack_in]
    bias, _ = epilogue_operands(epilogue, steps)
    epi = 0 if epilogue is None else 3 if epilogue.hswish else 2 if epilogue.relu else 1

    def bind_part(counter: np.ndarray, me: int) -> Step:
        rb = workspace.empty(((rows * wq + loops.tile_positions()) * width,), _F32)
        return loops.conv_units(xp, wp, outf, rb, taps, geom, bias, epi, counter, me)

    pack_w = functools.partial(loops.pack_filter, loops.readonly_view(filt), wp, flip, bs)
    return filter_packed(pack_w, chain([*steps, units_as_they_go(units, bind_part)]), constant)


register(ConvAlgorithm(
    "DIRECT_NCHW8C", "forward", bind_nchw8c_forward, usable_nchw8c_forward,
    priority=25, heuristic=preferred_nchw8c_forward, epilogue=True, hswish=True,
))  # fmt: skip

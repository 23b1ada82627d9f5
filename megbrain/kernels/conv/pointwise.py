"""Direct NCHW pointwise convolution (DIRECT_POINTWISE): 1x1 filter, stride 1, no padding,
float32, any channel count, the ConvBias epilogue (bias, ReLU, H_SWISH, ReLU6) applied as the
output is written.

ShuffleNet's 1x1 layers (24, 58, 116, 232 channels: not multiples of 8, so they stay in
NCHW) and every NCHW model's short-reduction 1x1 layers: ``out[k, p] = sum_c W[k, c] x[c,
p]``, a GEMM whose constant operand is the filter. The filter is packed once (a constant
filter; at every run otherwise) so that a tile's filter values are one stream of broadcasts;
each register tile of ``R`` output channels by ``B`` vectors of positions reads the source
rows in place and keeps its whole reduction and epilogue in registers
(:mod:`.loops.pointwise`). ``R`` and ``B`` are chosen per layer by a cost model of the tile
(:func:`tiles_for`: fused multiply-adds, loads, an accumulator chain's latency, the padded
rows of the last channel group, the positions a plane's last tile repeats, the threads'
balance). Sums run in input-channel order (reproducible); nothing is allocated when the bound
callable runs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import workspace
from ..steps import chain
from ..tiled_jit import vector_width
from .common import _is_pointwise, _reshaped, bind_doc, checked, threads
from .constant_operands import filter_is_constant
from .epilogue import Epilogue, epilogue_operands
from .loops import pointwise as loops
from .loops.nchw8c import readonly_view
from .nchw8c import filter_packed, units_as_they_go
from .registry import ConvAlgorithm, register

__all__ = [
    "MAX_K",
    "PREFERRED_MAX_K",
    "PointwiseTiles",
    "bind_pointwise_forward",
    "filter_matrix",
    "preferred_pointwise_forward",
    "tiles_for",
    "usable_pointwise_forward",
]

#: the longest reduction (input channels per group) accepted: each output is one float32
#: running sum over it
MAX_K = 1024
#: HEURISTIC takes it over CONV1X1_GEMM up to this many input channels per group
PREFERRED_MAX_K = 256
#: a layer is split over threads only when each thread gets at least this many blocks of
#: :data:`_SPLIT_BLOCK` multiply-adds (below, waking a second thread costs more than it saves)
_MIN_SPLIT_BLOCKS = 16
_SPLIT_BLOCK = 1 << 16
#: units per thread a layer is cut into at least (bands of tiles), for the threads' balance
_UNITS_PER_THREAD = 6
#: positions a band holds at most: a unit's source rows stay in the core's L2 cache
_BAND_POSITIONS = 1024
#: cycles a tile spends around its reduction (its epilogue and stores), per accumulator
#: vector and in all
_EPI_CYCLES, _TILE_CYCLES = 3, 20
_F32 = np.dtype(np.float32)
#: the tiles (output channels, vectors of positions) :func:`tiles_for` chooses among, by
#: vector width: at most 24 accumulators of AVX-512's 32 registers, 12 of AVX2's 16. Few,
#: since each is compiled on first use (a second and a half each); rows of 6 to 24 leave
#: ShuffleNet's 24 to 232 channels a few padded rows. Fewer than 12 accumulators ran
#: slower than the model says (the cost's floor of 6 cycles an input channel)
TILES = {
    16: ((8, 2), (12, 2), (6, 4), (8, 1), (16, 1), (24, 1)),
    8: ((4, 2), (6, 2), (4, 1), (8, 1), (12, 1), (3, 4)),
}


class PointwiseTiles(NamedTuple):
    """A layer's tiling: ``r`` output channels by ``b`` vectors of positions, ``nr`` groups
    of ``r`` output channels per group of the convolution, ``nb`` bands of ``tpb`` tiles per
    plane."""

    r: int
    b: int
    nr: int
    nb: int
    tpb: int


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
        and out.shape[2] * out.shape[3] >= vector_width()
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


def _bands(tiles: int, units: int, npos: int, nthreads: int) -> tuple[int, int]:
    """``(bands, tiles per band)`` of planes of ``tiles`` tiles of ``npos`` positions, with
    ``units`` units per band."""
    want = max(-(-_UNITS_PER_THREAD * nthreads // units), -(-tiles * npos // _BAND_POSITIONS))
    tpb = -(-tiles // max(1, min(tiles, want)))
    return -(-tiles // tpb), tpb


def tiles_for(n: int, g: int, ocg: int, k: int, positions: int, nthreads: int) -> PointwiseTiles:
    """The tiling of ``n`` samples of ``g`` groups of ``ocg`` output channels over ``k``
    input channels, planes of ``positions``, at ``nthreads`` threads, among
    :data:`TILES`: the least cost of the slowest thread by a model of a tile (fused
    multiply-adds and loads per input channel, at least an accumulator's latency; its
    epilogue), padded rows and repeated positions included."""
    lanes = vector_width()
    best = None
    for r, b in TILES[lanes]:
        npos = b * lanes
        if npos > positions:
            continue
        tiles = -(-positions // npos)
        nr = -(-ocg // r)
        per_ic = max(r * b / 2, (r + b) / 2, 6)
        tile = per_ic * k + _EPI_CYCLES * r * b + _TILE_CYCLES
        units = n * g * nr
        nb, tpb = _bands(tiles, units, npos, nthreads)
        cost = tile * tpb * math.ceil(units * nb / nthreads)
        if best is None or cost < best[0]:
            best = (cost, PointwiseTiles(r, b, nr, nb, tpb))
    return best[1]


def _filter_packer(filt: np.ndarray, wp: np.ndarray, r: int, nr: int):
    """A step packing the ``(G, OCg, ICg, 1, 1)`` filter into ``wp`` laid out ``(G, NR,
    ICg, R)``, the last group's rows past ``OCg`` zeros (views made here: the step allocates
    nothing)."""
    g, ocg, icg = filt.shape[:3]
    dst = wp.reshape(g, nr, icg, r)
    src = filt[..., 0, 0]
    full = ocg // r
    pairs = [(dst[:, :full], src[:, : full * r].reshape(g, full, r, icg).transpose(0, 1, 3, 2))]
    rest = ocg - full * r
    if rest:
        pairs.append((dst[:, full, :, :rest], src[:, full * r :].transpose(0, 2, 1)))
        pad = dst[:, full, :, rest:]
    else:
        pad = dst[:, :0]

    def pack() -> None:
        for d, s in pairs:
            np.copyto(d, s)
        pad.fill(0)

    return pack


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
    bias, epi = epilogue_operands(epilogue, steps)
    if epi & ~loops.EPILOGUE_BITS:  # registered without SiLU: never asked for one
        raise ValueError(f"DIRECT_POINTWISE does not apply epilogue bits {epi}")
    macs = geo.n * geo.g * geo.ocg * geo.icg * geo.l
    nthreads = max(1, min(threads(), macs // max(1, _MIN_SPLIT_BLOCKS * _SPLIT_BLOCK)))
    tl = tiles_for(geo.n, geo.g, geo.ocg, geo.icg, geo.l, nthreads)
    constant = filter_is_constant()
    wp = (workspace.aligned if constant else workspace.empty)(
        (geo.g * tl.nr * geo.icg * tl.r,), _F32)  # fmt: skip
    pack_w = _filter_packer(filt, wp, tl.r, tl.nr)
    it = src.itemsize
    geom = np.array([geo.g, geo.ocg, geo.icg, geo.l, tl.nr, tl.nb, tl.tpb,
                     src.strides[0] // it, src.strides[1] // it,
                     out.strides[0] // it, out.strides[1] // it], np.int64)  # fmt: skip
    x, y, wr = _flat(src, False), _flat(out, True), readonly_view(wp)
    run = loops.compiled_units(tl.r, tl.b, epi)

    def bind_part(counter: np.ndarray, me: int):
        return functools.partial(run, x, wr, y, bias, geom, epi, counter, me)

    units = geo.n * geo.g * tl.nr * tl.nb
    steps.append(units_as_they_go(units, bind_part, nthreads))
    return filter_packed(pack_w, chain(steps), constant)


register(ConvAlgorithm(
    "DIRECT_POINTWISE", "forward", bind_pointwise_forward, usable_pointwise_forward,
    priority=31, heuristic=preferred_pointwise_forward, epilogue=True, hswish=True, relu6=True,
))  # fmt: skip

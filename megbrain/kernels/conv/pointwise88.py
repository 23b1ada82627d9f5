"""POINTWISE_NCHW88: the dense 1x1, stride-1, unpadded NCHW88 convolution (the expansions
and projections of the mobile nets) as register tiles that keep the whole reduction and the
ConvBias epilogue in registers (:mod:`.loops.pointwise88`).

The source ``(N, C/8, H, W, 8)`` is read in place (per input channel block a contiguous run
of positions), the filter packed once for a constant filter (at every run otherwise) so
that a tile's filter loads are one contiguous stream, and each tile of ``R`` positions by
``B`` blocks of 16 output channels stores its ``act(conv + bias + z)`` straight into the
``(N, OC/8, H, W, 8)`` output: no row buffer, no write-out pass. ``R`` and ``B`` are chosen
per layer by a cost model of the tile (fused multiply-adds, loads, the latency of an
accumulator's chain, the positions a plane's last tile repeats, the padding of the output
channels, the threads' balance, and at several threads the bytes each thread brings to
its core). Work units (a sample, a group of ``B`` blocks, a band of whole tiles) are taken
as they go (:func:`.nchw8c.units_as_they_go`), each thread first from its own contiguous
range of them. Where the filter outweighs the source (small planes of many channels: the
7x7 layers, whose filters come from the shared cache in a network) the groups vary slowest,
so that each thread's range is its own output channels and it reads only their part of the
filter; elsewhere they vary fastest, and each thread reads its own positions of the source.
Nothing is allocated at run time; every sum runs over the input channels in order, whoever
computes it.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from .. import workspace
from ..steps import Step, chain
from ..tiled_jit import vector_width
from .common import threads
from .constant_operands import filter_is_constant
from .epilogue import Epilogue, epilogue_operands
from .loops import pointwise88 as loops
from .loops.nchw8c import readonly_view
from .nchw8c import filter_packed, units_as_they_go

__all__ = ["ALGORITHM", "PointwiseTiles", "bind_pointwise88", "tiles_for", "usable_pointwise88"]

#: the algorithm's name, as ``chosen_algorithm`` reports it
ALGORITHM = "POINTWISE_NCHW88"
_F32 = np.dtype(np.float32)
_EMPTY = readonly_view(np.zeros(1, _F32))
#: below these multiply-adds one thread runs the units (as DIRECT_NCHW88's MIN_SPLIT_MACS)
MIN_SPLIT_MACS = 1 << 21
#: units per thread a layer is cut into at least (bands of tiles), for the threads' balance
_UNITS_PER_THREAD = 6
#: positions a band holds at most
_BAND_POSITIONS = 768
#: cycles a tile spends around its reduction (its epilogue and stores), per accumulator
#: vector and in all
_EPI_CYCLES, _TILE_CYCLES = 3, 20
#: bytes a cycle a core brings in from the shared cache (a layer's operands are not in its
#: own L2 in a network: the filters of a mobile net's layers together exceed it)
_TRAFFIC_BYTES = 16


class PointwiseTiles(NamedTuple):
    """A layer's tiling: ``r`` positions by ``b`` blocks of 16 output channels, ``ng``
    groups of ``b`` blocks, ``nb`` bands of ``tpb`` whole tiles per sample and group; the
    units ordered group, sample, band (``by_group``: a thread's range of units is a range
    of output channels) or sample, band, group."""

    r: int
    b: int
    ng: int
    nb: int
    tpb: int
    by_group: bool = False


def usable_pointwise88(src, filt, out, geo, stride, pad) -> bool:
    """Whether POINTWISE_NCHW88 computes the NCHW88 convolution of geometry ``geo``
    (:func:`.nchw88.nchw88_geometry`): float32, dense, a 1x1 filter, stride 1, no padding,
    a C-contiguous writable output."""
    return (
        src.dtype == filt.dtype == out.dtype == _F32
        and geo.kind == "dense"
        and tuple(geo.fshape) == (1, 1)
        and tuple(stride) == (1, 1)
        and tuple(pad) == (0, 0)
        and out.flags.c_contiguous
        and out.flags.writeable
    )


def _split(n: int, ng: int, nt: int, r: int, nthreads: int) -> tuple[int, int]:
    """``(bands, tiles per band)`` of planes of ``nt`` whole tiles of ``r`` positions."""
    if nt == 0:
        return 1, 0
    want = max(-(-_UNITS_PER_THREAD * nthreads // (n * ng)), -(-nt * r // _BAND_POSITIONS))
    nb = max(1, min(nt, want))
    return nb, nt // nb


def tiles_for(n: int, hw: int, k: int, oc: int, nthreads: int,
              by_group: tuple[bool, ...] = (False,)) -> PointwiseTiles:  # fmt: skip
    """The tiling of ``n`` planes of ``hw`` positions, ``k`` input and ``oc`` output
    channels at ``nthreads`` threads, by the cost model (the module's docstring), among the
    units' orders ``by_group`` allows (True: groups slowest, :class:`PointwiseTiles`)."""
    v = 16 // vector_width()  # registers per 16-lane vector
    budget = 24 if v == 1 else 6  # accumulators of 16 lanes: of 32 zmm, or 16 ymm registers
    nblk = -(-oc // loops.BLOCK)
    best = None
    for b in (b for b in range(1, min(4, nblk) + 1) if nblk % b == 0):
        ng = nblk // b  # groups of whole blocks: only the last block may be half padding
        for r in range(1, min(14, budget // b) + 1):
            nt = hw // r
            rr, tiles = (r, nt + (hw % r != 0)) if nt else (1, hw)
            per_ic = max(rr * b * v / 2, (rr + b * v) / 2, 4)
            tile = per_ic * k + _EPI_CYCLES * rr * b * v + _TILE_CYCLES
            nb, tpb = _split(n, ng, nt, r, nthreads)
            units = n * ng * nb
            # the slowest thread's share, a unit of the most tiles (the last band's) apiece
            most = tiles - (nb - 1) * tpb if nt else tiles
            per_thread = math.ceil(units / nthreads)
            cost = tile * (n * ng * tiles / units) * per_thread + tile * (most - tiles / nb)
            for order in by_group:
                c = cost + _traffic(n * hw * k, ng, k * b * loops.BLOCK, order, nthreads)
                if best is None or c < best[0]:
                    best = (c, PointwiseTiles(r, b, ng, nb, tpb, order))
    return best[1]


def _traffic(source: int, ng: int, group: int, by_group: bool, nthreads: int) -> float:
    """Cycles the slowest of ``nthreads`` threads spends bringing its share of the source
    (``source`` floats) and of the packed filter (``ng`` groups of ``group`` floats) to its
    core: with the groups slowest (``by_group``) a thread reads the whole source and the
    groups its range of units covers, otherwise a share of the source and every group."""
    if nthreads == 1:
        return 0.0  # one thread reads everything either way: no order is cheaper
    if by_group:
        per = ng // nthreads + (ng % nthreads != 0) + (ng % nthreads > 1)
        floats = source + min(ng, per) * group
    else:
        floats = source / nthreads + ng * group
    return floats * 4 / _TRAFFIC_BYTES


def _flat_operand(a: np.ndarray | None, steps: list) -> np.ndarray:
    """The flat read-only view of ``a`` (read at every run), of a copy that a step appended
    to ``steps`` refreshes at every run when ``a`` is strided; a dummy for None."""
    if a is None:
        return _EMPTY
    if not a.flags.c_contiguous:
        dense = workspace.empty(a.shape, _F32)
        steps.append(functools.partial(np.copyto, dense, a))
        a = dense
    return readonly_view(a.reshape(-1))


def bind_pointwise88(src: np.ndarray, filt: np.ndarray, out: np.ndarray,
                     epilogue: Epilogue | None = None, z: np.ndarray | None = None,
                     tiles: PointwiseTiles | None = None,
                     gate: np.ndarray | None = None,
                     preact: tuple[np.ndarray, np.ndarray] | None = None) -> Step:  # fmt: skip
    """Bind ``out = act(conv(src gate, filt) + bias + z)`` for a dense 1x1 stride-1 NCHW88
    convolution (with ``preact``, of ``relu(src scale + shift)``).

    Parameters
    ----------
    src : numpy.ndarray
        ``(N, IC/8, H, W, 8)`` float32 (any strides).
    filt : numpy.ndarray
        ``(OC/8, IC/8, 1, 1, 8, 8)`` float32.
    out : numpy.ndarray
        ``(N, OC/8, H, W, 8)`` float32, C-contiguous (checked by the caller,
        :func:`.nchw88.bind_nchw88_forward`).
    epilogue : Epilogue, optional
        The per-channel bias (OC values), ReLU or H_SWISH, and the ReLU6 or SiLU tail.
    z : numpy.ndarray, optional
        An array of the output's shape added after the bias, before the activation; it may
        be ``out`` itself (each position's ``z`` is read before the position is written).
    tiles : PointwiseTiles, optional
        The tiling (default :func:`tiles_for`'s).
    gate : numpy.ndarray, optional
        ``(N, IC/8, 1, 1, 8)`` float32 scaling each sample's input channels (read at every
        run): the kernel scales the filter's vectors of each input channel as it loads them
        (the squeeze-and-excitation multiply, without a pass over the source).
    preact : (numpy.ndarray, numpy.ndarray), optional
        ``(scale, shift)``, each ``(1, IC/8, 1, 1, 8)`` float32 (read at every run): the
        kernel reads the source through ``relu(src scale + shift)`` per input channel (a
        pre-activation BatchNorm and ReLU, without a pass over the source); not with
        ``gate``.

    Returns
    -------
    Step
        The callable computing ``out``.

    Raises
    ------
    ValueError
        For an epilogue this kernel does not apply (a bit without a row in the loops'
        ``ACTIVATIONS``).
    """
    n, icb, h, w, _ = src.shape
    hw, ocb8 = h * w, out.shape[1]
    k, oc = icb * loops.CB, ocb8 * loops.CB
    steps: list[Step] = []
    xp = _flat_operand(src, steps)
    bias, epi = epilogue_operands(epilogue, steps)
    unapplied = epi & ~(1 | sum(loops.ACTIVATIONS))
    if unapplied:  # never a silent wrong answer: the caller runs such a tail after the kernel
        raise ValueError(f"POINTWISE_NCHW88 does not apply epilogue bits {unapplied}")
    if gate is not None and preact is not None:
        raise ValueError("POINTWISE_NCHW88 takes a gate or a pre-activation, not both")
    zf, gf = _flat_operand(z, steps), _flat_operand(gate, steps)
    sf = _EMPTY
    if preact is not None:
        gf, sf = (_flat_operand(a, steps) for a in preact)
    epi |= (2 if z is not None else 0) | (loops.GATE if gate is not None else 0)
    epi |= loops.PREACT if preact is not None else 0
    macs = n * hw * k * oc
    nthreads = 1 if macs < MIN_SPLIT_MACS else threads()
    tl = tiles or tiles_for(n, hw, k, oc, nthreads, (False, True))
    constant = filter_is_constant()
    wp = (workspace.aligned if constant else workspace.empty)((tl.ng * k * tl.b * loops.BLOCK,),
                                                             _F32)  # fmt: skip
    pack_w = loops.filter_packer(filt, wp, tl.b)
    half = int(oc % loops.BLOCK != 0)
    geom = np.array([hw, icb, tl.ng, half, ocb8, tl.nb, tl.tpb, tl.by_group, n], np.int64)
    run = loops.compiled_units(tl.r, tl.b, epi)
    outf, wr = out.reshape(-1), readonly_view(wp)

    def bind_part(counter: np.ndarray, me: int) -> Step:
        return functools.partial(run, xp, wr, outf, zf, bias, gf, sf, geom, counter, me)

    steps.append(units_as_they_go(n * tl.ng * tl.nb, bind_part, nthreads))
    return filter_packed(pack_w, chain(steps), constant)

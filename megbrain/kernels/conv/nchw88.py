"""Forward convolution in the NCHW88 format (MegDNN's channel-blocked layout for AVX2): the
source ``(N, C/8, H, W, 8)``, the output ``(N, OC/8, OH, OW, 8)`` and the filter

- dense ``(OC/8, IC/8, FH, FW, 8 ic, 8 oc)``;
- grouped (``sparse=GROUP``) ``(G, OCg/8, ICg/8, FH, FW, 8 ic, 8 oc)``;
- channel-wise (``sparse=GROUP``, one input and output channel per group)
  ``(G/8, 1, 1, FH, FW, 8)``;
- hybrid (the first layer of a network: an NCHW source of at most 8 channels)
  ``(OC/8, FH, FW, IC, 8 oc)``.

Five algorithms:

- POINTWISE_NCHW88 (float32, dense, 1x1, stride 1, no padding, a C-contiguous output): the
  tiles of :mod:`.pointwise88`, the whole reduction and the epilogue in registers, chosen
  over DIRECT_NCHW88 where :func:`preferred_pointwise88` says; the same sums bit for bit.
- DIRECT_NCHW88 (float32, dense or grouped, padding and dilated filter reach at most
  :data:`.nchw8c.MAX_PAD`, a C-contiguous output): the register tiles of :mod:`.nchw8c`
  (16 output channels, and 8 for a group's last block where ``OCg % 16 == 8``) reading
  the blocked source (copied into zero-padded phase planes row by row, or read in place by
  a pointwise convolution with stride 1 and no padding) and writing the blocked output
  directly, with the bias, the residual ``z`` and the ReLU of a ConvBias applied on the
  way. A network kept in NCHW88 between its convolutions
  (``optimize_for_inference(use_nchw88=True)``) so spends no time on the copies and the
  transposing writes an NCHW convolution pays for at every layer.
- CHANNELWISE_NCHW88 (float32, channel-wise): the direct kernel of :mod:`.channelwise88`,
  reading the blocked source in place, any filter size, stride, padding and dilation, the
  same epilogue.
- DIRECT_NCHW_NCHW88 (float32, hybrid): the direct kernel of :mod:`.hybrid88`, writing a
  first layer's NCHW88 output straight from its NCHW source, the same epilogue.
- NCHW88_AS_NCHW (any other case): the source and filter copied to NCHW, an NCHW
  convolution chosen as usual (:mod:`.registry`), its result copied back.

DIRECT_NCHW88 and NCHW88_AS_NCHW give the sums in the order of the NCHW algorithms they share
tiles with: DIRECT_NCHW88 equals DIRECT_NCHW8C on the same values, bit for bit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from .. import parallel, workspace
from ..steps import Step, chain
from .channelwise88 import ALGORITHM as CHANNELWISE
from .channelwise88 import bind_channelwise88, usable_channelwise88
from .common import conv_out_size
from .constant_operands import filter_is_constant
from .epilogue import Epilogue, epilogue_operands, tail_step
from .hybrid88 import ALGORITHM as HYBRID
from .hybrid88 import bind_hybrid88, usable_hybrid88
from .loops import nchw8c as loops
from .nchw8c import MAX_PAD, filter_packed, plane_geometry, units_as_they_go, wide_units
from .pointwise88 import ALGORITHM as POINTWISE
from .pointwise88 import bind_pointwise88, usable_pointwise88
from .registry import bind as bind_chosen

__all__ = [
    "Nchw88Geometry",
    "bind_nchw88_forward",
    "direct_geometry",
    "nchw88_geometry",
    "preactivate",
    "preferred_pointwise88",
    "row_tiles",
    "to_nchw",
    "to_nchw88",
    "unit_rows",
    "usable_direct_nchw88",
]

_F32 = np.dtype(np.float32)
_PACK = 8
#: the most positions a unit takes whole (a 14x14 plane): more are split in bands of at
#: least ROW_POSITIONS positions
WHOLE_PLANE = 256
#: output positions (whole rows) a unit covers at least: 192 ran 3-8% faster than 96 and
#: 384 on ResNet50's 56x56 and 28x28 layers (a unit's output and z rows stream longer)
ROW_POSITIONS = 192
#: below these multiply-adds (tiles' positions counted whole) one thread runs the units: a
#: squeeze-and-excitation layer at 1x1 (576 -> 144) took 0.021 ms on one core and 0.039 on
#: two, waiting for the second; 4x4 144 -> 576 0.028 and 0.032
MIN_SPLIT_MACS = 1 << 21
_EMPTY = np.zeros(1, _F32)
_EMPTY.flags.writeable = False


class Nchw88Geometry(NamedTuple):
    """A checked NCHW88 convolution: ``kind`` (dense, group, chan or hybrid), groups,
    channels per group, filter spatial shape and the output shape."""

    kind: str
    g: int
    icg: int
    ocg: int
    fshape: tuple[int, int]
    out_shape: tuple[int, ...]


def nchw88_geometry(src_shape, filt_shape, group: bool, stride, pad, dilate) -> Nchw88Geometry:
    """The geometry of an NCHW88 forward convolution; ValueError (a message naming the shapes)
    when the shapes do not make one."""
    src, flt = tuple(src_shape), tuple(filt_shape)

    def bad(why: str) -> ValueError:
        return ValueError(f"NCHW88: {why}; got src {src}, filter {flt}")

    if len(src) == 5:
        if src[4] != _PACK:
            raise bad("the source's last dim must be 8, (N, C/8, H, W, 8)")
        c = src[1] * _PACK
        if not group:
            if len(flt) != 6 or flt[4:] != (_PACK, _PACK):
                raise bad("a dense filter is (OC/8, IC/8, FH, FW, 8, 8)")
            kind, g, ocg, icg, fsp = "dense", 1, flt[0] * _PACK, flt[1] * _PACK, flt[2:4]
        elif len(flt) == 7:
            if flt[5:] != (_PACK, _PACK):
                raise bad("a grouped filter is (G, OCg/8, ICg/8, FH, FW, 8, 8)")
            kind, g, ocg, icg, fsp = "group", flt[0], flt[1] * _PACK, flt[2] * _PACK, flt[3:5]
        elif len(flt) == 6:
            if flt[1:3] != (1, 1) or flt[5] != _PACK:
                raise bad("a channel-wise filter is (G/8, 1, 1, FH, FW, 8)")
            kind, g, ocg, icg, fsp = "chan", flt[0] * _PACK, 1, 1, flt[3:5]
        else:
            raise bad("sparse=GROUP needs a 7-d grouped or 6-d channel-wise filter")
    elif len(src) == 4:
        if group or len(flt) != 5 or flt[4] != _PACK:
            raise bad("an NCHW source (hybrid) needs a dense (OC/8, FH, FW, IC, 8) filter")
        c = src[1]
        if c > _PACK:
            raise bad("an NCHW source (hybrid) has at most 8 channels")
        kind, g, ocg, icg, fsp = "hybrid", 1, flt[0] * _PACK, flt[3], flt[1:3]
    else:
        raise bad("the source must be (N, C/8, H, W, 8), or NCHW with at most 8 channels")
    if c != g * icg:
        raise bad(f"the source has {c} channels, the filter expects {g * icg}")
    if any(v <= 0 for v in (*src, *flt)):
        raise bad("every dim must be positive")
    osp = tuple(conv_out_size(*a) for a in zip(src[2:4], fsp, stride, pad, dilate))
    if any(o <= 0 for o in osp):
        raise bad(f"the output size {osp} is not positive (pad={tuple(pad)}, "
                  f"dilate={tuple(dilate)})")  # fmt: skip
    return Nchw88Geometry(kind, g, icg, ocg, tuple(fsp), (src[0], g * ocg // _PACK, *osp, _PACK))


def to_nchw88(x: np.ndarray) -> np.ndarray:
    """The (N, C/8, H, W, 8) view of an NCHW array's values (a strided view: no copy)."""
    n, c, h, w = x.shape
    return x.reshape(n, c // _PACK, _PACK, h, w).transpose(0, 1, 3, 4, 2)


def to_nchw(x: np.ndarray) -> np.ndarray:
    """The (N, C, H, W) values of an NCHW88 array (a copy when ``x`` is not a view from
    :func:`to_nchw88`)."""
    n, cb, h, w, p = x.shape
    return x.transpose(0, 1, 4, 2, 3).reshape(n, cb * p, h, w)


def _grouped_nchw_view(filt: np.ndarray, kind: str, g: int, ocg: int, icg: int):
    """``(buffer shape (G, OCg, ICg, FH, FW), a function writing filt's values into such a
    buffer)``."""
    fh, fw = (filt.shape[2:4] if kind == "dense" else filt.shape[3:5] if kind != "hybrid"
              else filt.shape[1:3])  # fmt: skip
    shape = (g, ocg, icg, fh, fw)

    def write(buf: np.ndarray) -> None:
        if kind == "dense":  # (O8, I8, FH, FW, 8i, 8o) -> (O8, 8o, I8, 8i, FH, FW)
            dst = buf.reshape(ocg // _PACK, _PACK, icg // _PACK, _PACK, fh, fw)
            np.copyto(dst, filt.transpose(0, 5, 1, 4, 2, 3))
        elif kind == "group":  # (G, O8, I8, FH, FW, 8i, 8o)
            dst = buf.reshape(g, ocg // _PACK, _PACK, icg // _PACK, _PACK, fh, fw)
            np.copyto(dst, filt.transpose(0, 1, 6, 2, 5, 3, 4))
        elif kind == "chan":  # (G/8, 1, 1, FH, FW, 8) -> (G/8, 8, FH, FW)
            dst = buf.reshape(g // _PACK, _PACK, fh, fw)
            np.copyto(dst, filt[:, 0, 0].transpose(0, 3, 1, 2))
        else:  # hybrid (O8, FH, FW, IC, 8o) -> (O8, 8o, IC, FH, FW)
            dst = buf.reshape(ocg // _PACK, _PACK, icg, fh, fw)
            np.copyto(dst, filt.transpose(0, 4, 3, 1, 2))

    return shape, write


def preferred_pointwise88(geo: Nchw88Geometry) -> bool:
    """Whether POINTWISE_NCHW88 computes a convolution it can rather than DIRECT_NCHW88: on
    every pointwise layer of MobileNetV2, MnasNet, MobileNetV3 and EfficientNet-B0 it ran
    1.3-1.9x as fast on one core (benchmarks/pointwise88.py; docs/performance.md)."""
    return True


def direct_geometry(geo: Nchw88Geometry, pad, dilate) -> bool:
    """Whether DIRECT_NCHW88 takes the geometry: dense or grouped (any ``OCg``, a multiple
    of 8: tiles of 16 output channels, and one of 8 for the rest), padding and dilated filter
    reach at most MAX_PAD."""
    return (
        geo.kind in ("dense", "group")
        and all(0 <= p <= MAX_PAD for p in pad)
        and all((f - 1) * d <= MAX_PAD for f, d in zip(geo.fshape, dilate))
    )


def usable_direct_nchw88(src, filt, out, geo: Nchw88Geometry, pad, dilate) -> bool:
    """Whether DIRECT_NCHW88 computes the convolution: float32 operands, a geometry
    :func:`direct_geometry` takes, a C-contiguous writable output."""
    return (
        src.dtype == filt.dtype == out.dtype == _F32
        and direct_geometry(geo, pad, dilate)
        and out.flags.c_contiguous
        and out.flags.writeable
    )


def bind_nchw88_forward(
    src: np.ndarray,
    filt: np.ndarray,
    out: np.ndarray,
    stride: Sequence[int],
    pad: Sequence[int],
    dilate: Sequence[int],
    flip: bool = False,
    *,
    group: bool = False,
    epilogue: Epilogue | None = None,
    z: np.ndarray | None = None,
    select_nchw: Callable | None = None,
    gate: np.ndarray | None = None,
    preact: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[str, Callable[[], None]]:
    """Bind the NCHW88 convolution ``out = conv(src, filt)`` (with ``epilogue``,
    ``act(conv + bias + z)``; with ``gate``, of ``src gate``; with ``preact``, of
    ``relu(src scale + shift)``).

    Parameters
    ----------
    src, filt, out : numpy.ndarray
        The operands in the NCHW88 layouts of this module (``group`` selects the grouped
        and channel-wise filters).
    stride, pad, dilate : sequence of int
        Two values each.
    flip : bool
        CONVOLUTION mode (the filter flipped spatially).
    group : bool
        ``sparse=GROUP``.
    epilogue : Epilogue, optional
        The per-channel bias (a 1-d view of OC values), ReLU or H_SWISH to apply, and the
        ReLU6 or SiLU tail (applied by the kernel where the chosen algorithm can, else by the
        JIT's kernel after it).
    z : numpy.ndarray, optional
        An array of the output's shape added (after the bias, before the activation).
    select_nchw : callable, optional
        ``select_nchw(src, filt, out) -> step`` binding the NCHW convolution of the
        NCHW88_AS_NCHW algorithm (the operator's own choice of algorithm and its epilogue
        handling; NCHW ``src``, grouped ``filt``, NCHW ``out``).
    gate : numpy.ndarray, optional
        A float32 array broadcast over ``src``'s plane (``(N, IC/8, 1, 1, 8)``) scaling the
        source, read at every run: POINTWISE_NCHW88 scales its filter's vectors by it as it
        loads them; the other algorithms read the product, computed into the workspace
        first.
    preact : (numpy.ndarray, numpy.ndarray), optional
        ``(scale, shift)``, float32 arrays ``(1, IC/8, 1, 1, 8)`` read at every run: the
        source is read as ``relu(src scale + shift)`` (a pre-activation BatchNorm and ReLU),
        by POINTWISE_NCHW88 as it loads it; the other algorithms read it computed into the
        workspace first. Not with ``gate``.

    Returns
    -------
    (str, Callable[[], None])
        The algorithm's name and the step computing ``out``.

    Raises
    ------
    ValueError
        When the shapes do not make an NCHW88 convolution into ``out``.
    """
    geo = nchw88_geometry(src.shape, filt.shape, group, stride, pad, dilate)
    if tuple(out.shape) != geo.out_shape:
        raise ValueError(f"NCHW88: out {tuple(out.shape)} must be {geo.out_shape} for src "
                         f"{tuple(src.shape)} and filter {tuple(filt.shape)}")  # fmt: skip
    if z is not None and tuple(z.shape) != geo.out_shape:
        raise ValueError(f"NCHW88: z {tuple(z.shape)} must have the output's shape "
                         f"{geo.out_shape}")  # fmt: skip
    pointwise = usable_pointwise88(src, filt, out, geo, stride, pad) and (
        z is None or z.dtype == _F32
    )
    if gate is not None and not (pointwise and gate.dtype == _F32 and gate.shape == (
        src.shape[0], src.shape[1], 1, 1, src.shape[4]
    )):  # fmt: skip
        scaled = workspace.empty(np.broadcast_shapes(src.shape, gate.shape),
                                 np.result_type(src, gate))  # fmt: skip
        name, step = bind_nchw88_forward(scaled, filt, out, stride, pad, dilate, flip,
                                         group=group, epilogue=epilogue, z=z,
                                         select_nchw=select_nchw)  # fmt: skip
        return name, chain([functools.partial(np.multiply, src, gate, out=scaled), step])
    if preact is not None and not (pointwise and gate is None and all(
        a.dtype == _F32 and a.shape == (1, src.shape[1], 1, 1, src.shape[4]) for a in preact
    )):  # fmt: skip
        act = workspace.empty(src.shape, _F32)
        name, step = bind_nchw88_forward(act, filt, out, stride, pad, dilate, flip,
                                         group=group, epilogue=epilogue, z=z,
                                         select_nchw=select_nchw, gate=gate)  # fmt: skip
        return name, chain([functools.partial(preactivate, src, *preact, act), step])
    if pointwise and (gate is not None or preact is not None or preferred_pointwise88(geo)):
        ep, after = _tail_after(epilogue, out, relu6=True, silu=True)
        return POINTWISE, _then(bind_pointwise88(src, filt, out, ep, z, gate=gate,
                                                 preact=preact), after)  # fmt: skip
    if usable_direct_nchw88(src, filt, out, geo, pad, dilate) and (
        z is None or z.dtype == _F32
    ):
        ep, after = _tail_after(epilogue, out, relu6=True, silu=True)
        return "DIRECT_NCHW88", _then(_bind_direct(src, filt, out, geo, stride, pad, dilate,
                                                   flip, ep, z), after)  # fmt: skip
    if geo.kind == "chan" and usable_channelwise88(src, filt, out, pad) and (
        z is None or z.dtype == _F32
    ):
        return CHANNELWISE, bind_channelwise88(src, filt, out, stride, pad, dilate, flip,
                                               epilogue, z)  # fmt: skip
    if geo.kind == "hybrid" and usable_hybrid88(src, filt, out, pad) and (
        z is None or z.dtype == _F32
    ):
        ep, after = _tail_after(epilogue, out, relu6=True, silu=False)
        return HYBRID, _then(bind_hybrid88(src, filt, out, stride, pad, dilate, flip, ep, z),
                             after)  # fmt: skip
    return "NCHW88_AS_NCHW", _bind_as_nchw(src, filt, out, geo, stride, pad, dilate, flip,
                                           epilogue, z, select_nchw)  # fmt: skip


def _tail_after(epilogue: Epilogue | None, out: np.ndarray, relu6: bool,
                silu: bool) -> tuple[Epilogue | None, Step | None]:  # fmt: skip
    """``epilogue`` without a tail the algorithm does not apply in its kernel (ReLU6 unless
    ``relu6``, SiLU unless ``silu``), and the step applying that tail to ``out`` after the
    kernel (the JIT's kernel, in place), else None. A ReLU6 in the first layer's tile made
    LLVM gather the tile."""
    if epilogue is None or not ((epilogue.relu6 and not relu6) or (epilogue.silu and not silu)):
        return epilogue, None
    tail = "RELU6" if epilogue.relu6 else "SILU"
    return epilogue._replace(relu6=False, silu=False), tail_step(tail, out)


def _then(step: Step, after: Step | None) -> Step:
    return step if after is None else chain([step, after])


def _bind_as_nchw(src, filt, out, geo, stride, pad, dilate, flip, epilogue, z, select_nchw):
    n, (h, w) = src.shape[0], src.shape[2:4]
    steps: list[Step] = []
    if geo.kind == "hybrid":
        x = src
    else:
        x = workspace.empty((n, geo.g * geo.icg, h, w), src.dtype)
        steps.append(functools.partial(np.copyto, to_nchw88(x), src))
    wshape, write = _grouped_nchw_view(filt, geo.kind, geo.g, geo.ocg, geo.icg)
    wbuf = workspace.empty(wshape, filt.dtype)
    steps.append(functools.partial(write, wbuf))
    y = workspace.empty((n, geo.g * geo.ocg, *geo.out_shape[2:4]), out.dtype)
    if select_nchw is not None:
        steps.append(select_nchw(x, wbuf, y))
    else:
        steps.append(bind_chosen("forward", x, wbuf, y, stride, pad, dilate, flip))
    y88 = to_nchw88(y)
    if epilogue is not None:
        bias = epilogue.bias.reshape(1, -1, 1, 1)
        steps.append(functools.partial(np.add, y, bias, out=y))
    if z is not None:
        steps.append(functools.partial(np.add, y88, z, out=y88))
    if epilogue is not None and epilogue.relu:
        steps.append(functools.partial(_relu, y))
    if epilogue is not None and epilogue.hswish:
        steps.append(functools.partial(_hswish, y, workspace.empty(y.shape, y.dtype)))
    if epilogue is not None and (epilogue.relu6 or epilogue.silu):
        steps.append(tail_step("RELU6" if epilogue.relu6 else "SILU", y))
    steps.append(functools.partial(np.copyto, out, y88))
    return chain(steps)


def unit_rows(oh: int, wq: int, ow: int, planes: int, widths: Sequence[float],
              threads: int) -> tuple[int, bool]:  # fmt: skip
    """``(rows, bands_first)``: the output rows of DIRECT_NCHW88's units (bands of them) and
    whether a unit's bands vary fastest in the units' order (else its channel blocks), for
    ``planes`` (sample, group) pairs of ``oh`` rows, ``wq`` plane positions a row (``ow``
    written), channel units of ``widths`` blocks of 16 each, taken by ``threads`` threads.

    A plane of at most :data:`WHOLE_PLANE` positions is one unit per channel unit, unless
    whole planes leave the threads unevenly loaded: then it is cut into the bands (at most 4)
    that the threads finish soonest, a tile plus the unit's setup per band counted
    (:func:`_makespan`), the bands varying fastest so that each thread keeps a contiguous
    range of output channels, its share of the filter (DenseNet's 128->32 at 14x14 was one
    unit, one thread; GoogLeNet's 14x14 layers of 7 and 9 wide units left a thread 14% and
    11% idle). A larger plane is cut into bands of :data:`ROW_POSITIONS` positions or more,
    its channel blocks varying fastest: the threads split it by rows."""
    if oh * wq > WHOLE_PLANE:
        return max(1, min(oh, -(-ROW_POSITIONS // wq))), False
    best = (_makespan(oh, oh, wq, ow, planes, widths, threads), oh)
    for bands in range(2, min(oh, 4) + 1 if threads > 1 else 0):
        rows = -(-oh // bands)
        span = _makespan(oh, rows, wq, ow, planes, widths, threads)
        if span < 0.97 * best[0]:  # a band more only for a clear gain
            best = (span, rows)
    return best[1], best[1] < oh


def _makespan(oh: int, rows: int, wq: int, ow: int, planes: int, widths: Sequence[float],
              threads: int) -> float:  # fmt: skip
    """When the last of ``threads`` threads ends the units of :func:`unit_rows`'s split into
    bands of ``rows`` rows (the bands varying fastest), taken as
    :func:`.nchw8c.units_as_they_go` hands them out, a unit's time its tiles plus one, times
    its width."""
    p = loops.tile_positions()
    bands = [-(-((min(oh, h + rows) - h - 1) * wq + ow) // p) + 1 for h in range(0, oh, rows)]
    cost = [w * b for _ in range(planes) for w in widths for b in bands]
    ranges = parallel.ranges(len(cost), threads)
    nxt = [lo for lo, _ in ranges]
    clock = [0.0] * len(ranges)
    while True:
        me = min(range(len(ranges)), key=clock.__getitem__)
        k = next((k % len(ranges) for k in range(me, me + len(ranges))
                  if nxt[k % len(ranges)] < ranges[k % len(ranges)][1]), None)  # fmt: skip
        if k is None:
            return max(clock)
        clock[me] += cost[nxt[k]]
        nxt[k] += 1


def row_tiles(ow: int, wq: int, wide: bool) -> int:
    """The positions of DIRECT_NCHW88's row tiles for an output ``ow`` positions wide read
    from plane rows of ``wq`` positions (0: tiles of :func:`.loops.nchw8c.tile_positions`
    consecutive plane positions), for wide units (AVX-512: a tile of 14 positions by 32
    channels is 28 of its 32 registers) whose plane rows have a gap (``wq > ow``), so that
    no tile computes the gap's column: ``ow`` itself where it is one of
    :data:`.loops.nchw8c.ROW_TILES` (the 7x7, 13x13 and 14x14 planes: SqueezeNet's 13x13
    3x3 layers 1.08-1.10x as fast as in tiles of 12 on one core, which computed 192
    positions for 169), 14 for rows of 28 (two tiles a row: 1.6-2.6% faster than tiles of
    12 on the 28x28 3x3 layers of 128 or more input channels on one core, 5% slower on
    GoogLeNet's 16->32, a 0.08 ms layer) and of 27 (a tile of 14, then one of 13:
    SqueezeNet's 32->128 1-2% faster). Rows of 55 and 56 keep the tiles of P (3-6% and 2-4%
    faster there than tiles of 14 and a last of 13). Rows without a gap (a
    strided pointwise convolution's subsampled plane) keep them too: ResNet's 1x1/s2
    128->256 to 14x14 ran 1.4x as fast so, 256->512 to 7x7 1.08x (one core;
    docs/performance.md)."""
    if not wide or wq <= ow:
        return 0
    if ow in loops.ROW_TILES:
        return ow
    return 14 if ow in (27, 28) else 0


def _chunk(taps: int) -> int:
    """Channel blocks a tile sums at a time (:func:`.loops.nchw8c.conv_units_blocked`):
    8 for pointwise convolutions (1024->256 at 14x14: 0.79x the time of summing all 128 at
    once, on ResNet50's batch-1 layers at 2 threads), 16 for the others: on one core (AVX-512,
    32 KiB of L1 data cache, which a chunk of 4 blocks' 36 KiB of filter did not fit
    either) 1-4% faster than 4 on every 3x3 layer of ResNet-18, SqueezeNet and DenseNet
    tried (7x7 512->512 2.27 -> 2.22 ms, 14x14 256->256 2.15 -> 2.11), as fast as summing
    all at once but for 7x7 512->512 (2.17), whose unit's filter (590 KB) then has to stay
    in a core's L2 cache; 16 blocks of 32 channels are 147 KB."""
    return 8 if taps == 1 else 16


def preactivate(src: np.ndarray, scale: np.ndarray, shift: np.ndarray,
                 out: np.ndarray) -> None:  # fmt: skip
    """``out = relu(src scale + shift)`` (broadcast; NaN stays NaN): the source a
    pre-activated convolution reads where its algorithm does not apply it as it loads."""
    np.multiply(src, scale, out=out)
    np.add(out, shift, out=out)
    _relu(out)


def _relu(a: np.ndarray) -> None:
    np.maximum(a, 0, out=a)  # NaN stays NaN, as ELEMWISE RELU's


def _hswish(a: np.ndarray, w: np.ndarray) -> None:
    """``a = min(max(a + 3, 0), 6) a / 6`` in place (``w`` scratch of a's shape), in the
    elementwise kernels' order; fmax/fmin leave NaN to the product."""
    np.add(a, np.float32(3), out=w)
    np.fmax(w, np.float32(0), out=w)
    np.fmin(w, np.float32(6), out=w)
    np.multiply(w, a, out=w)
    np.multiply(w, np.float32(1 / 6), out=a)


def _bind_direct(src, filt, out, geo, stride, pad, dilate, flip, epilogue, z):
    n, cb_n, h, w, _ = src.shape
    oh, ow = geo.out_shape[2:4]
    (sh, sw), (pt, pl) = tuple(stride), tuple(pad)
    fh, fw = geo.fshape
    steps: list[Step] = []
    pointwise = geo.fshape == (1, 1) and (pt, pl) == (0, 0) and oh * ow >= loops.tile_positions()
    if not src.flags.c_contiguous:  # read in place, or packed a row at a time by runs
        dense = workspace.empty(src.shape, _F32)
        steps.append(functools.partial(np.copyto, dense, src))
        src = dense
    packing = None
    packed = None  # (row_off, col_off, phases) of a source the units' threads pack
    if pointwise:
        taps, shift = np.zeros(1, np.int64), 0
        if (sh, sw) == (1, 1):  # read in place
            hq, wq = h, w
            cstride = h * w * loops.CB
            sample = cb_n * cstride
            xp = loops.readonly_view(src.reshape(-1))
        else:
            # a strided pointwise convolution reads one position in sh * sw: the units'
            # threads pack that subsampled source (phase plane (0, 0) alone). Copied by
            # NumPy before the units instead, ResNet50's three took 0.2 ms on one core
            hq, wq = oh, ow
            packed = (0, 0, 1)
        limit = hq * wq  # a tile never reads past its plane
    else:
        hq, wq, col_off, shift, taps = plane_geometry((h, w), (oh, ow), (sh, sw), (pt, pl),
                                                      dilate, geo.fshape)  # fmt: skip
        packed = (pt, col_off, sh * sw)
        limit = hq * wq + loops.SLACK  # the planes are followed by SLACK zero positions
    if packed is not None:  # packed by the units' threads, in the same call
        cstride = packed[2] * hq * wq * loops.CB
        sample = cb_n * cstride + loops.SLACK * loops.CB
        buf = workspace.empty((n * sample,), _F32)
        xp = loops.readonly_view(buf)
        packing = loops.blocked_packing(src, buf, (sh, sw), *packed[:2], hq, wq,
                                        phases=packed[2])  # fmt: skip
        steps.append(functools.partial(packing[-1].fill, 0))
    constant = filter_is_constant()
    packed_size = geo.g * geo.ocg * geo.icg * fh * fw
    wp = (workspace.aligned if constant else workspace.empty)((packed_size,), _F32)
    wshape, write = _grouped_nchw_view(filt, geo.kind, geo.g, geo.ocg, geo.icg)
    wtmp = np.empty(wshape, _F32) if constant else workspace.empty(wshape, _F32)

    def pack_w() -> None:
        write(wtmp)
        loops.pack_filter(loops.readonly_view(wtmp), wp, flip)

    ocb, rem = divmod(geo.ocg, loops.OB)  # blocks of 16 channels, and one of 8 (rem 8)
    rem //= loops.CB
    # an odd count of blocks of 16 (GoogLeNet's 208, 112, 144, 48 channels) takes wide units
    # too, the last of them one block wide
    wide = wide_units(ocb) or (ocb >= 3 and wide_units(ocb + 1))
    per = 2 if wide else 1
    macs = n * geo.g * geo.ocg * geo.icg * fh * fw * max(oh * ow, loops.tile_positions())
    threads = 1 if macs < MIN_SPLIT_MACS else max(1, parallel.num_threads())
    widths = [per] * (ocb // per) + [1] * (ocb % per) + [0.5] * rem  # a unit's channels / 16
    rows, bands_first = unit_rows(oh, wq, ow, n * geo.g, widths, threads)
    units = n * geo.g * len(widths) * -(-oh // rows)
    geom = np.array([geo.g, ocb, geo.icg // loops.CB, wq, oh, ow, rows, cstride, sample, shift,
                     limit, _chunk(taps.size), wide, rem, bands_first, row_tiles(ow, wq, wide)],
                    np.int64)  # fmt: skip
    outf = out.reshape(-1)
    bias, epi = epilogue_operands(epilogue, steps)
    zf = _EMPTY
    if z is not None:
        zc = z if z.flags.c_contiguous else None
        if zc is None:
            zc = workspace.empty(z.shape, _F32)
            steps.append(functools.partial(np.copyto, zc, z))
        zf = loops.readonly_view(zc.reshape(-1))
        epi |= 2

    def bind_part(counter: np.ndarray, me: int) -> Step:
        rb = workspace.empty(((rows * wq + 2 * loops.tile_positions()) * loops.OB * per,), _F32)
        return loops.conv_units_blocked(xp, wp, outf, zf, rb, taps, geom, bias, epi, counter,
                                        me, packing)  # fmt: skip

    steps.append(units_as_they_go(units, bind_part, 1 if macs < MIN_SPLIT_MACS else None))
    return filter_packed(pack_w, chain(steps), constant)

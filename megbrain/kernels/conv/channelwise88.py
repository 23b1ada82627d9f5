"""The channel-wise (depthwise) convolution in NCHW88: source ``(N, C/8, H, W, 8)``, filter
``(C/8, 1, 1, FH, FW, 8)``, output ``(N, C/8, OH, OW, 8)``, float32, any filter size, stride,
padding and dilation, with ConvBias's bias, residual ``z`` and ReLU applied on the way.

MobileNet-class networks put a depthwise convolution between two pointwise ones in every
block; computed in NCHW, each one cost two relayouts out of and back into NCHW88. Here a
compiled loop (:func:`.loops.channelwise88.channelwise88`) reads the blocked source in
place: the 8 channels of a position are one vector (where the target has AVX-512, two
channel blocks' 8 are one vector of 16 lanes, their filters packed in pairs: half the
multiply-add instructions for the same bits), 8 positions of an output row summed at
once in registers, the filter's columns unrolled for widths 3, 5 and 7 at strides 1 and 2, the
epilogue applied before the row's vectors are stored. Only the tiles at a row's ends check
their columns (reading zeros outside the source); a copy of the source padded with zeros
cost as much as the sums on a 56x56 plane. :func:`.common.threads` Python threads take the
units (a band of output rows of one sample's channel block, so that a few blocks still
fill the threads, or several whole blocks where there are many; sized so that no thread is
left a unit more than the others) as they go
(:func:`.nchw8c.units_as_they_go`): a thread the OS holds back delays the unit it has, not
a fixed half of them; a layer of less work than :data:`MIN_SPLIT_WORK` runs on the calling
thread alone (the hand-off cost more than the second thread saved). Nothing is allocated
when the bound callable runs, and every output is summed in the same order whoever
computes it.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import workspace
from ..steps import Step, chain
from ..tiled_jit import vector_width
from .common import threads
from .constant_operands import filter_is_constant
from .epilogue import Epilogue, epilogue_operands
from .loops import channelwise88 as loops
from .nchw8c import filter_packed, units_as_they_go

__all__ = ["ALGORITHM", "MIN_SPLIT_WORK", "bind_channelwise88", "split_work",
           "usable_channelwise88"]

#: the algorithm's name, as ``chosen_algorithm`` reports it
ALGORITHM = "CHANNELWISE_NCHW88"
#: a block's output rows are cut into bands until there are this many units per thread, and
#: many blocks are grouped into units down to that many (each unit taken costs an atomic
#: on the cache line the threads share: 72 units of a 576x14x14 layer cost 10 us at 2 threads)
_UNITS_PER_THREAD = 4
#: below this work (multiply-adds plus twice the source's elements, :func:`split_work`) one
#: thread runs the layer, with no hand-off: on the 2-core machines, near idle, every
#: depthwise layer of MobileNetV3-small ran 0.54-0.90x as fast at two threads as at one
#: (5-25 us; the 5x5 at 14x14, 240 channels, 1.27M: 25.4 -> 29.8 us), the 3x3 at 14x14 of
#: 480 channels (1.03M) at par, while those of 1.5M and more gained 1.14-1.6x (7x7 of 1152
#: channels, 5x5: 30.3 -> 26.2 us; 28x28 of 240 channels, 5x5: 101 -> 63 us)
MIN_SPLIT_WORK = 1_400_000
_F32 = np.dtype(np.float32)
_EMPTY = np.zeros(1, _F32)
_EMPTY.flags.writeable = False


def _makespan(sizes: list[int], t: int) -> int:
    """The work of the busiest of ``t`` threads taking units of ``sizes`` as they go (the
    largest first: the order of :func:`.nchw8c.units_as_they_go`'s ranges aside)."""
    load = [0] * t
    for s in sorted(sizes, reverse=True):
        load[load.index(min(load))] += s
    return max(load)


def _units(blocks: int, oh: int, t: int) -> tuple[int, int, int]:
    """``(rows, bands, per)``: units of ``per`` channel slots by a band of ``rows`` output
    rows, ``bands`` bands, for ``blocks`` slots of ``oh`` rows at ``t`` threads. Bands
    until there are :data:`_UNITS_PER_THREAD` units a thread (or slots grouped down to
    that many), then, among fewer slots a unit (or, where the rows are banded already, a
    band or two more), the units whose busiest thread has the least work, the fewest units
    at a tie: 36 slots in 9 units of 4 left one thread 5 of them, in 12 units of 3 each
    thread has 6."""
    if t == 1:
        return oh, 1, max(1, blocks // _UNITS_PER_THREAD)
    bands0 = max(1, min(oh, -(-_UNITS_PER_THREAD * t // blocks)))
    rows = -(-oh // bands0)
    bands0 = -(-oh // rows)
    per0 = max(1, blocks // (_UNITS_PER_THREAD * t)) if bands0 == 1 else 1
    best = None
    for bands in range(bands0, min(oh, bands0 + 2) + 1 if bands0 > 1 else 2):
        rows = -(-oh // bands)
        bands = -(-oh // rows)
        for per in range(per0, 0, -1):
            full, last = divmod(blocks, per)
            slots = [per] * full + ([last] if last else [])
            sizes = [s * rows for s in slots] * (bands - 1)
            sizes += [s * (oh - (bands - 1) * rows) for s in slots]
            key = (_makespan(sizes, t), len(sizes))
            if best is None or key < best[0]:
                best = (key, (rows, bands, per))
    return best[1]


def split_work(n: int, c: int, h: int, w: int, oh: int, ow: int, fh: int, fw: int) -> int:
    """The work :data:`MIN_SPLIT_WORK` compares: the multiply-adds of ``n`` samples of ``c``
    channels, ``oh x ow`` outputs of an ``fh x fw`` filter each, plus twice the source's
    ``n c h w`` elements (a layer at stride 2 reads four times the source of its outputs,
    and took 44 us at 1.0M multiply-adds where one at stride 1 took 31)."""
    return n * c * (oh * ow * fh * fw + 2 * h * w)


def usable_channelwise88(src: np.ndarray, filt: np.ndarray, out: np.ndarray, pad) -> bool:
    """Whether :func:`bind_channelwise88` computes the convolution: float32 operands, a
    channel-wise filter (6-d), non-negative padding."""
    return (
        src.dtype == filt.dtype == out.dtype == _F32
        and src.ndim == 5
        and filt.ndim == 6
        and all(p >= 0 for p in pad)
    )


def _contiguous(a: np.ndarray, steps: list[Step]) -> np.ndarray:
    """``a``, or a C-contiguous workspace copy of it refreshed by a step added to ``steps``."""
    if a.flags.c_contiguous:
        return a
    copy = workspace.empty(a.shape, a.dtype)
    steps.append(functools.partial(np.copyto, copy, a))
    return copy


def _readonly(a: np.ndarray) -> np.ndarray:
    """A read-only flat view of the C-contiguous ``a`` (the type the loop is compiled for)."""
    view = a.reshape(-1)
    view.flags.writeable = False
    return view


def _pack_filter(wbuf: np.ndarray, taps: np.ndarray, pairs: bool) -> None:
    """``taps`` (C/8, FH, FW, 8) into the flat ``wbuf``: as they are, or (``pairs``) each
    two blocks' taps side by side, 16 lanes a tap (the kernel's vectors of two blocks), the
    odd last block as it is."""
    cbn, fh, fw, cb = taps.shape
    if not pairs:
        np.copyto(wbuf.reshape(taps.shape), taps)
        return
    p = cbn // 2
    head = wbuf[: p * fh * fw * 2 * cb].reshape(p, fh, fw, 2, cb)
    np.copyto(head, taps[: 2 * p].reshape(p, 2, fh, fw, cb).transpose(0, 2, 3, 1, 4))
    if cbn % 2:
        np.copyto(wbuf[p * fh * fw * 2 * cb :].reshape(fh, fw, cb), taps[-1])


def bind_channelwise88(src: np.ndarray, filt: np.ndarray, out: np.ndarray, stride, pad,
                       dilate, flip: bool = False, epilogue: Epilogue | None = None,
                       z: np.ndarray | None = None) -> Step:  # fmt: skip
    """Bind ``out = act(conv(src, filt) + bias + z)`` for a channel-wise NCHW88 convolution.

    Parameters
    ----------
    src : numpy.ndarray
        ``(N, C/8, H, W, 8)`` float32 (any strides).
    filt : numpy.ndarray
        ``(C/8, 1, 1, FH, FW, 8)`` float32.
    out : numpy.ndarray
        ``(N, C/8, OH, OW, 8)`` float32, the shape the geometry gives (checked by the
        caller, :func:`.nchw88.bind_nchw88_forward`).
    stride, pad, dilate : sequence of int
        Two values each; ``pad`` non-negative.
    flip : bool
        CONVOLUTION mode (the filter flipped spatially).
    epilogue : Epilogue, optional
        The per-channel bias (C values) and ReLU or H_SWISH.
    z : numpy.ndarray, optional
        An array of the output's shape added after the bias, before the activation.

    Returns
    -------
    Step
        The callable computing ``out``.
    """
    n, cbn, h, w, _ = src.shape
    oh, ow = out.shape[2:4]
    fh, fw = filt.shape[3:5]
    steps: list[Step] = []
    x = _readonly(_contiguous(src, steps))
    zf = _EMPTY if z is None else _readonly(_contiguous(z, steps))
    y = out if out.flags.c_contiguous and out.flags.writeable else workspace.empty(out.shape, _F32)
    constant = filter_is_constant()
    wbuf = (workspace.aligned if constant else workspace.empty)((cbn * fh * fw * loops.CB,), _F32)
    taps = filt[:, 0, 0, ::-1, ::-1] if flip else filt[:, 0, 0]
    pairs = cbn > 1 and vector_width() == 16
    pack_w = functools.partial(_pack_filter, wbuf, taps, pairs)
    bias, epi = epilogue_operands(epilogue, steps)
    if z is not None:
        epi |= 2
    t = threads() if split_work(n, cbn * loops.CB, h, w, oh, ow, fh, fw) >= MIN_SPLIT_WORK else 1
    blocks = n * (-(-cbn // 2) if pairs else cbn)  # the units' channel slots
    rows, bands, per = _units(blocks, oh, t)
    units = -(-blocks // per) * bands
    dims = np.array([n, cbn, h, w, oh, ow, fh, fw, rows, bands, per, pairs], np.int64)
    conv = np.array([*stride, *pad, *dilate], np.int64)
    yf, wr = y.reshape(-1), _readonly(wbuf)
    key = loops.kernel_key(fw, stride[1], dilate[1])
    zero = loops.zeros(h * w * loops.CB + loops.CB if pairs else loops.CB)

    def bind_part(counter: np.ndarray, me: int) -> Step:
        return loops.channelwise88(key, x, wr, yf, zf, bias, dims, conv, epi, counter, me,
                                   zero)  # fmt: skip

    steps.append(units_as_they_go(units, bind_part, t))
    if y is not out:
        steps.append(functools.partial(np.copyto, out, y))
    return filter_packed(pack_w, chain(steps), constant)

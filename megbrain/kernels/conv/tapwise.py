"""Forward convolution TAPWISE_SGEMM: a stride-1 2-d float32 convolution as one product per
filter tap and output row, in megbrain's GEMM (:mod:`..sgemm`), with no column matrix and no
product over the padding; and its filter gradient by the same taps.

The source is copied once into an ``(H, W, N, C)`` layout: the positions ``(j, n)`` of one
output row ``i`` are then, for the tap ``(a, b)``, consecutive rows of ``C`` channels starting
at ``((i + a - ph) W + j + b - pw) N C``, a matrix the GEMM's tiles read in place (a tap
reads only the positions inside the image, so the layout needs no zero frame). Each tap's
``(C, OC)`` filter matrix is packed once per run into the GEMM's panels
(:func:`sgemm.bind_pack`; a C-ordered filter first transposed to ``(C FH FW, OC)``, whose tap
rows pack by vector loads). Output row ``i`` is the sum over its taps of ``rows (j, n) @
W_tap``, each product over the positions whose source lies inside the image only (a tap
reading padding at the top row or the left column is skipped there), the first storing and
the next ones adding into an ``(OH, OW, N, OC)`` result, whose samples' ``(OH OW, OC)``
matrices are transposed into the ``(N, OC, OH, OW)`` output. On a 4x4 plane with padding 1
that is 100 of im2col's 144 tap-positions (69 %), on 8x8 84 %, on 16x16 92 %. The rows are
shared out to the kernel threads (:func:`parallel.take_in_turn`, the rows with most taps
first); every output sums its taps in a fixed order, whatever the threads. The relayouts
are :func:`.sgemm_loops.compiled_transpose`'s, 16 rows at a time by transposes in registers.

A stride-1 backward data with a "same" padding is this forward convolution of ``diff`` with
the transposed, flipped filter (:mod:`.bwd_data`'s AS_FORWARD_CONV).

The filter gradient (TAPWISE_SGEMM of the backward_filter kind, :func:`bind_tapwise_filter`)
is the same sum per tap: ``grad_tap (C, OC) = sum over the positions p inside the image of
x[p + tap] dy[p]^T``. ``diff`` is packed once, straight from its ``(N, OC, OH OW)`` planes,
into the GEMM's panels as the batch-inner ``(OH OW N, OC)`` matrix
(:func:`.sgemm_loops.compiled_pack_planes`); the source is transposed to ``(C, H W N)``
rows. Per tap and output row, the positions ``(j, n)`` whose source lies inside the image
are one run of the source's row (the left operand, read in place) and one run of the
packed rows (:func:`sgemm.bind_packed_product`'s ``first``); a tap over whole rows (the
middle column of a "same" padding) takes all its rows in one product, or, over many
positions, the products run output row by output row (:data:`FILTER_ROW_ORDER_POSITIONS`).
Each tap's products add into its ``(C, OC)`` matrix in a fixed order (the first stores),
the threads on disjoint panels of output channels (or rows of input channels, where there
are fewer panels than threads); with one panel of output channels, the products are cut in
:data:`FILTER_POSITION_PARTS` runs of positions, each summed into a matrix of its own and
the matrices added after, so the threads share even work. One transpose puts the
``(C FH FW, OC)`` result into the ``(OC, C, FH, FW)`` gradient. Against
IM2COL_GEMM_BLOCKED: no column matrix (nine copies of the source) and no products over the
padding.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from .. import parallel, sgemm, sgemm_loops, tiled_jit, workspace
from ..steps import Step, chain
from .common import _KIND_NAMES, _geometry
from .loops import tapwise as loops
from .registry import ConvAlgorithm, register

__all__ = ["ENABLED", "FILTER_MAX_POSITIONS", "FILTER_POSITION_PARTS", "MAX_POSITIONS",
           "MIN_CHANNELS", "MIN_ROW_POSITIONS", "bind_tapwise", "bind_tapwise_filter",
           "tapwise_filter_preferred", "tapwise_preferred", "usable_tapwise",
           "usable_tapwise_filter"]  # fmt: skip

_F32 = np.dtype(np.float32)
#: whether the algorithm is usable at all (off: every convolution binds as before it, to
#: compare the two)
ENABLED = True
_partial = functools.partial
#: HEURISTIC takes TAPWISE_SGEMM for output planes of at most this many positions...
MAX_POSITIONS = 256
#: ... and at least this many input and output channels (the products' reduction and
#: their panels' columns)...
MIN_CHANNELS = 64
#: ... and at least this many positions in an output row's product (``N OW``, its rows:
#: a batch-1 7x7 plane gives 7, not two whole 6-row tiles)
MIN_ROW_POSITIONS = 48


#: HEURISTIC takes the filter gradient's TAPWISE_SGEMM for output planes of at most this
#: many positions (with :data:`MIN_CHANNELS` and :data:`MIN_ROW_POSITIONS`): ResNet-18's
#: batch-32 layers, one thread, CPU ms against IM2COL_GEMM_BLOCKED (and PyTorch's
#: convolution_backward, load 10): 64 at 32x32 24.6 / 27.4 (27.1), 128 at 16x16 22.4 /
#: 25.6 (23.7), 256 at 8x8 19.9 / 26.4 (22.4), 512 at 4x4 17.1 / 26.3 (29.4)
FILTER_MAX_POSITIONS = 1024
#: the filter gradient runs its products output row by output row (each row's taps while
#: its source and ``diff`` rows are in the caches) over more than this many positions
#: in the batch, tap by tap over fewer (CPU ms bound for two threads, tap / row order: 64 at 32x32
#: 26.5 / 26.0, 128 at 16x16 23.1 / 22.8, 512 at 4x4 17.6 / 18.9)
FILTER_ROW_ORDER_POSITIONS = 4096
#: the filter gradient of one panel of output channels (at most ``16 TILE[1]``) sums its
#: positions in this many runs, each into a result of its own, added after: the runs share out
#: to the threads evenly, where its few tiles of input channels did not (64 channels: 6 and
#: 5 tiles of 6 rows). 2 threads, ms, one run against two: ResNet-18's 32x64x32x32 14.2 ->
#: 12.5, 8x64x56x56 12.1 -> 10.3; one thread 26.2 -> 25.0, 20.5 -> 20.5
FILTER_POSITION_PARTS = 2


def usable_tapwise(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """Whether TAPWISE_SGEMM computes this convolution: 2-d, one group, stride and dilation
    1, float32 operands of non-negative strides, and a compiler targeting AVX-512 (the
    GEMM's 16-lane tiles)."""
    return _usable("forward", src, filt, out, stride, pad, dilate)


def _checked(kind, a, b, out, stride, pad, dilate):
    """The geometry of a ``kind`` convolution TAPWISE_SGEMM computes, else ValueError."""
    if not _usable(kind, a, b, out, stride, pad, dilate):
        raise ValueError(f"{_KIND_NAMES[kind]}: TAPWISE_SGEMM needs a 2-d, one-group, "
                         f"stride-1, undilated float32 convolution on AVX-512; got operands "
                         f"{a.shape} {a.dtype}, {b.shape} {b.dtype}, {out.shape} {out.dtype}, "
                         f"stride {stride}, dilate {dilate}")  # fmt: skip
    return _geometry(kind, a, b, out, stride, pad, dilate)


def _usable(kind, src, filt, out, stride, pad, dilate) -> bool:
    geo = _geometry(kind, src, filt, out, stride, pad, dilate)
    if not ENABLED or geo.nsp != 2 or geo.g != 1 or any(s != 1 for s in geo.stride) or any(
            d != 1 for d in geo.dilate) or geo.n == 0 or geo.l == 0:  # fmt: skip
        return False
    if not src.dtype == filt.dtype == out.dtype == _F32 or not out.flags.writeable:
        return False
    if any(s < 0 for a in (src, filt, out) for s in a.strides):
        return False
    return tiled_jit.vector_width() == 16


def tapwise_preferred(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """The heuristic: small planes (:data:`MAX_POSITIONS`) of many channels
    (:data:`MIN_CHANNELS`) in a batch (:data:`MIN_ROW_POSITIONS`), where im2col's products
    spend the most on the padding."""
    return _preferred(_geometry("forward", src, filt, out, stride, pad, dilate), MAX_POSITIONS)


def _preferred(geo, max_positions: int) -> bool:
    return geo.l <= max_positions and min(geo.icg, geo.ocg) >= MIN_CHANNELS and \
        geo.n * geo.oshape[-1] >= MIN_ROW_POSITIONS


def _taps(geo) -> list[list[tuple[int, int, int, int]]]:
    """Per output row, its taps ``(a, b, j0, j1)``: the filter offset and the output columns
    ``[j0, j1)`` whose source lies inside the image; a tap over every column first."""
    (fh, fw), (ph, pw), (h, w), (oh, ow) = geo.fshape, geo.pad, geo.sshape, geo.oshape
    rows = []
    for i in range(oh):
        taps = []
        for a in range(fh):
            if not 0 <= i + a - ph < h:
                continue
            for b in range(fw):
                j0, j1 = max(0, pw - b), min(ow, pw + w - b)
                if j0 < j1:
                    taps.append((a, b, j0, j1))
        taps.sort(key=lambda tp: (tp[2], -tp[3]) != (0, ow))  # stable: one full tap first
        rows.append(taps)
    return rows


def bind_tapwise(src, filt, out, stride, pad, dilate, flip=False) -> Callable[[], None]:
    """Forward TAPWISE_SGEMM (the module's docstring); operands as
    :func:`megbrain.kernels.conv.binds.bind_convolution`'s."""
    geo = _checked("forward", src, filt, out, stride, pad, dilate)
    n, c, oc = geo.n, geo.icg, geo.ocg
    (fh, fw), (ph, pw), (h, w), (oh, ow) = geo.fshape, geo.pad, geo.sshape, geo.oshape
    f4 = filt.reshape(filt.shape[-4:]) if filt.ndim == 5 else filt  # (OC, C, FH, FW)
    nt = max(1, min(parallel.num_threads(), oh))
    steps: list[Step] = []
    tr = sgemm_loops.compiled_transpose()

    # the source as (H, W, N, C) (the taps read no padding): per sample, its (C, H W) planes
    # transposed
    hw = h * w
    xr = workspace.empty((h, w, n, c), _F32)
    xf = _flat_source(src, steps)
    steps.append(parallel.split(lambda lo, hi: tr(xf, 0, hw, c, hw, xr.reshape(-1), 0, n * c,
                                                  lo, hi, c * hw, c), n, 1))  # fmt: skip

    # each tap's (C, OC) filter matrix in the GEMM's panels: a C-ordered (P, Q, FH, FW)
    # filter (the forward's, or the data gradient's before its transpose) first transposed
    # to (Q FH FW, P), whose taps then pack by vector loads or transposes in registers, where
    # the filter's own strides take gathers
    size, taps_n = sgemm.packed_size(c, oc), fh * fw
    panels = workspace.empty((taps_n * size,), _F32)
    swapped = f4.swapaxes(0, 1)
    base = f4 if f4.flags.c_contiguous else swapped if swapped.flags.c_contiguous else None
    if base is not None:
        p_, q_ = base.shape[:2]
        ft = workspace.empty((q_ * taps_n, p_), _F32)
        ff, fo, qt = _readonly(base.reshape(-1)), ft.reshape(-1), q_ * taps_n
        steps.append(parallel.split(lambda lo, hi: tr(ff, lo * qt, qt, hi - lo, qt, fo, lo, p_,
                                                      0, 1, 0, 0), p_, 16))  # fmt: skip
        fq = ft.reshape(q_, fh, fw, p_)  # fq[q, a, b, p] = base[p, q, a, b]
        fmat = fq if base is f4 else fq.transpose(3, 1, 2, 0)  # (C, FH, FW, OC)
    else:
        fmat = f4.transpose(1, 2, 3, 0)
    packs = []
    for a in range(fh):
        for b in range(fw):
            fa, fb = (fh - 1 - a, fw - 1 - b) if flip else (a, b)
            t = a * fw + b
            packs.append(sgemm.bind_pack(fmat[:, fa, fb], panels[t * size : (t + 1) * size]))
    groups = parallel.ranges(len(packs), nt)
    steps.append(parallel.concurrently([chain(packs[lo:hi]) for lo, hi in groups]))

    # per output row, its taps' products into (OH, OW N, OC)
    res = workspace.empty((oh, ow, n, oc), _F32)
    rm = res.reshape(oh, ow * n, oc)
    xm = xr.reshape(h, w * n, c)
    taps = _taps(geo)
    order = sorted(range(oh), key=lambda i: -len(taps[i]))

    def row(i: int, ap: np.ndarray) -> Step:
        work: list[Step] = []
        if not taps[i] or taps[i][0][2:] != (0, ow):
            work.append(_partial(np.copyto, rm[i], 0))
        for k, (a, b, j0, j1) in enumerate(taps[i]):
            t = a * fw + b
            rows = xm[i + a - ph, (j0 + b - pw) * n : (j1 + b - pw) * n]
            work.append(sgemm.bind_packed_product(
                rows, panels[t * size : (t + 1) * size], oc, rm[i, j0 * n : j1 * n],
                bool(k) or bool(work), ap))  # fmt: skip
        return chain(work) if work else _nothing

    buffers = [workspace.empty((sgemm.product_buffer_size(ow * n, c),), _F32)
               for _ in range(nt)]  # fmt: skip
    steps.append(parallel.take_in_turn([[row(i, ap) for i in order] for ap in buffers]))
    # (OH OW, OC) of each sample transposed into its (OC, OH OW) planes
    ohw = oh * ow
    rf = _readonly(res.reshape(-1))
    if out.flags.c_contiguous:
        of = out.reshape(-1)
        steps.append(parallel.split(lambda lo, hi: tr(rf, 0, n * oc, ohw, oc, of, 0, ohw, lo,
                                                      hi, oc, oc * ohw), n, 1))  # fmt: skip
    else:
        steps.append(parallel.split(_partial(loops.result_rows, res, out), n, 1))
    return chain(steps)


def usable_tapwise_filter(src, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """Whether :func:`bind_tapwise_filter` computes this filter gradient: as
    :func:`usable_tapwise` (``grad`` the written operand)."""
    return _usable("backward_filter", src, diff, grad, stride, pad, dilate)


def tapwise_filter_preferred(src, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """The heuristic: output planes of at most :data:`FILTER_MAX_POSITIONS` positions, else
    as :func:`tapwise_preferred`."""
    return _preferred(_geometry("backward_filter", src, diff, grad, stride, pad, dilate),
                      FILTER_MAX_POSITIONS)


def bind_tapwise_filter(src, diff, grad, stride, pad, dilate, flip=False) -> Callable[[], None]:
    """Backward filter TAPWISE_SGEMM (the module's docstring); operands as
    :func:`megbrain.kernels.conv.binds.bind_conv_backward_filter`'s."""
    geo = _checked("backward_filter", src, diff, grad, stride, pad, dilate)
    n, c, oc = geo.n, geo.icg, geo.ocg
    (fh, fw), (h, w), (oh, ow) = geo.fshape, geo.sshape, geo.oshape
    nt = parallel.num_threads()
    steps: list[Step] = []

    # the source as (C, H W N) rows, their stride off multiples of 4 KB (sgemm packs those):
    # per channel, the (N, H W) plane transposed
    hw, hwn = h * w, h * w * n
    ld = hwn + (16 if hwn % 1024 == 0 else 0)
    xt = workspace.empty((c, ld), _F32)
    xf = _flat_source(src, steps)
    tr = sgemm_loops.compiled_transpose()
    steps.append(parallel.split(lambda lo, hi: tr(xf, 0, c * hw, n, hw, xt.reshape(-1), 0, n, lo,
                                                  hi, hw, ld), c, 1))  # fmt: skip

    # diff as a (OH OW N, OC) matrix in the GEMM's panels, straight from its (N, OC, OH OW)
    # planes, the samples split over the threads
    pos = oh * ow * n
    nr = sgemm.packed_size(1, 1)
    panels = workspace.empty((sgemm.packed_size(pos, oc),), _F32)
    df = _flat_source(diff, steps)
    pk = sgemm_loops.compiled_pack_planes(sgemm.TILE[1])
    steps.append(parallel.split(_partial(pk, df, n, oc, oh * ow, panels), n, 1))

    # per tap, its products into res[:, t] (C, OC) (the flipped tap with ``flip``). Output
    # channels of one panel: the products split in FILTER_POSITION_PARTS runs of positions,
    # each into a result of its own, added after (the split does not depend on the threads,
    # so neither do the bits); then whole panels of output channels to each thread, or rows
    # of input channels where the panels are fewer
    taps = fh * fw
    npan = -(-oc // nr)
    plan = _filter_products(geo, oh * ow * n > FILTER_ROW_ORDER_POSITIONS)
    runs = _position_runs(plan, FILTER_POSITION_PARTS if npan == 1 else 1)
    res = workspace.empty((len(runs), c, taps, oc), _F32)
    per = max(1, nt // len(runs))
    if npan >= per:
        parts = [(slice(None), slice(lo * nr, min(oc, hi * nr)))
                 for lo, hi in parallel.ranges(npan, per)]  # fmt: skip
    else:
        r = sgemm.TILE[0]
        parts = [(slice(lo * r, min(c, hi * r)), slice(None))
                 for lo, hi in parallel.ranges(-(-c // r), per)]  # fmt: skip
    longest = max((k for *_, k in plan), default=1)
    calls = []
    for h, run in enumerate(runs):
        for rows, cols in parts:
            ap = workspace.empty((sgemm.product_buffer_size(len(range(c)[rows]), longest),),
                                 _F32)  # fmt: skip
            outs = [res[h, rows, taps - 1 - t if flip else t, cols] for t in range(taps)]
            work: list[Step] = []
            started = set()
            for t, s0, k0, k in run:
                work.append(sgemm.bind_packed_product(
                    xt[rows, s0 : s0 + k], panels[(cols.start or 0) * pos :], outs[t].shape[1],
                    outs[t], t in started, ap, rows=pos, first=k0))  # fmt: skip
                started.add(t)
            work += [_partial(np.copyto, outs[t], 0) for t in range(taps) if t not in started]
            calls.append(chain(work))
    steps.append(parallel.concurrently(calls))
    for h in range(1, len(runs)):
        steps.append(_partial(np.add, res[0], res[h], out=res[0]))
    res = res[0]

    # (C T, OC) transposed into the (OC, C FH FW) gradient
    direct = grad.flags.c_contiguous and grad.flags.writeable
    g2 = grad.reshape(-1) if direct else workspace.empty((oc * c * taps,), _F32)
    rf = _readonly(res.reshape(-1))
    ct = c * taps
    steps.append(parallel.split(lambda lo, hi: tr(rf, lo * oc, oc, hi - lo, oc, g2, lo, ct, 0, 1,
                                                  0, 0), ct, 16))  # fmt: skip
    if not direct:
        steps.append(_partial(np.copyto, grad, g2.reshape(grad.shape)))
    return chain(steps)


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


def _flat_source(a: np.ndarray, steps: list[Step]) -> np.ndarray:
    """``a`` as a flat read-only C-ordered view, through a workspace copy (a step appended
    to ``steps``) where it is not C-contiguous."""
    if not a.flags.c_contiguous:
        buf = workspace.empty(a.shape, _F32)
        steps.append(_partial(np.copyto, buf, a))
        a = buf
    return _readonly(a.reshape(-1))


def _filter_products(geo, by_rows: bool) -> list[tuple[int, int, int, int]]:
    """The filter gradient's products ``(t, s0, k0, k)`` in their order: for tap ``t``, ``k``
    positions from item ``s0`` of a source row of :func:`bind_tapwise_filter`'s ``(C, H W
    N)`` copy and from row ``k0`` of the packed ``diff``. Tap by tap (a tap over whole rows
    in one product), or ``by_rows``: output row by output row, each row's taps (its source
    and ``diff`` rows stay in the caches across them)."""
    n = geo.n
    (fh, fw), (ph, pw), (h, w), (oh, ow) = geo.fshape, geo.pad, geo.sshape, geo.oshape
    plan: list[tuple[int, int, int, int, int]] = []  # (row, t, s0, k0, k)
    for a in range(fh):
        inside = [i for i in range(oh) if 0 <= i + a - ph < h]
        for b in range(fw):
            t = a * fw + b
            j0, j1 = max(0, pw - b), min(ow, pw + w - b)
            if j0 >= j1 or not inside:
                continue
            if (j0, j1) == (0, ow) and ow == w and not by_rows:  # whole rows: one run
                i0 = inside[0]
                plan.append((i0, t, (i0 + a - ph) * w * n, i0 * ow * n, len(inside) * ow * n))
                continue
            for i in inside:
                s0 = ((i + a - ph) * w + j0 + b - pw) * n
                plan.append((i, t, s0, (i * ow + j0) * n, (j1 - j0) * n))
    if by_rows:
        plan.sort(key=lambda p: p[:2])
    return [p[1:] for p in plan]


def _position_runs(plan: list[tuple[int, int, int, int]], parts: int) -> list[list[tuple]]:
    """``plan`` (:func:`_filter_products`) cut into ``parts`` consecutive runs of whole products
    (as many as it has, if fewer), each cut where the positions before it come nearest an
    even share."""
    parts = min(parts, len(plan))
    before = np.cumsum([0] + [k for *_, k in plan])  # positions before each product
    cuts = [0]
    for q in range(1, parts):
        # a cut after the last one, leaving a product for each run still to come
        lo, hi = cuts[-1] + 1, len(plan) - (parts - q)
        target = before[-1] * q / parts
        cuts.append(min(range(lo, hi + 1), key=lambda b: abs(before[b] - target)))
    cuts.append(len(plan))
    return [plan[a:b] for a, b in zip(cuts, cuts[1:])]


def _nothing() -> None:
    pass


register(ConvAlgorithm(
    "TAPWISE_SGEMM", "forward", bind_tapwise, usable_tapwise, priority=21,
    heuristic=tapwise_preferred,
))  # fmt: skip
register(ConvAlgorithm(
    "TAPWISE_SGEMM", "backward_filter", bind_tapwise_filter, usable_tapwise_filter, priority=25,
    heuristic=tapwise_filter_preferred,
))  # fmt: skip

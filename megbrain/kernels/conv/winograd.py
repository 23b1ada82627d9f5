"""Winograd F(2x2, 3x3) convolution: 2-d, 3x3 filters, stride 1, no dilation, any padding
and group count; forward and backward data (the stride-1 backward data is the forward
convolution of ``diff`` with the transposed, flipped filter).

Each 2x2 block of outputs (a tile) is computed from the 4x4 input patch under it as
``A^T [U * V] A``, with ``U = G g G^T`` the transformed filter and ``V = B^T d B`` the
transformed patch: summed over the input channels, the 16 elementwise products become 16
GEMMs ``M[e] = U[e] (OC, IC) @ V[e] (IC, tiles)`` (per group), 2.25x fewer multiplications
than im2col + GEMM.

The work is cut into *bands* (a few tile rows of one sample, or a few whole samples; every
channel), each small enough (:data:`BAND_BYTES`) that its transformed input and products stay
in the core's cache between the three stages, and long enough (:data:`MIN_BAND_TILES`) for
the GEMMs: input transform (compiled, :mod:`.loops.winograd`), one batched
``np.matmul`` of the 16 (per group) GEMMs with the band's tiles as their long dimension, and
output transform straight into the output rows. The bands are split over :func:`threads`
threads, each a whole pipeline with its own buffers taking the next band until none is
left, BLAS running single-threaded on each (:func:`parallel.blas_single_threaded`):
OpenBLAS's own threads on these thin GEMMs scaled 1.4x on 2 cores, and spinning, they fought
the transform threads for the cores under load.

In float32, F(2x2, 3x3)'s error is 2-3x im2col + GEMM's (its GEMMs multiply transformed
values up to 4x the inputs, and each output sums 9 products), so it is usable only up to
:data:`MAX_CHANNELS` summed channels, where it stays within the float64 reference's
tolerance: a reduction wider than :data:`ONE_PRODUCT_CHANNELS` adds the products of
successive chunks of :data:`SUM_CHANNELS` channels, and the filter transform is computed in
float64. The larger F(4x4, 3x3) tiles are not used: with coefficients up to 8 and 1/24,
even float64 transforms left it outside the tolerance from 16 channels.

Every buffer rewritten on each run (transformed filter, each thread's transformed band and
products and scratch, the float32 copies of a float16/bfloat16 operand) comes from
:func:`workspace.empty`; nothing is allocated when the bound callable runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from .. import parallel, workspace
from ..steps import Step, chain
from .common import _Conv, bind_doc, checked, compute_dtype, threads
from .loops import winograd as winograd_loops
from .registry import ConvAlgorithm, register

__all__ = [
    "BAND_BYTES",
    "MIN_BAND_TILES",
    "bind_winograd_backward_data",
    "MAX_CHANNELS",
    "MIN_CHANNELS",
    "MIN_CHANNELS_BACKWARD_DATA",
    "MIN_PLANE_POSITIONS",
    "MIN_POSITIONS",
    "ONE_PRODUCT_CHANNELS",
    "SUM_CHANNELS",
    "plane_stride",
    "bind_winograd_forward",
    "preferred_winograd_backward_data",
    "preferred_winograd_forward",
    "threads",
    "usable_winograd_backward_data",
    "usable_winograd_forward",
]

#: the most bytes one band's transformed input and products take together (at least one tile
#: row): the three stages of a band then work in the core's cache (L2 is 512 KiB here, L3
#: 32 MiB; measured single-threaded, 0.5-2 MiB bands ran alike, 4 MiB ones up to 1.3x slower)
BAND_BYTES = 1 << 20
#: ... but at least this many tiles (the GEMMs' long dimension: thinner, they run slower and
#: re-read a large transformed filter from memory once per band)
MIN_BAND_TILES = 128
#: the most channels one output sums over (ICg forward, OCg backward data) for Winograd to be
#: usable: its float32 error grows with them faster than im2col + GEMM's (its GEMMs multiply
#: transformed values up to 4x the inputs and the outputs sum 9 products). Measured against
#: float64 with inputs and filters in [-1, 1], as the largest error over (atol 1e-5 + rtol
#: 1e-4 |ref|) of 0.5-2M outputs, two draws, Winograd / TAPWISE_SGEMM / IM2COL_GEMM: 64
#: channels (one product) 0.66-0.89 / 0.40-0.43 / 0.47-0.60; 128 channels in chunks (below)
#: on a par with the GEMMs; 256 channels in chunks of 32 1.12-1.20 / 0.86-1.00 / 0.68-0.98
MAX_CHANNELS = 128
#: the most channels one GEMM of a band sums in one product, as Winograd did up to 64
#: channels...
ONE_PRODUCT_CHANNELS = 64
#: ... and a wider reduction is cut into chunks of this many channels, each chunk's
#: products added once to the running sum. On 8x128x16x16 (262K outputs), six draws,
#: forward and backward data, the largest error over the tolerance: chunks of 16 0.53-0.70,
#: 32 0.62-0.87, 64 0.74-1.20, one product 1.14-1.66, against TAPWISE_SGEMM's 0.60-0.88
#: and IM2COL_GEMM's 0.56-0.77; 2 threads, ms, 32x128x16x16 forward: chunks of 16 9.9, 32
#: 8.8, 64 9.2 (TAPWISE_SGEMM 11.2)
SUM_CHANNELS = 32
#: HEURISTIC takes Winograd when both channel counts of a group are at least this (the GEMMs'
#: dims; below, their (OC, IC) @ (IC, tiles) products are too thin to pay for the transforms)
MIN_CHANNELS = 16
#: ... and, for backward data, at least this: its input transform (the costlier one) runs over
#: OCg channels and its output transform over ICg, so narrow diffs gain least; single-threaded
#: at 128x32x14x14 -> 16 channels (the CNN's second layer) Winograd took 10.2 ms, the compiled
#: GEMM + col2im 8.3
MIN_CHANNELS_BACKWARD_DATA = 32
#: ... and the output (backward data: the gradient) has at least this many positions in all
#: (N OH OW, 4 per tile): below, the GEMMs are too thin and the filter transform does not pay.
#: Measured single-threaded (thread time; load 6-8 on the 2 cores), ms, Winograd vs the best
#: im2col algorithm, forward / backward data: 8x64x56x56 24.1 vs 34.2 / 23.5 vs 22.7;
#: 1x64x56x56 3.1 vs 4.3 / 3.0 vs 4.2; 64x64x14x14 13.0 vs 21.2 / 12.8 vs 19.6; 128x16x14x14
#: to 32 5.9 vs 6.6; 2x64x28x28 2.9 vs 2.9 / 2.4 vs 3.0; 32x16x14x14 1.6 vs 1.7 / 1.7 vs 1.9
MIN_POSITIONS = 1024
#: ... and, forward, at least this many positions in an output plane: on smaller planes the
#: half-empty edge tiles and the filter transform cost more than the products save (2
#: threads, ms, Winograd / TAPWISE_SGEMM / IM2COL_GEMM: 32x128x12x12 6.1 / 6.9 / 9.0,
#: 16x64x12x12 1.13 / 1.11 / 1.41, 32x128x8x8 3.0 / 2.6 / -, 32x32x8x8 0.56 / 0.63 / 0.47,
#: 64x48x6x6 1.26 / 0.78 / 1.04; 32x128x16x16 9.4 / 11.2 / -, 32x96x14x14 4.4 / 6.3 / -)
MIN_PLANE_POSITIONS = 144


def _geometry_ok(nd: int, fshape, stride, dilate, dtype) -> bool:
    try:
        compute_dtype(dtype)
    except ValueError:
        return False
    return (
        nd == 4
        and tuple(fshape) == (3, 3)
        and tuple(stride) == (1, 1)
        and tuple(dilate) == (1, 1)
    )


def usable_winograd_forward(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """Whether :func:`bind_winograd_forward` accepts the convolution: 2-d, 3x3, stride 1,
    dilation 1, floating point, at most :data:`MAX_CHANNELS` input channels per group (any
    padding and group count)."""
    return (
        _geometry_ok(src.ndim, filt.shape[3:], stride, dilate, src.dtype)
        and all(p >= 0 for p in pad)
        and filt.shape[2] <= MAX_CHANNELS
    )


def usable_winograd_backward_data(filt, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """Whether :func:`bind_winograd_backward_data` accepts the gradient: 2-d, 3x3, stride 1,
    dilation 1, padding at most 2, floating point, at most :data:`MAX_CHANNELS` output
    channels per group (the channels a gradient value sums over)."""
    return (
        _geometry_ok(grad.ndim, filt.shape[3:], stride, dilate, diff.dtype)
        and all(0 <= p <= 2 for p in pad)
        and filt.shape[1] <= MAX_CHANNELS
    )


def _large_enough(filt, out, min_channels: int) -> bool:
    n, (oh, ow) = out.shape[0], out.shape[2:]
    return min(filt.shape[1], filt.shape[2]) >= min_channels and n * oh * ow >= MIN_POSITIONS


def preferred_winograd_forward(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """HEURISTIC's rule: usable, both ICg and OCg at least :data:`MIN_CHANNELS`, at least
    :data:`MIN_POSITIONS` output positions in all and :data:`MIN_PLANE_POSITIONS` in a
    plane."""
    return (
        usable_winograd_forward(src, filt, out, stride, pad, dilate, flip)
        and _large_enough(filt, out, MIN_CHANNELS)
        and out.shape[2] * out.shape[3] >= MIN_PLANE_POSITIONS
    )


def preferred_winograd_backward_data(filt, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """HEURISTIC's rule: usable, both ICg and OCg at least :data:`MIN_CHANNELS_BACKWARD_DATA`
    and at least :data:`MIN_POSITIONS` gradient positions in all."""
    return usable_winograd_backward_data(
        filt, diff, grad, stride, pad, dilate, flip
    ) and _large_enough(filt, grad, MIN_CHANNELS_BACKWARD_DATA)


@bind_doc("forward")
def bind_winograd_forward(src: np.ndarray, filt: np.ndarray, out: np.ndarray, stride: Sequence[int],
                          pad: Sequence[int], dilate: Sequence[int], flip: bool = False
                          ) -> Callable[[], None]:  # fmt: skip
    """Bind the grouped convolution ``out = conv(src, filt)`` as Winograd F(2x2, 3x3): 2-d,
    a 3x3 filter, stride and dilation 1 (:func:`usable_winograd_forward`); any strides."""
    needs = (f"a 2-d 3x3 filter, stride 1, dilation 1 and at most {MAX_CHANNELS} input "
             "channels per group")  # fmt: skip
    geo = checked("forward", "winograd F(2x2,3x3)", needs, usable_winograd_forward, src, filt,
                  out, stride, pad, dilate, flip)  # fmt: skip
    return _bind(geo, src, filt, out, flip, "Convolution")


@bind_doc("backward_data")
def bind_winograd_backward_data(
    filt: np.ndarray, diff: np.ndarray, grad: np.ndarray, stride: Sequence[int],
    pad: Sequence[int], dilate: Sequence[int], flip: bool = False,
) -> Callable[[], None]:  # fmt: skip
    """Bind the gradient of a convolution w.r.t. its input as Winograd F(2x2, 3x3): the
    forward convolution of ``diff``, padded by ``2 - pad``, with the transposed, flipped
    filter (:func:`usable_winograd_backward_data`: as the forward one, ``pad <= 2``)."""
    needs = (f"a 2-d 3x3 filter, stride 1, dilation 1, pad <= 2 and at most {MAX_CHANNELS} "
             "output channels per group")  # fmt: skip
    checked("backward_data", "winograd F(2x2,3x3)", needs, usable_winograd_backward_data, filt,
            diff, grad, stride, pad, dilate, flip)  # fmt: skip
    tpad = tuple(2 - p for p in pad)
    tfilt = filt.swapaxes(1, 2)
    geo = _Conv("ConvolutionBackwardData", diff.shape, tfilt.shape, grad.shape, stride, tpad,
                dilate)  # fmt: skip
    return _bind(geo, diff, tfilt, grad, not flip, "ConvolutionBackwardData")


def plane_stride(size: int, itemsize: int) -> int:
    """How far apart, in values, to put the 16 planes of ``size`` values (of ``itemsize``
    bytes) each of a transformed filter: ``size`` rounded up to whole 64-byte lines, then
    moved on by lines until the 16 planes begin in 16 different sets of the L1 cache.

    The filter transform writes one value to each of the 16 planes in turn; planes a multiple
    of 4 KiB apart share one set of the 8-way L1, and the 16 stores evicted each other: 64 x 64
    and 128 x 128 filters took 0.186 and 0.675 ms, and 0.028 and 0.107 ms with the planes
    one line further apart (one thread)."""
    line, page = 64, 4096
    step = line // itemsize
    st = -(-size // step) * step
    # k lines apart modulo a page's 64 sets: 16 planes take 16 sets where 8 does not divide k
    while (st * itemsize % page // line) % 8 == 0:
        st += step
    return st


def _bands(n: int, th: int, tw: int, per_tile: int, nt: int) -> list[list[tuple]]:
    """The bands, each a list of ``(sample, r0, r1, offset)`` parts (tile rows ``[r0, r1)`` of
    the sample, at tile ``offset`` of the band): a run of tile rows of one sample, or whole
    samples when a band of :data:`BAND_BYTES` (or of :data:`MIN_BAND_TILES` tiles, whichever
    is more) holds more than one. Of the band sizes within that bound, the one putting the
    fewest tile rows on the busiest of ``nt`` threads, the largest on ties."""
    most = max(MIN_BAND_TILES, BAND_BYTES // max(1, per_tile))
    best = (0, 0, 0)
    for size in range(max(1, min(n * th, most // tw)), 0, -1):  # tile rows per band
        if size > th and size % th:
            continue
        items = n * -(-th // size) if size <= th else -(-n // (size // th))
        path = -(-items // nt) * size
        if not best[0] or path < best[0]:
            best = (path, size, items)
    size = best[1]
    if size <= th:
        return [[(k, r0, min(th, r0 + size), 0)] for k in range(n) for r0 in range(0, th, size)]
    per = size // th
    return [
        [(k, 0, th, (k - k0) * th * tw) for k in range(k0, min(n, k0 + per))]
        for k0 in range(0, n, per)
    ]


def _bind(geo: _Conv, src, filt, out, flip: bool, name: str) -> Callable[[], None]:
    dt = compute_dtype(src.dtype)
    steps: list[Step] = []
    post: list[Step] = []
    x = src
    if src.dtype != dt:
        x = workspace.empty(src.shape, dt)
        steps.append(functools.partial(np.copyto, x, src, "unsafe"))
    if filt.dtype != dt:
        f32 = workspace.empty(filt.shape, dt)
        steps.append(functools.partial(np.copyto, f32, filt, "unsafe"))
        filt = f32
    y = out
    if out.dtype != dt or not out.flags.c_contiguous:
        y = workspace.empty(out.shape, dt)
        post.append(functools.partial(np.copyto, out, y, "unsafe"))
    if geo.n == 0:
        return chain([])
    g, ocg, icg = geo.g, geo.ocg, geo.icg
    c, oc = geo.c, g * ocg
    (ph, pw), (oh, ow) = geo.pad, geo.oshape
    th, tw = (oh + 1) // 2, (ow + 1) // 2
    # a reduction wider than ONE_PRODUCT_CHANNELS: the products of its chunks, the later
    # ones into a second buffer of products added to the first
    width = icg if icg <= ONE_PRODUCT_CHANNELS else SUM_CHANNELS
    chunks = [(lo, min(icg, lo + width)) for lo in range(0, icg, width)]
    held = oc * (2 if len(chunks) > 1 else 1)  # products held per tile
    nt = threads() if parallel.can_single_thread_blas() else 1
    bands = _bands(geo.n, th, tw, 16 * (c + held) * dt.itemsize, nt)
    nt = min(nt, len(bands))
    most = max(sum(r1 - r0 for _, r0, r1, _ in band) for band in bands)  # tile rows
    ffilter, finput, foutput = winograd_loops.compiled()
    planes = workspace.empty((16, plane_stride(g * ocg * icg, dt.itemsize)), dt)
    u = planes[:, : g * ocg * icg].reshape(16, g, ocg, icg)  # a view: splits each plane's row

    # the backward data's transposed filter is read through its contiguous original
    swap = not filt.flags.c_contiguous and filt.swapaxes(1, 2).flags.c_contiguous
    if swap:
        filt = filt.swapaxes(1, 2)

    def filter_part(lo: int, hi: int, f=filt, u=u, flip=bool(flip), swap=swap) -> None:
        ffilter(f, u, flip, swap, lo, hi)

    steps.append(parallel.split(filter_part, g * ocg, max(1, 2048 // (icg + 1))))
    # the threads take the bands in turn from one counter (reset each run): a thread the
    # scheduler holds back delays one band, not a fixed share of them
    rows = max(r1 - r0 for band in bands for _, r0, r1, _ in band)
    table = []
    for _ in range(nt):
        v = workspace.empty((16 * c * most * tw,), dt)
        m = workspace.empty((16 * oc * most * tw,), dt)
        part = workspace.empty((16 * oc * most * tw,), dt) if len(chunks) > 1 else None
        s = workspace.empty((2 * (tw + 1) + 8 * (rows + 1) * tw,), dt)
        z = workspace.empty((4 * rows * tw,), dt)
        work = []
        for band in bands:
            ld = sum(r1 - r0 for _, r0, r1, _ in band) * tw
            v4 = v[: 16 * c * ld].reshape(16, g, icg, ld)
            m4 = m[: 16 * oc * ld].reshape(16, g, ocg, ld)
            p4 = None if part is None else part[: 16 * oc * ld].reshape(16, g, ocg, ld)
            factors = [(u[..., lo:hi], v4[:, :, lo:hi]) for lo, hi in chunks]
            work.append((tuple(band), factors, m4, p4))
        table.append(
            [_band_step(x, y, u, v, m, s, z, ph, pw, tw, item, finput, foutput) for item in work]
        )
    steps.append(parallel.take_in_turn(table))
    return chain(steps + post)


def _band_step(x, y, u, v, m, s, z, ph, pw, tw, item, finput, foutput) -> Step:
    """One band on one thread's buffers: transform it in, multiply, transform it back."""
    band, factors, m4, p4 = item
    ld = m4.shape[-1]
    (u0, v0), rest = factors[0], factors[1:]

    def step() -> None:
        for k, r0, r1, off in band:
            finput(x, v, s, k, ph, pw, tw, r0, r1, ld, off)
        np.matmul(u0, v0, out=m4)
        for uk, vk in rest:  # the later chunks' products, added once each
            np.matmul(uk, vk, out=p4)
            np.add(m4, p4, out=m4)
        for k, r0, r1, off in band:
            foutput(m, y, z, k, tw, r0, r1, ld, off)

    return step


# forward, ahead of TAPWISE_SGEMM (21), whose small planes of many channels it shares from
# MIN_PLANE_POSITIONS on
register(ConvAlgorithm(
    "WINOGRAD_F23", "forward", bind_winograd_forward, usable_winograd_forward,
    priority=22, heuristic=preferred_winograd_forward,
))  # fmt: skip
register(ConvAlgorithm(
    "WINOGRAD_F23", "backward_data", bind_winograd_backward_data,
    usable_winograd_backward_data, priority=20, heuristic=preferred_winograd_backward_data,
))  # fmt: skip

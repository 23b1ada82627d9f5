"""Quantized 2-d convolution and ConvBias kernels (NCHW, dense, grouped and depthwise) with
MegDNN's semantics: 8-bit products accumulated exactly in int32 by a compiled im2col and
integer GEMM of dot products (:mod:`.loops.int8`), the bias added in int32, then the naive
kernels' float32 chain (``handle_z_inp_and_activation``): with a ``z``, the int32 sum and
``z`` dequantized and added, the activation applied and the result quantized; without one,
the quantized activation (dequantize, activation, quantize) or a requantize to the output.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from .. import elemwise as ew
from .. import elemwise_multi_type as emt
from .. import parallel, workspace
from ..steps import Step, chain
from .common import conv_out_size
from .constant_operands import constant_filter, filter_is_constant
from .loops import depthwise_bytes as dw_bytes
from .loops import int8 as int8_loops
from .loops import vnni as vnni_loops
from .loops import vnni_channels, vnni_gemv
from .nchw8c import filter_packed, units_as_they_go

__all__ = [
    "bind_quantized_conv_bias",
    "bind_quantized_convolution",
    "bind_quantized_matmul",
    "QUANTIZED_SOURCES",
]

_partial = functools.partial
_F32 = np.dtype(np.float32)
_I16, _I32 = np.dtype(np.int16), np.dtype(np.int32)

#: the quantized source/filter dtypes the kernels take (MegDNN's 8-bit ConvBias dispatch)
QUANTIZED_SOURCES = ("QuantizedS8", "Quantized8Asymm")

#: multiply-adds worth one thread of the GEMM
_MIN_MACS_PER_THREAD = 1 << 17
#: bytes of relaid source worth one thread
_MIN_RELAYOUT_BYTES = 1 << 16
#: bytes of a matrix-vector product's weights worth one thread: the classifiers' 0.5-2 MB ran
#: 5-50% slower split in two than in one thread (7-46 us), on the loaded 2-core machine
_MIN_GEMV_BYTES = 1 << 21
#: the most rows of the source a quantized matrix product takes the matrix-vector loop
#: for (:func:`.loops.vnni_gemv.gemv`: a row per pass over the weights), more the tiles
GEMV_ROWS = 4
#: positions (of the phase planes' rows) worth a band of its own
_MIN_BAND_POSITIONS = 512
#: units (bands, or chunks of output channels) per thread of a layer, at most: a thread
#: held back leaves the other the units it has not begun
_UNITS_PER_THREAD = 2
#: units per thread of a 3x3 depthwise layer on the byte loop (bands of output rows, then
#: chunks of planes), taken as they go
_DW_UNITS_PER_THREAD = 4
#: scales the output-row widths up to which a depthwise convolution takes the loop with its
#: channels along the vectors (:func:`.loops.int8.depthwise_channels`): 8 at stride 1, 16 at
#: larger strides; a test sets it to 0 or a large value to run either loop on any shape
CHANNELS_ROW_SCALE = 1
#: whether requantized depthwise convolutions bound from now on take the masked-vector form
#: of the positions loop (:func:`.loops.int8.depthwise_masked_rows`); chosen once, from the
#: CPU's features, and set off by a test to run the portable loops
MASKED_VECTORS = int8_loops.masked_vectors()
#: the widest output rows that take it (a test sets it large to run it on any shape)
MASKED_ROW_MAX = 16
#: whether 3x3 depthwise convolutions bound from now on take the byte loop of ``vpermb`` and
#: ``vpdpbusd`` (:func:`.loops.depthwise_bytes.depthwise_vnni`); chosen once, from the CPU's
#: features, and set off by a test to run the other loops
DEPTHWISE_BYTES = dw_bytes.vnni_bytes()
#: whether convolutions bound from now on take the AVX-512 VNNI kernels
#: (:mod:`.loops.vnni`) where their operands allow; chosen once, from the CPU's features
VNNI = vnni_loops.available()
#: whether the VNNI kernels bound from now on run a layer as one hand-off to the pool, its
#: threads taking bands of output rows (or chunks of output channels where the planes are
#: small) as they go, each relaying a band's source rows itself (:func:`.loops.vnni.bands`),
#: rather than as a split per phase (the relayout, the tiles, the dropped columns); a test
#: and the benchmarks set it off
VNNI_BANDS = True
#: whether the VNNI bands bound from now on take the tiles with output channels along the
#: vectors (:mod:`.loops.vnni_channels`) where those compute fewer products; a test sets it
#: off to run the tiles of positions on any shape
CHANNEL_TILES = True
#: the fraction of the position tiles' products the channel tiles must compute at most to
#: be taken
CHANNEL_TILE_GAIN = 0.95
#: the cost of a channel tile's output byte stored to an NCHW plane (one at a time), in
#: ``vpdpbusd`` lanes of one k group: 64 -> 384 1x1 at 14x14 (16 k groups) ran 1.6x slower
#: on them, 960 -> 320 at 7x7 (240) 1.2x faster
CHANNEL_STORE_SUMS = 16
#: the fewest k groups at which an NCHW4 layer the position tiles would split in chunks of
#: channels takes the channel tiles at as many products (2 threads: 192 -> 32 1x1 at 28x28,
#: 48 k groups, 1.19x faster on them; 32 -> 192, 8 k groups, 0.85x)
CHANNEL_TIE_GROUPS = 16


def _plain(a: np.ndarray) -> np.ndarray:
    """``a`` viewed with its storage dtype (no quantization metadata)."""
    return a.view(np.dtype(a.dtype.str))


def _zero_point(a: np.ndarray) -> int:
    qp = ew.quant_params(a.dtype)
    if qp is None or qp.name not in QUANTIZED_SOURCES:
        raise ValueError(
            f"quantized convolution needs {' or '.join(QUANTIZED_SOURCES)} operands, got "
            f"{qp.name if qp else a.dtype.name}"
        )
    return int(qp.zero_point)


def bind_quantized_convolution(src: np.ndarray, filt: np.ndarray, out: np.ndarray,
                               stride: Sequence[int], pad: Sequence[int],
                               dilate: Sequence[int], flip: bool = False) -> Step:  # fmt: skip
    """Bind ``out = conv(src, filt)`` exactly in int32.

    Parameters
    ----------
    src : numpy.ndarray
        (N, G*I, H, W), QuantizedS8 or Quantized8Asymm (its zero point subtracted).
    filt : numpy.ndarray
        (G, O, I, FH, FW), of the source's kind (its zero point subtracted).
    out : numpy.ndarray
        (N, G*O, OH, OW) with 32-bit integer storage (QuantizedS32 or int32): the raw sums.
    stride, pad, dilate : sequence of int
        Per spatial dim.
    flip : bool
        Convolution (the filter flipped) rather than cross-correlation.

    Returns
    -------
    Step
        A zero-argument callable computing the sums into ``out``.
    """
    zx, zf = _zero_point(src), _zero_point(filt)
    n_, c_ = src.shape[:2]
    g_, o_, i_, fh, fw = filt.shape
    oh, ow = (conv_out_size(*a) for a in zip(src.shape[2:], (fh, fw), stride, pad, dilate))
    if c_ != g_ * i_ or out.shape != (n_, g_ * o_, oh, ow) or out.dtype.itemsize != 4:
        raise ValueError(
            f"quantized convolution: shapes src {src.shape}, filter {filt.shape}, out "
            f"{out.shape} ({out.dtype}) do not agree"
        )
    fast = _fast_kernel(src, filt, stride, pad, dilate)
    if fast is not None:
        direct = out.flags.c_contiguous and out.dtype.kind == "i"
        y = _plain(out) if direct else workspace.empty(out.shape, _I32)
        step = fast(src, filt, None, y, stride, pad, dilate, flip, None)
        return step if direct else chain([step, _partial(np.copyto, _plain(out), y, "unsafe")])
    k_, p_ = i_ * fh * fw, oh * ow
    # int8 operands stay int8 (their products and sums widen in the GEMM); zero-point
    # shifted 8-bit values span up to [-255, 255] and take int16
    narrow = zx == 0 and zf == 0 and src.dtype.kind == "i" and filt.dtype.kind == "i"
    lane = np.dtype(np.int8) if narrow else _I16
    steps: list[Step] = []
    wk = workspace.empty((g_, o_, k_), lane)
    fv = _plain(filt)[..., ::-1, ::-1] if flip else _plain(filt)
    steps.append(_partial(np.copyto, wk.reshape(fv.shape), fv, "unsafe"))
    if zf:
        steps.append(_partial(np.subtract, wk, np.int16(zf), wk))
    col = workspace.empty((g_, p_, k_), lane)
    direct = out.flags.c_contiguous and out.dtype.kind == "i"
    y = _plain(out) if direct else workspace.empty(out.shape, _I32)
    y3 = y.reshape(n_, g_ * o_, p_)
    x = _plain(src)
    geo = ((fh, fw), tuple(stride), tuple(pad), tuple(dilate))
    blocks = int8_loops.gemm_blocks(g_, o_)
    blocks_min = max(1, _MIN_MACS_PER_THREAD // max(1, k_ * p_ * min(o_, 4)))
    for n in range(n_):
        im2col = _partial(_im2col_part, x, col, n, geo, ow, zx)
        steps.append(parallel.split(im2col, g_, 1))
        steps.append(parallel.split(_partial(_gemm_part, col, wk, y3, n), blocks, blocks_min))
    if not direct:
        steps.append(_partial(np.copyto, _plain(out), y, "unsafe"))
    return chain(steps)


def _fast_kernel(src, filt, stride, pad, dilate):
    """:func:`_bind_depthwise` or :func:`_bind_vnni` where either takes the convolution,
    else None (the portable im2col and GEMM)."""
    if _is_depthwise(src, filt, stride, pad, dilate):
        return _bind_depthwise
    return _bind_vnni if _vnni_usable(src, filt) else None


def _is_depthwise(src, filt, stride, pad, dilate) -> bool:
    """Whether :func:`_bind_depthwise` computes the convolution: a depthwise one (one
    channel in and out per group), its sums exact in float32 (``FH FW 255^2 < 2^24``), a
    band of one output row fitting its buffers."""
    g_, o_, i_, fh, fw = filt.shape
    if not (g_ > 1 and o_ == i_ == 1 and fh * fw * 255 * 255 < 1 << 24):
        return False
    ow = conv_out_size(src.shape[3], fw, stride[1], pad[1], dilate[1])
    return int8_loops.depthwise_band_rows(src.shape[3], ow, fh, stride[0], dilate[0], pad[1]) > 0


def _bind_depthwise(src, filt, bias, y, stride, pad, dilate, flip, requant) -> Step:
    """Bind the direct depthwise loop (:func:`.loops.int8.depthwise`), the arguments as for
    :func:`_bind_vnni`."""
    n_, c_ = src.shape[:2]
    fh, fw = filt.shape[3:]
    fv = _plain(filt)[:, 0, 0]  # (a view: a reshape of a strided filter would copy it now)
    if flip:
        fv = fv[:, ::-1, ::-1]
    steps: list[Step] = []
    x = _plain(src)
    if not x.flags.c_contiguous:
        x = workspace.empty(x.shape, x.dtype)
        steps.append(_partial(np.copyto, x, _plain(src)))
    b = np.zeros(c_, _I32) if bias is None else bias
    if DEPTHWISE_BYTES and _signed_filter(filt) and dw_bytes.depthwise_vnni_takes(
            fh, fw, stride[1], dilate[1], dilate[0]):  # fmt: skip
        zx = _zero_point(src)
        u0 = zx + 128 if src.dtype.kind == "i" else zx
        return chain([*steps, _bind_depthwise_bytes(x, fv, b, y, stride, pad, dilate, requant,
                                                    zx, _zero_point(filt), u0)])  # fmt: skip
    w = workspace.empty((c_, fh, fw), fv.dtype)
    steps.insert(0, _partial(np.copyto, w, fv))
    h_, w_ = src.shape[2:]
    oh, ow = y.shape[2:]
    lanes = int8_loops.CHANNEL_LANES
    # a requantized 3x3 filter at stride 1 or 2 with rows of 9 to 16 columns, where the CPU
    # has byte masks: the positions loop in masked vectors (shorter rows: the channel loop;
    # longer ones fill the plain loop's vectors)
    rows = 0
    if MASKED_VECTORS and requant is not None and 8 * CHANNELS_ROW_SCALE < ow <= MASKED_ROW_MAX:
        rows = int8_loops.depthwise_masked_rows(w_, ow, fh, fw, *stride, *dilate, pad[1])
    masked = rows > 0
    by_channels = False
    if not masked:
        rows = int8_loops.depthwise_channel_rows(w_, ow, fh, fw, *stride, *dilate, oh)
        # short output rows: 16 channels along the vectors (a row of positions fills few)
        by_channels = rows > 0 and ow <= (16 if stride[1] > 1 else 8) * CHANNELS_ROW_SCALE
    if not (masked or by_channels):
        rows = int8_loops.depthwise_band_rows(w_, ow, fh, stride[0], dilate[0], pad[1])
    geom = np.array([*stride, *pad, *dilate, _zero_point(src), _zero_point(filt), rows, h_, w_,
                     oh, ow, fh, fw, c_, int(masked)], np.int64)  # fmt: skip
    if requant is None:
        epi, q, yv = 0, np.zeros(5, _F32), y
    else:
        (epi, q), yv = requant, _plain(y)
    loop, items, per = int8_loops.depthwise, n_ * c_, 1
    if by_channels:
        loop, items, per = int8_loops.depthwise_channels, n_ * -(-c_ // lanes), lanes
    part = loop(x.reshape(-1), w.reshape(-1), b, yv.reshape(-1), q, geom, epi)
    macs = fh * fw * y.shape[2] * y.shape[3] * per
    steps.append(parallel.split(part, items, max(1, _MIN_MACS_PER_THREAD // max(1, macs))))
    return chain(steps)


def _bind_depthwise_bytes(x, w, bias, y, stride, pad, dilate, requant, zx, zf, u0) -> Step:
    """Bind the 3x3 depthwise byte loop (:func:`.loops.depthwise_bytes.depthwise_vnni`) on the plain
    source ``x`` and filter ``w`` (C, 3, 3), any strides, as :func:`_bind_depthwise` prepared
    them, ``zx`` and ``zf`` their zero points, ``u0`` the source's shifted to unsigned."""
    n_, c_, h_, w_ = x.shape
    oh, ow = y.shape[2:]
    # the filter's words, made on every run unless it is constant (then once, into memory
    # that outlives the run); the bias is added in the loop
    constant = filter_is_constant()
    keep = workspace.aligned if constant else workspace.empty
    wt, init = keep((3 * c_,), _I32), keep((c_,), _I32)
    pack = _partial(dw_bytes.depthwise_vnni_operands, w, zf, u0, wt, init)
    plan = dw_bytes.depthwise_vnni_plan(stride[0], dilate[0], ow)
    paired = dw_bytes.depthwise_vnni_paired(plan)
    idx = dw_bytes.depthwise_vnni_index(stride[1], dilate[1], ow if paired else 0)
    geom = np.array([*stride, *pad, *dilate, zx, zf, plan, h_, w_, oh, ow, 3, 3, c_, 0],
                    np.int64)  # fmt: skip
    if requant is None:
        epi, q, yv = 0, np.zeros(7, _F32), y
    else:
        epi, q, yv = requant[0], vnni_loops.requant_params(requant[1]), _plain(y)
    loop = _partial(dw_bytes.depthwise_vnni_loop(epi, plan), x.reshape(-1), wt, init, bias,
                    yv.reshape(-1), q, idx, geom)  # fmt: skip
    # the threads the layer's multiply-adds are worth, each taking units (bands of output
    # rows, then chunks of planes) as it goes: a thread held back delays only its unit
    planes = n_ * c_
    threads = len(parallel.ranges(planes, parallel.num_threads(),
                                  max(1, _MIN_MACS_PER_THREAD // (9 * oh * ow))))  # fmt: skip
    units = dw_bytes.depthwise_vnni_units(oh, planes, plan, threads, _DW_UNITS_PER_THREAD)
    if threads == 1:
        run = _partial(loop, units, np.zeros(2, np.int64), -1)
    else:
        count = dw_bytes.depthwise_vnni_count(units, oh)
        run = units_as_they_go(count, lambda counter, me: _partial(loop, units, counter, me),
                               threads)  # fmt: skip
    return filter_packed(pack, run, constant)


def _signed_filter(filt: np.ndarray) -> bool:
    """Whether the filter minus its zero point is a signed byte (QuantizedS8 without a zero
    point, Quantized8Asymm with zero point 128): ``vpdpbusd``'s signed operand."""
    zf = _zero_point(filt)
    return (filt.dtype.kind == "i" and zf == 0) or (filt.dtype.kind == "u" and zf == 128)


def _vnni_usable(src: np.ndarray, filt: np.ndarray) -> bool:
    """Whether :func:`_bind_vnni` takes the convolution: VNNI on, the filter minus its zero
    point a signed byte (QuantizedS8, or Quantized8Asymm with zero point 128), and output
    channels enough per group to fill a tile's rows (a depthwise convolution is no GEMM)."""
    if not VNNI:
        return False
    g_, o_ = filt.shape[:2]
    return _signed_filter(filt) and src.dtype.itemsize == 1 and (g_ == 1 or o_ >= 4)


def _bind_vnni(src, filt, bias, y, stride, pad, dilate, flip, requant,
               blocked: bool = False) -> Step:  # fmt: skip
    """Bind the VNNI kernels (:mod:`.loops.vnni`, or on small planes the channel tiles of
    :mod:`.loops.vnni_channels`: :func:`_channel_tile`) writing ``y`` (N, G*O, OH, OW),
    C-contiguous: the int32 sums (plus ``bias``, (G*O,) int32, when given), or, with
    ``requant`` = (epi, float32 [input scale, output scale, zero point, qmin, qmax]), those
    requantized into the 8-bit ``y``. With ``blocked`` (bands only, requantized), ``src``
    and ``y`` are NCHW4, ``filt``'s input channels the source's padded ones."""
    zx, zf = _zero_point(src), _zero_point(filt)
    n_ = src.shape[0]
    h_, w_ = src.shape[2:4]
    g_, o_, i_, fh, fw = filt.shape
    oh, ow = (conv_out_size(*a) for a in zip(src.shape[2:4], (fh, fw), stride, pad, dilate))
    signed = src.dtype.kind == "i"
    u0 = zx + 128 if signed else zx
    cg_ = -(-i_ // 4)
    kg_ = cg_ * fh * fw
    lanes = vnni_loops.LANES
    # the padded source split into the stride's phase planes, every tap then read in place
    # (no im2col): a tap (a, b) is phase (a DH % SH, b DW % SW), shifted by (a DH // SH,
    # b DW // SW) in it; only the phases some tap reads are relaid
    (sh, sw), (dh, dw) = stride, dilate
    hp, wp = h_ + 2 * pad[0], w_ + 2 * pad[1]
    hph, wph = -(-hp // sh), -(-wp // sw)
    kept_r = sorted({a * dh % sh for a in range(fh)})
    kept_c = sorted({b * dw % sw for b in range(fw)})
    pg = oh * wph  # the positions computed: whole rows of the phase planes
    shift = max(a * dh // sh for a in range(fh))  # the taps' reach down the phase planes
    rb, nchunk = oh, 1  # one band of every output row, the channels in one chunk
    if VNNI_BANDS:
        parts = max(1, min(parallel.num_threads(), pg * kg_ * 4 * o_ // _MIN_MACS_PER_THREAD))
        nb = min(oh, _UNITS_PER_THREAD * parts, pg // _MIN_BAND_POSITIONS)
        if parts > 1 and nb >= parts:
            rb = -(-oh // nb)  # bands of output rows, each one's source rows relaid with it
        elif parts > 1:  # few positions: chunks of the output channels, each thread
            nchunk = _UNITS_PER_THREAD * parts  # relaying the whole source once
    rows, vecs = vnni_loops.tile_shape(o_, rb * wph)
    ctile = None
    if VNNI_BANDS and (not blocked or o_ % 4 == 0 or n_ * g_ == 1):
        ctile = _channel_tile(o_, oh, ow, wph, rb, rows, kg_, blocked, nchunk > 1)
    if ctile is not None:
        rows = vnni_loops.LANES * ctile[1]  # (the packed filter's rows: whole vectors)
        if parts > 1:
            rb, nchunk = _channel_units(oh, -(-o_ // rows), parts)
    nb = -(-oh // rb)
    hph_b = min(hph, rb + shift)  # a band's phase-plane rows
    pplane = hph_b * wph
    pb = rb * wph  # a band's positions
    # blocks of whole vectors: a 1x1 stride-1 layer's loads stay 64-byte aligned
    plane = -(-len(kept_r) * len(kept_c) * pplane // lanes) * lanes
    op = -(-o_ // rows) * rows
    tiles = -(-pb // (lanes * vecs))
    nchunk = min(nchunk, op // rows)
    # too few tiles of positions for the threads: split the output channels too
    chunks = min(op // rows, -(-2 * parallel.num_threads() // tiles))
    items = tiles * chunks
    constant = filter_is_constant()
    # a constant filter's packed copy must outlive the run: private memory, not workspace
    keep = workspace.aligned if constant else workspace.empty
    wk = keep((g_ * op * kg_ * 4,), np.int8)
    init_w = keep((g_ * op,), _I32)
    pack = _partial(vnni_loops.pack_filter, _plain(filt), wk, init_w, flip, zf, u0, kg_, op,
                    0 if ctile is None else vnni_loops.LANES)  # fmt: skip
    steps: list[Step] = []
    init = init_w
    if bias is not None:
        init = workspace.empty((g_ * op,), _I32)
        view = init.reshape(g_, op)[:, :o_]
        steps.append(_partial(np.add, init_w.reshape(g_, op)[:, :o_],
                              bias.reshape(g_, o_), view))  # fmt: skip
    # each k group's byte offset; the last tile's dropped lanes read past the planes
    cg, a, b = np.meshgrid(np.arange(cg_), np.arange(fh), np.arange(fw), indexing="ij")
    slot = np.searchsorted(kept_r, a * dh % sh) * len(kept_c) + np.searchsorted(kept_c,
                                                                                b * dw % sw)
    words = cg * plane + slot * pplane + a * dh // sh * wph + b * dw // sw
    offs = (words * 4).reshape(-1)
    last = int(words[0].max()) + tiles * vecs * lanes
    if ctile is not None:  # a row's last tile reads all its positions
        last = int(words[0].max()) + pb + ctile[0]
    tail = max(0, last - plane) * 4
    if requant is None:
        epi, q = vnni_loops.EPI_INT32, np.zeros(7, _F32)
        yf = y.reshape(-1)
    else:
        epi, q = requant[0], vnni_loops.requant_params(requant[1])
        yf = y.reshape(-1).view(np.uint8)
    x = _plain(src).view(np.uint8)
    if not x.flags.c_contiguous:
        steps.insert(0, _partial(np.copyto, x := workspace.empty(x.shape, np.uint8),
                                 _plain(src).view(np.uint8)))  # fmt: skip
    x = x.reshape(-1)
    hw = np.array([h_, w_], np.int64)
    geo = np.array([*pad, sh, sw, hph_b, wph, len(kept_r), len(kept_c), plane, *kept_r,
                    *kept_c], np.int64)  # fmt: skip
    drop = (wph != ow or blocked) and ctile is None
    yt = workspace.empty((n_ * g_ * o_ * pg,), yf.dtype) if drop else yf
    flipx = 128 if signed else 0
    x4_bytes = -(-(cg_ * plane * 4 + tail) // 64) * 64  # (each band buffer 64-byte aligned)
    tmp_words = cg_ * h_ * w_ if sw == 2 and not blocked else 1
    if VNNI_BANDS:
        units = nb * nchunk
        nt = min(parts, units)
        x4s = workspace.empty((nt, x4_bytes), np.uint8)
        x4ws = x4s[:, : cg_ * plane * 4].view(np.uint32)
        tmps = workspace.empty((nt, tmp_words), np.uint32)
        if ctile is not None:
            # the output written in place: NCHW planes, or NCHW4 words of 4 planes
            step_, cdiv = (4, 4) if blocked else (1, 1)
            for n in range(n_):
                for g in range(g_):
                    geom = np.array([rb, oh, wph, nchunk, o_, kg_, cg_,
                                     (n * g_ + g) * o_ // cdiv * oh * ow * step_,
                                     oh * ow * step_, g * op * kg_ * 4, g * op, ow, step_, cdiv,
                                     *offs], np.int64)  # fmt: skip
                    kernel = vnni_channels.bands_kernel(*ctile, epi, blocked)
                    args = (x, x4ws, tmps, (n * g_ + g) * i_ * h_ * w_, hw, i_, geo, flipx, u0,
                            x4s, wk, init, yf, q, geom)  # fmt: skip
                    steps.append(units_as_they_go(units, _partial(_band_part, kernel, args),
                                                  nt))  # fmt: skip
            return filter_packed(pack, chain(steps), constant)
        for n in range(n_):
            for g in range(g_):
                geom = np.array([rb, oh, wph, nchunk, o_, kg_, cg_, (n * g_ + g) * o_ * pg, pg,
                                 g * op * kg_ * 4, g * op, yf.itemsize, ow, *offs],
                                np.int64)  # fmt: skip
                kernel = vnni_loops.bands_kernel(rows, vecs, epi, drop, blocked)
                args = (x, x4ws, tmps, (n * g_ + g) * i_ * h_ * w_, hw, i_, geo, flipx, u0, x4s,
                        wk, init, yt, q, geom, yt.view(np.uint8), yf.view(np.uint8))  # fmt: skip
                steps.append(units_as_they_go(units, _partial(_band_part, kernel, args), nt))
        return filter_packed(pack, chain(steps), constant)
    x4 = workspace.empty((x4_bytes,), np.uint8)
    x4w = x4[: cg_ * plane * 4].view(np.uint32)
    rows_tmp = workspace.empty((tmp_words,), np.uint32)
    relayout_min = max(1, _MIN_RELAYOUT_BYTES // (plane * 4))
    gemm_min = max(1, _MIN_MACS_PER_THREAD // (lanes * vecs * kg_ * 4 * op // chunks))
    for n in range(n_):
        for g in range(g_):
            steps.append(parallel.split(
                _partial(vnni_loops.relayout, x, x4w, rows_tmp, (n * g_ + g) * i_ * h_ * w_,
                         hw, i_, geo, flipx, u0), cg_, relayout_min))  # fmt: skip
            geom = np.array([pg, o_, kg_, chunks, (n * g_ + g) * o_ * pg, g * op * kg_ * 4,
                             g * op, *offs], np.int64)  # fmt: skip
            steps.append(parallel.split(_partial(vnni_loops.gemm_tiles, rows, vecs, x4, wk, init,
                                                 yt, q, geom, epi), items, gemm_min))  # fmt: skip
    if drop:
        isz = yf.itemsize  # rows of bytes
        cut = _partial(vnni_loops.drop_columns, yt.view(np.uint8), yf.view(np.uint8), oh,
                       wph * isz, ow * isz)  # fmt: skip
        planes = n_ * g_ * o_
        steps.append(parallel.split(cut, planes, max(1, _MIN_RELAYOUT_BYTES // (oh * wph))))
    return filter_packed(pack, chain(steps), constant)


def bind_vnni_blocked(src, filt, bias, z, out, stride, pad, dilate, flip, mode) -> Step | None:
    """The NCHW4 ConvBias on the VNNI bands reading the blocked source's words and writing
    the blocked output (:func:`.nchw4.bind_nchw4_conv_bias`'s operands, ``filt`` its
    (G, OCg, ICg, FH, FW) copy): a QuantizedS8 source, a per-channel bias, no ``z``, an
    IDENTITY or RELU requantize to a QuantizedS8 output; None where they do not take it."""
    out_q, bias_q = ew.quant_params(out.dtype), ew.quant_params(bias.dtype)
    if not (VNNI and VNNI_BANDS and z is None and mode in ("IDENTITY", "RELU")
            and out_q is not None and out_q.name == "QuantizedS8"
            and ew.quant_params(src.dtype).name == "QuantizedS8" and _vnni_usable(src, filt)
            and bias.ndim == 5 and bias.shape[2:4] == (1, 1) and not bias_q.zero_point
            and bias.flags.c_contiguous and out.flags.c_contiguous):  # fmt: skip
        return None
    b = _plain(bias).reshape(-1)
    q = np.array([bias_q.scale, out_q.scale, out_q.zero_point, out_q.qmin, out_q.qmax], _F32)
    epi = vnni_loops.EPI_QUANT_RELU if mode == "RELU" else vnni_loops.EPI_QUANT
    return _bind_vnni(src, filt, b, out, stride, pad, dilate, flip, (epi, q), blocked=True)


def _channel_tile(o_: int, oh: int, ow: int, wph: int, rb: int, rows: int, kg: int,
                  blocked: bool, chunked: bool = False) -> tuple[int, int] | None:  # fmt: skip
    """The shape (positions, vectors) of :mod:`.loops.vnni_channels`' tiles where they
    compute fewer products than :mod:`.loops.vnni`'s tiles of ``rows`` output channels
    would, by :data:`CHANNEL_TILE_GAIN`, on a layer of ``o_`` output channels, ``oh x
    ow`` outputs, phase-plane rows of ``wph``, bands of ``rb`` output rows and ``kg`` k
    groups; else None. An NCHW output (not ``blocked``) takes them only where the sums
    saved outweigh their stores, a byte a channel (:data:`CHANNEL_STORE_SUMS`). An NCHW4
    one takes them at no fewer products too where the position tiles would split the
    layer in chunks of channels (``chunked``: each thread relaying the whole source; the
    channel tiles split it in bands) and the reduction is long enough for their stores
    (:data:`CHANNEL_TIE_GROUPS`)."""
    if not CHANNEL_TILES:
        return None
    lanes = vnni_loops.LANES
    bands = [min(oh, r + rb) - r for r in range(0, oh, rb)]
    by_positions = -(-o_ // rows) * rows * sum(-(-n * wph // lanes) * lanes for n in bands)
    runs = [n * ow for n in bands] if wph == ow else [ow] * oh
    tile = vnni_channels.tile_shape(o_, runs)
    by_channels = vnni_channels.padded_products(o_, runs, tile)
    tie = blocked and chunked and kg >= CHANNEL_TIE_GROUPS
    if by_channels > (1.0 if tie else CHANNEL_TILE_GAIN) * by_positions:
        return None
    if not blocked and (by_positions - by_channels) * kg < CHANNEL_STORE_SUMS * o_ * oh * ow:
        return None
    return tile


def _channel_units(oh: int, ctiles: int, parts: int) -> tuple[int, int]:
    """The bands' output rows and the chunks of output channels of a layer on ``ctiles``
    channel tiles split for ``parts`` threads: a chunk a tile, up to twice as many chunks
    as units (each thread then relays the source once and takes whole tiles), and bands
    of rows where there are fewer tiles than units (a channel tile needs no band of many
    positions)."""
    units = _UNITS_PER_THREAD * parts
    nchunk = min(ctiles, 2 * units)
    nb = min(oh, -(-units // nchunk))
    return -(-oh // nb), nchunk


def _band_part(kernel, args: tuple, counter: np.ndarray, me: int) -> Step:
    """Thread ``me``'s part of a bands ``kernel`` (:func:`.loops.vnni.bands_kernel`,
    :func:`.loops.vnni_channels.bands_kernel`) on ``args`` (its buffers the ``me``-th rows
    of those given for every thread)."""
    x, x4w, tmp, xoff, hw, ci, geo, flip, u0, x4, *rest = args
    return _partial(kernel, x, x4w[me], tmp[me], int(xoff), hw, int(ci), geo, np.uint8(flip),
                    int(u0), x4[me], *rest, counter, int(me))  # fmt: skip


def bind_quantized_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Step | None:
    """``out = a @ b`` of 8-bit quantized matrices as a 1x1 convolution on the VNNI tiles
    (``a`` the filter, ``b``'s rows the channels of one row of positions; for a constant
    ``b`` (bound inside :func:`.constant_operands.constant_filter`: a classifier's weight)
    or one whose transpose is C-contiguous, ``out.T = b.T @ a.T`` with ``b.T`` the filter,
    packed once when constant), exact in int32; with at most :data:`GEMV_ROWS` rows of
    activations there (a classifier at batch 1), the matrix-vector product of
    :mod:`.loops.vnni_gemv` instead of the tiles; None where those do not take it (then the
    caller's integer product).

    Parameters
    ----------
    a, b : numpy.ndarray
        (M, K) and (K, N), of one 8-bit quantized kind; ``b`` C-contiguous, or ``a.T`` and
        ``b.T`` (or a constant ``b``) C-contiguous.
    out : numpy.ndarray
        (M, N), 32-bit integer storage, C-contiguous (or its transpose, with ``b.T``).

    Returns
    -------
    Step or None
    """
    if not (a.ndim == b.ndim == 2 and out.dtype.kind == "i" and out.dtype.itemsize == 4
            and a.dtype.itemsize == b.dtype.itemsize == 1):
        return None  # fmt: skip
    # b is the constant operand MatrixMul declares; the filter is packed once only if it is b
    b_constant = filter_is_constant()
    plain = b.flags.c_contiguous and out.flags.c_contiguous
    # out.T = b.T @ a.T, b.T the filter: a classifier's weight (packed once, where as the
    # source it would be relaid every run) or a strided b (gathered every run as the source,
    # slower than the integer product)
    swapped = (a.T.flags.c_contiguous and out.T.flags.c_contiguous
               and (b.T.flags.c_contiguous or b_constant))  # fmt: skip
    if swapped and (not plain or (b_constant and a.shape[0] <= b.shape[1])):
        a, b, out = b.T, a.T, out.T
    elif plain:
        swapped = False
    else:
        return None
    src, filt = b[None, :, None, :], a[None, :, :, None, None]
    if _zero_point_or_none(src) is None or _zero_point_or_none(filt) is None:
        return None
    if not _vnni_usable(src, filt):
        return None
    if (0 < b.shape[1] <= GEMV_ROWS and a.shape[0] and b.T.flags.c_contiguous
            and out.T.flags.c_contiguous):  # fmt: skip
        return _bind_gemv(b.T, a, out.T, swapped and b_constant)
    y = _plain(out)[None, :, None, :]
    with constant_filter(swapped and b_constant):
        return _bind_vnni(src, filt, None, y, (1, 1), (0, 0), (1, 1), False, None)


def _bind_gemv(x: np.ndarray, filt: np.ndarray, y: np.ndarray, constant: bool) -> Step:
    """``y = x @ filt.T`` (``x`` (M, K), ``filt`` (N, K) any strides, ``y`` (M, N) int32,
    both C-contiguous) by :func:`.loops.vnni_gemv.gemv`, its ``M`` rows a few: each
    weight byte read once a row, split over the threads by blocks of output rows."""
    (m_, k_), n_ = x.shape, filt.shape[0]
    zx, zf = _zero_point(x), _zero_point(filt)
    signed = x.dtype.kind == "i"
    u0 = zx + 128 if signed else zx
    kg, nblk = -(-k_ // 4), -(-n_ // vnni_gemv.LANES)
    keep = workspace.aligned if constant else workspace.empty
    w = keep((nblk * kg * 4 * vnni_gemv.LANES,), np.int8)
    init = keep((nblk * vnni_gemv.LANES,), _I32)
    pack = _partial(vnni_gemv.pack_rows, _plain(filt), zf, u0, w, init)
    geom = np.array([k_, n_, k_, n_, 128 if signed else 0], np.int64)
    groups = -(-nblk // vnni_gemv.BLOCKS)
    part = _partial(vnni_gemv.gemv_loop(), _plain(x).view(np.uint8).reshape(-1), w, init,
                    _plain(y).reshape(-1), geom)  # fmt: skip
    # a thread's share of the weights worth its hand-off
    per_item = kg * 4 * vnni_gemv.LANES * vnni_gemv.BLOCKS
    run = parallel.split(part, m_ * groups, max(1, _MIN_GEMV_BYTES // max(1, per_item)))
    return filter_packed(pack, run, constant)


def _zero_point_or_none(a: np.ndarray) -> int | None:
    try:
        return _zero_point(a)
    except ValueError:
        return None


def _im2col_part(x, col, n, geo, ow, zx, g0, g1):
    int8_loops.int8_im2col(x, col, n, *geo, ow, zx, g0, g1)


def _gemm_part(col, wk, y3, n, t0, t1):
    int8_loops.int8_gemm(col, wk, y3, n, t0, t1)


def bind_quantized_conv_bias(src: np.ndarray, filt: np.ndarray, bias: np.ndarray,
                             z: np.ndarray | None, out: np.ndarray, stride: Sequence[int],
                             pad: Sequence[int], dilate: Sequence[int], flip: bool,
                             mode: str) -> Step:  # fmt: skip
    """Bind MegDNN's quantized ConvBias ``out = act(conv(src, filt) + bias [+ z])``.

    Parameters
    ----------
    src, filt : numpy.ndarray
        As for :func:`bind_quantized_convolution`.
    bias : numpy.ndarray
        QuantizedS32, (1, G*O, 1, 1) or the output's shape; added in int32.
    z : numpy.ndarray or None
        Of the output's shape and quantized kind.
    out : numpy.ndarray
        QuantizedS32 (the int32 sums are written there and read with its scale) or an 8-bit
        quantized dtype (the sums are read with the bias's scale).
    stride, pad, dilate, flip
        As for :func:`bind_quantized_convolution`.
    mode : str
        IDENTITY, RELU or H_SWISH; SIGMOID only with a ``z`` (MegDNN applies it to float
        values only).

    Returns
    -------
    Step
        A zero-argument callable computing ``out``.
    """
    out_q = ew.quant_params(out.dtype)
    if out_q is None:
        raise ValueError(f"quantized ConvBias: the output must be quantized, got {out.dtype}")
    sfb_is_out = out_q.name == "QuantizedS32"
    fused = _bind_fused(src, filt, bias, z, out, stride, pad, dilate, flip, mode)
    if fused is not None:
        return fused
    sfb = out if sfb_is_out else workspace.empty(out.shape, _I32).view(bias.dtype)
    steps = [bind_quantized_convolution(src, filt, sfb, stride, pad, dilate, flip)]
    acc = _plain(sfb)
    steps.append(_partial(np.add, acc, _plain(bias), acc))  # int32, wrapping as C's does
    sfb_q = ew.quant_params(sfb.dtype)
    if z is not None:
        res, zf = np.empty(out.shape, _F32), np.empty(z.shape, _F32)
        steps += ew.dequantize_steps(sfb, res, sfb_q)
        steps += ew.dequantize_steps(z, zf, ew.quant_params(z.dtype))
        steps.append(_partial(np.add, res, zf, res))
        if mode != "IDENTITY":
            act = np.empty(out.shape, _F32)
            steps.append(ew.bind(mode, [res], act))
            res = act
        steps += ew.quantize_steps(res, out, out_q)
    elif mode != "IDENTITY":
        if mode == "SIGMOID":
            raise ValueError("quantized ConvBias: SIGMOID needs a z (float intermediate)")
        steps.append(emt.bind_quantized(mode, [sfb], out))
    elif not sfb_is_out:
        steps.append(ew.typecvt_bind(sfb, out))
    return chain(steps)


def _bind_fused(src, filt, bias, z, out, stride, pad, dilate, flip, mode) -> Step | None:
    """ConvBias in one pass of the VNNI kernels where they take it: the per-channel bias
    added to the sums, and the result written as QuantizedS32 (IDENTITY) or requantized to
    the 8-bit output (IDENTITY or RELU) as the naive chain does; else None."""
    out_q, bias_q = ew.quant_params(out.dtype), ew.quant_params(bias.dtype)
    channel_bias = bias.shape == (1, out.shape[1], 1, 1) and not bias_q.zero_point
    bind = _fast_kernel(src, filt, stride, pad, dilate)
    if not (z is None and channel_bias and out.flags.c_contiguous and bind is not None):
        return None
    b = _plain(bias).reshape(-1)
    if out_q.name == "QuantizedS32":
        if mode != "IDENTITY" or out.dtype.kind != "i":
            return None
        return bind(src, filt, b, _plain(out), stride, pad, dilate, flip, None)
    if mode not in ("IDENTITY", "RELU"):
        return None
    q = np.array([bias_q.scale, out_q.scale, out_q.zero_point, out_q.qmin, out_q.qmax], _F32)
    epi = vnni_loops.EPI_QUANT_RELU if mode == "RELU" else vnni_loops.EPI_QUANT
    return bind(src, filt, b, out, stride, pad, dilate, flip, (epi, q))

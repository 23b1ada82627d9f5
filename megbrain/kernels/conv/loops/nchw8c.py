"""Compiled (Numba) loops of the direct NCHW8c convolution (:mod:`..nchw8c`): the input
and filter packing and the register-tiled convolution of a range of work units.

Layouts (float32, flat C-contiguous buffers):

- packed input: per sample and block of 8 input channels, ``SH x SW`` *phase planes* of
  ``HQ x WQ`` positions of 8 values (the channels innermost), then, after a sample's last
  block, :data:`SLACK` positions. Phase plane ``(rho, phi)`` holds source value
  ``x[SH r + rho - ROW_OFF, SW c + phi - COL_OFF]`` at ``(r, c)`` (zero outside the
  source), so that output position ``(i, j)``, plane position ``q = i WQ + j``, reads its
  filter tap ``(a, b)`` at ``q + taps[a FW + b] + SHIFT``, a fixed offset: one tile of
  :data:`P` consecutive positions needs no bounds tests, and positions with ``j >= OW`` are
  computed and dropped. With stride 1 there is one phase whose rows are ``GAP = WQ - W``
  zeros then a source row (a tap left or right of the source lands in a gap; ``COL_OFF =
  GAP``, ``SHIFT = GAP - PL``); with stride ``s`` the phases make each tap a stride-1 read
  (``COL_OFF = PL``, ``SHIFT = 0``);
- packed filter: ``(G, OCg / 16, ICg / 8, FH, FW, 8, 16)``, the 16 output channels of a
  block innermost (two vectors);
- a unit: sample, group, block of 16 output channels and a band of output rows. Its tiles'
  accumulators go to a per-thread row buffer (position-major) and from there to the NCHW
  output rows, square blocks of a vector's width transposed in registers
  (:func:`megbrain.kernels.tiled_jit.transpose_store`; the network's first layer 1.11 ->
  1.03 ms in ResNet50 against a scalar loop), a row's last columns one value at a time.

The NCHW88 (channel-blocked) operators use the same tiles
(:func:`conv_units_blocked`): their source, ``(N, C/8, H, W, 8)``, is copied into the
phase planes row by row (:func:`pack_blocked_input`), or read in place by a pointwise
convolution with stride 1 and no padding (its plane is the source's ``H x W`` positions);
each tile writes its ``P`` positions by 16 channels (32 for wide units,
:func:`megbrain.kernels.conv.nchw88.wide_units`) straight into two (four) blocks of the
``(N, OC/8, OH, OW, 8)`` output, adding the bias and the residual ``z`` and applying the
ReLU on the way. A tile that would read past a plane's end starts ``P`` positions before
it instead and writes only the positions not written yet.

Each tile is ``P`` positions (:func:`tile_positions`) by 16 output channels, computed by
:func:`megbrain.kernels.tiled_jit.fma_tile`: per input channel and tap, the filter's 16
values in one AVX-512 vector (two AVX2 ones), a broadcast of the input per position and one
fused multiply-add per vector, the accumulators in registers. Every sum runs over input
channel blocks, filter rows, filter columns and the 8 channels of a block in that order:
the result does not depend on the thread split (reproducible).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import carray as _carray
from numba import types as t

from ... import jit_codegen, tiled_jit
from ...tiled_jit import tile_positions
from .pointwise88 import silu8

# Numba's cache keys this file's kernels on its time stamp alone: a change to the
# activations of .pointwise88 they inline goes with an edit here (this line)
__all__ = [
    "OB",
    "CB",
    "ROW_TILES",
    "SLACK",
    "blocked_packing",
    "conv_units",
    "conv_units_blocked",
    "pack_blocked_input",
    "pack_filter",
    "pack_input",
    "readonly_view",
    "tail_scalars",
    "tile_positions",
]

#: output channels of a tile (one AVX-512 vector, or two AVX2 vectors)
OB = 16
#: output channels of a wide tile (two blocks of 16, :func:`..nchw8c.wide_units`)
WIDE = 2 * OB
#: input channels of a packed block
CB = 8
#: positions after the last plane, read by the last tiles of a sample (dropped outputs; at
#: least a tile's positions)
SLACK = 64
#: the output positions of a tile (:func:`tile_positions`, by the target's vector width) and
#: the tile's size, bound by _compiled() first, as the tiled_jit intrinsics
P = _TILE = _WIDE_TILE = None
#: the positions of the row tiles of wide units (:func:`conv_units_blocked`): a row of a
#: 7x7, 13x13 or 14x14 output in one tile, no column of the plane rows' gap computed (tiles
#: of P = 12 computed 60 positions for a 7x7 plane's 49, 192 for 13x13's 169, 216 for 196)
ROW_TILES = (7, 13, 14)
#: the vector width, the side of the blocks the NCHW write-back transposes
_LANES = None
stack_tile = fetch_add = fma_tile = transpose_store = add_rows = None


def _unit_py(u, nblk, ocb_n, per, extra, g_, rows, oh_n, wq, ow_n, bands_first):
    # pragma: no cover - compiled
    # work unit u as (sample, group, first block of 16 output channels, output rows [h0, h1),
    # packed positions [q0, q1)): units of ``per`` channel blocks and bands of ``rows`` rows,
    # the bands varying fastest (bands_first) or the channel blocks; ``extra`` 1 adds units
    # of the block after the ocb_n blocks of 16 (8 channels: block index ocb_n). With per 2
    # and ocb_n odd, the last unit of blocks of 16 has one (block ocb_n - 1)
    ocu_n = (ocb_n + per - 1) // per + extra
    if bands_first:
        blk, ocu = u % nblk, u // nblk % ocu_n
    else:
        ocu, blk = u % ocu_n, u // ocu_n % nblk
    rest = u // (nblk * ocu_n)
    h0 = blk * rows
    h1 = min(oh_n, h0 + rows)
    return rest // g_, rest % g_, min(ocu * per, ocb_n), h0, h1, h0 * wq, (h1 - 1) * wq + ow_n


def _tiles_py(width, npos):
    """The tiles of ``npos`` positions (P, or a row tile's) by ``width`` output channels (CB,
    OB or WIDE) at plane positions ``q`` in ``range(qa, qb, npos)``: each sums its input
    channels (continuing the sums rb holds when ``more``) into ``rb[r0 + q width:]``, reading
    ``xp[x0 + q CB:]``. One call per unit rather than per tile: the call passed each array
    as 7 words on the stack, a quarter of a short reduction's time. A wide tile's second
    block of the packed filter is ``wnext`` after the first."""
    size = npos * width

    def tiles(xp, x0, wp, w0, cbn, cstride, taps, rb, r0, more, wnext, qa, qb):
        # pragma: no cover - compiled
        tile = stack_tile(size, np.float32)  # noqa: F821 - the tiled_jit intrinsic
        acc = carray(tile, size)  # noqa: F821 - numba.carray
        for q in range(qa, qb, npos):
            r = r0 + q * width
            for i in range(size):  # more: continue the sums rb holds
                acc[i] = rb[np.uintp(r + i)] if more else np.float32(0.0)
            fma_tile(tile, npos, width, CB, xp, x0 + q * CB, wp, w0, cbn, cstride, taps,  # noqa: F821
                     wnext)  # fmt: skip
            for i in range(size):
                rb[np.uintp(r + i)] = acc[i]

    return tiles


def _tile1_py(xp, x0, wp, w0, cn, cstride, taps, rb, r0):
    # pragma: no cover - compiled
    # _tile_py over planes of one channel (a source of fewer than 8 channels per group)
    tile = stack_tile(_TILE, np.float32)  # noqa: F821 - the tiled_jit intrinsic
    acc = carray(tile, _TILE)  # noqa: F821 - numba.carray
    for i in range(_TILE):
        acc[i] = np.float32(0.0)
    fma_tile(tile, P, OB, 1, xp, x0, wp, w0, cn, cstride, taps, 0)  # noqa: F821
    for i in range(_TILE):
        rb[np.uintp(r0 + i)] = acc[i]


def _tile1_32_py(xp, x0, wp, w0, cn, cstride, taps, rb, r0, wnext):
    # pragma: no cover - compiled
    # _tile1_py for a wide tile (32 output channels, as _tile32_py)
    tile = stack_tile(_WIDE_TILE, np.float32)  # noqa: F821 - the tiled_jit intrinsic
    acc = carray(tile, _WIDE_TILE)  # noqa: F821 - numba.carray
    for i in range(_WIDE_TILE):
        acc[i] = np.float32(0.0)
    fma_tile(tile, P, WIDE, 1, xp, x0, wp, w0, cn, cstride, taps, wnext)  # noqa: F821
    for i in range(_WIDE_TILE):
        rb[np.uintp(r0 + i)] = acc[i]


def _conv_units_py(xp, wp, out, rb, taps, geom, bias, epi, counter, me):
    # pragma: no cover - compiled
    # geom: G, OCB (blocks per group), ICB, WQ, OH, OW, ROWS, CSTRIDE, SAMPLE, SHIFT, BS (the
    # channels of a packed block: CB, or 1), WIDE (units of 32 output channels); epi: 0 none,
    # 1 + bias[oc], 2 also ReLU, 3 also H_SWISH
    g_, ocb_n, icb_n, wq, oh_n, ow_n, rows, cstride, sample, shift, bs, wide = (
        geom[0], geom[1], geom[2], geom[3], geom[4], geom[5], geom[6], geom[7], geom[8],
        geom[9], geom[10], geom[11] != 0,
    )  # fmt: skip
    per = 2 if wide else 1  # blocks of 16 output channels per unit
    width = per * OB
    wsz = icb_n * taps.size * bs * OB
    ohw = oh_n * ow_n
    nblk = (oh_n + rows - 1) // rows
    while True:  # the units the other threads have not taken
        u = _take(counter, me)
        if u < 0:
            break
        n, g, ocb, h0, h1, q0, q1 = _unit(u, nblk, ocb_n, per, 0, g_, rows, oh_n, wq, ow_n, True)
        x0 = n * sample + g * icb_n * cstride + shift * bs
        w0 = (g * ocb_n + ocb) * wsz
        if bs == CB and wide:
            _tile32(xp, x0, wp, w0, icb_n, cstride, taps, rb, -q0 * width, False, wsz, q0, q1)
        elif bs == CB:
            _tile(xp, x0, wp, w0, icb_n, cstride, taps, rb, -q0 * width, False, 0, q0, q1)
        for q in range(q0, q1 if bs == 1 else q0, P):
            r0 = (q - q0) * width
            if wide:
                _tile1_32(xp, x0 + q, wp, w0, icb_n, cstride, taps, rb, r0, wsz)
            else:
                _tile1(xp, x0 + q, wp, w0, icb_n, cstride, taps, rb, r0)
        oc0 = (g * ocb_n + ocb) * OB
        c0 = (n * g_ * ocb_n) * OB + oc0  # the output channel of the unit's first sums
        kv = ow_n // _LANES * _LANES  # whole blocks of a row, written transposed
        for i in range(h0, h1):
            for jb in range(0, width, _LANES):
                for k0 in range(0, kv, _LANES):
                    s0 = (i * wq - q0 + k0) * width + jb
                    d0 = (c0 + jb) * ohw + i * ow_n + k0
                    if epi == 0:
                        transpose_store(rb, s0, width, out, d0, ohw, bias, oc0 + jb, 0)  # noqa: F821
                    elif epi == 1:
                        transpose_store(rb, s0, width, out, d0, ohw, bias, oc0 + jb, 1)  # noqa: F821
                    elif epi == 2:
                        transpose_store(rb, s0, width, out, d0, ohw, bias, oc0 + jb, 2)  # noqa: F821
                    else:
                        transpose_store(rb, s0, width, out, d0, ohw, bias, oc0 + jb, 3)  # noqa: F821
        for j in range(width if kv < ow_n else 0):  # the rows' last columns
            ob = (c0 + j) * ohw
            b = bias[oc0 + j] if epi else np.float32(0.0)
            for i in range(h0, h1):
                rq = (i * wq - q0) * width + j
                d = ob + i * ow_n
                for k in range(kv, ow_n):
                    v = rb[np.uintp(rq + k * width)]
                    if epi:  # not v + 0 without a bias: -0.0 stays -0.0
                        v += b
                        if epi == 2 and v < 0:  # not max(): NaN stays NaN
                            v = np.float32(0.0)
                        elif epi == 3:
                            v = _hswish(v)
                    out[np.uintp(d + k)] = v


def _tile_out_py(width, npos):
    """The tiles of ``npos`` positions (P, a row of ROW_TILES, or 1 for planes of one
    position) by ``width`` output channels (CB, OB or WIDE) at plane positions
    ``range(qa, qb, npos)``, summed as :func:`_tiles_py`'s and written to the NCHW88 output
    by the compiled :func:`_write_out_py` of npos: its sizes constants of the compiled
    function, the tile stays in registers. The write-outs are module globals, not closure
    cells: Numba keys a cached closure by its cells' pickles, and a dispatcher's differs in
    every process (each process compiled these again)."""
    size = npos * width

    def tile_out(xp, x0, wp, w0, cbn, cstride, taps, rb, r0, more, wnext, out, z, bias, oc0,
                 epi, obase, ohw8, qa, qb, qlo, qhi, wq, ow):  # fmt: skip
        # pragma: no cover - compiled
        # the tiles at q in range(qa, qb, npos), as _tiles_py's, each written out
        tile = stack_tile(size, np.float32)  # noqa: F821 - the tiled_jit intrinsic
        acc = carray(tile, size)  # noqa: F821 - numba.carray
        for q in range(qa, qb, npos):
            r = r0 + q * width
            for i in range(size):
                acc[i] = rb[np.uintp(r + i)] if more else np.float32(0.0)
            fma_tile(tile, npos, width, CB, xp, x0 + q * CB, wp, w0, cbn, cstride, taps,  # noqa: F821
                     wnext)  # fmt: skip
            if npos == 1:
                _write_one(tile, width, out, z, bias, oc0, epi, obase, ohw8, q, qlo, qhi, wq, ow)
            elif npos == ROW_TILES[0]:
                _write_row7(tile, width, out, z, bias, oc0, epi, obase, ohw8, q, qlo, qhi, wq,
                            ow)  # fmt: skip
            elif npos == ROW_TILES[1]:
                _write_row13(tile, width, out, z, bias, oc0, epi, obase, ohw8, q, qlo, qhi, wq,
                             ow)  # fmt: skip
            elif npos == ROW_TILES[2]:
                _write_row14(tile, width, out, z, bias, oc0, epi, obase, ohw8, q, qlo, qhi, wq,
                             ow)  # fmt: skip
            else:
                _write_out(tile, width, out, z, bias, oc0, epi, obase, ohw8, q, qlo, qhi, wq, ow)

    return tile_out


def _write_out_py(npos):
    """The write-out of a tile of ``npos`` positions (P, or 1: :func:`_tile_out_py`)."""

    def write_out(tile, width, out, z, bias, oc0, epi, obase, ohw8, q, qlo, qhi, wq, ow):
        # pragma: no cover - compiled
        # the epilogue applied to a tile of npos x width sums (width 8, 16 or 32: blocks of 8
        # channels ohw8 apart in the NCHW88 output), written to positions q + p in [qlo, qhi)
        # of a plane row, not in its gap. Inlined into its callers, whose width is a
        # constant: only stores to ``out`` are conditional (a conditional write to the tile,
        # or a branch around its reads, made the compiler keep it in memory: 3x slower)
        acc = carray(tile, npos * width)  # noqa: F821 - numba.carray
        # the bias add's lanes at a time (a multiple of width): an 8-channel tile's by pairs
        # of positions, as LLVM vectorized a body of 8 lanes across positions, with gathers
        # and scatters of the tile; the index unsigned, as a signed one's wraparound test
        # gathered the bias. The row tiles' (7, 13 and 14 positions, by 32 channels: their rows
        # were gathered and scattered too) in explicit vectors, slower for tiles of P
        span = 2 * width if width == CB and npos % 2 == 0 else width
        if epi & 1 and npos in ROW_TILES and width == WIDE:
            add_rows(tile, npos, WIDE, bias, oc0)  # noqa: F821 - the tiled_jit intrinsic
        elif epi & 1:
            for p in range(0, npos * width, span):
                for j in range(span):
                    acc[p + j] += bias[np.uintp(oc0 + j % width)]
        offs = carray(stack_tile(npos, np.int64), npos)  # noqa: F821 - an output offset, or -1
        if wq == ow and qlo <= q and q + npos <= qhi:
            # rows without a gap (a pointwise convolution read in place), every position new:
            # no division, no tests (5-10% of the mobile nets' pointwise layers at 56x56)
            for pos in range(npos):
                offs[pos] = obase + (q + pos) * CB
        else:
            row = q // wq
            col = q - row * wq
            for pos in range(npos):
                qq = q + pos
                ok = qlo <= qq < qhi and col < ow
                offs[pos] = obase + (row * ow + col) * CB if ok else -1
                col += 1
                if col == wq:
                    row += 1
                    col = 0
        if epi & 2:  # a dropped position reads the block's first (any in-bounds value)
            for pos in range(npos):
                o = max(offs[pos], obase)
                for h in range(width // CB):
                    for c in range(CB):
                        acc[pos * width + h * CB + c] += z[np.uintp(o + h * ohw8 + c)]
        if epi & 20:  # ReLU, and ReLU6's MIN(6, x) (a bound of inf without it)
            hi = np.float32(6.0) if epi & 16 else np.float32(np.inf)
            for i in range(npos * width):
                a = acc[i]
                a = np.float32(0.0) if a < 0 else a  # not max(): NaN stays NaN
                acc[i] = hi if a > hi else a
        for pos in range(npos):
            o = offs[pos]
            if o >= 0:
                for h in range(width // CB):
                    for c in range(CB):
                        out[np.uintp(o + h * ohw8 + c)] = acc[pos * width + h * CB + c]
        if epi & 8:  # on the values just written (on the tile's, LLVM gathered the wide tiles')
            for pos in range(npos):
                o = offs[pos]
                if o >= 0:
                    for h in range(width // CB):
                        for c in range(CB):
                            e = np.uintp(o + h * ohw8 + c)
                            out[e] = _hswish(out[e])
        if epi & 32:  # SiLU on the values just written (in L1), 8 channels a vector
            for pos in range(npos):
                o = offs[pos]
                if o >= 0:
                    for h in range(width // CB):
                        _silu8(out, np.uintp(o + h * ohw8))

    return write_out


def _conv_units_blocked_py(xp, wp, out, z, rb, taps, geom, bias, epi, counter, me, src, xbuf,
                           pack, dims, packed):  # fmt: skip
    # pragma: no cover - compiled
    # geom: G, OCB, ICB, WQ, OH, OW, ROWS, CSTRIDE, SAMPLE, SHIFT, LIMIT (a tile reads at most
    # LIMIT positions of a plane), CHUNK, WIDE (units of 32 output channels, two blocks of
    # 16), REM (1: each group's OCB blocks of 16 are followed by one of 8), BANDS_FIRST (1:
    # a unit's bands of rows vary fastest, else its channel blocks); epi bits: 1 +
    # bias[oc], 2 + z (out's layout), 4 ReLU, 8 H_SWISH, 16 ReLU6, 32 SiLU.
    # pack: BLOCKS (0: xp is the source itself), SH, SW, ROW_OFF, COL_OFF, HQ, WQ, PHASES:
    # first the parts pack the source src into xbuf (xp's memory), one (sample, channel
    # block) at a time taken from packed[0] and counted done in packed[1], and wait for every
    # block
    # (a part only waits for blocks another running part has taken: run one after the other,
    # the first packs them all)
    blocks = pack[0]
    if blocks > 0:
        while True:
            b = fetch_add(packed, 0, 1)  # noqa: F821 - the tiled_jit intrinsic
            if b >= blocks:
                break
            _pack_blocked(src, xbuf, dims, pack[1], pack[2], pack[3], pack[4], pack[5],
                          pack[6], b, b + 1, pack[7])  # fmt: skip
            fetch_add(packed, 1, 1)  # noqa: F821
        while fetch_add(packed, 1, 0) < blocks:  # noqa: F821 - the others' blocks
            pass
    # A unit's tiles sum CHUNK channel blocks at a time, into rb (its positions, from q0 - P)
    # but for the last chunk, whose tiles write the output: the chunk's filter and source
    # rows stay in the core's caches across the unit (L2: 16 blocks of a 3x3 filter for 32
    # channels are 147 KB)
    g_, ocb_n, icb_n, wq, oh_n, ow_n, rows, cstride, sample, shift, limit, chunk, wide, rem = (
        geom[0], geom[1], geom[2], geom[3], geom[4], geom[5], geom[6], geom[7], geom[8],
        geom[9], geom[10], geom[11], geom[12] != 0, geom[13],
    )  # fmt: skip
    bands_first = geom[14] != 0
    rowt = geom[15]  # 0, or the row tiles' positions (ROW_TILES) of wide units
    per = 2 if wide else 1  # blocks of 16 output channels per unit
    ocg = ocb_n * OB + rem * CB
    ohw8 = oh_n * ow_n * CB
    nblk = (oh_n + rows - 1) // rows
    last = (icb_n - 1) // chunk * chunk
    # planes of one position (squeeze-and-excitation layers): tiles of one position, whose
    # sums wait on each other (a quarter of the tile of P's rate) but are not P - 1 dropped
    one = oh_n * wq == 1
    while True:  # the units the other threads have not taken
        u = _take(counter, me)
        if u < 0:
            break
        n, g, ocb, h0, h1, q0, q1 = _unit(u, nblk, ocb_n, per, rem, g_, rows, oh_n, wq, ow_n,
                                          bands_first)  # fmt: skip
        # a unit of the block of 8 after the blocks of 16 (OCg % 16 == 8): 8-channel tiles;
        # of wide units, the one of an odd count's last block of 16: 16-channel tiles
        narrow = ocb == ocb_n
        single = wide and ocb == ocb_n - 1 and ocb_n % 2 == 1
        width = CB if narrow else OB if single else per * OB
        wcb = taps.size * CB * (CB if narrow else OB)  # a block's filter per input block
        wsz = icb_n * taps.size * CB * OB  # the filter of a block of 16 (wide: the next one's)
        oc0 = g * ocg + ocb * OB
        obase = (n * g_ * ocg + oc0) // CB * ohw8
        x0 = n * sample + g * icb_n * cstride + shift * CB
        w0 = oc0 * icb_n * taps.size * CB
        if one:  # all channels at once
            if narrow:
                _one8(xp, x0, wp, w0, icb_n, cstride, taps, rb, 0, False, wsz, out, z, bias,
                      oc0, epi, obase, ohw8, q0, q1, q0, q1, wq, ow_n)
            elif wide and not single:
                _one32(xp, x0, wp, w0, icb_n, cstride, taps, rb, 0, False, wsz, out, z, bias,
                       oc0, epi, obase, ohw8, q0, q1, q0, q1, wq, ow_n)
            else:
                _one16(xp, x0, wp, w0, icb_n, cstride, taps, rb, 0, False, wsz, out, z, bias,
                       oc0, epi, obase, ohw8, q0, q1, q0, q1, wq, ow_n)
            continue
        r0 = (P - q0) * width  # a tile's sums at rb[(q - q0 + P) width:]
        if rowt and width == WIDE:  # row tiles: each row's OW positions, no gap
            # rowt 7 or 13: tiles of rowt; 14: tiles of 14, then one of 13 for a rest of 13
            # (rows of 27: 14 + 13)
            t14 = ow_n // rowt * rowt if rowt == 14 else 0
            for c0 in range(0, icb_n, chunk):
                x1, w1, cn = x0 + c0 * cstride, w0 + c0 * wcb, min(chunk, icb_n - c0)
                mid, more = c0 + chunk < icb_n, c0 > 0
                for i in range(h0, h1):
                    qa = i * wq
                    qb = qa + ow_n
                    qc = qa + t14  # [qa, qc) in tiles of 14, [qc, qb) of rowt or 13
                    if mid and rowt == 7:
                        _row7(xp, x1, wp, w1, cn, cstride, taps, rb, r0, more, wsz, qa, qb)
                    elif mid:
                        _row14(xp, x1, wp, w1, cn, cstride, taps, rb, r0, more, wsz, qa, qc)
                        _row13(xp, x1, wp, w1, cn, cstride, taps, rb, r0, more, wsz, qc, qb)
                    elif rowt == 7:
                        _row_out7(xp, x1, wp, w1, cn, cstride, taps, rb, r0, more, wsz, out,
                                  z, bias, oc0, epi, obase, ohw8, qa, qb, q0, q1, wq,
                                  ow_n)  # fmt: skip
                    else:
                        _row_out14(xp, x1, wp, w1, cn, cstride, taps, rb, r0, more, wsz, out,
                                   z, bias, oc0, epi, obase, ohw8, qa, qc, q0, q1, wq,
                                   ow_n)  # fmt: skip
                        _row_out13(xp, x1, wp, w1, cn, cstride, taps, rb, r0, more, wsz, out,
                                   z, bias, oc0, epi, obase, ohw8, qc, qb, q0, q1, wq,
                                   ow_n)  # fmt: skip
            continue
        # tiles [q0, qt) read within the planes; one more, from limit - P, ends the unit
        qt = q0 + min((q1 - q0 + P - 1) // P, max(0, limit - q0) // P) * P
        for c0 in range(0, last, chunk):
            x1, w1 = x0 + c0 * cstride, w0 + c0 * wcb
            if narrow:
                _tile8(xp, x1, wp, w1, chunk, cstride, taps, rb, r0, c0 > 0, 0, q0, qt)
            elif wide and not single:
                _tile32(xp, x1, wp, w1, chunk, cstride, taps, rb, r0, c0 > 0, wsz, q0, qt)
            else:
                _tile(xp, x1, wp, w1, chunk, cstride, taps, rb, r0, c0 > 0, 0, q0, qt)
        # the last chunk's tiles (k 0), then (qt < q1) one from limit - P (k 1), whose first
        # positions repeat equal sums: it writes the others
        for k in range(1 if qt >= q1 else 2):
            xa, wa, cn = (x0 + last * cstride, w0 + last * wcb, icb_n - last) if k == 0 else (
                x0, w0, icb_n)
            ra, more = (r0, last > 0) if k == 0 else (0, False)
            qa, qb, qlo = (q0, qt, q0) if k == 0 else (limit - P, limit - P + 1, qt)
            if narrow:
                _tile_out8(xp, xa, wp, wa, cn, cstride, taps, rb, ra, more, wsz, out, z, bias,
                           oc0, epi, obase, ohw8, qa, qb, qlo, q1, wq, ow_n)
            elif wide and not single:
                _tile_out32(xp, xa, wp, wa, cn, cstride, taps, rb, ra, more, wsz, out, z, bias,
                            oc0, epi, obase, ohw8, qa, qb, qlo, q1, wq, ow_n)
            else:
                _tile_out16(xp, xa, wp, wa, cn, cstride, taps, rb, ra, more, wsz, out, z, bias,
                            oc0, epi, obase, ohw8, qa, qb, qlo, q1, wq, ow_n)


def _hswish_py(x):
    # pragma: no cover - compiled
    # H_SWISH as the elementwise kernels compute it: min(max(x + 3, 0), 6) x / 6, NaN kept
    w = x + np.float32(3.0)
    w = w if w > np.float32(0.0) else np.float32(0.0)
    w = w if w < np.float32(6.0) else np.float32(6.0)
    return w * x * np.float32(1.0 / 6.0)


def _relu6_py(x):
    # pragma: no cover - compiled
    # ReLU6 as the JIT computes MIN(6, MAX(0, x)): NaN kept
    x = np.float32(0.0) if x < np.float32(0.0) else x
    return np.float32(6.0) if x > np.float32(6.0) else x


def _silu_py(x):
    # pragma: no cover - compiled
    # SiLU as the JIT computes MUL(x, SIGMOID(x)), with its sigmoid
    return x * _sigmoid(x)


@functools.cache
def tail_scalars() -> tuple:
    """The compiled scalar ReLU6 and SiLU (``float32 -> float32``, inlined where called) of
    the epilogues' tails; SiLU calls the JIT's sigmoid
    (:func:`megbrain.kernels.jit_codegen.helper`)."""
    global _sigmoid
    _sigmoid = jit_codegen.helper("_sigmoid")
    sig = [t.float32(t.float32)]
    compile_tiled = tiled_jit.compile_tiled
    return (compile_tiled(_relu6_py, sig, inline="always"),
            compile_tiled(_silu_py, sig, inline="always"))  # fmt: skip


def _zeros_py(xp, lo, hi):
    # pragma: no cover - compiled
    for e in range(lo, hi):
        xp[np.uintp(e)] = 0.0


def _copy_block_py(xp, d, x, o):
    # pragma: no cover - compiled
    # xp[d:d + 8] = x[o:o + 8] (CB values), all eight loaded before any is stored, with
    # unsigned indices: with loads and stores in turn the compiler could not rule out that a
    # store changes a later load and copied value by value, and a signed index is tested
    # for wraparound
    u = np.uintp
    d, o = u(d), u(o)
    v0, v1, v2, v3 = x[o], x[o + u(1)], x[o + u(2)], x[o + u(3)]
    v4, v5, v6, v7 = x[o + u(4)], x[o + u(5)], x[o + u(6)], x[o + u(7)]
    xp[d], xp[d + u(1)], xp[d + u(2)], xp[d + u(3)] = v0, v1, v2, v3
    xp[d + u(4)], xp[d + u(5)], xp[d + u(6)], xp[d + u(7)] = v4, v5, v6, v7


def _pad_row_py(xp, d, src, h_, k0, k1, wq, bs):
    # pragma: no cover - compiled
    # the zeros of the plane row at d (wq positions of bs values): all of it when its source
    # row src is outside [0, h_), else its columns outside [k0, k1); whether it has source
    # columns to copy
    if src < 0 or src >= h_:
        _zeros(xp, d, d + wq * bs)
        return False
    _zeros(xp, d, d + k0 * bs)
    _zeros(xp, d + k1 * bs, d + wq * bs)
    return True


def _inside_py(phi, sw, col_off, w_, wq):
    # pragma: no cover - compiled
    # the columns [k0, k1) of a phase-phi plane row inside a source row of w_ columns:
    # sw k + phi - col_off in [0, w_)
    k0 = min(wq, max(0, -(-(col_off - phi) // sw)))
    k1 = min(wq, max(k0, (w_ - 1 - phi + col_off) // sw + 1))
    return k0, k1


def _pack_blocked_py(x, xp, dims, sh, sw, row_off, col_off, hq, wq, b0, b1, phases):
    # pragma: no cover - compiled
    # blocks [b0, b1) of (sample, channel block) of the flat C-contiguous x (N, C/8, H, W, 8)
    # (dims: C/8, H, W) into the first ``phases`` phase planes (all sh * sw, or 1: the
    # subsampled source of a strided pointwise convolution) of _pack_input_py's layout; a
    # row's columns inside the source are one contiguous copy at stride 1. All sh * sw
    # phases of a strided source are written a source row at a time, its positions read in
    # order (plane by plane, each phase read every sw-th position of its rows: the 3x3/s2
    # layers of ResNet packed 2-2.5x slower)
    cbs, h_, w_ = dims[0], dims[1], dims[2]
    phase = hq * wq * CB
    cstride = phases * phase
    sample = cbs * cstride + SLACK * CB
    every = sw > 1 and phases == sh * sw
    cols = min(w_, wq * sw - col_off)  # the source columns that land in a plane row
    for blk in range(b0, b1):
        n = blk // cbs
        cb = blk % cbs
        s0 = blk * h_ * w_ * CB
        for r in range(hq if every else 0):
            for rho in range(sh):
                src = sh * r + rho - row_off
                d0 = n * sample + cb * cstride + rho * sw * phase + r * wq * CB
                inside = True
                for phi in range(sw):
                    k0, k1 = _inside(phi, sw, col_off, w_, wq)
                    inside = _pad_row(xp, d0 + phi * phase, src, h_, k0, k1, wq, CB)
                if not inside:
                    continue
                o = s0 + src * w_ * CB
                k, phi = col_off // sw, col_off % sw  # source column c's plane position
                for _ in range(cols):
                    _copy_block(xp, d0 + phi * phase + k * CB, x, o)
                    o += CB
                    phi += 1
                    if phi == sw:
                        phi = 0
                        k += 1
        for ph in range(0 if every else phases):
            rho, phi = ph // sw, ph % sw
            base = n * sample + cb * cstride + ph * phase
            k0, k1 = _inside(phi, sw, col_off, w_, wq)
            for r in range(hq):
                d = base + r * wq * CB
                src = sh * r + rho - row_off
                if not _pad_row(xp, d, src, h_, k0, k1, wq, CB):
                    continue
                srow = s0 + src * w_ * CB
                if sw == 1:
                    o = srow + (phi - col_off) * CB
                    for e in range(k0 * CB, k1 * CB):
                        xp[np.uintp(d + e)] = x[np.uintp(o + e)]
                else:
                    for k in range(k0, k1):
                        _copy_block(xp, d + k * CB, x, srow + (sw * k + phi - col_off) * CB)
        if cb == cbs - 1:
            tail = n * sample + cbs * cstride
            _zeros(xp, tail, tail + SLACK * CB)


def _pack_input_py(x, xf, xp, sh, sw, row_off, col_off, hq, wq, i0, i1, bs):
    # pragma: no cover - compiled
    # phase planes [i0, i1) of (sample, block of bs channels, phase); x (N, C, H, W) any
    # strides. Phase plane (rho, phi) of a block holds x[sh r + rho - row_off, sw c + phi -
    # col_off] at (r, c); the columns inside the source are one loop without tests. xf: x
    # itself, flat, when it is C-contiguous (else empty): planes of one channel at stride 1
    # or 2 (a network's first layer) read it at a constant stride, a loop the compiler
    # vectorizes (a strided row view's reads are one at a time: 0.1 ms of the 3->16 stem at
    # 224 on one core, 0.045 so)
    c_, h_, w_ = x.shape[1], x.shape[2], x.shape[3]
    cbs = c_ // bs
    phases = sh * sw
    phase = hq * wq * bs
    cstride = phases * phase
    sample = cbs * cstride + SLACK * bs
    for item in range(i0, i1):
        blk, ph = item // phases, item % phases
        rho, phi = ph // sw, ph % sw
        n = blk // cbs
        cb = blk % cbs
        base = n * sample + cb * cstride + ph * phase
        k0, k1 = _inside(phi, sw, col_off, w_, wq)
        for r in range(hq):
            d = base + r * wq * bs
            src = sh * r + rho - row_off
            if not _pad_row(xp, d, src, h_, k0, k1, wq, bs):
                continue
            if bs == 1 and sw <= 2 and xf.size > 0:
                s0 = ((n * c_ + cb) * h_ + src) * w_ + phi - col_off
                if sw == 1:
                    for k in range(k0, k1):
                        xp[np.uintp(d + k)] = xf[np.uintp(s0 + k)]
                else:
                    for k in range(k0, k1):
                        xp[np.uintp(d + k)] = xf[np.uintp(s0 + 2 * k)]
                continue
            for ic in range(bs):
                row = x[n, cb * bs + ic, src]
                for k in range(k0, k1):
                    xp[np.uintp(d + k * bs + ic)] = row[sw * k + phi - col_off]
        if cb == cbs - 1 and ph == phases - 1:
            tail = n * sample + cbs * cstride
            _zeros(xp, tail, tail + SLACK * bs)


def _pack_filter_py(w, wp, flip, bs):
    # pragma: no cover - compiled
    # w (G, OCg, ICg, FH, FW) any strides -> wp (G, OCg/16, ICg/bs, FH, FW, bs, 16), then,
    # when OCg % 16 == 8, a group's last 8 channels as a block (ICg/bs, FH, FW, bs, 8)
    g_, ocg, icg, fh, fw = w.shape[0], w.shape[1], w.shape[2], w.shape[3], w.shape[4]
    i = 0
    for g in range(g_):
        for ocb in range((ocg + OB - 1) // OB):
            bw = min(OB, ocg - ocb * OB)
            for cb in range(icg // bs):
                for a in range(fh):
                    for b in range(fw):
                        sa = fh - 1 - a if flip else a
                        sb = fw - 1 - b if flip else b
                        for ic in range(bs):
                            for j in range(bw):
                                wp[np.uintp(i)] = w[g, ocb * OB + j, cb * bs + ic, sa, sb]
                                i += 1


_unit = _take = None  # compiled by _compiled() before the units
_NO_PACKING = (np.zeros(1, np.float32), np.zeros(1, np.float32), np.zeros(8, np.int64),
               np.zeros(3, np.int64), np.zeros(2, np.int64))  # fmt: skip
_NO_PACKING[0].flags.writeable = False
_NOT_FLAT = np.zeros(0, np.float32)  # pack_input's source is not C-contiguous
_NOT_FLAT.flags.writeable = False
_tile = None  # the compiled tiles, bound by _compiled() before compiling the units
_tile1 = None
_tile32 = _tile1_32 = _write_out = _tile_out16 = _tile_out32 = _pack_blocked = _inside = None
_write_one = _write_row7 = _write_row13 = _write_row14 = None  # of 1 and ROW_TILES positions
_tile8 = _tile_out8 = _one8 = _one16 = _one32 = None
_row7 = _row13 = _row14 = None  # the row tiles (ROW_TILES) of wide units, and theirs that
_row_out7 = _row_out13 = _row_out14 = None  # write the output
_zeros = _copy_block = _pad_row = _hswish = _sigmoid = _silu8 = None


@functools.cache
def _compiled() -> dict:
    global stack_tile, fetch_add, fma_tile, transpose_store, add_rows, P, _TILE, _WIDE_TILE
    global _LANES
    global _unit, _take, _tile, _tile1
    global _tile32, _tile1_32, _write_out, _tile_out16, _tile_out32, _pack_blocked, _inside
    global _write_one, _write_row7, _write_row13, _write_row14
    global _tile8, _tile_out8, _one8, _one16, _one32, _row7, _row13, _row14
    global _row_out7, _row_out13, _row_out14
    global _zeros, _copy_block, _pad_row, carray, _hswish, _silu8


    stack_tile, fetch_add, carray = tiled_jit.stack_tile(), tiled_jit.fetch_add(), _carray
    fma_tile, transpose_store = tiled_jit.fma_tile(), tiled_jit.transpose_store()
    add_rows = tiled_jit.add_rows()
    _LANES = tiled_jit.vector_width()
    P = tile_positions()
    _TILE = P * OB
    _WIDE_TILE = 2 * _TILE
    compile_tiled = tiled_jit.compile_tiled
    f1, i8 = t.float32[::1], t.int64
    ints = t.int64[::1]
    fr = t.Array(t.float32, 1, "C", readonly=True)
    # the NCHW88 units read a source in place: a read-only one too
    bo = t.boolean
    _unit = compile_tiled(_unit_py, [t.UniTuple(i8, 7)(i8, i8, i8, i8, i8, i8, i8, i8, i8, i8,
                                                        bo)])  # fmt: skip
    _inside = compile_tiled(_inside_py, [t.UniTuple(i8, 2)(i8, i8, i8, i8, i8)])
    _zeros = compile_tiled(_zeros_py, [t.void(f1, i8, i8)])
    _copy_block = compile_tiled(_copy_block_py, [t.void(f1, i8, fr, i8)], inline="always")
    _hswish = compile_tiled(_hswish_py, [t.float32(t.float32)], inline="always")
    _silu8 = silu8()
    _pad_row = compile_tiled(_pad_row_py, [t.boolean(f1, i8, i8, i8, i8, i8, i8, i8)])
    _take = tiled_jit.take_unit()
    tiles_sig = [t.void(x, i8, f1, i8, i8, i8, ints, f1, i8, bo, i8, i8, i8) for x in (f1, fr)]
    _tile = compile_tiled(_tiles_py(OB, P), tiles_sig)
    _tile32 = compile_tiled(_tiles_py(WIDE, P), tiles_sig)
    _tile8 = compile_tiled(_tiles_py(CB, P), tiles_sig[1:])
    _row7, _row13, _row14 = (compile_tiled(_tiles_py(WIDE, k), tiles_sig[1:]) for k in ROW_TILES)
    _tile1_32 = compile_tiled(_tile1_32_py, [t.void(f1, i8, f1, i8, i8, i8, ints, f1, i8, i8)])
    _tile1 = compile_tiled(_tile1_py, [t.void(f1, i8, f1, i8, i8, i8, ints, f1, i8)])
    # the bias C-contiguous (the binders copy a strided one at every run): a strided type
    # kept the epilogue's bias add from vectorising
    b1 = t.Array(t.float32, 1, "C", readonly=True)
    wo_sig = [t.void(t.CPointer(t.float32), i8, f1, fr, b1, i8, i8, i8, i8, i8, i8, i8, i8, i8)]
    _write_out = compile_tiled(_write_out_py(P), wo_sig, inline="always")
    _write_one = compile_tiled(_write_out_py(1), wo_sig, inline="always")
    _write_row7, _write_row13, _write_row14 = (
        compile_tiled(_write_out_py(k), wo_sig, inline="always") for k in ROW_TILES
    )
    out_sig = [t.void(fr, i8, f1, i8, i8, i8, ints, f1, i8, bo, i8, f1, fr, b1, i8, i8, i8, i8,
                      i8, i8, i8, i8, i8, i8)]  # fmt: skip
    _tile_out16 = compile_tiled(_tile_out_py(OB, P), out_sig)
    _tile_out32 = compile_tiled(_tile_out_py(WIDE, P), out_sig)
    _tile_out8 = compile_tiled(_tile_out_py(CB, P), out_sig)
    _one16 = compile_tiled(_tile_out_py(OB, 1), out_sig)
    _one32 = compile_tiled(_tile_out_py(WIDE, 1), out_sig)
    _one8 = compile_tiled(_tile_out_py(CB, 1), out_sig)
    _row_out7, _row_out13, _row_out14 = (compile_tiled(_tile_out_py(WIDE, k), out_sig)
                                         for k in ROW_TILES)  # fmt: skip
    units = compile_tiled(_conv_units_py, [t.void(f1, f1, f1, f1, ints, ints, b1, i8, ints, i8)])
    # the sources are typed read-only (readonly_view): one signature fits every operand
    x4 = t.Array(t.float32, 4, "A", readonly=True)
    w5 = t.Array(t.float32, 5, "A", readonly=True)
    pack_in = compile_tiled(_pack_input_py, [t.void(x4, fr, f1, i8, i8, i8, i8, i8, i8, i8, i8,
                                                     i8)])  # fmt: skip
    pack_w = compile_tiled(_pack_filter_py, [t.void(w5, f1, t.boolean, i8)])
    pack_b = compile_tiled(_pack_blocked_py, [t.void(fr, f1, ints, i8, i8, i8, i8, i8, i8, i8,
                                                     i8, i8)])  # fmt: skip
    _pack_blocked = pack_b
    blocked = compile_tiled(_conv_units_blocked_py, [t.void(fr, f1, f1, fr, f1, ints, ints, b1,
                                                            i8, ints, i8, fr, f1, ints, ints,
                                                            ints)])  # fmt: skip
    return {
        "units": units,
        "pack_input": pack_in,
        "pack_filter": pack_w,
        "units_blocked": blocked,
        "pack_blocked": pack_b,
    }


def conv_units(xp, wp, out, rb, taps, geom, bias, epi: int, counter, me: int):
    """The call of the compiled kernel bound to its arguments (which the kernel pool can run as a C
    call, without the GIL) computing thread ``me``'s share of the convolution's units into
    the flat NCHW ``out``: units taken one at a time from ``counter`` (int64, a ``(next,
    end)`` pair per thread's range of units,
    :func:`megbrain.kernels.conv.nchw8c.units_as_they_go`) by atomic increments, its own
    range first, then what the other threads have not taken of theirs; ``rb`` this thread's
    row buffer of at least ``(ROWS WQ + P) 16`` values; ``taps`` the int64 plane offsets
    (positions) of the filter taps, row-major; ``geom`` the int64 array of the units'
    geometry (see the source); ``epi`` 0, or 1 to add ``bias`` (a :func:`readonly_view` per
    output channel), 2 to add it and apply ReLU, 3 to add it and apply H_SWISH."""
    return functools.partial(_compiled()["units"], xp, wp, out, rb, taps, geom, bias, epi,
                             counter, me)  # fmt: skip


def conv_units_blocked(xp, wp, out, z, rb, taps, geom, bias, epi: int, counter, me: int,
                       packing=None):  # fmt: skip
    """The bound call (as :func:`conv_units`'s) computing thread ``me``'s share of the units into
    the flat NCHW88 ``out``, taken as by :func:`conv_units`. As :func:`conv_units`
    otherwise: the source ``xp`` (a :func:`readonly_view`, flat) either packed planes or,
    for a pointwise convolution read in place, the source itself; ``rb`` this thread's
    buffer of a unit's positions plus ``2 P``, by 16 values; ``geom`` also holding the
    positions a tile may read in a plane, the channel blocks summed at a time and the order
    of the units (bands of rows or channel blocks varying fastest); ``epi`` the sum of 1
    (add ``bias``), 2 (add ``z``, flat, laid out as ``out``) and 4 (ReLU) or 8 (H_SWISH, as
    the elementwise kernels compute it), 16 (ReLU6, with or without 4).

    ``packing`` (a :func:`blocked_packing`) makes the threads first pack the source into the
    planes ``xp`` views, a (sample, channel block) at a time, in the same call: the packing
    costs no hand-over of its own between the threads."""
    src, xbuf, pack, dims, packed = packing or _NO_PACKING
    return functools.partial(_compiled()["units_blocked"], xp, wp, out, z, rb, taps, geom,
                             bias, epi, counter, me, src, xbuf, pack, dims, packed)  # fmt: skip


def blocked_packing(x, xbuf, stride, row_off: int, col_off: int, hq: int, wq: int,
                    phases: int | None = None) -> tuple:  # fmt: skip
    """The ``packing`` of :func:`conv_units_blocked`: the float32, C-contiguous NCHW88 source
    ``x`` (N, C/8, H, W, 8) packed into the flat ``xbuf`` as :func:`pack_blocked_input`
    does. Its counter (an int64 pair, the last item) must be zeroed before every run."""
    blocks = x.shape[0] * x.shape[1]
    phases = stride[0] * stride[1] if phases is None else phases
    pack = np.array([blocks, stride[0], stride[1], row_off, col_off, hq, wq, phases], np.int64)
    dims = np.array(x.shape[1:4], np.int64)
    return readonly_view(x.reshape(-1)), xbuf, pack, dims, np.zeros(2, np.int64)


def pack_blocked_input(x, xp, stride, row_off: int, col_off: int, hq: int, wq: int, b0: int,
                       b1: int, phases: int | None = None) -> None:  # fmt: skip
    """:func:`pack_input` from the float32, C-contiguous NCHW88 ``(N, C/8, H, W, 8)`` source
    (a :func:`readonly_view`), blocks ``[b0, b1)`` of (sample, channel block). ``phases``
    packs the first phase planes only (1: phase (0, 0), the source subsampled by the stride;
    the planes of a block then follow each other ``phases`` planes apart)."""
    dims = np.array(x.shape[1:4], np.int64)
    phases = int(stride[0]) * int(stride[1]) if phases is None else phases
    _compiled()["pack_blocked"](x.reshape(-1), xp, dims, int(stride[0]), int(stride[1]),
                                row_off, col_off, hq, wq, b0, b1, phases)  # fmt: skip


def readonly_view(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a`` (the type the packing loops are compiled for: Numba types
    read-only and writable arrays apart, and a writable one matched both signatures)."""
    view = a.view()
    view.flags.writeable = False
    return view


def pack_input(x, xp, stride, row_off: int, col_off: int, hq: int, wq: int, b0: int,
               b1: int, bs: int = CB) -> None:  # fmt: skip
    """Phase planes ``[b0, b1)`` of the float32 ``(N, C, H, W)`` source (a
    :func:`readonly_view`) into the packed input ``xp``: per block (sample, ``bs`` channels:
    CB, or 1 for planes of one channel) ``SH x SW`` phase planes of ``hq x wq`` positions,
    plane ``i`` of the whole being phase ``i % (SH SW)`` of block ``i // (SH SW)``; every
    value written (zero outside the source)."""
    xf = x.reshape(-1) if x.flags.c_contiguous else _NOT_FLAT
    _compiled()["pack_input"](x, xf, xp, int(stride[0]), int(stride[1]), row_off, col_off, hq,
                              wq, b0, b1, bs)  # fmt: skip


def pack_filter(w, wp, flip: bool, bs: int = CB) -> None:
    """The float32 ``(G, OCg, ICg, FH, FW)`` filter (a :func:`readonly_view`) into the
    packed ``wp`` (blocks of ``bs`` input channels), flipped spatially when ``flip``
    (CONVOLUTION mode)."""
    _compiled()["pack_filter"](w, wp, bool(flip), bs)

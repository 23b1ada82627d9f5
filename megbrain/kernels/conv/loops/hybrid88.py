"""Compiled (Numba) loop of the hybrid NCHW88 convolution (:mod:`..hybrid88`): a network's
first layer, an NCHW source of at most 8 channels, written straight into the NCHW88 output
with the ConvBias epilogue.

Single-threaded and GIL-free over a ``[begin, end)`` range of units (a sample and a band of
output rows), so that a caller splits one call over a few Python threads. A unit first copies
the source rows its band reads into zero-padded phase planes of one channel (its thread's
scratch), one plane per input channel and stride phase, so that every filter tap of a row of
output positions is a stride-1 read at a fixed offset; then each tile of
:func:`.tiled_jit.tile_positions` positions of an output row by 16 output channels (8 for
the block after the last 16) sums its taps in registers
(:func:`megbrain.kernels.tiled_jit.fma_tile`, planes of one channel) and writes the two
blocks of the output. No allocation; compiled on first use.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import carray as _carray
from numba import types as t

from ... import tiled_jit
from .nchw8c import _hswish_py

__all__ = ["CB", "OB", "band_planes", "hybrid88", "scratch_size", "tap_offsets"]

#: channels of a block of the output (its innermost dim)
CB = 8
#: output channels of a tile: two blocks
OB = 16

# bound by _compiled() before compiling
stack_tile = carray = fma_tile = _hswish = _tile16 = _tile8 = _tile8w = _one16 = _one8 = None
_pack_band = None
P = None


def _tile_py(npos, width):
    """The tile of ``npos`` consecutive output positions of a row by ``width`` (16 or 8)
    output channels: its sizes constants of the compiled function, the tile in registers."""
    size = npos * width

    def tile(xp, x0, wp, w0, ic_n, cstride, taps, out, o, ohw8, z, bias, oc0, epi):
        # pragma: no cover - compiled
        # the sums of planes [0, ic_n) at x0 (cstride apart), then + bias[oc0:] (epi bit 1),
        # + z (bit 2, out's layout), ReLU (bit 4) or H_SWISH (bit 8), stored at out[o:]
        # (position p at o + 8 p, the second block of 8 channels ohw8 after the first)
        acc_p = stack_tile(size, np.float32)  # noqa: F821 - the tiled_jit intrinsic
        acc = carray(acc_p, size)  # noqa: F821 - numba.carray
        for i in range(size):
            acc[i] = np.float32(0.0)
        fma_tile(acc_p, npos, width, 1, xp, x0, wp, w0, ic_n, cstride, taps, 0)  # noqa: F821
        if epi & 1:
            for p in range(npos):
                for j in range(width):
                    acc[p * width + j] += bias[oc0 + j]
        if epi & 2:
            for p in range(npos):
                for h in range(width // CB):
                    for c in range(CB):
                        acc[p * width + h * CB + c] += z[np.uintp(o + p * CB + h * ohw8 + c)]
        if epi & 4:
            for i in range(size):
                a = acc[i]
                acc[i] = np.float32(0.0) if a < 0 else a  # not max(): NaN stays NaN
        if epi & 8:
            for i in range(size):
                acc[i] = _hswish(acc[i])  # noqa: F821 - compiled in _compiled
        for p in range(npos):
            for h in range(width // CB):
                for c in range(CB):
                    out[np.uintp(o + p * CB + h * ohw8 + c)] = acc[p * width + h * CB + c]

    return tile


def _pack_band_py(x, xp, dims, conv, n, r0, hq, wq):
    # pragma: no cover - compiled
    # the phase planes of sample n's band starting at output row r0: plane (ic, rho, phi)
    # holds source value x[n, ic, SH (r0 + r) + rho - PH, SW k + phi - PW] at (r, k), zero
    # outside the source; rows of a plane are wq positions, a plane hq rows
    ic_n, h_, w_ = dims[1], dims[2], dims[3]
    sh, sw, ph, pw = conv[0], conv[1], conv[2], conv[3]
    phase = hq * wq
    for ic in range(ic_n):
        for rho in range(sh):
            for phi in range(sw):
                base = ((ic * sh + rho) * sw + phi) * phase
                # the columns k with SW k + phi - PW in [0, W)
                k0 = min(wq, max(0, (pw - phi + sw - 1) // sw))
                k1 = min(wq, max(k0, (w_ - 1 + pw - phi) // sw + 1))
                for r in range(hq):
                    d = base + r * wq
                    sr = sh * (r0 + r) + rho - ph
                    if sr < 0 or sr >= h_:
                        for k in range(wq):
                            xp[np.uintp(d + k)] = np.float32(0.0)
                        continue
                    for k in range(k0):
                        xp[np.uintp(d + k)] = np.float32(0.0)
                    for k in range(k1, wq):
                        xp[np.uintp(d + k)] = np.float32(0.0)
                    s = ((n * ic_n + ic) * h_ + sr) * w_ + phi - pw
                    if sw == 1:
                        for k in range(k0, k1):
                            xp[np.uintp(d + k)] = x[np.uintp(s + k)]
                    elif sw == 2:  # a constant stride: the compiler vectorizes the copy
                        for k in range(k0, k1):
                            xp[np.uintp(d + k)] = x[np.uintp(s + 2 * k)]
                    else:
                        for k in range(k0, k1):
                            xp[np.uintp(d + k)] = x[np.uintp(s + sw * k)]


def _hybrid88_py(x, wp, out, z, bias, xp, taps, dims, conv, epi, u0, u1):
    # pragma: no cover - compiled
    """Units [u0, u1) of the flat C-contiguous NCHW88 ``out`` (N, OC/8, OH, OW, 8) = the
    convolution of the flat C-contiguous NCHW ``x`` (N, IC, H, W) with the packed ``wp``
    (OC/16 blocks of (IC, FH, FW, 16), then, for OC % 16 == 8, one of (IC, FH, FW, 8)),
    then the epilogue (epi bits: 1 + bias, 2 + z, 4 ReLU, 8 H_SWISH).

    dims: N, IC, H, W, OC8 (blocks of 8 output channels), OH, OW, ROWS (output rows of a
    unit), BANDS (units per sample), HQ, WQ (a band's phase planes); conv: SH, SW, PH, PW;
    ``taps`` the plane offsets of the filter taps (:func:`tap_offsets`). A row's tiles of P
    positions (2 P for the block of 8) end with one ending at the row's end (it recomputes
    a few positions of the one before it, the same sums: the output never takes z's
    memory); rows shorter than that go P or one position at a time."""
    ic_n, oc8, oh, ow = dims[1], dims[4], dims[5], dims[6]
    rows, bands, hq, wq = dims[7], dims[8], dims[9], dims[10]
    sh, sw = conv[0], conv[1]
    cstride = sh * sw * hq * wq
    ohw8 = oh * ow * CB
    wblock = ic_n * taps.size  # a block's filter values per output channel
    for u in range(u0, u1):
        n = u // bands
        r0 = (u % bands) * rows
        r1 = min(oh, r0 + rows)
        _pack_band(x, xp, dims, conv, n, r0, hq, wq)
        for ob in range((oc8 + 1) // 2):
            narrow = 2 * ob + 1 == oc8  # the block of 8 after the blocks of 16
            oc0 = ob * OB
            w0 = oc0 * wblock
            for i in range(r0, r1):
                q = (i - r0) * wq
                o = ((n * oc8 + 2 * ob) * oh + i) * ow * CB
                if narrow and ow >= 2 * P:  # as many accumulators as a tile of 16
                    j = 0
                    while True:
                        jj = min(j, ow - 2 * P)
                        _tile8w(xp, q + jj, wp, w0, ic_n, cstride, taps, out, o + jj * CB,
                                ohw8, z, bias, oc0, epi)  # fmt: skip
                        if jj == ow - 2 * P:
                            break
                        j += 2 * P
                elif ow >= P:
                    j = 0
                    while True:
                        jj = min(j, ow - P)
                        if narrow:
                            _tile8(xp, q + jj, wp, w0, ic_n, cstride, taps, out, o + jj * CB,
                                   ohw8, z, bias, oc0, epi)  # fmt: skip
                        else:
                            _tile16(xp, q + jj, wp, w0, ic_n, cstride, taps, out, o + jj * CB,
                                    ohw8, z, bias, oc0, epi)  # fmt: skip
                        if jj == ow - P:
                            break
                        j += P
                else:
                    for j in range(ow):
                        if narrow:
                            _one8(xp, q + j, wp, w0, ic_n, cstride, taps, out, o + j * CB,
                                  ohw8, z, bias, oc0, epi)  # fmt: skip
                        else:
                            _one16(xp, q + j, wp, w0, ic_n, cstride, taps, out, o + j * CB,
                                   ohw8, z, bias, oc0, epi)  # fmt: skip


def band_planes(rows: int, w: int, fshape, stride, pad, dilate) -> tuple[int, int]:
    """``(HQ, WQ)``: the rows and columns of the phase planes of a band of ``rows`` output
    rows, for a source ``w`` positions wide."""
    hq = rows + (fshape[0] - 1) * dilate[0] // stride[0]
    wq = -(-(w + 2 * pad[1]) // stride[1])
    return hq, wq


def scratch_size(ic: int, hq: int, wq: int, stride) -> int:
    """The float32 values of a unit's phase planes (``xp``)."""
    return ic * stride[0] * stride[1] * hq * wq


def tap_offsets(hq: int, wq: int, fshape, stride, dilate) -> np.ndarray:
    """The plane offsets (positions) of the filter taps, row-major: tap ``(a, b)`` reads
    phase ``(a DH % SH, b DW % SW)`` ``a DH // SH`` rows and ``b DW // SW`` columns on."""
    (sh, sw), (dh, dw) = stride, dilate
    phase = hq * wq
    return np.array([((a * dh % sh) * sw + b * dw % sw) * phase + a * dh // sh * wq
                     + b * dw // sw for a in range(fshape[0]) for b in range(fshape[1])],
                    np.int64)  # fmt: skip


def hybrid88(x, wp, out, z, bias, xp, taps, dims, conv, epi: int, u0: int, u1: int) -> None:
    """Units [u0, u1) of the hybrid NCHW88 convolution (:func:`_hybrid88_py`): ``x``,
    ``wp``, ``z`` read-only flat float32 vectors, ``bias`` a read-only float32 vector (any
    stride), ``out`` and the scratch ``xp`` (:func:`scratch_size` values) writable flat
    ones."""
    _compiled()(x, wp, out, z, bias, xp, taps, dims, conv, int(epi), int(u0), int(u1))


@functools.cache
def _compiled():
    global stack_tile, carray, fma_tile, _hswish, _tile16, _tile8, _tile8w, _one16, _one8, P
    global _pack_band
    stack_tile, carray, fma_tile = tiled_jit.stack_tile(), _carray, tiled_jit.fma_tile()
    P = tiled_jit.tile_positions()
    compile_tiled = tiled_jit.compile_tiled
    f1, i8, ints = t.float32[::1], t.int64, t.int64[::1]
    fr = t.Array(t.float32, 1, "C", readonly=True)
    b1 = t.Array(t.float32, 1, "A", readonly=True)
    _hswish = compile_tiled(_hswish_py, [t.float32(t.float32)], inline="always")
    sig = [t.void(f1, i8, fr, i8, i8, i8, ints, f1, i8, i8, fr, b1, i8, i8)]
    _tile16 = compile_tiled(_tile_py(P, OB), sig)
    _tile8 = compile_tiled(_tile_py(P, CB), sig)
    _tile8w = compile_tiled(_tile_py(2 * P, CB), sig)
    _one16 = compile_tiled(_tile_py(1, OB), sig)
    _one8 = compile_tiled(_tile_py(1, CB), sig)
    _pack_band = compile_tiled(_pack_band_py, [t.void(fr, f1, ints, ints, i8, i8, i8, i8)])
    return compile_tiled(_hybrid88_py, [t.void(fr, fr, f1, fr, b1, f1, ints, ints, ints, i8, i8,
                                               i8)])  # fmt: skip


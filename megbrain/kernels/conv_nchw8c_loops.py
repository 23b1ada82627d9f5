"""Compiled (Numba) loops of the direct NCHW8c convolution (:mod:`conv_nchw8c`): the input
and filter packing and the register-tiled convolution of a range of work units.

Layouts (float32, flat C-contiguous buffers):

- packed input: per sample and block of 8 input channels, a zero-padded plane of
  ``HP x WP`` positions of 8 values (the channels innermost), then :data:`SLACK` positions.
  Row ``r`` of a plane holds ``GAP = WP - W`` zeros, then the ``W`` source values of source
  row ``r - PT`` (rows outside the source are zeros). Output position ``(i, j)`` is plane
  position ``q = i WP + j``, and its filter tap ``(a, b)`` reads position
  ``q + a DH WP + b DW + GAP - PL``: a tap left or right of the source lands in a row's gap,
  so one tile of :data:`P` consecutive positions needs no bounds tests (positions with
  ``j >= OW`` are computed and dropped);
- packed filter: ``(G, OCg / 16, ICg / 8, FH, FW, 8, 16)``, the 16 output channels of a
  block innermost (two vectors);
- a unit: sample, group, block of 16 output channels and a band of output rows. Its tiles'
  accumulators go to a per-thread row buffer (position-major) and from there, transposed,
  to the NCHW output rows.

Each tile is :data:`P` positions by 16 output channels: per input channel and tap, two
vector loads of the filter, six broadcasts of the input and twelve fused multiply-adds, the
accumulators in registers (:mod:`megbrain.kernels.tiled_jit`). Every sum runs over input
channel blocks, filter rows, filter columns and the 8 channels of a block in that order:
the result does not depend on the thread split (reproducible).
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["OB", "CB", "P", "SLACK", "conv_units", "pack_filter", "pack_input", "readonly_view"]

#: output channels of a tile (two 8-float vectors)
OB = 16
#: input channels of a packed block
CB = 8
#: output positions of a tile
P = 6
#: positions after the last plane, read by the last tiles of a sample (dropped outputs)
SLACK = 64
_TILE = P * OB

stack_tile = None  # the tiled_jit intrinsic, bound by _compiled() before compiling


def _tile_py(xp, x0, wp, w0, cbn, fh, fw, row_step, col_step, plane, rb, r0):
    # pragma: no cover - compiled
    acc = carray(stack_tile(_TILE, np.float32), _TILE)  # noqa: F821 - numba.carray
    for i in range(_TILE):
        acc[i] = 0.0
    wi = w0
    for cb in range(cbn):
        for a in range(fh):
            for b in range(fw):
                xb = x0 + cb * plane + a * row_step + b * col_step
                for ic in range(CB):
                    for pos in range(P):
                        v = xp[np.uintp(xb + pos * CB + ic)]
                        for j in range(OB):
                            acc[pos * OB + j] += v * wp[np.uintp(wi + j)]
                    wi += OB
    for i in range(_TILE):
        rb[np.uintp(r0 + i)] = acc[i]


def _conv_units_py(xp, wp, out, rb, geom, u0, u1):
    # pragma: no cover - compiled
    # geom: G, OCB (blocks per group), ICB, FH, FW, DH, DW, HP, WP, OH, OW, SHIFT, ROWS
    g_, ocb_n, icb_n, fh, fw, dh, dw, hp, wpd, oh_n, ow_n, shift, rows = (
        geom[0], geom[1], geom[2], geom[3], geom[4], geom[5], geom[6], geom[7], geom[8],
        geom[9], geom[10], geom[11], geom[12],
    )  # fmt: skip
    plane = (hp * wpd) * CB
    sample = g_ * icb_n * plane + SLACK * CB
    wsz = icb_n * fh * fw * CB * OB
    ohw = oh_n * ow_n
    nblk = (oh_n + rows - 1) // rows
    for u in range(u0, u1):
        blk = u % nblk
        rest = u // nblk
        ocb = rest % ocb_n
        rest //= ocb_n
        g = rest % g_
        n = rest // g_
        h0 = blk * rows
        h1 = min(oh_n, h0 + rows)
        q0 = h0 * wpd
        q1 = (h1 - 1) * wpd + ow_n
        x0 = n * sample + g * icb_n * plane + shift * CB
        w0 = (g * ocb_n + ocb) * wsz
        for q in range(q0, q1, P):
            _tile(xp, x0 + q * CB, wp, w0, icb_n, fh, fw, dh * wpd * CB, dw * CB, plane, rb,
                  (q - q0) * OB)  # fmt: skip
        oc0 = (g * ocb_n + ocb) * OB
        for j in range(OB):
            ob = ((n * g_ * ocb_n) * OB + oc0 + j) * ohw
            for i in range(h0, h1):
                rq = (i * wpd - q0) * OB + j
                d = ob + i * ow_n
                for k in range(ow_n):
                    out[np.uintp(d + k)] = rb[np.uintp(rq + k * OB)]


def _pack_input_py(x, xp, pt, gap, hp, wpd, b0, b1):
    # pragma: no cover - compiled
    # blocks [b0, b1) of (sample, channel block); x (N, C, H, W) any strides
    c_, h_, w_ = x.shape[1], x.shape[2], x.shape[3]
    cbs = c_ // CB
    plane = hp * wpd * CB
    sample = cbs * plane + SLACK * CB
    for blk in range(b0, b1):
        n = blk // cbs
        cb = blk % cbs
        base = n * sample + cb * plane
        for r in range(hp):
            d = base + r * wpd * CB
            src = r - pt
            if src < 0 or src >= h_:
                for t in range(wpd * CB):
                    xp[np.uintp(d + t)] = 0.0
                continue
            for t in range(gap * CB):
                xp[np.uintp(d + t)] = 0.0
            d += gap * CB
            for k in range(w_):
                for ic in range(CB):
                    xp[np.uintp(d + k * CB + ic)] = x[n, cb * CB + ic, src, k]
        if cb == cbs - 1:
            tail = n * sample + cbs * plane
            for t in range(SLACK * CB):
                xp[np.uintp(tail + t)] = 0.0


def _pack_filter_py(w, wp, flip):
    # pragma: no cover - compiled
    # w (G, OCg, ICg, FH, FW) any strides -> wp (G, OCg/16, ICg/8, FH, FW, 8, 16)
    g_, ocg, icg, fh, fw = w.shape[0], w.shape[1], w.shape[2], w.shape[3], w.shape[4]
    i = 0
    for g in range(g_):
        for ocb in range(ocg // OB):
            for cb in range(icg // CB):
                for a in range(fh):
                    for b in range(fw):
                        sa = fh - 1 - a if flip else a
                        sb = fw - 1 - b if flip else b
                        for ic in range(CB):
                            for j in range(OB):
                                wp[np.uintp(i)] = w[g, ocb * OB + j, cb * CB + ic, sa, sb]
                                i += 1


_tile = None  # the compiled tile, bound by _compiled() before compiling _conv_units_py


@functools.cache
def _compiled() -> dict:
    # numba is imported on first use: ``import megbrain`` stays free of its import time
    global stack_tile, _tile, carray
    from numba import carray as _carray
    from numba import types as t

    from .tiled_jit import compile_tiled
    from .tiled_jit import stack_tile as _stack_tile

    stack_tile, carray = _stack_tile(), _carray
    f1, i8 = t.float32[::1], t.int64
    _tile = compile_tiled(_tile_py, [t.void(f1, i8, f1, i8, i8, i8, i8, i8, i8, i8, f1, i8)])
    units = compile_tiled(_conv_units_py, [t.void(f1, f1, f1, f1, t.int64[::1], i8, i8)])
    # the sources are typed read-only (readonly_view): one signature fits every operand
    x4 = t.Array(t.float32, 4, "A", readonly=True)
    w5 = t.Array(t.float32, 5, "A", readonly=True)
    pack_in = compile_tiled(_pack_input_py, [t.void(x4, f1, i8, i8, i8, i8, i8, i8)])
    pack_w = compile_tiled(_pack_filter_py, [t.void(w5, f1, t.boolean)])
    return {"units": units, "pack_input": pack_in, "pack_filter": pack_w}


def conv_units(xp, wp, out, rb, geom, u0: int, u1: int) -> None:
    """Units ``[u0, u1)`` of the convolution into the flat NCHW ``out``; ``rb`` a row buffer
    of at least ``(ROWS WP + P) 16`` values; ``geom`` the int64 array of the units' geometry
    (see the source)."""
    _compiled()["units"](xp, wp, out, rb, geom, u0, u1)


def readonly_view(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a`` (the type the packing loops are compiled for: Numba types
    read-only and writable arrays apart, and a writable one matched both signatures)."""
    view = a.view()
    view.flags.writeable = False
    return view


def pack_input(x, xp, pt: int, gap: int, hp: int, wpd: int, b0: int, b1: int) -> None:
    """Blocks ``[b0, b1)`` (sample, 8 channels) of the float32 ``(N, C, H, W)`` source
    (a :func:`readonly_view`) into the packed input ``xp`` (every value of those planes
    written, borders and gaps zero)."""
    _compiled()["pack_input"](x, xp, pt, gap, hp, wpd, b0, b1)


def pack_filter(w, wp, flip: bool) -> None:
    """The float32 ``(G, OCg, ICg, FH, FW)`` filter (a :func:`readonly_view`) into the
    packed ``wp``, flipped spatially when ``flip`` (CONVOLUTION mode)."""
    _compiled()["pack_filter"](w, wp, bool(flip))

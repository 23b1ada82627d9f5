"""Compiled (Numba) loops of the quantized (8-bit) convolution of :mod:`..quantized`: an
im2col of the zero-point-shifted source into int16 columns and an integer GEMM accumulating
the products exactly in int32, as MegDNN's kernels do (no float emulation).

Every loop is single-threaded and GIL-free (``nogil``) and takes a ``[begin, end)`` range of
its outermost items, so that a caller may split one call over a few Python threads. The loops
are compiled on first use and allocate nothing.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

__all__ = ["gemm_blocks", "int8_gemm", "int8_im2col"]

#: output positions per GEMM block: a block of the columns and the int32 rows stays in cache
_BLOCK = 512


def _im2col_py(x, col, n, fh, fw, sh, sw, ph, pw, dh, dw, ow, zx, g0, g1):  # pragma: no cover
    """Columns of sample ``n`` for the groups [g0, g1): ``col[g, (i, a, b), r * OW + q]`` =
    ``x[n, g * I + i, r sh - ph + a dh, q sw - pw + b dw] - zx``, 0 outside the image."""
    k_, p_ = col.shape[1], col.shape[2]
    i_ = k_ // (fh * fw)
    h, w = x.shape[2], x.shape[3]
    oh = p_ // ow
    for g in range(g0, g1):
        for i in range(i_):
            c = g * i_ + i
            for a in range(fh):
                for b in range(fw):
                    row = col[g, (i * fh + a) * fw + b]
                    for r in range(oh):
                        ih = r * sh - ph + a * dh
                        base = r * ow
                        if ih < 0 or ih >= h:
                            for q in range(ow):
                                row[base + q] = 0
                            continue
                        xr = x[n, c, ih]
                        for q in range(ow):
                            iw = q * sw - pw + b * dw
                            if iw < 0 or iw >= w:
                                row[base + q] = 0
                            else:
                                row[base + q] = np.int16(xr[iw]) - zx


def _gemm_py(col, w, y, n, t0, t1):  # pragma: no cover - compiled
    """Row blocks t in [t0, t1) of sample ``n`` (block t = g * ceil(O / 4) + j holds the
    output channels o = 4 j ... 4 j + 3 of group g): ``y[n, g * O + o, p] = sum_k w[g, o, k]
    * col[g, k, p]``, exact in int32 (y is (N, G*O, P) int32, w (G, O, K) int16).

    Four rows share each load of the columns, two k at a time: eight multiply-adds for two
    column loads and four row loads and stores, where one row at a time does one."""
    k_, p_ = col.shape[1], col.shape[2]
    o_ = w.shape[1]
    ob = (o_ + 3) // 4
    for t in range(t0, t1):
        g, o0 = t // ob, (t % ob) * 4
        rows = min(4, o_ - o0)
        base = g * o_ + o0
        for pb in range(0, p_, _BLOCK):
            pe = min(pb + _BLOCK, p_)
            for r in range(rows):
                yr = y[n, base + r]
                for p in range(pb, pe):
                    yr[p] = 0
            if rows == 4:
                y0, y1, y2, y3 = y[n, base], y[n, base + 1], y[n, base + 2], y[n, base + 3]
                k = 0
                while k + 2 <= k_:
                    ca, cb = col[g, k], col[g, k + 1]
                    a0, a1 = np.int32(w[g, o0, k]), np.int32(w[g, o0 + 1, k])
                    a2, a3 = np.int32(w[g, o0 + 2, k]), np.int32(w[g, o0 + 3, k])
                    b0, b1 = np.int32(w[g, o0, k + 1]), np.int32(w[g, o0 + 1, k + 1])
                    b2, b3 = np.int32(w[g, o0 + 2, k + 1]), np.int32(w[g, o0 + 3, k + 1])
                    for p in range(pb, pe):
                        va, vb = np.int32(ca[p]), np.int32(cb[p])
                        y0[p] += a0 * va + b0 * vb
                        y1[p] += a1 * va + b1 * vb
                        y2[p] += a2 * va + b2 * vb
                        y3[p] += a3 * va + b3 * vb
                    k += 2
                if k < k_:
                    ca = col[g, k]
                    a0, a1 = np.int32(w[g, o0, k]), np.int32(w[g, o0 + 1, k])
                    a2, a3 = np.int32(w[g, o0 + 2, k]), np.int32(w[g, o0 + 3, k])
                    for p in range(pb, pe):
                        va = np.int32(ca[p])
                        y0[p] += a0 * va
                        y1[p] += a1 * va
                        y2[p] += a2 * va
                        y3[p] += a3 * va
                continue
            for r in range(rows):
                yr = y[n, base + r]
                wr = w[g, o0 + r]
                for k in range(k_):
                    wv = np.int32(wr[k])
                    cr = col[g, k]
                    for p in range(pb, pe):
                        yr[p] += wv * np.int32(cr[p])


def int8_im2col(x, col, n, fsize, stride, pad, dilate, ow: int, zx: int, g0: int, g1: int):
    """Groups [g0, g1) of sample ``n``'s int16 columns ``col`` (G, I*FH*FW, OH*OW) of the
    8-bit ``x`` (N, G*I, H, W), its zero point ``zx`` subtracted."""
    _compiled("im2col")(x, col, int(n), int(fsize[0]), int(fsize[1]), int(stride[0]),
                        int(stride[1]), int(pad[0]), int(pad[1]), int(dilate[0]),
                        int(dilate[1]), int(ow), np.int16(zx), int(g0), int(g1))  # fmt: skip


def int8_gemm(col, w, y, n: int, t0: int, t1: int) -> None:
    """Row blocks [t0, t1) (of four output channels each, :func:`gemm_blocks` in all) of
    sample ``n`` of the int32 ``y`` (N, G*O, P): the int16 weights ``w`` (G, O, K) times the
    columns ``col`` (G, K, P), exact in int32."""
    _compiled("gemm")(col, w, y, int(n), int(t0), int(t1))


def gemm_blocks(groups: int, out_channels: int) -> int:
    """The number of row blocks :func:`int8_gemm` takes for G groups of O output channels."""
    return groups * -(-out_channels // 4)


@functools.cache
def _compiled(name: str):
    fn = {"im2col": _im2col_py, "gemm": _gemm_py}[name]
    return njit(nogil=True, cache=True, error_model="numpy", fastmath=False)(fn)

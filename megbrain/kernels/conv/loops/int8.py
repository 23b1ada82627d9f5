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

__all__ = ["int8_gemm", "int8_im2col"]

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
    """Rows t = g * O + o in [t0, t1) of sample ``n``: ``y[n, t, p] = sum_k w[g, o, k] *
    col[g, k, p]``, exact in int32 (y is (N, G*O, P) int32, w (G, O, K) int16)."""
    k_, p_ = col.shape[1], col.shape[2]
    o_ = w.shape[1]
    for t in range(t0, t1):
        g, o = t // o_, t % o_
        yr = y[n, t]
        wr = w[g, o]
        for pb in range(0, p_, _BLOCK):
            pe = min(pb + _BLOCK, p_)
            for p in range(pb, pe):
                yr[p] = 0
            for k in range(k_):
                wv = np.int32(wr[k])
                if wv == 0:
                    continue
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
    """Rows [t0, t1) (t = g * O + o) of sample ``n`` of the int32 ``y`` (N, G*O, P): the
    int16 weights ``w`` (G, O, K) times the columns ``col`` (G, K, P), exact in int32."""
    _compiled("gemm")(col, w, y, int(n), int(t0), int(t1))


@functools.cache
def _compiled(name: str):
    fn = {"im2col": _im2col_py, "gemm": _gemm_py}[name]
    return njit(nogil=True, cache=True, error_model="numpy", fastmath=False)(fn)

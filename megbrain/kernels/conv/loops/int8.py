"""Compiled (Numba) loops of the quantized (8-bit) convolution of :mod:`..quantized`: an
im2col of the zero-point-shifted source into one row per output position (int8 when no zero
point shifts the values, else int16) and an integer GEMM of dot products accumulating the
products exactly in int32, as MegDNN's kernels do (no float emulation).

Every loop is single-threaded and GIL-free (``nogil``) and takes a ``[begin, end)`` range of
its outermost items, so that a caller may split one call over a few Python threads. The loops
are compiled on first use and allocate nothing.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

__all__ = ["gemm_blocks", "int8_gemm", "int8_im2col"]

#: output positions filled together by the im2col (their rows stay in the L1 cache)
_ROWS = 32

def _im2col_py(x, col, n, fh, fw, sh, sw, ph, pw, dh, dw, ow, zx, g0, g1):  # pragma: no cover
    """Rows of sample ``n`` for the groups [g0, g1): ``col[g, r * OW + q, (i, a, b)]`` =
    ``x[n, g * I + i, r sh - ph + a dh, q sw - pw + b dw] - zx``, 0 outside the image (each
    output position's window is one contiguous row, the operand of the GEMM's dots).

    Blocks of :data:`_ROWS` positions are filled one (i, a, b) column at a time: the source
    is read along its rows and the block's rows stay in cache while they are written
    across."""
    p_, k_ = col.shape[1], col.shape[2]
    i_ = k_ // (fh * fw)
    h, w = x.shape[2], x.shape[3]
    for g in range(g0, g1):
        for p0 in range(0, p_, _ROWS):
            p1 = min(p0 + _ROWS, p_)
            for i in range(i_):
                plane = x[n, g * i_ + i]
                for a in range(fh):
                    for b in range(fw):
                        k = (i * fh + a) * fw + b
                        r, q = p0 // ow, p0 % ow
                        for p in range(p0, p1):
                            ih = r * sh - ph + a * dh
                            iw = q * sw - pw + b * dw
                            if ih < 0 or ih >= h or iw < 0 or iw >= w:
                                col[g, p, k] = 0
                            else:
                                col[g, p, k] = plane[ih, iw] - zx
                            q += 1
                            if q == ow:
                                q = 0
                                r += 1


def _gemm_py(col, w, y, n, t0, t1):  # pragma: no cover - compiled
    """Row blocks t in [t0, t1) of sample ``n`` (block t = g * ceil(O / 4) + j holds the
    output channels o = 4 j ... 4 j + 3 of group g): ``y[n, g * O + o, p] = sum_k w[g, o, k]
    * col[g, p, k]``, exact in int32 (y is (N, G*O, P) int32; w (G, O, K) and col (G, P, K)
    8- or 16-bit).

    Each output is a dot product over the contiguous K values of a window, which LLVM turns
    into widening multiply-adds (``vpmaddwd``); four output channels share each window's
    loads."""
    p_, k_ = col.shape[1], col.shape[2]
    o_ = w.shape[1]
    ob = (o_ + 3) // 4
    for t in range(t0, t1):
        g, o0 = t // ob, (t % ob) * 4
        rows = min(4, o_ - o0)
        base = g * o_ + o0
        if rows == 4:
            w0, w1, w2, w3 = w[g, o0], w[g, o0 + 1], w[g, o0 + 2], w[g, o0 + 3]
            for p in range(p_):
                c = col[g, p]
                s0 = np.int32(0)
                s1 = np.int32(0)
                s2 = np.int32(0)
                s3 = np.int32(0)
                for k in range(k_):
                    v = np.int32(c[k])
                    s0 += np.int32(w0[k]) * v
                    s1 += np.int32(w1[k]) * v
                    s2 += np.int32(w2[k]) * v
                    s3 += np.int32(w3[k]) * v
                y[n, base, p] = s0
                y[n, base + 1, p] = s1
                y[n, base + 2, p] = s2
                y[n, base + 3, p] = s3
            continue
        for r in range(rows):
            wr = w[g, o0 + r]
            for p in range(p_):
                c = col[g, p]
                s = np.int32(0)
                for k in range(k_):
                    s += np.int32(wr[k]) * np.int32(c[k])
                y[n, base + r, p] = s


def int8_im2col(x, col, n, fsize, stride, pad, dilate, ow: int, zx: int, g0: int, g1: int):
    """Groups [g0, g1) of sample ``n``'s window rows ``col`` (G, OH*OW, I*FH*FW), int8 or
    int16, of the 8-bit ``x`` (N, G*I, H, W), its zero point ``zx`` subtracted."""
    _compiled("im2col")(x, col, int(n), int(fsize[0]), int(fsize[1]), int(stride[0]),
                        int(stride[1]), int(pad[0]), int(pad[1]), int(dilate[0]),
                        int(dilate[1]), int(ow), col.dtype.type(zx), int(g0), int(g1))  # fmt: skip


def int8_gemm(col, w, y, n: int, t0: int, t1: int) -> None:
    """Row blocks [t0, t1) (of four output channels each, :func:`gemm_blocks` in all) of
    sample ``n`` of the int32 ``y`` (N, G*O, P): the weights ``w`` (G, O, K) times the
    window rows ``col`` (G, P, K) (both int8 or both int16), exact in int32."""
    _compiled("gemm")(col, w, y, int(n), int(t0), int(t1))


def gemm_blocks(groups: int, out_channels: int) -> int:
    """The number of row blocks :func:`int8_gemm` takes for G groups of O output channels."""
    return groups * -(-out_channels // 4)


@functools.cache
def _compiled(name: str):
    fn = {"im2col": _im2col_py, "gemm": _gemm_py}[name]
    return njit(nogil=True, cache=True, error_model="numpy", fastmath=False)(fn)

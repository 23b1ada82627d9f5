"""Compiled (Numba) loops of the GEMM convolutions: 2-d im2col and col2im over a batch chunk.

The column matrix of a chunk of samples ``[n0, n1)`` of a 2-d convolution is the C-contiguous
``(C * FH * FW, k * OH * OW)`` matrix (``k = n1 - n0``) whose row ``(c * FH + a) * FW + b`` holds,
sample after sample, the ``OH * OW`` source values ``x[n, c, i * sh - ph + a * dh,
j * sw - pw + b * dw]`` (zero outside the source): the batch-inner layout of
:mod:`megbrain.kernels.conv.im2col`, so that one GEMM ``W (OC, C FH FW) @ cols`` covers the chunk
(and, with G groups, the rows of group g are the block ``[g K / G, (g + 1) K / G)``).

The loops are single-threaded and GIL-free (``nogil``) and take a ``[r0, r1)`` range of rows
(im2col) or channels (col2im), so that a caller splits one call over a few Python threads with
:func:`megbrain.kernels.parallel.split`; disjoint ranges write disjoint memory. They index flat
views with unsigned offsets: a signed, computed index makes Numba test it for wrap-around,
which kept LLVM from vectorizing the row copies (im2col of 128x16x14x14, 3x3: 6.4 -> 1.5 ms on
one core; NumPy's strided copy of the same columns took 3.7 ms). Padding is written as zeros
by the loops themselves, so no padded copy of the source is needed. At stride 1 with the output
as wide as the source (3x3 padding 1, 1x1), im2col copies each sample's rows of one filter
offset as a single run and zeroes the padding between rows after it: short rows cost their
loop overhead each (one core, batch 32, 3x3: 256x8x8 6.7 -> 4.6 ms, 512x4x4 4.9 -> 2.9). The
loops are compiled on first use; no loop allocates.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

__all__ = ["col2im", "im2col"]


# Each loop computes, per filter offset, the outputs [lo, hi) whose source index o * step + off
# lies in [0, size) (inlined by hand: a compiled helper function was not inlined and cost 2x).
def _im2col_py(x, cols, n0, n1, sh, sw, ph, pw, dh, dw, fh_, fw_, i0, i1, r0, r1, rb, ncol):
    # pragma: no cover - compiled
    # ``cols``: 2-d C-contiguous, or flat; row r - rb at ``(r - rb) * ncol`` (its row stride).
    # (The output size is computed here: a 20th argument's tuple is past CPython's free
    # lists, so each call would allocate it.)
    c_, h_, w_ = x.shape[1], x.shape[2], x.shape[3]
    oh_ = (h_ + 2 * ph - dh * (fh_ - 1) - 1) // sh + 1
    ow_ = (w_ + 2 * pw - dw * (fw_ - 1) - 1) // sw + 1
    ll = (i1 - i0) * ow_  # the output rows [i0, i1) of each sample
    xf = x.reshape(-1)
    cf = cols.reshape(-1)
    for r in range(r0, r1):
        c = r // (fh_ * fw_)
        a = (r // fw_) % fh_
        b = r % fw_
        off = b * dw - pw
        jlo = min(ow_, (-off + sw - 1) // sw) if off < 0 else 0
        jhi = max(jlo, min(ow_, (w_ - off - 1) // sw + 1)) if w_ > off else jlo
        offh = a * dh - ph
        ilo = min(oh_, (-offh + sh - 1) // sh) if offh < 0 else 0
        ihi = max(ilo, min(oh_, (h_ - offh - 1) // sh + 1)) if h_ > offh else ilo
        ilo = min(max(ilo, i0), i1)
        ihi = max(ilo, min(ihi, i1))
        m = jhi - jlo
        if sh == 1 and sw == 1 and w_ == ow_ and ihi > ilo and m > 0:
            # stride 1, same width: output position t = i * ow + j reads source t + shift, so
            # the rows [ilo, ihi) are one run (long copies even for 4- and 8-wide planes); the
            # run's wrapped entries (the padding between two rows) are zeroed after it
            t0 = ilo * ow_ + jlo
            t1 = (ihi - 1) * ow_ + jhi
            for k in range(n1 - n0):
                plane = ((n0 + k) * c_ + c) * h_ * w_
                d0 = (r - rb) * ncol + k * ll - i0 * ow_
                for t in range(i0 * ow_, t0):
                    cf[np.uintp(d0 + t)] = 0.0
                ss = plane + offh * w_ + off + t0
                dd = d0 + t0
                for t in range(t1 - t0):
                    cf[np.uintp(dd + t)] = xf[np.uintp(ss + t)]
                for i in range(ilo, ihi - 1):
                    for t in range(i * ow_ + jhi, (i + 1) * ow_ + jlo):
                        cf[np.uintp(d0 + t)] = 0.0
                for t in range(t1, i1 * ow_):
                    cf[np.uintp(d0 + t)] = 0.0
            continue
        for k in range(n1 - n0):
            plane = ((n0 + k) * c_ + c) * h_ * w_
            d0 = (r - rb) * ncol + k * ll - i0 * ow_  # the column of output row i is d0 + i * ow_
            for t in range(i0 * ow_, ilo * ow_):
                cf[np.uintp(d0 + t)] = 0.0
            for i in range(ilo, ihi):
                s = plane + (i * sh + offh) * w_ + jlo * sw + off
                d = d0 + i * ow_
                for j in range(jlo):
                    cf[np.uintp(d + j)] = 0.0
                dd = d + jlo
                for j in range(m):
                    cf[np.uintp(dd + j)] = xf[np.uintp(s + j * sw)]
                for j in range(jhi, ow_):
                    cf[np.uintp(d + j)] = 0.0
            for t in range(ihi * ow_, i1 * ow_):
                cf[np.uintp(d0 + t)] = 0.0


def _col2im_py(cols, x, n0, n1, sh, sw, ph, pw, dh, dw, fh_, fw_, oh_, ow_, c0, c1, rb):
    # pragma: no cover - compiled
    c_, h_, w_ = x.shape[1], x.shape[2], x.shape[3]
    ll = oh_ * ow_
    xf = x.reshape(-1)
    cf = cols.reshape(-1)
    ncol = (n1 - n0) * ll
    hw = h_ * w_
    for c in range(c0, c1):
        for k in range(n1 - n0):
            plane = ((n0 + k) * c_ + c) * hw
            for t in range(hw):
                xf[np.uintp(plane + t)] = 0.0
        for a in range(fh_):
            offh = a * dh - ph
            ilo = min(oh_, (-offh + sh - 1) // sh) if offh < 0 else 0
            ihi = max(ilo, min(oh_, (h_ - offh - 1) // sh + 1)) if h_ > offh else ilo
            for b in range(fw_):
                off = b * dw - pw
                jlo = min(ow_, (-off + sw - 1) // sw) if off < 0 else 0
                jhi = max(jlo, min(ow_, (w_ - off - 1) // sw + 1)) if w_ > off else jlo
                m = jhi - jlo
                r = (c * fh_ + a) * fw_ + b
                for k in range(n1 - n0):
                    plane = ((n0 + k) * c_ + c) * hw
                    d0 = (r - rb) * ncol + k * ll
                    for i in range(ilo, ihi):
                        s = plane + (i * sh + offh) * w_ + jlo * sw + off
                        d = d0 + i * ow_ + jlo
                        for j in range(m):
                            xf[np.uintp(s + j * sw)] += cf[np.uintp(d + j)]


@functools.cache
def _compiled(name: str):
    fn = {"im2col": _im2col_py, "col2im": _col2im_py}[name]
    return njit(nogil=True, cache=True, error_model="numpy", fastmath=False)(fn)


def im2col(
    x: np.ndarray, cols: np.ndarray, n0: int, n1: int, stride: tuple[int, int],
    pad: tuple[int, int], dilate: tuple[int, int], fshape: tuple[int, int], r0: int, r1: int,
    out_rows: tuple[int, int] | None = None, row_base: int = 0, row_stride: int | None = None,
) -> None:  # fmt: skip
    """Rows ``[r0, r1)`` of the column matrix of samples ``[n0, n1)`` of a 2-d convolution
    (of their output rows ``out_rows`` only, when given), written ``row_base`` rows up.

    Parameters
    ----------
    x : numpy.ndarray
        The C-contiguous ``(N, C, H, W)`` source (float32 or float64), not padded.
    cols : numpy.ndarray
        The C-contiguous ``(C * FH * FW, (n1 - n0) * OH * OW)`` result, of ``x``'s dtype (or,
        with ``row_stride``, the flat buffer holding its rows that far apart); row
        ``(c * FH + a) * FW + b``, column ``k * OH * OW + i * OW + j`` receives
        ``x[n0 + k, c, i * sh - ph + a * dh, j * sw - pw + b * dw]``, or 0 outside ``x``
        (``OH, OW``: the convolution's output size).
    n0, n1 : int
        The batch chunk.
    stride, pad, dilate, fshape : tuple of int
        The convolution's geometry (two values each).
    r0, r1 : int
        The rows to write (disjoint ranges may run concurrently).
    out_rows : tuple of int, optional
        ``(i0, i1)``: only the output rows ``i0 <= i < i1`` of each sample, so that ``cols``
        is ``(C * FH * FW, (n1 - n0) * (i1 - i0) * OW)`` and column ``k * (i1 - i0) * OW +
        (i - i0) * OW + j`` holds output position (i, j) of sample n0 + k (a block of one
        large sample's columns that fits in the cache).
    row_base : int, optional
        Row ``r`` of the column matrix goes to row ``r - row_base`` of ``cols`` (``r0 >=
        row_base``), so that a buffer of ``r1 - row_base`` rows holds a band of the rows.
    row_stride : int, optional
        ``cols`` is a flat C-contiguous buffer whose rows start this many items apart (at
        least a row's columns): a padded row stride, made at bind time so that a run
        allocates nothing.
    """
    oh, ow = _out_shape(x, stride, pad, dilate, fshape)
    i0, i1 = (0, oh) if out_rows is None else (int(out_rows[0]), int(out_rows[1]))
    ld = cols.shape[1] if row_stride is None else int(row_stride)
    if (cols.ndim != 1) == (row_stride is not None) or ld < (n1 - n0) * (i1 - i0) * ow or (
            row_stride is not None and cols.size < (r1 - row_base) * ld):  # fmt: skip
        raise ValueError(f"im2col: cols {cols.shape}, row_stride {row_stride}: a 2-d matrix "
                         "of the columns, or a flat buffer of rows row_stride apart")  # fmt: skip
    _compiled("im2col")(x, cols, int(n0), int(n1), *_ints(stride, pad, dilate, fshape), i0,
                        i1, int(r0), int(r1), int(row_base), ld)  # fmt: skip


def col2im(
    cols: np.ndarray, x: np.ndarray, n0: int, n1: int, stride: tuple[int, int],
    pad: tuple[int, int], dilate: tuple[int, int], fshape: tuple[int, int], c0: int, c1: int,
    row_base: int = 0,
) -> None:  # fmt: skip
    """Channels ``[c0, c1)`` of samples ``[n0, n1)`` of ``x`` set to the sum of the column
    matrix ``cols`` scattered back (the adjoint of :func:`im2col`): each plane is zeroed, then
    every column value is added at the source position :func:`im2col` read it from; the
    column matrix's row ``r`` is row ``r - row_base`` of ``cols``.

    Parameters
    ----------
    cols : numpy.ndarray
        The C-contiguous ``(C * FH * FW, (n1 - n0) * OH * OW)`` columns (layout of
        :func:`im2col`).
    x : numpy.ndarray
        The C-contiguous ``(N, C, H, W)`` result, of ``cols``' dtype; only the planes of
        samples ``[n0, n1)`` and channels ``[c0, c1)`` are written.
    n0, n1, stride, pad, dilate, fshape
        As for :func:`im2col`.
    c0, c1 : int
        The channels to write (disjoint ranges may run concurrently).
    row_base : int, optional
        As for :func:`im2col`: ``cols`` may hold only the rows from ``row_base`` on (at
        most ``c0 * FH * FW``), a band of channels' columns.
    """
    oh, ow = _out_shape(x, stride, pad, dilate, fshape)
    _compiled("col2im")(cols, x, int(n0), int(n1), *_ints(stride, pad, dilate, fshape),
                        oh, ow, int(c0), int(c1), int(row_base))  # fmt: skip


def _ints(stride, pad, dilate, fshape) -> tuple[int, ...]:
    return (int(stride[0]), int(stride[1]), int(pad[0]), int(pad[1]), int(dilate[0]),
            int(dilate[1]), int(fshape[0]), int(fshape[1]))  # fmt: skip


def _out_shape(x, stride, pad, dilate, fshape) -> tuple[int, int]:
    return tuple(
        max(0, (s + 2 * p - d * (f - 1) - 1) // t + 1)
        for s, f, t, p, d in zip(x.shape[2:], fshape, stride, pad, dilate)
    )

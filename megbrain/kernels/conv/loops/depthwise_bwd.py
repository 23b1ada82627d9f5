"""Compiled (Numba) loops of the depthwise convolutions' backward passes of
:mod:`..depthwise_bwd`: the filter gradient and the data gradient of a 2-d convolution with one
input and one output channel per group, any stride, padding and dilation.

Single-threaded and GIL-free (``nogil``), over a ``[c0, c1)`` range of channels, so that a
caller splits one call over a few Python threads. No allocation: the scratch comes from the
caller. Every sum runs in a fixed order (reproducible). Compiled on first use.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

__all__ = ["SPAN", "filter_grad", "data_grad", "plane_shape"]


#: the positions of a tap's products a float32 sum takes before it goes into the float64 sum
SPAN = 256


def plane_shape(oshape, fshape, stride, dilate) -> tuple[int, int]:
    """The padded source plane the outputs read: ``(HP, WP)``."""
    (oh, ow), (fh, fw), (sh, sw), (dh, dw) = oshape, fshape, stride, dilate
    return (oh - 1) * sh + (fh - 1) * dh + 1, (ow - 1) * sw + (fw - 1) * dw + 1


def _spread_py(ds, dt, db, oh_, ow_, row_step, sw):
    # pragma: no cover - compiled
    """One (OH, OW) diff plane, at flat offset ``db`` of ``ds``, spread over ``dt`` where its
    outputs read the padded source plane: output (i, j) at ``i * row_step + j * sw``
    (``row_step = SH * WP``), zeros between, so that each tap is one pass over the plane."""
    for t in range(dt.size):
        dt[t] = 0.0
    for oh in range(oh_):
        for ow in range(ow_):
            dt[oh * row_step + ow * sw] = ds[db + oh * ow_ + ow]


#: compiled on its first call (from the loops below, which read it as a global when they compile)
_spread = njit(nogil=True, cache=True, error_model="numpy")(_spread_py)


def _filter_grad_py(src, diff, grad, plane, plane_d, acc, sh, sw, ph, pw, dh, dw, flip, c0, c1):
    # pragma: no cover - compiled
    """Channels [c0, c1) of ``grad`` (C, 1, 1, FH, FW) = sum over samples and output
    positions of ``diff`` (N, C, OH, OW) times the source ``src`` (N, C, H, W) the tap reads.

    ``plane`` and ``plane_d`` hold K zero-padded (HP, WP) planes one below the other
    (``(K * HP, WP)``, :func:`plane_shape`): per channel and chunk of K samples the sources
    are copied into ``plane`` and the diffs spread into ``plane_d`` where their outputs read
    it (output (i, j) of the chunk's sample q at ``(q * HP + i * SH) * WP + j * SW``, zeros
    between). Each tap's products over the chunk are then one contiguous run of positions,
    at any stride and however small the planes (the zeros between the samples' outputs
    cancel what a tap reads across a plane's edge): at stride 2 that multiplies 4x as many
    values, but a pass per 4- or 8-wide output row (strided, one slice each) ran 3-10x
    slower. The products are summed in float32 over spans of :data:`SPAN` positions
    (vectorized: LLVM may reassociate these sums, in an order fixed at compile time), each
    span's sum added into the float64 ``acc[(c - c0) * FH * FW + tap]``; a row of 3 taps is
    one pass (the diff read once for the three). The samples are the outer loop, the channels
    the inner: the planes are read in memory order (a channel's planes of successive samples,
    a whole image apart, each began with cache misses: 2x slower). Flat indices throughout."""
    n_, c_, h_, w_ = src.shape
    oh_, ow_ = diff.shape[2], diff.shape[3]
    fh, fw = grad.shape[3], grad.shape[4]
    wp = plane.shape[1]
    hp = (oh_ - 1) * sh + (fh - 1) * dh + 1
    k_ = plane.shape[0] // hp
    run = (oh_ - 1) * sh * wp + (ow_ - 1) * sw + 1
    xs = src.reshape(n_ * c_ * h_ * w_)
    ds = diff.reshape(n_ * c_ * oh_ * ow_)
    pl = plane.reshape(plane.size)
    dx_ = plane_d.reshape(plane_d.size)
    hh = min(h_, hp - ph)
    ww = min(w_, wp - pw)
    taps = fh * fw
    for k in range((c1 - c0) * taps):
        acc[k] = 0.0
    # samples outside, channels inside: consecutive planes of the source are read in turn
    for n0 in range(0, n_, k_):
        kn = min(k_, n_ - n0)
        n_pos = (kn - 1) * hp * wp + run
        for c in range(c0, c1):
            ab = (c - c0) * taps
            for t in range(kn * hp * wp):
                pl[t] = 0.0
                dx_[t] = 0.0
            for q in range(kn):
                xb = ((n0 + q) * c_ + c) * h_ * w_
                for i in range(hh):
                    pb = (q * hp + i + ph) * wp + pw
                    prow = pl[pb : pb + ww]
                    xrow = xs[xb + i * w_ : xb + i * w_ + ww]
                    for j in range(ww):
                        prow[j] = xrow[j]
                db = ((n0 + q) * c_ + c) * oh_ * ow_
                for i in range(oh_):
                    qb = (q * hp + i * sh) * wp
                    drow = ds[db + i * ow_ : db + (i + 1) * ow_]
                    if sw == 1:
                        trow = dx_[qb : qb + ow_]
                        for j in range(ow_):
                            trow[j] = drow[j]
                    else:
                        for j in range(ow_):
                            dx_[qb + j * sw] = drow[j]
            dt = dx_[:n_pos]
            for t0 in range(0, n_pos, SPAN):
                t1 = min(n_pos, t0 + SPAN)
                dsp = dt[t0:t1]
                for a in range(fh):
                    pb = a * dh * wp + t0
                    if fw == 3:
                        s0 = np.float32(0.0)
                        s1 = np.float32(0.0)
                        s2 = np.float32(0.0)
                        p0 = pl[pb : pb + t1 - t0]
                        p1 = pl[pb + dw : pb + dw + t1 - t0]
                        p2 = pl[pb + 2 * dw : pb + 2 * dw + t1 - t0]
                        for t in range(t1 - t0):
                            d = dsp[t]
                            s0 += d * p0[t]
                            s1 += d * p1[t]
                            s2 += d * p2[t]
                        acc[ab + a * 3] += float(s0)
                        acc[ab + a * 3 + 1] += float(s1)
                        acc[ab + a * 3 + 2] += float(s2)
                    else:
                        for b in range(fw):
                            st = pl[pb + b * dw : pb + b * dw + t1 - t0]
                            s = np.float32(0.0)
                            for t in range(t1 - t0):
                                s += dsp[t] * st[t]
                            acc[ab + a * fw + b] += float(s)
    for c in range(c0, c1):
        for a in range(fh):
            for b in range(fw):
                v = acc[(c - c0) * taps + a * fw + b]
                if flip:
                    grad[c, 0, 0, fh - 1 - a, fw - 1 - b] = v
                else:
                    grad[c, 0, 0, a, b] = v


def _data_grad_py(filt, diff, grad, plane, plane_d, sh, sw, ph, pw, dh, dw, flip, c0, c1):
    # pragma: no cover - compiled
    """Channels [c0, c1) of ``grad`` (N, C, H, W): ``diff`` scattered, times each tap of
    ``filt`` (C, 1, 1, FH, FW), into the zero-padded ``plane`` (HP, WP) (taps in a fixed
    order), whose inner region is then the gradient (zero where the padded plane does not
    reach). The diff is spread into ``plane_d`` first, as in :func:`_filter_grad_py`, so that
    each tap is one pass over the plane at any stride."""
    n_, c_, h_, w_ = grad.shape
    oh_, ow_ = diff.shape[2], diff.shape[3]
    fh, fw = filt.shape[3], filt.shape[4]
    hp, wp = plane.shape
    n_pos = (oh_ - 1) * sh * wp + (ow_ - 1) * sw + 1
    gs = grad.reshape(n_ * c_ * h_ * w_)
    ds = diff.reshape(n_ * c_ * oh_ * ow_)
    pl = plane.reshape(hp * wp)
    dt = plane_d.reshape(plane_d.size)[:n_pos]
    # samples outside, channels inside: the planes are read and written in memory order
    for n in range(n_):
        for c in range(c0, c1):
            for t in range(hp * wp):
                pl[t] = 0.0
            _spread(ds, dt, (n * c_ + c) * oh_ * ow_, oh_, ow_, sh * wp, sw)
            for a in range(fh):
                for b in range(fw):
                    if flip:
                        wv = filt[c, 0, 0, fh - 1 - a, fw - 1 - b]
                    else:
                        wv = filt[c, 0, 0, a, b]
                    pb = a * dh * wp + b * dw
                    pt = pl[pb : pb + n_pos]
                    for t in range(n_pos):
                        pt[t] += dt[t] * wv
            gb = (n * c_ + c) * h_ * w_
            ww = max(0, min(w_, wp - pw))
            for i in range(h_):
                grow = gs[gb + i * w_ : gb + (i + 1) * w_]
                r = i + ph
                if r < hp:
                    prow = pl[r * wp + pw : r * wp + pw + ww]
                    for j in range(ww):
                        grow[j] = prow[j]
                    for j in range(ww, w_):
                        grow[j] = 0.0
                else:
                    for j in range(w_):
                        grow[j] = 0.0


def filter_grad(src, diff, grad, plane, plane_d, acc, stride, pad, dilate, flip: bool,
                c0: int, c1: int) -> None:  # fmt: skip
    """Channels [c0, c1) of the depthwise filter gradient (:func:`_filter_grad_py`);
    ``plane`` and ``plane_d`` float32 (K * HP, WP) for chunks of K samples
    (:func:`plane_shape`), ``acc`` float64 with at least ``(c1 - c0) * FH * FW`` values."""
    _compiled()[0](src, diff, grad, plane, plane_d, acc, int(stride[0]), int(stride[1]),
                   int(pad[0]), int(pad[1]), int(dilate[0]), int(dilate[1]), bool(flip),
                   int(c0), int(c1))  # fmt: skip


def data_grad(filt, diff, grad, plane, plane_d, stride, pad, dilate, flip: bool, c0: int,
              c1: int) -> None:  # fmt: skip
    """Channels [c0, c1) of the depthwise data gradient (:func:`_data_grad_py`); ``plane``
    and ``plane_d`` float32 (HP, WP) (:func:`plane_shape`)."""
    _compiled()[1](filt, diff, grad, plane, plane_d, int(stride[0]), int(stride[1]), int(pad[0]),
                   int(pad[1]), int(dilate[0]), int(dilate[1]), bool(flip), int(c0),
                   int(c1))  # fmt: skip


@functools.cache
def _compiled():
    jit = njit(nogil=True, cache=True, error_model="numpy", fastmath=False)
    # reassociation in the filter gradient's span sums only (their order is fixed when compiled)
    sums = njit(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc", "contract"})
    return sums(_filter_grad_py), jit(_data_grad_py)

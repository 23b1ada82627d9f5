"""Compiled (Numba) loops of the depthwise convolutions' backward passes of
:mod:`..depthwise_bwd`: the filter gradient and the data gradient of a 2-d convolution with one
input and one output channel per group, any stride, padding and dilation.

Single-threaded and GIL-free (``nogil``), over a ``[c0, c1)`` range of channels, so that a
caller splits one call over a few Python threads. No allocation: the scratch comes from the
caller. Every sum runs in a fixed order (reproducible). Compiled on first use.
"""

from __future__ import annotations

import functools

from numba import njit

__all__ = ["FLUSH_SAMPLES", "filter_grad", "data_grad", "lanes", "plane_shape"]


#: samples whose products a float32 lane accumulates before its sum goes into float64
FLUSH_SAMPLES = 8


def plane_shape(oshape, fshape, stride, dilate) -> tuple[int, int]:
    """The padded source plane the outputs read: ``(HP, WP)``."""
    (oh, ow), (fh, fw), (sh, sw), (dh, dw) = oshape, fshape, stride, dilate
    return (oh - 1) * sh + (fh - 1) * dh + 1, (ow - 1) * sw + (fw - 1) * dw + 1


def lanes(oshape, stride, wp: int) -> int:
    """The float32 lane accumulators of one filter tap: the plane positions from the first
    output's to the last one's, ``(OH - 1) * SH * WP + (OW - 1) * SW + 1``."""
    (oh, ow), (sh, sw) = oshape, stride
    return (oh - 1) * sh * wp + (ow - 1) * sw + 1


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


def _filter_grad_py(src, diff, grad, plane, plane_d, vacc, acc, sh, sw, ph, pw, dh, dw, flip,
                    c0, c1):  # fmt: skip
    # pragma: no cover - compiled
    """Channels [c0, c1) of ``grad`` (C, 1, 1, FH, FW) = sum over samples and output
    positions of ``diff`` (N, C, OH, OW) times the source ``src`` (N, C, H, W) the tap reads.

    Per (sample, channel) the source is copied into the zero-padded ``plane`` (HP, WP); each
    tap then adds ``diff * source`` elementwise (vectorized) into its float32 lane
    accumulators ``vacc[tap]``, summed into the float64 ``acc[tap]`` every
    :data:`FLUSH_SAMPLES` samples. The diff is first spread into ``plane_d`` where its
    outputs read the plane (output (i, j) at ``i * SH * WP + j * SW``, zeros between), so
    that each tap is one contiguous, vectorized pass over the plane (the lanes,
    :func:`lanes`), at any stride: at stride 2 that multiplies 4x as many values, but a pass
    per 4- or 8-wide output row (strided, one slice each) ran 3-10x slower. Flat indices
    throughout."""
    n_, c_, h_, w_ = src.shape
    oh_, ow_ = diff.shape[2], diff.shape[3]
    fh, fw = grad.shape[3], grad.shape[4]
    hp, wp = plane.shape
    n_pos = (oh_ - 1) * sh * wp + (ow_ - 1) * sw + 1
    xs = src.reshape(n_ * c_ * h_ * w_)
    ds = diff.reshape(n_ * c_ * oh_ * ow_)
    pl = plane.reshape(hp * wp)
    npos_max = vacc.shape[1]
    va = vacc.reshape(fh * fw * npos_max)
    dx_ = plane_d.reshape(plane_d.size)
    hh = min(h_, hp - ph)
    ww = min(w_, wp - pw)
    for c in range(c0, c1):
        for t in range(fh * fw * npos_max):
            va[t] = 0.0
        for k in range(fh * fw):
            acc[k] = 0.0
        for n in range(n_):
            for t in range(hp * wp):
                pl[t] = 0.0
            xb = (n * c_ + c) * h_ * w_
            for i in range(hh):
                pb = (i + ph) * wp + pw
                for j in range(ww):
                    pl[pb + j] = xs[xb + i * w_ + j]
            dt = dx_[:n_pos]
            _spread(ds, dt, (n * c_ + c) * oh_ * ow_, oh_, ow_, sh * wp, sw)
            for a in range(fh):
                for b in range(fw):
                    vb = (a * fw + b) * npos_max
                    pb = a * dh * wp + b * dw
                    vt = va[vb : vb + n_pos]
                    st = pl[pb : pb + n_pos]
                    for t in range(n_pos):
                        vt[t] += dt[t] * st[t]
            if (n + 1) % FLUSH_SAMPLES == 0 or n == n_ - 1:
                for k in range(fh * fw):
                    s = 0.0
                    for t in range(npos_max):
                        s += va[k * npos_max + t]
                        va[k * npos_max + t] = 0.0
                    acc[k] += s
        for a in range(fh):
            for b in range(fw):
                v = acc[a * fw + b]
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
    for c in range(c0, c1):
        for n in range(n_):
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
            for i in range(h_):
                r = i + ph
                for j in range(w_):
                    q = j + pw
                    gs[gb + i * w_ + j] = pl[r * wp + q] if (r < hp and q < wp) else 0.0


def filter_grad(src, diff, grad, plane, plane_d, vacc, acc, stride, pad, dilate, flip: bool,
                c0: int, c1: int) -> None:  # fmt: skip
    """Channels [c0, c1) of the depthwise filter gradient (:func:`_filter_grad_py`);
    ``plane`` and ``plane_d`` float32 (HP, WP) (:func:`plane_shape`), ``vacc`` float32
    (FH * FW, :func:`lanes`), ``acc`` float64 (FH * FW,)."""
    _compiled()[0](src, diff, grad, plane, plane_d, vacc, acc, int(stride[0]), int(stride[1]),
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
    return jit(_filter_grad_py), jit(_data_grad_py)

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
    """The float32 lane accumulators of one filter tap: the phase-width positions of the
    plane at stride 1, an output row otherwise."""
    (oh, ow) = oshape
    return (oh - 1) * wp + ow if tuple(stride) == (1, 1) else ow


def _filter_grad_py(src, diff, grad, plane, plane_d, vacc, acc, sh, sw, ph, pw, dh, dw, flip,
                    c0, c1):  # fmt: skip
    # pragma: no cover - compiled
    """Channels [c0, c1) of ``grad`` (C, 1, 1, FH, FW) = sum over samples and output
    positions of ``diff`` (N, C, OH, OW) times the source ``src`` (N, C, H, W) the tap reads.

    Per (sample, channel) the source is copied into the zero-padded ``plane`` (HP, WP); each
    tap then adds ``diff * source`` elementwise (vectorized) into its float32 lane
    accumulators ``vacc[tap]``, summed into the float64 ``acc[tap]`` every
    :data:`FLUSH_SAMPLES` samples. At stride (1, 1) the diff is first copied with the plane's row
    pitch into ``plane_d`` (zeros past OW), so that each tap is one pass over the whole
    plane (the lanes are the (OH - 1) * WP + OW phase-width positions); at other strides
    each tap is a pass per output row (OW lanes). Flat indices throughout: a view per row
    costs more than the work of a 4-wide row."""
    n_, c_, h_, w_ = src.shape
    oh_, ow_ = diff.shape[2], diff.shape[3]
    fh, fw = grad.shape[3], grad.shape[4]
    hp, wp = plane.shape
    unit = sh == 1 and sw == 1
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
            if unit:
                # phase-width rows: diff copied with the plane's row pitch WP (zeros past OW),
                # so that each tap is one contiguous pass over the whole plane
                n_pos = (oh_ - 1) * wp + ow_
                for t in range(n_pos):
                    dx_[t] = 0.0
                db = (n * c_ + c) * oh_ * ow_
                for oh in range(oh_):
                    for ow in range(ow_):
                        dx_[oh * wp + ow] = ds[db + oh * ow_ + ow]
                dt = dx_[:n_pos]
                for a in range(fh):
                    for b in range(fw):
                        vb = (a * fw + b) * npos_max
                        pb = a * dh * wp + b * dw
                        vt = va[vb : vb + n_pos]
                        st = pl[pb : pb + n_pos]
                        for t in range(n_pos):
                            vt[t] += dt[t] * st[t]
            else:
                db = (n * c_ + c) * oh_ * ow_
                for oh in range(oh_):
                    dr = db + oh * ow_
                    gr = ds[dr : dr + ow_]
                    for a in range(fh):
                        rb = (oh * sh + a * dh) * wp
                        for b in range(fw):
                            vb = (a * fw + b) * npos_max
                            pb = rb + b * dw
                            vt = va[vb : vb + ow_]
                            st = pl[pb : pb + (ow_ - 1) * sw + 1]
                            for ow in range(ow_):
                                vt[ow] += gr[ow] * st[ow * sw]
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
    reach). At stride (1, 1) the diff is copied with the plane's row pitch into ``plane_d`` first
    and each tap is one pass over the whole plane; at other strides one per output row."""
    n_, c_, h_, w_ = grad.shape
    oh_, ow_ = diff.shape[2], diff.shape[3]
    fh, fw = filt.shape[3], filt.shape[4]
    hp, wp = plane.shape
    unit = sh == 1 and sw == 1
    gs = grad.reshape(n_ * c_ * h_ * w_)
    ds = diff.reshape(n_ * c_ * oh_ * ow_)
    pl = plane.reshape(hp * wp)
    for c in range(c0, c1):
        for n in range(n_):
            for t in range(hp * wp):
                pl[t] = 0.0
            db = (n * c_ + c) * oh_ * ow_
            if unit:  # phase-width rows, as in _filter_grad_py: one pass per tap
                n_pos = (oh_ - 1) * wp + ow_
                dt = plane_d.reshape(plane_d.size)[:n_pos]
                for t in range(n_pos):
                    dt[t] = 0.0
                for oh in range(oh_):
                    for ow in range(ow_):
                        dt[oh * wp + ow] = ds[db + oh * ow_ + ow]
            for oh in range(1 if unit else oh_):
                dr = db + oh * ow_
                for a in range(fh):
                    rb = (oh * sh + a * dh) * wp
                    for b in range(fw):
                        if flip:
                            wv = filt[c, 0, 0, fh - 1 - a, fw - 1 - b]
                        else:
                            wv = filt[c, 0, 0, a, b]
                        pb = rb + b * dw
                        if unit:
                            pt = pl[pb : pb + n_pos]
                            for t in range(n_pos):
                                pt[t] += dt[t] * wv
                        else:
                            gr = ds[dr : dr + ow_]
                            pt = pl[pb : pb + (ow_ - 1) * sw + 1]
                            for ow in range(ow_):
                                pt[ow * sw] += gr[ow] * wv
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

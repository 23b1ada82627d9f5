"""Compiled (Numba) loop of the direct grouped convolution of :mod:`..grouped`: any stride,
padding and dilation, a few input channels per group (depthwise convolutions: one).

Single-threaded and GIL-free (``nogil``), over a ``[begin, end)`` range of (sample, output
channel) planes, so that a caller splits one call over a few Python threads (see
:mod:`.direct` for why not Numba's parallel layers). No allocation: the scratch comes from the
caller. Compiled on first use.
"""

from __future__ import annotations

import functools

from numba import njit

__all__ = ["grouped_conv2d", "scratch_size"]


def scratch_size(oshape, fshape, stride, dilate) -> tuple[int, int, int]:
    """``(HQ, WQ, values)``: the phase planes' height and width (the source split by stride
    phase, each tap of the filter then a shifted stride-1 read of one of them) and the float32
    scratch one thread needs (the phase planes of one channel, two accumulators)."""
    (oh, ow), (fh, fw), (sh, sw), (dh, dw) = oshape, fshape, stride, dilate
    hq = oh + (fh - 1) * dh // sh
    wq = ow + (fw - 1) * dw // sw
    n_pos = (oh - 1) * wq + ow
    return hq, wq, sh * sw * hq * wq + 2 * n_pos


def _grouped_conv2d_py(x, w, y, scratch, bias, act, sh, sw, ph_, pw_, dh, dw, hq, wq, flip,
                       p0, p1):  # fmt: skip
    # pragma: no cover - compiled
    """Planes p = n * OC + oc in [p0, p1) of ``y`` (N, G*O, OH, OW) = the convolution of ``x``
    (N, G*I, H, W), padded by (ph_, pw_), with ``w`` (G, O, I, FH, FW), flipped when
    ``flip``; then ``act`` 0: nothing, 1: ``+ bias[oc]``, 2: ``max(. + bias[oc], 0)``.

    Per input channel the padded source is split into its sh * sw stride phases (HQ x WQ
    planes), so that tap (a, b) reads phase ((a dh) % sh, (b dw) % sw) shifted by
    ((a dh) // sh, (b dw) // sw): with outputs at "phase-width" positions t = r WQ + q, every
    tap is one contiguous pass over the plane, which the compiler vectorizes. The taps of a
    filter row are summed apart (three per pass), then added (a two-level sum: the error of a
    7x7 filter stays under a GEMM's)."""
    _n, c_, h_, w_ = x.shape
    g_, o_, i_, fh, fw = w.shape
    oc = g_ * o_
    oh, ow = y.shape[2], y.shape[3]
    n_pos = (oh - 1) * wq + ow
    plane = hq * wq
    phases = scratch[: sh * sw * plane]
    acc = scratch[sh * sw * plane : sh * sw * plane + n_pos]
    pc = scratch[sh * sw * plane + n_pos : sh * sw * plane + 2 * n_pos]
    for p in range(p0, p1):
        n, oo = p // oc, p % oc
        g, o = oo // o_, oo % o_
        for t in range(n_pos):
            acc[t] = 0.0
        for i in range(i_):
            c = g * i_ + i
            xc = x[n, c]
            for a in range(sh):  # the phase planes of channel c, zero outside the source
                for b in range(sw):
                    base = (a * sw + b) * plane
                    for r in range(hq):
                        sr = r * sh + a - ph_
                        rowbase = base + r * wq
                        if sr < 0 or sr >= h_:
                            zrow = phases[rowbase : rowbase + wq]
                            for q in range(wq):
                                zrow[q] = 0.0
                            continue
                        xr = xc[sr]
                        # the columns q with 0 <= q sw + b - pw_ < W read the source
                        qlo = min(wq, max(0, (pw_ - b + sw - 1) // sw))
                        qhi = min(wq, max(qlo, (w_ + pw_ - b + sw - 1) // sw))
                        row = phases[rowbase : rowbase + wq]
                        for q in range(qlo):
                            row[q] = 0.0
                        # 0-based loops over slices: indices the compiler knows are not
                        # negative (no wrap-around test), so the copy vectorizes
                        dst = row[qlo:qhi]
                        src = xr[qlo * sw + b - pw_ :: sw]
                        for q in range(qhi - qlo):
                            dst[q] = src[q]
                        tail = row[qhi:]
                        for q in range(wq - qhi):
                            tail[q] = 0.0
            for a in range(fh):
                fa = fh - 1 - a if flip else a
                ra, pa = (a * dh) // sh, (a * dh) % sh
                for t in range(n_pos):
                    pc[t] = 0.0
                b = 0
                while b < fw:
                    k = min(3, fw - b)
                    fb = fw - 1 - b if flip else b
                    w0 = w[g, o, i, fa, fb]
                    off = (pa * sw + (b * dw) % sw) * plane + ra * wq + (b * dw) // sw
                    s0 = phases[off : off + n_pos]
                    if k == 1:
                        for t in range(n_pos):
                            pc[t] += w0 * s0[t]
                    else:
                        fb = fw - 2 - b if flip else b + 1
                        w1 = w[g, o, i, fa, fb]
                        off = (pa * sw + ((b + 1) * dw) % sw) * plane + ra * wq \
                            + ((b + 1) * dw) // sw
                        s1 = phases[off : off + n_pos]
                        if k == 2:
                            for t in range(n_pos):
                                pc[t] += w0 * s0[t] + w1 * s1[t]
                        else:
                            fb = fw - 3 - b if flip else b + 2
                            w2 = w[g, o, i, fa, fb]
                            off = (pa * sw + ((b + 2) * dw) % sw) * plane + ra * wq \
                                + ((b + 2) * dw) // sw
                            s2 = phases[off : off + n_pos]
                            for t in range(n_pos):
                                pc[t] += w0 * s0[t] + w1 * s1[t] + w2 * s2[t]
                    b += k
                for t in range(n_pos):
                    acc[t] += pc[t]
        bv = bias[oo] if act > 0 else 0.0
        for r in range(oh):
            yr = y[n, oo, r]
            ar = acc[r * wq : r * wq + ow]
            for q in range(ow):
                v = ar[q]
                if act > 0:
                    v += bv
                    if act == 2 and v < 0:  # not max(): NaN stays NaN, as ReLU's
                        v = 0.0
                yr[q] = v


def grouped_conv2d(x, w, y, scratch, bias, act: int, stride, pad, dilate, hq: int, wq: int,
                   flip: bool, p0: int, p1: int) -> None:  # fmt: skip
    """Planes [p0, p1) of ``y = act(conv(x, w) + bias)`` (:func:`_grouped_conv2d_py`);
    ``scratch`` the float32 values :func:`scratch_size` gives."""
    _compiled()(x, w, y, scratch, bias, int(act), int(stride[0]), int(stride[1]), int(pad[0]),
                int(pad[1]), int(dilate[0]), int(dilate[1]), int(hq), int(wq), bool(flip),
                int(p0), int(p1))  # fmt: skip


@functools.cache
def _compiled():
    return njit(nogil=True, cache=True, error_model="numpy", fastmath=False)(_grouped_conv2d_py)

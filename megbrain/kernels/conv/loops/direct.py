"""Compiled (Numba) loops of the direct convolution of :mod:`..direct` (the Winograd
transforms are in :mod:`.winograd`).

Every loop is single-threaded and GIL-free (``nogil``) and takes a ``[begin, end)`` range
of its outermost dim, so that a caller may split one call over a few Python threads; Numba's
parallel threading layers are not safe to enter from the executor's several worker threads,
and their OpenMP threads slowed the next OpenBLAS call. The loops are compiled on first use.
No loop allocates: scratch buffers come
from the caller.
"""

from __future__ import annotations

import functools

from numba import njit

__all__ = ["direct_conv2d"]


# ---- direct convolution --------------------------------------------------------------------
def _direct_conv2d_py(xp, w, y, acc, dh, dw, flip, p0, p1):  # pragma: no cover - compiled
    """The (sample, output channel) planes p = n * OC + oc in [p0, p1) of the stride-1
    grouped convolution ``y`` (N, G*O, OH, OW) of the padded, C-contiguous ``xp`` (N, G*I,
    HP, WP) with ``w`` (G, O, I, FH, FW) (flipped spatially when ``flip``).

    Each plane is accumulated in "padded-width" positions t = r * WP + q (``acc``, a scratch
    of 2 ((OH - 1) WP + OW) values), where the input of filter offset (a, b) is at t + a dh WP +
    b dw: one contiguous loop over the whole plane per (channel, offset), then the OW valid
    columns of each row are copied out."""
    c_, hp, wp = xp.shape[1], xp.shape[2], xp.shape[3]
    g_, o_, i_, fh, fw = w.shape
    oc = g_ * o_
    oh, ow = y.shape[2], y.shape[3]
    n_pos = (oh - 1) * wp + ow
    xf = xp.reshape(-1)
    a_ = acc[:n_pos]
    # with several input channels, the products of each block of 8 channels are summed apart,
    # then added: a two-level sum keeps the float32 error of long reductions near a GEMM's
    pc = acc[n_pos : 2 * n_pos] if i_ > 1 else a_
    for p in range(p0, p1):
        n, oo = p // oc, p % oc
        g, o = oo // o_, oo % o_
        for t in range(n_pos):
            a_[t] = 0.0
        for i in range(i_):
            base = (n * c_ + g * i_ + i) * hp * wp
            if i_ > 1 and i % 8 == 0:
                for t in range(n_pos):
                    pc[t] = 0.0
            for a in range(fh):
                fa = fh - 1 - a if flip else a
                b = 0
                while b + 3 <= fw:  # three offsets of a filter row per pass over the plane
                    if flip:
                        w0, w1, w2 = w[g, o, i, fa, fw - 1 - b], w[g, o, i, fa, fw - 2 - b], \
                            w[g, o, i, fa, fw - 3 - b]
                    else:
                        w0, w1, w2 = w[g, o, i, fa, b], w[g, o, i, fa, b + 1], w[g, o, i, fa, b + 2]
                    off = base + a * dh * wp + b * dw
                    s0 = xf[off : off + n_pos]
                    s1 = xf[off + dw : off + dw + n_pos]
                    s2 = xf[off + 2 * dw : off + 2 * dw + n_pos]
                    for t in range(n_pos):
                        pc[t] += w0 * s0[t] + w1 * s1[t] + w2 * s2[t]
                    b += 3
                while b < fw:
                    wv = w[g, o, i, fa, fw - 1 - b] if flip else w[g, o, i, fa, b]
                    off = base + a * dh * wp + b * dw
                    src = xf[off : off + n_pos]
                    for t in range(n_pos):
                        pc[t] += wv * src[t]
                    b += 1
            if i_ > 1 and (i % 8 == 7 or i == i_ - 1):
                for t in range(n_pos):
                    a_[t] += pc[t]
        for r in range(oh):
            row = a_[r * wp : r * wp + ow]
            yr = y[n, oo, r]
            for q in range(ow):
                yr[q] = row[q]


def direct_conv2d(xp, w, y, acc, dilate, flip: bool, p0: int, p1: int) -> None:
    """Planes [p0, p1) of the stride-1 convolution ``y = conv(xp, w)`` of an already padded,
    C-contiguous source; ``acc`` a scratch of 2 ((OH - 1) WP + OW) values."""
    _compiled("direct")(xp, w, y, acc, int(dilate[0]), int(dilate[1]), bool(flip), int(p0),
                        int(p1))  # fmt: skip


@functools.cache
def _compiled(name: str):
    fn = {
        "direct": _direct_conv2d_py,
    }[name]
    return njit(nogil=True, cache=True, error_model="numpy", fastmath=False)(fn)

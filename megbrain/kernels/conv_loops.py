"""Compiled (Numba) loops of the fast convolution algorithms: the Winograd F(2x2, 3x3)
transforms of :mod:`conv_winograd`.

Every loop is single-threaded and GIL-free (``nogil``) and takes a ``[begin, end)`` range
of its outermost dim, so that a caller may split one call over a few Python threads; Numba's
parallel threading layers are not safe to enter from the executor's several worker threads,
and their OpenMP threads slowed the next OpenBLAS call. Numba is imported on first use, so
that ``import megbrain`` stays free of its import time. No loop allocates: scratch rows come
from the caller.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["winograd_filter", "winograd_input", "winograd_output"]


# ---- Winograd F(2x2, 3x3) ------------------------------------------------------------------
# With B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
# G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]] and
# A^T = [[1, 1, 1, 0], [0, 1, -1, -1]], the 2x2 outputs of a 4x4 input tile d are
# A^T [(G g G^T) * (B^T d B)] A (elementwise product in the middle).
def _winograd_filter_py(w, u, t, flip, g0, g1):  # pragma: no cover - compiled
    """u[e, g, o, i] = (G w[g, o, i] G^T)[e // 4, e % 4] for groups [g0, g1); ``w`` is
    (G, O, I, 3, 3), read flipped spatially when ``flip``; ``t`` a (4, 3) scratch."""
    _, o_, i_ = w.shape[:3]
    for g in range(g0, g1):
        for o in range(o_):
            for i in range(i_):
                for b in range(3):  # t = G k, column b
                    if flip:
                        c = 2 - b
                        k0, k1, k2 = w[g, o, i, 2, c], w[g, o, i, 1, c], w[g, o, i, 0, c]
                    else:
                        k0, k1, k2 = w[g, o, i, 0, b], w[g, o, i, 1, b], w[g, o, i, 2, b]
                    t[0, b] = k0
                    t[1, b] = 0.5 * (k0 + k1 + k2)
                    t[2, b] = 0.5 * (k0 - k1 + k2)
                    t[3, b] = k2
                for a in range(4):  # (G k) G^T, row a
                    t0, t1, t2 = t[a, 0], t[a, 1], t[a, 2]
                    u[4 * a + 0, g, o, i] = t0
                    u[4 * a + 1, g, o, i] = 0.5 * (t0 + t1 + t2)
                    u[4 * a + 2, g, o, i] = 0.5 * (t0 - t1 + t2)
                    u[4 * a + 3, g, o, i] = t2


# The transforms index flat, C-contiguous 1-d buffers: Numba types a slice of an n-d array
# as of any layout (a run-time stride), which kept LLVM from vectorizing the loops (3x slower).
def _winograd_input_py(x, v, rows, ph, pw, th, tw, nb, c_, p0, p1):  # pragma: no cover
    """v[e, c, (k * th + i) * tw + j] = (B^T d B)[e // 4, e % 4] for the 4x4 tile d of
    x[nb + k, c] (zero-padded by ph, pw) at rows 2 i - ph.., columns 2 j - pw..; the planes
    p = k * c_ + c in [p0, p1) of ``x`` (N, C, H, W); ``v`` is the flat (16, C, T) buffer.
    ``rows`` is a flat scratch of 8 (tw + 1) values: the even and the odd columns of the
    tile's 4 rows, so that every loop below reads and writes contiguously."""
    h_, w_ = x.shape[2], x.shape[3]
    wq = tw + 1
    t_ = v.size // (16 * c_)  # tiles of the chunk
    qlo = min(wq, (pw + 1) // 2)  # the first q with 2 q - pw >= 0
    qhi = max(qlo, min(wq, (w_ + pw - 2) // 2 + 1))  # past the last q with 2 q - pw + 1 < W
    for p in range(p0, p1):
        k, c = p // c_, p % c_
        n = nb + k
        for i in range(th):
            for r in range(4):
                y = 2 * i - ph + r
                e0, o0 = r * wq, (4 + r) * wq  # this row's even and odd columns in ``rows``
                if 0 <= y < h_:
                    for q in range(qlo):
                        xe = 2 * q - pw
                        rows[e0 + q] = x[n, c, y, xe] if 0 <= xe < w_ else 0.0
                        rows[o0 + q] = x[n, c, y, xe + 1] if 0 <= xe + 1 < w_ else 0.0
                    for q in range(qlo, qhi):  # both columns inside the row
                        rows[e0 + q] = x[n, c, y, 2 * q - pw]
                        rows[o0 + q] = x[n, c, y, 2 * q - pw + 1]
                    for q in range(qhi, wq):
                        xe = 2 * q - pw
                        rows[e0 + q] = x[n, c, y, xe] if 0 <= xe < w_ else 0.0
                        rows[o0 + q] = x[n, c, y, xe + 1] if 0 <= xe + 1 < w_ else 0.0
                else:
                    for q in range(wq):
                        rows[e0 + q] = 0.0
                        rows[o0 + q] = 0.0
            # the row combinations B^T d, in place: rows become t0..t3
            for half in range(2):
                b = half * 4 * wq
                t0 = rows[b : b + wq]
                t1 = rows[b + wq : b + 2 * wq]
                t2 = rows[b + 2 * wq : b + 3 * wq]
                t3 = rows[b + 3 * wq : b + 4 * wq]
                for q in range(wq):
                    d0, d1, d2, d3 = t0[q], t1[q], t2[q], t3[q]
                    t0[q] = d0 - d2
                    t1[q] = d1 + d2
                    t2[q] = d2 - d1
                    t3[q] = d1 - d3
            base = (k * th + i) * tw
            for r in range(4):
                ev = rows[r * wq : (r + 1) * wq]
                od = rows[(4 + r) * wq : (5 + r) * wq]
                s0 = ((4 * r) * c_ + c) * t_ + base
                v0 = v[s0 : s0 + tw]
                v1 = v[s0 + c_ * t_ : s0 + c_ * t_ + tw]
                v2 = v[s0 + 2 * c_ * t_ : s0 + 2 * c_ * t_ + tw]
                v3 = v[s0 + 3 * c_ * t_ : s0 + 3 * c_ * t_ + tw]
                for j in range(tw):
                    a0, a1, a2, a3 = ev[j], od[j], ev[j + 1], od[j + 1]
                    v0[j] = a0 - a2
                    v1[j] = a1 + a2
                    v2[j] = a2 - a1
                    v3[j] = a1 - a3


def _winograd_output_py(m, y, th, tw, nb, o_, p0, p1):  # pragma: no cover - compiled
    """y[nb + k, o, 2 i + a, 2 j + b] = (A^T M A)[a, b] for M[e] = m[e, o, (k * th + i) * tw
    + j], the planes p = k * o_ + o in [p0, p1) of ``y``; ``m`` is the flat (16, O, T)
    buffer, ``y`` the flat C-contiguous (N, O, OH, OW) output. Outputs past OH, OW are
    dropped: the second row or column of a clipped tile is stored first, then overwritten by
    the first."""
    t_ = m.size // (16 * o_)
    oh_, ow_ = y.shape[2], y.shape[3]
    yf = y.reshape(-1)
    plane = oh_ * ow_
    jf = ow_ // 2  # tiles with two output columns
    st = o_ * t_  # from one element e of M to the next
    for p in range(p0, p1):
        k, o = p // o_, p % o_
        ybase = ((nb + k) * o_ + o) * plane
        for i in range(th):
            mb = o * t_ + (k * th + i) * tw
            r0 = ybase + 2 * i * ow_
            r1 = ybase + min(2 * i + 1, oh_ - 1) * ow_
            yr0 = yf[r0 : r0 + ow_]
            yr1 = yf[r1 : r1 + ow_]
            q0, q1 = m[mb : mb + tw], m[mb + st : mb + st + tw]
            q2, q3 = m[mb + 2 * st : mb + 2 * st + tw], m[mb + 3 * st : mb + 3 * st + tw]
            q4, q5 = m[mb + 4 * st : mb + 4 * st + tw], m[mb + 5 * st : mb + 5 * st + tw]
            q6, q7 = m[mb + 6 * st : mb + 6 * st + tw], m[mb + 7 * st : mb + 7 * st + tw]
            q8, q9 = m[mb + 8 * st : mb + 8 * st + tw], m[mb + 9 * st : mb + 9 * st + tw]
            q10, q11 = m[mb + 10 * st : mb + 10 * st + tw], m[mb + 11 * st : mb + 11 * st + tw]
            q12, q13 = m[mb + 12 * st : mb + 12 * st + tw], m[mb + 13 * st : mb + 13 * st + tw]
            q14, q15 = m[mb + 14 * st : mb + 14 * st + tw], m[mb + 15 * st : mb + 15 * st + tw]
            for j in range(jf):
                r00 = q0[j] + q4[j] + q8[j]
                r01 = q1[j] + q5[j] + q9[j]
                r02 = q2[j] + q6[j] + q10[j]
                r03 = q3[j] + q7[j] + q11[j]
                r10 = q4[j] - q8[j] - q12[j]
                r11 = q5[j] - q9[j] - q13[j]
                r12 = q6[j] - q10[j] - q14[j]
                r13 = q7[j] - q11[j] - q15[j]
                x0 = np.uint64(2 * j)
                x1 = x0 + np.uint64(1)
                yr1[x1] = r11 - r12 - r13
                yr1[x0] = r10 + r11 + r12
                yr0[x1] = r01 - r02 - r03
                yr0[x0] = r00 + r01 + r02
            if jf < tw:  # the last tile has one output column
                t = mb + jf
                r10 = m[t + 4 * st] - m[t + 8 * st] - m[t + 12 * st]
                r11 = m[t + 5 * st] - m[t + 9 * st] - m[t + 13 * st]
                r12 = m[t + 6 * st] - m[t + 10 * st] - m[t + 14 * st]
                yf[r1 + 2 * jf] = r10 + r11 + r12
                r00 = m[t] + m[t + 4 * st] + m[t + 8 * st]
                r01 = m[t + st] + m[t + 5 * st] + m[t + 9 * st]
                r02 = m[t + 2 * st] + m[t + 6 * st] + m[t + 10 * st]
                yf[r0 + 2 * jf] = r00 + r01 + r02


def winograd_filter(w, u, t, flip: bool, g0: int, g1: int) -> None:
    """The F(2x2, 3x3) filter transform of groups [g0, g1) of ``w`` (G, O, I, 3, 3) into
    ``u`` (16, G, O, I); ``t`` is a (4, 3) scratch of ``u``'s dtype."""
    _compiled("filter")(w, u, t, bool(flip), int(g0), int(g1))


def winograd_input(x, v, rows, ph, pw, th, tw, nb, c, p0, p1) -> None:
    """The F(2x2, 3x3) input transform into ``v`` (16, C, tiles) of the (sample, channel)
    planes [p0, p1) of ``x`` (N, C, H, W) from sample ``nb`` on (plane k * C + c is sample
    nb + k, channel c), zero-padded by ``ph``, ``pw``; ``th`` x ``tw`` tiles a plane."""
    _compiled("input")(x, v, rows, *map(int, (ph, pw, th, tw, nb, c, p0, p1)))


def winograd_output(m, y, th, tw, nb, o, p0, p1) -> None:
    """The F(2x2, 3x3) output transform of ``m`` (16, O, tiles) into the (sample, channel)
    planes [p0, p1) of ``y`` (N, O, OH, OW) from sample ``nb`` on."""
    _compiled("output")(m, y, *map(int, (th, tw, nb, o, p0, p1)))


@functools.cache
def _compiled(name: str):
    # numba is imported on first use: ``import megbrain`` stays free of its import time
    from numba import njit

    fn = {
        "filter": _winograd_filter_py,
        "input": _winograd_input_py,
        "output": _winograd_output_py,
    }[name]
    return njit(nogil=True, cache=True, error_model="numpy", fastmath=False)(fn)

"""Compiled (Numba) transforms of the Winograd F(2x2, 3x3) convolution of :mod:`..winograd`.

With ``B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]``,
``G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]]`` and
``A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]``, the 2x2 outputs of a 4x4 input tile ``d`` are
``A^T [(G g G^T) * (B^T d B)] A`` (elementwise product in the middle).

The input and output transforms work on the tile rows ``[r0, r1)`` of one sample, every
channel, within a *band* (such rows, or several whole samples) laid out ``(16, C, tiles of the
band)``, so that the 16 GEMMs of :mod:`..winograd` have the band's tiles as their long,
contiguous dimension. The
long loops run along whole bands of contiguous 1-d views indexed by the loop variable (LLVM
vectorizes those; a computed index, or loops as short as one row of tiles, did not). An
offset is folded into the view, never added to the index: Numba wraps a signed index it cannot
prove non-negative around, and LLVM makes such loads (``ce[t + tw]``) gathers.

Every loop is single-threaded and GIL-free (``nogil``), so that a caller may run several on
a few Python threads; Numba's parallel threading layers are not safe to enter from the
executor's several worker threads. The loops are compiled on first use and allocate nothing:
scratch comes from the caller.
"""

from __future__ import annotations

import functools

from numba import njit

__all__ = ["compiled", "filter_transform", "input_transform", "output_transform"]


def _filter_py(w, u, flip, swap, p0, p1):  # pragma: no cover - compiled
    """u[e, g, o, i] = (G w[g, o, i] G^T)[e // 4, e % 4] for the (group, output channel)
    pairs p = g * O + o in [p0, p1); ``w`` (G, O, I, 3, 3) is read flipped spatially when
    ``flip``, and is given as its contiguous (G, I, O, 3, 3) transpose when ``swap`` (the
    backward data's filter: one compiled loop serves both, where a strided view of the
    filter compiled a second one). The transform is computed in float64 and rounded once."""
    o_, i_ = (w.shape[2], w.shape[1]) if swap else (w.shape[1], w.shape[2])
    for p in range(p0, p1):
        g, o = p // o_, p % o_
        # (I, 3, 3): the loop runs along I, writing 16 contiguous rows of u
        wk = w[g, :, o] if swap else w[g, o]
        uk = u[:, g, o]
        for i in range(i_):
            if flip:
                a0, a1, a2 = wk[i, 2, 2], wk[i, 2, 1], wk[i, 2, 0]
                b0, b1, b2 = float(wk[i, 1, 2]), float(wk[i, 1, 1]), float(wk[i, 1, 0])
                c0, c1, c2 = float(wk[i, 0, 2]), float(wk[i, 0, 1]), float(wk[i, 0, 0])
            else:
                a0, a1, a2 = float(wk[i, 0, 0]), float(wk[i, 0, 1]), float(wk[i, 0, 2])
                b0, b1, b2 = float(wk[i, 1, 0]), float(wk[i, 1, 1]), float(wk[i, 1, 2])
                c0, c1, c2 = float(wk[i, 2, 0]), float(wk[i, 2, 1]), float(wk[i, 2, 2])
            # the rows of G k (k's rows a, b, c combined), each then times G^T
            d0, d1, d2 = 0.5 * (a0 + b0 + c0), 0.5 * (a1 + b1 + c1), 0.5 * (a2 + b2 + c2)
            e0, e1, e2 = 0.5 * (a0 - b0 + c0), 0.5 * (a1 - b1 + c1), 0.5 * (a2 - b2 + c2)
            _times_gt(uk, 0, i, a0, a1, a2)
            _times_gt(uk, 4, i, d0, d1, d2)
            _times_gt(uk, 8, i, e0, e1, e2)
            _times_gt(uk, 12, i, c0, c1, c2)


@njit(inline="always")
def _times_gt(uk, k, i, r0, r1, r2):  # pragma: no cover - compiled
    """Rows ``k .. k + 3`` of column ``i`` of ``uk``: the row ``(r0, r1, r2)`` of G k times
    G^T."""
    uk[k, i] = r0
    uk[k + 1, i] = 0.5 * (r0 + r1 + r2)
    uk[k + 2, i] = 0.5 * (r0 - r1 + r2)
    uk[k + 3, i] = r2


def _input_py(x, v, s, n, ph, pw, tw, r0, r1, ld, off):  # pragma: no cover - compiled
    """v[4 p + q, c, off + (i - r0) tw + j] = (B^T d B)[p, q] for the tile d at rows
    2 i - ph.., columns 2 j - pw.. of x[n, c] (zero-padded), tile rows i in [r0, r1), every
    channel c of ``x`` (N, C, H, W); ``v`` is flat, (16, C, ld) at its start (a band of
    several samples puts each at its own offset ``off``).

    ``s`` is a flat scratch of 2 (tw + 1) + 8 (r1 - r0 + 1) tw values. Each padded input row
    is split into its even and odd columns, whose column combinations d B (4 per tile) go to
    the rows of 8 planes (combination, row parity) of (r1 - r0 + 1, tw) values; the row
    combinations B^T then run along whole planes."""
    c_, h_, w_ = x.shape[1], x.shape[2], x.shape[3]
    nr = r1 - r0
    tb = nr * tw
    wq = tw + 1
    ev = s[0:wq]
    od = s[wq : 2 * wq]
    cs = 2 * wq
    ps = (nr + 1) * tw  # one of the 8 (combination, parity) planes
    qlo = min(wq, (pw + 1) // 2)
    qhi = max(qlo, min(wq, (w_ + pw - 2) // 2 + 1))
    st = c_ * ld
    for c in range(c_):
        for yy in range(2 * nr + 2):
            y = 2 * r0 + yy - ph
            par = yy % 2
            row = yy // 2
            if 0 <= y < h_:
                xr = x[n, c, y]
                for q in range(qlo):
                    xe = 2 * q - pw
                    ev[q] = xr[xe] if 0 <= xe < w_ else 0.0
                    od[q] = xr[xe + 1] if 0 <= xe + 1 < w_ else 0.0
                xm, em, om = xr[2 * qlo - pw :], ev[qlo:], od[qlo:]
                for q in range(qhi - qlo):
                    em[q] = xm[2 * q]
                    om[q] = xm[2 * q + 1]
                for q in range(qhi, wq):
                    xe = 2 * q - pw
                    ev[q] = xr[xe] if 0 <= xe < w_ else 0.0
                    od[q] = xr[xe + 1] if 0 <= xe + 1 < w_ else 0.0
            else:
                for q in range(wq):
                    ev[q] = 0.0
                    od[q] = 0.0
            b = cs + par * 4 * ps + row * tw
            c0 = s[b : b + tw]
            c1 = s[b + ps : b + ps + tw]
            c2 = s[b + 2 * ps : b + 2 * ps + tw]
            c3 = s[b + 3 * ps : b + 3 * ps + tw]
            for j in range(tw):
                e0, o0, e1, o1 = ev[j], od[j], ev[j + 1], od[j + 1]
                c0[j] = e0 - e1
                c1[j] = o0 + e1
                c2[j] = e1 - o0
                c3[j] = o0 - o1
        vb = c * ld + off
        for q in range(4):
            ce = s[cs + q * ps : cs + q * ps + ps]
            co = s[cs + (4 + q) * ps : cs + (4 + q) * ps + ps]
            va = v[vb + q * st : vb + q * st + tb]
            vb1 = v[vb + (4 + q) * st : vb + (4 + q) * st + tb]
            vc = v[vb + (8 + q) * st : vb + (8 + q) * st + tb]
            vd = v[vb + (12 + q) * st : vb + (12 + q) * st + tb]
            ce1 = s[cs + q * ps + tw : cs + q * ps + ps]
            co1 = s[cs + (4 + q) * ps + tw : cs + (4 + q) * ps + ps]
            for t in range(tb):
                d0, d1, d2, d3 = ce[t], co[t], ce1[t], co1[t]
                va[t] = d0 - d2
                vb1[t] = d1 + d2
                vc[t] = d2 - d1
                vd[t] = d1 - d3


def _output_py(m, y, z, n, tw, r0, r1, ld, off):  # pragma: no cover - compiled
    """y[n, o, 2 i + a, 2 j + b] = (A^T M A)[a, b] for M[e] = m[e, o, off + (i - r0) tw + j],
    tile rows i in [r0, r1), every channel o of ``y`` (N, O, OH, OW; C-contiguous); ``m`` is
    flat, (16, O, ld) at its start. ``z`` is a flat scratch of 4 (r1 - r0) tw values: the
    4 outputs of every tile of the band, computed along the band (contiguous loops), then
    spread into the output rows (outputs past OH, OW are dropped)."""
    o_, oh_, ow_ = y.shape[1], y.shape[2], y.shape[3]
    nr = r1 - r0
    tb = nr * tw
    st = o_ * ld
    yf = y.reshape(-1)
    z0, z1 = z[0:tb], z[tb : 2 * tb]
    z2, z3 = z[2 * tb : 3 * tb], z[3 * tb : 4 * tb]
    jf = ow_ // 2
    for o in range(o_):
        mb = o * ld + off
        q0, q1 = m[mb : mb + tb], m[mb + st : mb + st + tb]
        q2, q3 = m[mb + 2 * st : mb + 2 * st + tb], m[mb + 3 * st : mb + 3 * st + tb]
        q4, q5 = m[mb + 4 * st : mb + 4 * st + tb], m[mb + 5 * st : mb + 5 * st + tb]
        q6, q7 = m[mb + 6 * st : mb + 6 * st + tb], m[mb + 7 * st : mb + 7 * st + tb]
        q8, q9 = m[mb + 8 * st : mb + 8 * st + tb], m[mb + 9 * st : mb + 9 * st + tb]
        q10, q11 = m[mb + 10 * st : mb + 10 * st + tb], m[mb + 11 * st : mb + 11 * st + tb]
        q12, q13 = m[mb + 12 * st : mb + 12 * st + tb], m[mb + 13 * st : mb + 13 * st + tb]
        q14, q15 = m[mb + 14 * st : mb + 14 * st + tb], m[mb + 15 * st : mb + 15 * st + tb]
        for t in range(tb):
            r00 = q0[t] + q4[t] + q8[t]
            r01 = q1[t] + q5[t] + q9[t]
            r02 = q2[t] + q6[t] + q10[t]
            r03 = q3[t] + q7[t] + q11[t]
            r10 = q4[t] - q8[t] - q12[t]
            r11 = q5[t] - q9[t] - q13[t]
            r12 = q6[t] - q10[t] - q14[t]
            r13 = q7[t] - q11[t] - q15[t]
            z0[t] = r00 + r01 + r02
            z1[t] = r01 - r02 - r03
            z2[t] = r10 + r11 + r12
            z3[t] = r11 - r12 - r13
        ybase = (n * o_ + o) * oh_ * ow_
        for li in range(nr):
            i = r0 + li
            zr = li * tw
            ya = yf[ybase + 2 * i * ow_ : ybase + 2 * i * ow_ + ow_]
            if 2 * i + 1 < oh_:
                yb = yf[ybase + (2 * i + 1) * ow_ : ybase + (2 * i + 2) * ow_]
                w2, w3 = z2[zr : zr + tw], z3[zr : zr + tw]
                for j in range(jf):
                    yb[2 * j] = w2[j]
                    yb[2 * j + 1] = w3[j]
                if jf < tw:
                    yb[2 * jf] = w2[jf]
            w0, w1 = z0[zr : zr + tw], z1[zr : zr + tw]
            for j in range(jf):
                ya[2 * j] = w0[j]
                ya[2 * j + 1] = w1[j]
            if jf < tw:
                ya[2 * jf] = w0[jf]


def filter_transform(w, u, flip: bool, p0: int, p1: int) -> None:
    """The F(2x2, 3x3) filter transform of the (group, output channel) pairs ``[p0, p1)``
    (pair ``g * O + o``) of ``w`` (G, O, I, 3, 3) into ``u`` (16, G, O, I)."""
    _compiled("filter")(w, u, bool(flip), False, int(p0), int(p1))


def input_transform(x, v, scratch, n, ph, pw, tw, r0, r1, ld, off) -> None:
    """The F(2x2, 3x3) input transform of tile rows ``[r0, r1)`` of sample ``n`` of ``x``
    (N, C, H, W), zero-padded by ``ph``, ``pw``, into the flat ``v`` ((16, C, ld) at its
    start) from column ``off`` on; ``tw`` tiles a row. ``scratch`` holds
    2 (tw + 1) + 8 (r1 - r0 + 1) tw values."""
    _compiled("input")(x, v, scratch, *map(int, (n, ph, pw, tw, r0, r1, ld, off)))


def output_transform(m, y, scratch, n, tw, r0, r1, ld, off) -> None:
    """The F(2x2, 3x3) output transform of the flat ``m`` ((16, O, ld) at its start, from
    column ``off`` on) into the output rows of tile rows ``[r0, r1)`` of sample ``n`` of ``y``
    (N, O, OH, OW; C-contiguous). ``scratch`` holds 4 (r1 - r0) tw values."""
    _compiled("output")(m, y, scratch, *map(int, (n, tw, r0, r1, ld, off)))


def compiled() -> tuple:
    """The compiled ``(filter, input, output)`` loops themselves (compiling or loading them
    from Numba's cache on the first call), for a caller that calls them many times: they take
    the arguments of :func:`filter_transform`, :func:`input_transform` and
    :func:`output_transform` as they are (ints and bools, no conversion)."""
    return _compiled("filter"), _compiled("input"), _compiled("output")


@functools.cache
def _compiled(name: str):
    fn = {"filter": _filter_py, "input": _input_py, "output": _output_py}[name]
    return njit(nogil=True, cache=True, error_model="numpy", fastmath=False)(fn)

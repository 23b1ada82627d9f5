"""Compiled (Numba) loops of the fast convolution algorithms: the Winograd F(2x2, 3x3)
transforms of :mod:`conv_winograd` and the direct convolution of :mod:`conv_direct`.

Every loop is single-threaded and GIL-free (``nogil``) and takes a ``[begin, end)`` range
of its outermost dim, so that a caller may split one call over a few Python threads; Numba's
parallel threading layers are not safe to enter from the executor's several worker threads,
and their OpenMP threads slowed the next OpenBLAS call. Numba is imported on first use, so
that ``import megbrain`` stays free of its import time. No loop allocates: scratch buffers come
from the caller.
"""

from __future__ import annotations

import functools

__all__ = ["direct_conv2d", "winograd_filter", "winograd_input", "winograd_output"]


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


# The transforms run their long loops along whole planes of contiguous 1-d views indexed by the
# loop variable: LLVM vectorizes those; a computed index (a possible negative index to wrap)
# or loops as short as a row of tiles did not vectorize (2x slower).
def _winograd_input_py(x, v, s, ph, pw, th, tw, nb, c_, p0, p1):  # pragma: no cover
    """v[e, c, k * th * tw + i * tw + j] = (B^T d B)[e // 4, e % 4] for the 4x4 tile d of
    x[nb + k, c] (zero-padded by ph, pw) at rows 2 i - ph.., columns 2 j - pw..; the planes
    p = k * c_ + c in [p0, p1) of ``x`` (N, C, H, W); ``v`` is the flat (16, C, T) buffer.

    ``s`` is a flat scratch of 2 (tw + 1) + 8 (th + 1) tw values. Each padded input row is
    split into its even and odd columns, whose column combinations d B (4 per tile) go to
    the row of 8 planes (combination, row parity) of (th + 1, tw) values; the row
    combinations B^T then run along whole planes, so that the long loops are contiguous."""
    h_, w_ = x.shape[2], x.shape[3]
    wq = tw + 1
    pt = th * tw
    t_ = v.size // (16 * c_)
    ev = s[0:wq]
    od = s[wq:2 * wq]
    cs = 2 * wq
    ps = (th + 1) * tw  # one of the 8 (s, parity) planes
    qlo = min(wq, (pw + 1) // 2)
    qhi = max(qlo, min(wq, (w_ + pw - 2) // 2 + 1))
    for p in range(p0, p1):
        k, c = p // c_, p % c_
        n = nb + k
        for yy in range(2 * th + 2):
            y = yy - ph
            par = yy % 2
            row = yy // 2
            if 0 <= y < h_:
                for q in range(qlo):
                    xe = 2 * q - pw
                    ev[q] = x[n, c, y, xe] if 0 <= xe < w_ else 0.0
                    od[q] = x[n, c, y, xe + 1] if 0 <= xe + 1 < w_ else 0.0
                for q in range(qlo, qhi):
                    ev[q] = x[n, c, y, 2 * q - pw]
                    od[q] = x[n, c, y, 2 * q - pw + 1]
                for q in range(qhi, wq):
                    xe = 2 * q - pw
                    ev[q] = x[n, c, y, xe] if 0 <= xe < w_ else 0.0
                    od[q] = x[n, c, y, xe + 1] if 0 <= xe + 1 < w_ else 0.0
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
        vb = c * t_ + k * pt
        st = c_ * t_
        for q in range(4):
            ce = s[cs + q * ps : cs + q * ps + ps]
            co = s[cs + (4 + q) * ps : cs + (4 + q) * ps + ps]
            va = v[vb + q * st : vb + q * st + pt]
            vb1 = v[vb + (4 + q) * st : vb + (4 + q) * st + pt]
            vc = v[vb + (8 + q) * st : vb + (8 + q) * st + pt]
            vd = v[vb + (12 + q) * st : vb + (12 + q) * st + pt]
            for t in range(pt):
                d0, d1, d2, d3 = ce[t], co[t], ce[t + tw], co[t + tw]
                va[t] = d0 - d2
                vb1[t] = d1 + d2
                vc[t] = d2 - d1
                vd[t] = d1 - d3


def _winograd_output_py(m, y, z, th, tw, nb, o_, p0, p1):  # pragma: no cover - compiled
    """y[nb + k, o, 2 i + a, 2 j + b] = (A^T M A)[a, b] for M[e] = m[e, o, k * th * tw + i * tw
    + j], the planes p = k * o_ + o in [p0, p1) of ``y`` (N, O, OH, OW), C-contiguous; ``m``
    is the flat (16, O, T) buffer. ``z`` is a flat scratch of 4 th tw values: the 4 outputs
    of every tile of a plane, computed along the plane (contiguous loops), then spread into
    the output rows (outputs past OH, OW are dropped)."""
    t_ = m.size // (16 * o_)
    oh_, ow_ = y.shape[2], y.shape[3]
    yf = y.reshape(-1)
    plane = oh_ * ow_
    pt = th * tw
    st = o_ * t_
    z0, z1 = z[0:pt], z[pt : 2 * pt]
    z2, z3 = z[2 * pt : 3 * pt], z[3 * pt : 4 * pt]
    for p in range(p0, p1):
        k, o = p // o_, p % o_
        mb = o * t_ + k * pt
        q0, q1 = m[mb : mb + pt], m[mb + st : mb + st + pt]
        q2, q3 = m[mb + 2 * st : mb + 2 * st + pt], m[mb + 3 * st : mb + 3 * st + pt]
        q4, q5 = m[mb + 4 * st : mb + 4 * st + pt], m[mb + 5 * st : mb + 5 * st + pt]
        q6, q7 = m[mb + 6 * st : mb + 6 * st + pt], m[mb + 7 * st : mb + 7 * st + pt]
        q8, q9 = m[mb + 8 * st : mb + 8 * st + pt], m[mb + 9 * st : mb + 9 * st + pt]
        q10, q11 = m[mb + 10 * st : mb + 10 * st + pt], m[mb + 11 * st : mb + 11 * st + pt]
        q12, q13 = m[mb + 12 * st : mb + 12 * st + pt], m[mb + 13 * st : mb + 13 * st + pt]
        q14, q15 = m[mb + 14 * st : mb + 14 * st + pt], m[mb + 15 * st : mb + 15 * st + pt]
        for t in range(pt):
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
        ybase = ((nb + k) * o_ + o) * plane
        jf = ow_ // 2
        for i in range(th):
            zr = i * tw
            ya = yf[ybase + 2 * i * ow_ : ybase + 2 * i * ow_ + ow_]
            if 2 * i + 1 < oh_:
                yb = yf[ybase + (2 * i + 1) * ow_ : ybase + (2 * i + 2) * ow_]
                for j in range(jf):
                    yb[2 * j] = z2[zr + j]
                    yb[2 * j + 1] = z3[zr + j]
                if jf < tw:
                    yb[2 * jf] = z2[zr + jf]
            for j in range(jf):
                ya[2 * j] = z0[zr + j]
                ya[2 * j + 1] = z1[zr + j]
            if jf < tw:
                ya[2 * jf] = z0[zr + jf]


def winograd_filter(w, u, t, flip: bool, g0: int, g1: int) -> None:
    """The F(2x2, 3x3) filter transform of groups [g0, g1) of ``w`` (G, O, I, 3, 3) into
    ``u`` (16, G, O, I); ``t`` is a (4, 3) scratch of ``u``'s dtype."""
    _compiled("filter")(w, u, t, bool(flip), int(g0), int(g1))


def winograd_input(x, v, scratch, ph, pw, th, tw, nb, c, p0, p1) -> None:
    """The F(2x2, 3x3) input transform into ``v`` (16, C, tiles) of the (sample, channel)
    planes [p0, p1) of ``x`` (N, C, H, W) from sample ``nb`` on (plane k * C + c is sample
    nb + k, channel c), zero-padded by ``ph``, ``pw``; ``th`` x ``tw`` tiles a plane."""
    _compiled("input")(x, v, scratch, *map(int, (ph, pw, th, tw, nb, c, p0, p1)))


def winograd_output(m, y, scratch, th, tw, nb, o, p0, p1) -> None:
    """The F(2x2, 3x3) output transform of ``m`` (16, O, tiles) into the (sample, channel)
    planes [p0, p1) of ``y`` (N, O, OH, OW) from sample ``nb`` on."""
    _compiled("output")(m, y, scratch, *map(int, (th, tw, nb, o, p0, p1)))


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
    # numba is imported on first use: ``import megbrain`` stays free of its import time
    from numba import njit

    fn = {
        "filter": _winograd_filter_py,
        "input": _winograd_input_py,
        "output": _winograd_output_py,
        "direct": _direct_conv2d_py,
    }[name]
    return njit(nogil=True, cache=True, error_model="numpy", fastmath=False)(fn)

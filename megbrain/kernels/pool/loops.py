"""Compiled (Numba) loops of 2-d pooling, forward and backward, over ``(P, H, W)`` planes.

Every loop takes C-contiguous arrays of one float dtype (float32 or float64) viewed as
``(P, H, W)`` planes (``P = N * C``) and a plane range ``[lo, hi)``, so that a caller may split
the planes over threads. The loops are single-threaded and GIL-free (``nogil``): the comp
nodes' worker threads may run several at once, which Numba's parallel threading layers do not
allow.

The general loops work one output row at a time: for each window offset ``(a, b)`` they
compute once the output columns whose source column ``j * sw - pw + b`` lies inside the
image, so that no element test is left in the innermost loop (which LLVM vectorises), and the
border needs no separate code. 2x2 windows of stride 2 without padding (the pooling of most
CNNs) have their own single-pass loops, and so has MAX of 3x3 windows of stride 2 and padding 1
(ResNet's stem): its forward reads each output's three source rows in one pass, its backward
computes each gradient element once instead of zeroing the gradient and adding to it per
window offset.

The 2x2 loops work in explicit vector chunks of 8 (or 4) outputs, emitted as LLVM vector IR
(:func:`_chunk_2x2`): LLVM's loop vectoriser needs rows of at least 16 outputs before its
vector body runs (the CNNs' 28x28 .. 8x8 planes have 14 .. 4) and Numba leaves the SLP
vectoriser off. A row's last chunk overlaps the one before it instead of a scalar tail: the
loops only write, so recomputing a few outputs gives the same values.

MAX propagates NaN as ``numpy.maximum`` does; its backward gives each window's ``diff`` to
every element equal to the window's maximum (MegDNN's rule: ties share it).

The loops are compiled on first use (:func:`kernels`).
"""

from __future__ import annotations

import functools
import threading
from types import SimpleNamespace

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..conv.loops.int8 import _quantize
from ..tiled_jit import stack_tile

_stack_tile = stack_tile()
#: values of the stack tile of :func:`_fwd_max_3s2p1`'s column maxima (a source row and its
#: two padding columns)
_ROW_TILE = 1024

__all__ = ["kernels"]


def _cols(b, sw, pw, w, ow):  # pragma: no cover - compiled
    """The output columns ``[jlo, jhi)`` whose window offset ``b`` reads a source column, and
    the source column of ``jlo``."""
    jlo = max(0, (pw - b + sw - 1) // sw)
    jhi = min(ow, (w - 1 + pw - b) // sw + 1)
    return jlo, jhi, jlo * sw + b - pw


# The row loops index from 0 (``k``) into slices that start at the first column, and have a
# branch per common stride: with a constant, non-negative index LLVM vectorises the strided
# loads (a runtime stride, or a possibly negative index, keeps them scalar: 3-4x slower).
# ``np.maximum`` on scalars vectorises; ``v if v > m else m`` does not.
def _row_max(yr, xr, jlo, jhi, s0, sw):  # pragma: no cover - compiled
    ys, xs = yr[jlo:jhi], xr[s0:]
    if sw == 1:
        for k in range(jhi - jlo):
            ys[k] = np.maximum(ys[k], xs[k])
    elif sw == 2:
        for k in range(jhi - jlo):
            ys[k] = np.maximum(ys[k], xs[2 * k])
    else:
        for k in range(jhi - jlo):
            ys[k] = np.maximum(ys[k], xs[k * sw])


def _row_add(yr, xr, jlo, jhi, s0, sw):  # pragma: no cover - compiled
    ys, xs = yr[jlo:jhi], xr[s0:]
    if sw == 1:
        for k in range(jhi - jlo):
            ys[k] += xs[k]
    elif sw == 2:
        for k in range(jhi - jlo):
            ys[k] += xs[2 * k]
    else:
        for k in range(jhi - jlo):
            ys[k] += xs[k * sw]


def _row_bwd_max(gr, xr, yr, dr, jlo, jhi, s0, sw):  # pragma: no cover - compiled
    gs, xs, ys, ds = gr[s0:], xr[s0:], yr[jlo:jhi], dr[jlo:jhi]
    # ``d * (x == m)``: 2.7x faster than a select or a branch; an infinite ``d`` leaks NaN
    if sw == 1:
        for k in range(jhi - jlo):
            gs[k] += ds[k] * (xs[k] == ys[k])
    elif sw == 2:
        for k in range(jhi - jlo):
            gs[2 * k] += ds[k] * (xs[2 * k] == ys[k])
    else:
        for k in range(jhi - jlo):
            gs[k * sw] += ds[k] * (xs[k * sw] == ys[k])


def _row_bwd_add(gr, dr, jlo, jhi, s0, sw, scale):  # pragma: no cover - compiled
    gs, ds = gr[s0:], dr[jlo:jhi]
    if sw == 1:
        for k in range(jhi - jlo):
            gs[k] += ds[k] * scale
    elif sw == 2:
        for k in range(jhi - jlo):
            gs[2 * k] += ds[k] * scale
    else:
        for k in range(jhi - jlo):
            gs[k * sw] += ds[k] * scale


def _fwd_max(x, y, wh, ww, sh, sw, ph, pw, lo, hi):  # pragma: no cover - compiled
    h_, w_ = x.shape[1], x.shape[2]
    oh_, ow_ = y.shape[1], y.shape[2]
    ninf = -np.inf
    for p in range(lo, hi):
        for i in range(oh_):
            yr = y[p, i]
            for j in range(ow_):
                yr[j] = ninf
            h0 = i * sh - ph
            for a in range(max(0, -h0), min(wh, h_ - h0)):
                xr = x[p, h0 + a]
                for b in range(ww):
                    jlo, jhi, s0 = _cols(b, sw, pw, w_, ow_)
                    _row_max(yr, xr, jlo, jhi, s0, sw)


def _max3(a, b, c):  # pragma: no cover - compiled
    return np.maximum(np.maximum(a, b), c)


def _row_fwd_max_3s2(yr, ra, rb, rc, ow, w, cm):  # pragma: no cover - compiled
    """One output row of 3x3, stride-2, pad-1 MAX windows from its three source rows (a
    padding row is passed as a repeat of a real one: max is idempotent), in two passes that
    both vectorize: the column maxima of the three rows into ``cm`` (``w + 2`` values, a
    padding column a repeat of its neighbour), then output ``t`` the maximum of ``cm[2t]
    .. cm[2t + 2]`` (a scalar pass over the strided windows ran 4x slower)."""
    for j in range(w):
        cm[j + 1] = _max3(ra[j], rb[j], rc[j])
    cm[0] = cm[1]
    cm[w + 1] = cm[w]
    for t in range(ow):
        yr[t] = _max3(cm[2 * t], cm[2 * t + 1], cm[2 * t + 2])


def _fwd_max_3s2p1(x, y, lo, hi):  # pragma: no cover - compiled
    # the column maxima on the stack (rows of up to _ROW_TILE - 2 columns): no allocation
    if x.shape[2] + 2 <= _ROW_TILE:
        _fwd_max_3s2p1_rows(x, y, lo, hi, carray(_stack_tile(_ROW_TILE, x.dtype), _ROW_TILE))
    else:
        _fwd_max_3s2p1_rows(x, y, lo, hi, np.empty(x.shape[2] + 2, x.dtype))


def _fwd_max_3s2p1_rows(x, y, lo, hi, cm):  # pragma: no cover - compiled
    h_, w_ = x.shape[1], x.shape[2]
    oh_, ow_ = y.shape[1], y.shape[2]
    for p in range(lo, hi):
        for i in range(oh_):
            c = 2 * i  # source rows c - 1 .. c + 1, a padding row replaced by row c
            a = c - 1 if c > 0 else c
            b = c + 1 if c + 1 < h_ else c
            _row_fwd_max_3s2(y[p, i], x[p, a], x[p, c], x[p, b], ow_, w_, cm)


def _fwd_avg_global_q8(x, y, q, lo, hi):  # pragma: no cover - compiled
    """Planes [lo, hi) of the 8-bit global average (each row of ``x`` (P, A) one window):
    MegDNN's quantized pooling, the window's int32 sum (wrapping) as float32 divided by
    ``q[0]`` (the area), rounded half away from zero and saturated to ``[q[1], q[2]]``,
    into ``y`` (P,)."""
    area = x.shape[1]
    for p in range(lo, hi):
        total = np.int64(0)
        for j in range(area):
            total += np.int64(x[p, j])
        y[p] = _quantize(np.float32(np.int32(total)), q[0], np.float32(0), q[1], q[2])


def _fwd_avg(x, y, wh, ww, sh, sw, ph, pw, exclude, inv, lo, hi):  # pragma: no cover - compiled
    h_, w_ = x.shape[1], x.shape[2]
    oh_, ow_ = y.shape[1], y.shape[2]
    zero = inv - inv
    for p in range(lo, hi):
        for i in range(oh_):
            yr = y[p, i]
            for j in range(ow_):
                yr[j] = zero
            h0 = i * sh - ph
            for a in range(max(0, -h0), min(wh, h_ - h0)):
                xr = x[p, h0 + a]
                for b in range(ww):
                    jlo, jhi, s0 = _cols(b, sw, pw, w_, ow_)
                    _row_add(yr, xr, jlo, jhi, s0, sw)
            if exclude:
                ch = min(h0 + wh, h_) - max(h0, 0)
                for j in range(ow_):
                    w0 = j * sw - pw
                    yr[j] /= ch * (min(w0 + ww, w_) - max(w0, 0))
            else:
                for j in range(ow_):
                    yr[j] *= inv


def _fwd_max_2x2(x, y, lo, hi):  # pragma: no cover - compiled
    oh_, ow_ = y.shape[1], y.shape[2]
    for p in range(lo, hi):
        for i in range(oh_):
            if ow_ >= 8:
                for j in range(0, ow_ - 7, 8):
                    _v_fwd_max8(x, y, p, i, j)
                if ow_ % 8:
                    _v_fwd_max8(x, y, p, i, ow_ - 8)
            elif ow_ >= 4:
                _v_fwd_max4(x, y, p, i, 0)
                if ow_ > 4:
                    _v_fwd_max4(x, y, p, i, ow_ - 4)
            else:  # 3-d indexing: row views here would cost reference counting every row
                for j in range(ow_):
                    a, b = x[p, 2 * i, 2 * j], x[p, 2 * i, 2 * j + 1]
                    c, d = x[p, 2 * i + 1, 2 * j], x[p, 2 * i + 1, 2 * j + 1]
                    y[p, i, j] = np.maximum(np.maximum(a, c), np.maximum(b, d))


def _fwd_avg_2x2(x, y, inv, lo, hi):  # pragma: no cover - compiled
    oh_, ow_ = y.shape[1], y.shape[2]
    for p in range(lo, hi):
        for i in range(oh_):
            if ow_ >= 8:
                for j in range(0, ow_ - 7, 8):
                    _v_fwd_avg8(x, y, inv, p, i, j)
                if ow_ % 8:
                    _v_fwd_avg8(x, y, inv, p, i, ow_ - 8)
            elif ow_ >= 4:
                _v_fwd_avg4(x, y, inv, p, i, 0)
                if ow_ > 4:
                    _v_fwd_avg4(x, y, inv, p, i, ow_ - 4)
            else:  # the vector chunks' order of additions
                for j in range(ow_):
                    a, b = x[p, 2 * i, 2 * j], x[p, 2 * i, 2 * j + 1]
                    c, d = x[p, 2 * i + 1, 2 * j], x[p, 2 * i + 1, 2 * j + 1]
                    y[p, i, j] = ((a + c) + (b + d)) * inv


def _zero_rows(gp, lo, hi):  # pragma: no cover - compiled
    """Zero rows ``[lo, hi)`` of plane ``gp``; returns ``max(lo, hi)``, the rows zeroed so far.
    The general backward loops zero each gradient row just before its first window adds to
    it (it is then in L1), instead of a separate pass over the plane."""
    for hh in range(lo, hi):
        gr = gp[hh]
        for j in range(gr.shape[0]):
            gr[j] = 0
    return max(lo, hi)


def _bwd_max(x, y, d, g, wh, ww, sh, sw, ph, pw, lo, hi):  # pragma: no cover - compiled
    h_, w_ = x.shape[1], x.shape[2]
    oh_, ow_ = y.shape[1], y.shape[2]
    for p in range(lo, hi):
        gp = g[p]
        zeroed = 0
        for i in range(oh_):
            yr, dr = y[p, i], d[p, i]
            h0 = i * sh - ph
            zeroed = _zero_rows(gp, zeroed, min(h0 + wh, h_))
            for a in range(max(0, -h0), min(wh, h_ - h0)):
                xr, gr = x[p, h0 + a], gp[h0 + a]
                for b in range(ww):
                    jlo, jhi, s0 = _cols(b, sw, pw, w_, ow_)
                    _row_bwd_max(gr, xr, yr, dr, jlo, jhi, s0, sw)
        _zero_rows(gp, zeroed, h_)  # rows below the last window


def _bwd_avg(d, g, wh, ww, sh, sw, ph, pw, exclude, inv, lo, hi):  # pragma: no cover - compiled
    h_, w_ = g.shape[1], g.shape[2]
    oh_, ow_ = d.shape[1], d.shape[2]
    one = inv - inv + 1
    for p in range(lo, hi):
        gp = g[p]
        zeroed = 0
        for i in range(oh_):
            dr = d[p, i]
            h0 = i * sh - ph
            zeroed = _zero_rows(gp, zeroed, min(h0 + wh, h_))
            ch = min(h0 + wh, h_) - max(h0, 0)
            for a in range(max(0, -h0), min(wh, h_ - h0)):
                gr = gp[h0 + a]
                for b in range(ww):
                    jlo, jhi, s0 = _cols(b, sw, pw, w_, ow_)
                    if exclude:
                        for j in range(jlo, jhi):
                            w0 = j * sw - pw
                            cw = min(w0 + ww, w_) - max(w0, 0)
                            gr[j * sw + b - pw] += dr[j] * (one / (ch * cw))
                    else:
                        _row_bwd_add(gr, dr, jlo, jhi, s0, sw, inv)
        _zero_rows(gp, zeroed, h_)  # rows below the last window


def _row_bwd_max_3s2(gr, xr, yr, dr, ow, w):  # pragma: no cover - compiled
    """One source row's gradient from the one output row (``yr`` / ``dr``) of 3-wide, stride-2,
    pad-1 windows that reads it: the even column ``2t`` is tap 1 of output ``t``, the odd
    column ``2t + 1`` tap 2 of ``t`` and tap 0 of ``t + 1``. Each column is computed once, so
    the stride-2 stores come in full pairs, which LLVM vectorises."""
    for t in range(ow - 1):
        m0, m1, d0, d1, xe, xo = yr[t], yr[t + 1], dr[t], dr[t + 1], xr[2 * t], xr[2 * t + 1]
        gr[2 * t] = d0 * (xe == m0)
        gr[2 * t + 1] = d0 * (xo == m0) + d1 * (xo == m1)
    t = ow - 1
    gr[2 * t] = dr[t] * (xr[2 * t] == yr[t])
    if 2 * t + 1 < w:
        gr[2 * t + 1] = dr[t] * (xr[2 * t + 1] == yr[t])


def _row_bwd_max_3s2_two(gr, xr, yr, dr, ur, er, ow, w):  # pragma: no cover - compiled
    """:func:`_row_bwd_max_3s2` for a source row read by two output rows (window row 2 of
    ``yr`` / ``dr``, window row 0 of ``ur`` / ``er``), in one pass: the row is read and its
    gradient written once."""
    for t in range(ow - 1):
        m0, m1, d0, d1, xe, xo = yr[t], yr[t + 1], dr[t], dr[t + 1], xr[2 * t], xr[2 * t + 1]
        n0, n1, e0, e1 = ur[t], ur[t + 1], er[t], er[t + 1]
        gr[2 * t] = d0 * (xe == m0) + e0 * (xe == n0)
        gr[2 * t + 1] = (d0 * (xo == m0) + d1 * (xo == m1)) + (e0 * (xo == n0) + e1 * (xo == n1))
    t = ow - 1
    xe = xr[2 * t]
    gr[2 * t] = dr[t] * (xe == yr[t]) + er[t] * (xe == ur[t])
    if 2 * t + 1 < w:
        xo = xr[2 * t + 1]
        gr[2 * t + 1] = dr[t] * (xo == yr[t]) + er[t] * (xo == ur[t])


def _bwd_max_3s2p1(x, y, d, g, lo, hi):  # pragma: no cover - compiled
    # source row 2t is window row 1 of output row t; row 2t + 1 is window row 2 of output row
    # t and window row 0 of output row t + 1: every gradient element is written once, no fill
    h_, w_ = x.shape[1], x.shape[2]
    oh_, ow_ = y.shape[1], y.shape[2]
    for p in range(lo, hi):
        for hh in range(h_):
            xr, gr = x[p, hh], g[p, hh]
            i = hh // 2
            if hh % 2 == 1 and i + 1 < oh_:
                _row_bwd_max_3s2_two(gr, xr, y[p, i], d[p, i], y[p, i + 1], d[p, i + 1], ow_, w_)
            else:
                _row_bwd_max_3s2(gr, xr, y[p, i], d[p, i], ow_, w_)


def _bwd_max_2x2(x, y, d, g, lo, hi):  # pragma: no cover - compiled
    h_, w_ = x.shape[1], x.shape[2]
    oh_, ow_ = y.shape[1], y.shape[2]
    z = np.zeros(1, g.dtype)[0]
    for p in range(lo, hi):
        for i in range(oh_):
            if ow_ >= 8:
                for j in range(0, ow_ - 7, 8):
                    _v_bwd_max8(x, y, d, g, p, i, j)
                if ow_ % 8:
                    _v_bwd_max8(x, y, d, g, p, i, ow_ - 8)
            elif ow_ >= 4:
                _v_bwd_max4(x, y, d, g, p, i, 0)
                if ow_ > 4:
                    _v_bwd_max4(x, y, d, g, p, i, ow_ - 4)
            else:  # 3-d indexing (no row views, see _fwd_max_2x2)
                for j in range(ow_):
                    m, v = y[p, i, j], d[p, i, j]
                    for r in range(2 * i, 2 * i + 2):
                        g[p, r, 2 * j] = v if x[p, r, 2 * j] == m else z
                        g[p, r, 2 * j + 1] = v if x[p, r, 2 * j + 1] == m else z
            for j in range(2 * ow_, w_):
                g[p, 2 * i, j] = 0
                g[p, 2 * i + 1, j] = 0
        for hh in range(2 * oh_, h_):
            for j in range(w_):
                g[p, hh, j] = 0


def _bwd_avg_2x2(d, g, inv, lo, hi):  # pragma: no cover - compiled
    h_, w_ = g.shape[1], g.shape[2]
    oh_, ow_ = d.shape[1], d.shape[2]
    for p in range(lo, hi):
        for i in range(oh_):
            if ow_ >= 8:
                for j in range(0, ow_ - 7, 8):
                    _v_bwd_avg8(d, g, inv, p, i, j)
                if ow_ % 8:
                    _v_bwd_avg8(d, g, inv, p, i, ow_ - 8)
            elif ow_ >= 4:
                _v_bwd_avg4(d, g, inv, p, i, 0)
                if ow_ > 4:
                    _v_bwd_avg4(d, g, inv, p, i, ow_ - 4)
            else:  # 3-d indexing (no row views, see _fwd_max_2x2)
                for j in range(ow_):
                    v = d[p, i, j] * inv
                    for r in range(2 * i, 2 * i + 2):
                        g[p, r, 2 * j] = v
                        g[p, r, 2 * j + 1] = v
            for j in range(2 * ow_, w_):
                g[p, 2 * i, j] = 0
                g[p, 2 * i + 1, j] = 0
        for hh in range(2 * oh_, h_):
            for j in range(w_):
                g[p, hh, j] = 0


# ---- vector chunks of the 2x2 loops ------------------------------------------------------
_CHUNK_ARGS = {"fwd_max": 2, "fwd_avg": 3, "bwd_max": 4, "bwd_avg": 3}
# the chunks, bound by _compile before the loops calling them are compiled
_v_fwd_max4 = _v_fwd_max8 = _v_fwd_avg4 = _v_fwd_avg8 = None
_v_bwd_max4 = _v_bwd_max8 = _v_bwd_avg4 = _v_bwd_avg8 = None


def _chunk_2x2(kind: str, width: int):
    """A Numba intrinsic computing ``width`` outputs ``j .. j + width - 1`` of output row ``i``
    of plane ``p`` of a 2x2, stride-2 pooling (``kind``: ``fwd_max(x, y, p, i, j)``,
    ``fwd_avg(x, y, inv, p, i, j)``, ``bwd_max(x, y, d, g, p, i, j)``,
    ``bwd_avg(d, g, inv, p, i, j)``) as LLVM vector instructions: the two source rows'
    ``2 * width`` elements are loaded as vectors, folded top with bottom, then even with odd
    lanes (forward); the backward duplicates ``dst`` / ``diff`` into lane pairs. MAX is
    ``llvm.maximum`` (NaN-propagating, as ``numpy.maximum``); its backward selects ``diff``
    where ``src == dst`` (an ordered compare: a NaN maximum gives no gradient)."""

    i32 = ir.IntType(32)

    def lanes(n, f):
        return ir.Constant(ir.VectorType(i32, n), [f(k) for k in range(n)])

    pairs = lanes(2 * width, lambda k: k // 2)  # lane k of 2 * width: element k // 2
    even, odd = lanes(width, lambda k: 2 * k), lanes(width, lambda k: 2 * k + 1)

    def codegen(context, builder, sig, args):
        elt = context.get_data_type(sig.args[0].dtype)
        align = context.get_abi_sizeof(elt)
        wide, narrow = ir.VectorType(elt, 2 * width), ir.VectorType(elt, width)
        p, i, j = args[-3:]
        i2 = builder.add(i, i)
        rows = (i2, builder.add(i2, ir.Constant(i.type, 1)))
        j2 = builder.add(j, j)

        def ptr(k, row, col, vty):
            ary = context.make_array(sig.args[k])(context, builder, args[k])
            item = cgutils.get_item_pointer(
                context, builder, sig.args[k], ary, [p, row, col], wraparound=False
            )
            return builder.bitcast(item, vty.as_pointer())

        def load(k, row, col, vty):
            return builder.load(ptr(k, row, col, vty), align=align)

        def store(val, k, row, col):
            builder.store(val, ptr(k, row, col, val.type), align=align)

        def vmax(a, b):
            suffix = "f32" if isinstance(elt, ir.FloatType) else "f64"
            fnty = ir.FunctionType(a.type, [a.type, a.type])
            name = f"llvm.maximum.v{a.type.count}{suffix}"
            return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), [a, b])

        def splat(s, vty):
            v = builder.insert_element(ir.Constant(vty, ir.Undefined), s, ir.Constant(i32, 0))
            return builder.shuffle_vector(v, v, lanes(vty.count, lambda k: 0))

        def halves(v):
            return builder.shuffle_vector(v, v, even), builder.shuffle_vector(v, v, odd)

        if kind == "fwd_max":
            store(vmax(*halves(vmax(*(load(0, r, j2, wide) for r in rows)))), 1, i, j)
        elif kind == "fwd_avg":
            total = builder.fadd(*halves(builder.fadd(*(load(0, r, j2, wide) for r in rows))))
            store(builder.fmul(total, splat(args[2], narrow)), 1, i, j)
        elif kind == "bwd_max":
            m, v = load(1, i, j, narrow), load(2, i, j, narrow)
            mm, vv = builder.shuffle_vector(m, m, pairs), builder.shuffle_vector(v, v, pairs)
            for r in rows:
                hit = builder.fcmp_ordered("==", load(0, r, j2, wide), mm)
                store(builder.select(hit, vv, ir.Constant(wide, None)), 3, r, j2)
        else:
            v = builder.fmul(load(0, i, j, narrow), splat(args[2], narrow))
            vv = builder.shuffle_vector(v, v, pairs)
            for r in rows:
                store(vv, 1, r, j2)
        return context.get_dummy_value()

    if _CHUNK_ARGS[kind] == 2:
        def typer(typingctx, a, b, p, i, j):
            return types.void(a, b, p, i, j), codegen

    elif _CHUNK_ARGS[kind] == 3:

        def typer(typingctx, a, b, c, p, i, j):
            return types.void(a, b, c, p, i, j), codegen

    else:
        def typer(typingctx, a, b, c, e, p, i, j):
            return types.void(a, b, c, e, p, i, j), codegen

    typer.__name__ = f"_v_{kind}{width}"
    return intrinsic(typer)


_compile_lock = threading.Lock()
_compiled: SimpleNamespace | None = None


def kernels() -> SimpleNamespace:
    """The compiled loops (compiled on first call for each dtype, cached on disk):
    ``fwd_max``, ``fwd_avg``, ``fwd_max_2x2``, ``fwd_avg_2x2``, ``fwd_max_3s2p1``, ``bwd_max``,
    ``bwd_avg``, ``bwd_max_2x2``, ``bwd_max_3s2p1``, ``bwd_avg_2x2``, and the 8-bit
    ``fwd_avg_global_q8`` (:func:`_fwd_avg_global_q8`). Each takes its arrays,
    the geometry (``wh, ww, sh, sw, ph, pw``; none for the special-case loops), for the
    average modes ``exclude`` (divide by the non-padding count; the general loops only) and
    ``inv`` (``1 / window area`` in the arrays' dtype), and the plane range ``lo, hi``."""
    global _compiled
    with _compile_lock:  # once: the row helpers are replaced by their compiled forms
        if _compiled is None:
            _compiled = _compile()
        return _compiled


def _compile() -> SimpleNamespace:

    jit = functools.partial(njit, nogil=True, cache=True, error_model="numpy")
    global _cols, _row_max, _row_add, _row_bwd_max, _row_bwd_add, _zero_rows
    global _row_bwd_max_3s2, _row_bwd_max_3s2_two, _max3, _row_fwd_max_3s2, _fwd_max_3s2p1_rows
    global _v_fwd_max4, _v_fwd_max8, _v_fwd_avg4, _v_fwd_avg8
    global _v_bwd_max4, _v_bwd_max8, _v_bwd_avg4, _v_bwd_avg8
    _v_fwd_max4, _v_fwd_max8 = _chunk_2x2("fwd_max", 4), _chunk_2x2("fwd_max", 8)
    _v_fwd_avg4, _v_fwd_avg8 = _chunk_2x2("fwd_avg", 4), _chunk_2x2("fwd_avg", 8)
    _v_bwd_max4, _v_bwd_max8 = _chunk_2x2("bwd_max", 4), _chunk_2x2("bwd_max", 8)
    _v_bwd_avg4, _v_bwd_avg8 = _chunk_2x2("bwd_avg", 4), _chunk_2x2("bwd_avg", 8)
    inline = njit(inline="always")
    _cols, _row_max, _row_add = inline(_cols), inline(_row_max), inline(_row_add)
    _row_bwd_max, _row_bwd_add = inline(_row_bwd_max), inline(_row_bwd_add)
    _row_bwd_max_3s2 = inline(_row_bwd_max_3s2)
    _zero_rows = inline(_zero_rows)
    _max3, _row_fwd_max_3s2 = inline(_max3), inline(_row_fwd_max_3s2)
    _fwd_max_3s2p1_rows = njit(nogil=True)(_fwd_max_3s2p1_rows)
    _row_bwd_max_3s2_two = inline(_row_bwd_max_3s2_two)
    return SimpleNamespace(
        fwd_max=jit(_fwd_max),
        fwd_avg=jit(_fwd_avg),
        fwd_max_2x2=jit(_fwd_max_2x2),
        fwd_max_3s2p1=jit(_fwd_max_3s2p1),
        fwd_avg_2x2=jit(_fwd_avg_2x2),
        fwd_avg_global_q8=jit(_fwd_avg_global_q8),
        bwd_max=jit(_bwd_max),
        bwd_avg=jit(_bwd_avg),
        bwd_max_2x2=jit(_bwd_max_2x2),
        bwd_max_3s2p1=jit(_bwd_max_3s2p1),
        bwd_avg_2x2=jit(_bwd_avg_2x2),
    )
